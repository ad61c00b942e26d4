"""Quantized KV caches in JAX: fp8 E4M3 (per-tensor scale) and NVFP4 (E2M1 codes, E4M3 micro-scales per 16).

The formats, the rounding and the handling of non-finite input are those of ``attn_core.formats`` (the numpy
judge; docs/quantized_kv.md and docs/reference.md §1.4): these jnp versions are jit-able and produce the same
bytes. They use only exact steps: every division the format defines is an IEEE float32 division done in integer
arithmetic (``_div_rn``: correctly rounded on every backend, which XLA's own float division is not on the GPU),
the rest power-of-two scalings, exact products and integer work, so the bytes do not depend on the backend's
division, transcendental, subnormal-flushing or fused-multiply choices.

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


with np.errstate(invalid="ignore"):
    _DEFAULT_NAN = (np.float32(np.inf) / np.float32(np.inf)).view(np.uint32)  # the host's invalid-operation NaN


def _div_rn(a, b):
    """``a / b`` in float32, correctly rounded (nearest, ties to even), computed with integer arithmetic only.

    Why not ``a / b``: the bytes of the judge (numpy, one IEEE float32 division) depend on the last bit of every
    quotient (a tie of the E4M3 or NVFP4 rounding moves with it), and no backend promises that bit: XLA's
    simplifier turns a division by a constant into a multiplication by a rounded reciprocal, XLA flushes float32
    subnormals, and on the GPU the division is not correctly rounded (the H100 gave ``amax / 2688`` one ulp
    high). Here no float operation touches the quotient, so every backend computes the same bits, those of an
    IEEE division in round-to-nearest-even with subnormals kept (the numpy judge on x86-64):

    * ``|a| = A·2^ea``, ``|b| = B·2^eb`` with the significands normalized to ``[2^23, 2^24)`` (subnormal
      operands shifted by their leading zeros), ``A`` doubled when ``A < B`` so that ``A / B`` is in ``[1, 2)``;
    * 25 quotient bits by restoring long division (the remainder stays below ``2^25``, int32), the last one the
      round bit; the remainder's being non-zero is the sticky bit;
    * the significand shifted right into the subnormal range when the exponent is below the normal one (the
      bits shifted out join the round/sticky decision), rounded half to even; a carry runs into the exponent
      field (up to infinity) by plain integer addition of the bit pattern;
    * zeros, infinities and NaNs as the host CPU divides (the judge's numpy): a NaN operand gives that NaN
      quieted (the dividend's first), ``0/0`` and ``inf/inf`` the host's default NaN (``0xFFC00000`` on x86-64:
      its sign bit is the sign the judge's E4M3 byte of such a quotient carries), ``x/0`` a signed infinity,
      ``0/x`` and ``x/inf`` a signed zero.

    About 200 integer operations per element, all elementwise and jit-able (fusible with their neighbours).
    """
    a, b = jnp.broadcast_arrays(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
    ia = lax.bitcast_convert_type(a, jnp.uint32)
    ib = lax.bitcast_convert_type(b, jnp.uint32)
    sign = (ia ^ ib) & np.uint32(0x80000000)
    ma = (ia & np.uint32(0x7FFFFFFF)).astype(jnp.int32)
    mb = (ib & np.uint32(0x7FFFFFFF)).astype(jnp.int32)
    inf_bits = 0x7F800000
    a_nan, b_nan = ma > inf_bits, mb > inf_bits
    a_inf, b_inf = ma == inf_bits, mb == inf_bits
    a_zero, b_zero = ma == 0, mb == 0

    def significand(m):
        # m = |x| bits of a finite non-zero x: x = S * 2^(e - 150) with S in [2^23, 2^24) after normalizing
        field = m >> 23
        s = jnp.where(field > 0, (m & 0x7FFFFF) | 0x800000, m & 0x7FFFFF)
        s = jnp.where(s == 0, 0x800000, s)  # zeros, infinities: any value, the result is selected below
        e = jnp.maximum(field, 1)
        shift = lax.clz(s) - 8  # > 0 only for a subnormal
        return s << shift, e - shift

    sa, ea = significand(ma)
    sb, eb = significand(mb)
    small = sa < sb
    r = jnp.where(small, sa << 1, sa)  # r / sb in [1, 2)
    e = ea - eb - small.astype(jnp.int32)  # the quotient is (r / sb) * 2^e
    q = jnp.zeros_like(r)
    for _ in range(25):  # 24 significand bits and the round bit
        bit = r >= sb
        q = (q << 1) | bit.astype(jnp.int32)
        r = (jnp.where(bit, r - sb, r)) << 1
    sticky = r != 0
    # the value is q * 2^(e - 24) (q in [2^24, 2^25)); keep q >> n, n = 1 for a normal result, more below 2^-126
    biased = e + 127
    n = jnp.clip(2 - biased, 1, 26)  # q >> 26 is 0 and its bits all lie below the half
    kept = q >> n
    dropped = q & ((1 << n) - 1)
    half = 1 << (n - 1)
    round_up = (dropped > half) | ((dropped == half) & (sticky | ((kept & 1) == 1)))
    # kept carries the leading bit, so the exponent field is biased - 1 (0 for a subnormal result)
    mag = (jnp.maximum(biased - 1, 0) << 23) + kept + round_up.astype(jnp.int32)
    mag = jnp.where(biased >= 255, inf_bits, mag)
    mag = jnp.where(a_zero | b_inf, 0, mag)
    mag = jnp.where(a_inf | b_zero, inf_bits, mag)
    out = mag.astype(jnp.uint32) | sign
    out = jnp.where((a_zero & b_zero) | (a_inf & b_inf), _DEFAULT_NAN, out)
    out = jnp.where(b_nan, ib | np.uint32(0x00400000), out)
    out = jnp.where(a_nan, ia | np.uint32(0x00400000), out)
    return lax.bitcast_convert_type(out, jnp.float32)


def _tensor_scale(x32, divisor: float):
    """``max(amax|x|, 1e-12) / divisor`` in float32 (NaN propagates through amax, as in the judge)."""
    return _div_rn(jnp.maximum(jnp.max(jnp.abs(x32)), _AMAX_FLOOR), np.float32(divisor))


@jax.jit
def quantize_fp8_e4m3(x) -> Fp8Tensor:
    """Per-tensor symmetric fp8: ``scale = max(amax, 1e-12) / 448``, bytes ``E4M3(x / scale)``."""
    x32 = _as_float32(x, "x")
    if x32.size == 0:
        raise ValueError(f"x must be non-empty to have a scale; got shape {x32.shape}")
    scale = _tensor_scale(x32, E4M3_MAX)
    return Fp8Tensor(data=float_to_e4m3(_div_rn(x32, scale)), scale=scale)


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
    micro = float_to_e4m3(_div_rn(_div_rn(jnp.maximum(block_amax, _AMAX_FLOOR), np.float32(6.0)), scale))
    eff = e4m3_to_float(micro) * scale
    eff = eff[..., None]
    y = _div_rn(blocks, eff)
    index = sum((jnp.abs(y) > np.float32(m)).astype(jnp.int32) for m in _MIDPOINTS)
    negative = _is_negative(y)
    codes = (index | (negative.astype(jnp.int32) << 3)).reshape(x32.shape)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return Nvfp4Tensor(packed=packed.astype(jnp.uint8), micro=micro, scale=scale)


def _is_negative(y):
    """The judge's ``y < 0`` read from the bits: the sign bit of a non-zero, non-NaN value. A float comparison
    would not do: XLA treats a negative subnormal as -0.0 (not below zero), numpy does not."""
    bits = lax.bitcast_convert_type(y, jnp.uint32)
    mag = bits & np.uint32(0x7FFFFFFF)
    return ((bits >> 31) == 1) & (mag != 0) & (mag <= np.uint32(0x7F800000))


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
