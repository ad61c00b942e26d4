"""Context-parallel decode's two halves apart on 1, 2, 4 ... GPUs of one host: the merge alone, the local kernels.

    PYTHONPATH=. python scripts/cp_merge_probe.py --out $OUT/cp_merge [--devices 1,2,4] [--merges psum,packed]
    XLA_FLAGS=--xla_force_host_platform_device_count=4 PYTHONPATH=. python scripts/cp_merge_probe.py --smoke  # CPU

Workloads: compare's ``configs/cp_decode.toml`` shapes, ``cp_decode_b1_s1048576_dev{n}`` and
``cp_decode_b8_s262144_dev{n}`` (Hq 32, Hkv 8, D 128, fp16 KV, Tq 1, non-causal, the cache split into equal
contiguous slices over the first n devices; ``--smoke``: its ``cp_smoke_b2_s512_dev{n}``); the records carry those
names, so each pairs with compare's record of
the whole step (``pallas:fa_decode_cp:<merge>``). Two record kinds (``type: "probe"``, compare's record schema through
``compare.records.ProbeWriter``), each on compare's multi-device clock (``compare.timing.time_loop``: the step chained
inside one jitted program, ``(T(2n) - T(n)) / n`` so what a call pays once cancels; warm L2):

* ``cp_merge``: the collective + merge alone (``distributed.merge_across``, one per ``--merges``) on zero partial
  states of the real (o, lse) shapes, no attention;
* ``cp_local``: each device's kernel on its slice (fa_decode's paged entry over the identity table, the view the
  program runs through), no collective (device 0's rows are the output, so the loop chains).

ROLE: a probe. Why it is not a compare config: a compare workload is an attention problem and an implementation
computes its answer; the collective + merge on zero states and the kernels on their slices without the merge are
neither. The whole step (every merge on 1, 2, 4 devices: the loop clock, pipelined and synced calls, oracle agreement)
is ``configs/cp_decode.toml``'s. ``scripts/cp_slice_probe.py`` times one device's kernel on its slice on the CUPTI
clock. This file was ``scripts/bench_context_parallel.py`` until issue 26 item 5, which also timed the step (its
``cp_decode`` records, now compare's); records it wrote stay under results/ with its old field names (``loop_us``,
``merge_us``, ``local_us``: the best of 3 loop samples, at 50 steps).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from compare import records, timing  # noqa: E402
from pallas_attn import _compat, api, distributed  # noqa: E402

ROLE = "probe"
PROBE = "cp_merge_probe"
WORKLOADS = {  # configs/cp_decode.toml's workload names without the _dev{n}: (B, S, Hq, Hkv, D)
    "cp_decode_b1_s1048576": (1, 1048576, 32, 8, 128),
    "cp_decode_b8_s262144": (8, 262144, 32, 8, 128),
}
SMOKE = {"cp_smoke_b2_s512": (2, 512, 8, 2, 64)}  # --smoke: the config's CPU workload
TQ = 1
MERGES = ("all_gather", "psum", "packed")


def _kv(mesh, b, s, hq, hkv, d, dtype):
    sh_kv = NamedSharding(mesh, P(None, "cp", None, None))
    sh_q = NamedSharding(mesh, P())

    def make(key):
        kq, kk, kv = jax.random.split(key, 3)
        q = jax.random.normal(kq, (b, TQ, hq, d), jnp.float32).astype(dtype)
        k = jax.random.normal(kk, (b, s, hkv, d), jnp.float32).astype(dtype)
        v = jax.random.normal(kv, (b, s, hkv, d), jnp.float32).astype(dtype)
        return q, k, v

    return jax.jit(make, out_shardings=(sh_q, sh_kv, sh_kv))(jax.random.PRNGKey(0))


def _merge_step(mesh, n: int, merge: str):
    """The merge alone: ``merge_across`` on each device's (o, lse) block, the merged o tiled back to the input's
    shape so ``time_loop`` can chain it."""
    mfn = jax.jit(jax.shard_map(lambda o, lse: distributed.merge_across(o, lse, axis_name="cp", merge=merge)[0],
                                mesh=mesh, in_specs=(P("cp"), P("cp")), out_specs=P(), check_vma=False))
    return lambda o, lse: jnp.tile(mfn(o, lse), (n, 1, 1, 1))


def _local_step(mesh, b: int, interpret):
    """Each device's kernel on its slice (the program's paged view over the identity table), no collective."""
    def local(q, k, v):
        t = k.shape[1]
        page = distributed._page_for(t)
        per = t // page
        table = jnp.arange(b, dtype=jnp.int32)[:, None] * per + jnp.arange(per, dtype=jnp.int32)[None, :]
        return api.paged_attention(q, distributed._as_pool(k, page), distributed._as_pool(v, page), table,
                                   jnp.full((b,), t, jnp.int32), check_block_table=False, interpret=interpret)

    lfn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, "cp"), P(None, "cp")),
                                out_specs=P("cp"), check_vma=False))
    return lambda q, k, v: lfn(q, k, v)[:b]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--merges", default=",".join(MERGES))
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--iters", type=int, default=20, help="steps of the shorter loop (compare's loop clock: 20)")
    ap.add_argument("--reps", type=int, default=5, help="loop-difference samples per record")
    ap.add_argument("--out", default=None, help="directory for records.jsonl (default: print only)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (CPU virtual devices)")
    a = ap.parse_args(argv)
    _compat.silence_triton_deprecation()
    interpret = True if a.smoke else None
    dtype = jnp.float16
    counts = [int(x) for x in a.devices.split(",") if int(x) <= jax.device_count()]
    merges = a.merges.split(",")
    sizes = SMOKE if a.smoke else {w: WORKLOADS[w] for w in a.workloads.split(",")}
    iters, reps = (2, 3) if a.smoke else (a.iters, a.reps)
    out = records.ProbeWriter(PROBE, a.out, argv, {**vars(a), "iters": iters, "reps": reps})

    for wl, (b, s, hq, hkv, d) in sizes.items():
        for n in counts:
            mesh = Mesh(np.array(jax.devices()[:n]), ("cp",))
            shape = {"name": f"{wl}_dev{n}", "family": "decode", "batch": b, "heads_q": hq, "heads_kv": hkv,
                     "q_len": TQ, "kv_len": s, "head_dim": d, "dtype": "float16", "causal": False, "devices": n,
                     "config": "configs/cp_decode.toml"}
            for merge in merges:
                o_st = jax.device_put(jnp.zeros((n * b, TQ, hq, d), dtype), NamedSharding(mesh, P("cp")))
                l_st = jax.device_put(jnp.zeros((n * b, hq, TQ), jnp.float32), NamedSharding(mesh, P("cp")))
                t = timing.time_loop(_merge_step(mesh, n, merge), (o_st, l_st), reps=reps, iters=iters)
                out.emit("cp_merge", {**shape, "merge": merge},
                         {**out.timing_metrics(t), "state_bytes_per_device": b * TQ * hq * (d * 2 + 4)})
                del o_st, l_st
            q, k, v = _kv(mesh, b, s, hq, hkv, d, dtype)
            t = timing.time_loop(_local_step(mesh, b, interpret), (q, k, v), reps=reps, iters=iters)
            kv_bytes = 2 * b * (s // n) * hkv * d * 2
            out.emit("cp_local", {**shape, "keys_per_device": s // n, "page_view": distributed._page_for(s // n)},
                     {**out.timing_metrics(t), "kv_bytes_per_device": kv_bytes})
            del q, k, v
    out.close()
    key = "time_us_p50" if out.env["device_kind"] == "gpu" else "cpu_interpret_us_p50"
    print(f"\n{'workload':32s} {'kind':9s} {'merge':11s} {'p50 us':>9s}  clock")
    for r in out.records:
        m = r["metrics"]
        print(f"{r['workload']['name']:32s} {r['kind']:9s} {r['workload'].get('merge', '-'):11s} {m[key]:9.1f}  "
              f"{m['clock']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
