"""v6_splitkv: split-KV decode (Flash-Decoding): unnormalized partials + an LSE merge (ORIGINAL.md §2.6).

Delta from v4_fused: the key axis is also split across programs, so decode (Tq = 1, where v4 has
B·H programs only) fills the GPU. Two ``pallas_call``s:

* ``pallas_attn_v6_splitkv_partial``: grid (ceil(Tq/8), S, B·H). Program (r, s, bh) runs v4's row loop
  (``v4_fused.rows_attend``: 8 rows per program, one shared K/V tile of TN = 64 / 32 keys, CUDA-core FP32
  arithmetic) over the split's keys ``[s*chunk, min((s+1)*chunk, Tk))`` and writes the *unnormalized*
  FP32 triple ``O [B*H, Tq, S, D]``, ``m, l [B*H, Tq, S]`` (the reference's query-head-shaped workspace,
  stored flat as ``[B*H, Tq*S, (D)]``). A split a row cannot see writes ``(-FLT_MAX, 0, 0)``.
* ``pallas_attn_v6_splitkv_merge``: grid (Tq, B·H), one program per output row (the reference: D
  threads): ``m* = max m_s``, ``l* = sum exp(m_s - m*) l_s``, ``O = sum exp(m_s - m*) O_s / l*``
  (0 if ``l* = 0``), stored in q's dtype.

Split count: the reference's ``choose_splits`` (§2.0: S_CAP 32, MIN_CHUNK 256, 2 x num_sm target,
8 rows per program). ``CONFIGS["faithful"]`` uses the device's SM count (the reference's post-audit
behaviour); ``CONFIGS["reference_sm40"]`` hard-codes the T4's 40 SMs that every recorded v6 number used.
``num_splits`` overrides the heuristic (tests use it to force empty splits).

Precision: like the reference host, K/V (and Q) are cast to FP16 before the kernel when they are FP32
(BF16 input is staged as BF16); inside, tiles are upcast to FP32 (the reference's FP16 global -> FP32 smem)
and everything accumulates in FP32. Causal is top-left with ``q_offset`` (the reference's v6 has no
``q_offset``, which made its causal decode degenerate: one key; v7 added it).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from .._compat import device_sm_count, load, pl, store, triton_params
from . import common as c
from .v4_fused import rows_attend

GEN = "v6_splitkv"


@dataclasses.dataclass(frozen=True)
class SplitKVConfig:
    rows: int = 8  # query rows per partial program (8 warps)
    key_tile_d64: int = 64  # TN
    key_tile_d128: int = 32
    num_warps: int = 8
    num_stages: int = 1
    num_sm: int | None = None  # None: the device's SM count; 40 reproduces the reference's numbers
    num_splits: int | None = None  # None: choose_splits; an int forces S (capped at Tk)
    s_cap: int = c.S_CAP
    min_chunk: int = c.MIN_CHUNK
    merge_num_warps: int | None = None  # None: D/32 (the reference's D threads)
    fp32_stage_dtype: str = "float16"
    skip_idle_rows: bool = True

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("rows", "key_tile_d64", "key_tile_d128", "num_warps"):
            c.check_pow2(owner, name, getattr(self, name))
        for name in ("num_stages", "s_cap", "min_chunk"):
            c.check_positive(owner, name, getattr(self, name))
        for name in ("num_sm", "num_splits"):
            if getattr(self, name) is not None:
                c.check_positive(owner, name, getattr(self, name))
        if self.merge_num_warps is not None:
            c.check_pow2(owner, "merge_num_warps", self.merge_num_warps)
        if self.fp32_stage_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"{owner}.fp32_stage_dtype must be 'float16' or 'bfloat16'; "
                             f"got {self.fp32_stage_dtype!r}")

    def key_tile(self, d: int) -> int:
        return c.per_head_dim(GEN, d, d64=self.key_tile_d64, d128=self.key_tile_d128)

    def splits(self, *, bh: int, n_q: int, n_k: int) -> tuple[int, int]:
        """``(S, chunk)`` for this problem: the override, else the reference's heuristic."""
        if self.num_splits is not None:
            s = min(self.num_splits, n_k)
            return s, c.cdiv(n_k, s)
        return c.choose_splits(bh=bh, n_q=n_q, n_k=n_k, num_sm=self.num_sm or device_sm_count(),
                               rows_per_program=self.rows, s_cap=self.s_cap, min_chunk=self.min_chunk)


CONFIGS: dict[str, SplitKVConfig] = {
    "faithful": SplitKVConfig(),
    "reference_sm40": SplitKVConfig(num_sm=c.REFERENCE_NUM_SM),
}


def _partial_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, scale, tq, tk, causal, q_offset, rows,
                    block_k, splits, chunk, skip_idle_rows):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * rows
    sp = pl.program_id(1)
    key_start = sp * chunk
    key_end = jnp.minimum(key_start + chunk, tk)
    row_ids, states = rows_attend(
        q_ref, k_ref, v_ref, i0=i0, rows=rows, key_start=key_start, key_end=key_end, block_k=block_k,
        scale=scale, tq=tq, causal=causal, q_offset=q_offset, skip_idle_rows=skip_idle_rows,
    )
    for r, (m, l, acc) in zip(row_ids, states):
        at = r * splits + sp  # workspace row (query row r, split sp)
        ok = r < tq
        store(o_ref.at[pl.ds(at, 1), :], acc.reshape(1, d), mask=jnp.broadcast_to(ok, (1, d)))
        store(m_ref.at[pl.ds(at, 1)], m.reshape(1), mask=jnp.broadcast_to(ok, (1,)))
        store(l_ref.at[pl.ds(at, 1)], l.reshape(1), mask=jnp.broadcast_to(ok, (1,)))


def _merge_kernel(o_ref, m_ref, l_ref, out_ref, *, splits, s_pad):
    d = o_ref.shape[-1]
    i = pl.program_id(0)
    sid = jnp.arange(s_pad)
    ok = sid < splits
    base = i * splits
    m = load(m_ref.at[pl.ds(base, s_pad)], mask=ok, other=c.NEG_BIG)
    l = load(l_ref.at[pl.ds(base, s_pad)], mask=ok, other=0.0)
    o = load(o_ref.at[pl.ds(base, s_pad), :], mask=jnp.broadcast_to(ok[:, None], (s_pad, d)), other=0.0)
    out = c.lse_merge(m, l, o, ok)
    out_ref[pl.ds(i, 1), :] = out.reshape(1, d).astype(out_ref.dtype)


def stage(x, config: SplitKVConfig):
    """The reference decode host's cast: FP32 becomes FP16; 16-bit inputs stay as they are."""
    return x.astype(config.fp32_stage_dtype) if x.dtype == jnp.float32 else x


@functools.partial(jax.jit, static_argnames=("causal", "scale", "q_offset", "interpret", "config"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset: int, interpret: bool,
            config: SplitKVConfig = CONFIGS["faithful"]):
    """BTNH in (FP32/FP16/BF16; FP32 staged as FP16), FP32 partials in HBM, output in q's dtype."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    out_dtype = q.dtype
    q, k, v = (stage(x, config) for x in (q, k, v))
    bk = config.key_tile(d)
    splits, chunk = config.splits(bh=b * h, n_q=tq, n_k=tk)
    o_part, m_part, l_part = pl.pallas_call(
        functools.partial(_partial_kernel, scale=scale, tq=tq, tk=tk, causal=causal, q_offset=q_offset,
                          rows=config.rows, block_k=bk, splits=splits, chunk=chunk,
                          skip_idle_rows=config.skip_idle_rows),
        out_shape=(jax.ShapeDtypeStruct((b * h, tq * splits, d), jnp.float32),
                   jax.ShapeDtypeStruct((b * h, tq * splits), jnp.float32),
                   jax.ShapeDtypeStruct((b * h, tq * splits), jnp.float32)),
        grid=(c.cdiv(tq, config.rows), splits, b * h),
        in_specs=[c.btnh_spec(tq, d, h, bh_axis=2), c.btnh_spec(tk, d, h, bh_axis=2),
                  c.btnh_spec(tk, d, h, bh_axis=2)],
        out_specs=(c.full_spec((b * h, tq * splits, d), bh_axis=2), c.full_spec((b * h, tq * splits), bh_axis=2),
                   c.full_spec((b * h, tq * splits), bh_axis=2)),
        compiler_params=triton_params(num_warps=config.num_warps, num_stages=config.num_stages),
        interpret=interpret,
        name=f"pallas_attn_{GEN}_partial",
    )(q, k, v)
    return pl.pallas_call(
        functools.partial(_merge_kernel, splits=splits, s_pad=c.next_pow2(splits)),
        out_shape=jax.ShapeDtypeStruct((b, tq, h, d), out_dtype),
        grid=(tq, b * h),
        in_specs=[c.full_spec(o_part.shape, bh_axis=1), c.full_spec(m_part.shape, bh_axis=1),
                  c.full_spec(l_part.shape, bh_axis=1)],
        out_specs=c.btnh_spec(tq, d, h, bh_axis=1),
        compiler_params=triton_params(num_warps=config.merge_num_warps or max(1, d // 32), num_stages=1),
        interpret=interpret,
        name=f"pallas_attn_{GEN}_merge",
    )(o_part, m_part, l_part)
