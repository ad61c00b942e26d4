"""fa_prefill_bwd.attention_lse(with_lse=False): the drop-in's call without return_residual on Hopper. Not
differentiated, it runs fa_prefill's forward without the LSE; differentiated, its gradients are the with-LSE pair's.
Interpret mode (the forward's Pallas twin, the backward's kernels on the GPU interpreter)."""

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
