"""attn_core.formats (fp8 E4M3, NVFP4) and the quantized / MLA oracles built on it.

The E4M3 codec is checked against ml_dtypes (an independent implementation) wherever both define the result;
where our contract deliberately differs (saturation instead of NaN above 448) the contract is asserted directly.
"""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from attn_core import formats as F
from attn_core import oracle as ref

ROOT = Path(__file__).resolve().parents[1]


def _ml_e4m3():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return ml_dtypes.float8_e4m3fn


def _ml_encode(x):
    """ml_dtypes' RNE encoding of float32 values (only meaningful for |x| <= 448 and non-NaN)."""
    return np.asarray(x, dtype=np.float32).astype(_ml_e4m3()).view(np.uint8)


def _positive_e4m3_values():
    """All finite non-negative E4M3 values, ascending (bytes 0x00..0x7E)."""
    return F.e4m3_to_float(np.arange(0x7F, dtype=np.uint8))


# ---------------------------------------------------------------------------------------------------------------
# E4M3 codec


def test_e4m3_decode_all_256_bytes_matches_ml_dtypes():
    b = np.arange(256, dtype=np.uint8)
    ours = F.e4m3_to_float(b)
    theirs = b.view(_ml_e4m3()).astype(np.float32)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)  # NaN positions must agree too
    np.testing.assert_array_equal(np.signbit(ours), np.signbit(theirs))
    assert set(np.flatnonzero(np.isnan(ours))) == {0x7F, 0xFF}
    assert ours[0x7E] == 448.0 and ours[0xFE] == -448.0
    assert ours[0x01] == 2.0**-9 and ours[0x08] == 2.0**-6  # smallest subnormal, smallest normal


def test_e4m3_encode_round_trips_every_byte():
    b = np.arange(256, dtype=np.uint8)
    again = F.float_to_e4m3(F.e4m3_to_float(b))
    finite = (b & 0x7F) != 0x7F
    np.testing.assert_array_equal(again[finite], b[finite])  # 0x80 (-0.0) included
    np.testing.assert_array_equal(again[~finite], [0x7F, 0xFF])  # NaN keeps its sign


def test_e4m3_encode_random_magnitudes_matches_ml_dtypes(rng):
    n = 200_000
    mags = np.exp2(rng.uniform(-16.0, np.log2(448.0), n))
    x = (rng.choice([-1.0, 1.0], n) * mags).astype(np.float32)
    # float32 subnormals and exact zeros too
    x = np.concatenate([x, np.float32([1e-40, -1e-40, 0.0, 448.0, -448.0, 2.0**-10, 2.0**-10 * 1.0001])])
    np.testing.assert_array_equal(F.float_to_e4m3(x), _ml_encode(x))


def test_e4m3_exact_ties_round_to_even():
    vals = _positive_e4m3_values().astype(np.float64)
    mids = ((vals[:-1] + vals[1:]) / 2).astype(np.float32)  # exact: at most 5 significant bits
    assert np.array_equal(mids.astype(np.float64), (vals[:-1] + vals[1:]) / 2)
    got = F.float_to_e4m3(mids)
    # RNE: of the two neighbours (bytes i and i+1), the one with the even mantissa, i.e. the even byte
    lower = np.arange(0x7E, dtype=np.uint8)
    np.testing.assert_array_equal(got, np.where(lower % 2 == 0, lower, lower + 1))
    np.testing.assert_array_equal(got, _ml_encode(mids))
    np.testing.assert_array_equal(F.float_to_e4m3(-mids), got | 0x80)
    # one float32 ulp either side of a tie decides it
    np.testing.assert_array_equal(F.float_to_e4m3(np.nextafter(mids, np.float32(0))), lower)
    np.testing.assert_array_equal(F.float_to_e4m3(np.nextafter(mids, np.float32(np.inf))), lower + 1)


def test_e4m3_subnormals():
    k = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(F.float_to_e4m3(k * np.float32(2.0**-9)), np.arange(8))
    # 2^-10 is the tie between 0 and the smallest subnormal: even (0) wins; above it rounds up
    assert F.float_to_e4m3(np.float32([2.0**-10]))[0] == 0x00
    assert F.float_to_e4m3(np.float32([-(2.0**-10)]))[0] == 0x80
    assert F.float_to_e4m3(np.float32([2.0**-10 * 1.01]))[0] == 0x01
    # 7.5 * 2^-9 rounds to even 8 * 2^-9 = 2^-6, the smallest normal (a carry across the subnormal boundary)
    assert F.float_to_e4m3(np.float32([7.5 * 2.0**-9]))[0] == 0x08


def test_e4m3_signed_zero():
    got = F.float_to_e4m3(np.float32([0.0, -0.0, -1e-30, 1e-30]))
    np.testing.assert_array_equal(got, [0x00, 0x80, 0x80, 0x00])
    assert np.signbit(F.e4m3_to_float(np.uint8([0x80]))[0])


def test_e4m3_saturates_above_448():
    x = np.float32([448.0, 449.0, 463.9, 464.0, 465.0, 480.0, 1e6, 3.4e38, np.inf])
    np.testing.assert_array_equal(F.float_to_e4m3(x), np.full(x.shape, 0x7E))
    np.testing.assert_array_equal(F.float_to_e4m3(-x), np.full(x.shape, 0xFE))
    # ml_dtypes' cast is non-saturating (overflow -> NaN): the one place our contract differs on purpose
    assert np.isnan(np.float32(1e6).astype(_ml_e4m3()).astype(np.float32))


def test_e4m3_nan():
    got = F.float_to_e4m3(np.float32([np.nan, -np.nan, 1.0]))
    np.testing.assert_array_equal(got, [0x7F, 0xFF, 0x38])


def test_e4m3_input_dtypes_and_errors():
    x = np.array([0.1, -3.3, 300.0])
    expect = F.float_to_e4m3(x.astype(np.float32))
    for dt in (np.float16, np.float64):
        np.testing.assert_array_equal(F.float_to_e4m3(x.astype(dt)), F.float_to_e4m3(x.astype(dt).astype(np.float32)))
    np.testing.assert_array_equal(F.float_to_e4m3(x), expect)
    # the contract starts at float32: a float64 just above the 1.0/1.125 tie first rounds to the tie itself
    assert F.float_to_e4m3(np.array([1.0625 + 2.0**-40]))[0] == F.float_to_e4m3(np.float32([1.0]))[0]
    assert F.float_to_e4m3(np.zeros((2, 0, 3), np.float32)).shape == (2, 0, 3)
    with pytest.raises(ValueError, match="x must be a floating"):
        F.float_to_e4m3(np.arange(3))
    with pytest.raises(ValueError, match="b must be a uint8"):
        F.e4m3_to_float(np.arange(3, dtype=np.int8))


# ---------------------------------------------------------------------------------------------------------------
# fp8 per-tensor quantization


def test_fp8_scale_formula_and_one_scale_per_tensor(rng):
    x = (rng.standard_normal((2, 5, 3, 16)) * 7).astype(np.float32)
    t = F.quantize_fp8_e4m3(x)
    assert isinstance(t.scale, np.float32) and np.ndim(t.scale) == 0
    assert t.data.dtype == np.uint8 and t.data.shape == x.shape == t.shape
    assert t.scale == np.float32(np.max(np.abs(x))) / np.float32(448.0)
    # the largest element lands exactly on +-448
    i = np.unravel_index(np.argmax(np.abs(x)), x.shape)
    assert t.data[i] & 0x7F == 0x7E
    # one scale for the whole tensor: changing one element elsewhere rescales every element
    x2 = x.copy()
    x2[1, 4, 2, 15] = 1000.0
    t2 = F.quantize_fp8_e4m3(x2)
    assert t2.scale == np.float32(1000.0) / np.float32(448.0)
    np.testing.assert_array_equal(t.data, F.float_to_e4m3(x / t.scale))
    np.testing.assert_array_equal(F.dequantize_fp8_e4m3(t), F.e4m3_to_float(t.data) * t.scale)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_fp8_round_trip_error_bound(rng, dtype):
    x = (rng.standard_normal((4, 64, 8)) * np.exp2(rng.uniform(-6, 6, (4, 64, 1)))).astype(dtype)
    t = F.quantize_fp8_e4m3(x)
    deq = F.dequantize_fp8_e4m3(t)
    assert deq.dtype == np.float32
    x32 = x.astype(np.float32)
    # half an E4M3 ulp: 2^-4 relative for normals, 2^-10 (in units of scale) for subnormals; slack for float32
    bound = np.maximum(np.abs(x32) * 2.0**-4, 2.0**-10 * t.scale) * (1 + 1e-5)
    assert np.all(np.abs(deq.astype(np.float64) - x32) <= bound)


def test_fp8_signed_zero_and_all_zero():
    t = F.quantize_fp8_e4m3(np.float32([-0.0, 0.0, 2.0]))
    np.testing.assert_array_equal(t.data, [0x80, 0x00, 0x7E])
    deq = F.dequantize_fp8_e4m3(t)
    assert deq[0] == 0 and np.signbit(deq[0]) and deq[2] == 2.0
    z = F.quantize_fp8_e4m3(np.zeros((3, 4)))
    assert z.scale == np.float32(1e-12) / np.float32(448.0)
    assert not z.data.any() and not F.dequantize_fp8_e4m3(z).any()


def test_fp8_nan_and_inf_poison_the_tensor():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # documented behaviour, not a numpy RuntimeWarning
        t = F.quantize_fp8_e4m3(np.float32([1.0, np.nan, -2.0]))
        assert np.isnan(t.scale)
        assert np.all((t.data & 0x7F) == 0x7F)
        assert np.all(np.isnan(F.dequantize_fp8_e4m3(t)))
        u = F.quantize_fp8_e4m3(np.float32([1.0, np.inf]))
        assert np.isinf(u.scale) and np.all(np.isnan(F.dequantize_fp8_e4m3(u)))


def test_fp8_bad_input():
    with pytest.raises(ValueError, match="x must be a floating"):
        F.quantize_fp8_e4m3(np.arange(4))
    with pytest.raises(ValueError, match="non-empty"):
        F.quantize_fp8_e4m3(np.zeros((0, 4), np.float32))


# ---------------------------------------------------------------------------------------------------------------
# NVFP4


def test_nvfp4_hand_worked_example():
    # Global amax 2688 = 6 * 448, so the per-tensor scale is exactly 1.0.
    # Block 0: amax 2688 -> micro = E4M3(2688 / 6 / 1) = 448 = 0x7E, eff = 448; x = 448 * y with y chosen to hit
    #   every level, the midpoints (which round down) and the sign rule (-0.0 codes as 0).
    y0 = [-0.0, 0.25, 0.3, 0.75, 1.0, 1.25, 1.6, 1.75, 2.2, 2.5, 3.4, 3.5, 4.9, 5.0, -5.5, 6.0]
    codes0 = [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 15, 7]
    # Block 1: amax 1000 -> 1000 / 6 = 166.67 -> E4M3 rounds to 160 (binade 128, step 16) = 0 1110 010 = 0x72,
    #   eff = 160: 1000 -> 6.25 -> code 7; -400 -> -2.5 (tie, down) -> 8|4 = 12; 80 -> 0.5 -> 1;
    #   40 -> 0.25 (tie, down) -> 0; 200 -> 1.25 (tie, down) -> 2.
    x1 = [1000.0, -400.0, 80.0, 40.0, 200.0] + [0.0] * 11
    x = np.array([[448.0 * v for v in y0] + x1], dtype=np.float32)  # [1, 32]
    x[0, 0] = -0.0
    t = F.quantize_nvfp4(x)
    assert t.scale == np.float32(1.0)
    np.testing.assert_array_equal(t.micro, [[0x7E, 0x72]])
    # packing: even element in the low nibble
    expect_bytes = [0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x7F, 0xC7, 0x01, 0x02, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(t.packed, [expect_bytes])
    assert [(b & 0xF, b >> 4) for b in expect_bytes[:8]] == list(zip(codes0[0::2], codes0[1::2]))
    deq0 = [0, 0, 224, 224, 448, 448, 672, 672, 896, 896, 1344, 1344, 1792, 1792, -2688, 2688]
    deq1 = [960, -320, 80, 0, 160] + [0] * 11
    np.testing.assert_array_equal(F.dequantize_nvfp4(t), [deq0 + deq1])
    assert t.shape == (1, 32)


def test_nvfp4_midpoint_ties_round_down_and_above_5_is_6():
    # scale 1 and eff 448 (as in the hand-worked example): y = x / 448 exactly
    y = np.float32(
        [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 5.0000005, -5.0000005, 5.5, -0.25, 0.2500001, 0, 0]
    )
    t = F.quantize_nvfp4((y * 448).astype(np.float32))
    codes = np.stack([t.packed & 0xF, t.packed >> 4], axis=-1).reshape(-1)
    np.testing.assert_array_equal(codes, [7, 0, 1, 2, 3, 4, 5, 6, 14, 7, 15, 7, 8, 1, 0, 0])
    # code 8 (a negative tiny value) is E2M1's negative zero
    deq = F.dequantize_nvfp4(t)
    assert deq[12] == 0 and np.signbit(deq[12])


def test_nvfp4_even_element_in_low_nibble():
    x = np.zeros(16, np.float32)
    x[0], x[1] = 448.0, 2688.0  # y = 1 (code 2) and y = 6 (code 7)
    x[2], x[3] = -2688.0, 0.0  # code 15, code 0
    t = F.quantize_nvfp4(x)
    assert t.packed.shape == (8,) and t.micro.shape == (1,)
    assert t.packed[0] == 0x72 and t.packed[1] == 0x0F


@pytest.mark.parametrize("shape", [(3, 24), (8,), (2, 0), ()])
def test_nvfp4_last_dim_must_be_multiple_of_16(shape):
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., D\]") as e:
        F.quantize_nvfp4(np.ones(shape, np.float32))
    assert str(shape) in str(e.value)


def test_nvfp4_bad_input():
    with pytest.raises(ValueError, match="x must be a floating"):
        F.quantize_nvfp4(np.ones((2, 16), np.int32))
    t = F.quantize_nvfp4(np.ones((2, 32), np.float32))
    with pytest.raises(ValueError, match="micro must have shape"):
        F.dequantize_nvfp4(F.Nvfp4Array(t.packed, t.micro[:, :1], t.scale))
    with pytest.raises(ValueError, match="uint8"):
        F.dequantize_nvfp4(F.Nvfp4Array(t.packed.astype(np.int16), t.micro, t.scale))


def _nvfp4_independent(x32):
    """A second NVFP4 encoder, written differently: micro via ml_dtypes, level by nearest distance (ties low)."""
    scale = np.float32(np.max(np.abs(x32))) / np.float32(2688.0)
    blocks = x32.reshape(*x32.shape[:-1], -1, 16)
    bamax = np.max(np.abs(blocks), axis=-1)
    micro = _ml_encode(np.maximum(bamax, np.float32(1e-12)) / np.float32(6.0) / scale)
    eff = micro.view(_ml_e4m3()).astype(np.float32) * scale
    y = (blocks / eff[..., None]).astype(np.float64)
    dist = np.abs(np.abs(y)[..., None] - F.NVFP4_LEVELS.astype(np.float64))
    codes = np.argmin(dist, axis=-1) + 8 * (y < 0)  # argmin takes the first (lower) level on a tie
    codes = codes.reshape(x32.shape)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8), micro


def test_nvfp4_random_round_trip(rng):
    x = (rng.standard_normal((3, 40, 4, 64)) * np.exp2(rng.uniform(-4, 4, (3, 40, 4, 1)))).astype(np.float32)
    t = F.quantize_nvfp4(x)
    assert t.packed.shape == (3, 40, 4, 32) and t.micro.shape == (3, 40, 4, 4)
    assert t.packed.dtype == t.micro.dtype == np.uint8 and isinstance(t.scale, np.float32)
    assert t.scale == np.float32(np.max(np.abs(x))) / np.float32(6 * 448)
    packed, micro = _nvfp4_independent(x)
    np.testing.assert_array_equal(t.micro, micro)
    np.testing.assert_array_equal(t.packed, packed)

    deq = F.dequantize_nvfp4(t)
    assert deq.dtype == np.float32 and deq.shape == x.shape
    blocks = x.reshape(3, 40, 4, 4, 16).astype(np.float64)
    dblocks = deq.reshape(blocks.shape).astype(np.float64)
    eff = F.e4m3_to_float(t.micro).astype(np.float64) * float(t.scale)
    # bit-exact dequant: level * micro is exact, so the contract rounds once, when multiplying by the scale
    codes = np.stack([t.packed & 0xF, t.packed >> 4], axis=-1).reshape(x.shape)
    signed = F.NVFP4_LEVELS[codes & 7].astype(np.float64) * np.where(codes & 8, -1.0, 1.0)
    micro_f = np.repeat(F.e4m3_to_float(t.micro), 16, axis=-1).astype(np.float64)
    np.testing.assert_array_equal(deq, (signed * micro_f * float(t.scale)).astype(np.float32))
    # every value is a signed level times its block's effective scale
    ratio = np.abs(dblocks) / eff[..., None]
    assert np.all(np.isin(np.round(ratio, 4), F.NVFP4_LEVELS))
    # error: at most half the widest level gap (1, between 4 and 6) times eff, eff within 2^-4 of amax / 6
    bamax = np.abs(blocks).max(axis=-1, keepdims=True)
    assert np.all(np.abs(dblocks - blocks) <= bamax / 6 * (1 + 2.0**-4) * (1 + 1e-5))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_nvfp4_accepts_other_float_dtypes(rng, dtype):
    x = rng.standard_normal((2, 32)).astype(dtype)
    a, b = F.quantize_nvfp4(x), F.quantize_nvfp4(x.astype(np.float32))
    np.testing.assert_array_equal(a.packed, b.packed)
    np.testing.assert_array_equal(a.micro, b.micro)
    assert a.scale == b.scale


def test_nvfp4_zeros_negative_zero_and_underflowed_block():
    z = F.quantize_nvfp4(np.zeros((2, 16)))
    assert z.scale == np.float32(1e-12) / np.float32(2688.0)
    np.testing.assert_array_equal(z.micro, [[0x7E], [0x7E]])  # 1e-12 / 6 / scale = 448
    assert not z.packed.any() and not F.dequantize_nvfp4(z).any()
    # -0.0 codes as 0 (no sign): NVFP4 keeps no signed zero for it
    nz = F.quantize_nvfp4(np.array([-0.0] * 15 + [1.0], np.float32))
    assert nz.packed[0] == 0 and not np.signbit(F.dequantize_nvfp4(nz)[0])
    # a block far below the tensor amax: its micro-scale underflows to E4M3 zero and it dequantizes to zeros
    x = np.zeros((2, 16), np.float32)
    x[0, 0], x[1, :] = 1000.0, 1e-6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = F.quantize_nvfp4(x)
        deq = F.dequantize_nvfp4(t)
    assert t.micro[1, 0] == 0 and np.all(deq[1] == 0) and deq[0, 0] == 1000.0


def test_nvfp4_nan_makes_the_scale_nan():
    x = np.ones((2, 16), np.float32)
    x[1, 3] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = F.quantize_nvfp4(x)
        deq = F.dequantize_nvfp4(t)
    assert np.isnan(t.scale)
    np.testing.assert_array_equal(t.micro, [[0x7F], [0x7F]])
    assert np.all(np.isnan(deq))


def test_bytes_per_element():
    assert F.bytes_per_element("fp8") == 1.0
    assert F.bytes_per_element("nvfp4") == 0.5625
    assert F.bytes_per_element("fp16") == 2.0 and F.bytes_per_element("bf16") == 2.0
    assert F.bytes_per_element("fp32") == 4.0
    with pytest.raises(ValueError, match="fmt must be one of"):
        F.bytes_per_element("int3")
    assert F.E4M3_MAX == 448.0
    np.testing.assert_array_equal(F.NVFP4_LEVELS, [0, 0.5, 1, 1.5, 2, 3, 4, 6])
    np.testing.assert_array_equal(F.NVFP4_MIDPOINTS, (F.NVFP4_LEVELS[:-1] + F.NVFP4_LEVELS[1:]) / 2)


# ---------------------------------------------------------------------------------------------------------------
# quantized and MLA oracles


@pytest.mark.parametrize("kv_format,dequant", [("fp8", "fp8"), ("nvfp4", "nvfp4")])
def test_quantized_oracle_is_the_oracle_on_dequantized_operands(rng, kv_format, dequant):
    q = rng.standard_normal((2, 3, 4, 32))
    k = rng.standard_normal((2, 7, 2, 32)) * 3
    v = rng.standard_normal((2, 7, 2, 32))
    if dequant == "fp8":
        kd = F.dequantize_fp8_e4m3(F.quantize_fp8_e4m3(k))
        vd = F.dequantize_fp8_e4m3(F.quantize_fp8_e4m3(v))
    else:
        kd = F.dequantize_nvfp4(F.quantize_nvfp4(k))
        vd = F.dequantize_nvfp4(F.quantize_nvfp4(v))
    kw = dict(causal=True, q_offset=4, kv_len=np.array([7, 6]), scale=0.2)
    out, lse = ref.quantized_attention_reference(q, k, v, kv_format=kv_format, **kw)
    out_d, lse_d = ref.attention_reference(q, kd, vd, **kw)
    np.testing.assert_array_equal(out, out_d)
    np.testing.assert_array_equal(lse, lse_d)
    out_exact, _ = ref.attention_reference(q, k, v, **kw)
    assert not np.array_equal(out, out_exact)  # it really attends over the quantized cache
    np.testing.assert_allclose(out, out_exact, atol=0.5)


def test_quantized_oracle_rejects_unknown_format(rng):
    q = rng.standard_normal((1, 1, 1, 16))
    with pytest.raises(ValueError, match="kv_format"):
        ref.quantized_attention_reference(q, q, q, kv_format="int4")


def _mla_case(rng, *, b=2, tq=3, tk=9, h=4, d_nope=8, rope=4, lora=16, d_v=8):
    q_nope = rng.standard_normal((b, tq, h, d_nope))
    q_rope = rng.standard_normal((b, tq, h, rope))
    latent = rng.standard_normal((b, tk, 1, lora + rope))
    w_uk = rng.standard_normal((h, d_nope, lora)) / np.sqrt(lora)
    w_uv = rng.standard_normal((h, d_v, lora)) / np.sqrt(lora)
    return q_nope, q_rope, latent, w_uk, w_uv


@pytest.mark.parametrize("causal,q_offset", [(False, 0), (True, 6), (True, 0)])
def test_mla_absorption_identity(rng, causal, q_offset):
    q_nope, q_rope, latent, w_uk, w_uv = _mla_case(rng)
    lora = 16
    out, lse = ref.mla_materialized_reference(
        q_nope, q_rope, latent, kv_lora_rank=lora, w_uk=w_uk, w_uv=w_uv, causal=causal, q_offset=q_offset
    )
    assert out.shape == (2, 3, 4, 8) and lse.shape == (2, 4, 3)
    q_abs = np.concatenate([np.einsum("bqhd,hdl->bqhl", q_nope, w_uk), q_rope], axis=-1)
    scale = 1 / np.sqrt(8 + 4)  # the materialized head dim, passed explicitly to the absorbed form
    o_abs, lse_abs = ref.mla_attention_reference(
        q_abs, latent, kv_lora_rank=lora, scale=scale, causal=causal, q_offset=q_offset
    )
    assert o_abs.shape == (2, 3, 4, lora) and lse_abs.shape == (2, 4, 3)
    np.testing.assert_allclose(np.einsum("bqhl,hvl->bqhv", o_abs, w_uv), out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(lse_abs, lse, rtol=1e-10)
    if causal and q_offset == 0:  # query i sees keys 0..i only: query 0 attends to key 0 alone
        np.testing.assert_allclose(o_abs[:, 0], np.broadcast_to(latent[:, 0, :, :lora], (2, 4, lora)), rtol=1e-12)


def test_mla_absorbed_matches_direct_formula(rng):
    q = rng.standard_normal((1, 2, 3, 20))
    latent = rng.standard_normal((1, 5, 1, 20))
    out, lse = ref.mla_attention_reference(q, latent, kv_lora_rank=16, kv_len=4)
    s = np.einsum("bqhd,bkd->bhqk", q, latent[:, :, 0]) / np.sqrt(20)  # default scale 1/sqrt(DQK)
    s[..., 4:] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    expect = np.einsum("bhqk,bkl->bqhl", p / p.sum(-1, keepdims=True), latent[:, :, 0, :16])
    np.testing.assert_allclose(out, expect, rtol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(s).sum(-1)), rtol=1e-12)


def test_mla_shape_errors(rng):
    q_nope, q_rope, latent, w_uk, w_uv = _mla_case(rng)
    q = rng.standard_normal((2, 3, 4, 20))
    with pytest.raises(ValueError, match="latent"):
        ref.mla_attention_reference(q, np.concatenate([latent, latent], axis=2), kv_lora_rank=16)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        ref.mla_attention_reference(q, latent, kv_lora_rank=21)
    with pytest.raises(ValueError, match="DQK"):
        ref.mla_attention_reference(q[..., :18], latent, kv_lora_rank=16)
    with pytest.raises(ValueError, match="w_uk"):
        ref.mla_materialized_reference(q_nope, q_rope, latent, kv_lora_rank=16, w_uk=w_uk[:2], w_uv=w_uv)
    with pytest.raises(ValueError, match="q_rope"):
        ref.mla_materialized_reference(q_nope, q_rope[..., :3], latent, kv_lora_rank=16, w_uk=w_uk, w_uv=w_uv)


def test_import_pulls_in_no_framework():
    code = (
        "import attn_core.formats, attn_core.oracle, sys; "
        "assert not any(m.split('.')[0] in ('jax', 'torch', 'ml_dtypes') for m in sys.modules), "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'torch', 'ml_dtypes'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
