"""v3_online: two passes, row statistics (M, L) in HBM, S never materialized (docs/reference.md §2.3).

Delta from v2_tiled: the score matrix is recomputed instead of stored. The only HBM scratch is FP32
``M, L [B*H, Tq]``.

* ``pallas_attn_v3_online_stats``: grid (ceil(Tq/TM), B·H); streams key tiles of TN, keeps the running
  row max M and denominator L with the online recurrence (§2.0), writes them to HBM.
* ``pallas_attn_v3_online_out``: same grid; recomputes every score, ``p = exp(s - M) / L`` with the final
  statistics (so the output accumulator is never rescaled), accumulates ``p V`` in FP32 and stores it.

Tiles are v2's (TM = TN = 64 for D = 64, 32 for D = 128). Causal programs stop at the last key their
last row can see (the reference: each row stops at its first ``j > i``); with a per-sequence ``q_offset``
(int32 ``[B]``, an input of both passes, read once per program) that bound is a traced loop bound.

``return_lse=True``: the output pass, which already reads the final ``M, L``, also writes the rows'
natural-log LSE ``M + log L`` (-inf for a row with no visible key) as FP32 ``[B*H, Tq]`` = ``[B, H, Tq]``.
With ``return_lse=False`` the passes write exactly M, L and O. A NaN score makes ``M``/``L`` NaN and the
row's output NaN (1/L is taken unless L is exactly 0, never guarded by ``L > 0``).

Differences from the CUDA original: there one *thread* owns a query row and computes its scores one at a
time (64 or 32 of 256 threads active) and pass 2 reads K, V unstaged from global memory; here a program
computes a TM x TN score tile with an IEEE-FP32 ``dot`` (CUDA-core FMAs, ``precision=HIGHEST``) and
Triton decides the caching. The update is per tile, not per key (same arithmetic, fewer rescales).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .._compat import load, pl, store, triton_params
from . import common as c
from . import launches as _l
from . import seqlen, softmax
from .contract import Kernel, Precision, Problem

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


def _program(off_ref, *, heads, tm, tq, tk, tn, causal):
    """This program's rows, its sequence's offset (None when not causal) and its key-tile count."""
    ib, bh = pl.program_id(0), pl.program_id(1)
    rows = ib * tm + jnp.arange(tm)
    off = c.seq_offset(off_ref, bh // heads, tq=tq, tk=tk) if causal else None
    last = jnp.minimum(ib * tm + tm, tq) - 1
    return ib, rows, off, c.cdiv(c.key_limit(last, tk=tk, causal=causal, q_offset=off), tn)


def _stats_kernel(off_ref, q_ref, k_ref, m_ref, l_ref, *, scale, heads, tq, tk, tm, tn, causal):
    d = q_ref.shape[-1]
    ib, rows, off, n_tiles = _program(off_ref, heads=heads, tm=tm, tq=tq, tk=tk, tn=tn, causal=causal)
    qt = load(q_ref.at[pl.ds(ib * tm, tm), :], mask=c.row_mask(rows, tq, d), other=0.0)

    def body(cb, carry):
        m, l = carry
        s, vis, _ = _scores(qt, k_ref, cb, rows, scale=scale, tk=tk, tn=tn, causal=causal, q_offset=off)
        m, l, _, _ = softmax.step(m, l, s, vis)
        return m, l

    m, l = lax.fori_loop(0, n_tiles, body, softmax.init_state((tm,)))
    rmask = rows < tq
    store(m_ref.at[pl.ds(ib * tm, tm)], m, mask=rmask)
    store(l_ref.at[pl.ds(ib * tm, tm)], l, mask=rmask)


def _out_kernel(off_ref, q_ref, k_ref, v_ref, m_ref, l_ref, o_ref, *lse_ref, scale, heads, tq, tk, tm, tn,
                causal):
    d = q_ref.shape[-1]
    ib, rows, off, n_tiles = _program(off_ref, heads=heads, tm=tm, tq=tq, tk=tk, tn=tn, causal=causal)
    rmask = rows < tq
    qt = load(q_ref.at[pl.ds(ib * tm, tm), :], mask=c.row_mask(rows, tq, d), other=0.0)
    m = load(m_ref.at[pl.ds(ib * tm, tm)], mask=rmask, other=0.0)
    l = load(l_ref.at[pl.ds(ib * tm, tm)], mask=rmask, other=0.0)
    # 1/L; an empty row (L == 0) has only masked scores (p = 0) whatever this is; a NaN L stays NaN
    inv_l = 1.0 / jnp.where(l == 0, 1.0, l)

    def body(cb, acc):
        s, vis, cols = _scores(qt, k_ref, cb, rows, scale=scale, tk=tk, tn=tn, causal=causal, q_offset=off)
        p = jnp.where(vis, jnp.exp(s - m[:, None]) * inv_l[:, None], 0.0)
        vt = load(v_ref.at[pl.ds(cb * tn, tn), :], mask=c.row_mask(cols, tk, d), other=0.0)
        return acc + c.dot_nn(p, vt, precision=c.FP32_EXACT)

    acc = lax.fori_loop(0, n_tiles, body, jnp.zeros((tm, d), jnp.float32))
    store(o_ref.at[pl.ds(ib * tm, tm), :], acc.astype(o_ref.dtype), mask=c.row_mask(rows, tq, d))
    if lse_ref:
        store(lse_ref[0].at[pl.ds(ib * tm, tm)], softmax.lse(m, l), mask=rmask)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool,
            config: OnlineConfig = CONFIGS["faithful"], return_lse: bool = False):
    """BTNH FP32 in, FP32 out (with ``return_lse``: ``(out, lse [B, H, Tq] FP32)``); only
    ``M, L [B*H, Tq]`` FP32 go through HBM between the passes. ``q_offset``: int32 ``[B]`` (or a scalar)."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    if q.dtype != jnp.float32:
        raise NotImplementedError(f"{GEN} takes float32 only (as the reference); got {q.dtype}")
    off = seqlen.q_offsets(q_offset, b)
    t = config.tile(d)
    kw = dict(scale=scale, heads=h, tq=tq, tk=tk, tm=t, tn=t, causal=causal)
    params = triton_params(num_warps=config.num_warps, num_stages=config.num_stages)
    grid = (c.cdiv(tq, t), b * h)
    off_spec = c.offset_spec(b)
    q_spec, kv_spec = c.btnh_spec(tq, d, h, bh_axis=1), c.btnh_spec(tk, d, h, bh_axis=1)
    stat_spec = c.full_spec((b * h, tq), bh_axis=1)
    stat_shape = jax.ShapeDtypeStruct((b * h, tq), jnp.float32)
    m, l = pl.pallas_call(
        functools.partial(_stats_kernel, **kw),
        out_shape=(stat_shape, stat_shape),
        grid=grid,
        in_specs=[off_spec, q_spec, kv_spec],
        out_specs=(stat_spec, stat_spec),
        compiler_params=params,
        interpret=interpret,
        name=f"pallas_attn_{GEN}_stats",
    )(off, q, k)
    out_shape = (jax.ShapeDtypeStruct((b, tq, h, d), q.dtype),) + ((stat_shape,) if return_lse else ())
    res = pl.pallas_call(
        functools.partial(_out_kernel, **kw),
        out_shape=out_shape,
        grid=grid,
        in_specs=[off_spec, q_spec, kv_spec, kv_spec, stat_spec, stat_spec],
        out_specs=(q_spec,) + ((stat_spec,) if return_lse else ()),
        compiler_params=params,
        interpret=interpret,
        name=f"pallas_attn_{GEN}_out",
    )(off, q, k, v, m, l)
    return (res[0], res[1].reshape(b, h, tq)) if return_lse else res[0]


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: OnlineConfig) -> dict:
    p = problem
    t = config.tile(p.head_dim)
    grid = [c.cdiv(p.q_len, t), p.batch * p.heads_q]
    per = {"grid": grid, "tile_m": t, "tile_n": t, "num_warps": config.num_warps}
    return {"tile": t, "stats": dict(per), "out": dict(per)}


def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan): the
    stats pass ((M, L) over the key tiles) and the output pass (the output with the final stats), both fp32 dots."""
    del hw, cfg
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    qkv_f32 = bh * (tq + 2 * tk) * d * 4
    by_suffix = {n.rsplit("_", 1)[-1]: n for n in names}
    t = lp["tile"]
    P = math.prod(lp["stats"]["grid"])
    steps = max(1.0, _l.cdiv(tk, t) * s.vis_frac)
    w = 32 * lp["stats"]["num_warps"]
    return [_l.Launch(by_suffix["stats"], "pallas_attn_v3_online_stats", P, w, 128, 2 * t * d * 4,
                      units=t * t * d * steps, steps=steps, dram_bytes=bh * (tq + tk) * d * 4,
                      l2_bytes=P * steps * t * d * 4, unit="FMA", note="(M, L) over key tiles"),
            _l.Launch(by_suffix["out"], "pallas_attn_v3_online_out", P, w, 128, 3 * t * d * 4,
                      units=2 * t * t * d * steps, steps=steps, dram_bytes=qkv_f32 + bh * tq * d * 4,
                      l2_bytes=P * steps * 2 * t * d * 4, unit="FMA", note="output with the final stats")]


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_stats", f"pallas_attn_{GEN}_out"),
    config_cls=OnlineConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=("float32",),
    precision={"float32": Precision(operand="fp32", accumulate="fp32", engine="fp32",
                                    note="IEEE-fp32 tile dots (precision=HIGHEST, FMA, no TF32); M, L in HBM")},
    head_dims=(64, 128),
    gqa=False,
    max_q_len=None,
    dense=forward,
    plan=plan,
    launches=launches,
)
