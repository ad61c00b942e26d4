"""Where the public context-parallel decode wrapper's per-call time goes, on the GPUs of this host (issue 36).

Per-call wall time (50 calls issued back to back, one sync; median of 5 batches) for the bare program with every
input pre-placed, the wrapper's cached step with q pre-placed, and the wrapper with q as a caller holds it (committed
to device 0, uncommitted, numpy), at a smoke shape (host-bound: the per-call floor) and at B1 S1M, on 1, 2, 4, 8
devices as the host has them.

Usage: ``PYTHONPATH=. python scripts/cp_host_probe.py OUT.json`` on a GPU host (``CP_INTERP=1`` runs the smoke shape
on one CPU device in interpret mode: a check that the script runs, not a measurement). The JSON carries the GPU names,
jax version and ``PALLAS_ATTN_GIT_SHA``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_attn import distributed

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

INTERP = bool(os.environ.get("CP_INTERP"))
# the cases CP_PROFILE=1 profiles (on the largest device count)
PROFILED = ("step, q pre-placed", "wrapper, q committed dev0", "wrapper, q uncommitted",
            "stacked q (dev0 shard), broadcast in program")
SHAPES = {"smoke_b2_s512_h8_d64": (2, 512, 8, 2, 64), "b1_s1048576_h32_d128": (1, 1048576, 32, 8, 128)}


def per_call(f, calls: int = 50, reps: int = 5) -> float:
    """Median over ``reps`` batches of the wall time per call of ``calls`` calls issued back to back, one sync."""
    jax.block_until_ready(f())
    jax.block_until_ready(f())
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = None
        for _ in range(calls):
            r = f()
        jax.block_until_ready(r)
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return float(np.median(samples))


def issue_time(f, calls: int = 50) -> float:
    """Median host time for one call to return (no sync between calls): the host's own cost per call. Where it is near
    ``per_call``'s wall time the loop is host-bound; where it is far under, the calls wait on something else."""
    jax.block_until_ready(f())
    ts, r = [], None
    for _ in range(calls):
        t0 = time.perf_counter()
        r = f()
        ts.append((time.perf_counter() - t0) * 1e6)
    jax.block_until_ready(r)
    return float(np.median(ts))


def profile(f, label: str, calls: int = 50, top: int = 25) -> str:
    """cProfile of ``calls`` pipelined calls (C++ time is charged to the Python frame that called it)."""
    import cProfile
    import io
    import pstats
    jax.block_until_ready(f())
    pr = cProfile.Profile()
    pr.enable()
    r = None
    for _ in range(calls):
        r = f()
    jax.block_until_ready(r)
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(top)
    return f"== profile: {label} ({calls} calls)\n" + buf.getvalue()


def cases(n: int, shape: tuple, q_host, k_host, v_host) -> dict:
    b, s, _, _, _ = shape
    mesh = Mesh(np.array(jax.devices()[:n]), ("cp",))
    k, v = distributed.shard_kv(mesh, k_host), distributed.shard_kv(mesh, v_host)
    rep = NamedSharding(mesh, P())
    qs = jax.device_put(q_host, rep)
    q0 = jax.device_put(q_host, jax.devices()[0])
    qu = jnp.asarray(q_host)
    lens = jax.device_put(jnp.full((b,), s, jnp.int32), rep)
    off = jax.device_put(jnp.full((b,), s - 1, jnp.int32), rep)
    opts = dict(axis="cp", head_axis=None, t_local=s // n, batch=b, causal=True, scale=None, merge="all_gather",
                generation="fa_decode", config=None, interpret=INTERP)
    prog = distributed.decode_program(mesh, **opts)
    step = distributed.step_program(mesh, tq=1, has_len=False, has_off=False, **opts)
    kw = dict(causal=True, merge="all_gather", interpret=INTERP)

    def call(q):
        return distributed.context_parallel_decode(mesh, q, k, v, **kw)

    # a caller's own jit takes the cache as an argument (closing over it would bake it in as a constant); JAX refuses
    # a q committed to one device beside a cache on the mesh there, so the caller's q is uncommitted
    outer = jax.jit(lambda q, k, v: distributed.context_parallel_decode(mesh, q, k, v, **kw))

    # session 13's stacked q (removed from the library, commit 9926468), rebuilt here to profile it: q on device 0
    # becomes device 0's shard of a [n * B, ...] array (cached zero shards elsewhere), broadcast inside the program
    pads = [jax.device_put(np.zeros_like(q_host), dv) for dv in jax.devices()[1:n]]
    st_sh = NamedSharding(mesh, P("cp"))
    bcast = jax.shard_map(lambda x: jax.lax.all_gather(x, "cp")[0], mesh=mesh, in_specs=P("cp"), out_specs=P(),
                          check_vma=False)
    stacked_step = jax.jit(lambda qq, k, v: prog(bcast(qq), k, v, jnp.full((b,), s, jnp.int32),
                                                   jnp.full((b,), s - 1, jnp.int32)),
                           in_shardings=(st_sh, NamedSharding(mesh, P(None, "cp")), NamedSharding(mesh, P(None, "cp"))))
    gshape = (n * b,) + q_host.shape[1:]

    def stacked():
        qq = jax.make_array_from_single_device_arrays(gshape, st_sh, [q0] + pads)
        return stacked_step(qq, k, v)[0]

    return {
        "program, all pre-placed": lambda: prog(qs, k, v, lens, off)[0],
        "step, q pre-placed": lambda: step(qs, k, v)[0],
        "wrapper, q pre-placed": lambda: call(qs),
        "wrapper, q committed dev0": lambda: call(q0),
        "wrapper, q uncommitted": lambda: call(qu),
        "wrapper, q numpy": lambda: call(q_host),
        "wrapper in caller jit, q uncommitted": lambda: outer(qu, k, v),
        "device_put(q dev0 -> mesh) alone": lambda: jax.device_put(q0, rep),
        "stacked q (dev0 shard), broadcast in program": stacked,
        "make_array_from_single_device_arrays alone": lambda: jax.make_array_from_single_device_arrays(
            gshape, st_sh, [q0] + pads),
    }


def main(out: str) -> None:
    shapes = {"smoke_b2_s512_h8_d64": SHAPES["smoke_b2_s512_h8_d64"]} if INTERP else SHAPES
    if os.environ.get("CP_SHAPES"):  # e.g. CP_SHAPES=b1_s1048576_h32_d128
        shapes = {k: SHAPES[k] for k in os.environ["CP_SHAPES"].split(",")}
    ndev = [n for n in (1, 2, 4, 8) if n <= len(jax.devices())]
    if os.environ.get("CP_DEVICES"):  # e.g. CP_DEVICES=1,4
        ndev = [int(x) for x in os.environ["CP_DEVICES"].split(",")]
    rows = []
    env = dict(gpu=[dv.device_kind for dv in jax.devices()], jax=jax.__version__,
               git=os.environ.get("PALLAS_ATTN_GIT_SHA"), interpret=INTERP, xla_flags=os.environ.get("XLA_FLAGS"))
    for sname, shape in shapes.items():
        b, s, hq, hkv, d = shape
        rng = np.random.default_rng(0)
        q_host = rng.standard_normal((b, 1, hq, d)).astype(np.float16)
        k_host = jnp.asarray(rng.standard_normal((b, s, hkv, d), dtype=np.float32).astype(np.float16))
        v_host = jnp.asarray(rng.standard_normal((b, s, hkv, d), dtype=np.float32).astype(np.float16))
        for n in ndev:
            for cname, f in cases(n, shape, q_host, k_host, v_host).items():
                t = ti = None
                try:
                    t = per_call(f)
                    ti = issue_time(f)
                    if os.environ.get("CP_PROFILE") and n == max(ndev) and cname in PROFILED:
                        print(profile(f, f"{sname} dev{n} {cname}"), flush=True)
                except Exception as e:  # noqa: BLE001 - recorded, the probe goes on
                    print("ERR", sname, n, cname, repr(e)[:200], flush=True)
                rows.append(dict(shape=sname, devices=n, case=cname, us_per_call=t, issue_us=ti))
                print(f"{sname:24s} dev{n} {cname:52s} wall {t if t is None else round(t, 1)} "
                      f"issue {ti if ti is None else round(ti, 1)}", flush=True)
                with open(out, "w") as fh:  # after every row: a run cut short keeps what it measured
                    json.dump(dict(env=env, rows=rows), fh, indent=1)


if __name__ == "__main__":
    # argparse, so that ``--help`` prints this and no option is taken for the output path (a ``--help`` file of
    # rows was once written and committed that way)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the JSON file the rows go to (rewritten after every row)")
    main(ap.parse_args().out)
