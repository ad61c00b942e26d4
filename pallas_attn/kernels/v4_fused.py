"""v4_fused: one pass, online softmax, 8 query rows per program, FP32 on CUDA cores (docs/reference.md §2.4).

Delta from v3_online: the statistics pass is gone. Each program owns 8 query rows (the reference: 8 warps,
warp w owns row ``i0 + w``) and streams key tiles of TN = 64 (D = 64) / 32 (D = 128) shared by the 8 rows
(the reference: one FP32 ``sK, sV`` tile per block). Every row keeps its own FP32 ``(m, l, O[D])`` and
applies the online update (§2.0) with O rescaled before ``p V`` is added; no HBM scratch at all.
One ``pallas_call``: ``pallas_attn_v4_fused_fwd``, grid (ceil(Tq/8), B·H).

The arithmetic is deliberately the reference's GEMV shape on CUDA cores: a row's scores are a broadcast
multiply of its Q row with the K tile and a sum over D (no ``jnp.dot``, no tensor cores), and ``p V`` is a
broadcast multiply and a sum over the keys. Rows are unrolled in the program as the reference's warps
are; a row past ``Tq``, or (causal) a tile wholly beyond the row's last visible key, skips the tile with
``lax.cond`` (the reference's idle warp / "stop at j > i").

Differences from the CUDA original: the reference updates once per key after a 5-step shuffle reduction;
here a row updates once per key tile (Triton reduces a tile at a time). ``rows_attend`` is reused by
v6_splitkv, whose partial kernel is this loop restricted to a key range.

Causal offsets are per sequence (int32 ``[B]``, an input read once per program), so the tile count and the
idle-row test are traced. ``return_lse=True``: each row also stores its natural-log LSE from its final
``(m, l)`` (-inf with no visible key) into FP32 ``[B*H, Tq]`` = ``[B, H, Tq]``; without it the kernel
writes O only. A NaN score makes the row's ``l`` NaN and ``finalize`` keeps it NaN.
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

GEN = "v4_fused"


@dataclasses.dataclass(frozen=True)
class FusedConfig:
    rows: int = 8  # query rows per program (the reference's 8 warps)
    key_tile_d64: int = 64  # TN
    key_tile_d128: int = 32
    num_warps: int = 8  # 256 threads
    num_stages: int = 1
    skip_idle_rows: bool = True  # lax.cond around a row's tile update (idle warps do no work)

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("rows", "key_tile_d64", "key_tile_d128", "num_warps"):
            c.check_pow2(owner, name, getattr(self, name))
        c.check_positive(owner, "num_stages", self.num_stages)

    def key_tile(self, d: int) -> int:
        return c.per_head_dim(GEN, d, d64=self.key_tile_d64, d128=self.key_tile_d128)


CONFIGS: dict[str, FusedConfig] = {"faithful": FusedConfig()}


def rows_attend(q_ref, k_ref, v_ref, *, i0, rows: int, key_start, key_end, block_k: int, scale: float,
                tq: int, causal: bool, q_offset=None, skip_idle_rows: bool = True):
    """Online softmax of rows ``i0 .. i0+rows-1`` over keys ``[key_start, key_end)``, one shared K/V tile
    at a time. Returns per row the unnormalized FP32 ``(m, l, acc[D])``; a row that saw no visible key
    keeps ``(-FLT_MAX, 0, 0)``. K/V are upcast to FP32 after the load (the reference's FP32 smem tile).
    ``q_offset``: the rows' sequence offset (traced int32, clamped; unused when not causal)."""
    d = q_ref.shape[-1]
    row_ids = [i0 + w for w in range(rows)]
    qs = [
        load(q_ref.at[pl.ds(r, 1), :], mask=jnp.broadcast_to(r < tq, (1, d)), other=0.0).astype(jnp.float32)
        for r in row_ids
    ]
    end = key_end
    if causal:
        end = jnp.minimum(key_end, jnp.minimum(i0 + rows, tq) - 1 + (q_offset + 1))
    span = end - key_start
    n_tiles = c.cdiv(jnp.maximum(span, 0) if not isinstance(span, int) else max(span, 0), block_k)

    def body(t, states):
        j0 = key_start + t * block_k
        cols = j0 + jnp.arange(block_k)
        kmask = c.row_mask(cols, key_end, d)
        kt = load(k_ref.at[pl.ds(j0, block_k), :], mask=kmask, other=0.0).astype(jnp.float32)
        vt = load(v_ref.at[pl.ds(j0, block_k), :], mask=kmask, other=0.0).astype(jnp.float32)
        out = []
        for w, r in enumerate(row_ids):
            def update(st, q_w=qs[w], r=r):
                m, l, acc = st
                s = jnp.sum(q_w * kt, axis=1) * scale  # the row's FP32 dot with each key, CUDA cores
                vis = c.visible(r, cols, tk=key_end, causal=causal, q_offset=q_offset)
                m, l, alpha, p = softmax.step(m, l, s, vis)
                return m, l, acc * alpha + jnp.sum(p[:, None] * vt, axis=0)

            if skip_idle_rows:
                active = r < tq
                if causal:
                    active = active & (j0 <= r + q_offset)
                out.append(lax.cond(active, update, lambda st: st, states[w]))
            else:
                out.append(update(states[w]))
        return tuple(out)

    init = tuple(softmax.init_state((), d) for _ in row_ids)
    return row_ids, lax.fori_loop(0, n_tiles, body, init)


def _kernel(off_ref, q_ref, k_ref, v_ref, o_ref, *lse_ref, scale, heads, tq, tk, causal, rows, block_k,
            skip_idle_rows):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * rows
    off = c.seq_offset(off_ref, pl.program_id(1) // heads, tq=tq, tk=tk) if causal else None
    row_ids, states = rows_attend(
        q_ref, k_ref, v_ref, i0=i0, rows=rows, key_start=0, key_end=tk, block_k=block_k, scale=scale,
        tq=tq, causal=causal, q_offset=off, skip_idle_rows=skip_idle_rows,
    )
    for r, (m, l, acc) in zip(row_ids, states):
        ok = r < tq
        store(o_ref.at[pl.ds(r, 1), :], softmax.finalize(acc, l).reshape(1, d).astype(o_ref.dtype),
              mask=jnp.broadcast_to(ok, (1, d)))
        if lse_ref:
            store(lse_ref[0].at[pl.ds(r, 1)], softmax.lse(m, l).reshape(1), mask=jnp.broadcast_to(ok, (1,)))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool,
            config: FusedConfig = CONFIGS["faithful"], return_lse: bool = False):
    """BTNH FP32 in, FP32 out (with ``return_lse``: ``(out, lse [B, H, Tq] FP32)``), one pass, nothing but
    Q, K, V, O in HBM. ``q_offset``: int32 ``[B]`` (or a scalar; traced either way)."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    if q.dtype != jnp.float32:
        raise NotImplementedError(f"{GEN} takes float32 only (as the reference); got {q.dtype}")
    off = seqlen.q_offsets(q_offset, b)
    bk = config.key_tile(d)
    o_spec = c.btnh_spec(tq, d, h, bh_axis=1)
    out_shape = (jax.ShapeDtypeStruct((b, tq, h, d), q.dtype),)
    out_specs = (o_spec,)
    if return_lse:
        out_shape += (jax.ShapeDtypeStruct((b * h, tq), jnp.float32),)
        out_specs += (c.full_spec((b * h, tq), bh_axis=1),)
    res = pl.pallas_call(
        functools.partial(_kernel, scale=scale, heads=h, tq=tq, tk=tk, causal=causal, rows=config.rows,
                          block_k=bk, skip_idle_rows=config.skip_idle_rows),
        out_shape=out_shape,
        grid=(c.cdiv(tq, config.rows), b * h),
        in_specs=[c.offset_spec(b), c.btnh_spec(tq, d, h, bh_axis=1), c.btnh_spec(tk, d, h, bh_axis=1),
                  c.btnh_spec(tk, d, h, bh_axis=1)],
        out_specs=out_specs,
        compiler_params=triton_params(num_warps=config.num_warps, num_stages=config.num_stages),
        interpret=interpret,
        name=f"pallas_attn_{GEN}_fwd",
    )(off, q, k, v)
    return (res[0], res[1].reshape(b, h, tq)) if return_lse else res[0]


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: FusedConfig) -> dict:
    p = problem
    return {"grid": [c.cdiv(p.q_len, config.rows), p.batch * p.heads_q], "rows_per_program": config.rows,
            "key_tile": config.key_tile(p.head_dim), "num_warps": config.num_warps,
            "skip_idle_rows": config.skip_idle_rows}


def rows_attend_launches(s, lp, names: list[str], *, split: bool) -> list[_l.Launch]:
    """The launches of ``rows_attend`` (v4_fused; v6_splitkv's partial with ``split``, then its merge): programs of
    ``rows_per_program`` rows, each a serial vector update per key tile (``lp`` the call's plan)."""
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    out: list[_l.Launch] = []
    pp = lp if not split else lp["partial"]
    rows, bk = pp["rows_per_program"], pp["key_tile"]
    P = math.prod(pp["grid"])
    keys = tk if not split else lp["chunk"]
    tiles = max(1.0, _l.cdiv(min(keys, tk), bk) * s.vis_frac)
    kvb = 4 if not split else 2
    if split:
        out += _l.cast_launches(s, "stage")
    ws = bh * tq * lp.get("splits", 1) * (d + 1) * 4 if split else 0
    active = min(rows, tq)  # idle rows (past Tq) skip their update (skip_idle_rows)
    out.append(_l.Launch(names[0], "pallas_attn_rows_attend", P, 32 * pp["num_warps"], 128, 0,
                         units=active * tiles * bk * d, steps=active * tiles,
                         dram_bytes=bh * (tq + 2 * tk) * d * kvb + bh * tq * d * 4 + ws,
                         l2_bytes=P * tiles * 2 * bk * d * kvb, unit="row x key x dim",
                         note=f"{rows} rows, each a serial vector update per {bk}-key tile"))
    if split:
        m = lp["merge"]
        out.append(_l.merge_launch(names[1], math.prod(m["grid"]), m["num_warps"], lp["splits"], d,
                                   ws + bh * tq * d * s.in_bytes))
    return out


def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``): ``rows_attend_launches``."""
    del hw, cfg
    return rows_attend_launches(s, lp, names, split=False)


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_fwd",),
    config_cls=FusedConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=("float32",),
    precision={"float32": Precision(operand="fp32", accumulate="fp32", engine="fp32",
                                    note="per-row broadcast-multiply + sum on CUDA cores (no dot)")},
    head_dims=(64, 128),
    gqa=False,
    max_q_len=None,
    dense=forward,
    plan=plan,
    launches=launches,
)
