"""v1_naive ... v6_splitkv compiled through the Triton lowering on the GPU, at the reference's shapes.

Run on the device machine: ``python -m pytest tests/gpu/test_pallas_gpu.py -m gpu -q``.

Each case is checked twice:
  * every output element against an XLA FP32 reference computed on the GPU (``precision=HIGHEST``), so
    an unwritten row or tile fails even at N = 8192. Before each kernel call, a NaN-filled buffer of the
    output's size is allocated and freed, so that the allocator most likely hands the kernel memory that
    reads NaN where it is not written (best effort: the GPU does not initialize outputs itself);
  * a subset of query rows (first and last 16) against the float64 oracle on the CPU, with the same
    tolerances as the CPU tests (the oracle over all rows at N = 8192 would take minutes).
Shapes (ORIGINAL.md §6): prefill B=1, H=8, N in {512, 2048, 8192}, D in {64, 128}, causal and not;
long-N stability N=16384, B=1, H=2 (v3, v4, v5); decode Tq=1, Tk in {4096, 8190, 16384} (v6).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from pallas_attn.reference import attention_reference, to_f64

pytestmark = pytest.mark.gpu

EPS32 = float(np.finfo(np.float32).eps)
PREFILL_GENS = ("v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma")
FP32_GENS = ("v1_naive", "v2_tiled", "v3_online", "v4_fused")
SUBSET = 16  # first and last SUBSET query rows go to the float64 oracle


def _inputs(seed, *, b, tq, tk, h, d, dtype):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    return tuple(jax.random.normal(key, (b, t, h, d), jnp.float32).astype(dtype)
                 for key, t in ((kq, tq), (kk, tk), (kv, tk)))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "q_offset"))
def _xla_reference(q, k, v, *, causal, scale, q_offset):
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) * scale
    if causal:
        i = jnp.arange(q.shape[1])[:, None]
        j = jnp.arange(k.shape[1])[None, :]
        s = jnp.where(j <= i + q_offset, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v, precision=jax.lax.Precision.HIGHEST)


def _poison(shape, dtype):
    jnp.full(shape, jnp.nan, dtype).block_until_ready()  # freed at once; its block is likely reused


def _staged(gen, x):
    return x.astype(jnp.float16) if gen in ("v5_wmma", "v6_splitkv") and x.dtype == jnp.float32 else x


def _tolerance(gen, dtype, qs, ks, vs, scale):
    kind = "float32" if gen in FP32_GENS else dtype
    if gen == "v5_wmma" and dtype == "float32":
        kind = "float16"
    if kind == "float32":
        smax = float(jnp.max(jnp.abs(jnp.einsum("bqhd,bkhd->bhqk", qs.astype(jnp.float32), ks.astype(jnp.float32),
                                                precision=jax.lax.Precision.HIGHEST)))) * scale
        return 1e-5, 1e-5 + 4 * EPS32 * smax * float(jnp.max(jnp.abs(vs.astype(jnp.float32))))
    r = {"float16": 5e-3, "bfloat16": 2e-2}[kind]
    return r, r


def _check(gen, q, k, v, *, causal, q_offset=0, dtype, config=None):
    d = q.shape[-1]
    scale = 1.0 / np.sqrt(d)
    _poison(q.shape, q.dtype)
    out = pallas_attn.attention(q, k, v, causal=causal, q_offset=q_offset, generation=gen, config=config)
    out = jax.block_until_ready(out)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))), f"{gen}: non-finite output"
    qs, ks, vs = (_staged(gen, x) for x in (q, k, v))
    rtol, atol = _tolerance(gen, dtype, qs, ks, vs, scale)
    # 1) every element, against FP32 XLA on the device (its own rounding is ~1e-6: well inside atol)
    ref_all = _xla_reference(qs, ks, vs, causal=causal, scale=scale, q_offset=q_offset)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref_all), rtol=rtol,
                               atol=atol + 2e-6, err_msg=f"{gen} vs XLA fp32")
    # 2) a row subset against the float64 oracle
    tq = q.shape[1]
    starts = sorted({0, max(tq - SUBSET, 0)})
    k64, v64 = to_f64(ks), to_f64(vs)
    for r0 in starts:
        r1 = min(r0 + SUBSET, tq)
        ref, _ = attention_reference(to_f64(qs[:, r0:r1]), k64, v64, causal=causal, scale=scale,
                                     q_offset=q_offset + r0)
        got = np.asarray(out[:, r0:r1].astype(jnp.float32), dtype=np.float64)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"{gen} rows {r0}:{r1} vs f64")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [512, 2048, 8192])
@pytest.mark.parametrize("gen", PREFILL_GENS)
def test_prefill_reference_shapes(gen, n, d, causal):
    dtype = "float32" if gen in FP32_GENS else "float16"
    q, k, v = _inputs(n + d, b=1, tq=n, tk=n, h=8, d=d, dtype=dtype)
    _check(gen, q, k, v, causal=causal, dtype=dtype)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("gen", ["v3_online", "v4_fused", "v5_wmma"])
def test_long_sequence_stability(gen, d):
    dtype = "float32" if gen in FP32_GENS else "float16"
    q, k, v = _inputs(16384 + d, b=1, tq=16384, tk=16384, h=2, d=d, dtype=dtype)
    _check(gen, q, k, v, causal=True, dtype=dtype)


@pytest.mark.parametrize("d", [64, 128])
def test_v5_tuned_config(d):
    q, k, v = _inputs(7, b=1, tq=2048, tk=2048, h=8, d=d, dtype="float16")
    _check("v5_wmma", q, k, v, causal=True, dtype="float16", config="tuned")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("tk", [4096, 8190, 16384])
def test_v6_decode(tk, d, causal):
    q, k, v = _inputs(tk + d, b=1, tq=1, tk=tk, h=8, d=d, dtype="float16")
    # causal decode: the one query sits at the end of the cache (q_offset = Tk - 1), as in v7+
    _check("v6_splitkv", q, k, v, causal=causal, q_offset=tk - 1 if causal else 0, dtype="float16")


@pytest.mark.parametrize(("dtype", "config"), [("bfloat16", "faithful"), ("float32", "reference_sm40"),
                                               ("float16", "reference_sm40")])
def test_v6_dtypes_and_reference_heuristic(dtype, config):
    q, k, v = _inputs(3, b=2, tq=1, tk=8192, h=8, d=128, dtype=dtype)
    _check("v6_splitkv", q, k, v, causal=False, dtype=dtype, config=config)


def test_v6_prefill_degenerates_to_one_split():
    q, k, v = _inputs(5, b=1, tq=512, tk=512, h=8, d=64, dtype="float16")
    _check("v6_splitkv", q, k, v, causal=True, dtype="float16")
