"""v8_gqa_ss: score-stationary inner loop, one online-softmax update per 32 keys (docs/reference.md §2.13).

Delta from v8_gqa (Cut 1): same grid ``(ceil(G*Tq/8), S, B*Hkv)``, same packed rows, same split state and
merge; the inner loop changes. The reference gives each lane one key: for a group of 32 keys every lane
forms its key's full D-length dot with the warp's query row (no cross-lane reduction for QK), then one
warp max and one warp sum advance the recurrence once for the 32 keys, and ``p V`` runs as a transpose
(each ``p`` broadcast from its lane). Its tiles are FP16 in shared memory (K transposed and padded to
``[D][TN+1]`` for conflict-free lane-per-key reads), upcast at read.

Here (``v7_paged.attend_cuda_cores`` with ``group = 32``): each staged tile of TN = 64 (D=64) / 32 (D=128)
keys is loaded as TN/32 groups of 32 keys, kept 16-bit (``stage_fp32=False``); per group the scores of the
program's 8 packed rows are one broadcast-multiply + sum over D, then ONE ``softmax.step`` (max, exp, sum)
and ``p V`` as a broadcast-multiply + sum over the group's keys, all FP32 on CUDA cores. What Triton
cannot say: which lane holds which key, and the transposed, padded K layout (a shared-memory bank
detail; Triton picks register layouts and stages nothing by hand). So the Pallas delta from Cut 1 is the
update granularity (1 key -> 32 keys), and the 16-bit staging.

Host: the post-audit reference asks the device for its SM count (``faithful``); ``reference_sm40`` keeps
the T4's 40 of the earlier runs. ``tuned``: 64-key tiles at both head dims, 4 warps, ``num_stages=3``.

Base of v9_fp8 / v10_nvfp4: ``forward_with(..., dequant=fn)`` runs this kernel with a ``kv_source``
dequant hook (storage tiles -> compute tiles at the gather), so a quantized pool is a delta on this
module: the pools keep their storage dtype through the host cast (only FP32 is cast) and ``fn(k, v)``
returns the tiles the scores and ``p V`` consume.
"""

from __future__ import annotations

from collections.abc import Callable

from .v7_paged import Family, PagedConfig, cuda_core_launch, family_kernel, run

__all__ = ["CONFIGS", "KERNEL", "paged_forward", "forward_with"]

GEN = "v8_gqa_ss"
GROUP = 32  # keys per online-softmax update (one per lane of a warp in the reference)

CONFIGS: dict[str, PagedConfig] = {
    "faithful": PagedConfig(update_keys=GROUP, stage_fp32=False, num_sm=None),
    "reference_sm40": PagedConfig(update_keys=GROUP, stage_fp32=False),
    "tuned": PagedConfig(update_keys=GROUP, stage_fp32=False, key_tile_d128=64, num_warps=4, num_stages=3,
                         num_sm=None),
}


def forward_with(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                 interpret: bool, config: PagedConfig = CONFIGS["faithful"], return_lse: bool = False,
                 check_block_table: bool = True, dequant: Callable | None = None, gen: str = GEN, quant=(),
                 width: int | None = None):
    """The score-stationary kernel with an optional ``kv_source`` dequant hook (a module-level function,
    so the jitted launch caches per hook) and the pass names of generation ``gen``. A quantized pool: uint8
    storage pools as ``k_pool`` / ``v_pool`` (``width`` columns per head), its micro pools and scales as
    ``quant``, and the hook called ``dequant(k, v, scale_k, scale_v)`` (``v7_paged.run``)."""
    if config.update_keys != GROUP:
        raise ValueError(f"{gen} updates once per {GROUP} keys; got a config with update_keys={config.update_keys}")
    return run(Family(gen, config, cuda_core_launch), config, q, k_pool, v_pool, block_table, kv_lens,
               causal=causal, scale=scale, q_offset=q_offset, interpret=interpret, return_lse=return_lse,
               check_block_table=check_block_table, gqa_ok=True, dequant=dequant, quant=quant, width=width)


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: PagedConfig = CONFIGS["faithful"], return_lse: bool = False,
                  check_block_table: bool = True):
    """v8_gqa_ss on validated arrays (the contract's ``paged`` convention)."""
    return forward_with(q, k_pool, v_pool, block_table, kv_lens, causal=causal, scale=scale, q_offset=q_offset,
                        interpret=interpret, config=config, return_lse=return_lse,
                        check_block_table=check_block_table)


KERNEL = family_kernel(GEN, configs=CONFIGS, paged=paged_forward)
