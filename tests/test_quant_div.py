"""The quantizers' division (pallas_attn.quant._div_rn): correctly rounded float32 a / b in integer arithmetic.

Issue 12's GPU run found XLA's float32 division on the H100 one ulp off the numpy judge (the NVFP4 scale
``amax / 2688``: the GPU's value is ``amax * fl(1/2688)``). The quantizers now divide without any float division,
so the backend's divide cannot reach the bytes. Proved here on the CPU:

* ``_div_rn`` equals numpy's float32 division bit for bit (NaN payloads included) on a special-value grid, random
  bit patterns, wide-range random pairs (overflow, subnormal and zero results), subnormal ties, the overflow
  boundary and the quantizers' own divisions (448, 2688, 6), including the H100's failing case;
* the quantizers' jaxprs hold no float division, so an inexact backend divide has nothing to act on;
* on inputs built so that every quotient is an exact E4M3 or NVFP4 tie (the scale, the micro-scale division and
  ``x / eff``), a division one ulp off either way changes the judge's bytes (checked by perturbing the judge's
  quotients with ``np.nextafter``: the inputs are sensitive) while the JAX quantizers match the judge exactly.
"""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from attn_core import formats as F
from pallas_attn import quant as Q

_div = jax.jit(Q._div_rn)


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _assert_div_matches_numpy(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    with np.errstate(all="ignore"):
        want = _bits(a / b)
    got = _bits(_div(jnp.asarray(a), jnp.asarray(b)))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(_bits(a).flat[i]), hex(_bits(b).flat[i]), hex(got.flat[i]), hex(want.flat[i]))
                           for i in bad[:6]]


def _f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


SPECIALS = _f32([
    0x00000000, 0x80000000,  # +-0
    0x00000001, 0x80000001, 0x007FFFFF, 0x00400000, 0x00000003,  # subnormals
    0x00800000, 0x00800001, 0x80FFFFFF,  # smallest normals
    0x3F800000, 0xBF800000, 0x3FC00000, 0x40400000, 0x40C00000,  # 1, -1, 1.5, 3, 6
    0x43E00000, 0x45280000, 0x2B8CBCCC, 0x3F7FFFFF,  # 448, 2688, 1e-12, 1 - 2^-24
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F000000,  # +-max, 2^127
    0x7F800000, 0xFF800000,  # +-inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA00005, 0x7FC12345,  # quiet / signalling NaNs of both signs
])


def test_special_value_grid():
    a, b = np.meshgrid(SPECIALS, SPECIALS, indexing="ij")
    _assert_div_matches_numpy(a.ravel(), b.ravel())


def test_random_bit_patterns_and_wide_range(rng):
    n = 1 << 15
    pats = rng.integers(0, 2**32, size=(2, n), dtype=np.uint64).astype(np.uint32)
    _assert_div_matches_numpy(_f32(pats[0]), _f32(pats[1]))
    # magnitudes 2^-150 .. 2^128 on both sides: overflow to inf, subnormal and zero quotients, both signs
    with np.errstate(over="ignore"):  # a few overflow to +-inf in the cast: wanted
        a = (rng.standard_normal(n) * np.exp2(rng.uniform(-150, 128, n))).astype(np.float32)
        b = (rng.standard_normal(n) * np.exp2(rng.uniform(-150, 128, n))).astype(np.float32)
    _assert_div_matches_numpy(a, b)
    _assert_div_matches_numpy(rng.standard_normal(n), rng.standard_normal(n))


def test_subnormal_ties_and_the_boundaries():
    # k * 2^-149 over small powers of two and odd divisors: exact halves (ties to even) in the subnormal range,
    # rounding up into the smallest normal, and quotients that vanish (a tie at 2^-150 rounds to the even 0)
    k = np.arange(1, 4097, dtype=np.uint32)
    near_normal = np.arange(0x007FFFF0, 0x00800010, dtype=np.uint32)
    a = _f32(np.concatenate([k, near_normal, near_normal | 0x80000000]))
    for d in (2.0, 4.0, 8.0, 2.0**12, 2.0**24, 3.0, 0.75, 1.0 - 2.0**-24, 1.0 + 2.0**-23, 0.5, 2.0**-20):
        _assert_div_matches_numpy(a, np.full(a.shape, d, np.float32))
    # the overflow boundary: max / (1 - j ulp) rounds to max or to inf, and so does 2^127 / 0.5 ... 2^-1
    top = _f32(np.arange(0x7F7FFFF0, 0x7F800000, dtype=np.uint32))
    below_one = _f32(np.arange(0x3F7FFFF0, 0x3F800001, dtype=np.uint32))
    t, o = np.meshgrid(top, below_one, indexing="ij")
    _assert_div_matches_numpy(t.ravel(), o.ravel())
    _assert_div_matches_numpy(_f32([0x7F000000] * 4), np.float32([0.5, 0.4999999, 0.25, 2.0**-149]))


def test_the_quantizers_divisions_and_the_h100_case(rng):
    amax = (np.abs(rng.standard_normal(1 << 14)) * np.exp2(rng.uniform(-40, 40, 1 << 14))).astype(np.float32)
    for d in (448.0, 6.0 * 448.0, 6.0):
        _assert_div_matches_numpy(amax, np.full(amax.shape, d, np.float32))
    # the H100 run: amax 14.824783 (bits 1097675344) / 2688 must be 1001699486; the GPU gave 1001699487, which is
    # amax times the rounded reciprocal of 2688
    h100_amax = _f32(1097675344)
    assert int(_bits(_div(h100_amax, np.float32(2688.0)))) == 1001699486
    assert int(_bits(h100_amax * (np.float32(1.0) / np.float32(2688.0)))) == 1001699487
    x = np.zeros((2, 16), np.float32)
    x[0, 3] = h100_amax
    assert int(_bits(Q.quantize_nvfp4(jnp.asarray(x)).scale)) == int(_bits(F.quantize_nvfp4(x).scale)) == 1001699486


def _float_div_eqns(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in ("div", "rem") and any(jnp.issubdtype(v.aval.dtype, jnp.floating)
                                                        for v in eqn.outvars):
            found.append(str(eqn))
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _float_div_eqns(sub)
    return found


@pytest.mark.parametrize("name", ["quantize_fp8_e4m3", "quantize_nvfp4"])
def test_no_float_division_reaches_the_backend(name):
    x = jnp.zeros((2, 3, 32), jnp.float32)
    jaxpr = jax.make_jaxpr(getattr(Q, name))(x).jaxpr
    assert _float_div_eqns(jaxpr) == []
    # the walker does see a float division where there is one (the check can fail)
    assert _float_div_eqns(jax.make_jaxpr(lambda a: a / 3.0)(x).jaxpr)


def _tie_inputs():
    """Inputs whose every division is an exact tie of the format's rounding (few significant bits throughout).

    fp8: amax 84 -> scale 84/448 = 0.1875 exactly; x = (E4M3 midpoint) * 0.1875, so x / scale is the midpoint.
    NVFP4: amax 126 -> scale 126/2688 = 3 * 2^-6; a block holding 126 has micro E4M3(126/6/scale) = 448, eff 21,
    and x = (NVFP4 midpoint) * 21 gives y on the midpoint; a block whose amax is (E4M3 midpoint) * 0.28125 puts
    amax / 6 / scale on that E4M3 midpoint (the micro-scale's rounding ties)."""
    vals = F.e4m3_to_float(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)
    mids = ((vals[:-1] + vals[1:]) / 2)[8:120]  # normal-range midpoints below 448
    fp8 = np.concatenate([mids, -mids, [448.0]]) * 0.1875
    fp8 = np.pad(fp8, (0, -fp8.size % 16)).astype(np.float32).reshape(-1, 16)
    nv_mid = np.float64(F.NVFP4_MIDPOINTS)
    blk = np.concatenate([[126.0], nv_mid * 21, -nv_mid * 21, [0.0]])
    micro_blocks = np.zeros((mids.size, 16))
    micro_blocks[:, 0] = mids * 0.28125  # < 126 (mids < 448), 9 significant bits at most: exact in float32
    nv = np.concatenate([blk[None], micro_blocks]).astype(np.float32)
    return fp8, nv


def test_tie_inputs_catch_a_one_ulp_divide_and_the_quantizers_match_the_judge():
    fp8, nv = _tie_inputs()
    # the judge, and the judge with its quotients one ulp off (what an inexact divide does)
    ref8 = F.quantize_fp8_e4m3(fp8)
    assert ref8.scale == np.float32(0.1875)
    for direction in (np.inf, -np.inf):
        moved = F.float_to_e4m3(np.nextafter(fp8 / ref8.scale, np.float32(direction)))
        assert np.count_nonzero(moved != ref8.data) > 50  # the ties are real: one ulp moves the bytes
    got8 = Q.quantize_fp8_e4m3(jnp.asarray(fp8))
    assert np.array_equal(np.asarray(got8.data), ref8.data) and _bits(got8.scale) == _bits(ref8.scale)

    ref4 = F.quantize_nvfp4(nv)
    assert ref4.scale == np.float32(3 * 2.0**-6) and ref4.micro[0, 0] == 0x7E  # E4M3(448)
    eff = F.e4m3_to_float(ref4.micro) * ref4.scale
    y = nv.reshape(*nv.shape[:-1], -1, 16) / eff[..., None]
    micro_q = np.maximum(nv.reshape(nv.shape[0], -1, 16).max(-1), np.float32(1e-12)) / np.float32(6) / ref4.scale
    for direction in (np.inf, -np.inf):
        codes = (np.abs(np.nextafter(y, np.float32(direction)))[..., None] > F.NVFP4_MIDPOINTS).sum(-1)
        want = (np.abs(y)[..., None] > F.NVFP4_MIDPOINTS).sum(-1)
        micro_moved = F.float_to_e4m3(np.nextafter(micro_q, np.float32(direction)))
        assert np.count_nonzero(codes != want) + np.count_nonzero(micro_moved != ref4.micro) > 20
    got4 = Q.quantize_nvfp4(jnp.asarray(nv))
    for f in ("packed", "micro"):
        assert np.array_equal(np.asarray(getattr(got4, f)), getattr(ref4, f)), f
    assert _bits(got4.scale) == _bits(ref4.scale)
