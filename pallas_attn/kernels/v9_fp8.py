"""v9_fp8: v8_gqa_ss reading FP8 E4M3 KV pools, dequantized in the paged gather (docs/reference.md §2.14).

Delta from v8_gqa_ss (one change, as in the reference): the pools are ``Fp8Tensor`` pools
(``pallas_attn.quant``): uint8 E4M3 bytes ``[num_pages, page, Hkv, D]`` and one float32 tensor scale each
(``scale_k``, ``scale_v`` = amax / 448, docs/quantized_kv.md). While a tile is gathered through the block
table, every byte is decoded (E4M3 -> fp16, exact: every E4M3 value is an fp16 value), multiplied by its
tensor's scale in fp32 and rounded to fp16: that 16-bit tile is what v8_gqa_ss stages and consumes. Scores,
the one-update-per-32-keys online softmax, ``p V`` (fp32 on CUDA cores), split-KV, the merge and the host's
SM query are v8_gqa_ss's. Decoding is fused per tile: there is no whole-cache dequantization pass.

The hook runs in ``kv_source.KVSource.tile`` (the gather), through ``v8_gqa_ss.forward_with(...,
dequant=hook, quant=(scales,))``; the two scales reach the kernel as one float32 ``[2]`` operand. Decodes
(``LowpConfig.decode``): ``cast`` (bitcast to float8_e4m3fn and convert: the hardware cvt on sm_89+, the
reference's E4M3 -> half conversion) or ``bits`` (integer bit placement into fp16, any GPU; its 2^-8 is folded
into the scale multiply, so both give the same fp16 tile bit for bit).

Faithful numerics, so what the reference rounds is rounded here: the product ``e4m3 * scale`` is rounded to
fp16. A value whose magnitude exceeds fp16's range (a cache quantized from float32 data beyond 65504) becomes
inf in the tile and the output NaN, not a silently wrong number; fa_decode's quantized path (scales folded into
the score and output scalars, no rounding of the product) is the one for such data.

v10_nvfp4 is this module with the NVFP4 decode (``v10_nvfp4.py``).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from .. import quant
from . import v8_gqa_ss
from .contract import Kernel, Precision, Problem
from .kv_source import DECODES, E4M3_FOLD, NVFP4_FOLD, e4m3_tile, nvfp4_tile
from .v7_paged import PagedConfig, cuda_core_plan, cuda_core_precision, paged_launches

__all__ = ["LowpConfig", "CONFIGS", "KERNEL", "paged_forward", "lowp_forward", "lowp_kernel", "HOOKS"]

GEN = "v9_fp8"
FMT = "fp8_e4m3"


@dataclasses.dataclass(frozen=True)
class LowpConfig(PagedConfig):
    """v8_gqa_ss's config plus ``decode``: how the gather decodes the stored bytes (``kv_source.DECODES``)."""

    decode: str = "cast"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decode not in DECODES:
            raise ValueError(f"{type(self).__name__}.decode must be one of {DECODES}; got {self.decode!r}")


def configs_for(decode: str, alt: str) -> dict[str, LowpConfig]:
    """v8_gqa_ss's named configs with ``decode``, plus ``alt_decode`` (faithful with the other decode)."""
    out = {name: LowpConfig(**dataclasses.asdict(cfg), decode=decode) for name, cfg in v8_gqa_ss.CONFIGS.items()}
    out["alt_decode"] = dataclasses.replace(out["faithful"], decode=alt)
    return out


CONFIGS: dict[str, LowpConfig] = configs_for("cast", "bits")


# --- the gather's dequant hooks (module-level functions: the jitted launch caches per hook) --------------


def _scaled(tile, s, fold: int):
    """An exact fp16 tile short of 2^fold, times its tensor scale in fp32, rounded to fp16 (the reference's
    staged tile). The power of two joins the scale (exact), so both decodes round the same product."""
    return (tile.astype(jnp.float32) * (s * jnp.float32(2.0 ** fold))).astype(jnp.float16)


def _fp8_cast(k, v, sk, sv):
    return _scaled(e4m3_tile(k, "cast"), sk, E4M3_FOLD["cast"]), _scaled(e4m3_tile(v, "cast"), sv, E4M3_FOLD["cast"])


def _fp8_bits(k, v, sk, sv):
    return _scaled(e4m3_tile(k, "bits"), sk, E4M3_FOLD["bits"]), _scaled(e4m3_tile(v, "bits"), sv, E4M3_FOLD["bits"])


def _nvfp4_cast(k, v, sk, sv):
    f = NVFP4_FOLD["cast"]
    return _scaled(nvfp4_tile(*k, "cast"), sk, f), _scaled(nvfp4_tile(*v, "cast"), sv, f)


def _nvfp4_bits(k, v, sk, sv):
    f = NVFP4_FOLD["bits"]
    return _scaled(nvfp4_tile(*k, "bits"), sk, f), _scaled(nvfp4_tile(*v, "bits"), sv, f)


HOOKS = {("fp8_e4m3", "cast"): _fp8_cast, ("fp8_e4m3", "bits"): _fp8_bits,
         ("nvfp4", "cast"): _nvfp4_cast, ("nvfp4", "bits"): _nvfp4_bits}


# --- the entry -----------------------------------------------------------------------------------------


def lowp_forward(gen: str, fmt: str, q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float,
                 q_offset, interpret: bool, config: LowpConfig, return_lse: bool, check_block_table: bool):
    """v8_gqa_ss on the storage pools of a quantized pair of format ``fmt`` (v9_fp8 / v10_nvfp4)."""
    fk, fv = quant.kv_format(k_pool), quant.kv_format(v_pool)
    if fk != fmt or fv != fmt:
        cls = "Fp8Tensor" if fmt == "fp8_e4m3" else "Nvfp4Tensor"
        raise ValueError(f"{gen} reads {fmt} KV pools: k_pool and v_pool must both be pallas_attn.quant.{cls}; got "
                         f"{fk or type(k_pool).__name__}, {fv or type(v_pool).__name__}")
    if not isinstance(config, LowpConfig):
        raise ValueError(f"{gen}: config must be a LowpConfig (v8_gqa_ss's knobs plus decode); got {config!r}")
    if jnp.dtype(q.dtype) != jnp.float16 and not (jnp.dtype(q.dtype) == jnp.float32 and config.host_cast):
        raise NotImplementedError(f"{gen} takes float16 q (the tiles decode to fp16, as in the reference); got "
                                  f"q.dtype={jnp.dtype(q.dtype).name} (float32 only with host_cast=True)")
    quant._check_fields("k_pool", k_pool)
    quant._check_fields("v_pool", v_pool)
    scales = jnp.stack([jnp.asarray(k_pool.scale, jnp.float32).reshape(()),
                        jnp.asarray(v_pool.scale, jnp.float32).reshape(())])
    if fmt == "fp8_e4m3":
        kd, vd, extra, width = k_pool.data, v_pool.data, (scales,), None
    else:
        if k_pool.micro.shape != v_pool.micro.shape:
            raise ValueError(f"{gen}: k_pool.micro and v_pool.micro must match; got {k_pool.micro.shape}, "
                             f"{v_pool.micro.shape}")
        kd, vd, extra, width = k_pool.packed, v_pool.packed, (k_pool.micro, v_pool.micro, scales), q.shape[-1] // 2
        if k_pool.shape[-1] != q.shape[-1]:
            raise ValueError(f"{gen}: the pools' logical D ({k_pool.shape[-1]}) must equal q's ({q.shape[-1]})")
    return v8_gqa_ss.forward_with(q, kd, vd, block_table, kv_lens, causal=causal, scale=scale, q_offset=q_offset,
                                  interpret=interpret, config=config, return_lse=return_lse,
                                  check_block_table=check_block_table, dequant=HOOKS[(fmt, config.decode)], gen=gen,
                                  quant=extra, width=width)


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: LowpConfig = CONFIGS["faithful"], return_lse: bool = False,
                  check_block_table: bool = True):
    """v9_fp8 on validated inputs (the contract's ``paged`` convention, serving the ``quantized`` entry):
    q float16 ``[B, Tq, Hq, D]``, ``Fp8Tensor`` pools of logical shape ``[num_pages, page, Hkv, D]``."""
    return lowp_forward(GEN, FMT, q, k_pool, v_pool, block_table, kv_lens, causal=causal, scale=scale,
                        q_offset=q_offset, interpret=interpret, config=config, return_lse=return_lse,
                        check_block_table=check_block_table)


# --- contract --------------------------------------------------------------------------------------------

# ALU instructions per KV element of the faithful gather (docs/quantized_kv.md): fp8 "cast" = one
# cvt.f16x2.e4m3x2 per two (0.5), the fp16 -> fp32 convert (1), the scale multiply (1), the fp32 -> fp16 round
# per two (0.5); NVFP4 adds the nibble placement (two shift/and/or groups per byte, ~3 per element), the join
# and the micro-scale multiply (0.5). Estimates for the roofline's dequant bound, not measurements.
DEQUANT_OPS = {"fp8_e4m3": 3.0, "nvfp4": 6.5}
QNOTE = ("q float16; KV bytes decoded in the paged gather, times the tensor scale, rounded to a 16-bit tile "
         "(the reference's staged fp16 tile); then v8_gqa_ss: CUDA-core fp32 scores and p V, one update per 32 keys")


def _plan(problem: Problem, config: LowpConfig) -> dict:
    out = cuda_core_plan(problem, config)
    out["partial"]["decode"] = config.decode
    return out


def lowp_kernel(gen: str, fmt: str, operand: str, *, configs, paged) -> Kernel:
    """The declaration v9_fp8 and v10_nvfp4 share: v8_gqa_ss's passes and plan, the ``quantized`` entry on
    paged pools of one format."""
    return Kernel(
        name=gen,
        lowering="triton",
        passes=(f"pallas_attn_{gen}_partial", f"pallas_attn_{gen}_merge"),
        config_cls=LowpConfig,
        configs=configs,
        entries=frozenset({"quantized"}),
        dtypes=("float16",),
        precision={"float16": cuda_core_precision()["float16"]},
        head_dims=(64, 128),
        gqa=True,
        max_q_len=None,
        paged=paged,
        kv_precision={fmt: Precision(operand, "fp32", "fp32", QNOTE)},
        quantized_q_dtypes=("float16",),
        kv_dequant_ops={fmt: DEQUANT_OPS[fmt]},
        plan=_plan,
        launches=paged_launches,
    )


KERNEL = lowp_kernel(GEN, FMT, "fp8", configs=CONFIGS, paged=paged_forward)
