"""Ring attention (``pallas_attn.distributed.ring_attention``, issue 34, first version) on a mesh of virtual CPU
devices, in interpret mode: the output against the float64 oracle and the gradients against jax.nn's on one device,
causal and not, GQA. The outer test re-runs this file in a subprocess with 4 virtual devices (the flag must be set
before JAX starts); the ``test_inner_*`` tests run there and skip in a one-device process."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from attn_core import oracle
from pallas_attn import distributed as dist

N = 4
inner = pytest.mark.skipif(jax.device_count() < N, reason="runs in the virtual-device subprocess (outer test)")


@pytest.mark.slow
def test_ring_on_virtual_devices(run_on_virtual_devices):
    run_on_virtual_devices(__file__, N)


def _mesh():
    return Mesh(np.array(jax.devices()[:N]), ("cp",))


@inner
@pytest.mark.parametrize("causal,layout", [(True, "striped"), (True, "contiguous"), (False, "striped")])
def test_inner_ring_matches_the_oracle_and_jax_nn_gradients(rng, causal, layout):
    b, t, hq, hkv, d = 1, 64, 4, 2, 32  # 16 tokens a device
    q, k, v, do = (jnp.asarray(rng.standard_normal(s), jnp.float32)
                   for s in ((b, t, hq, d), (b, t, hkv, d), (b, t, hkv, d), (b, t, hq, d)))
    mesh = _mesh()
    out = jax.jit(lambda q, k, v: dist.ring_attention_sharded(mesh, q, k, v, causal=causal, layout=layout))(q, k, v)
    ref, _ = oracle.attention_reference(np.asarray(q), np.asarray(k), np.asarray(v), causal=causal)
    assert np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref) < 1e-5

    def ours(q, k, v):
        return jnp.sum(dist.ring_attention_sharded(mesh, q, k, v, causal=causal, layout=layout) * do)

    def theirs(q, k, v):
        return jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=causal) * do)

    g = jax.jit(jax.grad(ours, argnums=(0, 1, 2)))(q, k, v)
    r = jax.grad(theirs, argnums=(0, 1, 2))(q, k, v)
    for name, a, e in zip(("dq", "dk", "dv"), g, r):
        a, e = np.asarray(a, np.float64), np.asarray(e, np.float64)
        assert np.isfinite(a).all() and np.linalg.norm(a - e) / np.linalg.norm(e) < 1e-4, name


@inner
def test_inner_the_ring_sends_each_block_n_minus_1_times_before_its_kernel():
    """The unrolled forward has 2 (n - 1) ppermutes (K and V, none after the last step), the first issued before the
    first kernel call in program order."""
    mesh = _mesh()
    q = jax.ShapeDtypeStruct((1, 64, 4, 32), jnp.float32)
    kv = jax.ShapeDtypeStruct((1, 64, 2, 32), jnp.float32)
    text = str(jax.make_jaxpr(lambda q, k, v: dist.ring_attention_sharded(mesh, q, k, v, causal=True))(q, kv, kv))
    assert text.count("ppermute[") == 2 * (N - 1)
    assert text.index("ppermute[") < text.index("pallas_call[")


@inner
def test_inner_ring_refuses_uneven_and_cross_attention(rng):
    mesh = _mesh()
    q = jnp.zeros((1, 30, 2, 16), jnp.float32)
    with pytest.raises(ValueError, match="equal chunks"):
        dist.ring_attention_sharded(mesh, q, q[:, :, :1], q[:, :, :1])
    with pytest.raises(ValueError, match="self-attention"):
        dist.ring_attention_sharded(mesh, q[:, :16], q[:, :, :1], q[:, :, :1])
    with pytest.raises(ValueError, match="layout"):
        dist.ring_attention_sharded(mesh, q[:, :16], q[:, :16, :1], q[:, :16, :1], layout="zigzag")
    with pytest.raises(ValueError, match="BTNH arrays"):
        dist.ring_attention_sharded(mesh, q[0, :16], q[0, :16, :1], q[0, :16, :1])
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        dist.ring_attention_sharded(mesh, q[:, :16], q[:, :16, :1], q[:, :16, :1], axis="tp")


@inner
def test_inner_compare_runs_the_ring_on_1_2_4_devices(tmp_path):
    """compare's multi-device train workloads (configs/ring_train.toml, the smoke rows): pallas:ring:striped and
    :contiguous on 1, 2 and 4 devices, each record ok with the output and dq / dk / dv checked against the float64
    oracle, the plan naming the devices and the layout; the single-device peer only on the one-device row."""
    import json

    from compare import runner

    opts = runner.RunOptions(config="ring_train", only=["ring_smoke*"], out=str(tmp_path), reps=1, warmup=0,
                             e2e_reps=1, budget_s=60.0, max_run_s=None, clock="cupti", arch="h100",
                             cpu_max_flops=1e9, no_ceilings=True, quiet=True, argv=[])
    assert runner.run(opts) == 0
    res = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    res = [r for r in res if r.get("type") == "result"]
    for n in (1, 2, 4):
        ring = [r for r in res if r["workload"]["devices"] == n and r["impl"]["name"].startswith("pallas:ring:")]
        assert {r["impl"]["config"] for r in ring} == {"striped", "contiguous"}
        for r in ring:
            assert r["status"] == "ok", r["reason"]
            assert r["impl"]["plan"]["devices"] == n and r["impl"]["plan"]["layout"] == r["impl"]["config"]
            assert r["agreement"]["rel_l2_err"] < 1e-5
            g = r["agreement"]["grads"]
            assert all(g[x]["rel_l2_err"] < g["tol_rel_l2"] for x in ("dq", "dk", "dv"))
    assert [r["workload"]["devices"] for r in res if r["impl"]["name"] == "jax:xla"] == [1]


def test_ring_steps_run_fa_prefill_s_pair_on_a_hopper(monkeypatch):
    """ring_kernel: fa_prefill's forward + backward on a Hopper (faked here) for fp16 / bf16 at its backward's head
    dims; fa_train in interpret mode, for fp32, other head dims, a fa_train config, another GPU, or the switch off."""
    from pallas_attn import dropin

    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    assert dist.ring_kernel("bfloat16", 128, False) == "fa_prefill"
    assert dist.ring_kernel("float16", 64, False) == "fa_prefill"
    assert dist.ring_kernel("bfloat16", 128, True) == "fa_train"
    assert dist.ring_kernel("float32", 128, False) == "fa_train"
    assert dist.ring_kernel("bfloat16", 96, False) == "fa_prefill"  # D 96: the backward on zero-padded D 128 columns
    assert dist.ring_kernel("bfloat16", 80, False) == "fa_train"
    assert dist.ring_kernel("bfloat16", 128, False, config=object()) == "fa_train"
    monkeypatch.setattr(dist, "RING_FA_PREFILL", False)
    assert dist.ring_kernel("bfloat16", 128, False) == "fa_train"
    monkeypatch.setattr(dist, "RING_FA_PREFILL", True)
    monkeypatch.setattr(dropin, "_is_sm90", lambda: False)
    assert dist.ring_kernel("bfloat16", 128, False) == "fa_train"


def test_the_ring_s_training_step_lowers_with_fa_prefill_s_pair_for_cuda(monkeypatch):
    """On a Hopper (faked: nothing runs) the ring's forward and backward lower for CUDA with fa_prefill's forward and
    both backward passes (dK/dV, dQ) in the program, under jax.grad inside shard_map."""
    from pallas_attn import dropin
    from pallas_attn.kernels import fa_prefill, fa_prefill_bwd

    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    mesh = Mesh(np.array(jax.devices()[:1]), ("cp",))

    def loss(q, k, v):
        out = dist.ring_attention_sharded(mesh, q, k, v, axis="cp", causal=True, interpret=False)
        return jnp.sum(out.astype(jnp.float32))

    qs = jax.ShapeDtypeStruct((1, 1024, 8, 128), jnp.bfloat16)
    ks = jax.ShapeDtypeStruct((1, 1024, 2, 128), jnp.bfloat16)
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(qs, ks, ks).lower(lowering_platforms=("cuda",)).as_text()
    for name in (fa_prefill.PASS_FWD, fa_prefill_bwd.PASS_DKDV, fa_prefill_bwd.PASS_DQ):
        assert name in text, name
