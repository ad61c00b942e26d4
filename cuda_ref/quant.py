"""Quantized KV caches in torch, byte-identical to the numpy judge (``attn_core.formats``) and to the JAX twin
(``pallas_attn.quant``): fp8 E4M3 with a per-tensor scale, and NVFP4 (E2M1 codes, an E4M3 micro-scale per 16
elements of the last axis, a per-tensor scale). docs/quantized_kv.md and docs/reference.md §1.4 give the formats.

* ``quantize_fp8_e4m3(t) -> Fp8Tensor(data, scale)``: ``data`` uint8 E4M3 bytes of t's shape (t's device),
  ``scale`` a 0-d float32 tensor ``max(amax|t|, 1e-12) / 448``;
* ``quantize_nvfp4(t) -> Nvfp4Tensor(packed, micro, scale)``: ``packed`` uint8 ``[..., D/2]`` (even element in
  the low nibble), ``micro`` uint8 ``[..., D/16]``, ``scale`` 0-d float32 ``max(amax, 1e-12) / (6 * 448)``;
* ``dequantize_fp8_e4m3`` / ``dequantize_nvfp4``: float32 values.

The encoder does not use torch's float8 cast (which turns values above 448 into NaN instead of saturating): it
picks the E4M3 spacing of the binade of ``|x|`` and rounds ``|x|`` over it half-to-even, as the judge does, so
every step is an exact float32 operation apart from the one division ``x / scale`` the format defines.

torch is imported inside the functions: ``import cuda_ref`` stays free of torch and JAX.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from attn_core import formats as _ref

__all__ = ["Fp8Tensor", "Nvfp4Tensor", "float_to_e4m3", "quantize_fp8_e4m3", "dequantize_fp8_e4m3",
           "quantize_nvfp4", "dequantize_nvfp4"]

_E4M3_TABLE = _ref.e4m3_to_float(np.arange(256, dtype=np.uint8))
_AMAX_FLOOR = 1e-12  # rounded to float32 where used, as in the judge


class Fp8Tensor(NamedTuple):
    """fp8 E4M3 tensor (torch): ``data`` uint8 bytes, ``scale`` 0-d float32."""

    data: Any
    scale: Any


class Nvfp4Tensor(NamedTuple):
    """NVFP4 tensor (torch): ``packed`` uint8 ``[..., D/2]``, ``micro`` uint8 ``[..., D/16]``, ``scale`` 0-d float32."""

    packed: Any
    micro: Any
    scale: Any


def _as_float32(t, name: str):
    import torch

    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"{name} must be a floating torch tensor; got "
                         f"{getattr(t, 'dtype', type(t).__name__)}")
    return t.to(torch.float32)


def float_to_e4m3(t):
    """E4M3 bytes (uint8) of a float tensor: nearest, ties to even; saturate to +-448 (inf too); NaN -> 0x7F with
    its sign bit; -0.0 -> 0x80 (``attn_core.formats.float_to_e4m3``'s method, in torch)."""
    import torch

    x = _as_float32(t, "t")
    sign = (x.view(torch.int32) < 0).to(torch.int32) << 7  # the sign bit (negative zero and NaN included)
    a = x.abs()
    finite = torch.isfinite(a)
    a_fin = torch.where(finite, a, torch.zeros_like(a))
    exp = (a_fin.view(torch.int32) >> 23) - 127  # |x| has no sign bit, so the shift is logical
    u = torch.where(a_fin < 2.0**-6, torch.full_like(exp, -6), exp)
    pow2 = ((3 - u + 127) << 23).view(torch.float32)  # 2^(3-u), exact
    steps = torch.round(a_fin * pow2).to(torch.int32)  # torch.round: half to even
    code = ((u + 7) << 3) + steps - 8
    code = torch.where(finite, code.clamp(max=0x7E), torch.full_like(code, 0x7E))
    code = torch.where(torch.isnan(x), torch.full_like(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


def _e4m3_to_float(b):
    import torch

    table = torch.from_numpy(_E4M3_TABLE.copy()).to(b.device)
    return table[b.long()]


def _tensor_scale(x, divisor: float):
    import torch

    floor = torch.tensor(_AMAX_FLOOR, dtype=torch.float32, device=x.device)
    return torch.maximum(x.abs().amax(), floor) / torch.tensor(divisor, dtype=torch.float32, device=x.device)


def quantize_fp8_e4m3(t) -> Fp8Tensor:
    """Per-tensor symmetric fp8: ``scale = max(amax, 1e-12) / 448``, bytes ``E4M3(t / scale)``."""
    x = _as_float32(t, "t")
    if x.numel() == 0:
        raise ValueError(f"t must be non-empty to have a scale; got shape {tuple(x.shape)}")
    scale = _tensor_scale(x, _ref.E4M3_MAX)
    return Fp8Tensor(data=float_to_e4m3(x / scale), scale=scale)


def dequantize_fp8_e4m3(q: Fp8Tensor):
    """float32 values: ``e4m3(data) * scale``."""
    return _e4m3_to_float(q.data) * q.scale


def quantize_nvfp4(t) -> Nvfp4Tensor:
    """Two-level NVFP4 of ``t [..., D]`` along its last axis (``D % 16 == 0``)."""
    import torch

    x = _as_float32(t, "t")
    blk = _ref.NVFP4_BLOCK
    if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % blk:
        raise ValueError(f"t must have shape [..., D] with D a positive multiple of {blk}; got {tuple(x.shape)}")
    scale = _tensor_scale(x, 6.0 * _ref.E4M3_MAX)
    blocks = x.reshape(*x.shape[:-1], -1, blk)
    floor = torch.tensor(_AMAX_FLOOR, dtype=torch.float32, device=x.device)
    six = torch.tensor(6.0, dtype=torch.float32, device=x.device)
    micro = float_to_e4m3(torch.maximum(blocks.abs().amax(dim=-1), floor) / six / scale)
    eff = _e4m3_to_float(micro) * scale
    y = blocks / eff[..., None]  # an underflowed micro-scale (eff == 0) gives inf/NaN: codes 7/0, dequant 0
    index = torch.zeros(y.shape, dtype=torch.int32, device=x.device)
    for m in _ref.NVFP4_MIDPOINTS:
        index += (y.abs() > float(m)).to(torch.int32)
    codes = (index | ((y < 0).to(torch.int32) << 3)).reshape(x.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return Nvfp4Tensor(packed=packed.to(torch.uint8), micro=micro, scale=scale)


def dequantize_nvfp4(q: Nvfp4Tensor):
    """float32 values ``[..., D]``: ``level * sign * e4m3(micro) * scale``, left to right in float32."""
    import torch

    p = q.packed.to(torch.int32)
    d = 2 * p.shape[-1]
    codes = torch.stack([p & 0xF, p >> 4], dim=-1).reshape(*p.shape[:-1], d)
    levels = torch.from_numpy(_ref.NVFP4_LEVELS.copy()).to(p.device)
    level = levels[(codes & 7).long()]
    signed = torch.where((codes & 8) != 0, -level, level)
    micro_el = torch.repeat_interleave(_e4m3_to_float(q.micro), _ref.NVFP4_BLOCK, dim=-1)
    return (signed * micro_el) * q.scale
