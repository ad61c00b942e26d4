"""fa_prefill's features beyond the causal mask (window band, soft-cap, sinks) on the CPU: the block schedule the
Mosaic kernel runs (``_block_bounds``, ``_consumer_bounds``, ``_serial_plan``, ``_pipeline_plan``) checked by brute
force over many tiles, windows and offsets; the interpret-mode twin against the float64 oracle; the Mosaic kernel
lowering for CUDA with every feature and config; the drop-in's routing and its refusals. The compiled kernel runs
in tests/gpu/test_fa_prefill_gpu.py."""

from __future__ import annotations

import dataclasses
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from attn_core import oracle
from pallas_attn import dropin
from pallas_attn.kernels import fa_prefill as fp
from pallas_attn.kernels import fa_prefill_bwd as fb
from pallas_attn.kernels.contract import Problem


def _visible_rows(r0, bq, off, tk, hi_off, lo_off):
    """[bq, tk] visibility of keys to rows r0..r0+bq-1 (the module's rule), numpy."""
    i = np.arange(r0, r0 + bq)[:, None]
    j = np.arange(tk)[None, :]
    ok = np.broadcast_to(j < tk, (bq, tk)).copy()
    if hi_off is not None:
        ok &= j <= i + off + hi_off
    if lo_off is not None:
        ok &= j >= i + off - lo_off
    return ok


_WINDOWS = [(True, None), (False, None), (True, (0, 0)), (True, (63, 0)), (True, (127, None)), (True, (200, 5)),
            (False, (17, 40)), (False, (300, -3)), (False, (-10, 90)), (True, (4095, 0)), (False, (None, 70))]


@pytest.mark.parametrize("causal,window", _WINDOWS, ids=str)
@pytest.mark.parametrize("bkv", [64, 128])
def test_block_schedule_covers_every_visible_key_and_masks_every_edge(causal, window, bkv):
    """For every row tile of both consumers: the blocks it runs hold every key any of its rows sees; a block it runs
    unmasked is visible to all its rows; the producer's range is the union, loaded once, in order (what the barrier
    ring relies on); serial and pipelined schedules alike."""
    hi_off, lo_off = fp._mask_bounds(causal, window)
    banded = lo_off is not None
    bq = 64
    for tk, off in itertools.product((1, 64, 200, 517), (0, 37, -50, 300)):
        n_len = -(-tk // bkv)
        for q0 in range(0, 640, 2 * bq):
            plans = []
            for wg in (0, 1):
                r0 = q0 + wg * bq
                a, n_lfull, n_full, n_done = (int(x) for x in fp._consumer_bounds(
                    jnp.int32(r0), jnp.int32(off), bq=bq, bkv=bkv, tk=tk, hi_off=hi_off, lo_off=lo_off))
                vis = _visible_rows(r0, bq, off, tk, hi_off, lo_off)
                tag = (causal, window, bkv, tk, off, r0)
                assert 0 <= a < n_done <= n_len, tag
                cols = np.nonzero(vis.any(axis=0))[0]
                if cols.size:  # every visible key lies in [a, n_done)
                    assert a * bkv <= cols.min() and cols.max() < n_done * bkv, tag
                bm, f = (int(x) for x in fp._serial_plan(a, n_lfull, n_full, n_done, banded=banded))
                unmasked_serial = set(range(bm, f))
                pbm, pro_masked, lo = fp._pipeline_plan(a, n_lfull, n_full, n_done, banded=banded)
                pbm, pro_masked, lo = int(pbm), bool(pro_masked), int(lo)
                assert a <= pbm < n_done and pbm < lo <= n_done, tag
                unmasked_pipe = set(range(pbm + 1, lo)) | (set() if pro_masked else {pbm})
                for s in unmasked_serial | unmasked_pipe:
                    blk = vis[:, s * bkv:(s + 1) * bkv]
                    assert blk.shape[1] == bkv and blk.all(), (tag, s)
                plans.append((a, n_done))
            (a0, d0), (a1, d1) = plans
            assert a0 <= a1 and d0 <= d1, (causal, window, tk, off, q0)  # the producer's [a0, d1) covers both


_FEATURES = [
    dict(window=(31, 0)), dict(window=(100, 37), causal=False), dict(softcap=5.0), dict(sinks=True),
    dict(window=(63, 0), softcap=3.0, sinks=True), dict(window=(-5, 20), causal=False, sinks=True),
]


def _oracle_kw(kw, hq, rng):
    out = {}
    if "window" in kw:
        out["window"] = kw["window"]
    if "softcap" in kw:
        out["softcap"] = kw["softcap"]
    if kw.get("sinks"):
        out["sinks"] = rng.standard_normal(hq).astype(np.float32) * 2
    return out


@pytest.mark.parametrize("kw", _FEATURES, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_interpret_twin_matches_the_oracle(rng, kw):
    b, tq, tk, hq, hkv, d = 2, 150, 260, 4, 2, 64
    causal = kw.get("causal", True)
    q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), jnp.float16)
    k = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), jnp.float16)
    v = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), jnp.float16)
    offs = np.array([0, 70])
    okw = _oracle_kw(kw, hq, rng)
    o, lse = fp.forward(q, k, v, causal=causal, scale=0.125, q_offset=jnp.asarray(offs, jnp.int32), interpret=True,
                        config=fp.CONFIGS["default"], return_lse=True, **okw)
    ro, rl = oracle.attention_reference(q, k, v, causal=causal, scale=0.125, q_offset=offs, **okw)
    o64, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    assert np.linalg.norm(o64 - ro) / np.linalg.norm(ro) < 4e-3
    fin = np.isfinite(rl)
    assert np.array_equal(np.isfinite(lse), fin)
    assert np.abs(lse[fin] - rl[fin]).max() < 1e-3
    if not fin.all():  # rows that see no key (and no sink): zero output, LSE -inf
        assert np.all(o64[~fin.transpose(0, 2, 1)] == 0.0)


def test_sink_alone_takes_an_empty_row(rng):
    """A row that sees no key, with a sink: output 0, LSE = the sink (its softmax is the sink's alone)."""
    q = jnp.asarray(rng.standard_normal((1, 64, 2, 64)), jnp.float16)
    k = jnp.asarray(rng.standard_normal((1, 64, 1, 64)), jnp.float16)
    sinks = np.array([1.5, -2.0], np.float32)
    o, lse = fp.forward(q, k, k, causal=True, scale=0.125, q_offset=jnp.asarray([-10], jnp.int32), interpret=True,
                        config=fp.CONFIGS["default"], return_lse=True, sinks=sinks)
    o, lse = np.asarray(o, np.float64), np.asarray(lse, np.float64)
    assert np.all(o[0, :10] == 0.0)
    np.testing.assert_allclose(lse[0, :, :10], np.broadcast_to(sinks[:, None], (2, 10)), atol=1e-6)
    assert np.all(np.isfinite(o))


def test_feature_arguments_are_checked():
    q = jnp.zeros((1, 64, 2, 64), jnp.float16)
    off = jnp.zeros((1,), jnp.int32)
    for bad, match in [(dict(window=5), "pair"), (dict(window=(1.5, 0)), "int"), (dict(softcap=0.0), "softcap"),
                       (dict(softcap=-1.0), "softcap"), (dict(sinks=np.zeros(3)), "sinks"),
                       (dict(sinks=np.zeros(2, np.int32)), "sinks")]:
        with pytest.raises(ValueError, match=match):
            fp.forward(q, q, q, causal=True, scale=1.0, q_offset=off, interpret=True, config=fp.CONFIGS["default"],
                       **bad)
    # (None, None) is no window; a huge side is clamped (int32 bound arithmetic), not refused
    assert fp.check_features((None, None), None, None, 2) == (None, None, None)
    assert fp.check_features((1 << 40, 0), None, None, 2)[0] == (1 << 30, 0)


@pytest.mark.parametrize("cfg", ["default", "serial", "pingpong"])
@pytest.mark.parametrize("causal,kw", [(True, dict(window=(63, 0))), (False, dict(window=(100, 37))),
                                       (True, dict(softcap=50.0)), (True, dict(sinks=True)),
                                       (True, dict(window=(127, 0), softcap=30.0, sinks=True))], ids=str)
def test_mosaic_kernel_lowers_for_cuda_with_features(cfg, causal, kw):
    q = jax.ShapeDtypeStruct((2, 200, 4, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 333, 2, 128), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)
    sk = jax.ShapeDtypeStruct((4,), jnp.float32)

    def f(q, k, off, sk):
        kk = dict(kw, sinks=sk if kw.get("sinks") else None)
        return fp.forward(q, k, k, causal=causal, scale=0.1, q_offset=off, interpret=False, config=fp.CONFIGS[cfg],
                          return_lse=True, **kk)

    text = jax.jit(f).trace(q, k, off, sk).lower(lowering_platforms=("cuda",)).as_text()
    names = set(re.findall(r"pallas_attn_\w+", text))
    assert fp.PASS_FWD in names and fp.PASS_FALLBACK not in names, names


def test_dropin_routes_features_and_refuses_what_it_cannot_run(rng):
    q = jnp.asarray(rng.standard_normal((2, 130, 4, 64)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((2, 130, 2, 64)), jnp.bfloat16)
    sinks = np.array([0.5, -1, 2, 3], np.float32)
    impl, why = dropin.which_implementation(q, k, k, is_causal=True, softcap=50.0)
    assert impl == "pallas:fa_prefill" and "forward and backward" in why, why
    impl, why = dropin.which_implementation(q, k, k, is_causal=True, sinks=sinks, local_window_size=(63, 0))
    assert impl == "pallas:fa_prefill" and "forward and backward" in why and "sinks' gradient" in why, why
    seg = jnp.zeros((2, 130), jnp.int32)
    for kw in (dict(softcap=5.0, local_window_size=(20, 9)), dict(segment_ids=seg, local_window_size=(20, 0))):
        impl, why = dropin.which_implementation(q, k, k, is_causal=False, **kw) if "softcap" in kw else \
            dropin.which_implementation(q, k, k, is_causal=True, **kw)
        assert impl == "pallas:fa_prefill" and "forward only" in why, (kw, why)
    impl, why = dropin.which_implementation(q, k, k, is_causal=True, segment_ids=seg)  # interpret: both kernels
    assert impl == "pallas:fa_prefill" and "forward and backward" in why, why
    for implementation in ("xla", "cudnn", "pallas:fa_train"):
        with pytest.raises(NotImplementedError, match="fa_prefill only"):
            dropin.which_implementation(q, k, k, softcap=5.0, implementation=implementation)
    with pytest.raises(NotImplementedError, match="sequence lengths"):
        dropin.which_implementation(q, k, k, sinks=sinks, key_value_seq_lengths=jnp.full((2,), 9, jnp.int32))
    with pytest.raises(ValueError, match="sinks"):
        dropin.which_implementation(q, k, k, sinks=np.zeros(3, np.float32))
    for kw, okw in [(dict(softcap=5.0), dict(softcap=5.0)),
                    (dict(sinks=sinks, local_window_size=(63, 0)), dict(sinks=sinks, window=(63, 0)))]:
        o = pallas_attn.dot_product_attention(q, k, k, is_causal=True, implementation="pallas:fa_prefill", **kw)
        ro, _ = oracle.attention_reference(q, k, k, causal=True, **okw)
        assert np.linalg.norm(np.asarray(o, np.float64) - ro) / np.linalg.norm(ro) < 2e-2
    with pytest.raises(NotImplementedError, match="no backward kernel"):
        jax.grad(lambda q: pallas_attn.dot_product_attention(q, k, k, is_causal=True, segment_ids=seg,
                                                             local_window_size=(20, 0)).astype(jnp.float32).sum())(q)
    with pytest.raises(NotImplementedError, match="no backward kernel"):
        jax.grad(lambda q: pallas_attn.dot_product_attention(q, k, k, softcap=5.0, local_window_size=(20, 9)).astype(
            jnp.float32).sum())(q)


@pytest.mark.parametrize("window", [None, (30, 0)])
def test_dropin_softcap_sinks_grads_match_oracle(rng, window):
    """softcap + sinks through the drop-in (interpret mode: fa_prefill's twin forward and fa_prefill_bwd's kernels on
    the GPU interpreter), with and without a causal window: output, dq / dk / dv and the sinks' gradient against the
    float64 oracle."""
    q, k, v, do = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
                   for s in ((1, 80, 2, 64), (1, 80, 1, 64), (1, 80, 1, 64), (1, 80, 2, 64)))
    sinks = jnp.asarray([0.7, -0.4], jnp.float32)

    def f(q, k, v, sinks):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=True, softcap=20.0, sinks=sinks,
                                                 local_window_size=window)

    out, vjp = jax.vjp(f, q, k, v, sinks)
    grads = vjp(do)
    ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=64 ** -0.5, softcap=20.0,
                                          sinks=np.asarray(sinks), window=None if window is None else window[0] + 1)
    ro, _ = oracle.attention_reference(q, k, v, causal=True, softcap=20.0, sinks=np.asarray(sinks), window=window)
    for name, a, r in zip(("o", "dq", "dk", "dv", "dsinks"), (out, *grads),
                          (ro, ref["dq"], ref["dk"], ref["dv"], ref["dsinks"])):
        a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
        assert np.linalg.norm(a - r) / np.linalg.norm(r) < 2e-2, (window, name)


@pytest.mark.parametrize("causal,window", [(True, (20, 0)), (False, (15, 9))])
def test_dropin_window_pair_grads_match_jax_nn(rng, causal, window):
    """A window on fa_prefill: a causal one runs fa_prefill's forward and fa_prefill_bwd (its kernels on the GPU
    interpreter here), a two-sided one fa_prefill's forward with fa_train's backward kernels; output and dq / dk / dv
    against jax.nn's XLA path in float32."""
    q, k, v, do = (jnp.asarray(rng.standard_normal(s), jnp.float16)
                   for s in ((1, 80, 2, 64), (1, 80, 1, 64), (1, 80, 1, 64), (1, 80, 2, 64)))
    impl, why = dropin.which_implementation(q, k, v, is_causal=causal, local_window_size=window,
                                            implementation="pallas:fa_prefill")
    assert impl == "pallas:fa_prefill" and (("fa_train" in why) != causal), why

    def f(q, k, v):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window,
                                                 implementation="pallas:fa_prefill")

    def g(q, k, v):
        f32 = jnp.float32
        return jax.nn.dot_product_attention(q.astype(f32), k.astype(f32), v.astype(f32), is_causal=causal,
                                            local_window_size=window)

    out, vjp = jax.vjp(f, q, k, v)
    ref, vjp_ref = jax.vjp(g, q, k, v)
    for a, r in zip((out, *vjp(do)), (ref, *vjp_ref(do.astype(jnp.float32)))):
        a, r = np.asarray(a, np.float64), np.asarray(r, np.float64)
        assert np.linalg.norm(a - r) / np.linalg.norm(r) < 2e-3


def test_a_window_that_masks_nothing_is_no_window(rng):
    """jax.nn keeps i - left <= j <= i + right (top-left): left >= T - 1 with a causal (or right >= S - 1) right side
    masks no key, and the drop-in then runs the plain schedule (Mistral's 4096-key window at N <= 4096). One key less
    on either side keeps the window. The answer equals jax.nn's with the window (interpret mode)."""
    w = dropin._window
    assert w((79, 0), True, 80, 80) is None and w((100, 5), True, 80, 80) is None  # causal: right >= 0 is implied
    assert w((79, 79), False, 80, 80) is None and w(79, False, 80, 120) == (79, 79)  # right 79 < S - 1 = 119
    assert w((78, 0), True, 80, 80) == (78, 0) and w((79, 78), False, 80, 80) == (79, 78)
    assert w((79, -1), True, 80, 80) == (79, -1) and w((79, 0), False, 80, 80) == (79, 0)  # right 0: causal in effect
    assert w((4095, 0), True, 4096, 4096) is None and w((4095, 0), True, 8192, 8192) == (4095, 0)  # Mistral
    assert w((5, 0)) == (5, 0) and w(None, True, 8, 8) is None  # without the lengths: as given
    q, k, v = (jnp.asarray(rng.standard_normal(s), jnp.float16) for s in ((1, 80, 2, 64), (1, 80, 1, 64),
                                                                            (1, 80, 1, 64)))
    impl, why = dropin.which_implementation(q, k, v, is_causal=True, local_window_size=(79, 0),
                                            implementation="pallas:fa_prefill")
    assert impl == "pallas:fa_prefill" and "window" not in why, why
    _, why = dropin.which_implementation(q, k, v, is_causal=True, local_window_size=(78, 0),
                                         implementation="pallas:fa_prefill")
    assert "window" in why, why
    for window in ((79, 0), (78, 0)):
        out = pallas_attn.dot_product_attention(q, k, v, is_causal=True, local_window_size=window,
                                                implementation="pallas:fa_prefill")
        f32 = jnp.float32
        ref = jax.nn.dot_product_attention(q.astype(f32), k.astype(f32), v.astype(f32), is_causal=True,
                                           local_window_size=window)
        a, r = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        assert np.linalg.norm(a - r) / np.linalg.norm(r) < 2e-3, window


@pytest.mark.parametrize("snake", [False, True])
@pytest.mark.parametrize("tiles", [1, 2, 3, 4, 8, 16])
def test_multi_tile_ctas_cover_every_row_block_once(tiles, snake):
    """cfg.tiles: the CTAs of a head (the grid's q axis, ``ceil(n_qblocks / tiles)`` of them) run every row block
    exactly once, heavy (late) blocks first within each CTA, in either order (``strided`` / ``snake``)."""
    for n_qblocks in range(1, 41):
        t_eff = min(tiles, n_qblocks)
        n_groups = -(-n_qblocks // t_eff)
        seen = []
        for g in range(n_groups):
            n = int(fp._n_tiles(jnp.int32(g), t_eff, n_qblocks, n_groups))
            assert 1 <= n <= t_eff, (tiles, n_qblocks, g)
            blocks = [int(fp._tile_qblock(jnp.int32(g), t, n_qblocks, n_groups, snake)) for t in range(n)]
            assert blocks == sorted(blocks, reverse=True), (tiles, n_qblocks, g)
            seen += blocks
        assert sorted(seen) == list(range(n_qblocks)), (tiles, n_qblocks)


@pytest.mark.parametrize("tiles", [2, 4, 8])
def test_snake_order_balances_causal_work(tiles):
    """``order="snake"``: where the tiles make whole pairs of rounds, every CTA of a head runs the same causal work
    (row block r costs r + 1 key blocks of its width); ``strided`` gives CTA 0 ``tiles * n_groups`` blocks more
    than the last CTA. N 4096 (32 row tiles of 128) and N 2048 (16)."""
    for n_qblocks in (16, 32):
        n_groups = n_qblocks // tiles

        def work(snake, n_qblocks=n_qblocks, n_groups=n_groups):
            return [sum(int(fp._tile_qblock(jnp.int32(g), t, n_qblocks, n_groups, snake)) + 1 for t in range(tiles))
                    for g in range(n_groups)]

        even = work(True)
        assert len(set(even)) == 1, (tiles, n_qblocks, even)
        assert even[0] * n_groups == n_qblocks * (n_qblocks + 1) // 2
        strided = work(False)
        assert strided[0] - strided[-1] == tiles * (n_groups - 1), strided


def test_prefill_order_is_checked():
    with pytest.raises(ValueError, match="order"):
        fp.PrefillConfig(order="zigzag")
    assert fp.PrefillConfig(tiles=2, order="strided").order == "strided"
    assert all(c.order == "snake" for c in fp.CONFIGS.values())  # the named multi-tile configs run the snake


@pytest.mark.parametrize("cfg", ["tiles2", "tiles4", "tiles8"])
def test_multi_tile_configs_lower_for_cuda(cfg):
    q = jax.ShapeDtypeStruct((2, 600, 4, 64), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 600, 2, 64), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)

    def f(q, k, off):
        return fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False, config=fp.CONFIGS[cfg],
                          return_lse=True, window=(127, 0))

    text = jax.jit(f).trace(q, k, off).lower(lowering_platforms=("cuda",)).as_text()
    assert fp.PASS_FWD in text


def test_snake_order_lowers_for_cuda_and_changes_the_program():
    """``order="snake"`` lowers (tiles 2 and 4, causal, D 128) and is a different program from ``strided``; at one
    tile a CTA the order changes nothing (the same program)."""
    q = jax.ShapeDtypeStruct((1, 1024, 4, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 1024, 2, 128), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((1,), jnp.int32)

    def text(cfg):
        def f(q, k, off):
            return fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False, config=cfg)
        return jax.jit(f).trace(q, k, off).lower(lowering_platforms=("cuda",)).as_text()

    for tiles in (2, 4):
        a = text(fp.PrefillConfig(tiles=tiles, order="strided"))
        b = text(fp.PrefillConfig(tiles=tiles, order="snake"))
        assert fp.PASS_FWD in b and a != b, tiles
        assert text(fp.PrefillConfig(tiles=tiles)) == b  # snake is the default order (session 30)
    assert text(fp.PrefillConfig(order="strided")) == text(fp.PrefillConfig(order="snake"))


def test_narrow_windows_run_several_tiles_per_cta(monkeypatch):
    """fa_prefill.config_for_window: a band of at most NARROW_WINDOW keys gets NARROW_WINDOW_TILES row tiles per CTA
    (whatever the shape's tiles); wider or one-sided windows keep the shape's config; the drop-in and compare's
    pallas:auto name the config that runs."""
    from compare import auto, workloads

    d = fp.CONFIGS["default"]
    assert fp.config_for_window(d, True, (127, 0)) == fp.CONFIGS["tiles8"]
    assert fp.config_for_window(d, False, (200, 200)) == fp.CONFIGS["tiles8"]
    for causal, window in ((True, (4095, 0)), (True, None), (False, (100, None)), (True, (None, 0))):
        assert fp.config_for_window(d, causal, window) is d, (causal, window)
    # the narrow rule's tiles whatever the dense row's (the H200's gpt-oss N 2048 row is tiles4 since session 30)
    assert fp.config_for_window(fp.CONFIGS["tiles2"], True, (127, 0)) is fp.CONFIGS["tiles8"]
    assert fp.config_for_window(fp.CONFIGS["tiles4"], True, (127, 0)) is fp.CONFIGS["tiles8"]
    assert fp.config_for_window(fp.CONFIGS["tiles8"], True, (127, 0)) is fp.CONFIGS["tiles8"]
    assert fp.config_for_window(fp.CONFIGS["tiles2"], True, (4095, 0)) is fp.CONFIGS["tiles2"]
    # three consumers (the H100 table's D 64 N >= 8192 choice) give way to two at a narrow band: a tile of a few key
    # blocks is where three lose (short N, docs/fa_prefill.md)
    assert fp.config_for_window(fp.CONFIGS["c3"], True, (127, 0)) is fp.CONFIGS["tiles8"]
    assert fp.config_for_window(fp.CONFIGS["c3"], True, (4095, 0)) is fp.CONFIGS["c3"]
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)  # the device query faked to a Hopper: nothing runs
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")  # the kernel's own rule (no GPU, no table here anyway)
    ws = {w.name: w for w in workloads.load_config("sweep")}
    assert auto.choice(ws["sweep_prefill_gpt-oss-20b:local_n4096"])["chose"] == "fa_prefill:tiles8"
    assert auto.choice(ws["sweep_prefill_mistral-7b-v0.1_n4096"])["chose"] == "fa_prefill:default"
    assert auto.choice(ws["sweep_prefill_gemma-2-9b:local_n4096"])["chose"] == "fa_prefill:default"


def test_wide_causal_windows_over_two_windows_of_rows_run_eight_tiles_at_d128(monkeypatch):
    """fa_prefill.config_for_window's wide-window rule: a causal window of w keys over N rows with w < N <= 2 w at
    D 128 runs WIDE_WINDOW_TILES (Mistral's 4096-key window at N 8192, session 30: tiles8 0.976-0.979x one tile in
    three H200 runs); N 16384 (0.987x), N <= w (the window masks nothing: the dense row's config), D 256 (Gemma-2's
    local layers lose 2%) and calls without the shape (the chunked path) keep the shape's config; the drop-in names it
    only for self-attention (q_len == kv_len)."""
    from compare import auto, workloads

    d, w = fp.CONFIGS["default"], (4095, 0)
    assert fp.config_for_window(d, True, w, q_len=8192, kv_len=8192, head_dim=128) == fp.CONFIGS["tiles8"]
    assert fp.config_for_window(d, True, w, q_len=4097, kv_len=4097, head_dim=128) == fp.CONFIGS["tiles8"]
    for q_len, head_dim in ((16384, 128), (8193, 128), (4096, 128), (8192, 256), (8192, 64), (8192, None),
                            (None, 128)):
        assert fp.config_for_window(d, True, w, q_len=q_len, kv_len=q_len, head_dim=head_dim) is d, (q_len, head_dim)
    assert fp.config_for_window(d, False, (4095, 4095), q_len=8192, kv_len=8192, head_dim=128) is d  # two-sided
    assert fp.config_for_window(d, True, w, q_len=8192, kv_len=12288, head_dim=128) is d  # not self-attention
    assert fp.config_for_window(fp.CONFIGS["tiles2"], True, w, q_len=8192, kv_len=8192,
                                head_dim=128) is fp.CONFIGS["tiles2"]
    assert fp.config_for_window(fp.CONFIGS["c3"], True, w, q_len=8192, kv_len=8192,
                                head_dim=128) is fp.CONFIGS["tiles8"]
    assert fp.config_for_features(d, causal=True, window=w, q_len=8192, packed=False, kv_len=8192,
                                  head_dim=128) == fp.CONFIGS["tiles8"]
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)  # the device query faked to a Hopper: nothing runs
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")  # the kernel's own rule: default at every dense shape
    ws = {x.name: x for x in workloads.load_config("sweep")}
    assert auto.choice(ws["sweep_prefill_mistral-7b-v0.1_n8192"])["chose"] == "fa_prefill:tiles8"
    assert auto.choice(ws["sweep_prefill_mistral-7b-v0.1_n16384"])["chose"] == "fa_prefill:default"
    assert auto.choice(ws["sweep_prefill_gemma-2-9b:local_n8192"])["chose"] != "fa_prefill:tiles8"
    base = Problem(entry="dense", dtype="bfloat16", batch=4, q_len=8192, kv_len=8192, heads_q=32, heads_kv=8,
                   head_dim=128, causal=True)
    assert dropin.prefill_config(base, w) == fp.CONFIGS["tiles8"]
    cross = dataclasses.replace(base, kv_len=12288)  # rows and keys not one sequence: the shape's config
    assert dropin.prefill_config(cross, w) is dropin.prefill_config(cross, None)


def test_packed_documents_run_four_tiles_per_cta_to_4096_tokens_and_two_to_8192(monkeypatch):
    """fa_prefill.config_for_packed: packed documents in rows of at most 4096 tokens get four row tiles per CTA, up to
    8192 two (whatever the dense row's tiles; c3 gives way to tiles4 / tiles2); longer rows keep the shape's config;
    compare's pallas:auto names it, and the drop-in hands it to the kernel pair (packed training)."""
    from compare import auto, workloads

    d = fp.CONFIGS["default"]
    assert fp.PACKED_TILES == ((4096, 4), (8192, 2)) and fp.PACKED_TILES_MAX_Q_LEN == 8192
    assert fp.config_for_packed(d, 4096) == fp.CONFIGS["tiles4"]
    assert fp.config_for_packed(d, 512) == fp.CONFIGS["tiles4"]
    assert fp.config_for_packed(d, 4097) == fp.CONFIGS["tiles2"] == fp.config_for_packed(d, 8192)
    assert fp.config_for_packed(d, 8193) is d and fp.config_for_packed(d, 16384) is d
    assert fp.config_for_packed(fp.CONFIGS["c3"], 4096) is fp.CONFIGS["tiles4"]
    assert fp.config_for_packed(fp.CONFIGS["c3"], 8192) is fp.CONFIGS["tiles2"]
    # the packed rule's tiles whatever the dense row's (the H200's dense N 4096 row is tiles8 since session 30)
    assert fp.config_for_packed(fp.CONFIGS["tiles8"], 1024) is fp.CONFIGS["tiles4"]
    assert fp.config_for_packed(fp.CONFIGS["tiles8"], 4096) is fp.CONFIGS["tiles4"]
    assert fp.config_for_packed(fp.CONFIGS["tiles4"], 8192) is fp.CONFIGS["tiles2"]
    assert fp.config_for_packed(fp.CONFIGS["tiles4"], 4096) is fp.CONFIGS["tiles4"]
    assert fp.config_for_packed(fp.CONFIGS["tiles8"], 16384) is fp.CONFIGS["tiles8"]
    # the named object, so fit() adapts it at D 256 (an unnamed copy of 128-key tiles would not fit shared memory)
    for c in (fp.config_for_packed(d, 4096), fp.config_for_window(d, True, (127, 0))):
        assert any(c is n for n in fp.CONFIGS.values()), c
        assert fp.smem_bytes(256, 2, fp.fit(c, 256)) <= fp._SMEM_LIMIT
    pp = fp.config_for_packed(fp.CONFIGS["pingpong"], 2048)
    assert pp.tiles == 4 and pp.pingpong
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)  # the device query faked to a Hopper: nothing runs
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")  # the kernel's own rule (no GPU, no table here anyway)
    ws = {w.name: w for w in workloads.load_config("sweep")}
    for model in ("llama-3.1-8b", "gpt-2"):
        assert auto.choice(ws[f"sweep_prefill_packed_{model}_n4096"])["chose"] == "fa_prefill:tiles4"
        assert auto.choice(ws[f"sweep_prefill_packed_{model}_n16384"])["chose"] == "fa_prefill:default"
    # the drop-in's packed training path hands the packed config to the pair (captured, not run)
    seen = []

    def fake_pair(q, k, v, *, config, **kw):
        seen.append(config)
        return jnp.zeros(q.shape, q.dtype)

    monkeypatch.setattr(fb, "attention_lse", fake_pair)
    monkeypatch.setattr(fb, "PACKED_BWD_ON_GPU", True)
    for t, want in ((4096, fp.CONFIGS["tiles4"]), (8192, fp.CONFIGS["tiles2"]), (8448, d)):
        q = jnp.zeros((1, t, 4, 64), jnp.bfloat16)
        seg = jnp.zeros((1, t), jnp.int32)
        seen.clear()
        dropin._pallas(q, q, q, kernel=dropin._PREFILL, scale=0.125, is_causal=True, q_lens=None, kv_lens=None,
                       window=None, return_residual=False, segment_ids=seg)
        assert seen == [want], (t, seen)


def test_the_pair_without_a_config_takes_the_packed_rule(monkeypatch):
    """fa_prefill_bwd.attention_lse called with packed documents and no config (fa_prefill's heuristic) applies the
    drop-in's packed rule too, so the kernel's own entry and the drop-in run the same forward."""
    seen = []
    real = fp.config_for_packed

    def spy(cfg, q_len):
        out = real(cfg, q_len)
        seen.append((q_len, out))
        return out

    monkeypatch.setattr(fp, "config_for_packed", spy)
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")
    t = 96
    q = jax.random.normal(jax.random.PRNGKey(3), (1, t, 2, 64), jnp.float32).astype(jnp.bfloat16)
    seg = jnp.asarray(np.repeat(np.arange(3), (20, 50, 26))[None], jnp.int32)
    out = fb.attention_lse(q, q, q, causal=True, scale=0.125, interpret=True, with_lse=False, segment_ids=seg)
    assert seen == [(t, fp.CONFIGS["tiles4"])]
    ref, _ = oracle.attention_reference(q, q, q, causal=True, scale=0.125, q_segments=np.asarray(seg))
    o64 = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert np.linalg.norm(o64 - ref) / np.linalg.norm(ref) < 1e-2


def test_c3_at_d256_fits_with_two_consumers_whether_or_not_the_lse_is_returned():
    """c3 at D 256: three consumers with 64-key tiles estimate 372 bytes under the shared-memory limit without the
    LSE staging and failed Mosaic GPU's pass pipeline on an H200 (session 29), so fit() counts the LSE either way and
    gives two consumers; a config built by hand that fits only without the LSE is refused by name, not compiled."""
    import dataclasses

    c3 = fp.CONFIGS["c3"]
    for with_lse in (True, False):
        cfg = fp.fit(c3, 256, 2, with_lse)
        assert cfg.consumers == 2 and (cfg.block_kv, cfg.stages) == (64, 2), with_lse
        assert fp.smem_bytes(256, 2, cfg) <= fp._SMEM_LIMIT
    tight = dataclasses.replace(c3, block_kv=64, stages=2)  # not a named config: fit() returns it as is
    assert fp.smem_bytes(256, 2, tight, with_lse=False) <= fp._SMEM_LIMIT < fp.smem_bytes(256, 2, tight)
    q = jnp.zeros((1, 128, 2, 256), jnp.bfloat16)
    with pytest.raises(ValueError, match="LSE staging counted"):
        fp.forward(q, q, q, causal=True, scale=0.0625, q_offset=jnp.zeros((1,), jnp.int32), interpret=False,
                   config=tight, return_lse=False)


@pytest.mark.parametrize("bkv", [64, 128])
@pytest.mark.parametrize("window", [None, (127, 0)])
def test_block_schedule_with_packed_documents(bkv, window):
    """Packed documents (``segment_ids``): row i sees j iff start[i] <= j <= i (and the window). For random document
    mixes, every row tile's blocks hold every key its rows see, and blocks run unmasked are visible to all its rows."""
    hi_off, lo_off = fp._mask_bounds(True, window)
    bq = 64
    rng = np.random.default_rng(bkv)
    for trial in range(6):
        t = int(rng.integers(64, 700))
        cuts = np.sort(rng.choice(np.arange(1, t), size=int(rng.integers(0, 6)), replace=False))
        seg = np.zeros(t, np.int32)
        for c in cuts:
            seg[c:] += 1
        starts = np.asarray(fp.segment_starts(seg[None]))[0]
        t_pad = -(-t // (2 * bq)) * 2 * bq
        starts_p = np.concatenate([starts, np.full(t_pad - t, starts[-1])])
        for r0 in range(0, t_pad, bq):
            sb = (jnp.int32(starts_p[r0]), jnp.int32(starts_p[r0 + bq - 1]))
            a, n_lfull, n_full, n_done = (int(x) for x in fp._consumer_bounds(
                jnp.int32(r0), jnp.int32(0), bq=bq, bkv=bkv, tk=t, hi_off=hi_off, lo_off=lo_off, seg=sb))
            i = np.arange(r0, r0 + bq)[:, None]
            j = np.arange(t)[None, :]
            vis = (j <= i) & (j >= starts_p[r0:r0 + bq, None])
            if lo_off is not None:
                vis &= j >= i - lo_off
            tag = (trial, t, list(cuts), r0)
            cols = np.nonzero(vis.any(axis=0))[0]
            if cols.size:
                assert a * bkv <= cols.min() and cols.max() < n_done * bkv, tag
            pbm, pro_masked, lo = (x for x in fp._pipeline_plan(a, n_lfull, n_full, n_done, banded=True))
            unmasked = set(range(int(pbm) + 1, int(lo))) | (set() if bool(pro_masked) else {int(pbm)})
            bm, f = (int(x) for x in fp._serial_plan(a, n_lfull, n_full, n_done, banded=True))
            for s in unmasked | set(range(bm, f)):
                assert vis[:, s * bkv:(s + 1) * bkv].shape[1] == bkv and vis[:, s * bkv:(s + 1) * bkv].all(), (tag, s)


@pytest.mark.parametrize("kw", [{}, dict(window=(63, 0)), dict(sinks=True, softcap=20.0)], ids=str)
def test_packed_twin_matches_the_oracle(rng, kw):
    b, t, hq, hkv, d = 2, 300, 4, 2, 64
    q = jnp.asarray(rng.standard_normal((b, t, hq, d)), jnp.float16)
    k = jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.float16)
    v = jnp.asarray(rng.standard_normal((b, t, hkv, d)), jnp.float16)
    seg = np.stack([np.repeat(np.arange(3), (100, 37, 163)), np.repeat([4, 1, 4], (5, 200, 95))]).astype(np.int32)
    okw = _oracle_kw(kw, hq, rng)
    o, lse = fp.forward(q, k, v, causal=True, scale=0.125, q_offset=jnp.zeros((b,), jnp.int32), interpret=True,
                        config=fp.CONFIGS["default"], return_lse=True, segment_ids=seg, **okw)
    # the oracle's segments compare ids: the second row's id 4 reappears, a new document for us, so give the oracle
    # the contiguous numbering
    contiguous = np.stack([np.repeat(np.arange(3), (100, 37, 163)), np.repeat(np.arange(3), (5, 200, 95))])
    ro, rl = oracle.attention_reference(q, k, v, causal=True, scale=0.125, q_segments=contiguous, **okw)
    assert np.linalg.norm(np.asarray(o, np.float64) - ro) / np.linalg.norm(ro) < 4e-3
    np.testing.assert_allclose(np.asarray(lse, np.float64), rl, atol=1e-3)
    with pytest.raises(ValueError, match="causal self-attention"):
        fp.forward(q, k, v, causal=False, scale=0.125, q_offset=jnp.zeros((b,), jnp.int32), interpret=True,
                   config=fp.CONFIGS["default"], segment_ids=seg)
    with pytest.raises(ValueError, match="segment_ids must be int"):
        fp.forward(q, k, v, causal=True, scale=0.125, q_offset=jnp.zeros((b,), jnp.int32), interpret=True,
                   config=fp.CONFIGS["default"], segment_ids=seg[:, :10])


@pytest.mark.parametrize("cfg", ["default", "serial", "pingpong", "tiles4"])
def test_packed_mosaic_kernel_lowers_for_cuda(cfg, monkeypatch):
    """The packed kernel lowers (``PACKED_ON_GPU``, on since its GPU test passed), and is refused when switched off."""
    q = jax.ShapeDtypeStruct((2, 600, 4, 128), jnp.bfloat16)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)
    seg = jax.ShapeDtypeStruct((2, 600), jnp.int32)
    assert fp.PACKED_ON_GPU
    monkeypatch.setattr(fp, "PACKED_ON_GPU", False)
    with pytest.raises(NotImplementedError, match="switched off"):
        jax.jit(lambda q, off, seg: fp.forward(q, q, q, causal=True, scale=0.1, q_offset=off, interpret=False,
                                                config=fp.CONFIGS[cfg], segment_ids=seg)).trace(q, off, seg)
    monkeypatch.setattr(fp, "PACKED_ON_GPU", True)
    off = jax.ShapeDtypeStruct((2,), jnp.int32)
    seg = jax.ShapeDtypeStruct((2, 600), jnp.int32)

    def f(q, off, seg):
        return fp.forward(q, q, q, causal=True, scale=0.1, q_offset=off, interpret=False, config=fp.CONFIGS[cfg],
                          return_lse=True, segment_ids=seg, window=(127, 0))

    assert fp.PASS_FWD in jax.jit(f).trace(q, off, seg).lower(lowering_platforms=("cuda",)).as_text()


def test_dropin_segment_ids_extension(rng, monkeypatch):
    """``segment_ids`` on the drop-in: fa_prefill's forward (packed documents), refusals that name the argument, no
    gradient."""
    q = jnp.asarray(rng.standard_normal((2, 160, 4, 64)), jnp.bfloat16)
    k = jnp.asarray(rng.standard_normal((2, 160, 2, 64)), jnp.bfloat16)
    seg = jnp.asarray(np.stack([np.repeat(np.arange(2), (70, 90)), np.repeat(np.arange(3), (10, 100, 50))]),
                      jnp.int32)
    impl, why = dropin.which_implementation(q, k, k, is_causal=True, segment_ids=seg)
    assert impl == "pallas:fa_prefill" and "segment_ids" in why
    o = pallas_attn.dot_product_attention(q, k, k, is_causal=True, segment_ids=seg)
    ro, _ = oracle.attention_reference(q, k, k, causal=True, q_segments=np.asarray(seg))
    assert np.linalg.norm(np.asarray(o, np.float64) - ro) / np.linalg.norm(ro) < 2e-2
    with pytest.raises(NotImplementedError, match="causal self-attention"):
        dropin.which_implementation(q, k, k, is_causal=False, segment_ids=seg)
    with pytest.raises(ValueError, match="segment_ids must be int"):
        dropin.which_implementation(q, k, k, is_causal=True, segment_ids=seg[:, :5])
    with pytest.raises(NotImplementedError, match="fa_prefill only"):
        dropin.which_implementation(q, k, k, is_causal=True, segment_ids=seg, implementation="xla")
    # on a Hopper while the packed backward's GPU switch is off: forward only, and differentiating raises
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    monkeypatch.setattr(fb, "PACKED_BWD_ON_GPU", False)
    impl, why = dropin.which_implementation(q, k, k, is_causal=True, segment_ids=seg)
    assert impl == "pallas:fa_prefill" and "forward only" in why and "PACKED_BWD_ON_GPU" in why, why


# packed documents alone through the kernels: tests/test_fa_prefill_bwd.py::test_packed_backward_on_the_gpu_interpreter
@pytest.mark.parametrize("with_cap_sinks", [True])
def test_dropin_packed_documents_grads_match_oracle(rng, with_cap_sinks):
    """segment_ids through the drop-in, differentiated (interpret mode: fa_prefill's twin forward and fa_prefill_bwd's
    packed kernels on JAX's GPU interpreter, the drop-in's backward config), alone and with soft-cap + sinks: output,
    dq / dk / dv (and the sinks' gradient) against the float64 oracle, documents of 5, 60 and 31 tokens (a boundary
    inside a 64-row block and one near a tile edge)."""
    q, k, v, do = (jnp.asarray(rng.standard_normal(s), jnp.bfloat16)
                   for s in ((1, 96, 2, 64), (1, 96, 1, 64), (1, 96, 1, 64), (1, 96, 2, 64)))
    seg = np.repeat(np.arange(3), (5, 60, 31))[None].astype(np.int32)
    sinks = jnp.asarray([0.3, -0.5], jnp.float32)
    kw = dict(softcap=20.0) if with_cap_sinks else {}

    def f(q, k, v, s):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=True, segment_ids=jnp.asarray(seg),
                                                 sinks=s if with_cap_sinks else None, **kw)

    out, vjp = jax.vjp(f, q, k, v, sinks)
    ref = oracle.attention_grad_reference(q, k, v, do, causal=True, scale=64 ** -0.5, q_segments=seg,
                                          kv_segments=seg, sinks=np.asarray(sinks) if with_cap_sinks else None, **kw)
    grads = vjp(do)
    names = ("out", "dq", "dk", "dv") + (("dsinks",) if with_cap_sinks else ())
    for name, a in zip(names, (out, *grads)):
        a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
        assert np.linalg.norm(a - ref[name]) / np.linalg.norm(ref[name]) < 2e-2, name
