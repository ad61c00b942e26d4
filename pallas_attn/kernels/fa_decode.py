"""fa_decode: frontier GQA decode (dense and paged KV) meant to run at the HBM read ceiling.

What it is. Decode attention for a few query tokens (Tq <= 16) against a long KV cache. Its arithmetic
intensity is about G FLOP per KV byte (docs/fa_decode.md), so the only thing that matters is how many KV
bytes are in flight; every choice below is about that.

How it differs from its parent (v8_gqa_ss, reference §2.13), which stalled near 28% of HBM bandwidth:
  * GQA M-packing (``gqa``) on tensor cores: the G query heads of one KV head times Tq are the M rows of one
    program, padded to a power of two >= 16 so both dots run as MMAs; each KV tile is read once for all G.
  * One program per (row tile, split, batch*KV head) with the KV tile streamed by a ``fori_loop`` that
    Triton software-pipelines (``num_stages``): several K/V tiles in flight per program, several programs
    per SM. The split count comes from the device SM count and a wave model (``planner``), not from the
    reference's 40-SM constants; on a dense 16-bit cache one split wherever the programs already fill the SMs once
    (session 23: the wave model's second split cost 2.5-5% there).
  * KV is indexed in place, in the caller's layout (``kv_source``): no transpose or copy of the cache.
  * Split-KV partials are the shared state (``splitkv``: normalized fp32 O + LSE per row and split); the
    shared Pallas merge combines them. With one split there is no merge: the partial kernel writes the
    output directly.
  * Online softmax in base 2 (``softmax.step(base2=True)``): the scale and log2(e) fold into one multiply.

Conventions (``contract``): causal is top-left with a per-sequence offset, ``j <= i_q + q_offset[b]``; the
paged entry's default offset is ``kv_len - Tq`` (set by the API). A row with no visible key outputs 0 (LSE
-inf). Keys at or past the length are never read (masked loads; splits past the length issue no loads).

Quantized KV (docs/quantized_kv.md): ``Fp8Tensor`` / ``Nvfp4Tensor`` pools (``pallas_attn.quant``) in place of
fp16 ones, dense or paged, with float16 or bfloat16 q. The KV tile source loads the storage bytes (1 B / element, or the
0.5 B packed nibbles + a micro-scale byte per 16) and decodes them in registers into *exact* fp16 tiles short
of a power of two (``kv_source.e4m3_tile`` / ``nvfp4_tile``); the per-tensor scales and that power of two fold
into the one scalar the scores are already multiplied by (``scale * log2(e) * scale_k``) and into the output
(``* scale_v``), so dequantization costs no multiply by the tensor scale per element. Scores and ``p V`` run
on fp16 tensor cores with fp32 accumulation, as for fp16 KV. With a bf16 q (session 13) the exact fp16 tile is
converted to bf16, exactly (at most 7 significant bits, bf16 holds 8), one more convert per element, and both dots
run in bf16 (CPU-verified in interpret mode; not yet run on a GPU).

Block tables: page indices are clamped in-kernel (no out-of-bounds read, ever). With ``check_block_table``
an index outside ``[0, num_blocks)`` (or a ``kv_len`` the table cannot hold) raises ValueError on concrete
inputs and, under jit, turns that sequence's output into NaN (the kernel sees the bad index on its way).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, quant, tuning
from .._compat import pl
from . import common as c
from . import gqa, planner, seqlen, softmax, splitkv
from .common import SMEM_LIMIT, stage_buffers
from .contract import Kernel, Precision, Problem
from .kv_source import (
    DECODES,
    E4M3_FOLD,
    NVFP4_DECODES,
    NVFP4_FOLD,
    KVLayout,
    KVSource,
    e4m3_tile,
    flat_dense,
    flat_pool,
    nvfp4_halves,
    nvfp4_tile,
    pages_bad,
    pages_flag,
    pages_load,
    validate_block_table,
)
from .launches import Launch, kv_bytes, kv_tokens, merge_launch

__all__ = ["DecodeConfig", "CONFIGS", "KERNEL", "plan", "forward", "paged_forward"]

GEN = "fa_decode"

# the paged block-table check (gathered pages): a split spanning at most this many pages loads its table entries in
# one vector before its key loop (one int32 a thread or two at 4 warps), reduced after it (session 39)
PAGES_ONE_LOAD = 256


# D 96 (Phi-3): tiles of 128 columns, the last 32 masked to zero (session 16); 16-bit KV only
HEAD_DIMS = (64, 96, 128, 256)
QUANT_HEAD_DIMS = (64, 128, 256)


def tile_width(d: int) -> int:
    """Columns of fa_decode's q / K / V / output tiles for head dim ``d`` (``KVLayout.tile_d``): D rounded up to a
    power of two."""
    return planner.next_pow2(d)


def _limits(p: Problem) -> tuple[bool, str]:
    """fa_decode's own refusal beyond the contract's checks: quantized KV at a head dim it does not read."""
    if p.kv_dtype is not None and p.kv_dtype != p.dtype and p.head_dim not in QUANT_HEAD_DIMS:
        return False, f"fa_decode reads quantized KV at head dims {QUANT_HEAD_DIMS}; got D={p.head_dim}"
    return True, ""


def _asm_capable() -> bool:
    """Whether NVFP4's "asm" decode can run here: its ``cvt.rn.f16x2.e4m3x2`` needs sm_89 or newer. Without a GPU
    (lowering for one from a CPU machine) the target is taken to be capable."""
    cc = _compat.gpu_compute_capability()
    try:
        return not cc or tuple(int(x) for x in cc.split(".")[:2]) >= (8, 9)
    except ValueError:
        return True


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Knobs of the decode kernel; ``None`` means "pick by heuristic" (``plan``).

    block_k: keys per streamed tile (power of two, 16..512). num_warps / num_stages: Triton launch knobs
    (stages = software-pipelining depth of the K/V loads; an upper bound: the plan lowers it to what fits the
    227 KiB of shared memory a CTA may use, ``fit_stages``). splits: KV splits per (b, h_kv) (None: wave
    model). occupancy: programs the wave model assumes resident per SM. block_m_max: cap on packed rows per
    program (rows beyond it go to more row tiles, which re-read the tile, mostly from L2).
    merge_block: splits combined per step of the merge kernel. fp8_decode / nvfp4_decode: how quantized
    KV tiles become fp16 (``kv_source.DECODES``: "cast" through Triton's fp8 conversion, "bits" by integer
    bit placement; NVFP4 also "asm", four bytes per register by inline PTX, ``kv_source.NVFP4_ASM``, its default
    since session 19, which the interpreter and GPUs older than sm_89 run as "cast"); unused for fp16 KV.
    nvfp4_halves: NVFP4 tiles stay as their even / odd halves
    (``kv_source.nvfp4_halves``: no interleave in the kernel; q's even and odd columns are loaded, and the output's
    written, with a column stride of 2, since session 20 in the kernel, before it by two XLA permutations); None:
    in the NVFP4 batch regime, and always with the "asm" decode. nvfp4_batch_occupancy: a dense
    NVFP4 cache whose ``B * Hkv * row_tiles`` programs give every SM one (the batch regime) is planned with this many
    programs per SM (more splits, more resident warps: the NVFP4 loop is latency-bound at 8 warps per SM,
    docs/quantized_kv.md §8);
    None: off. quant_tile_scale: a quantized cache's planned ``block_k`` times this (1, 2 or 4; at most 512): a tile of
    fewer bytes per key, more keys per tile, so the bytes in flight match fp16's. quant_pv16: with a bf16 q, only the K
    tile converts to bf16 (the scores' dot runs in q's dtype); the decoded V tile stays fp16 and P joins it as fp16 (P
    is in [0, 1]: fp16 holds it with 3 more bits than bf16); None: in the batch regime (``batch_regime``: dense, ``B *
    Hkv * row_tiles >= SMs``) and on paged NVFP4 caches. quant_qk16: with a bf16 q, q becomes fp16 once per program,
    each row scaled by a power of two (``fp16_rows``), and the scores' dot runs in fp16 on the K tile as it decodes (no
    bf16 convert a K element); None: on, except on an NVFP4 cache where the plan gives a program fewer than
    ``QK16_NVFP4_MIN_TILES`` key tiles (session 38: 0.93-0.98x the time at every other quantized row measured,
    1.005-1.033x at NVFP4 B1 S 8k, four tiles a program, in three runs). Every knob from fp8_decode on is unused for
    16-bit KV (``Kernel.effective`` resets them there). split1_fill: one split (no merge) wherever the call's programs
    ``B * Hkv * row_tiles`` number at least this many times the SMs, else the wave model's split count; None:
    ``DENSE_SPLIT1_FILL`` on a dense 16-bit cache, the wave model alone on paged and quantized caches; ``math.inf``: the
    wave model alone everywhere (config ``waves``, the plan before session 23). Session 23: at 128 programs on 132 SMs
    one split was 2.5-5% faster than the wave model's two, at Tq 1 and Tq 2-8 (docs/fa_decode.md).
    """

    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    splits: int | None = None
    occupancy: int = 2
    paged_min_waves: int = 6
    block_m_max: int | None = None
    merge_block: int = 64
    merge_num_warps: int = 4
    fp8_decode: str = "cast"
    nvfp4_decode: str = "asm"
    nvfp4_halves: bool | None = None
    nvfp4_batch_occupancy: int | None = 4
    quant_tile_scale: int = 1
    quant_pv16: bool | None = None
    quant_qk16: bool | None = None
    split1_fill: float | None = None

    def __post_init__(self) -> None:
        if not all(isinstance(x, (bool, type(None))) for x in (self.nvfp4_halves, self.quant_pv16, self.quant_qk16)):
            raise ValueError(f"nvfp4_halves, quant_pv16 and quant_qk16 must be a bool or None; got "
                             f"{self.nvfp4_halves=}, {self.quant_pv16=}, {self.quant_qk16=}")
        nbo = self.nvfp4_batch_occupancy
        if nbo is not None and (isinstance(nbo, bool) or not isinstance(nbo, int) or not 1 <= nbo <= 32):
            raise ValueError(f"nvfp4_batch_occupancy must be an int in [1, 32] or None; got {nbo=}")
        if self.quant_tile_scale not in (1, 2, 4) or isinstance(self.quant_tile_scale, bool):
            raise ValueError(f"quant_tile_scale must be 1, 2 or 4; got {self.quant_tile_scale=}")
        if self.fp8_decode not in DECODES or self.nvfp4_decode not in NVFP4_DECODES:
            raise ValueError(f"fp8_decode must be one of {DECODES} and nvfp4_decode one of {NVFP4_DECODES}; got "
                             f"{self.fp8_decode=}, {self.nvfp4_decode=}")
        if self.block_k is not None and not (_is_pow2(self.block_k) and 16 <= self.block_k <= 512):
            raise ValueError(f"block_k must be a power of two in [16, 512]; got {self.block_k=}")
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16; got {self.num_warps=}")
        if self.num_stages is not None and not (1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be in [1, 8]; got {self.num_stages=}")
        if self.splits is not None and not (isinstance(self.splits, int) and self.splits >= 1):
            raise ValueError(f"splits must be a positive int or None; got {self.splits=}")
        if not (isinstance(self.paged_min_waves, int) and 1 <= self.paged_min_waves <= 16):
            raise ValueError(f"paged_min_waves must be an int in [1, 16]; got {self.paged_min_waves=}")
        f1 = self.split1_fill
        if f1 is not None and (isinstance(f1, bool) or not isinstance(f1, (int, float)) or not 0 < f1):
            raise ValueError(f"split1_fill must be a positive number (math.inf: never one split) or None; got {f1=}")
        if f1 is not None and self.splits is not None:
            raise ValueError(f"split1_fill and splits are exclusive (a forced split count leaves nothing to pick); got "
                             f"{f1=}, {self.splits=}")
        if not (isinstance(self.occupancy, int) and 1 <= self.occupancy <= 32):
            raise ValueError(f"occupancy must be an int in [1, 32]; got {self.occupancy=}")
        if self.block_m_max is not None and not (_is_pow2(self.block_m_max) and self.block_m_max >= 16):
            raise ValueError(f"block_m_max must be a power of two >= 16; got {self.block_m_max=}")
        if not (_is_pow2(self.merge_block) and 1 <= self.merge_block <= 256):
            raise ValueError(f"merge_block must be a power of two in [1, 256]; got {self.merge_block=}")
        if self.merge_num_warps not in (1, 2, 4, 8):
            raise ValueError(f"merge_num_warps must be one of 1, 2, 4, 8; got {self.merge_num_warps=}")


# "default" is the heuristic (a frontier kernel has no reference to be faithful to); the others are measured
# alternatives that compare runs beside it (docs/fa_decode.md).
DENSE_SPLIT1_FILL = 0.9  # one split on a dense 16-bit cache from 0.9 x SMs programs up (DecodeConfig.split1_fill)
# quant_qk16 None on an NVFP4 cache: on from this many key tiles a program (the plan's chunk_blocks). Session 38, H200,
# qk16 / off by tiles a program: 4 -> 1.005-1.033 (B1 S 8k, 6 readings), 8 -> 0.981, 16 -> 0.961-0.981, >= 32 ->
# 0.931-0.957 (docs/quantized_kv.md §13)
QK16_NVFP4_MIN_TILES = 8

CONFIGS: dict[str, DecodeConfig] = {
    "default": DecodeConfig(),
    # the wave model's split count everywhere (the dense default before session 23): measured beside the default
    "waves": DecodeConfig(split1_fill=math.inf),
    # the paged plan without the ragged-batch balancing (one program per sequence when B*Hkv fills the
    # chip): kept so compare measures what the balancing costs on uniform lengths and buys on ragged ones
    "paged_unbalanced": DecodeConfig(paged_min_waves=1),
    # best dense point of the first H200 sweep (results/fa_decode_tune/20261121_h200_tune1.json): B=32,
    # S=8192 234.2 us vs 236.4 default; B=1, S=131072 122.7 vs 122.4; B=64, S=4096 240.1 vs 236.9 (bk 128)
    "tuned": DecodeConfig(block_k=32, num_warps=4, num_stages=4),
    # "bits" for both quantized formats (fp16 KV runs exactly as "default"): measured beside the default. NVFP4's
    # default was "cast" from session 18 (faster than "bits" in every record of three runs: docs/quantized_kv.md §8)
    # and is "asm" since session 19 (§9)
    "quant_alt_decode": DecodeConfig(fp8_decode="bits", nvfp4_decode="bits"),
    # a bf16 q's P.V on the fp16 V tile (no V convert) at every shape, and never: the default takes it in the batch
    # regime (session 19: 0-6% faster there, fp8 2.5-4% slower at B1; docs/quantized_kv.md §9) and, since session 38,
    # on paged NVFP4 caches (§13)
    "quant_pv16": DecodeConfig(quant_pv16=True),
    "quant_pv16_off": DecodeConfig(quant_pv16=False),
    # a bf16 q's scores on the fp16 K tile (q to fp16 by a power of two a row, no K convert; session 38, issue 31),
    # on and off at every shape: the default takes it except on NVFP4 programs of few key tiles (docs/quantized_kv.md
    # §13)
    "quant_qk16": DecodeConfig(quant_qk16=True),
    "quant_qk16_off": DecodeConfig(quant_qk16=False),
    # NVFP4 before session 19 (the default's decode is "asm" since, docs/quantized_kv.md §9): session 18's default
    # ("cast", its halves in the batch regime only) and the plain NVFP4 path before that (joined tiles, plain plan)
    "nvfp4_cast": DecodeConfig(nvfp4_decode="cast"),
    "nvfp4_plain": DecodeConfig(nvfp4_decode="cast", nvfp4_halves=False, nvfp4_batch_occupancy=None),
    # session 23 (speculative decode, Tq 2-8 at B 16 S 8k: 16-64 packed rows a program, 2-8x the MMA work per KV byte
    # of Tq 1): the candidates measured at the sweep's spec shapes (docs/fa_decode.md, "Speculative decode"); what won
    # (one split where the programs fill the SMs, 4 warps for 64-row programs) went into the default's plan, and they
    # stay so compare can measure them beside it
    "spec_w8": DecodeConfig(num_warps=8),
    "spec_w4": DecodeConfig(num_warps=4),
    "spec_st4": DecodeConfig(num_stages=4),
    "spec_bk128": DecodeConfig(block_k=128, num_warps=8, num_stages=3),
    "spec_bk32_w8": DecodeConfig(block_k=32, num_warps=8, num_stages=5),
    # one split where the programs fill the SMs once (0.9: the spec shapes' 128 programs on an H100's 132), else the
    # wave model's split: measured at Llama-8B / 70B spec shapes as one split (their plans are the same), and a table
    # row of it can never leave a smaller batch's chip under-filled
    "spec_split1": DecodeConfig(split1_fill=0.9),
    "spec_split4": DecodeConfig(splits=4),
    "spec_split8": DecodeConfig(splits=8),
    "spec_occ3": DecodeConfig(occupancy=3),
    "spec_m32": DecodeConfig(block_m_max=32),
    # NVFP4's batch regime planned at 8 / 16 programs an SM instead of 4 (session 36, issue 31): at B 32 the plans of
    # spec_split4 / spec_split8, which session 31 measured 2.5-4.5% faster than the default on an H200, but only in the
    # regime, so a table row of them cannot give B 1 eight splits (session 31's nearest-bucket accident); every other
    # cache and batch runs the default's program (Kernel.effective)
    "nvfp4_occ8": DecodeConfig(nvfp4_batch_occupancy=8),
    "nvfp4_occ16": DecodeConfig(nvfp4_batch_occupancy=16),
}


def batch_regime(config: DecodeConfig, *, batch: int, hkv: int, rows: int, d: int, paged: bool,
                 sm_count: int | None = None) -> bool:
    """Whether a dense call is in the batch regime: ``B * Hkv * row_tiles >= SMs`` (each SM gets a program without
    splitting the keys)."""
    if paged:
        return False
    sm = sm_count if sm_count is not None else _compat.device_sm_count()
    return batch * hkv * planner.cdiv(rows, planner.block_m(rows, d, config.block_m_max)) >= sm


def nvfp4_batch_regime(config: DecodeConfig, *, batch: int, hkv: int, rows: int, d: int, paged: bool,
                       sm_count: int | None = None) -> bool:
    """Whether a dense NVFP4 call is in the batch regime (``batch_regime``) and the config turns NVFP4's regime on
    (``nvfp4_batch_occupancy``)."""
    return config.nvfp4_batch_occupancy is not None and batch_regime(
        config, batch=batch, hkv=hkv, rows=rows, d=d, paged=paged, sm_count=sm_count)


def quant_knobs(config: DecodeConfig, *, fmt: str | None, batch: int, hkv: int, rows: int, d: int, d_data: int,
                paged: bool, sm_count: int | None = None) -> tuple[bool, bool]:
    """``(halves, pv16)`` as a call over a ``fmt`` cache runs them (the kernel's launch and ``Kernel.effective`` both
    ask here). ``nvfp4_halves`` None: on with the "asm" decode or in NVFP4's batch regime, and only when the tile is
    the data's width (``d == d_data``). ``quant_pv16`` None (meaningful with a bf16 q): on in the batch regime and on
    a paged NVFP4 cache (session 38: 0.95-0.96x at NVFP4 paged B 8 / 32 in two runs; 1.00 / 1.04x at fp8 paged, and
    1.02-1.06x on dense caches outside the regime)."""
    if fmt is None:
        return False, False
    kw = dict(batch=batch, hkv=hkv, rows=rows, d=d, paged=paged, sm_count=sm_count)
    pv16 = config.quant_pv16
    if pv16 is None:
        pv16 = (paged and fmt == "nvfp4") or batch_regime(config, **kw)
    halves = config.nvfp4_halves
    if halves is None:
        halves = config.nvfp4_decode == "asm" or nvfp4_batch_regime(config, **kw)
    return bool(fmt == "nvfp4" and halves and d == d_data), bool(pv16)


def qk16_on(config: DecodeConfig, *, fmt: str | None, q_dtype, tiles: int) -> bool:
    """Whether a call over a ``fmt`` cache with a ``q_dtype`` q runs its scores in fp16 (``quant_qk16``): a quantized
    cache and a bf16 q only (an fp16 q has nothing to convert; a 16-bit cache's K tile is already q's dtype). None:
    on, except NVFP4 where a program streams fewer than ``QK16_NVFP4_MIN_TILES`` key tiles (``tiles``: the plan's
    ``chunk_blocks``): there the conversion's fixed cost a program outweighed the tiles' saving (docs/quantized_kv.md
    §13)."""
    if fmt is None or jnp.dtype(q_dtype) != jnp.bfloat16:
        return False
    if config.quant_qk16 is not None:
        return bool(config.quant_qk16)
    return fmt != "nvfp4" or tiles >= QK16_NVFP4_MIN_TILES


def plan(*, batch: int, hkv: int, rows: int, d: int, max_kv: int, config: DecodeConfig,
         page_size: int | None = None, sm_count: int | None = None, kv_format: str | None = None) -> planner.DecodePlan:
    """The launch plan for one call (``planner.plan_decode`` with this config's knobs; a quantized cache's tile
    scaled by ``config.quant_tile_scale`` when the config leaves ``block_k`` to the planner; a dense NVFP4 cache in
    the batch regime planned at ``config.nvfp4_batch_occupancy`` programs per SM)."""
    sm = sm_count if sm_count is not None else _compat.device_sm_count()
    occ = config.occupancy
    if kv_format == "nvfp4" and nvfp4_batch_regime(config, batch=batch, hkv=hkv, rows=rows, d=d,
                                                   paged=page_size is not None, sm_count=sm):
        occ = config.nvfp4_batch_occupancy
    # session 23 (docs/fa_decode.md "Speculative decode"): on a dense 16-bit cache, one split wherever the programs
    # fill the SMs once (the wave model's second split cost 2.5-5% there, at Tq 1 and at Tq 2-8 alike), and 4 warps
    # for a 64-row program at D 128 (8 were 2.5-4% slower at every such shape measured); paged caches keep their
    # ragged-batch splits and quantized ones their own regimes (neither measured under these rules)
    dense16 = page_size is None and not kv_format
    fill = config.split1_fill if config.split1_fill is not None else (DENSE_SPLIT1_FILL if dense16 else None)
    bm = planner.block_m(rows, d, config.block_m_max)
    splits = config.splits
    if splits is None and fill is not None:
        splits = 1 if batch * hkv * planner.cdiv(rows, bm) >= fill * sm else None
    warps = config.num_warps
    if warps is None and dense16 and d == 128 and bm == 64:
        warps = 4
    p = planner.plan_decode(
        batch=batch, hkv=hkv, rows=rows, d=d, max_kv=max_kv, sm_count=sm,
        block_k=config.block_k, num_warps=warps, num_stages=config.num_stages, splits=splits,
        occupancy=occ, paged_min_waves=config.paged_min_waves, block_m_max=config.block_m_max,
        page_size=page_size, block_k_scale=config.quant_tile_scale if kv_format else 1)
    return fit_stages(p, d=d, kv_format=kv_format)


# Triton keeps a program's K+V tiles as stored in shared memory beside the q tile, within ``SMEM_LIMIT``, in
# ``common.stage_buffers`` buffers (the rule and the three `spec_st4` launches that pin it: docs/fa_decode.md).


def stage_bytes(block_k: int, d: int, kv_format: str | None) -> int:
    """Shared memory of one pipelined K+V stage: the tiles as stored (16-bit; fp8 a byte; NVFP4 the packed codes and
    the micro-scales)."""
    per_key = {None: 2 * d, "fp8_e4m3": d, "nvfp4": d // 2 + d // 16}[kv_format]
    return 2 * block_k * per_key


def fit_stages(p: planner.DecodePlan, *, d: int, kv_format: str | None) -> planner.DecodePlan:
    """``p`` with its stages lowered to what fits ``SMEM_LIMIT`` beside the q tile (a config's ``num_stages`` is an
    upper bound; ``stage_buffers`` buffers of ``stage_bytes``); unchanged wherever it fits (every default plan does).
    Raises if not even one stage fits."""
    room = SMEM_LIMIT - p.block_m * d * 2
    fit = room // stage_bytes(p.block_k, d, kv_format)  # buffers that fit
    if stage_buffers(p.block_m, p.num_stages) <= fit:
        return p
    if fit < 1:
        raise ValueError(f"fa_decode: one {p.block_k}-key K+V tile at D {d} ({kv_format or '16-bit'}) does not fit the "
                         f"{SMEM_LIMIT} bytes of shared memory a CTA may use; give a smaller block_k")
    return dataclasses.replace(p, num_stages=max(s for s in range(1, fit + 2) if stage_buffers(p.block_m, s) <= fit))


# --------------------------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------------------------


# The power a row of q is scaled by for fp16 (qk16): its largest finite |value| lands in [2^14, 2^15), so every value
# within 2^28 of it is an fp16 normal; the exponent is clamped to [-112, 127] so that both powers are fp32 normals
# (a row whose largest value is under 2^-112 is scaled by 2^126 only).
_QK16_TOP, _QK16_MIN_EXP = 14, -112


def fp16_rows(qs):
    """bf16 q tiles -> ``(fp16 tiles, pow [rows])``: each row times ``2^(14 - E)``, where ``2^E <= m < 2^(E+1)`` and
    ``m`` is the row's largest finite ``|value|`` over every tile, and ``pow = 2^(E - 14)`` to undo it in the scores.

    Exact for every value within 2^28 of the row's largest (bf16's 8 significant bits fit fp16's 11; the power of
    two moves only the exponent) in a row whose largest is at least 2^-112; a smaller value rounds on fp16's subnormal
    grid, an error below 2^-38 of the row's largest, far under the fp32 accumulation's (an fp32-subnormal value, under
    2^-126, may be flushed to zero, as the bf16 tensor-core product would). NaN and inf stay NaN and inf in their own
    row (they are left out of ``m``, so no other row's scale sees them)."""
    f32 = jnp.float32
    a = None
    for x in qs:
        ax = jnp.abs(x.astype(f32))
        m = jnp.max(jnp.where(ax <= np.finfo(np.float32).max, ax, 0.0), axis=1)
        a = m if a is None else jnp.maximum(a, m)
    e = jnp.clip(((jax.lax.bitcast_convert_type(a, jnp.int32) >> 23) & 0xFF) - 127, _QK16_MIN_EXP, 127)
    up = jax.lax.bitcast_convert_type((127 + _QK16_TOP - e) << 23, f32)
    down = jax.lax.bitcast_convert_type((127 - _QK16_TOP + e) << 23, f32)
    return tuple((x.astype(f32) * up[:, None]).astype(jnp.float16) for x in qs), down


def _decode_kernel(*refs, p: planner.DecodePlan, lay: KVLayout, causal: bool, check: bool, scale_log2: float,
                   tq: int, rows: int, hkv: int, with_lse: bool, fmt: str | None = None, decode: str = "cast",
                   window: int | None = None, softcap: float | None = None, halves: bool = False, pv16: bool = False,
                   qk16: bool = False, strided: bool = False, rowlim: bool = False):
    it = iter(refs)
    q_ref, k_ref, v_ref = next(it), next(it), next(it)
    km_ref, vm_ref = (next(it), next(it)) if fmt == "nvfp4" else (None, None)
    sk_ref, sv_ref = (next(it), next(it)) if fmt is not None else (None, None)
    bt_ref, lens_ref = (next(it), next(it)) if lay.paged else (None, None)
    off_ref = next(it) if causal else None
    qr_ref = next(it) if rowlim else None  # rowlim: each sequence's real queries (rows packed query-major)
    out_refs = list(it)
    bm, bk, d = p.block_m, p.block_k, lay.tile_d  # tile columns: D, or D 96 padded to 128 (zeros past D)

    pid = pl.program_id(0)
    t = pid % p.row_tiles
    rest = pid // p.row_tiles
    s = rest % p.splits
    bh = rest // p.splits
    b = bh // hkv
    h = bh % hkv

    if lay.paged:
        # A length the table cannot hold is a bad table too: clamp (no read past the table) and flag.
        kv_len, bad0 = seqlen.clamp_len(lens_ref[b], lay.capacity)
    else:
        kv_len, bad0 = lay.tk, jnp.zeros((), jnp.bool_)

    r = t * bm + jnp.arange(bm, dtype=jnp.int32)  # packed rows
    row_ok = r < rows
    # rowlim: the rows of real queries (query-major: query i's rows are i * group ...); padding rows load no q and,
    # with splits, store no partial state (the merge reads only real rows: session 39)
    live = r < qr_ref[b] * (rows // tq) if rowlim else None
    q_ok = row_ok & live if rowlim else row_ok
    st_ok = row_ok & live if rowlim and p.splits > 1 else row_ok
    q_row0 = bh * rows + t * bm
    # halves (NVFP4, kv_source.nvfp4_halves): q's even columns are one operand, its odd ones the other. strided (the
    # GPU): read with a column stride of 2 and the output written back the same way, no XLA permutation around the
    # kernel; else (the interpreter, which has no strided refs) q arrives even-then-odd and the output leaves so
    qcols = (((0, d // 2, 2), (1, d // 2, 2)) if strided else ((0, d // 2, 1), (d // 2, d // 2, 1))) if halves \
        else ((0, d, 1),)
    qs = [_compat.load(q_ref.at[pl.ds(q_row0, bm), pl.ds(c0, w, st)],
                       mask=jnp.broadcast_to(q_ok[:, None], (bm, w)), other=0.0) for c0, w, st in qcols]
    _, i_q = gqa.row_position(r, tq, rows // tq, q_major=rowlim)

    lo = s * (p.chunk_blocks * bk)
    if causal:
        q_off = seqlen.offset_of(off_ref, b)
    if window is not None:
        # a sliding window (causal): the splits tile the band [first row's window start, last row], not the cache,
        # from a key-tile boundary; keys before the band are never loaded (the time follows the window)
        lo = lo + jnp.maximum(q_off - (window - 1), 0) // bk * bk
    hi = jnp.minimum(kv_len, lo + p.chunk_blocks * bk)
    if causal:
        # No row of this program sees a key past the last query position: stop loading there.
        hi = jnp.minimum(hi, q_off + tq)
    n_tiles = jnp.maximum(hi - lo + bk - 1, 0) // bk
    if rowlim:  # a row tile past the sequence's real queries reads no key (its rows are padding, dropped later)
        n_tiles = jnp.where(t * bm < qr_ref[b] * (rows // tq), n_tiles, 0)
    qk_scale, o_scale, dequant = scale_log2, None, None
    if fmt is not None:
        # the tiles decode exactly, short of 2^fold; the tensor scales and 2^fold fold into two scalars
        fold = float(2.0 ** (E4M3_FOLD if fmt == "fp8_e4m3" else NVFP4_FOLD)[decode])
        qk_scale = sk_ref[0] * (scale_log2 * fold)
        o_scale = sv_ref[0] * fold
        # a bf16 q (session 13): the exact fp16 tile converts to bf16 exactly (an E4M3 value has 4 significant bits,
        # an NVFP4 level x micro-scale product at most 7, bf16 holds 8, and bf16's exponent range covers fp16's), so
        # the scores' dot runs in q's dtype on the same values; V too unless pv16 (session 18: V stays fp16 and P
        # joins it as fp16, one convert per V element fewer)
        to_q = (lambda x: x) if q_ref.dtype == jnp.float16 else (lambda x: x.astype(q_ref.dtype))
        to_v = (lambda x: x) if pv16 else to_q
        # qk16 (session 38): a bf16 q becomes fp16 instead, each row scaled by a power of two (fp16_rows), so the K
        # tile stays as it decodes (no fp16 -> bf16 convert a K element) and the row's power joins its score scale
        to_k = (lambda x: x) if qk16 else to_q
        if qk16:
            qs, row_pow = fp16_rows(qs)
            qk_scale = qk_scale * row_pow[:, None]
        if fmt == "fp8_e4m3":
            def dequant(k, v):
                return (to_k(e4m3_tile(k, decode)),), (to_v(e4m3_tile(v, decode)),)
        elif halves:
            def dequant(k, v):
                return tuple(map(to_k, nvfp4_halves(*k, decode))), tuple(map(to_v, nvfp4_halves(*v, decode)))
        else:
            def dequant(k, v):
                return (to_k(nvfp4_tile(*k, decode)),), (to_v(nvfp4_tile(*v, decode)),)
    # the block-table check on gathered pages (page < tile): the pages this program's keys span, checked once outside
    # its loop (kv_source.pages_load / pages_flag, or pages_bad for wide spans; session 38: per-key flags carried
    # through the loop cost the fp8 paged call 7-14%); a tile of one page checks that page in the loop (a scalar);
    # nothing when the caller turned the check off
    pages_after = check and lay.paged and lay.gather
    src = KVSource(lay, k_ref, v_ref, bt_ref, b=b, h=h, dequant=dequant, k_micro_ref=km_ref, v_micro_ref=vm_ref,
                   check_gathered=not pages_after)

    def body(i, carry):
        m_run, l_run, accs, bad_run = carry
        j0 = lo + i * bk
        j = j0 + jnp.arange(bk, dtype=jnp.int32)
        kmask = j < hi
        ks, vs, bad = src.tile(j0, j, kmask)
        if dequant is None:
            ks, vs = (ks,), (vs,)
        # the scores: one dot over D, or (halves) the sum of the two halves' dots
        sc = functools.reduce(operator.add, (
            jax.lax.dot_general(qh, kh, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            for qh, kh in zip(qs, ks)))
        if softcap is not None:  # cap * tanh(scale * s / cap), in the base-2 domain of the online softmax
            sc = jnp.tanh(sc * (scale_log2 / (softmax.LOG2E * softcap))) * (softcap * softmax.LOG2E)
        else:
            sc = sc * qk_scale
        vis = kmask[None, :]
        if causal:
            vis = vis & (j[None, :] <= (i_q + q_off)[:, None])
        if window is not None:
            vis = vis & (j[None, :] > (i_q + q_off - window)[:, None])
        m_new, l_new, alpha, pr = softmax.step(m_run, l_run, sc, vis, base2=True)
        accs = tuple(acc * alpha[:, None] + jnp.dot(pr.astype(vh.dtype), vh, preferred_element_type=jnp.float32)
                     for acc, vh in zip(accs, vs))
        return m_new, l_new, accs, (bad_run | bad) if check and lay.paged and not pages_after else bad_run

    m0, l0 = softmax.init_state((bm,))
    accs0 = tuple(jnp.zeros((bm, w), jnp.float32) for _, w, _ in qcols)
    if pages_after:  # the pages holding keys [lo, hi), as the loop visits them (none when it runs no tile)
        first = lo // lay.page
        end = jnp.where(n_tiles > 0, (hi + lay.page - 1) // lay.page, first)
        # at most a split's keys, from a tile boundary: its pages (2 more where a page does not divide the tile)
        span = p.chunk_blocks * bk // lay.page + (0 if bk % lay.page == 0 else 2)
        # up to PAGES_ONE_LOAD: one load issued before the loop and reduced after it, its latency under the loop
        # (session 39: the load after the loop cost fp8 paged B 8 4%); wider spans loop after the key loop
        early = pages_load(bt_ref, b * lay.pages_per_seq, first, pages_per_seq=lay.pages_per_seq,
                           width=c.next_pow2(span)) if span <= PAGES_ONE_LOAD else None
    m_run, l_run, accs, bad = jax.lax.fori_loop(0, n_tiles, body, (m0, l0, accs0, bad0))
    if pages_after:
        bad = bad | (pages_flag(early, first, end, num_pages=lay.num_pages) if early is not None else
                     pages_bad(bt_ref, b * lay.pages_per_seq, first, end, pages_per_seq=lay.pages_per_seq,
                               num_pages=lay.num_pages, width=min(256, c.next_pow2(span))))

    for (c0, w, st), acc in zip(qcols, accs):
        o, lse = splitkv.partial(m_run, l_run, acc, base2=True)
        if o_scale is not None:
            o = o * o_scale
        if check and lay.paged:
            o = jnp.where(bad, jnp.nan, o)
        omask = jnp.broadcast_to(st_ok[:, None], (bm, w))
        if p.splits == 1:
            o_ref = out_refs[0]
            _compat.store(o_ref.at[pl.ds(q_row0, bm), pl.ds(c0, w, st)], o.astype(o_ref.dtype), mask=omask)
        else:
            _compat.store(out_refs[0].at[pl.ds(q_row0, bm), s, pl.ds(c0, w, st)], o, mask=omask)
    if p.splits == 1 and with_lse:
        _compat.store(out_refs[1].at[pl.ds(q_row0, bm)], lse, mask=st_ok)
    elif p.splits > 1:
        _compat.store(out_refs[1].at[pl.ds(q_row0, bm), s], lse, mask=st_ok)


# --------------------------------------------------------------------------------------------------------
# Wrappers
# --------------------------------------------------------------------------------------------------------


def _launch(q, k2, v2, extra, *, p: planner.DecodePlan, lay: KVLayout, causal: bool, check: bool, scale: float,
            b: int, tq: int, hq: int, hkv: int, interpret: bool, config: DecodeConfig, return_lse: bool,
            fmt: str | None = None, quant_args: tuple = (), window: int | None = None, softcap: float | None = None,
            sinks=None, rowlim: bool = False):
    if sinks is not None:  # the sink joins each row's denominator after the merge: o *= e^lse / (e^lse + e^sink)
        out, lse = _launch(q, k2, v2, extra, p=p, lay=lay, causal=causal, check=check, scale=scale, b=b, tq=tq, hq=hq,
                           hkv=hkv, interpret=interpret, config=config, return_lse=True, fmt=fmt,
                           quant_args=quant_args, window=window, softcap=softcap, rowlim=rowlim)
        sk = jnp.asarray(sinks, jnp.float32)[None, :, None]  # [1, Hq, 1] against lse [B, Hq, Tq]
        tot = jnp.logaddexp(lse, sk)
        w = jnp.exp(lse - tot)  # 0 for a row with no visible key (lse -inf)
        out = (out.astype(jnp.float32) * jnp.transpose(w, (0, 2, 1))[..., None]).astype(out.dtype)
        return (out, tot) if return_lse else out
    d = lay.tile_d  # D 96: q padded with zero columns to 128, the output cut back to 96 after the merge
    rows = (hq // hkv) * tq
    n_rows = b * hkv * rows
    decode = config.nvfp4_decode if fmt == "nvfp4" else config.fp8_decode
    if decode == "asm" and (interpret or not _asm_capable()):  # the same bytes through "cast" (no inline PTX in the
        decode = "cast"  # interpreter; cvt.rn.f16x2.e4m3x2 needs sm_89+)
    # "asm" keeps its halves apart everywhere (kv_source._nvfp4_levels_asm)
    halves, pv16 = quant_knobs(config, fmt=fmt, batch=b, hkv=hkv, rows=rows, d=d, d_data=lay.d, paged=lay.paged)
    qk16 = qk16_on(config, fmt=fmt, q_dtype=q.dtype, tiles=p.chunk_blocks)
    kernel = functools.partial(
        _decode_kernel, p=p, lay=lay, causal=causal, check=check, scale_log2=scale * softmax.LOG2E, tq=tq,
        rows=rows, hkv=hkv, with_lse=return_lse and p.splits == 1, fmt=fmt, decode=decode, window=window,
        softcap=softcap, halves=halves, pv16=pv16, qk16=qk16, strided=halves and not interpret, rowlim=rowlim)
    grid = (p.row_tiles * p.splits * b * hkv,)
    params = _compat.triton_params(num_warps=p.num_warps, num_stages=p.num_stages)
    qp = gqa.pack_q(q, hkv, q_major=rowlim)
    if d != lay.d:
        qp = jnp.pad(qp, ((0, 0), (0, d - lay.d)))
    if halves and interpret:  # the kernel's halves: q's even columns, then its odd ones (the output comes back so)
        qp = jnp.concatenate([qp[:, 0::2], qp[:, 1::2]], axis=-1)
    args = (qp, k2, v2, *quant_args, *extra)
    if p.splits == 1:
        shapes = [jax.ShapeDtypeStruct((n_rows, d), q.dtype)]
        if return_lse:
            shapes.append(jax.ShapeDtypeStruct((n_rows,), jnp.float32))
        res = pl.pallas_call(kernel, out_shape=tuple(shapes), grid=grid, compiler_params=params,
                             interpret=interpret, name=f"pallas_attn_{GEN}_partial")(*args)
        o, lse = (res[0], res[1]) if return_lse else (res[0], None)
    else:
        o_part, lse_part = pl.pallas_call(
            kernel,
            out_shape=(jax.ShapeDtypeStruct((n_rows, p.splits, d), jnp.float32),
                       jax.ShapeDtypeStruct((n_rows, p.splits), jnp.float32)),
            grid=grid, compiler_params=params, interpret=interpret, name=f"pallas_attn_{GEN}_partial",
        )(*args)
        # rowlim: the merge reads the real rows' states only (the padding rows' partials were never written)
        live = (extra[-1], lambda row, qr_ref: row % rows < qr_ref[row // (hkv * rows)] * (rows // tq)) \
            if rowlim else None
        res = splitkv.merge(o_part, lse_part, out_dtype=q.dtype, interpret=interpret, name=f"pallas_attn_{GEN}_merge",
                            block=config.merge_block, num_warps=config.merge_num_warps, return_lse=return_lse,
                            live=live)
        o, lse = res if return_lse else (res, None)
    if d != lay.d:
        o = o[:, :lay.d]
    if halves and interpret:  # even-then-odd columns back to the interleaved order
        o = jnp.stack([o[:, :d // 2], o[:, d // 2:]], axis=-1).reshape(o.shape)
    out = gqa.unpack_o(o, b, tq, hq, hkv, q_major=rowlim)
    return (out, gqa.unpack_lse(lse, b, tq, hq, hkv, q_major=rowlim)) if return_lse else out


def _storage(k, v, *, flat):
    """``(fmt, k_data, v_data, quant_args, width, micro)`` of the K/V operands: fp16 arrays pass through; a
    quantized pair contributes its (flattened) data, micro pools and the two tensor scales, each its own ``[1]``
    operand (a reshape, no launch: stacking them into one array was an XLA kernel of ~1.3 us on every call,
    docs/quantized_kv.md §10)."""
    fmt = quant.kv_format(k)
    if fmt is None:
        return None, flat(k), flat(v), (), 0, 0
    scales = (jnp.asarray(k.scale, jnp.float32).reshape(1), jnp.asarray(v.scale, jnp.float32).reshape(1))
    if fmt == "fp8_e4m3":
        return fmt, flat(k.data), flat(v.data), scales, 0, 0
    d = k.shape[-1]
    return fmt, flat(k.packed), flat(v.packed), (flat(k.micro), flat(v.micro), *scales), d // 2, d // quant.NVFP4_BLOCK


def _check_quantized(q, k, v) -> None:
    """Refuse a quantized K/V pair fa_decode cannot read (the API validates the fields' shapes)."""
    fk, fv = quant.kv_format(k), quant.kv_format(v)
    if fk != fv:
        raise ValueError(f"k and v must be stored alike (both fp16, both fp8_e4m3 or both nvfp4); got {fk}, {fv}")
    if fk is not None and q.shape[-1] not in QUANT_HEAD_DIMS:
        raise NotImplementedError(f"fa_decode reads quantized KV at head dims {QUANT_HEAD_DIMS}; got D={q.shape[-1]}")
    if fk is not None and jnp.dtype(q.dtype).name not in KERNEL.quantized_q_dtypes:
        raise NotImplementedError(f"fa_decode reads quantized KV with {' or '.join(KERNEL.quantized_q_dtypes)} q "
                                  f"(tiles decode exactly to fp16, then to q's dtype); got "
                                  f"q.dtype={jnp.dtype(q.dtype).name}")


def _check_common(q, hkv: int, d_kv: int, dtype) -> None:
    b, tq, hq, d = q.shape
    if dtype is None:  # a quantized pair, checked by _check_quantized
        dtype = q.dtype
    if jnp.dtype(q.dtype).name not in ("float16", "bfloat16") or jnp.dtype(dtype) != jnp.dtype(q.dtype):
        raise NotImplementedError(f"fa_decode takes float16 or bfloat16 q and KV of the same dtype; got "
                                  f"{q.dtype=}, kv dtype={jnp.dtype(dtype).name}")
    if d not in HEAD_DIMS or d_kv != d:
        raise NotImplementedError(f"fa_decode supports head dims {', '.join(map(str, HEAD_DIMS))} (same for q and KV); "
                                  f"got {d=}, {d_kv=}")
    if hq % hkv:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={hq}, Hkv={hkv}")
    if not 1 <= tq <= 16:
        raise NotImplementedError(f"fa_decode is a decode kernel for 1 <= Tq <= 16; got Tq={tq}")


def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool, config: DecodeConfig,
            return_lse: bool = False, window: int | None = None, softcap: float | None = None, sinks=None):
    """Dense decode on validated BTNH arrays (``contract`` calling convention). Features as ``paged_forward``'s:
    ``window=W`` (causal; the splits tile only the band), ``softcap`` (16-bit KV), ``sinks [Hq]``."""
    window, softcap, sinks = check_features(causal, window, softcap, sinks, q.shape[2], quant.kv_format(k) is not None)
    return _dense(q, k, v, q_offset, sinks, causal=bool(causal), scale=scale, interpret=interpret, config=config,
                  return_lse=return_lse, window=window, softcap=softcap)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse", "window",
                                             "softcap"))
def _dense(q, k, v, q_offset, sinks=None, *, causal, scale, interpret, config, return_lse, window=None, softcap=None):
    b, tq, hq, d = q.shape
    _, tk, hkv, dk = k.shape
    _check_quantized(q, k, v)
    _check_common(q, hkv, dk, getattr(k, "dtype", None))
    p = plan(batch=b, hkv=hkv, rows=(hq // hkv) * tq, d=tile_width(d), max_kv=_band(tk, tq, window), config=config,
             kv_format=quant.kv_format(k))
    fmt, k2, v2, qargs, width, micro = _storage(k, v, flat=flat_dense)
    lay = KVLayout(paged=False, block_k=p.block_k, d=d, tk=tk, width=width, micro=micro)
    extra = (q_offset,) if causal else ()
    return _launch(q, k2, v2, extra, p=p, lay=lay, causal=bool(causal), check=False,
                   scale=scale, b=b, tq=tq, hq=hq, hkv=hkv, interpret=interpret, config=config,
                   return_lse=return_lse, fmt=fmt, quant_args=qargs, window=window, softcap=softcap, sinks=sinks)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse",
                                             "check_block_table", "window", "softcap"))
def _paged(q, k_pool, v_pool, block_table, kv_lens, q_offset, sinks=None, q_rows=None, *, causal, scale, interpret,
           config, return_lse, check_block_table, window=None, softcap=None):
    b, tq, hq, d = q.shape
    num_pages, page, hkv, _ = k_pool.shape
    pages_per_seq = block_table.shape[1]
    p = plan(batch=b, hkv=hkv, rows=(hq // hkv) * tq, d=tile_width(d), max_kv=_band(pages_per_seq * page, tq, window),
             config=config, page_size=page, kv_format=quant.kv_format(k_pool))
    fmt, k2, v2, qargs, width, micro = _storage(k_pool, v_pool, flat=flat_pool)
    lay = KVLayout(paged=True, block_k=p.block_k, d=d, page=page, pages_per_seq=pages_per_seq,
                   num_pages=num_pages, gather=p.paged_gather, width=width, micro=micro)
    extra = (block_table.reshape(-1), kv_lens) + ((q_offset,) if causal else ()) + (
        () if q_rows is None else (q_rows,))
    return _launch(q, k2, v2, extra, p=p, lay=lay, causal=bool(causal),
                   check=bool(check_block_table), scale=scale, b=b, tq=tq, hq=hq, hkv=hkv, interpret=interpret,
                   config=config, return_lse=return_lse, fmt=fmt, quant_args=qargs, window=window, softcap=softcap,
                   sinks=sinks, rowlim=q_rows is not None)


def _band(max_kv: int, tq: int, window: int | None) -> int:
    """Keys the splits must cover: the whole cache, or with a window the band of ``window + tq - 1`` keys from a
    key-tile boundary (a tile is at most 512 keys), so the split plan follows the window, not the cache length."""
    return max_kv if window is None else min(max_kv, window + tq - 1 + 512)


def check_features(causal: bool, window, softcap, sinks, hq: int, quantized: bool):
    """fa_decode's features (``window`` keys a query sees, itself included, causal; ``softcap``; ``sinks [Hq]``),
    validated: ``(window, softcap, sinks)``."""
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be a positive int (keys a query sees, itself included); got {window!r}")
        if not causal:
            raise NotImplementedError("fa_decode's window is causal (a query's last W positions); pass causal=True")
        window = int(window)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not softcap > 0:
            raise ValueError(f"softcap must be a positive float; got {softcap!r}")
        if quantized:
            raise NotImplementedError("fa_decode: softcap over a quantized cache is not built")
        softcap = float(softcap)
    if sinks is not None:
        sinks = jnp.asarray(sinks, jnp.float32)
        if sinks.shape != (hq,):
            raise ValueError(f"sinks must be float [Hq={hq}]; got shape {sinks.shape}")
    return window, softcap, sinks


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: DecodeConfig, return_lse: bool = False, check_block_table: bool = True,
                  window: int | None = None, softcap: float | None = None, sinks=None, q_rows=None):
    """Paged decode on validated arrays (``contract`` calling convention): pools ``[num_pages, page, Hkv, D]``,
    int32 ``block_table [B, pages_per_seq]``, int32 ``kv_lens [B]`` (ragged), int32 ``q_offset [B]``.
    Features (keyword-only; session 11, issue 32): ``window=W`` (causal: query ``i`` sees keys ``i + off - W < j <=
    i + off``; the splits tile only that band, so the keys before it are never read), ``softcap`` (fp16 / bf16
    caches), ``sinks [Hq]`` (joined to each row's denominator after the merge; the LSE includes it).
    ``q_rows`` int32 ``[B]`` (causal; session 34, a mixed batch's decode part): each sequence's real queries, the
    rest of its ``Tq`` padding. The packed rows run query-major (``gqa``) and a row tile holding no real query reads
    no key, so 16 rows of which one query is real cost about one query's tile; the padding rows' output and LSE are
    unspecified (the caller drops them). Give the config a ``block_m_max`` (16: one tile the first ``16 / G``
    queries) for the tiles to be that small."""
    num_pages, page, hkv, dk = k_pool.shape
    _check_quantized(q, k_pool, v_pool)
    window, softcap, sinks = check_features(causal, window, softcap, sinks, q.shape[2],
                                            quant.kv_format(k_pool) is not None)
    _check_common(q, hkv, dk, getattr(k_pool, "dtype", None))
    if not _is_pow2(page):
        raise ValueError(f"page_size must be a power of two; got {page}")
    if check_block_table:
        c.validate_table_if_concrete(validate_block_table, block_table, kv_lens, num_pages=num_pages, page_size=page)
    if q_rows is not None:
        if not causal:
            raise ValueError("fa_decode: q_rows (padding queries) needs causal attention")
        q_rows = jnp.asarray(q_rows)
        if q_rows.shape != (q.shape[0],) or q_rows.dtype != jnp.int32:
            raise ValueError(f"fa_decode: q_rows must be int32 [B={q.shape[0]}]; got {q_rows.shape} {q_rows.dtype}")
    return _paged(q, k_pool, v_pool, block_table, kv_lens, q_offset, sinks, q_rows, causal=bool(causal), scale=scale,
                  interpret=interpret, config=config, return_lse=return_lse, check_block_table=check_block_table,
                  window=window, softcap=softcap)


def _plan_record(problem: Problem, config: DecodeConfig) -> dict:
    return plan(batch=problem.batch, hkv=problem.heads_kv, rows=problem.group * problem.q_len,
                d=tile_width(problem.head_dim),
                max_kv=problem.kv_len, config=config, page_size=problem.page_size,
                kv_format=problem.kv_dtype if problem.kv_dtype in ("fp8_e4m3", "nvfp4") else None).as_dict()


_QUANT_KNOBS = ("fp8_decode", "nvfp4_decode", "nvfp4_halves", "nvfp4_batch_occupancy", "quant_tile_scale", "quant_pv16",
                "quant_qk16")
_NVFP4_KNOBS = ("nvfp4_decode", "nvfp4_halves", "nvfp4_batch_occupancy")


def _effective(problem: Problem, config: DecodeConfig) -> DecodeConfig:
    """``config`` as ``problem`` runs it (``Kernel.effective``): the quantized decode's knobs reset on a 16-bit cache,
    NVFP4's on an fp8 one and fp8's on an NVFP4 one, ``quant_pv16`` / ``quant_qk16`` with an fp16 q (and both
    resolved from None), and NVFP4's batch regime resolved
    (outside it the plain plan and no halves, as ``nvfp4_plain``, except that the "asm" decode keeps its halves)."""
    base = DecodeConfig()
    kvd = problem.kv_dtype if problem.kv_dtype in ("fp8_e4m3", "nvfp4") else None
    keep = {"fp8_e4m3": ("fp8_decode", "quant_tile_scale", "quant_pv16", "quant_qk16"),
            "nvfp4": (*_NVFP4_KNOBS, "quant_tile_scale", "quant_pv16", "quant_qk16")}.get(kvd, ())
    if problem.dtype == "float16":
        keep = tuple(k for k in keep if k not in ("quant_pv16", "quant_qk16"))
    out = dataclasses.replace(config, **{k: getattr(base, k) for k in _QUANT_KNOBS if k not in keep})
    kw = dict(batch=problem.batch, hkv=problem.heads_kv, rows=problem.group * problem.q_len,
              d=tile_width(problem.head_dim), paged=problem.page_size is not None)
    halves, pv16 = quant_knobs(config, fmt=kvd, d_data=problem.head_dim, **kw)
    if "quant_pv16" in keep:
        tiles = _plan_record(problem, config)["chunk_blocks"]
        out = dataclasses.replace(out, quant_pv16=pv16, quant_qk16=qk16_on(config, fmt=kvd, q_dtype=problem.dtype,
                                                                            tiles=tiles))
    if kvd == "nvfp4":
        regime = nvfp4_batch_regime(config, **kw)
        out = dataclasses.replace(out, nvfp4_halves=halves,
                                  nvfp4_batch_occupancy=config.nvfp4_batch_occupancy if regime else None)
    return out


_TC = "packed GQA rows on tensor cores (mma), fp32 accumulation, base-2 online softmax"
_QNOTE = ("q float16 or bfloat16; KV tiles decoded in registers to exact fp16 (tensor scales folded into the score "
          "and output scalars), then as fp16 (bf16 q: q to fp16 by a power of two a row where quant_qk16 is on, "
          "else the tile converted to bf16; both exact)")

# ALU instructions per KV element of the decodes as first counted (docs/quantized_kv.md §3): fp8 "cast" is one
# cvt.rn.f16x2.e4m3x2 per two elements plus the byte permute feeding it; NVFP4 "bits" is per packed byte two
# shift/and/or groups (LOP3 + SHF, ~3 each), the join, and one fp16x2 multiply by the micro-scale per two (NVFP4's
# default decode is "asm" since session 19, 7.15 SASS instructions per element in all; layer 2 prices each decode by
# its own fitted cost, compare/layer2.py).
_DEQUANT_OPS = {"fp8_e4m3": 1.0, "nvfp4": 4.5}

def _table_choice(problem: Problem) -> str:
    """This GPU's table (pallas_attn/tuning, from the model-shape sweep) at the problem's bucket, else "default"."""
    return tuning.choose("fa_decode", problem, names=CONFIGS) or "default"


def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``s`` a ``compare.layer2.Shape``,
    ``hw`` its ``Hardware``, ``lp`` the call's plan, ``_plan_record``): the partial kernel over the packed rows' key
    tiles (a split's chunk of them), then the shared merge when the plan splits the keys. A causal window re-plans
    over its band (the splits tile only the window's keys). ``cfg`` names the quantized decode path (``fp8_decode``
    / ``nvfp4_decode``)."""
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    out: list[Launch] = []
    band = tk
    if s.window and s.causal:  # the kernel's splits tile only the window's band (session 11): plan it so
        band = _band(tk, tq, s.window)
        lp = plan(batch=s.batch, hkv=s.heads_kv, rows=(s.heads_q // s.heads_kv) * tq, d=tile_width(d), max_kv=band,
                  config=cfg or CONFIGS["default"], page_size=s.page_size, sm_count=hw.num_sm,
                  kv_format=s.kv_dtype or None).as_dict()
        band = min(tk, s.window + tq - 1 + lp["block_k"])  # keys read: the band from a tile boundary
    bm, bk, cb = lp["block_m"], lp["block_k"], lp["chunk_blocks"]
    P = lp["programs"]
    warps, stages = lp["num_warps"], lp["num_stages"]
    # keys read: every sequence's own length (ragged: their sum), or the window's band from a tile boundary
    kv = 2 * s.heads_kv * (s.batch * band if band != tk else kv_tokens(s)) * d * kv_bytes(s)
    dt = tile_width(d)  # the tiles' columns (D 96: 128, the padding masked: staged and multiplied, never read)
    ws = s.batch * s.heads_kv * lp["row_tiles"] * bm * lp["splits"] * (dt + 1) * 4 if lp["splits"] > 1 else 0
    cost, deq, note = "pallas_attn_fa_decode_partial", 0.0, ""
    if s.kv_dtype:  # quantized KV: storage bytes from HBM, every K and V element decoded in registers
        how = getattr(cfg, "fp8_decode" if s.kv_dtype == "fp8_e4m3" else "nvfp4_decode", None) or "cast"
        qk16 = qk16_on(cfg or CONFIGS["default"], fmt=s.kv_dtype, q_dtype=s.dtype, tiles=cb)
        cost, deq = f"pallas_attn_fa_decode_{s.kv_dtype}_{how}" + ("_qk16" if qk16 else ""), 2.0 * cb * bk * d
        note = f"; {s.kv_dtype} KV decoded ({how}) per element" + ("; scores in fp16 (qk16)" if qk16 else "")
    # shared memory: the q tile and the K/V buffers of the plan's stages (``stage_buffers``), staged as stored
    # (quantized: the storage bytes)
    out.append(Launch(names[0], cost, P, 32 * warps, 128,
                      int(bm * dt * 2 + 2 * bk * dt * stage_buffers(bm, stages) * kv_bytes(s)),
                      units=4 * bm * bk * dt * cb, steps=cb,
                      dram_bytes=kv + bh * tq * d * 2 + ws, unit="MMA FLOP", dequant_elems=deq,
                      note=f"{bm} packed rows x {bk}-key tiles, {cb} tiles per split" + note))
    if lp["splits"] > 1:
        rows_all = s.batch * s.heads_kv * (s.heads_q // s.heads_kv) * tq
        out.append(merge_launch(names[1], rows_all, lp.get("merge_num_warps", 4), lp["splits"], dt,
                                ws + rows_all * dt * 2, block=lp.get("merge_block", 64)))
    return out


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_partial", f"pallas_attn_{GEN}_merge"),
    config_cls=DecodeConfig,
    configs=CONFIGS,
    entries=frozenset({"dense", "paged", "quantized"}),
    dtypes=("float16", "bfloat16"),
    precision={"float16": Precision("fp16", "fp32", "tensor", _TC),
               "bfloat16": Precision("bf16", "fp32", "tensor", _TC)},
    head_dims=HEAD_DIMS,
    limits=_limits,
    gqa=True,
    max_q_len=16,
    dense=forward,
    paged=paged_forward,
    kv_precision={"fp8_e4m3": Precision("fp8", "fp32", "tensor", _QNOTE),
                  "nvfp4": Precision("nvfp4", "fp32", "tensor", _QNOTE)},
    quantized_q_dtypes=("float16", "bfloat16"),
    kv_dequant_ops=_DEQUANT_OPS,
    heuristic=lambda problem: CONFIGS[_table_choice(problem)],  # then the plan sizes tiles and splits per call
    plan=_plan_record,
    effective=_effective,
    launches=launches,
)
