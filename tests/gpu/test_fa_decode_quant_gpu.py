"""fa_decode with fp8 E4M3 / NVFP4 KV on the GPU (Triton, compiled) at the issue-12 sizes, against the float64
oracle on the kernel's own quantized operands (a subset of batch rows and KV heads, edges included), both
decodes of each format, dense and paged (page 64 and 16). The quantizers run on the GPU too and must match the
numpy judge byte for byte. Budget: about a minute on an H100 (``-m gpu``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import formats, oracle  # noqa: E402
from pallas_attn import quant  # noqa: E402
from pallas_attn.kernels import fa_decode as fd  # noqa: E402

pytestmark = pytest.mark.gpu

QUANTIZE = {"fp8_e4m3": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}
DEQUANTIZE = {"fp8_e4m3": quant.dequantize_fp8_e4m3, "nvfp4": quant.dequantize_nvfp4}


def _inputs(seed, b, s, hq=32, hkv=8, d=128):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(kq, (b, 1, hq, d), jnp.float32).astype(jnp.float16)
    return q, jax.random.normal(kk, (b, s, hkv, d), jnp.float32), jax.random.normal(kv, (b, s, hkv, d), jnp.float32)


def _check(out, q, kq, vq, fmt, rows, heads, lens=None, tol=1e-2):
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "non-finite output"
    g = q.shape[2] // kq.shape[2]
    qh = np.concatenate([np.arange(h * g, (h + 1) * g) for h in heads])
    hsel = jnp.asarray(heads)
    for b in rows:
        n = kq.shape[1] if lens is None else int(lens[b])
        sub = lambda t, b=b, n=n: jax.tree_util.tree_map(  # noqa: E731
            lambda a: a if a.ndim == 0 else a[b : b + 1, :n][:, :, hsel], t)
        ks = np.asarray(DEQUANTIZE[fmt](sub(kq)), np.float64)
        vs = np.asarray(DEQUANTIZE[fmt](sub(vq)), np.float64)
        ref, _ = oracle.attention_reference(np.asarray(q[b : b + 1][:, :, qh], np.float32), ks, vs)
        got = out[b : b + 1][:, :, qh].astype(np.float64)
        rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
        assert rel < tol and np.max(np.abs(got - ref)) < 5 * tol, (b, rel)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
def test_quantizer_on_gpu_matches_the_judge(fmt):
    x = jax.random.normal(jax.random.PRNGKey(3), (4, 512, 8, 128), jnp.float32) * 3.0
    got = jax.jit(QUANTIZE[fmt])(x)
    want = (formats.quantize_fp8_e4m3 if fmt == "fp8_e4m3" else formats.quantize_nvfp4)(np.asarray(x))
    for f in ("data",) if fmt == "fp8_e4m3" else ("packed", "micro"):
        np.testing.assert_array_equal(np.asarray(getattr(got, f)), getattr(want, f))
    assert np.asarray(got.scale).view(np.uint32) == np.float32(want.scale).view(np.uint32)


# session 18: the NVFP4 halves at every shape, the plain NVFP4 plan (the default's batch regime off), and the wider
# quantized tiles (quant_tile_scale; no named config: measured slower, docs/quantized_kv.md §8)
# session 19: the default decodes NVFP4 by "asm" as halves; "asm_tile" is the asm decode made to take the joined tile
# (kv_source.nvfp4_tile, a float32 join); nvfp4_cast is session 18's default, nvfp4_plain the path before it
# session 36: nvfp4_occ16, NVFP4's batch regime at 16 programs an SM (B 32: eight splits)
CONFIGS = ["default", "quant_alt_decode", "nvfp4_cast", "nvfp4_plain", "asm_tile", "wide", "nvfp4_occ16"]


def _config(name):
    if name == "asm_tile":
        return fd.DecodeConfig(nvfp4_decode="asm", nvfp4_halves=False)
    return fd.DecodeConfig(quant_tile_scale=2) if name == "wide" else name


@pytest.mark.parametrize("rows,num_warps", [(32, 4), (64, 4), (128, 8)])
def test_nvfp4_asm_tiles_in_a_compiled_kernel(rows, num_warps):
    """kv_source's NVFP4 decoders inside one compiled Triton kernel, every byte value in the tile: "asm" equals
    "cast" element for element, joined (nvfp4_tile) and as halves (nvfp4_halves). Session 19 found a float16 join
    of the inline-asm results swapping columns 1 and 2 of every four; nvfp4_tile joins in float32 because of it."""
    from jax.experimental import pallas as pl

    from pallas_attn import _compat
    from pallas_attn.kernels import kv_source as ks

    rng = np.random.default_rng(rows)
    packed = np.resize(np.arange(256, dtype=np.uint8), (rows, 64))
    packed = jnp.asarray(rng.permuted(packed, axis=1))
    micro = jnp.asarray(rng.integers(0x28, 0x48, (rows, 8), dtype=np.uint8))

    def run(how):
        def kernel(p_ref, m_ref, t_ref, e_ref, o_ref):
            t_ref[...] = ks.nvfp4_tile(p_ref[...], m_ref[...], how)
            e, o = ks.nvfp4_halves(p_ref[...], m_ref[...], how)
            e_ref[...] = e
            o_ref[...] = o

        shapes = (jax.ShapeDtypeStruct((rows, 128), jnp.float16), jax.ShapeDtypeStruct((rows, 64), jnp.float16),
                  jax.ShapeDtypeStruct((rows, 64), jnp.float16))
        return [np.asarray(x) for x in pl.pallas_call(
            kernel, out_shape=shapes, grid=(1,),
            compiler_params=_compat.triton_params(num_warps=num_warps, num_stages=1))(packed, micro)]

    want, got = run("cast"), run("asm")
    for name, w, g in zip(("tile", "even", "odd"), want, got):
        np.testing.assert_array_equal(g.view(np.uint16), w.view(np.uint16), err_msg=name)
    np.testing.assert_array_equal(want[0][:, 0::2].view(np.uint16), want[1].view(np.uint16))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("b,s", [(8, 8192), (1, 131072), (32, 2048)])  # B32 x Hkv 8 >= the SMs: NVFP4's batch regime
def test_dense_target_shapes(fmt, config, b, s):
    q, k, v = _inputs(1, b, s)
    kq, vq = QUANTIZE[fmt](k), QUANTIZE[fmt](v)
    out = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, generation="fa_decode", config=_config(config)))(
        q, kq, vq)
    _check(out, q, kq, vq, fmt, rows=[0, b - 1], heads=[0, 7])


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
@pytest.mark.parametrize("page", [64, 16])
def test_paged_ragged(fmt, config, page):
    b, s = 6, 4096
    q, k, v = _inputs(2, b, s)
    kq, vq = QUANTIZE[fmt](k), QUANTIZE[fmt](v)
    lens = np.array([4096, 1, 4000, 63, 2048, 3333], np.int32)
    kp, vp, bt = quant.build_paged_quantized(kq, vq, page, seed=5, kv_lens=lens)
    out = jax.jit(lambda q, kp, vp, bt, l: pallas_attn.paged_attention(q, kp, vp, bt, l, config=_config(config),
                                                                       check_block_table=False))(
        q, kp, vp, bt, jnp.asarray(lens))
    # paged default offset kv_len - 1 with Tq = 1: every row sees its whole sequence (the dense oracle)
    _check(out, q, kq, vq, fmt, rows=[0, 1, 3, 5], heads=[0, 7], lens=lens)


@pytest.mark.parametrize("config", ["default", "quant_alt_decode", "nvfp4_cast", "nvfp4_plain", "quant_pv16",
                                    "quant_pv16_off", "asm_tile", "quant_qk16", "quant_qk16_off"])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
def test_bf16_q_dense_and_paged(fmt, config):
    """bf16 q over the quantized cache (session 13; the tiles convert to bf16 exactly): the compiled kernel agrees
    with the oracle on the same operands to bf16's tolerance, dense (B8 S8192) and paged (page 16, ragged)."""
    q, k, v = _inputs(4, 8, 8192)
    q = q.astype(jnp.bfloat16)
    kq, vq = QUANTIZE[fmt](k), QUANTIZE[fmt](v)
    config = _config(config)
    out = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, generation="fa_decode", config=config))(q, kq, vq)
    assert out.dtype == jnp.bfloat16
    _check(out, q, kq, vq, fmt, rows=[0, 7], heads=[0, 7], tol=2e-2)
    lens = np.array([8192, 1, 5000, 63, 2048, 3333, 8000, 17], np.int32)
    kp, vp, bt = quant.build_paged_quantized(kq, vq, 16, seed=9, kv_lens=lens)
    out = jax.jit(lambda q, kp, vp, bt, l: pallas_attn.paged_attention(q, kp, vp, bt, l, config=config,
                                                                       check_block_table=False))(
        q, kp, vp, bt, jnp.asarray(lens))
    _check(out, q, kq, vq, fmt, rows=[0, 1, 3, 7], heads=[0, 7], lens=lens, tol=2e-2)


@pytest.mark.parametrize("batch", [1, 32])
@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
def test_qk16_agrees_with_the_bf16_scores(fmt, batch):
    """quant_qk16 (session 38) on and off, compiled: the same scores (exact products, fp32 sums), so the bf16 outputs
    agree to bf16's rounding, also for query rows at 1e30 and 1e-30 (an unscaled fp16 q would overflow / flush); a
    NaN in one query row makes that row NaN and no other row of its program. B 1 (split plan) and B 32 (the batch
    regime: NVFP4's halves and wider plan, P.V in fp16)."""
    q, k, v = _inputs(6, batch, 4096)
    q = np.asarray(q, np.float32)
    q[0, 0, 1] *= 1e30
    q[-1, 0, 6] *= 1e-30
    q = jnp.asarray(q, jnp.bfloat16)
    kq, vq = QUANTIZE[fmt](k), QUANTIZE[fmt](v)
    run = {on: jax.jit(lambda q, k, v, on=on: pallas_attn.attention(
        q, k, v, generation="fa_decode", config=fd.DecodeConfig(quant_qk16=on))) for on in (True, False)}
    a = np.asarray(run[True](q, kq, vq), np.float32)
    ref = np.asarray(run[False](q, kq, vq), np.float32)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, ref, rtol=2 ** -7, atol=1e-6)
    out = np.asarray(run[True](q.at[0, 0, 3, 17].set(jnp.nan), kq, vq), np.float32)
    nan_rows = np.isnan(out).any(-1)
    assert nan_rows[0, 0, 3] and nan_rows.sum() == 1 and np.all(np.isnan(out[0, 0, 3]))
