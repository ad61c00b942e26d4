"""The FMA-pipe exp2 of fa_prefill's softmax (``kernels/fast_exp.py``): its numpy float32 mirror, op for op, and the
PTX text it emits. The GPU tests run the kernel against the oracle (tests/gpu/test_fa_prefill_gpu.py, ``*poly4``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pallas_attn.kernels import fa_prefill as fp
from pallas_attn.kernels import fast_exp as fe


def test_relative_error_over_the_softmax_range():
    x = np.linspace(-126.0, 0.0, 2_000_001, dtype=np.float32)
    x = np.concatenate([x, -np.float32(2.0) ** -np.arange(1, 40, dtype=np.float32), np.float32([0.25, 0.5])])
    y = fe.poly_exp2_reference(x).astype(np.float64)
    rel = np.abs(y / np.exp2(x.astype(np.float64)) - 1)
    assert rel.max() < 7.6e-5, rel.max()
    assert rel.max() > 1e-5  # a polynomial, not ex2: the bound above is what it claims


def test_special_values():
    y = fe.poly_exp2_reference(np.float32([-np.inf, -127.0, -200.0, -3e38, np.nan, -np.nan]))
    assert np.array_equal(y[:4], np.zeros(4, np.float32)) and not np.signbit(y[:4]).any()  # a masked key adds 0
    assert np.isnan(y[4:]).all()  # NaN in, NaN out
    # the row's maximum (argument 0) gives 0.99993, which bf16 and fp16 (the P operand) round to 1
    one = fe.poly_exp2_reference(np.float32([0.0]))[0]
    assert abs(one - 1) < 7.5e-5 and np.float16(one) == 1
    # down to 2**-126 within the bound (p(0) * 2**-126 is just below the smallest normal); past it, under 2**-126
    tiny = np.float64(2.0) ** -126
    assert abs(float(fe.poly_exp2_reference(np.float32([-126.0]))[0]) / tiny - 1) < 7.5e-5
    assert 0 < fe.poly_exp2_reference(np.float32([-126.4]))[0] < np.float32(2.0) ** -126


def test_monotone_where_softmax_needs_it():
    # a larger score never gets a smaller weight across the rounding seams (f near +-0.5)
    x = np.sort(np.concatenate([np.arange(-20, 1, dtype=np.float32) + d for d in (-0.5001, -0.5, -0.4999, 0.4999)]))
    x = x[x <= 0]
    y = fe.poly_exp2_reference(x)
    assert np.all(np.diff(y) >= 0)


def test_coefficients_are_the_fit():
    np.testing.assert_allclose(fe.coefficients(), [fe.C0, fe.C1, fe.C2, fe.C3], rtol=1e-6)


def test_asm_carries_the_constants():
    hexes = re.findall(r"0f([0-9A-F]{8})", fe.POLY_ASM)
    vals = [float(np.uint32(int(h, 16)).view(np.float32)) for h in hexes]
    f32 = [float(np.float32(v)) for v in (fe.LOW, fe.MAGIC, fe.MAGIC, fe.C3, fe.C2, fe.C1, fe.C0)]
    assert vals == f32
    assert fe.POLY_ASM.count("fma.rn.f32") == 3 and "max.NaN.f32" in fe.POLY_ASM and "shl.b32 s, t, 23" in fe.POLY_ASM


@pytest.mark.parametrize("bad", [1, -1, 17, True, 2.0])
def test_config_refuses_bad_exp_poly(bad):
    with pytest.raises(ValueError, match="exp_poly"):
        fp.PrefillConfig(exp_poly=bad)


def test_split_refuses_every_below_two():
    with pytest.raises(ValueError, match="every"):
        fe.exp2_split(np.zeros((64, 128), np.float32), every=1)


def test_named_configs_differ_only_in_exp_poly():
    assert fp.CONFIGS["poly4"] == fp.PrefillConfig(exp_poly=4)
    assert fp.CONFIGS["tiles4_poly4"].tiles == 4 and fp.CONFIGS["tiles4_poly4"].exp_poly == 4
    c3 = fp.CONFIGS["c3"]
    assert fp.CONFIGS["c3_poly4"] == fp.PrefillConfig(consumers=c3.consumers, consumer_regs=c3.consumer_regs,
                                                      producer_regs=c3.producer_regs, exp_poly=4)
