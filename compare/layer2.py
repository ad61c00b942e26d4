"""Roofline layer 2: a schedule-aware time prediction from a kernel's launch plan (docs/roofline.md).

Layer 1 (``compare.roofline``) bounds a problem by FLOPs / peak, bytes / bandwidth and exps / exp rate and
names the largest; the reference found it names the limiter right and misses the time by up to 450x, because
occupancy, waves, per-program latency, launch cost and L2 live in the schedule (docs/reference.md §3.4). This
module models the schedule, one launch at a time:

* **launches**: the kernels one call runs (a Pallas kernel's declared passes, a CUDA twin's declared kernels,
  and the host-side casts that sit inside the timed call);
* **programs, warps, registers, shared memory** per launch, from the plan (``Kernel.plan``; for a CUDA twin
  ``cuda_ref.launches.plan``: its table row, its split heuristic and the ptxas report);
* **residency**: programs per SM under the sm_90 limits (2048 threads, 64K registers, 228 KB shared memory,
  32 blocks), then ``rounds`` = how many times the busiest SM refills its slots, and ``waves``;
* per launch, the largest of four times, each a named limiter:
    - ``issue``: the busiest SM's programs x work units per program x SM-cycles per unit (the engine's cost);
    - ``latency``: rounds x (serial steps per program x cycles per step + fixed cycles per program) - the
      per-program ("per-CTA") bound; for a streaming loop one step is one tile in flight, so this is Little's
      law: bytes in flight per SM / latency caps the bandwidth a low-occupancy launch can draw;
    - ``dram``: compulsory bytes / HBM bandwidth (a buffer written by an earlier launch and small enough to stay
      in L2 is re-read from L2, not HBM: the **L2 residency switch**);
    - ``l2``: bytes served by L2 (operand re-reads across programs) / L2 bandwidth;
* plus a fixed **launch cost** per launch (ramp-up and drain of a kernel on CUPTI's clock; gaps between
  kernels are not on that clock).

Generation-specific facts (what one program of a launch does: its work units, serial steps and bytes) come from the
kernel, which declares them in the vocabulary both twins share (``attn_core.launches.Launch``): a Pallas kernel in
``Kernel.launches``, a CUDA twin in ``cuda_ref.launches`` (with its registers and shared memory from cuda_ref's ptxas
report). ``_priced`` applies this model's spill threshold and L2 residency rule to what either declares; this module
names no generation.

Constants: ``GLOBAL`` (L2 bandwidth per SM-cycle, L2 residency fraction, launch cost) and one
``Cost(issue, lat, fixed)`` per launch dataflow in ``COSTS``. Every one was fitted once on the H200 run
``results/20261121T092505_nvidia-h200`` (``scripts/fit_layer2.py``) and is frozen; the H100 is scored with
the same numbers (held out). Hardware enters only through ``compare.hardware`` (SMs, clock, HBM bandwidth,
L2 size).

Hooks for the runner: ``predict_record(workload, impl, plan, hardware) -> dict`` (before the kernel runs) and
``score(record) -> dict`` (after).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attn_core.launches import KV_STORAGE_BYTES, SM90, Launch, occupancy

from . import hardware as _hardware
from .hardware import Hardware

__all__ = ["SM90", "Cost", "COSTS", "GLOBAL", "Shape", "Launch", "LaunchTime", "Prediction", "occupancy",
           "time_launch", "launches_for", "predict", "predict_record", "score"]

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------------------------
# Machine limits and constants
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cost:
    """What one unit of a launch's work costs on one SM.

    ``issue``: SM-cycles per work unit when the SM is throughput-bound (the unit is named by the launch
    builder: an FMA, a tensor-core FLOP, a warp-key step ...); ``lat``: cycles per serial step of one program
    (a dependent chain: load -> compute -> next tile); ``fixed``: cycles per program outside the loop
    (prologue loads, epilogue stores); ``key``: cycles per dependent one-key update (the per-key online
    softmax of the paged family's faithful configs), priced on ``Launch.key_steps``."""

    issue: float
    lat: float
    fixed: float = 0.0
    key: float = 0.0  # cycles per serial per-key update inside a step (a launch's ``key_steps``)
    spill: float = 0.0  # extra SM-cycles per spilled work unit (a launch's ``spill_units``, issue side)
    dequant: float = 0.0  # SM-cycles per KV element decoded from a quantized format (a launch's ``dequant_elems``)
    ramp: float = 0.0  # cycles per launch on top of its limiter: the first tiles' fill and the last ones' drain that
    # nothing overlaps in a streaming kernel (session 16: fa_decode's partial)
    dram_loss: float = 0.0  # the share of the run's measured HBM read bandwidth a streaming dataflow does not reach:
    # its DRAM time is bytes / bandwidth * (1 + dram_loss) (session 16: fa_decode's partial)
    sfu_hide: float = 0.0  # the share of a program's MMA cycles under which its exponentials (``Launch.sfu``, at the
    # datasheet SFU rate) run hidden; the rest of the exponentials' time is on its chain (session 22: fa_prefill)


# The special-function unit's rate for ex2 (and the other MUFU ops): 16 a cycle per SM on compute capability 9.0
# (the CUDA programming guide's arithmetic-instruction throughput table), on the H100 and the H200 alike
SFU_PER_CLK_SM = 16.0

# Fitted on the H200 reference run (scripts/fit_layer2.py, issue 16 refit: 19 cost fields + 2 globals, was 25 + 2;
# the merge priced per serial step, not per float); frozen. See docs/roofline.md for what each one buys.
GLOBAL: dict[str, float] = {
    "l2_bytes_per_clk_sm": 35.34,  # L2 -> SM bandwidth per SM per cycle (~10.5 TB/s on 132 SMs at 1.98 GHz)
    "l2_resident_fraction": 0.75,  # a buffer up to this fraction of L2 is still there for the next launch
    "launch_us": 2.017,  # fixed cost of one kernel on the CUPTI clock (ramp-up + drain)
    # issue 16, the paged family: one serial gather step = a block-table read, then the K/V pool reads it
    # addresses (two dependent memory round trips); fitted on the H200 paged run 20261122T174922 (the cuda_ref
    # paged twins), frozen, held out on the H100
    "gather_lat": 1476.0,
}

COSTS: dict[str, Cost] = {
    # --- Pallas (Triton) launches ----------------------------------------------------------------------
    "pallas_attn_v1_naive_qk": Cost(issue=0, lat=0),
    "pallas_attn_v1_naive_pv": Cost(issue=0, lat=0),
    "pallas_attn_row_softmax": Cost(issue=0, lat=0),
    "pallas_attn_v2_tiled_qk": Cost(issue=0.07348, lat=2.925e+04),
    "pallas_attn_v2_tiled_pv": Cost(issue=0, lat=1.183e+04),
    "pallas_attn_v3_online_stats": Cost(issue=0, lat=0),
    "pallas_attn_v3_online_out": Cost(issue=0.08278, lat=3.903e+04),
    "pallas_attn_rows_attend": Cost(issue=0, lat=2738),
    "pallas_attn_v5_wmma_fwd": Cost(issue=0.0006823, lat=2323),
    # fa_decode's partial: a stream at (1 - loss) of the measured HBM read rate plus a fill / drain (``ramp``, at most
    # the stream's own time); the shared merge's per-step latency. Session 16 fit (scripts/fit_layer2.py --only these
    # three) on the 97 latest H100 sweep records of the dense, spec, bf16-quant and paged decode workloads, after the
    # ragged pools were priced at their own lengths (Shape.kv_tokens); in sample median 0.032, worst 0.22 (B1 S1024,
    # 7 us). Before: lat 0 / no ramp / no loss, merge lat 5491 (the H200 reference fit): median 0.095, mean -0.096.
    # The merge's latency fits to ~0 (its launch and bytes are its cost); the generations' scorecards on the s4
    # reference runs are unchanged by it (H100 7% / 56%, H200 6% / 59% median / worst, re-scored)
    "pallas_attn_fa_decode_partial": Cost(issue=0, lat=0, ramp=9056, dram_loss=0.07573),
    "pallas_attn_merge": Cost(issue=0, lat=2.16),
    # issue 16: the paged family's CUDA-core partial (v7_paged, v8_gqa + db/occ/ilp, v8_gqa_ss): issue-bound,
    # SM-cycles per row x key x dim unit (incl. the per-key [R, TN] sweeps); ``spill`` per unit of a plan whose
    # live [R, width, D] product exceeds PAGED_LIVE_VALUES per thread. Fitted on the H200 paged run
    # 20261122T174922 (scripts/fit_layer2.py --only), frozen, held out on the H100
    "pallas_attn_paged_cuda_cores": Cost(issue=0.5698, lat=0, spill=2.273),
    # --- cuda_ref launches -----------------------------------------------------------------------------
    "v1_qk_kernel": Cost(issue=0, lat=0),
    "v1_softmax_kernel": Cost(issue=2.352, lat=0),
    "v1_pv_kernel": Cost(issue=0.8934, lat=0),
    "v2_qk_kernel": Cost(issue=0.3469, lat=0),
    "v2_pv_kernel": Cost(issue=0, lat=0),
    "v3_stats_kernel": Cost(issue=0, lat=0),
    "v3_output_kernel": Cost(issue=1.388, lat=101.4),
    "warp_rows": Cost(issue=14.02, lat=223.3),
    "v5_wmma_kernel": Cost(issue=0.02098, lat=1.827e+04),
    "v6_merge_kernel": Cost(issue=0, lat=0, fixed=6.32e+04),
    # issue 16: cuda v8_gqa_ss's score-stationary group (lane per key): cycles per lane step, D + 32 steps per
    # 32-key group (the D-long dot from shared memory, then 32 broadcast p x V steps); fitted on the H200 paged run
    "v8_gqa_ss_group": Cost(issue=0, lat=84.05),
    # issue 16: the paged twins' merge (kernels/v7_paged.cu), priced by two dependent memory round trips
    # (GLOBAL gather_lat) + the launch; no constant of its own. v6_merge_kernel's fitted 6.3e4 cycles per CTA
    # (~32 us) is what the dense fit needed, not this kernel's physics (docs/roofline.md)
    "paged_merge": Cost(issue=0.0, lat=0.0),
    # --- casts inside the timed call (XLA convert, torch .to(half)) ------------------------------------
    "cast": Cost(issue=0.0, lat=0.0),
    # --- issue 16, every built generation (docs/roofline.md "Quantized KV, MLA, Mosaic prefill") ----------
    # XLA kernels inside the timed call (the MLA kernels' jnp merge, unpack and NaN select): bytes + launch
    "xla_glue": Cost(issue=0.0, lat=0.0),
    # fa_decode on quantized KV: SM-cycles per K/V element decoded, per (format, decode)
    "pallas_attn_fa_decode_fp8_e4m3_cast": Cost(issue=0, lat=1812, dequant=0.04881),
    "pallas_attn_fa_decode_fp8_e4m3_bits": Cost(issue=0, lat=0, dequant=0.1418),
    "pallas_attn_fa_decode_nvfp4_bits": Cost(issue=0, lat=0, dequant=0.1507),
    "pallas_attn_fa_decode_nvfp4_cast": Cost(issue=0, lat=0, dequant=0.1372),
    # session 19: NVFP4 "asm", fitted alone on the H200 quant sweep (call 5; held out: the H100 runs, docs/roofline.md)
    "pallas_attn_fa_decode_nvfp4_asm": Cost(issue=0, lat=0, dequant=0.09512),
    # session 38 (quant_qk16: a bf16 q's scores on the fp16 K tile): first predicted from the instruction ratio (the
    # fitted decode above minus the K tile's bf16 convert: nvfp4 0.08514, fp8 0.03892), then fitted alone
    # (scripts/fit_layer2.py --only these two) on call 1's H200 quant run, results/gpu_runs/
    # 20261129_s38_h200_call1_quant_qk16/; held out: calls 3-4 (docs/quantized_kv.md §13)
    "pallas_attn_fa_decode_nvfp4_asm_qk16": Cost(issue=0, lat=0, dequant=0.08962),
    "pallas_attn_fa_decode_fp8_e4m3_cast_qk16": Cost(issue=0, lat=0, dequant=0.04265),
    # MLA, Pallas: the Mosaic kernel (per-tile latency on top of the MMA at the datasheet rate; fixed per CTA),
    # its pipelined config, the Triton twin (+ fp8 latent decode per element)
    "pallas_attn_v12_mla_mosaic": Cost(issue=0, lat=1568, fixed=1.512e+04),
    "pallas_attn_v12_mla_mosaic_pipelined": Cost(issue=0, lat=2449),
    "pallas_attn_v12_mla_triton": Cost(issue=0, lat=7864, fixed=2.254e+04, dequant=0.09652),
    # fa_prefill (Mosaic): per key tile on top of the MMA, one per dataflow; fixed per CTA and ``key`` per row tile
    # a CTA runs (shared by alias). Refitted in session 11 on 94 named H100 fa_prefill records (the sweep's default /
    # pingpong / serial of session 8, the double-buffered multi-tile configs of session 11; scripts/fit_layer2.py
    # --only these five), after the second Q/O buffer changed what a row tile costs; scored out of sample in
    # docs/roofline.md ("Session 11 refit"). Session 10: lat 799.9 / fixed 8483 / no per-row-tile cost, serial 1099,
    # pingpong 799.5 (before that: lat 533.7 / fixed 1.77e4, serial 1044, pingpong 558.2)
    # Session 22: the softmax's exponentials priced on the SFU (``Launch.sfu``, 16 a cycle) beyond the share of the
    # MMA they hide under (``sfu_hide``, one for the three dataflows); refitted (--only these six) on the 89 priced
    # H100 prefill sweep records of sessions 8, 9, 11, 14 and 15 without a window, packing, soft-cap or sinks (and
    # without c3 at D 128, which spills); held out: the H200's, the features', the training steps' forward
    # (docs/roofline.md "Session 22: the softmax on the SFU"). Before: overlap lat 709.3 / fixed 4018 / key 4636,
    # serial 1092, pingpong 794.2, no SFU term
    "pallas_attn_fa_prefill_overlap": Cost(issue=0, lat=321.4, fixed=3245, key=5083, sfu_hide=0.1984),
    "pallas_attn_fa_prefill_serial": Cost(issue=0, lat=670.5),
    "pallas_attn_fa_prefill_pingpong": Cost(issue=0, lat=300.4),
    # fa_train's forward (Triton): per key block on top of the MMA
    "pallas_attn_fa_train_fwd": Cost(issue=0, lat=2754),
    # fa_prefill_bwd (Mosaic; the train family's backward, session 21): per step on top of the step's MMA, fixed per
    # CTA; one per dataflow (the dK/dV kernel, the dQ kernel, its pipelined dQ, the five-product kernel). Fitted
    # (scripts/fit_layer2.py --only these eight) on 90 H100 records of sessions 8, 14 and session 21 call 4, the rest
    # frozen; scored out of sample on session 21 calls 5-7 and sessions 10-11's training records
    # (docs/roofline.md "Session 21: the train family"). Session 22: refitted on the same 90 records' training steps
    # after the forward's SFU term (was dkdv 1058 / 1004, dq 713.7 / 1.074e4, dq_ovl 1099 / 1.199e4, fused 1868 /
    # 1.041e4); dkdv's fixed cost fits to 0 (not separable from its per-step latency on these records)
    "pallas_attn_fa_prefill_bwd_dkdv": Cost(issue=0, lat=837.5, fixed=0),
    "pallas_attn_fa_prefill_bwd_dq": Cost(issue=0, lat=681.5, fixed=1.292e+04),
    "pallas_attn_fa_prefill_bwd_dq_ovl": Cost(issue=0, lat=1168, fixed=1.279e+04),
    "pallas_attn_fa_prefill_bwd_fused": Cost(issue=0, lat=1646, fixed=1.027e+04),
    # MLA, cuda_ref: v11 (lane per key, cycles per lane step) and v12 (mma.sync, cycles per tile; fp8 convert)
    "v11_mla_group": Cost(issue=0, lat=97.45),
    "v12_mla_tc_mma": Cost(issue=0, lat=8117, dequant=0.4106),
}

# Dataflows with no record in the fit run, priced with the fitted cost of the dataflow they share (no new
# constant; docs/roofline.md "The paged family"). Each field names (COSTS key, field); resolved at use, so a
# refit moves them too.
ALIASES: dict[str, dict[str, tuple[str, str]]] = {
    # v8_gqa_tc (Pallas): per key block two 16-bit dots and one update (v5's Pallas block: MMA FLOP, latency per
    # block); no tensor-core paged record on the fit GPU, so no constant of its own
    "pallas_attn_paged_tc": {"issue": ("pallas_attn_v5_wmma_fwd", "issue"),
                             "lat": ("pallas_attn_v5_wmma_fwd", "lat")},
    # cuda_ref's paged warp-per-row twins (v7_paged, v8_gqa, _db, _occ, _ilp): v4/v6's per-key warp chain
    "paged_warp_rows": {"issue": ("warp_rows", "issue"), "lat": ("warp_rows", "lat")},
    # cuda v8_gqa_tc: v5's WMMA block (one warp, softmax and running O in shared memory)
    "paged_wmma": {"issue": ("v5_wmma_kernel", "issue"), "lat": ("v5_wmma_kernel", "lat")},
    # issue 16: the Mosaic configs share their CTA's prologue / epilogue (Q load, output stores) with the default
    # (and, since session 11, the per-row-tile cost ``key`` on the row tiles a CTA runs)
    # (and, since session 22, the share of the MMA their exponentials hide under: one constant for the three)
    "pallas_attn_fa_prefill_serial": {"lat": ("pallas_attn_fa_prefill_serial", "lat"),
                                      "fixed": ("pallas_attn_fa_prefill_overlap", "fixed"),
                                      "key": ("pallas_attn_fa_prefill_overlap", "key"),
                                      "sfu_hide": ("pallas_attn_fa_prefill_overlap", "sfu_hide")},
    "pallas_attn_fa_prefill_pingpong": {"lat": ("pallas_attn_fa_prefill_pingpong", "lat"),
                                        "fixed": ("pallas_attn_fa_prefill_overlap", "fixed"),
                                        "key": ("pallas_attn_fa_prefill_overlap", "key"),
                                        "sfu_hide": ("pallas_attn_fa_prefill_overlap", "sfu_hide")},
    # fa_decode on quantized KV: one per-tile latency (the decode, the [rows, block_k] softmax step and the dots of
    # one tile in order; hidden under the HBM time at 16-bit KV) shared by the four (format, decode) dataflows
    # Session 18: and the stream's fill / drain and DRAM loss of the 16-bit partial (the same loads, fewer bytes):
    # before, a quantized launch had neither, and the split plans at B1 came out 27-33% fast (call 4's records,
    # docs/quantized_kv.md §8); no new constant
    # NVFP4 "asm" (session 19) has its own dequant constant (COSTS); quant_qk16 (session 38): the two default decodes
    # with their own dequant constant (fitted on call 1), the other decodes priced as without it (no record of them
    # with it)
    **{f"pallas_attn_fa_decode_{f}{qk}": {"lat": ("pallas_attn_fa_decode_fp8_e4m3_cast", "lat"),
                                         "dequant": (f"pallas_attn_fa_decode_{f}" + (qk if f in (
                                             "fp8_e4m3_cast", "nvfp4_asm") else ""), "dequant"),
                                         "ramp": ("pallas_attn_fa_decode_partial", "ramp"),
                                         "dram_loss": ("pallas_attn_fa_decode_partial", "dram_loss")}
       for f in ("fp8_e4m3_cast", "fp8_e4m3_bits", "nvfp4_bits", "nvfp4_cast", "nvfp4_asm") for qk in ("", "_qk16")},
    "pallas_attn_v12_mla_mosaic_pipelined": {"lat": ("pallas_attn_v12_mla_mosaic_pipelined", "lat"),
                                             "fixed": ("pallas_attn_v12_mla_mosaic", "fixed")},
}

# A Triton CUDA-core paged program holds its [R, width, D] FP32 product (width = keys per load) in registers;
# beyond this many values per thread the recorded plans pay a spill price (chosen, not fitted: every 8-warp plan
# on record holds <= 128 and shows no penalty; the 4-warp `tuned` plans hold 256). docs/roofline.md.
PAGED_LIVE_VALUES = 128

def cost_of(name: str, costs: Mapping[str, Cost] | None = None) -> Cost:
    """The ``Cost`` of dataflow ``name`` in ``costs`` (default ``COSTS``), resolving ``ALIASES``."""
    costs = costs or COSTS
    if name in ALIASES:
        return Cost(**{"issue": 0.0, "lat": 0.0,
                       **{f: getattr(costs[src], sf) for f, (src, sf) in ALIASES[name].items()}})
    return costs[name]


# --------------------------------------------------------------------------------------------------------
# Types
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    """The workload as the schedule sees it."""

    batch: int
    heads_q: int
    heads_kv: int
    q_len: int
    kv_len: int
    head_dim: int
    dtype: str = "float16"
    causal: bool = False
    q_offset: int = 0
    page_size: int | None = None
    family: str = ""
    kv_dtype: str | None = None  # quantized KV / latent storage format (None: the workload dtype)
    kv_lora_rank: int | None = None  # MLA: DV, the latent columns that serve as V
    window: int | None = None  # keys a query sees back from itself (the workload's window W, causal side)
    max_doc: int | None = None  # packed documents: the longest document (a row tile sees at most its keys)
    mask_pairs: float | None = None  # visible (query, key) pairs per batch row and head under a window / packing
    kv_tokens: int | None = None  # keys over the batch under ragged lengths (the bytes a decode reads; None: B * Tk)
    softcap: float | None = None  # the logit soft-cap (a tanh per score beside the exponential: twice the SFU work)

    @property
    def bh(self) -> int:
        return self.batch * self.heads_q

    @property
    def in_bytes(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def kv_bytes(self) -> float:
        """Storage bytes per K/V element: fp8 1, NVFP4 one nibble + one E4M3 micro-scale per 16, else the dtype."""
        return KV_STORAGE_BYTES.get(self.kv_dtype or "", float(self.in_bytes))

    @property
    def vis_frac(self) -> float:
        """Fraction of (query, key) pairs a fused kernel visits (causal skips masked tiles; a window or packed
        documents leave ``mask_pairs``)."""
        if self.mask_pairs is not None and self.q_len and self.kv_len:
            return min(1.0, self.mask_pairs / (self.q_len * self.kv_len))
        if not self.causal:
            return 1.0
        from .roofline import visible_pairs

        return visible_pairs(self.q_len, self.kv_len, self.q_offset) / (self.q_len * self.kv_len)

    @classmethod
    def of(cls, w: Any) -> Shape:
        g = (lambda k, d=None: w.get(k, d)) if isinstance(w, Mapping) else (lambda k, d=None: getattr(w, k, d))
        hq = int(g("heads_q"))
        window, max_doc, pairs = g("window"), None, None
        if window is not None or g("packed", False):  # the mask's work, counted as layer 1 counts it
            window, max_doc, pairs = _mask_facts(w)
        return cls(batch=int(g("batch")), heads_q=hq, heads_kv=int(g("heads_kv") or hq), q_len=int(g("q_len")),
                   kv_len=int(g("kv_len")), head_dim=int(g("head_dim")), dtype=str(g("dtype")),
                   causal=bool(g("causal", False)), q_offset=int(g("q_offset", 0) or 0),
                   page_size=g("page_size"), family=str(g("family", "") or ""), kv_dtype=g("kv_dtype"),
                   kv_lora_rank=g("kv_lora_rank"), window=window, max_doc=max_doc, mask_pairs=pairs,
                   kv_tokens=_ragged_tokens(w) if g("ragged", False) else None, softcap=g("softcap"))


def _workload(w: Any) -> Any:
    """A record's workload dict as a ``compare.workloads.Workload`` (a Workload passes through)."""
    from .workloads import Workload

    if isinstance(w, Mapping):
        names = {f.name for f in dataclasses.fields(Workload)}
        return Workload(**{k: v for k, v in w.items() if k in names and k != "model_info"})
    return w


def _ragged_tokens(w: Any) -> int | None:
    """The keys a ragged paged / MLA workload holds over its batch (``compare.interop.kv_lengths``: the lengths are
    fixed by the workload's seed), as layer 1 counts them; None where the workload has no per-sequence lengths."""
    from . import interop

    lens = interop.kv_lengths(_workload(w))
    return int(lens.sum()) if lens is not None else None


def _mask_facts(w: Any) -> tuple[int | None, int | None, float | None]:
    """``(window, longest document, visible pairs per batch row and head)`` of a workload (or a record's workload
    dict) with a window or packed documents, from ``compare.interop.roofline_view`` / ``packed_lengths`` (the
    documents are fixed by the workload's seed)."""
    from . import interop

    w = _workload(w)
    view = interop.roofline_view(w)
    docs = interop.packed_lengths(w)
    max_doc = max(max(row) for row in docs) if docs else None
    return getattr(w, "window", None), max_doc, getattr(view, "mask_pairs", None)


@dataclasses.dataclass(frozen=True)
class LaunchTime:
    launch: Launch
    resident: int  # programs per SM
    occupancy_limit: str  # what capped the residency
    waves: float
    rounds: int
    t_issue: float
    t_latency: float
    t_dram: float
    t_l2: float
    t_launch: float
    limiter: str
    time_s: float

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self.launch)
        d.update({k: getattr(self, k) for k in ("resident", "occupancy_limit", "waves", "rounds", "limiter")})
        for k in ("t_issue", "t_latency", "t_dram", "t_l2", "t_launch", "time_s"):
            d[k.replace("_s", "") + "_us" if k == "time_s" else k + "_us"] = getattr(self, k) * 1e6
        return d


@dataclasses.dataclass(frozen=True)
class Prediction:
    """Layer 2 for one (implementation, workload, hardware): the launches, their times, the total."""

    impl: str
    hardware: str
    launches: tuple[LaunchTime, ...]
    time_s: float
    limiter: str  # the limiter of the launch that takes the longest
    plan: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {"impl": self.impl, "hardware": self.hardware, "time_us": self.time_s * 1e6, "limiter": self.limiter,
                "launches": [lt.as_dict() for lt in self.launches], "plan": dict(self.plan),
                "constants": "compare.layer2 GLOBAL/COSTS, fitted on the H200 run 20261121T092505"}


# --------------------------------------------------------------------------------------------------------
# Residency and the time of one launch
# --------------------------------------------------------------------------------------------------------


def mma_per_clk_sm(hw: Hardware) -> float:
    """16-bit dense tensor-core FLOPs per SM-cycle from the datasheet (3786 on the H100 / H200 SXM at 1.98 GHz), also
    for a ``Hardware`` carrying a run's measured rates: the constants were fitted at the datasheet rate (a re-score
    prices with ``hardware_of``, which takes only the measured HBM bandwidth), and until session 16 the runner's
    before-the-run layer 2 priced the MMA at the measured matmul rate (~762 of 989 TFLOP/s on the H100), 1.3x slower
    than the model it was scored as."""
    sheet = _hardware.HARDWARE.get(hw.key)
    peak = sheet.peak("bf16") if sheet is not None and sheet.num_sm == hw.num_sm else hw.peak("bf16")
    return peak / (hw.num_sm * hw.clock_mhz * 1e6)


def _l2_bw(hw: Hardware) -> float:
    return GLOBAL["l2_bytes_per_clk_sm"] * hw.num_sm * hw.clock_mhz * 1e6


def time_launch(ln: Launch, hw: Hardware, costs: Mapping[str, Cost] | None = None,
                glob: Mapping[str, float] | None = None) -> LaunchTime:
    """The predicted time of one launch: max(issue, latency, dram, l2) + the launch cost."""
    cst = cost_of(ln.cost, costs)
    g = glob or GLOBAL
    clk = hw.clock_mhz * 1e6
    resident, limit = occupancy(ln.threads, ln.regs, ln.smem)
    per_sm = -(-ln.programs // hw.num_sm)  # programs on the busiest SM
    rounds = -(-per_sm // resident)
    # tensor-core work at the datasheet 16-bit MMA rate of one SM (FLOPs per SM-cycle): a physical price, not a
    # fitted one; it is both issue (co-resident programs share the tensor cores) and on each program's serial chain
    # and so is a quantized tile's decode (the program's own threads do it between its loads and its dots)
    mma = ln.mma / mma_per_clk_sm(hw) if ln.mma else 0.0
    # the softmax's exponentials on the special-function unit (SFU_PER_CLK_SM, a datasheet rate), exposed beyond the
    # share of the MMA they hide under (Cost.sfu_hide): at D 64 a tile's exponentials take as long as its wgmmas
    sfu = max(0.0, ln.sfu / SFU_PER_CLK_SM - cst.sfu_hide * mma) if ln.sfu else 0.0
    deq = ln.dequant_elems * cst.dequant
    t_issue = per_sm * (ln.units * cst.issue + ln.spill_units * cst.spill + deq + mma) / clk
    gather = ln.gather_steps * g.get("gather_lat", GLOBAL["gather_lat"]) if ln.gather_steps else 0.0
    t_lat = rounds * (ln.steps * cst.lat + ln.key_steps * cst.key + gather + cst.fixed + mma + sfu + deq) / clk
    t_dram = ln.dram_bytes / hw.hbm_bw * (1.0 + cst.dram_loss)
    t_l2 = ln.l2_bytes / (g["l2_bytes_per_clk_sm"] * hw.num_sm * clk)
    # a streaming kernel's fill and drain: at most as long as its stream (a short kernel never reaches full rate)
    t_launch = g["launch_us"] * 1e-6 + min(cst.ramp / clk, t_dram)
    parts = {"issue": t_issue, "latency": t_lat, "dram": t_dram, "l2": t_l2}
    lim = max(parts, key=parts.__getitem__)
    waves = ln.programs / (resident * hw.num_sm)
    return LaunchTime(ln, resident, limit, waves, rounds, t_issue, t_lat, t_dram, t_l2, t_launch, lim,
                      parts[lim] + t_launch)


# --------------------------------------------------------------------------------------------------------
# Launch builders: what one program of each launch does
# --------------------------------------------------------------------------------------------------------


def _resident_cap(hw: Hardware) -> float:
    return GLOBAL["l2_resident_fraction"] * hw.l2_mb * 1e6


def _split_dram_l2(nbytes: float, buffer_bytes: float, hw: Hardware) -> tuple[float, float]:
    """Re-reads of a buffer an earlier launch wrote: from L2 when it fits, else from HBM."""
    return (0.0, nbytes) if buffer_bytes <= _resident_cap(hw) else (nbytes, 0.0)


def _priced(ln: Launch, hw: Hardware) -> Launch:
    """A declared launch with this model's choices applied: its spilled work (the share of its units whose live fp32
    products per thread exceed ``PAGED_LIVE_VALUES``, from ``live_values``) and where its re-reads come from (L2 when
    the buffer fits the residency cap, else HBM: ``reread_bytes`` of a ``reread_buffer``)."""
    if ln.live_values:
        ln = dataclasses.replace(ln, spill_units=ln.units * max(0.0, 1.0 - PAGED_LIVE_VALUES / ln.live_values))
    if ln.reread_bytes:
        dram, l2 = _split_dram_l2(ln.reread_bytes, ln.reread_buffer, hw)
        ln = dataclasses.replace(ln, dram_bytes=dram + ln.dram_bytes, l2_bytes=l2 + ln.l2_bytes)
    return ln


def _pallas_launches(gen: str, kernel: Any, s: Shape, plan: Mapping[str, Any], hw: Hardware,
                     cfg: Any = None) -> list[Launch]:
    """The launches a Pallas kernel declares (``Kernel.launches``: pallas_attn.kernels.launches), with this model's
    choices applied (``_priced``); layer 2 holds no kernel's facts."""
    if getattr(kernel, "launches", None) is None:
        raise NotImplementedError(f"layer 2 has no launches for the Pallas kernel {kernel.name!r} ({gen}): it declares "
                                  f"none (Kernel.launches)")
    return [_priced(ln, hw) for ln in kernel.launches(s, plan, list(kernel.passes), hw=hw, cfg=cfg)]


def _cuda_launches(gen: str, s: Shape, plan: Mapping[str, Any] | None, hw: Hardware) -> tuple[list[Launch], dict]:
    """The launches a CUDA twin declares (``cuda_ref.launches``) for the plan it runs (the record's, completed by
    the twin's own split heuristic on ``hw``'s SMs), with this model's choices applied (``_priced``)."""
    from cuda_ref import launches as twins

    pl = twins.plan(gen, s, plan, num_sm=hw.num_sm)
    return [_priced(ln, hw) for ln in twins.launches(gen, s, pl)], pl


# --------------------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------------------


def _pallas_problem(s: Shape, entry: str):
    from pallas_attn.kernels.contract import Problem

    if entry == "mla":
        return Problem(entry, s.dtype, s.batch, s.q_len, s.kv_len, s.heads_q, s.heads_kv, s.head_dim, s.causal,
                       s.page_size, kv_dtype=s.kv_dtype, kv_lora_rank=s.kv_lora_rank)
    return Problem(entry, s.dtype, s.batch, s.q_len, s.kv_len, s.heads_q, s.heads_kv, s.head_dim, s.causal,
                   s.page_size, kv_dtype=s.kv_dtype)


def _pallas_config(gen: str, config: Any, s: Shape, entry: str) -> Any:
    """The config object a record's ``pallas:<gen>:<config>`` ran (a row's names map to its kernel's)."""
    from pallas_attn import registry

    k, cfgs = registry.kernel(gen), registry.configs(gen)
    if isinstance(config, str) and config not in cfgs:
        config = k.default_config_name()
    return cfgs[config] if isinstance(config, str) else k.config(config, _pallas_problem(s, entry))


def _pallas_plan(gen: str, config: Any, s: Shape, entry: str = "dense") -> tuple[Any, dict[str, Any]]:
    from pallas_attn import registry

    k = registry.kernel(gen)
    cfgs = registry.configs(gen)
    if isinstance(config, str) and config not in cfgs:
        config = k.default_config_name()  # records of older runs name fa_decode's default 'faithful'
    prob = _pallas_problem(s, entry)
    # a row's config names map to its kernel's (v8_gqa_db's 'faithful' is v8_gqa's 'double_buffered')
    cfg = cfgs[config] if isinstance(config, str) else k.config(config, prob)
    pl = k.plan(prob, cfg)
    if hasattr(pl, "as_dict"):
        pl = pl.as_dict()
    return k, dict(pl)


DROPIN = "pallas:dropin:"  # compare/impls.py: the drop-in's Hopper pair with a named backward config


def train_launches(impl: str, s: Shape, hw: Hardware, plan: Mapping[str, Any] | None) -> tuple[list[Launch], dict]:
    """A train-family record's launches (one ``jax.value_and_grad`` step of the drop-in's Hopper pair): fa_prefill's
    forward at the config the record's plan names (its declared launches, priced as in the prefill family), the
    step's loss (``sum(out * w)``: out and w read), and fa_prefill_bwd's declared backward launches for its config.
    ``pallas:auto`` through the plan its defaults made (``bwd_config``), ``pallas:dropin:<bwd>`` through its own;
    NotImplementedError for any other path (fa_train's backward, the chunked path)."""
    from pallas_attn.kernels import fa_prefill_bwd
    from pallas_attn.kernels.launches import xla_glue

    pl_ = dict(plan or {})
    if impl == AUTO:
        bwd = str(pl_.get("bwd_config") or "")
        if (pl_.get("generation") != "fa_prefill" or bwd not in fa_prefill_bwd.CONFIGS
                or pl_.get("forward_impl") is not None):  # e.g. cuDNN's forward before our backward
            raise NotImplementedError(f"pallas:auto chose {pl_.get('chose')!r}; layer 2 models the train family "
                                      f"through fa_prefill's forward and fa_prefill_bwd only")
        fwd, fplan = pl_.get("config"), pl_.get("kernel_plan")
    elif impl.startswith(DROPIN) and impl[len(DROPIN):] in fa_prefill_bwd.CONFIGS:
        bwd, fwd, fplan = impl[len(DROPIN):], pl_.get("forward_config"), pl_.get("forward")
    else:
        raise NotImplementedError(f"layer 2 models the train family for pallas:auto and pallas:dropin:<config> "
                                  f"(fa_prefill's forward, fa_prefill_bwd), not {impl!r}")
    k, fp = _pallas_plan("fa_prefill", fwd if isinstance(fwd, str) else "default", s)
    if isinstance(fplan, Mapping) and "error" not in fplan and fplan.keys() >= fp.keys():
        fp = dict(fplan)  # the plan made before the run (a window's or the table's config)
    lns = _pallas_launches("fa_prefill", k, s, fp, hw)
    out_bytes = s.batch * s.q_len * s.heads_q * s.head_dim * s.in_bytes
    lns.append(_priced(xla_glue("loss", s, 2 * out_bytes, 4, "the step's loss sum(out * w) in fp32 (XLA)"), hw))
    lns += [_priced(ln, hw) for ln in fa_prefill_bwd.launches(s, fa_prefill_bwd.CONFIGS[bwd], hw)]
    return lns, {"forward_config": fwd, "forward": fp, "backward_config": bwd}


def launches_for(impl: str, s: Shape, hw: Hardware, plan: Mapping[str, Any] | None = None) -> tuple[list[Launch], dict]:
    """The launches of ``impl`` (``pallas:<gen>:<config>`` or ``cuda:<gen>``) on shape ``s`` and the plan used; a
    train-family shape through ``train_launches``."""
    if s.family == "train":
        return train_launches(impl, s, hw, plan)
    parts = impl.split(":")
    fw = parts[0]
    if fw == "pallas":
        gen, config = parts[1], (parts[2] if len(parts) > 2 else None)
        entry = "mla" if s.family == "mla" else "quantized" if s.kv_dtype else "paged" if s.page_size else "dense"
        k, pl = _pallas_plan(gen, config, s, entry)
        if plan and "error" not in plan and plan.keys() >= pl.keys():
            pl = dict(plan)
        return _pallas_launches(gen, k, s, pl, hw, _pallas_config(gen, config, s, entry)), pl
    if fw == "cuda":
        return _cuda_launches(parts[1], s, plan, hw)
    raise NotImplementedError(f"layer 2 models pallas:* and cuda:* implementations, not {impl!r} (peers excluded)")


# the Pallas implementations whose builders read ``Shape.kv_dtype`` (storage bytes, decode work); a CUDA twin says so
# in its declaration (``cuda_ref.launches.reads_kv_dtype``)
QUANT_READERS = re.compile(r"^pallas:(fa_decode|v9_fp8|v10_nvfp4|v11_mla|v12_mla_tc|fa_mla)(:|$)")


def _reads_kv_dtype(impl: str) -> bool:
    if impl.startswith("cuda:"):
        from cuda_ref import launches as twins

        return twins.reads_kv_dtype(impl.split(":")[1])
    return bool(QUANT_READERS.match(impl))


def predict(impl: str, workload: Any, hw: Hardware | str, plan: Mapping[str, Any] | None = None) -> Prediction:
    """Layer 2 for ``impl`` on ``workload`` (a Workload, a record's workload dict or a ``Shape``)."""
    hw = _hardware.get(hw) if isinstance(hw, str) else hw
    s = workload if isinstance(workload, Shape) else Shape.of(workload)
    if s.kv_dtype and not _reads_kv_dtype(impl):  # it would charge a quantized cache at 16-bit bytes
        raise NotImplementedError(f"layer 2 models quantized KV (kv_dtype={s.kv_dtype}) for the kernels that read it "
                                  f"(fa_decode, v9_fp8, v10_nvfp4, the MLA latents), not {impl!r}")
    lns, pl = launches_for(impl, s, hw, plan)
    times = tuple(time_launch(ln, hw) for ln in lns)
    total = sum(t.time_s for t in times)
    worst = max(times, key=lambda t: t.time_s)
    return Prediction(impl, hw.name, times, total, worst.limiter, pl)


def predict_record(workload: Any, impl: Mapping[str, Any] | str, plan: Mapping[str, Any] | None,
                   hw: Hardware) -> dict[str, Any]:
    """The runner hook, made before the kernel runs: ``record["prediction"]["layer2"] = predict_record(...)``.
    Never raises: an implementation layer 2 does not model, or one whose facts are missing here (the ptxas report
    outside a checkout), gets ``{"error": ...}``; a prediction never costs a measurement (DESIGN.md decision 12)."""
    name = impl if isinstance(impl, str) else impl.get("name", "")
    fam = workload.get("family") if isinstance(workload, Mapping) else getattr(workload, "family", "")
    try:
        inner, kplan = resolve(name, plan, fam)
    except NotImplementedError as e:  # auto chose a path layer 2 does not model: the reason, as it reads
        return {"error": str(e), "impl": name}
    try:
        out = predict(inner, workload, hw, kplan).as_dict()
        if inner != name:
            out["via"] = inner
        return out
    except Exception as e:  # noqa: BLE001 -- any failure to predict is a note on the record, never a failed run
        return {"error": f"{type(e).__name__}: {e}", "impl": name}


def resolve(name: str, plan: Mapping[str, Any] | None, family: str) -> tuple[str, Mapping[str, Any] | None]:
    """``resolve_auto`` for every family but train, whose step is the forward and the backward: there auto's plan
    names both and ``train_launches`` reads it as it is."""
    return (name, plan) if family == "train" else resolve_auto(name, plan)


def resolve_auto(name: str, plan: Mapping[str, Any] | None) -> tuple[str, Mapping[str, Any] | None]:
    """``(implementation, plan)`` layer 2 prices for a record: ``pallas:auto`` (the public entry) as the kernel and
    config its defaults chose, with that kernel's plan (its plan made before the run); any other implementation as
    itself. NotImplementedError where auto chose what layer 2 does not model (cuDNN, the chunked path)."""
    if name != AUTO:
        return name, plan
    pl = plan or {}
    gen, cfg = pl.get("generation"), pl.get("config")
    if not gen or not cfg:
        raise NotImplementedError(f"pallas:auto chose {pl.get('chose')!r}, which layer 2 does not model")
    kplan = pl.get("kernel_plan")
    return f"pallas:{gen}:{cfg}", kplan if isinstance(kplan, Mapping) and "error" not in kplan else None


AUTO = "pallas:auto"  # compare/auto.py: its plan names the generation and config the defaults chose


def hardware_of(record_env: Mapping[str, Any], ceilings: Mapping[str, Any] | None = None) -> Hardware | None:
    """The table row of a record's GPU, with the run's measured HBM read bandwidth when the run has it."""
    hw = _hardware.detect(str((record_env or {}).get("gpu", "")))
    if hw is None:
        return None
    bw = ((ceilings or {}).get("measured") or {}).get("hbm_read_Bps")
    return hw.with_measured(hbm_bw=bw) if bw else hw


def score(record: Mapping[str, Any], hw: Hardware | None = None, recompute: bool = False) -> dict[str, Any]:
    """After the run: layer-1 and layer-2 predictions against ``metrics.time_us_p50`` (error = predicted /
    measured - 1, so -0.5 is a prediction twice too fast). Uses the layer 2 the record carries (made before
    the run) unless it carries none (a record from before layer 2) or ``recompute`` asks for the current model
    and constants; a carried ``{"error": ...}`` stays an error (the model of that run could not price it)."""
    m = record.get("metrics") or {}
    meas = m.get("time_us_p50")
    pred = record.get("prediction") or {}
    basis = pred.get(pred.get("basis") or "measured") or pred.get("datasheet") or {}
    l1 = basis.get("floor_us")
    l2 = pred.get("layer2")
    if recompute or not l2:
        hw = hw or hardware_of(record.get("env") or {})
        l2 = predict_record(record["workload"], record["impl"], (record.get("impl") or {}).get("plan"), hw) \
            if hw else {"error": "unknown GPU"}
    out: dict[str, Any] = {"measured_us": meas, "layer1_us": l1, "layer1_limiter": basis.get("limiter"),
                           "layer2_us": l2.get("time_us"), "layer2_limiter": l2.get("limiter"),
                           "layer2_error": l2.get("error")}
    for k in ("layer1", "layer2"):
        p = out[f"{k}_us"]
        out[f"{k}_err"] = (p / meas - 1.0) if (p and meas) else None
    return out


_NAME_RE = re.compile(r"^(pallas|cuda):")


def modelled(impl_name: str) -> bool:
    """Layer 2 covers our own kernels (Pallas generations and CUDA twins), not the peers."""
    return bool(_NAME_RE.match(impl_name))
