"""Issue 26 item 2's leftovers: the drop-in's backward config and the chunked path's kernels resolve through the one
resolver (``api.resolve`` / ``api.resolve_pair``) over the one ``Problem``; a kernel declares its backward with its
configs and chooser (``Kernel.backward``, a ``Backward``)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from pallas_attn import api, chunked, dropin, registry, tuning
from pallas_attn.kernels import fa_decode, fa_prefill, fa_prefill_bwd, fa_train
from pallas_attn.kernels.contract import Backward, Problem

sds = jax.ShapeDtypeStruct


def _p(d=64, causal=True, dtype="float16", b=2, t=128, s=128, hq=4, hkv=2):
    return Problem(entry="dense", dtype=dtype, batch=b, q_len=t, kv_len=s, heads_q=hq, heads_kv=hkv, head_dim=d,
                   causal=causal)


def test_the_kernels_declare_their_backward_with_its_configs_and_chooser():
    """fa_prefill declares fa_prefill_bwd (its configs, its chooser, config_for) for the drop-in only; fa_train's
    backward is set by its forward config and serves attention and the drop-in; no other built kernel has one."""
    bwd = fa_prefill.KERNEL.backward
    assert isinstance(bwd, Backward) and bwd.kernel == "fa_prefill_bwd"
    assert dict(bwd.configs) == fa_prefill_bwd.CONFIGS and bwd.config_cls is fa_prefill_bwd.BwdConfig
    assert bwd.heuristic is fa_prefill_bwd.heuristic
    assert bwd.runs(_p(d=256), fa_prefill_bwd.CONFIGS["wide"]) == fa_prefill_bwd.CONFIGS["d256"]
    assert bwd.runs(_p(d=128), fa_prefill_bwd.CONFIGS["wide"]) == fa_prefill_bwd.CONFIGS["wide"]
    assert fa_prefill.KERNEL.differentiates("dot_product_attention")
    assert not fa_prefill.KERNEL.differentiates("attention")
    tb = fa_train.KERNEL.backward
    assert tb.kernel is None and not tb.configs
    assert fa_train.KERNEL.differentiates("attention") and fa_train.KERNEL.differentiates("dot_product_attention")
    others = {r.generation for r in registry.rows() if registry.built(r.generation)
              and registry.kernel(r.generation).backward is not None}
    assert others == {"fa_train", "fa_prefill"}, others


def test_a_backward_declaration_is_checked():
    with pytest.raises(ValueError, match="non-empty subset"):
        Backward("x", entries={"nope"})
    with pytest.raises(ValueError, match="declares no configs"):
        Backward("x", entries={"attention"}, configs={"a": 1})
    with pytest.raises(ValueError, match="declares config_cls, configs and heuristic"):
        Backward("x", entries={"attention"}, kernel="k")


@pytest.mark.parametrize("chip", ["h100", "h200", None])
def test_resolve_pair_gives_the_table_choice_a_named_config_or_a_refusal_by_name(chip, monkeypatch):
    """The default backward config is the declared chooser's (the table, else the rule), with and without
    determinism, exactly ``dropin.bwd_config_name``'s; a name or a BwdConfig is returned as given; an unknown name
    is a ValueError listing fa_prefill_bwd's configs; the forward's refusals are ``resolve``'s, word for word."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    cf = fa_prefill_bwd.CONFIGS
    with tuning.use_chip(chip):
        for p in (_p(), _p(causal=False), _p(d=128, b=4, t=4096, s=4096, hq=32, hkv=8), _p(d=256, dtype="bfloat16"),
                  _p(d=64, b=8, t=1024, s=1024, hq=12, hkv=12)):
            for det in (None, True, False):
                kern, fwd, bwd = api.resolve_pair("fa_prefill", p, None, None, deterministic=det)
                assert kern is fa_prefill.KERNEL and fwd == api.resolve("fa_prefill", p, None)[1]
                assert bwd == cf[dropin.bwd_config_name(p, det)], (chip, p, det)
                if det:
                    assert not bwd.fused_dq
            for name in cf:
                assert api.resolve_pair("fa_prefill", p, "pingpong", name)[2] == cf[name]
            custom = fa_prefill_bwd.BwdConfig(stages=3)
            assert api.resolve_pair("fa_prefill", p, None, custom)[2] is custom
    with pytest.raises(ValueError, match=r"fa_prefill_bwd has configs \[.*'wide'.*\]; got bwd_config='nope'"):
        api.resolve_pair("fa_prefill", _p(), None, "nope")
    with pytest.raises(ValueError, match="bwd_config must be a BwdConfig"):
        api.resolve_pair("fa_prefill", _p(), None, 3)
    with pytest.raises(ValueError, match="fa_train's backward runs at its forward config"):
        api.resolve_pair("fa_train", _p(), None, "wide")
    assert api.resolve_pair("fa_train", _p(), None, None)[1:] == (fa_train.heuristic(_p()), None)
    with pytest.raises(NotImplementedError, match="'v4_fused' has no backward kernel"):
        api.resolve_pair("v4_fused", _p(dtype="float32", hkv=4), None, None)
    with pytest.raises(NotImplementedError, match="'fa_prefill' has no backward kernel"):
        api.resolve_pair("fa_prefill", _p(), None, None, entry="attention")
    for bad in (_p(dtype="float32"), _p(d=80)):  # the forward's refusal first, as resolve words it
        with pytest.raises(NotImplementedError) as e1:
            api.resolve("fa_prefill", bad, None)
        with pytest.raises(NotImplementedError) as e2:
            api.resolve_pair("fa_prefill", bad, None, "wide")
        assert str(e1.value) == str(e2.value)


def test_deterministic_flag_steers_the_default_not_a_named_config(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    p = _p()  # causal D 64: fused without determinism (no table here)
    with tuning.use_chip(None):
        assert api.resolve_pair("fa_prefill", p)[2] == fa_prefill_bwd.CONFIGS["wide"]
        assert api.resolve_pair("fa_prefill", p, deterministic=False)[2] == fa_prefill_bwd.CONFIGS["fused"]
        assert api.resolve_pair("fa_prefill", p, None, "fused")[2] == fa_prefill_bwd.CONFIGS["fused"]
    assert dropin.deterministic_asked is api.deterministic_asked
    assert dropin.DROPIN_BWD_CONFIG is fa_prefill_bwd.RULE_CONFIG
    assert dropin.NONDET_BWD_CONFIG == fa_prefill_bwd.NONDET_CONFIG


def _spy_backward(monkeypatch):
    seen, real = [], fa_prefill_bwd.attention_lse

    def spy(*a, config, bwd_config, **kw):
        seen.append((config, bwd_config))
        return real(*a, config=config, bwd_config=bwd_config, **kw)

    monkeypatch.setattr(fa_prefill_bwd, "attention_lse", spy)
    return seen


def test_a_named_backward_config_reaches_the_backward(monkeypatch):
    """The drop-in's ``bwd_config=`` (a name or a BwdConfig) is what fa_prefill_bwd gets, with the forward config the
    resolver gives; None gives the chooser's (traced only: nothing runs)."""
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    seen = _spy_backward(monkeypatch)
    q = sds((1, 128, 2, 64), jnp.float16)
    cf = fa_prefill_bwd.CONFIGS
    for name in (None, "wide", "wide_ovl", "fused", "default", cf["wide_s3"]):
        jax.eval_shape(lambda q, k, v, n=name: pallas_attn.dot_product_attention(q, k, v, is_causal=True,
                                                                                 bwd_config=n), q, q, q)
    p = _p(b=1, hq=2, hkv=2)
    fwd = api.resolve("fa_prefill", p, None)[1]
    want = [cf[dropin.bwd_config_name(p)], cf["wide"], cf["wide_ovl"], cf["fused"], cf["default"], cf["wide_s3"]]
    assert [b for _, b in seen] == want and all(f == fwd for f, _ in seen), seen
    # a causal-shaped window: the same pair, the named config too
    jax.eval_shape(lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, local_window_size=(31, 0),
                                                                     bwd_config="wide_ovl"), q, q, q)
    assert seen[-1][1] == cf["wide_ovl"]


def test_a_named_backward_config_is_the_lowered_backward(monkeypatch):
    """End to end (lowered for CUDA, nothing runs): ``bwd_config="wide"`` lowers fa_prefill_bwd's dK/dV and dQ
    kernels, ``"fused"`` the five-product kernel alone (no dQ kernel)."""
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    q, kv = sds((2, 256, 8, 64), jnp.float16), sds((2, 256, 2, 64), jnp.float16)

    def names(bwd):
        def loss(q, k, v):
            return jnp.sum(pallas_attn.dot_product_attention(q, k, v, is_causal=True, bwd_config=bwd
                                                             ).astype(jnp.float32))
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
            lowering_platforms=("cuda",)).as_text()
        return set(re.findall(r"pallas_attn_\w+", text))

    wide = names("wide")
    assert {"pallas_attn_fa_prefill_bwd_dkdv", "pallas_attn_fa_prefill_bwd_dq"} <= wide, wide
    fused = names("fused")
    assert "pallas_attn_fa_prefill_bwd_dq" not in fused and "pallas_attn_fa_prefill_fwd" in fused, fused


def test_a_bad_or_misplaced_backward_config_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    q = sds((1, 128, 2, 64), jnp.float16)

    def call(q, k, v, **kw):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=True, **kw)

    with pytest.raises(ValueError, match=r"fa_prefill_bwd has configs \[.*\]; got bwd_config='wider'"):
        jax.eval_shape(lambda q, k, v: call(q, k, v, bwd_config="wider"), q, q, q)
    with pytest.raises(ValueError, match="fa_train's backward runs at its forward config"):  # fa_train's pair
        jax.eval_shape(lambda q, k, v: call(q, k, v, bwd_config="wide", implementation="pallas:fa_train"), q, q, q)
    with pytest.raises(ValueError, match="fa_train's backward runs at its forward config"):  # a two-sided window
        jax.eval_shape(lambda q, k, v: pallas_attn.dot_product_attention(
            q, k, v, local_window_size=(31, 5), bwd_config="wide"), q, q, q)
    with pytest.raises(NotImplementedError, match="runs jax.nn's 'xla'"):
        call(jnp.zeros((1, 8, 2, 64), jnp.float16), *(jnp.zeros((1, 8, 2, 64), jnp.float16),) * 2,
             bwd_config="wide", implementation="xla")
    with pytest.raises(NotImplementedError, match="no backward to configure"):  # forward only: a two-sided window
        jax.eval_shape(lambda q, k, v: pallas_attn.dot_product_attention(
            q, k, v, local_window_size=(31, 5), softcap=20.0, bwd_config="wide"), q, q, q)


# ---- the chunked path


def _paged(b, tq, hq, hkv, d, page, kv, dtype=jnp.bfloat16):
    pps = -(-max(kv) // page)
    q, pool = sds((b, tq, hq, d), dtype), sds((b * pps + 1, page, hkv, d), dtype)
    bt = np.arange(b * pps, dtype=np.int32).reshape(b, pps)
    return q, pool, bt, np.asarray(kv, np.int32), pps


@pytest.mark.parametrize("chip", ["h100", None])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("window", [None, 128])
def test_chunked_configs_come_from_the_resolver(monkeypatch, chip, page, window):
    """A chunk of a paged cache (pages 16 / 64, q_lens mixing decodes into the chunks): fa_prefill runs the config
    ``chunked.resolve_chunk`` gives, which is ``api.resolve``'s for the chunk's dense shape over the page-rounded
    cache then the window's rule (the drop-in's forward config there, ``dropin.prefill_config``); the decodes run
    fa_decode at ``api.resolve``'s config (traced only)."""
    seen = []
    real_fwd, real_dec = fa_prefill.forward, fa_decode.paged_forward
    monkeypatch.setattr(fa_prefill, "forward", lambda *a, config, **k: seen.append(("fa_prefill", config)) or
                        real_fwd(*a, config=config, **k))
    monkeypatch.setattr(fa_decode, "paged_forward", lambda *a, config, **k: seen.append(("fa_decode", config)) or
                        real_dec(*a, config=config, **k))
    b, tq, hq, hkv, d = 3, 64, 8, 2, 128
    q, pool, bt, kl, pps = _paged(b, tq, hq, hkv, d, page, [700, 900, 1000])
    ql = np.asarray([64, 5, 64], np.int32)
    with tuning.use_chip(chip):
        jax.eval_shape(lambda q, kp, vp: pallas_attn.paged_attention(q, kp, vp, bt, kl, causal=True, q_lens=ql,
                                                                     window=window), q, pool, pool)
        dense = chunked._problem(q, pps * page, hkv)
        band = None if window is None else (window - 1, 0)
        gen, cfg = chunked.resolve_chunk(dense, band, True)
        assert gen == "fa_prefill" and cfg == dropin.prefill_config(dense, band)
        assert cfg == fa_prefill.config_for_window(api.resolve("fa_prefill", dense, None)[1], True, band)
        dec = api.resolve("fa_decode", api.problem_paged(sds((b, 16, hq, d), q.dtype), pool, bt, causal=True),
                          None)[1]
        # its split count planned for the decoding sequences only (ql is concrete here: one of three), one
        # query each, in 16-row tiles
        one = fa_decode.plan(batch=1, hkv=hkv, rows=hq // hkv, d=d, max_kv=pps * page, config=dec, page_size=page)
        assert one.splits > 1
        dec = dataclasses.replace(dec, splits=one.splits, split1_fill=None, block_m_max=16)
    assert seen == [("fa_decode", dec), ("fa_prefill", cfg)], seen


def test_chunked_off_fa_prefill_resolves_fa_train_and_words_its_refusals_as_before(monkeypatch):
    """fp32 (or a head dim fa_prefill lacks) runs fa_train at ``api.resolve``'s config (its heuristic); a head dim
    fa_train lacks is refused with the words fa_train's own shape check used before the chunked path resolved it."""
    seen, real = [], fa_train.attention_lse
    monkeypatch.setattr(fa_train, "attention_lse", lambda *a, config, **k: seen.append(config) or
                        real(*a, config=config, **k))
    for d, dtype in ((64, jnp.float32), (32, jnp.float16)):
        q, pool, bt, kl, pps = _paged(2, 32, 4, 2, d, 16, [100, 120], dtype)
        jax.eval_shape(lambda q, kp, vp, bt=bt, kl=kl: pallas_attn.paged_attention(q, kp, vp, bt, kl, causal=True),
                       q, pool, pool)
        dense = chunked._problem(q, pps * 16, 2)
        assert chunked.resolve_chunk(dense, None, False) == ("fa_train", fa_train.heuristic(dense))
        assert seen[-1] == fa_train.heuristic(dense)
    q, pool, bt, kl, _ = _paged(2, 32, 4, 2, 80, 16, [100, 120], jnp.float16)
    with pytest.raises(NotImplementedError, match=re.escape("fa_train supports head dims (16, 32, 64, 128, 256); got "
                                                            "D=80")):
        jax.eval_shape(lambda q, kp, vp: pallas_attn.paged_attention(q, kp, vp, bt, kl, causal=True), q, pool, pool)
    with pytest.raises(NotImplementedError) as e:  # the same words fa_train's own check raises
        fa_train.check_shapes(jnp.zeros((1, 4, 2, 80)), jnp.zeros((1, 4, 2, 80)), jnp.zeros((1, 4, 2, 80)))
    assert "fa_train supports head dims (16, 32, 64, 128, 256); got D=80" == str(e.value)
    # D 96: fa_prefill takes it on dense K / V only (session 24): a chunk runs it on the gathered pages, and the
    # in-kernel paged path refuses it by name
    q, pool, bt, kl, pps = _paged(2, 32, 4, 2, 96, 16, [100, 120], jnp.float16)
    out = jax.eval_shape(lambda q, kp, vp: pallas_attn.paged_attention(q, kp, vp, bt, kl, causal=True), q, pool, pool)
    assert out.shape == q.shape
    assert chunked.resolve_chunk(chunked._problem(q, pps * 16, 2), None, True)[0] == "fa_prefill"
    with pytest.raises(NotImplementedError, match="a paged cache at head dim 96 is not built"):
        fa_prefill.forward(q, pool, pool, causal=True, scale=0.1, q_offset=jnp.zeros((2,), jnp.int32),
                           interpret=True, config=fa_prefill.CONFIGS["default"], block_table=bt)
