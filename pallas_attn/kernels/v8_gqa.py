"""v8_gqa: GQA M-packing on CUDA cores, the reference's "Cut 1" (docs/reference.md §2.8), and its knobs.

Delta from v7_paged: the ``G = Hq / Hkv`` query heads that share a KV head, times the Tq query positions,
are the packed rows of one program (``gqa``, head-major: packed row ``r`` is query head ``h_kv*G + r // Tq``
at position ``r % Tq``), so one staged K/V tile of KV head ``h_kv`` serves all of them. Grid
``(ceil(G*Tq/8), S, B*Hkv)`` (B*Hkv programs along z instead of B*Hq); rows past ``G*Tq`` are idle (no
``G | 8`` assumption, any G and any Tq); for G > 8 each of the ``ceil(G*Tq/8)`` row tiles re-stages the
tile. Causal uses each row's own query position ``i_q + q_offset`` (never the packed row index).
``choose_splits`` counts ``base = B*Hkv*ceil(G*Tq/8)``. Everything else is v7's: 8 rows per program, key
tile 64 / 32, FP16 staged and upcast to FP32, one online-softmax update per key, CUDA-core FP32
arithmetic, the shared split state and merge (the kernel skeleton and tile loop live in ``v7_paged``).

Three reference generations are knobs of this kernel in Pallas, named configs with one registry row each
(``Row("v8_gqa_db", "v8_gqa", configs={"faithful": "double_buffered"})``); the lead's measurement says
whether the knob matters, which is the finding:

* ``double_buffered`` (v8_gqa_db, §2.10): the next tile's loads are issued before the current tile's
  compute and carried through the loop in registers (ordinary loads, not ``cp.async``, as the
  reference), 16-bit staging (the reference's two FP16 buffers). Triton's own software pipelining
  (``num_stages``) is the other way to say this; ``tuned`` uses that one.
* ``occupancy`` (v8_gqa_occ, §2.11): the staged tile stays 16-bit and is upcast at use (the reference's
  single FP16 tile, half the footprint). Triton has no shared-memory tile to shrink; what can change is
  the register footprint and so the programs per SM.
* ``key_ilp`` (v8_gqa_ilp, §2.12): four keys' scores are taken before their four updates (KU = 4). In
  Triton the scores of a whole tile are already formed at once, so only the per-key extraction is
  reordered; the compiler may schedule both the same, in which case the finding is "invisible here".

``device_sm`` is ``faithful`` with this device's SM count in ``choose_splits`` (the reference kept 40 for
every v8 variant but ss). ``tuned`` is our guess at what the faithful dataflow leaves behind: one update
per staged tile (Triton's block form), software-pipelined loads (``num_stages=3``), 4 warps, the device's
SM count.
"""

from __future__ import annotations

from .v7_paged import Family, PagedConfig, cuda_core_launch, family_kernel, run

__all__ = ["CONFIGS", "KERNEL", "paged_forward"]

GEN = "v8_gqa"

CONFIGS: dict[str, PagedConfig] = {
    "faithful": PagedConfig(),
    "device_sm": PagedConfig(num_sm=None),
    "tuned": PagedConfig(update_keys=None, num_warps=4, num_stages=3, num_sm=None),
    # the reference generations that are knobs of this kernel (registry rows v8_gqa_db / _occ / _ilp)
    "double_buffered": PagedConfig(prefetch=True, stage_fp32=False),
    "occupancy": PagedConfig(stage_fp32=False),
    "key_ilp": PagedConfig(key_ilp=4),
}


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: PagedConfig = CONFIGS["faithful"], return_lse: bool = False,
                  check_block_table: bool = True):
    """v8_gqa on validated arrays (the contract's ``paged`` convention): q ``[B, Tq, Hq, D]``, pools
    ``[num_pages, page, Hkv, D]`` with Hq a multiple of Hkv."""
    return run(Family(GEN, config, cuda_core_launch), config, q, k_pool, v_pool, block_table, kv_lens,
               causal=causal, scale=scale, q_offset=q_offset, interpret=interpret, return_lse=return_lse,
               check_block_table=check_block_table, gqa_ok=True)


KERNEL = family_kernel(GEN, configs=CONFIGS, paged=paged_forward)
