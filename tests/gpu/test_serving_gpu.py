"""Serving-shaped paged attention on the GPU (issue 32): the chunked path (gather + fa_prefill on a Hopper, fa_train
for fp32) and fa_decode's window / soft-cap / sinks, compiled, at a serving engine's sizes (Llama-3.1-8B heads: Hq
32, Hkv 8, D 128; 8k-32k cached keys; page 16; a batch mixing a long chunk, decodes and an empty slot), against the
float64 oracle on a subset of sequences, heads and rows (the full launch runs; the oracle checks slices of it).

Budget: about two minutes on an H100 (``-m gpu``; most of it compiles)."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import oracle  # noqa: E402
from pallas_attn import chunked, dropin  # noqa: E402
from pallas_attn.kernels import fa_decode  # noqa: E402

pytestmark = pytest.mark.gpu

HQ, HKV, D, PAGE = 32, 8, 128, 16


def _pools(seed, b, pps, d=D, dt=jnp.bfloat16, spare=7, page=PAGE):
    """A shuffled table over a pool with ``spare`` NaN pages nobody's table names (a kernel that read them: NaN)."""
    rng = np.random.default_rng(seed)
    npg = b * pps + spare
    kp = rng.standard_normal((npg, page, HKV, d), np.float32)
    vp = rng.standard_normal((npg, page, HKV, d), np.float32)
    tbl = rng.permutation(npg)[: b * pps].reshape(b, pps).astype(np.int32)
    unused = np.setdiff1d(np.arange(npg), tbl)
    kp[unused] = np.nan
    vp[unused] = np.nan
    kp, vp = (np.asarray(jnp.asarray(x, dt), np.float32) for x in (kp, vp))  # what the kernel sees, for the oracle
    return kp, vp, tbl


def _check_rows(out, lse, q, kp, vp, tbl, kv, b, rows, off, heads, tol, **feats):
    """Rows ``rows`` of sequence ``b`` (query row r at position r + off) on kv heads ``heads`` against the oracle."""
    qh = np.concatenate([np.arange(h * (HQ // HKV), (h + 1) * (HQ // HKV)) for h in heads])
    if feats.get("sinks") is not None:
        feats = dict(feats, sinks=feats["sinks"][qh])
    k = oracle.gather_paged_kv(kp, tbl[b], int(kv[b]))[None][:, :, heads]
    v = oracle.gather_paged_kv(vp, tbl[b], int(kv[b]))[None][:, :, heads]
    ro, rl = oracle.attention_reference(q[b:b + 1, rows][:, :, qh], k, v, causal=True, q_offset=off + int(rows[0]),
                                        **feats)
    got = np.asarray(jnp.asarray(out[b, rows][:, qh], jnp.float32), np.float64)
    assert np.isfinite(got).all(), b
    assert np.linalg.norm(got - ro[0]) / np.linalg.norm(ro[0]) < tol, (b, rows[0])
    if lse is not None:
        gl = np.asarray(lse[b][qh][:, rows], np.float64)
        assert np.allclose(gl, rl[0], atol=10 * tol), (b, rows[0])


def _sinks(seed):
    return np.random.default_rng(seed).standard_normal(HQ).astype(np.float32)


@pytest.mark.parametrize("feats", [{}, dict(window=4096), dict(window=1024, softcap=30.0, sinks=True)],
                         ids=["plain", "mistral-window", "window-softcap-sinks"])
def test_chunked_prefill_mixed_batch_on_fa_prefill(feats):
    """A 2048-token chunk at the end of 8k cached keys, a decode, a 300-token chunk, an empty slot, in one call:
    the Hopper runs fa_prefill over the gathered pages; padding rows are 0 with LSE -inf."""
    assert chunked.uses_fa_prefill("bfloat16", D, False) and dropin._is_sm90()
    b, tq, pps = 4, 2048, 8192 // PAGE
    kv = np.array([8192, 3000, 517, 1], np.int32)
    ql = np.array([2048, 1, 300, 0], np.int32)
    kp, vp, tbl = _pools(1, b, pps)
    q = np.asarray(jnp.asarray(np.random.default_rng(2).standard_normal((b, tq, HQ, D), np.float32), jnp.bfloat16),
                   np.float32)
    s = _sinks(3) if feats.get("sinks") else None
    kw = {k: v for k, v in feats.items() if k != "sinks"}
    # under jit: q_lens and the lengths are traced (the offsets checked on the device, not eagerly)
    f = jax.jit(lambda q, kp, vp, t, kv, ql: pallas_attn.paged_attention(
        q, kp, vp, t, kv, causal=True, q_lens=ql, return_lse=True, check_block_table=False,
        sinks=None if s is None else jnp.asarray(s), **kw))
    out, lse = f(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl), jnp.asarray(kv),
                 jnp.asarray(ql))
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)
    ref_kw = dict(kw, sinks=None if s is None else s.astype(np.float64))
    for bi in range(b):
        n = int(ql[bi])
        assert np.all(out[bi, n:] == 0.0) and np.all(np.isneginf(lse[bi, :, n:])), bi
        off = int(kv[bi]) - n
        for rows in {(0, min(n, 64)), (max(n - 128, 0), n), (n // 2, min(n // 2 + 64, n))}:
            if rows[1] > rows[0]:
                _check_rows(out, lse, q, kp, vp, tbl, kv, bi, np.arange(*rows), off, [0, HKV - 1], 1e-2, **ref_kw)


@pytest.mark.parametrize("d,page", [(64, 16), (256, 64), (128, 64), (128, 256), (128, 8)])
def test_chunked_prefill_other_head_dims_and_pages(d, page):
    """D 64 (GPT-2-like heads) and D 256 (Gemma), pages of 8 to 256 keys (one TMA copy per page of a key block, or
    one copy from inside a page) on the chunked fa_prefill path, a ragged batch of two chunks."""
    b, tq, pps = 2, 512, 4096 // page
    kv = np.array([4096, 700], np.int32)
    ql = np.array([512, 129], np.int32)
    kp, vp, tbl = _pools(4, b, pps, d=d, page=page)
    q = np.asarray(jnp.asarray(np.random.default_rng(5).standard_normal((b, tq, HQ, d), np.float32), jnp.bfloat16),
                   np.float32)
    out, lse = pallas_attn.paged_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl),
                                           jnp.asarray(kv), causal=True, q_lens=jnp.asarray(ql), return_lse=True)
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)
    for bi in range(b):
        n = int(ql[bi])
        _check_rows(out, lse, q, kp, vp, tbl, kv, bi, np.arange(n - 64, n), int(kv[bi]) - n, [0, 3], 1e-2)


@pytest.mark.parametrize("page", [16, 64])
def test_in_kernel_paging_equals_the_gather_path(monkeypatch, page):
    """fa_prefill reading the pages through the table (TMA per page) computes what it computes on the gathered dense
    cache: the same tiles, the same arithmetic, bit for bit (window, soft-cap and sinks on)."""
    b, tq, pps = 3, 1024, 8192 // page
    kv = np.array([8192, 2000, 1100], np.int32)
    ql = np.array([1024, 700, 1], np.int32)
    kp, vp, tbl = _pools(15, b, pps, page=page)
    q = jnp.asarray(np.random.default_rng(16).standard_normal((b, tq, HQ, D), np.float32), jnp.bfloat16)
    args = (q, jnp.asarray(kp, jnp.bfloat16), jnp.asarray(vp, jnp.bfloat16), jnp.asarray(tbl), jnp.asarray(kv))
    kw = dict(causal=True, q_lens=jnp.asarray(ql), return_lse=True, window=3000, softcap=30.0,
              sinks=jnp.asarray(_sinks(17)))
    assert chunked.PAGED_IN_KERNEL
    o1, l1 = pallas_attn.paged_attention(*args, **kw)
    monkeypatch.setattr(chunked, "PAGED_IN_KERNEL", False)
    o2, l2 = pallas_attn.paged_attention(*args, **kw)
    assert np.isfinite(np.asarray(o1, np.float32)).all()
    assert np.array_equal(np.asarray(o1, np.float32), np.asarray(o2, np.float32))
    assert np.array_equal(np.asarray(l1), np.asarray(l2))


def test_chunked_prefill_fp32_runs_fa_train():
    """fp32 is not fa_prefill's: the chunked path runs fa_train (Triton), masked by q_lens and kv_lens itself."""
    b, tq, pps = 2, 256, 2048 // PAGE
    kv = np.array([2048, 300], np.int32)
    ql = np.array([256, 57], np.int32)
    kp, vp, tbl = _pools(6, b, pps, dt=jnp.float32)
    q = np.random.default_rng(7).standard_normal((b, tq, HQ, D), np.float32)
    out, lse = pallas_attn.paged_attention(*(jnp.asarray(x) for x in (q, kp, vp)), jnp.asarray(tbl),
                                           jnp.asarray(kv), causal=True, q_lens=jnp.asarray(ql), return_lse=True,
                                           window=200)
    out, lse = np.asarray(out), np.asarray(lse)
    for bi in range(b):
        n = int(ql[bi])
        assert np.all(out[bi, n:] == 0.0), bi
        # fp32 on tensor cores (TF32 dots): 1e-2 is TF32's bound at D 128, not fp32's 1e-5
        _check_rows(out, lse, q, kp, vp, tbl, kv, bi, np.arange(0, n), int(kv[bi]) - n, [2], 1e-2, window=200)


@pytest.mark.parametrize("feats", [dict(window=4096), dict(softcap=50.0), dict(sinks=True),
                                   dict(window=128, softcap=30.0, sinks=True)],
                         ids=["mistral-window", "softcap", "sinks", "all"])
@pytest.mark.parametrize("splits", [None, 16])
def test_paged_decode_features_at_serving_sizes(feats, splits):
    """fa_decode (Tq 1, B 8, 32k-key pages, ragged lengths down to 1) with a model's features: the default plan and a
    forced 16-way split, against the oracle on three sequences and two kv heads."""
    b, pps = 8, 32768 // PAGE
    kv = np.array([32768, 1, 9000, 4097, 16, 20000, 129, 31000], np.int32)
    kp, vp, tbl = _pools(8, b, pps)
    q = np.asarray(jnp.asarray(np.random.default_rng(9).standard_normal((b, 1, HQ, D), np.float32), jnp.bfloat16),
                   np.float32)
    s = _sinks(10) if feats.get("sinks") else None
    kw = {k: v for k, v in feats.items() if k != "sinks"}
    cfg = None if splits is None else fa_decode.DecodeConfig(splits=splits)
    f = jax.jit(lambda q, kp, vp, t, kv: pallas_attn.paged_attention(
        q, kp, vp, t, kv, causal=True, return_lse=True, config=cfg, check_block_table=False,
        sinks=None if s is None else jnp.asarray(s), **kw))
    out, lse = f(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl), jnp.asarray(kv))
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)
    ref_kw = dict(kw, sinks=None if s is None else s.astype(np.float64))
    for bi in (0, 1, 5):
        _check_rows(out, lse, q, kp, vp, tbl, kv, bi, np.arange(1), int(kv[bi]) - 1, [0, HKV - 1], 1e-2, **ref_kw)


def test_windowed_decode_skips_the_keys_before_its_band():
    """Every key before the band is NaN through the table: a kernel that loaded one would return NaN."""
    b, pps, w = 2, 32768 // PAGE, 4096
    kv = np.array([32768, 20001], np.int32)
    kp, vp, tbl = _pools(11, b, pps)
    ref_k, ref_v = kp.copy(), vp.copy()
    for bi in range(b):
        first = (int(kv[bi]) - w) // 512 * 512  # well before the band's first tile: still poisoned
        for pool in (kp, vp):
            for j in range(0, first, PAGE):
                pool[tbl[bi, j // PAGE]] = np.nan
    q = np.asarray(jnp.asarray(np.random.default_rng(12).standard_normal((b, 1, HQ, D), np.float32), jnp.bfloat16),
                   np.float32)
    out = pallas_attn.paged_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl),
                                      jnp.asarray(kv), causal=True, window=w)
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.isfinite(out).all()
    for bi in range(b):
        _check_rows(out, None, q, ref_k, ref_v, tbl, kv, bi, np.arange(1), int(kv[bi]) - 1, [1, 5], 1e-2, window=w)


def test_dense_decode_features_at_serving_sizes():
    """pallas_attn.attention on a dense 16k cache at Tq 1 with per-sequence positions and all three features."""
    rng = np.random.default_rng(13)
    b, tk = 4, 16384
    q = np.asarray(jnp.asarray(rng.standard_normal((b, 1, HQ, D), np.float32), jnp.bfloat16), np.float32)
    k, v = (np.asarray(jnp.asarray(rng.standard_normal((b, tk, HKV, D), np.float32), jnp.bfloat16), np.float32)
            for _ in range(2))
    off = np.array([tk - 1, 5000, 0, 12345], np.int32)
    s = _sinks(14)
    out, lse = pallas_attn.attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)), causal=True,
                                     q_offset=jnp.asarray(off), return_lse=True, window=2048, softcap=30.0,
                                     sinks=jnp.asarray(s))
    heads = [0, 3]
    qh = np.concatenate([np.arange(h * 4, h * 4 + 4) for h in heads])
    ro, rl = oracle.attention_reference(q[:, :, qh], k[:, :, heads], v[:, :, heads], causal=True, q_offset=off,
                                        window=2048, softcap=30.0, sinks=s[qh].astype(np.float64))
    got = np.asarray(jnp.asarray(out, jnp.float32), np.float64)[:, :, qh]
    assert np.linalg.norm(got - ro) / np.linalg.norm(ro) < 1e-2
    assert np.allclose(np.asarray(lse, np.float64)[:, qh], rl, atol=1e-1)


def test_mixed_batch_decode_part_runs_row_limited_tiles():
    """A mixed batch under jit whose decodes have 1, 5 and 16 queries (session 34: the decode part runs fa_decode on
    query-major 16-row tiles, a tile with no real query reading no key; its splits planned for half the batch):
    every real row of every sequence matches the oracle, padding rows are 0 with LSE -inf."""
    b, tq, pps = 6, 1024, 16384 // PAGE
    kv = np.array([4096, 16384, 777, 9000, 5000, 1], np.int32)
    ql = np.array([1024, 1, 5, 16, 300, 0], np.int32)
    kp, vp, tbl = _pools(21, b, pps)
    q = np.asarray(jnp.asarray(np.random.default_rng(22).standard_normal((b, tq, HQ, D), np.float32), jnp.bfloat16),
                   np.float32)
    f = jax.jit(lambda q, kp, vp, t, kv, ql: pallas_attn.paged_attention(q, kp, vp, t, kv, causal=True, q_lens=ql,
                                                                         return_lse=True))
    out, lse = f(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl), jnp.asarray(kv),
                 jnp.asarray(ql))
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)
    for bi in range(b):
        n = int(ql[bi])
        assert np.all(out[bi, n:] == 0.0) and np.all(np.isneginf(lse[bi, :, n:])), bi
        if n:
            rows = np.arange(n) if n <= 16 else np.arange(n - 64, n)
            _check_rows(out, lse, q, kp, vp, tbl, kv, bi, rows, int(kv[bi]) - n, [0, HKV - 1], 1e-2)


@pytest.mark.parametrize("extra,dmax", [(37, 16), (5, 16), (0, 16), (5, 1), (0, 4)])
def test_packed_varlen_batch_matches_the_oracle(extra, dmax):
    """``paged_attention_varlen`` at Llama-3.1-8B heads under jit (session 34): packed queries of a 2048-query chunk
    over 8k keys, decodes of 1, 1 and 5 queries, an empty sequence and a 300-query chunk over 16k (its row tiles
    pseudo-sequences of fa_prefill, the decodes on fa_decode's row-limited part); every real row matches the oracle,
    the unused trailing rows are 0 with LSE -inf. ``extra`` unused rows after the last sequence: T = 2392, 2360 and
    2355 (the last chunk's last row tile reaching past T, its gathered rows clamped). ``dmax``: the
    ``decode_max_q`` hint (session 39; 1 and 4 send the 5-query sequence to fa_prefill's row tiles)."""
    ql = np.array([2048, 1, 1, 5, 0, 300], np.int32)
    kv = np.array([8192, 4096, 16384, 777, 50, 16384], np.int32)
    b, pps = len(ql), 16384 // PAGE
    cu = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    t = int(cu[-1]) + extra
    kp, vp, tbl = _pools(23, b, pps)
    q = np.asarray(jnp.asarray(np.random.default_rng(24).standard_normal((t, HQ, D), np.float32), jnp.bfloat16),
                   np.float32)
    f = jax.jit(lambda q, kp, vp, tb, kv, cu: pallas_attn.paged_attention_varlen(q, kp, vp, tb, kv, cu,
                                                                                return_lse=True, decode_max_q=dmax))
    out, lse = f(*(jnp.asarray(x, jnp.bfloat16) for x in (q, kp, vp)), jnp.asarray(tbl), jnp.asarray(kv),
                 jnp.asarray(cu))
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)
    assert np.all(out[cu[-1]:] == 0.0) and np.all(np.isneginf(lse[:, cu[-1]:]))
    # the padded entry's row checker on a [1, n] view of each sequence
    for bi in range(b):
        n = int(ql[bi])
        if not n:
            continue
        o_b, l_b = out[None, cu[bi]:cu[bi + 1]], lse[None, :, cu[bi]:cu[bi + 1]]
        for rows in {(0, min(n, 64)), (max(n - 64, 0), n), (n // 2, min(n // 2 + 64, n))}:  # contiguous ranges
            _check_rows(o_b, l_b, q[None, cu[bi]:cu[bi + 1]], kp, vp, tbl[bi:bi + 1], kv[bi:bi + 1], 0,
                        np.arange(*rows), int(kv[bi]) - n, [0, HKV - 1], 1e-2)
