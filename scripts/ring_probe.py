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
from jax.sharding import PartitionSpec as P  # noqa: E402

import pallas_attn  # noqa: E402
from compare import records  # noqa: E402
from pallas_attn import distributed  # noqa: E402

ROLE = "benchmark"  # not yet a probe: tests/test_scripts_roles.py lists it as pending (issue 26 item 5)


def _wall(fn, args, reps):
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def _blk_of(rows, name):
    return next(info["block_of"] for n_, _, _, info in rows if n_ == name)


def _rel(a, b):
    """Relative L2 error on device 0 (no host copy of a 128k-token gradient)."""
    dev = jax.devices()[0]
    a, b = (jax.device_put(x, dev).astype(jnp.float32) for x in (a, b))
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--devices", default=None, help="comma-separated device counts (default: 1 and all)")
    ap.add_argument("--fa3", action="store_true",
                    help="also FlashAttention-3's JAX ring attention (flash_attn3_jax.flash_mha on inputs sharded "
                         "along the sequence: its custom partitioning runs a contiguous ring) and FA3 on one GPU")
    ap.add_argument("--peers-only", action="store_true", help="skip our ring's rows (the drop-in and --fa3 only)")
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
    counts = sorted({int(x) for x in args.devices.split(",")}) if args.devices else sorted({1, len(devs)})
    if 1 not in counts:
        counts = [1] + counts  # the ring on one GPU is the table's base
    for nd in [] if args.peers_only else counts:
        mesh = jax.sharding.Mesh(np.array(devs[:nd]), ("cp",))

        def ring(q, k, v, mesh=mesh):
            return distributed.ring_attention_sharded(mesh, q, k, v, axis="cp", causal=True, interpret=interpret)

        out = jax.jit(ring)(q, k, v)
        grads = step_of(ring)(q, k, v, do)
        agree = {"out_rel_l2": _rel(out, ref_out),
                 **{f"d{x}_rel_l2": _rel(g, r) for x, g, r in zip("qkv", grads, ref_grads)}}
        emit("ring step (fwd+bwd)", nd, _wall(step_of(ring), (q, k, v, do), args.reps), **agree)
        emit("ring forward", nd, _wall(jax.jit(ring), (q, k, v), args.reps))
        del out, grads
        # what a model that keeps its activations striped and sharded pays: ring_attention inside shard_map on inputs
        # already on the mesh (no reorder, no scatter from device 0, no gather of the gradients)
        sh = jax.sharding.NamedSharding(mesh, P(None, "cp", None, None))

        def striped(x, nd=nd):
            b_, t_ = x.shape[:2]
            return x.reshape(b_, t_ // nd, nd, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)

        qs, ks, vs, dos = (jax.device_put(striped(x), sh) for x in (q, k, v, do))
        def local(q, k, v):
            return distributed.ring_attention(q, k, v, axis_name="cp", causal=True, interpret=interpret)

        inner = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "cp"),) * 3, out_specs=P(None, "cp"),
                              check_vma=False)
        emit("ring step, sharded in", nd, _wall(step_of(inner), (qs, ks, vs, dos), args.reps))
        emit("ring forward, sharded in", nd, _wall(jax.jit(inner), (qs, ks, vs), args.reps))
        del qs, ks, vs, dos
    # one block's kernel on one GPU (the ring's step at nd devices does this once per step: the ideal is nd of them)
    from pallas_attn import dropin
    from pallas_attn.kernels import fa_prefill_bwd
    from pallas_attn.kernels.contract import Problem
    for nd in [] if args.peers_only else [c for c in counts if c > 1]:
        t = n // nd
        if interpret or not dropin._is_sm90():
            break
        blk = Problem(entry="dense", dtype="bfloat16", batch=1, q_len=t, kv_len=t, heads_q=hq, heads_kv=hkv,
                      head_dim=d, causal=True)
        fwd_cfg = dropin.prefill_config(blk, None)
        bwd_cfg = fa_prefill_bwd.CONFIGS[dropin.bwd_config_name(blk)]
        qb, kb, vb, dob = q[:, :t], k[:, :t], v[:, :t], do[:, :t]
        sc = 1.0 / float(np.sqrt(d))

        def one_block(q, k, v, sc=sc, fwd_cfg=fwd_cfg, bwd_cfg=bwd_cfg):
            o, _ = fa_prefill_bwd.attention_lse(q, k, v, causal=True, scale=sc, q_offset=jnp.zeros((1,), jnp.int32),
                                                config=fwd_cfg, bwd_config=bwd_cfg)
            return o

        emit(f"one block T={t} step (fwd+bwd)", 1, _wall(step_of(one_block), (qb, kb, vb, dob), args.reps),
             block_of=nd)
        emit(f"one block T={t} forward", 1, _wall(jax.jit(one_block), (qb, kb, vb), args.reps), block_of=nd)
    if out_f:
        out_f.close()
    t = {(name, nd): us for name, nd, us, _ in rows}
    print("\nname                                devices   ms      vs ring on 1   vs drop-in on 1")
    for name, nd, us, _ in rows:
        if name.startswith("one block"):
            print(f"{name:34s} {nd:5d} {us / 1e3:9.2f}   (x{_blk_of(rows, name)} steps = "
                  f"{us * _blk_of(rows, name) / 1e3:.2f} ms: the ideal ring at that many GPUs)")
            continue
        base = "ring step (fwd+bwd)" if "step" in name else "ring forward"
        drop = "drop-in step (fwd+bwd)" if "step" in name else "drop-in forward"
        if name.startswith(("fa3", "drop-in")) and (name, 1) not in t or name.startswith("fa3"):
            base = name  # a peer's scaling: against itself on one GPU
            if (base, 1) not in t:
                continue
        elif (base, 1) not in t:
            continue
        print(f"{name:34s} {nd:5d} {us / 1e3:9.2f} {t[(base, 1)] / us:10.2f}x {t[(drop, 1)] / us:12.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
