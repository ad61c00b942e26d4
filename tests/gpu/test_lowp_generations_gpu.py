"""v9_fp8 / v10_nvfp4 on the GPU (Triton, compiled): paged quantized pools, ragged, causal, G 1-16, D 64/128,
both decodes, against the float64 oracle on the kernel's own quantized operands (dequantized by
pallas_attn.quant, bit-identical to the numpy judge). Budget: well under a minute on an H100 (``-m gpu``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import oracle  # noqa: E402
from pallas_attn import quant  # noqa: E402

pytestmark = pytest.mark.gpu

QUANTIZE = {"fp8_e4m3": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}
DEQUANTIZE = {"fp8_e4m3": quant.dequantize_fp8_e4m3, "nvfp4": quant.dequantize_nvfp4}
GEN = {"fp8_e4m3": "v9_fp8", "nvfp4": "v10_nvfp4"}

# (fmt, B, Hq, Hkv, D, S, page, causal, config)
CASES = [
    ("fp8_e4m3", 4, 32, 8, 128, 4096, 64, True, "faithful"),  # G4 (Llama-3-8B heads), page 64
    ("fp8_e4m3", 3, 16, 1, 64, 3000, 16, False, "alt_decode"),  # G16, page below the 32-key load
    ("fp8_e4m3", 2, 8, 8, 128, 2500, 32, True, "tuned"),  # G1
    ("nvfp4", 4, 32, 8, 128, 4096, 64, True, "faithful"),
    ("nvfp4", 3, 16, 1, 64, 3000, 16, False, "alt_decode"),
    ("nvfp4", 2, 8, 8, 128, 2500, 32, True, "tuned"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{GEN[c[0]]}-B{c[1]}G{c[2] // c[3]}D{c[4]}S{c[5]}p{c[6]}"
                         f"{'c' if c[7] else ''}-{c[8]}")
def test_matches_same_quantized_oracle_on_gpu(case):
    fmt, b, hq, hkv, d, s, page, causal, cfg = case
    kq_, kk, kv = jax.random.split(jax.random.PRNGKey(b * 131 + d), 3)
    q = jax.random.normal(kq_, (b, 1, hq, d), jnp.float32).astype(jnp.float16)
    k = jax.random.normal(kk, (b, s, hkv, d), jnp.float32)
    v = jax.random.normal(kv, (b, s, hkv, d), jnp.float32) * 2.0
    lens = np.random.default_rng(b + d).integers(s // 3, s + 1, size=b).astype(np.int32)
    lens[0] = s
    kq, vq = QUANTIZE[fmt](k), QUANTIZE[fmt](v)
    kp, vp, bt = quant.build_paged_quantized(kq, vq, page, seed=5, kv_lens=lens)
    fn = jax.jit(lambda q, kp, vp, bt, ln: pallas_attn.paged_attention(
        q, kp, vp, bt, ln, causal=causal, generation=GEN[fmt], config=cfg, interpret=False))
    out = np.asarray(jnp.asarray(fn(q, kp, vp, bt, jnp.asarray(lens)), jnp.float32), np.float64)
    assert np.all(np.isfinite(out)), "non-finite output"
    ks = np.asarray(DEQUANTIZE[fmt](kq), np.float64)
    vs = np.asarray(DEQUANTIZE[fmt](vq), np.float64)
    ref, _ = oracle.attention_reference(np.asarray(q, np.float32), ks, vs, causal=causal,
                                        q_offset=lens - 1 if causal else 0, kv_len=lens)
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel < 1e-2 and np.max(np.abs(out - ref)) < 0.05, (rel, np.max(np.abs(out - ref)))
