"""fa_prefill: a Hopper (sm_90) attention forward in Pallas on Mosaic GPU: TMA, wgmma, warp specialisation.

What it is. Dense prefill attention (Tq and Tk long), forward only, written for the H100's asynchronous
machinery instead of the Triton lowering's generic tiles (docs/fa_prefill.md has the design, the roofline
prediction and the measurements). Its parent is v5_wmma (reference §2.5: fp16 operands on tensor cores,
fp32 accumulation, online softmax, docs/reference.md §2.5); the changes:

  * One CTA = three warpgroups (``plgpu.kernel(num_threads=3)``). Warpgroups 0 and 1 are consumers: each
    owns ``block_q`` query rows (its Q tile stays in shared memory for the whole KV sweep) and runs both
    products as **wgmma** (S = Q K^T from shared memory, O += P V with P from registers), fp32
    accumulation. Warpgroup 2 is the producer: it drops to a small register budget
    (``set_max_registers``) and issues **TMA** copies of K and V tiles (``block_kv`` keys) into a ring of
    ``stages`` shared-memory slots. Per slot, a "loaded" barrier (TMA completion) and a "free" barrier
    (both consumers arrived) hand the slot back and forth; this is the producer/consumer split of
    FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608), written from the paper's description.
  * ``pingpong``: the two consumers take turns on the tensor cores (two named-barrier style handoffs made
    of shared-memory barriers): while one warpgroup's softmax runs on the CUDA cores, the other's wgmma
    runs, so the exponentials hide under the matmuls (FA-3 §3.1, "ping-pong scheduling").
  * Online softmax in base 2: the scale and log2(e) fold into one multiply before ``exp2`` (approximate
    ``ex2`` through ``approx_math``); the running max is kept on the raw scores.
  * Causal: KV blocks past a row tile's diagonal are never loaded; blocks fully below the diagonal skip
    the mask (an unmasked loop) and only the diagonal band (and a ragged last key block) pays for it.
  * GQA: query head ``h`` reads KV head ``h // G`` in place (no repeated K/V in HBM).
  * Any length: the wrapper pads Q to the CTA's rows and K/V to ``block_kv`` only when the length is not
    a multiple (a copy, and only then); keys at or past ``Tk`` are masked in the last block.
  * LSE: natural-log, from ``m`` and ``l`` at the end (-inf and a zero output for a row with no visible key).
  * Features beyond the contract (``forward``'s keyword arguments, docs/fa_prefill.md "Features"): a window band
    ``(left, right)`` (key blocks outside every row's band are never loaded; the band's partial blocks run as masked
    serial steps), a logit soft-cap (tanh before the mask), attention sinks (one logit per head in the denominator).
  * ``tiles``: a CTA may run several row tiles in turn (snake order, heavy first), the K/V ring counting blocks across
    them, for short sequences and narrow windows where one tile is mostly latency.

Conventions (``contract``): BTNH arrays, causal top-left with a per-sequence offset: key ``j`` is visible
to query ``i`` iff ``j <= i + q_offset[b]``.

Interpret mode (CPU). Mosaic GPU kernels do not run on a CPU; ``interpret=True`` runs a Pallas kernel
with the same blocking and the same arithmetic in jnp (``_fallback_kernel``: online softmax in base 2 over
``block_kv`` tiles, same masking and causal block bounds, same LSE), so the CPU tests check the semantics
this module promises (odd lengths, offsets, GQA, fully masked rows, NaN propagation) and the GPU tests
check the Mosaic kernel against the float64 oracle.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .. import tuning
from .._compat import pl
from . import seqlen
from .common import SMEM_LIMIT as _SMEM_LIMIT  # 227 KiB a CTA on sm_90
from .contract import Backward, Kernel, Precision, Problem
from .launches import Launch, cdiv, occupancy
from .mosaic_kit import WgmmaOps
from .mosaic_kit import pad as _pad
from .mosaic_kit import ring_producer as _ring_producer
from .mosaic_kit import smem_tile as _smem_tile

__all__ = ["PrefillConfig", "CONFIGS", "KERNEL", "forward", "smem_bytes", "fit"]

GEN = "fa_prefill"
# packed documents (segment_ids) on the Mosaic kernel: on since tests/gpu/test_fa_prefill_gpu.py's packed cases passed
# on an H100 (session 10, git c59c847, after the left-band fix; the first runs gave wrong output and hung). A switch so
# that a regression found on a GPU can turn the path off (forward and drop-in then refuse segment_ids with the reason)
PACKED_ON_GPU = True
PASS_FWD = f"pallas_attn_{GEN}_fwd"
PASS_FALLBACK = f"pallas_attn_{GEN}_fwd_interpret"
PASS_NAMES = (PASS_FWD, f"{PASS_FWD}_mosaic_gpu", PASS_FALLBACK)  # the Mosaic module carries both spellings
_LOG2E = math.log2(math.e)
_HEAD_DIMS = (64, 96, 128, 256)
_PAGED_HEAD_DIMS = (64, 128, 256)


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """Knobs of the Hopper forward.

    block_q: query rows per consumer warpgroup (64: one wgmma M tile; the CTA holds consumers * block_q rows).
    block_kv: keys per K/V tile (a multiple of 64, 64..256). stages: depth of the K/V shared-memory ring (2..4).
    overlap: software-pipeline each consumer (issue S_s = Q K_s^T and O += P_{s-1} V_{s-1} together, softmax of
    block s under the P V wgmma; FA-3 §3.2); without it a consumer waits for each wgmma before its softmax.
    pingpong: the two consumers alternate on the tensor cores (FA-3 ping-pong). consumer_regs / producer_regs:
    per-thread register budgets after ``set_max_registers`` (multiples of 8, 24..256). tiles: row tiles (consumers *
    block_q rows each) one CTA runs in turn, spread over the head's row tiles (``order``); the producer streams the
    next tile's K/V while the consumers finish the current one (short sequences and narrow windows, where one tile
    is a few microseconds of latency and the H100 holds one CTA per SM). consumers: consumer warpgroups per CTA (2
    or 3; the CTA holds ``consumers * block_q`` rows and one producer): 3 gives the tensor cores a third warpgroup's
    wgmmas to run while two others are in their softmax (D 64, where a tile's exponentials take as long as its
    wgmmas); the register budgets must then fit four warpgroups (``3 * consumer_regs + producer_regs <= 512``), and
    ping-pong (a two-consumer handshake) is refused. order: which row tiles a multi-tile CTA runs
    (``_tile_qblock``): ``snake`` (every second round reversed, so a CTA's causal work is the same in every CTA of a
    head; the default since session 30: on an H200 at D 128, N 2048-8192, 0.5-2.4% faster than ``strided`` at the
    same tiles in 12 of 12 pairs, results/gpu_runs/20261128_s30_h200_call1_order_pagecfg/) or ``strided`` (rank ``g
    + t * n_groups``, what every multi-tile config ran before); no effect at ``tiles=1``. producer_warp: whether the
    producer's copy loop runs in one warp of its warpgroup (``pl.core_map(plgpu.WarpMesh)``) rather than in all four
    (a warpgroup copy repeats its descriptor code and a warpgroup barrier in four warps, on the sub-partitions the
    consumers issue from). None (default): one warp when a key block spans several pages (paged, page < block_kv:
    the page-16 chunk 1.081x -> 1.017x its dense twin, docs/serving.md "Page 16 under ncu"), the warpgroup otherwise
    (dense, on an H200: one warp 0.97-0.99x at D 96 and at N <= 1024, about even at D 256, 1.01-1.06x at D 64 and
    D 128 from N 2048; docs/fa_prefill.md "The producer in one warp"). True / False force it (config
    ``warp_producer``: True).
    """

    block_q: int = 64
    block_kv: int = 128
    stages: int = 2
    overlap: bool = True
    pingpong: bool = False
    consumer_regs: int = 232
    producer_regs: int = 40
    tiles: int = 1
    consumers: int = 2
    order: str = "snake"
    producer_warp: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tiles, bool) or not isinstance(self.tiles, int) or not 1 <= self.tiles <= 16:
            raise ValueError(f"PrefillConfig.tiles must be an int in [1, 16]; got {self.tiles!r}")
        if self.block_q != 64:
            raise ValueError(f"PrefillConfig.block_q must be 64 (one wgmma M tile per warpgroup); got {self.block_q}")
        if self.block_kv not in (64, 128, 192, 256):
            raise ValueError(f"PrefillConfig.block_kv must be one of 64, 128, 192, 256; got {self.block_kv}")
        if self.stages not in (2, 3, 4):
            raise ValueError(f"PrefillConfig.stages must be 2, 3 or 4; got {self.stages}")
        for name in ("consumer_regs", "producer_regs"):
            r = getattr(self, name)
            if not (24 <= r <= 256 and r % 8 == 0):
                raise ValueError(f"PrefillConfig.{name} must be a multiple of 8 in [24, 256]; got {r}")
        if self.producer_warp is not None and not isinstance(self.producer_warp, bool):
            raise ValueError(f"PrefillConfig.producer_warp must be None, True or False; got {self.producer_warp!r}")
        for name in ("overlap", "pingpong"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"PrefillConfig.{name} must be a bool; got {getattr(self, name)!r}")
        if self.order not in ("strided", "snake"):
            raise ValueError(f"PrefillConfig.order must be 'strided' or 'snake'; got {self.order!r}")
        if isinstance(self.consumers, bool) or self.consumers not in (2, 3):
            raise ValueError(f"PrefillConfig.consumers must be 2 or 3; got {self.consumers!r}")
        # setmaxnreg moves registers between the warpgroups of a CTA launched with 65536 / (128 x warpgroups) per
        # thread (rounded down to 8): 3 x 168 = 504 for two consumers, 4 x 128 = 512 for three
        wgs = self.consumers + 1
        budget = wgs * (65536 // (128 * wgs) // 8 * 8)
        if self.consumers * self.consumer_regs + self.producer_regs > budget:
            raise ValueError(f"PrefillConfig: {self.consumers} x consumer_regs {self.consumer_regs} + producer_regs "
                             f"{self.producer_regs} exceed the {budget} registers per thread that {wgs} warpgroups "
                             f"share (65536 per CTA)")
        if self.consumers != 2 and self.pingpong:
            raise ValueError("PrefillConfig: pingpong alternates two consumers; it needs consumers=2")


CONFIGS = {
    "default": PrefillConfig(),
    "pingpong": PrefillConfig(pingpong=True),
    "serial": PrefillConfig(overlap=False),
    "tiles2": PrefillConfig(tiles=2),
    "tiles4": PrefillConfig(tiles=4),
    "tiles8": PrefillConfig(tiles=8),
    # three consumers (192 rows a CTA); H100, GPT-2 shapes (D 64, causal, bf16): 0.90x default at B2 N16384, 1.10-1.45x
    # at N 512-2048 (results/fa_prefill/20261127_s14_h100_c3/)
    "c3": PrefillConfig(consumers=3, consumer_regs=160, producer_regs=32),
    # the producer's copy loop in one warp at every shape (the default does so only for paged blocks of several
    # pages): measured beside the default (session 32: faster at D 96 and at N <= 1024, slower at D 64 and D 128 from
    # N 2048, docs/fa_prefill.md "The producer in one warp")
    "warp_producer": PrefillConfig(producer_warp=True),
}


def _swizzle(d: int, dtype) -> int:
    """The shared-memory swizzle of a ``d``-column tile: 128 bytes (64 16-bit columns a swizzle atom) where ``d`` is
    a multiple of 64, else the widest that divides a row (D 96: 64 bytes, three 32-column atoms a row)."""
    row = d * jnp.dtype(dtype).itemsize
    return next(sw for sw in (128, 64, 32) if row % sw == 0)


def smem_bytes(d: int, itemsize: int, cfg: PrefillConfig, with_lse: bool = True, q_buffers: int = 1) -> int:
    """Shared memory of one CTA: ``q_buffers`` pairs of Q/O tiles (one per consumer), the K and V rings, the LSE
    staging and the barriers."""
    nc = cfg.consumers
    tiles = (nc * q_buffers * cfg.block_q * d + 2 * cfg.stages * cfg.block_kv * d) * itemsize
    # + Mosaic GPU's own scratch (2 KiB of reduction space by default), the barriers and alignment
    return tiles + (nc * cfg.block_q * 4 if with_lse else 0) + 2700


def q_buffers(d: int, itemsize: int, cfg: PrefillConfig, tiles: int, with_lse: bool = True) -> int:
    """Q/O buffers per consumer: 2 when a CTA runs several row tiles and a second pair fits shared memory (the next
    tile's Q streams in while the current one computes, and its O leaves without a wait), else 1."""
    if tiles > 1 and smem_bytes(d, itemsize, cfg, with_lse, q_buffers=2) <= _SMEM_LIMIT:
        return 2
    return 1


def fit(cfg: PrefillConfig, d: int, itemsize: int = 2, with_lse: bool = True) -> PrefillConfig:
    """The config that runs at head dim ``d`` for a **named** config (an object of ``CONFIGS``, as ``config=
    "default"`` resolves to, and what compare runs): itself when its tiles fit shared memory, else the same schedule
    with 64-key tiles and two stages (D=256: the 128-key K/V ring alone is 2 x 2 x 128 x 256 x 2 B), and with two
    consumers where three still do not fit (c3 at D=256). A ``PrefillConfig`` the caller built is returned as is
    (``forward`` refuses it if it does not fit: refused, not truncated). The heuristic, ``forward`` and the plan
    compare records all go through here, so the plan says what ran. The decision counts the LSE staging whether or
    not the call returns it (``with_lse`` is accepted and not used): the plan is made before the call is known, and
    the one config the LSE decides, c3 at D=256 (three consumers, 64-key tiles: 232,076 estimated bytes without the
    LSE, 372 under the limit), failed Mosaic GPU's pass pipeline on the GPU (H200, session 29: "INTERNAL: Pass
    pipeline failed"), so the estimate's slack is not trusted that close to the limit."""
    del with_lse
    named = any(cfg is c for c in CONFIGS.values())
    if named and smem_bytes(d, itemsize, cfg) > _SMEM_LIMIT and (cfg.block_kv, cfg.stages) != (64, 2):
        cfg = dataclasses.replace(cfg, block_kv=64, stages=2)
        if smem_bytes(d, itemsize, cfg) > _SMEM_LIMIT and cfg.consumers == 3:
            # three Q/O tiles of 256 columns do not fit beside the smallest ring: two consumers, their registers
            base = PrefillConfig()
            cfg = dataclasses.replace(cfg, consumers=2, consumer_regs=base.consumer_regs,
                                      producer_regs=base.producer_regs)
    return cfg


def _heuristic(p: Problem) -> PrefillConfig:
    # this GPU's table (pallas_attn/tuning, made from the model-shape sweep) first; outside it, "default": measured
    # on an H100 (docs/fa_prefill.md), the pipelined consumers win with and without the causal mask once masked
    # blocks leave the pipeline (B4 H16 N4096 D128 fp16: 825 vs 925 us non-causal, 490 vs 525 causal)
    name = tuning.choose("fa_prefill", p, names=CONFIGS) or "default"
    return fit(CONFIGS[name], p.head_dim)


# A window at most this wide (keys a row sees) runs several row tiles per CTA: each tile is then a few blocks of latency
# (H100, gpt-oss-20b local layers, window 128, B4 N8192 D64: tiles8 695.7 us vs one tile 796.6 us; at window 4096
# (Gemma-2 / Mistral) more tiles per CTA cost 6-10%: results/fa_prefill/20261126_s9_h100_tiles/). The bound between
# 128 and 4096 is not measured; 512 is a guess recorded as such in docs/fa_prefill.md.
NARROW_WINDOW = 512
NARROW_WINDOW_TILES = 8
# A wide causal window over rows at most two windows long (window < N <= 2 x window) at D 128: the first window's row
# tiles are the causal triangle (1 to 32 key blocks at a 4096-key window), the rest the full band, and several row
# tiles a CTA in the snake order balance the triangle and hide each tile's prologue. H200, Mistral-7B's 4096-key window
# (Hq 32 / Hkv 8, 32k tokens): at N 8192 tiles8 0.976-0.979x the one-tile config in three runs (session 30 calls 2-4,
# results/gpu_runs/20261128_s30_h200_call4_window_tiles/), at N 16384 0.987x (under the 2% a rule needs: not taken);
# Gemma-2's local layers (D 256, the same window, N 8192) lose 2% with any multi-tile config (call 2), and D 64 / 96
# under a wide window are not measured, so the rule is D 128's alone.
WIDE_WINDOW_TILES = 8
WIDE_WINDOW_HEAD_DIMS = (128,)


def config_for_window(cfg: PrefillConfig, causal: bool, window, *, q_len: int | None = None,
                      kv_len: int | None = None, head_dim: int | None = None) -> PrefillConfig:
    """The config for a call with ``window`` (``(left, right)`` or None) given the shape's config ``cfg``: with a
    band of at most ``NARROW_WINDOW`` keys per row, the same config with ``NARROW_WINDOW_TILES`` row tiles per CTA
    (two consumers in place of three), whatever the dense shape's tiles (session 30, H200: gpt-oss-20b's local layers
    ran 3-4% slower on the dense N 2048-8192 rows' tiles4 than on tiles8, results/gpu_runs/
    20261128_s30_h200_call5_prefill_window_rule/); with a wider causal window of ``left + 1`` keys over ``q_len`` rows
    where ``left + 1 < q_len <= 2 * (left + 1)`` at a head dim of ``WIDE_WINDOW_HEAD_DIMS`` (self-attention:
    ``kv_len == q_len``, all three given) and a one-tile config, ``WIDE_WINDOW_TILES``; otherwise ``cfg``."""
    if window is None:
        return cfg
    hi_off, lo_off = _mask_bounds(causal, tuple(window))
    if hi_off is None or lo_off is None:
        return cfg
    band = hi_off + lo_off + 1
    if band <= NARROW_WINDOW:
        return cfg if cfg.tiles == NARROW_WINDOW_TILES else _several_tiles(cfg, NARROW_WINDOW_TILES)
    if (cfg.tiles == 1 and causal and hi_off == 0 and q_len is not None and kv_len == q_len
            and head_dim in WIDE_WINDOW_HEAD_DIMS and band < q_len <= 2 * band):
        return _several_tiles(cfg, WIDE_WINDOW_TILES)
    return cfg


def _several_tiles(cfg: PrefillConfig, tiles: int) -> PrefillConfig:
    """``cfg`` with ``tiles`` row tiles a CTA: the same config with ``tiles``, or for three consumers (which lose where
    a tile is a few key blocks: short N, 1.1-1.6x two consumers) the named ``tiles<n>`` config (two consumers;
    ``default`` with ``tiles`` where no such name exists). A result equal to a named config is that named object, so
    ``fit`` still adapts it to the head dim (``default`` with four tiles is ``tiles4``, which ``fit`` gives 64-key
    tiles at D 256; an unnamed copy would be refused there for its shared memory)."""
    if cfg.consumers == 3:
        out = CONFIGS.get(f"tiles{tiles}") or dataclasses.replace(CONFIGS["default"], tiles=tiles)
    else:
        out = dataclasses.replace(cfg, tiles=tiles)
    return next((c for c in CONFIGS.values() if c == out), out)


# Packed documents (segment_ids): a row tile sees only its own document's keys, so with short documents each tile is a
# few key blocks, as under a narrow window, and several row tiles a CTA pay the tile's fixed cost once. Rows of at
# most PACKED_TILES[i][0] tokens run PACKED_TILES[i][1] row tiles a CTA (the first bound that holds). Measured on an
# H200 with the sweep's document mix (documents of N/16 to N/2 tokens; session 29, calls 0 and 4,
# results/gpu_runs/20261128_s29_h200_call4_packed_window/): at N 2048-4096 tiles4 is 0.90-0.94x the dense shape's
# one-tile config at D 64 and D 128; at N 8192 tiles2 is 0.976x (D 128) and 0.952x (D 64, against c3) where tiles4
# gains less; at N 16384 every multi-tile config loses 1-9% to the dense shape's config.
PACKED_TILES: tuple[tuple[int, int], ...] = ((4096, 4), (8192, 2))
PACKED_TILES_MAX_Q_LEN = PACKED_TILES[-1][0]


def config_for_packed(cfg: PrefillConfig, q_len: int) -> PrefillConfig:
    """The config for a call with packed documents (``segment_ids``) of ``q_len`` tokens a row given the shape's
    config ``cfg``: ``PACKED_TILES``' row tiles per CTA for its length (four up to 4096 tokens, two up to 8192; the
    named ``tiles4`` / ``tiles2``, two consumers, in place of ``c3``), whatever the dense shape's tiles (session 30:
    the H200's dense N 4096 row became tiles8, and the packed Llama-3.1-8B N 4096 call then ran 785.9 us where tiles4
    ran 768.0, results/gpu_runs/20261128_s30_h200_call5_prefill_window_rule/); a longer row keeps ``cfg``."""
    tiles = next((n for bound, n in PACKED_TILES if q_len <= bound), None)
    if tiles is None or cfg.tiles == tiles:
        return cfg
    return _several_tiles(cfg, tiles)


def config_for_features(cfg: PrefillConfig, *, causal: bool, window, q_len: int, packed: bool,
                        kv_len: int | None = None, head_dim: int | None = None) -> PrefillConfig:
    """The shape's config ``cfg`` after the rules for the call's features: ``config_for_window`` (its wide-window
    rule where ``kv_len`` and ``head_dim`` are given), then for packed documents ``config_for_packed``. The one
    composition the drop-in and ``fa_prefill_bwd.attention_lse`` use."""
    cfg = config_for_window(cfg, causal, window, q_len=q_len, kv_len=kv_len, head_dim=head_dim)
    return config_for_packed(cfg, q_len) if packed else cfg


def _limits(p: Problem) -> tuple[bool, str]:
    """This kernel's own refusals (``Kernel.limits``, asked after the contract's generic checks pass): the group
    divisibility, at least one key, the shared memory of the config it would run."""
    if p.heads_q % p.heads_kv:
        return False, f"{GEN}: Hq must be a multiple of Hkv; got Hq={p.heads_q}, Hkv={p.heads_kv}"
    if p.kv_len < 1:
        return False, f"{GEN}: needs at least one key (Tk >= 1); got Tk={p.kv_len}"
    cfg = _heuristic(p)
    if smem_bytes(p.head_dim, 2, cfg) > _SMEM_LIMIT:
        return False, f"{GEN}: D={p.head_dim} needs more shared memory than an H100 block has"
    return True, ""


# ------------------------------------------------------------------------------------------------------------
# The Mosaic GPU kernel
# ------------------------------------------------------------------------------------------------------------


def _block_bounds(r0, off, *, bq: int, bkv: int, tk: int, hi_off, lo_off=None, seg=None):
    """``(n_start, n_lfull, n_full, n_total)`` key blocks for rows ``[r0, r0 + bq)``, where row ``i`` sees keys
    ``i + off - lo_off <= j <= i + off + hi_off`` and ``j < tk`` (a side that is None is unbounded). Blocks before
    ``n_start`` and from ``n_total`` on are invisible to every row; blocks in ``[n_lfull, n_full)`` are visible to
    every row (no mask at all); ``[n_start, n_lfull)`` (the window's left band) and ``[n_full, n_total)`` (the
    causal diagonal or the window's right edge, a ragged last key block) need the mask. ``n_lfull`` may exceed
    ``n_full`` (a window narrower than the tile): callers clip. ``seg``: ``(s0, s1)``, the first and the last
    row's document start (packed sequences: row ``i`` also needs ``j >= start[i]``; starts never decrease)."""
    n_len_full, n_len = tk // bkv, -(-tk // bkv)
    if hi_off is None:
        n_full, n_total = jnp.int32(n_len_full), jnp.int32(n_len)
    else:
        lo = r0 + off + hi_off + 1  # keys [0, lo) are visible to the first row of the tile
        hi = r0 + bq + off + hi_off  # keys [0, hi) are visible to the last row
        n_full = jnp.clip(lax.div(jnp.maximum(lo, 0), bkv), 0, n_len_full).astype(jnp.int32)
        n_total = jnp.clip(lax.div(jnp.maximum(hi, 0) + bkv - 1, bkv), 0, n_len).astype(jnp.int32)
    if lo_off is None and seg is None:
        return 0, 0, n_full, n_total
    if lo_off is None:
        a0, a1 = seg
    else:
        a0 = r0 + off - lo_off  # the first row's lowest visible key
        a1 = r0 + bq - 1 + off - lo_off  # the last row's
        if seg is not None:
            a0, a1 = jnp.maximum(a0, seg[0]), jnp.maximum(a1, seg[1])
    n_start = jnp.clip(lax.div(jnp.maximum(a0, 0), bkv), 0, n_len).astype(jnp.int32)
    n_lfull = jnp.clip(lax.div(jnp.maximum(a1, 0) + bkv - 1, bkv), 0, n_len).astype(jnp.int32)
    return n_start, n_lfull, n_full, n_total


def _consumer_bounds(r0, off, *, bq: int, bkv: int, tk: int, hi_off, lo_off, seg=None):
    """``(a, n_lfull, n_full, n_done)`` of a consumer's rows ``[r0, r0 + bq)``: it runs blocks ``[a, n_done)``, at
    least one and inside the key range (a tile that sees no key runs one block, masked), ``[n_lfull, n_full)`` of
    them visible to every row."""
    n_start, n_lfull, n_full, n_total = _block_bounds(r0, off, bq=bq, bkv=bkv, tk=tk, hi_off=hi_off, lo_off=lo_off,
                                                      seg=seg)
    a = n_start if lo_off is None and seg is None else jnp.minimum(n_start, -(-tk // bkv) - 1)
    return a, n_lfull, n_full, jnp.maximum(n_total, a + 1)


def _tile_qblock(g, t, n_qblocks: int, n_groups: int, snake: bool = False):
    """The row block (of consumers * block_q rows) that CTA ``g`` runs as its tile ``t``: heavy (late) blocks first,
    strided by the number of CTAs per head. Round ``t`` hands the ``n_groups`` CTAs the row blocks of rank ``[t *
    n_groups, (t + 1) * n_groups)``, heaviest first: ``strided`` gives rank ``t * n_groups + g`` every round (CTA 0
    the heaviest each time: under causal masking its work is ``tiles * n_groups`` key blocks above the last CTA's);
    ``snake`` reverses every odd full round (CTA 0 the heaviest, then the lightest of the next ``n_groups``), so two
    rounds sum to the same causal work in every CTA. A last round that is not full runs straight in both (the same
    CTAs run it, so ``_n_tiles`` holds for both orders)."""
    r = g + t * n_groups
    if snake:
        full = (t + 1) * n_groups <= n_qblocks
        r = jnp.where(full & (lax.rem(t, 2) == 1), t * n_groups + n_groups - 1 - g, r)
    return n_qblocks - 1 - r


def _n_tiles(g, tiles: int, n_qblocks: int, n_groups: int):
    """How many tiles CTA ``g`` runs: ``tiles``, fewer for the last CTAs when ``tiles`` does not divide the blocks."""
    return jnp.minimum(tiles, lax.div(n_qblocks - g + n_groups - 1, n_groups))


def _serial_plan(a, n_lfull, n_full, n_done, *, banded: bool):
    """The serial consumer's blocks: ``(bm, f)``: ``[a, bm)`` masked (a window's left band), ``[bm, f)`` unmasked,
    ``[f, n_done)`` masked (``a``, ``n_lfull``, ``n_full``: ``_block_bounds``; ``n_done > a``)."""
    bm = jnp.clip(n_lfull, a, n_done) if banded else a
    return bm, jnp.clip(n_full, bm, n_done)


def _pipeline_plan(a, n_lfull, n_full, n_done, *, banded: bool):
    """The pipelined consumer's blocks: ``(bm, pro_masked, lo)``: ``[a, bm)`` masked serial steps (a window's left
    band), block ``bm`` the pipeline's prologue (masked iff ``pro_masked``), ``(bm, lo)`` unmasked and pipelined,
    ``[lo, n_done)`` masked serial steps. ``bm < n_done`` always: the prologue has a loaded block to run."""
    if banded:
        bm = jnp.clip(n_lfull, a, n_done - 1)
        pro_masked = (n_lfull > bm) | (n_full <= bm)
    else:
        bm, pro_masked = a, n_full == a
    lo = jnp.clip(jnp.where(pro_masked, bm + 1, n_full), bm + 1, n_done)
    return bm, pro_masked, lo


def _mask_bounds(causal: bool, window) -> tuple[int | None, int | None]:
    """``(hi_off, lo_off)`` of ``_block_bounds`` for the causal flag and a ``(left, right)`` window (either side
    None = unbounded): row ``i`` sees ``i + off - left <= j <= i + off + min(right, 0 if causal)``."""
    left, right = (None, None) if window is None else window
    hi = 0 if causal else None
    if right is not None:
        hi = right if hi is None else min(hi, right)
    return hi, left


@functools.lru_cache(maxsize=64)
def _build_mosaic(b: int, tq_pad: int, tk_pad: int, tk: int, hq: int, hkv: int, d: int, dtype_name: str,
                  causal: bool, scale: float, cfg: PrefillConfig, with_lse: bool, window=None,
                  softcap: float | None = None, sinks: bool = False, segments: bool = False,
                  paged: tuple[int, int] | None = None, rowlim: bool = False):
    """``paged=(page, pages_per_seq)``: K and V are page pools ``[num_pages, page, Hkv, D]`` read through a flat
    int32 block table ``[B * pages_per_seq]`` (entries already clamped into the pool); the producer issues one TMA
    copy per page of a key block (``block_kv // page`` of them, all arriving on the block's barrier) or one copy
    from inside a page (``page`` a multiple of ``block_kv``). ``rowlim``: an int32 ``[B]`` input of real rows per
    sequence (causal only; negative: a poisoned sequence, every output row NaN). A consumer whose rows all lie at or
    past it idles: no Q load and no math, it releases the tile's key blocks and stores zeros (ping-pong: it runs one
    masked block instead); a tile with no real row loads no key block. The kernel writes 0 into the output rows at or
    past it, so a batch of short chunks padded to a long one costs its real rows and no pass over the padding."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    ops = WgmmaOps(emulate=False)  # the register math (no interpreter path here: the CPU runs ``_fallback``)
    dtype = jnp.dtype(dtype_name)
    bq, bkv, ns, nc = cfg.block_q, cfg.block_kv, cfg.stages, cfg.consumers
    rows = nc * bq  # one row tile: nc consumers of bq rows
    group = hq // hkv
    n_qblocks = tq_pad // rows
    tiles = min(cfg.tiles, n_qblocks)
    n_groups = -(-n_qblocks // tiles)
    snake = cfg.order == "snake" and tiles > 1
    nqb = q_buffers(d, dtype.itemsize, cfg, tiles, with_lse)
    hi_off, lo_off = _mask_bounds(causal, window)
    bounded = hi_off is not None or lo_off is not None
    # soft-cap: the kernel keeps t = tanh(scale * s / cap) in [-1, 1] and folds cap and log2(e) into the exponent's
    # one multiply, exp2((t - m) * cap * log2 e); without it the scale and log2(e) fold into that multiply (the running
    # max is kept on t, or on the raw scores)
    c = softcap * _LOG2E if softcap is not None else float(scale) * _LOG2E

    banded = lo_off is not None or segments  # a lower key bound per row: the window's left side, a document start
    # rowlim: a consumer whose rows are all padding idles (no Q load, no math: it releases the tile's key blocks and
    # stores zeros), and a tile with no real row loads nothing. Ping-pong keeps the masked-block path (its turn
    # barrier counts every consumer's steps)
    skip = rowlim and not cfg.pingpong

    def body(q_ref, k_ref, v_ref, off_ref, *rest):
        if paged:
            bt_ref, *rest = rest
        if rowlim:
            rl_ref, *rest = rest
        if sinks:
            sink_ref, *rest = rest
        if segments:  # float32 [B, Tq_pad]: each row's document start (packed sequences; exact below 2^24)
            seg_ref, *rest = rest
        if with_lse:
            o_ref, lse_ref, *scratch = rest
        else:
            (o_ref, *scratch), lse_ref = rest, None
        if segments:  # the consumers' rows' document starts, staged in shared memory by TMA
            *scratch, seg_smem, seg_bar = scratch
        if with_lse:
            qo_smem, k_smem, v_smem, lse_smem, q_bar, k_bar, v_bar, k_free, v_free, turn = scratch
        else:
            (qo_smem, k_smem, v_smem, q_bar, k_bar, v_bar, k_free, v_free, turn), lse_smem = scratch, None
        h = lax.axis_index("h")
        bi = lax.axis_index("b")
        wg = lax.axis_index("wg")
        hk = lax.div(h, group)
        off = off_ref[bi] if bounded or segments else jnp.int32(0)

        def bounds(r0, off):
            seg = (seg_ref[bi, r0].astype(jnp.int32), seg_ref[bi, r0 + bq - 1].astype(jnp.int32)) if segments else None
            return _consumer_bounds(r0, off, bq=bq, bkv=bkv, tk=tk, hi_off=hi_off, lo_off=lo_off, seg=seg)

        # this CTA's row tiles (nc * bq rows each): tile t is row block _tile_qblock(g, t, ...), heavy (late, causal)
        # tiles first, every CTA a mix of heavy and light ones (cfg.order); q is the launch's fastest-varying axis (see
        # the grid). With cfg.tiles == 1 one tile per CTA.
        g = lax.axis_index("q")
        n_tiles = _n_tiles(g, tiles, n_qblocks, n_groups) if tiles > 1 else 1

        def row_off(r0):
            """The offset a consumer's rows ``[r0, r0 + bq)`` use: the sequence's, or with ``rowlim`` for rows all
            past the sequence's real ones an offset that hides every key (one masked block, output cut later)."""
            if not rowlim:
                return off
            return jnp.where(r0 < rl_ref[bi], off, jnp.int32(_PAD_ROW_OFF))

        def tile_span(t):
            """(q0, a_p, n_load) of tile t: the producer loads the union of the consumers' blocks, from the first
            one's start (warpgroup 0, the smallest rows) to the last one's end (warpgroup nc - 1). The K/V ring counts
            blocks over the CTA's tiles: block s of a tile whose loads start after ``base`` earlier ones uses slot
            (base + s - a_p) % stages in every warpgroup. With ``rowlim`` any consumer may be padding (one block
            from 0): the union is taken over all of them."""
            q0 = _tile_qblock(g, t, n_qblocks, n_groups, snake) * rows
            if skip:  # the real consumers are a prefix of the tile's (rows ascend); none: nothing loaded
                rl = rl_ref[bi]
                bs = [bounds(q0 + w * bq, off) for w in range(nc)]
                return q0, jnp.where(q0 < rl, bs[0][0], 0), functools.reduce(
                    jnp.maximum, [jnp.where(q0 + w * bq < rl, x[3], 0) for w, x in enumerate(bs)])
            if rowlim:
                bs = [bounds(q0, row_off(q0))] + [bounds(q0 + w * bq, row_off(q0 + w * bq)) for w in range(1, nc)]
                return q0, functools.reduce(jnp.minimum, [x[0] for x in bs]), functools.reduce(
                    jnp.maximum, [x[3] for x in bs])
            return q0, bounds(q0, off)[0], bounds(q0 + (nc - 1) * bq, off)[3]

        def over_tiles(fn):
            if tiles == 1:
                fn(0, 0)
            else:
                lax.fori_loop(0, n_tiles, fn, jnp.int32(0))

        @pl.when(wg < nc)
        def _consumer():
            plgpu.set_max_registers(cfg.consumer_regs, action="increase")

            def qo_buf(buf):  # this consumer's Q/O buffer (one buffer: the layout and indexing of before)
                return qo_smem.at[wg] if nqb == 1 else qo_smem.at[buf, wg]

            def q_load(t, buf):  # this consumer's rows of tile t into Q/O buffer buf
                r = _tile_qblock(g, t, n_qblocks, n_groups, snake) * rows + wg * bq
                plgpu.copy_gmem_to_smem(q_ref.at[bi, pl.ds(r, bq), h], qo_buf(buf), q_bar.at[nc * buf + wg])

            def real(t):  # skip: whether this consumer's rows of tile t hold a real row (else it idles)
                return _tile_qblock(g, t, n_qblocks, n_groups, snake) * rows + wg * bq < rl_ref[bi]

            if nqb == 2:  # double-buffered Q/O (several tiles per CTA): the first tile's Q before the loop
                if skip:
                    pl.when(real(0))(lambda: q_load(0, 0))
                else:
                    q_load(0, 0)

            def tile(t, base):
                q0, a_p, n_load = tile_span(t)

                def slot_of(s):
                    return lax.rem(base + s - a_p, ns)

                r0 = q0 + wg * bq
                if nqb == 2:
                    # tile t computes in buffer t % 2 while tile t + 1's Q streams into the other one, which held
                    # tile t - 1's O: its store (and the LSE's) must have left shared memory first (only the smem
                    # read, not the global write: the O of tile t - 1 was issued just before this point)
                    buf = lax.rem(t, 2)
                    plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                    @pl.when((t + 1 < n_tiles) & real(t + 1) if skip else t + 1 < n_tiles)
                    def _():
                        q_load(t + 1, 1 - buf)
                else:
                    buf = 0
                q_smem = qo_buf(buf)

                def run():  # this consumer's rows of tile t: (acc, m, l) over its key blocks
                    if nqb == 1:
                        q_load(t, 0)
                    if segments:
                        plgpu.copy_gmem_to_smem(seg_ref.at[bi, pl.ds(r0, bq)], seg_smem.at[wg], seg_bar.at[wg])
                    off_t = row_off(r0)
                    a, n_lfull, n_full, n_done = bounds(r0, off_t)
                    plgpu.barrier_wait(q_bar.at[nc * buf + wg])

                    if segments:  # this consumer's rows' document starts, in the row layout of the scores (staged in
                        # shared memory by TMA, as every other per-row vector)
                        plgpu.barrier_wait(seg_bar.at[wg])
                        seg_rows = ops.vec(seg_smem.at[wg]).astype(jnp.int32)
                    m0 = ops.rows(-jnp.inf, bq)
                    l0 = ops.rows(0.0, bq)
                    acc0 = ops.zeros((bq, d))

                    def turn_wait():  # ping-pong: wait for our turn on the tensor cores
                        if cfg.pingpong:
                            plgpu.barrier_wait(turn.at[wg])

                    def turn_pass():  # ping-pong: our wgmmas are issued, the other consumer may issue its own
                        if cfg.pingpong:
                            plgpu.barrier_arrive(turn.at[1 - wg])

                    if cfg.pingpong:  # warpgroup 1 lets warpgroup 0 go first
                        @pl.when(wg == 1)
                        def _():
                            plgpu.barrier_arrive(turn.at[0])

                    def drain(lo, hi):
                        # blocks the producer loaded for the other consumer only: release them (never early: each
                        # arrival waits for its load, so no slot's phase can complete before the other consumer's
                        # turn)
                        @pl.loop(lo, hi)
                        def _drain(s):
                            slot = slot_of(s)
                            turn_wait()
                            turn_pass()
                            plgpu.barrier_wait(k_bar.at[slot])
                            plgpu.barrier_arrive(k_free.at[slot])
                            plgpu.barrier_wait(v_bar.at[slot])
                            plgpu.barrier_arrive(v_free.at[slot])

                    def logits(sc):  # the soft-cap (tanh on the special-function unit; cap is in c), before any mask
                        if softcap is None:
                            return sc
                        return jnp.tanh(sc * (float(scale) / softcap))

                    def mask(sc, s):
                        rows = ops.iota((bq, bkv), 0)
                        cols = ops.iota((bq, bkv), 1)
                        kpos = s * bkv + cols
                        ok = kpos < tk
                        if hi_off is not None:
                            ok = ok & (kpos <= r0 + rows + (off_t + hi_off))
                        if lo_off is not None:
                            ok = ok & (kpos >= r0 + rows + (off_t - lo_off))
                        if segments:
                            ok = ok & (kpos >= lax.broadcast_in_dim(seg_rows, (bq, bkv), (0,)))
                        return jnp.where(ok, sc, -jnp.inf)

                    def softmax(sc, m_i, l_i):
                        m_new = jnp.maximum(m_i, sc.max(axis=1))
                        # a row with no visible key so far keeps m = -inf; subtract 0 there (never -inf - -inf)
                        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * c
                        alpha = jnp.exp2(m_i * c - m_use)
                        p = jnp.exp2(sc * c - lax.broadcast_in_dim(m_use, (bq, bkv), (0,)))
                        l_new = l_i * alpha + p.sum(axis=1)
                        return p.astype(dtype), alpha, m_new, l_new

                    def rescale(acc, alpha):
                        return acc * lax.broadcast_in_dim(alpha, (bq, d), (0,))

                    def qk(slot):  # S = Q K^T of the block in ``slot``, waited for (ping-pong: the turn passes once
                        # issued)
                        return ops.mma(q_smem, k_smem.at[slot], shape=(bq, bkv), b_t=True, issued=turn_pass)

                    # the serial step: S = Q K^T, wait, softmax, O = alpha O + P V, wait. The serial config runs every
                    # block with it; the pipelined one its masked blocks (below)
                    def step(s, carry, *, masked: bool):
                        acc, m_i, l_i = carry
                        slot = slot_of(s)
                        plgpu.barrier_wait(k_bar.at[slot])
                        turn_wait()
                        sc = qk(slot)
                        plgpu.barrier_arrive(k_free.at[slot])
                        sc = logits(sc)
                        if masked:
                            sc = mask(sc, s)
                        p, alpha, m_new, l_new = softmax(sc, m_i, l_i)
                        acc = rescale(acc, alpha)
                        plgpu.barrier_wait(v_bar.at[slot])
                        acc = ops.mma(p, v_smem.at[slot], acc=acc)
                        plgpu.barrier_arrive(v_free.at[slot])
                        return acc, m_new, l_new

                    masked_step = functools.partial(step, masked=True)
                    if banded:
                        drain(a_p, a)  # warpgroup 1 (a window, a later document): the first rows' left band is not ours
                    if not cfg.overlap:
                        bm, f = _serial_plan(a, n_lfull, n_full, n_done, banded=banded)  # the left band [a, bm): masked
                        carry = (acc0, m0, l0)
                        if banded:
                            carry = lax.fori_loop(a, bm, masked_step, carry)
                        carry = lax.fori_loop(bm, f, functools.partial(step, masked=False), carry)
                        acc, m_i, l_i = lax.fori_loop(f, n_done, masked_step, carry)
                    else:
                        # software pipeline inside the warpgroup (FA-3 §3.2): step s issues S_s = Q K_s^T and then
                        # O += P_{s-1} V_{s-1}, waits for S_s only, and runs the softmax of block s while the P V
                        # wgmma is still running. The carry is (alpha_s * O_{s-1}, m_s, l_s, P_s).
                        # Order: the window's left band [a, bm) as serial masked steps; block bm is the prologue
                        # (masked when it needs it, with no wgmma in flight; with no visible block at all the mask
                        # hides every key and the row ends with l = 0); the unmasked blocks (bm, lo) pipelined; the
                        # masked blocks [lo, n_done) (the causal diagonal, the window's right edge, a ragged last key
                        # block) serial again.
                        bm, pro_masked, lo = _pipeline_plan(a, n_lfull, n_full, n_done, banded=banded)
                        carry = (acc0, m0, l0)
                        if banded:
                            carry = lax.fori_loop(a, bm, masked_step, carry)
                        acc1, m_i, l_i = carry
                        slot0 = slot_of(bm)
                        plgpu.barrier_wait(k_bar.at[slot0])
                        turn_wait()
                        sc = logits(qk(slot0))
                        plgpu.barrier_arrive(k_free.at[slot0])
                        sc = lax.cond(pro_masked, lambda x: mask(x, bm), lambda x: x, sc)
                        p0, alpha0, m_i, l_i = softmax(sc, m_i, l_i)
                        acc1 = rescale(acc1, alpha0) if banded else acc1

                        def ostep(s, carry):  # an unmasked block: the kit's pipelined step
                            slot, prev = slot_of(s), slot_of(s - 1)
                            plgpu.barrier_wait(k_bar.at[slot])
                            plgpu.barrier_wait(v_bar.at[prev])
                            turn_wait()

                            def scored(sc):  # S_s is done (P_{s-1} V_{s-1} may still run): K's slot is free
                                sc = logits(sc)
                                plgpu.barrier_arrive(k_free.at[slot])
                                return sc

                            return ops.pipelined_step(carry, q_smem, k_smem.at[slot], v_smem.at[prev], softmax,
                                                      issued=turn_pass, scored=scored,
                                                      done=lambda: plgpu.barrier_arrive(v_free.at[prev]))

                        # masking inside the pipelined step, while a P V wgmma is in flight, made ptxas serialize every
                        # wgmma of the kernel (a wait after each k-chunk; H100 ncu, docs/fa_prefill.md "The causal
                        # pipeline")
                        acc, m_i, l_i, p_last = lax.fori_loop(bm + 1, lo, ostep, (acc1, m_i, l_i, p0))
                        last = slot_of(lo - 1)
                        plgpu.barrier_wait(v_bar.at[last])
                        turn_wait()
                        acc = ops.mma(p_last, v_smem.at[last], acc=acc, issued=turn_pass)
                        plgpu.barrier_arrive(v_free.at[last])
                        acc, m_i, l_i = lax.fori_loop(lo, n_done, masked_step, (acc, m_i, l_i))

                    drain(n_done, n_load)

                    if cfg.pingpong:  # balance the extra arrival warpgroup 1 made at the start
                        @pl.when(wg == 0)
                        def _():
                            plgpu.barrier_wait(turn.at[0])
                    return acc, m_i, l_i

                if skip:
                    def idle():  # all rows padding: release the tile's blocks (loaded for the others), no math
                        @pl.loop(a_p, n_load)
                        def _release(s):
                            slot = slot_of(s)
                            plgpu.barrier_wait(k_bar.at[slot])
                            plgpu.barrier_arrive(k_free.at[slot])
                            plgpu.barrier_wait(v_bar.at[slot])
                            plgpu.barrier_arrive(v_free.at[slot])

                        return ops.zeros((bq, d)), ops.rows(-jnp.inf, bq), ops.rows(0.0, bq)

                    acc, m_i, l_i = lax.cond(r0 < rl_ref[bi], run, idle)
                else:
                    acc, m_i, l_i = run()

                if sinks:
                    # the sink joins the denominator with no value (exp2 domain): m_f = max(m c, sink log2 e)
                    mc = m_i * c
                    s2 = sink_ref[h] * _LOG2E
                    mf = jnp.maximum(mc, s2)
                    corr = jnp.exp2(mc - mf)  # 0 for a row with no visible key (m = -inf)
                    l_tot = l_i * corr + jnp.exp2(s2 - mf)
                    out = acc * lax.broadcast_in_dim(corr / l_tot, (bq, d), (0,))
                    lse = (mf + jnp.log2(l_tot)) / _LOG2E
                else:
                    empty = l_i == 0.0
                    inv = 1.0 / jnp.where(empty, 1.0, l_i)
                    out = acc * lax.broadcast_in_dim(inv, (bq, d), (0,))
                    lse = jnp.where(empty, -jnp.inf, (m_i * c + jnp.log2(jnp.where(empty, 1.0, l_i))) / _LOG2E)
                if rowlim:  # rows at or past the sequence's real ones: 0; every row NaN for a poisoned one (rl < 0)
                    rl = rl_ref[bi]
                    out = jnp.where(ops.iota((bq, d), 0) < rl - r0, out, jnp.where(rl < 0, jnp.nan, 0.0))
                q_smem[...] = out.astype(dtype)
                if with_lse:
                    lse_smem.at[wg][...] = lse
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(q_smem, o_ref.at[bi, pl.ds(r0, bq), h])
                if with_lse:
                    plgpu.copy_smem_to_gmem(lse_smem.at[wg], lse_ref.at[bi, h, pl.ds(r0, bq)])
                if nqb == 1:
                    plgpu.wait_smem_to_gmem(0)
                return base + (n_load - a_p)

            over_tiles(tile)
            if nqb == 2:
                plgpu.wait_smem_to_gmem(0)

        def load_block(src, s, dst, bar):  # key block s of this (batch, kv head) into one ring slot
            if not paged:
                plgpu.copy_gmem_to_smem(src.at[bi, pl.ds(s * bkv, bkv), hk], dst, bar)
            elif paged[0] >= bkv:  # the block lies inside one page
                page, pps = paged
                pg = bt_ref[bi * pps + lax.div(s * bkv, page)]
                plgpu.copy_gmem_to_smem(src.at[pg, pl.ds(lax.rem(s * bkv, page), bkv), hk], dst, bar)
            else:  # the block spans block_kv // page pages: one copy each, all arriving on the block's barrier
                page, pps = paged
                per = bkv // page
                for c in range(per):
                    pg = bt_ref[bi * pps + s * per + c]
                    plgpu.copy_gmem_to_smem(src.at[pg, pl.ds(0, page), hk], dst.at[pl.ds(c * page, page)], bar)

        @pl.when(wg == nc)
        def _producer():
            plgpu.set_max_registers(cfg.producer_regs, action="decrease")

            def tile(t, base):  # key blocks [a_p, n_load) of tile t, the K and V rings counted across tiles
                _, a_p, n_load = tile_span(t)
                return _ring_producer(
                    plgpu, n_load, ns, (k_free, v_free),
                    (lambda s, slot: load_block(k_ref, s, k_smem.at[slot], k_bar.at[slot]),
                     lambda s, slot: load_block(v_ref, s, v_smem.at[slot], v_bar.at[slot])),
                    start=a_p, base=base, drain=False)

            one_warp = cfg.producer_warp if cfg.producer_warp is not None else bool(paged and paged[0] < bkv)
            if not one_warp:
                over_tiles(tile)
                return
            # One warp issues the copies; the other three only wait at the core_map's exit. As a warpgroup every
            # copy's table load (paged), descriptor arithmetic and warpgroup barrier ran in all four producer warps,
            # on the sub-partitions the consumers issue from: at page 16 (8 copies a K block) a third more warp
            # instructions than the dense kernel and the chunk 1.08x its dense twin (session 32, ncu; docs/serving.md
            # "Page 16 under ncu"); in one warp 1.017x. PrefillConfig.producer_warp says where else it pays.
            @pl.core_map(plgpu.WarpMesh(axis_name="warp"))
            def _per_warp():
                @pl.when(lax.axis_index("warp") == 0)
                def _():
                    over_tiles(tile)

    copies = max(bkv // paged[0], 1) if paged else 1  # TMA copies per key block (each one arrival)
    out_type = [jax.ShapeDtypeStruct((b, tq_pad, hq, d), dtype)]
    if with_lse:
        out_type.append(jax.ShapeDtypeStruct((b, hq, tq_pad), jnp.float32))
    scratch = [
        _smem_tile((nc, bq, d) if nqb == 1 else (nqb, nc, bq, d), dtype, swizzle=_swizzle(d, dtype)),
        _smem_tile((ns, bkv, d), dtype, swizzle=_swizzle(d, dtype)),
        _smem_tile((ns, bkv, d), dtype, swizzle=_swizzle(d, dtype)),
        *([plgpu.SMEM((nc, bq), jnp.float32)] if with_lse else []),
        plgpu.Barrier(num_arrivals=1, num_barriers=nc * nqb),
        plgpu.Barrier(num_arrivals=copies, num_barriers=ns),
        plgpu.Barrier(num_arrivals=copies, num_barriers=ns),
        plgpu.Barrier(num_arrivals=nc, num_barriers=ns),
        plgpu.Barrier(num_arrivals=nc, num_barriers=ns),
        plgpu.Barrier(num_arrivals=1, num_barriers=2),
    ]
    if segments:
        # float32 starts (exact below 2^24 tokens): an int32 vector through this path gave wrong output on the GPU
        scratch += [plgpu.SMEM((nc, bq), jnp.float32), plgpu.Barrier(num_arrivals=1, num_barriers=nc)]
    return plgpu.kernel(
        body,
        out_type=tuple(out_type) if with_lse else out_type[0],
        scratch_types=scratch,
        # Mosaic GPU launches the grid reversed (its last axis is CUDA's x, the fastest-varying): q last, so the
        # CTAs that run together are the row tiles of a few heads and their K/V stays in L2 (with q first, a
        # wave spanned 64 (batch, head) pairs whose 128 MB of K/V streamed from HBM again in every wave)
        grid=(b, hq, n_groups),
        grid_names=("b", "h", "q"),
        num_threads=nc + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name=PASS_FWD,
    )


# ------------------------------------------------------------------------------------------------------------
# The interpret-mode twin (CPU): same tiles, same arithmetic, a plain pallas_call
# ------------------------------------------------------------------------------------------------------------


def _fallback_kernel(off_ref, sink_ref, seg_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *, bq: int, bkv: int, tk: int,
                     tk_pad: int, causal: bool, scale: float, window, softcap, sinks: bool, segments: bool):
    bi, hi_, qi = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hi_off, lo_off = _mask_bounds(causal, window)
    off = off_ref[bi] if (hi_off is not None or lo_off is not None) else jnp.int32(0)
    c = softcap * _LOG2E if softcap is not None else float(scale) * _LOG2E  # as the Mosaic kernel (t = tanh units)
    r0 = qi * bq
    q = q_ref[0, :, 0, :]
    seg_rows = seg_ref[0, :] if segments else None
    seg = (seg_rows[0], seg_rows[bq - 1]) if segments else None
    n_start, _, _, n_total = _block_bounds(r0, off, bq=bq, bkv=bkv, tk=tk, hi_off=hi_off, lo_off=lo_off, seg=seg)
    n_total = jnp.minimum(n_total, tk_pad // bkv)
    rows = r0 + lax.broadcasted_iota(jnp.int32, (bq, bkv), 0)
    d = q.shape[-1]

    def step(s, carry):
        acc, m_i, l_i = carry
        k = k_ref[0, pl.ds(s * bkv, bkv), 0, :]
        v = v_ref[0, pl.ds(s * bkv, bkv), 0, :]
        sc = jnp.dot(q, k.T, preferred_element_type=jnp.float32)
        if softcap is not None:
            sc = jnp.tanh(sc * (float(scale) / softcap))
        kpos = s * bkv + lax.broadcasted_iota(jnp.int32, (bq, bkv), 1)
        ok = kpos < tk
        if hi_off is not None:
            ok = ok & (kpos <= rows + (off + hi_off))
        if lo_off is not None:
            ok = ok & (kpos >= rows + (off - lo_off))
        if segments:
            ok = ok & (kpos >= seg_rows[:, None])
        sc = jnp.where(ok, sc, -jnp.inf)
        m_new = jnp.maximum(m_i, sc.max(axis=1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * c
        alpha = jnp.exp2(m_i * c - m_use)
        p = jnp.exp2(sc * c - m_use[:, None])
        l_new = l_i * alpha + p.sum(axis=1)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return acc, m_new, l_new

    init = (jnp.zeros((bq, d), jnp.float32), jnp.full((bq,), -jnp.inf, jnp.float32), jnp.zeros((bq,), jnp.float32))
    # the twin masks every block it visits; the Mosaic kernel skips the mask where the bounds say it may
    acc, m_i, l_i = lax.fori_loop(n_start, n_total, step, init)
    if sinks:  # the sink joins the denominator with no value, as in the Mosaic kernel
        mc = m_i * c
        s2 = sink_ref[hi_] * _LOG2E
        mf = jnp.maximum(mc, s2)
        corr = jnp.exp2(mc - mf)
        l_tot = l_i * corr + jnp.exp2(s2 - mf)
        o_ref[0, :, 0, :] = (acc * (corr / l_tot)[:, None]).astype(o_ref.dtype)
        lse_ref[0, 0, :] = (mf + jnp.log2(l_tot)) / _LOG2E
        return
    empty = l_i == 0.0
    o_ref[0, :, 0, :] = (acc / jnp.where(empty, 1.0, l_i)[:, None]).astype(o_ref.dtype)
    lse_ref[0, 0, :] = jnp.where(empty, -jnp.inf, (m_i * c + jnp.log2(jnp.where(empty, 1.0, l_i))) / _LOG2E)


def _fallback(q, k, v, off, sinks, seg, *, causal: bool, scale: float, tk: int, cfg: PrefillConfig, window,
              softcap):
    b, tq_pad, hq, d = q.shape
    tk_pad, hkv = k.shape[1], k.shape[2]
    group = hq // hkv
    bq, bkv = cfg.block_q, cfg.block_kv
    kern = functools.partial(_fallback_kernel, bq=bq, bkv=bkv, tk=tk, tk_pad=tk_pad, causal=causal, scale=scale,
                             window=window, softcap=softcap, sinks=sinks is not None, segments=seg is not None)
    sink_arr = jnp.zeros((hq,), jnp.float32) if sinks is None else sinks
    seg_arr = jnp.zeros((b, tq_pad), jnp.int32) if seg is None else seg
    return pl.pallas_call(
        kern,
        grid=(b, hq, tq_pad // bq),
        in_specs=[
            pl.BlockSpec((b,), lambda i, j, t: (0,)),
            pl.BlockSpec((hq,), lambda i, j, t: (0,)),
            pl.BlockSpec((1, bq), lambda i, j, t: (i, t)),
            pl.BlockSpec((1, bq, 1, d), lambda i, j, t: (i, t, j, 0)),
            pl.BlockSpec((1, tk_pad, 1, d), lambda i, j, t: (i, 0, j // group, 0)),
            pl.BlockSpec((1, tk_pad, 1, d), lambda i, j, t: (i, 0, j // group, 0)),
        ],
        out_specs=[
            pl.BlockSpec((1, bq, 1, d), lambda i, j, t: (i, t, j, 0)),
            pl.BlockSpec((1, 1, bq), lambda i, j, t: (i, j, t)),
        ],
        out_shape=[jax.ShapeDtypeStruct((b, tq_pad, hq, d), q.dtype),
                   jax.ShapeDtypeStruct((b, hq, tq_pad), jnp.float32)],
        interpret=True,
        name=PASS_FALLBACK,
    )(off, sink_arr, seg_arr, q, k, v)


# ------------------------------------------------------------------------------------------------------------
# Entry
# ------------------------------------------------------------------------------------------------------------


def _check(q, k, v) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"{GEN}: expected q [B, Tq, Hq, D] and k, v [B, Tk, Hkv, D]; got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype.name not in KERNEL.dtypes:
        raise ValueError(f"{GEN}: q, k, v must share one dtype in {KERNEL.dtypes}; got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}")
    if q.shape[3] != k.shape[3] or q.shape[3] not in _HEAD_DIMS:
        raise ValueError(f"{GEN}: head dim must match and be one of {_HEAD_DIMS}; got {q.shape[3]}, {k.shape[3]}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"{GEN}: Hq must be a multiple of Hkv; got {q.shape[2]}, {k.shape[2]}")
    if k.shape[1] < 1:
        raise ValueError(f"{GEN}: needs at least one key; got Tk={k.shape[1]}")


def _pad_edge(starts, t_pad: int):
    """Document starts padded to ``t_pad`` rows by repeating the last row's (padded rows are computed, then cut)."""
    if starts is None or starts.shape[1] == t_pad:
        return starts
    return jnp.pad(starts, ((0, 0), (0, t_pad - starts.shape[1])), mode="edge")


_SIDE_LIMIT = 1 << 30  # a window side beyond this is unbounded in effect (int32 bound arithmetic stays in range)
_PAD_ROW_OFF = -(1 << 29)  # a padding consumer's offset (rowlim): every key past its rows' causal bound


def check_features(window, softcap, sinks, hq: int):
    """The feature arguments, validated and normalized: ``(window (left, right) | None, softcap float | None, sinks
    f32 [Hq] | None)``. ``window``: a ``(left, right)`` pair of ints or None per side (None = unbounded); a side may
    be negative (jax.nn's ``local_window_size`` semantics); sides are clamped to +-2^30."""
    if window is not None:
        try:
            left, right = window
        except (TypeError, ValueError):
            raise ValueError(f"{GEN}: window must be a (left, right) pair (ints or None); got {window!r}") from None
        sides = []
        for name, x in (("left", left), ("right", right)):
            if x is None:
                sides.append(None)
                continue
            if isinstance(x, bool) or not isinstance(x, (int,)) and not hasattr(x, "__index__"):
                raise ValueError(f"{GEN}: window {name} must be an int or None; got {x!r}")
            sides.append(max(-_SIDE_LIMIT, min(int(x), _SIDE_LIMIT)))
        window = None if sides == [None, None] else tuple(sides)
    if softcap is not None:
        if isinstance(softcap, bool) or not float(softcap) > 0 or not math.isfinite(float(softcap)):
            raise ValueError(f"{GEN}: softcap must be a positive finite number; got {softcap!r}")
        softcap = float(softcap)
    if sinks is not None:
        sinks = jnp.asarray(sinks)
        if sinks.shape != (hq,) or not jnp.issubdtype(sinks.dtype, jnp.floating):
            raise ValueError(f"{GEN}: sinks must be one float logit per query head, shape ({hq},); got "
                             f"{sinks.shape} {sinks.dtype}")
        sinks = sinks.astype(jnp.float32)
    return window, softcap, sinks


def segment_starts(segment_ids):
    """int32 ``[B, T]``: the index of the first token of each token's segment (packed documents: a segment is a
    contiguous run of equal ids; an id that reappears later starts a new document)."""
    seg = jnp.asarray(segment_ids)
    t = seg.shape[1]
    idx = lax.broadcasted_iota(jnp.int32, seg.shape, 1)
    new = jnp.concatenate([jnp.ones((seg.shape[0], 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1) if t else seg > 0
    return lax.cummax(jnp.where(new, idx, 0), axis=1).astype(jnp.int32)


def _check_paged(q, k_pool, v_pool, block_table, cfg: PrefillConfig) -> tuple[int, int]:
    """Pools ``[num_pages, page, Hkv, D]`` and an int32 ``[B, pages_per_seq]`` table for the in-kernel paged path:
    ``(page, pages_per_seq)``."""
    if k_pool.ndim != 4 or v_pool.shape != k_pool.shape:
        raise ValueError(f"{GEN}: paged K / V must be pools [num_pages, page, Hkv, D] of one shape; got {k_pool.shape}"
                         f", {v_pool.shape}")
    per_seq = jax.ShapeDtypeStruct((q.shape[0], k_pool.shape[1]) + tuple(k_pool.shape[2:]), k_pool.dtype)
    _check(q, per_seq, jax.ShapeDtypeStruct(per_seq.shape, v_pool.dtype))
    if q.shape[3] not in _PAGED_HEAD_DIMS:  # D 96's 64-byte-swizzled tiles ran dense only (session 24)
        raise NotImplementedError(f"{GEN}: a paged cache at head dim {q.shape[3]} is not built (the paged path takes "
                                  f"{_PAGED_HEAD_DIMS}; D 96 runs on dense K / V only)")
    page = k_pool.shape[1]
    if block_table.ndim != 2 or block_table.shape[0] != q.shape[0] or jnp.dtype(block_table.dtype) != jnp.int32:
        raise ValueError(f"{GEN}: block_table must be int32 [B={q.shape[0]}, pages_per_seq]; got "
                         f"{block_table.shape} {block_table.dtype}")
    bkv = cfg.block_kv
    if page % 8 or (page % bkv and bkv % page):
        raise ValueError(f"{GEN}: the paged path needs a page size that is a multiple of 8 and divides or is divided "
                         f"by block_kv={bkv}; got page {page}")
    return page, block_table.shape[1]


def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool, config: PrefillConfig,
            return_lse: bool = False, window=None, softcap: float | None = None, sinks=None, segment_ids=None,
            block_table=None, q_lens=None, poison=None):
    """Dense prefill forward on validated BTNH arrays (``contract`` calling convention).

    Features beyond the contract (keyword-only, each priced in docs/fa_prefill.md): ``window=(left, right)``: row
    ``i`` sees keys ``i + off - left <= j <= i + off + right`` (either side None = unbounded; with ``causal`` also
    ``j <= i + off``), key blocks outside every row's band are neither loaded nor computed; ``softcap=cap``: each
    scaled score ``s -> cap * tanh(s / cap)`` before the softmax (Gemma-2); ``sinks`` ``[Hq]``: one logit per query
    head joins every row's softmax denominator with no value (gpt-oss; unscaled, not soft-capped); the LSE includes
    it; ``segment_ids`` int ``[B, T]`` (packed documents, self-attention: ``Tq == Tk``, causal): a key is visible
    only from the query's own contiguous segment (causal within each document; key blocks before the first row's
    document are never loaded). A row with no visible key: output 0, LSE -inf (with sinks: output 0, LSE = the
    sink).

    ``block_table`` int32 ``[B, pages_per_seq]``: ``k`` and ``v`` are page pools ``[num_pages, page, Hkv, D]`` and
    sequence ``b``'s key ``j`` is ``k[block_table[b, j // page], j % page]`` (``Tk = pages_per_seq * page``; entries are
    clamped into the pool, so a bad entry reads a wrong page, never out of bounds: validate the table first, as
    ``paged_attention`` does). On the GPU the producer reads the pages through the table (no gather); in interpret mode
    the pages are gathered first. The page size must be a multiple of 8 that divides or is divided by ``block_kv``.

    ``q_lens`` int32 ``[B]`` (causal only): sequence ``b``'s rows at or past ``q_lens[b]`` are padding: output 0, LSE
    -inf. On the GPU the kernel writes those zeros itself, and a consumer's 64 rows that are all padding load and
    compute nothing (a batch of chunks padded to the longest costs its real rows); interpret mode computes them in
    full and cuts them after. ``poison`` bool ``[B]`` (with ``q_lens``): those sequences' every output row and LSE
    come back NaN (a caller's invalid input under ``jit``; on the GPU the kernel writes the NaN, no pass over the
    output)."""
    if poison is not None and q_lens is None:
        raise ValueError(f"{GEN}: poison needs q_lens")
    rl = None  # the kernel's real-rows input (poisoned sequences: -1)
    if q_lens is not None:
        if not causal:
            raise ValueError(f"{GEN}: q_lens (padding rows) needs causal attention")
        q_lens = jnp.asarray(q_lens)
        if q_lens.shape != (q.shape[0],) or q_lens.dtype != jnp.int32:
            raise ValueError(f"{GEN}: q_lens must be int32 [B={q.shape[0]}]; got {q_lens.shape} {q_lens.dtype}")
        if poison is not None:
            poison = jnp.asarray(poison)
            if poison.shape != (q.shape[0],) or poison.dtype != jnp.bool_:
                raise ValueError(f"{GEN}: poison must be bool [B={q.shape[0]}]; got {poison.shape} {poison.dtype}")
        if not interpret:
            rl = q_lens if poison is None else jnp.where(poison, jnp.int32(-1), q_lens)
    tbl = None  # a block table the kernel reads (page pools on the GPU)
    if block_table is not None:
        if segment_ids is not None:
            raise NotImplementedError(f"{GEN}: segment_ids with a paged cache")
        page, pps = _check_paged(q, k, v, block_table, fit(config, q.shape[3], q.dtype.itemsize, bool(return_lse)))
        tbl = jnp.clip(block_table, 0, k.shape[0] - 1)
        if interpret:  # the interpret twin reads a dense cache: gather the pages
            k = k[tbl].reshape(q.shape[0], pps * page, *k.shape[2:])
            v = v[tbl].reshape(q.shape[0], pps * page, *v.shape[2:])
            tbl = None
    if tbl is None:
        _check(q, k, v)
    b, tq, hq, d = q.shape
    tk, hkv = (k.shape[1] if tbl is None else pps * page), k.shape[2]
    window, softcap, sinks = check_features(window, softcap, sinks, hq)
    starts = None
    if segment_ids is not None:
        seg = jnp.asarray(segment_ids)
        if seg.shape != (b, tq) or not jnp.issubdtype(seg.dtype, jnp.integer):
            raise ValueError(f"{GEN}: segment_ids must be int [B, Tq] = [{b}, {tq}]; got {seg.shape} {seg.dtype}")
        if not causal or tk != tq:
            raise ValueError(f"{GEN}: segment_ids (packed documents) need causal self-attention (Tq == Tk); got "
                             f"causal={causal}, Tq={tq}, Tk={tk}")
        starts = segment_starts(seg)
        if tq >= 1 << 24:
            raise ValueError(f"{GEN}: segment_ids: the kernel carries document starts in float32, exact below 2^24 "
                             f"tokens; got Tq={tq}")
        if not interpret and not PACKED_ON_GPU:
            raise NotImplementedError(
                f"{GEN}: segment_ids (packed documents) on the Mosaic GPU kernel are switched off "
                f"(fa_prefill.PACKED_ON_GPU; docs/fa_prefill.md, 'Packed documents'), so they are refused rather than "
                f"run; interpret mode (CPU) is unaffected")
    cfg = fit(config, d, q.dtype.itemsize, bool(return_lse))
    # counted with the LSE staging whether or not it is returned (``fit``: the estimate's slack is not trusted within
    # a few hundred bytes of the limit), so a config that would fail Mosaic GPU's compile is refused by name here
    if not interpret and smem_bytes(d, q.dtype.itemsize, cfg) > _SMEM_LIMIT:
        raise ValueError(f"{GEN}: config {cfg} needs {smem_bytes(d, q.dtype.itemsize, cfg)} bytes of shared memory "
                         f"at D={d} (limit {_SMEM_LIMIT}, the LSE staging counted); use fewer stages or a smaller "
                         f"block_kv")
    off = jnp.asarray(q_offset, jnp.int32).reshape((b,))
    if tbl is None:
        kp, vp, paged, table_in = _pad(k, 1, cfg.block_kv), _pad(v, 1, cfg.block_kv), None, ()
        tk_pad = kp.shape[1]
    else:  # page pools: whole key blocks, the table padded with page 0 (keys past tk, masked by the kernel)
        per = max(cfg.block_kv // page, 1)
        tbl = jnp.pad(tbl, ((0, 0), (0, -pps % per))) if pps % per else tbl
        kp, vp, tk_pad, paged, table_in = k, v, tbl.shape[1] * page, (page, tbl.shape[1]), (tbl.reshape(-1),)
    if interpret:
        qp = _pad(q, 1, cfg.block_q)
        out, lse = _fallback(qp, kp, vp, off, sinks, _pad_edge(starts, qp.shape[1]), causal=bool(causal),
                             scale=scale, tk=tk, cfg=cfg, window=window, softcap=softcap)
    else:
        qp = _pad(q, 1, cfg.consumers * cfg.block_q)
        call = _build_mosaic(b, qp.shape[1], tk_pad, tk, hq, hkv, d, q.dtype.name, bool(causal),
                             float(scale), cfg, bool(return_lse), window, softcap, sinks is not None,
                             starts is not None, paged=paged, rowlim=rl is not None)
        extra = (() if rl is None else (rl,)) + (() if sinks is None else (sinks,)) + (
            () if starts is None else (_pad_edge(starts, qp.shape[1]).astype(jnp.float32),))
        res = call(qp, kp, vp, off, *table_in, *extra)
        out, lse = res if return_lse else (res, None)
    out = out[:, :tq] if out.shape[1] != tq else out
    lse = None if lse is None else (lse[:, :, :tq] if lse.shape[2] != tq else lse)
    if q_lens is not None and (interpret or lse is not None):  # padding rows: 0, LSE -inf; poisoned sequences NaN
        cut, lse = seqlen.cut_padding(out if interpret else None, lse, q_lens, poison)  # (the GPU kernel wrote out's)
        out = cut if interpret else out
    return (out, lse) if return_lse else out


def _plan(p: Problem, cfg: PrefillConfig):
    cfg = fit(cfg, p.head_dim)
    rows = cfg.consumers * cfg.block_q
    n_q = -(-p.q_len // rows)
    ctas = p.batch * p.heads_q * (-(-n_q // min(cfg.tiles, n_q)))
    nqb = q_buffers(p.head_dim, 2, cfg, min(cfg.tiles, n_q))
    return {"block_q": cfg.block_q, "block_kv": cfg.block_kv, "stages": cfg.stages, "pingpong": cfg.pingpong,
            "overlap": cfg.overlap, "tiles": cfg.tiles, "ctas": ctas, "warpgroups": cfg.consumers + 1,
            "consumers": cfg.consumers, "q_buffers": nqb,
            "smem_bytes": smem_bytes(p.head_dim, 2, cfg, q_buffers=nqb)}


def launches(s, plan: Mapping[str, Any], names: list[str], hw=None, cfg=None) -> list[Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``s`` a ``compare.layer2.Shape``,
    ``hw`` its ``Hardware`` or None). One CTA = producer + two (or ``consumers``) consumer warpgroups of ``block_q``
    query rows each, K/V tiles of ``block_kv`` keys through a TMA ring. Per key tile the MMA work (4 x rows x
    block_kv x D) at the datasheet rate plus a fitted per-tile latency (one per dataflow: ``overlap`` / ``serial`` /
    ``pingpong``). ``cfg`` is not read: the plan holds what the launch needs."""
    del cfg
    bq, bk = plan["block_q"], plan["block_kv"]
    nc = int(plan.get("consumers") or 2)
    rows = nc * bq
    threads = 128 * (nc + 1)
    P = plan.get("ctas") or s.bh * cdiv(s.q_len, rows)
    d = s.head_dim
    # the busiest CTA (the first of a head): its row tiles n_q - 1, n_q - 1 - G, ... (``tiles`` of them, heavy
    # first), each seeing the keys up to its last row (causal, top-left with the offset), from its first row's window
    # start, within a document of at most ``max_doc`` keys
    n_q = cdiv(s.q_len, rows)
    t_eff = max(1, min(int(plan.get("tiles") or 1), n_q))
    groups = cdiv(n_q, t_eff)

    def keys_of(b: int) -> int:
        hi = min(s.kv_len, (b + 1) * rows + s.q_offset) if s.causal else s.kv_len
        lo = max(0, b * rows + s.q_offset - (s.window - 1)) if s.window else 0
        if s.max_doc:
            lo = max(lo, hi - s.max_doc - rows)
        return max(1, hi - lo)

    busiest = sum(max(1, cdiv(keys_of(b), bk)) for b in range(n_q - 1, -1, -groups)[:t_eff])
    per_cta = n_q / groups  # row tiles a CTA runs, on average
    mean_tiles = max(1.0, cdiv(s.kv_len, bk) * s.vis_frac) * per_cta  # key tiles a CTA runs, on average
    # the CTAs are unequal under a causal mask or a window and run heavy first, so the SMs stay balanced: a round
    # costs the mean CTA, and a single round (or a grid of one heavy CTA) the busiest one
    steps = float(busiest)
    if hw is not None:
        resident, _ = occupancy(threads, 65536 // threads // 8 * 8, int(plan.get("smem_bytes") or 0))
        rounds = max(1, cdiv(cdiv(P, hw.num_sm), resident))
        steps = max(mean_tiles, busiest / rounds)
    cost = "pallas_attn_fa_prefill_" + ("pingpong" if plan.get("pingpong") else
                                        "overlap" if plan.get("overlap") else "serial")
    kv = 2 * s.batch * s.heads_kv * s.kv_len * d * 2
    q_rows = s.bh * s.q_len
    # each row tile a CTA runs pays its own prologue / epilogue (the Q wait, the first and the masked diagonal steps,
    # the normalisation and O store): Cost.key per row tile on ``key_steps``; Cost.fixed once per CTA
    return [Launch(names[0], cost, P, threads, 65536 // threads // 8 * 8, int(plan.get("smem_bytes") or 0),
                   units=0.0, steps=steps,
                   key_steps=per_cta, mma=4 * rows * bk * d * mean_tiles,
                   sfu=rows * bk * mean_tiles * (2 if getattr(s, "softcap", None) else 1),  # ex2 (and tanh: soft-cap)
                   dram_bytes=kv + q_rows * d * 2 * 2,
                   l2_bytes=P * mean_tiles * 2 * bk * d * 2, unit="-",
                   note=f"{rows} rows x {bk}-key tiles, {per_cta:.1f} row tiles a CTA; {busiest} key tiles on the "
                        f"busiest CTA, {mean_tiles:.1f} on the mean one; wgmma")]


_TC = "wgmma on fp16/bf16 operands from shared memory (P from registers), fp32 accumulation"

# the backward the drop-in pairs with this forward: fa_prefill_bwd imports this module's block bounds, so it is
# imported here, once they exist (pallas_attn's import of the drop-in loads this module first)
from . import fa_prefill_bwd as _bwd  # noqa: E402

KERNEL = Kernel(
    name=GEN,
    lowering="mosaic-gpu",
    passes=PASS_NAMES,
    config_cls=PrefillConfig,
    configs=CONFIGS,
    entries=frozenset({"dense"}),
    dtypes=("float16", "bfloat16"),
    precision={"float16": Precision("fp16", "fp32", "tensor", _TC),
               "bfloat16": Precision("bf16", "fp32", "tensor", _TC)},
    head_dims=_HEAD_DIMS,
    gqa=True,
    dense=forward,
    heuristic=_heuristic,
    plan=_plan,
    launches=launches,
    limits=_limits,
    # pallas_attn.attention(generation="fa_prefill") has no backward (jax.grad raises naming it); the drop-in's
    # jax.grad runs fa_prefill_bwd (its jax.custom_vjp, fa_prefill_bwd.attention_lse) at the config
    # api.resolve_pair gives: the caller's, else this GPU's table, else the rule
    backward=Backward("fa_prefill_bwd: Mosaic GPU dK/dV and dQ kernels (or the five-product fused one) in a "
                      "jax.custom_vjp over this forward's output and LSE (fa_prefill_bwd.attention_lse)",
                      entries={"dot_product_attention"}, kernel="fa_prefill_bwd", config_cls=_bwd.BwdConfig,
                      configs=_bwd.CONFIGS, heuristic=_bwd.heuristic, effective=_bwd.effective),
)
