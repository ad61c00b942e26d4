"""Ring attention on the GPUs of one host (issue 34): output and gradients against one GPU's drop-in, with each ring
step on fa_prefill's pair (a Hopper) and on fa_train (the switch off). Needs at least 2 GPUs (skips otherwise).
Budget: about a minute on 2 H100s."""

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import pallas_attn  # noqa: E402
from pallas_attn import distributed as dist  # noqa: E402

pytestmark = pytest.mark.gpu


def _rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("kernel", ["fa_prefill", "fa_train"])
@pytest.mark.parametrize("causal,layout", [(True, "striped"), (True, "contiguous"), (False, "striped")])
def test_ring_matches_the_drop_in_on_one_gpu(monkeypatch, kernel, causal, layout):
    if jax.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    monkeypatch.setattr(dist, "RING_FA_PREFILL", kernel == "fa_prefill")
    assert dist.ring_kernel("bfloat16", 128, False) == kernel
    n = jax.device_count()
    rng = np.random.default_rng(0)
    t = 2048 * n
    q, do = (jnp.asarray(rng.standard_normal((1, t, 8, 128), np.float32), jnp.bfloat16) for _ in range(2))
    k, v = (jnp.asarray(rng.standard_normal((1, t, 2, 128), np.float32), jnp.bfloat16) for _ in range(2))
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("cp",))

    def ring(q, k, v):
        return dist.ring_attention_sharded(mesh, q, k, v, axis="cp", causal=causal, layout=layout)

    def one(q, k, v):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=causal)

    def grads(f):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * do.astype(jnp.float32)),
                                argnums=(0, 1, 2)))(q, k, v)

    assert _rel(jax.jit(ring)(q, k, v), jax.jit(one)(q, k, v)) < 1e-2
    for name, g, r in zip("qkv", grads(ring), grads(one)):
        assert np.isfinite(np.asarray(g, np.float32)).all(), name
        assert _rel(g, r) < 2e-2, name
