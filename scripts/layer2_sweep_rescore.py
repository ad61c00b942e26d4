"""Re-score layer 2 on the committed model-shape sweep records with the current model and constants.

Per family, for ``pallas:auto`` and the named configs apart: the median and worst |error| of layer 2 against the
measured p50 (error = predicted / measured - 1), how many are within 25%, the mean signed error, and the three worst
records. Train records are left out (layer 2 does not model the backward). This runs AFTER the records were made: it
checks the model, it is not the before-the-run score issue 35 asks for (a sweep run records that itself).

Usage: ``python scripts/layer2_sweep_rescore.py [record files ...]`` (default: ``results/sweep/*/*.records.jsonl``).
"""

from __future__ import annotations

import collections
import glob
import json
import statistics
import sys

from compare import layer2


def main(files: list[str]) -> None:
    errs: dict[tuple[str, str], list[tuple[float, str, str, float, float]]] = collections.defaultdict(list)
    unpriced: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for f in files:
        for line in open(f):
            r = json.loads(line)
            if r.get("type") != "result" or r["status"] != "ok" or not r["impl"]["name"].startswith("pallas:"):
                continue
            fam = r["workload"]["family"]
            if fam == "train":
                continue
            sc = layer2.score(r, recompute=True)
            if sc["layer2_err"] is None:
                unpriced[fam][str(sc["layer2_error"])[:80]] += 1
                continue
            side = "auto" if r["impl"]["name"] == "pallas:auto" else "named"
            errs[(fam, side)].append((sc["layer2_err"], r["workload"]["name"], r["impl"]["name"], sc["measured_us"],
                                      sc["layer2_us"]))
    print("| family | rows | records | median abs err | worst abs err | within 25% | mean signed |")
    print("|---|---|---|---|---|---|---|")
    for (fam, side), v in sorted(errs.items()):
        a = [abs(e[0]) for e in v]
        print(f"| {fam} | {side} | {len(v)} | {statistics.median(a):.3f} | {max(a):.3f} | "
              f"{sum(x <= 0.25 for x in a)}/{len(a)} | {statistics.mean(e[0] for e in v):+.3f} |")
    print()
    for (fam, side), v in sorted(errs.items()):
        for e in sorted(v, key=lambda e: -abs(e[0]))[:3]:
            print(f"worst {fam}/{side}: {e[0]:+.2f} {e[1]} {e[2]} measured {e[3]:.1f} us, layer 2 {e[4]:.1f} us")
    for fam, c in sorted(unpriced.items()):
        print(f"not priced ({fam}): {dict(c)}")


if __name__ == "__main__":
    main(sys.argv[1:] or sorted(glob.glob("results/sweep/*/*.records.jsonl")))
