"""Re-score layer 2 on the committed model-shape sweep records with the current model and constants.

Per family, for ``pallas:auto`` and the named configs apart: the median and worst |error| of layer 2 against the
measured p50 (error = predicted / measured - 1), how many are within 25%, the mean signed error, and the three worst
records. Train records are left out (layer 2 does not model the backward). This runs AFTER the records were made: it
checks the model, it is not the before-the-run score issue 35 asks for (a sweep run records that itself). The rows
are ``compare.scorecard.rows(..., recompute=True)`` (the run's measured ceilings where it has them).

``--before`` scores the prediction each record carries from before its run instead (layer 2 as it stood when the run
started: the before-the-run score issue 35 asks for, on runs that recorded one).

Only the latest record of each (GPU, workload, implementation) is scored (``scorecard.latest``: the sweep report's
rule, a later run replaces an earlier one); ``--all-runs`` scores every record, superseded ones too.

Usage: ``python scripts/layer2_sweep_rescore.py [--before] [--all-runs] [record files ...]`` (default:
``results/sweep/*/*.records.jsonl``).
"""

from __future__ import annotations

import collections
import glob
import statistics
import sys

from compare import scorecard

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def main(files: list[str], before: bool = False, all_runs: bool = False) -> None:
    errs: dict[tuple[str, str], list[dict]] = collections.defaultdict(list)
    unpriced: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in scorecard.rows(scorecard.load(files), recompute=not before, latest_only=not all_runs):
        fam = r["family"].split("/")[0]
        if fam == "train" or not r["impl"].startswith("pallas:"):
            continue
        if r["layer2_err"] is None:
            unpriced[fam][str(r["layer2_error"])[:80]] += 1
            continue
        errs[(fam, "auto" if r["impl"] == "pallas:auto" else "named")].append(r)
    print("| family | rows | records | median abs err | worst abs err | within 25% | mean signed |")
    print("|---|---|---|---|---|---|---|")
    for (fam, side), v in sorted(errs.items()):
        a = [abs(r["layer2_err"]) for r in v]
        print(f"| {fam} | {side} | {len(v)} | {statistics.median(a):.3f} | {max(a):.3f} | "
              f"{sum(x <= 0.25 for x in a)}/{len(a)} | {statistics.mean(r['layer2_err'] for r in v):+.3f} |")
    print()
    for (fam, side), v in sorted(errs.items()):
        for r in sorted(v, key=lambda r: -abs(r["layer2_err"]))[:3]:
            print(f"worst {fam}/{side}: {r['layer2_err']:+.2f} {r['workload']} {r['impl']} measured "
                  f"{r['measured_us']:.1f} us, layer 2 {r['layer2_us']:.1f} us")
    for fam, c in sorted(unpriced.items()):
        print(f"not priced ({fam}): {dict(c)}")


if __name__ == "__main__":
    args = sys.argv[1:]
    flag, every = "--before" in args, "--all-runs" in args
    args = [a for a in args if a not in ("--before", "--all-runs")]
    main(args or sorted(glob.glob("results/sweep/*/*.records.jsonl")), before=flag, all_runs=every)
