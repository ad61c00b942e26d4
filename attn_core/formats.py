"""Numpy reference of the two quantized KV-cache formats: fp8 E4M3 (per-tensor) and NVFP4 (two-level).

Why: both twins (JAX/Pallas and torch/CUDA) store K and V in these formats, and the oracle must attend over the
*same* quantized operands a kernel sees. This module is the bit-exact contract both twins are tested against. It
needs numpy only and works in float32, in the order written below, so a kernel can reproduce every byte.

FP8 E4M3 (the OCP ``float8_e4m3fn`` flavour)
  * A byte is ``s eeee mmm``: 1 sign bit, 4 exponent bits with bias 7, 3 mantissa bits. Exponent field 0 holds
    the subnormals ``m * 2^-9``; otherwise the value is ``2^(e-7) * (1 + m/8)``. There are no infinities: only
    ``s 1111 111`` (0x7F, 0xFF) is NaN, so the largest finite magnitude is ``2^8 * 1.75 = 448``.
  * Encoding rounds to nearest, ties to even mantissa. Anything above 448 (infinity included) saturates to
    +-448 rather than becoming NaN; NaN encodes as 0x7F with its sign bit (0xFF for a negative NaN); -0.0 keeps
    its sign (0x80).
  * Per-tensor symmetric quantization: ``scale = max(amax|x|, 1e-12) / 448`` (float32), the stored byte is
    ``E4M3(x / scale)`` and dequantization is ``e4m3_to_float(byte) * scale`` (float32).

NVFP4
  * An element is a 4-bit E2M1 code: bit 3 is the sign, bits 0-2 index the magnitudes
    ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``.
  * Two scales: a float32 per-tensor ``scale = max(amax|x|, 1e-12) / (6 * 448)``, and per 16 consecutive elements
    of the last axis an E4M3 micro-scale ``micro = E4M3(max(block_amax, 1e-12) / 6 / scale)``. The block's
    effective scale is ``eff = e4m3_to_float(micro) * scale`` and the element is coded from ``y = x / eff``.
  * Rounding of ``|y|``: the magnitude index is the count of midpoints ``{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}``
    strictly below ``|y|``. A value exactly on a midpoint therefore rounds DOWN (not to even), and everything
    above 5 becomes 6. The sign bit is ``y < 0``, so -0.0 codes as 0 (not 8): NVFP4 keeps no signed zero.
  * Packing: two codes per byte, even element index in the low nibble, odd index in the high nibble. For
    ``x [..., D]`` the packed codes are ``[..., D/2]`` uint8 and the micro-scales ``[..., D/16]`` uint8 (E4M3
    bytes); ``D % 16 == 0`` is required.
  * Dequantization: ``level[c & 7] * (-1 if c & 8 else 1) * e4m3_to_float(micro[t // 16]) * scale``, evaluated
    left to right in float32. The first three factors multiply exactly (few significant bits), so only the
    final multiplication by ``scale`` rounds.

Inputs are float16/float32/float64 numpy arrays (or anything ``np.asarray`` turns into one); they are converted
to float32 first, which is where the contract starts (a float64 value is rounded to float32, then to E4M3).

Non-finite inputs:
  * ``float_to_e4m3``: NaN -> NaN byte, +-inf -> +-448.
  * ``quantize_fp8_e4m3``: amax propagates NaN (as ``jnp.max`` / ``torch.amax`` do), so a single NaN makes the
    scale NaN and every byte NaN; dequantization is then all NaN. An infinity makes the scale infinite: finite
    elements code as (signed) zero, the infinity as NaN (inf / inf), and every dequantized value is NaN.
  * ``quantize_nvfp4``: a NaN makes the per-tensor scale NaN, hence every micro-scale the NaN byte and every
    dequantized value NaN. Nothing raises.
  * A block whose micro-scale underflows to E4M3 zero (its amax is below about ``2^-10 / 448`` of the tensor
    amax, e.g. an all-zero block) dequantizes to zeros: ``y`` is then ``x / 0`` (inf or NaN), which codes as 7
    or 0, and either times a zero scale is zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "E4M3_MAX",
    "NVFP4_BLOCK",
    "NVFP4_LEVELS",
    "NVFP4_MIDPOINTS",
    "Fp8Array",
    "Nvfp4Array",
    "bytes_per_element",
    "float_to_e4m3",
    "e4m3_to_float",
    "quantize_fp8_e4m3",
    "dequantize_fp8_e4m3",
    "quantize_nvfp4",
    "dequantize_nvfp4",
]

E4M3_MAX = 448.0
NVFP4_BLOCK = 16  # elements of the last axis sharing one micro-scale
NVFP4_LEVELS = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
NVFP4_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=np.float32)

_AMAX_FLOOR = np.float32(1e-12)  # keeps an all-zero tensor (or block) from dividing by zero
_E4M3_NAN = 0x7F
_E4M3_MAX_BYTE = 0x7E  # 0 1111 110 = 448
_E4M3_MIN_NORMAL_EXP = -6  # smallest normal is 2^-6; below it the spacing stays 2^-9


def _as_float32(x, name: str) -> np.ndarray:
    """``x`` as a float32 array, refusing anything that is not a real floating array."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        raise ValueError(f"{name} must be a floating numpy array (float16/float32/float64); got dtype {a.dtype}")
    return a.astype(np.float32, copy=False)


def _e4m3_decode_table() -> np.ndarray:
    """The float32 value of every one of the 256 bytes, computed from the field definitions."""
    b = np.arange(256, dtype=np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp_field = (b >> 3) & 0xF
    mant = (b & 0x7).astype(np.float64)
    magnitude = np.where(
        exp_field == 0,
        mant * 2.0**-9,  # subnormal: no implicit leading one
        np.ldexp(1.0 + mant / 8.0, (exp_field - 7).astype(np.int32)),
    )
    values = sign * magnitude  # 0x80 gives -0.0 because sign is -1.0 and magnitude +0.0
    values[(b & 0x7F) == _E4M3_NAN] = np.nan
    values[0xFF] = -np.nan  # keep the NaN's sign bit, as the encoder does
    return values.astype(np.float32)


_E4M3_TABLE = _e4m3_decode_table()
_E4M3_TABLE.flags.writeable = False


def e4m3_to_float(b: np.ndarray) -> np.ndarray:
    """Decode E4M3 bytes (uint8, any shape) to float32. 0x7F and 0xFF decode to NaN, 0x80 to -0.0."""
    a = np.asarray(b)
    if a.dtype != np.uint8:
        raise ValueError(f"b must be a uint8 array of E4M3 bytes; got dtype {a.dtype}")
    return _E4M3_TABLE[a]


def float_to_e4m3(x: np.ndarray) -> np.ndarray:
    """Encode floats as E4M3 bytes (uint8, same shape): round to nearest even, saturate to +-448, keep -0.0.

    Method: pick the spacing ``q`` of E4M3 values around ``|x|`` (``2^(u-3)`` for binade ``u``, never finer than
    the subnormal spacing ``2^-9``), round ``|x| / q`` to an integer with ties to even (exact in float64, since
    ``q`` is a power of two), and add it to the binade's first byte. E4M3 bytes are ordered like their
    magnitudes, so a rounding that carries into the next binade lands on the right byte without a special case.
    """
    x32 = _as_float32(x, "x")
    a = np.abs(x32).astype(np.float64)
    sign = np.signbit(x32).astype(np.int64) << 7
    finite = np.isfinite(a)
    a_fin = np.where(finite, a, 0.0)

    # Binade u with 2^u <= a < 2^(u+1); values below the smallest normal share the subnormal spacing.
    _, e = np.frexp(a_fin)  # a = m * 2^e with m in [0.5, 1)
    u = np.where(a_fin < 2.0**_E4M3_MIN_NORMAL_EXP, _E4M3_MIN_NORMAL_EXP, e.astype(np.int64) - 1)
    steps = np.rint(np.ldexp(a_fin, (3 - u).astype(np.int32))).astype(np.int64)  # np.rint: ties to even
    # Byte of 2^u is (u + 7) << 3; for the subnormal binade this gives byte == steps (0..8).
    code = ((u + 7) << 3) + steps - 8
    code = np.where(finite, np.minimum(code, _E4M3_MAX_BYTE), _E4M3_MAX_BYTE)  # saturate, infinity included
    code = np.where(np.isnan(a), _E4M3_NAN, code)
    return (code | sign).astype(np.uint8)


# ---------------------------------------------------------------------------------------------------------------
# fp8: one float32 scale for the whole tensor


@dataclass(frozen=True, eq=False)
class Fp8Array:
    """An fp8 E4M3 tensor: ``data`` (uint8 bytes, the input's shape) times the float32 per-tensor ``scale``."""

    data: np.ndarray
    scale: np.float32

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape


def _tensor_scale(x32: np.ndarray, divisor: float) -> np.float32:
    """``max(amax|x|, 1e-12) / divisor`` in float32; NaN propagates through amax on purpose (see module doc)."""
    amax = np.max(np.abs(x32))
    return np.float32(np.maximum(amax, _AMAX_FLOOR) / np.float32(divisor))


def quantize_fp8_e4m3(x: np.ndarray) -> Fp8Array:
    """Per-tensor symmetric fp8: ``scale = max(amax, 1e-12) / 448``, bytes = ``E4M3(x / scale)``."""
    x32 = _as_float32(x, "x")
    if x32.size == 0:
        raise ValueError(f"x must be non-empty to have a scale; got shape {x32.shape}")
    scale = _tensor_scale(x32, E4M3_MAX)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        data = float_to_e4m3(x32 / scale)
    return Fp8Array(data=data, scale=scale)


def dequantize_fp8_e4m3(t: Fp8Array) -> np.ndarray:
    """float32 values of an :class:`Fp8Array`: ``e4m3_to_float(data) * scale``."""
    with np.errstate(invalid="ignore", over="ignore"):
        return e4m3_to_float(t.data) * np.float32(t.scale)


# ---------------------------------------------------------------------------------------------------------------
# NVFP4: E2M1 codes, an E4M3 micro-scale per 16 elements, and a float32 per-tensor scale


@dataclass(frozen=True, eq=False)
class Nvfp4Array:
    """An NVFP4 tensor of logical shape ``[..., D]``.

    ``packed`` uint8 ``[..., D/2]`` (even element in the low nibble), ``micro`` uint8 E4M3 bytes ``[..., D/16]``,
    ``scale`` the float32 per-tensor scale.
    """

    packed: np.ndarray
    micro: np.ndarray
    scale: np.float32

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.packed.shape[:-1], 2 * self.packed.shape[-1])


def _nvfp4_codes(y: np.ndarray) -> np.ndarray:
    """E2M1 codes (uint8, 0..15) of the already-scaled values ``y`` (float32)."""
    # Count midpoints strictly below |y|: ties round down, > 5 gives 6, and NaN (compares false) gives 0.
    index = (np.abs(y)[..., None] > NVFP4_MIDPOINTS).sum(axis=-1)
    sign = (y < 0).astype(np.int64) << 3
    return (index | sign).astype(np.uint8)


def quantize_nvfp4(x: np.ndarray) -> Nvfp4Array:
    """Two-level NVFP4 quantization of ``x [..., D]`` along its last axis (``D % 16 == 0``); see the module doc."""
    x32 = _as_float32(x, "x")
    if x32.ndim == 0 or x32.shape[-1] == 0 or x32.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"x must have shape [..., D] with D a positive multiple of {NVFP4_BLOCK}; got {x32.shape}")
    scale = _tensor_scale(x32, 6.0 * E4M3_MAX)

    blocks = x32.reshape(*x32.shape[:-1], -1, NVFP4_BLOCK)  # [..., D/16, 16]
    block_amax = np.max(np.abs(blocks), axis=-1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        micro = float_to_e4m3(np.maximum(block_amax, _AMAX_FLOOR) / np.float32(6.0) / scale)
        eff = e4m3_to_float(micro) * scale  # [..., D/16]
        y = blocks / eff[..., None]  # eff == 0 (underflowed micro-scale) gives inf/NaN: codes 7/0, dequant 0
    codes = _nvfp4_codes(y).reshape(x32.shape)

    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return Nvfp4Array(packed=packed.astype(np.uint8), micro=micro, scale=scale)


def _unpack_nvfp4(packed: np.ndarray) -> np.ndarray:
    """Codes ``[..., 2P]`` from packed bytes ``[..., P]`` (low nibble is the even element)."""
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), dtype=np.uint8)
    codes[..., 0::2] = packed & 0x0F
    codes[..., 1::2] = packed >> 4
    return codes


def dequantize_nvfp4(t: Nvfp4Array) -> np.ndarray:
    """float32 values ``[..., D]`` of an :class:`Nvfp4Array` (left-to-right float32 product, see the module doc)."""
    packed = np.asarray(t.packed)
    micro = np.asarray(t.micro)
    if packed.dtype != np.uint8 or micro.dtype != np.uint8:
        raise ValueError(f"packed and micro must be uint8; got {packed.dtype}, {micro.dtype}")
    d = 2 * packed.shape[-1] if packed.ndim else 0
    if d == 0 or d % NVFP4_BLOCK or micro.shape != (*packed.shape[:-1], d // NVFP4_BLOCK):
        raise ValueError(
            f"micro must have shape [..., D/{NVFP4_BLOCK}] for packed [..., D/2]; got {packed.shape=}, {micro.shape=}"
        )
    codes = _unpack_nvfp4(packed)
    signed_level = NVFP4_LEVELS[codes & 7] * np.where(codes & 8, np.float32(-1.0), np.float32(1.0))
    micro_per_element = np.repeat(e4m3_to_float(micro), NVFP4_BLOCK, axis=-1)
    with np.errstate(invalid="ignore", over="ignore"):
        return (signed_level * micro_per_element) * np.float32(t.scale)


# ---------------------------------------------------------------------------------------------------------------
# storage cost


_BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "float32": 4.0,
    "fp16": 2.0,
    "float16": 2.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "float8_e4m3fn": 1.0,
    # half a byte of code plus one micro-scale byte per 16 elements; the per-tensor scale is not counted
    "nvfp4": 0.5 + 1.0 / NVFP4_BLOCK,
}


def bytes_per_element(fmt: str) -> float:
    """Storage bytes per element of a KV format (per-tensor scales excluded): fp8 1.0, nvfp4 0.5625, fp16 2.0."""
    try:
        return _BYTES_PER_ELEMENT[fmt.lower()]
    except (KeyError, AttributeError):
        raise ValueError(f"fmt must be one of {sorted(_BYTES_PER_ELEMENT)}; got {fmt!r}") from None
