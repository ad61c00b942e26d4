"""fa_decode with fp8 E4M3 and NVFP4 KV (interpret mode, CPU) against the oracle on the same quantized operands.

The oracle (attn_core.oracle.quantized_attention_reference) quantizes the dense K and V as whole tensors with the
numpy judge and attends in float64; the kernel reads pools quantized by pallas_attn.quant (byte-identical,
tests/test_quant.py) and paged afterwards. Both decodes of each format are exercised; the tile decoders are
checked exact; the contract, errors, NaN propagation and the CUDA lowering of every variant are checked too.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from pallas_attn import api, quant
from pallas_attn.kernels import fa_decode as fd
from pallas_attn.kernels import kv_source as ks
from pallas_attn.kernels.contract import Problem

QUANTIZE = {"fp8": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}
KV_DTYPE = {"fp8": "fp8_e4m3", "nvfp4": "nvfp4"}
TOL = 1e-2  # relative L2 vs float64 on the same quantized operands (fp16 q and output), as for fp16 KV


def _rel(out, ref):
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert out.shape == ref.shape and np.all(np.isfinite(out)), "non-finite output (unwritten element or NaN)"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def _case(rng, b, tq, hq, hkv, d, tk):
    q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), jnp.float16)
    k = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    v = rng.standard_normal((b, tk, hkv, d)).astype(np.float32)
    return q, k, v


# (fmt, B, Tq, Hq, Hkv, D, Tk, page (None: dense), ragged, causal, config)
CASES = [
    ("fp8", 2, 1, 8, 2, 128, 77, 16, True, True, fd.DecodeConfig(block_k=32)),  # G4, page < tile: gather
    ("fp8", 1, 1, 16, 1, 64, 100, None, False, False, fd.DecodeConfig(block_k=16, splits=3, fp8_decode="bits")),
    ("fp8", 2, 4, 8, 8, 128, 50, 64, True, True, fd.DecodeConfig(block_k=16, fp8_decode="bits")),  # G1, Tq 4
    ("nvfp4", 2, 1, 8, 2, 128, 77, 16, True, True, fd.DecodeConfig(block_k=32, nvfp4_decode="bits")),
    ("nvfp4", 1, 1, 16, 1, 64, 100, None, False, False, fd.DecodeConfig(block_k=16, splits=3, nvfp4_decode="cast")),
    ("nvfp4", 3, 1, 4, 2, 64, 90, 32, True, False, fd.DecodeConfig(block_k=32, splits=2)),  # G2, page = tile
    ("nvfp4", 1, 4, 8, 1, 128, 40, None, False, True, fd.DecodeConfig(block_k=16, nvfp4_decode="cast")),  # G8
    # session 18: the NVFP4 halves (q / output columns permuted outside the kernel) and the wider quantized tiles
    ("nvfp4", 2, 1, 8, 2, 128, 77, 16, True, True, fd.DecodeConfig(block_k=32, nvfp4_halves=True)),
    ("nvfp4", 1, 1, 16, 1, 64, 100, None, False, False,
     fd.DecodeConfig(block_k=16, splits=3, nvfp4_decode="cast", nvfp4_halves=True)),
    ("nvfp4", 1, 4, 8, 1, 128, 300, None, False, True, fd.DecodeConfig(nvfp4_halves=True, quant_tile_scale=2)),
    # the default's NVFP4 batch regime: B*Hkv = 136 programs >= 132 SMs (the CPU's stand-in count): 4 programs per
    # SM in the wave model (the keys split in two) and the halves
    ("nvfp4", 17, 1, 16, 8, 64, 70, None, False, True, fd.DecodeConfig(block_k=16)),
    # nvfp4_decode "asm": the interpreter runs the same bytes through "cast" (the asm itself: test_nvfp4_asm_*)
    ("nvfp4", 2, 1, 8, 2, 128, 77, 16, True, True, fd.DecodeConfig(block_k=32, nvfp4_decode="asm")),
    ("fp8", 2, 1, 8, 2, 64, 300, None, False, True, fd.DecodeConfig(quant_tile_scale=4, splits=1)),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-B{c[1]}Tq{c[2]}G{c[3] // c[4]}D{c[5]}"
                         f"{'p' + str(c[7]) if c[7] else 'dense'}{'r' if c[8] else ''}{'c' if c[9] else ''}")
def test_matches_same_quantized_oracle(rng, case):
    fmt, b, tq, hq, hkv, d, tk, page, ragged, causal, cfg = case
    q, k, v = _case(rng, b, tq, hq, hkv, d, tk)
    kq, vq = QUANTIZE[fmt](jnp.asarray(k)), QUANTIZE[fmt](jnp.asarray(v))
    qn = np.asarray(q, np.float32)
    if page is None:
        off = tk - tq if causal else 0
        out, lse = pallas_attn.attention(q, kq, vq, causal=causal, q_offset=off, generation="fa_decode",
                                         interpret=True, config=cfg, return_lse=True)
        ref, ref_lse = oracle.quantized_attention_reference(qn, k, v, kv_format=fmt, causal=causal, q_offset=off)
    else:
        lens = rng.integers(1, tk + 1, size=b).astype(np.int32) if ragged else np.full(b, tk, np.int32)
        lens[0] = tk
        kp, vp, bt = quant.build_paged_quantized(kq, vq, page, seed=7, kv_lens=lens)
        out, lse = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=causal, interpret=True,
                                               config=cfg, return_lse=True)
        ref, ref_lse = oracle.quantized_attention_reference(qn, k, v, kv_format=fmt, causal=causal,
                                                            q_offset=lens - tq if causal else 0, kv_len=lens)
    assert out.dtype == jnp.float16 and out.shape == q.shape
    assert _rel(out, ref) < TOL
    np.testing.assert_allclose(np.asarray(lse), ref_lse, rtol=2e-3, atol=2e-3)


# bf16 q over a quantized cache (session 13): (fmt, B, Tq, Hq, Hkv, D, Tk, page, causal, config)
BF16_CASES = [
    ("fp8", 2, 1, 8, 2, 128, 77, 16, True, fd.DecodeConfig(block_k=32)),
    ("fp8", 1, 2, 16, 1, 64, 100, None, True, fd.DecodeConfig(block_k=16, splits=3, fp8_decode="bits")),
    ("nvfp4", 2, 1, 8, 2, 128, 77, 32, True, fd.DecodeConfig(block_k=32, nvfp4_decode="cast")),
    ("nvfp4", 1, 1, 16, 2, 64, 90, None, False, fd.DecodeConfig(block_k=16, splits=2, nvfp4_decode="bits")),
    ("nvfp4", 2, 1, 8, 2, 128, 77, 32, True, fd.DecodeConfig(block_k=32, nvfp4_halves=True)),
    # P.V on the fp16 V tile (quant_pv16, session 18)
    ("fp8", 2, 1, 8, 2, 128, 77, None, True, fd.DecodeConfig(block_k=32, quant_pv16=True)),
    ("nvfp4", 2, 1, 8, 2, 64, 77, 16, True, fd.DecodeConfig(block_k=16, quant_pv16=True)),
    # the scores in fp16 on the K tile as it decodes (quant_qk16, session 38), with and without P.V in fp16
    ("fp8", 2, 1, 8, 2, 128, 77, 16, True, fd.DecodeConfig(block_k=32, quant_qk16=True)),
    ("fp8", 1, 2, 16, 1, 64, 100, None, True, fd.DecodeConfig(block_k=16, splits=3, quant_qk16=True,
                                                              quant_pv16=True)),
    ("nvfp4", 2, 1, 8, 2, 128, 77, 32, True, fd.DecodeConfig(block_k=32, nvfp4_halves=True, quant_qk16=True)),
    ("nvfp4", 1, 1, 16, 2, 64, 90, None, False, fd.DecodeConfig(block_k=16, splits=2, quant_qk16=True)),
]


@pytest.mark.parametrize("case", BF16_CASES, ids=lambda c: f"{c[0]}-D{c[5]}{'p' + str(c[7]) if c[7] else 'dense'}")
def test_bf16_q_matches_the_same_quantized_oracle(rng, case):
    """A bf16 q reads the fp8 / NVFP4 cache too (the tiles convert to bf16 exactly): the output is bf16 and agrees
    with the float64 oracle on the same quantized operands to bf16's tolerance (2e-2, as fp16 KV's bf16 cases), and
    with the fp16-q kernel on the same cache to bf16's rounding."""
    fmt, b, tq, hq, hkv, d, tk, page, causal, cfg = case
    q16, k, v = _case(rng, b, tq, hq, hkv, d, tk)
    q = q16.astype(jnp.bfloat16)
    kq, vq = QUANTIZE[fmt](jnp.asarray(k)), QUANTIZE[fmt](jnp.asarray(v))
    qn = np.asarray(q.astype(jnp.float32))
    if page is None:
        off = tk - tq if causal else 0
        run = lambda q: pallas_attn.attention(q, kq, vq, causal=causal, q_offset=off,  # noqa: E731
                                              generation="fa_decode", interpret=True, config=cfg)
        ref, _ = oracle.quantized_attention_reference(qn, k, v, kv_format=fmt, causal=causal, q_offset=off)
    else:
        lens = np.full(b, tk, np.int32)
        lens[1:] = tk - 13
        kp, vp, bt = quant.build_paged_quantized(kq, vq, page, seed=3, kv_lens=lens)
        run = lambda q: pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=causal,  # noqa: E731
                                                    interpret=True, config=cfg)
        ref, _ = oracle.quantized_attention_reference(qn, k, v, kv_format=fmt, causal=causal,
                                                      q_offset=lens - tq if causal else 0, kv_len=lens)
    out = run(q)
    assert out.dtype == jnp.bfloat16 and out.shape == q.shape
    assert _rel(out, ref) < 2e-2
    assert _rel(out, np.asarray(run(q.astype(jnp.float16)), np.float64)) < 2e-2


def test_fp16_rows_is_exact_and_row_local(rng):
    """``fa_decode.fp16_rows`` (quant_qk16): each row's fp16 values times its power give back the bf16 q exactly, for
    rows of magnitudes 1e-33 .. 3e37 (each row's largest value in [2^14, 2^15) as fp16); NaN / inf stay in their
    own row and leave the other rows' powers alone; an all-zero row stays zero with a finite power."""
    mags = [1.0, 1e30, 1e-30, 3e37, 1e-33, 0.0, 1.0, 1.0]
    x = rng.standard_normal((8, 64)) * np.asarray(mags)[:, None]
    x[6, 5], x[7, 9] = np.nan, np.inf
    q = jnp.asarray(x, jnp.bfloat16)
    halves = (q[:, :32], q[:, 32:])
    (a, b), pw = jax.jit(fd.fp16_rows)(halves)
    assert a.dtype == jnp.float16 and pw.dtype == jnp.float32
    back = np.concatenate([np.asarray(a, np.float32), np.asarray(b, np.float32)], 1) * np.asarray(pw)[:, None]
    want = np.asarray(q, np.float32)
    ok = np.isfinite(want) & (np.abs(want) >= np.finfo(np.float32).tiny)  # fp32 subnormals may flush (docstring)
    assert ok.sum() >= 8 * 64 - 2 - 64 - 4  # only the NaN, the inf, the zero row and a few subnormals left out
    np.testing.assert_array_equal(back[ok], want[ok])  # every other value, bit for bit
    assert np.isnan(back[6, 5]) and np.isinf(back[7, 9]) and np.all(np.isfinite(np.asarray(pw)))
    assert np.all(back[5] == 0)
    top = np.max(np.abs(np.concatenate([np.asarray(a, np.float32), np.asarray(b, np.float32)], 1)[:5]), axis=1)
    assert np.all((top >= 2.0 ** 14) & (top < 2.0 ** 15)), top
    # the NaN / inf rows are scaled by their finite values alone, as the clean row 0 is by its own
    assert np.asarray(pw)[6] == np.asarray(pw)[7] == np.asarray(pw)[0]


def test_pv16_rule():
    """quant_pv16 None: on in the batch regime and on a paged NVFP4 cache (session 38), off on a dense cache outside
    the regime and on a paged fp8 one; True / False force it."""
    kw = dict(hkv=8, rows=4, d=128, d_data=128, sm_count=132)
    knobs = lambda cfg, **k: fd.quant_knobs(fd.CONFIGS[cfg], **{**kw, **k})[1]  # noqa: E731
    for fmt in ("fp8_e4m3", "nvfp4"):
        assert not knobs("default", fmt=fmt, batch=1, paged=False)
        assert knobs("default", fmt=fmt, batch=32, paged=False)  # 256 programs >= 132 SMs
        for b in (1, 32):
            assert knobs("default", fmt=fmt, batch=b, paged=True) == (fmt == "nvfp4")
        assert not knobs("quant_pv16_off", fmt=fmt, batch=32, paged=True)
        assert knobs("quant_pv16", fmt=fmt, batch=1, paged=False) and knobs("quant_pv16", fmt=fmt, batch=1, paged=True)


def test_qk16_rule():
    """quant_qk16 None: a bf16 q over fp8 always, over NVFP4 from QK16_NVFP4_MIN_TILES key tiles a program; never an
    fp16 q or a 16-bit cache; True / False force it (a bf16 q over a quantized cache only)."""
    d, n = fd.CONFIGS["default"], fd.QK16_NVFP4_MIN_TILES
    assert fd.qk16_on(d, fmt="fp8_e4m3", q_dtype=jnp.bfloat16, tiles=1)
    assert not fd.qk16_on(d, fmt="nvfp4", q_dtype=jnp.bfloat16, tiles=n - 1)
    assert fd.qk16_on(d, fmt="nvfp4", q_dtype=jnp.bfloat16, tiles=n)
    assert fd.qk16_on(fd.CONFIGS["quant_qk16"], fmt="nvfp4", q_dtype=jnp.bfloat16, tiles=1)
    assert not fd.qk16_on(fd.CONFIGS["quant_qk16_off"], fmt="fp8_e4m3", q_dtype=jnp.bfloat16, tiles=64)
    for cfg in (d, fd.CONFIGS["quant_qk16"]):
        assert not fd.qk16_on(cfg, fmt="fp8_e4m3", q_dtype=jnp.float16, tiles=64)
        assert not fd.qk16_on(cfg, fmt=None, q_dtype=jnp.bfloat16, tiles=64)
    with pytest.raises(ValueError, match="quant_qk16"):
        fd.DecodeConfig(quant_qk16=1)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_qk16_agrees_with_the_bf16_scores(rng, fmt):
    """quant_qk16 on and off compute the same scores (the same products of exact values, accumulated in fp32): their
    bf16 outputs agree to bf16's rounding at every row, including rows of q at 1e30 and 1e-30, where an unscaled fp16
    q would overflow or flush; a NaN in one query row makes that row NaN and no other."""
    b, hq, hkv, d, tk = 2, 8, 2, 128, 200
    q16, k, v = _case(rng, b, 1, hq, hkv, d, tk)
    q = np.asarray(q16, np.float32)
    q[0, 0, 1] *= 1e30
    q[1, 0, 6] *= 1e-30
    q = jnp.asarray(q, jnp.bfloat16)
    kq, vq = QUANTIZE[fmt](jnp.asarray(k)), QUANTIZE[fmt](jnp.asarray(v))
    run = {on: (lambda q, on=on: np.asarray(pallas_attn.attention(
        q, kq, vq, generation="fa_decode", interpret=True,
        config=fd.DecodeConfig(block_k=32, quant_qk16=on)), np.float32)) for on in (True, False)}
    a, ref = run[True](q), run[False](q)
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a, ref, rtol=2 ** -7, atol=1e-6)
    qn = q.at[1, 0, 3, 17].set(jnp.nan)
    out = run[True](qn)
    nan_rows = np.isnan(out).any(-1)
    assert nan_rows[1, 0, 3] and nan_rows.sum() == 1 and np.all(np.isnan(out[1, 0, 3]))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_qk16_with_window_sinks_and_pages(rng, fmt):
    """quant_qk16 where the score scale meets the other features: a causal window and Tq 2 (the row's power joins
    the window's masked scores), sinks (joined after the merge), a paged ragged cache of page 16 with splits; on and
    off agree to bf16's rounding, and both agree with the fp16-q kernel on the same cache."""
    b, tq, hq, hkv, d, tk, page = 2, 2, 8, 2, 64, 90, 16
    q16, k, v = _case(rng, b, tq, hq, hkv, d, tk)
    q = q16.astype(jnp.bfloat16)
    kq, vq = QUANTIZE[fmt](jnp.asarray(k)), QUANTIZE[fmt](jnp.asarray(v))
    lens = np.array([90, 57], np.int32)
    kp, vp, bt = quant.build_paged_quantized(kq, vq, page, seed=11, kv_lens=lens)
    sinks = jnp.asarray(rng.standard_normal(hq), jnp.float32)

    def run(q, on):
        cfg = fd.DecodeConfig(block_k=16, splits=3, quant_qk16=on)
        return np.asarray(pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=True, window=40,
                                                      sinks=sinks, interpret=True, config=cfg), np.float32)

    on, off = run(q, True), run(q, False)
    assert np.all(np.isfinite(on))
    np.testing.assert_allclose(on, off, rtol=2 ** -7, atol=1e-6)
    assert _rel(on, run(q.astype(jnp.float16), None).astype(np.float64)) < 2e-2


@pytest.mark.parametrize("how", ks.DECODES)
def test_tile_decoders_are_exact(rng, how):
    """decode(tile) * 2^fold * scale is bit-identical to the float32 dequantization (fp8: all 256 bytes)."""
    b = jnp.arange(256, dtype=jnp.uint8).reshape(16, 16)
    got = np.asarray(ks.e4m3_tile(b, how), np.float32) * np.float32(2.0 ** ks.E4M3_FOLD[how])
    want = np.asarray(quant.e4m3_to_float(b))
    np.testing.assert_array_equal(got, want)  # NaN bytes decode to NaN (assert_array_equal matches NaNs)
    x = jnp.asarray(rng.standard_normal((16, 128)) * np.logspace(-4, 4, 128), jnp.float32)
    t = quant.quantize_nvfp4(x)
    tile = np.asarray(ks.nvfp4_tile(t.packed, t.micro, how), np.float32)
    got = (tile * np.float32(2.0 ** ks.NVFP4_FOLD[how])) * np.float32(t.scale)
    np.testing.assert_array_equal(got.view(np.uint32), np.asarray(quant.dequantize_nvfp4(t)).view(np.uint32))
    even, odd = (np.asarray(h, np.float32) for h in ks.nvfp4_halves(t.packed, t.micro, how))
    np.testing.assert_array_equal(even.view(np.uint32), tile[:, 0::2].view(np.uint32))  # same bits, halves apart
    np.testing.assert_array_equal(odd.view(np.uint32), tile[:, 1::2].view(np.uint32))


def _run_ptx(asm: str, word: np.ndarray) -> list[np.ndarray]:
    """A PTX interpreter for the instructions ``kv_source.NVFP4_ASM`` uses, over uint32 arrays: ``$2`` = ``word``;
    returns ``$0, $1``. shl / shr (.b32: logical) / and / or, ``mov.b32 {lo16, hi16}``, and
    ``cvt.rn.f16x2.e4m3x2`` (the low byte to the low half) through the numpy E4M3 judge."""
    e4m3_f16 = np.asarray(quant.e4m3_to_float(jnp.arange(256, dtype=jnp.uint8)), np.float32).astype(
        np.float16).view(np.uint16).astype(np.uint32)
    reg = {"$2": word.astype(np.uint32)}

    def val(tok):
        return np.uint32(int(tok, 16)) if tok.startswith("0x") else np.uint32(int(tok)) if tok.isdigit() else reg[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op == "mov.b32":
            m = re.fullmatch(r"\{(\w+), (\w+)\}, (\$?\w+)", rest)
            reg[m[1]], reg[m[2]] = reg[m[3]] & np.uint32(0xFFFF), reg[m[3]] >> np.uint32(16)
            continue
        d, *src = [t.strip() for t in rest.split(",")]
        if op == "shl.b32":
            reg[d] = (val(src[0]) << val(src[1])) & np.uint32(0xFFFFFFFF)
        elif op == "shr.b32":
            reg[d] = val(src[0]) >> val(src[1])
        elif op == "and.b32":
            reg[d] = val(src[0]) & val(src[1])
        elif op == "or.b32":
            reg[d] = val(src[0]) | val(src[1])
        elif op == "cvt.rn.f16x2.e4m3x2":
            s16 = val(src[0])
            reg[d] = e4m3_f16[s16 & 0xFF] | (e4m3_f16[(s16 >> 8) & 0xFF] << np.uint32(16))
        else:
            raise AssertionError(f"instruction the interpreter does not know: {line!r}")
    return [reg["$0"], reg["$1"]]


def test_nvfp4_asm_decodes_as_cast():
    """NVFP4_ASM's two programs, run by the PTX interpreter on every byte in every position of the 32-bit register, give
    the cast decode's fp16 levels bit for bit: element i (byte i) -> half i % 2 of $0 / $1 ("lo": low nibbles, "hi")."""
    rng = np.random.default_rng(0)
    b = np.arange(256, dtype=np.uint32)
    for pos in range(4):
        others = rng.integers(0, 256, size=(256, 4)).astype(np.uint32)
        others[:, pos] = b
        word = others[:, 0] | (others[:, 1] << 8) | (others[:, 2] << 16) | (others[:, 3] << 24)
        lo01, lo23 = _run_ptx(ks.NVFP4_ASM["lo"], word)
        hi01, hi23 = _run_ptx(ks.NVFP4_ASM["hi"], word)
        got_lo = np.stack([lo01 & 0xFFFF, lo01 >> 16, lo23 & 0xFFFF, lo23 >> 16], axis=1)
        got_hi = np.stack([hi01 & 0xFFFF, hi01 >> 16, hi23 & 0xFFFF, hi23 >> 16], axis=1)
        want_lo, want_hi = (np.asarray(x).view(np.uint16).astype(np.uint32)
                            for x in ks._nvfp4_levels(jnp.asarray(others.astype(np.uint8)), "cast"))
        np.testing.assert_array_equal(got_lo, want_lo)
        np.testing.assert_array_equal(got_hi, want_hi)


def test_quant_tile_scale_widens_quantized_tiles_only():
    """quant_tile_scale multiplies the planned block_k of a quantized cache (capped at 512), never a 16-bit one's,
    and never a block_k the config names."""
    kw = dict(batch=1, hkv=8, rows=4, d=128, max_kv=32768, sm_count=132)
    wide = fd.DecodeConfig(quant_tile_scale=2)
    base = fd.plan(config=fd.DecodeConfig(), kv_format="fp8_e4m3", **kw).block_k
    assert fd.plan(config=wide, kv_format="fp8_e4m3", **kw).block_k == 2 * base
    assert fd.plan(config=wide, kv_format=None, **kw).block_k == base
    assert fd.plan(config=fd.DecodeConfig(block_k=32, quant_tile_scale=4), kv_format="nvfp4", **kw).block_k == 32
    assert fd.plan(config=fd.DecodeConfig(quant_tile_scale=4), kv_format="nvfp4", **{**kw, "d": 64}).block_k <= 512


def test_nvfp4_batch_regime():
    """A dense NVFP4 cache whose B*Hkv programs give every SM one is planned at 4 programs per SM (B32 Hkv8 D128 on
    132 SMs: the keys split in two, 512 programs) and decodes by halves; below it (B1), for fp8 and 16-bit caches,
    paged, or with the regime off (nvfp4_plain) the plan is the plain one."""
    kw = dict(hkv=8, rows=4, d=128, max_kv=8192, sm_count=132)
    cfg, plain = fd.CONFIGS["default"], fd.CONFIGS["nvfp4_plain"]
    big = fd.plan(config=cfg, batch=32, kv_format="nvfp4", **kw)
    assert big.splits == 2 and big.programs == 512 and big.slots == 528
    for fmt in (None, "fp8_e4m3"):
        assert fd.plan(config=cfg, batch=32, kv_format=fmt, **kw) == fd.plan(config=plain, batch=32, kv_format="nvfp4",
                                                                             **kw)
    assert fd.plan(config=plain, batch=32, kv_format="nvfp4", **kw).splits == 1
    assert fd.plan(config=cfg, batch=1, kv_format="nvfp4", **kw) == fd.plan(config=plain, batch=1, kv_format="nvfp4",
                                                                            **kw)
    assert fd.nvfp4_batch_regime(cfg, batch=32, hkv=8, rows=4, d=128, paged=False, sm_count=132)
    assert not fd.nvfp4_batch_regime(cfg, batch=32, hkv=8, rows=4, d=128, paged=True, sm_count=132)
    assert not fd.nvfp4_batch_regime(cfg, batch=16, hkv=8, rows=4, d=128, paged=False, sm_count=132)
    assert not fd.nvfp4_batch_regime(plain, batch=32, hkv=8, rows=4, d=128, paged=False, sm_count=132)
    with pytest.raises(ValueError, match="nvfp4_batch_occupancy"):
        fd.DecodeConfig(nvfp4_batch_occupancy=0)
    with pytest.raises(ValueError, match="quant_tile_scale"):
        fd.DecodeConfig(quant_tile_scale=3)
    with pytest.raises(ValueError, match="nvfp4_halves"):
        fd.DecodeConfig(nvfp4_halves=1)


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("halves", [False, True])
def test_nan_in_nan_out(rng, fmt, halves):
    """A NaN byte in one sequence's keys makes that sequence's output NaN (and only it); a NaN scale all of it (NVFP4
    also through the halves)."""
    q, k, v = _case(rng, 2, 1, 4, 1, 64, 32)
    kq, vq = QUANTIZE[fmt](jnp.asarray(k)), QUANTIZE[fmt](jnp.asarray(v))
    cfg = fd.DecodeConfig(block_k=16, nvfp4_halves=halves)
    if fmt == "fp8":
        bad = quant.Fp8Tensor(kq.data.at[0, 5, 0, 3].set(0x7F), kq.scale)
    else:  # a NaN micro-scale byte
        bad = quant.Nvfp4Tensor(kq.packed, kq.micro.at[0, 5, 0, 1].set(0xFF), kq.scale)
    out = np.asarray(pallas_attn.attention(q, bad, vq, generation="fa_decode", interpret=True, config=cfg))
    assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1]))
    nan_scale = type(vq)(*jax.tree_util.tree_leaves(vq)[:-1], jnp.float32(np.nan))
    out = np.asarray(pallas_attn.attention(q, kq, nan_scale, generation="fa_decode", interpret=True, config=cfg))
    assert np.all(np.isnan(out))


def test_errors(rng):
    q, k, v = _case(rng, 1, 1, 4, 2, 64, 32)
    k8, v4 = quant.quantize_fp8_e4m3(jnp.asarray(k)), quant.quantize_nvfp4(jnp.asarray(v))
    with pytest.raises(ValueError, match="stored alike"):
        pallas_attn.attention(q, k8, v4, generation="fa_decode", interpret=True)
    with pytest.raises(ValueError, match="stored alike"):
        pallas_attn.attention(q, k8, jnp.asarray(v, jnp.float16), generation="fa_decode", interpret=True)
    with pytest.raises(NotImplementedError, match="takes dtypes .*float32"):
        pallas_attn.attention(q.astype(jnp.float32), k8, k8, generation="fa_decode", interpret=True)
    with pytest.raises(ValueError, match="uint8"):
        pallas_attn.attention(q, quant.Fp8Tensor(k8.data.astype(jnp.int8), k8.scale), k8, generation="fa_decode",
                              interpret=True)
    with pytest.raises(ValueError, match="float32 scalar"):
        pallas_attn.attention(q, quant.Fp8Tensor(k8.data, jnp.ones(2)), k8, generation="fa_decode", interpret=True)
    bad = quant.Nvfp4Tensor(v4.packed, v4.micro[..., :2], v4.scale)
    with pytest.raises(ValueError, match="micro"):
        pallas_attn.attention(q, bad, bad, generation="fa_decode", interpret=True)
    with pytest.raises(ValueError, match="serves"):  # a generation without the quantized entry says so
        pallas_attn.attention(q, k8, k8, generation="v4_fused", interpret=True)
    with pytest.raises(ValueError, match="fp8_decode"):
        fd.DecodeConfig(fp8_decode="lut")


def test_contract_declares_the_quantized_entry():
    k = fd.KERNEL
    assert "quantized" in k.entries and set(k.kv_precision) == {"fp8_e4m3", "nvfp4"}
    base = dict(dtype="float16", batch=32, q_len=1, kv_len=8192, heads_q=32, heads_kv=8, head_dim=128)
    for kv, operand in (("fp8_e4m3", "fp8"), ("nvfp4", "nvfp4")):
        p = Problem(entry="quantized", kv_dtype=kv, page_size=64, **base)
        assert k.supports(p) == (True, "")
        r = k.roofline(p)
        assert r.precision == operand and r.tensor_cores and r.dequant_ops > 0
    assert k.roofline(Problem(entry="paged", page_size=64, **base)).dequant_ops == 0
    ok, why = k.supports(Problem(entry="quantized", kv_dtype="int4", **base))
    assert not ok and "int4" in why
    assert k.supports(Problem(entry="quantized", kv_dtype="nvfp4", **{**base, "dtype": "bfloat16"})) == (True, "")
    ok, why = k.supports(Problem(entry="quantized", kv_dtype="nvfp4", **{**base, "dtype": "float32"}))
    assert not ok and "float32" in why
    q = jnp.zeros((1, 1, 4, 64), jnp.float16)
    k8 = quant.quantize_fp8_e4m3(jnp.ones((1, 8, 2, 64)))
    assert api.problem_dense(q, k8, causal=False).kv_dtype == "fp8_e4m3"


@pytest.mark.parametrize("qdtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("config", ["default", "quant_alt_decode", "nvfp4_cast", "nvfp4_plain", "quant_pv16",
                                    "quant_pv16_off", "quant_qk16", "quant_qk16_off"])
def test_lowers_for_cuda(fmt, config, qdtype):
    """Every format x decode lowers to Triton for CUDA on this CPU machine (dense and paged, page < and >= tile, the
    in-kernel block-table check on and off): what interpret mode lets through (unsupported casts, joins, reshapes)
    fails here before the GPU run. NVFP4's default decode carries its inline PTX (session 19), the others do not."""
    b, hq, hkv, d, tk = 2, 8, 2, 128, 1000

    def pool_struct(lead):
        if fmt == "fp8":
            return quant.Fp8Tensor(jax.ShapeDtypeStruct((*lead, hkv, d), jnp.uint8),
                                   jax.ShapeDtypeStruct((), jnp.float32))
        return quant.Nvfp4Tensor(jax.ShapeDtypeStruct((*lead, hkv, d // 2), jnp.uint8),
                                 jax.ShapeDtypeStruct((*lead, hkv, d // 16), jnp.uint8),
                                 jax.ShapeDtypeStruct((), jnp.float32))

    q = jax.ShapeDtypeStruct((b, 1, hq, d), jnp.dtype(qdtype))
    lens = jax.ShapeDtypeStruct((b,), jnp.int32)
    traced = [jax.jit(lambda q, k: pallas_attn.attention(q, k, k, generation="fa_decode", config=config,
                                                         interpret=False)).trace(q, pool_struct((b, tk)))]
    for page, check in ((16, False), (16, True), (256, False), (256, True)):
        n = -(-tk // page)
        bt = jax.ShapeDtypeStruct((b, n), jnp.int32)
        traced.append(jax.jit(lambda q, kp, bt, lens, check=check: pallas_attn.paged_attention(
            q, kp, kp, bt, lens, causal=True, config=config, interpret=False, check_block_table=check)).trace(
            q, pool_struct((b * n, page)), bt, lens))
    for t in traced:
        text = t.lower(lowering_platforms=("cuda",)).as_text()
        names = set(re.findall(r"pallas_attn_\w+", text))
        assert names and names <= set(fd.KERNEL.passes) and text.count("xla.gpu.triton") >= len(names)
        asm = fmt == "nvfp4" and config in ("default", "quant_pv16", "quant_pv16_off", "quant_qk16", "quant_qk16_off")
        assert ("cvt.rn.f16x2.e4m3x2" in text) == asm, config
