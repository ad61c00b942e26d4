"""examples/flax_nnx_attention.py (issue 33): pallas_attn's drop-in as a Flax NNX MultiHeadAttention's attention_fn,
on the CPU (interpret mode): the call runs the Pallas kernel pair (not a fallback), the block's output and gradients
equal the same module with Flax's own attention function, training lowers the loss, and attention dropout is refused
rather than silently skipped."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx  # in the test extra (pyproject.toml): the example is part of the CPU suite, never skipped

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "flax_nnx_attention.py"


def _load():
    spec = importlib.util.spec_from_file_location("examples_flax_nnx_attention", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_nnx_block_on_the_drop_in_matches_flax_attention_and_trains():
    import pallas_attn

    ex = _load()
    ours = ex.Block(ex.causal(ex.pallas_attention_fn), rngs=nnx.Rngs(0))
    ref = ex.Block(ex.causal(nnx.dot_product_attention), rngs=nnx.Rngs(0))
    nnx.update(ref, nnx.state(ours))  # the same parameters in both
    tokens = ex.data(0)[:, :-1]
    q = jnp.zeros((tokens.shape[0], tokens.shape[1], ex.HEADS, ex.D_MODEL // ex.HEADS), jnp.float32)
    kv = jnp.zeros((tokens.shape[0], tokens.shape[1], ex.KV_HEADS, ex.D_MODEL // ex.HEADS), jnp.float32)
    impl, why = pallas_attn.which_implementation(q, kv, kv, is_causal=True)
    assert impl.startswith("pallas:"), why  # the kernel pair, not jax.nn's fallback
    a, r = ours(tokens), ref(tokens)
    assert np.allclose(np.asarray(a), np.asarray(r), rtol=2e-4, atol=2e-4)

    def loss(m):
        return jnp.mean(m(tokens) ** 2)

    ga, gr = nnx.grad(loss)(ours), nnx.grad(loss)(ref)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gr)):
        assert np.allclose(np.asarray(x), np.asarray(y), rtol=2e-3, atol=2e-5)
    losses = ex.main(steps=3)
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.7 * losses[0], losses


def test_attention_dropout_is_refused_not_skipped():
    ex = _load()
    q = jnp.ones((1, 4, 2, 8), jnp.float32)
    with pytest.raises(NotImplementedError, match="dropout"):
        ex.pallas_attention_fn(q, q, q, dropout_rate=0.1, deterministic=False, dropout_rng=jax.random.key(0))
    out = ex.pallas_attention_fn(q, q, q, dropout_rate=0.1, deterministic=True)  # inference: no dropout to apply
    assert out.shape == q.shape
