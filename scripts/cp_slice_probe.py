"""Where the 4-GPU context-parallel decode loses its time: one device's kernel on its slice, and the program.

Session 15 (issue 34). Context-parallel decode on 4 H200s ran at 3.52x one GPU (bar 3.72x); session 13 traced the
gap to the local kernel at a quarter of the keys streaming at 3.87 TB/s where one GPU's whole cache streams at 4.5.
That local kernel is fa_decode's *paged* entry over an identity block table (the dense slice viewed as pages). This
probe times, on one GPU with compare's CUPTI clock (cold L2, p50 of ``--reps``), at B1 Hq32 Hkv8 D128 fp16 and each
``--seq``:

* ``dense``: fa_decode's dense entry (every key): the kernel's own best;
* ``dense_splits<n>``: the same with forced split counts (``--splits``);
* ``paged_view``: the identity-table paged view the slice runs through, and with 3 stages (the dense plan's depth;
  the paged plan takes 5);

then the context-parallel program (``distributed.decode_program``, compare's in-jit loop clock) on 1, 2, 4 devices
(those present) at B1 S``--cp-seq``. JSONL to ``--out``, a table last. (Session 15 also timed a dense slice with a
lengths operand, git 53533aa: equal to the paged view at every length tried, so it was removed.)

    PYTHONPATH=. python scripts/cp_slice_probe.py --out $OUT/cp_slice.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seq", default="262144,524288,1048576", help="keys per device for the one-GPU rows")
    ap.add_argument("--splits", default="48,66", help="forced split counts for the dense rows")
    ap.add_argument("--cp-seq", type=int, default=1048576, help="whole cache of the context-parallel rows")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--devices", default="1,2,4")
    ap.add_argument("--interpret", action="store_true", help="CPU smoke run (interpret mode, host clock)")
    a = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from compare import timing
    from pallas_attn import distributed as dist
    from pallas_attn.kernels import fa_decode as fd

    b, hq, hkv, d = 1, 32, 8, 128
    scale = 1.0 / np.sqrt(d)
    env = {"device_kind": jax.devices()[0].device_kind, "devices_visible": jax.device_count(), "jax": jax.__version__,
           "git_sha": os.environ.get("PALLAS_ATTN_GIT_SHA", "unknown")}
    rows = []
    out = open(a.out, "w")

    def emit(r):
        r["env"] = env
        rows.append(r)
        out.write(json.dumps(r) + "\n")
        out.flush()
        print(f"[{time.strftime('%H:%M:%S')}] {r}", flush=True)

    flush = timing.default_flush_bytes(None)
    zero = jnp.zeros((b,), jnp.int32)  # q_offset (non-causal: unused by the kernel)
    for s in [int(x) for x in a.seq.split(",")]:
        key = jax.random.split(jax.random.PRNGKey(s), 3)
        q = jax.random.normal(key[0], (b, 1, hq, d), jnp.float32).astype(jnp.float16)
        k = jax.random.normal(key[1], (b, s, hkv, d), jnp.float32).astype(jnp.float16)
        v = jax.random.normal(key[2], (b, s, hkv, d), jnp.float32).astype(jnp.float16)
        lens = jnp.full((b,), s, jnp.int32)
        page = dist._page_for(s)
        kp, vp = dist._as_pool(k, page), dist._as_pool(v, page)
        table = jnp.arange(s // page, dtype=jnp.int32)[None, :]
        cases = {"dense": (lambda q, k, v: fd.forward(q, k, v, causal=False, scale=scale, q_offset=zero,
                                                   interpret=a.interpret, config=fd.CONFIGS["default"],
                                                   return_lse=True), (q, k, v))}
        for sp in [int(x) for x in a.splits.split(",") if x]:
            cfg = fd.DecodeConfig(splits=sp)
            cases[f"dense_splits{sp}"] = (
                lambda q, k, v, _c=cfg: fd.forward(q, k, v, causal=False, scale=scale, q_offset=zero,
                                                   interpret=a.interpret, config=_c, return_lse=True), (q, k, v))
        for name, cfg in (("paged_view", fd.CONFIGS["default"]), ("paged_view_st3", fd.DecodeConfig(num_stages=3))):
            cases[name] = (lambda q, kp, vp, t, n, _c=cfg: fd.paged_forward(
                q, kp, vp, t, n, causal=False, scale=scale, q_offset=zero, interpret=a.interpret, config=_c,
                return_lse=True, check_block_table=False), (q, kp, vp, table, lens))
        for name, (fn, args) in cases.items():
            f = jax.jit(fn)
            jax.block_until_ready(f(*args))
            t = timing.time_kernels(f, args, framework="jax", reps=a.reps, flush_bytes=flush)
            us = float(np.median(t.samples_us))
            emit({"type": "slice", "case": name, "seq": s, "us": us, "tbps": 2 * s * hkv * d * 2 / us / 1e6,
                  "clock": t.clock})
        del q, k, v, kp, vp

    n_vis = jax.device_count()
    s = a.cp_seq
    key = jax.random.split(jax.random.PRNGKey(7), 3)
    q = jax.random.normal(key[0], (b, 1, hq, d), jnp.float32).astype(jnp.float16)
    k = jax.random.normal(key[1], (b, s, hkv, d), jnp.float32).astype(jnp.float16)
    v = jax.random.normal(key[2], (b, s, hkv, d), jnp.float32).astype(jnp.float16)
    for n in [int(x) for x in a.devices.split(",") if int(x) <= n_vis]:
        mesh = Mesh(np.array(jax.devices()[:n]), ("cp",))
        qs = jax.device_put(q, NamedSharding(mesh, P()))
        ks = jax.device_put(k, NamedSharding(mesh, P(None, "cp")))
        vs = jax.device_put(v, NamedSharding(mesh, P(None, "cp")))
        lens = jax.device_put(jnp.full((b,), s, jnp.int32), NamedSharding(mesh, P()))
        off = jax.device_put(jnp.zeros((b,), jnp.int32), NamedSharding(mesh, P()))
        prog = dist.decode_program(mesh, axis="cp", head_axis=None, t_local=s // n, batch=b, causal=False,
                                   scale=scale, merge="all_gather", generation="fa_decode", config=None,
                                   interpret=a.interpret)
        t = timing.time_loop(lambda q, k, v, n_, o_, _p=prog: _p(q, k, v, n_, o_)[0], (qs, ks, vs, lens, off), reps=5)
        emit({"type": "cp_program", "slice": "paged_view", "devices": n, "seq": s,
              "us": float(np.median(t.samples_us)), "clock": t.clock})
        del qs, ks, vs

    print("\none GPU, B1 Hq32 Hkv8 D128 fp16, CUPTI p50 (cold L2)")
    print(f"{'case':<22}" + "".join(f"{s:>16}" for s in sorted({r['seq'] for r in rows if r['type'] == 'slice'})))
    for c in dict.fromkeys(r["case"] for r in rows if r["type"] == "slice"):
        cells = [f"{r['us']:8.1f} {r['tbps']:4.2f}TB/s" for r in rows if r["type"] == "slice" and r["case"] == c]
        print(f"{c:<22}" + "".join(f"{x:>16}" for x in cells))
    one = {r["slice"]: r["us"] for r in rows if r["type"] == "cp_program" and r["devices"] == 1}
    best = [r["us"] for r in rows if r["type"] == "slice" and r["case"] == "dense" and r["seq"] == s]
    print(f"\ncontext-parallel program, B1 S{s}, in-jit loop clock: speed-up over its own 1-device row, and over "
          f"one GPU's dense fa_decode on CUPTI ({best[0] if best else float('nan'):.1f} us)")
    for r in rows:
        if r["type"] == "cp_program":
            print(f"  {r['slice']:<11} devices {r['devices']}: {r['us']:8.1f} us  "
                  f"{one.get(r['slice'], float('nan')) / r['us']:5.2f}x  "
                  f"{(best[0] if best else float('nan')) / r['us']:5.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
