"""Quick GPU timing of the Pallas v1_naive ... v6_splitkv kernels (not a benchmark: ``compare`` is).

    python scripts/time_pallas_generations.py [--iters 20] [--smoke] [--lse]

Prints, per generation and config, the kernel time (CUPTI via
``jax.experimental.mosaic.gpu.profiler.measure`` when it works, else ``block_until_ready`` wall clock
around a jitted call), with the per-pallas_call breakdown where CUPTI gives one, and the launch plan the
kernel declares (``KERNEL.plan``):
  * prefill B=1, H=8, N=2048, D=64, non-causal: v1-v4 FP32, v5 FP16 (faithful and tuned);
  * decode B=1, H=8, Tq=1, Tk=8192, D=128, FP16: v6 (faithful = device SM count, reference_sm40).
Each kernel is called through its contract entry ``KERNEL.dense(q, k, v, causal=, scale=, q_offset=int32 [B],
interpret=False, config=, return_lse=)``. ``--lse`` also times every case with ``return_lse=True`` (what the
log-sum-exp output costs on top).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from pallas_attn import _compat, registry  # noqa: E402
from pallas_attn.kernels.contract import Problem  # noqa: E402

try:
    from jax.experimental.mosaic.gpu import profiler as _profiler
except Exception:  # noqa: BLE001 - any import problem means "no CUPTI", the fallback is fine
    _profiler = None

CASES = [
    # (generation, config, dtype, B, H, Tq, Tk, D, causal)
    ("v1_naive", "faithful", "float32", 1, 8, 2048, 2048, 64, False),
    ("v2_tiled", "faithful", "float32", 1, 8, 2048, 2048, 64, False),
    ("v3_online", "faithful", "float32", 1, 8, 2048, 2048, 64, False),
    ("v4_fused", "faithful", "float32", 1, 8, 2048, 2048, 64, False),
    ("v5_wmma", "faithful", "float16", 1, 8, 2048, 2048, 64, False),
    ("v5_wmma", "tuned", "float16", 1, 8, 2048, 2048, 64, False),
    ("v6_splitkv", "faithful", "float16", 1, 8, 1, 8192, 128, False),
    ("v6_splitkv", "reference_sm40", "float16", 1, 8, 1, 8192, 128, False),
]


def _time(f, args, iters: int):
    """Returns (median ms, per-kernel [(name, ms)] of one iteration or None, clock name)."""
    if _profiler is not None:
        try:
            _, per_iter = _profiler.measure(f, aggregate=False, iterations=iters)(*args)
            if per_iter:
                totals = [sum(t for _, t in it) for it in per_iter]
                med = statistics.median(totals)
                return med, per_iter[totals.index(sorted(totals)[len(totals) // 2])], "cupti"
        except Exception as e:  # noqa: BLE001
            print(f"  (CUPTI unavailable: {type(e).__name__}: {e}; using wall clock)")
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), None, "wall"


def _call(dense, q, k, v, q_offset, **kw):
    return dense(q, k, v, q_offset=q_offset, **kw)


def _kernel(gen: str):
    return registry.kernel(gen)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, 1 iteration (CPU check of the script)")
    ap.add_argument("--lse", action="store_true", help="also time each case with return_lse=True")
    args = ap.parse_args(argv)
    cases = CASES
    if args.smoke:
        cases = [(g, c, dt, b, h, min(tq, 64), min(tk, 256), d, ca) for g, c, dt, b, h, tq, tk, d, ca in CASES]
        args.iters = 1
    interpret = _compat.default_interpret(None)
    dev = jax.devices()[0]
    print(f"device: {dev.device_kind} ({dev.platform}), jax {jax.__version__}{'  [interpret]' if interpret else ''}")
    for gen, cfg_name, dtype, b, h, tq, tk, d, causal in cases:
        kern = _kernel(gen)
        cfg = kern.config(cfg_name)
        keys = jax.random.split(jax.random.PRNGKey(0), 3)
        q = jax.random.normal(keys[0], (b, tq, h, d), jnp.float32).astype(dtype)
        k = jax.random.normal(keys[1], (b, tk, h, d), jnp.float32).astype(dtype)
        v = jax.random.normal(keys[2], (b, tk, h, d), jnp.float32).astype(dtype)
        off = jnp.zeros((b,), jnp.int32)  # the dense default: top-left causal with offset 0
        problem = Problem(entry="dense", dtype=dtype, batch=b, q_len=tq, kv_len=tk, heads_q=h, heads_kv=h,
                          head_dim=d, causal=causal)
        for lse in (False, True) if args.lse else (False,):
            f = jax.jit(functools.partial(_call, kern.dense, causal=causal, scale=1.0 / float(np.sqrt(d)),
                                          interpret=interpret, config=cfg, return_lse=lse))
            label = f"{gen:<11} {cfg_name:<15} {dtype:<8} B{b} H{h} Tq{tq} Tk{tk} D{d}{' +lse' if lse else ''}"
            try:
                t0 = time.perf_counter()
                jax.block_until_ready(f(q, k, v, off))
                compile_s = time.perf_counter() - t0
                ms, kernels, clock = _time(f, (q, k, v, off), args.iters)
            except Exception as e:  # noqa: BLE001 - report and go on: one failing kernel must not hide the rest
                print(f"{label}  FAILED: {type(e).__name__}: {str(e)[:400]}")
                continue
            flops = 4.0 * b * h * tq * tk * d
            kv_bytes = 2.0 * b * h * tk * d * jnp.dtype(dtype).itemsize
            extra = f"  {kv_bytes / ms / 1e9:.3f} TB/s KV" if gen == "v6_splitkv" else ""
            print(f"{label}  {ms:9.4f} ms [{clock}]  {flops / ms / 1e9:8.2f} TFLOP/s{extra}  "
                  f"(first call {compile_s:.1f} s)")
            if not lse:
                print(f"    plan: {kern.plan(problem, cfg)}")
            for name, t in kernels or []:
                print(f"    {name}: {t:.4f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
