"""Fit layer 2's constants (compare/layer2.py GLOBAL and COSTS) on ONE compare run, print them, and score.

    PYTHONPATH=. python scripts/fit_layer2.py results/20261121T092505_nvidia-h200/records.jsonl \\
        [--seed COSTKEY.FIELD=VALUE ...] [--drop COSTKEY.FIELD ...] [--only NAME ...] [--ablate]
    PYTHONPATH=. python scripts/fit_layer2.py --score <records.jsonl | paged_times.jsonl ...> [--json]

The fit minimises the sum of |log(predicted / measured)| over the run's pallas:* and cuda:* ok records (a
median-seeking loss: one wild record does not drag the rest), in log space of the constants, with scipy's
Powell method from the values in compare/layer2.py. The free constants are the cost fields that are > 0 in
``COSTS`` (plus ``--seed`` ones, started at the value given; minus ``--drop`` ones, held at 0) and the two
fitted globals (L2 bandwidth per SM-cycle, launch cost). Aliased dataflows (``layer2.ALIASES``) follow their
sources and add no constant. It prints a ``COSTS``/``GLOBAL`` block to paste into compare/layer2.py; the
constants are then frozen and every other run (the H100 first) is held out: never pass a held-out run here.

``--only NAME`` (repeatable): free only these, everything else frozen at its compare/layer2.py value; NAME is
``COSTKEY.FIELD`` or a ``GLOBAL`` key (``gather_lat``). Issue 16 fitted the paged family's new constants this way
on the H200 paged run alone (docs/roofline.md):

    PYTHONPATH=. python scripts/fit_layer2.py results/paged_gqa/20261122_s3_h200/records.jsonl \\
        --only gather_lat --only pallas_attn_paged_cuda_cores.issue --only pallas_attn_paged_cuda_cores.spill \\
        --only v8_gqa_ss_group.lat

``--ablate``: after the fit, for each free cost field, hold it at 0, refit the rest and print what the
in-sample loss, median and worst |error| become: what that constant buys (docs/roofline.md).

``--score``: no fit; the scorecard of the given records (compare records or ``paged_times.jsonl`` lines) with
layer 2 recomputed by today's model, labelled with its git sha (``compare.scorecard --recompute``); the
records keep the predictions they carry. ``compare report --rescore`` puts the same table into a report.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np
from scipy.optimize import minimize

from compare import layer2, scorecard

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

GKEYS = ["l2_bytes_per_clk_sm", "launch_us"]
FIELDS = ("issue", "lat", "fixed", "key", "spill", "dequant", "ramp", "dram_loss", "sfu_hide")


def load(paths):
    recs, ceil = [], {}
    for r in scorecard.load(paths):
        if r.get("type") == "ceilings":
            ceil[r["run_id"]] = r
        elif r.get("type") == "result" and r.get("status") == "ok" and layer2.modelled(r["impl"]["name"]):
            recs.append(r)
    return recs, ceil


def _field(spec: str) -> tuple[str, str]:
    name, _, field = spec.partition(".")
    if name not in layer2.COSTS or field not in FIELDS:
        raise SystemExit(f"{spec!r}: expected COSTKEY.FIELD with a key of layer2.COSTS and a Cost field")
    return name, field


class Fit:
    """The records' launches and the loss as a function of the free constants (log space)."""

    def __init__(self, rows, keys, gkeys=GKEYS):
        self.rows, self.keys, self.gkeys = rows, list(keys), list(gkeys)

    def unpack(self, x, base_costs):
        costs = dict(base_costs)
        for (n, f), v in zip(self.keys, x[: len(self.keys)]):
            costs[n] = dataclasses.replace(costs[n], **{f: float(math.exp(v))})
        glob = dict(layer2.GLOBAL)
        for g, v in zip(self.gkeys, x[len(self.keys):]):
            glob[g] = float(math.exp(v))
        return costs, glob

    def errs(self, x, base_costs):
        costs, glob = self.unpack(x, base_costs)
        out = []
        for r, hw, lns in self.rows:
            t = sum(layer2.time_launch(ln, hw, costs, glob).time_s for ln in lns) * 1e6
            out.append(math.log(t / r["metrics"]["time_us_p50"]))
        return np.array(out)

    def run(self, x0, base_costs, rounds=3, verbose=True):
        def loss(x):
            return float(np.abs(self.errs(x, base_costs)).sum())

        best, fun = x0, loss(x0)
        for _ in range(rounds):
            res = minimize(loss, best, method="Powell", options={"maxiter": 20000, "xtol": 1e-3, "ftol": 1e-6})
            if res.fun >= fun - 1e-6 and _ > 0:
                break
            best, fun = res.x, res.fun
            if verbose:
                e = np.abs(np.expm1(self.errs(best, base_costs)))
                print(f"loss {fun:.2f}; median |err| {np.median(e):.3f}; worst {e.max():.2f}")
        return best, fun


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--seed", action="append", default=[], help="COSTKEY.FIELD=VALUE: free a field at VALUE")
    ap.add_argument("--drop", action="append", default=[], help="COSTKEY.FIELD: hold a field at 0")
    ap.add_argument("--only", action="append", default=[],
                    help="COSTKEY.FIELD or a GLOBAL key: free only these (repeatable); the rest stay frozen")
    ap.add_argument("--ablate", action="store_true", help="what each free cost field buys")
    ap.add_argument("--score", action="store_true",
                    help="no fit: the scorecard of the records re-scored with today's model (labelled with its sha)")
    ap.add_argument("--json", action="store_true", help="with --score: the numbers as JSON")
    a = ap.parse_args(argv)
    if a.score:
        sargs = [*a.records, "--recompute"] + (["--json"] if a.json else [])
        return scorecard.main(sargs)
    recs, ceil = load(a.records)
    base = dict(layer2.COSTS)
    for spec in a.seed:
        k, _, v = spec.partition("=")
        n, f = _field(k)
        base[n] = dataclasses.replace(base[n], **{f: float(v)})
    for spec in a.drop:
        n, f = _field(spec)
        base[n] = dataclasses.replace(base[n], **{f: 0.0})
    rows, skipped = [], 0
    for r in recs:
        hw = layer2.hardware_of(r["env"], ceil.get(r["run_id"]))
        s = layer2.Shape.of(r["workload"])
        pred = layer2.predict_record(r["workload"], r["impl"], r["impl"].get("plan"), hw)
        if "error" in pred:
            skipped += 1  # an implementation layer 2 does not price (e.g. the multi-device fa_decode_cp)
            continue
        impl, plan = layer2.resolve(r["impl"]["name"], r["impl"].get("plan"), s.family)  # auto: what it chose
        lns, _ = layer2.launches_for(impl, s, hw, plan)
        rows.append((r, hw, lns))
    if skipped:
        print(f"{skipped} records layer 2 does not price are left out of the fit")
    names = sorted({ln.cost for _, _, lns in rows for ln in lns} - {"cast"} - set(layer2.ALIASES))
    gkeys = GKEYS
    if a.only:
        gkeys = [o for o in a.only if o in layer2.GLOBAL]
        keys = [_field(o) for o in a.only if o not in layer2.GLOBAL]
        if any(getattr(base[n], f) <= 0 for n, f in keys):
            raise SystemExit("--only: every freed cost field must start > 0 (give it a --seed)")
        names = sorted({n for n, _ in keys})
    else:
        keys = [(n, f) for n in names for f in FIELDS if getattr(base[n], f) > 0]
    fit = Fit(rows, keys, gkeys)
    x0 = np.log([getattr(base[n], f) for n, f in keys] + [layer2.GLOBAL[g] for g in gkeys])
    e0 = fit.errs(x0, base)
    print(f"{len(rows)} records, {len(keys)} cost fields + {len(gkeys)} globals free; start loss "
          f"{np.abs(e0).sum():.2f}; median |err| {np.median(np.abs(np.expm1(e0))):.3f}")
    best, fun = fit.run(x0, base)
    costs, glob = fit.unpack(best, base)
    print("GLOBAL:", {k: round(v, 4) for k, v in glob.items()})
    for n in names:
        c = costs[n]
        print(f'    "{n}": Cost(issue={c.issue:.4g}, lat={c.lat:.4g}, fixed={c.fixed:.4g}, key={c.key:.4g}, '
              f'spill={c.spill:.4g}, dequant={c.dequant:.4g}, ramp={c.ramp:.4g}, dram_loss={c.dram_loss:.4g}, '
              f'sfu_hide={c.sfu_hide:.4g}),')
    if a.ablate:
        e = np.abs(np.expm1(fit.errs(best, base)))
        print(f"\nablation (hold one field at 0, refit the rest); full fit: loss {fun:.2f}, median "
              f"{np.median(e):.3f}, worst {e.max():.2f}")
        for i, (n, f) in enumerate(keys):
            sub = Fit(rows, keys[:i] + keys[i + 1:], gkeys)
            b2 = dict(costs)
            b2[n] = dataclasses.replace(b2[n], **{f: 0.0})
            x = np.delete(best, i)
            xb, fb = sub.run(x, b2, rounds=2, verbose=False)
            eb = np.abs(np.expm1(sub.errs(xb, b2)))
            print(f"  -{n}.{f}: loss {fb:.2f} ({fb - fun:+.2f}); median {np.median(eb):.3f}; worst {eb.max():.2f}",
                  flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
