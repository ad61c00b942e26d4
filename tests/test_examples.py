"""The examples run on the CPU (interpret mode) and do what they say: the tiny decoder's loss falls while it
trains through pallas_attn.dot_product_attention's Pallas backward; the paged decode loop matches jax.nn
at every step and compiles its step once for every cache position."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_train_tiny_decoder_loss_decreases():
    losses = _load("train_tiny_decoder").main(steps=4)
    assert np.all(np.isfinite(losses)) and all(b < a for a, b in zip(losses, losses[1:])), losses


def test_paged_decode_loop_matches_jax_nn_and_compiles_once():
    mod = _load("paged_decode_loop")
    worst = mod.main(steps=2)
    assert worst < 2e-3  # fp16 operands and output against jax.nn in float32 on the same fp16 values
    assert mod.step._cache_size() == 1


def test_serving_loop_mixes_chunks_and_decodes_matches_jax_nn_and_compiles_once():
    """Prompts of 70 and 23 tokens in chunks of 32, then 3 and 5 decodes, chunks and decodes in one batch (step 2: a
    chunk beside a decode), one compile; every real row against jax.nn on the dense cache, padding rows 0; then the
    same loop with the queries packed (``paged_attention_varlen``), one more compile."""
    mod = _load("serving_loop")
    worst = mod.main()
    assert worst < 2e-2  # bf16 operands and output (P cast to bf16 for P V) against jax.nn in float32
    assert mod.step._cache_size() == 1
    # the same loop through the packed entry (paged_attention_varlen): one more compile, the same checks
    worst = mod.main(packed=True)
    assert worst < 2e-2
    assert mod.step._cache_size() == 2
