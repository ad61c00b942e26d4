"""v3_online: two passes, row statistics (M, L) in HBM, S never materialized (ORIGINAL.md §2.3).

Delta from v2_tiled: the score matrix is recomputed instead of stored. The only HBM scratch is FP32
``M, L [B*H, Tq]``.

* ``pallas_attn_v3_online_stats``: grid (ceil(Tq/TM), B·H); streams key tiles of TN, keeps the running
  row max M and denominator L with the online recurrence (§2.0), writes them to HBM.
* ``pallas_attn_v3_online_out``: same grid; recomputes every score, ``p = exp(s - M) / L`` with the final
  statistics (so the output accumulator is never rescaled), accumulates ``p V`` in FP32 and stores it.

Tiles are v2's (TM = TN = 64 for D = 64, 32 for D = 128). Causal programs stop at the last key their
last row can see (the reference: each row stops at its first ``j > i``).

Differences from the CUDA original: there one *thread* owns a query row and computes its scores one at a
time (64 or 32 of 256 threads active) and pass 2 reads K, V unstaged from global memory; here a program
computes a TM x TN score tile with an IEEE-FP32 ``dot`` (CUDA-core FMAs, ``precision=HIGHEST``) and
Triton decides the caching. The update is per tile, not per key (same arithmetic, fewer rescales).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from .._compat import load, pl, store, triton_params
from . import common as c

GEN = "v3_online"


@dataclasses.dataclass(frozen=True)
class OnlineConfig(c.SquareTiles):
    """TM = TN per head dim; one thread per query row in the reference (TM of 256 threads active)."""

    generation = GEN


CONFIGS: dict[str, OnlineConfig] = {"faithful": OnlineConfig()}


def _scores(q_tile, k_ref, cb, rows, *, scale, tk, tn, causal, q_offset):
    d = k_ref.shape[-1]
    cols = cb * tn + jnp.arange(tn)
    kt = load(k_ref.at[pl.ds(cb * tn, tn), :], mask=c.row_mask(cols, tk, d), other=0.0)
    s = c.dot_nt(q_tile, kt, precision=c.FP32_EXACT) * scale
    return s, c.visible(rows[:, None], cols[None, :], tk=tk, causal=causal, q_offset=q_offset), cols


def _bounds(ib, *, tm, tq, tk, tn, causal, q_offset):
    rows = ib * tm + jnp.arange(tm)
    last = jnp.minimum(ib * tm + tm, tq) - 1
    return rows, c.cdiv(c.key_limit(last, tk=tk, causal=causal, q_offset=q_offset), tn)


def _stats_kernel(q_ref, k_ref, m_ref, l_ref, *, scale, tq, tk, tm, tn, causal, q_offset):
    ib = pl.program_id(0)
    d = q_ref.shape[-1]
    rows, n_tiles = _bounds(ib, tm=tm, tq=tq, tk=tk, tn=tn, causal=causal, q_offset=q_offset)
    qt = load(q_ref.at[pl.ds(ib * tm, tm), :], mask=c.row_mask(rows, tq, d), other=0.0)

    def body(cb, carry):
        m, l = carry
        s, vis, _ = _scores(qt, k_ref, cb, rows, scale=scale, tk=tk, tn=tn, causal=causal, q_offset=q_offset)
        m, l, _, _ = c.online_softmax_step(m, l, s, vis)
        return m, l

    init = (jnp.full((tm,), c.NEG_BIG, jnp.float32), jnp.zeros((tm,), jnp.float32))
    m, l = lax.fori_loop(0, n_tiles, body, init)
    rmask = rows < tq
    store(m_ref.at[pl.ds(ib * tm, tm)], m, mask=rmask)
    store(l_ref.at[pl.ds(ib * tm, tm)], l, mask=rmask)


def _out_kernel(q_ref, k_ref, v_ref, m_ref, l_ref, o_ref, *, scale, tq, tk, tm, tn, causal, q_offset):
    ib = pl.program_id(0)
    d = q_ref.shape[-1]
    rows, n_tiles = _bounds(ib, tm=tm, tq=tq, tk=tk, tn=tn, causal=causal, q_offset=q_offset)
    rmask = rows < tq
    qt = load(q_ref.at[pl.ds(ib * tm, tm), :], mask=c.row_mask(rows, tq, d), other=0.0)
    m = load(m_ref.at[pl.ds(ib * tm, tm)], mask=rmask, other=0.0)
    l = load(l_ref.at[pl.ds(ib * tm, tm)], mask=rmask, other=0.0)
    inv_l = jnp.where(l > 0, 1.0 / jnp.where(l > 0, l, 1.0), 0.0)  # an empty row gives 0, not NaN

    def body(cb, acc):
        s, vis, cols = _scores(qt, k_ref, cb, rows, scale=scale, tk=tk, tn=tn, causal=causal,
                               q_offset=q_offset)
        p = jnp.where(vis, jnp.exp(s - m[:, None]) * inv_l[:, None], 0.0)
        vt = load(v_ref.at[pl.ds(cb * tn, tn), :], mask=c.row_mask(cols, tk, d), other=0.0)
        return acc + c.dot_nn(p, vt, precision=c.FP32_EXACT)

    acc = lax.fori_loop(0, n_tiles, body, jnp.zeros((tm, d), jnp.float32))
    store(o_ref.at[pl.ds(ib * tm, tm), :], acc.astype(o_ref.dtype), mask=c.row_mask(rows, tq, d))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "q_offset", "interpret", "config"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset: int, interpret: bool,
            config: OnlineConfig = CONFIGS["faithful"]):
    """BTNH FP32 in, FP32 out; only ``M, L [B*H, Tq]`` FP32 go through HBM between the passes."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    if q.dtype != jnp.float32:
        raise NotImplementedError(f"{GEN} takes float32 only (as the reference); got {q.dtype}")
    t = config.tile(d)
    kw = dict(scale=scale, tq=tq, tk=tk, tm=t, tn=t, causal=causal, q_offset=q_offset)
    params = triton_params(num_warps=config.num_warps, num_stages=config.num_stages)
    grid = (c.cdiv(tq, t), b * h)
    q_spec, kv_spec = c.btnh_spec(tq, d, h, bh_axis=1), c.btnh_spec(tk, d, h, bh_axis=1)
    stat_spec = c.full_spec((b * h, tq), bh_axis=1)
    stat_shape = jax.ShapeDtypeStruct((b * h, tq), jnp.float32)
    m, l = pl.pallas_call(
        functools.partial(_stats_kernel, **kw),
        out_shape=(stat_shape, stat_shape),
        grid=grid,
        in_specs=[q_spec, kv_spec],
        out_specs=(stat_spec, stat_spec),
        compiler_params=params,
        interpret=interpret,
        name=f"pallas_attn_{GEN}_stats",
    )(q, k)
    return pl.pallas_call(
        functools.partial(_out_kernel, **kw),
        out_shape=jax.ShapeDtypeStruct((b, tq, h, d), q.dtype),
        grid=grid,
        in_specs=[q_spec, kv_spec, kv_spec, stat_spec, stat_spec],
        out_specs=q_spec,
        compiler_params=params,
        interpret=interpret,
        name=f"pallas_attn_{GEN}_out",
    )(q, k, v, m, l)
