"""fa_prefill backward: dQ, dK, dV of dense attention on Hopper (sm_90) through Mosaic GPU; deterministic by
default.

What it is. The backward of ``fa_prefill`` (docs/fa_prefill.md, "Backward"): given Q, K, V, the forward's
output O and natural-log LSE ``[B, Hq, Tq]`` (``fa_prefill.forward(..., return_lse=True)``) and the output
cotangent dO, it returns dQ, dK, dV with the semantics of ``fa_train``'s backward (same recurrences, same
masking rules: top-left causal with a per-sequence offset, key ``j`` visible to query ``i`` iff
``j <= i + q_offset[b]``; a row that sees no key contributes nothing). Three steps, no atomics (every config but
``fused``, below):

* **Preprocess** (XLA, fused): ``delta = rowsum(dO * O)`` in fp32, and ``lse2 = LSE * log2 e`` with ``-inf``
  (a row that sees no key) turned into ``+inf`` so that every ``P`` of that row is ``exp2(x - inf) = 0``
  (never ``-inf - -inf``); NaN stays NaN (NaN in, NaN out).
* **dK/dV kernel** (``pallas_attn_fa_prefill_bwd_dkdv``), grid ``(Tk / 64, Hkv, B)``: one program owns 64 keys
  of one KV head (K and V tiles loaded once by TMA, kept in shared memory) and loops over the G query heads
  of its group (GQA: the sum over the group is a loop inside the program, so it is deterministic and needs no
  reduction afterwards) and over the 64-row query blocks that see its keys. Per block, with the keys as the
  wgmma M dimension: ``S^T = K Q^T`` and ``dP^T = V dO^T`` (two wgmmas, fp32 accumulators), ``P^T =
  exp2(S^T * scale * log2 e - lse2)``, ``dS^T = P^T * (dP^T - delta)``, then ``dV += P^T dO`` and
  ``dK += dS^T Q`` (two wgmmas with the 16-bit ``P^T`` / ``dS^T`` from registers). LSE and delta are column
  vectors here (one per query), loaded in the wgmma layout reduced over rows.
* **dQ kernel** (``pallas_attn_fa_prefill_bwd_dq``), grid ``(Tq / 64, Hq, B)``: the forward's loop order; one
  program owns 64 query rows (Q, dO, lse2, delta loaded once), loops over the visible key blocks: ``S = Q K^T``,
  ``dP = dO V^T``, ``P``, ``dS`` as above (row vectors now), ``dQ += dS K``.

Each kernel is two warpgroups: warpgroup 1, the producer, lowers its register budget and streams the looped
operands by TMA into a ``stages``-deep shared-memory ring (per slot a "loaded" barrier with one arrival per
copy and a "free" barrier the consumer arrives on); warpgroup 0, the consumer, runs the wgmmas and the
elementwise math, waiting for each pair of wgmmas before using their results (no intra-warpgroup overlap yet:
the simple first version). Config ``wide`` (``BwdConfig(wide=True)``): three warpgroups, two consumers of 64
keys (dK/dV) or 64 rows (dQ) each, sharing every streamed tile of the ring (its "free" barrier takes two
arrivals), so a CTA owns 128 keys / rows and the L2 traffic per FLOP halves; a consumer that cannot see a
streamed block (causal) waits for its load and hands the slot back. Config ``wide_ovl`` (``dq_overlap``):
``wide`` with a software-pipelined dQ consumer (step s issues S_s, dP_s and dQ += dS_{s-1} K_{s-1}, forms dS_s
under the last wgmma) and a 3-deep dQ ring; docs/fa_prefill.md, "Config `wide_ovl`". Config ``fused``
(``fused_dq``, the five-product backward; not bit-reproducible in dQ: the drop-in's default where the table says it
is faster, unless determinism is asked): the dK/dV
kernel alone, dQ computed in it from dS^T tiles the two consumers exchange through shared memory and added into a
zeroed fp32 accumulator by TMA reduce-adds (the accumulator is a JAX Ref the kernel reads and writes; jax's discharge
of that Ref renames the CUDA kernel ``new_body``); docs/fa_prefill.md, "The five-product backward".

``attention_lse`` joins ``fa_prefill.forward(..., return_lse=True)`` and ``backward`` in a ``jax.custom_vjp``
(the LSE's cotangent folds into delta): what ``pallas_attn.dot_product_attention`` runs on sm_90.

Causal: key blocks past a query block's diagonal (and query blocks before a key
block's diagonal) are never loaded; only blocks that straddle the diagonal, or hold the ragged end of the keys,
run the masked step. Lengths: Q/dO are padded to 64 rows and K/V to 64 keys only when needed (padded query
rows have ``lse2 = +inf``, so ``P = 0`` there; padded keys are masked). D 64, 128 and 256. At D 256 (config
``d256``, chosen by ``config_for`` whatever config was asked) a consumer owning 64 keys would hold two 64 x 256 fp32
accumulators (256 registers per thread): there the two consumers of a CTA own the same 64 keys / rows and split D
(each holds half of dK and dV, or of dQ, and recomputes the full S and dP); every tile is stored as two 64 x 128
column halves: the head-dim split mode (``_Cols``) of the one ``_build_dkdv`` and the one ``_build_dq``
(docs/fa_prefill.md, "Backward at D 256"). D 256 passed its GPU tests on an H100 (2026-11-23; 0.85x jax cuDNN's
backward non-causal, 0.76x causal: the recompute).

CPU. ``emulate_backward`` runs the same two kernels on jax's Mosaic GPU interpreter (warpgroups as threads;
TMA, barriers and shared memory simulated, uninitialised shared memory NaN, race detection on), with the
wgmma products replaced by ``jnp`` dots on the same shared-memory tiles (the interpreter has no ``run_state``,
no layouts and no transposed wgmma operands). So the CPU checks the ring protocol, the block bounds, the
masks, the GQA loop, the epilogues and the math; it does not check wgmma operand layouts, swizzles,
register budgets or speed (tests/gpu/test_fa_prefill_bwd_gpu.py does, on an H100).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _compat, tuning
from .._compat import pl
from .common import SMEM_LIMIT as _SMEM_LIMIT  # 227 KiB a CTA on sm_90
from .fa_prefill import _block_bounds, _consumer_bounds, _pipeline_plan, _serial_plan
from .launches import Launch, cdiv, xla_glue
from .mosaic_kit import WgmmaOps
from .mosaic_kit import kernel_with_refs as _kernel_with_refs
from .mosaic_kit import pad as _pad
from .mosaic_kit import ring_producer as _ring_producer
from .mosaic_kit import smem_tile as _smem_tile

__all__ = ["BwdConfig", "CONFIGS", "config_for", "heuristic", "effective", "RULE_CONFIG", "NONDET_CONFIG", "backward",
           "emulate_backward", "attention_lse", "smem_bytes", "PASS_NAMES", "launches"]

GEN = "fa_prefill"
# packed documents (segment_ids) in the backward kernels on a GPU: on since tests/gpu/test_fa_prefill_bwd_gpu.py's
# packed case passed on an H100 (session 11, results/sweep/20261127_s11_h100_call1/); a switch to turn them off
PACKED_BWD_ON_GPU = True
PASS_DKDV = f"pallas_attn_{GEN}_bwd_dkdv"
PASS_DQ = f"pallas_attn_{GEN}_bwd_dq"
PASS_NAMES = (PASS_DKDV, PASS_DQ, f"{PASS_DKDV}_mosaic_gpu", f"{PASS_DQ}_mosaic_gpu")
BLOCK = 64  # query rows and keys per tile: one wgmma M tile on either side
HEAD_DIMS = (64, 96, 128, 256)
# D 96 (Phi-3) runs the D 128 kernels on zero-padded columns (``backward``): 4/3 of the work, no kernel of its own
PADDED_HEAD_DIMS = {96: 128}
DTYPES = ("float16", "bfloat16")
_LOG2E = math.log2(math.e)


@dataclasses.dataclass(frozen=True)
class BwdConfig:
    """stages: depth of the shared-memory ring of each kernel's looped operands (Q/dO/lse/delta tiles in the
    dK/dV kernel, K/V tiles in the dQ kernel). wide: two consumer warpgroups per CTA instead of one (dK/dV: 128
    keys per CTA, 64 per consumer; dQ: 128 query rows, 64 per consumer), both reading each streamed tile of the
    ring, so the L2 -> shared-memory traffic per FLOP halves. consumer_regs / producer_regs: per-thread register
    budgets after ``set_max_registers`` (multiples of 8 in [24, 256]); the warpgroups share 504 registers per
    thread slot with three warpgroups (wide: 2 consumer_regs + producer_regs <= 504), 256 with two.
    dq_overlap: software-pipeline the dQ consumer (step s issues S_s = Q K_s^T, dP_s = dO V_s^T and then
    dQ += dS_{s-1} K_{s-1}, waits for S_s and dP_s only, and forms P_s, dS_s while the dQ wgmma runs); a K/V
    slot is then held for two steps, so a 3-deep dQ ring (dq_stages) keeps one load in flight ahead of the
    consumer. dq_stages: depth of the dQ kernel's ring (None: ``stages``); the dK/dV kernel keeps ``stages``.
    dsplit: the head-dim split (D 256; needs ``wide``): the two consumers own the SAME 64 keys (dK/dV) or 64 rows
    (dQ) and split D, consumer w holding the accumulator columns [w D/2, (w + 1) D/2); every tile is stored as
    two column halves (docs/fa_prefill.md, "Backward at D 256").
    fused_dq: the five-product backward (needs ``wide``, not ``dsplit`` / ``dq_overlap``): the dK/dV kernel also
    computes dQ and the dQ kernel does not run. Each step, both consumers put their dS^T tile in shared memory and one
    of them (alternating by step) runs ``dQ = dS K`` over the CTA's 128 keys and adds it into an fp32 dQ accumulator
    in global memory by a TMA reduce-add; so dQ's summation order over the key CTAs varies from run to run (not
    bit-reproducible; dK and dV stay deterministic). docs/fa_prefill.md, "The five-product backward"."""

    stages: int = 2
    consumer_regs: int = 232
    producer_regs: int = 24
    wide: bool = False
    dq_overlap: bool = False
    dq_stages: int | None = None
    dsplit: bool = False
    fused_dq: bool = False

    def __post_init__(self) -> None:
        if self.stages not in (2, 3, 4):
            raise ValueError(f"BwdConfig.stages must be 2, 3 or 4; got {self.stages}")
        if self.dq_stages is not None and self.dq_stages not in (2, 3, 4):
            raise ValueError(f"BwdConfig.dq_stages must be None, 2, 3 or 4; got {self.dq_stages!r}")
        for name in ("wide", "dq_overlap", "dsplit", "fused_dq"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"BwdConfig.{name} must be a bool; got {getattr(self, name)!r}")
        for name in ("consumer_regs", "producer_regs"):
            r = getattr(self, name)
            if not (isinstance(r, int) and 24 <= r <= 256 and r % 8 == 0):
                raise ValueError(f"BwdConfig.{name} must be a multiple of 8 in [24, 256]; got {r!r}")
        if self.wide and 2 * self.consumer_regs + self.producer_regs > 504:
            raise ValueError(f"BwdConfig(wide=True): 2 * consumer_regs + producer_regs must be <= 504 (three "
                             f"warpgroups); got 2 * {self.consumer_regs} + {self.producer_regs}")
        if self.dsplit and (not self.wide or self.dq_overlap):
            raise ValueError("BwdConfig(dsplit=True) needs wide=True (its two consumers split D) and "
                             "dq_overlap=False")
        if self.fused_dq and (not self.wide or self.dsplit or self.dq_overlap):
            raise ValueError("BwdConfig(fused_dq=True) needs wide=True (its two consumers share the dQ products) and "
                             "dsplit=False, dq_overlap=False (there is no dQ kernel)")
        if not self.wide and self.consumer_regs + self.producer_regs > 256:
            raise ValueError(f"BwdConfig: consumer_regs + producer_regs must be <= 256; got "
                             f"{self.consumer_regs} + {self.producer_regs}")

    @property
    def consumers(self) -> int:
        return 2 if self.wide else 1

    @property
    def blocks_per_cta(self) -> int:
        """64-key (dK/dV) or 64-row (dQ) blocks a CTA owns: one per consumer, or one shared by both (dsplit)."""
        return 1 if self.dsplit else self.consumers

    @property
    def dq_ring(self) -> int:
        """Depth of the dQ kernel's K/V ring (``dq_stages``, else ``stages``)."""
        return self.stages if self.dq_stages is None else self.dq_stages


CONFIGS = {
    "default": BwdConfig(),
    "wide": BwdConfig(wide=True, consumer_regs=240, producer_regs=24),
    "wide_s3": BwdConfig(wide=True, stages=3, consumer_regs=240, producer_regs=24),
    # wide + the software-pipelined dQ consumer (docs/fa_prefill.md, "Config `wide_ovl`"); the dK/dV kernel is
    # wide's. _s2: the same with a 2-deep dQ ring (the next load can only start once a step ends).
    "wide_ovl": BwdConfig(wide=True, consumer_regs=240, producer_regs=24, dq_overlap=True, dq_stages=3),
    "wide_ovl_s2": BwdConfig(wide=True, consumer_regs=240, producer_regs=24, dq_overlap=True),
    # D 256 (chosen automatically there, see ``config_for``): two consumers splitting D over one CTA's 64 keys / rows
    "d256": BwdConfig(wide=True, consumer_regs=240, producer_regs=24, dsplit=True),
    # the five-product backward: dQ inside the dK/dV kernel, TMA reduce-adds into fp32 (docs/fa_prefill.md, "The
    # five-product backward"); not bit-reproducible in dQ
    "fused": BwdConfig(wide=True, consumer_regs=240, producer_regs=24, fused_dq=True),
}


def config_for(d: int, cfg: BwdConfig) -> BwdConfig:
    """The config the kernels run at head dim ``d``: at D 256 a config without ``dsplit`` becomes ``"d256"`` (one
    64 x 256 fp32 accumulator pair per consumer would not fit its registers), like ``fa_prefill.fit`` does for
    the forward; other head dims run ``cfg`` as given."""
    if d == 256 and not cfg.dsplit:
        return CONFIGS["d256"]
    return cfg


def effective(problem, cfg: BwdConfig) -> BwdConfig:
    """The config the kernels run on ``problem`` (``Backward.effective``): ``config_for`` at its head dim."""
    return config_for(problem.head_dim, cfg)


# The rule where this GPU's table has no row, by causal: ``wide`` (two consumer warpgroups share each streamed tile)
# and ``wide_ovl`` (wide with the software-pipelined dQ consumer). One H100 run (B4 H16 N4096 D128 fp16,
# docs/fa_prefill.md "Backward"): non-causal wide_ovl 0.92x cuDNN's backward vs wide 0.86x; causal wide 0.90x vs
# wide_ovl 0.88x. (The drop-in's DROPIN_BWD_CONFIG.)
RULE_CONFIG = {False: "wide_ovl", True: "wide"}
# without a table row, unless determinism is asked for: causal D 64 (measured ahead there on an H100,
# docs/fa_prefill.md "The five-product backward, measured"). (The drop-in's NONDET_BWD_CONFIG.)
NONDET_CONFIG = "fused"


def heuristic(problem, deterministic: bool = False) -> str:
    """The backward config's name for ``problem`` when the caller names none (``Backward.heuristic``, which
    ``api.resolve_pair`` asks): this GPU's table (pallas_attn/tuning, made from the model-shape sweep's training steps;
    an H200 without one reads the H100's, ``tuning.table_for``) at the problem's bucket, else ``RULE_CONFIG`` by causal.

    By default the fastest path: the row's config, ``fused`` (dQ by TMA reduce-adds, not bit-reproducible) included;
    without a table ``fused`` at causal D 64, else the rule by causal. ``deterministic``: only configs whose gradients
    are bit-identical run to run: a row whose config is ``fused`` gives its fastest deterministic one, and no table
    gives the rule by causal."""
    names = {n: c for n, c in CONFIGS.items() if not (deterministic and c.fused_dq)}
    name = tuning.choose("fa_prefill_bwd", problem, names=names, fallback_to_row_best=True)
    if name is not None:
        return name
    if not deterministic and problem.causal and problem.head_dim == 64:
        return NONDET_CONFIG
    return RULE_CONFIG[bool(problem.causal)]


def smem_bytes(d: int, itemsize: int, cfg: BwdConfig) -> int:
    """Shared memory of the larger of the two kernels' CTAs (they hold the same tiles, roles swapped): the
    resident tiles (two 64 x D tiles per consumer), ``stages`` slots of two 64 x D tiles, the fp32 lse/delta
    vectors, barriers, scratch. dsplit: one pair of resident 64 x D tiles per CTA (both consumers read them), one
    copy of the vectors per consumer."""
    ring = max(cfg.stages, cfg.dq_ring)
    if cfg.fused_dq:  # one kernel: its ring, two slots of the consumers' dS^T tiles, one fp32 dQ staging tile
        nc = cfg.consumers
        tiles = (2 * nc * BLOCK * d + cfg.stages * 2 * BLOCK * d + 2 * nc * BLOCK * BLOCK) * itemsize
        stage = (cfg.consumers if d <= 64 else 1) * BLOCK * d * 4
        return tiles + stage + 2 * BLOCK * 4 * (cfg.stages + cfg.consumers) + 2700
    if cfg.dsplit:
        return (2 * BLOCK * d + ring * 2 * BLOCK * d) * itemsize + 2 * BLOCK * 4 * (ring + 2) + 2700
    tiles = (2 * cfg.consumers * BLOCK * d + ring * 2 * BLOCK * d) * itemsize
    vecs = 2 * BLOCK * 4 * (ring + cfg.consumers)
    return tiles + vecs + 2700


def launches(s, cfg: BwdConfig, hw=None) -> list[Launch]:
    """The launches of one backward call (priced by ``compare.layer2``, the train family's layer 2; ``s`` a
    ``compare.layer2.Shape``): the XLA preprocess (delta = rowsum(dO O): dO and O read, one fp32 per row written),
    the dK/dV kernel and the dQ kernel, or for ``fused`` the dK/dV kernel with dQ inside plus the accumulator's zeroing
    and its scale-and-cast (XLA). Per program: the steps it runs (dK/dV: one 64-row query block of one head of the
    group against the CTA's keys; dQ: one 64-key block against the CTA's rows; both the mean over the CTAs of the
    visible blocks, the ``vis_frac`` of the grid), the tensor-core FLOPs of its products (dK/dV: S^T, dP^T, dV, dK per
    consumer; fused adds dQ over the CTA's keys; dQ: S, dP, dQ; the D 256 split recomputes S and dP in both
    consumers), the bytes streamed through L2. One fitted latency per step and one fixed cost per program per
    dataflow (``pallas_attn_fa_prefill_bwd_{dkdv, dq, dq_ovl, fused}``); no SFU term (session 22: fitted, the
    exponentials came out wholly hidden under a step's four or five products). ``hw`` is not read."""
    del hw
    d = s.head_dim
    cfg = config_for(d, cfg)
    nc, split = cfg.consumers, cfg.dsplit
    group = s.heads_q // s.heads_kv
    esz = s.in_bytes
    vis = s.vis_frac
    nq, nk = cdiv(s.q_len, BLOCK), cdiv(s.kv_len, BLOCK)
    threads = 128 * (nc + 1)
    regs = 65536 // threads // 8 * 8
    smem = smem_bytes(d, esz, cfg)
    tile = BLOCK * BLOCK * d  # one 64 x 64 x D product's multiply-adds
    q_bytes = s.batch * s.q_len * s.heads_q * d * esz
    kv_b = s.batch * s.kv_len * s.heads_kv * d * esz
    rows = s.batch * s.heads_q * s.q_len
    out = [xla_glue("delta", s, 2 * q_bytes, 4 * rows, "delta = rowsum(dO * O) in fp32 (XLA)")]
    # dK/dV (and fused dQ): a CTA owns 64 * blocks_per_cta keys of one KV head
    keys = BLOCK * cfg.blocks_per_cta
    p_kv = s.batch * s.heads_kv * cdiv(s.kv_len, keys)
    st_kv = group * max(1.0, nq * vis)
    flop_kv = 2 * tile * (2 * 2 + 2 if split else 4 * nc)  # split: S^T, dP^T in full, dV, dK halves in each consumer
    if cfg.fused_dq:
        flop_kv += 2 * tile * nc  # dQ = dS K over the CTA's keys, once a step
    streamed = 2 * BLOCK * d * esz + 2 * BLOCK * 4  # Q and dO tiles, lse2 and delta, per step
    l2_kv = p_kv * st_kv * (streamed + (BLOCK * d * 4 if cfg.fused_dq else 0))  # + the fp32 dQ reduce-add
    name = PASS_DKDV
    out.append(Launch(name, "pallas_attn_fa_prefill_bwd_" + ("fused" if cfg.fused_dq else "dkdv"), p_kv, threads,
                      regs, smem, units=0.0, steps=st_kv, mma=flop_kv * st_kv,
                      dram_bytes=2 * kv_b * 2 + 2 * q_bytes, l2_bytes=l2_kv, unit="-",
                      note=f"{keys} keys a CTA, {st_kv:.1f} query blocks of the group on the mean CTA; wgmma"))
    if cfg.fused_dq:
        acc = rows * d * 4
        out.append(xla_glue("dq_zero", s, 0.0, acc, "the fp32 dQ accumulator zeroed (XLA)"))
        out.append(xla_glue("dq_cast", s, acc, rows * d * esz, "dQ scaled and cast from the fp32 accumulator (XLA)"))
        return out
    rws = BLOCK * cfg.blocks_per_cta
    p_q = s.batch * s.heads_q * cdiv(s.q_len, rws)
    st_q = max(1.0, nk * vis)
    flop_q = 2 * tile * (2 * 2 + 1 if split else 3 * nc)
    out.append(Launch(PASS_DQ, "pallas_attn_fa_prefill_bwd_" + ("dq_ovl" if cfg.dq_overlap else "dq"), p_q, threads,
                      regs, smem, units=0.0, steps=st_q, mma=flop_q * st_q, dram_bytes=2 * kv_b + 3 * q_bytes,
                      l2_bytes=p_q * st_q * 2 * BLOCK * d * esz, unit="-",
                      note=f"{rws} rows a CTA, {st_q:.1f} key blocks on the mean CTA; wgmma"))
    return out


# ------------------------------------------------------------------------------------------------------------
# Shared pieces of the two Mosaic kernels (their register math is the kit's ``WgmmaOps``; ``emulate``: jax's GPU
# interpreter, see the module docstring)
# ------------------------------------------------------------------------------------------------------------


def _query_blocks(j0, off, *, nq: int, tk: int, causal: bool):
    """(lo, full): query blocks of 64 rows that see keys ``[j0, j0 + 64)``: ``[lo, nq)``; of these ``[lo, full)``
    need the mask (they straddle the diagonal, or the key block holds the ragged end ``tk``), ``[full, nq)`` not."""
    ragged = j0 + BLOCK > tk
    if not causal:
        return jnp.int32(0), jnp.where(ragged, nq, 0).astype(jnp.int32)
    # row i sees key j iff j <= i + off: the first row that sees key j0 is j0 - off; every key of the block
    # (up to j0 + 63) is visible to every row of a block starting at i0 >= j0 + 63 - off
    lo = jnp.clip(lax.div(jnp.maximum(j0 - off, 0), BLOCK), 0, nq)
    full = jnp.clip(lax.div(jnp.maximum(j0 + BLOCK - 1 - off, 0) + BLOCK - 1, BLOCK), lo, nq)
    full = jnp.where(ragged, nq, full)
    return lo.astype(jnp.int32), full.astype(jnp.int32)


def _window_query_blocks(j0, off, *, nq: int, tk: int, left: int):
    """Causal with a window of ``left`` keys behind the diagonal (row ``i`` sees ``i + off - left <= j <= i + off``):
    ``(lo, full, full_hi, hi)`` query blocks of 64 rows for keys ``[j0, j0 + 64)``: rows in ``[lo, hi)`` see one of
    them, ``[full, full_hi)`` see all of them (no mask), ``[lo, full)`` and ``[full_hi, hi)`` need the mask. Key ``j``
    is seen up to row ``j + left - off``: its band ends (exclusive) at row ``j + left - off + 1``."""
    return _seg_query_blocks(j0, j0 + left - off + 1, j0 + BLOCK + left - off, nq=nq, tk=tk, off=off)


def _seg_query_blocks(j0, e_first, e_last, *, nq: int, tk: int, off=0):
    """A causal band that ends per key: ``(lo, full, full_hi, hi)`` query blocks of 64 rows for keys ``[j0, j0 + 64)``
    (as ``_window_query_blocks``), where ``e_first`` / ``e_last`` is the row at which key ``j0`` / the block's last key
    stops being seen (exclusive): rows before ``e_first`` see every key of the block (from the diagonal on), rows from
    ``e_last`` on see none. Packed documents (offset 0): the end of the key's document (``segment_ends``); a window:
    the key plus the window (``_window_query_blocks``)."""
    lo, full = _query_blocks(j0, off, nq=nq, tk=tk, causal=True)
    hi = jnp.clip(lax.div(jnp.maximum(e_last, 0) + BLOCK - 1, BLOCK), lo, nq)
    full = jnp.minimum(full, hi)
    full_hi = jnp.clip(lax.div(jnp.maximum(e_first, 0), BLOCK), full, hi)
    full_hi = jnp.where(j0 + BLOCK > tk, full, full_hi)
    return lo, full, full_hi.astype(jnp.int32), hi.astype(jnp.int32)


def segment_ends(starts):
    """int32 ``[B, T]``: for each key ``j``, the end of its document (the first row whose start is after ``j``; T for
    the last document), from the rows' document starts (``fa_prefill.segment_starts``)."""
    t = starts.shape[1]
    idx = lax.broadcasted_iota(jnp.int32, starts.shape, 1)
    # row i starts a document iff starts[i] == i; the end of key j's document is the next such row after j
    nxt = jnp.where((starts == idx) & (idx > 0), idx, t)
    after = lax.cummin(nxt, axis=1, reverse=True)  # after[i] = the first document start at or after row i
    return jnp.concatenate([after[:, 1:], jnp.full((starts.shape[0], 1), t, after.dtype)], axis=1).astype(jnp.int32)


def _p_ds_(sc, dp, lse2, delta, c: float, mask=None, cap_k: float | None = None):
    """``(P, dS)`` of one block in every backward kernel: ``P = exp2(S * c - lse2)`` (``mask``: applied to the scaled
    scores; P is 0 where masked and in rows that see no key, lse2 = +inf) and ``dS = P * (dP - delta)``; the same
    for the transposed blocks of the dK/dV kernels. A soft-cap (``cap_k = scale / cap``, ``c = cap * log2 e``): the
    scores are ``t = tanh(S * cap_k)`` (the forward's units), and dS carries tanh's derivative ``1 - t^2`` (the
    kernels' final multiply by the scale completes the chain rule)."""
    t = None
    if cap_k is not None:
        t = jnp.tanh(sc * cap_k)
        sc = t
    x = sc * c
    if mask is not None:
        x = mask(x)
    p = jnp.exp2(x - lse2)
    ds = p * (dp - delta)
    if t is not None:
        ds = ds * (1.0 - t * t)
    return p, ds


def _visible(x, kpos, qpos, *, tk: int, causal: bool, off, left: int | None, st=None):
    """``x`` where key ``kpos`` is visible to query ``qpos`` (int32 tiles of x's shape), ``-inf`` elsewhere: the mask
    of every block of both kernels (the dK/dV kernel's blocks are transposed: keys are its rows). Visible: ``kpos <
    tk``; causal, ``kpos <= qpos + off``; a window, ``kpos >= qpos + off - left``; ``st`` (packed documents: the
    query's document start), ``kpos >= st``."""
    ok = kpos < tk
    if causal:
        ok = ok & (kpos <= qpos + off)
    if left is not None:
        ok = ok & (kpos >= qpos + (off - left))
    if st is not None:
        ok = ok & (kpos >= st)
    return jnp.where(ok, x, -jnp.inf)


class _Cols:
    """The head-dim mode of both kernels (``BwdConfig.dsplit``; docs/fa_prefill.md, "Backward at D 256").

    Whole (D 64 / 128): every 64 x D tile is one shared-memory tile; each consumer owns its own 64 keys (dK/dV) or
    64 query rows (dQ) and all D columns of their accumulators. Split (D 256, where a 64 x D fp32 accumulator pair
    would not fit a consumer's registers): the two consumers own the SAME 64 keys / rows and split D, consumer ``w``
    holding the accumulator columns ``[w D/2, (w + 1) D/2)`` (dK and dV: 2 x 64 x 128 fp32, 128 registers per thread
    at D 256; dQ: 64). Each computes the full S and dP (the contraction over all of D: the two consumers repeat that
    work), then its half of the output products. Every 64 x D tile lives in shared memory as two 64 x D/2 column
    halves (TMA boxes of the gmem array's minor dim), so each wgmma operand is a whole tile of the D 128 kernels'
    shape: the S / dP products are two wgmmas each (one per half of the contraction). Each consumer loads its half of
    the resident tiles, waits for both halves, and stages its half of the output in its half of a resident tile once
    both consumers are done reading (the "done" barrier)."""

    def __init__(self, split: bool, d: int):
        self.split = split
        self.parts = 2 if split else 1  # shared-memory parts of a 64 x D tile
        self.dh = d // self.parts  # columns of a part: of each consumer's accumulators and output

    def gmem(self, i) -> tuple:
        """The column index of part ``i`` (a Python int, or a consumer's warpgroup index for its own half), to
        append to a ``[b, t, h]`` index of a gmem array: nothing when the tile is whole."""
        return (pl.ds(i * self.dh, self.dh),) if self.split else ()

    def smem(self, i) -> tuple:
        """The index of part ``i`` in a shared-memory tile (after a ring slot's index): nothing when whole."""
        return (i,) if self.split else ()

    def ring(self, ns: int, rows: int) -> tuple:
        """The shape of an ``ns``-slot ring of 64 x D tiles."""
        return (ns, self.parts, rows, self.dh) if self.split else (ns, rows, self.dh)

    def terms(self, a, b, halves) -> list:
        """``a @ b^T`` over all of D as (a, b) pairs of shared-memory refs for ``WgmmaOps.mma2_sum``: one pair, or one
        per column half (``halves``: the traced part indices, ref indices that reach a ``run_state``)."""
        return [(a.at[i], b.at[i]) for i in halves] if self.split else [(a, b)]

    def mine(self, ref, wg):
        """The part of a tile that consumer ``wg``'s output product reads: its column half, or the whole tile."""
        return ref.at[wg] if self.split else ref


def _load_resident(plgpu, copies, bars, wg, nc: int, split: bool) -> None:
    """A consumer loads its resident tiles (``copies``: (gmem ref, shared-memory ref) pairs) on its barrier of
    ``bars`` (one per consumer) and waits; split: for both consumers' barriers, every product contracting over both
    column halves."""
    bar = bars.at[wg] if nc > 1 else bars.at[0]
    for src, dst in copies:
        plgpu.copy_gmem_to_smem(src, dst, bar)
    if split:
        plgpu.barrier_wait(bars.at[0])
        plgpu.barrier_wait(bars.at[1])
    else:
        plgpu.barrier_wait(bar)


@functools.lru_cache(maxsize=64)
def _build_dkdv(b: int, tq_pad: int, tk_pad: int, tk: int, hq: int, hkv: int, d: int, dtype_name: str,
                causal: bool, scale: float, cfg: BwdConfig, emulate: bool = False, left: int | None = None,
                softcap: float | None = None, segments: bool = False):
    """The dK/dV kernel. ``cfg.dsplit`` (D 256) is its head-dim split mode (``_Cols``): a CTA's two consumers
    own the same 64 keys; otherwise each of its ``cfg.consumers`` consumers owns 64 keys of the CTA's. The mode
    switches the tile layout, the resident loads, the S / dP contraction, the CTA's query-block bounds (split: the
    consumers', computed once before the warpgroups fork), the loads skipped for another consumer's keys (none
    split) and the staging of the outputs (split: after the "done" barrier)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    ops = WgmmaOps(emulate)
    dtype = jnp.dtype(dtype_name)
    bq = bk = BLOCK
    ns = cfg.stages
    nc = cfg.consumers  # consumer warpgroups; warpgroup nc is the producer
    split = cfg.dsplit
    cols = _Cols(split, d)
    multi = nc > 1 and not split  # consumers owning different keys: each skips the blocks streamed for the others
    fused = cfg.fused_dq  # dQ here too (the five-product backward): the dS^T exchange and the TMA reduce-adds
    # fp32 dQ staging: one tile per consumer where shared memory has room (D 64); at D 128 one tile, handed on by
    # each reader as soon as its reduce-add has read it (a later hand-off would tie the consumers together again)
    own_stage = fused and d <= 64
    group = hq // hkv
    nq = tq_pad // bq
    c = float(scale) * _LOG2E if softcap is None else float(softcap) * _LOG2E
    _p_ds = functools.partial(_p_ds_, cap_k=None if softcap is None else float(scale) / float(softcap))
    f32 = jnp.float32

    banded = left is not None or segments  # a lower key bound per row: a window, or the row's document start

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, off_ref, *rest):
        if segments:  # float32 [B, Tq_pad] row starts, [B, Tk_pad] key ends (exact below 2^24)
            st_ref, en_ref, *rest = rest
        if fused:  # the fp32 dQ accumulator [B, Tq_pad, Hq, D] (a Ref, zeroed by the caller: read and written)
            acc_ref, *rest = rest
        dk_ref, dv_ref, k_smem, v_smem, q_smem, do_smem, lse_smem, dl_smem, kv_bar, q_bar, q_free, *extra = rest
        st_smem = extra[0] if segments else None
        done = extra[0] if split else None
        if fused:  # dS^T tiles (two slots of one per consumer), one fp32 dQ staging tile, the exchange's barriers
            ds_smem, stage, ds_full, ds_free, stage_free, *rmw = extra[1 if segments else 0:]

        def ends(j):  # the end of key j's document (segments)
            return en_ref[bi, j].astype(jnp.int32)

        def seg_blocks(j):
            return _seg_query_blocks(j, ends(j), ends(j + bk - 1), nq=nq, tk=tk)

        def key_bounds(j):  # (lo, full, full_hi, hi) query blocks of keys [j, j + 64)
            if segments:
                return seg_blocks(j)
            if left is None:
                lo, full = _query_blocks(j, off, nq=nq, tk=tk, causal=causal)
                return lo, full, nq, nq
            return _window_query_blocks(j, off, nq=nq, tk=tk, left=left)

        ji = lax.axis_index("k")
        hk = lax.axis_index("h")
        bi = lax.axis_index("b")
        wg = lax.axis_index("wg")
        halves = (_compat.traced_index(0, wg), _compat.traced_index(1, wg)) if split else None
        off = off_ref[bi] if causal else jnp.int32(0)
        if split:  # both consumers own the CTA's 64 keys: its query blocks are theirs
            j_cta = ji * bk
            bounds = key_bounds(j_cta)
            lo0, hi_last = bounds[0], bounds[3]
        else:
            # the producer streams the query blocks that see the CTA's first 64 keys: a superset of what the
            # later consumers' keys need (their first visible block is at or after this one)
            lo0, _ = _query_blocks(ji * (nc * bk), off, nq=nq, tk=tk, causal=causal)
            # a window / documents: the last consumer's keys are the last any row of the CTA's query range sees
            j_last = ji * (nc * bk) + (nc - 1) * bk
            if segments:  # packed documents: the last consumer's keys' document ends bound the CTA's query range
                hi_last = seg_blocks(j_last)[3]
            else:
                hi_last = nq if left is None else _window_query_blocks(j_last, off, nq=nq, tk=tk, left=left)[3]
        per_head = hi_last - lo0  # query blocks per query head of the group
        n_steps = group * per_head

        @pl.when(wg < nc)
        def _consumer():
            plgpu.set_max_registers(cfg.consumer_regs, action="increase")
            j0 = j_cta if split else ji * (nc * bk) + (wg * bk if nc > 1 else 0)  # this consumer's 64 keys
            keys = pl.ds(j0, bk)
            mine = cols.gmem(wg)  # split: this consumer's column half
            k_mine = k_smem.at[wg] if nc > 1 else k_smem
            v_mine = v_smem.at[wg] if nc > 1 else v_smem
            _load_resident(plgpu, ((k_ref.at[(bi, keys, hk, *mine)], k_mine),
                                   (v_ref.at[(bi, keys, hk, *mine)], v_mine)), kv_bar, wg, nc, split)
            lo, full, full_hi, hi = bounds if split else key_bounds(j0)
            k_all, v_all = (k_smem, v_smem) if split else (k_mine, v_mine)  # the S^T / dP^T operands

            def mask(x, qb, st=None):
                kpos = j0 + ops.iota((bk, bq), 0)  # rows: keys
                qpos = qb * bq + ops.iota((bk, bq), 1)  # columns: queries
                return _visible(x, kpos, qpos, tk=tk, causal=causal, off=off, left=left, st=st)

            def dq_put(s, dst):
                """fused: this consumer's dS^T of step ``s`` into its tile of slot ``s % 2`` once the reader of step
                s - 2 has read that slot (its dQ wgmma done). Two slots let the consumers drift a step apart (one's
                softmax under the other's wgmmas) instead of running in lockstep."""
                slot2 = lax.rem(s, 2)

                @pl.when(s >= 2)
                def _():
                    plgpu.barrier_wait(ds_free.at[slot2])

                ds_smem.at[slot2, wg][...] = dst.astype(dtype)
                plgpu.commit_smem()
                plgpu.barrier_arrive(ds_full.at[slot2])

            def dq_take(s, g, qb):
                """fused: once both dS^T tiles of step ``s`` are in, consumer ``s % nc`` runs ``dQ = dS K`` over the
                CTA's keys (the dS^T tiles transposed, the resident K tiles), frees the slot, waits until its
                staging tile is free (D 64: its own, read by its last reduce-add; D 128: the shared one, handed on
                by the other consumer's reduce-add of step s - 1) and adds dQ into the fp32 accumulator of query
                block ``qb`` of head ``g`` of the group."""
                slot2 = lax.rem(s, 2)
                plgpu.barrier_wait(ds_full.at[slot2])

                @pl.when(lax.rem(s, nc) == wg)
                def _():
                    parts = [_compat.traced_index(i, wg) for i in range(nc)]
                    dq = ops.mma_sum_ta(ops.zeros((bq, d)), [(ds_smem.at[slot2, i], k_smem.at[i]) for i in parts])
                    plgpu.barrier_arrive(ds_free.at[slot2])

                    if own_stage:  # this consumer's last reduce-add has read its staging tile
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
                    else:  # the other consumer's last reduce-add has read the shared one

                        @pl.when(s >= 1)
                        def _():
                            plgpu.barrier_wait(stage_free.at[1 - wg])

                    dst_ref = acc_ref.at[bi, pl.ds(qb * bq, bq), hk * group + g]
                    if emulate:  # the interpreter has no TMA reduction: read, add, write (its CTAs run one at a time)
                        rd, rd_bar = rmw
                        plgpu.copy_gmem_to_smem(dst_ref, rd.at[wg], rd_bar.at[wg])
                        plgpu.barrier_wait(rd_bar.at[wg])
                        dq = dq + rd.at[wg][...]
                    st_tile = stage.at[wg] if own_stage else stage
                    st_tile[...] = dq
                    plgpu.commit_smem()
                    if emulate:
                        plgpu.copy_smem_to_gmem(st_tile, dst_ref)
                    else:
                        plgpu.copy_smem_to_gmem(st_tile, dst_ref, reduction_op="add")
                    if not own_stage:  # hand the shared tile on once read (the other consumer adds next step)
                        plgpu.wait_smem_to_gmem(0, wait_read_only=True)

                        @pl.when(s + 1 < n_steps)
                        def _():
                            plgpu.barrier_arrive(stage_free.at[wg])

            def skip(qb, carry, *, g):
                # a block streamed for an earlier consumer's keys, invisible to ours: wait for its load (every
                # phase of the barrier, in order) and hand the slot back
                s = g * per_head + (qb - lo0)
                slot = lax.rem(s, ns)
                plgpu.barrier_wait(q_bar.at[slot])
                plgpu.barrier_arrive(q_free.at[slot])
                if fused:  # its dS^T is zero; the dQ of the step still runs
                    dq_put(s, ops.zeros((bk, bq), dtype))
                    dq_take(s, g, qb)
                return carry

            def step(qb, carry, *, g, masked: bool):
                dk, dv = carry
                s = g * per_head + (qb - lo0)
                slot = lax.rem(s, ns)
                plgpu.barrier_wait(q_bar.at[slot])
                qs, dos = q_smem.at[slot], do_smem.at[slot]
                st, dpt = ops.mma2_sum(ops.zeros((bk, bq)), cols.terms(k_all, qs, halves),
                                       ops.zeros((bk, bq)), cols.terms(v_all, dos, halves), b_t=True)
                lse2 = ops.bcast(ops.vec(lse_smem.at[slot], 0), (bk, bq), 0)
                delta = ops.bcast(ops.vec(dl_smem.at[slot], 0), (bk, bq), 0)
                starts = None
                if masked and segments:
                    starts = ops.bcast(ops.vec(st_smem.at[slot], 0).astype(jnp.int32), (bk, bq), 0)
                pt, dst = _p_ds(st, dpt, lse2, delta, c,  # P^T, dS^T
                                functools.partial(mask, qb=qb, st=starts) if masked else None)
                if fused:
                    dq_put(s, dst)
                dv, dk = ops.mma2(dv, pt.astype(dtype), cols.mine(dos, wg), dk, dst.astype(dtype), cols.mine(qs, wg),
                                  b_t=False)
                plgpu.barrier_arrive(q_free.at[slot])
                if fused:
                    dq_take(s, g, qb)
                return dk, dv

            def head(g, carry):
                if multi:
                    carry = lax.fori_loop(lo0, lo, functools.partial(skip, g=g), carry)
                carry = lax.fori_loop(lo, full, functools.partial(step, g=g, masked=True), carry)
                carry = lax.fori_loop(full, full_hi, functools.partial(step, g=g, masked=False), carry)
                if not (banded or split):
                    return carry
                # a window / a document: the far edge of the band masked, then the blocks streamed for a later
                # consumer. Split traces the far-edge loop without a band too (empty there: full_hi = hi = nq), as
                # the D 256 program always has
                carry = lax.fori_loop(full_hi, hi, functools.partial(step, g=g, masked=True), carry)
                if multi:
                    carry = lax.fori_loop(hi, hi_last, functools.partial(skip, g=g), carry)
                return carry

            dk, dv = lax.fori_loop(0, group, head, (ops.zeros((bk, cols.dh)), ops.zeros((bk, cols.dh))))
            if fused:  # the last two readers' dQ wgmmas have read both K tiles before they stage dK below (and
                # every phase of the slots' barriers is observed)

                @pl.when(n_steps >= 2)
                def _():
                    plgpu.barrier_wait(ds_free.at[lax.rem(n_steps - 2, 2)])

                @pl.when(n_steps >= 1)
                def _():
                    plgpu.barrier_wait(ds_free.at[lax.rem(n_steps - 1, 2)])

            if split:  # the other consumer reads both halves of K and V until its last (waited) wgmma
                plgpu.barrier_arrive(done.at[0])
                plgpu.barrier_wait(done.at[0])
            # epilogue: K and V were last read by the waited wgmmas above; their tiles stage the outputs
            k_mine[...] = (dk * scale).astype(dtype)
            v_mine[...] = dv.astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(k_mine, dk_ref.at[(bi, keys, hk, *mine)])
            plgpu.copy_smem_to_gmem(v_mine, dv_ref.at[(bi, keys, hk, *mine)])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == nc)
        def _producer():
            plgpu.set_max_registers(cfg.producer_regs, action="decrease")

            def issue(s, slot):  # query block lo0 + s % per_head of the group's head s // per_head
                g = lax.div(s, jnp.maximum(per_head, 1))
                qb = lo0 + lax.rem(s, jnp.maximum(per_head, 1))
                h = hk * group + g
                rows = pl.ds(qb * bq, bq)
                for i in range(cols.parts):
                    part = (slot, *cols.smem(i))
                    plgpu.copy_gmem_to_smem(q_ref.at[(bi, rows, h, *cols.gmem(i))], q_smem.at[part], q_bar.at[slot])
                    plgpu.copy_gmem_to_smem(do_ref.at[(bi, rows, h, *cols.gmem(i))], do_smem.at[part],
                                            q_bar.at[slot])
                plgpu.copy_gmem_to_smem(lse_ref.at[bi, h, rows], lse_smem.at[slot], q_bar.at[slot])
                plgpu.copy_gmem_to_smem(dl_ref.at[bi, h, rows], dl_smem.at[slot], q_bar.at[slot])
                if segments:
                    plgpu.copy_gmem_to_smem(st_ref.at[bi, rows], st_smem.at[slot], q_bar.at[slot])

            _ring_producer(plgpu, n_steps, ns, q_free, issue)

    out_type = (jax.ShapeDtypeStruct((b, tk_pad, hkv, d), dtype), jax.ShapeDtypeStruct((b, tk_pad, hkv, d), dtype))
    resident = (bk, d) if nc == 1 else (nc, bk, cols.dh)  # split: K's and V's column halves, one per consumer
    scratch = [
        _smem_tile(resident, dtype),
        _smem_tile(resident, dtype),
        _smem_tile(cols.ring(ns, bq), dtype),
        _smem_tile(cols.ring(ns, bq), dtype),
        plgpu.SMEM((ns, bq), f32),
        plgpu.SMEM((ns, bq), f32),
        plgpu.Barrier(num_arrivals=2, num_barriers=nc),
        plgpu.Barrier(num_arrivals=2 * cols.parts + (3 if segments else 2), num_barriers=ns),
        plgpu.Barrier(num_arrivals=nc, num_barriers=ns),
        *([plgpu.SMEM((ns, bq), f32)] if segments else []),
        *([plgpu.Barrier(num_arrivals=2, num_barriers=1)] if split else []),  # done
    ]
    if fused:
        scratch += [
            _smem_tile((2, nc, bk, bq), dtype),  # the dS^T exchange: two slots
            (plgpu.SMEM if emulate else _smem_tile)(((nc,) if own_stage else ()) + (bq, d), f32),  # fp32 dQ staging
            plgpu.Barrier(num_arrivals=nc, num_barriers=2),  # ds_full: both dS^T tiles of a slot written
            plgpu.Barrier(num_arrivals=1, num_barriers=2),  # ds_free: the slot's reader is done with it
            plgpu.Barrier(num_arrivals=1, num_barriers=nc),  # stage_free: consumer w's last reduce-add has read it
        ]
        if emulate:  # the read-modify-write's tile and barriers
            scratch += [plgpu.SMEM((nc, bq, d), f32), plgpu.Barrier(num_arrivals=1, num_barriers=nc)]
    return (_kernel_with_refs if fused else plgpu.kernel)(
        body,
        out_type=out_type,
        scratch_types=scratch,
        # reversed at launch: k is CUDA's x, so a wave shares its heads' Q/dO in L2
        grid=(b, hkv, tk_pad // (cfg.blocks_per_cta * bk)),
        grid_names=("b", "h", "k"),
        num_threads=nc + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name=PASS_DKDV,
    )


@functools.lru_cache(maxsize=64)
def _build_dq(b: int, tq_pad: int, tk_pad: int, tk: int, hq: int, hkv: int, d: int, dtype_name: str,
              causal: bool, scale: float, cfg: BwdConfig, emulate: bool = False, left: int | None = None,
              softcap: float | None = None, segments: bool = False):
    """The dQ kernel. ``cfg.dsplit`` (D 256) is its head-dim split mode (``_Cols``): a CTA's two consumers own
    the same 64 query rows; otherwise each of its ``cfg.consumers`` consumers owns 64 rows of the CTA's. The mode
    switches the tile layout, the resident loads, the S / dP contraction, the key-block schedule (split: the serial
    one, computed once before the warpgroups fork, the producer's too), the loads skipped for another consumer's rows
    (none split) and the staging of the output (split: after the "done" barrier)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    ops = WgmmaOps(emulate)
    dtype = jnp.dtype(dtype_name)
    bq = bk = BLOCK
    ns = cfg.dq_ring
    nc = cfg.consumers  # consumer warpgroups; warpgroup nc is the producer
    split = cfg.dsplit
    cols = _Cols(split, d)
    multi = nc > 1 and not split  # consumers owning different rows: each skips the blocks loaded for the others
    group = hq // hkv
    c = float(scale) * _LOG2E if softcap is None else float(softcap) * _LOG2E
    _p_ds = functools.partial(_p_ds_, cap_k=None if softcap is None else float(scale) / float(softcap))
    f32 = jnp.float32

    banded = left is not None or segments  # a lower key bound per row: a window, or the row's document start

    def body(q_ref, k_ref, v_ref, do_ref, lse_ref, dl_ref, off_ref, *rest):
        if segments:  # float32 [B, Tq_pad] row starts (the key ends are the dK/dV kernel's)
            st_ref, _, *rest = rest
        dq_ref, q_all, do_all, lse_all, dl_all, k_smem, v_smem, qd_bar, kv_bar, kv_free, *extra = rest
        st_all = extra[0] if segments else None
        done = extra[0] if split else None
        qi = lax.axis_index("q")
        h = lax.axis_index("h")
        bi = lax.axis_index("b")
        wg = lax.axis_index("wg")
        halves = (_compat.traced_index(0, wg), _compat.traced_index(1, wg)) if split else None
        hk = lax.div(h, group)
        off = off_ref[bi] if causal else jnp.int32(0)

        # a window / documents (causal): fa_prefill's schedule
        def wbounds(r0, off):
            seg = None
            if segments:  # the first and the last row's document starts
                seg = (st_ref[bi, r0].astype(jnp.int32), st_ref[bi, r0 + bq - 1].astype(jnp.int32))
            return _consumer_bounds(r0, off, bq=bq, bkv=bk, tk=tk, hi_off=0, lo_off=left, seg=seg)

        def serial_plan(r0):  # (a, bm, f, n_done): blocks [a, bm) masked, [bm, f) not, [f, n_done) masked
            if banded:
                a, n_lfull, n_full, n_done = wbounds(r0, off)
                return (a, *_serial_plan(a, n_lfull, n_full, n_done, banded=True), n_done)
            _, _, n_full, n_total = _block_bounds(r0, off, bq=bq, bkv=bk, tk=tk, hi_off=0 if causal else None)
            return 0, 0, n_full, n_total

        if split:  # both consumers own the CTA's 64 rows: their schedule is the CTA's (the serial one)
            r_cta = qi * bq
            plan = serial_plan(r_cta)
            a_p, n_load = plan[0], plan[3]
        else:
            # the producer loads the key blocks the CTA's last 64 rows see: a superset of the earlier rows' blocks
            *_, n_load = _block_bounds(qi * (nc * bq) + (nc - 1) * bq, off, bq=bq, bkv=bk, tk=tk,
                                       hi_off=0 if causal else None)
            # a window / documents: blocks [a_p, n_load), from the first consumer's first block
            if banded:
                a_p, n_load = wbounds(qi * (nc * bq), off)[0], wbounds(qi * (nc * bq) + (nc - 1) * bq, off)[3]
            else:
                a_p = 0

        @pl.when(wg < nc)
        def _consumer():
            plgpu.set_max_registers(cfg.consumer_regs, action="increase")
            if split:
                r0 = r_cta
            else:
                r0 = qi * (nc * bq) + (wg * bq if nc > 1 else 0)  # this consumer's 64 rows
                _, _, n_full, n_total = _block_bounds(r0, off, bq=bq, bkv=bk, tk=tk, hi_off=0 if causal else None)
            mine = cols.gmem(wg)  # split: this consumer's column half
            q_smem, do_smem = (q_all.at[wg], do_all.at[wg]) if nc > 1 else (q_all, do_all)
            lse_smem, dl_smem = (lse_all.at[wg], dl_all.at[wg]) if nc > 1 else (lse_all, dl_all)  # split: a copy each
            rows = pl.ds(r0, bq)
            copies = [(q_ref.at[(bi, rows, h, *mine)], q_smem), (do_ref.at[(bi, rows, h, *mine)], do_smem),
                      (lse_ref.at[bi, h, rows], lse_smem), (dl_ref.at[bi, h, rows], dl_smem)]
            if segments:
                st_smem = st_all.at[wg] if nc > 1 else st_all
                copies.append((st_ref.at[bi, rows], st_smem))
            _load_resident(plgpu, copies, qd_bar, wg, nc, split)
            q_op, do_op = (q_all, do_all) if split else (q_smem, do_smem)  # the S / dP operands
            lse2 = ops.bcast(ops.vec(lse_smem, 1), (bq, bk), 1)
            delta = ops.bcast(ops.vec(dl_smem, 1), (bq, bk), 1)
            starts = ops.bcast(ops.vec(st_smem, 1).astype(jnp.int32), (bq, bk), 1) if segments else None

            def mask(x, s):
                qpos = r0 + ops.iota((bq, bk), 0)
                kpos = s * bk + ops.iota((bq, bk), 1)
                return _visible(x, kpos, qpos, tk=tk, causal=causal, off=off, left=left, st=starts)

            def slot_of(s):  # block s of the producer's [a_p, n_load)
                return lax.rem(s - a_p, ns)

            def _skip_blocks(lo, hi):  # blocks loaded for another consumer's rows only: wait for each, hand it back
                @pl.loop(lo, hi)
                def _skip(s):
                    slot = slot_of(s)
                    plgpu.barrier_wait(kv_bar.at[slot])
                    plgpu.barrier_arrive(kv_free.at[slot])

            def s_dp(slot):  # S = Q K^T and dP = dO V^T with the K / V tiles of ring slot ``slot``
                return ops.mma2_sum(ops.zeros((bq, bk)), cols.terms(q_op, k_smem.at[slot], halves),
                                    ops.zeros((bq, bk)), cols.terms(do_op, v_smem.at[slot], halves), b_t=True)

            def step(s, dq, *, masked: bool):
                slot = slot_of(s)
                plgpu.barrier_wait(kv_bar.at[slot])
                sc, dp = s_dp(slot)
                _, ds = _p_ds(sc, dp, lse2, delta, c, functools.partial(mask, s=s) if masked else None)
                dq = ops.mma(ds.astype(dtype), cols.mine(k_smem.at[slot], wg), acc=dq)
                plgpu.barrier_arrive(kv_free.at[slot])
                return dq

            def serial(a, bm, f, n_done, *, banded: bool):  # fa_prefill's serial schedule (a window's band masked)
                dq = ops.zeros((bq, cols.dh))
                if banded:
                    dq = lax.fori_loop(a, bm, functools.partial(step, masked=True), dq)
                dq = lax.fori_loop(bm, f, functools.partial(step, masked=False), dq)
                return lax.fori_loop(f, n_done, functools.partial(step, masked=True), dq)

            def ds_of(s, *, masked: bool):
                def f(sc, dp):
                    _, ds = _p_ds(sc, dp, lse2, delta, c, functools.partial(mask, s=s) if masked else None)
                    return ds.astype(dtype)

                return f

            def ostep(s, carry):
                # pipelined (an unmasked block): S_s, dP_s and dQ += dS_{s-1} K_{s-1} issued together; dS_s formed
                # under the last
                dq, ds_prev = carry
                slot, prev = slot_of(s), slot_of(s - 1)
                plgpu.barrier_wait(kv_bar.at[slot])
                dq, ds = ops.mma2_under(dq, ds_prev, k_smem.at[prev], q_smem, k_smem.at[slot], do_smem,
                                        v_smem.at[slot], ds_of(s, masked=False))
                plgpu.barrier_arrive(kv_free.at[prev])  # K_{s-1} was read by the waited dQ wgmma
                return dq, ds

            if split:  # the schedule computed before the fork (serial: dsplit excludes dq_overlap)
                dq = serial(*plan, banded=banded)
            elif banded:
                # a window / a document: fa_prefill's schedule (its left band and right edge masked, serial; the band
                # pipelined)
                a, n_lfull, n_full, n_done = wbounds(r0, off)
                if multi:
                    _skip_blocks(a_p, a)
                if not cfg.dq_overlap:
                    dq = serial(a, *_serial_plan(a, n_lfull, n_full, n_done, banded=True), n_done, banded=True)
                else:
                    bm, _, lo = _pipeline_plan(a, n_lfull, n_full, n_done, banded=True)
                    dq = lax.fori_loop(a, bm, functools.partial(step, masked=True), ops.zeros((bq, d)))
                    slot0 = slot_of(bm)
                    plgpu.barrier_wait(kv_bar.at[slot0])
                    sc, dp = s_dp(slot0)
                    ds0 = ds_of(bm, masked=True)(sc, dp)  # the prologue is always masked (exact for any block)
                    dq, ds_last = lax.fori_loop(bm + 1, lo, ostep, (dq, ds0))
                    last = slot_of(lo - 1)
                    dq = ops.mma(ds_last, k_smem.at[last], acc=dq)
                    plgpu.barrier_arrive(kv_free.at[last])
                    dq = lax.fori_loop(lo, n_done, functools.partial(step, masked=True), dq)
                n_total = n_done
            elif not cfg.dq_overlap:
                dq = serial(0, 0, n_full, n_total, banded=False)
            else:
                dq = None  # staged in the Q tile inside the pipelined branch

                @pl.when(n_total > 0)
                def _pipelined():
                    # prologue: block 0 (always masked: the mask is exact for any block), its slot kept for
                    # dQ += dS_0 K_0 in the next step; epilogue: the last dS K alone
                    slot0 = _compat.traced_index(0, n_total)  # a ref index inside run_state
                    plgpu.barrier_wait(kv_bar.at[slot0])
                    sc, dp = s_dp(slot0)
                    ds0 = ds_of(0, masked=True)(sc, dp)
                    # the pipeline runs the unmasked blocks [1, lo) and drains with the last dS K; the masked blocks
                    # [lo, n_total) then run as serial steps (masking under an in-flight wgmma made ptxas serialize
                    # the forward's wgmmas: docs/fa_prefill.md "The causal pipeline")
                    lo = jnp.clip(n_full, 1, n_total)
                    dq, ds_last = lax.fori_loop(1, lo, ostep, (ops.zeros((bq, d)), ds0))
                    last = lax.rem(lo - 1, ns)
                    dq = ops.mma(ds_last, k_smem.at[last], acc=dq)
                    plgpu.barrier_arrive(kv_free.at[last])
                    dq = lax.fori_loop(lo, n_total, functools.partial(step, masked=True), dq)
                    q_smem[...] = (dq * scale).astype(dtype)  # Q was last read by the waited wgmmas

                @pl.when(n_total == 0)
                def _no_key():  # rows that see no key (causal, negative offset): dQ = 0
                    q_smem[...] = ops.zeros((bq, d)).astype(dtype)

            if multi:  # key blocks loaded for a later consumer's rows only: wait for each load, hand it back
                _skip_blocks(n_total, n_load)
            if split:  # the other consumer reads both halves of Q and dO until its last (waited) wgmma
                plgpu.barrier_arrive(done.at[0])
                plgpu.barrier_wait(done.at[0])

            if dq is not None:  # epilogue: Q was last read by the waited wgmmas; its tile stages dQ
                q_smem[...] = (dq * scale).astype(dtype)
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[(bi, rows, h, *mine)])
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == nc)
        def _producer():
            plgpu.set_max_registers(cfg.producer_regs, action="decrease")

            def issue(s, slot):  # key block a_p + s
                keys = pl.ds((a_p + s) * bk, bk)
                for i in range(cols.parts):
                    part = (slot, *cols.smem(i))
                    plgpu.copy_gmem_to_smem(k_ref.at[(bi, keys, hk, *cols.gmem(i))], k_smem.at[part], kv_bar.at[slot])
                    plgpu.copy_gmem_to_smem(v_ref.at[(bi, keys, hk, *cols.gmem(i))], v_smem.at[part], kv_bar.at[slot])

            _ring_producer(plgpu, n_load - a_p, ns, kv_free, issue)

    resident = (bq, d) if nc == 1 else (nc, bq, cols.dh)  # split: Q's and dO's column halves, one per consumer
    vec = (bq,) if nc == 1 else (nc, bq)
    scratch = [
        _smem_tile(resident, dtype),
        _smem_tile(resident, dtype),
        plgpu.SMEM(vec, f32),
        plgpu.SMEM(vec, f32),
        _smem_tile(cols.ring(ns, bk), dtype),
        _smem_tile(cols.ring(ns, bk), dtype),
        plgpu.Barrier(num_arrivals=5 if segments else 4, num_barriers=nc),
        plgpu.Barrier(num_arrivals=2 * cols.parts, num_barriers=ns),
        plgpu.Barrier(num_arrivals=nc, num_barriers=ns),
        *([plgpu.SMEM(vec, f32)] if segments else []),
        *([plgpu.Barrier(num_arrivals=2, num_barriers=1)] if split else []),  # done
    ]
    return plgpu.kernel(
        body,
        out_type=jax.ShapeDtypeStruct((b, tq_pad, hq, d), dtype),
        scratch_types=scratch,
        # reversed at launch: q is CUDA's x, so a wave shares its heads' K/V in L2
        grid=(b, hq, tq_pad // (cfg.blocks_per_cta * bq)),
        grid_names=("b", "h", "q"),
        num_threads=nc + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(approx_math=True),
        kernel_name=PASS_DQ,
    )


# ------------------------------------------------------------------------------------------------------------
# Entry
# ------------------------------------------------------------------------------------------------------------


def _check(q, k, v, o, lse, do) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"{GEN} backward: expected q [B, Tq, Hq, D] and k, v [B, Tk, Hkv, D]; got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    if o.shape != q.shape or do.shape != q.shape:
        raise ValueError(f"{GEN} backward: o and do must have q's shape {q.shape}; got {o.shape}, {do.shape}")
    b, tq, hq, d = q.shape
    if lse.shape != (b, hq, tq) or lse.dtype != jnp.float32:
        raise ValueError(f"{GEN} backward: lse must be float32 [B, Hq, Tq] = {(b, hq, tq)}; got {lse.dtype} "
                         f"{lse.shape}")
    if not (q.dtype == k.dtype == v.dtype == o.dtype == do.dtype) or q.dtype.name not in DTYPES:
        raise ValueError(f"{GEN} backward: q, k, v, o, do must share one dtype in {DTYPES}; got {q.dtype}, "
                         f"{k.dtype}, {v.dtype}, {o.dtype}, {do.dtype}")
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"{GEN} backward: k must share q's batch and head dim; got {q.shape}, {k.shape}")
    if d not in HEAD_DIMS:
        raise NotImplementedError(f"{GEN} backward: head dim {d} not supported (D in {HEAD_DIMS}): use fa_train's "
                                  f"backward")
    if hq % k.shape[2]:
        raise ValueError(f"{GEN} backward: Hq must be a multiple of Hkv; got {hq}, {k.shape[2]}")
    if k.shape[1] < 1 or tq < 1:
        raise ValueError(f"{GEN} backward: needs Tq >= 1 and Tk >= 1; got {tq}, {k.shape[1]}")


def _prepare(q, k, v, o, lse, do, q_offset, dlse=None, *, rows: int = BLOCK, keys: int = BLOCK):
    """Pad to whole 64-row / 64-key tiles; delta and lse2 (fp32 [B, Hq, Tq_pad]). ``dlse`` (the LSE's
    cotangent, fp32 [B, Hq, Tq] or None) folds into delta: ``dS = P (dP - delta)`` then covers both outputs."""
    b, tq = q.shape[:2]
    f32 = jnp.float32
    delta = jnp.einsum("bthd,bthd->bht", do.astype(f32), o.astype(f32), precision=lax.Precision.HIGHEST)
    if dlse is not None:
        delta = delta - dlse.astype(f32)
    lse2 = jnp.where(lse == -jnp.inf, jnp.inf, lse * _LOG2E)  # no visible key: P = exp2(x - inf) = 0
    extra = -tq % rows
    if extra:
        lse2 = jnp.pad(lse2, ((0, 0), (0, 0), (0, extra)), constant_values=jnp.inf)
        delta = jnp.pad(delta, ((0, 0), (0, 0), (0, extra)))
    off = jnp.asarray(q_offset, jnp.int32).reshape((b,))
    return (_pad(q, 1, rows), _pad(k, 1, keys), _pad(v, 1, keys), _pad(do, 1, rows), lse2, delta, off)


def _run(q, k, v, o, lse, do, q_offset, *, causal: bool, scale: float, cfg: BwdConfig, emulate: bool, dlse=None,
         left: int | None = None, softcap: float | None = None, segment_ids=None):
    _check(q, k, v, o, lse, do)
    b, tq, hq, d = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    cfg = config_for(d, cfg)
    if cfg.dsplit and d % 128:
        raise ValueError(f"{GEN} backward: a dsplit config needs D a multiple of 128 (halves of 64 columns or "
                         f"more); got D={d}")
    if dlse is not None and (dlse.shape != lse.shape or not jnp.issubdtype(dlse.dtype, jnp.floating)):
        raise ValueError(f"{GEN} backward: dlse must be a float array of lse's shape {lse.shape}; got {dlse.dtype} "
                         f"{dlse.shape}")
    # wide: the dK/dV CTA owns 128 keys, the dQ CTA 128 query rows (padded keys are masked; padded rows have
    # lse2 = +inf, so P = 0 there)
    tile = BLOCK * cfg.blocks_per_cta
    qp, kp, vp, dop, lse2, delta, off = _prepare(q, k, v, o, lse, do, q_offset, dlse, rows=tile, keys=tile)
    args = (b, qp.shape[1], kp.shape[1], tk, hq, hkv, d, q.dtype.name, bool(causal), float(scale), cfg, emulate)
    if left is not None and not causal:
        raise NotImplementedError(f"{GEN} backward: a window is built for causal attention only (row i sees "
                                  f"i + off - left <= j <= i + off); got causal={causal}")
    if softcap is not None and not (float(softcap) > 0 and math.isfinite(float(softcap))):
        raise ValueError(f"{GEN} backward: softcap must be a positive finite number; got {softcap!r}")
    kw = dict(left=None if left is None else int(left), softcap=None if softcap is None else float(softcap))
    seg = ()
    if segment_ids is not None:
        from . import fa_prefill

        if cfg.dsplit:
            raise NotImplementedError(f"{GEN} backward: packed documents (segment_ids) are built in the D <= 128 "
                                      f"kernels only, not the D 256 split ones; got D={d}")
        if left is not None or not causal or tq != tk:
            raise NotImplementedError(f"{GEN} backward: segment_ids need causal self-attention (Tq == Tk) without "
                                      f"a window; got causal={causal}, Tq={tq}, Tk={tk}, window={left}")
        sids = jnp.asarray(segment_ids)
        if sids.shape != (b, tq) or not jnp.issubdtype(sids.dtype, jnp.integer):
            raise ValueError(f"{GEN} backward: segment_ids must be int [B, Tq] = [{b}, {tq}]; got {sids.shape} "
                             f"{sids.dtype}")
        if tq >= 1 << 24:
            raise ValueError(f"{GEN} backward: segment_ids carry float32 positions, exact below 2^24 tokens")
        starts = fa_prefill.segment_starts(sids)
        ends = segment_ends(starts)
        edge = functools.partial(jnp.pad, mode="edge")
        seg = (edge(starts, ((0, 0), (0, qp.shape[1] - tq))).astype(jnp.float32),
               edge(ends, ((0, 0), (0, kp.shape[1] - tk))).astype(jnp.float32))
        kw["segments"] = True
    if cfg.fused_dq:  # one kernel; dQ summed into a zeroed fp32 accumulator
        dq, dk, dv = _fused_call(_build_dkdv(*args, **kw), qp, kp, vp, dop, lse2, delta, off, *seg)
        return (dq[:, :tq] * scale).astype(q.dtype), dk[:, :tk], dv[:, :tk]
    dk, dv = _build_dkdv(*args, **kw)(qp, kp, vp, dop, lse2, delta, off, *seg)
    dq = _build_dq(*args, **kw)(qp, kp, vp, dop, lse2, delta, off, *seg)
    return dq[:, :tq], dk[:, :tk], dv[:, :tk]


@functools.partial(jax.jit, static_argnums=0)
def _fused_call(kernel, *operands):
    """``(dq, dk, dv)`` of a ``fused_dq`` dK/dV kernel: dQ (fp32, unscaled) summed by the kernel into a zeroed
    accumulator it reads and writes (a global-memory Ref; jitted, as such a Ref lives inside a ``jit`` only)."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    acc = jax.new_ref(jnp.zeros(operands[0].shape, jnp.float32), memory_space=plgpu.GMEM)
    dk, dv = kernel(*operands, acc)
    return acc[...], dk, dv


def backward(q, k, v, o, lse, do, *, causal: bool, scale: float, q_offset=None, config: BwdConfig | None = None,
             interpret: bool = False, dlse=None, window: int | None = None, softcap: float | None = None,
             segment_ids=None):
    """``(dq, dk, dv)`` of ``fa_prefill``'s attention for the output cotangent ``do`` (BTNH arrays; ``o`` and the
    natural-log ``lse`` [B, Hq, Tq] fp32 from ``fa_prefill.forward(..., return_lse=True)``). ``dlse``: the
    cotangent of the LSE output (``[B, Hq, Tq]``, or None for zero). Deterministic: no atomics; GQA's dK/dV
    summed over the group in a fixed order. ``interpret``: run the same kernels on jax's Mosaic GPU interpreter
    (CPU; wgmma products as jnp dots; slow, small shapes only). ``window``: ``left`` of a causal window (row ``i``
    sees ``i + off - left <= j <= i + off``, fa_prefill's ``window=(left, 0)``),
    in every kernel (the D 256 split kernels too); GPU-tested (tests/gpu/test_fa_prefill_bwd_gpu.py, session 10).
    ``softcap``: the forward's logit soft-cap (dS through tanh's derivative); GPU-tested the same way.
    Sinks need no kernel change: their gradient is ``sinks_grad``, and dS is the same given the forward's LSE.
    ``segment_ids`` int ``[B, T]`` (packed documents, causal self-attention, offset 0, no window; D <= 128): each row
    sees ``start[i] <= j <= i`` (fa_prefill's forward with the same ids); the dK/dV kernel's query band per key tile
    ends at the tile's documents' ends, the dQ kernel runs the forward's schedule. Interpreter- and GPU-tested (H100);
    refused on a GPU while ``PACKED_BWD_ON_GPU`` is off."""
    cfg = CONFIGS["default"] if config is None else config
    if not isinstance(cfg, BwdConfig):
        raise ValueError(f"{GEN} backward: config must be a BwdConfig; got {cfg!r}")
    d = q.shape[-1]
    if d in PADDED_HEAD_DIMS:  # zero columns change no score, no P and no dP; their dQ / dK / dV columns are 0
        padc = functools.partial(_pad, axis=-1, mult=PADDED_HEAD_DIMS[d])  # 96 -> 128: mosaic_kit.pad
        if o.shape != q.shape or do.shape != q.shape or k.shape[-1] != d or v.shape != k.shape:
            _check(q, k, v, o, lse, do)  # the unpadded shapes' own message
        dq, dk, dv = backward(padc(q), padc(k), padc(v), padc(o), lse, padc(do), causal=causal, scale=scale,
                              q_offset=q_offset, config=config, interpret=interpret, dlse=dlse, window=window,
                              softcap=softcap, segment_ids=segment_ids)
        return dq[..., :d], dk[..., :d], dv[..., :d]
    if q_offset is None:
        q_offset = jnp.zeros((q.shape[0],), jnp.int32)
    if not interpret:
        need = smem_bytes(q.shape[-1], jnp.dtype(q.dtype).itemsize, config_for(q.shape[-1], cfg))
        if need > _SMEM_LIMIT:
            raise ValueError(f"{GEN} backward: config {cfg} needs {need} bytes of shared memory (limit "
                             f"{_SMEM_LIMIT}); use fewer stages")
        if segment_ids is not None and not PACKED_BWD_ON_GPU:
            raise NotImplementedError(f"{GEN} backward: packed documents (segment_ids) have not run on a GPU yet "
                                      f"(fa_prefill_bwd.PACKED_BWD_ON_GPU is off; docs/fa_prefill.md)")
        return _run(q, k, v, o, lse, do, q_offset, causal=causal, scale=scale, cfg=cfg, emulate=False, dlse=dlse,
                    left=window, softcap=softcap, segment_ids=segment_ids)
    # the same kernels on the GPU interpreter, traced under its mode (so this composes with jit / grad /
    # vmap; emulate_backward is the eager variant that also reports races)
    gpu_interpret, _ = _interpreter()
    with gpu_interpret.force_gpu_interpret_mode(gpu_interpret.InterpretGPUParams(detect_races=False)):
        return _run(q, k, v, o, lse, do, q_offset, causal=causal, scale=float(scale), cfg=cfg, emulate=True,
                    dlse=dlse, left=window, softcap=softcap, segment_ids=segment_ids)


def _interpreter():
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        from jax._src.pallas.mosaic_gpu.interpret import params as gpu_interpret
    except ImportError as e:  # pragma: no cover - a jax without the GPU interpreter
        raise NotImplementedError(f"this jax ({jax.__version__}) has no Mosaic GPU interpret mode: {e}") from e
    return gpu_interpret, gpu_callbacks


def sinks_grad(o, lse, do, sinks, dlse=None):
    """The gradient of the sink logits (``[Hq]`` fp32) from the forward's output and natural-log LSE (which includes
    the sinks): each row's sink probability ``exp(sink_h - lse)`` times ``-delta`` (``delta = rowsum(dO * O) -
    dLSE``), summed over the batch and the rows of head ``h``. Plain jnp (one [B, Hq, Tq] reduction)."""
    f32 = jnp.float32
    delta = jnp.einsum("bthd,bthd->bht", do.astype(f32), o.astype(f32), precision=lax.Precision.HIGHEST)
    if dlse is not None:
        delta = delta - dlse.astype(f32)
    p_sink = jnp.exp(jnp.asarray(sinks, f32)[None, :, None] - lse.astype(f32))
    return -jnp.sum(p_sink * delta, axis=(0, 2))


def emulate_backward(q, k, v, o, lse, do, *, causal: bool, scale: float, q_offset=None,
                     config: BwdConfig | None = None, detect_races: bool = True, dlse=None, window: int | None = None,
                     softcap: float | None = None, segment_ids=None):
    """The two Mosaic kernels (``emulate=True``) on jax's GPU interpreter. Returns ``(dq, dk, dv, races_found)``.
    ``window``: ``left`` of a causal window (row ``i`` sees ``i + off - left <= j <= i + off``)."""
    gpu_interpret, gpu_callbacks = _interpreter()
    cfg = CONFIGS["default"] if config is None else config
    if q_offset is None:
        q_offset = jnp.zeros((q.shape[0],), jnp.int32)
    try:
        with gpu_interpret.force_gpu_interpret_mode(gpu_interpret.InterpretGPUParams(detect_races=detect_races)):
            dq, dk, dv = jax.block_until_ready(_run(q, k, v, o, lse, do, q_offset, causal=causal,
                                                    scale=float(scale), cfg=cfg, emulate=True, dlse=dlse,
                                                    left=window, softcap=softcap, segment_ids=segment_ids))
        races = bool(detect_races and gpu_callbacks.get_races().races_found)
    finally:
        gpu_callbacks.reset_gpu_interpret_mode_state()
    return dq, dk, dv, races


# ------------------------------------------------------------------------------------------------------------
# Differentiable attention: fa_prefill's forward (with LSE) and this backward under one jax.custom_vjp
# ------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Static:
    causal: bool
    scale: float
    fwd_config: object  # fa_prefill.PrefillConfig (hashable)
    bwd_config: BwdConfig
    interpret: bool
    left: int | None = None  # a causal window's left side (row i sees i + off - left <= j <= i + off)
    softcap: float | None = None


def _fwd_call(q, k, v, off, sinks, seg, st: _Static, with_lse: bool = True):
    from . import fa_prefill

    return fa_prefill.forward(q, k, v, causal=st.causal, scale=st.scale, q_offset=off, interpret=st.interpret,
                              config=st.fwd_config, return_lse=with_lse,
                              window=None if st.left is None else (st.left, 0), softcap=st.softcap, sinks=sinks,
                              segment_ids=seg)


def _bwd_call(st: _Static, res, dout, dlse=None):
    q, k, v, off, sinks, seg, out, lse = res
    dq, dk, dv = backward(q, k, v, out, lse, dout, causal=st.causal, scale=st.scale, q_offset=off,
                          config=st.bwd_config, interpret=st.interpret, dlse=dlse, window=st.left,
                          softcap=st.softcap, segment_ids=seg)
    # the sinks' gradient from the same delta (dS needs no change: the forward's LSE includes the sinks)
    dsinks = None if sinks is None else sinks_grad(out, lse, dout, sinks, dlse).astype(jnp.asarray(sinks).dtype)
    dseg = None if seg is None else np.zeros(seg.shape, dtype=jax.dtypes.float0)
    return dq, dk, dv, np.zeros(off.shape, dtype=jax.dtypes.float0), dsinks, dseg


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attn(q, k, v, off, sinks, seg, st: _Static):
    return _fwd_call(q, k, v, off, sinks, seg, st)


def _attn_fwd(q, k, v, off, sinks, seg, st: _Static):
    out, lse = _fwd_call(q, k, v, off, sinks, seg, st)
    return (out, lse), (q, k, v, off, sinks, seg, out, lse)


def _attn_bwd(st: _Static, res, cts):
    dout, dlse = cts
    return _bwd_call(st, res, dout, dlse)


_attn.defvjp(_attn_fwd, _attn_bwd)


# The same pair for a caller that needs the output only (the drop-in without return_residual): the primal, which
# runs when nothing differentiates the call, is the forward without the LSE; the LSE is made (and kept as a
# residual) only under differentiation. A forward-only prefill through the drop-in then costs what fa_prefill's own
# forward does.
@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attn_out(q, k, v, off, sinks, seg, st: _Static):
    return _fwd_call(q, k, v, off, sinks, seg, st, with_lse=False)


def _attn_out_fwd(q, k, v, off, sinks, seg, st: _Static):
    out, lse = _fwd_call(q, k, v, off, sinks, seg, st)
    return out, (q, k, v, off, sinks, seg, out, lse)


def _attn_out_bwd(st: _Static, res, dout):
    return _bwd_call(st, res, dout)


_attn_out.defvjp(_attn_out_fwd, _attn_out_bwd)


def attention_lse(q, k, v, *, causal: bool, scale: float, q_offset=None, config=None,
                  bwd_config: BwdConfig | None = None, interpret: bool = False, with_lse: bool = True,
                  window: int | None = None, softcap: float | None = None, sinks=None, segment_ids=None):
    """``(out, lse)`` of fa_prefill's forward (natural-log LSE, fp32 ``[B, Hq, Tq]``), differentiable in q, k, v
    (and through the LSE) by this module's backward: the pair ``pallas_attn.dot_product_attention`` uses on
    Hopper. ``config``: a ``fa_prefill.PrefillConfig`` (None: fa_prefill's heuristic, then the drop-in's window and
    packed-documents rules, ``fa_prefill.config_for_window`` / ``config_for_packed``); ``bwd_config``: a
    ``BwdConfig`` (None: ``CONFIGS["default"]``); ``interpret``: the forward's Pallas twin and the backward's
    kernels on the GPU interpreter (CPU, small shapes only). ``with_lse=False`` returns ``out`` alone, and a call
    that is not differentiated then runs the forward without the LSE. Features, forward and backward:
    ``window=left`` (causal only: row ``i`` sees ``i + off - left <= j <= i + off``, fa_prefill's
    ``window=(left, 0)``), ``softcap`` (logit soft-cap), ``sinks`` ``[Hq]`` (differentiable: its gradient is
    ``sinks_grad``), ``segment_ids`` int ``[B, T]`` (packed documents: causal self-attention, no ``q_offset``, no
    window, D <= 128; not differentiated; on a GPU only while ``PACKED_BWD_ON_GPU`` is on)."""
    from . import fa_prefill
    from .contract import Problem

    fa_prefill._check(q, k, v)  # shapes, one dtype in fp16 / bf16, GQA divisibility, Tk >= 1
    if q.shape[3] not in HEAD_DIMS:
        raise NotImplementedError(f"{GEN} attention_lse: the backward supports head dims {HEAD_DIMS}; got "
                                  f"D={q.shape[3]}")
    if window is not None and not causal:
        raise NotImplementedError(f"{GEN} attention_lse: a window is built for causal attention only; got "
                                  f"causal={causal}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0):
        raise ValueError(f"{GEN} attention_lse: window is the causal window's left side, an int >= 0; got "
                         f"{window!r}")
    fwd_window, softcap, sinks = fa_prefill.check_features(None if window is None else (int(window), 0), softcap,
                                                           sinks, q.shape[2])
    b = q.shape[0]
    if config is None:  # the drop-in's rules for the features too (several row tiles a CTA where they pay)
        config = fa_prefill.config_for_features(fa_prefill.KERNEL.heuristic(Problem(
            entry="dense", dtype=q.dtype.name, batch=b, q_len=q.shape[1], kv_len=k.shape[1], heads_q=q.shape[2],
            heads_kv=k.shape[2], head_dim=q.shape[3], causal=bool(causal))), causal=bool(causal), window=fwd_window,
            q_len=q.shape[1], packed=segment_ids is not None, kv_len=k.shape[1], head_dim=q.shape[3])
    bwd = CONFIGS["default"] if bwd_config is None else bwd_config
    if not isinstance(bwd, BwdConfig):
        raise ValueError(f"{GEN} attention_lse: bwd_config must be a BwdConfig; got {bwd!r}")
    off = jnp.zeros((b,), jnp.int32) if q_offset is None else jnp.asarray(q_offset, jnp.int32).reshape((b,))
    st = _Static(causal=bool(causal), scale=float(scale), fwd_config=config, bwd_config=bwd,
                 interpret=bool(interpret), left=None if fwd_window is None else fwd_window[0], softcap=softcap)
    seg = None
    if segment_ids is not None:
        if q_offset is not None or window is not None or not causal:
            raise NotImplementedError(f"{GEN} attention_lse: segment_ids take causal self-attention without a "
                                      f"q_offset or a window")
        if not interpret and not PACKED_BWD_ON_GPU:
            raise NotImplementedError(f"{GEN} attention_lse: packed documents' backward has not run on a GPU yet "
                                      f"(PACKED_BWD_ON_GPU is off)")
        seg = jnp.asarray(segment_ids, jnp.int32)
    return _attn(q, k, v, off, sinks, seg, st) if with_lse else _attn_out(q, k, v, off, sinks, seg, st)
