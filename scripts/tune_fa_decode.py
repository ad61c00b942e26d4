"""Tune and time fa_decode on the GPU against the HBM read ceiling and cuDNN (torch SDPA), in one run.

Usage (GPU machine, repo root): ``PYTHONPATH=. python3 scripts/tune_fa_decode.py [--budget-s 170]``.
Order of work, so that a cut-off run still answers the main question: (1) HBM read ceiling, (2) the
default config on every target shape, (3) cuDNN on the dense shapes, (4) the sweep, until the budget is
spent. Kernel times are CUPTI per-iteration times (``jax.experimental.mosaic.gpu.profiler.measure``; the
partial and merge kernels of one call are summed), median of N; torch is timed with CUDA events over N
back-to-back calls. Bytes = 2·B·Hkv·S·D·2 (K and V, fp16) + Q + O (+ the block table for paged).
Prints a table last; writes every record as JSON to ``$OUT/tune_fa_decode.json`` when OUT is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas_attn  # noqa: E402
from pallas_attn import _compat, registry  # noqa: E402
from pallas_attn.kernels import fa_decode as fd  # noqa: E402

_compat.silence_triton_deprecation()  # an entry point: the jitted calls below lower Triton kernels

HQ, HKV, D = 32, 8, 128
DENSE_SHAPES = {"B32_S8192": (32, 8192), "B64_S4096": (64, 4096), "B1_S131072": (1, 131072)}
PAGED_SHAPE = (32, 8192)
INTERPRET = False  # --dry-run: tiny shapes in interpret mode on the CPU, to check this script itself
PAGES = (16, 64, 256)  # paged at B=32, S=8192 (the dense B32 bytes)

# Compact grids: (block_k, num_warps, num_stages); the default plan is always timed first.
DENSE_GRID = [(64, 4, 4), (64, 4, 2), (128, 4, 3), (128, 8, 3), (128, 4, 2), (32, 4, 4), (64, 8, 3), (256, 8, 2)]
PAGED_GRID = [(64, 4, 4), (64, 4, 6), (128, 4, 5), (128, 8, 5), (32, 4, 5), (16, 4, 4)]
SPLITS = {"B32_S8192": [2, 4], "B64_S4096": [2], "B1_S131072": [16, 48, 66, 132, 264]}

ITERS = 30
T0 = time.time()
RECORDS: list[dict] = []


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def _measure_jax(f, *args, iters=ITERS):
    """Median kernel time in µs of one call of ``f`` (all its kernels), CUPTI; wall clock as a fallback."""
    try:
        from jax.experimental.mosaic.gpu import profiler

        _, ms = profiler.measure(f, iterations=iters)(*args)
        ms = ms if isinstance(ms, (list, tuple)) else [ms]
        return statistics.median(ms) * 1e3, "cupti"
    except Exception as e:  # noqa: BLE001 - any profiler failure falls back to the wall clock
        log(f"  profiler.measure failed ({type(e).__name__}: {str(e)[:120]}); wall clock instead")
        jax.block_until_ready(f(*args))
        ts = []
        for _ in range(iters):
            t = time.perf_counter()
            jax.block_until_ready(f(*args))
            ts.append((time.perf_counter() - t) * 1e6)
        return statistics.median(ts), "wall"


def read_ceiling_tbs() -> float:
    """HBM read ceiling: a float32-accumulated sum over 4 GiB of random fp16 (bytes read / kernel time)."""
    n = 2 * 1024**3 if not INTERPRET else 1 << 20  # elements: 4 GiB of fp16
    x = jax.random.normal(jax.random.PRNGKey(0), (n // 4096, 4096), jnp.float32).astype(jnp.float16)
    f = jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32))
    us, clock = _measure_jax(f, x, iters=10)
    del x
    tbs = 2 * n / (us * 1e-6) / 1e12
    RECORDS.append(dict(kind="ceiling", what="jnp.sum over 4 GiB fp16", us=us, tbs=tbs, clock=clock))
    return tbs


def _bytes(b, s, tq=1, table=0):
    return 2 * b * HKV * s * D * 2 + 2 * b * tq * HQ * D * 2 + table


def _dense_inputs(b, s, seed=0):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    q = jax.random.normal(kq, (b, 1, HQ, D), jnp.float32).astype(jnp.float16)
    k = jax.random.normal(kk, (b, s, HKV, D), jnp.float32).astype(jnp.float16)
    v = jax.random.normal(kv, (b, s, HKV, D), jnp.float32).astype(jnp.float16)
    return q, k, v


def _paged_inputs(k, v, page, seed=0):
    b, s = k.shape[:2]
    p = -(-s // page)
    perm = np.random.default_rng(seed).permutation(b * p)
    inv = jnp.asarray(np.argsort(perm))
    kp = k.reshape(b * p, page, HKV, D)[inv]  # s is a page multiple here
    vp = v.reshape(b * p, page, HKV, D)[inv]
    return kp, vp, jnp.asarray(perm.reshape(b, p).astype(np.int32))


def _plan(shape, cfg, page=None):
    b, s = shape
    return fd.plan(batch=b, hkv=HKV, rows=HQ // HKV, d=D, max_kv=s, config=cfg, page_size=page)


def time_fa(name, args, cfg, nbytes, ceiling, *, page=None, shape=None, note=""):
    if page is None:
        f = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, generation="fa_decode", interpret=INTERPRET,
                                                          config=cfg))
    else:
        f = jax.jit(lambda q, kp, vp, bt, ln: pallas_attn.paged_attention(
            q, kp, vp, bt, ln, generation="fa_decode", interpret=INTERPRET, config=cfg, check_block_table=True))
    p = _plan(shape, cfg, page)
    rec = dict(kind="fa_decode", shape=name, page=page, config=dataclasses.asdict(cfg), plan=dataclasses.asdict(p),
               bytes=nbytes, note=note)
    try:
        t = time.time()
        out = jax.block_until_ready(f(*args))
        rec["compile_s"] = time.time() - t
        if not bool(jnp.all(jnp.isfinite(out.astype(jnp.float32)))):
            raise RuntimeError("non-finite output")
        us, clock = _measure_jax(f, *args)
        rec.update(us=us, tbs=nbytes / (us * 1e-6) / 1e12, frac_ceiling=nbytes / (us * 1e-6) / 1e12 / ceiling,
                   clock=clock)
        log(f"  {name:12s} page={page!s:4s} bk={p.block_k:3d} w={p.num_warps} st={p.num_stages} "
            f"splits={p.splits:3d} {us:8.1f} us {rec['tbs']:.2f} TB/s ({rec['frac_ceiling']:.0%}) {note}")
    except Exception as e:  # noqa: BLE001 - a failing config is a record, not a crash of the sweep
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        log(f"  {name} page={page} {cfg}: FAILED {rec['error']}")
    RECORDS.append(rec)
    return rec


def time_cudnn(name, q, k, v, nbytes, ceiling):
    rec = dict(kind="cudnn", shape=name, bytes=nbytes)
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA")
        # BTNH -> BHND contiguous copies outside the timed region (SDPA's layout).
        tq, tk, tv = (torch.from_dlpack(x).permute(0, 2, 1, 3).contiguous() for x in (q, k, v))
        torch.cuda.synchronize()

        def call():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True)

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            call()
            torch.cuda.synchronize()
            st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            samples = []
            for _ in range(5):
                st.record()
                for _ in range(ITERS):
                    call()
                en.record()
                torch.cuda.synchronize()
                samples.append(st.elapsed_time(en) * 1e3 / ITERS)
        us = statistics.median(samples)
        rec.update(us=us, tbs=nbytes / (us * 1e-6) / 1e12, frac_ceiling=nbytes / (us * 1e-6) / 1e12 / ceiling,
                   clock="cuda-events")
        log(f"  {name:12s} cuDNN {us:8.1f} us {rec['tbs']:.2f} TB/s ({rec['frac_ceiling']:.0%})")
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        log(f"  {name} cuDNN: {rec['error']}")
    RECORDS.append(rec)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop sweeping after this many seconds")
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes, interpret mode: check the script on a CPU")
    args = ap.parse_args(argv)
    dev = jax.devices()[0]
    log(f"device {dev.device_kind} ({getattr(dev, 'core_count', '?')} SMs), jax {jax.__version__}")
    if args.dry_run:
        global INTERPRET, ITERS, PAGED_SHAPE
        INTERPRET, ITERS, PAGED_SHAPE = True, 2, (2, 256)
        args.no_cudnn = True
        for name in DENSE_SHAPES:
            DENSE_SHAPES[name] = (2, 256)
        DENSE_GRID[2:] = []
        PAGED_GRID[2:] = []
    elif dev.platform != "gpu":
        print("no GPU: nothing to tune (use --dry-run to check the script on a CPU)", file=sys.stderr)
        return 2
    ceiling = read_ceiling_tbs()
    log(f"HBM read ceiling {ceiling:.2f} TB/s")
    default_cfg = registry.configs("fa_decode")["default"]
    inputs = {name: _dense_inputs(*shape, seed=i) for i, (name, shape) in enumerate(DENSE_SHAPES.items())}

    log("== default config, dense")
    for name, shape in DENSE_SHAPES.items():
        time_fa(name, inputs[name], default_cfg, _bytes(*shape), ceiling, shape=shape)
    pb, ps = PAGED_SHAPE
    log(f"== default config, paged (B={pb}, S={ps}, shuffled table)")
    q, k, v = inputs["B32_S8192"]
    lens = jnp.full((pb,), ps, jnp.int32)
    for page in PAGES:
        kp, vp, bt = _paged_inputs(k, v, page, seed=page)
        time_fa("B32_S8192", (q, kp, vp, bt, lens), default_cfg, _bytes(pb, ps, table=bt.size * 4), ceiling,
                page=page, shape=PAGED_SHAPE)
        del kp, vp
    # Ragged: lengths uniform in [S/2, S]; bytes are the keys actually read.
    rl = np.random.default_rng(1).integers(ps // 2, ps + 1, size=pb).astype(np.int32)
    kp, vp, bt = _paged_inputs(k, v, 16, seed=1)
    rbytes = int(2 * HKV * rl.sum() * D * 2 + 2 * pb * HQ * D * 2)
    time_fa("B32_ragged", (q, kp, vp, bt, jnp.asarray(rl)), default_cfg, rbytes, ceiling, page=16, shape=PAGED_SHAPE,
            note=f"kv_lens ~ U[{ps // 2}, {ps}]")
    del kp, vp

    if not args.no_cudnn:
        log("== cuDNN (torch SDPA, CUDNN_ATTENTION, enable_gqa)")
        for name, shape in DENSE_SHAPES.items():
            time_cudnn(name, *inputs[name], _bytes(*shape), ceiling)

    log("== sweep")
    work = []
    for name, shape in DENSE_SHAPES.items():
        work += [(name, shape, None, fd.DecodeConfig(block_k=bk, num_warps=w, num_stages=st))
                 for bk, w, st in DENSE_GRID]
        work += [(name, shape, None, fd.DecodeConfig(splits=s)) for s in SPLITS[name]]
        work += [(name, shape, None, fd.DecodeConfig(occupancy=o)) for o in (1, 3)]
    for page in PAGES:
        work += [("B32_S8192", PAGED_SHAPE, page, fd.DecodeConfig(block_k=bk, num_warps=w, num_stages=st))
                 for bk, w, st in PAGED_GRID if not (page >= 64 and bk < 32)]
    # Interleave shapes so a budget cut leaves every shape with some sweep points.
    groups: dict[tuple, list] = {}
    for w in work:
        groups.setdefault((w[0], w[2]), []).append(w)
    work = [w for tier in itertools.zip_longest(*groups.values()) for w in tier if w is not None]
    paged_cache: dict[int, tuple] = {}
    for name, shape, page, cfg in work:
        if time.time() - T0 > args.budget_s:
            log(f"budget of {args.budget_s:.0f}s spent: sweep stopped")
            break
        if page is None:
            time_fa(name, inputs[name], cfg, _bytes(*shape), ceiling, shape=shape)
        else:
            if page not in paged_cache:
                paged_cache.clear()
                paged_cache[page] = _paged_inputs(k, v, page, seed=page)
            kp, vp, bt = paged_cache[page]
            time_fa(name, (q, kp, vp, bt, lens), cfg, _bytes(*shape, table=bt.size * 4), ceiling, page=page,
                    shape=shape)

    # Summary: default vs best per shape, and cuDNN.
    print("\n=== fa_decode summary (µs, TB/s, fraction of the measured read ceiling "
          f"{ceiling:.2f} TB/s; KV fp16, Hq=32, Hkv=8, D=128)")
    print(f"{'shape':12s} {'page':>4s} | {'default':>8s} {'TB/s':>5s} {'frac':>5s} | {'best':>8s} {'TB/s':>5s} "
          f"{'frac':>5s} {'best config':38s} | {'cuDNN':>7s} {'fa/cuDNN':>8s}")
    keys = sorted({(r["shape"], r.get("page")) for r in RECORDS if r["kind"] == "fa_decode"},
                  key=lambda k: (k[0], k[1] or 0))
    for shape, page in keys:
        rs = [r for r in RECORDS if r["kind"] == "fa_decode" and r["shape"] == shape and r.get("page") == page
              and "us" in r]
        if not rs:
            print(f"{shape:12s} {page!s:>4s} | all failed")
            continue
        dflt = next((r for r in rs if r["config"] == dataclasses.asdict(default_cfg)), None)
        best = min(rs, key=lambda r: r["us"])
        cd = next((r for r in RECORDS if r["kind"] == "cudnn" and r["shape"] == shape and "us" in r), None)
        p = best["plan"]
        bc = f"bk={p['block_k']} w={p['num_warps']} st={p['num_stages']} splits={p['splits']}"
        d_us = (f"{dflt['us']:8.1f} {dflt['tbs']:5.2f} {dflt['frac_ceiling']:5.0%}" if dflt
                else f"{'-':>8s} {'':5s} {'':5s}")
        c_us = f"{cd['us']:7.1f} {best['us'] / cd['us']:8.2f}" if cd else f"{'-':>7s} {'-':>8s}"
        print(f"{shape:12s} {page!s:>4s} | {d_us} | {best['us']:8.1f} {best['tbs']:5.2f} {best['frac_ceiling']:5.0%} "
              f"{bc:38s} | {c_us}")
    out = os.environ.get("OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "tune_fa_decode.json"), "w") as fh:
            json.dump(dict(device=dev.device_kind, jax=jax.__version__, ceiling_tbs=ceiling, records=RECORDS), fh,
                      indent=1)
        print(f"records: {os.path.join(out, 'tune_fa_decode.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
