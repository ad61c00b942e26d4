"""v1_naive ... v6_splitkv compiled through the Triton lowering on the GPU, at the reference's shapes.

Run on the device machine: ``python -m pytest tests/gpu/test_pallas_gpu.py -m gpu -q``.

Every call goes through ``pallas_attn.attention(..., generation=, config=, q_offset=, return_lse=True)``
and each case is checked twice:
  * every output element and every row's LSE against an XLA FP32 reference computed on the GPU
    (``precision=HIGHEST``), so an unwritten row or tile fails even at N = 8192. Before each kernel call, a
    NaN-filled buffer of the output's size is allocated and freed, so that the allocator most likely hands
    the kernel memory that reads NaN where it is not written (best effort: the GPU does not initialize
    outputs itself);
  * a subset of query rows (first and last 16) against the float64 oracle on the CPU, with the same
    tolerances as the CPU tests (the oracle over all rows at N = 8192 would take minutes).
Shapes (docs/reference.md §6): prefill B=1, H=8, N in {512, 2048, 8192}, D in {64, 128}, causal and not;
long-N stability N=16384, B=1, H=2 (v3, v4, v5); decode Tq=1, Tk in {4096, 8190, 16384} (v6).
Plus what the compiled kernels must show beyond interpret mode: per-sequence offsets as traced data under
``jax.jit`` (negative ones: rows with no visible key give 0 and LSE -inf; v1's softmax gathers one offset
per flattened row), and NaN propagation (Triton lowers ``max`` to ``maxnumf``, which drops a NaN operand,
so a NaN score must still reach the output through ``exp`` and the row sum).
"""

from __future__ import annotations

import dataclasses
import functools
import os

# XLA's GEMM autotuning of the FP32 reference einsums cost 9-13 s per new shape on an H100 (407 s for this
# file instead of 183 s); the reference needs no fast GEMM. Takes effect when this module is imported before
# the GPU backend starts (pytest imports every test module before conftest asks for devices).
if "xla_gpu_autotune_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core.oracle import attention_reference, to_f64  # noqa: E402

pytestmark = pytest.mark.gpu

EPS32 = float(np.finfo(np.float32).eps)
GENS = ("v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv")
PREFILL_GENS = GENS[:5]
FP32_GENS = ("v1_naive", "v2_tiled", "v3_online", "v4_fused")
SUBSET = 16  # first and last SUBSET query rows go to the float64 oracle
LSE_RTOL, LSE_ATOL = 2e-5, 2e-4


def _inputs(seed, *, b, tq, tk, h, d, dtype):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    return tuple(jax.random.normal(key, (b, t, h, d), jnp.float32).astype(dtype)
                 for key, t in ((kq, tq), (kk, tk), (kv, tk)))


def _dtype(gen):
    return "float32" if gen in FP32_GENS else "float16"


@functools.partial(jax.jit, static_argnames=("causal", "scale"))
def _xla_reference(q, k, v, off, *, causal, scale):
    """FP32 ``(out [B, Tq, H, D], lse [B, H, Tq])`` with per-sequence offsets ``off [B]``."""
    q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=jax.lax.Precision.HIGHEST) * scale
    if causal:
        i = jnp.arange(q.shape[1])[None, None, :, None]
        j = jnp.arange(k.shape[1])[None, None, None, :]
        s = jnp.where(j <= i + off[:, None, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(s - m)
    l = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bhqk,bkhd->bqhd", p / jnp.where(l == 0, 1.0, l), v, precision=jax.lax.Precision.HIGHEST)
    lse = jnp.where(l[..., 0] == 0, -jnp.inf, m[..., 0] + jnp.log(jnp.where(l[..., 0] == 0, 1.0, l[..., 0])))
    return out, lse


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


def _attention(gen, q, k, v, *, causal, q_offset, config=None):
    return pallas_attn.attention(q, k, v, causal=causal, q_offset=q_offset, generation=gen, config=config,
                                 return_lse=True)


def _compare(gen, out, lse, q, k, v, *, causal, offs, dtype):
    """Every element and LSE against XLA FP32, then the first/last rows against the float64 oracle."""
    b, tq, h, d = q.shape
    scale = 1.0 / np.sqrt(d)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == jnp.float32 and lse.shape == (b, h, tq)
    assert bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))), f"{gen}: non-finite output"
    qs, ks, vs = (_staged(gen, x) for x in (q, k, v))
    rtol, atol = _tolerance(gen, dtype, qs, ks, vs, scale)
    off_arr = jnp.asarray(offs, jnp.int32)
    # 1) every element, against FP32 XLA on the device (its own rounding is ~1e-6: well inside atol)
    ref_all, ref_lse = _xla_reference(qs, ks, vs, off_arr, causal=causal, scale=scale)
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(ref_all), rtol=rtol,
                               atol=atol + 2e-6, err_msg=f"{gen} vs XLA fp32")
    got_lse, want_lse = np.asarray(lse), np.asarray(ref_lse)
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(want_lse)), f"{gen}: LSE -inf rows"
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[fin], want_lse[fin], rtol=LSE_RTOL, atol=LSE_ATOL, err_msg=f"{gen} lse")
    # 2) a row subset against the float64 oracle
    starts = sorted({0, max(tq - SUBSET, 0)})
    k64, v64 = to_f64(ks), to_f64(vs)
    offs64 = np.asarray(offs, np.int64)
    for r0 in starts:
        r1 = min(r0 + SUBSET, tq)
        ref, ref_l = attention_reference(to_f64(qs[:, r0:r1]), k64, v64, causal=causal, scale=scale,
                                         q_offset=offs64 + r0)
        got = np.asarray(out[:, r0:r1].astype(jnp.float32), dtype=np.float64)
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol, err_msg=f"{gen} rows {r0}:{r1} vs f64")
        gl, fin = got_lse[:, :, r0:r1], np.isfinite(ref_l)
        np.testing.assert_allclose(gl[fin], ref_l[fin], rtol=LSE_RTOL, atol=LSE_ATOL,
                                   err_msg=f"{gen} lse rows {r0}:{r1} vs f64")


def _check(gen, q, k, v, *, causal, q_offset=0, dtype, config=None):
    b = q.shape[0]
    offs = np.broadcast_to(np.asarray(q_offset, np.int64), (b,))
    _poison(q.shape, q.dtype)
    out, lse = _attention(gen, q, k, v, causal=causal, q_offset=jnp.asarray(offs, jnp.int32), config=config)
    out, lse = jax.block_until_ready((out, lse))
    _compare(gen, out, lse, q, k, v, causal=causal, offs=offs, dtype=dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("n", [512, 2048, 8192])
@pytest.mark.parametrize("gen", PREFILL_GENS)
def test_prefill_reference_shapes(gen, n, d, causal):
    dtype = _dtype(gen)
    q, k, v = _inputs(n + d, b=1, tq=n, tk=n, h=8, d=d, dtype=dtype)
    _check(gen, q, k, v, causal=causal, dtype=dtype)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("gen", ["v3_online", "v4_fused", "v5_wmma"])
def test_long_sequence_stability(gen, d):
    dtype = _dtype(gen)
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
    if dtype == "float32":
        # the API refuses fp32 (no silent cast); the reference host's fp16 cast is asked of the kernel module
        from pallas_attn.kernels import v6_splitkv

        cfg = dataclasses.replace(v6_splitkv.CONFIGS[config], host_cast=True)
        zero = jnp.zeros((q.shape[0],), jnp.int32)
        out, lse = jax.block_until_ready(v6_splitkv.forward(
            q, k, v, causal=False, scale=1.0 / np.sqrt(q.shape[-1]), q_offset=zero, interpret=False, config=cfg,
            return_lse=True))
        _compare("v6_splitkv", out, lse, q, k, v, causal=False, offs=np.zeros(q.shape[0], np.int64), dtype=dtype)
        return
    _check("v6_splitkv", q, k, v, causal=False, dtype=dtype, config=config)


def test_v6_prefill_degenerates_to_one_split():
    q, k, v = _inputs(5, b=1, tq=512, tk=512, h=8, d=64, dtype="float16")
    _check("v6_splitkv", q, k, v, causal=True, dtype="float16")


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("gen", GENS)
def test_per_sequence_offsets_traced_under_jit(gen, d):
    """Offsets as data: one compiled function for two sets of per-sequence offsets (negative ones hide
    every key from the first rows: output exactly 0, LSE -inf)."""
    dtype = _dtype(gen)
    tq = 1 if gen == "v6_splitkv" else 300
    q, k, v = _inputs(11 + d, b=3, tq=tq, tk=1000, h=4, d=d, dtype=dtype)
    traces = []

    @jax.jit
    def f(q, k, v, off):
        traces.append(off.shape)
        return _attention(gen, q, k, v, causal=True, q_offset=off)

    for offs in ([-50, 0, 700], [999, -tq, 123] if tq > 1 else [999, -1, 123]):
        _poison(q.shape, q.dtype)
        out, lse = jax.block_until_ready(f(q, k, v, jnp.asarray(offs, jnp.int32)))
        _compare(gen, out, lse, q, k, v, causal=True, offs=np.asarray(offs), dtype=dtype)
        empty = np.isneginf(np.asarray(lse))  # [B, H, Tq]
        assert empty.any()
        assert np.all(np.asarray(out.astype(jnp.float32)).transpose(0, 2, 1, 3)[empty] == 0.0)
    assert traces == [(3,)]


@pytest.mark.parametrize("gen", GENS)
def test_nan_propagates(gen):
    """A NaN in q makes its row NaN; a NaN in k makes NaN exactly the rows that see that key (their
    output and LSE); rows that do not see it stay finite."""
    dtype = _dtype(gen)
    tq, tk = (1, 3000) if gen == "v6_splitkv" else (200, 300)
    q, k, v = (np.array(x.astype(jnp.float32)) for x in _inputs(17, b=2, tq=tq, tk=tk, h=2, d=64, dtype=dtype))
    key = 100
    q[0, tq - 1, 0, 5] = np.nan
    k[1, key, 0, 5] = np.nan
    offs = np.array([0, 50 if tq > 1 else 150], np.int64)
    out, lse = _attention(gen, *(jnp.asarray(x).astype(dtype) for x in (q, k, v)), causal=True,
                          q_offset=jnp.asarray(offs, jnp.int32))
    o_nan = np.isnan(np.asarray(out.astype(jnp.float32))).any(-1)  # [B, Tq, H]
    l_nan = np.isnan(np.asarray(lse))  # [B, H, Tq]
    want_q = np.arange(tq) == tq - 1
    sees = np.arange(tq) + offs[1] >= key
    assert np.array_equal(o_nan[0, :, 0], want_q) and np.array_equal(l_nan[0, 0], want_q), "q"
    assert np.array_equal(o_nan[1, :, 0], sees) and np.array_equal(l_nan[1, 0], sees), "k"
    assert not o_nan[:, :, 1].any() and not l_nan[:, 1].any()
