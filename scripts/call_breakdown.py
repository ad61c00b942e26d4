"""Where a compare pair's time goes: every kernel of one timed call, for any workload and implementation.

    PYTHONPATH=. python scripts/call_breakdown.py --config sweep --only 'sweep_decode_*_b1_*' \
        --impl pallas:auto --impl jax:cudnn [--reps 20] [--out FILE.json]

Each selected (workload, implementation) pair is prepared as ``compare run`` prepares it (``impl.prepare``: the
timed callable, layouts done), then timed on compare's kernel clock (CUPTI, an L2 flush before each repetition,
excluded), and the median duration of each kernel it launches is printed in launch order: the main kernel, the
merge, and the glue around them (transposes, pads, casts, the table check) that the sum ``time_us_p50`` hides.
No agreement check runs here (``compare run`` does that); the table is for finding launches to remove
(docs/mla.md "The fixed cost" is the first use).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from compare import interop, timing
from compare.impls import all_impls
from compare.runner import detect_ctx, make_plan
from compare.workloads import load_config

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def kernels_jax(fn, args, reps: int, flush_bytes: int):
    import jax

    flush_names = timing._jax_flush_kernel_names(flush_bytes)
    buf = timing._jax_flush_buffer(flush_bytes)
    timed = timing._jax_timed(fn)
    jax.block_until_ready(timed(buf, *args))

    def run():
        jax.block_until_ready([timed(buf, *args) for _ in range(reps)])

    per = timing._per_rep(timing.cupti_kernels(run), reps)
    return [[(n, ms) for n, ms in p if n not in flush_names] for p in per]


def kernels_torch(fn, args, reps: int, flush_bytes: int):
    import torch

    buf = timing._torch_flush_buffer(flush_bytes)
    flush = frozenset(n for n, _ in timing.cupti_kernels(lambda: (buf.bitwise_not_(), torch.cuda.synchronize())))
    fn(*args)
    torch.cuda.synchronize()
    keep = []

    def run():
        for _ in range(reps):
            buf.bitwise_not_()
            keep.append(fn(*args))
        torch.cuda.synchronize()

    ks = timing.cupti_kernels(run)
    per, cur = [], None
    for n, ms in ks:
        if n in flush:
            if cur is not None:
                per.append(cur)
            cur = []
        elif cur is not None:
            cur.append((n, ms))
    if cur is not None:
        per.append(cur)
    return per


def summarize(per):
    """Median µs per launch position (the first repetition's names) and the median per-repetition sum."""
    names = [n for n, _ in per[0]]
    same = [p for p in per if [n for n, _ in p] == names]
    ks = [(n, 1e3 * statistics.median(p[i][1] for p in same)) for i, n in enumerate(names)]
    return ks, 1e3 * statistics.median(sum(ms for _, ms in p) for p in per)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="sweep")
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--impl", action="append", default=[])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out")
    a = ap.parse_args()
    ctx = detect_ctx()
    flush_bytes = 2 * 50 * 2**20
    results = []
    for w, impls in make_plan(load_config(a.config), all_impls(), a.only, a.impl, a.config):
        try:
            inputs = interop.make_inputs(w)
        except Exception as e:  # noqa: BLE001 - reported, the next workload runs
            print(f"{w.name}: inputs failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        for impl in impls:
            try:
                prep = impl.prepare(w, inputs, ctx)
                per = (kernels_torch if prep.framework == "torch" else kernels_jax)(prep.fn, prep.args, a.reps,
                                                                                   flush_bytes)
                ks, tot = summarize(per)
            except Exception as e:  # noqa: BLE001 - a pair that cannot run is reported, not fatal
                print(f"{w.name:48s} {impl.name:28s} FAILED {type(e).__name__}: {str(e)[:160]}", flush=True)
                results.append(dict(workload=w.name, impl=impl.name, error=str(e)[:500]))
                continue
            top = max(ks, key=lambda x: x[1])
            print(f"{w.name:48s} {impl.name:28s} {tot:9.1f} us  {len(ks):2d} launches, largest {top[1]:.1f}, "
                  f"rest {tot - top[1]:.1f} | " + "  ".join(f"{n[:32]}={t:.1f}" for n, t in ks), flush=True)
            results.append(dict(workload=w.name, impl=impl.name, total_us=tot, kernels=ks))
            del prep
    if a.out:
        import jax

        with open(a.out, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
