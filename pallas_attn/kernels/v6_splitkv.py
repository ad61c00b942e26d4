"""v6_splitkv: split-KV decode (Flash-Decoding): per-split partial states + an LSE merge (docs/reference.md §2.6).

Delta from v4_fused: the key axis is also split across programs, so decode (Tq = 1, where v4 has
B·H programs only) fills the GPU. Two ``pallas_call``s:

* ``pallas_attn_v6_splitkv_partial``: grid (ceil(Tq/8), S, B·H). Program (r, s, bh) runs v4's row loop
  (``v4_fused.rows_attend``: 8 rows per program, one shared K/V tile of TN = 64 / 32 keys, CUDA-core FP32
  arithmetic) over the split's keys ``[s*chunk, min((s+1)*chunk, Tk))`` and writes the split state in the
  one shared format (``splitkv``): the normalized FP32 partial ``O / l`` ``[B*H, Tq*S, D]`` and its
  natural-log ``LSE = m + log l`` ``[B*H, Tq*S]`` (the reference's query-head-shaped workspace, flat). A
  split a row cannot see writes ``(0, -inf)``.
* ``pallas_attn_v6_splitkv_merge``: ``splitkv.merge``, one program per output row (the reference: D
  threads): ``lse* = log sum_s exp(LSE_s)``, ``O = sum_s exp(LSE_s - lse*) O_s``, written straight into
  the BTNH output (its ``out_row`` mapping), in q's dtype; no separate transpose or copy.

Workspace: D + 1 floats per (row, split) instead of the reference's D + 2 (unnormalized ``O``, ``m``,
``l``). ``(O / l, m + log l)`` carries the same information as ``(O, m, l)`` for the merge (the merge only
ever needs each split's normalized output and its log-denominator), and it is the one state format every
split-KV kernel and the cross-device merge share, so there is one merge, not one per kernel. The cost is
one division and one log per (row, split) in the partial program.

Split count: the reference's ``choose_splits`` (``attn_core.splits``: S_CAP 32, MIN_CHUNK 256, 2 x num_sm
target, 8 rows per program). ``CONFIGS["faithful"]`` uses the device's SM count (the reference's
post-audit behaviour); ``CONFIGS["reference_sm40"]`` hard-codes the T4's 40 SMs that every recorded v6
number used. ``num_splits`` overrides the heuristic (tests use it to force empty splits).

Precision: FP16 / BF16 inputs are staged as they are; FP32 input is refused with an error naming the dtypes
unless the config asks for the reference host's cast (``SplitKVConfig(host_cast=True)``: Q, K, V cast to
FP16 before the kernel); ``KERNEL`` declares both. Inside, tiles are upcast to FP32 (the
reference's FP16 global -> FP32 smem) and everything accumulates in FP32. Causal is top-left with a
per-sequence ``q_offset`` (int32 ``[B]``, read once per partial program; the reference's v6 has none, which
made its causal decode degenerate: one key; v7 added it).

``return_lse=True``: the merge also writes the merged natural-log LSE per row (FP32 ``[B*H*Tq]`` =
``[B, H, Tq]``, -inf for a row with no visible key); without it the merge writes O only. NaN in q, k or v
makes the affected split states NaN and the merge keeps them NaN.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from attn_core import splits as split_plan

from .._compat import device_sm_count, pl, store, triton_params
from . import common as c
from . import launches as _l
from . import seqlen, splitkv
from .contract import Kernel, Precision, Problem
from .v4_fused import rows_attend, rows_attend_launches

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
    s_cap: int = split_plan.S_CAP
    min_chunk: int = split_plan.MIN_CHUNK
    merge_num_warps: int | None = None  # None: D/32 (the reference's D threads)
    fp32_stage_dtype: str = "float16"
    # FP32 input is refused unless asked: True casts it to fp32_stage_dtype before the kernel (the reference
    # host's cast, kept for faithful reproductions); never silent.
    host_cast: bool = False
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

    def merge_warps(self, d: int) -> int:
        return self.merge_num_warps or max(1, d // 32)

    def splits(self, *, bh: int, n_q: int, n_k: int) -> tuple[int, int]:
        """``(S, chunk)`` for this problem: the override, else the reference's heuristic."""
        if self.num_splits is not None:
            s = min(self.num_splits, n_k)
            return s, c.cdiv(n_k, s)
        return split_plan.choose_splits(bh=bh, n_q=n_q, n_k=n_k, num_sm=self.sm_count(),
                                        rows_per_program=self.rows, s_cap=self.s_cap, min_chunk=self.min_chunk)

    def sm_count(self) -> int:
        return self.num_sm or device_sm_count()


CONFIGS: dict[str, SplitKVConfig] = {
    "faithful": SplitKVConfig(),
    "reference_sm40": SplitKVConfig(num_sm=split_plan.REFERENCE_NUM_SM),
}


def _partial_kernel(off_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, heads, tq, tk, causal, rows,
                    block_k, splits, chunk, skip_idle_rows):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * rows
    sp = pl.program_id(1)
    off = c.seq_offset(off_ref, pl.program_id(2) // heads, tq=tq, tk=tk) if causal else None
    key_start = sp * chunk
    key_end = jnp.minimum(key_start + chunk, tk)
    row_ids, states = rows_attend(
        q_ref, k_ref, v_ref, i0=i0, rows=rows, key_start=key_start, key_end=key_end, block_k=block_k,
        scale=scale, tq=tq, causal=causal, q_offset=off, skip_idle_rows=skip_idle_rows,
    )
    for r, (m, l, acc) in zip(row_ids, states):
        at = r * splits + sp  # workspace row (query row r, split sp)
        ok = r < tq
        o, lse = splitkv.partial(m, l, acc, base2=False)
        store(o_ref.at[pl.ds(at, 1), :], o.reshape(1, d), mask=jnp.broadcast_to(ok, (1, d)))
        store(lse_ref.at[pl.ds(at, 1)], lse.reshape(1), mask=jnp.broadcast_to(ok, (1,)))


def stage(x, config: SplitKVConfig):
    """16-bit inputs stay as they are; FP32 is refused unless ``config.host_cast`` (``common.host_stage``)."""
    return c.host_stage(x, config, gen=GEN, alternatives="use a float32 generation (v1-v4, fa_train)")


def _btnh_row(tq: int, heads: int):
    """Merge row ``(b*H + h)*Tq + i`` -> row ``(b*Tq + i)*H + h`` of the output seen as ``[B*Tq*H, D]``."""

    def out_row(r):
        bh, i = lax.div(r, jnp.int32(tq)), lax.rem(r, jnp.int32(tq))
        return (lax.div(bh, jnp.int32(heads)) * tq + i) * heads + lax.rem(bh, jnp.int32(heads))

    return out_row


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool,
            config: SplitKVConfig = CONFIGS["faithful"], return_lse: bool = False):
    """BTNH in (FP32/FP16/BF16; FP32 staged as FP16), FP32 split states in HBM, output in q's dtype
    (with ``return_lse``: ``(out, lse [B, H, Tq] FP32)``). ``q_offset``: int32 ``[B]`` (or a scalar)."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    out_dtype = q.dtype
    off = seqlen.q_offsets(q_offset, b)
    q, k, v = (stage(x, config) for x in (q, k, v))
    bk = config.key_tile(d)
    splits, chunk = config.splits(bh=b * h, n_q=tq, n_k=tk)
    o_part, lse_part = pl.pallas_call(
        functools.partial(_partial_kernel, scale=scale, heads=h, tq=tq, tk=tk, causal=causal, rows=config.rows,
                          block_k=bk, splits=splits, chunk=chunk, skip_idle_rows=config.skip_idle_rows),
        out_shape=(jax.ShapeDtypeStruct((b * h, tq * splits, d), jnp.float32),
                   jax.ShapeDtypeStruct((b * h, tq * splits), jnp.float32)),
        grid=(c.cdiv(tq, config.rows), splits, b * h),
        in_specs=[c.offset_spec(b), c.btnh_spec(tq, d, h, bh_axis=2), c.btnh_spec(tk, d, h, bh_axis=2),
                  c.btnh_spec(tk, d, h, bh_axis=2)],
        out_specs=(c.full_spec((b * h, tq * splits, d), bh_axis=2),
                   c.full_spec((b * h, tq * splits), bh_axis=2)),
        compiler_params=triton_params(num_warps=config.num_warps, num_stages=config.num_stages),
        interpret=interpret,
        name=f"pallas_attn_{GEN}_partial",
    )(off, q, k, v)
    # [B*H, Tq*S, (D)] is [B*H*Tq, S, (D)] row-major: the merge's [rows, splits] view costs nothing
    res = splitkv.merge(
        o_part.reshape(b * h * tq, splits, d), lse_part.reshape(b * h * tq, splits), out_dtype=out_dtype,
        interpret=interpret, name=f"pallas_attn_{GEN}_merge", num_warps=config.merge_warps(d),
        out_rows=b * tq * h, out_row=_btnh_row(tq, h), return_lse=return_lse,
    )
    if return_lse:
        out, lse = res
        return out.reshape(b, tq, h, d), lse.reshape(b, h, tq)
    return res.reshape(b, tq, h, d)


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: SplitKVConfig) -> dict:
    p = problem
    bh = p.batch * p.heads_q
    splits, chunk = config.splits(bh=bh, n_q=p.q_len, n_k=p.kv_len)
    return {
        "splits": splits, "chunk": chunk, "num_sm": config.sm_count(),
        "partial": {"grid": [c.cdiv(p.q_len, config.rows), splits, bh], "rows_per_program": config.rows,
                    "key_tile": config.key_tile(p.head_dim), "num_warps": config.num_warps},
        "merge": {"grid": [bh * p.q_len], "rows_per_program": 1, "num_warps": config.merge_warps(p.head_dim)},
        "workspace_floats_per_row_split": p.head_dim + 1,
    }


_UPCAST = ("16-bit staged K/V/Q tiles upcast to fp32; CUDA-core fp32 arithmetic (no dot); float32 input is "
           "refused (no silent cast): SplitKVConfig(host_cast=True) casts it to fp16 before the kernel, as the "
           "reference host does")

def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``): the fp16 staging casts, the
    partials (``v4_fused.rows_attend_launches``) and the merge."""
    del hw, cfg
    return rows_attend_launches(s, lp, names, split=True)


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_partial", f"pallas_attn_{GEN}_merge"),
    config_cls=SplitKVConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=("float16", "bfloat16"),
    precision={
        "float16": Precision(operand="fp16", accumulate="fp32", engine="fp32", note=_UPCAST),
        "bfloat16": Precision(operand="bf16", accumulate="fp32", engine="fp32", note=_UPCAST),
    },
    head_dims=(64, 128),
    gqa=False,
    max_q_len=None,
    dense=forward,
    plan=plan,
    launches=launches,
)
