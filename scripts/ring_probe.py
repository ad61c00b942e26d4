"""Ring attention's pieces that compare has no form for: its forward alone, and the step and forward on inputs held
elsewhere than compare puts them (issue 34; issue 26 item 5).

    PYTHONPATH=. python scripts/ring_probe.py --out $OUT/ring [--seq 32768,131072] [--devices 1,2,4]
    XLA_FLAGS=--xla_force_host_platform_device_count=4 PYTHONPATH=. python scripts/ring_probe.py --smoke   # CPU

Workloads: ``configs/ring_train.toml``'s ``ring_train_llama8b_n{N}_dev{n}`` (B1, Hq 32, Hkv 8, D 128, bf16, causal,
self-attention, the striped layout; ``--smoke``: its ``ring_smoke_t64_dev{n}``, B1 Hq 4 Hkv 2 T 64 D 32 fp32 in
interpret mode on CPU virtual devices). The records carry those names, so each pairs with compare's records of the
same workload. Two record kinds (``type: "probe"``, compare's record schema through ``compare.records.ProbeWriter``),
each with ``workload.inputs`` saying where the inputs are when the call starts:

* ``ring_forward``: the forward alone (``jax.jit`` of the attention), inputs three ways: ``"mesh"`` (compare's
  placement for ``pallas:ring:*``: split along the sequence over the mesh in order, the striped reorder inside
  ``ring_attention_sharded``), ``"device0"`` (arrays held by device 0, uncommitted, as ``jnp.asarray`` makes them:
  the wrapper scatters them and gathers the output) and ``"striped"`` (already striped and sharded, as a model that
  keeps its activations striped holds them: ``ring_attention`` inside ``shard_map``, no reorder);
* ``ring_step``: the training step (``compare.train.train_step``: value_and_grad of ``sum(out * w)``, the program
  compare times) on ``"device0"`` and ``"striped"`` inputs. On ``"mesh"`` inputs the step is compare's own record
  (``pallas:ring:striped``), so it is not timed here.

Clock: compare's for the ring's step (``compare.timing.time_e2e``: host wall-clock per synchronized call, after two
warm calls; several devices' kernels and collectives have no single CUPTI span), p10/p50/p90 of ``--reps``;
``--smoke``: ``timing.time_cpu``, labelled ``cpu_interpret_us_*``. Agreement: each row's output (and dq / dk / dv
for a step) against one device's drop-in (``pallas_attn.dot_product_attention``, the same step for the gradients),
relative L2, computed on device 0 (a striped row's arrays put back in sequence order first).

Read against compare's ``configs/ring_train.toml`` records: the step on the mesh (``pallas:ring:striped``, same
name); one GPU's drop-in (``pallas:auto``, ``pallas:dropin:wide`` at ``..._dev1``; its forward:
``ring_fwd_llama8b_n{N}``); one ring block on one GPU, the ideal ring at ``n`` devices being ``n`` of them
(``ring_block_llama8b_n{N/n}`` / ``ring_fwd_llama8b_n{N/n}``; N/4 of 128k is the 32k row ``..._n32768_dev1``).

ROLE: a probe. Why it is not a compare config: ``pallas:ring:*`` is a train-family implementation (no forward
workload) whose inputs compare places on the mesh, untimed; where the inputs start (device 0, pre-striped) is not a
workload field. Until issue 26 item 5 this script also timed the step on one GPU's drop-in, its forward and one
block's step and forward alone (now ``configs/ring_train.toml``'s), with its own clock (the median of synced calls);
records it wrote stay under results/ as they are (``type: "ring_probe"``, ``name`` e.g. ``"ring step (fwd+bwd)"``
for the step on device-0 inputs, ``wall_us_p50``).
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

import pallas_attn  # noqa: E402
from compare import records, timing, train  # noqa: E402
from pallas_attn import _compat, distributed  # noqa: E402

ROLE = "probe"
PROBE = "ring_probe"
SHAPE = {"batch": 1, "heads_q": 32, "heads_kv": 8, "head_dim": 128, "dtype": "bfloat16"}  # configs/ring_train.toml
SMOKE = {"batch": 1, "heads_q": 4, "heads_kv": 2, "head_dim": 32, "dtype": "float32", "q_len": 64}  # its smoke rows
FORWARD_INPUTS = ("device0", "mesh", "striped")
STEP_INPUTS = ("device0", "striped")  # the step on "mesh" inputs is compare's pallas:ring:striped record


def stripe(x, n: int):
    """Sequence order -> striped order (token ``r * n + i`` to device ``i``, local row ``r``), as the ring's layout."""
    b, t = x.shape[:2]
    return x.reshape(b, t // n, n, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)


def unstripe(x, n: int):
    b, t = x.shape[:2]
    return x.reshape(b, n, t // n, *x.shape[2:]).swapaxes(1, 2).reshape(x.shape)


def rel_l2(a, b) -> float:
    """Relative L2 error on device 0 (no host copy of a 128k-token gradient)."""
    dev = jax.devices()[0]
    a, b = (jax.device_put(x, dev).astype(jnp.float32) for x in (a, b))
    return float(jnp.linalg.norm(a - b) / jnp.maximum(jnp.linalg.norm(b), 1e-30))


def workload_name(n_tokens: int, devices: int, smoke: bool) -> str:
    return f"ring_smoke_t{n_tokens}_dev{devices}" if smoke else f"ring_train_llama8b_n{n_tokens}_dev{devices}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="directory for records.jsonl (default: print only)")
    ap.add_argument("--seq", default="32768", help="comma-separated sequence lengths (ring_train.toml: 32768,131072)")
    ap.add_argument("--devices", default="1,2,4", help="comma-separated device counts (those this process has)")
    ap.add_argument("--reps", type=int, default=5, help="synchronized calls per record, after two warm ones")
    ap.add_argument("--smoke", action="store_true", help="the config's smoke shape in interpret mode (CPU devices)")
    a = ap.parse_args(argv)
    _compat.silence_triton_deprecation()
    interpret = True if a.smoke else None
    shape = dict(SMOKE) if a.smoke else dict(SHAPE)
    seqs = [shape.pop("q_len")] if a.smoke else [int(x) for x in a.seq.split(",")]
    hq, hkv, d, dtype = shape["heads_q"], shape["heads_kv"], shape["head_dim"], jnp.dtype(shape["dtype"])
    counts = sorted({int(x) for x in a.devices.split(",") if int(x) <= jax.device_count()})
    reps = 2 if a.smoke else a.reps
    out = records.ProbeWriter(PROBE, a.out, argv, {**vars(a), "reps": reps, "counts": counts})
    devs = jax.devices()

    def clock(fn, args):
        jax.block_until_ready(fn(*args))
        jax.block_until_ready(fn(*args))
        if out.env["device_kind"] != "gpu":
            return timing.time_cpu(fn, args, reps=reps)
        return timing.time_e2e(fn, args, framework="jax", reps=reps)

    def dropin(q, k, v):
        return pallas_attn.dot_product_attention(q, k, v, is_causal=True)

    for n_tok in seqs:
        rng = np.random.default_rng(0)
        q, k, v, w = (jnp.asarray(rng.standard_normal((1, n_tok, h, d), np.float32), dtype)
                      for h in (hq, hkv, hkv, hq))  # on device 0, uncommitted
        ref_out = jax.jit(dropin)(q, k, v)
        _, ref_grads, _ = train.train_step(dropin)(q, k, v, w)
        for n in counts:
            if n_tok % n:
                print(f"N {n_tok} does not split over {n} devices: skipped", flush=True)
                continue
            mesh = Mesh(np.array(devs[:n]), ("cp",))
            on_mesh = NamedSharding(mesh, P(None, "cp"))
            wl = {"name": workload_name(n_tok, n, a.smoke), "family": "train", **shape, "q_len": n_tok,
                  "kv_len": n_tok, "causal": True, "devices": n, "layout": "striped",
                  "config": "configs/ring_train.toml"}

            def wrapper(q, k, v, mesh=mesh):
                return distributed.ring_attention_sharded(mesh, q, k, v, axis="cp", causal=True, interpret=interpret)

            def local(q, k, v):
                return distributed.ring_attention(q, k, v, axis_name="cp", causal=True, interpret=interpret)

            inner = jax.shard_map(local, mesh=mesh, in_specs=(P(None, "cp"),) * 3, out_specs=P(None, "cp"),
                                  check_vma=False)
            placed = {"device0": ((q, k, v, w), wrapper, lambda x: x),
                      "mesh": (tuple(jax.device_put(x, on_mesh) for x in (q, k, v, w)), wrapper, lambda x: x),
                      "striped": (tuple(jax.device_put(stripe(x, n), on_mesh) for x in (q, k, v, w)), inner,
                                  lambda x, n=n: unstripe(x, n))}
            for where in FORWARD_INPUTS:
                args, attn, back = placed[where]
                fwd = jax.jit(attn)
                agree = {"out_rel_l2": rel_l2(back(fwd(*args[:3])), ref_out)}
                t = clock(fwd, args[:3])
                out.emit("ring_forward", {**wl, "family": "prefill", "inputs": where}, {**out.timing_metrics(t),
                                                                                        **agree})
            for where in STEP_INPUTS:
                args, attn, back = placed[where]
                step = train.train_step(attn)
                o, grads, _ = step(*args)
                agree = {"out_rel_l2": rel_l2(back(o), ref_out),
                         **{f"d{x}_rel_l2": rel_l2(back(g), r) for x, g, r in zip("qkv", grads, ref_grads)}}
                del o, grads
                t = clock(step, args)
                out.emit("ring_step", {**wl, "inputs": where}, {**out.timing_metrics(t), **agree})
            del placed
        del q, k, v, w, ref_out, ref_grads
    out.close()
    key = "time_us_p50" if out.env["device_kind"] == "gpu" else "cpu_interpret_us_p50"
    print(f"\n{'workload':32s} {'kind':12s} {'inputs':8s} {'p50 ms':>10s}  out / grads rel L2  clock")
    for r in out.records:
        m = r["metrics"]
        grads = "/".join(f"{m[f'd{x}_rel_l2']:.1e}" for x in "qkv" if f"d{x}_rel_l2" in m)
        print(f"{r['workload']['name']:32s} {r['kind']:12s} {r['workload']['inputs']:8s} {m[key] / 1e3:10.3f}  "
              f"{m['out_rel_l2']:.1e} {grads:26s} {m['clock']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
