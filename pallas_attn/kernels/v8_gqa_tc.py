"""v8_gqa_tc: GQA M-packing on tensor cores, one warp per 16-row tile ("Cut 2a", docs/reference.md §2.9).

Delta from v8_gqa (Cut 1): the packed rows go to tensor cores instead of 8 warps on CUDA cores. One warp
(``num_warps=1``) per program, grid ``(ceil(G*Tq/16), S, B*Hkv)``: each program is one 16-row packed M
tile (rows past ``G*Tq`` carry a zero query and are never written: "pad M = G -> 16"); key blocks of BN =
64 (D=64) / 32 (D=128). Per block: ``S = Q K^T`` as one 16-bit MMA with FP32 accumulation (K read as
``[BN, D]`` and contracted on D, the reference's col-major fragment), scale and masks (padded keys,
causal ``j > i_q + q_offset``), one online-softmax update per block, ``P`` rounded to the operand dtype
and ``P V`` as a second MMA onto the FP32 accumulator. The reference's all-masked-block guard (a row that
has seen no valid key must not add ``exp(0)``) is the recurrence's own behaviour here: the running max
starts at -FLT_MAX and masked scores are -inf, so their ``p`` is exactly 0 (``softmax``).
``choose_splits`` counts ``row_tiles = ceil(G*Tq/16)``; 40 SMs (``faithful``) or the device's
(``device_sm``).

Staging: the reference stages half ``sQ/sK/sV/sP`` and float ``sS/oRun`` in shared memory; Triton keeps
the operands where its MMA lowering wants them (on sm_90 with one warp: ``mma.sync``, not ``wgmma``,
which needs a warpgroup). ``tuned``: 4 warps, 16 rows, BN 64 at both head dims, ``num_stages=3`` and the
device's SM count: the obvious repair of the dead end, and close to fa_decode's dataflow.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from attn_core import splits as split_plan

from .. import _compat
from . import common as c
from . import softmax
from .contract import Precision, Problem
from .v7_paged import Family, Launch, family_kernel, make_plan, run

__all__ = ["TcConfig", "CONFIGS", "KERNEL", "paged_forward", "attend_tensor_cores"]

GEN = "v8_gqa_tc"


@dataclasses.dataclass(frozen=True)
class TcConfig:
    block_m: int = 16  # packed rows per program (one WMMA M tile)
    block_n_d64: int = 64
    block_n_d128: int = 32
    num_warps: int = 1  # the reference's one warp per CTA
    num_stages: int = 1
    num_sm: int | None = split_plan.REFERENCE_NUM_SM
    num_splits: int | None = None
    s_cap: int = split_plan.S_CAP
    min_chunk: int = split_plan.MIN_CHUNK
    merge_num_warps: int | None = None
    fp32_stage_dtype: str = "float16"

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("block_m", "block_n_d64", "block_n_d128"):
            c.check_pow2(owner, name, getattr(self, name), minimum=16)  # MMA operands: every dim >= 16
        c.check_pow2(owner, "num_warps", self.num_warps)
        for name in ("num_stages", "s_cap", "min_chunk"):
            c.check_positive(owner, name, getattr(self, name))
        for name in ("num_sm", "num_splits"):
            if getattr(self, name) is not None:
                c.check_positive(owner, name, getattr(self, name))
        if self.merge_num_warps is not None:
            c.check_pow2(owner, "merge_num_warps", self.merge_num_warps)
        if self.fp32_stage_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"{owner}.fp32_stage_dtype must be 'float16' or 'bfloat16'; got {self.fp32_stage_dtype!r}")

    def block_n(self, d: int) -> int:
        return c.per_head_dim(GEN, d, d64=self.block_n_d64, d128=self.block_n_d128)

    def sm_count(self) -> int:
        return self.num_sm or _compat.device_sm_count()

    def merge_warps(self, d: int) -> int:
        return self.merge_num_warps or max(1, d // 32)

    def splits(self, *, bh: int, rows: int, n_k: int) -> tuple[int, int]:
        n_k = max(int(n_k), 1)
        if self.num_splits is not None:
            s = min(self.num_splits, n_k)
            return s, c.cdiv(n_k, s)
        return split_plan.choose_splits(bh=bh, n_q=rows, n_k=n_k, num_sm=self.sm_count(),
                                        rows_per_program=self.block_m, s_cap=self.s_cap, min_chunk=self.min_chunk)


CONFIGS: dict[str, TcConfig] = {
    "faithful": TcConfig(),
    "device_sm": TcConfig(num_sm=None),
    "tuned": TcConfig(block_n_d128=64, num_warps=4, num_stages=3, num_sm=None),
}


def attend_tensor_cores(q, src, *, lo, hi, i_q, q_off, causal: bool, scale: float, block_n: int):
    """One online-softmax update per block of ``block_n`` keys, both products as 16-bit MMAs with FP32
    accumulation. ``q [16, D]`` is the padded packed tile. Returns ``(m, l, acc, bad)``."""
    rows, d = q.shape
    n_tiles = c.cdiv(jnp.maximum(hi - lo, 0), block_n)

    def body(t, carry):
        m, l, acc, bad = carry
        j0 = lo + t * block_n
        j = j0 + jnp.arange(block_n, dtype=jnp.int32)
        kmask = j < hi
        k, v, bd = src.tile(j0, j, kmask)
        s = c.dot_nt(q, k) * scale
        vis = kmask[None, :]
        if causal:
            vis = vis & (j[None, :] <= (i_q + q_off)[:, None])
        m, l, alpha, p = softmax.step(m, l, s, vis)
        acc = acc * alpha[:, None] + c.dot_nn(p.astype(v.dtype), v)
        return m, l, acc, bad | bd

    return jax.lax.fori_loop(0, n_tiles, body, (*softmax.init_state((rows,), d), jnp.zeros((), jnp.bool_)))


def tc_launch(cfg: TcConfig, d: int) -> Launch:
    bn = cfg.block_n(d)
    return Launch(rpp=cfg.block_m, block_k=bn, attend=functools.partial(attend_tensor_cores, block_n=bn),
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages, merge_warps=cfg.merge_warps(d),
                  stage_dtype=cfg.fp32_stage_dtype)


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: TcConfig = CONFIGS["faithful"], return_lse: bool = False,
                  check_block_table: bool = True):
    """v8_gqa_tc on validated arrays (the contract's ``paged`` convention)."""
    return run(Family(GEN, config, tc_launch), config, q, k_pool, v_pool, block_table, kv_lens, causal=causal,
               scale=scale, q_offset=q_offset, interpret=interpret, return_lse=return_lse,
               check_block_table=check_block_table, gqa_ok=True)


def plan(problem: Problem, config: TcConfig) -> dict:
    d = problem.head_dim
    bn = config.block_n(d)
    return make_plan(problem, rpp=config.block_m, key_tile=bn, group=bn, num_warps=config.num_warps,
                     num_stages=config.num_stages,
                     splits=config.splits(bh=problem.batch * problem.heads_kv, rows=problem.group * problem.q_len,
                                          n_k=problem.kv_len),
                     num_sm=config.sm_count(), merge_warps=config.merge_warps(d),
                     extra={"padded_rows": -(-problem.group * problem.q_len // config.block_m) * config.block_m})


_TC = ("16-bit operands on tensor cores (one MMA for QK^T, one for PV, P rounded to the operand dtype), "
       "fp32 accumulation")

KERNEL = family_kernel(GEN, configs=CONFIGS, paged=paged_forward, config_cls=TcConfig, plan=plan,
                       precision={"float16": Precision(operand="fp16", accumulate="fp32", engine="tensor", note=_TC)})
