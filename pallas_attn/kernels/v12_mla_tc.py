"""v12_mla_tc: MLA latent decode on tensor cores; Hopper through Mosaic GPU (docs/reference.md §2.17, docs/mla.md).

The reference planned this generation and never built it (its v12 is a scaffold that raises; the numbers it shows
are CUTLASS example 77's on a B300). Delta from v11_mla: the query heads are the MMA's M dimension. The packed rows
of a sequence (``r = h * Tq + t``, head-major; ``Hq * Tq`` rows, padded to 64) form 64-row tiles, and one CTA runs
``S[64, TN] = Q[64, DQK] . L[TN, DQK]^T`` and ``O[64, DV] += P[64, TN] . L[TN, :DV]`` as wgmma on one latent
tile that serves both products, with fp32 accumulators, a base-2 online softmax (scale * log2 e folded into one
multiply before ``exp2``, the running max kept on raw scores) and split-KV (grid ``(row tiles, splits, B)``) whose
fp32 partial states (normalized O, natural-log LSE) go through the shared merge (``splitkv.merge_jnp``, or the
Pallas finish); at one split the Mosaic kernel writes q's dtype and the LSE itself (``direct``, docs/mla.md).

The Mosaic GPU kernel (config ``faithful``; ``fa_mla``'s ``default`` is this config at the DeepSeek-V3 shape,
h_q 128, 512 + 64, page 64). One CTA = three warpgroups:

* warpgroup 2, the producer, drops to a small register budget and issues TMA copies of latent tiles (TN keys x
  DQK) into a ``stages``-deep shared-memory ring. The block table decides which page each copy reads: one copy
  per tile when a page holds it (page >= TN), else TN / page copies of one page each into the slot, all on the
  slot's "loaded" barrier (which then expects that many arrivals). Page indices are clamped into the pool.
* warpgroups 0 and 1, the consumers, split DV: consumer ``w`` owns output columns ``[w DV/2, (w+1) DV/2)``, so its
  fp32 O accumulator is 64 x 256 (128 registers per thread at DV 512) instead of the 256 a single warpgroup would
  need. Both wait for the same Q tile (64 x DQK, loaded once by TMA and kept in shared memory for the whole
  split) and both compute the full ``S = Q L^T`` (K = DQK = 576) and the same softmax on it, then each runs its
  own ``P V`` half (N = 256) with P from registers. Recomputing S in both warpgroups costs QK flops
  (~1.5x the MMA work of the shared-P design) but needs no consumer-to-consumer handoff: the simple, obviously
  correct first version. Each arrives on the slot's "free" barrier (two arrivals) when done with it.
  Config ``split_qk`` (fa_mla's ``split_qk``) removes the redundancy: consumer ``w`` contracts only its half of
  DQK (288 columns), writes its fp32 S half to a double-buffered shared-memory slot, arrives on a barrier, waits
  for the other half and adds it (``a + b == b + a`` bit for bit, so both consumers run the same softmax on the
  same S). Two latent stages (the exchange takes the third's shared memory). Not the default until measured.
  Config ``pipelined`` (fa_mla's ``pipelined``): FlashAttention-3's intra-warpgroup pipelining, as fa_prefill's
  ``overlap``: step s issues ``S_s = Q L_s^T`` and ``O += P_{s-1} L_{s-1}`` together, waits for S only, and runs
  the softmax of s while the P V wgmma runs; block 0 is the prologue (always loaded, an empty split is fully
  masked there), the last P V the epilogue. Not the default until measured either.
  Config ``kv64`` (fa_mla's ``kv64``): 64-key tiles (TN 64, the 128-byte swizzle) in a 2-slot ring. Consumer 0
  alone computes ``S = Q L^T`` over all 576 columns, masks, runs the softmax, and hands P (q's dtype, 64 x 64) and
  the rescale factor alpha to consumer 1 through one shared-memory buffer (``p_ready`` / ``p_free`` barriers);
  both then run their ``P V`` half (consumer 0 with P from registers, consumer 1 with P as a shared-memory wgmma
  operand). The MMA work is the minimum (no recomputed S, no fp32 S exchange) and the per-tile fixed costs
  (barriers, TMA issue, waits) are paid every 64 keys instead of 32. The final l reaches consumer 1 in the alpha
  buffer, over a ``done`` barrier both consumers pass after their loops; after it the ring is idle, and the fp32
  output staging aliases the ring's bytes (``plgpu.RefUnion``). See "Shared memory and registers" below.
  Config ``kv64_lazy`` (fa_mla's ``kv64_lazy``): kv64 with a lazy running max: the reference max moves only when
  some row's tile max passes it by more than ``LAZY_LOG2`` (base 2; one warpgroup-uniform flag per tile through a
  1 KiB reduction scratch, the LSE staging joining the ring's alias to pay for it), else alpha is 1 and neither
  consumer rescales its O half (consumer 1 reads the flag beside alpha); the row sum runs after the P handoff.
  Config ``kv64_mc`` (fa_mla's ``kv64_mc``): kv64 with the row tiles of a (batch, split) paired into 2-CTA clusters
  (tiles 2k and 2k + 1; h_q 128 at Tq 1 is one cluster per (batch, split)). Both producers issue every page copy of
  a tile as a TMA multicast (``collective_axes``): each CTA fetches half of the copy's 8-row groups from L2 and
  writes it into both CTAs' shared memory, so a latent tile crosses L2 -> SM once per cluster instead of once per
  CTA; each CTA's "loaded" barrier still expects the whole tile. The slot's "free" barrier is a cluster barrier
  (each consumer's arrival lands in both CTAs: 4 per phase), so no producer overwrites a slot that a consumer of
  either CTA still reads. Both CTAs share (batch, split), hence the same tile count (an empty split is empty in
  both). Page >= 16 (each CTA's half of a copy is whole 8-row groups); an odd number of row tiles runs as kv64
  (no partner; the plan records it). Shared memory is kv64's: a cluster barrier is a plain 8-byte mbarrier.
  Configs ``kv64_wl`` / ``kv64_mc_wl`` (``work_list``): kv64 / kv64_mc's steps over a work list instead of the split
  rule's grid: one wave of units (``SMs / row tiles``, a multiple of the batch where the batch is smaller), each an
  equal share of the batch's key tiles counted across sequence boundaries (``work_plan``, one Triton program on the
  traced lengths), run as pieces one sequence after another (Q reloaded, the ring refilled once both consumers, of
  both CTAs, have stored the piece's output from ring bytes: ``ring_free``; the final l read before the next handoff:
  ``l_taken``), each piece's partial state in slot ``unit + sequence``, the finish merging each sequence's slots.
* Masking: only the last tile of a split (keys at or past ``min(kv_len, split end)``) and, for causal Tq > 1,
  every tile (``j <= t + q_offset`` per row); causal Tq == 1 is a bound on the key range, no mask.
* Epilogue: each consumer normalizes its half and writes it, fp32, through a 64 x 64 shared-memory staging tile
  (four TMA stores per half), consumer 0 also the LSE. Shared memory at the default (TN 32, 3 stages, bf16):
  Q 72 KiB + ring 108 KiB + staging 32 KiB = 212 KiB of the H100's 227 (TN 64 with two stages would need 248).
  TN 32 is P V's contraction, and wgmma takes K in whole swizzle groups, so the Q tile and the ring use the
  64-byte swizzle (32 elements) rather than 128; a page of 64 is two tiles.

Shared memory and registers (bf16, DQK 576, DV 512; the H100 / H200 opt-in limit is 227 KiB = 232,448 B per CTA,
the register file 65,536 x 32-bit per SM, at most 255 per thread; Mosaic aligns every buffer to 1 KiB and by default
reserves 2 KiB for cross-warp reductions):

* **One CTA owning all 128 heads of a (batch, split) does not fit.** Its fp32 output is 128 x 512 x 4 B = 256 KiB =
  65,536 registers, the whole register file, before Q fragments, S, P, addresses or the producer; two consumers
  of 64 rows x 512 columns would each need 256 accumulator registers per thread (limit 255). Parking half of O in
  shared memory does not fit either: the 128-row Q tile is 128 x 576 x 2 B = 144 KiB, half of O 128 KiB, already
  272 KiB without a latent tile. Four consumer warpgroups (2 row halves x 2 DV halves, 128 accumulator registers
  each) need 4 x 128 x 128 = 65,536 accumulator registers: the whole file again. Two passes over DV (one half per
  pass) read the latent twice, which is what the 64-row tiles do today. Reading each latent tile once for all 128
  heads therefore needs two CTAs on two SMs sharing one read: a 2-CTA cluster with TMA multicast and a
  cluster-wide "free" barrier: config ``kv64_mc``. jax's GPU interpreter supports no cluster barriers and does not
  model a multicast, so on a CPU only the rest of it is checked (below); the protocol itself only on a GPU.
* **kv64 (built)**: Q 64 x 576 x 2 = 73,728 B; ring 2 x 64 x 576 x 2 = 147,456 B, aliased by the fp32 staging
  (2 x 64 x 64 x 4 = 32,768 B); P 64 x 64 x 2 = 8,192 B; alpha / l and LSE vectors 256 B each, 1,024 B aligned;
  8 barriers 64 B; reduction scratch 0 (every reduction here is along a WGMMA row, inside a warp): 231,488 B, 960 B
  under the limit (``smem_bytes`` computes it; the CUDA lowering's own count agrees). Without the alias the staging
  alone would overshoot by 31,808 B; with Mosaic's default 2 KiB reduction scratch by 1,088 B. Registers:
  ``setmaxnreg`` 232 per consumer and 40 for the producer, (2 x 232 + 40) x 128 = 64,512 <= 65,536; consumer 0
  holds O (64 x 256 fp32: 128 registers), S (64 x 64 fp32: 32), P (16-bit: 16) and row vectors, consumer 1 only O.
  A third 64-key stage does not fit (Q and three slots: 294,912 B).

Latent formats on this kernel: bf16 / fp16 (q of the same dtype). An fp8 latent runs on the ``triton`` config
(the config=None heuristic picks it): converting the E4M3 ring to a 16-bit tile in shared memory needs a register
layout for a 32-row tile that Mosaic's tiled shared-memory loads do not offer at TN 32, and TN 64 does not fit.

What was checked without a GPU: every config lowers for CUDA on the CPU (tests/test_conformance.py), and the
kernel's own code runs on jax's GPU interpreter (``emulate_mosaic``: warpgroups as threads, TMA, barriers and
shared memory simulated, uninitialised shared memory NaN, race detection on; the two products become jnp dots
there because the interpreter has no ``run_state`` and no transposed wgmma operand): table addressing, the ring's
barrier protocol (removing the producer's free-wait fails the test), masks, splits, the split_qk exchange, kv64's
P handoff and its staging in ring bytes (modelled there as writes to the ring: no RefUnion in the interpreter) and
the staged epilogue agree with the float64 oracle (tests/test_mla_pallas.py). kv64_mc runs there with its real grid
and cluster shape (the tile index from the cluster rank), its multicast degraded to a plain copy and its free barrier
to a CTA-local one; its CUDA lowering is checked for the cluster launch, multicast copies and shared-memory size.
Not checked: wgmma operand layouts and swizzles, register budgets, the cluster protocol, timing:
tests/gpu/test_mla_pallas_gpu.py on an H100.

The Triton twin (config ``triton``, also what interpret mode runs for every config on the CPU): the same tiles
(64 rows, TN keys, the same splits and per-split recurrence) in a plain ``pallas_call``, with ``pl.dot`` on the
64-row tiles (wgmma on sm_90 through Triton) in 64-column chunks of the latent (Triton tensors are powers of two),
the latent read through the block table and decoded at the gather: an ``Fp8Tensor`` latent's bytes become the
exact E4M3 values in a bf16 / fp16 tile (no rounding: every E4M3 value is representable), and the tensor scale
multiplies the fp32 scores and the output instead (``mla_common.LatentSource``, ``fold``). It is the fallback on a
GPU where the Mosaic kernel fails, and the fp8 path.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .. import _compat, tuning
from .._compat import pl
from . import common as c
from . import gqa, softmax, splitkv
from .common import SMEM_LIMIT as _SMEM_LIMIT  # 227 KiB a CTA on sm_90
from .contract import Kernel, Precision, Problem
from .launches import Launch, cdiv, kv_bytes, kv_tokens, merge_launch, mla_dims, next_pow2, xla_glue
from .mla_common import (
    LatentLayout,
    LatentSource,
    latent_storage,
    table_flag,
    table_poison,
    validate_table_eagerly,
    visible,
)
from .mosaic_kit import WgmmaOps, ring_drain, ring_producer
from .mosaic_kit import smem_tile as _smem_tile

__all__ = ["MlaTcConfig", "CONFIGS", "KERNEL", "mla_forward", "TEMPLATES", "smem_bytes", "emulate_mosaic"]

GEN = "v12_mla_tc"
PASS_TWIN = f"pallas_attn_{GEN}_partial"
PASS_MOSAIC = f"pallas_attn_{GEN}_mosaic"
PASS_FINISH = f"pallas_attn_{GEN}_finish"
PASS_PLAN = f"pallas_attn_{GEN}_plan"  # work_list's plan (a Triton program before the Mosaic one)
PASS_NAMES = (PASS_TWIN, PASS_MOSAIC, f"{PASS_MOSAIC}_mosaic_gpu", PASS_FINISH, PASS_PLAN)
TEMPLATES = ((576, 512), (320, 256), (192, 128))  # (DQK, DV): rope 64, DV split in two halves of >= 64 columns
BLOCK_M = 64  # rows per CTA: one wgmma M tile
_LOG2E = math.log2(math.e)
_STAGE_COLS = 64  # fp32 output columns staged per TMA store
LAZY_LOG2 = 8.0  # lazy_rescale: P = exp2(s - m_ref) may reach 2^8 before the reference max moves (docs/mla.md)
_LAUNCH_REGS_3WG = 168  # registers per thread at launch with three warpgroups (65,536 / 384, rounded down to 8)
_LAZY_SCRATCH = 1024  # lazy_rescale: Mosaic's cross-warp reduction scratch for the one uniform decision per tile
WL_MIN_BATCH, WL_MIN_KV_LEN = 64, 8192  # _own_rule: the work list from here (docs/mla.md "The work list")
# layer 2: a work-list piece's restart in 64-key tiles of a cluster pair's chain (~12 us against ~2.05 us a tile,
# session 33 call 1's breakdown; checked against session 35 calls 4 and 6, docs/mla.md)
WL_RESTART_TILES = 6


@dataclasses.dataclass(frozen=True)
class MlaTcConfig:
    """engine: ``mosaic`` (the Hopper kernel) or ``triton`` (the tensor-core twin; also fp8 latents). block_kv:
    keys per latent tile (TN). stages: depth of the Mosaic kernel's latent ring. num_sm: SMs the split count
    fills (None: this device). num_splits forces S. consumer_regs / producer_regs: Mosaic register budgets.
    num_warps / num_stages: the Triton twin's launch knobs. split_qk (Mosaic): each consumer computes S over
    half of DQK and the halves are exchanged through shared memory (no redundant QK; see the module docstring).
    overlap (Mosaic): each consumer issues S_{s+1} = Q L^T and O += P_s V_s together and runs the softmax of s + 1
    while the P V wgmma runs (FlashAttention-3's intra-warpgroup pipelining, as fa_prefill's ``overlap``).
    share_p (Mosaic): consumer 0 alone computes S over all of DQK and the softmax and hands P (16-bit) and the
    rescale factor to consumer 1 through shared memory; the fp32 output staging aliases the latent ring (config
    ``kv64``: 64-key tiles, see the module docstring's budget). lazy_rescale (with share_p): the running max, and
    with it both consumers' O rescale, moves only when some row's tile max exceeds it by more than
    ``LAZY_LOG2`` (base 2), one warpgroup-uniform decision per tile; the row sum after the P handoff (config
    ``kv64_lazy``, module docstring). multicast (with share_p): the row tiles of a (batch, split) pair up into
    2-CTA clusters and each latent tile is read from L2 once per pair by a TMA multicast, the slot's free barrier
    cluster-wide (config ``kv64_mc``, module docstring; an odd number of row tiles runs without the cluster and
    the plan says so). s_warpgroup (with share_p): warpgroups by role: one computes S, the mask and the softmax
    and only hands P and alpha over (``s_regs`` registers), two run the P V halves (``consumer_regs``; the first
    also loads); the scores of tile s + 1 then run while the P V of tile s does (config ``kv64_ws``, docs/mla.md).
    q_regs (with s_warpgroup): the S warpgroup holds Q's first ``q_regs`` columns in registers as the QK's A operand,
    so those k-steps read only the latent tile from shared memory (config ``kv64_wsq_mc``, docs/mla.md).
    s_pipelined (with s_warpgroup): the S warpgroup issues the QK of tile s + 1 before the softmax of tile s, which
    then runs while that wgmma does (config ``kv32_ws``: 32-key tiles in a 4-slot ring, docs/mla.md).
    work_list (with share_p, not lazy_rescale or s_warpgroup): the split rule's grid of (batch, split) CTAs is
    replaced by one wave of work units (``SMs / row tiles``, each the row tiles of one key range), each given an
    equal share of the batch's key tiles counted across sequence boundaries (computed on the device from the traced
    lengths before the launch), and running the pieces of its share one sequence after the other, each piece's
    partial state in its own slot for the finish's merge (configs ``kv64_wl`` / ``kv64_mc_wl``; docs/mla.md "The
    work list").
    finish: what follows the partial kernel: ``jnp`` (the shared merge ``splitkv.merge_jnp``, the cast, the
    unpack and the bad-table select as XLA ops: several launches) or ``pallas`` (one Pallas launch, ``_finish``:
    the merge, the bad-table check, the cast and the unpacked output layout; docs/mla.md "The fixed cost").
    direct (Mosaic, not work_list): at one split the kernel's epilogue writes q's dtype and the LSE in the packed
    layout itself (the bad-table NaN from a per-sequence flag computed before the launch), and no finish runs: the
    fp32 partial's store, its read back and the finish's launch are gone (docs/mla.md "The direct epilogue"). At
    more splits, and with ``direct=False``, ``finish`` follows the kernel."""

    engine: str = "mosaic"
    block_kv: int = 32
    stages: int = 3
    num_sm: int | None = None
    num_splits: int | None = None
    consumer_regs: int = 232
    producer_regs: int = 40
    num_warps: int = 8
    num_stages: int = 2
    split_qk: bool = False
    overlap: bool = False
    share_p: bool = False
    lazy_rescale: bool = False
    multicast: bool = False
    s_warpgroup: bool = False
    s_regs: int = 152
    q_regs: int = 0
    s_pipelined: bool = False
    work_list: bool = False
    finish: str = "pallas"
    direct: bool = True

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if self.finish not in ("jnp", "pallas"):
            raise ValueError(f"{owner}.finish must be 'jnp' or 'pallas'; got {self.finish!r}")
        if self.engine not in ("mosaic", "triton"):
            raise ValueError(f"{owner}.engine must be 'mosaic' or 'triton'; got {self.engine!r}")
        if self.block_kv not in (16, 32, 64):
            raise ValueError(f"{owner}.block_kv must be 16, 32 or 64; got {self.block_kv}")
        if self.stages not in (2, 3, 4):
            raise ValueError(f"{owner}.stages must be 2, 3 or 4; got {self.stages}")
        for name in ("consumer_regs", "producer_regs", "s_regs"):
            r = getattr(self, name)
            if not (24 <= r <= 256 and r % 8 == 0):
                raise ValueError(f"{owner}.{name} must be a multiple of 8 in [24, 256]; got {r}")
        c.check_pow2(owner, "num_warps", self.num_warps)
        for name in ("split_qk", "overlap", "share_p", "lazy_rescale", "multicast", "s_warpgroup", "s_pipelined",
                     "work_list", "direct"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{owner}.{name} must be a bool; got {getattr(self, name)!r}")
        if self.split_qk + self.overlap + self.share_p > 1:
            raise ValueError(f"{owner}: split_qk, overlap and share_p are separate variants (not combined)")
        if self.s_pipelined and (not self.s_warpgroup or self.q_regs):
            raise ValueError(f"{owner}: s_pipelined is a variant of s_warpgroup without q_regs; got "
                             f"s_warpgroup={self.s_warpgroup}, q_regs={self.q_regs}")
        if self.share_p and self.stages != 2 and not self.s_warpgroup:
            raise ValueError(f"{owner}: share_p runs a 2-slot ring (each consumer stages its output in one slot); "
                             f"got stages={self.stages}")
        if self.lazy_rescale and not self.share_p:
            raise ValueError(f"{owner}: lazy_rescale is a variant of share_p (kv64); got share_p=False")
        if self.multicast and not self.share_p:
            raise ValueError(f"{owner}: multicast is a variant of share_p (kv64); got share_p=False")
        if self.s_warpgroup and (not self.share_p or self.lazy_rescale):
            raise ValueError(f"{owner}: s_warpgroup is a variant of share_p without lazy_rescale (kv64); got "
                             f"share_p={self.share_p}, lazy_rescale={self.lazy_rescale}")
        if self.work_list and (not self.share_p or self.lazy_rescale or self.s_warpgroup or self.finish != "pallas"
                               or self.num_splits is not None):
            raise ValueError(f"{owner}: work_list is a variant of share_p (kv64, kv64_mc) without lazy_rescale, "
                             f"s_warpgroup or num_splits, merged by finish='pallas'; got share_p={self.share_p}, "
                             f"lazy_rescale={self.lazy_rescale}, s_warpgroup={self.s_warpgroup}, "
                             f"num_splits={self.num_splits}, finish={self.finish!r}")
        if self.q_regs and (not self.s_warpgroup or self.q_regs % 64 or self.q_regs < 0):
            raise ValueError(f"{owner}: q_regs (Q columns held in the S warpgroup's registers) needs s_warpgroup and "
                             f"a multiple of 64; got q_regs={self.q_regs}, s_warpgroup={self.s_warpgroup}")
        if self.s_warpgroup and self.s_regs + 2 * self.consumer_regs > 3 * _LAUNCH_REGS_3WG:
            # setmaxnreg moves registers only within the CTA's launch allocation (168 per thread for 384 threads):
            # a sum over that (even within the 65,536 of the SM) leaves an increase waiting forever (a hang on the
            # H100 at 160 + 2 x 176 = 512)
            raise ValueError(f"{owner}: with s_warpgroup, s_regs + 2 * consumer_regs must be <= "
                             f"{3 * _LAUNCH_REGS_3WG} (three warpgroups' launch allocation of {_LAUNCH_REGS_3WG} "
                             f"each); got {self.s_regs} + 2 x {self.consumer_regs}")
        c.check_positive(owner, "num_stages", self.num_stages)
        for name in ("num_sm", "num_splits"):
            if getattr(self, name) is not None:
                c.check_positive(owner, name, getattr(self, name))

    def splits(self, *, batch: int, rows: int, n_k: int) -> tuple[int, int]:
        """``(S, chunk)``: as many splits as fit ``B x row tiles x S`` CTAs in one wave (one CTA per SM: the kernel
        holds ~212 KiB of shared memory; at least one split, at least one tile per split); chunk a multiple of TN."""
        tn = self.block_kv
        n_tiles = max(1, c.cdiv(max(int(n_k), 1), tn))
        if self.num_splits is not None:
            s = min(self.num_splits, n_tiles)
        else:
            base = batch * c.cdiv(rows, BLOCK_M)
            s = max(1, min(n_tiles, (self.num_sm or _compat.device_sm_count()) // base))
        chunk = c.cdiv(n_tiles, s) * tn
        return c.cdiv(n_tiles * tn, chunk), chunk

    def units(self, *, batch: int, rows: int) -> tuple[int, int]:
        """work_list: ``(U, P)``, the work units of one wave (each runs the ``rows``' row tiles of one key range:
        ``SMs / row tiles`` of them, at least one, rounded down to a multiple of the batch where the batch is
        smaller, so that equal lengths give every unit one piece, the split rule's partition) and the partial-state
        slots (``U + batch - 1``: a piece of sequence b run by unit u writes slot ``u + b``, unique because units and
        sequences both advance in key order)."""
        u = max(1, (self.num_sm or _compat.device_sm_count()) // c.cdiv(rows, BLOCK_M))
        if batch <= u:  # a multiple of the batch: equal lengths then split as the split rule does (one piece a unit)
            u -= u % batch
        return u, u + batch - 1

    def writes_direct(self, splits: int) -> bool:
        """Whether the Mosaic kernel writes the output itself (``direct``): one split, no work list."""
        return self.direct and self.engine == "mosaic" and not self.work_list and splits == 1


# "faithful": the reference's plan (QK and PV as MMAs over v11's paged latent, split-KV, the shared merge) on
# Hopper's machinery; fa_mla's "default" is this config. "triton": the twin on the GPU (fallback, fp8 latents).
CONFIGS = {
    "faithful": MlaTcConfig(),
    "triton": MlaTcConfig(engine="triton", block_kv=64),
    "split_qk": MlaTcConfig(split_qk=True, stages=2),
    "pipelined": MlaTcConfig(overlap=True),
    "kv64": MlaTcConfig(block_kv=64, stages=2, share_p=True),
    "kv64_lazy": MlaTcConfig(block_kv=64, stages=2, share_p=True, lazy_rescale=True),
    "kv64_mc": MlaTcConfig(block_kv=64, stages=2, share_p=True, multicast=True),
    "kv64_wl": MlaTcConfig(block_kv=64, stages=2, share_p=True, work_list=True),
    "kv64_mc_wl": MlaTcConfig(block_kv=64, stages=2, share_p=True, multicast=True, work_list=True),
    "kv64_ws": MlaTcConfig(block_kv=64, stages=2, share_p=True, s_warpgroup=True, consumer_regs=176, s_regs=152),
    "kv64_ws_mc": MlaTcConfig(block_kv=64, stages=2, share_p=True, s_warpgroup=True, multicast=True,
                              consumer_regs=176, s_regs=152),
    "kv32_ws": MlaTcConfig(block_kv=32, stages=4, share_p=True, s_warpgroup=True, s_pipelined=True,
                           consumer_regs=176, s_regs=152),
    "kv32_ws_mc": MlaTcConfig(block_kv=32, stages=4, share_p=True, s_warpgroup=True, s_pipelined=True, multicast=True,
                              consumer_regs=176, s_regs=152),
    "kv64_wsq_mc": MlaTcConfig(block_kv=64, stages=2, share_p=True, s_warpgroup=True, multicast=True,
                               consumer_regs=168, s_regs=168, q_regs=256),
}


def smem_bytes(dqk: int, dv: int, itemsize: int, cfg: MlaTcConfig) -> int:
    """Shared memory of one Mosaic CTA: the Q tile, the latent ring, the fp32 output staging, LSE and barriers."""
    del dv
    if cfg.share_p:  # exact (Mosaic aligns each buffer to 1 KiB): Q, the ring aliased by the staging, P, the
        # alpha / l and LSE vectors, 8 barriers, no reduction scratch (lazy_rescale: the LSE staging joins the
        # ring's alias and its 1 KiB goes to a 1 KiB reduction scratch: the same total)
        ring = max(cfg.stages * cfg.block_kv * dqk * itemsize, 2 * BLOCK_M * _STAGE_COLS * 4)
        nbuf = 2 if cfg.s_pipelined else 1  # P / alpha buffers
        return _align(BLOCK_M * dqk * itemsize) + _align(ring) + _align(nbuf * BLOCK_M * cfg.block_kv * itemsize) \
            + 2 * 1024 + (2 * cfg.stages + 2 * nbuf + 2 + 2 * cfg.work_list) * 8  # barriers: Q, loaded / free per
        # slot, p_ready / p_free per P buffer, done (work_list: ring_free, l_taken)
    exchange = 2 * 2 * BLOCK_M * cfg.block_kv * 4 if cfg.split_qk else 0  # the S halves, double-buffered
    return (BLOCK_M * dqk + cfg.stages * cfg.block_kv * dqk) * itemsize + 2 * BLOCK_M * _STAGE_COLS * 4 \
        + BLOCK_M * 4 + exchange + 2700


def _align(nbytes: int, to: int = 1024) -> int:
    return -(-nbytes // to) * to


def _heuristic(p: Problem) -> MlaTcConfig:
    if p.kv_dtype not in (None, p.dtype):  # a quantized latent: the twin decodes it at the gather
        return CONFIGS["triton"]
    # this GPU's table (pallas_attn/tuning, made from the model-shape sweep), else the kernel's own rule
    return CONFIGS[tuning.choose("fa_mla", p, names=CONFIGS) or _own_rule(p)]


def _own_rule(p: Problem) -> str:
    """The config where no table row speaks (a chip without a table, the H200 today; a kind the table never measured;
    ``PALLAS_ATTN_TUNING=off``). At DeepSeek's 576 / 512 template: ``kv64_mc`` (page >= 16; ``kv64`` at page 8), the
    H100 table's choice or within 2% of it at every sweep shape, and 268-269 µs on the H200 at B64 S8192 where the
    reference's plan takes 402 (session 7's records; session 20, `results/sweep/20261127_s20_h200_call10/`, is the
    H200 sweep that ran the reference's plan by default). From ``WL_MIN_BATCH`` sequences of a cache of
    ``WL_MIN_KV_LEN`` keys: ``kv64_mc_wl``, the work list, which balances ragged lengths (H200, session 33 call 3:
    0.78x kv64_mc's time at ragged B 64 S 32k, 0.90x at S 8k) at a cost on equal lengths (1.00-1.05x at B 64-128,
    S 8k-32k; 1.15-1.36x below, where it is not chosen). Other templates: the reference's plan (never measured against
    the others)."""
    page = p.page_size or 0
    if p.head_dim == 576 and page >= 16 and p.batch >= WL_MIN_BATCH and p.kv_len >= WL_MIN_KV_LEN:
        return "kv64_mc_wl"
    if p.head_dim == 576 and page >= 16:
        return "kv64_mc"
    if p.head_dim == 576 and page >= 8:
        return "kv64"
    return "faithful"


# ------------------------------------------------------------------------------------------------------------
# The Mosaic GPU kernel
# ------------------------------------------------------------------------------------------------------------


def _swizzle(tn: int, itemsize: int) -> int:
    """The operand swizzle: the P V product's K is the tile's TN keys, and wgmma wants K in whole swizzle
    groups (swizzle / itemsize elements), so TN 32 at 16 bits takes the 64-byte swizzle, TN 64 the 128-byte one."""
    return min(128, tn * itemsize)


# The Mosaic kernel in pieces. ``_Build`` holds what one build fixes (shapes, tile sizes, the config's flags as
# facts). ``_Cta`` is one CTA: its refs, its key range, and the pieces every schedule uses (the Q load, the latent
# ring's copies through the block table, the mask, the online softmax, the P handoff, the epilogue). The math runs
# on the kit's ``WgmmaOps``, so one source serves the GPU and jax's GPU interpreter (``emulate``). Then one function
# per schedule and warpgroup role:
#
# * faithful / split_qk / pipelined: ``_dv_half_consumer`` (warpgroups 0 and 1; its steps ``_serial_step``, with
#   ``_exchange_s_half`` for split_qk, or ``_pipelined_loop`` / ``_pipelined_step``) and ``_producer`` (warpgroup 2);
# * kv64 / kv64_lazy / kv64_mc: ``_shared_p_consumer`` (consumer 0's loop ``_shared_p_scores`` with the step
#   ``_shared_p_step`` or ``_lazy_step``; consumer 1's step ``_shared_p_pv_step``) and ``_producer``;
# * kv64_ws / kv32_ws / kv64_wsq_mc: ``_ws_scores`` (warpgroup 0; ``_s_pipelined_loop`` for kv32_ws) and ``_ws_pv``
#   (warpgroups 1 and 2; the first also loads).
#
# ``_kernel_body`` gives each warpgroup its role; ``_scratch`` and ``_grid`` lay out shared memory and the launch.
# The split into functions left every lowered program identical (scripts/lowered_hashes.py).


class _Build:
    """What one Mosaic build fixes: the shapes, the tile sizes and the config's flags as the facts the pieces read
    (which staging aliases the ring, whether row tiles pair into clusters, how many P buffers)."""

    def __init__(self, b: int, rows_pad: int, tq: int, dqk: int, dv: int, num_pages: int, page: int, pps: int,
                 dtype_name: str, splits: int, chunk: int, causal: bool, scale: float, cfg: MlaTcConfig,
                 emulate: bool, direct: bool = False, flag: bool = False):
        from jax.experimental.pallas import mosaic_gpu as plgpu

        self.plgpu, self.ops, self.cfg, self.emulate = plgpu, WgmmaOps(emulate), cfg, emulate
        self.b, self.rows_pad, self.tq, self.dqk, self.dv = b, rows_pad, tq, dqk, dv
        self.num_pages, self.page, self.pps = num_pages, page, pps
        self.splits, self.chunk, self.causal = splits, chunk, causal
        self.dtype = jnp.dtype(dtype_name)
        self.bm, self.tn, self.ns = BLOCK_M, cfg.block_kv, cfg.stages
        self.dvh = dv // 2
        self.sub = min(page, self.tn)  # rows per TMA copy: a copy never crosses a page
        self.copies = self.tn // self.sub
        self.cap = pps * page
        self.n_row_tiles = rows_pad // self.bm
        self.cl = float(scale) * _LOG2E
        self.per_row_mask = causal and tq > 1
        self.swz = _swizzle(self.tn, self.dtype.itemsize)
        self.kh = dqk // 2  # split_qk: the K half each consumer contracts
        self.aliased = cfg.share_p and not emulate  # share_p: the output staging shares the ring's bytes (RefUnion)
        self.lazy = cfg.lazy_rescale
        self.q_cols_reg = min(cfg.q_regs, dqk - 64)  # q_regs: at least one 64-column chunk of Q stays in smem
        self.nbuf = 2 if cfg.s_pipelined else 1  # P / alpha buffers (s_pipelined: P_s may be published before
        # P_{s-1} is read)
        # multicast (kv64_mc): row tiles 2k and 2k + 1 of one (batch, split) form a 2-CTA cluster (cluster axis
        # "t", grid axis "tp" = k). Each producer issues every page copy of a tile with collective_axes: Mosaic
        # splits the copy in two along its 8-row groups, each CTA fetches one half from L2 and multicasts it into
        # both CTAs' shared memory, and each CTA's "loaded" barrier expects the whole tile (its arrive_expect_tx
        # counts the full copy, whoever issued the half). The slot's "free" barrier is a cluster barrier: every
        # consumer's arrival lands in both CTAs (2 consumers x 2 CTAs), so neither producer overwrites a slot, in
        # either CTA, before the consumers of both released it. An odd number of row tiles has no partner: kv64
        # without the cluster (_plan records it). The GPU interpreter has no cluster barriers and no multicast:
        # emulate keeps the pairing (the grid and cluster shape, the tile index) and degrades the copy to a plain
        # one, the free barrier to a CTA-local one (what is checked on the CPU is everything but the cluster
        # protocol itself).
        self.paired = cfg.multicast and self.n_row_tiles % 2 == 0
        self.cluster = self.paired and not emulate
        self.mc_copy = {"collective_axes": "t"} if self.cluster else {}
        # work_list: ``splits`` is the number of work units U (grid axis "s"; "b" has size 1) and the kernel reads
        # its share and its pieces' sequences from the plan array (``work_plan``; offsets ``wl_layout``)
        self.wl = cfg.work_list
        self.wl_lay = wl_layout(splits, b)
        # direct (one split): the epilogue writes q's dtype to o [B, rows_pad, DV] and the LSE to [B, rows_pad];
        # flag: an int32 [B] input after the offsets, nonzero for a sequence whose table or length is bad (its rows
        # then NaN, table_poison's rule evaluated before the launch)
        self.direct, self.flag = direct, direct and flag
        self.stage_dtype = self.dtype if direct else jnp.dtype(jnp.float32)


def _rescale(acc, alpha):
    """``acc`` (an O half) with row ``i`` scaled by ``alpha[i]``."""
    return acc * lax.broadcast_in_dim(alpha, acc.shape, (0,))


class _Cta:
    """One CTA of a build: its refs, its (row tile, split, batch) and key range ``[lo, hi)`` of ``n`` latent tiles,
    and the pieces every schedule uses. Made inside the kernel body (it reads the grid indices and the lengths)."""

    def __init__(self, k: _Build, refs):
        self.k, self.plgpu, self.ops = k, k.plgpu, k.ops
        if k.wl:
            self.q_ref, self.lat_ref, self.bt_ref, lens_ref, off_ref, self.wl_ref, self.o_ref, self.lse_ref, \
                *scratch = refs
        elif k.flag:
            self.q_ref, self.lat_ref, self.bt_ref, lens_ref, off_ref, self.bad_ref, self.o_ref, self.lse_ref, \
                *scratch = refs
        else:
            self.q_ref, self.lat_ref, self.bt_ref, lens_ref, off_ref, self.o_ref, self.lse_ref, *scratch = refs
        self.off_ref = off_ref  # work_list: each piece's causal offset (piece())
        if k.aliased and k.lazy:  # the LSE staging is aliased too (its bytes pay for the reduction scratch)
            self.q_smem, (self.lat_smem, (self.o_stage, self.lse_stage)), self.q_bar, self.l_bar, self.l_free, \
                *self.exchange = scratch
        elif k.aliased:
            self.q_smem, (self.lat_smem, self.o_stage), self.lse_stage, self.q_bar, self.l_bar, self.l_free, \
                *self.exchange = scratch
        else:
            self.q_smem, self.lat_smem, self.o_stage, self.lse_stage, self.q_bar, self.l_bar, self.l_free, \
                *self.exchange = scratch
        if k.wl:  # the ring_free / l_taken barriers of the work list close the scratch
            *self.exchange, self.ring_free, self.l_taken = self.exchange
        ti = lax.axis_index("t")
        if k.paired:  # "t" is the CTA's rank in its cluster
            ti = 2 * lax.axis_index("tp") + ti
        self.sp = lax.axis_index("s")
        self.bi = lax.axis_index("b")
        self.wg = lax.axis_index("wg")
        self.r0 = ti * k.bm
        if k.wl:  # unit sp's share of the key tiles, [t0, t1), over `count` sequences from `first`; per piece: piece()
            lay, u = k.wl_lay, self.sp
            quota, total = self.wl_ref[0], self.wl_ref[1]
            self.t0 = jnp.minimum(u * quota, total)
            self.t1 = jnp.minimum(self.t0 + quota, total)
            self.first, self.count = self.wl_ref[lay["first"] + u], self.wl_ref[lay["count"] + u]
            return
        kv_len = jnp.clip(lens_ref[self.bi], 0, k.cap)
        self.lo = self.sp * k.chunk
        hi = jnp.minimum(kv_len, self.lo + k.chunk)
        self.off = jnp.int32(0)
        if k.causal:
            self.off = jnp.clip(off_ref[self.bi], -k.tq, k.cap)
            hi = jnp.minimum(hi, self.off + k.tq)  # the last query position (tq - 1) sees keys j <= tq - 1 + off
        self.hi = hi
        # n depends on (batch, split) only, never on the row tile: the two CTAs of a kv64_mc cluster load, wait
        # for and free the same number of tiles (an empty split or sequence is n = 0 in both: no multicast is
        # issued that the partner would wait for, and no remote arrival is made)
        self.n = lax.div(jnp.maximum(hi - self.lo, 0) + (k.tn - 1), k.tn)

    def piece(self, i):
        """work_list: this unit's piece i, a view of the CTA whose ``bi``, ``lo``, ``hi``, ``n`` and output slot
        are those of sequence ``first + i`` within the unit's tiles ``[t0, t1)`` (n = 0 for a sequence with no
        key to read). Both CTAs of a kv64_mc cluster share the unit, hence every piece and its n."""
        k, lay = self.k, self.k.wl_lay
        y = copy.copy(self)
        b = self.first + i
        c0, c1, hi = self.wl_ref[lay["cum"] + b], self.wl_ref[lay["cum"] + b + 1], self.wl_ref[lay["hi"] + b]
        lo_t, hi_t = jnp.maximum(self.t0, c0) - c0, jnp.minimum(self.t1, c1) - c0
        y.bi, y.sp = b, self.sp + b  # the partial-state slot (MlaTcConfig.units)
        y.lo = lo_t * k.tn
        y.off = jnp.clip(self.off_ref[b], -k.tq, k.cap) if k.causal else jnp.int32(0)
        y.hi = jnp.minimum(hi, hi_t * k.tn)  # hi: the split rule's CTAs' rule, from the plan
        y.n = jnp.maximum(hi_t - lo_t, 0)
        return y

    def issue_q(self):
        """The CTA's Q tile (64 packed rows x DQK) into shared memory by TMA (one warpgroup issues it)."""
        self.plgpu.copy_gmem_to_smem(self.q_ref.at[self.bi, pl.ds(self.r0, self.k.bm)], self.q_smem,
                                     self.q_bar.at[0])

    def wait_q(self):
        self.plgpu.barrier_wait(self.q_bar.at[0])

    def mask(self, sc, s):
        """Key tile s of this split: keys past the split or kv_len (and, causal, past the row's offset) to -inf."""
        k = self.k
        cols = k.ops.iota((k.bm, k.tn), 1)
        kpos = self.lo + s * k.tn + cols
        ok = kpos < self.hi
        if k.per_row_mask:
            rws = k.ops.iota((k.bm, k.tn), 0)
            ok = ok & (kpos <= lax.rem(self.r0 + rws, k.tq) + self.off)
        return jnp.where(ok, sc, -jnp.inf)

    def load_tile(self, s, slot=None):
        """Issue tile s's TMA copies (one per page it spans; multicast under kv64_mc) into slot s % ns (``slot``:
        that index, already computed)."""
        k = self.k
        slot = lax.rem(s, k.ns) if slot is None else slot
        j0 = self.lo + s * k.tn
        for i in range(k.copies):
            jj = j0 + i * k.sub
            lp = jnp.minimum(lax.div(jj, k.page), k.pps - 1)
            pg = jnp.clip(self.bt_ref[self.bi * k.pps + lp], 0, k.num_pages - 1)
            row = pg * k.page + lax.rem(jj, k.page)
            self.plgpu.copy_gmem_to_smem(self.lat_ref.at[pl.ds(row, k.sub)],
                                         self.lat_smem.at[slot, pl.ds(i * k.sub, k.sub)], self.l_bar.at[slot],
                                         **k.mc_copy)

    def drain_frees(self, n_load):
        """The loader observes the last frees too (the kit's ``ring_drain``). kv64_mc: the partner's consumers
        arrive on this CTA's free barriers remotely; waiting for every phase keeps this CTA (and its shared memory)
        alive until the last of those arrivals has landed. The partner's multicast writes into this CTA's ring all
        completed before this CTA's consumers passed their last "loaded" wait, so the staging alias stays safe."""
        ring_drain(self.plgpu, n_load, self.k.ns, self.l_free)

    def softmax(self, sc, m_i, l_i):
        """The online softmax of one tile's scores (base 2, the running max on raw scores): ``(P in q's dtype,
        alpha, m, l)``."""
        k = self.k
        m_new = jnp.maximum(m_i, sc.max(axis=1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * k.cl  # no -inf - -inf for an all-masked row
        alpha = jnp.exp2(m_i * k.cl - m_use)
        p = jnp.exp2(sc * k.cl - lax.broadcast_in_dim(m_use, (k.bm, k.tn), (0,)))
        return p.astype(k.dtype), alpha, m_new, l_i * alpha + p.sum(axis=1)

    def tile_scores(self, s, masked: bool, q_reg=None):
        """share_p: wait for tile s's latent slot, S = Q K^T over all DQK columns, masked where asked. ``q_reg``:
        Q's first q_regs columns as a register array (the A operand of those k-steps), the rest from shared
        memory, both products in one run_state (the refs sliced outside it). Returns ``(slot, S)``."""
        k, plgpu, ops = self.k, self.plgpu, self.ops
        slot = lax.rem(s, k.ns)
        plgpu.barrier_wait(self.l_bar.at[slot])
        if q_reg is None:
            sc = ops.mma(self.q_smem, self.lat_smem.at[slot], shape=(k.bm, k.tn), b_t=True)
        else:
            kr = k.q_cols_reg
            k_reg, q_rest = self.lat_smem.at[slot, :, pl.ds(0, kr)], self.q_smem.at[:, pl.ds(kr, k.dqk - kr)]
            k_rest = self.lat_smem.at[slot, :, pl.ds(kr, k.dqk - kr)]
            if k.emulate:
                sc = ops.mma(q_rest, k_rest, acc=ops.mma(q_reg, k_reg, shape=(k.bm, k.tn), b_t=True), b_t=True)
            else:
                def issue(acc_ref):
                    plgpu.wgmma(acc_ref, q_reg, k_reg.transpose((1, 0)))
                    plgpu.wgmma(acc_ref, q_rest, k_rest.transpose((1, 0)))

                sc = pl.run_state(issue)(plgpu.ACC.init(ops.zeros((k.bm, k.tn))))
        return slot, (self.mask(sc, s) if masked else sc)

    def tile_softmax(self, s, m_i, l_i, masked: bool, q_reg=None):
        """share_p: tile s's scores and online softmax: ``(slot, P in q's dtype, alpha, m, l)``."""
        slot, sc = self.tile_scores(s, masked, q_reg)
        return (slot, *self.softmax(sc, m_i, l_i))

    def hand_over(self, s, pt, alpha):
        """share_p: publish P_s and alpha_s once the P V warpgroups are done with the buffer's previous P
        (p_free): P_{s-1} with one buffer, P_{s-2} with two (s_pipelined: buffer s % 2)."""
        plgpu, nbuf = self.plgpu, self.k.nbuf
        p_smem, alpha_smem, p_ready, p_free, _ = self.exchange
        if nbuf == 1:
            @pl.when(s > 0)
            def _():
                plgpu.barrier_wait(p_free.at[0])

            p_smem[...] = pt
            alpha_smem[...] = alpha
            plgpu.commit_smem()
            plgpu.barrier_arrive(p_ready.at[0])
            return
        k = lax.rem(s, nbuf)

        @pl.when(s >= nbuf)
        def _():
            plgpu.barrier_wait(p_free.at[k])

        p_smem.at[k][...] = pt
        alpha_smem.at[k][...] = alpha
        plgpu.commit_smem()
        plgpu.barrier_arrive(p_ready.at[k])

    def touch_ring(self, first: int):
        """emulate only: the GPU's output staging aliases the ring (RefUnion); write the slots this warpgroup's
        staging would overlap (``first``, ``first + 2``, ...) so that the race detector sees the alias hazard (a TMA
        load or another warpgroup's read still in flight)."""
        k = self.k
        if k.emulate:
            for i in range(first, k.ns, 2):
                self.lat_smem.at[i][...] = jnp.zeros((k.tn, k.dqk), k.dtype)

    def epilogue(self, w: int, acc, m_i, l_i):
        """Normalize DV half ``w`` of the output (``acc``; None: no output here) and write it (fp32, or q's dtype
        under ``direct``, staged by 64 columns in staging buffer ``w``) and, when ``m_i`` is given, the LSE. Under
        ``direct`` with the flag a bad sequence's rows and LSE are NaN."""
        k, plgpu = self.k, self.plgpu
        col0 = w * k.dvh
        empty = l_i == 0.0
        # the flag as a factor (NaN or 1): Mosaic GPU lowers no select of a vector on a scalar predicate
        poison = jnp.where(self.bad_ref[self.bi] != 0, jnp.float32(jnp.nan), jnp.float32(1.0)) if k.flag else None
        if acc is not None:
            inv = 1.0 / jnp.where(empty, 1.0, l_i)
            if poison is not None:
                inv = inv * poison
            out = acc * lax.broadcast_in_dim(inv, (k.bm, k.dvh), (0,))
            for c0 in range(0, k.dvh, _STAGE_COLS):
                self.o_stage.at[w][...] = out[:, c0:c0 + _STAGE_COLS].astype(k.stage_dtype)
                plgpu.commit_smem()
                if k.wl:
                    dst = self.o_ref.at[self.sp, pl.ds(self.r0, k.bm), pl.ds(col0 + c0, _STAGE_COLS)]
                elif k.direct:
                    dst = self.o_ref.at[self.bi, pl.ds(self.r0, k.bm), pl.ds(col0 + c0, _STAGE_COLS)]
                else:
                    dst = self.o_ref.at[self.bi, pl.ds(self.r0, k.bm), self.sp, pl.ds(col0 + c0, _STAGE_COLS)]
                plgpu.copy_smem_to_gmem(self.o_stage.at[w], dst)
                plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        if m_i is not None:
            lse = jnp.where(empty, -jnp.inf, (m_i * k.cl + jnp.log2(jnp.where(empty, 1.0, l_i))) / _LOG2E)
            if poison is not None:
                lse = lse * poison
            self.lse_stage[...] = lse
            plgpu.commit_smem()
            if k.wl:
                dst = self.lse_ref.at[self.sp, pl.ds(self.r0, k.bm)]
            elif k.direct:
                dst = self.lse_ref.at[self.bi, pl.ds(self.r0, k.bm)]
            else:
                dst = self.lse_ref.at[self.bi, self.sp, pl.ds(self.r0, k.bm)]
            plgpu.copy_smem_to_gmem(self.lse_stage, dst)
        plgpu.wait_smem_to_gmem(0)


# --- faithful / split_qk / pipelined: two consumers, each S (or its half), the softmax and one DV half --------


def _producer(x: _Cta):
    """Warpgroup 2 (every schedule but s_warpgroup): drop to ``producer_regs`` and issue the latent tiles into the
    ring, slot s % ns once both consumers freed it (pipelined: at least tile 0, its prologue's): the kit's
    ``ring_producer`` with the slot index computed inside the wait (and again for ``load_tile``), then its drain
    (``drain_frees``)."""
    k, plgpu = x.k, x.plgpu
    plgpu.set_max_registers(k.cfg.producer_regs, action="decrease")

    n_load = jnp.maximum(x.n, 1) if k.cfg.overlap else x.n
    ring_producer(plgpu, n_load, k.ns, x.l_free, x.load_tile, slot_in_wait=True, drain=False)
    x.drain_frees(n_load)


def _exchange_s_half(x: _Cta, w: int, s, sc):
    """split_qk: hand this consumer's fp32 S half to the other consumer and add the other's half (double-buffered
    by step parity: the other consumer read buffer k of step s before it could write its half of step s + 1, which
    this consumer waits for before it overwrites buffer k at step s + 2). ``a + b == b + a``, bit for bit: both
    consumers see the same S."""
    plgpu = x.plgpu
    sx, x_ready = x.exchange
    k = lax.rem(s, 2)
    sx.at[w, k][...] = sc
    plgpu.commit_smem()
    plgpu.barrier_arrive(x_ready.at[w * 2 + k])
    plgpu.barrier_wait(x_ready.at[(1 - w) * 2 + k])
    other = x.ops.tile(sx.at[1 - w, k])
    return sc + other


def _serial_step(x: _Cta, w: int, s, carry, *, masked: bool):
    """faithful / split_qk, consumer ``w``, tile s: S (all of DQK, or split_qk's half plus the other's), the mask,
    the online softmax, the rescale and ``O += P L[:, half w]``, then the slot's free arrival."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    bm, tn, dvh = k.bm, k.tn, k.dvh
    acc, m_i, l_i = carry
    slot = lax.rem(s, k.ns)
    plgpu.barrier_wait(x.l_bar.at[slot])

    if k.cfg.split_qk:  # this consumer's half of the contraction
        sc = ops.mma(x.q_smem.at[:, pl.ds(w * k.kh, k.kh)], x.lat_smem.at[slot, :, pl.ds(w * k.kh, k.kh)],
                     shape=(bm, tn), b_t=True)
        sc = _exchange_s_half(x, w, s, sc)
    else:
        sc = ops.mma(x.q_smem, x.lat_smem.at[slot], shape=(bm, tn), b_t=True)
    if masked:
        sc = x.mask(sc, s)
    m_new = jnp.maximum(m_i, sc.max(axis=1))
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * k.cl  # no -inf - -inf for an all-masked row
    alpha = jnp.exp2(m_i * k.cl - m_use)
    p = jnp.exp2(sc * k.cl - lax.broadcast_in_dim(m_use, (bm, tn), (0,)))
    l_new = l_i * alpha + p.sum(axis=1)
    acc = _rescale(acc, alpha)

    acc = ops.mma(p.astype(k.dtype), x.lat_smem.at[slot, :, pl.ds(w * dvh, dvh)], acc=acc)
    plgpu.barrier_arrive(x.l_free.at[slot])
    return acc, m_new, l_new


def _pipelined_step(x: _Cta, w: int, s, carry, *, masked: bool):
    """pipelined, consumer ``w``, step s: the kit's pipelined step, ``S_s = Q L_s^T`` and ``O += P_{s-1}
    L_{s-1}[:, half]`` issued together; the softmax of S_s runs while the P V wgmma does; the carry is
    ``(alpha_s O_{s-1}, m_s, l_s, P_s)``."""
    k, plgpu = x.k, x.plgpu
    slot, prev = lax.rem(s, k.ns), lax.rem(s - 1, k.ns)
    plgpu.barrier_wait(x.l_bar.at[slot])
    # done: the P V wgmma has been waited for, slot s - 1 is free
    return x.ops.pipelined_step(carry, x.q_smem, x.lat_smem.at[slot], x.lat_smem.at[prev, :, pl.ds(w * k.dvh, k.dvh)],
                                x.softmax, scored=(lambda sc: x.mask(sc, s)) if masked else None,
                                done=lambda: plgpu.barrier_arrive(x.l_free.at[prev]))


def _pipelined_loop(x: _Cta, w: int, acc0, m0, l0):
    """pipelined, consumer ``w``: tile 0's scores and softmax (the prologue; the producer loads tile 0 even for an
    empty split, fully masked then), the steps 1 .. n - 1 (``_pipelined_step``), and the last P V (the epilogue).
    Returns ``(O, m, l)``."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    nn = jnp.maximum(x.n, 1)
    plgpu.barrier_wait(x.l_bar.at[0])
    slot0 = _compat.traced_index(0, nn)  # a ref index inside run_state
    p0, _, m_i, l_i = x.softmax(x.mask(ops.mma(x.q_smem, x.lat_smem.at[slot0], shape=(k.bm, k.tn), b_t=True), 0),
                                m0, l0)
    first_masked = 1 if k.per_row_mask else jnp.maximum(nn - 1, 1)
    carry = lax.fori_loop(1, first_masked, functools.partial(_pipelined_step, x, w, masked=False),
                          (acc0, m_i, l_i, p0))
    acc, m_i, l_i, p_last = lax.fori_loop(first_masked, nn, functools.partial(_pipelined_step, x, w, masked=True),
                                          carry)
    last = lax.rem(nn - 1, k.ns)
    acc = ops.mma(p_last, x.lat_smem.at[last, :, pl.ds(w * k.dvh, k.dvh)], acc=acc)
    plgpu.barrier_arrive(x.l_free.at[last])
    return acc, m_i, l_i


def _dv_half_consumer(x: _Cta, w: int):
    """faithful / split_qk / pipelined, consumer ``w`` (warpgroup 0 or 1; the first loads Q): every tile's S, its
    softmax and the P V product over DV half ``w``; then the epilogue (consumer 0 also writes the LSE)."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    plgpu.set_max_registers(k.cfg.consumer_regs, action="increase")
    if w == 0:
        x.issue_q()
    x.wait_q()
    m0 = ops.rows(-jnp.inf, k.bm)
    l0 = ops.rows(0.0, k.bm)
    acc0 = ops.zeros((k.bm, k.dvh))
    carry = (acc0, m0, l0)
    step = functools.partial(_serial_step, x, w)
    if k.cfg.overlap:
        acc, m_i, l_i = _pipelined_loop(x, w, acc0, m0, l0)
    elif k.per_row_mask:
        acc, m_i, l_i = lax.fori_loop(0, x.n, functools.partial(step, masked=True), carry)
    else:
        n_plain = jnp.maximum(x.n - 1, 0)
        carry = lax.fori_loop(0, n_plain, functools.partial(step, masked=False), carry)
        acc, m_i, l_i = lax.fori_loop(n_plain, x.n, functools.partial(step, masked=True), carry)

    x.epilogue(w, acc, m_i if w == 0 else None, l_i)


# --- kv64 / kv64_lazy / kv64_mc: consumer 0 computes S and P once and hands P over ------------------------------


def _plain_then_masked(x: _Cta, step, carry):
    """Run ``step(s, carry, masked=...)`` over the split's n tiles: unmasked but the last one, or every one masked
    when rows differ (causal Tq > 1)."""
    n_plain = jnp.int32(0) if x.k.per_row_mask else jnp.maximum(x.n - 1, 0)
    carry = lax.fori_loop(0, n_plain, functools.partial(step, masked=False), carry)
    return lax.fori_loop(n_plain, x.n, functools.partial(step, masked=True), carry)


def _alpha_rows(x: _Cta):
    """share_p: the alpha (then final l) rows of the handoff buffer (lazy_rescale: element bm is the tile's flag)."""
    alpha_smem = x.exchange[1]
    return alpha_smem.at[pl.ds(0, x.k.bm)] if x.k.lazy else alpha_smem


def _shared_p_step(x: _Cta, s, carry, *, masked: bool):
    """kv64, consumer 0, tile s: S over all DQK columns, the softmax, P and alpha handed over, then its own P V
    half with P from registers and the slot's free arrival."""
    acc, m_i, l_i = carry
    slot, pt, alpha, m_new, l_new = x.tile_softmax(s, m_i, l_i, masked)
    x.hand_over(s, pt, alpha)
    acc = _rescale(acc, alpha)
    acc = x.ops.mma(pt, x.lat_smem.at[slot, :, pl.ds(0, x.k.dvh)], acc=acc)
    x.plgpu.barrier_arrive(x.l_free.at[slot])
    return acc, m_new, l_new


def _lazy_step(x: _Cta, s, carry, *, masked: bool, rescale):
    """``_shared_p_step`` with a lazy running max (kv64_lazy): one warpgroup-uniform decision per tile (does any
    row's tile max exceed its reference by more than LAZY_LOG2?); if not, m, l and both O halves keep their scale
    (alpha = 1, no multiply) and P = exp2(s cl - m cl) <= 2^LAZY_LOG2. The row sum runs after P is handed over,
    off consumer 1's path. ``rescale``: this warpgroup's ``_rescale`` (see ``_shared_p_consumer``)."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    bm, tn, cl = k.bm, k.tn, k.cl
    p_smem, alpha_smem, p_ready, p_free, _ = x.exchange
    acc, m_i, l_i = carry
    slot, sc = x.tile_scores(s, masked)
    mx = sc.max(axis=1)
    # m_i = -inf (nothing seen yet): -inf + LAZY_LOG2 = -inf, so any finite max moves it; a NaN max compares False
    # (the row's P is NaN anyway: NaN in, NaN out)
    grow = jnp.where(mx * cl > m_i * cl + LAZY_LOG2, 1.0, 0.0)
    need = grow.max()  # scalar, uniform over the warpgroup (cross-warp: the reduction scratch)
    move = need > 0.0

    def rescaled(m_i, mx):
        m_new = jnp.maximum(m_i, mx)
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * cl
        return m_new, jnp.exp2(m_i * cl - m_use)

    def kept(m_i, mx):
        del mx
        return m_i, ops.rows(1.0, bm)

    m_new, alpha = lax.cond(move, rescaled, kept, m_i, mx)
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * cl
    p = jnp.exp2(sc * cl - lax.broadcast_in_dim(m_use, (bm, tn), (0,)))
    pt = p.astype(k.dtype)

    @pl.when(s > 0)
    def _():  # consumer 1 is done with P_{s-1}, alpha_{s-1} and its flag
        plgpu.barrier_wait(p_free.at[0])

    p_smem[...] = pt
    _alpha_rows(x)[...] = alpha
    alpha_smem[bm] = need
    plgpu.commit_smem()
    plgpu.barrier_arrive(p_ready.at[0])
    l_new = l_i * alpha + p.sum(axis=1)
    acc = lax.cond(move, rescale, lambda a, _: a, acc, alpha)
    acc = ops.mma(pt, x.lat_smem.at[slot, :, pl.ds(0, k.dvh)], acc=acc)
    plgpu.barrier_arrive(x.l_free.at[slot])
    return acc, m_new, l_new


def _shared_p_scores(x: _Cta, acc0, rescale):
    """kv64, consumer 0: load Q, run every tile (``_lazy_step`` under lazy_rescale, else ``_shared_p_step``),
    observe the last handoff's p_free, and leave the final l in the alpha buffer. Returns ``(O half 0, m, l)``."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    p_free = x.exchange[3]
    x.issue_q()
    x.wait_q()
    step = functools.partial(_lazy_step, x, rescale=rescale) if k.lazy else functools.partial(_shared_p_step, x)
    carry = (acc0, ops.rows(-jnp.inf, k.bm), ops.rows(0.0, k.bm))
    acc, m_i, l_i = _plain_then_masked(x, step, carry)

    @pl.when(x.n > 0)
    def _():  # the last handoff consumed (every phase of p_free observed)
        plgpu.barrier_wait(p_free.at[0])

    _alpha_rows(x)[...] = l_i  # consumer 1 has read its last alpha: the buffer now carries the final l
    return acc, m_i, l_i


def _shared_p_pv_step(x: _Cta, s, acc, *, rescale):
    """kv64, consumer 1, tile s: wait for the tile and for P_s, rescale (under lazy_rescale only when consumer 0's
    flag says so) and ``O += P L[:, DV/2:]`` with P as a shared-memory operand; release P and the slot."""
    k, plgpu = x.k, x.plgpu
    p_smem, alpha_smem, p_ready, p_free, _ = x.exchange
    slot = lax.rem(s, k.ns)
    plgpu.barrier_wait(x.l_bar.at[slot])
    plgpu.barrier_wait(p_ready.at[0])
    alpha = x.ops.vec(_alpha_rows(x))
    if k.lazy:  # consumer 0's uniform decision for this tile
        acc = lax.cond(alpha_smem[k.bm] > 0.0, rescale, lambda a, _: a, acc, alpha)
    else:
        acc = _rescale(acc, alpha)
    acc = x.ops.mma(p_smem, x.lat_smem.at[slot, :, pl.ds(k.dvh, k.dvh)], acc=acc)
    plgpu.barrier_arrive(p_free.at[0])
    plgpu.barrier_arrive(x.l_free.at[slot])
    return acc


def _shared_p_consumer(x: _Cta, w: int):
    """share_p: consumer 0 computes S over all of DQK, the mask and the softmax, hands P (q's dtype) and
    alpha to consumer 1 through shared memory (one buffer: p_ready / p_free), and both run their P V half
    (consumer 1 with P as a shared-memory wgmma operand). After both loops (the ``done`` barrier, which also
    publishes consumer 0's final l in the alpha buffer) the ring is idle and each consumer stages its output
    in ring bytes."""
    plgpu = x.plgpu
    plgpu.set_max_registers(x.k.cfg.consumer_regs, action="increase")

    def rescale(acc, alpha):  # lazy_rescale's cond branch: lax.cond caches a branch's jaxpr by its function, and
        # one function per warpgroup keeps the traced program as it was (one shared one would only share the jaxpr)
        return _rescale(acc, alpha)

    _shared_p_roles(x, w, rescale)


def _shared_p_roles(x: _Cta, w: int, rescale, l_read=None):
    """share_p's consumer ``w`` over ``x``'s tiles (its loop, the ``done`` barrier, consumer 1's read of the final l,
    then ``l_read()`` if given, and the staged epilogue): ``_shared_p_consumer``'s body, and the work list's per
    piece."""
    k, plgpu = x.k, x.plgpu
    done = x.exchange[4]
    acc0 = x.ops.zeros((k.bm, k.dvh))
    if w == 0:
        acc, m_i, l_i = _shared_p_scores(x, acc0, rescale)
    else:
        acc = lax.fori_loop(0, x.n, functools.partial(_shared_p_pv_step, x, rescale=rescale), acc0)
        m_i = None
    plgpu.barrier_arrive(done.at[0])
    plgpu.barrier_wait(done.at[0])
    if w == 1:
        l_i = x.ops.vec(_alpha_rows(x))
        if l_read is not None:
            l_read()
    x.touch_ring(w)
    x.epilogue(w, acc, m_i, l_i)


# --- kv64_wl / kv64_mc_wl: kv64's roles over a work list of pieces, one sequence after another --------------------


def _wl_pieces(x: _Cta, run):
    """work_list: ``run(y)`` for each of the unit's pieces ``y`` that has a key tile (a sequence inside the unit's
    share with nothing to read is skipped by every role alike)."""

    @pl.loop(0, x.count)
    def _piece(i):
        y = x.piece(i)

        @pl.when(y.n > 0)
        def _():
            run(y)


def _wl_producer(x: _Cta):
    """work_list, warpgroup 2: per piece the ring as ``_producer`` fills it (then its drain), and before the next
    piece's first copy the wait for ``ring_free``: both consumers (of both CTAs under kv64_mc, whose multicast
    writes the partner's ring too) have staged and stored the piece's output in ring bytes."""
    k, plgpu = x.k, x.plgpu
    plgpu.set_max_registers(k.cfg.producer_regs, action="decrease")

    def run(y):
        ring_producer(plgpu, y.n, k.ns, y.l_free, y.load_tile, slot_in_wait=True, drain=False)
        y.drain_frees(y.n)
        plgpu.barrier_wait(y.ring_free)

    _wl_pieces(x, run)


def _wl_consumer(x: _Cta, w: int):
    """work_list, consumer ``w``: per piece kv64's consumer (``_shared_p_consumer``: consumer 0 loads the piece's
    Q, runs S, the softmax and the handoff; consumer 1 its P V half), the ``done`` barrier, the staged epilogue into
    the piece's slot, then ``ring_free`` (the producers may refill the ring). Consumer 1 arrives on ``l_taken``
    once it has read the final l from the alpha buffer, which consumer 0 waits for before the next piece's first
    handoff overwrites it."""
    plgpu = x.plgpu
    plgpu.set_max_registers(x.k.cfg.consumer_regs, action="increase")

    def run(y):
        _shared_p_roles(y, w, _rescale, l_read=lambda: plgpu.barrier_arrive(y.l_taken.at[0]))
        plgpu.barrier_arrive(y.ring_free.at[0])
        if w == 0:
            plgpu.barrier_wait(y.l_taken.at[0])

    _wl_pieces(x, run)


# --- kv64_ws / kv32_ws / kv64_wsq_mc: warpgroups by role (S and softmax; two P V halves, the first loads) -------


def _s_pipelined_loop(x: _Cta, m0, l0):
    """s_pipelined: tile s's softmax runs while the QK of tile s + 1 does (both in one run_state; the refs sliced
    outside it), then P_s is published. Tiles 0 .. n - 2 in the loop, the last one after it; every tile is masked
    when rows differ (causal Tq > 1), else only the last (a partial tile or the split's end). Returns the final
    (m, l); n = 0 runs nothing."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    n = x.n

    def step(s, carry):
        m_i, l_i, sc = carry
        sc = x.mask(sc, s) if k.per_row_mask else sc
        nxt = lax.rem(s + 1, k.ns)
        plgpu.barrier_wait(x.l_bar.at[nxt])
        if k.emulate:
            sc_next = ops.mma(x.q_smem, x.lat_smem.at[nxt], shape=(k.bm, k.tn), b_t=True)
            pt, alpha, m_new, l_new = x.softmax(sc, m_i, l_i)
        else:
            k_next = x.lat_smem.at[nxt].transpose((1, 0))

            def both(refs):
                s_ref, m_ref, l_ref, p_ref, a_ref = refs
                plgpu.wgmma(s_ref, x.q_smem, k_next)  # in flight during the softmax below
                pt, alpha, m_new, l_new = x.softmax(sc, m_ref[...], l_ref[...])
                p_ref[...] = pt
                m_ref[...] = m_new
                l_ref[...] = l_new
                a_ref[...] = alpha

            sc_next, m_new, l_new, pt, alpha = pl.run_state(both)(
                (plgpu.ACC.init(ops.zeros((k.bm, k.tn))), m_i, l_i, ops.zeros((k.bm, k.tn), k.dtype), m_i))
        x.hand_over(s, pt, alpha)
        return m_new, l_new, sc_next

    def run(carry):
        m_i, l_i = carry
        m_i, l_i, sc = lax.fori_loop(0, n - 1, step, (m_i, l_i, x.tile_scores(0, False)[1]))
        pt, alpha, m_i, l_i = x.softmax(x.mask(sc, n - 1), m_i, l_i)
        x.hand_over(n - 1, pt, alpha)
        return m_i, l_i

    return lax.cond(n > 0, run, lambda c: c, (m0, l0))


def _ws_scores(x: _Cta):
    """s_warpgroup, warpgroup 0: loads Q (q_regs: keeps its first columns in registers), computes S, the mask and
    the softmax of every tile and hands P and alpha over (it holds no output); after the loop it observes the last
    handoffs, publishes the final l in the alpha buffer, passes ``done`` and writes the LSE."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    _, alpha_smem, _, p_free, done = x.exchange
    plgpu.set_max_registers(k.cfg.s_regs, action="decrease" if k.cfg.s_regs <= _LAUNCH_REGS_3WG else "increase")
    x.issue_q()
    x.wait_q()
    q_reg = None
    if k.q_cols_reg:  # Q's first q_regs columns stay in registers for the whole loop
        q_reg = ops.tile(x.q_smem.at[:, pl.ds(0, k.q_cols_reg)])

    def step_s(s, carry, *, masked: bool):
        _, pt, alpha, m_new, l_new = x.tile_softmax(s, *carry, masked, q_reg)
        x.hand_over(s, pt, alpha)
        return m_new, l_new

    carry = (ops.rows(-jnp.inf, k.bm), ops.rows(0.0, k.bm))
    if k.cfg.s_pipelined:
        m_i, l_i = _s_pipelined_loop(x, *carry)
    else:
        m_i, l_i = _plain_then_masked(x, step_s, carry)

    @pl.loop(jnp.maximum(x.n - k.nbuf, 0), x.n)
    def _(s):  # the last handoffs consumed by both P V warpgroups (every phase observed)
        plgpu.barrier_wait(p_free.at[lax.rem(s, k.nbuf)])

    l_out = alpha_smem if k.nbuf == 1 else alpha_smem.at[0]
    l_out[...] = l_i  # both have read their last alpha: the buffer now carries the final l
    plgpu.barrier_arrive(done.at[0])
    plgpu.barrier_wait(done.at[0])
    x.epilogue(0, None, m_i, l_i)


def _ws_pv(x: _Cta, w: int):
    """s_warpgroup, warpgroup ``w`` (1 or 2): rescale and accumulate DV half ``w - 1`` of O with P as a
    shared-memory operand and release the slot; warpgroup 1 also loads (the first ns tiles at once, then tile
    s + ns into slot s once both P V warpgroups released it). After ``done`` it stages its half in ring bytes."""
    k, plgpu, ops = x.k, x.plgpu, x.ops
    ns, nbuf, n = k.ns, k.nbuf, x.n
    p_smem, alpha_smem, p_ready, p_free, done = x.exchange
    plgpu.set_max_registers(k.cfg.consumer_regs, action="increase")
    half = w - 1

    loader = w == 1
    if loader:  # the first ns tiles need no free slot
        @pl.loop(0, jnp.minimum(n, ns))
        def _first(s):
            x.load_tile(s)

    def step_pv(s, acc):
        slot = lax.rem(s, ns)
        i = lax.rem(s, nbuf)
        p_k, a_k = (p_smem, alpha_smem) if nbuf == 1 else (p_smem.at[i], alpha_smem.at[i])
        plgpu.barrier_wait(x.l_bar.at[slot])
        plgpu.barrier_wait(p_ready.at[i])
        acc = _rescale(acc, ops.vec(a_k))
        acc = ops.mma(p_k, x.lat_smem.at[slot, :, pl.ds(half * k.dvh, k.dvh)], acc=acc)
        plgpu.barrier_arrive(p_free.at[i])
        plgpu.barrier_arrive(x.l_free.at[slot])
        if loader:
            @pl.when(s + ns < n)
            def _():  # both P V warpgroups (of both CTAs under kv64_mc) released slot s: refill it
                plgpu.barrier_wait(x.l_free.at[slot])
                x.load_tile(s + ns)
        return acc

    acc = lax.fori_loop(0, n, step_pv, ops.zeros((k.bm, k.dvh)))
    if loader:
        x.drain_frees(n)
    plgpu.barrier_arrive(done.at[0])
    plgpu.barrier_wait(done.at[0])
    l_i = ops.vec(alpha_smem if nbuf == 1 else alpha_smem.at[0])
    x.touch_ring(half)
    x.epilogue(half, acc, None, l_i)


def _ws_consumer(x: _Cta, w: int):
    """s_warpgroup: warpgroup 0 computes S, the mask and the softmax of every tile and hands P and alpha over
    (``_ws_scores``); warpgroups 1 and 2 each rescale and accumulate one DV half of O (``_ws_pv``). While they run
    the P V of tile s, warpgroup 0 already runs the scores of tile s + 1 (the other slot). After the loops
    (``done``: three arrivals) warpgroup 0 has published the final l in the alpha buffer and the ring is idle, so
    the P V warpgroups stage their halves in ring bytes; warpgroup 0 writes the LSE. Three warpgroups, not four:
    with a fourth (a producer) the kernel compiles under a 128-register cap, and a 64 x 256 fp32 wgmma needs ~154
    (ptxas refused it on the H100)."""
    if w == 0:
        _ws_scores(x)
    else:
        _ws_pv(x, w)


# --- the kernel: roles per warpgroup, shared memory, the launch ---------------------------------------------


def _kernel_body(k: _Build, refs):
    """One CTA: the schedule's consumer role on warpgroups 0 and 1 (and 2 under s_warpgroup), else the producer on
    warpgroup 2."""
    x = _Cta(k, refs)
    run_consumer = _ws_consumer if k.cfg.s_warpgroup else _wl_consumer if k.wl else _shared_p_consumer \
        if k.cfg.share_p else _dv_half_consumer

    @pl.when(x.wg == 0)
    def _c0():
        run_consumer(x, 0)

    @pl.when(x.wg == 1)
    def _c1():
        run_consumer(x, 1)

    if k.cfg.s_warpgroup:
        @pl.when(x.wg == 2)
        def _c2():
            run_consumer(x, 2)

    if not k.cfg.s_warpgroup:  # s_warpgroup: P.V warpgroup 1 loads (_ws_pv)
        @pl.when(x.wg == 2)
        def _producer_wg():
            (_wl_producer if k.wl else _producer)(x)


def _scratch(k: _Build) -> list:
    """Shared memory, in the order ``_Cta`` unpacks it: Q, the latent ring (share_p on the GPU: aliased by the
    output staging, lazy_rescale: and the LSE staging), the barriers (Q; loaded and free per slot, free a cluster
    barrier under kv64_mc), then split_qk's S exchange or share_p's P / alpha buffers and their barriers."""
    plgpu, cfg, f32 = k.plgpu, k.cfg, jnp.float32
    bm, tn, ns = k.bm, k.tn, k.ns
    ring = _smem_tile((ns, tn, k.dqk), k.dtype, k.swz)
    stage = _smem_tile((2, bm, _STAGE_COLS), k.stage_dtype, min(128, _STAGE_COLS * k.stage_dtype.itemsize))
    lse_tile = plgpu.SMEM((bm,), f32)
    if k.aliased and k.lazy:
        staging = [plgpu.RefUnion(ring, (stage, lse_tile))]
    elif k.aliased:
        staging = [plgpu.RefUnion(ring, stage), lse_tile]
    else:
        staging = [ring, stage, lse_tile]
    scratch = [
        _smem_tile((bm, k.dqk), k.dtype, k.swz),
        *staging,
        plgpu.Barrier(num_arrivals=1, num_barriers=1),
        plgpu.Barrier(num_arrivals=k.copies, num_barriers=ns),
        (plgpu.ClusterBarrier(collective_axes=("t",), num_arrivals=2, num_barriers=ns) if k.cluster
         else plgpu.Barrier(num_arrivals=2, num_barriers=ns)),
    ]
    if cfg.split_qk:
        scratch += [_smem_tile((2, 2, bm, tn), f32, min(128, tn * 4)), plgpu.Barrier(num_arrivals=1, num_barriers=4)]
    if cfg.share_p:  # P, alpha (then consumer 0's final l); p_ready, p_free (by each reader of P), done (by all)
        readers = 2 if cfg.s_warpgroup else 1
        nbuf = k.nbuf
        if nbuf == 1:
            p_bufs = [_smem_tile((bm, tn), k.dtype, k.swz), plgpu.SMEM((2 * bm if k.lazy else bm,), f32)]
        else:  # s_pipelined: two P / alpha buffers
            p_bufs = [_smem_tile((nbuf, bm, tn), k.dtype, k.swz), plgpu.SMEM((nbuf, bm), f32)]
        scratch += [*p_bufs, plgpu.Barrier(num_arrivals=1, num_barriers=nbuf),
                    plgpu.Barrier(num_arrivals=readers, num_barriers=nbuf),
                    plgpu.Barrier(num_arrivals=readers + 1, num_barriers=1)]
    if k.wl:  # ring_free (both consumers, of both CTAs under kv64_mc: the partner's multicast writes this ring),
        # l_taken (consumer 1 has read the final l)
        scratch += [(plgpu.ClusterBarrier(collective_axes=("t",), num_arrivals=2, num_barriers=1) if k.cluster
                     else plgpu.Barrier(num_arrivals=2, num_barriers=1)),
                    plgpu.Barrier(num_arrivals=1, num_barriers=1)]
    return scratch


def _grid(k: _Build) -> dict:
    """The launch grid: (row tiles, splits, batch), or under kv64_mc with paired row tiles 2-CTA clusters along
    "t" (the CUDA grid is (2 B, S, row tiles / 2), a cluster (2, 1, 1))."""
    nb = 1 if k.wl else k.b  # work_list: "s" is the work unit, the sequences are its pieces
    if k.paired:
        return dict(grid=(k.n_row_tiles // 2, k.splits, nb), grid_names=("tp", "s", "b"), cluster=(2,),
                    cluster_names=("t",))
    return dict(grid=(k.n_row_tiles, k.splits, nb), grid_names=("t", "s", "b"))


@functools.lru_cache(maxsize=64)
def _build_mosaic(b: int, rows_pad: int, tq: int, dqk: int, dv: int, num_pages: int, page: int, pps: int,
                  dtype_name: str, splits: int, chunk: int, causal: bool, scale: float, cfg: MlaTcConfig,
                  emulate: bool = False, direct: bool = False, flag: bool = False):
    """The Mosaic kernel. ``emulate``: the same kernel for jax's GPU interpreter (CPU), which has no layouts, no
    ``run_state`` and no transposed wgmma operand: there the two products are ``jnp`` dots on the same shared-memory
    tiles (everything else, TMA through the table, barriers, masks, the S exchange, the epilogue, is the kernel's).
    ``direct`` (one split): the output in q's dtype ``[B, rows_pad, DV]`` and the LSE ``[B, rows_pad]``; ``flag``:
    with a per-sequence bad flag input (``_Build``)."""
    k = _Build(b, rows_pad, tq, dqk, dv, num_pages, page, pps, dtype_name, splits, chunk, causal, scale, cfg, emulate,
               direct, flag)
    plgpu, f32 = k.plgpu, jnp.float32
    n_wg = 3  # two consumers and a producer, or (s_warpgroup) S, two P.V warpgroups, the first of which loads

    def body(*refs):
        _kernel_body(k, refs)

    out_type = (jax.ShapeDtypeStruct((b, rows_pad, splits, dv), f32),
                jax.ShapeDtypeStruct((b, splits, rows_pad), f32))
    if direct:
        if splits != 1 or k.wl:
            raise ValueError(f"{GEN}: the direct epilogue writes one split's output; got {splits} splits, "
                             f"work_list={k.wl}")
        out_type = (jax.ShapeDtypeStruct((b, rows_pad, dv), k.dtype), jax.ShapeDtypeStruct((b, rows_pad), f32))
    if k.wl:  # one slot per (unit u, sequence b) piece at u + b; wl_merge_block more that the finish's last masked
        # merge step may address (never written, never used)
        pad = wl_merge_block(splits, b)
        out_type = (jax.ShapeDtypeStruct((splits + b - 1 + pad, rows_pad, dv), f32),
                    jax.ShapeDtypeStruct((splits + b - 1 + pad, rows_pad), f32))
    return plgpu.kernel(
        body,
        out_type=out_type,
        scratch_types=_scratch(k),
        **_grid(k),
        num_threads=n_wg,
        thread_name="wg",
        # share_p: every reduction is along a WGMMA row (within a warp: no cross-warp scratch), and the 2 KiB the
        # default reserves for one would push the CTA past 227 KiB (module docstring)
        # (lazy_rescale: 1 KiB, paid for by aliasing the LSE staging into the ring)
        compiler_params=plgpu.CompilerParams(
            approx_math=True,
            **({"reduction_scratch_bytes": _LAZY_SCRATCH if k.lazy else 0} if cfg.share_p else {})),
        kernel_name=PASS_MOSAIC,
    )


# ------------------------------------------------------------------------------------------------------------
# The twin: same tiles, pl.dot on 64-row tiles (Triton on a GPU, interpret mode on the CPU)
# ------------------------------------------------------------------------------------------------------------


def attend_tc(q_chunks, q_rope, src, *, lo, hi, pos, q_off, causal: bool, scale: float, tn: int,
              base2: bool = True):
    """Online softmax (base 2, raw running max) of 64 rows over keys ``[lo, hi)`` in tiles of ``tn`` keys;
    scores and ``P V`` as dots with fp32 accumulation, P rounded to the tile dtype. Returns ``(m * scale *
    log2 e, l, accs)`` (the log2-unit max ``splitkv.partial(..., base2=True)`` expects)."""
    del base2
    f32 = jnp.float32
    cl = float(scale) * _LOG2E
    rows = q_rope.shape[0]
    n_tiles = c.cdiv(jnp.maximum(hi - lo, 0), tn)

    def body(t, carry):
        m_i, l_i, accs = carry
        j0 = lo + t * tn
        j = j0 + jnp.arange(tn, dtype=jnp.int32)
        chunks, rope = src.tile(j0, j < hi)
        sc = c.dot_nt(q_rope, rope)
        for qx, kx in zip(q_chunks, chunks):
            sc = sc + c.dot_nt(qx, kx)
        if src.lay.fold:
            sc = sc * src.scale
        sc = jnp.where(visible(j, hi, pos, q_off, causal=causal), sc, -jnp.inf)
        m_new = jnp.maximum(m_i, jnp.max(sc, axis=1))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) * cl
        alpha = jnp.exp2(m_i * cl - m_use)
        p = jnp.exp2(sc * cl - m_use[:, None])
        l_new = l_i * alpha + jnp.sum(p, axis=1)
        pt = p.astype(rope.dtype)
        accs = tuple(a * alpha[:, None] + c.dot_nn(pt, kx) for a, kx in zip(accs, chunks))
        return m_new, l_new, accs

    init = (jnp.full((rows,), -jnp.inf, f32), jnp.zeros((rows,), f32),
            tuple(jnp.zeros((rows, x.shape[1]), f32) for x in q_chunks))
    m_i, l_i, accs = lax.fori_loop(0, n_tiles, body, init)
    if src.lay.fold:
        accs = tuple(a * src.scale for a in accs)
    return m_i * cl, l_i, accs


@functools.cache
def _attend(causal: bool, scale: float, tn: int):
    return functools.partial(attend_tc, causal=causal, scale=scale, tn=tn, base2=True)


def _twin_kernel(q_ref, lat_ref, bt_ref, lens_ref, off_ref, *refs, rows: int, tq: int, chunk: int, causal: bool,
                 lay: LatentLayout, attend, n_quant: int):
    quant_refs, (o_ref, lse_ref) = refs[:n_quant], refs[n_quant:]
    scale_l = quant_refs[-1][0] if n_quant else None
    t, sp, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv_len = jnp.clip(lens_ref[b], 0, lay.capacity)
    r = t * BLOCK_M + jnp.arange(BLOCK_M, dtype=jnp.int32)
    row_ok = r < rows
    row0 = b * rows + t * BLOCK_M

    def q_piece(c0: int, w: int):
        return _compat.load(q_ref.at[pl.ds(row0, BLOCK_M), pl.ds(c0, w)],
                            mask=jnp.broadcast_to(row_ok[:, None], (BLOCK_M, w)), other=0.0)

    q_chunks = [q_piece(i * lay.cw, lay.cw) for i in range(lay.chunks)]
    q_rope = q_piece(lay.dv, lay.rope)
    pos = r % tq
    lo = sp * chunk
    hi = jnp.minimum(kv_len, lo + chunk)
    q_off = None
    if causal:
        q_off = jnp.clip(off_ref[b], -tq, lay.capacity)
        hi = jnp.minimum(hi, q_off + tq)
    src = LatentSource(lay, lat_ref, bt_ref, b=b, scale=scale_l)
    m, l, accs = attend(q_chunks, q_rope, src, lo=lo, hi=hi, pos=pos, q_off=q_off)
    for i, acc in enumerate(accs):
        o, lse = splitkv.partial(m, l, acc, base2=True)
        _compat.store(o_ref.at[pl.ds(row0, BLOCK_M), sp, pl.ds(i * lay.cw, lay.cw)], o,
                      mask=jnp.broadcast_to(row_ok[:, None], (BLOCK_M, lay.cw)))
    _compat.store(lse_ref.at[pl.ds(row0, BLOCK_M), sp], lse, mask=row_ok)


def _twin(q, data, bt, lens, off, quant_ops, *, dv: int, splits: int, chunk: int, causal: bool, scale: float,
          cfg: MlaTcConfig, interpret: bool):
    b, tq, hq, dqk = q.shape
    num_pages, page = data.shape[:2]
    fmt = "fp8_e4m3" if quant_ops else None
    tn = cfg.block_kv
    lay = LatentLayout(dqk=dqk, dv=dv, tn=tn, page=page, pages_per_seq=bt.shape[1], num_pages=num_pages, fmt=fmt,
                       tile_dtype=jnp.dtype(q.dtype).name, gather=page < tn or chunk % tn != 0, fold=fmt is not None)
    rows = hq * tq
    params = None if interpret else _compat.triton_params(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return pl.pallas_call(
        functools.partial(_twin_kernel, rows=rows, tq=tq, chunk=chunk, causal=causal, lay=lay,
                          attend=_attend(causal, scale, tn), n_quant=len(quant_ops)),
        out_shape=(jax.ShapeDtypeStruct((b * rows, splits, dv), jnp.float32),
                   jax.ShapeDtypeStruct((b * rows, splits), jnp.float32)),
        grid=(c.cdiv(rows, BLOCK_M), splits, b),
        compiler_params=params,
        interpret=interpret,
        name=PASS_TWIN,
    )(gqa.pack_q(q, 1), data.reshape(num_pages * page, data.shape[-1]), bt.reshape(-1), lens, off, *quant_ops)


def wl_layout(units: int, b: int) -> dict:
    """Offsets into ``work_plan``'s int32 array: ``quota``, ``total``, then per unit ``first`` and ``count`` (its
    first sequence, how many it touches), ``cum`` (B + 1 running tile counts), per sequence ``hi`` (the end of its
    visible keys), ``pfirst`` and ``pcount`` (its first slot, its number of pieces: what the finish merges), and the
    length ``n``. A CTA reads quota, total and its unit's two fields, then each piece's sequence fields: two levels
    of dependent loads. (Storing each unit's share bounds too made jax's GPU interpreter hang at the third
    warpgroup's read of them, session 33; they are two multiplies away from quota and total.)"""
    u2 = 2 + 2 * units
    return dict(first=2, count=2 + units, cum=u2, hi=u2 + b + 1, pfirst=u2 + 2 * b + 1, pcount=u2 + 3 * b + 1,
                n=u2 + 4 * b + 1)


def wl_merge_block(units: int, b: int) -> int:
    """Pieces per step of the finish's merge under the work list (a sequence has about ``units / b`` pieces, one
    more where a share crosses into it), and the unwritten slots after the last one that its masked lanes address."""
    return min(32, next_pow2(max(1, units // b) + 1))


def _plan_kernel(lens_ref, off_ref, out_ref, *, b: int, units: int, cap: int, tq: int, tn: int, causal: bool,
                 bp: int, up: int, ub: int):
    """``work_plan`` in one Triton program: the B lengths (and offsets) padded to ``bp`` lanes, their running sums
    (a scan), the units' first sequences as ``[ub, bp]`` compare-and-sums over blocks of ``ub`` units, every field
    stored masked."""
    lay = wl_layout(units, b)
    i32 = jnp.int32
    lane = jnp.arange(bp, dtype=i32)
    ok = lane < b
    kv = jnp.clip(_compat.load(lens_ref.at[pl.ds(0, bp)], mask=ok, other=0), 0, cap)
    if causal:
        kv = jnp.minimum(kv, jnp.clip(_compat.load(off_ref.at[pl.ds(0, bp)], mask=ok, other=0), -tq, cap) + tq)
    tiles = jnp.where(ok, (jnp.maximum(kv, 0) + tn - 1) // tn, 0)
    incl = jnp.cumsum(tiles)  # tiles of sequences 0 .. b (Triton's associative scan)
    excl = incl - tiles  # cum[b]; lane b (>= B) holds the total
    total = jnp.sum(tiles)
    quota = jnp.maximum((total + units - 1) // units, 1)
    ends = jnp.where(ok, incl, jnp.iinfo(jnp.int32).max)[None, :]  # sequence b ends at incl[b]

    def unit_block(j, carry):  # units [j ub, (j + 1) ub): a [ub, bp] compare at a time (not [up, bp] at once: at
        # B 128 that was 32k lanes in one program's registers)
        u = j * ub + jnp.arange(ub, dtype=i32)
        t0 = jnp.minimum(u * quota, total)
        t1 = jnp.minimum(t0 + quota, total)
        first = jnp.sum((ends <= t0[:, None]).astype(i32), axis=1)
        last = jnp.sum((ends <= (t1 - 1)[:, None]).astype(i32), axis=1)
        count = jnp.where(t1 > t0, last - first + 1, 0)
        _compat.store(out_ref.at[pl.ds(lay["first"] + j * ub, ub)], first, mask=u < units)
        _compat.store(out_ref.at[pl.ds(lay["count"] + j * ub, ub)], count, mask=u < units)
        return carry

    lax.fori_loop(0, up // ub, unit_block, 0)
    u0 = excl // quota
    pcount = jnp.where(tiles > 0, (incl - 1) // quota - u0 + 1, 0)
    head = jnp.where(lane == 0, quota, total)
    _compat.store(out_ref.at[pl.ds(0, bp)], head, mask=lane < 2)
    _compat.store(out_ref.at[pl.ds(lay["cum"], bp)], excl, mask=lane <= b)
    _compat.store(out_ref.at[pl.ds(lay["hi"], bp)], jnp.maximum(kv, 0), mask=ok)
    _compat.store(out_ref.at[pl.ds(lay["pfirst"], bp)], u0 + lane, mask=ok)
    _compat.store(out_ref.at[pl.ds(lay["pcount"], bp)], pcount, mask=ok)


def work_plan(lens, off, *, cap: int, tq: int, tn: int, causal: bool, units: int, interpret: bool = False):
    """work_list: the plan the kernel and the finish read, from the traced lengths (and causal offsets), as one
    int32 array (``wl_layout``). Sequence b sees keys below ``hi_b`` (the split rule's CTAs compute the same in
    ``_Cta``) and has ``cdiv(hi_b, tn)`` key tiles, ``cum`` their running sum, ``total`` the batch's tiles and
    ``quota = cdiv(total, U)`` each unit's share: unit u runs tiles ``[u quota, (u + 1) quota)`` of the batch
    counted across sequences, over ``count[u]`` sequences from ``first[u]`` (empty ones among them are skipped), and
    writes sequence b's piece to slot ``u + b``: sequence b's pieces are ``pcount[b]`` slots from ``pfirst[b] =
    cum[b] // quota + b``. One small Triton launch before the kernel (``_plan_kernel``; XLA's ops for the same took
    four launches, session 33 call 1)."""
    b = lens.shape[0]
    lay = wl_layout(units, b)
    bp, up = next_pow2(b + 1), next_pow2(units)
    ub = min(up, max(1, 4096 // bp))  # units a block: at most 4096 compares live at once
    return pl.pallas_call(
        functools.partial(_plan_kernel, b=b, units=units, cap=cap, tq=tq, tn=tn, causal=causal, bp=bp, up=up,
                          ub=ub),
        out_shape=jax.ShapeDtypeStruct((lay["n"] + max(bp, up),), jnp.int32),  # masked lanes past the end
        grid=(1,),
        compiler_params=None if interpret else _compat.triton_params(num_warps=4, num_stages=1),
        interpret=interpret, name=PASS_PLAN,
    )(lens.astype(jnp.int32), off.astype(jnp.int32))[:lay["n"]]


def _mosaic(q, data, bt, lens, off, *, dv: int, splits: int, chunk: int, causal: bool, scale: float,
            cfg: MlaTcConfig, emulate: bool = False, raw: bool = False, wl=None, bad=None):
    """The Mosaic partial kernel: ``(o, lse)`` in the kernel's layout (``raw``) or the merge's; under work_list
    ``(o, lse, plan)``, the slots and ``work_plan``'s array (``wl``: one already computed) for ``_finish``. Where
    the config writes directly (``MlaTcConfig.writes_direct``) the caller's ``(out [B, Tq, Hq, DV], lse [B, Hq,
    Tq])``, NaN where ``bad`` (``table_flag``'s ``[B]``, or None: no check) is nonzero."""
    b, tq, hq, dqk = q.shape
    num_pages, page = data.shape[:2]
    rows = hq * tq
    rows_pad = c.cdiv(rows, BLOCK_M) * BLOCK_M
    qp = gqa.pack_q(q, 1).reshape(b, rows, dqk)
    if rows_pad != rows:
        qp = jnp.pad(qp, ((0, 0), (0, rows_pad - rows), (0, 0)))
    if cfg.work_list:  # splits: the work units U; the plan goes to the kernel and comes back for the finish
        units = cfg.units(batch=b, rows=rows)[0]
        if wl is None:  # (emulate: computed by the caller, outside the GPU interpreter, which runs no Triton)
            wl = work_plan(lens, off, cap=bt.shape[1] * page, tq=tq, tn=cfg.block_kv, causal=causal, units=units)
        call = _build_mosaic(b, rows_pad, tq, dqk, dv, num_pages, page, bt.shape[1], jnp.dtype(q.dtype).name,
                             units, 0, bool(causal), float(scale), cfg, emulate)
        o, lse = call(qp, data.reshape(num_pages * page, dqk), bt.reshape(-1), lens, off, wl)
        return o, lse, wl
    direct = cfg.writes_direct(splits)  # the output itself: [B, rows_pad, DV] in q's dtype, the LSE [B, rows_pad]
    call = _build_mosaic(b, rows_pad, tq, dqk, dv, num_pages, page, bt.shape[1], jnp.dtype(q.dtype).name, splits,
                         chunk, bool(causal), float(scale), cfg, emulate, direct, direct and bad is not None)
    flag = (bad.astype(jnp.int32),) if direct and bad is not None else ()  # (table_flag's int32: no cast)
    o, lse = call(qp, data.reshape(num_pages * page, dqk), bt.reshape(-1), lens, off, *flag)
    if direct:
        out = gqa.unpack_o(o[:, :rows].reshape(b * rows, dv), b, tq, hq, 1)
        return out, gqa.unpack_lse(lse[:, :rows].reshape(b * rows), b, tq, hq)
    if raw:  # the kernel's layout, o [B, rows_pad, S, DV] and lse [B, S, rows_pad], for _finish
        return o, lse
    o = o[:, :rows].reshape(b * rows, splits, dv)
    lse = lse.transpose(0, 2, 1)[:, :rows].reshape(b * rows, splits)
    return o, lse


def emulate_mosaic(q, latent_pool, block_table, kv_lens, q_offset, *, kv_lora_rank: int, causal: bool, scale: float,
                   config: MlaTcConfig, detect_races: bool = True, check_block_table: bool = False):
    """The Mosaic kernel (``emulate=True``) on jax's GPU interpreter (CPU; threads, barriers, TMA and shared
    memory simulated, uninitialised shared memory NaN), merged as ``mla_forward`` does (or, at one split under
    ``direct``, written by the kernel itself, with the bad-table flag when ``check_block_table``). Returns ``(out,
    lse, races_found)``. For tests: it checks the kernel's synchronisation, table addressing, masks and epilogue
    where no GPU is present (the products are jnp dots there, see ``_build_mosaic``)."""
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        from jax._src.pallas.mosaic_gpu.interpret import params as gpu_interpret
    except ImportError as e:  # pragma: no cover - a jax without the GPU interpreter
        raise NotImplementedError(f"this jax ({jax.__version__}) has no Mosaic GPU interpret mode: {e}") from e
    b, tq, hq, _ = q.shape
    page = latent_pool.shape[1]
    s, chunk = config.splits(batch=b, rows=hq * tq, n_k=block_table.shape[1] * page)
    off = jnp.asarray(q_offset, jnp.int32)
    wl = None
    direct = config.writes_direct(s)
    bad = table_flag(block_table, kv_lens, num_pages=latent_pool.shape[0], page=page) \
        if direct and check_block_table else None
    if config.work_list:
        wl = work_plan(kv_lens, off, cap=block_table.shape[1] * page, tq=tq, tn=config.block_kv, causal=causal,
                       units=config.units(batch=b, rows=hq * tq)[0], interpret=True)
    try:
        with gpu_interpret.force_gpu_interpret_mode(gpu_interpret.InterpretGPUParams(detect_races=detect_races)):
            parts = jax.block_until_ready(_mosaic(
                q, latent_pool, block_table, kv_lens, off, dv=kv_lora_rank, splits=s, chunk=chunk, causal=causal,
                scale=float(scale), cfg=config, emulate=True, wl=wl, bad=bad))
        races = bool(detect_races and gpu_callbacks.get_races().races_found)
    finally:
        gpu_callbacks.reset_gpu_interpret_mode_state()
    if config.work_list:  # the pieces' slots merged by the finish the GPU runs (in interpret mode)
        o_part, lse_part, wl = parts
        out, lse = _finish(o_part, lse_part, block_table, kv_lens, b=b, tq=tq, hq=hq,
                           num_pages=latent_pool.shape[0], page=page, out_dtype=q.dtype, interpret=True,
                           return_lse=True, check=False, wl=wl, units=config.units(batch=b, rows=hq * tq)[0])
        return out, lse, races
    if direct:
        return (*parts, races)
    o_part, lse_part = parts
    o, lse = splitkv.merge_jnp(o_part, lse_part, axis=1)
    return gqa.unpack_o(o.astype(q.dtype), b, tq, hq, 1), gqa.unpack_lse(lse, b, tq, hq), races


def _finish_kernel(op_ref, lse_ref, bt_ref, lens_ref, *out_refs, splits: int, sb: int, dv: int, rows: int, tq: int,
                   hq: int, pps: int, pb: int, num_pages: int, page: int, check: bool, with_lse: bool, dc: int,
                   wl_seq: tuple[int, int] | None = None):
    """Columns ``[col * dc, (col + 1) * dc)`` of packed row ``r`` (``b * rows + h * tq + t``) of ``o_part [B,
    rows_x, S, DV]`` / ``lse [B, S, rows_x]``: the merge of its ``splits`` states (``splitkv.merge_states``, the
    shared merge's loop; under the work list a sequence one piece ran whole is read as it is, no merge), then, with
    ``check``, NaN when its sequence's length or a page it uses is outside the pool (``mla_common.table_poison``'s
    rule), written to output row ``(b, t, h)``; the LSE by the row's first column program."""
    r, col = pl.program_id(0), pl.program_id(1)
    c0 = col * dc
    bi, rr = r // rows, r % rows
    h, t = rr // tq, rr % tq
    if wl_seq is None:
        m_run, l_run, acc = splitkv.merge_states(lambda s0: lse_ref.at[bi, pl.ds(s0, sb), rr],
                                                 lambda s0: op_ref.at[bi, rr, pl.ds(s0, sb), pl.ds(c0, dc)],
                                                 splits=splits, sb=sb, d=dc)
        out = softmax.finalize(acc, l_run)
        lse = softmax.lse(m_run, l_run, base2=True)
    else:  # work_list: sequence bi's pieces, in consecutive slots (work_plan's pfirst / pcount)
        wl_ref, *out_refs = out_refs
        first, n_pieces = wl_ref[wl_seq[0] + bi], wl_ref[wl_seq[1] + bi]

        def merged():
            m_run, l_run, acc = splitkv.merge_states(lambda s0: lse_ref.at[pl.ds(first + s0, sb), rr],
                                                     lambda s0: op_ref.at[pl.ds(first + s0, sb), rr, pl.ds(c0, dc)],
                                                     splits=n_pieces, sb=sb, d=dc)
            return softmax.finalize(acc, l_run), softmax.lse(m_run, l_run, base2=True)

        def single():  # one piece ran the whole sequence: its slot holds the normalized output and the LSE
            return op_ref[first, rr, pl.ds(c0, dc)], lse_ref[first, rr]

        out, lse = lax.cond(n_pieces == 1, single, merged)
    if check:
        n = lens_ref[bi]
        cap = pps * page
        used = (jnp.clip(n, 0, cap) + page - 1) // page

        def scan(ci, bad):
            j = ci * pb + jnp.arange(pb, dtype=jnp.int32)
            pg = _compat.load(bt_ref.at[bi, pl.ds(ci * pb, pb)], mask=j < pps, other=0)
            oob = (j < used) & ((pg < 0) | (pg >= num_pages))
            return bad | jnp.max(oob.astype(jnp.int32))

        bad = lax.fori_loop(0, c.cdiv(pps, pb), scan, ((n < 0) | (n > cap)).astype(jnp.int32))
        out = jnp.where(bad > 0, jnp.float32(jnp.nan), out)
        lse = jnp.where(bad > 0, jnp.float32(jnp.nan), lse)
    out_refs[0][bi * tq + t, pl.ds(h * dv + c0, dc)] = out.astype(out_refs[0].dtype)
    if with_lse:
        @pl.when(col == 0)
        def _():
            out_refs[1][r] = lse


def finish_grid(r: int, splits: int, dv: int) -> tuple[int, int, int]:
    """``(column programs per row, columns each, splits per step)`` of ``_finish`` over ``r`` packed rows: whole rows
    while the rows alone give >= 512 programs (4 a SM), else 2, 4, ... programs a row of >= 64 columns each (at B1,
    128 rows, the merge of 64 splits runs as 4 programs a row), and at most 8,192 partial floats in flight."""
    n_col = 1
    while r * n_col < 512 and dv // (2 * n_col) >= 64 and dv % (2 * n_col) == 0:
        n_col *= 2
    dc = dv // n_col
    return n_col, dc, max(1, min(next_pow2(splits), 8192 // dc))


def _finish(o_part, lse_part, bt, lens, *, b: int, tq: int, hq: int, num_pages: int, page: int, out_dtype,
            interpret: bool, return_lse: bool, check: bool, wl=None, units: int | None = None):
    """Config ``finish="pallas"``: ``o_part [B, rows_x, S, DV]`` / ``lse_part [B, S, rows_x]`` (the Mosaic
    kernel's layout; rows = Hq * Tq head-major, rows_x >= rows, the padding rows unread) to the caller's ``[B, Tq,
    Hq, DV]`` (and ``[B, Hq, Tq]`` LSE) in one launch (``_finish_kernel``) instead of the XLA merge, cast, unpack and
    bad-table select. ``wl`` (work_list): ``work_plan``'s array for ``units`` units, with ``o_part [slots, rows_x,
    DV]`` / ``lse_part [slots, rows_x]`` (each sequence's pieces in consecutive slots; ``wl_merge_block`` unwritten
    slots at the end that only masked lanes of the last merge step address)."""
    rows = hq * tq
    r = b * rows
    pps = bt.shape[1]
    wl_seq = None
    if wl is None:
        _, _, splits, dv = o_part.shape
        n_col, dc, sb = finish_grid(r, splits, dv)
    else:
        dv = o_part.shape[-1]
        if o_part.shape[0] != units + b - 1 + wl_merge_block(units, b):
            raise ValueError(f"{GEN}: {o_part.shape[0]} partial slots for {units} units and {b} sequences")
        lay = wl_layout(units, b)
        wl_seq = (lay["pfirst"], lay["pcount"])
        splits = wl_merge_block(units, b)  # (the merge's trip count is each sequence's pcount)
        n_col, dc, sb = finish_grid(r, splits, dv)  # sb <= splits: the masked lanes stay in the padding slots
    pb = min(next_pow2(pps), 1024)
    out_shape = [jax.ShapeDtypeStruct((b * tq, hq * dv), out_dtype)]
    if return_lse:
        out_shape.append(jax.ShapeDtypeStruct((r,), jnp.float32))
    res = pl.pallas_call(
        functools.partial(_finish_kernel, splits=splits, sb=sb, dv=dv, rows=rows, tq=tq, hq=hq, pps=pps, pb=pb,
                          num_pages=num_pages, page=page, check=check, with_lse=return_lse, dc=dc,
                          wl_seq=wl_seq),
        out_shape=tuple(out_shape), grid=(r, n_col),
        compiler_params=_compat.triton_params(num_warps=4, num_stages=1),
        interpret=interpret, name=PASS_FINISH,
    )(o_part, lse_part, bt, lens, *(() if wl is None else (wl,)))
    out = res[0].reshape(b, tq, hq, dv)
    if not return_lse:
        return out
    return out, gqa.unpack_lse(res[1], b, tq, hq)


@functools.partial(jax.jit, static_argnames=("dv", "splits", "chunk", "causal", "scale", "cfg", "interpret",
                                             "return_lse", "check"))
def _forward(q, data, bt, lens, off, quant_ops, *, dv: int, splits: int, chunk: int, causal: bool, scale: float,
             cfg: MlaTcConfig, interpret: bool, return_lse: bool, check: bool):
    b, tq, hq, _ = q.shape
    fin = cfg.finish == "pallas"
    if cfg.engine == "mosaic" and not interpret and cfg.writes_direct(splits):  # no finish: the kernel writes it
        bad = table_flag(bt, lens, num_pages=data.shape[0], page=data.shape[1]) if check else None
        out, lse = _mosaic(q, data, bt, lens, off, dv=dv, splits=splits, chunk=chunk, causal=causal, scale=scale,
                           cfg=cfg, bad=bad)
        return (out, lse) if return_lse else out
    if cfg.engine == "mosaic" and not interpret and cfg.work_list:
        o_part, lse_part, wl = _mosaic(q, data, bt, lens, off, dv=dv, splits=splits, chunk=chunk, causal=causal,
                                       scale=scale, cfg=cfg)
        return _finish(o_part, lse_part, bt, lens, b=b, tq=tq, hq=hq, num_pages=data.shape[0], page=data.shape[1],
                       out_dtype=q.dtype, interpret=False, return_lse=return_lse, check=check, wl=wl,
                       units=cfg.units(batch=b, rows=hq * tq)[0])
    if cfg.engine == "mosaic" and not interpret:
        o_part, lse_part = _mosaic(q, data, bt, lens, off, dv=dv, splits=splits, chunk=chunk, causal=causal,
                                   scale=scale, cfg=cfg, raw=fin)
    else:  # (a work_list config in interpret mode runs the twin by the split rule: the same math)
        o_part, lse_part = _twin(q, data, bt, lens, off, quant_ops, dv=dv, splits=splits, chunk=chunk,
                                 causal=causal, scale=scale, cfg=cfg, interpret=interpret)
        if fin:  # [B * rows, S, DV] / [B * rows, S] to the Mosaic layout (the LSE transpose is B x S x rows floats)
            o_part = o_part.reshape(b, hq * tq, splits, dv)
            lse_part = lse_part.reshape(b, hq * tq, splits).transpose(0, 2, 1)
    if fin:
        return _finish(o_part, lse_part, bt, lens, b=b, tq=tq, hq=hq, num_pages=data.shape[0], page=data.shape[1],
                       out_dtype=q.dtype, interpret=interpret, return_lse=return_lse, check=check)
    o, lse = splitkv.merge_jnp(o_part, lse_part, axis=1)
    out = gqa.unpack_o(o.astype(q.dtype), b, tq, hq, 1)
    if check:
        poison = table_poison(bt, lens, num_pages=data.shape[0], page=data.shape[1])
        out = jnp.where(poison[:, None, None, None], jnp.asarray(jnp.nan, out.dtype), out)
    if not return_lse:
        return out
    lse = gqa.unpack_lse(lse, b, tq, hq)
    if check:
        lse = jnp.where(poison[:, None, None], jnp.float32(jnp.nan), lse)
    return out, lse


def mla_forward(q, latent_pool, block_table, kv_lens, *, kv_lora_rank: int, causal: bool, scale: float, q_offset,
                interpret: bool, config: MlaTcConfig = CONFIGS["faithful"], return_lse: bool = False,
                check_block_table: bool = True):
    """v12_mla_tc on validated inputs (``pallas_attn.mla_attention``)."""
    if not isinstance(config, MlaTcConfig):
        raise ValueError(f"{GEN}: config must be an MlaTcConfig; got {config!r}")
    b, tq, hq, dqk = q.shape
    if (dqk, kv_lora_rank) not in TEMPLATES:
        raise NotImplementedError(f"{GEN} takes (DQK, kv_lora_rank) in {list(TEMPLATES)}; got ({dqk}, {kv_lora_rank})")
    fmt, data, _, scale_l = latent_storage(latent_pool)
    if fmt not in (None, "fp8_e4m3"):
        raise NotImplementedError(f"{GEN} reads bf16 / fp16 or fp8_e4m3 latents; got {fmt} (NVFP4: v11_mla)")
    if fmt is not None and config.engine == "mosaic":
        raise NotImplementedError(f"{GEN}: the Mosaic GPU kernel reads bf16 / fp16 latents; an fp8 latent runs on "
                                  "config='triton' (or config=None, which picks it)")
    num_pages, page = data.shape[:2]
    if config.engine == "mosaic" and not interpret:
        if page < 8:
            raise NotImplementedError(f"{GEN}: the Mosaic kernel copies whole pages of >= 8 rows; got page {page} "
                                      "(config='triton' takes any page)")
        if config.multicast and page < 2 * 8:
            raise NotImplementedError(
                f"{GEN}: multicast (kv64_mc) splits each page copy into two halves of whole 8-row groups, one per "
                f"CTA of the cluster: it needs page >= 16; got page {page} (config='kv64' takes page 8)")
        need = smem_bytes(dqk, kv_lora_rank, jnp.dtype(q.dtype).itemsize, config)
        if need > _SMEM_LIMIT:
            raise ValueError(f"{GEN}: config {config} needs {need} bytes of shared memory (limit {_SMEM_LIMIT})")
    if check_block_table:
        validate_table_eagerly(block_table, kv_lens, num_pages=num_pages, page=page)
    s, chunk = config.splits(batch=b, rows=hq * tq, n_k=block_table.shape[1] * page)
    quant_ops = () if fmt is None else (scale_l[None],)
    return _forward(q, data, block_table, kv_lens, q_offset.astype(jnp.int32), quant_ops, dv=int(kv_lora_rank),
                    splits=s, chunk=chunk, causal=bool(causal), scale=float(scale), cfg=config,
                    interpret=bool(interpret), return_lse=bool(return_lse), check=bool(check_block_table))


def _plan(p: Problem, cfg: MlaTcConfig) -> dict:
    rows = p.heads_q * p.q_len
    s, chunk = cfg.splits(batch=p.batch, rows=rows, n_k=p.kv_len)
    dv = p.kv_lora_rank or dict(TEMPLATES).get(p.head_dim, 0)
    out = {"engine": cfg.engine, "splits": s, "chunk": chunk, "block_m": BLOCK_M, "block_kv": cfg.block_kv,
           "ctas": c.cdiv(rows, BLOCK_M) * s * p.batch,
           "merge": "v12_mla_tc._finish (Pallas)" if cfg.finish == "pallas" else "splitkv.merge_jnp"}
    if cfg.writes_direct(s):
        out.update(direct=True, merge="none: one split, the kernel's epilogue writes q's dtype and the LSE (the "
                   "bad-table flag computed before the launch)")
    if cfg.engine == "mosaic":
        out.update(stages=cfg.stages, warpgroups=3, smem_bytes=smem_bytes(p.head_dim, dv, 2, cfg))
    if cfg.work_list:
        u, slots = cfg.units(batch=p.batch, rows=rows)
        out.update(units=u, slots=slots, ctas=c.cdiv(rows, BLOCK_M) * u, merge="v12_mla_tc._finish (Pallas, work list)",
                   work_list=f"{u} units, each an equal share of the batch's {cfg.block_kv}-key tiles counted across "
                   "sequences (computed on the device from the lengths), its pieces one sequence after another; "
                   "splits / chunk: the twin's split rule (interpret mode)")
    if cfg.multicast:
        tiles = c.cdiv(rows, BLOCK_M)
        if tiles % 2 == 0:
            out.update(cluster=2, multicast="each latent tile read from L2 once per 2-CTA cluster (row tiles "
                       "2k, 2k+1), multicast into both")
        else:
            out.update(cluster=1, multicast=f"off: {tiles} row tile(s) ({rows} packed rows) do not pair into 2-CTA "
                       "clusters; runs as kv64")
    return out


_TC = ("wgmma (Mosaic GPU) on 16-bit Q and latent tiles from shared memory, P from registers, fp32 accumulation; "
       "the latent tile serves QK (all DQK columns) and PV (its first DV columns)")
_FP8 = ("fp8 E4M3 latent decoded at the gather to q's 16-bit dtype (exact: every E4M3 value is an fp16 and a bf16 "
        "value), tensor-core dots with fp32 accumulation, the tensor scale applied to S and O in fp32 (the triton "
        "config)")

def launches(s, plan, names: list[str], hw=None, cfg=None) -> list[Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``s`` a ``compare.layer2.Shape``).
    v12_mla_tc / fa_mla: 64 packed heads x TN latent keys per tile on tensor cores, grid (row tiles, S, B).

    Mosaic (``engine`` mosaic): one CTA = producer + two consumer warpgroups, 1 CTA per SM (shared memory). Per
    tile the serial chain is the MMA work on the tensor cores (priced at the datasheet rate, ``Launch.mma``) plus a
    fitted per-tile latency (barriers, TMA wait, softmax). MMA per tile: ``faithful`` / ``pipelined`` compute S in
    both consumers (2 x 2 x 64 x TN x DQK) + P V (2 x 64 x TN x DV); ``split_qk`` and ``kv64`` compute S once.
    Triton twin (``triton``): the same tiles through ``pl.dot``; an fp8 latent is decoded at the gather
    (``Cost.dequant`` per element). Then the jnp merge (XLA) and the unpack / poison select."""
    del hw
    dqk, dv = mla_dims(s)
    engine = plan.get("engine", "mosaic")
    tn, bm, splits = plan["block_kv"], plan.get("block_m", 64), plan["splits"]
    rows = s.heads_q * s.q_len
    row_tiles = cdiv(rows, bm)
    P = plan.get("ctas") or row_tiles * splits * s.batch
    keys = max(1.0, min(plan["chunk"], s.kv_len) * s.vis_frac)
    tiles = max(1, math.ceil(keys / tn))
    latent = kv_tokens(s) * dqk * kv_bytes(s)  # every sequence's own length (ragged: their sum)
    ws = s.batch * row_tiles * bm * splits * (dv + 1) * 4
    direct = bool(plan.get("direct"))
    if direct:  # the kernel writes the output (q's dtype) and the LSE itself
        ws = s.batch * row_tiles * bm * (dv * s.in_bytes + 4)
    units = plan.get("units")
    if units:  # work_list: a unit's share of the batch's tiles (+ 1: a piece boundary), one piece per unit and
        # sequence written, and each further piece's restart (the epilogue, the ring refilled, Q reloaded: ~12 us,
        # WL_RESTART_TILES tiles of the chain, docs/mla.md "The work list"); a unit crosses (B - 1) / U sequence
        # boundaries on average, none at equal lengths when the units are a multiple of the batch
        ragged = kv_tokens(s) != s.batch * s.kv_len
        restarts = (s.batch - 1) / units if ragged or units % s.batch else 0.0
        tiles = max(1, math.ceil(kv_tokens(s) * s.vis_frac / tn / units + restarts * WL_RESTART_TILES) + 1)
        splits = max(1, cdiv(units + s.batch - 1, s.batch))  # pieces merged per sequence, on average
        ws = (units + s.batch - 1) * row_tiles * bm * (dv + 1) * 4
    split_qk = bool(getattr(cfg, "split_qk", False) or getattr(cfg, "share_p", False))
    qk = 2 * bm * tn * dqk * (1 if (split_qk or engine != "mosaic") else 2)
    mma = tiles * (qk + 2 * bm * tn * dv)
    common = dict(dram_bytes=latent + s.batch * rows * dqk * s.in_bytes + ws, l2_bytes=(row_tiles - 1) * latent,
                  mma=mma, unit="-")
    if engine == "mosaic":
        cost = "pallas_attn_v12_mla_mosaic"
        if getattr(cfg, "overlap", False):
            cost = "pallas_attn_v12_mla_mosaic_pipelined"
        out = [Launch(names[0], cost, P, 384, 168, int(plan.get("smem_bytes") or 220 * 1024), units=0.0,
                      steps=tiles, note=f"64 heads x {tn}-key latent tiles, {tiles} per CTA, wgmma (3 warpgroups)"
                      + (", S once" if split_qk else ", S in both consumers"), **common)]
    else:
        deq = tiles * tn * dqk if s.kv_dtype else 0.0
        out = [Launch(names[0], "pallas_attn_v12_mla_triton", P, 32 * getattr(cfg, "num_warps", 4), 255,
                      (bm * dqk + tn * dqk * max(1, getattr(cfg, "num_stages", 2) - 1)) * 2, units=0.0, steps=tiles,
                      dequant_elems=deq, note=f"64 heads x {tn}-key latent tiles, pl.dot in 64-column chunks"
                      + (f"; {s.kv_dtype} latent decoded at the gather" if s.kv_dtype else ""), **common)]
    o = s.batch * rows * dv * s.in_bytes
    if units:  # the plan's own launch before the kernel (a few hundred integers)
        out.insert(0, xla_glue(names[4] if len(names) > 4 else PASS_PLAN, s, 8 * s.batch,
                               4 * wl_layout(units, s.batch)["n"],
                               f"work_plan: {units} units' shares of the batch's tiles (one Triton program)"))
    if direct:  # the table check's flag before the launch (B x pages integers)
        table = s.batch * cdiv(s.kv_len, s.page_size or 64) * 4
        out.insert(0, xla_glue("mla_table_flag", s, table, 4 * s.batch, "table_flag: one flag a sequence (XLA)"))
        return out
    if getattr(cfg, "finish", "pallas") == "pallas":
        n_col, dc, sb = finish_grid(s.batch * rows, wl_merge_block(units, s.batch) if units else splits, dv)
        # names follow PASS_NAMES (twin, mosaic, mosaic_gpu, finish, plan): the finish is the fourth (it was
        # names[-1], the plan's name once the plan joined the passes in session 33)
        out.append(merge_launch(names[3] if len(names) > 3 else PASS_FINISH, s.batch * rows * n_col, 4, splits, dc,
                                ws + o, block=sb))
        return out
    out.append(xla_glue("mla_merge_jnp", s, ws, o, f"splitkv.merge_jnp over {splits} split(s) (XLA)"))
    out.append(xla_glue("mla_unpack_poison", s, o, o, "unpack and the bad-table NaN select (XLA)"))
    return out


KERNEL = Kernel(
    name=GEN,
    lowering="mosaic-gpu",
    passes=PASS_NAMES,
    config_cls=MlaTcConfig,
    configs=CONFIGS,
    entries=frozenset({"mla"}),
    dtypes=("float16", "bfloat16"),
    precision={"float16": Precision("fp16", "fp32", "tensor", _TC),
               "bfloat16": Precision("bf16", "fp32", "tensor", _TC)},
    head_dims=tuple(d for d, _ in TEMPLATES),
    gqa=True,
    max_q_len=None,
    mla=mla_forward,
    heuristic=_heuristic,
    plan=_plan,
    launches=launches,
    templates=TEMPLATES,
    latent_precision={"fp8_e4m3": Precision("fp8", "fp32", "tensor", _FP8)},
    latent_q_dtypes={"fp8_e4m3": ("float16", "bfloat16")},
    kv_dequant_ops={"fp8_e4m3": 3.0},
    min_page=1,
    triton_passes=frozenset({PASS_FINISH, PASS_PLAN}),
)
