"""pallas_attn.mla_attention (issue 13): v11_mla, v12_mla_tc and fa_mla against the float64 MLA oracles, on the CPU.

Interpret mode runs v11_mla's Triton kernel and v12_mla_tc's twin (the same 64-row tiles, TN-key latent tiles,
splits and base-2 recurrence as the Mosaic kernel; tests/gpu/test_mla_pallas_gpu.py runs the Mosaic kernel itself).
Quantized latents are judged against the oracle on the dequantized latent (attn_core.formats); the quantization
error is reported separately. Small shapes: the file runs in well under a minute.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import formats, oracle, paging
from pallas_attn import quant, registry
from pallas_attn.kernels import v12_mla_tc
from pallas_attn.kernels.contract import Problem

TOL = {"float16": 3e-3, "bfloat16": 2e-2}


def _latent_values(pool) -> np.ndarray:
    """float64 values a kernel sees in a pool: plain, or the judge's dequantization of a quantized one."""
    if isinstance(pool, quant.Fp8Tensor):
        return formats.dequantize_fp8_e4m3(formats.Fp8Array(np.asarray(pool.data), np.float32(pool.scale)))
    if isinstance(pool, quant.Nvfp4Tensor):
        return formats.dequantize_nvfp4(formats.Nvfp4Array(np.asarray(pool.packed), np.asarray(pool.micro),
                                                           np.float32(pool.scale)))
    return np.asarray(jnp.asarray(pool).astype(jnp.float32))


def _ref(q, pool, bt, lens, *, dv, causal=False, q_offset=None, scale=None):
    """(out [B, Tq, Hq, DV], lse [B, Hq, Tq]) of the absorbed-MLA oracle, sequence by sequence."""
    qv = np.asarray(jnp.asarray(q).astype(jnp.float32), np.float64)
    lat = _latent_values(pool)
    b, tq, hq, _ = qv.shape
    outs, lses = [], []
    for i in range(b):
        n = int(lens[i])
        off = n - tq if q_offset is None else int(np.broadcast_to(q_offset, (b,))[i])
        if n == 0:
            outs.append(np.zeros((1, tq, hq, dv)))
            lses.append(np.full((1, hq, tq), -np.inf))
            continue
        o, lse = oracle.mla_attention_reference(qv[i:i + 1], oracle.gather_paged_kv(lat, bt[i], n)[None],
                                                kv_lora_rank=dv, causal=causal, q_offset=off, scale=scale)
        outs.append(o)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


def _case(seed, *, b, tq, hq, dqk, lens, page, dtype):
    rng = np.random.default_rng(seed)
    tk = max(max(lens), 1)
    lat = rng.standard_normal((b, tk, 1, dqk)).astype(np.float32)
    q = rng.standard_normal((b, tq, hq, dqk)).astype(np.float32)
    pool, bt, kl = paging.build_paged_latent(lat, page, seed=seed, kv_lens=lens)
    return jnp.asarray(q, dtype), jnp.asarray(pool), jnp.asarray(bt), jnp.asarray(kl)


def _check(out, lse, ref, dtype):
    ro, rl = ref
    got = np.asarray(jnp.asarray(out).astype(jnp.float32), np.float64)
    assert got.shape == ro.shape
    np.testing.assert_allclose(got, ro, atol=TOL[dtype], rtol=TOL[dtype])
    fin = np.isfinite(rl)
    assert np.array_equal(np.isfinite(np.asarray(lse)), fin)
    np.testing.assert_allclose(np.asarray(lse)[fin], rl[fin], atol=2e-4, rtol=1e-5)


# --- v11_mla: the three templates, plain and NVFP4 latents ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("dqk", "dv"), [(96, 64), (160, 128), (576, 512)])
def test_v11_templates_ragged_paged(dqk, dv):
    lens = [37, 0, 70]
    q, pool, bt, kl = _case(1, b=3, tq=1, hq=8, dqk=dqk, lens=lens, page=16, dtype="float16")
    out, lse = pallas_attn.mla_attention(q, pool.astype(jnp.float16), bt, kl, kv_lora_rank=dv, generation="v11_mla",
                                         return_lse=True)
    _check(out, lse, _ref(q, pool.astype(jnp.float16), bt, lens, dv=dv), "float16")
    assert out.dtype == jnp.float16 and out.shape == (3, 1, 8, dv)


def test_v11_nvfp4_latent_causal_multi_query_page64():
    lens = [90, 45]
    q, pool, bt, kl = _case(2, b=2, tq=3, hq=4, dqk=96, lens=lens, page=64, dtype="float16")
    qpool = quant.quantize_nvfp4(pool)
    out, lse = pallas_attn.mla_attention(q, qpool, bt, kl, kv_lora_rank=64, generation="v11_mla", causal=True,
                                         q_offset=jnp.array([50, 40], jnp.int32), return_lse=True)
    ref = _ref(q, qpool, bt, lens, dv=64, causal=True, q_offset=np.array([50, 40]))
    _check(out, lse, ref, "float16")
    # the quantization error, separately: the same call's oracle on the unquantized latent
    exact, _ = _ref(q, pool, bt, lens, dv=64, causal=True, q_offset=np.array([50, 40]))
    qerr = np.sqrt(np.mean((ref[0] - exact) ** 2))
    kerr = np.sqrt(np.mean((np.asarray(out, np.float64) - ref[0]) ** 2))
    print(f"v11_mla NVFP4 latent: quantization RMSE {qerr:.2e}, kernel RMSE vs the dequantized oracle {kerr:.2e}")
    assert kerr < qerr


# --- v12_mla_tc / fa_mla (the twin in interpret mode) -----------------------------------------------------------


def test_v12_deepseek_template_bf16_ragged_causal_lse():
    lens = [70, 33]
    q, pool, bt, kl = _case(3, b=2, tq=3, hq=16, dqk=576, lens=lens, page=16, dtype="bfloat16")
    pool = pool.astype(jnp.bfloat16)
    off = np.array([67, 20])
    out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=512, generation="v12_mla_tc", causal=True,
                                         q_offset=jnp.asarray(off, jnp.int32), return_lse=True)
    _check(out, lse, _ref(q, pool, bt, lens, dv=512, causal=True, q_offset=off), "bfloat16")


def test_fa_mla_fp16_forced_splits_page64():
    lens = [200, 1, 129]
    q, pool, bt, kl = _case(4, b=3, tq=1, hq=8, dqk=192, lens=lens, page=64, dtype="float16")
    pool = pool.astype(jnp.float16)
    cfg = v12_mla_tc.MlaTcConfig(num_splits=3)
    out, lse = pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=128, config=cfg, return_lse=True)
    _check(out, lse, _ref(q, pool, bt, lens, dv=128), "float16")


def test_fa_mla_fp8_latent_bf16_q():
    lens = [100, 64]
    q, pool, bt, kl = _case(5, b=2, tq=1, hq=8, dqk=192, lens=lens, page=16, dtype="bfloat16")
    qpool = quant.quantize_fp8_e4m3(pool)
    problem = Problem(entry="mla", dtype="bfloat16", batch=2, q_len=1, kv_len=bt.shape[1] * 16, heads_q=8,
                      heads_kv=1, head_dim=192, page_size=16, kv_dtype="fp8_e4m3", kv_lora_rank=128)
    assert registry.kernel("fa_mla").config(None, problem).engine == "triton"  # the heuristic picks the twin
    out, lse = pallas_attn.mla_attention(q, qpool, bt, kl, kv_lora_rank=128, return_lse=True, causal=True)
    ref = _ref(q, qpool, bt, lens, dv=128, causal=True)
    _check(out, lse, ref, "bfloat16")
    exact, _ = _ref(q, pool, bt, lens, dv=128, causal=True)
    print(f"fa_mla fp8 latent: quantization RMSE {np.sqrt(np.mean((ref[0] - exact) ** 2)):.2e}")
    with pytest.raises(NotImplementedError, match="config='triton'"):
        pallas_attn.mla_attention(q, qpool, bt, kl, kv_lora_rank=128, config="default")


def test_absorption_identity_through_the_kernel():
    """Materialized MLA (per-head K = [c W_UK^T, r], V = c W_UV^T) == mla_attention(q_abs) . W_UV^T."""
    rng = np.random.default_rng(6)
    b, tq, h, lora, rope, dn, dvh, tk = 2, 1, 4, 128, 64, 32, 16, 50
    latent = rng.standard_normal((b, tk, 1, lora + rope)).astype(np.float16).astype(np.float64)
    q_nope, q_rope = rng.standard_normal((b, tq, h, dn)), rng.standard_normal((b, tq, h, rope))
    w_uk, w_uv = rng.standard_normal((h, dn, lora)) / np.sqrt(dn), rng.standard_normal((h, dvh, lora)) / np.sqrt(lora)
    scale = 1.0 / np.sqrt(dn + rope)
    ref, ref_lse = oracle.mla_materialized_reference(q_nope, q_rope, latent, kv_lora_rank=lora, w_uk=w_uk, w_uv=w_uv,
                                                     scale=scale)
    q_abs = np.concatenate([np.einsum("bthd,hdl->bthl", q_nope, w_uk), q_rope], axis=-1)
    pool, bt, kl = paging.build_paged_latent(latent.astype(np.float16), 16, seed=6)
    o_abs, lse = pallas_attn.mla_attention(jnp.asarray(q_abs, jnp.float16), jnp.asarray(pool), jnp.asarray(bt),
                                           jnp.asarray(kl), kv_lora_rank=lora, scale=float(scale), return_lse=True)
    out = np.einsum("bthl,hvl->bthv", np.asarray(o_abs, np.float64), w_uv)
    # the kernel sees q_abs rounded to fp16: the tolerance is fp16's, the identity itself holds to 1e-12
    np.testing.assert_allclose(out, ref, atol=5e-3, rtol=5e-3)
    np.testing.assert_allclose(np.asarray(lse), ref_lse, atol=5e-3)


# --- the Mosaic GPU kernel itself, on jax's GPU interpreter ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("config", "dqk", "dv", "b", "tq", "hq", "page", "causal", "splits", "lens"), [
    ("faithful", 192, 128, 2, 3, 24, 16, True, 1, [140, 0]),  # two row tiles (padded), per-row mask, 2 copies/tile,
    # 5 tiles through the 3-slot ring
    ("split_qk", 320, 256, 2, 1, 16, 64, False, 2, [150, 37]),  # the S exchange
    ("pipelined", 192, 128, 2, 2, 8, 16, True, 2, [230, 0]),  # QK(s) with PV(s-1); empty splits still load block 0
    ("kv64", 192, 128, 2, 3, 16, 16, True, 2, [140, 0]),  # 64-key tiles (4 page copies each), P and alpha handed
    # from consumer 0 to consumer 1, the staging aliasing the ring; an empty split and an empty sequence
    ("kv64_lazy", 192, 128, 2, 3, 16, 16, True, 2, [140, 0]),  # kv64 with the lazy running max (the flag handed
    # over with alpha; causal rows see their first key late, so the max moves after tile 0 too)
    ("kv32_ws", 192, 128, 2, 1, 16, 16, False, 2, [130, 37]),  # 32-key tiles in a 4-slot ring, the S warpgroup
    # running tile s's softmax while tile s + 1's QK is in flight; two splits, the last tile of each sequence partial
    ("kv64_wsq_mc", 192, 128, 2, 3, 16, 16, True, 2, [140, 0]),  # warpgroups by role (kv64_ws's protocol: S +
    # softmax, two P V readers of the one P buffer, p_free by both, the first also the loader) with Q's first 128
    # columns (of 192) in the S warpgroup's registers; one row tile here, so no cluster
])
def test_mosaic_kernel_on_the_gpu_interpreter(config, dqk, dv, b, tq, hq, page, causal, splits, lens):
    """The Mosaic kernel's own code (TMA through the table, the latent ring and its barriers, masks, the split_qk
    exchange, kv64's P handoff, the staged fp32 epilogue) run by jax's GPU interpreter with race detection; products
    as jnp dots. Without kv64's ``done`` wait before the aliased staging the race detector fires; without its p_free
    wait the interpreter's barrier check raises (and the run then hangs)."""
    q, pool, bt, kl = _case(10, b=b, tq=tq, hq=hq, dqk=dqk, lens=lens, page=page, dtype="bfloat16")
    pool = pool.astype(jnp.bfloat16)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS[config].__dict__, "num_splits": splits})
    out, lse, races = v12_mla_tc.emulate_mosaic(q, pool, bt, kl, kl - tq, kv_lora_rank=dv, causal=causal,
                                                scale=1.0 / np.sqrt(dqk), config=cfg)
    assert not races
    _check(out, lse, _ref(q, pool, bt, lens, dv=dv, causal=causal), "bfloat16")


@pytest.mark.slow
def test_kv64_lazy_moves_the_max_after_the_first_tile():
    """kv64_lazy keeps the running max until a row's tile max passes it by more than LAZY_LOG2 (base 2). Keys from
    64 on (tiles 2 and 3) score 3x larger, so the max moves on later tiles: both consumers must then rescale their
    O halves (consumer 1 on the flag consumer 0 hands over; skipping either rescale fails this test), and rows
    that stay under the threshold keep P > 1 against the old reference."""
    rng = np.random.default_rng(12)
    b, hq, dqk, dv, lens = 2, 16, 192, 128, [200, 150]
    lat = rng.standard_normal((b, max(lens), 1, dqk)).astype(np.float32)
    lat[:, 64:] *= 3.0
    q = jnp.asarray(rng.standard_normal((b, 1, hq, dqk)), jnp.bfloat16)
    pool, bt, kl = (jnp.asarray(x) for x in paging.build_paged_latent(lat, 16, seed=12, kv_lens=lens))
    pool = pool.astype(jnp.bfloat16)
    scale = 2.0 / np.sqrt(dqk)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS["kv64_lazy"].__dict__, "num_splits": 1})
    out, lse, races = v12_mla_tc.emulate_mosaic(q, pool, bt, kl, kl - 1, kv_lora_rank=dv, causal=False,
                                                scale=scale, config=cfg)
    assert not races
    _check(out, lse, _ref(q, pool, bt, lens, dv=dv, scale=scale), "bfloat16")


# --- kv64_mc: kv64 in 2-CTA clusters with a TMA multicast of each latent tile --------------------------------------


@pytest.mark.slow
def test_kv64_mc_pairs_row_tiles_on_the_gpu_interpreter():
    """kv64_mc's kernel on the GPU interpreter with its real grid and cluster shape: 4 row tiles (56 heads x Tq 4 =
    224 packed rows, padded) in two 2-CTA clusters, the tile index 2 * pair + rank (pairing them wrongly fails this
    test), causal per-row masks, a 3-tile split through the 2-slot ring and an empty second split (q_offset 180:
    both CTAs of a cluster see n = 0 there). The interpreter has no multicast and no cluster barrier, so the copy
    is a plain one and the free barrier CTA-local here: the cluster protocol itself is checked only on a GPU
    (tests/gpu/test_mla_pallas_gpu.py, ``-k kv64_mc``)."""
    tq, hq, dqk, dv, lens, off = 4, 56, 192, 128, [330], np.array([180])
    q, pool, bt, kl = _case(18, b=1, tq=tq, hq=hq, dqk=dqk, lens=lens, page=16, dtype="bfloat16")
    pool = pool.astype(jnp.bfloat16)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS["kv64_mc"].__dict__, "num_splits": 2})
    p = Problem(entry="mla", dtype="bfloat16", batch=1, q_len=tq, kv_len=bt.shape[1] * 16, heads_q=hq, heads_kv=1,
                head_dim=dqk, page_size=16, kv_lora_rank=dv)
    plan = registry.kernel("fa_mla").plan(p, cfg)
    assert (plan["cluster"], plan["splits"], plan["chunk"], plan["ctas"]) == (2, 2, 192, 8)
    out, lse, races = v12_mla_tc.emulate_mosaic(q, pool, bt, kl, jnp.asarray(off, jnp.int32), kv_lora_rank=dv,
                                                causal=True, scale=1.0 / np.sqrt(dqk), config=cfg)
    assert not races
    _check(out, lse, _ref(q, pool, bt, lens, dv=dv, causal=True, q_offset=off), "bfloat16")


def _mosaic_launch_facts(monkeypatch):
    """Record what Mosaic GPU's CUDA lowering launches: (grid, cluster, shared-memory bytes) per kernel and, per
    TMA copy, (source type, destination type, the cluster dimensions it multicasts along)."""
    core = pytest.importorskip("jax.experimental.mosaic.gpu.core")
    lctx = pytest.importorskip("jax.experimental.mosaic.gpu.launch_context")
    if not (hasattr(core, "_launch") and hasattr(core, "_smem_tree_size") and hasattr(lctx.LaunchContext,
                                                                                       "async_copy")):
        pytest.skip(f"this jax ({jax.__version__}) lays out Mosaic GPU's launch differently")
    launches, loads = [], []
    launch, copy = core._launch, lctx.LaunchContext.async_copy

    def spy_launch(token, grid, cluster, block, smem, *args, **kw):
        launches.append((tuple(grid), tuple(cluster), core._smem_tree_size(smem)))
        return launch(token, grid, cluster, block, smem, *args, **kw)

    def spy_copy(self, **kw):
        coll = kw.get("collective") or ()
        loads.append((str(kw["src_ref"].type), str(kw["dst_ref"].type),
                      (coll,) if not isinstance(coll, (tuple, list)) else tuple(coll)))
        return copy(self, **kw)

    monkeypatch.setattr(core, "_launch", spy_launch)
    monkeypatch.setattr(lctx.LaunchContext, "async_copy", spy_copy)
    return launches, loads


@pytest.mark.parametrize(("config", "page"), [("kv64_mc", 64), ("kv64_mc", 16), ("kv64_ws_mc", 64)])
def test_kv64_mc_lowers_as_a_multicast_cluster(monkeypatch, config, page):
    """kv64_mc at the DeepSeek-V3 template (h_q 128: two row tiles, one cluster per (batch, split)) lowered for CUDA
    on the CPU, page 64 (one TMA copy per 64-key tile) and page 16 (four): the launch is B x S clusters of 2 CTAs,
    every latent copy multicasts along the cluster dimension while the Q copy does not, and the shared memory
    Mosaic allocates is kv64's 231,488 B, what smem_bytes says (the cluster barrier takes a plain barrier's 8 B).
    kv64_ws_mc (four warpgroups by role, same buffers) launches the same way."""
    from pallas_attn.mla import mla_attention

    launches, loads = _mosaic_launch_facts(monkeypatch)
    b, pps, dqk, dv = 2, 256 // page, 576, 512  # 256 keys: two splits of two 64-key tiles
    q = jax.ShapeDtypeStruct((b, 1, 128, dqk), jnp.bfloat16)
    pool = jax.ShapeDtypeStruct((b * pps, page, 1, dqk), jnp.bfloat16)
    bt, lens = jax.ShapeDtypeStruct((b, pps), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.int32)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS[config].__dict__, "num_splits": 2})
    jax.jit(lambda q, p, bt, lens: mla_attention(q, p, bt, lens, kv_lora_rank=dv, generation="fa_mla", config=cfg,
                                                 interpret=False, check_block_table=False)
            ).trace(q, pool, bt, lens).lower(lowering_platforms=("cuda",))
    # the CUDA grid (x, y, z) = (2 B, S, row tiles / 2); a cluster of two along x
    assert launches == [((2 * b, 2, 1), (2, 1, 1), v12_mla_tc.smem_bytes(dqk, dv, 2, cfg))]
    assert launches[0][2] == 231_488
    q_copies = [c for src, _, c in loads if src.startswith(f"memref<{b}x128x{dqk}x")]
    ring = [(dst, c) for src, dst, c in loads if src.startswith(f"memref<{b * pps * page}x{dqk}x")]
    assert q_copies == [()], loads
    # one copy per page of a tile, each into its rows of the slot, at each place the kernel issues tile loads (kv64_ws:
    # the loading P.V warpgroup's first tiles and its refills)
    assert len(ring) == (2 if config == "kv64_ws_mc" else 1) * (64 // page), loads
    for dst, coll in ring:
        assert dst.startswith(f"memref<{page // 8}x9x8x64xbf16") and len(coll) == 1 and coll[0].name == "x", loads


# --- the direct epilogue: at one split the kernel writes q's dtype and the LSE, no finish ----------------------


@pytest.mark.slow
@pytest.mark.parametrize(("config", "b", "tq", "hq", "lens", "causal"), [
    ("kv64_mc", 2, 1, 128, [140, 0], False),  # two row tiles paired in a cluster, an empty sequence (zeros, -inf)
    ("kv64", 2, 3, 16, [150, 37], True),  # 48 packed rows padded to 64 (the padding rows cut), Tq 3 unpacked
    ("faithful", 1, 1, 64, [90], False),  # the 32-key, 3-slot ring (its staging not aliased)
])
def test_direct_epilogue_on_the_gpu_interpreter(config, b, tq, hq, lens, causal):
    """At one split (``MlaTcConfig.writes_direct``) the Mosaic kernel's epilogue writes q's dtype into ``[B, rows_pad,
    DV]`` and the LSE into ``[B, rows_pad]`` and nothing merges: on the GPU interpreter with race detection it agrees
    with the oracle, and with the same kernel run through the fp32 partial and the merge (``direct=False``) to one
    bf16 rounding."""
    dqk, dv = 192, 128
    q, pool, bt, kl = _case(31, b=b, tq=tq, hq=hq, dqk=dqk, lens=lens, page=16, dtype="bfloat16")
    pool = pool.astype(jnp.bfloat16)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS[config].__dict__, "num_splits": 1})
    assert cfg.writes_direct(1) and not cfg.writes_direct(2)
    run = functools.partial(v12_mla_tc.emulate_mosaic, q, pool, bt, kl, kl - tq, kv_lora_rank=dv, causal=causal,
                            scale=1.0 / np.sqrt(dqk))
    out, lse, races = run(config=cfg, check_block_table=True)
    assert not races and out.dtype == jnp.bfloat16 and out.shape == (b, tq, hq, dv) and lse.shape == (b, hq, tq)
    _check(out, lse, _ref(q, pool, bt, lens, dv=dv, causal=causal), "bfloat16")
    out_p, lse_p, _ = run(config=dataclasses.replace(cfg, direct=False))
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), np.asarray(out_p.astype(jnp.float32)),
                               atol=1e-2, rtol=1e-2)
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse_p))


@pytest.mark.slow
def test_direct_epilogue_poisons_a_bad_table_and_passes_nan():
    """The direct epilogue's NaN: a sequence whose block table names a page outside the pool (the flag computed
    before the launch, ``table_poison``'s rule) has NaN rows and LSE, its neighbours are untouched; a NaN in one
    sequence's query stays in that sequence's rows."""
    dqk, dv, lens = 192, 128, [100, 120, 70]
    q, pool, bt, kl = _case(32, b=3, tq=1, hq=64, dqk=dqk, lens=lens, page=16, dtype="bfloat16")
    pool = pool.astype(jnp.bfloat16)
    bt = bt.at[1, 2].set(pool.shape[0] + 5)  # a page sequence 1 uses, outside the pool
    q = q.at[2, 0, 7, 3].set(jnp.nan)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS["kv64"].__dict__, "num_splits": 1})
    out, lse, races = v12_mla_tc.emulate_mosaic(q, pool, bt, kl, kl - 1, kv_lora_rank=dv, causal=False,
                                                scale=1.0 / np.sqrt(dqk), config=cfg, check_block_table=True)
    assert not races
    o = np.asarray(out.astype(jnp.float32))
    assert np.isnan(o[1]).all() and np.isnan(np.asarray(lse)[1]).all()
    assert np.isnan(o[2, 0, 7]).all() and np.isnan(np.asarray(lse)[2, 7]).all()
    ref = _ref(q[:1], pool, bt[:1], lens[:1], dv=dv)
    _check(out[:1], lse[:1], ref, "bfloat16")
    assert np.isfinite(np.delete(o[2, 0], 7, axis=0)).all()


@pytest.mark.parametrize("seed", range(4))
def test_table_flag_is_table_poisons_rule(seed):
    """The direct epilogue's flag (one int32 reduction) is set exactly where ``table_poison`` is: random tables with
    pages outside the pool (used and unused ones), lengths below 0, at 0, at and past the capacity."""
    from pallas_attn.kernels.mla_common import table_flag, table_poison

    rng = np.random.default_rng(seed)
    for _ in range(50):
        b, pps, page, num_pages = int(rng.integers(1, 6)), int(rng.integers(1, 7)), 16, int(rng.integers(1, 30))
        bt = jnp.asarray(rng.integers(-2, num_pages + 2, (b, pps)), jnp.int32)
        lens = jnp.asarray(rng.integers(-3, pps * page + 4, b), jnp.int32)
        flag = table_flag(bt, lens, num_pages=num_pages, page=page)
        assert flag.dtype == jnp.int32
        np.testing.assert_array_equal(np.asarray(flag) != 0,
                                      np.asarray(table_poison(bt, lens, num_pages=num_pages, page=page)))


def test_direct_epilogue_lowers_without_a_finish(monkeypatch):
    """DeepSeek-V3's template at B 2 lowered for CUDA on the CPU: at one split one Mosaic launch and no finish pass
    (the flag input makes no second launch), at two splits the finish follows."""
    from pallas_attn.mla import mla_attention

    launches, _ = _mosaic_launch_facts(monkeypatch)
    b, page, pps, dqk, dv = 2, 64, 4, 576, 512
    q = jax.ShapeDtypeStruct((b, 1, 128, dqk), jnp.bfloat16)
    pool = jax.ShapeDtypeStruct((b * pps, page, 1, dqk), jnp.bfloat16)
    bt, lens = jax.ShapeDtypeStruct((b, pps), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.int32)
    texts = {}
    for ns in (1, 2):
        cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS["kv64_mc"].__dict__, "num_splits": ns})
        texts[ns] = jax.jit(lambda q, p, bt, lens, cfg=cfg: mla_attention(
            q, p, bt, lens, kv_lora_rank=dv, generation="fa_mla", config=cfg, interpret=False)
        ).trace(q, pool, bt, lens).lower(lowering_platforms=("cuda",)).as_text()
    assert [g for g, _, _ in launches] == [(2 * b, 1, 1), (2 * b, 2, 1)]
    assert v12_mla_tc.PASS_FINISH not in texts[1] and v12_mla_tc.PASS_FINISH in texts[2]


def test_kv64_mc_refusals_and_fallback_are_explicit():
    """kv64_mc refuses page 8 (a copy of 8 rows has no whole 8-row group per CTA) and records in its plan when an
    odd number of row tiles runs it without the cluster (as kv64); multicast is a variant of share_p only."""
    q, pool, bt, kl = _case(19, b=1, tq=1, hq=128, dqk=192, lens=[40], page=8, dtype="bfloat16")
    with pytest.raises(NotImplementedError, match="page >= 16; got page 8"):
        pallas_attn.mla_attention(q, pool.astype(jnp.bfloat16), bt, kl, kv_lora_rank=128, config="kv64_mc",
                                  interpret=False)
    k, cfg = registry.kernel("fa_mla"), registry.configs("fa_mla")["kv64_mc"]
    p = Problem(entry="mla", dtype="bfloat16", batch=64, q_len=1, kv_len=8192, heads_q=64, heads_kv=1,
                head_dim=576, page_size=64, kv_lora_rank=512)
    plan = k.plan(p, cfg)
    assert plan["cluster"] == 1 and plan["multicast"].startswith("off: 1 row tile(s) (64 packed rows)")
    assert k.plan(p.__class__(**{**p.__dict__, "heads_q": 128}), cfg)["cluster"] == 2
    assert "cluster" not in k.plan(p, registry.configs("fa_mla")["kv64"])
    with pytest.raises(ValueError, match="multicast is a variant of share_p"):
        v12_mla_tc.MlaTcConfig(block_kv=64, stages=2, multicast=True)
    with pytest.raises(ValueError, match="s_warpgroup is a variant of share_p"):
        v12_mla_tc.MlaTcConfig(block_kv=64, stages=2, s_warpgroup=True)
    with pytest.raises(ValueError, match="s_pipelined is a variant of s_warpgroup"):
        v12_mla_tc.MlaTcConfig(block_kv=32, stages=4, share_p=True, s_pipelined=True)
    with pytest.raises(ValueError, match="q_regs .* needs s_warpgroup"):
        v12_mla_tc.MlaTcConfig(block_kv=64, stages=2, share_p=True, q_regs=256)
    with pytest.raises(ValueError, match="must be <= 504"):  # the three warpgroups' launch allocation
        v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS["kv64_ws"].__dict__, "consumer_regs": 200})


# --- the work list (kv64_wl, kv64_mc_wl): equal shares of the batch's key tiles, pieces in turn ------------------


@pytest.mark.parametrize("seed", range(8))
def test_work_plan_covers_every_tile_once_in_unique_slots(seed):
    """``work_plan`` (its Triton program in interpret mode): the shares cover each sequence's key tiles exactly once
    (random lengths, empty sequences, causal offsets); every (unit, sequence) piece's slot ``u + b`` is distinct and
    below ``U + B - 1``; and the slots the finish merges for a sequence are exactly those of the units that ran it.
    Seeds 6-7: a batch of 150-300 over 66 units, the units' compares in several blocks (``work_plan``'s ``ub``)."""
    rng = np.random.default_rng(seed)
    b, units, cap, tq, tn = int(rng.integers(1, 9)), int(rng.integers(1, 12)), 1024, int(rng.integers(1, 4)), 64
    if seed >= 6:
        b, units = int(rng.integers(150, 301)), 66
    lens = rng.integers(0, cap + 1, b) * (rng.random(b) > 0.25)
    off = lens - tq if seed % 2 else rng.integers(-tq, cap, b)
    causal = seed % 3 != 0
    wl = np.asarray(v12_mla_tc.work_plan(jnp.asarray(lens, jnp.int32), jnp.asarray(off, jnp.int32), cap=cap, tq=tq,
                                         tn=tn, causal=causal, units=units, interpret=True))
    lay = v12_mla_tc.wl_layout(units, b)
    assert wl.shape == (lay["n"],)
    quota, total = wl[0], wl[1]
    first, count = wl[lay["first"]:lay["count"]], wl[lay["count"]:lay["cum"]]
    cum, his = wl[lay["cum"]:lay["hi"]], wl[lay["hi"]:lay["pfirst"]]
    pfirst, pcount = wl[lay["pfirst"]:lay["pcount"]], wl[lay["pcount"]:]
    hi = np.minimum(lens, np.clip(off, -tq, cap) + tq) if causal else lens
    tiles = -(-np.maximum(hi, 0) // tn)
    assert list(cum) == [0, *np.cumsum(tiles)] and total == tiles.sum() and quota == max(1, -(-total // units))
    assert list(his) == list(np.maximum(hi, 0))
    seen, slots, ran = np.zeros(total, int), set(), {}
    for u in range(units):
        t0, t1 = min(u * quota, total), min(u * quota + quota, total)
        for bb in range(first[u], first[u] + count[u]):
            lo, hi_t = max(t0, cum[bb]), min(t1, cum[bb + 1])
            if hi_t > lo:
                seen[lo:hi_t] += 1
                assert u + bb not in slots and u + bb < units + b - 1
                slots.add(u + bb)
                ran.setdefault(bb, []).append(u)
    assert np.all(seen == 1)
    for bb in range(b):  # the finish merges slots pfirst .. pfirst + pcount - 1: exactly the units that ran b
        assert [pfirst[bb] + i - bb for i in range(pcount[bb])] == ran.get(bb, [])


@pytest.mark.slow
@pytest.mark.parametrize(("config", "tq", "hq", "lens", "off", "num_sm"), [
    ("kv64_wl", 3, 16, [140, 70, 300, 20], None, 2),  # 2 units over 11 tiles: unit 0 runs sequences 0, 1 and the
    # first tile of 2 (three pieces: Q reloaded, the ring refilled after the aliased epilogue, l handed over)
    ("kv64_mc_wl", 4, 56, [330, 0, 100, 200], [180, 0, 96, 10], 8),  # 4 row tiles in two 2-CTA clusters, 2 units;
    # an empty sequence between shares, unit 1 runs two pieces
])
def test_work_list_on_the_gpu_interpreter(config, tq, hq, lens, off, num_sm):
    """The work-list kernel on jax's GPU interpreter with race detection, merged by its finish (interpret mode):
    several pieces a unit, causal offsets and an empty sequence, against the oracle. Without the producer's wait
    for ring_free the race detector fires (the next piece's TMA into ring bytes the epilogue still stages in);
    without consumer 0's wait for l_taken the interpreter's barrier check raises."""
    dqk, dv = 192, 128
    q, pool, bt, kl = _case(18, b=len(lens), tq=tq, hq=hq, dqk=dqk, lens=lens, page=16, dtype="bfloat16")
    pool = pool.astype(jnp.bfloat16)
    off = kl - tq if off is None else jnp.asarray(off, jnp.int32)
    cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS[config].__dict__, "num_sm": num_sm})
    out, lse, races = v12_mla_tc.emulate_mosaic(q, pool, bt, kl, off, kv_lora_rank=dv, causal=True,
                                                scale=1.0 / np.sqrt(dqk), config=cfg)
    assert not races
    _check(out, lse, _ref(q, pool, bt, lens, dv=dv, causal=True, q_offset=np.asarray(off)), "bfloat16")


def test_work_list_lowers_as_one_wave_of_units(monkeypatch):
    """kv64_mc_wl at the DeepSeek-V3 template lowered for CUDA on the CPU: one wave of units (132 SMs / 2 row tiles =
    66, rounded down to a multiple of the batch, 65 at B 5), each a 2-CTA cluster (grid (2, 65, 1)); shared memory
    kv64's plus the two work-list barriers (231,504 B, what smem_bytes says); the plan array and the slots' shapes in
    the program. kv64_wl launches 65 units of two unclustered CTAs. The config refuses what it does not combine
    with."""
    from pallas_attn.mla import mla_attention

    launches, _ = _mosaic_launch_facts(monkeypatch)
    b, page, dqk, dv = 5, 64, 576, 512
    q = jax.ShapeDtypeStruct((b, 1, 128, dqk), jnp.bfloat16)
    pool = jax.ShapeDtypeStruct((b * 4, page, 1, dqk), jnp.bfloat16)
    bt, lens = jax.ShapeDtypeStruct((b, 4), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.int32)
    for name, grid, cluster in (("kv64_mc_wl", (2, 65, 1), (2, 1, 1)), ("kv64_wl", (1, 65, 2), (1, 1, 1))):
        launches.clear()
        cfg = v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS[name].__dict__, "num_sm": 132})
        text = jax.jit(lambda q, p, bt, lens, cfg=cfg: mla_attention(
            q, p, bt, lens, kv_lora_rank=dv, generation="fa_mla", config=cfg, interpret=False,
            check_block_table=False)).trace(q, pool, bt, lens).lower(lowering_platforms=("cuda",)).as_text()
        assert launches == [(grid, cluster, v12_mla_tc.smem_bytes(dqk, dv, 2, cfg))], name
        assert launches[0][2] == 231_504
        units = 65  # 66 rounded down to a multiple of the batch (5)
        assert f"tensor<{v12_mla_tc.wl_layout(units, b)['n']}xi32>" in text  # the plan
        assert f"tensor<{units + b - 1 + v12_mla_tc.wl_merge_block(units, b)}x128x512xf32>" in text  # the slots
    for bad in (dict(lazy_rescale=True), dict(s_warpgroup=True), dict(num_splits=2), dict(finish="jnp")):
        with pytest.raises(ValueError, match="work_list is a variant of share_p"):
            v12_mla_tc.MlaTcConfig(**{**v12_mla_tc.CONFIGS["kv64_mc_wl"].__dict__, **bad})
    with pytest.raises(ValueError, match="work_list is a variant of share_p"):
        v12_mla_tc.MlaTcConfig(block_kv=64, stages=2, work_list=True)


# --- NaN, refusals, bad inputs --------------------------------------------------------------------------------


@pytest.mark.parametrize("gen", ["v11_mla", "fa_mla"])
def test_nan_in_nan_out(gen):
    lens = [40, 30]
    q, pool, bt, kl = _case(7, b=2, tq=1, hq=8, dqk=192 if gen == "fa_mla" else 160, lens=lens, page=16,
                            dtype="float16")
    dv = 128
    pool = pool.astype(jnp.float16)
    q = q.at[0, 0, 3, 5].set(jnp.nan)
    pool = pool.at[int(bt[1, 0]), 2, 0, 7].set(jnp.nan)  # key 2 of sequence 1: visible to every row
    out = np.asarray(pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=dv, generation=gen), np.float32)
    assert np.all(np.isnan(out[0, 0, 3])) and np.all(np.isfinite(np.delete(out[0, 0], 3, axis=0)))
    assert np.all(np.isnan(out[1]))


def test_bad_inputs_raise_naming_the_problem():
    q, pool, bt, kl = _case(8, b=2, tq=1, hq=4, dqk=96, lens=[20, 10], page=16, dtype="float16")
    pool = pool.astype(jnp.float16)
    call = pallas_attn.mla_attention
    with pytest.raises(ValueError, match="ONE latent head"):
        call(q, jnp.concatenate([pool, pool], axis=2), bt, kl, kv_lora_rank=64)
    with pytest.raises(ValueError, match="share DQK"):
        call(q[..., :64], pool, bt, kl, kv_lora_rank=32)
    for bad in (0, 97, 64.0, True):
        with pytest.raises(ValueError, match="kv_lora_rank"):
            call(q, pool, bt, kl, kv_lora_rank=bad)
    with pytest.raises(NotImplementedError, match=r"templates \[\(96, 64\)"):
        call(q, pool, bt, kl, kv_lora_rank=32, generation="v11_mla")
    with pytest.raises(NotImplementedError, match=r"\(576, 512\)"):  # v12: rope 64 templates only
        call(q, pool, bt, kl, kv_lora_rank=64)
    with pytest.raises(ValueError, match="share a dtype"):
        call(q.astype(jnp.bfloat16), pool, bt, kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(NotImplementedError, match="float16"):
        call(q.astype(jnp.float32), pool.astype(jnp.float32), bt, kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(NotImplementedError, match="nvfp4"):  # v11 reads NVFP4, not fp8
        call(q, quant.quantize_fp8_e4m3(pool), bt, kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(NotImplementedError, match="float16"):  # NVFP4 decodes to fp16 tiles: fp16 q only
        call(q.astype(jnp.bfloat16), quant.quantize_nvfp4(pool), bt, kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(ValueError, match="block_table must be int32"):
        call(q, pool, bt.astype(jnp.float32), kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(ValueError, match="block_table must be int32"):
        call(q, pool, bt[:1], kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(ValueError, match="kv_lens must be int32"):
        call(q, pool, bt, kl.astype(jnp.int64) if jax.config.jax_enable_x64 else kl[:1], kv_lora_rank=64)
    with pytest.raises(ValueError, match="power of two"):
        call(q, pool[:, :12], bt, kl, kv_lora_rank=64)
    with pytest.raises(ValueError, match="outside the pool"):
        call(q, pool, bt.at[0, 0].set(999), kl, kv_lora_rank=64, generation="v11_mla")
    with pytest.raises(ValueError, match="mla"):
        pallas_attn.paged_attention(q, pool, pool, bt, kl, generation="v11_mla")


def test_bad_table_under_jit_poisons_only_that_sequence():
    q, pool, bt, kl = _case(9, b=2, tq=1, hq=4, dqk=96, lens=[20, 10], page=16, dtype="float16")
    pool = pool.astype(jnp.float16)
    f = jax.jit(lambda bt: pallas_attn.mla_attention(q, pool, bt, kl, kv_lora_rank=64, generation="v11_mla"))
    out = np.asarray(f(bt.at[1, 0].set(-1)), np.float32)
    assert np.all(np.isnan(out[1])) and np.all(np.isfinite(out[0]))


# --- the contract, the plan, the builder --------------------------------------------------------------------------


def test_contract_and_deepseek_plan():
    info = {g.id: g for g in pallas_attn.generations()}
    assert info["v11_mla"].lowering == "triton" and info["v12_mla_tc"].lowering == "mosaic-gpu"
    assert info["fa_mla"].built and info["fa_mla"].frontier
    assert set(info["fa_mla"].configs) == {"default", "split_qk", "pipelined", "kv64", "kv64_lazy", "kv64_mc",
                                           "kv64_ws", "kv64_ws_mc", "kv64_wsq_mc", "kv32_ws", "kv32_ws_mc",
                                           "kv64_wl", "kv64_mc_wl", "triton"}
    k = registry.kernel("fa_mla")
    p = Problem(entry="mla", dtype="bfloat16", batch=64, q_len=1, kv_len=8192, heads_q=128, heads_kv=1,
                head_dim=576, page_size=64, kv_lora_rank=512)
    assert k.supports(p) == (True, "")
    cfg = registry.configs("fa_mla")["default"]
    plan = k.plan(p, cfg)
    assert plan["ctas"] == 128 and plan["splits"] == 1 and plan["smem_bytes"] <= 227 * 1024  # one wave on 132 SMs
    assert k.plan(p.__class__(**{**p.__dict__, "batch": 1}), cfg)["splits"] == 64  # B 1: 64 splits of 128 keys
    assert k.roofline(p).tensor_cores and k.roofline(p).precision == "bf16"
    ok, why = registry.kernel("v11_mla").supports(p.__class__(**{**p.__dict__, "heads_kv": 2}))
    assert not ok and "one head" in why


def test_build_paged_latent():
    lat = np.arange(2 * 10 * 1 * 32, dtype=np.float32).reshape(2, 10, 1, 32)
    pool, bt, lens = paging.build_paged_latent(lat, 4, seed=3, kv_lens=[10, 5], spare=2)
    assert pool.shape == (3 + 2 + 2, 4, 1, 32) and bt.dtype == np.int32 and list(lens) == [10, 5]
    for i, n in enumerate(lens):
        np.testing.assert_array_equal(oracle.gather_paged_kv(pool, bt[i], n), lat[i, :n])
    assert np.all(pool[-2:] == np.abs(pool[:-2]).max())  # spare blocks: finite, the pool's largest magnitude
    with pytest.raises(ValueError, match="one latent head"):
        paging.build_paged_latent(np.zeros((1, 4, 2, 32)), 4)
