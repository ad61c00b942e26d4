"""The drop-in's default paths: fa_prefill_bwd.attention_lse(with_lse=False) (the drop-in without return_residual
on Hopper: not differentiated, fa_prefill's forward without the LSE; differentiated, the with-LSE pair's gradients),
and the fallback's choice of jax.nn's cuDNN over XLA on a GPU. Interpret mode / CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_attn.kernels import fa_prefill_bwd as fb


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((1, 70, 2, 64)), jnp.float16)
    k = jnp.asarray(rng.standard_normal((1, 90, 1, 64)), jnp.float16)
    v = jnp.asarray(rng.standard_normal((1, 90, 1, 64)), jnp.float16)
    w = jnp.asarray(rng.standard_normal((1, 70, 2, 64)), jnp.float32)
    return q, k, v, w


def test_forward_only_has_no_lse_and_same_output_and_grads():
    q, k, v, w = _inputs()
    kw = dict(causal=True, scale=0.125, bwd_config=fb.CONFIGS["wide"], interpret=True)
    out_only = jax.jit(lambda q, k, v: fb.attention_lse(q, k, v, with_lse=False, **kw))
    jaxpr = str(jax.make_jaxpr(out_only)(q, k, v))
    # the undifferentiated call returns the output alone
    assert not isinstance(out_only(q, k, v), tuple)
    out, _ = fb.attention_lse(q, k, v, **kw)
    np.testing.assert_array_equal(np.asarray(out_only(q, k, v)), np.asarray(out))
    assert "custom_vjp_call" in jaxpr

    def loss(f):
        return lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * w)

    g_only = jax.grad(loss(lambda q, k, v: fb.attention_lse(q, k, v, with_lse=False, **kw)), argnums=(0, 1, 2))(q, k, v)
    g_pair = jax.grad(loss(lambda q, k, v: fb.attention_lse(q, k, v, **kw)[0]), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g_only, g_pair):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=0, atol=1e-3)


def test_fallback_prefers_cudnn_on_a_gpu_where_it_takes_the_call(monkeypatch):
    """D 80: no Pallas kernel takes it (D 96, Phi-3, runs fa_prefill since session 24). On a GPU the fallback is
    jax.nn's cuDNN when cuDNN takes the call
    (fp16/bf16, D a multiple of 8 up to 128, no bias/mask/lengths); XLA otherwise and on a CPU."""
    import pallas_attn
    from pallas_attn import _compat, dropin

    q = jax.ShapeDtypeStruct((2, 64, 4, 80), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 64, 2, 80), jnp.bfloat16)
    assert pallas_attn.which_implementation(q, kv, kv, is_causal=True)[0] == "xla"  # CPU: interpret mode
    monkeypatch.setattr(_compat, "default_interpret", lambda interpret: False)
    monkeypatch.setattr(_compat, "has_gpu", lambda: True)
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    impl, why = pallas_attn.which_implementation(q, kv, kv, is_causal=True)
    assert impl == "cudnn" and "cuDNN" in why and "80" in why
    q96 = jax.ShapeDtypeStruct((2, 64, 4, 96), jnp.bfloat16)
    kv96 = jax.ShapeDtypeStruct((2, 64, 2, 96), jnp.bfloat16)
    # D 96: forced, fa_prefill's pair; by default cuDNN's (its training step is faster than our padded backward)
    assert pallas_attn.which_implementation(q96, kv96, kv96, is_causal=True,
                                            implementation="pallas:fa_prefill")[0] == "pallas:fa_prefill"
    impl96, why96 = pallas_attn.which_implementation(q96, kv96, kv96, is_causal=True)
    assert impl96 == "cudnn" and "head dim 96" in why96 and "zero-padded" in why96, why96
    assert pallas_attn.which_implementation(q, kv, kv, is_causal=True, local_window_size=(7, 0))[0] == "cudnn"
    q32 = jax.ShapeDtypeStruct((2, 64, 4, 80), jnp.float32)
    kv32 = jax.ShapeDtypeStruct((2, 64, 2, 80), jnp.float32)
    assert pallas_attn.which_implementation(q32, kv32, kv32)[0] == "xla"  # fp32: not cuDNN's
    q200 = jax.ShapeDtypeStruct((2, 64, 4, 200), jnp.bfloat16)
    kv200 = jax.ShapeDtypeStruct((2, 64, 2, 200), jnp.bfloat16)
    assert pallas_attn.which_implementation(q200, kv200, kv200)[0] == "xla"  # D 200 > 128
    lens = jnp.full((2,), 64, jnp.int32)
    assert pallas_attn.which_implementation(q, kv, kv, key_value_seq_lengths=lens)[0] == "xla"
    mask = jnp.ones((2, 4, 64, 64), bool)
    assert pallas_attn.which_implementation(q, kv, kv, mask=mask)[0] == "xla"


def test_window_without_empty_rows_skips_the_corner_pass_and_keeps_the_answer(monkeypatch):
    """A causal window over T <= S keys leaves no row empty: the drop-in's corner-case pass (mean of V, a select) is
    not traced, and the output equals jax.nn's XLA answer; with more queries than keys a row can be empty and the
    pass is kept (jax.nn's mean-of-V rows)."""
    import pallas_attn
    from pallas_attn import dropin

    calls = []
    real = dropin._empty_rows
    monkeypatch.setattr(dropin, "_empty_rows", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((1, 40, 2, 32)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 40, 1, 32)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, 40, 1, 32)), jnp.float32)
    f = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(7, 0))  # noqa: E731
    out = f(q, k, v)
    assert calls == []  # no row can be empty: no corner-case pass traced
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(7, 0), implementation="xla")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=2e-5, rtol=2e-5)
    qt = jnp.asarray(rng.standard_normal((1, 40, 2, 32)), jnp.float32)
    kt, vt = k[:, :24], v[:, :24]
    g = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, local_window_size=(3, -1))  # noqa: E731
    ref2 = jax.nn.dot_product_attention(qt, kt, vt, local_window_size=(3, -1), implementation="xla")
    np.testing.assert_allclose(np.asarray(g(qt, kt, vt)), np.asarray(ref2), atol=2e-5, rtol=2e-5)
    assert len(calls) == 1  # T > S and a negative window side: rows can be empty, the pass is kept


def _gpu_like(monkeypatch):
    from pallas_attn import _compat, dropin

    monkeypatch.setattr(_compat, "default_interpret", lambda interpret: False)
    monkeypatch.setattr(_compat, "has_gpu", lambda: True)
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)


def test_d96_forward_runs_apart_from_its_backward_from_query_length_1024(monkeypatch):
    """D 96 on a Hopper GPU: fa_prefill's forward when the call is not differentiated, cuDNN's pair when it is, from
    N 1024 on (session 24, H100: the forward 0.84-0.95x cuDNN's at N >= 1024, 1.04x at N 512; the training step on our
    zero-padded backward 1.08-1.34x cuDNN's)."""
    import pallas_attn
    from pallas_attn import dropin

    _gpu_like(monkeypatch)
    q = jax.ShapeDtypeStruct((2, 1024, 32, 96), jnp.bfloat16)
    impl, why = pallas_attn.which_implementation(q, q, q, is_causal=True)
    assert impl == dropin.APART and "not differentiated" in why and "cuDNN" in why
    short = jax.ShapeDtypeStruct((2, 512, 32, 96), jnp.bfloat16)
    assert pallas_attn.which_implementation(short, short, short, is_causal=True)[0] == "cudnn"
    # jax.nn's residual comes from cuDNN's pair; forcing either side still forces it
    assert pallas_attn.which_implementation(q, q, q, is_causal=True, return_residual=True)[0] == "cudnn"
    assert pallas_attn.which_implementation(q, q, q, is_causal=True,
                                            implementation="pallas:fa_prefill")[0] == "pallas:fa_prefill"
    assert pallas_attn.which_implementation(q, q, q, is_causal=True, implementation="cudnn")[0] == "cudnn"
    f32 = jax.ShapeDtypeStruct((2, 1024, 32, 96), jnp.float32)  # not cuDNN's: no pair to differentiate through
    assert pallas_attn.which_implementation(f32, f32, f32, is_causal=True)[0] != dropin.APART
    q128 = jax.ShapeDtypeStruct((2, 1024, 32, 128), jnp.bfloat16)  # D 128: fa_prefill's own pair, as before
    assert pallas_attn.which_implementation(q128, q128, q128, is_causal=True)[0] == "pallas:fa_prefill"


def test_forward_apart_is_the_forward_alone_and_the_other_pair_under_differentiation():
    from pallas_attn import dropin

    def forward(q, k, v):
        return q * k + v + 1.0  # distinguishable from the differentiable side's value

    def differentiable(q, k, v):
        return q * k + v

    f = dropin._forward_apart(forward, differentiable)
    q, k, v = (jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + i for i in range(3))
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(q, k, v)), np.asarray(forward(q, k, v)))
    val, grads = jax.value_and_grad(lambda *a: jnp.sum(f(*a) * 2.0), argnums=(0, 1, 2))(q, k, v)
    ref_val, ref_grads = jax.value_and_grad(lambda *a: jnp.sum(differentiable(*a) * 2.0), argnums=(0, 1, 2))(q, k, v)
    assert float(val) == float(ref_val)
    for a, b in zip(grads, ref_grads):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _force_route(monkeypatch, route: str, d: int, seed: int):
    """A default call (no implementation, no residual) routed to ``route`` as a Hopper GPU routes it, here at a small
    shape; returns bf16 ``q [1, 128, 2, d]``, ``k``, ``v [1, 128, 1, d]`` and a float32 cotangent weight ``w``."""
    from pallas_attn import dropin

    real = dropin.which_implementation

    def which(*a, **kw):
        if kw.get("implementation") is None and not kw.get("return_residual"):
            return route, "test"
        return real(*a, **kw)

    monkeypatch.setattr(dropin, "which_implementation", which)
    kq, kk, kv, kw = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(kq, (1, 128, 2, d), jnp.float32).astype(jnp.bfloat16)
    k = jax.random.normal(kk, (1, 128, 1, d), jnp.float32).astype(jnp.bfloat16)
    v = jax.random.normal(kv, (1, 128, 1, d), jnp.float32).astype(jnp.bfloat16)
    return q, k, v, jax.random.normal(kw, (1, 128, 2, d), jnp.float32)


@pytest.mark.slow
def test_the_drop_in_runs_d96_apart_end_to_end(monkeypatch):
    """The APART route through ``dot_product_attention`` on a CPU: fa_prefill's forward (interpret mode) when not
    differentiated, jax.nn's pair (XLA here, cuDNN on a GPU) under jax.grad: its value and gradients exactly."""
    import pallas_attn
    from pallas_attn import dropin

    q, k, v, w = _force_route(monkeypatch, dropin.APART, 96, 3)  # the route a Hopper GPU takes at N >= 1024
    monkeypatch.setattr(dropin, "_APART_DIFFERENTIATED", "xla")
    monkeypatch.setattr(dropin, "APART_STEP", "cudnn")  # the pair; the default's hybrid: the tests below
    out = pallas_attn.dot_product_attention(q, k, v, is_causal=True)
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=2e-2, rtol=0)
    forced = pallas_attn.dot_product_attention(q, k, v, is_causal=True, implementation="pallas:fa_prefill")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(forced, np.float32))  # fa_prefill's

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    val, g = jax.value_and_grad(loss(lambda *a: pallas_attn.dot_product_attention(*a, is_causal=True)),
                                argnums=(0, 1, 2))(q, k, v)
    rval, rg = jax.value_and_grad(loss(lambda *a: jax.nn.dot_product_attention(*a, is_causal=True,
                                                                                implementation="xla")),
                                  argnums=(0, 1, 2))(q, k, v)
    assert float(val) == float(rval)
    for a, b in zip(g, rg):
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(NotImplementedError, match="cuDNN"):
        pallas_attn.dot_product_attention(q, k, v, is_causal=True, bwd_config="wide")


def _assert_grads_within_bf16_eps(grads, ref_grads):
    """Each of dq, dk, dv finite and within one bf16 eps (relative norm) of the reference's."""
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    for name, a, b in zip(("dq", "dk", "dv"), grads, ref_grads):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.isfinite(a).all(), name
        rel = np.linalg.norm(a - b) / np.linalg.norm(b)
        assert rel < eps, (name, rel)


def _reference_backward(q, k, v, out, lse, g, *, scale, causal, left):
    """``(dq, dk, dv)`` in float32 jnp from a forward's ``out`` and natural-log ``lse`` [B, N, T] (what cuDNN's
    backward reads): P = exp(S - lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K, dK = dS^T Q; GQA
    groups summed; a causal mask and a causal window's left side."""
    f = lambda x: x.astype(jnp.float32)  # noqa: E731
    qf, kf, vf, of, gf = f(q), f(k), f(v), f(out), f(g)
    grp = q.shape[2] // k.shape[2]
    kr, vr = jnp.repeat(kf, grp, axis=2), jnp.repeat(vf, grp, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", qf, kr) * scale
    i, j = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
    keep = jnp.ones_like(i >= j)
    if causal:
        keep = keep & (j <= i)
    if left is not None:
        keep = keep & (j >= i - left)
    p = jnp.where(keep, jnp.exp(s - lse[..., None]), 0.0)
    dv = jnp.einsum("bnts,btnh->bsnh", p, gf)
    dp = jnp.einsum("btnh,bsnh->bnts", gf, vr)
    delta = jnp.swapaxes(jnp.sum(gf * of, axis=-1), 1, 2)  # [B, N, T]
    ds = p * (dp - delta[..., None])
    dq = jnp.einsum("bnts,bsnh->btnh", ds, kr) * scale
    dk = jnp.einsum("bnts,btnh->bsnh", ds, qf) * scale
    fold = lambda x: x.reshape(x.shape[0], x.shape[1], k.shape[2], grp, x.shape[3]).sum(axis=3)  # noqa: E731
    return dq.astype(q.dtype), fold(dk).astype(k.dtype), fold(dv).astype(v.dtype)


def test_cudnn_backward_binds_jax_cudnn_primitive():
    """``dropin._cudnn_backward``: jax.nn cuDNN's backward primitive on our output and LSE, by shape (abstract eval)
    and as lowered for CUDA (cuDNN's fused backward custom call, the mask and sliding window jax.nn would give)."""
    from pallas_attn import dropin

    fa, why = dropin._cudnn_bwd_api()
    assert fa is not None and why == ""
    q = jax.ShapeDtypeStruct((2, 256, 8, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((2, 256, 2, 128), jnp.bfloat16)
    lse = jax.ShapeDtypeStruct((2, 8, 256), jnp.float32)
    for causal, left, mask, window in ((True, None, "CAUSAL", None), (True, 4095, "CAUSAL", 4096),
                                       (False, None, "NO_MASK", None)):
        fn = jax.jit(lambda q, k, v, o, lse, g, c=causal, lf=left: dropin._cudnn_backward(
            q, k, v, o, lse, g, scale=0.125, causal=c, left=lf))
        shapes = jax.eval_shape(fn, q, k, k, q, lse, q)
        assert [(x.shape, x.dtype) for x in shapes] == [(q.shape, q.dtype), (k.shape, k.dtype), (k.shape, k.dtype)]
        text = fn.trace(q, k, k, q, lse, q).lower(lowering_platforms=("cuda",)).as_text()
        assert "fmhaSoftmaxBackward" in text and "fmhaSoftmax(" not in text  # the backward alone, no forward
        assert f"\\22mask_type\\22: \\22{mask}\\22" in text, mask
        assert "tensor<2x8x256xf32>" in text  # our LSE as cuDNN's softmax statistics, [B, N, T] fp32
        assert (f"sliding_window_length\\22: {window}" in text) == (window is not None)
    fa, why = dropin._cudnn_fwd_api()
    assert fa is not None and why == ""
    fwd = jax.jit(lambda q, k, v: dropin._cudnn_forward(q, k, v, scale=0.125, causal=True))
    out, stats = jax.eval_shape(fwd, q, k, k)
    assert (out.shape, out.dtype, stats.shape, stats.dtype) == (q.shape, q.dtype, lse.shape, lse.dtype)
    text = fwd.trace(q, k, k).lower(lowering_platforms=("cuda",)).as_text()
    assert "fmhaSoftmax(" in text
    assert "fmhaSoftmaxBackward" not in text and "\\22mask_type\\22: \\22CAUSAL\\22" in text


def test_cudnn_bwd_api_refuses_a_changed_primitive(monkeypatch):
    """A jax whose cuDNN backward primitive takes other operands: ``_cudnn_bwd_api`` says so, and an APART call keeps
    jax.nn cuDNN's pair, its reason naming why."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    import pallas_attn
    from pallas_attn import dropin

    def changed(query, key, value, bias, activation, fwd_output, grad_output, *, scale, mask_type, layout):
        raise AssertionError("not called")

    monkeypatch.setattr(fa, "_dot_product_attention_bwd_abstract", changed)
    api, why = dropin._cudnn_api.__wrapped__("bwd")
    assert api is None and "operands" in why
    monkeypatch.setattr(dropin, "_cudnn_bwd_api", lambda: (None, why))
    _gpu_like(monkeypatch)
    q = jax.ShapeDtypeStruct((1, 8192, 32, 128), jnp.bfloat16)
    k = jax.ShapeDtypeStruct((1, 8192, 8, 128), jnp.bfloat16)
    impl, reason = pallas_attn.which_implementation(q, k, k, is_causal=True)
    assert impl == dropin.APART and "jax.nn's cuDNN forward and backward" in reason and "operands" in reason
    monkeypatch.setattr(dropin, "_cudnn_bwd_api", lambda: (fa, ""))
    impl, reason = pallas_attn.which_implementation(q, k, k, is_causal=True)
    assert impl == dropin.APART and "cuDNN's backward on them" in reason
    short_k = jax.ShapeDtypeStruct((1, 4096, 8, 128), jnp.bfloat16)
    assert dropin._hybrid_takes(q, short_k, is_causal=True, window=None) == "query length 8192 != key length 4096"
    assert "not a causal one" in dropin._hybrid_takes(q, k, is_causal=False, window=(100, 0))


@pytest.mark.slow
@pytest.mark.parametrize("d,hk,window", [(128, 1, None), (96, 2, None), (128, 1, (40, 0))])
def test_apart_trains_our_forward_with_cudnns_backward(monkeypatch, d, hk, window):
    """A differentiated APART call (the default on a Hopper GPU for causal D 128 from N 4096, D 96 from N 1024, and
    Mistral's window) on a CPU: fa_prefill's forward (interpret mode) and then the backward ``_cudnn_backward``
    binds, here a float32 jnp twin of it (``_reference_backward``) given the same output and LSE. The value under
    jax.value_and_grad is fa_prefill's forward's, exactly (the forced pair's); the gradients are within bf16 rounding
    of jax.nn XLA's."""
    import pallas_attn
    from pallas_attn import dropin

    q, k, v, w = _force_route(monkeypatch, dropin.APART, d, 5 + d)
    if hk == 2:
        k, v = (jnp.concatenate([x, x[..., ::-1]], axis=2) for x in (k, v))
    seen = []

    def twin(*a, **kw):
        seen.append(kw)
        return _reference_backward(*a, **kw)

    monkeypatch.setattr(dropin, "_cudnn_backward", twin)
    kw = dict(is_causal=True, local_window_size=window)

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    # blocked on before the next eager op (see test_cudnn_forward_route_trains_cudnns_forward_with_our_backward)
    val, g = jax.block_until_ready(jax.value_and_grad(loss(lambda *a: pallas_attn.dot_product_attention(*a, **kw)),
                                                      argnums=(0, 1, 2))(q, k, v))
    assert seen and seen[0]["causal"] is True and seen[0]["left"] == (None if window is None else window[0])
    forced = pallas_attn.dot_product_attention(q, k, v, implementation="pallas:fa_prefill", **kw)
    assert float(val) == float(jnp.sum(forced.astype(jnp.float32) * w))
    _, rg = jax.value_and_grad(loss(lambda *a: jax.nn.dot_product_attention(*a, implementation="xla", **kw)),
                               argnums=(0, 1, 2))(q, k, v)
    _assert_grads_within_bf16_eps(g, rg)
    ref = jax.nn.dot_product_attention(q, k, v, implementation="xla", **kw)
    np.testing.assert_allclose(np.asarray(forced, np.float32), np.asarray(ref, np.float32), atol=2e-2, rtol=0)


def test_short_self_attention_runs_cudnns_forward_and_our_pair_under_differentiation(monkeypatch):
    """The mirror of APART (``dropin.CUDNN_FORWARD``): a default self-attention call at D 64 up to N 4096, at D 128 up
    to N 512 (causal) or 1024 (not) runs jax.nn's cuDNN forward when not differentiated (H100, sessions 26-27:
    fa_prefill's forward 1.01-1.35x cuDNN's there) and fa_prefill's pair when it is; every other call keeps its
    route."""
    import pallas_attn
    from pallas_attn import dropin

    _gpu_like(monkeypatch)

    def which(b, t, h, d, *, s=None, dtype=jnp.bfloat16, **kw):
        q = jax.ShapeDtypeStruct((b, t, h, d), dtype)
        k = jax.ShapeDtypeStruct((b, t if s is None else s, max(h // 4, 1), d), dtype)
        return pallas_attn.which_implementation(q, k, k, **kw)

    impl, why = which(64, 512, 12, 64, is_causal=True)
    assert impl == dropin.CUDNN_FORWARD and "not differentiated" in why and "4096" in why
    assert which(8, 4096, 12, 64, is_causal=True)[0] == dropin.CUDNN_FORWARD
    assert which(4, 8192, 12, 64, is_causal=True)[0] == "pallas:fa_prefill"  # a tie at N 8192, ours faster beyond
    assert which(64, 512, 32, 128, is_causal=True)[0] == dropin.CUDNN_FORWARD
    assert which(32, 1024, 32, 128, is_causal=True)[0] == "pallas:fa_prefill"
    # Mistral's 4096-key window over 512 tokens masks nothing: the plain call, so cuDNN's plain forward
    assert which(64, 512, 32, 128, is_causal=True, local_window_size=(4096, 0))[0] == dropin.CUDNN_FORWARD
    # a window that masks something, another length of keys, a residual, fp32, D 256, a forced
    # implementation, an extension: no measured case for cuDNN's forward, so the route is as before
    assert which(64, 512, 32, 128, is_causal=True, local_window_size=(128, 0))[0] == "pallas:fa_prefill"
    assert which(64, 512, 32, 128, s=1024, is_causal=True)[0] == "pallas:fa_prefill"
    assert which(8, 4096, 12, 64, is_causal=False)[0] == dropin.CUDNN_FORWARD  # and without the causal mask
    assert which(4, 8192, 12, 64, is_causal=False)[0] == "pallas:fa_prefill"
    assert which(32, 1024, 32, 128, is_causal=False)[0] == dropin.CUDNN_FORWARD
    assert which(16, 2048, 32, 128, is_causal=False)[0] == "pallas:fa_prefill"
    assert which(64, 512, 12, 64, is_causal=True, return_residual=True)[0] == "pallas:fa_prefill"
    assert which(64, 512, 12, 64, dtype=jnp.float32, is_causal=True)[0] != dropin.CUDNN_FORWARD
    assert which(64, 512, 8, 256, is_causal=True)[0] == "pallas:fa_prefill"
    assert which(64, 512, 12, 64, is_causal=True, implementation="pallas")[0] == "pallas:fa_prefill"
    assert which(64, 512, 12, 64, is_causal=True, implementation="pallas:fa_prefill")[0] == "pallas:fa_prefill"
    assert which(64, 512, 12, 64, is_causal=True, softcap=30.0)[0] == "pallas:fa_prefill"
    monkeypatch.setattr(dropin, "_is_sm90", lambda: False)  # not a Hopper: no fa_prefill pair to differentiate
    assert which(64, 512, 12, 64, is_causal=True)[0] == "pallas:fa_train"


@pytest.mark.slow
def test_the_drop_in_runs_the_cudnn_forward_route_end_to_end(monkeypatch):
    """The CUDNN_FORWARD route through ``dot_product_attention`` on a CPU: jax.nn's forward (XLA here, cuDNN on a GPU)
    exactly when not differentiated; under jax.value_and_grad, exactly the forced fa_prefill pair's value and
    gradients (interpret mode), with ``bwd_config`` reaching its backward."""
    import pallas_attn
    from pallas_attn import dropin

    q, k, v, w = _force_route(monkeypatch, dropin.CUDNN_FORWARD, 64, 5)  # the route a Hopper GPU takes at short N
    monkeypatch.setattr(dropin, "_CUDNN_FORWARD_IMPL", "xla")
    monkeypatch.setattr(dropin, "CUDNN_FORWARD_STEP", "ours")  # the pair; the default's hybrid: the test below
    out = pallas_attn.dot_product_attention(q, k, v, is_causal=True)
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))

    def loss(**kw):
        return lambda q, k, v: jnp.sum(pallas_attn.dot_product_attention(q, k, v, is_causal=True, **kw)
                                       .astype(jnp.float32) * w)

    for bwd in (None, "wide"):
        # each blocked on before the next (see test_cudnn_forward_route_trains_cudnns_forward_with_our_backward)
        val, g = jax.block_until_ready(jax.value_and_grad(loss(bwd_config=bwd), argnums=(0, 1, 2))(q, k, v))
        rval, rg = jax.block_until_ready(jax.value_and_grad(loss(bwd_config=bwd, implementation="pallas:fa_prefill"),
                                                            argnums=(0, 1, 2))(q, k, v))
        assert float(val) == float(rval)
        for a, b in zip(g, rg):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
    with pytest.raises(ValueError, match="bwd_config"):
        jax.grad(loss(bwd_config="no-such-config"))(q, k, v)
    with pytest.raises(ValueError, match="bwd_config"):  # not differentiated: refused all the same
        pallas_attn.dot_product_attention(q, k, v, is_causal=True, bwd_config="no-such-config")


def _reference_forward(q, k, v, *, scale, causal):
    """``(out, lse)`` in float32 jnp as cuDNN's training forward returns them: ``out`` in q's dtype, ``lse`` the
    natural-log LSE of the scaled scores, fp32 ``[B, N, T]``."""
    grp = q.shape[2] // k.shape[2]
    kr = jnp.repeat(k.astype(jnp.float32), grp, axis=2)
    vr = jnp.repeat(v.astype(jnp.float32), grp, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q.astype(jnp.float32), kr) * scale
    if causal:
        i, j = jnp.arange(q.shape[1])[:, None], jnp.arange(k.shape[1])[None, :]
        s = jnp.where(j <= i, s, -jnp.inf)
    lse = jax.nn.logsumexp(s, axis=-1)
    out = jnp.einsum("bnts,bsnh->btnh", jnp.exp(s - lse[..., None]), vr)
    return out.astype(q.dtype), lse


@pytest.mark.slow
@pytest.mark.parametrize("d,bwd,deterministic", [(64, None, None), (128, "wide", True)])
def test_cudnn_forward_route_trains_cudnns_forward_with_our_backward(monkeypatch, d, bwd, deterministic):
    """A differentiated CUDNN_FORWARD call (the default on a Hopper GPU for short self-attention) on a CPU: the
    forward ``_cudnn_forward`` binds, here a float32 jnp twin of it (``_reference_forward``), then fa_prefill_bwd's
    backward (interpret mode) on that output and LSE at the pair's config (a named one reaches it). Not
    differentiated, jax.nn's forward exactly (XLA here); under jax.value_and_grad the twin's output is the value and
    the gradients are within bf16 rounding of jax.nn XLA's."""
    import pallas_attn
    from pallas_attn import dropin
    from pallas_attn.kernels import fa_prefill_bwd

    q, k, v, w = _force_route(monkeypatch, dropin.CUDNN_FORWARD, d, 11 + d)
    monkeypatch.setattr(dropin, "_CUDNN_FORWARD_IMPL", "xla")
    seen, configs = [], []
    real_backward = fa_prefill_bwd.backward

    def twin(*a, **kw):
        seen.append(kw)
        return _reference_forward(*a, **kw)

    def backward(*a, **kw):
        configs.append(kw["config"])
        return real_backward(*a, **kw)

    monkeypatch.setattr(dropin, "_cudnn_forward", twin)
    monkeypatch.setattr(fa_prefill_bwd, "backward", backward)
    kw = dict(is_causal=True, bwd_config=bwd, deterministic=deterministic)
    out = pallas_attn.dot_product_attention(q, k, v, **kw)
    ref = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
    assert not seen  # not differentiated: jax.nn's own forward

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)

    # blocked on before any eager op: the interpret-mode backward runs host callbacks that issue eager jax ops, and an
    # eager op of this thread queued behind the still-running program deadlocked the CPU client once (session 32)
    val, g = jax.block_until_ready(jax.value_and_grad(loss(lambda *a: pallas_attn.dot_product_attention(*a, **kw)),
                                                      argnums=(0, 1, 2))(q, k, v))
    assert seen and seen[0]["causal"] is True
    twin_out = _reference_forward(q, k, v, scale=1.0 / np.sqrt(d), causal=True)[0]
    assert float(val) == float(jnp.sum(twin_out.astype(jnp.float32) * w))
    expect = fa_prefill_bwd.CONFIGS[bwd] if bwd else dropin.api.resolve_pair(
        "fa_prefill", dropin._dense_problem(q, k, True), None, None, deterministic=deterministic)[2]
    assert configs and configs[0] == expect
    _, rg = jax.value_and_grad(loss(lambda *a: jax.nn.dot_product_attention(*a, is_causal=True,
                                                                             implementation="xla")),
                               argnums=(0, 1, 2))(q, k, v)
    _assert_grads_within_bf16_eps(g, rg)


def test_long_d128_causal_steps_differentiate_through_cudnn_unless_asked_otherwise(monkeypatch):
    """``dropin.TRAIN_ON_CUDNN_MIN_Q_LEN``: a default causal D 128 self-attention call from N 4096 runs fa_prefill's
    forward when not differentiated and cuDNN's pair when it is (``APART``; our step measured 1.03-1.10x cuDNN's
    there), Mistral's causal 4096-key window too (``TRAIN_ON_CUDNN_MIN_WINDOW``). Determinism asked (the argument
    or XLA's flag), a named backward config, a narrower window, N 2048, no causal mask, D 64: fa_prefill's pair."""
    import pallas_attn
    from pallas_attn import dropin

    _gpu_like(monkeypatch)
    monkeypatch.delenv("XLA_FLAGS", raising=False)

    def which(t, h=32, d=128, **kw):
        q = jax.ShapeDtypeStruct((32768 // t, t, h, d), jnp.bfloat16)
        k = jax.ShapeDtypeStruct((32768 // t, t, 8, d), jnp.bfloat16)
        return pallas_attn.which_implementation(q, k, k, **kw)

    impl, why = which(8192, is_causal=True)
    assert impl == dropin.APART and "training step" in why and "deterministic=True" in why
    assert which(16384, is_causal=True)[0] == dropin.APART
    assert which(4096, is_causal=True)[0] == dropin.APART
    assert which(2048, is_causal=True)[0] == "pallas:fa_prefill"
    assert which(4096, is_causal=True, local_window_size=(4095, 0))[0] == dropin.APART  # Mistral at N 4096: no mask
    assert which(8192, is_causal=True, deterministic=True)[0] == "pallas:fa_prefill"
    assert which(8192, is_causal=True, deterministic=False)[0] == dropin.APART
    assert which(8192, is_causal=True, bwd_config="wide")[0] == "pallas:fa_prefill"
    impl, why = which(8192, is_causal=True, local_window_size=(4095, 0))  # Mistral's window (masks here): measured
    assert impl == dropin.APART and "window left 4095" in why
    assert which(16384, is_causal=True, local_window_size=(8191, 0))[0] == dropin.APART
    assert which(8192, is_causal=True, local_window_size=(1023, 0))[0] == "pallas:fa_prefill"  # narrower: unmeasured
    assert which(8192, is_causal=True, local_window_size=(4095, 0), deterministic=True)[0] == "pallas:fa_prefill"
    assert which(8192, is_causal=False, local_window_size=(4095, 4095))[0] == "pallas:fa_prefill"
    assert which(8192, is_causal=True, local_window_size=(8191, 0))[0] == dropin.APART  # masks nothing
    assert which(8192, is_causal=False)[0] == "pallas:fa_prefill"
    assert which(8192, d=64, is_causal=True)[0] == "pallas:fa_prefill"
    assert which(8192, is_causal=True, return_residual=True)[0] == "pallas:fa_prefill"
    assert which(8192, is_causal=True, implementation="pallas")[0] == "pallas:fa_prefill"
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    assert which(8192, is_causal=True)[0] == "pallas:fa_prefill"


@pytest.mark.parametrize("route", ["APART", "CUDNN_FORWARD"])
def test_the_training_routes_refuse_a_traced_scale_by_name(monkeypatch, route):
    """The session-31 routes run Pallas kernels whose scale is static: a traced ``scale`` is a ValueError naming it
    (``dropin._static_scale``), as on fa_prefill's own path; a Python float runs."""
    import pallas_attn
    from pallas_attn import dropin

    q, k, v, _ = _force_route(monkeypatch, getattr(dropin, route), 64, 3)
    monkeypatch.setattr(dropin, "_cudnn_forward", _reference_forward)
    f = jax.jit(lambda q, k, v, s: pallas_attn.dot_product_attention(q, k, v, is_causal=True, scale=s))
    with pytest.raises(ValueError, match="scale must be a Python float"):
        f(q, k, v, 0.125)
    assert dropin._static_scale(None, 64) == 0.125 and dropin._static_scale(0.5, 64) == 0.5
