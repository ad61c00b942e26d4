"""fa_decode's features on the paged entry (issue 32; session 11): a sliding window whose splits tile only the
band (a windowed decode never reads the keys before it), soft-cap and sinks, against the float64 oracle with the same
features on the CPU (interpret mode), with the default plan and with forced splits; bad arguments refuse by name."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from pallas_attn.kernels import fa_decode


def _pools(rng, b, pps, page, hkv, d, dt):
    npg = b * pps + 2
    kp = rng.standard_normal((npg, page, hkv, d)).astype(np.float32)
    vp = rng.standard_normal((npg, page, hkv, d)).astype(np.float32)
    tbl = rng.permutation(npg)[: b * pps].reshape(b, pps).astype(np.int32)
    return kp, vp, tbl


@pytest.mark.parametrize("feats", [dict(window=40), dict(window=40, softcap=3.0, sinks=True), dict(softcap=3.0),
                                   dict(sinks=True), dict(window=1)],
                         ids=["window", "window-softcap-sinks", "softcap", "sinks", "window1"])
@pytest.mark.parametrize("splits", [None, 4])
def test_decode_features_match_the_oracle(rng, feats, splits):
    b, tq, hq, hkv, d, page, pps, dt = 3, 3, 4, 2, 64, 16, 16, jnp.bfloat16
    kp, vp, tbl = _pools(rng, b, pps, page, hkv, d, dt)
    kv = np.array([250, 37, 3], np.int32)  # the last: fewer keys than the queries (a row sees none)
    q = rng.standard_normal((b, tq, hq, d)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32) if feats.get("sinks") else None
    kw = {k: v for k, v in feats.items() if k != "sinks"}
    cast = [np.asarray(jnp.asarray(x, dt), np.float32) for x in (q, kp, vp)]
    cfg = None if splits is None else fa_decode.DecodeConfig(splits=splits)
    out, lse = pallas_attn.paged_attention(*(jnp.asarray(x, dt) for x in (q, kp, vp)), jnp.asarray(tbl),
                                           jnp.asarray(kv), causal=True, return_lse=True, config=cfg,
                                           sinks=None if sinks is None else jnp.asarray(sinks), **kw)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    for i in range(b):
        k = oracle.gather_paged_kv(cast[1], tbl[i], kv[i])[None]
        v = oracle.gather_paged_kv(cast[2], tbl[i], kv[i])[None]
        ro, rl = oracle.attention_reference(cast[0][i:i + 1], k, v, causal=True, q_offset=int(kv[i]) - tq,
                                            window=kw.get("window"), softcap=kw.get("softcap"),
                                            sinks=None if sinks is None else sinks.astype(np.float64))
        assert np.linalg.norm(out[i] - ro[0]) <= 1e-2 * max(np.linalg.norm(ro[0]), 1e-30) + 1e-6, i
        fin = np.isfinite(rl[0])
        assert np.array_equal(np.isfinite(lse[i]), fin) and np.allclose(lse[i][fin], rl[0][fin], atol=1e-2), i


def test_a_windowed_decode_never_reads_the_keys_before_its_band(rng):
    """Keys before the band (the first row's window start, down to a 16-key tile) are NaN in the pool: a kernel that
    loaded them would return NaN (a masked key's zero weight times NaN is NaN). The answer is finite and right, and
    the split plan covers the band, not the 4096-key cache."""
    b, tq, hq, hkv, d, page, pps, w = 1, 2, 4, 2, 64, 16, 256, 64
    kp, vp, tbl = _pools(rng, b, pps, page, hkv, d, jnp.bfloat16)
    kv = np.array([3000], np.int32)
    first = (int(kv[0]) - tq - (w - 1)) // 16 * 16  # the band's first tile
    kg, vg = oracle.gather_paged_kv(kp, tbl[0], int(kv[0])), oracle.gather_paged_kv(vp, tbl[0], int(kv[0]))
    for pool in (kp, vp):
        for j in range(first):  # poison every key before the band through the table
            pool[tbl[0, j // page], j % page] = np.nan
    q = rng.standard_normal((b, tq, hq, d)).astype(np.float32)
    cfg = fa_decode.DecodeConfig(block_k=16)
    out = pallas_attn.paged_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl),
                                      jnp.asarray(kv), causal=True, window=w, config=cfg)
    out = np.asarray(out, np.float64)
    assert np.isfinite(out).all()
    cast = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in (q, kg, vg)]
    ro, _ = oracle.attention_reference(cast[0], cast[1][None], cast[2][None], causal=True, q_offset=int(kv[0]) - tq,
                                       window=w)
    assert np.linalg.norm(out - ro) / np.linalg.norm(ro) < 1e-2
    assert fa_decode._band(pps * page, tq, w) == w + tq - 1 + 512 < pps * page


def test_decode_feature_arguments_refuse_by_name(rng):
    kp, vp, tbl = _pools(rng, 1, 4, 16, 2, 64, jnp.bfloat16)
    arrs = [jnp.asarray(x, jnp.bfloat16) for x in (rng.standard_normal((1, 1, 4, 64)), kp, vp)]
    kv = jnp.asarray(np.array([40], np.int32))
    with pytest.raises(NotImplementedError, match="causal"):
        pallas_attn.paged_attention(*arrs, jnp.asarray(tbl), kv, causal=False, window=8)
    with pytest.raises(ValueError, match="window must be a positive int"):
        pallas_attn.paged_attention(*arrs, jnp.asarray(tbl), kv, causal=True, window=0)
    with pytest.raises(ValueError, match="sinks must be float"):
        pallas_attn.paged_attention(*arrs, jnp.asarray(tbl), kv, causal=True, sinks=jnp.zeros(3))
    with pytest.raises(ValueError, match="softcap must be a positive"):
        pallas_attn.paged_attention(*arrs, jnp.asarray(tbl), kv, causal=True, softcap=-1.0)


def test_decode_features_and_the_chunked_path_lower_for_cuda(monkeypatch):
    """The Triton kernels with a window, soft-cap and sinks (fa_decode) lower for CUDA on this CPU machine, and the
    chunked path's fa_prefill (Mosaic GPU) with its window / soft-cap / sinks too (the device query faked to a
    Hopper: nothing runs)."""
    import jax

    from pallas_attn import dropin

    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)

    pool = jax.ShapeDtypeStruct((64, 16, 2, 128), jnp.bfloat16)
    bt = jax.ShapeDtypeStruct((2, 32), jnp.int32)
    lens = jax.ShapeDtypeStruct((2,), jnp.int32)
    sinks = jax.ShapeDtypeStruct((8,), jnp.float32)
    for tq in (4, 64):  # fa_decode; the chunked path (gather + fa_prefill)
        qs = jax.ShapeDtypeStruct((2, tq, 8, 128), jnp.bfloat16)
        f = jax.jit(lambda q, kp, bt, lens, s: pallas_attn.paged_attention(
            q, kp, kp, bt, lens, causal=True, interpret=False, check_block_table=False, window=100, softcap=30.0,
            sinks=s))
        text = f.trace(qs, pool, bt, lens, sinks).lower(lowering_platforms=("cuda",)).as_text()
        want = "pallas_attn_fa_decode_partial" if tq == 4 else "pallas_attn_fa_prefill"
        assert want in text, tq


@pytest.mark.parametrize("feats", [dict(window=33), dict(window=33, softcap=4.0, sinks=True)], ids=["window", "all"])
def test_dense_decode_features_match_the_oracle(rng, feats):
    """pallas_attn.attention (dense cache, fa_decode chosen by default at Tq 2) with the features, per-sequence offsets
    (the decode positions), forced splits: against the oracle; another generation refuses them by name."""
    b, tq, tk, hq, hkv, d = 2, 2, 300, 4, 2, 64
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, d)))
    sinks = rng.standard_normal(hq).astype(np.float32) if feats.get("sinks") else None
    kw = {x: y for x, y in feats.items() if x != "sinks"}
    off = np.array([tk - tq, 120], np.int32)
    cast = [np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32) for x in (q, k, v)]
    out, lse = pallas_attn.attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), causal=True,
                                     q_offset=jnp.asarray(off), return_lse=True,
                                     config=fa_decode.DecodeConfig(splits=3),
                                     sinks=None if sinks is None else jnp.asarray(sinks), **kw)
    ro, rl = oracle.attention_reference(*cast, causal=True, q_offset=off, window=kw.get("window"),
                                        softcap=kw.get("softcap"), sinks=None if sinks is None else sinks.astype(float))
    assert np.linalg.norm(np.asarray(out, np.float64) - ro) / np.linalg.norm(ro) < 1e-2
    assert np.allclose(np.asarray(lse, np.float64), rl, atol=1e-2)
    with pytest.raises(NotImplementedError, match="fa_decode only"):
        pallas_attn.attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), causal=True, window=8,
                              generation="fa_train")


def test_compare_auto_times_the_decode_entries_with_features_on_cpu(tmp_path):
    """compare's pallas:auto on decode workloads with a model's features (a dense cache and a paged one: window,
    soft-cap, sinks), which it recorded as unsupported before session 11: ok, fa_decode chosen, oracle agreement."""
    from compare import cli, records

    cfg = tmp_path / "dec.toml"
    common = '''heads_q = 4
heads_kv = 2
head_dim = 64
q_len = 1
kv_len = 200
causal = true
dtype = "bfloat16"
window = 64
softcap = 30.0
sinks = true
generations = ["pallas:auto"]
peers = []
'''
    cfg.write_text(f'''description = "decode with a model's features"
[[workload]]
name = "dec_feats"
family = "decode"
batch = 2
{common}
[[workload]]
name = "paged_feats"
family = "paged_decode"
batch = 2
page_size = 16
{common}''')
    out = tmp_path / "out"
    assert cli.main(["run", "--config", str(cfg), "--quiet", "--out", str(out)]) == 0
    res = {r["workload"]["name"]: r for r in records.read_jsonl(out / "records.jsonl") if r["type"] == "result"}
    for name in ("dec_feats", "paged_feats"):
        r = res[name]
        assert r["status"] == "ok", (name, r.get("reason"))
        assert r["impl"]["plan"]["chose"].startswith("fa_decode"), r["impl"]["plan"]
        assert r["agreement"]["rel_l2_err"] < r["agreement"]["tol_rel_l2"], name


@pytest.mark.parametrize("tq", [1, 2])
def test_a_static_offset_past_the_last_key_runs_the_non_causal_program(rng, tq):
    """``attention(causal=True, q_offset=int)`` with ``q_offset >= Tk - 1`` masks nothing (every row sees every key),
    so it runs the non-causal program (no offset array: session 20): exactly the non-causal output, and the oracle's
    causal one; one position less (``Tk - 2``) is a real mask at the first row and stays causal (differs)."""
    b, tk, hq, hkv, d = 2, 200, 4, 2, 64
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in ((b, tq, hq, d), (b, tk, hkv, d),
                                                                         (b, tk, hkv, d)))
    free = np.asarray(pallas_attn.attention(q, k, v, causal=False), np.float32)
    for off in (tk - 1, tk + 5):
        got = np.asarray(pallas_attn.attention(q, k, v, causal=True, q_offset=off), np.float32)
        np.testing.assert_array_equal(got, free)
        ro, _ = oracle.attention_reference(*(np.asarray(x, np.float32) for x in (q, k, v)), causal=True,
                                           q_offset=np.full((b,), off))
        assert np.linalg.norm(got - ro) / np.linalg.norm(ro) < 1e-2
    masked = np.asarray(pallas_attn.attention(q, k, v, causal=True, q_offset=tk - 2), np.float32)
    assert not np.array_equal(masked[:, 0], free[:, 0])
    ro, _ = oracle.attention_reference(*(np.asarray(x, np.float32) for x in (q, k, v)), causal=True,
                                       q_offset=np.full((b,), tk - 2))
    assert np.linalg.norm(masked - ro) / np.linalg.norm(ro) < 1e-2


@pytest.mark.parametrize("splits", [None, 3])
@pytest.mark.parametrize("feats", [dict(), dict(window=30, softcap=3.0, sinks=True)], ids=["plain", "all"])
def test_q_rows_runs_query_major_tiles_and_matches_the_oracle(rng, feats, splits):
    """``paged_forward(q_rows=)`` (session 34, a mixed batch's decode part): the rows packed query-major in 16-row
    tiles, a tile holding no real query reads no key; every real row (1, 5: across two tiles, 16: all four tiles) of
    each sequence matches the float64 oracle, a sequence with no real query reads nothing, with the default plan and
    forced splits, plain and with window + soft-cap + sinks; bad q_rows refuse by name."""
    b, tq, hq, hkv, d, page, pps, dt = 4, 16, 8, 2, 64, 16, 16, jnp.bfloat16
    kp, vp, tbl = _pools(rng, b, pps, page, hkv, d, dt)
    kv = np.array([250, 37, 100, 90], np.int32)
    ql = np.array([1, 5, 16, 0], np.int32)
    off = kv - ql
    q = rng.standard_normal((b, tq, hq, d)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32) if feats.get("sinks") else None
    kw = {k: v for k, v in feats.items() if k != "sinks"}
    cast = [np.asarray(jnp.asarray(x, dt), np.float32) for x in (q, kp, vp)]
    cfg = fa_decode.DecodeConfig(splits=splits, block_m_max=16)
    out, lse = fa_decode.paged_forward(*(jnp.asarray(x, dt) for x in (q, kp, vp)), jnp.asarray(tbl), jnp.asarray(kv),
                                       causal=True, scale=d ** -0.5, q_offset=jnp.asarray(off), interpret=True,
                                       config=cfg, return_lse=True, sinks=None if sinks is None else jnp.asarray(sinks),
                                       q_rows=jnp.asarray(ql), **kw)
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    per_tile = 16 // (hq // hkv)  # queries a 16-row tile holds
    for i in range(b):
        n = int(ql[i])
        first_idle = -(-n // per_tile) * per_tile  # the queries of the tiles that read no key: nothing seen
        want = np.full(hq, -np.inf) if sinks is None else sinks.astype(np.float64)  # no key seen: the sink alone
        assert np.allclose(lse[i][:, first_idle:], want[:, None], atol=1e-6) and np.all(out[i, first_idle:] == 0.0), i
        if n == 0:
            continue
        k = oracle.gather_paged_kv(cast[1], tbl[i], kv[i])[None]
        v = oracle.gather_paged_kv(cast[2], tbl[i], kv[i])[None]
        ro, rl = oracle.attention_reference(cast[0][i:i + 1, :n], k, v, causal=True, q_offset=int(off[i]),
                                            window=kw.get("window"), softcap=kw.get("softcap"),
                                            sinks=None if sinks is None else sinks.astype(np.float64))
        assert np.linalg.norm(out[i, :n] - ro[0]) <= 1e-2 * np.linalg.norm(ro[0]), i
        assert np.allclose(lse[i][:, :n], rl[0], atol=1e-2), i
    args = (jnp.asarray(q, dt), jnp.asarray(kp, dt), jnp.asarray(vp, dt), jnp.asarray(tbl), jnp.asarray(kv))
    with pytest.raises(ValueError, match="q_rows must be int32"):
        fa_decode.paged_forward(*args, causal=True, scale=0.1, q_offset=jnp.asarray(off), interpret=True, config=cfg,
                                q_rows=jnp.asarray(ql[:3]))
    with pytest.raises(ValueError, match="needs causal"):
        fa_decode.paged_forward(*args, causal=False, scale=0.1, q_offset=None, interpret=True, config=cfg,
                                q_rows=jnp.asarray(ql))


def test_merge_reads_only_live_rows(rng):
    """``splitkv.merge(live=...)`` (session 39, fa_decode's padding rows): a row that is not live reads nothing and
    gives 0 with LSE -inf, even where its partial states are NaN (memory its producer never wrote); live rows equal
    the merge without ``live`` bit for bit."""
    from pallas_attn.kernels import splitkv

    r, s, d = 12, 5, 32
    o = rng.standard_normal((r, s, d)).astype(np.float32)
    lse = rng.standard_normal((r, s)).astype(np.float32)
    alive = np.array([1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 0], np.int32)
    o[alive == 0], lse[alive == 0] = np.nan, np.nan
    kw = dict(out_dtype=jnp.float32, interpret=True, name="t_merge", return_lse=True, block=4)
    out, ls = splitkv.merge(jnp.asarray(o), jnp.asarray(lse), live=(jnp.asarray(alive), lambda i, ref: ref[i] > 0),
                            **kw)
    out, ls = np.asarray(out), np.asarray(ls)
    assert np.all(out[alive == 0] == 0.0) and np.all(np.isneginf(ls[alive == 0]))
    ref_o, ref_l = splitkv.merge(jnp.asarray(o), jnp.asarray(lse), **kw)
    assert np.array_equal(out[alive == 1], np.asarray(ref_o)[alive == 1])
    assert np.array_equal(ls[alive == 1], np.asarray(ref_l)[alive == 1])
    assert np.all(np.isnan(np.asarray(ref_o)[alive == 0]))  # without live the NaN states are read


def test_a_mixed_batch_lowers_for_cuda_with_its_row_limited_decode_part(monkeypatch):
    """A chunked call with traced q_lens (a mixed batch) lowers for CUDA on this CPU machine: fa_prefill with its
    real-rows input and fa_decode's query-major, row-limited decode part (the device query faked to a Hopper)."""
    import jax

    from pallas_attn import dropin

    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    pool = jax.ShapeDtypeStruct((64, 16, 2, 128), jnp.bfloat16)
    f = jax.jit(lambda q, kp, bt, lens, ql: pallas_attn.paged_attention(
        q, kp, kp, bt, lens, causal=True, interpret=False, check_block_table=False, q_lens=ql))
    text = f.trace(jax.ShapeDtypeStruct((2, 64, 8, 128), jnp.bfloat16), pool, jax.ShapeDtypeStruct((2, 32), jnp.int32),
                   jax.ShapeDtypeStruct((2,), jnp.int32), jax.ShapeDtypeStruct((2,), jnp.int32)).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "pallas_attn_fa_decode_partial" in text and "pallas_attn_fa_prefill" in text
