"""The float64 oracle: definitions, conventions, edge cases (it is what every kernel is judged by)."""

import numpy as np
import pytest

from attn_core import oracle as ref


def _naive(q, k, v, *, causal=False, scale=None, q_offset=0):
    """Loop-by-loop attention, independent of the vectorised oracle."""
    b, tq, hq, d = q.shape
    _, tk, hkv, _ = k.shape
    g = hq // hkv
    scale = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros((b, tq, hq, v.shape[-1]))
    for bi in range(b):
        for h in range(hq):
            for i in range(tq):
                s = np.array([q[bi, i, h] @ k[bi, j, h // g] * scale for j in range(tk)])
                vis = np.array([(not causal) or j <= i + q_offset for j in range(tk)])
                if not vis.any():
                    continue
                s = np.where(vis, s, -np.inf)
                p = np.exp(s - s.max())
                p /= p.sum()
                out[bi, i, h] = p @ v[bi, :, h // g]
    return out


@pytest.mark.parametrize("causal,q_offset", [(False, 0), (True, 0), (True, 5)])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (6, 2), (3, 1)])
def test_matches_naive_loops(rng, causal, q_offset, hq, hkv):
    q = rng.standard_normal((2, 5, hq, 8))
    k = rng.standard_normal((2, 9, hkv, 8))
    v = rng.standard_normal((2, 9, hkv, 8))
    out, lse = ref.attention_reference(q, k, v, causal=causal, q_offset=q_offset, scale=0.3)
    expect = _naive(q, k, v, causal=causal, q_offset=q_offset, scale=0.3)
    np.testing.assert_allclose(out, expect, rtol=1e-12, atol=1e-12)
    assert lse.shape == (2, hq, 5) and np.all(np.isfinite(lse))


def test_gqa_is_repeat_interleave_not_tile(rng):
    """Query head h reads KV head h // G; a tiled expansion would be a silently wrong oracle."""
    q = rng.standard_normal((1, 3, 4, 8))
    k = rng.standard_normal((1, 6, 2, 8))
    v = rng.standard_normal((1, 6, 2, 8))
    out, _ = ref.attention_reference(q, k, v)
    for h in range(4):
        o1, _ = ref.attention_reference(q[:, :, h : h + 1], k[:, :, h // 2 : h // 2 + 1], v[:, :, h // 2 : h // 2 + 1])
        np.testing.assert_allclose(out[:, :, h : h + 1], o1, rtol=1e-13)


def test_fully_masked_row_is_zero_not_nan(rng):
    q = rng.standard_normal((1, 4, 1, 8))
    k = rng.standard_normal((1, 4, 1, 8))
    out, lse = ref.attention_reference(q, k, k, kv_len=0)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    out, lse = ref.attention_reference(q, k[:, :0], k[:, :0])  # an empty cache
    assert out.shape == q.shape and np.all(out == 0) and np.all(np.isneginf(lse))


def test_ragged_kv_len_and_per_sequence_offset(rng):
    q = rng.standard_normal((2, 2, 2, 8))
    k = rng.standard_normal((2, 10, 2, 8))
    v = rng.standard_normal((2, 10, 2, 8))
    out, _ = ref.attention_reference(q, k, v, causal=True, kv_len=np.array([4, 10]), q_offset=np.array([2, 8]))
    o0, _ = ref.attention_reference(q[:1], k[:1, :4], v[:1, :4], causal=True, q_offset=2)
    o1, _ = ref.attention_reference(q[1:], k[1:], v[1:], causal=True, q_offset=8)
    np.testing.assert_allclose(out, np.concatenate([o0, o1]), rtol=1e-13)


def test_lse_definition_and_softmax_stability(rng):
    q = rng.standard_normal((1, 3, 1, 16)) * 40  # scores in the thousands: a naive exp overflows
    k = rng.standard_normal((1, 7, 1, 16)) * 40
    v = rng.standard_normal((1, 7, 1, 16))
    out, lse = ref.attention_reference(q, k, v)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
    m = s.max(-1)
    np.testing.assert_allclose(lse, m + np.log(np.exp(s - m[..., None]).sum(-1)), rtol=1e-12)


def test_lse_merge_reproduces_full_attention(rng):
    """Split keys into chunks, attend to each, merge by LSE: the exact identity behind split-KV."""
    q = rng.standard_normal((1, 2, 2, 8))
    k = rng.standard_normal((1, 30, 2, 8))
    v = rng.standard_normal((1, 30, 2, 8))
    full, full_lse = ref.attention_reference(q, k, v)
    parts, lses = [], []
    for lo, hi in [(0, 7), (7, 7), (7, 30)]:  # the middle split is empty
        o, lse = ref.attention_reference(q, k[:, lo:hi], v[:, lo:hi]) if hi > lo else (
            np.zeros_like(full), np.full(full_lse.shape, -np.inf))
        parts.append(o)
        lses.append(np.moveaxis(lse, 1, 2))  # [B, Tq, H] like the output
    merged, mlse = ref.lse_merge_reference(np.stack(parts), np.stack(lses))
    np.testing.assert_allclose(merged, full, rtol=1e-12)
    np.testing.assert_allclose(mlse, np.moveaxis(full_lse, 1, 2), rtol=1e-12)


def test_paged_oracle_equals_dense(rng):
    b, tk, hkv, d, page = 3, 37, 2, 8, 8
    k = rng.standard_normal((b, tk, hkv, d))
    v = rng.standard_normal((b, tk, hkv, d))
    q = rng.standard_normal((b, 2, 4, d))
    n_pages = -(-tk // page)
    perm = rng.permutation(b * n_pages)
    pool_k = np.zeros((b * n_pages, page, hkv, d))
    pool_v = np.zeros_like(pool_k)
    pad = n_pages * page - tk
    kp = np.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b * n_pages, page, hkv, d)
    vp = np.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b * n_pages, page, hkv, d)
    pool_k[perm] = kp
    pool_v[perm] = vp
    table = perm.reshape(b, n_pages).astype(np.int32)
    lens = np.array([37, 1, 20], dtype=np.int32)
    out, _ = ref.paged_attention_reference(q, pool_k, pool_v, table, lens, causal=True)
    for i in range(b):
        o, _ = ref.attention_reference(q[i : i + 1], k[i : i + 1, : lens[i]], v[i : i + 1, : lens[i]],
                                       causal=True, q_offset=int(lens[i]) - 2)
        np.testing.assert_allclose(out[i : i + 1], o, rtol=1e-13)
    bad = table.copy()
    bad[0, 0] = b * n_pages
    with pytest.raises(ValueError, match="block_table"):
        ref.paged_attention_reference(q, pool_k, pool_v, bad, lens)


def test_accepts_jax_low_precision(rng):
    jnp = pytest.importorskip("jax.numpy")
    q = jnp.asarray(rng.standard_normal((1, 2, 1, 8)), dtype=jnp.bfloat16)
    out, _ = ref.attention_reference(q, q, q)
    assert out.dtype == np.float64


def test_bad_shapes_are_value_errors(rng):
    q = rng.standard_normal((1, 2, 3, 8))
    with pytest.raises(ValueError, match="multiple"):
        ref.attention_reference(q, q[:, :, :2], q[:, :, :2])
    with pytest.raises(ValueError, match="rank 4"):
        ref.attention_reference(q[0], q, q)


def test_a_kv_head_serves_its_query_heads_without_a_copy_per_head(rng):
    """Session 28: each KV head broadcasts over its G query heads (``_by_kv_head``) instead of being repeated G times.
    The values are bit-identical to running the same problem with K/V expanded to every query head by hand, forward
    and gradients; and an MLA-shaped problem (64 query heads over one 256-wide latent of 4096 keys) allocates far
    less than the 2 x 537 MB the repeat of K and V would (tracemalloc, which sees numpy's allocations)."""
    import tracemalloc

    q = rng.standard_normal((2, 5, 8, 32))
    k = rng.standard_normal((2, 9, 2, 32))
    v = rng.standard_normal((2, 9, 2, 24))
    do = rng.standard_normal((2, 5, 8, 24))
    k_all, v_all = np.repeat(k, 4, axis=2), np.repeat(v, 4, axis=2)  # query head h reads KV head h // 4
    for kw in ({}, {"causal": True, "q_offset": 4}, {"softcap": 5.0, "sinks": rng.standard_normal(8)}):
        out, lse = ref.attention_reference(q, k, v, **kw)
        out_all, lse_all = ref.attention_reference(q, k_all, v_all, **kw)
        np.testing.assert_array_equal(out, out_all)
        np.testing.assert_array_equal(lse, lse_all)
        g, g_all = ref.attention_grad_reference(q, k, v, do, **kw), ref.attention_grad_reference(q, k_all, v_all, do,
                                                                                                   **kw)
        np.testing.assert_array_equal(g["dq"], g_all["dq"])
        np.testing.assert_array_equal(g["dk"], g_all["dk"].reshape(2, 9, 2, 4, 32).sum(axis=3))
        np.testing.assert_array_equal(g["dv"], g_all["dv"].reshape(2, 9, 2, 4, 24).sum(axis=3))
    q = rng.standard_normal((1, 1, 64, 256))
    lat = rng.standard_normal((1, 4096, 1, 256))
    tracemalloc.start()
    try:
        ref.attention_reference(q, lat, lat)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak
