"""The float64 oracle's features (window, soft-cap, sinks, packed segments) against loop-by-loop attention written
here, its gradient reference against central finite differences, and the packed document mix."""

from __future__ import annotations

import numpy as np
import pytest

from attn_core import oracle as ref


def _naive(q, k, v, *, scale, causal=False, q_offset=0, window=None, softcap=None, sinks=None, segments=None):
    """One row at a time, one key at a time: the definitions of the oracle's docstring, nothing vectorised."""
    b, tq, hq, _ = q.shape
    tk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    out = np.zeros((b, tq, hq, v.shape[-1]))
    lse = np.full((b, hq, tq), -np.inf)
    for bi in range(b):
        for h in range(hq):
            for i in range(tq):
                logits, vals = [], []
                for j in range(tk):
                    if causal and j > i + q_offset:
                        continue
                    if window is not None and j <= i + q_offset - window:
                        continue
                    if segments is not None and segments[bi, i] != segments[bi, j]:
                        continue
                    s = float(q[bi, i, h] @ k[bi, j, h // g]) * scale
                    if softcap is not None:
                        s = softcap * np.tanh(s / softcap)
                    logits.append(s)
                    vals.append(v[bi, j, h // g])
                if sinks is not None:
                    logits.append(float(sinks[h]))
                    vals.append(np.zeros(v.shape[-1]))
                if not logits:
                    continue
                m = max(logits)
                e = [np.exp(x - m) for x in logits]
                tot = sum(e)
                out[bi, i, h] = sum(ei * vi for ei, vi in zip(e, vals)) / tot
                lse[bi, h, i] = m + np.log(tot)
    return out, lse


CASES = [
    dict(causal=True, window=3),
    dict(causal=True, window=1),  # each query sees only its own key
    dict(causal=True, q_offset=4, window=5),  # a decode-like offset
    dict(softcap=0.7),  # small: the cap bends most scores
    dict(causal=True, softcap=2.0, window=4),
    dict(sinks=True),
    dict(causal=True, sinks=True, window=2),
    dict(causal=True, segments=True),
    dict(causal=True, segments=True, sinks=True, softcap=1.5),
]


def _inputs(rng, *, hq=4, hkv=2, tq=7, tk=7, d=5, b=2):
    q = rng.standard_normal((b, tq, hq, d)) * 1.5
    k = rng.standard_normal((b, tk, hkv, d)) * 1.5
    v = rng.standard_normal((b, tk, hkv, d))
    return q, k, v


def _features(case, rng, b, t, hq):
    kw = {key: val for key, val in case.items() if key not in ("sinks", "segments")}
    if case.get("sinks"):
        kw["sinks"] = rng.standard_normal(hq) + 0.5
    if case.get("segments"):
        lens = [[3, 2, 2], [1, 6]][:b]
        kw["segments"] = np.stack([ref.segment_ids_from_lengths(x) for x in lens])[:, :t]
    return kw


def _oracle_kw(kw):
    kw = dict(kw)
    seg = kw.pop("segments", None)
    if seg is not None:
        kw["q_segments"] = seg
    return kw


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_features_match_naive_loops(rng, case):
    q, k, v = _inputs(rng)
    kw = _features(case, rng, 2, 7, 4)
    out, lse = ref.attention_reference(q, k, v, scale=0.6, **_oracle_kw(kw))
    exp_out, exp_lse = _naive(q, k, v, scale=0.6, **kw)
    np.testing.assert_allclose(out, exp_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, exp_lse, rtol=1e-12, atol=1e-12)
    # the feature changes the answer (the test can fail): plain causal / non-causal attention differs
    plain, _ = ref.attention_reference(q, k, v, scale=0.6, causal=case.get("causal", False),
                                       q_offset=case.get("q_offset", 0))
    assert np.max(np.abs(plain - out)) > 1e-3


def test_window_is_jax_local_window(rng):
    """window=W is jax.nn's local_window_size=(W - 1, 0) with is_causal (jax.nn's XLA path, float32)."""
    import jax
    import jax.numpy as jnp

    q, k, v = _inputs(rng, hq=2, hkv=2, tq=9, tk=9)
    out, _ = ref.attention_reference(q, k, v, causal=True, window=3)
    got = jax.nn.dot_product_attention(*(jnp.asarray(x, jnp.float32) for x in (q, k, v)), is_causal=True,
                                       local_window_size=(2, 0), implementation="xla")
    np.testing.assert_allclose(np.asarray(got), out, atol=2e-6)


def test_fully_masked_rows_and_nan():
    q = np.ones((1, 2, 1, 2))
    k = np.ones((1, 2, 1, 2))
    v = np.ones((1, 2, 1, 2))
    seg_q, seg_k = np.array([[0, 0]]), np.array([[1, 1]])  # no key shares the queries' segment
    out, lse = ref.attention_reference(q, k, v, q_segments=seg_q, kv_segments=seg_k)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    out, lse = ref.attention_reference(q, k, v, q_segments=seg_q, kv_segments=seg_k, sinks=np.array([0.3]))
    assert np.all(out == 0) and np.allclose(lse, 0.3)  # the sink alone holds the denominator
    qn = q.copy()
    qn[0, 1, 0, 0] = np.nan
    out, _ = ref.attention_reference(qn, k, v, causal=True, sinks=np.array([0.3]))
    assert np.all(np.isfinite(out[0, 0])) and np.all(np.isnan(out[0, 1]))  # NaN in -> NaN out, that row only
    g = ref.attention_grad_reference(qn, k, v, np.ones_like(qn), causal=True, sinks=np.array([0.3]))
    assert np.isnan(g["dq"][0, 1]).all() and np.isnan(g["dsinks"]).all()


def test_bad_feature_arguments_are_clear_errors():
    q = np.zeros((1, 3, 2, 4))
    k = np.zeros((1, 3, 1, 4))
    with pytest.raises(ValueError, match="window needs causal"):
        ref.attention_reference(q, k, k, window=2)
    with pytest.raises(ValueError, match="window must be a positive int"):
        ref.attention_reference(q, k, k, causal=True, window=0)
    with pytest.raises(ValueError, match="softcap must be a positive"):
        ref.attention_reference(q, k, k, softcap=-1.0)
    with pytest.raises(ValueError, match=r"sinks must be one logit per query head, shape \(2,\)"):
        ref.attention_reference(q, k, k, sinks=np.zeros(3))
    with pytest.raises(ValueError, match="q_segments must be"):
        ref.attention_reference(q, k, k, q_segments=np.zeros((1, 2), int))
    with pytest.raises(ValueError, match="dout must be"):
        ref.attention_grad_reference(q, k, k, np.zeros((1, 3, 2, 3)))


# ------------------------------------------------------------------------------------------- gradients


def _loss(q, k, v, w, sinks, kw):
    out, _ = ref.attention_reference(q, k, v, sinks=sinks, **kw)
    return float(np.sum(out * w))


def _fd(f, x, h=1e-6):
    """Central differences of scalar ``f`` w.r.t. every element of ``x`` (modified in place, restored)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        x0 = x[idx]
        x[idx] = x0 + h
        fp = f()
        x[idx] = x0 - h
        fm = f()
        x[idx] = x0
        g[idx] = (fp - fm) / (2 * h)
    return g


GRAD_CASES = [
    dict(),
    dict(causal=True),
    dict(causal=True, window=2, softcap=1.2),
    dict(causal=True, q_offset=2, window=3, sinks=True),
    dict(causal=True, segments=True, sinks=True, softcap=0.9),
]


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "plain")
@pytest.mark.parametrize("block_q", [None, 2])
def test_gradient_matches_finite_differences(rng, case, block_q):
    b, hq, hkv, tq, d = 2, 4, 2, 5, 3
    tk = tq + case.get("q_offset", 0)
    q, k, v = _inputs(rng, hq=hq, hkv=hkv, tq=tq, tk=tk, d=d, b=b)
    w = rng.standard_normal((b, tq, hq, d))
    kw = _oracle_kw(_features(case, rng, b, tq, hq))
    if "q_segments" in kw:
        kw["q_segments"] = kw["q_segments"][:, :tq]
    sinks = kw.pop("sinks", None)
    scale = 0.7
    kw["scale"] = scale
    got = ref.attention_grad_reference(q, k, v, w, sinks=sinks, block_q=block_q, **kw)
    out, lse = ref.attention_reference(q, k, v, sinks=sinks, **kw)
    np.testing.assert_allclose(got["out"], out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["lse"], lse, rtol=1e-12, atol=1e-12)
    for name, x in (("dq", q), ("dk", k), ("dv", v)):
        fd = _fd(lambda: _loss(q, k, v, w, sinks, kw), x)
        np.testing.assert_allclose(got[name], fd, rtol=1e-6, atol=1e-7, err_msg=name)
        assert np.max(np.abs(fd)) > 1e-3  # a gradient that is all zero would pass nothing here
    if sinks is None:
        assert got["dsinks"] is None
    else:
        fd = _fd(lambda: _loss(q, k, v, w, sinks, kw), sinks)
        np.testing.assert_allclose(got["dsinks"], fd, rtol=1e-6, atol=1e-7)


def test_gradient_blocks_against_long_rows(rng):
    """Key trimming per query block (causal bound, window) gives the unblocked answer exactly."""
    q, k, v = _inputs(rng, hq=2, hkv=1, tq=40, tk=40, d=4, b=1)
    w = rng.standard_normal(q.shape)
    one = ref.attention_grad_reference(q, k, v, w, causal=True, window=6, block_q=40)
    many = ref.attention_grad_reference(q, k, v, w, causal=True, window=6, block_q=7)
    for name in ("out", "dq", "dk", "dv"):
        np.testing.assert_allclose(many[name], one[name], rtol=1e-12, atol=1e-13)


# ------------------------------------------------------------------------------------------- packing


@pytest.mark.parametrize("total", [1, 5, 16, 100, 4096, 16384])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_packed_doc_lengths_rule(total, seed):
    lens = ref.packed_doc_lengths(total, seed)
    assert sum(lens) == total and all(isinstance(n, int) and n >= 1 for n in lens)
    assert lens == ref.packed_doc_lengths(total, seed)  # deterministic
    if total >= 16:
        assert all(total // 16 <= n <= total // 2 + total // 16 for n in lens)
        assert 2 <= len(lens) <= 16


def test_packed_doc_lengths_mix_and_errors():
    seen = {tuple(ref.packed_doc_lengths(4096, s)) for s in range(8)}
    assert len(seen) > 1  # the seed changes the mix
    assert any(len(set(x)) > 1 for x in seen)  # mixed lengths within a row
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="total must be a positive int"):
            ref.packed_doc_lengths(bad, 0)
    with pytest.raises(ValueError, match="seed"):
        ref.packed_doc_lengths(8, -1)
    np.testing.assert_array_equal(ref.segment_ids_from_lengths([2, 1, 3]), [0, 0, 1, 2, 2, 2])
    with pytest.raises(ValueError):
        ref.segment_ids_from_lengths([2, 0])
