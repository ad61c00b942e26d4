"""pallas_attn.dot_product_attention against jax.nn.dot_product_attention(implementation="xla"), on the CPU.

The Pallas kernels (fa_train: forward, dK/dV, dQ) run in interpret mode. Outputs and gradients must match
jax.nn's XLA path in float32 to 1e-5 (relative to the largest element) across causal / not, GQA G in
{1, 4, 8}, odd lengths, per-sequence lengths (an empty sequence included), local windows (one that leaves
rows with no key: jax.nn returns the mean of V there), rank-3 input and return_residual; fp16 / bf16 within
their rounding error (docstring of the test); NaN / Inf as jax.nn; jit / vmap / grad / value_and_grad / remat / scan /
shard_map; bias and mask fall back (None) or raise ("pallas"); the fp16/bf16/fp32 grads lower to Triton.
Shapes are tiny: every case is one compile of forward + backward in interpret mode.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pallas_attn
from pallas_attn import dropin
from pallas_attn.kernels import fa_train

XLA = dict(implementation="xla")


def _arrays(rng, b, t, s, n, kh, h, dtype="float32"):
    def a(shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)

    return a((b, t, n, h)), a((b, s, kh, h)), a((b, s, kh, h)), a((b, t, n, h))


def _loss_and_grads(fn, q, k, v, w, **kw):
    """One jitted value_and_grad: the output and d(sum(out * w))/d(q, k, v)."""

    def loss(q, k, v):
        out = fn(q, k, v, **kw)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# (B, T, S, N, K, H, causal, window, q_lens, kv_lens)
CASES = [
    pytest.param(2, 13, 29, 2, 2, 16, False, None, None, None, id="mha-odd-lengths"),
    pytest.param(1, 33, 33, 8, 2, 32, True, None, None, None, id="gqa4-causal"),
    pytest.param(1, 20, 40, 8, 1, 16, True, (5, 2), None, None, id="mqa-g8-causal-window"),
    pytest.param(2, 17, 23, 4, 1, 16, False, (3, -2), [11, 17], [0, 19], id="g4-lengths-window-empty-rows"),
    pytest.param(2, 19, 19, 2, 2, 64, True, 4, [19, 6], [12, 19], id="causal-int-window-lengths-d64"),
]


@pytest.mark.slow
@pytest.mark.parametrize("b,t,s,n,kh,h,causal,window,q_lens,kv_lens", CASES)
def test_float32_outputs_and_grads_match_xla(rng, b, t, s, n, kh, h, causal, window, q_lens, kv_lens):
    q, k, v, w = _arrays(rng, b, t, s, n, kh, h)
    kw = dict(is_causal=causal, local_window_size=window,
              query_seq_lengths=None if q_lens is None else jnp.asarray(q_lens, jnp.int32),
              key_value_seq_lengths=None if kv_lens is None else jnp.asarray(kv_lens, jnp.int32))
    assert pallas_attn.which_implementation(q, k, v, **kw)[0] == "pallas:fa_train"
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, implementation="pallas", **kw)
    ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, q, k, v, w, **XLA, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert np.all(np.isfinite(np.asarray(out))), "non-finite output on finite input (an unwritten element?)"
    assert _rel(out, ref) < 1e-5, _rel(out, ref)
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert g.dtype == q.dtype and g.shape == rg.shape
        assert _rel(g, rg) < 1e-5, (name, _rel(g, rg))


@pytest.mark.slow
def test_residual_rank3_and_default_scale(rng):
    """return_residual (jax.nn's logsumexp, BTN, masked rows included) and TNH (rank-3) inputs."""
    q, k, v, _ = _arrays(rng, 1, 9, 14, 4, 2, 16)
    kw = dict(is_causal=True, local_window_size=(2, 0), key_value_seq_lengths=jnp.asarray([5], jnp.int32))
    out, res = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(
        q, k, v, implementation="pallas", return_residual=True, **kw))(q, k, v)
    rout, rres = jax.nn.dot_product_attention(q, k, v, return_residual=True, **XLA, **kw)
    assert _rel(out, rout) < 1e-5 and res.shape == rres.shape == (1, 9, 4) and res.dtype == rres.dtype
    np.testing.assert_allclose(np.asarray(res), np.asarray(rres), rtol=1e-6)
    out3 = jax.jit(lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, implementation="pallas",
                                                                      scale=0.3))(q[0], k[0], v[0])
    assert out3.shape == q[0].shape
    assert _rel(out3, jax.nn.dot_product_attention(q[0], k[0], v[0], scale=0.3, **XLA)) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_within_tolerance(rng, dtype):
    """fp16 / bf16 against the float32 answer on the same (exactly representable) inputs. Output: at most
    twice jax.nn's own low-precision error plus one ulp (both round P to the operand dtype before P V,
    accumulate in fp32 and round once). Gradients (jax.nn's fp16 backward does not run on the CPU): within
    2 eps of the largest element: each is an fp32 sum of products with one factor rounded once to the
    operand dtype (P or dS, relative eps/2) and the result rounded once (eps/2); measured 0.2-0.4 eps."""
    q, k, v, w = _arrays(rng, 2, 24, 40, 4, 1, 32, dtype)
    kw = dict(is_causal=True, key_value_seq_lengths=jnp.asarray([40, 17], jnp.int32))
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, implementation="pallas", **kw)
    f32 = [x.astype(jnp.float32) for x in (q, k, v, w)]
    ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, *f32, **XLA, **kw)
    theirs = jax.nn.dot_product_attention(q, k, v, **XLA, **kw)
    eps = float(jnp.finfo(dtype).eps)
    assert out.dtype == jnp.dtype(dtype)
    assert _rel(out, ref) <= 2 * _rel(theirs, ref) + eps, (_rel(out, ref), _rel(theirs, ref))
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert g.dtype == jnp.dtype(dtype), name
        assert _rel(g, rg) <= 2 * eps, (name, _rel(g, rg) / eps)


def test_nan_and_inf_propagate_as_in_jax_nn(rng):
    """NaN in a query row, +Inf in one key, NaN in one value: the NaN pattern of the output and of the
    gradients is jax.nn's (causal: rows before the bad key never see it; a masked NaN never leaks)."""
    q, k, v, w = _arrays(rng, 1, 12, 12, 2, 1, 16)
    q = q.at[0, 3, 0, 2].set(jnp.nan)
    k = k.at[0, 7, 0, 5].set(jnp.inf)
    v = v.at[0, 9, 0, 1].set(jnp.nan)
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, implementation="pallas",
                                 is_causal=True)
    ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, q, k, v, w, is_causal=True, **XLA)
    assert np.isnan(np.asarray(ref)).any() and not np.isnan(np.asarray(ref)).all()  # the premise
    np.testing.assert_array_equal(np.isnan(np.asarray(out)), np.isnan(np.asarray(ref)))
    for name, g, rg in zip("qkv", grads, ref_grads):
        np.testing.assert_array_equal(np.isnan(np.asarray(g)).any(-1), np.isnan(np.asarray(rg)).any(-1),
                                      err_msg=f"d{name} NaN rows")


@pytest.mark.slow
def test_transforms_jit_vmap_remat_scan_and_jvp(rng):
    """vmap over an extra axis, remat + grad, grad inside lax.scan; jvp raises JAX's clear TypeError."""
    q, k, v, w = _arrays(rng, 2, 16, 16, 2, 1, 16)
    f = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True, implementation="pallas")  # noqa: E731
    r = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, **XLA)  # noqa: E731
    stack = [jnp.stack([x, x[::-1]]) for x in (q, k, v)]
    assert _rel(jax.vmap(f)(*stack), jax.vmap(r)(*stack)) < 1e-5

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)

    g_remat = jax.jit(jax.grad(jax.checkpoint(loss(f)), argnums=1))(q, k, v)
    g_ref = jax.grad(loss(r), argnums=1)(q, k, v)
    assert _rel(g_remat, g_ref) < 1e-5

    def scan_steps(fn):
        def step(qc, _):
            val, dq = jax.value_and_grad(loss(fn))(qc, k, v)
            return qc - 0.1 * dq, val
        return jax.jit(lambda q: jax.lax.scan(step, q, None, length=2))

    (qf, vals), (rq, rvals) = scan_steps(f)(q), scan_steps(r)(q)
    assert _rel(qf, rq) < 1e-5 and _rel(vals, rvals) < 1e-5
    with pytest.raises(TypeError, match="custom_vjp"):
        jax.jvp(f, (q, k, v), (q, k, v))


def test_implementation_choice_fallback_and_errors(rng):
    q, k, v, _ = _arrays(rng, 1, 8, 8, 2, 2, 16)
    bias = jnp.asarray(rng.standard_normal((1, 2, 8, 8)), jnp.float32)
    mask = jnp.asarray(rng.random((1, 1, 8, 8)) > 0.3)
    for kw, word in ((dict(bias=bias), "bias"), (dict(mask=mask), "mask")):
        impl, why = pallas_attn.which_implementation(q, k, v, **kw)
        assert impl == "xla" and word in why
        with pytest.raises(NotImplementedError, match=word):
            pallas_attn.dot_product_attention(q, k, v, implementation="pallas", **kw)
        out = pallas_attn.dot_product_attention(q, k, v, **kw)  # the fallback computes jax.nn's answer
        np.testing.assert_array_equal(np.asarray(out), np.asarray(jax.nn.dot_product_attention(q, k, v, **kw)))
    q48 = jnp.zeros((1, 8, 2, 48), jnp.float32)
    assert pallas_attn.which_implementation(q48, q48, q48)[0] == "xla"
    with pytest.raises(NotImplementedError, match="head dims"):
        pallas_attn.dot_product_attention(q48, q48, q48, implementation="pallas")
    assert pallas_attn.which_implementation(q, k, v, implementation="xla")[0] == "xla"
    with pytest.raises(ValueError, match="implementation"):
        pallas_attn.dot_product_attention(q, k, v, implementation="triton")
    with pytest.raises(ValueError, match="query heads"):
        pallas_attn.dot_product_attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2))
    with pytest.raises(ValueError, match="key_value_seq_lengths"):
        pallas_attn.dot_product_attention(q, k, v, key_value_seq_lengths=jnp.zeros((1,), jnp.float32))
    with pytest.raises(ValueError, match="dtype"):
        pallas_attn.dot_product_attention(q.astype(jnp.float16), k, v)


def test_grads_lower_to_triton_for_cuda():
    """Forward + backward of every dtype lower for the CUDA platform on this CPU machine: the three
    pallas_calls are Triton calls (catches what interpret mode lets through: shapes, dots, primitives)."""
    for dt in ("float16", "bfloat16", "float32"):
        q = jax.ShapeDtypeStruct((2, 300, 8, 128), dt)
        k = jax.ShapeDtypeStruct((2, 280, 2, 128), dt)
        lens = jax.ShapeDtypeStruct((2,), jnp.int32)

        def loss(q, k, v, lens):  # the drop-in's kernel call, with interpret=False (no GPU here)
            out, lse = fa_train.attention_lse(q, k, v, causal=True, scale=0.1, q_lens=lens, kv_lens=lens,
                                              window=(64, 0), interpret=False, config=fa_train.CONFIGS["default"])
            return jnp.sum(out.astype(jnp.float32)) + jnp.sum(lse)

        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, lens).lower(
            lowering_platforms=("cuda",)).as_text()
        names = set(re.findall(r"pallas_attn_\w+", text))
        assert names == {"pallas_attn_fa_train_fwd", "pallas_attn_fa_train_dkdv", "pallas_attn_fa_train_dq"}, names
        assert text.count("xla.gpu.triton") >= 3


@pytest.mark.slow
def test_attention_entry_default_generation_and_grad(rng):
    """``attention()``'s default is the best built kernel for the input (bf16 GQA prefill works, fp32 too),
    its gradient runs fa_train's backward, and a generation without a backward says so."""
    q, k, v, w = _arrays(rng, 1, 12, 12, 4, 2, 32)
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True, **XLA)
    out = pallas_attn.attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16), causal=True)
    assert out.dtype == jnp.bfloat16 and _rel(out.astype(jnp.float32), ref) < 2e-2
    g = jax.grad(lambda k: jnp.sum(pallas_attn.attention(q, k, v, causal=True) * w))(k)
    g_ref = jax.grad(lambda k: jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=True, **XLA) * w))(k)
    assert _rel(g, g_ref) < 1e-5
    x = jnp.asarray(rng.standard_normal((1, 8, 2, 64)), jnp.float32)
    with pytest.raises(NotImplementedError, match="v4_fused' has no backward"):
        jax.grad(lambda x: jnp.sum(pallas_attn.attention(x, x, x, generation="v4_fused", interpret=True)))(x)


def test_v5_v6_refuse_float32_unless_host_cast(rng):
    """No silent fp32 -> fp16 cast: v5_wmma / v6_splitkv refuse float32 naming the dtypes; the reference
    host's cast stays available as an explicit config (``host_cast=True``)."""
    from pallas_attn.kernels import v5_wmma, v6_splitkv

    q = jnp.asarray(rng.standard_normal((1, 8, 2, 64)), jnp.float32)
    for gen, mod, cfg in (("v5_wmma", v5_wmma, v5_wmma.WmmaConfig(host_cast=True)),
                          ("v6_splitkv", v6_splitkv, v6_splitkv.SplitKVConfig(host_cast=True))):
        with pytest.raises(NotImplementedError, match="float32"):
            pallas_attn.attention(q, q, q, generation=gen, interpret=True)
        with pytest.raises(NotImplementedError, match="host_cast"):
            mod.forward(q, q, q, causal=False, scale=0.125, q_offset=0, interpret=True, config=mod.CONFIGS["faithful"])
        out = mod.forward(q, q, q, causal=False, scale=0.125, q_offset=0, interpret=True, config=cfg)
        assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
        assert "host_cast" in str(dict(pallas_attn.generations()[[g.id for g in pallas_attn.generations()].index(
            gen)].precision))


_SHARD = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4 " + os.environ.get("XLA_FLAGS", "")
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    import pallas_attn
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("b", "h"))
    rng = np.random.default_rng(0)
    q, k, v, w = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in
                  ((2, 16, 4, 16), (2, 16, 2, 16), (2, 16, 2, 16), (2, 16, 4, 16)))
    spec = P("b", None, "h", None)
    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v) * w)
    ours = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True, implementation="pallas")
    sharded = jax.shard_map(ours, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec,
                            check_vma=False)
    xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    g = jax.jit(jax.grad(loss(sharded), argnums=(0, 1, 2)))(q, k, v)
    r = jax.grad(loss(xla), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, r):
        assert float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) < 1e-5
    print("OK")
""")


@pytest.mark.slow
def test_shard_map_over_batch_and_heads():
    """shard_map over a (batch, heads) mesh of 4 virtual CPU devices (GQA heads split with their KV head):
    gradients equal jax.nn's unsharded ones. Needs --xla_force_host_platform_device_count (a subprocess)."""
    res = subprocess.run([sys.executable, "-c", _SHARD], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "OK" in res.stdout, res.stderr[-3000:]


def test_dropin_module_exports():
    assert pallas_attn.dot_product_attention is dropin.dot_product_attention
    assert dropin.IMPLEMENTATIONS == (None, "pallas", "pallas:fa_train", "pallas:fa_prefill", "xla", "cudnn")


def test_dispatch_on_a_faked_sm90(monkeypatch):
    """With the device query faked to a Hopper (nothing runs on it): fp16 / bf16 at D 64 / 128 without window
    or lengths pick fa_prefill; everything fa_prefill's contract lacks stays on fa_train, and the reason names
    it; bias / mask fall back to XLA. Then, with interpret mode off too, the drop-in's value_and_grad lowers for
    CUDA to exactly fa_prefill's forward and its two backward kernels (the custom_vjp wiring, no fa_train)."""
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    q, kv = jnp.zeros((2, 300, 8, 128), jnp.float16), jnp.zeros((2, 280, 2, 128), jnp.float16)
    impl, why = pallas_attn.which_implementation(q, kv, kv, is_causal=True)
    assert impl == "pallas:fa_prefill" and "sm_90" in why
    assert pallas_attn.which_implementation(q, kv, kv, implementation="pallas")[0] == "pallas:fa_prefill"
    assert pallas_attn.which_implementation(q, kv, kv, implementation="pallas:fa_train")[0] == "pallas:fa_train"
    b64 = jnp.zeros((1, 64, 2, 64), jnp.bfloat16)
    assert pallas_attn.which_implementation(b64, b64, b64)[0] == "pallas:fa_prefill"
    q256, kv256 = jnp.zeros((1, 30, 2, 256), jnp.float16), jnp.zeros((1, 28, 2, 256), jnp.float16)
    assert pallas_attn.which_implementation(q256, kv256, kv256)[0] == "pallas:fa_prefill"  # the backward's D split
    monkeypatch.setattr(dropin, "DROPIN_HEAD_DIMS", (64, 128))  # a head dim not (yet) GPU-verified stays on fa_train
    impl, why = pallas_attn.which_implementation(q256, kv256, kv256)
    assert impl == "pallas:fa_train" and "has not passed a GPU run" in why, (impl, why)
    monkeypatch.setattr(dropin, "DROPIN_HEAD_DIMS", (64, 128, 256))
    lens = jnp.asarray([100, 280], jnp.int32)
    impl, why = pallas_attn.which_implementation(q, kv, kv, local_window_size=8)  # forward band, fa_train's backward
    assert impl == "pallas:fa_prefill" and "fa_train's backward" in why, (impl, why)
    for causal, window in ((True, (8, 8)), (False, (8, 0)), (True, (0, 0))):  # causal in effect: both on fa_prefill
        impl, why = pallas_attn.which_implementation(q[:, :280], kv, kv, is_causal=causal, local_window_size=window)
        assert impl == "pallas:fa_prefill" and "forward and backward" in why, (causal, window, why)
    # T > S (q 300 rows, kv 280): rows that may see no key stay on fa_train's pair
    impl, why = pallas_attn.which_implementation(q, kv, kv, is_causal=True, local_window_size=(8, 0))
    assert impl == "pallas:fa_prefill" and "fa_train's backward" in why, (impl, why)
    for args, kw, word in (((q, kv, kv), dict(key_value_seq_lengths=lens), "sequence lengths"),
                           ((q.astype(jnp.float32),) + (kv.astype(jnp.float32),) * 2, {}, "float32"),
                           ((q[..., :32],) + (kv[..., :32],) * 2, {}, "head dims")):
        impl, why = pallas_attn.which_implementation(*args, **kw)
        assert impl == "pallas:fa_train" and word in why, (impl, why)
        with pytest.raises(NotImplementedError, match=word):
            pallas_attn.which_implementation(*args, implementation="pallas:fa_prefill", **kw)
    mask = jnp.ones((1, 1, 300, 280), bool)
    assert pallas_attn.which_implementation(q, kv, kv, mask=mask)[0] == "xla"

    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)

    def loss(q, k, v):
        return jnp.sum(pallas_attn.dot_product_attention(q, k, v, is_causal=True).astype(jnp.float32))

    sds = jax.ShapeDtypeStruct
    q, kv = sds(q.shape, q.dtype), sds(kv.shape, kv.dtype)
    text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).trace(q, kv, kv).lower(
        lowering_platforms=("cuda",)).as_text()
    names = set(re.findall(r"pallas_attn_\w+", text))
    assert {"pallas_attn_fa_prefill_fwd", "pallas_attn_fa_prefill_bwd_dkdv", "pallas_attn_fa_prefill_bwd_dq"} <= \
        names, names
    assert not any("fa_train" in n for n in names), names

    def lowered_names(fn, *args):
        text = jax.jit(jax.value_and_grad(fn, argnums=tuple(range(len(args))))).trace(*args).lower(
            lowering_platforms=("cuda",)).as_text()
        return set(re.findall(r"pallas_attn_\w+", text))

    def loss_w(q, k, v, window=(63, 0), causal=True):  # a causal window: fa_prefill's pair, the band in both
        return jnp.sum(pallas_attn.dot_product_attention(q, k, v, is_causal=causal, local_window_size=window).astype(
            jnp.float32))

    qs = sds((2, 280, 8, 128), jnp.float16)  # T == S (a causal window on T > S stays on fa_train's backward)
    names = lowered_names(loss_w, qs, kv, kv)
    assert {"pallas_attn_fa_prefill_fwd", "pallas_attn_fa_prefill_bwd_dkdv", "pallas_attn_fa_prefill_bwd_dq"} <= \
        names, names
    assert not any("fa_train" in n for n in names), names
    # a two-sided window: fa_prefill's forward, fa_train's two backward kernels
    names = lowered_names(functools.partial(loss_w, window=(63, 20), causal=False), qs, kv, kv)
    assert {"pallas_attn_fa_prefill_fwd", "pallas_attn_fa_train_dkdv", "pallas_attn_fa_train_dq"} <= names, names
    assert not any("fa_prefill_bwd" in n for n in names), names

    def loss_x(q, k, v, sinks):  # soft-cap + sinks + a causal window: fa_prefill's pair, sinks differentiated too
        return jnp.sum(pallas_attn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(63, 0),
                                                         softcap=30.0, sinks=sinks).astype(jnp.float32))

    names = lowered_names(loss_x, qs, kv, kv, sds((8,), jnp.float32))
    assert {"pallas_attn_fa_prefill_fwd", "pallas_attn_fa_prefill_bwd_dkdv", "pallas_attn_fa_prefill_bwd_dq"} <= \
        names, names
    assert not any("fa_train" in n for n in names), names


def test_fa_prefill_backward_config_by_causal(monkeypatch):
    """The drop-in passes fa_prefill's backward the config measured best for the mask (docs/fa_prefill.md):
    wide_ovl without the causal mask; with it at D 64 fused (the five-product kernel, session 21), or wide when
    determinism is asked (traced only: jax.eval_shape, nothing runs; no GPU here, so no table)."""
    from pallas_attn.kernels import fa_prefill_bwd

    seen, real = [], fa_prefill_bwd.attention_lse

    def spy(*a, bwd_config, **kw):
        seen.append(bwd_config)
        return real(*a, bwd_config=bwd_config, **kw)

    monkeypatch.setattr(fa_prefill_bwd, "attention_lse", spy)
    q = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.float16)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    for det in (None, True):
        for causal in (False, True):
            jax.eval_shape(lambda q, k, v, c=causal, det=det: pallas_attn.dot_product_attention(
                q, k, v, is_causal=c, implementation="pallas:fa_prefill", deterministic=det), q, q, q)
    cf = fa_prefill_bwd.CONFIGS
    assert seen == [cf["wide_ovl"], cf["fused"], cf["wide_ovl"], cf["wide"]], seen


@pytest.mark.slow
def test_forced_fa_prefill_in_interpret_mode(rng):
    """implementation="pallas:fa_prefill" on the CPU: fa_prefill's forward twin and its backward's Mosaic kernels
    on JAX's GPU interpreter, through the drop-in's custom_vjp (GQA 2, causal, T < S, odd lengths, fp16): the
    output, jax.nn's residual and dQ/dK/dV against the float32 XLA answer (output: twice jax.nn's own fp16
    error plus one ulp; gradients within 2 eps of the largest element, as the fa_train fp16 check above)."""
    q, k, v, w = _arrays(rng, 1, 70, 90, 4, 2, 64, "float16")
    assert pallas_attn.which_implementation(q, k, v, is_causal=True, implementation="pallas:fa_prefill")[0] == \
        "pallas:fa_prefill"
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, is_causal=True,
                                 implementation="pallas:fa_prefill")
    f32 = [x.astype(jnp.float32) for x in (q, k, v, w)]
    ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, *f32, is_causal=True, **XLA)
    theirs = jax.nn.dot_product_attention(q, k, v, is_causal=True, **XLA)
    eps = float(jnp.finfo(jnp.float16).eps)
    assert out.dtype == jnp.float16 and _rel(out, ref) <= 2 * _rel(theirs, ref) + eps, (_rel(out, ref),
                                                                                      _rel(theirs, ref))
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert g.dtype == jnp.float16 and g.shape == rg.shape, name
        assert _rel(g, rg) <= 2 * eps, (name, _rel(g, rg) / eps)
    _, res = pallas_attn.dot_product_attention(q, k, v, is_causal=True, implementation="pallas:fa_prefill",
                                               return_residual=True)
    _, rres = jax.nn.dot_product_attention(q, k, v, is_causal=True, return_residual=True, **XLA)
    assert res.shape == rres.shape and res.dtype == rres.dtype
    np.testing.assert_allclose(np.asarray(res, np.float32), np.asarray(rres, np.float32), rtol=2e-3)
