"""fa_train: frontier flash attention for training (forward + backward), Triton-lowered Pallas, BTNH layout.

What it is. The kernel behind ``pallas_attn.dot_product_attention`` (docs/dropin.md): dense attention with
causal masking, GQA, per-sequence query / key lengths and a local window, in fp16, bf16 or fp32, with a
``jax.custom_vjp`` whose backward runs as Pallas kernels too. It descends from v5_wmma (reference §2.5:
16-bit operands on tensor cores, fp32 accumulation, online softmax) and adds what training needs.

Forward (``pallas_attn_fa_train_fwd``): grid ``(ceil(Tq/BM), B*Hq)``. A program owns BM query rows of one
head and streams key blocks of BN from its KV head ``h // G`` (GQA: K/V are indexed in place, never
repeated). ``S = Q K^T`` on tensor cores (fp32 in: IEEE fp32 dots, no TF32), base-2 online softmax
(``softmax.step(base2=True)``: ``scale * log2(e)`` folded into one multiply), P rounded to the operand dtype
for ``P V`` (as jax.nn does), fp32 accumulator. It writes O (input dtype) and the natural-log LSE, fp32
``[B, Hq, Tq]``, the only residual the backward needs besides Q, K, V, O. The key loop only visits blocks
that a row of the program can see (causal / window / key-length bounds are traced loop bounds).

Backward: two kernels, no atomics, deterministic.

* ``delta = rowsum(dO * O) - dLSE`` in fp32, ``[B, Hq, Tq]``: one fused XLA elementwise-and-reduce (a
  separate Pallas pass would read the same bytes; XLA fuses it with the transposes for free). Subtracting
  the LSE cotangent makes ``return_lse`` differentiable at no cost: ``dS = P * (dP - delta)`` covers both.
* ``pallas_attn_fa_train_dkdv``: grid ``(ceil(Tk/BN), B*Hkv)``. A program owns BN keys of one **KV head** and
  loops over the G query heads of its group and over the query blocks that can see its keys, recomputing
  ``P = exp2(S*scale*log2e - LSE*log2e)``; ``dV += P^T dO``, ``dK += dS^T Q``. Summing the group inside the
  program gives GQA's dK / dV without materialising repeated K/V and without a reduction afterwards.
* ``pallas_attn_fa_train_dq``: grid ``(ceil(Tq/BM), B*Hq)``, the forward's loop structure: ``dQ += dS K``.

Why two kernels instead of one with atomic dQ updates (FlashAttention-2's single backward): Pallas' Triton
lowering has fp32 atomic adds, but their summation order changes run to run (non-deterministic gradients),
and the dQ pass costs one extra read of K/V and recomputation of S, about 20% more FLOPs than the minimum
(docs/dropin.md has the roofline). Determinism is worth more to a training user than that.

Masking (everything is top-left, one query offset per sequence, key ``j`` and query ``i`` of sequence ``b``):
visible iff ``i < q_len[b]`` and ``j < kv_len[b]`` and (causal) ``j <= i + q_offset[b]`` and (window
``(left, right)``) ``i + q_offset[b] - left <= j <= i + q_offset[b] + right``. jax.nn's semantics are the
``q_offset = 0`` case. A row with no visible key outputs 0 with LSE -inf (the contract's rule);
``dropin`` turns such rows into what jax.nn returns (the mean of V) outside the kernel.

NaN in, NaN out: a NaN score poisons its row's ``m`` and ``l`` and ``finalize`` keeps it NaN; the backward's
``P`` recomputed from a NaN LSE is NaN, so NaN reaches dQ/dK/dV as it does in jax.nn's XLA path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat
from .._compat import load, pl, store
from . import common as c
from . import seqlen, softmax
from .contract import Backward, Kernel, Precision, Problem
from .launches import Launch, cdiv

__all__ = ["TrainConfig", "CONFIGS", "KERNEL", "forward", "attention_lse", "heuristic", "HEAD_DIMS"]

GEN = "fa_train"
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = ("float16", "bfloat16", "float32")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Block sizes and Triton launch knobs of the three passes (clamped to the problem at launch).

    fwd_block_m x fwd_block_n: query rows x keys per forward step; bwd_block_m x bwd_block_n: the same for
    both backward kernels (the dK/dV kernel owns ``bwd_block_n`` keys, the dQ kernel ``bwd_block_m`` rows).
    """

    fwd_block_m: int = 128
    fwd_block_n: int = 64
    fwd_num_warps: int = 8
    fwd_num_stages: int = 3
    bwd_block_m: int = 64
    bwd_block_n: int = 64
    bwd_num_warps: int = 8
    bwd_num_stages: int = 2

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("fwd_block_m", "fwd_block_n", "bwd_block_m", "bwd_block_n"):
            c.check_pow2(owner, name, getattr(self, name), minimum=16)  # tensor-core dot: every dim >= 16
        for name in ("fwd_num_warps", "bwd_num_warps"):
            c.check_pow2(owner, name, getattr(self, name))
        for name in ("fwd_num_stages", "bwd_num_stages"):
            c.check_positive(owner, name, getattr(self, name))


# "default": a starting point for the H100 (FA-2 Triton practice for D = 128: 128x64 forward tiles with 8
# warps and 3 stages, 64x64 backward tiles); the lead measures it. "small": for D = 256 or fp32, whose tiles
# hold twice the registers.
CONFIGS: dict[str, TrainConfig] = {
    "default": TrainConfig(),
    "d64": TrainConfig(fwd_block_m=128, fwd_block_n=64, fwd_num_warps=4, fwd_num_stages=3,
                       bwd_block_m=64, bwd_block_n=64, bwd_num_warps=4, bwd_num_stages=2),
    "small": TrainConfig(fwd_block_m=64, fwd_block_n=32, fwd_num_warps=4, fwd_num_stages=2,
                         bwd_block_m=32, bwd_block_n=32, bwd_num_warps=4, bwd_num_stages=1),
}


def heuristic(problem: Problem) -> TrainConfig:
    """The config for a problem: "small" for D = 256 or fp32 operands, "d64" for D <= 64, else "default"."""
    if problem.head_dim >= 256 or problem.dtype == "float32":
        return CONFIGS["small"]
    if problem.head_dim <= 64:
        return CONFIGS["d64"]
    return CONFIGS["default"]


def _clamp_block(block: int, n: int) -> int:
    """A block no larger than the next power of two >= n (>= 16): tiny problems do not pay for 128 rows."""
    return max(16, min(block, c.next_pow2(n)))


@dataclasses.dataclass(frozen=True)
class _Static:
    """Everything static about one call (hashable: a custom_vjp non-differentiable argument)."""

    scale: float
    causal: bool
    window: tuple[int, int] | None
    config: TrainConfig
    interpret: bool


# --------------------------------------------------------------------------------------------------------
# masking helpers (in-kernel, traced)
# --------------------------------------------------------------------------------------------------------


def _visible(rows, cols, *, qlen, kvlen, off, causal: bool, window):
    """[R, N] visibility of keys ``cols`` to query rows ``rows`` (module docstring's rule)."""
    ok = (rows[:, None] < qlen) & (cols[None, :] < kvlen)
    if causal:
        ok = ok & (cols[None, :] <= rows[:, None] + off)
    if window is not None:
        left, right = window
        ok = ok & (cols[None, :] >= rows[:, None] + (off - left)) & (cols[None, :] <= rows[:, None] + (off + right))
    return ok


def _key_range(i_first, i_last, *, kvlen, off, causal: bool, window, bn: int):
    """``(lo, n_blocks)``: the key blocks that rows ``[i_first, i_last]`` can see, ``lo`` aligned to ``bn``."""
    hi = kvlen
    lo = jnp.int32(0)
    if causal:
        hi = jnp.minimum(hi, i_last + off + 1)
    if window is not None:
        left, right = window
        hi = jnp.minimum(hi, i_last + off + right + 1)
        lo = jnp.maximum(lo, i_first + off - left)
    lo = lax.div(lo, jnp.int32(bn)) * bn  # lo >= 0: truncation is floor
    return lo, c.cdiv(jnp.maximum(hi - lo, 0), bn)


def _query_range(j_first, j_last, *, qlen, off, causal: bool, window, bm: int):
    """``(lo, n_blocks)``: the query blocks that can see a key in ``[j_first, j_last]``, ``lo`` aligned."""
    lo = jnp.int32(0)
    hi = qlen
    if causal:
        lo = jnp.maximum(lo, j_first - off)
    if window is not None:
        left, right = window
        lo = jnp.maximum(lo, j_first - off - right)
        hi = jnp.minimum(hi, j_last - off + left + 1)
    lo = lax.div(lo, jnp.int32(bm)) * bm
    return lo, c.cdiv(jnp.maximum(hi - lo, 0), bm)


def _seq(qlen_ref, kvlen_ref, off_ref, b, *, tq: int, tk: int):
    """Sequence ``b``'s (q_len, kv_len, q_offset), clamped so that no bound arithmetic overflows int32."""
    qlen = jnp.clip(qlen_ref[b], 0, tq)
    kvlen = jnp.clip(kvlen_ref[b], 0, tk)
    off = jnp.clip(off_ref[b], -(tq + tk), tq + tk)
    return qlen, kvlen, off


def _rows_mask(rows, n, d: int):
    return jnp.broadcast_to((rows < n)[:, None], (rows.shape[0], d))


# --------------------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------------------


def _fwd_kernel(qlen_ref, kvlen_ref, off_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale_log2, heads, tq, tk,
                causal, window, bm, bn, prec):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * bm
    b = pl.program_id(1) // heads
    qlen, kvlen, off = _seq(qlen_ref, kvlen_ref, off_ref, b, tq=tq, tk=tk)
    rows = i0 + jnp.arange(bm, dtype=jnp.int32)
    q = load(q_ref.at[pl.ds(i0, bm), :], mask=_rows_mask(rows, tq, d), other=0.0)
    i_last = jnp.minimum(i0 + bm, qlen) - 1
    lo, n_blocks = _key_range(i0, i_last, kvlen=kvlen, off=off, causal=causal, window=window, bn=bn)
    n_blocks = jnp.where(i0 < qlen, n_blocks, 0)

    def body(t, carry):
        m, l, acc = carry
        j0 = lo + t * bn
        cols = j0 + jnp.arange(bn, dtype=jnp.int32)
        kmask = _rows_mask(cols, kvlen, d)
        k = load(k_ref.at[pl.ds(j0, bn), :], mask=kmask, other=0.0)
        v = load(v_ref.at[pl.ds(j0, bn), :], mask=kmask, other=0.0)
        s = c.dot_nt(q, k, precision=prec) * scale_log2
        vis = _visible(rows, cols, qlen=qlen, kvlen=kvlen, off=off, causal=causal, window=window)
        m, l, alpha, p = softmax.step(m, l, s, vis, base2=True)
        acc = acc * alpha[:, None] + c.dot_nn(p.astype(v.dtype), v, precision=prec)
        return m, l, acc

    m, l, acc = lax.fori_loop(0, n_blocks, body, softmax.init_state((bm,), d))
    store(o_ref.at[pl.ds(i0, bm), :], softmax.finalize(acc, l).astype(o_ref.dtype), mask=_rows_mask(rows, tq, d))
    store(lse_ref.at[pl.ds(i0, bm)], softmax.lse(m, l, base2=True), mask=rows < tq)


def _specs_btnh(t: int, d: int, h_total: int, heads_div: int = 1) -> pl.BlockSpec:
    def index_map(i, bh):
        return (bh // h_total, 0, (bh % h_total) // heads_div, 0)

    return pl.BlockSpec((None, t, None, d), index_map)


def _spec_lse(tq: int, h_total: int) -> pl.BlockSpec:
    return pl.BlockSpec((None, None, tq), lambda i, bh: (bh // h_total, bh % h_total, 0))


def _spec_lens(batch: int) -> pl.BlockSpec:
    return pl.BlockSpec((batch,), lambda *g: (0,))


def _precision(dtype):
    return c.FP32_EXACT if jnp.dtype(dtype) == jnp.float32 else None


def _fwd_call(q, k, v, qlens, kvlens, offs, st: _Static):
    b, tq, hq, d = q.shape
    _, tk, hkv, _ = k.shape
    cfg = st.config
    bm, bn = _clamp_block(cfg.fwd_block_m, tq), _clamp_block(cfg.fwd_block_n, tk)
    kern = functools.partial(
        _fwd_kernel, scale_log2=st.scale * softmax.LOG2E, heads=hq, tq=tq, tk=tk, causal=st.causal,
        window=st.window, bm=bm, bn=bn, prec=_precision(q.dtype))
    out, lse = pl.pallas_call(
        kern,
        out_shape=(jax.ShapeDtypeStruct((b, tq, hq, d), q.dtype), jax.ShapeDtypeStruct((b, hq, tq), jnp.float32)),
        grid=(c.cdiv(tq, bm), b * hq),
        in_specs=[_spec_lens(b), _spec_lens(b), _spec_lens(b), _specs_btnh(tq, d, hq),
                  _specs_btnh(tk, d, hq, hq // hkv), _specs_btnh(tk, d, hq, hq // hkv)],
        out_specs=(_specs_btnh(tq, d, hq), _spec_lse(tq, hq)),
        compiler_params=_compat.triton_params(num_warps=cfg.fwd_num_warps, num_stages=cfg.fwd_num_stages),
        interpret=st.interpret,
        name=f"pallas_attn_{GEN}_fwd",
    )(qlens, kvlens, offs, q, k, v)
    return out, lse


# --------------------------------------------------------------------------------------------------------
# backward
# --------------------------------------------------------------------------------------------------------


def _dot_tn(a, b, *, precision=None):
    """``a [K, M]^T . b [K, N] -> [M, N]`` in fp32 (the transposed operand stays in registers)."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), precision=precision, preferred_element_type=jnp.float32)


def _dkdv_kernel(qlen_ref, kvlen_ref, off_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, *,
                 scale, heads_kv, group, tq, tk, causal, window, bm, bn, prec):
    d = k_ref.shape[-1]
    j0 = pl.program_id(0) * bn
    b = pl.program_id(1) // heads_kv
    qlen, kvlen, off = _seq(qlen_ref, kvlen_ref, off_ref, b, tq=tq, tk=tk)
    cols = j0 + jnp.arange(bn, dtype=jnp.int32)
    kmask = _rows_mask(cols, kvlen, d)
    k = load(k_ref.at[pl.ds(j0, bn), :], mask=kmask, other=0.0)
    v = load(v_ref.at[pl.ds(j0, bn), :], mask=kmask, other=0.0)
    j_last = jnp.minimum(j0 + bn, kvlen) - 1
    lo, n_blocks = _query_range(j0, j_last, qlen=qlen, off=off, causal=causal, window=window, bm=bm)
    n_blocks = jnp.where(j0 < kvlen, n_blocks, 0)
    scale_log2 = scale * softmax.LOG2E

    def head(g, carry):
        def body(t, carry):
            dk, dv = carry
            i0 = lo + t * bm
            rows = i0 + jnp.arange(bm, dtype=jnp.int32)
            rmask = _rows_mask(rows, tq, d)
            q = load(q_ref.at[pl.ds(i0, bm), g, pl.ds(0, d)], mask=rmask, other=0.0)
            do = load(do_ref.at[pl.ds(i0, bm), g, pl.ds(0, d)], mask=rmask, other=0.0)
            lse = load(lse_ref.at[g, pl.ds(i0, bm)], mask=rows < tq, other=0.0)
            delta = load(delta_ref.at[g, pl.ds(i0, bm)], mask=rows < tq, other=0.0)
            s = c.dot_nt(q, k, precision=prec) * scale_log2
            vis = _visible(rows, cols, qlen=qlen, kvlen=kvlen, off=off, causal=causal, window=window)
            p = jnp.where(vis, jnp.exp2(s - (lse * softmax.LOG2E)[:, None]), 0.0)
            dv = dv + _dot_tn(p.astype(do.dtype), do, precision=prec)
            dp = c.dot_nt(do, v, precision=prec)
            ds = p * (dp - delta[:, None])
            dk = dk + _dot_tn(ds.astype(q.dtype), q, precision=prec)
            return dk, dv

        return lax.fori_loop(0, n_blocks, body, carry)

    zeros = jnp.zeros((bn, d), jnp.float32)
    dk, dv = lax.fori_loop(0, group, head, (zeros, zeros))
    omask = _rows_mask(cols, tk, d)
    store(dk_ref.at[pl.ds(j0, bn), :], (dk * scale).astype(dk_ref.dtype), mask=omask)
    store(dv_ref.at[pl.ds(j0, bn), :], dv.astype(dv_ref.dtype), mask=omask)


def _dq_kernel(qlen_ref, kvlen_ref, off_ref, q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, *, scale, heads,
               tq, tk, causal, window, bm, bn, prec):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * bm
    b = pl.program_id(1) // heads
    qlen, kvlen, off = _seq(qlen_ref, kvlen_ref, off_ref, b, tq=tq, tk=tk)
    rows = i0 + jnp.arange(bm, dtype=jnp.int32)
    rmask = _rows_mask(rows, tq, d)
    q = load(q_ref.at[pl.ds(i0, bm), :], mask=rmask, other=0.0)
    do = load(do_ref.at[pl.ds(i0, bm), :], mask=rmask, other=0.0)
    lse2 = load(lse_ref.at[pl.ds(i0, bm)], mask=rows < tq, other=0.0) * softmax.LOG2E
    delta = load(delta_ref.at[pl.ds(i0, bm)], mask=rows < tq, other=0.0)
    i_last = jnp.minimum(i0 + bm, qlen) - 1
    lo, n_blocks = _key_range(i0, i_last, kvlen=kvlen, off=off, causal=causal, window=window, bn=bn)
    n_blocks = jnp.where(i0 < qlen, n_blocks, 0)
    scale_log2 = scale * softmax.LOG2E

    def body(t, dq):
        j0 = lo + t * bn
        cols = j0 + jnp.arange(bn, dtype=jnp.int32)
        kmask = _rows_mask(cols, kvlen, d)
        k = load(k_ref.at[pl.ds(j0, bn), :], mask=kmask, other=0.0)
        v = load(v_ref.at[pl.ds(j0, bn), :], mask=kmask, other=0.0)
        s = c.dot_nt(q, k, precision=prec) * scale_log2
        vis = _visible(rows, cols, qlen=qlen, kvlen=kvlen, off=off, causal=causal, window=window)
        p = jnp.where(vis, jnp.exp2(s - lse2[:, None]), 0.0)
        dp = c.dot_nt(do, v, precision=prec)
        ds = p * (dp - delta[:, None])
        return dq + c.dot_nn(ds.astype(k.dtype), k, precision=prec)

    dq = lax.fori_loop(0, n_blocks, body, jnp.zeros((bm, d), jnp.float32))
    store(dq_ref.at[pl.ds(i0, bm), :], (dq * scale).astype(dq_ref.dtype), mask=rmask)


def _bwd_call(q, k, v, qlens, kvlens, offs, out, lse, dout, dlse, st: _Static):
    b, tq, hq, d = q.shape
    _, tk, hkv, _ = k.shape
    g = hq // hkv
    cfg = st.config
    bm, bn = _clamp_block(cfg.bwd_block_m, tq), _clamp_block(cfg.bwd_block_n, tk)
    prec = _precision(q.dtype)
    # delta_i = sum_d dO_id O_id - dLSE_i (fp32): dS = P (dP - delta) is then the cotangent of both outputs
    delta = jnp.einsum("bthd,bthd->bht", dout.astype(jnp.float32), out.astype(jnp.float32),
                       precision=lax.Precision.HIGHEST) - dlse.astype(jnp.float32)
    params = _compat.triton_params(num_warps=cfg.bwd_num_warps, num_stages=cfg.bwd_num_stages)
    lens = [_spec_lens(b)] * 3

    def kv_spec(t):
        return pl.BlockSpec((None, t, None, d), lambda j, bh: (bh // hkv, 0, bh % hkv, 0))

    def group_spec(t):  # the G query heads of KV head h: heads [h*G, (h+1)*G)
        return pl.BlockSpec((None, t, g, d), lambda j, bh: (bh // hkv, 0, bh % hkv, 0))

    group_lse = pl.BlockSpec((None, g, tq), lambda j, bh: (bh // hkv, bh % hkv, 0))
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_kernel, scale=st.scale, heads_kv=hkv, group=g, tq=tq, tk=tk, causal=st.causal,
                          window=st.window, bm=bm, bn=bn, prec=prec),
        out_shape=(jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)),
        grid=(c.cdiv(tk, bn), b * hkv),
        in_specs=[*lens, group_spec(tq), kv_spec(tk), kv_spec(tk), group_spec(tq), group_lse, group_lse],
        out_specs=(kv_spec(tk), kv_spec(tk)),
        compiler_params=params, interpret=st.interpret, name=f"pallas_attn_{GEN}_dkdv",
    )(qlens, kvlens, offs, q, k, v, dout, lse, delta)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, scale=st.scale, heads=hq, tq=tq, tk=tk, causal=st.causal, window=st.window,
                          bm=bm, bn=bn, prec=prec),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(c.cdiv(tq, bm), b * hq),
        in_specs=[*lens, _specs_btnh(tq, d, hq), _specs_btnh(tk, d, hq, g), _specs_btnh(tk, d, hq, g),
                  _specs_btnh(tq, d, hq), _spec_lse(tq, hq), _spec_lse(tq, hq)],
        out_specs=_specs_btnh(tq, d, hq),
        compiler_params=params, interpret=st.interpret, name=f"pallas_attn_{GEN}_dq",
    )(qlens, kvlens, offs, q, k, v, dout, lse, delta)
    return dq, dk, dv


# --------------------------------------------------------------------------------------------------------
# custom_vjp
# --------------------------------------------------------------------------------------------------------


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attn(q, k, v, qlens, kvlens, offs, st: _Static):
    return _fwd_call(q, k, v, qlens, kvlens, offs, st)


def _attn_fwd(q, k, v, qlens, kvlens, offs, st: _Static):
    out, lse = _fwd_call(q, k, v, qlens, kvlens, offs, st)
    return (out, lse), (q, k, v, qlens, kvlens, offs, out, lse)


def _int_zero(x):
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def _attn_bwd(st: _Static, res, cts):
    q, k, v, qlens, kvlens, offs, out, lse = res
    dout, dlse = cts
    dq, dk, dv = _bwd_call(q, k, v, qlens, kvlens, offs, out, lse, dout, dlse, st)
    return dq, dk, dv, _int_zero(qlens), _int_zero(kvlens), _int_zero(offs)


_attn.defvjp(_attn_fwd, _attn_bwd)


def check_shapes(q, k, v) -> None:
    """What the kernel relies on (the public entries validate first; this guards direct calls)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{GEN}: q, k, v must be rank 4 BTNH; got {q.shape=}, {k.shape=}, {v.shape=}")
    b, _, hq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"{GEN}: k and v must be [B={b}, Tk, Hkv, D={d}]; got {k.shape=}, {v.shape=}")
    if hq % k.shape[2]:
        raise ValueError(f"{GEN}: Hq must be a multiple of Hkv; got Hq={hq}, Hkv={k.shape[2]}")
    names = {jnp.dtype(x.dtype).name for x in (q, k, v)}
    if len(names) != 1 or next(iter(names)) not in DTYPES:
        raise NotImplementedError(f"{GEN} takes q, k, v of one dtype in {DTYPES}; got {q.dtype=}, {k.dtype=}, "
                                  f"{v.dtype=}")
    if d not in HEAD_DIMS:
        raise NotImplementedError(f"{GEN} supports head dims {HEAD_DIMS}; got D={d}")


def _lens(x, batch: int, default: int, name: str):
    if x is None:
        return jnp.full((batch,), default, jnp.int32)
    if tuple(x.shape) != (batch,) or jnp.dtype(x.dtype) != jnp.int32:
        raise ValueError(f"{name} must be int32 [B={batch}]; got shape {tuple(x.shape)}, dtype {x.dtype}")
    return x


def _window(window, tq: int, tk: int):
    if window is None:
        return None
    lim = tq + tk  # any bound beyond this is equivalent (and keeps int32 bound arithmetic in range)
    left, right = (int(w) for w in window)
    return (max(-lim, min(left, lim)), max(-lim, min(right, lim)))


def attention_lse(q, k, v, *, causal: bool, scale: float, q_offset=None, q_lens=None, kv_lens=None, window=None,
                  interpret: bool, config: TrainConfig):
    """``(out, lse)``, differentiable in q, k, v (and through the LSE). ``q_offset``/``q_lens``/``kv_lens``:
    int32 ``[B]`` or None (0 / Tq / Tk); ``window``: None or ``(left, right)`` static ints."""
    b, tq, tk, offs, st = _call_statics(q, k, v, causal=causal, scale=scale, q_offset=q_offset, window=window,
                                        interpret=interpret, config=config)
    return _attn(q, k, v, _lens(q_lens, b, tq, "q_lens"), _lens(kv_lens, b, tk, "kv_lens"), offs, st)


def _call_statics(q, k, v, *, causal, scale, q_offset, window, interpret, config):
    """Shapes checked; ``(b, tq, tk, offsets, _Static)`` of one call."""
    check_shapes(q, k, v)
    b, tq = q.shape[:2]
    tk = k.shape[1]
    offs = seqlen.q_offsets(0 if q_offset is None else q_offset, b)
    st = _Static(scale=float(scale), causal=bool(causal), window=_window(window, tq, tk), config=config,
                 interpret=bool(interpret))
    return b, tq, tk, offs, st


def backward(q, k, v, out, lse, dout, *, causal: bool, scale: float, q_offset=None, window=None, interpret: bool,
             config: TrainConfig, dlse=None):
    """``(dq, dk, dv)`` of attention from a forward's ``out`` and natural-log ``lse`` ``[B, Hq, Tq]`` (fp32), by this
    module's backward kernels: the backward the drop-in pairs with fa_prefill's forward where fa_prefill's own
    backward lacks a mask (a window). Same mask arguments as ``attention_lse`` (no sequence lengths)."""
    b, tq, tk, offs, st = _call_statics(q, k, v, causal=causal, scale=scale, q_offset=q_offset, window=window,
                                        interpret=interpret, config=config)
    dlse = jnp.zeros(lse.shape, jnp.float32) if dlse is None else dlse
    with _compat.quiet_triton():
        return _bwd_call(q, k, v, _lens(None, b, tq, "q_lens"), _lens(None, b, tk, "kv_lens"), offs, out, lse, dout,
                         dlse, st)


def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool, config: TrainConfig = CONFIGS["default"],
            return_lse: bool = False):
    """The contract's dense entry: BTNH in (fp16 / bf16 / fp32), output in q's dtype, differentiable
    (``jax.grad`` runs the Pallas backward). With ``return_lse``: ``(out, lse [B, Hq, Tq] fp32)``."""
    out, lse = attention_lse(q, k, v, causal=causal, scale=scale, q_offset=q_offset, interpret=interpret,
                             config=config)
    return (out, lse) if return_lse else out


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: TrainConfig) -> dict[str, Any]:
    p = problem
    fm, fn = _clamp_block(config.fwd_block_m, p.q_len), _clamp_block(config.fwd_block_n, p.kv_len)
    bm, bn = _clamp_block(config.bwd_block_m, p.q_len), _clamp_block(config.bwd_block_n, p.kv_len)
    return {
        "fwd": {"grid": [c.cdiv(p.q_len, fm), p.batch * p.heads_q], "block_m": fm, "block_n": fn,
                "num_warps": config.fwd_num_warps, "num_stages": config.fwd_num_stages},
        "dkdv": {"grid": [c.cdiv(p.kv_len, bn), p.batch * p.heads_kv], "block_m": bm, "block_n": bn,
                 "group": p.group, "num_warps": config.bwd_num_warps, "num_stages": config.bwd_num_stages},
        "dq": {"grid": [c.cdiv(p.q_len, bm), p.batch * p.heads_q], "block_m": bm, "block_n": bn,
               "num_warps": config.bwd_num_warps, "num_stages": config.bwd_num_stages},
    }


_TC = "tensor cores, fp32 accumulation, base-2 online softmax; P rounded to the operand dtype before P V"

def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan). fa_train's
    forward (Triton; the timed call is the forward): grid (query blocks, B*Hq), ``block_n``-key
    blocks, two tensor-core dots per block; the MMA work at the datasheet rate and a fitted latency per block.
    fp32 inputs run the fp32 dot (not modelled apart: see docs/roofline.md)."""
    del hw, cfg
    f = lp["fwd"]
    bm, bn = f["block_m"], f["block_n"]
    P = math.prod(f["grid"])
    d = s.head_dim
    tiles = max(1.0, cdiv(s.kv_len, bn) * (s.vis_frac if s.q_len > bm else 1.0))
    kv = 2 * s.batch * s.heads_kv * s.kv_len * d * s.in_bytes
    pad_m = max(bm, 16)
    return [Launch(names[0], "pallas_attn_fa_train_fwd", P, 32 * f["num_warps"], 128,
                   (bm * d + 2 * bn * d * max(1, f["num_stages"] - 1)) * s.in_bytes, units=0.0, steps=tiles,
                   mma=4 * pad_m * bn * d * tiles, dram_bytes=kv + s.bh * s.q_len * d * s.in_bytes * 2,
                   l2_bytes=P * tiles * 2 * bn * d * s.in_bytes, unit="-",
                   note=f"{bm} rows x {bn}-key blocks, {tiles:.0f} per program")]


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_fwd", f"pallas_attn_{GEN}_dkdv", f"pallas_attn_{GEN}_dq"),
    config_cls=TrainConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=DTYPES,
    precision={
        "float16": Precision("fp16", "fp32", "tensor", _TC),
        "bfloat16": Precision("bf16", "fp32", "tensor", _TC),
        "float32": Precision("fp32", "fp32", "fp32",
                             "IEEE fp32 dots (no TF32, no cast): matches jax.nn in float32 to ~1e-6"),
    },
    head_dims=HEAD_DIMS,
    gqa=True,
    max_q_len=None,
    dense=forward,
    heuristic=heuristic,
    plan=plan,
    launches=launches,
    # its one TrainConfig sets the backward kernels too: no backward configs of their own
    backward=Backward("jax.custom_vjp over its Pallas dK/dV and dQ kernels (the LSE saved by the forward)",
                      entries={"attention", "dot_product_attention"}),
)
