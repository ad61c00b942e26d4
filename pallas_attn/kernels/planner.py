"""The decode planner, written once: tiles, launch knobs, split count and the wave model (DESIGN.md 3).

``plan_decode`` resolves everything static about one decode launch from the problem's shape and a
config's knobs and returns a ``DecodePlan``; ``DecodePlan.as_dict`` is what ``compare`` records next to the
measured time, so a record says how many programs ran in how many waves.

The wave model: time ~ ceil(programs / slots) * (tiles_per_split + 2), the 2 standing for a program's
fixed cost (pipeline fill, Q load, epilogue), plus a two-tile penalty for the merge launch, with slots =
SMs x occupancy. Enough programs to fill the chip, no partial last wave if a cheaper count avoids it, and
no merge at all once B*Hkv fills the chip. The reference's own heuristic (``attn_core.splits``) is the
other planner; the mirrors use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["DecodePlan", "plan_decode", "block_m", "next_pow2", "cdiv", "PROGRAM_OVERHEAD_TILES"]

PROGRAM_OVERHEAD_TILES = 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Everything static about one decode launch."""

    block_m: int  # packed rows per program (power of two >= 16)
    row_tiles: int
    block_k: int
    chunk_blocks: int  # KV tiles per split
    splits: int
    num_warps: int
    num_stages: int
    paged_gather: bool  # page_size < block_k: per-key row gather through the table
    base: int = 1  # programs per split: batch * Hkv * row_tiles
    slots: int = 1  # SMs x assumed occupancy

    @property
    def programs(self) -> int:
        return self.base * self.splits

    @property
    def waves(self) -> float:
        return self.programs / self.slots

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(programs=self.programs, waves=round(self.waves, 3), merge=self.splits > 1)
        return d


def _default_block_k(d: int) -> int:
    # One K+V tile = 2*block_k*D*2 bytes = 32 KiB at fp16: with 3 stages ~96 KiB of shared memory, so two
    # programs fit per SM (228 KiB) and each keeps two tiles in flight while it computes on the third.
    return max(16, min(256, 8192 // d))


def block_m(rows: int, d: int, block_m_max: int | None) -> int:
    """Packed rows per program: the rows rounded up to a power of two (at least 16), capped at ``block_m_max`` (None:
    ``8192 // d``, at least 16)."""
    return min(max(16, next_pow2(rows)), block_m_max or max(16, 8192 // d))


def plan_decode(*, batch: int, hkv: int, rows: int, d: int, max_kv: int, sm_count: int, block_k: int | None,
                num_warps: int | None, num_stages: int | None, splits: int | None, occupancy: int,
                paged_min_waves: int, block_m_max: int | None, page_size: int | None = None,
                block_k_scale: int = 1) -> DecodePlan:
    """Resolve tiles, launch knobs and the split count (the knobs' ``None`` means "pick"). ``block_k_scale``
    multiplies a picked ``block_k`` (at most 512; a given ``block_k`` is kept): a quantized cache's tile of fewer
    bytes per key."""
    bm = block_m(rows, d, block_m_max)
    row_tiles = cdiv(rows, bm)
    slots = max(1, sm_count * occupancy)
    base = batch * hkv * row_tiles
    bk = block_k or _default_block_k(d)
    if block_k is None and page_size is None and base >= slots:
        # B*Hkv alone fills the chip (one split, no merge): a program then streams a whole sequence, and a
        # tile twice as large keeps more bytes in flight per SM. Measured on an H200 (tune run 2026-11-21,
        # docs/fa_decode.md): B=64, S=4096 268.7 -> 236.9 us; B=32, S=8192 236.4 -> 235.7 us.
        bk = min(256, 2 * bk)
    if block_k is None and block_k_scale > 1:
        bk = min(512, bk * block_k_scale)
    n_blocks = max(1, cdiv(max(int(max_kv), 1), bk))

    def realized(s: int) -> tuple[int, int]:
        cb = cdiv(n_blocks, s)
        return cb, cdiv(n_blocks, cb)

    # Paged caches serve ragged batches whose lengths are runtime values the plan cannot see: with one
    # program per sequence the longest sequence sets the makespan (H200, B=32, lengths in [S/2, S]:
    # 3.93 TB/s against 4.5 dense). Splitting so that programs cover ``paged_min_waves`` waves lets the
    # hardware scheduler fill in behind the short sequences; splits past a sequence's end exit at once.
    # Split sweep (results/fa_decode_tune/20261121_h200_paged_splits.log, B=32, S=8192, page 16, us
    # uniform/ragged): s=1 245.5/204.5, s=3 250.7/207.1, s=4 259.3/194.9, s=8 253.5/191.2, dense 242.7:
    # about 6 waves serves both. Only when the sequences alone fill half the chip: below that the wave
    # model already makes many short programs.
    s_min = 1
    if page_size is not None and paged_min_waves > 1 and 2 * base >= slots:
        s_min = min(n_blocks, cdiv(paged_min_waves * slots, base))
    if splits is not None:
        chunk_blocks, n_splits = realized(min(splits, n_blocks))
    else:
        best = None
        for s in range(s_min, min(n_blocks, 256) + 1):
            cb, s_eff = realized(s)
            cost = cdiv(base * s_eff, slots) * (cb + PROGRAM_OVERHEAD_TILES) + (2 if s_eff > 1 else 0)
            if best is None or cost < best[0]:
                best = (cost, cb, s_eff)
        _, chunk_blocks, n_splits = best
    warps = num_warps or (4 if bm * d <= 4096 else 8)
    # Paged: the K/V addresses depend on a table load in the same iteration, and Triton's pipeliner puts
    # that load a stage ahead; 5 stages give the K/V loads the same two buffers 3 stages give dense
    # (read off the sm_90 compile: 72 KiB of shared memory either way; 3 stages paged: one buffer, 39 KiB).
    stages = num_stages or (5 if page_size is not None else 3)
    gather = page_size is not None and page_size < bk
    return DecodePlan(bm, row_tiles, bk, chunk_blocks, n_splits, warps, stages, gather, base, slots)
