"""Does timing the jitted call itself measure what timing it wrapped in one program with the L2 flush measured?

Session 25 changed compare's JAX kernel clock (compare/timing.py, ``_time_jax_cupti``): a jitted implementation is
now dispatched as it is after the flush program, instead of being traced into one program after the flush, which was
a whole second compile per (workload, implementation) pair. This probe times the same prepared programs both ways in
one process, alternating (``--rounds`` times each), so any difference between the two methods shows beside the
run-to-run spread. GPU only.

    PYTHONPATH=. python scripts/timing_program_probe.py --out probe.json \\
        --only sweep_prefill_llama-3.1-8b_n4096 --only sweep_train_llama-3.1-8b_n2048 --impl pallas:auto
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROLE = "probe"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", required=True, help="sweep workload name (repeatable)")
    ap.add_argument("--impl", action="append", required=True, help="implementation name (repeatable)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import jax

    from compare import interop, runner, timing
    from compare.impls import all_impls
    from compare.workloads import load_config

    if not any(d.platform == "gpu" for d in jax.devices()):
        print("no GPU: this probe times device kernels", file=sys.stderr)
        return 2
    ws = {w.name: w for w in load_config("sweep")}
    impls = {i.name: i for i in all_impls()}
    ctx = runner.detect_ctx()
    flush = timing.default_flush_bytes(runner._l2_bytes(runner.hardware.detect(runner.records.collect_env()["gpu"])))
    rows = []
    for wn in a.only:
        w = ws[wn]
        inp = interop.make_inputs(w)
        for name in a.impl:
            prep = impls[name].prepare(w, inp, ctx)
            sync = runner._sync_for(prep.framework)
            aot = None
            if timing.is_jitted(prep.fn):  # what compare's compile-ahead does on a worker: does it leave work behind?
                t0 = time.perf_counter()
                prep.fn.lower(*prep.args).compile()
                aot = round(time.perf_counter() - t0, 3)
            t0 = time.perf_counter()
            sync(prep.fn(*prep.args))
            first = time.perf_counter() - t0
            row = {"workload": wn, "impl": name, "lower_compile_s": aot, "first_call_s": round(first, 3),
                   "direct": [], "wrapped": []}
            print(f"{wn:40s} {name:14s} lower+compile {aot} s, then first call {first:.3f} s", flush=True)
            for _ in range(a.rounds):
                for how in ("direct", "wrapped"):
                    t0 = time.perf_counter()
                    kt = timing.time_kernels(prep.fn, prep.args, framework=prep.framework, reps=a.reps,
                                             flush_bytes=flush, direct=how == "direct")
                    st = kt.stats
                    row[how].append({"p10": st["p10"], "p50": st["p50"], "p90": st["p90"], "clock": kt.clock,
                                     "program": kt.program, "host_s": round(time.perf_counter() - t0, 3)})
            rows.append(row)
            d = [r["p50"] for r in row["direct"]]
            wr = [r["p50"] for r in row["wrapped"]]
            print(f"{wn:40s} {name:14s} direct p50 {' '.join(f'{x:9.1f}' for x in d)} | wrapped p50 "
                  f"{' '.join(f'{x:9.1f}' for x in wr)} | host s direct {row['direct'][0]['host_s']:.2f} "
                  f"wrapped {row['wrapped'][0]['host_s']:.2f} (first round)", flush=True)
            del prep
    with open(a.out, "w") as f:
        json.dump({"env": runner.records.collect_env(), "reps": a.reps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
