"""v4_fused: one pass, online softmax, 8 query rows per program, FP32 on CUDA cores (ORIGINAL.md §2.4).

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
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from .._compat import load, pl, store, triton_params
from . import common as c

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
                tq: int, causal: bool, q_offset: int, skip_idle_rows: bool = True):
    """Online softmax of rows ``i0 .. i0+rows-1`` over keys ``[key_start, key_end)``, one shared K/V tile
    at a time. Returns per row the unnormalized FP32 ``(m, l, acc[D])``; a row that saw no visible key
    keeps ``(-FLT_MAX, 0, 0)``. K/V are upcast to FP32 after the load (the reference's FP32 smem tile)."""
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
                m, l, alpha, p = c.online_softmax_step(m, l, s, vis)
                return m, l, acc * alpha + jnp.sum(p[:, None] * vt, axis=0)

            if skip_idle_rows:
                active = r < tq
                if causal:
                    active = active & (j0 <= r + q_offset)
                out.append(lax.cond(active, update, lambda st: st, states[w]))
            else:
                out.append(update(states[w]))
        return tuple(out)

    init = tuple(
        (jnp.full((), c.NEG_BIG, jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((d,), jnp.float32))
        for _ in row_ids
    )
    return row_ids, lax.fori_loop(0, n_tiles, body, init)


def _kernel(q_ref, k_ref, v_ref, o_ref, *, scale, tq, tk, causal, q_offset, rows, block_k, skip_idle_rows):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * rows
    row_ids, states = rows_attend(
        q_ref, k_ref, v_ref, i0=i0, rows=rows, key_start=0, key_end=tk, block_k=block_k, scale=scale,
        tq=tq, causal=causal, q_offset=q_offset, skip_idle_rows=skip_idle_rows,
    )
    for r, (_, l, acc) in zip(row_ids, states):
        store(o_ref.at[pl.ds(r, 1), :], c.finalize(acc, l).reshape(1, d).astype(o_ref.dtype),
              mask=jnp.broadcast_to(r < tq, (1, d)))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "q_offset", "interpret", "config"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset: int, interpret: bool,
            config: FusedConfig = CONFIGS["faithful"]):
    """BTNH FP32 in, FP32 out, one pass, nothing but Q, K, V, O in HBM."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    if q.dtype != jnp.float32:
        raise NotImplementedError(f"{GEN} takes float32 only (as the reference); got {q.dtype}")
    bk = config.key_tile(d)
    return pl.pallas_call(
        functools.partial(_kernel, scale=scale, tq=tq, tk=tk, causal=causal, q_offset=q_offset,
                          rows=config.rows, block_k=bk, skip_idle_rows=config.skip_idle_rows),
        out_shape=jax.ShapeDtypeStruct((b, tq, h, d), q.dtype),
        grid=(c.cdiv(tq, config.rows), b * h),
        in_specs=[c.btnh_spec(tq, d, h, bh_axis=1), c.btnh_spec(tk, d, h, bh_axis=1),
                  c.btnh_spec(tk, d, h, bh_axis=1)],
        out_specs=c.btnh_spec(tq, d, h, bh_axis=1),
        compiler_params=triton_params(num_warps=config.num_warps, num_stages=config.num_stages),
        interpret=interpret,
        name=f"pallas_attn_{GEN}_fwd",
    )(q, k, v)
