"""Quantized KV caches in JAX: fp8 E4M3 (per-tensor scale) and NVFP4 (E2M1 codes, E4M3 micro-scales per 16).

The formats, the rounding and the handling of non-finite input are those of ``attn_core.formats`` (the numpy
judge; docs/quantized_kv.md and docs/reference.md §1.4): these jnp versions are jit-able and produce the same
bytes. They use only exact float32 steps (one division per element, as the judge, then power-of-two scalings and
integer work), so the bytes do not depend on the backend's transcendental or fused-multiply choices.

* ``quantize_fp8_e4m3(x) -> Fp8Tensor(data, scale)``: ``data`` uint8 E4M3 bytes of x's shape, ``scale`` float32
  scalar ``max(amax|x|, 1e-12) / 448`` over the whole tensor.
* ``quantize_nvfp4(x) -> Nvfp4Tensor(packed, micro, scale)``: ``packed`` uint8 ``[..., D/2]`` (even element in
  the low nibble), ``micro`` uint8 ``[..., D/16]`` E4M3 micro-scales, ``scale`` float32 ``max(amax, 1e-12) /
  (6 * 448)``; a magnitude is coded by counting the midpoints strictly below it (ties round down, > 5 gives 6).
* ``dequantize_fp8_e4m3(t)`` / ``dequantize_nvfp4(t)``: float32 values.

Both tensor types are JAX pytrees (arrays as children), so a paged pool of them passes through ``jax.jit`` and
``pallas_attn.paged_attention`` takes them in place of fp16 pools. NaN in gives NaN out (a NaN anywhere makes the
per-tensor scale NaN, hence every dequantized value); see ``attn_core.formats`` for infinities. The public
functions are jitted (argument checks run at trace time and raise ValueError).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from attn_core import formats as _ref
from attn_core import paging as _paging

__all__ = [
    "Fp8Tensor",
    "Nvfp4Tensor",
    "QuantizedKV",
    "float_to_e4m3",
    "e4m3_to_float",
    "quantize_fp8_e4m3",
    "dequantize_fp8_e4m3",
    "quantize_nvfp4",
    "dequantize_nvfp4",
    "kv_format",
    "kv_view",
    "build_paged_quantized",
]

E4M3_MAX = _ref.E4M3_MAX
NVFP4_BLOCK = _ref.NVFP4_BLOCK
_AMAX_FLOOR = np.float32(1e-12)
_E4M3_TABLE = _ref.e4m3_to_float(np.arange(256, dtype=np.uint8))  # float32 value of every byte (numpy judge)
_MIDPOINTS = tuple(float(m) for m in _ref.NVFP4_MIDPOINTS)
_LEVELS = _ref.NVFP4_LEVELS


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class Fp8Tensor:
    """An fp8 E4M3 tensor: ``data`` (uint8 E4M3 bytes, the logical shape) times the float32 scalar ``scale``."""

    data: jax.Array
    scale: jax.Array

    def tree_flatten(self):
        return (self.data, self.scale), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    kind = "fp8_e4m3"


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class Nvfp4Tensor:
    """An NVFP4 tensor of logical shape ``[..., D]``: ``packed`` uint8 ``[..., D/2]`` (even element in the low
    nibble), ``micro`` uint8 E4M3 ``[..., D/16]``, ``scale`` the float32 per-tensor scalar."""

    packed: jax.Array
    micro: jax.Array
    scale: jax.Array

    def tree_flatten(self):
        return (self.packed, self.micro, self.scale), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.packed.shape[:-1], 2 * self.packed.shape[-1])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    kind = "nvfp4"


QuantizedKV = (Fp8Tensor, Nvfp4Tensor)


def kv_format(x) -> str | None:
    """``"fp8_e4m3"`` / ``"nvfp4"`` for a quantized tensor, None for anything else (a plain array)."""
    return x.kind if isinstance(x, QuantizedKV) else None


def _check_fields(name: str, t) -> None:
    fields = ("data",) if isinstance(t, Fp8Tensor) else ("packed", "micro")
    for f in fields:
        a = getattr(t, f)
        if not hasattr(a, "dtype") or jnp.dtype(a.dtype) != jnp.uint8:
            raise ValueError(f"{name}.{f} must be a uint8 array; got {getattr(a, 'dtype', type(a).__name__)}")
    sc = t.scale
    if not hasattr(sc, "dtype") or jnp.dtype(sc.dtype) != jnp.float32 or tuple(jnp.shape(sc)) != ():
        raise ValueError(f"{name}.scale must be a float32 scalar; got {getattr(sc, 'dtype', type(sc).__name__)} "
                         f"shape {tuple(jnp.shape(sc))}")
    if isinstance(t, Nvfp4Tensor):
        p, m = t.packed, t.micro
        if p.ndim < 1 or (2 * p.shape[-1]) % NVFP4_BLOCK or tuple(m.shape) != (*p.shape[:-1],
                                                                               2 * p.shape[-1] // NVFP4_BLOCK):
            raise ValueError(f"{name}: NVFP4 needs packed [..., D/2] and micro [..., D/16] with D % 16 == 0; got "
                             f"packed {tuple(p.shape)}, micro {tuple(m.shape)}")


def kv_view(q, k, v, names: tuple[str, str] = ("k", "v")):
    """What the API's shape checks see of a K/V pair: a quantized pair (both the same type, fields checked) as
    ``ShapeDtypeStruct``s of its logical shape in q's dtype; plain arrays are returned unchanged. A mix of a
    quantized and a plain tensor, or of two formats, raises ValueError naming both."""
    fk, fv = kv_format(k), kv_format(v)
    if fk is None and fv is None:
        return k, v
    if fk != fv:
        raise ValueError(f"{names[0]} and {names[1]} must be stored alike (both plain, both Fp8Tensor or both "
                         f"Nvfp4Tensor); got {fk or type(k).__name__}, {fv or type(v).__name__}")
    _check_fields(names[0], k)
    _check_fields(names[1], v)
    dt = getattr(q, "dtype", jnp.float16)
    return jax.ShapeDtypeStruct(k.shape, dt), jax.ShapeDtypeStruct(v.shape, dt)


def _as_float32(x, name: str) -> jax.Array:
    if not hasattr(x, "dtype") or not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must be a floating array (float16/bfloat16/float32/float64); "
                         f"got {getattr(x, 'dtype', type(x).__name__)}")
    return jnp.asarray(x).astype(jnp.float32)


def _pow2(k):
    """``2.0 ** k`` as float32 for int32 ``k`` in [-126, 127], built from its exponent bits (exact)."""
    return lax.bitcast_convert_type(((k + 127) << 23).astype(jnp.int32), jnp.float32)


@jax.jit
def float_to_e4m3(x) -> jax.Array:
    """Encode floats as E4M3 bytes (uint8): nearest, ties to even; saturate to +-448 (inf too); NaN -> 0x7F with
    its sign bit; -0.0 -> 0x80. The method of ``attn_core.formats.float_to_e4m3``: the spacing of E4M3 values
    in the binade of ``|x|`` (never finer than the subnormal 2^-9), ``|x|`` over it rounded half-to-even
    (exact: a power-of-two scaling), added to the binade's first byte."""
    x32 = _as_float32(x, "x")
    bits = lax.bitcast_convert_type(x32, jnp.uint32)
    sign = ((bits >> 31) << 7).astype(jnp.int32)
    a = jnp.abs(x32)
    finite = jnp.isfinite(a)
    a_fin = jnp.where(finite, a, 0.0)
    exp = ((lax.bitcast_convert_type(a_fin, jnp.uint32) >> 23).astype(jnp.int32)) - 127
    u = jnp.where(a_fin < np.float32(2.0**-6), -6, exp)  # the subnormal binade shares the 2^-9 spacing
    steps = jnp.round(a_fin * _pow2(3 - u)).astype(jnp.int32)  # jnp.round: half to even
    code = ((u + 7) << 3) + steps - 8
    code = jnp.where(finite, jnp.minimum(code, 0x7E), 0x7E)
    code = jnp.where(jnp.isnan(x32), 0x7F, code)
    return (code | sign).astype(jnp.uint8)


@jax.jit
def e4m3_to_float(b) -> jax.Array:
    """Decode E4M3 bytes (uint8) to float32 (0x7F/0xFF NaN, 0x80 -0.0): a 256-entry table lookup."""
    if getattr(b, "dtype", None) != jnp.uint8:
        raise ValueError(f"b must be a uint8 array of E4M3 bytes; got dtype {getattr(b, 'dtype', None)}")
    return jnp.asarray(_E4M3_TABLE)[b.astype(jnp.int32)]


def _exact_div(a, b):
    """``a / b`` as one IEEE float32 division per element. XLA's simplifier rewrites a division by a constant or
    by a broadcast into a multiplication by a rounded reciprocal (other bits: 1e-12 / 448 differs in the last
    place, and ties move), so the divisor is materialized at ``a``'s shape behind an optimization barrier, where
    the simplifier cannot see what it is."""
    b = jnp.broadcast_to(jnp.asarray(b, jnp.float32), jnp.shape(a))
    a, b = lax.optimization_barrier((a, b))  # also keeps (a / b) / c from becoming a / (b * c)
    return a / b


def _tensor_scale(x32, divisor: float):
    """``max(amax|x|, 1e-12) / divisor`` in float32 (NaN propagates through amax, as in the judge)."""
    return _exact_div(jnp.maximum(jnp.max(jnp.abs(x32)), _AMAX_FLOOR), np.float32(divisor))


@jax.jit
def quantize_fp8_e4m3(x) -> Fp8Tensor:
    """Per-tensor symmetric fp8: ``scale = max(amax, 1e-12) / 448``, bytes ``E4M3(x / scale)``."""
    x32 = _as_float32(x, "x")
    if x32.size == 0:
        raise ValueError(f"x must be non-empty to have a scale; got shape {x32.shape}")
    scale = _tensor_scale(x32, E4M3_MAX)
    return Fp8Tensor(data=float_to_e4m3(_exact_div(x32, scale)), scale=scale)


@jax.jit
def dequantize_fp8_e4m3(t: Fp8Tensor) -> jax.Array:
    """float32 values of an :class:`Fp8Tensor`: ``e4m3_to_float(data) * scale``."""
    return e4m3_to_float(t.data) * t.scale.astype(jnp.float32)


@jax.jit
def quantize_nvfp4(x) -> Nvfp4Tensor:
    """Two-level NVFP4 of ``x [..., D]`` along its last axis (``D % 16 == 0``)."""
    x32 = _as_float32(x, "x")
    if x32.ndim == 0 or x32.shape[-1] == 0 or x32.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"x must have shape [..., D] with D a positive multiple of {NVFP4_BLOCK}; got {x32.shape}")
    scale = _tensor_scale(x32, 6.0 * E4M3_MAX)
    blocks = x32.reshape(*x32.shape[:-1], -1, NVFP4_BLOCK)
    block_amax = jnp.max(jnp.abs(blocks), axis=-1)
    micro = float_to_e4m3(_exact_div(_exact_div(jnp.maximum(block_amax, _AMAX_FLOOR), np.float32(6.0)), scale))
    eff = e4m3_to_float(micro) * scale
    eff = eff[..., None]
    y = _exact_div(blocks, eff)
    index = sum((jnp.abs(y) > np.float32(m)).astype(jnp.int32) for m in _MIDPOINTS)
    index, negative = _judge_edge_cases(blocks, eff, index)
    codes = (index | (negative.astype(jnp.int32) << 3)).reshape(x32.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return Nvfp4Tensor(packed=packed.astype(jnp.uint8), micro=micro, scale=scale)


def _judge_edge_cases(x, eff, index):
    """The judge's code of ``y = x / eff`` where XLA's float32 flushing would change it.

    XLA treats float32 subnormals as zero (inputs and results), numpy does not. Two cases matter: an underflowed
    micro-scale (``eff == 0``: ``y`` is +-inf for any non-zero ``x``, code 7 with x's sign, NaN for 0, code 0),
    and the sign bit ``y < 0`` of a tiny quotient (the judge's ``y`` is a negative subnormal, not -0.0, unless
    ``|x| / eff`` rounds to zero, i.e. ``|x| <= eff * 2^-150``). Both are decided here from x's bits with exact
    arithmetic: ``|x| = M * 2^(E - 150)`` (M < 2^24 an integer, E >= 1), so ``|x| > eff * 2^-150`` iff
    ``M > eff * 2^-E``, a power-of-two scaling in three steps: exact while the threshold is >= 2^-126, and
    below that any M >= 1 exceeds it whatever the flushing does.
    """
    bits = lax.bitcast_convert_type(x, jnp.uint32)
    mag = bits & 0x7FFFFFFF
    is_nan = mag > 0x7F800000
    nonzero = (mag != 0) & ~is_nan
    e = (mag >> 23).astype(jnp.int32)
    m = (mag & 0x7FFFFF).astype(jnp.int32)
    big_m = jnp.where(e > 0, m + (1 << 23), m).astype(jnp.float32)  # exact: < 2^24
    k = -jnp.maximum(e, 1)  # in [-254, -1]
    k1 = jnp.maximum(k, -126)
    k2 = jnp.maximum(k - k1, -126)
    threshold = eff * _pow2(k1) * _pow2(k2) * _pow2(k - k1 - k2)
    survives = big_m > threshold  # fl(|x| / eff) != 0 (a tie at 2^-150 rounds to the even 0)
    eff0 = eff == 0
    index = jnp.where(eff0, jnp.where(nonzero, 7, 0), index)
    negative = ((bits >> 31) == 1) & nonzero & (eff0 | survives)
    return index, negative


@jax.jit
def dequantize_nvfp4(t: Nvfp4Tensor) -> jax.Array:
    """float32 values ``[..., D]``: ``level * sign * e4m3(micro) * scale``, left to right in float32."""
    packed, micro = t.packed, t.micro
    if packed.dtype != jnp.uint8 or micro.dtype != jnp.uint8:
        raise ValueError(f"packed and micro must be uint8; got {packed.dtype}, {micro.dtype}")
    d = 2 * packed.shape[-1] if packed.ndim else 0
    if d == 0 or d % NVFP4_BLOCK or tuple(micro.shape) != (*packed.shape[:-1], d // NVFP4_BLOCK):
        raise ValueError(f"micro must have shape [..., D/{NVFP4_BLOCK}] for packed [..., D/2]; got "
                         f"{packed.shape=}, {micro.shape=}")
    p = packed.astype(jnp.int32)
    codes = jnp.stack([p & 0xF, p >> 4], axis=-1).reshape(*packed.shape[:-1], d)
    level = jnp.asarray(_LEVELS)[codes & 7]
    signed = jnp.where((codes & 8) != 0, -level, level)
    micro_el = jnp.repeat(e4m3_to_float(micro), NVFP4_BLOCK, axis=-1)
    return (signed * micro_el) * t.scale.astype(jnp.float32)


def build_paged_quantized(k, v, page_size: int, *, seed: int = 0, kv_lens=None):
    """Page a quantized dense cache (quantize first, then page, as the reference's builders do): ``k``, ``v``
    both Fp8Tensor or both Nvfp4Tensor of logical shape ``[B, Tk, Hkv, D]``. Every field is paged with
    ``attn_core.paging.build_paged_kv`` under the same seed (one permutation for data, packed and micro
    pools). Returns ``(k_pool, v_pool, block_table)`` with the pools of the same type (scales unchanged)."""
    fmt = kv_format(k)
    if fmt is None or kv_format(v) != fmt:
        raise ValueError(f"k and v must both be Fp8Tensor or both Nvfp4Tensor; got {type(k).__name__}, "
                         f"{type(v).__name__}")
    fields = ("data",) if fmt == "fp8_e4m3" else ("packed", "micro")
    pools_k, pools_v, table = {}, {}, None
    for f in fields:
        kp, vp, table = _paging.build_paged_kv(np.asarray(getattr(k, f)), np.asarray(getattr(v, f)), page_size,
                                               seed=seed, kv_lens=kv_lens)
        pools_k[f], pools_v[f] = jnp.asarray(kp), jnp.asarray(vp)
    cls = type(k)
    return (cls(**pools_k, scale=k.scale), cls(**pools_v, scale=v.scale), jnp.asarray(table))
