"""MLA on the GPU (issue 13): v11_mla, v12_mla_tc (the Mosaic GPU kernel and its Triton twin) and fa_mla, compiled
(``interpret=False``), against a float64 oracle, at real sizes: the DeepSeek-V3 shape (h_q 128, 512 + 64, page 64,
S 8192, B 1 and 4), ragged lengths, causal multi-query with offsets, page 16, forced splits, the smaller templates,
fp8 (v12 / fa_mla) and NVFP4 (v11) latents judged on the dequantized latent, NaN in -> NaN out. One timing
line per kernel at mla_b64_s8192_bf16 is printed (informational; compare makes the records).

The oracle is attn_core.oracle.mla_attention_reference called with the heads as query rows (``_mqa_ref``: no
per-head copy of the latent); a CPU check below ties that call to the oracle's plain per-sequence one. Budget: three
to five minutes (``-m gpu``), most of it
compiling (~48 kernels; config kv64 adds 8 of them and one timing line, ~40 s; ``-k "kv64 or small_templates"``
runs them; kv64_lazy adds 8 more and a late-moving-max check, ``-k "kv64_lazy or small_templates"``; kv64_mc, the
2-CTA cluster with TMA multicast, adds 13 and a bit-for-bit comparison with kv64 at three templates and page sizes,
``-k kv64_mc``: a wrong cluster protocol hangs, so run it under ``timeout``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import dataclasses  # noqa: E402
import functools  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import formats, oracle, paging  # noqa: E402
from pallas_attn import quant  # noqa: E402
from pallas_attn.kernels import v12_mla_tc  # noqa: E402

REL = {"float16": 2e-3, "bfloat16": 1e-2}  # relative RMS error against the float64 oracle
MAXABS = {"float16": 4e-3, "bfloat16": 3e-2}


def _values(pool) -> np.ndarray:
    if isinstance(pool, quant.Fp8Tensor):
        return formats.dequantize_fp8_e4m3(formats.Fp8Array(np.asarray(pool.data), np.float32(pool.scale)))
    if isinstance(pool, quant.Nvfp4Tensor):
        return formats.dequantize_nvfp4(formats.Nvfp4Array(np.asarray(pool.packed), np.asarray(pool.micro),
                                                           np.float32(pool.scale)))
    return np.asarray(jnp.asarray(pool).astype(jnp.float32))


def _mqa_ref(q, pool, bt, lens, *, dv, causal=False, q_offset=None, scale=None):
    """float64 absorbed MLA: attn_core.oracle.mla_attention_reference, one call per (sequence, query token) with the
    Hq heads as its query rows over the one latent head (so the oracle never repeats the latent per head, which at
    h_q 128 and S 8192 would be gigabytes) and causality as the visible length ``t + offset + 1``."""
    qv = np.asarray(jnp.asarray(q).astype(jnp.float32), np.float64)
    lat = np.asarray(_values(pool), np.float64)
    b, tq, hq, _ = qv.shape
    out, lse = np.zeros((b, tq, hq, dv)), np.full((b, hq, tq), -np.inf)
    for i in range(b):
        n = int(lens[i])
        off = n - tq if q_offset is None else int(q_offset[i])
        kv = oracle.gather_paged_kv(lat, bt[i], n)[None]  # [1, n, 1, DQK]
        for t in range(tq):
            seen = min(max(t + off + 1, 0), n) if causal else n
            o, lse_t = oracle.mla_attention_reference(qv[i, t][None, :, None], kv, kv_lora_rank=dv, scale=scale,
                                                      kv_len=seen)
            out[i, t], lse[i, :, t] = o[0, :, 0], lse_t[0, 0]
    return out, lse


def _case(seed, *, b, tq, hq, dqk, lens, page, dtype, cap=None):
    key = jax.random.PRNGKey(seed)
    tk = cap or max(lens)
    kq, kl = jax.random.split(key)
    q = jax.random.normal(kq, (b, tq, hq, dqk), jnp.float32).astype(dtype)
    lat = np.asarray(jax.random.normal(kl, (b, tk, 1, dqk), jnp.float32).astype(dtype).astype(jnp.float32))
    pool, bt, kvl = paging.build_paged_latent(lat, page, seed=seed, kv_lens=lens)
    return q, jnp.asarray(pool, dtype), jnp.asarray(bt), jnp.asarray(kvl)


def _check(out, lse, ref, dtype, what=""):
    ro, rl = ref
    got = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
    assert got.shape == ro.shape, what
    rel = np.sqrt(np.mean((got - ro) ** 2)) / max(np.sqrt(np.mean(ro ** 2)), 1e-30)
    mx = np.max(np.abs(got - ro))
    print(f"{what}: rel RMS {rel:.2e}, max abs {mx:.2e}")
    assert rel < REL[dtype] and mx < MAXABS[dtype], (what, rel, mx)
    if lse is not None:
        fin = np.isfinite(rl)
        assert np.array_equal(np.isfinite(np.asarray(lse)), fin), what
        np.testing.assert_allclose(np.asarray(lse)[fin], rl[fin], atol=2e-3, rtol=1e-4, err_msg=what)


def test_oracle_is_the_core_mla_oracle():
    """CPU only: ``_mqa_ref`` (heads as query rows, causal as a length) equals attn_core.oracle.mla_attention_reference
    called per sequence with its own causal mask (small shapes)."""
    q, pool, bt, kl = _case(0, b=2, tq=2, hq=4, dqk=96, lens=[30, 17], page=16, dtype="float16")
    mine = _mqa_ref(q, pool, bt, kl, dv=64, causal=True)
    for i, n in enumerate([30, 17]):
        lat = oracle.gather_paged_kv(_values(pool), np.asarray(bt)[i], n)[None]
        o, lse = oracle.mla_attention_reference(np.asarray(q[i:i + 1], np.float64), lat, kv_lora_rank=64, causal=True,
                                                q_offset=n - 2)
        np.testing.assert_allclose(mine[0][i:i + 1], o, atol=1e-12)
        np.testing.assert_allclose(mine[1][i:i + 1], lse, atol=1e-12)


pytestmark_gpu = pytest.mark.gpu

# (generation, config, dtype of q / plain latent, batch)
_DEEPSEEK = [("fa_mla", "default", "bfloat16", 1), ("fa_mla", "default", "bfloat16", 4),
             ("v12_mla_tc", "faithful", "float16", 1), ("fa_mla", "split_qk", "bfloat16", 4),
             ("fa_mla", "pipelined", "bfloat16", 4), ("fa_mla", "kv64", "bfloat16", 4),
             ("v12_mla_tc", "kv64", "float16", 1), ("fa_mla", "kv64_lazy", "bfloat16", 4),
             ("v12_mla_tc", "kv64_lazy", "float16", 1), ("fa_mla", "kv64_mc", "bfloat16", 4),
             ("v12_mla_tc", "kv64_mc", "float16", 1), ("fa_mla", "kv64_ws", "bfloat16", 4),
             ("v12_mla_tc", "kv64_ws", "float16", 1), ("fa_mla", "kv64_ws_mc", "bfloat16", 4),
             ("fa_mla", "kv64_wsq_mc", "bfloat16", 4), ("v12_mla_tc", "kv64_wsq_mc", "float16", 1),
             ("fa_mla", "kv32_ws", "bfloat16", 4), ("fa_mla", "kv32_ws_mc", "bfloat16", 4),
             ("v12_mla_tc", "kv32_ws", "float16", 1),
             ("fa_mla", "kv64_mc_wl", "bfloat16", 4), ("v12_mla_tc", "kv64_wl", "float16", 1),
             ("fa_mla", "triton", "bfloat16", 4),
             ("v11_mla", "faithful", "float16", 1), ("v11_mla", "faithful", "float16", 4)]


@pytestmark_gpu
@pytest.mark.parametrize(("gen", "config", "dtype", "batch"), _DEEPSEEK)
def test_deepseek_shape(gen, config, dtype, batch):
    lens = [8192] if batch == 1 else [8192, 5000, 8191, 1]
    q, pool, bt, kl = _case(batch, b=batch, tq=1, hq=128, dqk=576, lens=lens, page=64, dtype=dtype, cap=8192)
    out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, generation=gen, config=config,
                                         return_lse=True, interpret=False)
    _check(out, lse, _mqa_ref(q, pool, bt, np.asarray(kl), dv=512), dtype, f"{gen}:{config} B{batch} S8192")


@pytestmark_gpu
@pytest.mark.parametrize("config", ["default", "split_qk", "pipelined", "kv64", "kv64_lazy", "kv64_mc", "kv64_ws",
                                    "kv64_ws_mc", "kv64_wsq_mc", "kv32_ws", "kv32_ws_mc", "triton"])
def test_causal_multi_query_offsets_page16_and_splits(config):
    lens = [2048, 1000]
    q, pool, bt, kl = _case(11, b=2, tq=3, hq=128, dqk=576, lens=lens, page=16, dtype="bfloat16")
    off = np.array([2045, 400])
    out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, causal=True, config=config,
                                         q_offset=jnp.asarray(off, jnp.int32), return_lse=True, interpret=False)
    _check(out, lse, _mqa_ref(q, pool, bt, np.asarray(kl), dv=512, causal=True, q_offset=off), "bfloat16",
           f"fa_mla:{config} causal Tq3 page16")
    base = pallas_attn.registry.configs("fa_mla")[config]
    cfg = v12_mla_tc.MlaTcConfig(**{**base.__dict__, "num_splits": 7})
    out = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, config=cfg, interpret=False)
    _check(out, None, _mqa_ref(q, pool, bt, np.asarray(kl), dv=512), "bfloat16", f"fa_mla:{config} 7 splits")


@pytestmark_gpu
@pytest.mark.parametrize(("dqk", "dv"), [(192, 128), (320, 256)])
def test_v12_small_templates_few_heads(dqk, dv):
    lens = [700, 129, 0]
    q, pool, bt, kl = _case(12, b=3, tq=1, hq=16, dqk=dqk, lens=lens, page=32, dtype="float16")
    # kv64 at page 32: two TMA copies per 64-key tile; kv64_mc at 16 heads (one row tile) runs as kv64, no cluster
    for config in ("faithful", "kv64", "kv64_lazy", "kv64_mc", "kv64_ws", "kv64_ws_mc", "kv64_wsq_mc", "kv32_ws",
                   "triton"):
        out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=dv, generation="v12_mla_tc",
                                             config=config, return_lse=True, interpret=False)
        _check(out, lse, _mqa_ref(q, pool, bt, np.asarray(kl), dv=dv), "float16", f"v12:{config} {dqk}/{dv}")


@pytestmark_gpu
def test_fp8_latent_fa_mla():
    lens = [8192, 3000, 17, 8000]
    q, pool, bt, kl = _case(13, b=4, tq=1, hq=128, dqk=576, lens=lens, page=64, dtype="bfloat16", cap=8192)
    qpool = quant.quantize_fp8_e4m3(pool)
    out, lse = pallas_attn.mla_attention(q, qpool, bt, kl, kv_lora_rank=512, return_lse=True, interpret=False)
    ref = _mqa_ref(q, qpool, bt, np.asarray(kl), dv=512)
    _check(out, lse, ref, "bfloat16", "fa_mla fp8 latent (triton config) vs dequantized oracle")
    exact = _mqa_ref(q, pool, bt, np.asarray(kl), dv=512)[0]
    print(f"fp8 latent quantization: rel RMS {np.sqrt(np.mean((ref[0] - exact) ** 2) / np.mean(exact ** 2)):.2e}")


@pytestmark_gpu
@pytest.mark.parametrize(("dqk", "dv", "hq", "s"), [(96, 64, 16, 1000), (160, 128, 16, 1000), (576, 512, 128, 8192)])
def test_v11_nvfp4_templates(dqk, dv, hq, s):
    lens = [s, s // 3]
    q, pool, bt, kl = _case(14, b=2, tq=1, hq=hq, dqk=dqk, lens=lens, page=16, dtype="float16")
    qpool = quant.quantize_nvfp4(pool)
    out, lse = pallas_attn.mla_attention(q, qpool, bt, kl, kv_lora_rank=dv, generation="v11_mla", return_lse=True,
                                         interpret=False)
    _check(out, lse, _mqa_ref(q, qpool, bt, np.asarray(kl), dv=dv), "float16", f"v11 NVFP4 {dqk}/{dv}")


@pytestmark_gpu
@pytest.mark.parametrize(("pair", "dqk", "dv", "page"), [(("kv64", "kv64_mc"), 576, 512, 32),
                                                         (("kv64", "kv64_mc"), 320, 256, 64),
                                                         (("kv64", "kv64_mc"), 192, 128, 16),
                                                         (("kv64_ws", "kv64_ws_mc"), 576, 512, 16)])
def test_kv64_mc_equals_kv64_bit_for_bit(pair, dqk, dv, page):
    """kv64_mc changes only how a latent tile reaches shared memory (one L2 read per 2-CTA cluster, multicast into
    both; a cluster-wide free barrier), not one operation of the arithmetic: its output and LSE must equal kv64's
    bit for bit, and the oracle. h_q 128 (two row tiles: one cluster per (batch, split)), every template, page 32
    (two copies per tile), 64 (one) and 16 (four); 5 forced splits over ragged lengths with an empty sequence, so
    some clusters have no tile at all (n = 0 in both CTAs) and others a partial last tile. A broken cluster
    protocol shows here as a hang (run under ``timeout``), a wrong tile (stale or the partner's slot) as a mismatch."""
    lens = [3000, 0, 700]
    q, pool, bt, kl = _case(18, b=3, tq=1, hq=128, dqk=dqk, lens=lens, page=page, dtype="bfloat16")
    plain, mc = pair
    got = {}
    for config in pair:
        base = pallas_attn.registry.configs("v12_mla_tc")[config]
        cfg = v12_mla_tc.MlaTcConfig(**{**base.__dict__, "num_splits": 5})
        got[config] = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=dv, generation="v12_mla_tc", config=cfg,
                                                return_lse=True, interpret=False)
    out, lse = got[mc]
    _check(out, lse, _mqa_ref(q, pool, bt, np.asarray(kl), dv=dv), "bfloat16", f"v12:{mc} {dqk}/{dv} page {page}")
    for a, b in zip(got[mc], got[plain]):
        assert np.array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)), equal_nan=True)


@pytestmark_gpu
@pytest.mark.parametrize("config", ["kv64_ws", "kv64_wsq_mc"])
def test_kv64_ws_matches_kv64(config):
    """kv64_ws moves the products between warpgroups (S and the softmax on one, each P V half on its own, P always
    from shared memory) but computes the same S, P, alpha and sums: at the DeepSeek-V3 shape with ragged lengths,
    forced splits and an empty sequence its output and LSE stay within one bf16 rounding of kv64's (printed: whether
    they are equal bit for bit), and both match the oracle."""
    lens = [8192, 0, 3001, 64]
    q, pool, bt, kl = _case(19, b=4, tq=1, hq=128, dqk=576, lens=lens, page=64, dtype="bfloat16", cap=8192)
    got = {}
    for name in ("kv64", config):
        base = pallas_attn.registry.configs("fa_mla")[name]
        cfg = v12_mla_tc.MlaTcConfig(**{**base.__dict__, "num_splits": 3})
        got[name] = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, config=cfg, return_lse=True,
                                              interpret=False)
    _check(*got[config], _mqa_ref(q, pool, bt, np.asarray(kl), dv=512), "bfloat16", f"fa_mla:{config} 3 splits")
    (o1, l1), (o2, l2) = (tuple(np.asarray(x.astype(jnp.float32)) for x in got[c]) for c in ("kv64", config))
    print(f"\n{config} vs kv64: output bit-equal {np.array_equal(o1, o2, equal_nan=True)}, "
          f"max abs diff {np.nanmax(np.abs(o1 - o2)):.3e}; LSE max abs diff {np.nanmax(np.abs(l1 - l2)):.3e}")
    np.testing.assert_allclose(o2, o1, rtol=2.0 ** -8, atol=1e-6)
    np.testing.assert_allclose(l2, l1, rtol=1e-6, atol=1e-6)


@pytestmark_gpu
@pytest.mark.parametrize(("config", "num_sm", "tq"), [("kv64_mc_wl", None, 1), ("kv64_mc_wl", 8, 1), ("kv64_wl", 6, 1),
                                                      ("kv64_mc_wl", 12, 3)])
def test_work_list_matches_the_split_rule(config, num_sm, tq):
    """The work list (units given equal shares of the batch's key tiles across sequence boundaries, each running its
    pieces in turn) computes the same S, P and sums as kv64 over other key ranges: at the DeepSeek-V3 template with
    ragged lengths, an empty sequence and a one-key one, its output and LSE match the oracle and stay within bf16
    rounding of kv64_mc's (the split rule). ``num_sm`` 6-12 gives 3-6 units, so a unit runs several pieces (the
    ring refilled after the aliased epilogue, Q reloaded, the final l handed over each time); None, the device's one
    wave. Tq 3 causal with offsets at page 16 (four copies a tile). Under jit a page outside the pool poisons only
    its sequence. A broken piece protocol hangs: run under ``timeout``."""
    lens = [8192, 0, 3001, 1, 5000] if tq == 1 else [2048, 1000, 0, 1500]
    page = 64 if tq == 1 else 16
    q, pool, bt, kl = _case(21, b=len(lens), tq=tq, hq=128, dqk=576, lens=lens, page=page, dtype="bfloat16",
                            cap=8192 if tq == 1 else 2048)
    off = np.array([2045, 400, 0, 1497]) if tq > 1 else None
    base = pallas_attn.registry.configs("fa_mla")[config]
    cfg = v12_mla_tc.MlaTcConfig(**{**base.__dict__, "num_sm": num_sm})
    kw = dict(kv_lora_rank=512, return_lse=True, causal=tq > 1, interpret=False,
              q_offset=None if off is None else jnp.asarray(off, jnp.int32))
    got = pallas_attn.mla_attention(q, pool, bt, kl, config=cfg, **kw)
    ref = _mqa_ref(q, pool, bt, np.asarray(kl), dv=512, causal=tq > 1, q_offset=off)
    _check(*got, ref, "bfloat16", f"fa_mla:{config} num_sm {num_sm} Tq {tq}")
    split = pallas_attn.mla_attention(q, pool, bt, kl, config="kv64_mc", **kw)
    (o1, l1), (o2, l2) = (tuple(np.asarray(x.astype(jnp.float32)) for x in r) for r in (split, got))
    np.testing.assert_allclose(o2, o1, rtol=2.0 ** -7, atol=2e-3)
    np.testing.assert_allclose(l2, l1, rtol=1e-5, atol=1e-5)
    f = jax.jit(lambda q, pool, bt, kl: pallas_attn.mla_attention(q, pool, bt, kl, config=cfg, **kw))
    sb = 2 if tq == 1 else 1
    o_ok = np.asarray(f(q, pool, bt, kl)[0], np.float32)
    o3, l3 = (np.asarray(x, np.float32) for x in f(q, pool, bt.at[sb, 0].set(pool.shape[0] + 7), kl))
    assert np.all(np.isnan(o3[sb])) and np.all(np.isnan(l3[sb]))
    assert np.array_equal(np.delete(o3, sb, axis=0), np.delete(o_ok, sb, axis=0))


@pytestmark_gpu
@pytest.mark.parametrize("config", ["default", "kv64", "kv64_lazy", "kv64_mc", "kv64_mc_wl", "triton"])
def test_nan_in_nan_out(config):
    q, pool, bt, kl = _case(15, b=2, tq=1, hq=128, dqk=576, lens=[300, 200], page=64, dtype="bfloat16")
    q = q.at[0, 0, 5, 9].set(jnp.nan)
    pool = pool.at[int(bt[1, 0]), 3, 0, 100].set(jnp.nan)
    out = np.asarray(pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, config=config, interpret=False),
                     np.float32)
    assert np.all(np.isnan(out[0, 0, 5])) and np.all(np.isfinite(np.delete(out[0, 0], 5, axis=0)))
    assert np.all(np.isnan(out[1]))


@pytestmark_gpu
@pytest.mark.parametrize(("config", "tq"), [("kv64_mc", 1), ("kv64_ws_mc", 2), ("default", 1), ("triton", 3)])
def test_finish_pallas_equals_the_jnp_merge_and_poisons_under_jit(config, tq):
    """``finish="pallas"`` (the default: one launch for the merge, the table check, the cast and the layout) against
    ``finish="jnp"`` (XLA's merge, cast, unpack and select) on the same partial kernel: the same output and LSE to a
    few bf16 ulps (summation order), and under jit a page outside the pool turns exactly that sequence into NaN."""
    import dataclasses

    q, pool, bt, kl = _case(16, b=3, tq=tq, hq=128, dqk=576, lens=[4000, 1, 2500], page=64, dtype="bfloat16",
                            cap=4096)
    base = v12_mla_tc.CONFIGS["faithful" if config == "default" else config]
    assert base.finish == "pallas"
    def jitted(cfg):
        return jax.jit(lambda q, pool, bt, kl: pallas_attn.mla_attention(
            q, pool, bt, kl, kv_lora_rank=512, config=cfg, return_lse=True, causal=True, interpret=False))

    f = {fin: jitted(dataclasses.replace(base, finish=fin)) for fin in ("pallas", "jnp")}
    (o1, l1), (o2, l2) = f["pallas"](q, pool, bt, kl), f["jnp"](q, pool, bt, kl)
    o1, o2 = np.asarray(o1, np.float32), np.asarray(o2, np.float32)
    assert np.all(np.isfinite(o1))  # sequence 1 (one key) has rows that see none: output 0, LSE -inf
    np.testing.assert_allclose(o1, o2, atol=4e-3, rtol=2e-2)
    np.testing.assert_allclose(np.asarray(l1), np.asarray(l2), atol=1e-5, rtol=1e-6)
    _check(o1, l1, _mqa_ref(q, pool, bt, np.asarray(kl), dv=512, causal=True), "bfloat16", f"{config} finish")
    bad = bt.at[2, 1].set(pool.shape[0] + 7)  # sequence 2 uses page 1 (2500 keys): poisoned
    o3, l3 = f["pallas"](q, pool, bad, kl)
    o3, l3 = np.asarray(o3, np.float32), np.asarray(l3)
    assert np.all(np.isnan(o3[2])) and np.all(np.isnan(l3[2]))
    assert np.all(np.isfinite(o3[:2])) and np.array_equal(o3[:2], o1[:2])


@pytestmark_gpu
@pytest.mark.parametrize(("config", "tq", "hq"), [("kv64_mc", 1, 128), ("kv64_mc", 2, 128), ("kv64_ws_mc", 1, 128),
                                                  ("kv64_lazy", 1, 128), ("default", 3, 128), ("kv32_ws_mc", 1, 128),
                                                  ("kv64_wsq_mc", 1, 128), ("kv64_mc", 1, 16), ("kv64", 3, 16)])
def test_direct_epilogue_equals_the_finish_and_poisons_under_jit(config, tq, hq):
    """At one split the kernel writes q's dtype and the LSE itself (``direct``, the default): against the same
    kernel's fp32 partial merged by the finish (``direct=False``) the output agrees to one bf16 rounding and the LSE
    exactly; it matches the oracle (causal, Tq 1-3, an empty sequence, a one-key one); under jit a page outside the
    pool turns exactly that sequence into NaN, and a NaN in a query stays in its row. At DeepSeek-V2-Lite's 16 heads
    the 16 or 48 packed rows are padded to one 64-row tile (kv64_mc then runs without its cluster) and cut after."""
    q, pool, bt, kl = _case(17, b=4, tq=tq, hq=hq, dqk=576, lens=[4000, 1, 2500, 0], page=64, dtype="bfloat16",
                            cap=4096)
    base = dataclasses.replace(v12_mla_tc.CONFIGS["faithful" if config == "default" else config], num_splits=1)
    assert base.direct and base.writes_direct(1)

    def jitted(cfg):
        return jax.jit(lambda q, pool, bt, kl: pallas_attn.mla_attention(
            q, pool, bt, kl, kv_lora_rank=512, config=cfg, return_lse=True, causal=True, interpret=False))

    f = {d: jitted(dataclasses.replace(base, direct=d)) for d in (True, False)}
    (o1, l1), (o2, l2) = f[True](q, pool, bt, kl), f[False](q, pool, bt, kl)
    assert o1.dtype == jnp.bfloat16 and o1.shape == (4, tq, hq, 512) and l1.shape == (4, hq, tq)
    o1, o2 = np.asarray(o1, np.float32), np.asarray(o2, np.float32)
    np.testing.assert_allclose(o1, o2, atol=2e-3, rtol=2.0 ** -7)
    np.testing.assert_array_equal(np.asarray(l1), np.asarray(l2))
    _check(o1, l1, _mqa_ref(q, pool, bt, np.asarray(kl), dv=512, causal=True), "bfloat16", f"{config} direct")
    bad = bt.at[2, 1].set(pool.shape[0] + 7)  # sequence 2 uses page 1 (2500 keys): poisoned
    o3, l3 = (np.asarray(x, np.float32) for x in f[True](q.at[0, 0, 5, 9].set(jnp.nan), pool, bad, kl))
    assert np.all(np.isnan(o3[2])) and np.all(np.isnan(l3[2]))
    assert np.all(np.isnan(o3[0, 0, 5])) and np.all(np.isfinite(np.delete(o3[0, 0], 5, axis=0)))
    assert np.array_equal(o3[1], o1[1]) and np.array_equal(o3[3], o1[3])


@pytestmark_gpu
def test_direct_epilogue_at_the_split_rules_one_split():
    """B 70 at DeepSeek-V3's heads fills the machine at one split (140 CTAs): the default rule writes directly and
    agrees with the oracle on ragged lengths."""
    rng = np.random.default_rng(5)
    lens = [int(x) for x in rng.integers(0, 1025, 70)]
    q, pool, bt, kl = _case(19, b=70, tq=1, hq=128, dqk=576, lens=lens, page=64, dtype="bfloat16", cap=1024)
    cfg = pallas_attn.registry.configs("fa_mla")["kv64_mc"]
    assert cfg.splits(batch=70, rows=128, n_k=1024)[0] == 1
    out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, config=cfg, return_lse=True,
                                         interpret=False)
    _check(out, lse, _mqa_ref(q, pool, bt, np.asarray(kl), dv=512), "bfloat16", "kv64_mc B70 direct")


@pytestmark_gpu
def test_kv64_lazy_max_moves_late():
    """kv64_lazy at the DeepSeek shape where the running max must move after the first tiles: from key 1000 on the
    rope part of the latent (its last 64 dims: in K, not in V) is 8x larger, so late scores spread ~3x wider (the max
    moves by ~18 in log2 units, past the 2^8 threshold) while V and the output stay at unit scale (the absolute
    tolerance is for unit-scale outputs; the first version scaled the whole latent 3x, and kv64_lazy's 0.0306 max
    abs against 0.03 was one bf16 ulp of outputs near 4-8, H200, 2026-11-22); kv64 beside it."""
    rng = np.random.default_rng(17)
    lens = [4096, 3000]
    lat = rng.standard_normal((2, 4096, 1, 576)).astype(np.float32)
    lat[:, 1000:, :, 512:] *= 8.0
    q = jnp.asarray(rng.standard_normal((2, 1, 128, 576)), jnp.bfloat16)
    pool, bt, kl = paging.build_paged_latent(lat, 64, seed=17, kv_lens=lens)
    pool, bt, kl = jnp.asarray(pool, jnp.bfloat16), jnp.asarray(bt), jnp.asarray(kl)
    scale = 2.0 / np.sqrt(576)
    ref = _mqa_ref(q, pool, bt, np.asarray(kl), dv=512, scale=scale)
    for config in ("kv64_lazy", "kv64"):
        out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, scale=scale, config=config,
                                             return_lse=True, interpret=False)
        _check(out, lse, ref, "bfloat16", f"fa_mla:{config} late-moving max")


@functools.cache
def _b64_case():
    return _case(16, b=64, tq=1, hq=128, dqk=576, lens=[8192] * 64, page=64, dtype="bfloat16")


@pytestmark_gpu
@pytest.mark.parametrize(("gen", "config"), [("fa_mla", "default"), ("fa_mla", "split_qk"), ("fa_mla", "pipelined"),
                                             ("fa_mla", "kv64"), ("fa_mla", "kv64_lazy"), ("fa_mla", "kv64_mc"),
                                             ("fa_mla", "triton")])
def test_timing_b64_s8192(gen, config):
    """mla_b64_s8192_bf16: one timing line, and two sequences checked against the oracle."""
    dtype = "bfloat16"
    b, s = 64, 8192
    q, pool, bt, kl = _b64_case()
    f = jax.jit(lambda q, pool, bt, kl: pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, generation=gen,
                                                                  config=config, interpret=False,
                                                                  check_block_table=False))
    out = f(q, pool, bt, kl).block_until_ready()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        out = f(q, pool, bt, kl)
    out.block_until_ready()
    us = (time.perf_counter() - t0) / reps * 1e6
    nbytes = b * s * 576 * 2 + 2 * b * 128 * (576 + 512)
    flops = 2 * b * 128 * s * (576 + 512)
    print(f"TIMING {gen}:{config} mla_b64_s8192: {us:.1f} us, {nbytes / us / 1e6:.2f} TB/s, "
          f"{flops / us / 1e6:.1f} TFLOP/s (wall clock incl. launch, L2 not flushed)")
    ref = _mqa_ref(q[:2], pool, np.asarray(bt)[:2], np.asarray(kl)[:2], dv=512)
    _check(out[:2], None, ref, dtype, f"{gen}:{config} B64 (first two sequences)")
