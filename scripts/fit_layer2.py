"""Fit layer 2's constants (compare/layer2.py GLOBAL and COSTS) on ONE compare run, print them, and score.

    PYTHONPATH=. python scripts/fit_layer2.py results/20261121T092505_nvidia-h200/records.jsonl

The fit minimises the sum of |log(predicted / measured)| over the run's pallas:* and cuda:* ok records (a
median-seeking loss: one wild record does not drag the rest), in log space of the constants, with scipy's
Powell method from the values in compare/layer2.py. It prints a ``COSTS``/``GLOBAL`` block to paste into
compare/layer2.py; the constants are then frozen and every other run (the H100 first) is held out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import numpy as np
from scipy.optimize import minimize

from compare import layer2


def load(paths):
    recs, ceil = [], {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            if r.get("type") == "ceilings":
                ceil[r["run_id"]] = r
            elif r.get("type") == "result" and r.get("status") == "ok" and layer2.modelled(r["impl"]["name"]):
                recs.append(r)
    return recs, ceil


def main(argv):
    recs, ceil = load(argv[1:])
    rows = []
    for r in recs:
        hw = layer2.hardware_of(r["env"], ceil.get(r["run_id"]))
        s = layer2.Shape.of(r["workload"])
        lns, _ = layer2.launches_for(r["impl"]["name"], s, hw, r["impl"].get("plan"))
        rows.append((r, hw, lns))
    names = sorted({ln.cost for _, _, lns in rows for ln in lns} - {"cast"})
    keys = [(n, f) for n in names for f in ("issue", "lat", "fixed") if getattr(layer2.COSTS[n], f) > 0]
    gkeys = ["l2_bytes_per_clk_sm", "launch_us"]
    x0 = np.log([getattr(layer2.COSTS[n], f) for n, f in keys] + [layer2.GLOBAL[g] for g in gkeys])

    def unpack(x):
        costs = dict(layer2.COSTS)
        for (n, f), v in zip(keys, x[: len(keys)]):
            costs[n] = dataclasses.replace(costs[n], **{f: float(math.exp(v))})
        glob = dict(layer2.GLOBAL)
        for g, v in zip(gkeys, x[len(keys):]):
            glob[g] = float(math.exp(v))
        return costs, glob

    def errs(x):
        costs, glob = unpack(x)
        out = []
        for r, hw, lns in rows:
            t = sum(layer2.time_launch(ln, hw, costs, glob).time_s for ln in lns) * 1e6
            out.append(math.log(t / r["metrics"]["time_us_p50"]))
        return np.array(out)

    def loss(x):
        return float(np.abs(errs(x)).sum())

    print(f"{len(rows)} records; start loss {loss(x0):.2f}; median |err| {np.median(np.abs(np.expm1(errs(x0)))):.3f}")
    best = x0
    for _ in range(3):
        res = minimize(loss, best, method="Powell", options={"maxiter": 20000, "xtol": 1e-3, "ftol": 1e-6})
        best = res.x
        e = np.abs(np.expm1(errs(best)))
        print(f"loss {res.fun:.2f}; median |err| {np.median(e):.3f}; worst {e.max():.2f}")
    costs, glob = unpack(best)
    print("GLOBAL:", {k: round(v, 4) for k, v in glob.items()})
    for n in names:
        c = costs[n]
        print(f'    "{n}": Cost(issue={c.issue:.4g}, lat={c.lat:.4g}, fixed={c.fixed:.4g}),')


if __name__ == "__main__":
    main(sys.argv)
