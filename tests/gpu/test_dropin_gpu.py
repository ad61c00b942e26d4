"""pallas_attn.dot_product_attention on the GPU (fa_train compiled through Triton) at realistic shapes.

The checks of tests/test_dropin.py at training sizes: outputs and gradients against
``jax.nn.dot_product_attention(implementation="xla")`` in float32 (XLA at HIGHEST precision so it does not
use TF32; ours runs IEEE fp32 dots) to 1e-5 relative; fp16 / bf16 gradients at most twice XLA's own
low-precision error against the float32 answer (plus 2 eps); NaN patterns as jax.nn; grad under jit,
vmap and remat; per-sequence lengths, windows, GQA. Budget: about two to three minutes on an H100.
"""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402

pytestmark = pytest.mark.gpu
XLA = dict(implementation="xla")


def _arrays(seed, b, t, s, n, kh, h, dtype="float32"):
    ks = jax.random.split(jax.random.key(seed), 4)
    return tuple(jax.random.normal(k, shape, jnp.float32).astype(dtype)
                 for k, shape in zip(ks, ((b, t, n, h), (b, s, kh, h), (b, s, kh, h), (b, t, n, h))))


def _loss_and_grads(fn, q, k, v, w, **kw):
    def loss(q, k, v):
        out = fn(q, k, v, **kw)
        return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, grads


def _rel(a, b) -> float:
    a = np.asarray(jnp.asarray(a, jnp.float32), np.float64)
    b = np.asarray(jnp.asarray(b, jnp.float32), np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# (B, T, S, N, K, H, causal, window, q_lens, kv_lens)
CASES = [
    pytest.param(2, 1024, 1024, 8, 8, 128, False, None, None, None, id="mha-1k-d128"),
    pytest.param(2, 1000, 1333, 16, 4, 64, True, None, None, None, id="gqa4-causal-odd"),
    pytest.param(1, 777, 2048, 16, 2, 128, True, (256, 0), [777], [1500], id="gqa8-window-lengths"),
    pytest.param(3, 513, 513, 4, 1, 256, False, 100, [513, 1, 300], [0, 513, 77], id="mqa-d256-empty-rows"),
]


@pytest.mark.parametrize("b,t,s,n,kh,h,causal,window,q_lens,kv_lens", CASES)
def test_float32_matches_xla(b, t, s, n, kh, h, causal, window, q_lens, kv_lens):
    q, k, v, w = _arrays(0, b, t, s, n, kh, h)
    kw = dict(is_causal=causal, local_window_size=window,
              query_seq_lengths=None if q_lens is None else jnp.asarray(q_lens, jnp.int32),
              key_value_seq_lengths=None if kv_lens is None else jnp.asarray(kv_lens, jnp.int32))
    assert pallas_attn.which_implementation(q, k, v, **kw)[0] == "pallas:fa_train"
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, implementation="pallas", **kw)
    with jax.default_matmul_precision("highest"):
        ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, q, k, v, w, **XLA, **kw)
    assert np.isfinite(np.asarray(out)).all()
    assert _rel(out, ref) < 1e-5, _rel(out, ref)
    for name, g, rg in zip("qkv", grads, ref_grads):
        assert g.dtype == q.dtype and _rel(g, rg) < 1e-5, (name, _rel(g, rg))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal,kh", [(False, 16), (True, 4)])
def test_low_precision_within_xla_error(dtype, causal, kh):
    """B2 H16 N2048 D128: our error against the float32 answer is at most twice jax.nn's own (XLA in the same
    dtype) plus 2 eps, for the output and every gradient."""
    q, k, v, w = _arrays(1, 2, 2048, 2048, 16, kh, 128, dtype)
    kw = dict(is_causal=causal)
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, implementation="pallas", **kw)
    lo, lo_grads = _loss_and_grads(jax.nn.dot_product_attention, q, k, v, w, **XLA, **kw)
    with jax.default_matmul_precision("highest"):
        f32 = [x.astype(jnp.float32) for x in (q, k, v, w)]
        ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, *f32, **XLA, **kw)
    eps = float(jnp.finfo(dtype).eps)
    for name, ours, theirs, truth in zip(("out", "dq", "dk", "dv"), (out, *grads), (lo, *lo_grads),
                                         (ref, *ref_grads)):
        assert ours.dtype == jnp.dtype(dtype), name
        assert _rel(ours, truth) <= 2 * _rel(theirs, truth) + 2 * eps, (name, _rel(ours, truth), _rel(theirs, truth))


def test_nan_inf_and_transforms():
    """NaN in q, +Inf in k: jax.nn's NaN rows (output and gradients); vmap and remat of the grad."""
    q, k, v, w = _arrays(2, 1, 512, 512, 4, 2, 64, "float16")
    q = q.at[0, 100, 0, 3].set(jnp.nan)
    k = k.at[0, 300, 1, 5].set(jnp.inf)
    kw = dict(is_causal=True)
    out, grads = _loss_and_grads(pallas_attn.dot_product_attention, q, k, v, w, implementation="pallas", **kw)
    ref, ref_grads = _loss_and_grads(jax.nn.dot_product_attention, q, k, v, w, **XLA, **kw)
    np.testing.assert_array_equal(np.isnan(np.asarray(out, np.float32)), np.isnan(np.asarray(ref, np.float32)))
    for g, rg in zip(grads, ref_grads):
        np.testing.assert_array_equal(np.isnan(np.asarray(g, np.float32)).any(-1),
                                      np.isnan(np.asarray(rg, np.float32)).any(-1))
    q, k, v, w = _arrays(3, 2, 256, 256, 8, 2, 128, "bfloat16")
    f = lambda q, k, v: pallas_attn.dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    r = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, **XLA)  # noqa: E731
    stack = [jnp.stack([x, x[::-1]]) for x in (q, k, v)]
    assert _rel(jax.jit(jax.vmap(f))(*stack), jax.vmap(r)(*stack)) < 2e-2
    g = jax.jit(jax.grad(jax.checkpoint(lambda k: jnp.sum(f(q, k, v).astype(jnp.float32) * w))))(k)
    rg = jax.grad(lambda k: jnp.sum(r(q, k, v).astype(jnp.float32) * w))(k)
    assert _rel(g, rg) < 2e-2
