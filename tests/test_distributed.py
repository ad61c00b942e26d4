"""Context-parallel decode (``pallas_attn.distributed``) on a mesh of virtual CPU devices, in interpret mode.

The outer test re-runs this file in a subprocess with ``--xla_force_host_platform_device_count=4`` (the flag
must be set before JAX starts); the ``test_inner_*`` tests run there and skip in a one-device process.
Every case is checked against the float64 oracle on the whole cache and against the single-device kernel.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import pallas_attn
from attn_core import oracle
from attn_core.paging import build_paged_kv
from pallas_attn import distributed as dist

N = 4
inner = pytest.mark.skipif(jax.device_count() < N, reason="runs in the virtual-device subprocess (outer test)")


@pytest.mark.slow
def test_on_virtual_devices(run_on_virtual_devices):
    run_on_virtual_devices(__file__, N)


def _mesh(shape=(N,), names=("cp",)):
    return Mesh(np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape), names)


def _qkv(rng, b, tq, hq, hkv, d, tk, dtype="float16"):
    dt = jnp.dtype(dtype)
    return (jnp.asarray(rng.standard_normal((b, tq, hq, d)), dt), jnp.asarray(rng.standard_normal((b, tk, hkv, d)), dt),
            jnp.asarray(rng.standard_normal((b, tk, hkv, d)), dt))


def _close(out, lse, ref_o, ref_lse, tol=1e-2):
    o = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    assert np.all(np.isfinite(o))
    assert np.linalg.norm(o - ref_o) / max(np.linalg.norm(ref_o), 1e-30) < tol
    l = np.asarray(lse, np.float64)
    assert np.array_equal(np.isneginf(l), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(l[fin], ref_lse[fin], atol=2e-3, rtol=0)


CASES = [
    # (B, Tq, Hq, Hkv, D, Tk, causal, kv_len): even slices, ragged batch, devices with empty slices, Tq > 1
    (2, 1, 8, 2, 64, 256, False, None),
    (2, 1, 8, 2, 64, 256, True, [256, 70]),  # sequence 1 ends in device 1's slice: devices 2, 3 empty
    (3, 1, 4, 4, 128, 512, False, [512, 1, 129]),  # G = 1; a one-key sequence
    (1, 4, 8, 1, 64, 192, True, [150]),  # Tq = 4, causal; slices of 48 keys (page 16 view)
]


@inner
@pytest.mark.parametrize("merge", dist.MERGES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}Tq{c[1]}G{c[2] // c[3]}Tk{c[5]}{'c' if c[6] else ''}")
def test_inner_dense_split_matches_oracle_and_one_device(rng, case, merge):
    b, tq, hq, hkv, d, tk, causal, lens = case
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, tk)
    kv_len = None if lens is None else jnp.asarray(lens, jnp.int32)
    out, lse = dist.context_parallel_decode(_mesh(), q, k, v, causal=causal, kv_len=kv_len, merge=merge,
                                            return_lse=True)
    lens_np = np.full((b,), tk) if lens is None else np.asarray(lens)
    ref_o, ref_lse = oracle.attention_reference(q, k, v, causal=causal, q_offset=lens_np - tq, kv_len=lens_np)
    _close(out, lse, ref_o, ref_lse)
    # The same problem on one device (fa_decode's paged entry over the same cache) agrees to fp32 rounding.
    kp, vp, bt = build_paged_kv(k, v, 16, shuffle=False)
    one, one_lse = pallas_attn.paged_attention(q, jnp.asarray(kp), jnp.asarray(vp), jnp.asarray(bt),
                                               jnp.asarray(lens_np, jnp.int32), causal=causal, return_lse=True)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(one, np.float32), atol=2e-3)


@inner
def test_inner_explicit_q_offset_and_all_empty_rows(rng):
    """A global q_offset that hides every key from query 0 (offset -1): that row is 0 with LSE -inf everywhere."""
    b, tq, hq, hkv, d, tk = 1, 2, 4, 2, 64, 128
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, tk)
    out, lse = dist.context_parallel_decode(_mesh(), q, k, v, causal=True, q_offset=jnp.asarray([-1], jnp.int32),
                                            merge="psum", return_lse=True)
    ref_o, ref_lse = oracle.attention_reference(q, k, v, causal=True, q_offset=-1)
    _close(out, lse, ref_o, ref_lse)
    assert not np.any(np.asarray(out[:, 0], np.float32)) and np.all(np.isneginf(np.asarray(lse[:, :, 0])))


@inner
@pytest.mark.parametrize("merge", dist.MERGES)
def test_inner_head_parallel_composes(rng, merge):
    """Mesh 2 (context) x 2 (heads): heads sharded, the merge over the context axis only."""
    b, tq, hq, hkv, d, tk = 2, 1, 8, 4, 64, 256
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, tk)
    mesh = _mesh((2, 2), ("cp", "tp"))
    out, lse = dist.context_parallel_decode(mesh, q, k, v, axis="cp", head_axis="tp", merge=merge, causal=True,
                                            return_lse=True)
    ref_o, ref_lse = oracle.attention_reference(q, k, v, causal=True, q_offset=tk - tq)
    _close(out, lse, ref_o, ref_lse)


@inner
def test_inner_paged_pools_per_device(rng):
    """Each device holds its own pages (own pool, table and lengths): the kernel's paged entry per device."""
    b, tq, hq, hkv, d, page = 2, 1, 8, 2, 64, 16
    lens = np.array([[64, 10], [64, 0], [30, 0], [0, 0]])  # [device, sequence]: ragged, some devices empty
    starts = np.concatenate([np.zeros((1, b), int), np.cumsum(lens, axis=0)[:-1]])
    total = lens.sum(0)
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, int(total.max()))
    pools_k, pools_v, tables = [], [], []
    for dev in range(N):
        kd = np.zeros((b, 64, hkv, d), np.float16)
        vd = np.zeros_like(kd)
        for s in range(b):
            n = lens[dev, s]
            kd[s, :n] = np.asarray(k[s, starts[dev, s]:starts[dev, s] + n])
            vd[s, :n] = np.asarray(v[s, starts[dev, s]:starts[dev, s] + n])
        kp, vp, bt = build_paged_kv(kd, vd, page, seed=dev)
        pools_k.append(kp), pools_v.append(vp), tables.append(bt)
    stack = lambda xs: jnp.asarray(np.stack(xs))  # noqa: E731 - [device, ...], sharded on the leading axis

    def local(q, kp, vp, bt, ln, st):
        return dist.context_parallel_attention(q, kp[0], vp[0], axis_name="cp", block_table=bt[0], kv_len=ln[0],
                                               kv_start=st[0], causal=True, return_lse=True)

    f = jax.jit(jax.shard_map(local, mesh=_mesh(), in_specs=(P(), P("cp"), P("cp"), P("cp"), P("cp"), P("cp")),
                              out_specs=(P(), P()), check_vma=False))
    out, lse = f(q, stack(pools_k), stack(pools_v), stack(tables), stack(lens.astype(np.int32)),
                 stack(starts.astype(np.int32)))
    ref_o, ref_lse = oracle.attention_reference(q, k, v, causal=True, q_offset=total - tq, kv_len=total)
    _close(out, lse, ref_o, ref_lse)


@inner
def test_inner_wrapper_is_one_program_and_composes_with_jit(rng):
    """The public wrapper (issue 36): one jitted program per call (its jaxpr is a single call, no eager op around it),
    the same values as ``decode_program`` given the lengths and offsets it defaults to, under a caller's ``jit``
    too, with q committed to one device or given as host arrays / Python ints for the lengths and offset."""
    b, tq, hq, hkv, d, tk = 2, 1, 4, 2, 64, 256
    q, k, v = _qkv(rng, b, tq, hq, hkv, d, tk)
    mesh = _mesh((2,))
    k, v = dist.shard_kv(mesh, k), dist.shard_kv(mesh, v)
    lens = jnp.asarray([256, 70], jnp.int32)
    prog = dist.decode_program(mesh, axis="cp", head_axis=None, t_local=tk // 2, batch=b, causal=True, scale=None,
                               merge="psum", generation="fa_decode", config=None, interpret=None)
    want, want_lse = prog(q, k, v, lens, lens - tq)

    def call(q, k, v, lens):
        return dist.context_parallel_decode(mesh, q, k, v, causal=True, kv_len=lens, merge="psum", return_lse=True)

    jaxpr = jax.make_jaxpr(call)(q, k, v, lens).jaxpr
    assert [e.primitive.name for e in jaxpr.eqns] in (["pjit"], ["jit"]), jaxpr
    out, lse = call(q, k, v, lens)
    assert np.array_equal(np.asarray(out), np.asarray(want)) and np.array_equal(np.asarray(lse), np.asarray(want_lse))
    q0 = jax.device_put(q, jax.devices()[0])  # q committed to one device: the program's input sharding moves it
    np.testing.assert_array_equal(np.asarray(call(q0, k, v, lens)[0]), np.asarray(want))
    q1 = jax.device_put(q, jax.devices()[1])  # on the mesh's other device: the same values
    np.testing.assert_array_equal(np.asarray(call(q1, k, v, lens)[0]), np.asarray(want))
    inner_jit = jax.jit(lambda q, k, v, lens: call(q, k, v, lens)[0] * 2)
    np.testing.assert_array_equal(np.asarray(inner_jit(q, k, v, lens)), np.asarray(want) * 2)
    host = dist.context_parallel_decode(mesh, q, k, v, causal=True, kv_len=[256, 70], q_offset=5, merge="psum")
    np.testing.assert_array_equal(np.asarray(host), np.asarray(prog(q, k, v, lens, jnp.full((b,), 5, jnp.int32))[0]))
    n = dist.step_program.cache_info().currsize
    for _ in range(3):  # the same shapes and options: no new program
        call(q, k, v, lens)
    assert dist.step_program.cache_info().currsize == n


@inner
def test_inner_bad_arguments():
    with pytest.raises(ValueError, match="merge"):
        dist.merge_across(jnp.zeros((1, 1, 1, 8)), jnp.zeros((1, 1, 1)), axis_name="cp", merge="ring")
    q = jnp.zeros((1, 1, 2, 64), jnp.float16)
    k = jnp.zeros((1, 10, 2, 64), jnp.float16)
    with pytest.raises(ValueError, match="equal slices"):
        dist.context_parallel_decode(_mesh(), q, k, k)
    k = jnp.zeros((1, 16, 2, 64), jnp.float16)
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        dist.context_parallel_decode(_mesh(), q, k, k, axis="tp")
    with pytest.raises(ValueError, match="not an axis of the mesh"):
        dist.context_parallel_decode(_mesh(), q, k, k, head_axis="tp")
    with pytest.raises(ValueError, match="BTNH arrays"):
        dist.context_parallel_decode(_mesh(), q[0], k[0], k[0])


@inner
def test_inner_compare_runs_the_multi_device_impls(tmp_path):
    """compare on the smoke cp workloads: the cp impls on 1, 2, 4 devices agree with the oracle; single-device
    impls never appear on devices > 1; every cp record carries its plan (devices, merge, local kernel plan)."""
    import json

    from compare import runner

    opts = runner.RunOptions(config="cp_decode", only=["cp_smoke*"], out=str(tmp_path), reps=1, warmup=0, e2e_reps=1,
                             budget_s=60.0, max_run_s=None, clock="cupti", arch="h200", cpu_max_flops=1e9,
                             no_ceilings=True, quiet=True, argv=[])
    assert runner.run(opts) == 0
    recs = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    res = [r for r in recs if r.get("type") == "result"]
    for n in (1, 2, 4):
        cp = [r for r in res if r["workload"]["devices"] == n and r["impl"]["name"].startswith("pallas:fa_decode_cp:")]
        assert {r["impl"]["config"] for r in cp} == {"all_gather", "psum", "packed"}
        call = [r for r in res if r["workload"]["devices"] == n
                and r["impl"]["name"].startswith("pallas:fa_decode_cp_call:")]  # the public wrapper per call (one
        assert {r["impl"]["config"] for r in call} == {"psum"}  # merge in the smoke set: the merges are the program's)
        cp += call
        for r in cp:
            assert r["status"] == "ok", r["reason"]
            assert r["impl"]["plan"]["devices"] == n and r["impl"]["multi_device"]
            assert r["agreement"]["rel_l2_err"] < 1e-2
    assert all(r["impl"]["multi_device"] for r in res if r["workload"]["devices"] > 1)
