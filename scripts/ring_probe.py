"""Ring attention (pallas_attn.distributed.ring_attention_sharded) on the GPUs of one host: agreement with one GPU's
drop-in and the training step's time against the same ring on one GPU and the drop-in on one GPU (issue 34).

    PYTHONPATH=. python scripts/ring_probe.py --out $OUT/ring [--seq 32768]
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python scripts/ring_probe.py --smoke   # CPU check

B1, Hq 32, Hkv 8, D 128, bf16, causal, striped layout. The step is ``jax.grad`` of ``sum(out * do)`` with respect to
q, k, v (forward + backward). Clock: host wall-clock, the median of ``--reps`` calls each followed by a sync (several
devices' kernels and collectives have no single CUPTI span); compiles excluded (two warm calls first). Agreement:
the ring's output and gradients against the drop-in (``pallas_attn.dot_product_attention``) on device 0, relative
L2 error. Records (JSONL with the environment) go to ``--out/records.jsonl``; a table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas_attn  # noqa: E402
from compare import records  # noqa: E402
from pallas_attn import distributed  # noqa: E402


def _wall(fn, args, reps):
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def _rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    hq, hkv, d = (32, 8, 128) if not args.smoke else (4, 2, 32)
    n = args.seq if not args.smoke else 64
    interpret = True if args.smoke else None
    devs = jax.devices()
    env = records.collect_env()
    out_f = records.open_new(args.out)
    rng = np.random.default_rng(0)
    q, k, v, do = (jnp.asarray(rng.standard_normal((1, n, h, d), np.float32), jnp.bfloat16)
                   for h in (hq, hkv, hkv, hq))
    rows = []

    def emit(name, devices, t_us, **info):
        rec = {"type": "ring_probe", "name": name, "devices": devices, "seq": n, "heads_q": hq, "heads_kv": hkv,
               "head_dim": d, "dtype": "bfloat16", "causal": True, "wall_us_p50": t_us,
               "clock": "host wall-clock, median of synced calls", **info, "env": env}
        if out_f:
            out_f.write(json.dumps(rec) + "\n")
            out_f.flush()
        rows.append((name, devices, t_us, info))
        print(f"{name:34s} {devices} GPU  {t_us / 1e3:9.2f} ms  {info}", flush=True)

    def step_of(attn):
        def loss(q, k, v, do):
            return jnp.sum(attn(q, k, v).astype(jnp.float32) * do.astype(jnp.float32))
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))

    # one GPU: the drop-in (fa_prefill forward + its backward on a Hopper), the reference of agreement too
    def dropin(q, k, v):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=True)

    ref_out = jax.jit(dropin)(q, k, v)
    ref_grads = step_of(dropin)(q, k, v, do)
    emit("drop-in step (fwd+bwd)", 1, _wall(step_of(dropin), (q, k, v, do), args.reps))
    emit("drop-in forward", 1, _wall(jax.jit(dropin), (q, k, v), args.reps))
    for nd in sorted({1, len(devs)}):
        mesh = jax.sharding.Mesh(np.array(devs[:nd]), ("cp",))

        def ring(q, k, v, mesh=mesh):
            return distributed.ring_attention_sharded(mesh, q, k, v, axis="cp", causal=True, interpret=interpret)

        out = jax.jit(ring)(q, k, v)
        grads = step_of(ring)(q, k, v, do)
        agree = {"out_rel_l2": _rel(out, ref_out),
                 **{f"d{x}_rel_l2": _rel(g, r) for x, g, r in zip("qkv", grads, ref_grads)}}
        emit("ring step (fwd+bwd)", nd, _wall(step_of(ring), (q, k, v, do), args.reps), **agree)
        emit("ring forward", nd, _wall(jax.jit(ring), (q, k, v), args.reps))
    if out_f:
        out_f.close()
    t = {(name, nd): us for name, nd, us, _ in rows}
    print("\nname                                devices   ms      vs ring on 1   vs drop-in on 1")
    for name, nd, us, _ in rows:
        base = "ring step (fwd+bwd)" if "step" in name else "ring forward"
        drop = "drop-in step (fwd+bwd)" if "step" in name else "drop-in forward"
        print(f"{name:34s} {nd:5d} {us / 1e3:9.2f} {t[(base, 1)] / us:10.2f}x {t[(drop, 1)] / us:12.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
