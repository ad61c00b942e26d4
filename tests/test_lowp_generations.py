"""v9_fp8 and v10_nvfp4 (interpret mode, CPU): v8_gqa_ss reading quantized paged pools.

Judged against the oracle on the same quantized operands (attn_core.oracle.quantized_attention_reference: the
numpy judge quantizes the dense K / V as whole tensors, float64 attention); the kernels read pools quantized by
pallas_attn.quant (byte-identical, tests/test_quant.py) and paged afterwards. The faithful tile (decode x tensor
scale, rounded to fp16) is checked bit for bit for both decodes; ragged, causal, G 1-16, D 64/128, page below
and at the 32-key load; NaN propagation; refusals; the CUDA lowering on this CPU machine.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from pallas_attn import quant, registry
from pallas_attn.kernels import v9_fp8, v10_nvfp4
from pallas_attn.kernels.contract import Problem

QUANTIZE = {"fp8": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}
GEN = {"fp8": "v9_fp8", "nvfp4": "v10_nvfp4"}
MOD = {"fp8": v9_fp8, "nvfp4": v10_nvfp4}
TOL = 1e-2  # relative L2 vs float64 on the same quantized operands: v8_gqa_ss's fp16-KV tolerance


def _rel(out, ref):
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert out.shape == ref.shape and np.all(np.isfinite(out)), "non-finite output (unwritten element or NaN)"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def _inputs(rng, fmt, b, tq, hq, hkv, d, tk, page, lens):
    q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), jnp.float16)
    k = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    v = (rng.standard_normal((b, tk, hkv, d)) * 3.0).astype(np.float32)
    kq, vq = QUANTIZE[fmt](jnp.asarray(k)), QUANTIZE[fmt](jnp.asarray(v))
    kp, vp, bt = quant.build_paged_quantized(kq, vq, page, seed=11, kv_lens=lens)
    return q, k, v, kp, vp, bt


# (fmt, B, Tq, Hq, Hkv, D, Tk, page, ragged, causal, config)
CASES = [
    ("fp8", 3, 1, 8, 8, 64, 150, 16, True, True, "faithful"),  # G1, page < load: per-key gather
    ("fp8", 2, 1, 16, 1, 128, 100, 32, True, False, "alt_decode"),  # G16, page = load, bits decode
    ("fp8", 1, 4, 8, 2, 64, 70, 64, False, True, "tuned"),  # G4, Tq 4
    ("nvfp4", 3, 1, 8, 2, 128, 150, 16, True, True, "faithful"),  # G4
    ("nvfp4", 2, 1, 16, 1, 64, 100, 32, True, False, "alt_decode"),  # G16, cast decode
    ("nvfp4", 2, 2, 8, 8, 64, 90, 64, True, True, "faithful"),  # G1, Tq 2
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-B{c[1]}Tq{c[2]}G{c[3] // c[4]}D{c[5]}p{c[7]}"
                         f"{'r' if c[8] else ''}{'c' if c[9] else ''}-{c[10]}")
def test_matches_same_quantized_oracle(rng, case):
    fmt, b, tq, hq, hkv, d, tk, page, ragged, causal, cfg = case
    lens = rng.integers(1, tk + 1, size=b).astype(np.int32) if ragged else np.full(b, tk, np.int32)
    lens[0] = tk
    q, k, v, kp, vp, bt = _inputs(rng, fmt, b, tq, hq, hkv, d, tk, page, lens)
    out, lse = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=causal, generation=GEN[fmt],
                                           interpret=True, config=cfg, return_lse=True)
    qn = np.asarray(q, np.float32)
    ref, ref_lse = oracle.quantized_attention_reference(qn, k, v, kv_format=fmt, causal=causal,
                                                        q_offset=lens - tq if causal else 0, kv_len=lens)
    assert out.dtype == jnp.float16 and out.shape == q.shape
    assert _rel(out, ref) < TOL
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=2e-3, atol=2e-3)
    # the kernel reads the quantized bytes, not some fp16 copy: the fp16-KV oracle is measurably farther away
    plain, _ = oracle.attention_reference(qn, k, v, causal=causal, q_offset=lens - tq if causal else 0, kv_len=lens)
    assert _rel(out, plain) > 2 * _rel(out, ref)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_faithful_tile_is_the_rounded_scaled_value_for_both_decodes(rng, fmt):
    """The gather's tile is fp16(dequantized value) bit for bit (the reference's rounding), whichever decode."""
    x = jnp.asarray(rng.standard_normal((32, 64)) * np.logspace(-3, 2, 64), jnp.float32)
    t = QUANTIZE[fmt](x)
    want = np.asarray(
        (quant.dequantize_fp8_e4m3(t) if fmt == "fp8" else quant.dequantize_nvfp4(t)).astype(jnp.float16))
    store = t.data if fmt == "fp8" else (t.packed, t.micro)
    for how in ("cast", "bits"):
        hook = v9_fp8.HOOKS[(quant.kv_format(t), how)]
        kt, vt = hook(store, store, t.scale, t.scale * 2)
        assert kt.dtype == jnp.float16
        np.testing.assert_array_equal(np.asarray(kt).view(np.uint16), want.view(np.uint16))
        np.testing.assert_array_equal(np.asarray(vt, np.float32), np.asarray(want, np.float32) * 2)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_nan_in_nan_out(rng, fmt):
    """A NaN byte in one sequence's keys makes that sequence's output NaN, and only it; a NaN scale all of it."""
    lens = np.array([40, 40], np.int32)
    q, _, _, kp, vp, bt = _inputs(rng, fmt, 2, 1, 4, 1, 64, 40, 16, lens)
    page0 = int(bt[0, 1])  # a page of sequence 0 only
    if fmt == "fp8":
        bad = quant.Fp8Tensor(kp.data.at[page0, 3, 0, 5].set(0x7F), kp.scale)
    else:  # a NaN micro-scale byte
        bad = quant.Nvfp4Tensor(kp.packed, kp.micro.at[page0, 3, 0, 1].set(0xFF), kp.scale)
    out = np.asarray(pallas_attn.paged_attention(q, bad, vp, bt, jnp.asarray(lens), generation=GEN[fmt],
                                                 interpret=True))
    assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1]))
    nan_scale = type(vp)(*jax.tree_util.tree_leaves(vp)[:-1], jnp.float32(np.nan))
    out = np.asarray(pallas_attn.paged_attention(q, kp, nan_scale, bt, jnp.asarray(lens), generation=GEN[fmt],
                                                 interpret=True))
    assert np.all(np.isnan(out))


def test_bad_inputs_are_refused_clearly(rng):
    lens = np.array([32], np.int32)
    q, k, v, kp8, vp8, bt = _inputs(rng, "fp8", 1, 1, 4, 2, 64, 32, 16, lens)
    kp4, vp4, _ = quant.build_paged_quantized(quant.quantize_nvfp4(jnp.asarray(k)),
                                              quant.quantize_nvfp4(jnp.asarray(v)), 16, seed=11, kv_lens=lens)
    ln = jnp.asarray(lens)
    with pytest.raises(NotImplementedError, match="nvfp4"):  # each generation reads its own format
        pallas_attn.paged_attention(q, kp4, vp4, bt, ln, generation="v9_fp8", interpret=True)
    with pytest.raises(NotImplementedError, match="fp8_e4m3"):
        pallas_attn.paged_attention(q, kp8, vp8, bt, ln, generation="v10_nvfp4", interpret=True)
    with pytest.raises(ValueError, match="serves"):  # fp16 pools are not the quantized entry
        kf = jnp.zeros(quant.dequantize_fp8_e4m3(kp8).shape, jnp.float16)
        pallas_attn.paged_attention(q, kf, kf, bt, ln, generation="v9_fp8", interpret=True)
    with pytest.raises(ValueError, match="stored alike"):
        pallas_attn.paged_attention(q, kp8, vp4, bt, ln, generation="v9_fp8", interpret=True)
    with pytest.raises(NotImplementedError, match="dtypes.*bfloat16"):
        pallas_attn.paged_attention(q.astype(jnp.bfloat16), kp8, vp8, bt, ln, generation="v9_fp8", interpret=True)
    with pytest.raises(NotImplementedError, match="paged pools only"):  # a dense quantized cache
        k8 = quant.quantize_fp8_e4m3(jnp.asarray(k))
        pallas_attn.attention(q, k8, k8, generation="v9_fp8", interpret=True)
    with pytest.raises(ValueError, match="micro"):
        short = quant.Nvfp4Tensor(kp4.packed, kp4.micro[..., :2], kp4.scale)
        pallas_attn.paged_attention(q, short, short, bt, ln, generation="v10_nvfp4", interpret=True)
    with pytest.raises(NotImplementedError, match="head dims"):
        q96 = jnp.zeros((1, 1, 4, 96), jnp.float16)
        p96 = quant.quantize_fp8_e4m3(jnp.ones((2, 16, 2, 96)))
        pallas_attn.paged_attention(q96, p96, p96, bt, ln, generation="v9_fp8", interpret=True)
    with pytest.raises(ValueError, match="Fp8Tensor"):  # the kernel called directly with plain pools
        kf = jnp.zeros((2, 16, 2, 64), jnp.float16)
        v9_fp8.paged_forward(q, kf, kf, bt, ln, causal=False, scale=0.125, q_offset=jnp.zeros(1, jnp.int32),
                             interpret=True)
    with pytest.raises(NotImplementedError, match="float16 q"):
        v10_nvfp4.paged_forward(q.astype(jnp.bfloat16), kp4, vp4, bt, ln, causal=False, scale=0.125,
                                q_offset=jnp.zeros(1, jnp.int32), interpret=True)
    with pytest.raises(ValueError, match="decode"):
        v9_fp8.LowpConfig(decode="lut")
    with pytest.raises(ValueError, match="outside the pool"):
        pallas_attn.paged_attention(q, kp8, vp8, bt.at[0, 0].set(99), ln, generation="v9_fp8", interpret=True)


def test_contract_and_registry_rows():
    base = dict(dtype="float16", batch=32, q_len=1, kv_len=8192, heads_q=32, heads_kv=8, head_dim=128,
                page_size=64)
    for fmt, operand in (("fp8", "fp8"), ("nvfp4", "nvfp4")):
        k = registry.kernel(GEN[fmt])
        assert k is MOD[fmt].KERNEL and k.entries == {"quantized"} and registry.get(GEN[fmt]).parent
        kvd = "fp8_e4m3" if fmt == "fp8" else "nvfp4"
        p = Problem(entry="quantized", kv_dtype=kvd, **base)
        assert k.supports(p) == (True, "")
        r = k.roofline(p)
        assert r.precision == operand and not r.tensor_cores and r.dequant_ops > 0
        other = "nvfp4" if fmt == "fp8" else "fp8_e4m3"
        assert not k.supports(Problem(entry="quantized", kv_dtype=other, **base))[0]
        assert not k.supports(Problem(entry="paged", **base))[0]
        plan = k.plan(p, k.configs["faithful"])
        assert plan["partial"]["keys_per_update"] == 32 and plan["partial"]["decode"] in ("cast", "bits")
    assert registry.kernel("v10_nvfp4").roofline(Problem(entry="quantized", kv_dtype="nvfp4", **base)).dequant_ops \
        > registry.kernel("v9_fp8").roofline(Problem(entry="quantized", kv_dtype="fp8_e4m3", **base)).dequant_ops


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("config", ["faithful", "alt_decode"])
def test_lowers_for_cuda(fmt, config):
    """Each format x decode lowers to Triton for CUDA on this CPU machine, page below and above the 32-key load,
    D 64 and 128: what interpret mode lets through (casts, joins, gathers of uint8) fails here first."""
    b, hq, hkv, tk = 2, 8, 2, 1000
    lens = jax.ShapeDtypeStruct((b,), jnp.int32)
    sc = jax.ShapeDtypeStruct((), jnp.float32)
    k = MOD[fmt].KERNEL
    for d, page in ((128, 16), (64, 64)):
        n = -(-tk // page)
        lead = (b * n, page, hkv)
        if fmt == "fp8":
            pool = quant.Fp8Tensor(jax.ShapeDtypeStruct((*lead, d), jnp.uint8), sc)
        else:
            pool = quant.Nvfp4Tensor(jax.ShapeDtypeStruct((*lead, d // 2), jnp.uint8),
                                     jax.ShapeDtypeStruct((*lead, d // 16), jnp.uint8), sc)
        q = jax.ShapeDtypeStruct((b, 1, hq, d), jnp.float16)
        bt = jax.ShapeDtypeStruct((b, n), jnp.int32)
        traced = jax.jit(lambda q, kp, bt, lens: pallas_attn.paged_attention(
            q, kp, kp, bt, lens, causal=True, generation=GEN[fmt], config=config, interpret=False,
            check_block_table=False)).trace(q, pool, bt, lens)
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
        names = set(re.findall(r"pallas_attn_\w+", text))
        assert names == set(k.passes) and text.count("xla.gpu.triton") >= len(names)
