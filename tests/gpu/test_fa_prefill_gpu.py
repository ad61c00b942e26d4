"""fa_prefill's Mosaic GPU kernel on an H100/H200, against the float64 oracle.

Every named config (pipelined, serial, ping-pong) x causal or not x fp16/bf16 x D 64/128/256 on shapes that
exercise the edges: GQA, Tq != Tk, ragged lengths (not multiples of the tiles), per-sequence and negative
causal offsets (rows that see no key: zero output, LSE -inf), LSE on and off, NaN in a row. The oracle
runs on the host in float64, so shapes stay small; the kernel is the compiled one (``interpret=False``).
Budget: about a minute (``-m gpu``).
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from attn_core import oracle  # noqa: E402
from pallas_attn.kernels import fa_prefill as fp  # noqa: E402

pytestmark = pytest.mark.gpu

TOL = {"float16": 4e-3, "bfloat16": 2e-2}

# b, tq, tk, hq, hkv, causal, offsets
_SHAPES = [
    (2, 256, 256, 4, 4, False, (0, 0)),
    (2, 256, 256, 4, 4, True, (0, 0)),
    (2, 200, 333, 4, 2, True, (133, 40)),
    (1, 130, 517, 8, 2, False, (0,)),
    (2, 64, 300, 4, 1, True, (-20, 250)),
]


def _rand(key, shape, dtype):
    return jax.random.normal(key, shape, jnp.float32).astype(dtype)


# three consumer warpgroups (192 rows a CTA, four warpgroups share the registers): "c3" is named (fp.CONFIGS, which
# _cfg reads first); its multi-tile and serial variants are tested here
_EXTRA = {"c3tiles3": fp.PrefillConfig(consumers=3, consumer_regs=160, producer_regs=32, tiles=3),
          "c3serial": fp.PrefillConfig(consumers=3, consumer_regs=160, producer_regs=32, overlap=False)}


def _cfg(name, d):
    # the named config object: at D 256 fa_prefill.fit gives it 64-key tiles and two stages inside the kernel
    return fp.CONFIGS[name] if name in fp.CONFIGS else _EXTRA[name]


# every config on fp16 D 64/128/256; the heuristic's configs also on bf16
_MATRIX = [("default", dt, d) for dt in ("float16", "bfloat16") for d in (64, 128, 256)]
_MATRIX += [("serial", dt, d) for dt in ("float16", "bfloat16") for d in (64, 128)] + [("serial", "float16", 256)]
_MATRIX += [("pingpong", "float16", d) for d in (64, 128, 256)]
# several row tiles per CTA (cfg.tiles; the ring counts blocks across a CTA's tiles)
_MATRIX += [("tiles2", "float16", 128), ("tiles4", "bfloat16", 64), ("tiles8", "bfloat16", 128),
            ("tiles4", "float16", 256)]
# three consumers (the rows of a tile are 192: every shape above leaves a partial tile)
_MATRIX += [("c3", "bfloat16", 64), ("c3", "float16", 128), ("c3tiles3", "bfloat16", 64), ("c3serial", "float16", 64)]
# D 96 (Phi-3): 96-column tiles with a 64-byte swizzle (three 32-column atoms a row), every schedule
_MATRIX += [("default", "bfloat16", 96), ("default", "float16", 96), ("serial", "bfloat16", 96),
            ("pingpong", "float16", 96), ("tiles4", "bfloat16", 96), ("c3", "bfloat16", 96)]


@pytest.mark.parametrize("cfg,dtype,d", _MATRIX)
def test_matches_oracle(cfg, dtype, d):
    key = jax.random.PRNGKey(d)
    for i, (b, tq, tk, hq, hkv, causal, offs) in enumerate(_SHAPES):
        kq, kk, kv = jax.random.split(jax.random.fold_in(key, i), 3)
        q, k, v = _rand(kq, (b, tq, hq, d), dtype), _rand(kk, (b, tk, hkv, d), dtype), _rand(kv, (b, tk, hkv, d), dtype)
        off = jnp.asarray(offs, jnp.int32)
        o, lse = pallas_attn.attention(q, k, v, causal=causal, q_offset=off, generation="fa_prefill",
                                       config=_cfg(cfg, d), interpret=False, return_lse=True)
        ro, rl = oracle.attention_reference(q, k, v, causal=causal, q_offset=np.asarray(offs))
        o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
        tag = (cfg, dtype, d, b, tq, tk, hq, hkv, causal, offs)
        assert o.dtype == q.dtype and np.all(np.isfinite(o64)), tag
        assert np.linalg.norm(o64 - ro) / np.linalg.norm(ro) < TOL[dtype], tag
        if i == 2:  # LSE on or off: the same output
            o_only = pallas_attn.attention(q, k, v, causal=causal, q_offset=off, generation="fa_prefill",
                                           config=_cfg(cfg, d), interpret=False)
            np.testing.assert_array_equal(np.asarray(o_only), np.asarray(o))
        _check_lse(lse, rl, o64, tag)


def _check_lse(lse, rl, o64, tag):
    """LSE within 1e-2 of the oracle's where finite, -inf exactly where the oracle's is, and a zero output there."""
    lse = np.asarray(lse, np.float64)
    fin = np.isfinite(rl)
    assert np.array_equal(np.isfinite(lse), fin), tag
    assert np.abs(lse[fin] - rl[fin]).max() < 1e-2, tag
    if not fin.all():
        assert np.all(o64[~fin.transpose(0, 2, 1)] == 0.0), tag


def test_nan_row_stays_in_its_row():
    q = _rand(jax.random.PRNGKey(3), (1, 128, 2, 128), "float16")
    k = _rand(jax.random.PRNGKey(4), (1, 256, 1, 128), "float16")
    q = q.at[0, 77, 1, 5].set(jnp.nan)
    o = np.asarray(jnp.asarray(pallas_attn.attention(q, k, k, generation="fa_prefill", interpret=False), jnp.float32))
    assert np.all(np.isnan(o[0, 77, 1]))
    mask = np.ones(o.shape[:3], bool)
    mask[0, 77, 1] = False
    assert np.all(np.isfinite(o[mask]))


def test_large_shape_matches_cudnn():
    """At the benchmark shape the kernel agrees with jax.nn's cuDNN attention (fp16, causal and not)."""
    b, n, h, d = 2, 2048, 8, 128
    ks = jax.random.split(jax.random.PRNGKey(5), 3)
    q, k, v = (_rand(kk, (b, n, h, d), "float16") for kk in ks)
    for causal in (False, True):
        ours = pallas_attn.attention(q, k, v, causal=causal, generation="fa_prefill", interpret=False)
        ref = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
        err = float(jnp.max(jnp.abs(ours.astype(jnp.float32) - ref.astype(jnp.float32))))
        assert err < 2e-3, (causal, err)


# ---- features: window band, soft-cap, sinks (the kernel's keyword extensions) ------------------------------------

# causal, window (left, right), softcap, sinks: causal windows as models use them (Mistral / Gemma-2 local / gpt-oss
# local: (W - 1, 0)), a two-sided band without the causal mask, a negative side (rows that see no key), each with the
# soft-cap and the sinks alone and together
_FEATURES = [
    (True, (63, 0), None, False), (True, (200, 0), None, False), (False, (100, 37), None, False),
    (False, (-5, 70), None, False), (True, None, 50.0, False), (True, None, 5.0, False), (True, None, None, True),
    (True, (127, 0), 30.0, True), (False, (40, 40), None, True),
]


# every config at D 128, the pipelined default at D 64 / 256 too; each feature on one of two shapes in turn (GQA,
# ragged lengths, per-sequence offsets; negative offsets: rows that see no key): one compile per feature and config
@pytest.mark.parametrize("cfg,d", [("default", 64), ("default", 128), ("default", 256), ("serial", 128),
                                   ("pingpong", 128), ("tiles4", 64), ("tiles8", 128), ("c3", 64), ("default", 96)])
def test_features_match_oracle(cfg, d):
    key = jax.random.PRNGKey(100 + d)
    dtype = "bfloat16"
    for i, (causal, window, softcap, sinks) in enumerate(_FEATURES):
        for j, (b, tq, tk, hq, hkv, _, offs) in enumerate([(_SHAPES[2], _SHAPES[4])[i % 2]]):
            kq, kk, kv, ks = jax.random.split(jax.random.fold_in(key, 10 * i + j), 4)
            q, k, v = (_rand(kq, (b, tq, hq, d), dtype), _rand(kk, (b, tk, hkv, d), dtype),
                       _rand(kv, (b, tk, hkv, d), dtype))
            sk = np.asarray(jax.random.normal(ks, (hq,), jnp.float32)) * 2 if sinks else None
            off = jnp.asarray(offs, jnp.int32)
            o, lse = fp.forward(q, k, v, causal=causal, scale=d ** -0.5, q_offset=off, interpret=False,
                                config=_cfg(cfg, d), return_lse=True, window=window, softcap=softcap, sinks=sk)
            ro, rl = oracle.attention_reference(q, k, v, causal=causal, q_offset=np.asarray(offs), window=window,
                                                softcap=softcap, sinks=sk)
            tag = (cfg, d, causal, window, softcap, sinks, b, tq, tk, offs)
            o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
            assert np.all(np.isfinite(o64)), tag
            assert np.linalg.norm(o64 - ro) / max(np.linalg.norm(ro), 1e-30) < TOL[dtype], tag
            _check_lse(lse, rl, o64, tag)


def test_dropin_window_grads_on_hopper():
    """The drop-in with a window on sm_90, against jax.nn's XLA path in float32 (output and dq / dk / dv): causal
    (model windows: fa_prefill's forward and fa_prefill_bwd since session 10) and a two-sided band (fa_prefill's
    forward with fa_train's backward)."""
    key = jax.random.PRNGKey(7)
    for causal, window in ((True, (255, 0)), (False, (100, 37))):
        kq, kk, kv, kd = jax.random.split(key, 4)
        q, k, v, do = (_rand(kq, (2, 700, 8, 128), "bfloat16"), _rand(kk, (2, 700, 2, 128), "bfloat16"),
                       _rand(kv, (2, 700, 2, 128), "bfloat16"), _rand(kd, (2, 700, 8, 128), "bfloat16"))
        impl, why = pallas_attn.which_implementation(q, k, v, is_causal=causal, local_window_size=window)
        assert impl == "pallas:fa_prefill", why

        def f(q, k, v, causal=causal, window=window):
            return pallas_attn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window)

        def g(q, k, v, causal=causal, window=window):
            f32 = jnp.float32
            return jax.nn.dot_product_attention(q.astype(f32), k.astype(f32), v.astype(f32), is_causal=causal,
                                                local_window_size=window, implementation="xla")

        out, vjp = jax.vjp(f, q, k, v)
        ref, vjp_ref = jax.vjp(g, q, k, v)
        for name, a, r in zip(("o", "dq", "dk", "dv"), (out, *vjp(do)), (ref, *vjp_ref(do.astype(jnp.float32)))):
            a, r = np.asarray(jnp.asarray(a, jnp.float32), np.float64), np.asarray(r, np.float64)
            assert np.linalg.norm(a - r) / np.linalg.norm(r) < 2e-2, (causal, window, name)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_dropin_softcap_sinks_window_grads_on_hopper(d):
    """The drop-in's differentiable extensions on sm_90 (fa_prefill's forward, fa_prefill_bwd, the sinks' gradient
    from its delta): softcap + sinks with and without a causal window, output and every gradient (sinks too) against
    the float64 oracle."""
    key = jax.random.PRNGKey(17)
    b, t, hq, hkv = 2, 700, 8, 2
    kq, kk, kv, kd, ks = jax.random.split(key, 5)
    q, k, v, do = (_rand(kq, (b, t, hq, d), "bfloat16"), _rand(kk, (b, t, hkv, d), "bfloat16"),
                   _rand(kv, (b, t, hkv, d), "bfloat16"), _rand(kd, (b, t, hq, d), "bfloat16"))
    sinks = jax.random.normal(ks, (hq,), jnp.float32)
    for window in (None, (255, 0)):
        impl, why = pallas_attn.which_implementation(q, k, v, is_causal=True, local_window_size=window, softcap=30.0,
                                                     sinks=sinks)
        assert impl == "pallas:fa_prefill" and "forward and backward" in why, why

        def f(q, k, v, sinks, window=window):
            return pallas_attn.dot_product_attention(q, k, v, is_causal=True, local_window_size=window, softcap=30.0,
                                                     sinks=sinks)

        out, vjp = jax.vjp(f, q, k, v, sinks)
        ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=d ** -0.5, softcap=30.0,
                                              sinks=np.asarray(sinks), window=None if window is None else 256)
        for name, a in zip(("out", "dq", "dk", "dv", "dsinks"), (out, *vjp(do))):
            a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
            assert np.linalg.norm(a - ref[name]) / np.linalg.norm(ref[name]) < 2e-2, (d, window, name)


@pytest.mark.parametrize("cfg", [fp.CONFIGS["tiles4"], fp.PrefillConfig(tiles=3),
                                 fp.PrefillConfig(tiles=3, pingpong=True), fp.PrefillConfig(tiles=5, overlap=False),
                                 _EXTRA["c3tiles3"], fp.PrefillConfig(tiles=2, order="snake"),
                                 fp.PrefillConfig(tiles=3, order="snake"), fp.PrefillConfig(tiles=4, order="snake")],
                         ids=["tiles4", "t3", "t3pp", "t5serial", "c3t3", "t2snake", "t3snake", "t4snake"])
def test_multi_tile_ragged_grid(cfg):
    """Several row tiles per CTA where the tiles do not divide the row blocks (8 blocks over 3 or 5 tiles: CTAs run
    3, 3, 2 or 5, 3), causal with per-sequence offsets, with and without a window, against the oracle; the snake
    order over whole rounds (tiles 2, 4) and with a last round that is not full (tiles 3: 3, 3, 2)."""
    key = jax.random.PRNGKey(11)
    b, tq, tk, hq, hkv, d = 2, 900, 1000, 4, 2, 128
    kq, kk, kv = jax.random.split(key, 3)
    q, k, v = (_rand(kq, (b, tq, hq, d), "bfloat16"), _rand(kk, (b, tk, hkv, d), "bfloat16"),
               _rand(kv, (b, tk, hkv, d), "bfloat16"))
    offs = (0, 100)
    for window in (None, (127, 0)):
        o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=jnp.asarray(offs, jnp.int32),
                            interpret=False, config=cfg, return_lse=True, window=window)
        ro, rl = oracle.attention_reference(q, k, v, causal=True, q_offset=np.asarray(offs), window=window)
        o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
        assert np.linalg.norm(o64 - ro) / np.linalg.norm(ro) < TOL["bfloat16"], (cfg, window)
        np.testing.assert_allclose(np.asarray(lse, np.float64), rl, atol=1e-2)


@pytest.mark.parametrize("cfg", ["default", "serial", "pingpong", "tiles4", "c3"])
def test_packed_documents_match_oracle(cfg, monkeypatch):
    """segment_ids (packed documents, causal within each): document mixes with short and long documents, a
    boundary inside a row tile and one on a tile edge, with and without a window, against the oracle."""
    monkeypatch.setattr(fp, "PACKED_ON_GPU", True)  # this test is the gate of the switch: it runs the kernel either way
    key = jax.random.PRNGKey(21)
    b, t, hq, hkv, d = 2, 1000, 4, 2, 128
    kq, kk, kv = jax.random.split(key, 3)
    q, k, v = (_rand(kq, (b, t, hq, d), "bfloat16"), _rand(kk, (b, t, hkv, d), "bfloat16"),
               _rand(kv, (b, t, hkv, d), "bfloat16"))
    seg = np.stack([np.repeat(np.arange(4), (128, 37, 700, 135)), np.repeat(np.arange(3), (5, 900, 95))])
    for window in (None, (127, 0)):
        o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=jnp.zeros((b,), jnp.int32),
                            interpret=False, config=_cfg(cfg, d), return_lse=True, window=window,
                            segment_ids=jnp.asarray(seg, jnp.int32))
        ro, rl = oracle.attention_reference(q, k, v, causal=True, window=window, q_segments=seg)
        o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
        assert np.linalg.norm(o64 - ro) / np.linalg.norm(ro) < TOL["bfloat16"], (cfg, window)
        _check_lse(lse, rl, o64, (cfg, window))


@pytest.mark.parametrize("cfg", ["c3", "c3tiles3"])
def test_three_consumers_q_lens_rows(cfg):
    """q_lens (rows past a sequence's real ones are padding; each of the three consumers may be padding alone or with
    the others): the real rows match the oracle, causal with offsets."""
    key = jax.random.PRNGKey(31)
    b, tq, tk, hq, hkv, d = 3, 600, 896, 4, 2, 64
    kq, kk, kv = jax.random.split(key, 3)
    q, k, v = (_rand(kq, (b, tq, hq, d), "bfloat16"), _rand(kk, (b, tk, hkv, d), "bfloat16"),
               _rand(kv, (b, tk, hkv, d), "bfloat16"))
    offs, lens = (300, 300, 0), (600, 250, 70)  # 250: the second consumer of a 192-row tile ends mid-way
    o, lse = fp.forward(q, k, v, causal=True, scale=d ** -0.5, q_offset=jnp.asarray(offs, jnp.int32),
                        interpret=False, config=_cfg(cfg, d), return_lse=True,
                        q_lens=jnp.asarray(lens, jnp.int32))
    ro, rl = oracle.attention_reference(q, k, v, causal=True, q_offset=np.asarray(offs))
    o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
    for i, n in enumerate(lens):
        err = np.linalg.norm(o64[i, :n] - ro[i, :n]) / np.linalg.norm(ro[i, :n])
        assert err < TOL["bfloat16"], (cfg, i, err)
        np.testing.assert_allclose(np.asarray(lse, np.float64)[i, :, :n], rl[i, :, :n], atol=1e-2)
        assert np.all(o64[i, n:] == 0.0) and np.all(np.isneginf(np.asarray(lse)[i, :, n:])), (cfg, i)  # padding
    # the same call through page pools (pages of 64 keys in a shuffled table; the chunked-prefill path): the real rows
    # equal the dense call's
    page = 64
    perm = np.random.default_rng(0).permutation(b * tk // page).astype(np.int32)
    inv = np.argsort(perm)
    pool = lambda x: x.reshape(b * tk // page, page, hkv, d)[inv]  # noqa: E731 - pool[perm[j]] = page j
    o2, lse2 = fp.forward(q, pool(k), pool(v), causal=True, scale=d ** -0.5, q_offset=jnp.asarray(offs, jnp.int32),
                          interpret=False, config=_cfg(cfg, d), return_lse=True, q_lens=jnp.asarray(lens, jnp.int32),
                          block_table=jnp.asarray(perm.reshape(b, tk // page)))
    for i, n in enumerate(lens):
        np.testing.assert_allclose(np.asarray(o2[i, :n], np.float32), np.asarray(o[i, :n], np.float32), atol=1e-6)
        np.testing.assert_allclose(np.asarray(lse2)[i, :, :n], np.asarray(lse)[i, :, :n], atol=1e-6)


@pytest.mark.parametrize("cfg", ["default", "tiles4", "serial", "pingpong", "warp_producer"])
def test_q_lens_idle_consumers_zero_rows_and_poison(cfg):
    """q_lens at D 128 (session 34: a consumer whose rows are all padding idles, a tile with no real row loads no key,
    the kernel writes the padding rows' zeros and a poisoned sequence's NaN): whole padding tiles, a sequence with no
    real row, a tile cut mid-consumer, a poisoned sequence, multi-tile CTAs (tiles4: the double-buffered Q skips its
    idle tiles' loads). Real rows match the oracle and the call without q_lens; padding rows are exactly 0 with LSE
    -inf; the poisoned sequence is NaN everywhere; the same through page pools (pages 16 and 64) equals the dense
    call bit for bit."""
    key = jax.random.PRNGKey(34)
    b, tq, tk, hq, hkv, d = 5, 1024, 1280, 4, 2, 128
    kq, kk, kv = jax.random.split(key, 3)
    q, k, v = (_rand(kq, (b, tq, hq, d), "bfloat16"), _rand(kk, (b, tk, hkv, d), "bfloat16"),
               _rand(kv, (b, tk, hkv, d), "bfloat16"))
    offs, lens = (256, 0, 1000, 300, 100), (1024, 0, 130, 700, 900)
    poison = jnp.asarray([False, False, False, False, True])
    kw = dict(causal=True, scale=d ** -0.5, q_offset=jnp.asarray(offs, jnp.int32), interpret=False,
              config=_cfg(cfg, d), return_lse=True)
    o, lse = fp.forward(q, k, v, q_lens=jnp.asarray(lens, jnp.int32), poison=poison, **kw)
    o_full, lse_full = fp.forward(q, k, v, **kw)
    ro, rl = oracle.attention_reference(q, k, v, causal=True, q_offset=np.asarray(offs))
    o64 = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
    lse = np.asarray(lse, np.float64)
    for i, n in enumerate(lens[:4]):
        assert np.all(o64[i, n:] == 0.0) and np.all(np.isneginf(lse[i, :, n:])), (cfg, i)
        if n:
            err = np.linalg.norm(o64[i, :n] - ro[i, :n]) / np.linalg.norm(ro[i, :n])
            assert err < TOL["bfloat16"], (cfg, i, err)
            np.testing.assert_allclose(lse[i, :, :n], rl[i, :, :n], atol=1e-2)
            assert np.array_equal(np.asarray(o[i, :n], np.float32), np.asarray(o_full[i, :n], np.float32)), (cfg, i)
    assert np.isnan(o64[4]).all() and np.isnan(lse[4]).all(), cfg
    for page in (16, 64):
        perm = np.random.default_rng(page).permutation(b * tk // page).astype(np.int32)
        pools = [x.reshape(b * tk // page, page, hkv, d)[np.argsort(perm)] for x in (k, v)]  # pool[perm[j]] = page j
        o2, lse2 = fp.forward(q, *pools, q_lens=jnp.asarray(lens, jnp.int32), poison=poison,
                              block_table=jnp.asarray(perm.reshape(b, tk // page)), **kw)
        assert np.array_equal(np.asarray(o2, np.float32), np.asarray(o, np.float32), equal_nan=True), (cfg, page)
        assert np.array_equal(np.asarray(lse2), lse.astype(np.float32), equal_nan=True), (cfg, page)
