"""fa_decode on the GPU (Triton lowering, compiled) at realistic sizes, against the float64 oracle.

The oracle runs on the host in float64, so each test checks a subset of batch rows and KV heads (edges
included: first and last) of a full-size launch; the kernel itself always runs on the whole problem.
Outputs are checked element by element (rel. L2 and max-abs against the oracle, finiteness), so an
unwritten element fails. Budget: about two minutes on an H100/H200 (``-m gpu``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import oracle as reference  # noqa: E402
from pallas_attn.kernels import fa_decode as fd  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {"float16": 1e-2, "bfloat16": 2e-2}


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


def _inputs(seed, b, tq, hq, hkv, d, s, dtype):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    dt = jnp.dtype(dtype)
    return _rand(kq, (b, tq, hq, d), dt), _rand(kk, (b, s, hkv, d), dt), _rand(kv, (b, s, hkv, d), dt)


def _subset_check(out, q, k, v, *, rows, kv_heads, dtype, kv_lens=None, causal=False, q_offset=0):
    """Oracle on batch rows ``rows`` and KV heads ``kv_heads`` (with their G query heads each)."""
    hq, hkv = q.shape[2], k.shape[2]
    g = hq // hkv
    qh = np.concatenate([np.arange(h * g, (h + 1) * g) for h in kv_heads])
    out = np.asarray(jnp.asarray(out, jnp.float32))
    assert np.all(np.isfinite(out)), "non-finite output"
    for b in rows:
        n = k.shape[1] if kv_lens is None else int(kv_lens[b])
        qo = q_offset if kv_lens is None else n - q.shape[1]
        qs = np.asarray(q[b : b + 1][:, :, qh].astype(jnp.float32))
        ks = np.asarray(k[b : b + 1, :n][:, :, kv_heads].astype(jnp.float32))
        vs = np.asarray(v[b : b + 1, :n][:, :, kv_heads].astype(jnp.float32))
        ref, _ = reference.attention_reference(qs, ks, vs, causal=causal, q_offset=qo)
        got = out[b : b + 1][:, :, qh].astype(np.float64)
        rel = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
        assert rel < TOL[dtype], (b, rel)
        assert np.max(np.abs(got - ref)) < 0.05, (b, np.max(np.abs(got - ref)))


def _paged(k, v, page, seed=0):
    """Device-side paging with a shuffled table: same layout as attn_core.paging.build_paged_kv."""
    b, s, hkv, d = k.shape
    p = -(-s // page)
    pad = p * page - s
    perm = np.random.default_rng(seed).permutation(b * p)
    inv = np.argsort(perm)

    def pool(x):
        x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b * p, page, hkv, d)
        return x[jnp.asarray(inv)]

    return pool(k), pool(v), jnp.asarray(perm.reshape(b, p).astype(np.int32))


# -------------------------------------------------------------------------------------------------- dense


@pytest.mark.parametrize("s", [8192, 8190])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dense_target_family(s, dtype):
    q, k, v = _inputs(1, 4, 1, 32, 8, 128, s, dtype)
    out = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, generation="fa_decode"))(q, k, v)
    _subset_check(out, q, k, v, rows=[0, 3], kv_heads=[0, 7], dtype=dtype)


def test_dense_long_context_b1():
    q, k, v = _inputs(2, 1, 1, 32, 8, 128, 131072, "float16")
    out = pallas_attn.attention(q, k, v, generation="fa_decode")
    assert fd.plan(batch=1, hkv=8, rows=4, d=128, max_kv=131072, config=fd.CONFIGS["default"]).splits > 1
    _subset_check(out, q, k, v, rows=[0], kv_heads=[0, 7], dtype="float16")


@pytest.mark.parametrize("g, d, dtype", [(1, 128, "float16"), (2, 64, "bfloat16"), (8, 256, "float16"),
                                         (16, 128, "bfloat16"), (16, 256, "bfloat16"),
                                         (1, 96, "bfloat16"), (4, 96, "float16")])  # D 96: session 16
def test_dense_gqa_and_head_dims(g, d, dtype):
    hkv = 4
    q, k, v = _inputs(3, 2, 1, g * hkv, hkv, d, 3001, dtype)
    out = pallas_attn.attention(q, k, v, generation="fa_decode")
    _subset_check(out, q, k, v, rows=[0, 1], kv_heads=[0, hkv - 1], dtype=dtype)


def test_default_mha_decode_runs_fa_decode_and_differentiates():
    """``attention(generation=None)`` on an MHA decode shape (GPT-2's 12 heads of 64) runs fa_decode (session 16; it had
    gone to fa_train) and ``jax.grad`` through it takes fa_train's backward: the value against the oracle, the
    gradients against jax.nn's XLA attention's."""
    q, k, v = _inputs(11, 2, 1, 12, 12, 64, 1024, "bfloat16")
    off = 1023
    f = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, causal=True, q_offset=off))
    assert "pallas_attn_fa_decode_partial" in f.lower(q, k, v).as_text()
    _subset_check(f(q, k, v), q, k, v, rows=[0, 1], kv_heads=[0, 11], dtype="bfloat16", causal=True, q_offset=off)
    w = jax.random.normal(jax.random.PRNGKey(3), q.shape, jnp.float32)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    ours = jax.jit(jax.grad(loss(lambda q, k, v: pallas_attn.attention(q, k, v, causal=True, q_offset=off)),
                            argnums=(0, 1, 2)))(q, k, v)
    # decode: the one query row sees every key, so jax.nn's non-causal attention is the same problem
    ref = jax.jit(jax.grad(loss(lambda q, k, v: jax.nn.dot_product_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), implementation="xla")),
        argnums=(0, 1, 2)))(q, k, v)
    for g, r in zip(ours, ref):
        g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
        assert np.linalg.norm(g - r) / np.linalg.norm(r) < 2e-2


@pytest.mark.parametrize("tq, q_offset", [(4, 2044), (16, 2032), (4, 100)])
def test_dense_causal_multi_query(tq, q_offset):
    q, k, v = _inputs(4, 2, tq, 16, 4, 128, 2048, "float16")
    out = pallas_attn.attention(q, k, v, causal=True, q_offset=q_offset, generation="fa_decode")
    _subset_check(out, q, k, v, rows=[1], kv_heads=[0, 3], dtype="float16", causal=True, q_offset=q_offset)


@pytest.mark.parametrize("cfg", [fd.DecodeConfig(splits=1), fd.DecodeConfig(splits=7, block_k=128),
                                 fd.DecodeConfig(block_k=32, num_warps=8, num_stages=4),
                                 fd.DecodeConfig(block_k=128, num_warps=8, num_stages=2)])
def test_dense_configs_compile_and_agree(cfg):
    q, k, v = _inputs(5, 3, 1, 32, 8, 128, 4099, "float16")
    out = pallas_attn.attention(q, k, v, generation="fa_decode", config=cfg)
    _subset_check(out, q, k, v, rows=[0, 2], kv_heads=[0, 7], dtype="float16")


@pytest.mark.parametrize("name", [n for n in fd.CONFIGS if n.startswith("spec_")] + ["waves", "default"])
def test_spec_configs_at_a_speculative_shape(name):
    """The session-23 speculative-decode candidates, ``waves`` and the default (Tq 8, GQA 8:1, causal at the end of
    the cache; B 16 x Hkv 8 = 128 programs: the default and ``spec_split1`` run one split here, ``waves`` two) agree
    with the oracle."""
    q, k, v = _inputs(6, 16, 8, 64, 8, 128, 4096, "bfloat16")
    out = pallas_attn.attention(q, k, v, causal=True, q_offset=4096 - 8, generation="fa_decode", config=name)
    _subset_check(out, q, k, v, rows=[0, 15], kv_heads=[0, 7], dtype="bfloat16", causal=True, q_offset=4096 - 8)


# -------------------------------------------------------------------------------------------------- paged


@pytest.mark.parametrize("b, tq, hq, bm, stages", [(128, 1, 32, 16, 4), (64, 8, 32, 32, 4), (64, 8, 64, 64, 3)])
def test_spec_st4_stage_fit_launches(b, tq, hq, bm, stages):
    """``fit_stages`` / ``stage_buffers`` (sessions 36-37): `spec_st4` where B x Hkv fills the SMs (the tile doubled to
    128 keys) keeps 4 stages at block_m 16 / 32 (3 buffers on the mma.sync path) and is lowered to 3 at block_m 64 (4
    buffers on wgmma: 278,528 bytes, refused at launch before session 36); each launches and agrees."""
    from pallas_attn import _compat

    s = 1024
    p = fd.plan(batch=b, hkv=8, rows=(hq // 8) * tq, d=128, max_kv=s, config=fd.CONFIGS["spec_st4"],
                sm_count=_compat.device_sm_count())
    assert (p.block_m, p.block_k, p.num_stages) == (bm, 128, stages), p
    q, k, v = _inputs(13, b, tq, hq, 8, 128, s, "bfloat16")
    off = s - tq if tq > 1 else 0
    out = pallas_attn.attention(q, k, v, causal=tq > 1, q_offset=off, generation="fa_decode", config="spec_st4")
    _subset_check(out, q, k, v, rows=[0, b - 1], kv_heads=[0, 7], dtype="bfloat16", causal=tq > 1, q_offset=off)


@pytest.mark.parametrize("page", [8, 16, 32, 64, 128, 256])
def test_paged_ragged_shuffled(page):
    lens = np.array([8192, 8190, 1, 4097], np.int32)
    q, k, v = _inputs(6, 4, 1, 32, 8, 128, 8192, "float16")
    kp, vp, bt = _paged(k, v, page, seed=page)
    f = jax.jit(lambda *a: pallas_attn.paged_attention(*a))
    out = f(q, kp, vp, bt, jnp.asarray(lens))
    _subset_check(out, q, k, v, rows=[0, 1, 2, 3], kv_heads=[0, 7], dtype="float16", kv_lens=lens)


@pytest.mark.parametrize("page", [16, 64])
def test_paged_head_dim_96_mha(page):
    """Phi-3-mini's decode shape (32 heads of 96, MHA) through the default paged entry: 128-column tiles, the 32
    columns past 96 masked (session 16)."""
    lens = np.array([4099, 17], np.int32)
    q, k, v = _inputs(9, 2, 1, 32, 32, 96, 4099, "bfloat16")
    kp, vp, bt = _paged(k, v, page)
    out = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=True)
    _subset_check(out, q, k, v, rows=[0, 1], kv_heads=[0, 31], dtype="bfloat16", kv_lens=lens, causal=True)


@pytest.mark.parametrize("page, dtype", [(16, "bfloat16"), (256, "float16")])
def test_paged_causal_tq4(page, dtype):
    lens = np.array([5000, 3, 2048], np.int32)
    q, k, v = _inputs(7, 3, 4, 32, 8, 128, 5000, dtype)
    kp, vp, bt = _paged(k, v, page)
    out = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), causal=True)
    _subset_check(out, q, k, v, rows=[0, 1, 2], kv_heads=[0, 7], dtype=dtype, kv_lens=lens, causal=True)


@pytest.mark.parametrize("cfg", [fd.DecodeConfig(block_k=16), fd.DecodeConfig(block_k=128, num_stages=3),
                                 fd.DecodeConfig(splits=5, num_stages=4)])
def test_paged_configs_compile_and_agree(cfg):
    lens = np.array([4099, 777], np.int32)
    q, k, v = _inputs(8, 2, 1, 32, 8, 128, 4099, "float16")
    kp, vp, bt = _paged(k, v, 16)
    out = pallas_attn.paged_attention(q, kp, vp, bt, jnp.asarray(lens), config=cfg)
    _subset_check(out, q, k, v, rows=[0, 1], kv_heads=[0, 7], dtype="float16", kv_lens=lens)


@pytest.mark.parametrize("kv", ["float16", "nvfp4"])
def test_paged_bad_table_on_gpu(kv):
    """A bad page index raises eagerly and, under jit, poisons only its sequence (page 16: the gathered tiles, whose
    flags the kernel ORs over its loop and reduces once since session 19; NVFP4 pools too)."""
    from pallas_attn import quant

    lens = np.array([300, 300], np.int32)
    q, k, v = _inputs(9, 2, 1, 8, 2, 64, 300, "float16")
    kp, vp, bt = _paged(k, v, 16)
    if kv == "nvfp4":
        kp, vp = quant.quantize_nvfp4(kp.astype(jnp.float32)), quant.quantize_nvfp4(vp.astype(jnp.float32))
    bad = np.asarray(bt).copy()
    bad[0, 3] = jax.tree_util.tree_leaves(kp)[0].shape[0] + 100
    with pytest.raises(ValueError, match="block_table"):
        pallas_attn.paged_attention(q, kp, vp, jnp.asarray(bad), jnp.asarray(lens))
    out = jax.jit(lambda *a: pallas_attn.paged_attention(*a))(q, kp, vp, jnp.asarray(bad), jnp.asarray(lens))
    out = np.asarray(out, np.float32)
    assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1]))


# ------------------------------------------------------------------------------------ argument model, LSE


@pytest.mark.parametrize("splits", [1, 6])
def test_lse_and_traced_per_sequence_offsets(splits):
    """return_lse from the partial kernel (one split) and from the shared merge (several); per-sequence
    q_offset passed as data under one jit."""
    b, tq, hq, hkv, d, s = 3, 4, 16, 4, 128, 3000
    q, k, v = _inputs(11, b, tq, hq, hkv, d, s, "float16")
    cfg = fd.DecodeConfig(splits=splits)
    f = jax.jit(lambda q, k, v, off: pallas_attn.attention(q, k, v, causal=True, q_offset=off, generation="fa_decode",
                                                           config=cfg, return_lse=True))
    offs = np.array([2996, 40, 1500], np.int32)
    out, lse = f(q, k, v, jnp.asarray(offs))
    out, lse = np.asarray(jnp.asarray(out, jnp.float32)), np.asarray(lse)
    for bi in range(b):
        ref, ref_lse = reference.attention_reference(np.asarray(q[bi:bi + 1], np.float32),
                                                     np.asarray(k[bi:bi + 1], np.float32),
                                                     np.asarray(v[bi:bi + 1], np.float32), causal=True,
                                                     q_offset=int(offs[bi]))
        assert np.linalg.norm(out[bi:bi + 1] - ref) / np.linalg.norm(ref) < TOL["float16"]
        np.testing.assert_allclose(lse[bi:bi + 1], ref_lse, atol=2e-2, rtol=0)
