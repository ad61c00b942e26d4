"""The quantizers' integer division (pallas_attn.quant._div_rn) on the GPU: bit-identical to numpy's float32
division on the host, and the quantizers byte-identical to the numpy judge on inputs whose divisions are exact
E4M3 / NVFP4 ties (where XLA's own GPU division, PTX div.full.f32, may land one ulp off). Budget: ~20 s (``-m gpu``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from attn_core import formats as F  # noqa: E402
from pallas_attn import quant as Q  # noqa: E402

pytestmark = pytest.mark.gpu


def _bits(x):
    return np.asarray(x, np.float32).view(np.uint32)


def _pairs():
    rng = np.random.default_rng(12)
    n = 1 << 20
    pats = rng.integers(0, 2**32, size=(2, n), dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        wide = (rng.standard_normal((2, n)) * np.exp2(rng.uniform(-150, 128, (2, n)))).astype(np.float32)
    amax = (np.abs(rng.standard_normal(n)) * np.exp2(rng.uniform(-40, 40, n))).astype(np.float32)
    div = np.resize(np.float32([448.0, 2688.0, 6.0]), n)
    sub = np.arange(1, n + 1, dtype=np.uint32).view(np.float32)  # subnormal dividends: ties in the subnormal range
    sub_d = np.resize(np.float32([2.0, 4.0, 3.0, 0.75, 2.0**12]), n)
    a = np.concatenate([pats[0], wide[0], amax, sub])
    b = np.concatenate([pats[1], wide[1], div, sub_d])
    return a, b


def test_div_rn_on_gpu_matches_numpy_bit_for_bit():
    a, b = _pairs()
    with np.errstate(all="ignore"):
        want = _bits(a / b)
    got = _bits(jax.jit(Q._div_rn)(jnp.asarray(a), jnp.asarray(b)))
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(_bits(a)[i]), hex(_bits(b)[i]), hex(got[i]), hex(want[i])) for i in bad[:6]]
    # for the record (not asserted: it is XLA's business): how often XLA's own GPU division differs
    xla = _bits(jax.jit(lambda x, y: x / y)(jnp.asarray(a), jnp.asarray(b)))
    not_nan = ~np.isnan(want.view(np.float32))
    print(f"XLA GPU a/b differs from numpy on {np.count_nonzero((xla != want) & not_nan)} of {a.size} pairs")


def test_quantizers_on_gpu_match_the_judge_on_ties_and_the_h100_case():
    # the H100 failure of 2026-11-22: amax 14.824783 / 2688 (judge bits 1001699486)
    x = np.zeros((2, 16), np.float32)
    x[0, 3] = np.uint32(1097675344).view(np.float32)
    assert int(_bits(Q.quantize_nvfp4(jnp.asarray(x)).scale)) == 1001699486
    # every E4M3 midpoint times a scale of 0.1875 (exact ties of x / scale), NVFP4 midpoints times eff 21
    vals = F.e4m3_to_float(np.arange(0x7F, dtype=np.uint8)).astype(np.float64)
    mids = ((vals[:-1] + vals[1:]) / 2)[8:120]
    fp8 = np.concatenate([mids, -mids, [448.0]]) * 0.1875
    fp8 = np.pad(fp8, (0, -fp8.size % 16)).astype(np.float32).reshape(-1, 16)
    nv_mid = np.float64(F.NVFP4_MIDPOINTS)
    blocks = np.zeros((mids.size + 1, 16))
    blocks[0] = np.concatenate([[126.0], nv_mid * 21, -nv_mid * 21, [0.0]])
    blocks[1:, 0] = mids * 0.28125
    for arr in (fp8, blocks.astype(np.float32)):
        ref8, got8 = F.quantize_fp8_e4m3(arr), Q.quantize_fp8_e4m3(jnp.asarray(arr))
        assert np.array_equal(np.asarray(got8.data), ref8.data) and _bits(got8.scale) == _bits(ref8.scale)
        ref4, got4 = F.quantize_nvfp4(arr), Q.quantize_nvfp4(jnp.asarray(arr))
        for f in ("packed", "micro"):
            assert np.array_equal(np.asarray(getattr(got4, f)), getattr(ref4, f)), f
        assert _bits(got4.scale) == _bits(ref4.scale)
