"""``pallas_attn.paged_attention_varlen`` (issue 32, session 34): causal paged attention over packed queries (a
serving batch of chunks and decodes with no padding), against the float64 paged oracle on the CPU (interpret mode):
chunks longer and shorter than a row tile, decodes of 1 and 5 queries, an empty sequence, unused trailing rows, GQA,
pages 16 / 64, window + soft-cap + sinks, under jit equal to eager; bad lengths and tables raise eagerly and poison
under jit; the same answer as the padded entry (``paged_attention(q_lens=...)``); what is not built refuses by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle


def _case(rng, ql, kv, hq=4, hkv=2, d=64, page=16, pps=16, spare_rows=5, dt=jnp.bfloat16):
    b = len(ql)
    npages = b * pps + 3
    kp = rng.standard_normal((npages, page, hkv, d)).astype(np.float32)
    vp = rng.standard_normal((npages, page, hkv, d)).astype(np.float32)
    tbl = rng.permutation(npages)[: b * pps].reshape(b, pps).astype(np.int32)
    cu = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    q = rng.standard_normal((int(cu[-1]) + spare_rows, hq, d)).astype(np.float32)
    cast = [np.asarray(jnp.asarray(x, dt), np.float32) for x in (q, kp, vp)]
    arrs = [jnp.asarray(x, dt) for x in (q, kp, vp)]
    return arrs, cast, jnp.asarray(tbl), jnp.asarray(np.asarray(kv, np.int32)), jnp.asarray(cu)


def _check(out, lse, cast, tbl, kv, cu, tol, **feats):
    q, kp, vp = cast
    out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
    cu, kv, tbl = np.asarray(cu), np.asarray(kv), np.asarray(tbl)
    assert np.all(out[cu[-1]:] == 0.0) and np.all(np.isneginf(lse[:, cu[-1]:]))  # unused rows
    for b in range(len(kv)):
        lo, hi = int(cu[b]), int(cu[b + 1])
        if hi == lo:
            continue
        s = dict(feats)
        if s.get("sinks") is not None:
            s["sinks"] = np.asarray(s["sinks"], np.float64)
        k = oracle.gather_paged_kv(kp, tbl[b], int(kv[b]))[None]
        v = oracle.gather_paged_kv(vp, tbl[b], int(kv[b]))[None]
        ro, rl = oracle.attention_reference(q[None, lo:hi], k, v, causal=True, q_offset=int(kv[b]) - (hi - lo), **s)
        assert np.linalg.norm(out[lo:hi] - ro[0]) <= tol * np.linalg.norm(ro[0]), b
        assert np.allclose(lse[:, lo:hi], rl[0], atol=10 * tol), b


@pytest.mark.parametrize("page", [16, 64])
def test_packed_chunks_and_decodes_match_the_oracle(rng, page):
    ql, kv = [200, 1, 0, 5, 40, 129], [230, 64, 30, 100, 255, 129]  # long / short chunks, decodes, an empty one
    arrs, cast, tbl, kvl, cu = _case(rng, ql, kv, page=page, pps=256 // page)
    out, lse = pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, cu, return_lse=True)
    assert out.shape == arrs[0].shape and out.dtype == arrs[0].dtype and lse.shape == (4, arrs[0].shape[0])
    _check(out, lse, cast, tbl, kvl, cu, 1e-2)
    f = jax.jit(lambda q, k, v, t, kl, c: pallas_attn.paged_attention_varlen(q, k, v, t, kl, c))
    assert np.array_equal(np.asarray(f(*arrs, tbl, kvl, cu), np.float32), np.asarray(out, np.float32))


@pytest.mark.parametrize("dt", [jnp.bfloat16, jnp.float16, jnp.float32])
@pytest.mark.parametrize("tail", [(4, 64), (3, 5), (7,)])
def test_row_copies_as_words_are_the_element_gathers(rng, dt, tail):
    """``chunked._rows`` (session 36): whole rows gathered as 32-bit words where the rows are 16-bit and even (a
    bitcast each way), element by element otherwise; equal bit for bit, NaN payloads and signed zeros included."""
    from pallas_attn import chunked

    x = rng.standard_normal((9,) + tail).astype(np.float32)
    x.reshape(9, -1)[2, 0], x.reshape(9, -1)[4, -1] = np.nan, -0.0
    x = jnp.asarray(x, dt)
    idx = jnp.asarray(rng.integers(0, 9, size=(5, 3)), jnp.int32)
    got = chunked._rows(x, idx)
    assert got.shape == (5, 3) + tail and got.dtype == x.dtype
    bits = np.uint16 if jnp.dtype(dt).itemsize == 2 else np.uint32
    assert np.array_equal(np.asarray(got).view(bits), np.asarray(x[idx]).view(bits))


def test_the_packed_entry_is_the_same_with_and_without_word_copies(rng, monkeypatch):
    """The packed entry with ``chunked.ROW_WORDS`` on and off (only the row copies change: the tiles' Q gather and the
    output's assembly): the outputs bit for bit; the LSE to a few float32 ulp (the interpreter's two programs are
    compiled apart by XLA's CPU backend, whose log / exp code can differ by an ulp between them), with -inf exactly
    where the other has it."""
    from pallas_attn import chunked

    ql, kv = [150, 1, 3, 40], [200, 64, 100, 60]
    arrs, _, tbl, kvl, cu = _case(rng, ql, kv)
    f = jax.jit(lambda q, k, v, t, kl, c: pallas_attn.paged_attention_varlen(q, k, v, t, kl, c, return_lse=True))
    on = f(*arrs, tbl, kvl, cu)
    monkeypatch.setattr(chunked, "ROW_WORDS", False)
    off = jax.jit(lambda q, k, v, t, kl, c: pallas_attn.paged_attention_varlen(q, k, v, t, kl, c,
                                                                               return_lse=True))(*arrs, tbl, kvl, cu)
    assert np.array_equal(np.asarray(on[0], np.float32), np.asarray(off[0], np.float32), equal_nan=True)
    l_on, l_off = np.asarray(on[1]), np.asarray(off[1])
    assert np.array_equal(np.isneginf(l_on), np.isneginf(l_off))
    fin = np.isfinite(l_on)
    np.testing.assert_allclose(l_on[fin], l_off[fin], rtol=4e-7, atol=0)


def test_features_and_the_padded_entry_agree(rng):
    """window + soft-cap + sinks on both paths; the packed call's rows equal the padded entry's (q_lens) rows."""
    ql, kv = [150, 1, 3, 70], [240, 90, 50, 200]
    arrs, cast, tbl, kvl, cu = _case(rng, ql, kv, spare_rows=0)
    sinks = rng.standard_normal(4).astype(np.float32)
    feats = dict(window=37, softcap=4.0)
    out, lse = pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, cu, return_lse=True, sinks=jnp.asarray(sinks),
                                                  **feats)
    _check(out, lse, cast, tbl, kvl, cu, 1e-2, sinks=sinks, **feats)
    tq = max(ql)
    qp = np.zeros((len(ql), tq) + cast[0].shape[1:], np.float32)
    c = np.asarray(cu)
    for b, n in enumerate(ql):
        qp[b, :n] = cast[0][c[b]:c[b + 1]]
    po, pl_ = pallas_attn.paged_attention(jnp.asarray(qp, jnp.bfloat16), *arrs[1:], tbl, kvl, causal=True,
                                          q_lens=jnp.asarray(np.asarray(ql, np.int32)), return_lse=True,
                                          sinks=jnp.asarray(sinks), **feats)
    for b, n in enumerate(ql):
        np.testing.assert_allclose(np.asarray(out[c[b]:c[b + 1]], np.float32), np.asarray(po[b, :n], np.float32),
                                   atol=2e-2)
        np.testing.assert_allclose(np.asarray(lse[:, c[b]:c[b + 1]]), np.asarray(pl_[b, :, :n]), atol=2e-2)


@pytest.mark.parametrize("n", [1, 4])
def test_decode_max_q_sizes_the_decode_part_and_keeps_the_answer(rng, monkeypatch, n):
    """``decode_max_q`` (session 39): sequences of 1 to n queries run on fa_decode's part, sized ``[B, n]`` rows
    (not 16); a sequence of 5 queries then runs in fa_prefill's row tiles. Every row against the oracle, eager and
    under jit (traced ``cu_q_lens``), and the decode part's rows as asked."""
    from pallas_attn import chunked

    seen = []
    real = chunked._decode_part

    def spy(q, *a, **k):
        seen.append(q.shape[1])
        return real(q, *a, **k)

    monkeypatch.setattr(chunked, "_decode_part", spy)
    ql, kv = [150, 1, 5, 3, 1, 40], [200, 64, 100, 33, 250, 60]
    arrs, cast, tbl, kvl, cu = _case(rng, ql, kv)
    out, lse = pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, cu, return_lse=True, decode_max_q=n)
    assert seen == [n]
    _check(out, lse, cast, tbl, kvl, cu, 1e-2)
    f = jax.jit(lambda q, k, v, t, kl, c: pallas_attn.paged_attention_varlen(q, k, v, t, kl, c, return_lse=True,
                                                                             decode_max_q=n))
    jo, jl = f(*arrs, tbl, kvl, cu)
    assert seen == [n, n]
    _check(jo, jl, cast, tbl, kvl, cu, 1e-2)


def test_decode_max_q_refuses_what_fa_decode_cannot_take(rng):
    arrs, _, tbl, kvl, cu = _case(rng, [20, 1], [64, 30], pps=8)
    for bad in (0, 17, True, 2.0, "1"):
        with pytest.raises(ValueError, match="decode_max_q must be a static int"):
            pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, cu, decode_max_q=bad)


def test_bad_lengths_and_tables_raise_eagerly_and_poison_under_jit(rng):
    ql, kv = [40, 1, 20], [64, 30, 100]
    arrs, _, tbl, kvl, cu = _case(rng, ql, kv, pps=8)
    with pytest.raises(ValueError, match="cu_q_lens must start at 0"):
        pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, jnp.asarray(np.asarray([0, 41, 40, 61], np.int32)))
    late = jnp.asarray(np.asarray([24, 29, 95], np.int32))  # sequence 2: 20 queries from 95, past its 100 keys
    with pytest.raises(ValueError, match="sequence 2"):
        pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, cu, q_offset=late)
    bad = np.asarray(tbl).copy()
    bad[1, 0] = 10_000  # the decode's only page
    with pytest.raises(ValueError, match="outside the pool"):
        pallas_attn.paged_attention_varlen(*arrs, jnp.asarray(bad), kvl, cu)
    f = jax.jit(lambda t, o, c: pallas_attn.paged_attention_varlen(*arrs, t, kvl, c, q_offset=o, return_lse=True))
    out, lse = f(jnp.asarray(bad), late, cu)
    out, lse, c = np.asarray(out, np.float32), np.asarray(lse), np.asarray(cu)
    assert np.isfinite(out[:c[1]]).all() and np.isfinite(lse[:, :c[1]]).all()  # sequence 0 untouched
    assert np.isnan(out[c[1]:c[3]]).all() and np.isnan(lse[:, c[1]:c[3]]).all()  # 1: bad table; 2: offset
    # a decreasing cu_q_lens under jit: no row belongs to a sequence for sure, every sequence is poisoned
    out = np.asarray(f(tbl, jnp.asarray(np.asarray([0, 0, 0], np.int32)), jnp.asarray(np.asarray(
        [0, 41, 40, 61], np.int32)))[0], np.float32)
    assert np.isnan(out[:61]).all()


def test_what_is_not_built_refuses_by_name(rng):
    arrs, _, tbl, kvl, cu = _case(rng, [20, 1], [64, 30], pps=8)
    with pytest.raises(ValueError, match="rank 3"):
        pallas_attn.paged_attention_varlen(arrs[0][None], *arrs[1:], tbl, kvl, cu)
    with pytest.raises(ValueError, match="cu_q_lens must be int32"):
        pallas_attn.paged_attention_varlen(*arrs, tbl, kvl, cu[:-1])
    with pytest.raises(NotImplementedError, match="runs fa_prefill"):
        pallas_attn.paged_attention_varlen(*(a.astype(jnp.float32) for a in arrs), tbl, kvl, cu)
    with pytest.raises(NotImplementedError, match="paged_attention_varlen"):
        jax.grad(lambda q: pallas_attn.paged_attention_varlen(q, *arrs[1:], tbl, kvl, cu).astype(
            jnp.float32).sum())(arrs[0])
