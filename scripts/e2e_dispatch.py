"""Why a synchronized JAX call takes longer than its kernel: probe sync methods and settings (GPU only).

Measured on an H100 (B32 S8192, 1 GiB of KV; docs/fa_decode.md): fa_decode 348 µs kernel, 605 µs per synced
call, 356 µs per call when 50 calls are issued with one sync; `jax.nn` cuDNN 349 / 701 / 362; a bare
`jnp.sum` 172 / 344 / 179; torch SDPA cuDNN 396 synced / 352 pipelined. So the GPU can run these calls
back to back at kernel speed, and the extra time of a synced call is spent waiting. This script asks where:

  * the kernel itself, under CUPTI (``compare.timing.cupti_kernels``), when called synced and when
    pipelined: is the GPU work longer after the device has idled between calls?
  * sync methods for the same call: ``jax.block_until_ready``, ``Array.block_until_ready``, polling
    ``Array.is_ready()`` in a busy loop (no blocking wait), ``np.asarray`` of the (small) output,
    ``jax.device_get`` of one element; a sleep of 1 ms between calls (idle before each call);
  * settings, each in a fresh process: XLA command buffers off (``--xla_gpu_enable_command_buffer=``), the
    platform allocator (``XLA_PYTHON_CLIENT_ALLOCATOR=platform``), preallocation on;
  * torch's SDPA cuDNN and ``x.sum()`` as the baseline (default process only).

Usage (GPU): ``PYTHONPATH=. python3 scripts/e2e_dispatch.py --out $OUT/e2e_probe`` (about 2-3 minutes: one
child process per setting). Prints one table and writes ``probe.json`` (every figure) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

VARIANTS = {
    "default": {},
    "command_buffer_off": {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
    "allocator_platform": {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
    "preallocate_on": {"XLA_PYTHON_CLIENT_PREALLOCATE": "true", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"},
}
N_SYNCED, N_PIPE = 30, 50


def _median_us(samples_s) -> float:
    return 1e6 * statistics.median(samples_s)


def _child(variant: str) -> dict:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import functools

    import jax
    import jax.numpy as jnp

    import pallas_attn
    from compare import timing
    from pallas_attn import _compat

    _compat.silence_triton_deprecation()
    b, s, hq, hkv, d = 32, 8192, 32, 8, 128
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (b, 1, hq, d), jnp.float16)
    k = jax.random.normal(kk, (b, s, hkv, d), jnp.float16)
    v = jax.random.normal(kv, (b, s, hkv, d), jnp.float16)
    x = jax.random.normal(kq, (1 << 29,), jnp.float16)  # 1 GiB
    calls = {
        "fa_decode": (jax.jit(functools.partial(pallas_attn.attention, generation="fa_decode")), (q, k, v)),
        "jax.nn cudnn": (jax.jit(functools.partial(jax.nn.dot_product_attention, implementation="cudnn")), (q, k, v)),
        "jnp.sum 1GiB": (jax.jit(jnp.sum), (x,)),
        "tiny add": (jax.jit(lambda a: a + 1), (q[:1],)),
    }
    out: dict = {"variant": variant, "env": VARIANTS[variant], "jax": jax.__version__, "calls": {}}
    for name, (f, args) in calls.items():
        out["calls"][name] = _probe_call(f, args, timing)
    if variant == "default":
        out["torch"] = _torch_baseline(k, v)
    return out


def _probe_call(f, args, timing) -> dict:
    import jax
    import numpy as np

    first = jax.block_until_ready(f(*args))
    r: dict = {}

    def synced(sync, n=N_SYNCED, sleep=0.0):
        ts = []
        for _ in range(n):
            if sleep:
                time.sleep(sleep)
            t0 = time.perf_counter()
            sync(f(*args))
            ts.append(time.perf_counter() - t0)
        return _median_us(ts)

    def poll(o):
        while not o.is_ready():
            pass

    r["synced_block_until_ready"] = synced(jax.block_until_ready)
    r["synced_method"] = synced(lambda o: o.block_until_ready())
    if hasattr(first, "is_ready"):
        r["synced_poll_is_ready"] = synced(poll)
    r["synced_np_asarray"] = synced(lambda o: np.asarray(o))
    r["synced_device_get_1"] = synced(lambda o: jax.device_get(o.ravel()[0]))
    r["synced_after_1ms_idle"] = synced(jax.block_until_ready, n=15, sleep=1e-3)
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        o = None
        for _ in range(N_PIPE):
            o = f(*args)
        jax.block_until_ready(o)
        ts.append((time.perf_counter() - t0) / N_PIPE)
    r["pipelined"] = _median_us(ts)
    try:  # the kernel itself, synced vs pipelined (CUPTI, detached after each)
        ks = timing.cupti_kernels(lambda: [jax.block_until_ready(f(*args)) for _ in range(10)])
        kp = timing.cupti_kernels(lambda: jax.block_until_ready([f(*args) for _ in range(10)]))
        r["kernel_us_synced"] = 1e3 * sum(ms for _, ms in ks) / 10
        r["kernel_us_pipelined"] = 1e3 * sum(ms for _, ms in kp) / 10
        r["kernels_per_call"] = len(ks) / 10
    except Exception as e:  # no CUPTI: the wall-clock figures still answer part of the question
        r["kernel_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return r


def _torch_baseline(k, v) -> dict:
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as e:
        return {"error": str(e)}
    if not torch.cuda.is_available():
        return {"error": "no CUDA torch"}
    b, s, hkv, d = k.shape
    qt = torch.randn(b, 32, 1, d, dtype=torch.float16, device="cuda")
    kt = torch.randn(b, hkv, s, d, dtype=torch.float16, device="cuda")
    vt = torch.randn_like(kt)
    xt = torch.randn(1 << 29, dtype=torch.float16, device="cuda")

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)

    res = {}
    for name, f in (("sdpa cudnn", sdpa), ("x.sum 1GiB", lambda: xt.sum())):
        try:
            f()
            torch.cuda.synchronize()
            ts = []
            for _ in range(N_SYNCED):
                t0 = time.perf_counter()
                f()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
            pts = []
            for _ in range(3):
                t0 = time.perf_counter()
                for _ in range(N_PIPE):
                    f()
                torch.cuda.synchronize()
                pts.append((time.perf_counter() - t0) / N_PIPE)
            res[name] = {"synced": _median_us(ts), "pipelined": _median_us(pts)}
        except Exception as e:  # one baseline failing keeps the other
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="folder for probe.json (default: print only)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("PROBE_JSON " + json.dumps(_child(a.child)))
        return 0
    results = []
    for name in [v.strip() for v in a.variants.split(",") if v.strip()]:
        if name not in VARIANTS:
            print(f"unknown variant {name!r}; known: {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
        env = {**os.environ, **VARIANTS[name]}
        t0 = time.time()
        p = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True, text=True,
                           timeout=300)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("PROBE_JSON ")), None)
        if p.returncode or line is None:
            results.append({"variant": name, "error": (p.stderr or p.stdout)[-1500:]})
            print(f"{name}: failed (rc {p.returncode})\n{(p.stderr or '')[-800:]}", file=sys.stderr)
            continue
        r = json.loads(line[len("PROBE_JSON "):])
        r["wall_s"] = time.time() - t0
        results.append(r)
    cols = ("kernel_us_synced", "kernel_us_pipelined", "synced_block_until_ready", "synced_method",
            "synced_poll_is_ready", "synced_np_asarray", "synced_device_get_1", "synced_after_1ms_idle", "pipelined")
    print("µs per call (medians); kernel = CUPTI sum of the call's kernels")
    print(f"{'variant':20s} {'call':14s} " + " ".join(f"{c[:16]:>16s}" for c in cols))
    for r in results:
        for call, m in (r.get("calls") or {}).items():
            print(f"{r['variant']:20s} {call:14s} "
                  + " ".join(f"{m[c]:16.1f}" if isinstance(m.get(c), float) else f"{'—':>16s}" for c in cols))
        for call, m in (r.get("torch") or {}).items():
            if isinstance(m, dict) and "synced" in m:
                print(f"{'torch':20s} {call:14s} synced {m['synced']:.1f}  pipelined {m['pipelined']:.1f}")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "probe.json").write_text(json.dumps(results, indent=1))
        print(f"-> {Path(a.out) / 'probe.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
