"""The drop-in's default paths: fa_prefill_bwd.attention_lse(with_lse=False) (the drop-in without return_residual
on Hopper: not differentiated, fa_prefill's forward without the LSE; differentiated, the with-LSE pair's gradients),
and the fallback's choice of jax.nn's cuDNN over XLA on a GPU. Interpret mode / CPU."""

import jax
import jax.numpy as jnp
import numpy as np

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
