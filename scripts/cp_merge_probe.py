"""Context-parallel decode on 1, 2, 4 ... GPUs of one host: correctness, time per step, the merge's own time.

    python scripts/bench_context_parallel.py --out results/<dir> [--devices 1,2,4] [--merges all_gather,psum,packed]
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python scripts/bench_context_parallel.py --smoke  # CPU check

Workloads (names as in the issue): ``cp_decode_b1_s1048576`` and ``cp_decode_b8_s262144``: Hq 32, Hkv 8,
D 128, fp16 KV, Tq 1, non-causal, the cache split into equal contiguous slices over the devices.

Clock. Three host wall-clock figures per (workload, devices, merge), because several devices' kernels and
collectives have no single CUPTI span a JAX call can return:
  * ``loop_us``: the step chained inside ONE jitted program (``compare.timing.time_loop``: each step's q
    depends on the last step's output, so nothing is hoisted or dropped; ``T(2n) - T(n)`` over ``n`` steps,
    so what a call pays once cancels): device time per step (the primary number);
  * ``pipelined_us``: ``--iters`` calls issued with one sync at the end, per call (what a serving loop sees);
  * ``synced_us``: median of calls each followed by a sync.
The merge's own time is ``merge_us`` (the collective + merge alone on the real (o, lse) shapes, same loop
method) and ``local_us`` (each device's kernel on its slice, no collective). Records (JSONL, one per
measurement, with the environment and the device count) go to ``--out``.

The step's times (every merge on 1, 2, 4 devices: the loop clock, pipelined and synced calls, with oracle agreement)
are compare's too: ``configs/cp_decode.toml`` (``pallas:fa_decode_cp:<merge>``), whose records are the ones to keep.
This script stays for ``merge_us`` (``cp_merge``), which compare has no form for: a compare workload is an attention
problem and an implementation computes its answer, and the collective + merge alone on zero states is neither.
``scripts/cp_slice_probe.py`` times one device's kernel on its slice on the CUPTI clock (``local_us`` here also moves
device 0's result to every device).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from compare import timing  # noqa: E402
from pallas_attn import _compat, distributed  # noqa: E402

WORKLOADS = {  # name: (B, S)
    "cp_decode_b1_s1048576": (1, 1048576),
    "cp_decode_b8_s262144": (8, 262144),
}
HQ, HKV, D, TQ = 32, 8, 128, 1


def _env(n_dev: int) -> dict:
    dev = jax.devices()[0]
    return {"device_kind": getattr(dev, "device_kind", dev.platform), "platform": dev.platform,
            "devices_visible": jax.device_count(), "devices_used": n_dev, "jax": jax.__version__,
            "python": platform.python_version(), "git_sha": os.environ.get("PALLAS_ATTN_GIT_SHA"),
            "xla_flags": os.environ.get("XLA_FLAGS")}


def _inputs(mesh, b, s, dtype):
    sh_kv = NamedSharding(mesh, P(None, "cp", None, None))
    sh_q = NamedSharding(mesh, P())

    @jax.jit
    def make(key):
        kq, kk, kv = jax.random.split(key, 3)
        q = jax.random.normal(kq, (b, TQ, HQ, D), jnp.float32).astype(dtype)
        k = jax.random.normal(kk, (b, s, HKV, D), jnp.float32).astype(dtype)
        v = jax.random.normal(kv, (b, s, HKV, D), jnp.float32).astype(dtype)
        return q, k, v

    f = jax.jit(make, out_shardings=(sh_q, sh_kv, sh_kv))
    return f(jax.random.PRNGKey(0))


def _loop_time(step, args, iters: int) -> float:
    """µs per step: ``compare.timing.time_loop`` (steps chained in one jitted program, two loop lengths
    differenced so per-call costs cancel), the best of 3 samples. Records made before 2026-11-22 14:05 (git
    2406d14d7e57) used T(iters) / iters instead, which carries the per-call cost / iters on top."""
    return min(timing.time_loop(step, args, reps=3, iters=iters).samples_us)


def _call_times(fn, args, iters: int) -> tuple[float, float]:
    jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    outs = [fn(*args) for _ in range(iters)]
    jax.block_until_ready(outs)
    pipelined = (time.perf_counter() - t0) / iters * 1e6
    synced = []
    for _ in range(min(iters, 20)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        synced.append((time.perf_counter() - t0) * 1e6)
    return pipelined, statistics.median(synced)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--merges", default="all_gather,psum,packed")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", default=None, help="directory for records.jsonl (default: print only)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (CPU virtual devices)")
    a = ap.parse_args(argv)
    _compat.silence_triton_deprecation()
    interpret = True if a.smoke else None
    dtype = jnp.float16
    counts = [int(x) for x in a.devices.split(",") if int(x) <= jax.device_count()]
    merges = a.merges.split(",")
    sizes = {"cp_decode_smoke_b2_s1024": (2, 1024)} if a.smoke else {w: WORKLOADS[w] for w in a.workloads.split(",")}
    iters = 2 if a.smoke else a.iters
    records = []
    out_path = None
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        out_path = os.path.join(a.out, "records.jsonl")

    def emit(rec):
        records.append(rec)
        if out_path:
            with open(out_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
        print(json.dumps({k: v for k, v in rec.items() if k != "env"}), flush=True)

    base_out = {}
    for wl, (b, s) in sizes.items():
        kv_bytes = 2 * b * s * HKV * D * 2
        for n in counts:
            mesh = Mesh(np.array(jax.devices()[:n]), ("cp",))
            q, k, v = _inputs(mesh, b, s, dtype)
            lens = jnp.full((b,), s, jnp.int32)
            off = jnp.zeros((b,), jnp.int32)
            for merge in merges:
                prog = distributed.decode_program(mesh, axis="cp", head_axis=None, t_local=s // n, batch=b,
                                                  causal=False, scale=None, merge=merge, generation="fa_decode",
                                                  config=None, interpret=interpret)
                out, lse = prog(q, k, v, lens, off)
                out = np.asarray(jax.device_get(out), np.float32)
                ref = base_out.setdefault(wl, out)  # the 1-device result (first count) is the reference
                agree = float(np.max(np.abs(out - ref)))
                finite = bool(np.all(np.isfinite(out)))
                step = lambda q, k, v, _p=prog, _l=lens, _o=off: _p(q, k, v, _l, _o)[0]  # noqa: E731
                loop_us = _loop_time(step, (q, k, v), iters)
                call = lambda q, k, v, _p=prog, _l=lens, _o=off: _p(q, k, v, _l, _o)  # noqa: E731
                pipelined_us, synced_us = _call_times(call, (q, k, v), iters)
                emit({"type": "cp_decode", "workload": wl, "batch": b, "seq": s, "heads_q": HQ, "heads_kv": HKV,
                      "head_dim": D, "dtype": "float16", "devices": n, "merge": merge, "loop_us": loop_us,
                      "pipelined_us": pipelined_us, "synced_us": synced_us, "kv_bytes": kv_bytes,
                      "tbps_loop": kv_bytes / (loop_us * 1e-6) / 1e12, "max_abs_vs_1dev": agree, "finite": finite,
                      "iters": iters, "env": _env(n)})
            # the merge alone on the real state shapes, and each device's kernel alone
            for merge in merges:
                o_st = jax.device_put(jnp.zeros((n * b, TQ, HQ, D), dtype), NamedSharding(mesh, P("cp")))
                l_st = jax.device_put(jnp.zeros((n * b, HQ, TQ), jnp.float32), NamedSharding(mesh, P("cp")))
                mfn = jax.jit(jax.shard_map(
                    lambda o, l, _m=merge: distributed.merge_across(o, l, axis_name="cp", merge=_m)[0],
                    mesh=mesh, in_specs=(P("cp"), P("cp")), out_specs=P(), check_vma=False))
                m_us = _loop_time(lambda o, l, _f=mfn, _n=n: jnp.tile(_f(o, l), (_n, 1, 1, 1)), (o_st, l_st), iters)
                emit({"type": "cp_merge", "workload": wl, "devices": n, "merge": merge, "merge_us": m_us,
                      "iters": iters, "env": _env(n)})
            from pallas_attn import api

            def local(q, k, v, b=b):
                t = k.shape[1]
                page = distributed._page_for(t)
                per = t // page
                table = jnp.arange(b, dtype=jnp.int32)[:, None] * per + jnp.arange(per, dtype=jnp.int32)[None, :]
                return api.paged_attention(q, distributed._as_pool(k, page), distributed._as_pool(v, page), table,
                                           jnp.full((b,), t, jnp.int32), check_block_table=False,
                                           interpret=interpret)

            lfn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "cp"), P(None, "cp")),
                                        out_specs=P("cp"), check_vma=False))
            l_us = _loop_time(lambda q, k, v, _f=lfn, _b=b: _f(q, k, v)[:_b], (q, k, v), iters)
            emit({"type": "cp_local", "workload": wl, "devices": n, "local_us": l_us, "iters": iters,
                  "env": _env(n)})
            del q, k, v
    print("\nworkload                      devices  merge        loop us  pipelined us  synced us  TB/s  speed-up")
    one = {(r["workload"], r["merge"]): r["loop_us"] for r in records if r["type"] == "cp_decode" and r["devices"] == 1}
    for r in records:
        if r["type"] != "cp_decode":
            continue
        sp = one.get((r["workload"], r["merge"]))
        print(f"{r['workload']:29s} {r['devices']:7d}  {r['merge']:10s} {r['loop_us']:9.1f} {r['pipelined_us']:13.1f} "
              f"{r['synced_us']:10.1f} {r['tbps_loop']:5.2f}  {sp / r['loop_us'] if sp else float('nan'):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
