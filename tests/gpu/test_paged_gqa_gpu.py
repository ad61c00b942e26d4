"""v7_paged and the v8 family on the GPU (Triton lowering, compiled) at realistic sizes, against the float64
oracle on a subset of batch rows and KV heads (edges included) of a full-size launch.

Every generation and every named config of its registry row compiles and agrees; the G-sweep shapes
(B 1, Hq 32, N_k 8192, G 1-32, D 64 / 128), page sizes 8-256 with ragged lengths that are not page
multiples and a shuffled table, causal with per-sequence offsets and Tq > 1, the reference's unaligned
``choose_splits`` chunks, and a bad table (eager error; NaN for that sequence only under jit). Budget:
about two to three minutes on an H100 (``-m gpu``; most of it Triton compiles).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import oracle as reference  # noqa: E402
from pallas_attn import registry  # noqa: E402

pytestmark = pytest.mark.gpu

FAMILY = ("v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")
TOL = 1e-2


def _inputs(seed, b, tq, hq, hkv, d, s):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    f = lambda key, shape: jax.random.normal(key, shape, jnp.float32).astype(jnp.float16)  # noqa: E731
    return f(kq, (b, tq, hq, d)), f(kk, (b, s, hkv, d)), f(kv, (b, s, hkv, d))


def _paged(k, v, page, seed=0, spare=5):
    """Device-side paging with a shuffled table and ``spare`` unused pages (same layout as
    attn_core.paging.build_paged_kv)."""
    b, s, hkv, d = k.shape
    p = -(-s // page)
    pad = p * page - s
    n = b * p + spare
    perm = np.random.default_rng(seed).permutation(n)[: b * p]
    slots = np.full(n, -1)
    slots[perm] = np.arange(b * p)

    def pool(x):
        x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b * p, page, hkv, d)
        x = jnp.concatenate([x, jnp.full((spare, page, hkv, d), jnp.nan, x.dtype)])  # spare pages: NaN
        order = np.where(slots >= 0, slots, b * p + np.arange(n) % spare)
        return x[jnp.asarray(order)]

    return pool(k), pool(v), jnp.asarray(perm.reshape(b, p).astype(np.int32))


def _subset_check(out, q, k, v, *, rows, kv_heads, kv_lens, causal=False, q_offset=None):
    hq, hkv = q.shape[2], k.shape[2]
    g = hq // hkv
    qh = np.concatenate([np.arange(h * g, (h + 1) * g) for h in kv_heads])
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "non-finite output (a spare NaN page read, or an unwritten element)"
    for b in rows:
        n = int(kv_lens[b])
        qo = n - q.shape[1] if q_offset is None else int(q_offset[b])
        qs = np.asarray(q[b : b + 1][:, :, qh].astype(jnp.float32))
        ks = np.asarray(k[b : b + 1, :n][:, :, kv_heads].astype(jnp.float32))
        vs = np.asarray(v[b : b + 1, :n][:, :, kv_heads].astype(jnp.float32))
        ref, _ = reference.attention_reference(qs, ks, vs, causal=causal, q_offset=qo)
        got = out[b : b + 1][:, :, qh].astype(np.float64)
        rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
        assert rel < TOL, (b, rel)


def _cases():
    out = []
    for gen in FAMILY:
        for cfg in registry.configs(gen):
            out.append(pytest.param(gen, cfg, id=f"{gen}-{cfg}"))
    return out


@pytest.mark.parametrize(("gen", "config"), _cases())
def test_every_config_at_a_serving_shape(gen, config):
    """B 4, N_k 8192 ragged (8192, 8190, 1, 4097), page 16, shuffled with NaN spare pages, D 128."""
    hkv = 8
    hq = hkv if gen == "v7_paged" else 32
    lens = np.array([8192, 8190, 1, 4097], np.int32)
    q, k, v = _inputs(1, 4, 1, hq, hkv, 128, 8192)
    kp, vp, bt = _paged(k, v, 16, seed=3)
    f = jax.jit(lambda *a: pallas_attn.paged_attention(*a, generation=gen, config=config))
    out = f(q, kp, vp, bt, jnp.asarray(lens))
    _subset_check(out, q, k, v, rows=[0, 1, 2, 3], kv_heads=[0, hkv - 1], kv_lens=lens)


@pytest.mark.parametrize("gen", ["v8_gqa", "v8_gqa_tc", "v8_gqa_ss"])
@pytest.mark.parametrize("g, d", [(1, 128), (2, 64), (4, 128), (8, 64), (16, 128), (32, 128)])
def test_g_sweep(gen, g, d):
    """The reference's G-sweep shape: B 1, Hq 32, N_k 8192, page 256 (choose_splits' chunk straddles pages)."""
    hq = 32
    hkv = hq // g
    q, k, v = _inputs(2, 1, 1, hq, hkv, d, 8192)
    kp, vp, bt = _paged(k, v, 256, seed=g)
    lens = np.array([8192], np.int32)
    out = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), generation=gen)
    _subset_check(out, q, k, v, rows=[0], kv_heads=sorted({0, hkv - 1}), kv_lens=lens)


@pytest.mark.parametrize("page", [8, 32, 64, 128, 256])
def test_page_sizes_ragged(page):
    lens = np.array([5001, 3, 4096], np.int32)
    q, k, v = _inputs(3, 3, 1, 16, 4, 64, 5001)
    kp, vp, bt = _paged(k, v, page, seed=page)
    for gen in ("v8_gqa", "v8_gqa_ss"):
        out = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), generation=gen)
        _subset_check(out, q, k, v, rows=[0, 1, 2], kv_heads=[0, 3], kv_lens=lens)


@pytest.mark.parametrize("gen", ["v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_ss"])
def test_causal_tq4_per_sequence_offsets_and_lse(gen):
    lens = np.array([3000, 40, 2048], np.int32)
    offs = np.array([2996, 10, 1000], np.int32)
    hq, hkv = (8, 8) if gen == "v7_paged" else (32, 8)
    q, k, v = _inputs(4, 3, 4, hq, hkv, 128, 3000)
    kp, vp, bt = _paged(k, v, 64)
    f = jax.jit(lambda *a, off: pallas_attn.paged_attention(*a, causal=True, q_offset=off, generation=gen,
                                                            return_lse=True))
    out, lse = f(q, kp, vp, bt, jnp.asarray(lens), off=jnp.asarray(offs))
    _subset_check(out, q, k, v, rows=[0, 1, 2], kv_heads=[0, hkv - 1], kv_lens=lens, causal=True, q_offset=offs)
    lse = np.asarray(lse)
    for b in range(3):
        n = int(lens[b])
        _, ref_lse = reference.attention_reference(np.asarray(q[b:b + 1], np.float32),
                                                   np.asarray(k[b:b + 1, :n], np.float32),
                                                   np.asarray(v[b:b + 1, :n], np.float32), causal=True,
                                                   q_offset=int(offs[b]))
        fin = np.isfinite(ref_lse)
        assert np.array_equal(np.isneginf(lse[b:b + 1]), np.isneginf(ref_lse))
        np.testing.assert_allclose(lse[b:b + 1][fin], ref_lse[fin], atol=2e-2, rtol=0)


def test_bad_table_on_gpu():
    lens = np.array([300, 300], np.int32)
    q, k, v = _inputs(9, 2, 1, 8, 2, 64, 300)
    kp, vp, bt = _paged(k, v, 16)
    bad = np.asarray(bt).copy()
    bad[0, 3] = kp.shape[0] + 100
    for gen in ("v8_gqa", "v8_gqa_tc", "v8_gqa_ss"):
        with pytest.raises(ValueError, match="block_table"):
            pallas_attn.paged_attention(q, kp, vp, jnp.asarray(bad), jnp.asarray(lens), generation=gen)
        f = jax.jit(lambda *a, g=gen: pallas_attn.paged_attention(*a, generation=g))
        out = np.asarray(f(q, kp, vp, jnp.asarray(bad), jnp.asarray(lens)), np.float32)
        assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1])), gen
