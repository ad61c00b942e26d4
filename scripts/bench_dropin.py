"""Time forward and forward + backward of pallas_attn.dot_product_attention vs jax.nn (cuDNN, XLA).

    PYTHONPATH=. python scripts/bench_dropin.py --out $OUT/dropin            # the GPU run (H100: ~3-5 min)
    PYTHONPATH=. python scripts/bench_dropin.py --smoke --out /tmp/dropin     # CPU: tiny shapes, interpret mode

Workloads (``compare.train_bench.WORKLOADS``): B4 H16 N4096 D128 fp16, causal and not, and a GQA training
shape B4 Hq32 Hkv8 N4096 D128 bf16 causal; ``--set sweep``: ``train_bench.SWEEP`` (D 64, N 1024 / 16384, GQA
non-causal, bf16); ``--set d256``: ``train_bench.D256`` (B4 H16 N4096 D256 fp16).
Implementations: ``pallas:fa_train`` (ours),
``jax:cudnn`` (``jax.nn.dot_product_attention(implementation="cudnn")``) and ``jax:xla``. Per (workload,
implementation, program in {fwd, fwd_bwd}) one JSONL record in ``--out/records.jsonl``: the timing
percentiles on compare's kernel clock (CUPTI, L2 flushed; the clock that ran and any fallback are
recorded), TFLOP/s of useful FLOPs, the layer-1 prediction and its error, agreement with XLA (output and
gradients) and the environment. An implementation that fails (e.g. cuDNN refusing a shape) is a record with
its error, never a silent gap. Exit status 1 when any record has an error or a clock fell back.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402

from compare import hardware, records, timing, train_bench  # noqa: E402
from pallas_attn import _compat  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for records.jsonl (created; must not hold one)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (CPU check)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--clock", default="cupti", choices=("cupti", "kineto", "events"))
    ap.add_argument("--impls", default=",".join(train_bench.IMPLS))
    ap.add_argument("--no-agreement", action="store_true", help="skip the XLA agreement check")
    ap.add_argument("--set", default="bar", choices=("bar", "sweep", "d256"),
                    help="workloads: bar = WORKLOADS (the issue's shapes), sweep = SWEEP (D 64, N 1024 / 16384, GQA "
                         "non-causal, bf16), d256 = D256 (B4 H16 N4096 D256 fp16, causal and not)")
    ap.add_argument("--dropin-head-dims", default=None,
                    help="comma-separated head dims the drop-in may send to fa_prefill for this run (overrides "
                         "pallas_attn.dropin.DROPIN_HEAD_DIMS; recorded), e.g. 64,128,256 to time a head dim "
                         "before it is enabled")
    args = ap.parse_args(argv)
    _compat.silence_triton_deprecation()

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "records.jsonl")
    if os.path.exists(path):
        print(f"error: {path} exists; pick a new --out", file=sys.stderr)
        return 2
    interpret = not _compat.has_gpu()
    if interpret and not args.smoke:
        print("error: no GPU; use --smoke for the CPU check", file=sys.stderr)
        return 2
    impls = [i for i in args.impls.split(",") if i]
    unknown = sorted(set(impls) - set(train_bench.IMPLS))
    if unknown:
        print(f"error: unknown --impls {unknown}; known: {train_bench.IMPLS}", file=sys.stderr)
        return 2
    if interpret:
        impls = [i for i in impls if i != "jax:cudnn"]
    workloads = {"bar": train_bench.WORKLOADS, "sweep": train_bench.SWEEP, "d256": train_bench.D256}[args.set]
    head_dims_override = None
    if args.dropin_head_dims:
        from pallas_attn import dropin

        head_dims_override = tuple(int(x) for x in args.dropin_head_dims.split(","))
        dropin.DROPIN_HEAD_DIMS = head_dims_override
        print(f"drop-in head dims for this run: {head_dims_override}")
    if args.smoke:
        workloads = train_bench.SMOKE

    env = records.collect_env()
    dev = jax.devices()[0]
    hw = hardware.detect(getattr(dev, "device_kind", "")) or hardware.get("h100")
    datasheet = hw.peak("fp16")
    peak = train_bench.PRACTICAL_PEAK_FP16 if hw.key in ("h100", "h200") else datasheet
    flush = timing.default_flush_bytes(int(hw.l2_mb * (1 << 20)))
    reps = 2 if args.smoke else args.reps
    bad = 0
    with open(path, "w") as fh:
        def emit(rec):
            fh.write(json.dumps(rec, default=str) + "\n")
            fh.flush()

        for w in workloads:
            xs = train_bench.inputs(w)
            ref = None
            if not args.no_agreement:
                ref = train_bench.build("jax:xla", w)
            for impl in impls:
                base = {"kind": "dropin_train", "workload": {"name": w.name, **w.__dict__},
                        "impl": {"name": impl}, "hardware": hw.key, "peak_fp16_flops": peak,
                        "datasheet_fp16_flops": datasheet, "env": env,
                        "dropin_head_dims_override": head_dims_override,
                        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                try:
                    progs = train_bench.build(impl, w)
                    agree = None
                    if ref is not None and impl != "jax:xla":
                        agree = train_bench.agreement(progs, ref, xs)
                except Exception as e:  # a refusal (cuDNN shape limits, OOM) is a record, not a gap
                    bad += 1
                    emit({**base, "error": f"{type(e).__name__}: {str(e)[:500]}",
                          "traceback": traceback.format_exc()[-2000:]})
                    print(f"{w.name} {impl}: ERROR {type(e).__name__}: {str(e)[:200]}")
                    continue
                for program in ("fwd", "fwd_bwd"):
                    call_args = xs[:3] if program == "fwd" else xs
                    try:
                        t = train_bench.time_one(progs[program], call_args, reps=reps, flush_bytes=flush,
                                                 clock=args.clock, interpret=interpret)
                    except Exception as e:
                        bad += 1
                        emit({**base, "program": program, "error": f"{type(e).__name__}: {str(e)[:500]}"})
                        print(f"{w.name} {impl} {program}: ERROR {type(e).__name__}: {str(e)[:200]}")
                        continue
                    p50 = t.stats["p50"]
                    pred = train_bench.predicted_us(w, impl, program, peak)
                    rec = {**base, "program": program, "timing": {**t.stats, "clock": t.clock,
                                                                   "requested": t.requested, "notes": list(t.notes),
                                                                   "l2_flushed": t.l2_flushed},
                           "flops": train_bench.flops(w, program), "tflops": train_bench.tflops(w, program, p50),
                           "fraction_of_peak": train_bench.flops(w, program) / (p50 * 1e-6) / peak,
                           "prediction_us": pred, "prediction_error": None if pred is None else (p50 - pred) / pred,
                           "agreement_vs_xla": agree}
                    bad += int(t.fallback)
                    emit(rec)
                    print(f"{w.name:44s} {impl:16s} {program:8s} p50 {p50:10.1f} us  "
                          f"{rec['tflops']:7.1f} TFLOP/s  pred {pred or float('nan'):10.1f} us  clock {t.clock}"
                          + (f"  agree {agree}" if agree and program == "fwd" else ""))
    print(f"records: {path}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
