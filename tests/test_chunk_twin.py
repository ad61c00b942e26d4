"""The chunked entry's dense twin (``pallas:chunked:dense``, compare/auto.py; session 23): fa_prefill with the chunk's
config on the same keys as one dense cache, the other side of the serving issue's bar (the chunk at >= 0.95x its
speed). CPU, interpret mode, a tiny chunk: the twin, the chunk through ``paged_attention`` and the float64 oracle
agree."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from attn_core import oracle
from compare import auto, interop
from compare import workloads as W
from compare.schema import Ctx

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)


@pytest.fixture(scope="module")
def tiny_chunk():
    ws = {w.name: w for w in W.load_config(W.resolve_config("sweep"))}
    w = ws["sweep_chunked_llama-3.1-8b_p16_c512_s8192"]
    return dataclasses.replace(w, name="twin_tiny", batch=2, heads_q=4, heads_kv=2, head_dim=64, q_len=32, kv_len=96,
                               q_offset=64, page_size=16)


def test_the_twin_runs_the_chunks_config_on_the_dense_cache_and_agrees(tiny_chunk):
    w = tiny_chunk
    twin = auto.chunk_dense_impl()
    assert twin.kind == "twin" and twin.supports(w, CPU).ok
    inp = interop.make_inputs(w)
    prep = twin.prepare(w, inp, CPU)
    got = np.asarray(prep.fn(*prep.args), np.float64)
    user = auto.auto_impl().prepare(w, inp, CPU)
    chunk = np.asarray(user.fn(*user.args), np.float64)
    q, k, v = (np.asarray(x, np.float64) for x in (inp.q, inp.k, inp.v))
    ref, _ = oracle.attention_reference(q, k, v, causal=True, q_offset=w.kv_len - w.q_len)
    for out in (got, chunk):
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-2
    assert twin.plan_fn(w, CPU)["config"] == auto.choice(w)["config"]  # the chunk's own config


def test_the_twin_refuses_what_is_not_a_plain_chunk(tiny_chunk):
    twin = auto.chunk_dense_impl()
    dec = dataclasses.replace(tiny_chunk, q_len=1)
    assert twin.supports(dec, CPU).status == "n/a"
    windowed = dataclasses.replace(tiny_chunk, window=32)
    assert not twin.supports(windowed, CPU).ok and "window" in twin.supports(windowed, CPU).reason
