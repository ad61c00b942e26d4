"""Chunked prefill over the paged cache (issue 32, first path: pallas_attn.chunked): paged_attention with more queries
than fa_decode serves, ragged per-sequence query counts (a batch mixing chunks and decodes), against the float64
oracle on the CPU (interpret mode): fa_prefill's path (bf16) and fa_train's (fp32), page sizes 16 / 64, GQA, empty
chunks; padding rows 0 with LSE -inf; bad offsets and block tables raise eagerly and poison under jit; what is not
built refuses by name."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from pallas_attn import chunked


def _case(rng, b, tq, hq, hkv, d, page, pps, kv, dt):
    npages = b * pps + 3
    kp = rng.standard_normal((npages, page, hkv, d)).astype(np.float32)
    vp = rng.standard_normal((npages, page, hkv, d)).astype(np.float32)
    table = rng.permutation(npages)[: b * pps].reshape(b, pps).astype(np.int32)
    q = rng.standard_normal((b, tq, hq, d)).astype(np.float32)
    cast = [np.asarray(jnp.asarray(x, dt), np.float32) for x in (q, kp, vp)]  # the oracle sees the rounded inputs
    return [jnp.asarray(x, dt) for x in (q, kp, vp)], cast, jnp.asarray(table), jnp.asarray(np.asarray(kv, np.int32))


def _check(out, lse, cast, table, kv, ql, tol):
    q, kp, vp = cast
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    for b, n in enumerate(ql):
        assert np.all(out[b, n:] == 0.0) and np.all(np.isneginf(lse[b, :, n:])), b  # padding rows
        if n == 0:
            continue
        ro, rl = oracle.paged_attention_reference(q[b:b + 1, :n], kp, vp, np.asarray(table)[b:b + 1],
                                                  np.asarray(kv)[b:b + 1], causal=True)
        assert np.linalg.norm(out[b, :n] - ro[0]) / np.linalg.norm(ro[0]) < tol, b
        assert np.allclose(lse[b, :, :n], rl[0], atol=tol * 10), b


@pytest.mark.parametrize("dt,page,tol", [(jnp.bfloat16, 16, 1e-2), (jnp.float16, 64, 2e-3), (jnp.float32, 16, 1e-5)],
                         ids=["bf16-page16-fa_prefill", "fp16-page64-fa_prefill", "fp32-page16-fa_train"])
def test_ragged_chunks_and_decodes_in_one_batch_match_the_oracle(rng, dt, page, tol):
    pps = 256 // page
    kv, ql = [200, 40, 256, 17], [40, 1, 23, 0]  # a long chunk, a decode, a mid chunk, an empty one
    arrs, cast, table, kvl = _case(rng, 4, 40, 4, 2, 64, page, pps, kv, dt)
    q_lens = jnp.asarray(np.asarray(ql, np.int32))
    out, lse = pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=q_lens, return_lse=True)
    assert out.shape == arrs[0].shape and out.dtype == arrs[0].dtype and lse.shape == (4, 4, 40)
    _check(out, lse, cast, table, kvl, ql, tol)
    assert chunked.uses_fa_prefill(jnp.dtype(dt).name, 64, True) == (dt != jnp.float32)
    # the same call under jit (traced lengths): the same answer
    f = jax.jit(lambda q, k, v, t, kl, ql: pallas_attn.paged_attention(q, k, v, t, kl, causal=True, q_lens=ql))
    assert np.array_equal(np.asarray(f(*arrs, table, kvl, q_lens), np.float32), np.asarray(out, np.float32))


def test_default_q_lens_is_the_whole_chunk_at_the_end_of_the_cache(rng):
    arrs, cast, table, kvl = _case(rng, 2, 24, 2, 1, 64, 16, 4, [64, 30], jnp.bfloat16)
    out, lse = pallas_attn.paged_attention(*arrs, table, kvl, causal=True, return_lse=True)
    _check(out, lse, cast, table, kvl, [24, 24], 1e-2)


def test_offsets_past_the_cache_raise_eagerly_and_poison_under_jit(rng):
    arrs, _, table, kvl = _case(rng, 2, 20, 2, 1, 64, 16, 4, [64, 30], jnp.bfloat16)
    off = jnp.asarray(np.asarray([44, 20], np.int32))  # sequence 1: 20 + 20 > 30
    with pytest.raises(ValueError, match="sequence 1"):
        pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_offset=off)
    f = jax.jit(lambda q, k, v, t, kl, o: pallas_attn.paged_attention(q, k, v, t, kl, causal=True, q_offset=o))
    out = np.asarray(f(*arrs, table, kvl, off), np.float32)
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()
    with pytest.raises(ValueError, match="q_lens must lie"):
        pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=jnp.asarray(np.asarray([3, 21], np.int32)))


def test_bad_block_table_raises_eagerly_and_poisons_under_jit(rng):
    arrs, _, table, kvl = _case(rng, 2, 20, 2, 1, 64, 16, 4, [64, 30], jnp.bfloat16)
    bad = np.asarray(table).copy()
    bad[1, 1] = 10_000  # a page sequence 1 uses (30 keys: pages 0 and 1)
    with pytest.raises(ValueError, match="outside the pool"):
        pallas_attn.paged_attention(*arrs, jnp.asarray(bad), kvl, causal=True)
    f = jax.jit(lambda q, k, v, t, kl: pallas_attn.paged_attention(q, k, v, t, kl, causal=True))
    out = np.asarray(f(*arrs, jnp.asarray(bad), kvl), np.float32)
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()


def test_what_is_not_built_refuses_by_name(rng):
    arrs, _, table, kvl = _case(rng, 1, 20, 2, 1, 64, 16, 4, [64], jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="causal only"):
        pallas_attn.paged_attention(*arrs, table, kvl, causal=False)
    with pytest.raises(NotImplementedError, match="paged_attention"):
        jax.grad(lambda q: pallas_attn.paged_attention(q, *arrs[1:], table, kvl, causal=True).astype(
            jnp.float32).sum())(arrs[0])


def test_q_lens_on_the_decode_kernel_pads_its_rows(rng):
    """Tq <= 16 stays on fa_decode; q_lens there sets the offsets (kv_lens - q_lens) and zeroes the padding rows."""
    arrs, cast, table, kvl = _case(rng, 2, 8, 4, 2, 64, 16, 4, [64, 30], jnp.bfloat16)
    ql = [8, 3]
    out, lse = pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=jnp.asarray(np.asarray(ql, np.int32)),
                                           return_lse=True)
    _check(out, lse, cast, table, kvl, ql, 1e-2)


def test_compare_auto_runs_a_chunked_workload_on_cpu(tmp_path):
    """compare's pallas:auto takes the sweep's chunked entry now (it was 'unsupported': fa_decode serves <= 16
    queries): a small chunked workload runs through paged_attention's chunked path and passes the oracle check."""
    from compare import cli, records

    cfg = tmp_path / "chunk.toml"
    cfg.write_text('''description = "a small chunked prefill over a paged cache"
[[workload]]
name = "chunk_small"
family = "paged_decode"
entry = "chunked"
batch = 2
heads_q = 4
heads_kv = 2
head_dim = 64
page_size = 16
q_len = 32
kv_len = 128
causal = true
dtype = "bfloat16"
generations = ["pallas:auto"]
peers = []
''')
    out = tmp_path / "out"
    assert cli.main(["run", "--config", str(cfg), "--quiet", "--out", str(out)]) == 0
    (r,) = [r for r in records.read_jsonl(out / "records.jsonl") if r["type"] == "result"]
    assert r["status"] == "ok", r.get("reason")
    assert r["impl"]["plan"]["chose"] == "chunked:fa_prefill"
    assert r["agreement"]["rel_l2_err"] < r["agreement"]["tol_rel_l2"]
    # the plan names fa_prefill's config, so layer 2 prices the call (as fa_prefill at the dense shape) on an H100
    from compare import hardware, layer2

    gen, cfg_name = r["impl"]["plan"]["generation"], r["impl"]["plan"]["config"]
    assert gen == "fa_prefill" and cfg_name
    l2 = layer2.predict_record(r["workload"], r["impl"], r["impl"]["plan"], hardware.get("h100"))
    assert "error" not in l2 and l2["via"] == f"pallas:fa_prefill:{cfg_name}" and l2["time_us"] > 0


@pytest.mark.parametrize("dt,feats", [(jnp.bfloat16, dict(window=20, softcap=5.0, sinks=True)),
                                      (jnp.bfloat16, dict(window=7)), (jnp.float32, dict(window=20))],
                         ids=["bf16-window-softcap-sinks", "bf16-narrow-window", "fp32-window-fa_train"])
def test_window_softcap_and_sinks_on_the_chunked_path(rng, dt, feats):
    """Mistral's window (a query sees its last W positions, across pages), Gemma-2's soft-cap and gpt-oss's sinks on
    the chunked path, against the float64 oracle with the same features (fa_decode's path: test_decode_features)."""
    kv, ql = [100, 40, 64], [30, 1, 17]
    arrs, cast, table, kvl = _case(rng, 3, 30, 4, 2, 64, 16, 8, kv, dt)
    sinks = jnp.asarray(rng.standard_normal(4), jnp.float32) if feats.get("sinks") else None
    kw = {k: v for k, v in feats.items() if k != "sinks"}
    out, lse = pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=jnp.asarray(np.asarray(ql, np.int32)),
                                           return_lse=True, sinks=sinks, **kw)
    q, kp, vp = cast
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    for b, n in enumerate(ql):
        k = oracle.gather_paged_kv(kp, np.asarray(table)[b], kv[b])[None]
        v = oracle.gather_paged_kv(vp, np.asarray(table)[b], kv[b])[None]
        ro, rl = oracle.attention_reference(q[b:b + 1, :n], k, v, causal=True, q_offset=kv[b] - n,
                                            window=kw.get("window"), softcap=kw.get("softcap"),
                                            sinks=None if sinks is None else np.asarray(sinks))
        tol = 1e-5 if dt == jnp.float32 else 1e-2
        assert np.linalg.norm(out[b, :n] - ro[0]) / np.linalg.norm(ro[0]) < tol, b
        assert np.allclose(lse[b, :, :n], rl[0], atol=10 * tol), b
        assert np.all(out[b, n:] == 0.0)


def test_softcap_off_fa_prefill_refuses(rng):
    arrs, _, table, kvl = _case(rng, 1, 20, 2, 1, 64, 16, 4, [64], jnp.float32)
    with pytest.raises(NotImplementedError, match="fa_prefill's path only"):
        pallas_attn.paged_attention(*arrs, table, kvl, causal=True, softcap=30.0)


def test_fa_prefill_block_table_equals_the_dense_cache(rng):
    """fa_prefill.forward with a block table over page pools (interpret mode gathers the pages: the GPU kernel's
    producer reads them through the table, tests/gpu/test_serving_gpu.py) equals the dense call on the gathered
    cache, entries out of the pool are clamped (a wrong page, never an out-of-bounds read), and bad pools, tables
    and page sizes refuse by name."""
    from pallas_attn.kernels import fa_prefill

    b, tq, hq, hkv, d, page, pps = 2, 48, 4, 2, 64, 16, 6
    arrs, _, table, _ = _case(rng, b, tq, hq, hkv, d, page, pps, [96, 96], jnp.bfloat16)
    q, kp, vp = arrs
    cfg = fa_prefill.fit(fa_prefill.PrefillConfig(block_kv=64), d)
    off = jnp.asarray(np.array([48, 10], np.int32))
    kw = dict(causal=True, scale=0.125, q_offset=off, interpret=True, config=cfg, return_lse=True)
    o1, l1 = fa_prefill.forward(q, kp, vp, block_table=table, **kw)
    kd = kp[table].reshape(b, pps * page, hkv, d)
    vd = vp[table].reshape(b, pps * page, hkv, d)
    o2, l2 = fa_prefill.forward(q, kd, vd, **kw)
    assert np.array_equal(np.asarray(o1, np.float32), np.asarray(o2, np.float32))
    assert np.array_equal(np.asarray(l1), np.asarray(l2))
    wild = table.at[1, 0].set(10_000)
    o3 = fa_prefill.forward(q, kp, vp, block_table=wild, **kw)[0]
    assert np.isfinite(np.asarray(o3, np.float32)).all()
    with pytest.raises(ValueError, match="block_table must be int32"):
        fa_prefill.forward(q, kp, vp, block_table=table.astype(jnp.int16), **kw)
    with pytest.raises(ValueError, match="page size that is a multiple of 8"):
        fa_prefill.forward(q, kp[:, :12], vp[:, :12], block_table=table, **kw)
    with pytest.raises(ValueError, match="pools"):
        fa_prefill.forward(q, kp, vp[:, :8], block_table=table, **kw)
    with pytest.raises(NotImplementedError, match="segment_ids"):
        fa_prefill.forward(q, kp, vp, block_table=table, segment_ids=jnp.zeros((b, tq), jnp.int32), **kw)


@pytest.mark.parametrize("d,page", [(128, 16), (128, 64), (128, 256), (64, 8), (256, 64)])
def test_the_in_kernel_paged_fa_prefill_lowers_for_cuda(monkeypatch, d, page):
    """The chunked path on a Hopper (faked: nothing runs) hands fa_prefill the pools and the table, no gather: one TMA
    copy per page of a key block (pages smaller than block_kv) or one copy inside a page; the Mosaic GPU kernel
    lowers for CUDA at each page size. With PAGED_IN_KERNEL off the pages are gathered (an XLA gather in the HLO)."""
    from pallas_attn import dropin

    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    qs = jax.ShapeDtypeStruct((2, 512, 8, d), jnp.bfloat16)
    pool = jax.ShapeDtypeStruct((300, page, 2, d), jnp.bfloat16)
    bt = jax.ShapeDtypeStruct((2, 2048 // page), jnp.int32)
    lens = jax.ShapeDtypeStruct((2,), jnp.int32)

    def text():
        f = jax.jit(lambda q, kp, bt, lens: pallas_attn.paged_attention(q, kp, kp, bt, lens, causal=True,
                                                                       interpret=False, check_block_table=False))
        return f.trace(qs, pool, bt, lens).lower(lowering_platforms=("cuda",)).as_text()

    paged = text()
    assert "pallas_attn_fa_prefill" in paged and "gather" not in paged
    monkeypatch.setattr(chunked, "PAGED_IN_KERNEL", False)
    gathered = text()
    assert "pallas_attn_fa_prefill" in gathered and "gather" in gathered


def test_a_mixed_batch_sends_its_decodes_to_fa_decode(rng, monkeypatch):
    """q_lens with sequences of 1-16 queries: those run on fa_decode (fa_prefill sees their rows as padding), the
    answer still the oracle's (the ragged test above covers it); concrete q_lens with no such sequence, or no q_lens,
    make no fa_decode call; traced q_lens always make it (its non-decoding sequences read no key)."""
    calls = []
    real = chunked._decode_part
    monkeypatch.setattr(chunked, "_decode_part", lambda *a, **k: calls.append(1) or real(*a, **k))
    kv, ql = [120, 64, 90], [40, 3, 0]
    arrs, cast, table, kvl = _case(rng, 3, 40, 4, 2, 64, 16, 8, kv, jnp.bfloat16)
    out, lse = pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=jnp.asarray(np.asarray(ql, np.int32)),
                                           return_lse=True)
    assert calls == [1]
    _check(out, lse, cast, table, kvl, ql, 1e-2)
    pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=jnp.asarray(np.array([40, 30, 0], np.int32)))
    pallas_attn.paged_attention(*arrs, table, kvl, causal=True)
    assert calls == [1]
    jax.jit(lambda ql: pallas_attn.paged_attention(*arrs, table, kvl, causal=True, q_lens=ql,
                                                   check_block_table=False))(jnp.asarray(np.asarray(ql, np.int32)))
    assert calls == [1, 1]


@pytest.mark.parametrize("page", [16, 64, 128, 0])
def test_the_producer_runs_in_one_warp_only_where_a_block_spans_pages(page):
    """``PrefillConfig.producer_warp=None`` (the default) lowers to the one-warp producer exactly when a key block spans
    several pages (page < block_kv: session 32, the page-16 chunk 1.081x -> 1.017x its dense twin) and to the
    warpgroup producer otherwise (dense, or a page holding whole blocks: one warp was 1.01-1.06x slower at D 128 long
    N). Checked on the lowered CUDA programs (nothing runs): the default's text equals the forced one-warp config's
    where it should, and the forced warpgroup config's elsewhere; forcing one warp changes the program."""
    import dataclasses

    from pallas_attn.kernels import fa_prefill as fp

    sds = jax.ShapeDtypeStruct
    q, off = sds((2, 256, 4, 128), jnp.bfloat16), sds((2,), jnp.int32)
    base = fp.CONFIGS["default"]
    assert base.producer_warp is None and fp.CONFIGS["warp_producer"].producer_warp is True

    def text(cfg):
        if page == 0:
            k = sds((2, 512, 2, 128), jnp.bfloat16)
            fn = lambda q, k, off: fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False,  # noqa: E731
                                              config=cfg)
            args = (q, k, off)
        else:
            pool, bt = sds((2 * 512 // page, page, 2, 128), jnp.bfloat16), sds((2, 512 // page), jnp.int32)
            fn = lambda q, p, bt, off: fp.forward(q, p, p, causal=True, scale=0.1, q_offset=off,  # noqa: E731
                                                  interpret=False, config=cfg, block_table=bt)
            args = (q, pool, bt, off)
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    with _no_locations():
        default, one_warp = text(base), text(dataclasses.replace(base, producer_warp=True))
        warpgroup = text(dataclasses.replace(base, producer_warp=False))
    assert one_warp != warpgroup
    assert default == (one_warp if 0 < page < base.block_kv else warpgroup)


@contextlib.contextmanager
def _no_locations():
    """No source lines in the lowered text (scripts/lowered_hashes.py's setting), restored afterwards."""
    old = jax.config.jax_traceback_in_locations_limit
    jax.config.update("jax_traceback_in_locations_limit", 0)
    try:
        yield
    finally:
        jax.config.update("jax_traceback_in_locations_limit", old)


def test_producer_warp_is_none_or_a_bool():
    from pallas_attn.kernels import fa_prefill as fp

    for bad in ("yes", 1, 0):
        with pytest.raises(ValueError, match="producer_warp"):
            fp.PrefillConfig(producer_warp=bad)


def test_a_bad_decode_in_a_mixed_batch_is_poisoned_under_jit(rng):
    """Under jit a bad table entry of a decoding sequence poisons that sequence's every row and LSE (fa_prefill writes
    the NaN; the decode join leaves it), and only that sequence: the chunk and the other decode match the oracle."""
    kv, ql = [120, 64, 90], [40, 1, 3]
    arrs, cast, table, kvl = _case(rng, 3, 40, 4, 2, 64, 16, 8, kv, jnp.bfloat16)
    bad = np.asarray(table).copy()
    bad[1, 0] = 10_000  # sequence 1 (a decode over 64 keys) uses page 0
    f = jax.jit(lambda t, ql: pallas_attn.paged_attention(*arrs, t, kvl, causal=True, q_lens=ql, return_lse=True))
    out, lse = f(jnp.asarray(bad), jnp.asarray(np.asarray(ql, np.int32)))
    out, lse = np.asarray(out, np.float32), np.asarray(lse)
    assert np.isnan(out[1]).all() and np.isnan(lse[1]).all()
    keep = np.asarray([0, 2])
    _check(out[keep], lse[keep], [cast[0][keep], cast[1], cast[2]], np.asarray(table)[keep], np.asarray(kv)[keep],
           [ql[i] for i in keep], 1e-2)


def test_fa_prefill_forward_q_lens_and_poison_contract(rng):
    """``fa_prefill.forward(q_lens=, poison=)`` (interpret mode): rows at or past ``q_lens`` come back 0 with LSE
    -inf, a poisoned sequence's every row and LSE NaN, the real rows those of the call without either; bad arguments
    refuse by name."""
    from pallas_attn.kernels import fa_prefill as fp

    b, tq, tk, hq, hkv, d = 3, 70, 96, 2, 1, 64
    q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), jnp.bfloat16)
    off = jnp.asarray(np.asarray([26, 0, 10], np.int32))
    ql = jnp.asarray(np.asarray([70, 0, 33], np.int32))
    kw = dict(causal=True, scale=0.125, q_offset=off, interpret=True, config=fp.CONFIGS["default"], return_lse=True)
    o0, l0 = fp.forward(q, k, k, **kw)
    o, lse = fp.forward(q, k, k, q_lens=ql, poison=jnp.asarray([False, False, True]), **kw)
    o, lse, o0, l0 = (np.asarray(x, np.float32) for x in (o, lse, o0, l0))
    assert np.array_equal(o[0], o0[0]) and np.array_equal(lse[0], l0[0])
    assert np.all(o[1] == 0.0) and np.all(np.isneginf(lse[1]))
    assert np.isnan(o[2]).all() and np.isnan(lse[2]).all()
    o, lse = fp.forward(q, k, k, q_lens=ql, **kw)
    o, lse = np.asarray(o, np.float32), np.asarray(lse)
    assert np.array_equal(o[2, :33], o0[2, :33]) and np.all(o[2, 33:] == 0.0) and np.all(np.isneginf(lse[2, :, 33:]))
    with pytest.raises(ValueError, match="poison needs q_lens"):
        fp.forward(q, k, k, poison=jnp.asarray([False] * 3), **kw)
    with pytest.raises(ValueError, match="poison must be bool"):
        fp.forward(q, k, k, q_lens=ql, poison=jnp.zeros((3,), jnp.int32), **kw)


def test_the_decode_part_plans_for_the_decoding_sequences_only():
    """A mixed batch's decode part: fa_decode's split count planned for the decoding sequences' count when q_lens is
    concrete, half the batch (rounded up) when it is traced; never for the whole batch at the full cache (session
    34: 8 splits of 4096 keys where two of four sequences decode, 2x the two decodes' own time)."""
    from pallas_attn.kernels import fa_decode

    cfg = fa_decode.CONFIGS["default"]
    q_shape, pool_shape, pps = (4, 2048, 32, 128), (4 * 2048 + 7, 16, 8, 128), 2048

    def want(batch):
        return fa_decode.plan(batch=batch, hkv=8, rows=4, d=128, max_kv=pps * 16, config=cfg, page_size=16).splits

    dec = jnp.asarray([False, True, True, False])
    assert chunked.decode_part_splits(q_shape, pool_shape, pps, dec, cfg) == want(2)
    one = jnp.asarray([False, True, False, False])
    assert chunked.decode_part_splits(q_shape, pool_shape, pps, one, cfg) == want(1) > want(4)
    traced = jax.jit(lambda d: jnp.int32(chunked.decode_part_splits(q_shape, pool_shape, pps, d, cfg)))(one)
    assert int(traced) == want(2)



@pytest.mark.parametrize("with_lse", [False, True])
def test_fa_prefill_q_lens_lowers_for_cuda_with_and_without_the_lse(with_lse):
    """``fa_prefill.forward(q_lens=, poison=)`` lowers for CUDA (nothing runs) whether or not the LSE is returned: the
    kernel writes the output's padding and poison itself, the LSE's cut follows it only when there is one."""
    from pallas_attn.kernels import fa_prefill as fp

    sds = jax.ShapeDtypeStruct
    q, k, i = sds((2, 256, 4, 128), jnp.bfloat16), sds((2, 512, 2, 128), jnp.bfloat16), sds((2,), jnp.int32)

    def f(q, k, off, ql, bad):
        return fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False,
                          config=fp.CONFIGS["default"], q_lens=ql, poison=bad, return_lse=with_lse)

    text = jax.jit(f).trace(q, k, i, i, sds((2,), jnp.bool_)).lower(lowering_platforms=("cuda",)).as_text()
    assert fp.PASS_FWD in text
