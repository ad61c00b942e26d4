"""v10_nvfp4: v9_fp8 with NVFP4 KV pools (docs/reference.md §2.15).

Delta from v9_fp8 (one change, as in the reference): the pools are ``Nvfp4Tensor`` pools
(``pallas_attn.quant``): ``packed`` uint8 ``[num_pages, page, Hkv, D/2]`` (two E2M1 codes per byte, the even
element in the low nibble), ``micro`` uint8 ``[num_pages, page, Hkv, D/16]`` (an E4M3 micro-scale per 16
elements of the head dim) and a float32 tensor scale each. The gather reads a key's packed bytes and its
micro-scale bytes through the same table rows (``kv_source.KVLayout.width = D/2``, ``micro = D/16``),
decodes each element to ``level * sign * micro`` (exact in fp16, ``kv_source.nvfp4_tile``), multiplies by the
tensor scale in fp32 and rounds to the fp16 tile v8_gqa_ss consumes. Scores stay at fp16 operands / fp32
arithmetic, never an FP4 dot (the reference: no FP4 tensor cores at M = G). Everything else is v9_fp8's.

Decodes: ``bits`` (default: integer bit placement into fp16, any GPU; fa_decode's default for NVFP4 too) and
``cast`` (E2M1 code placed into an E4M3 byte and converted by the hardware cvt); both give the same tile.
"""

from __future__ import annotations

from .v9_fp8 import LowpConfig, configs_for, lowp_forward, lowp_kernel

__all__ = ["CONFIGS", "KERNEL", "paged_forward"]

GEN = "v10_nvfp4"
FMT = "nvfp4"

CONFIGS: dict[str, LowpConfig] = configs_for("bits", "cast")


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: LowpConfig = CONFIGS["faithful"], return_lse: bool = False,
                  check_block_table: bool = True):
    """v10_nvfp4 on validated inputs (the contract's ``paged`` convention, serving the ``quantized`` entry):
    q float16 ``[B, Tq, Hq, D]``, ``Nvfp4Tensor`` pools of logical shape ``[num_pages, page, Hkv, D]``."""
    return lowp_forward(GEN, FMT, q, k_pool, v_pool, block_table, kv_lens, causal=causal, scale=scale,
                        q_offset=q_offset, interpret=interpret, config=config, return_lse=return_lse,
                        check_block_table=check_block_table)


KERNEL = lowp_kernel(GEN, FMT, "nvfp4", configs=CONFIGS, paged=paged_forward)
