"""Layer 2's fa_prefill constants, scored where they were not fitted (sessions 10-11, issue 35).

The constants in ``compare/layer2.py`` (``pallas_attn_fa_prefill_*``) were fitted on the H100 model-shape sweep's
named fa_prefill records only. This scores layer 2 (recomputed with today's model) on the fa_prefill records of other
runs: the H200 ones (the other chip) and the earlier H100 named-shape runs, plus the sweep's ``pallas:auto`` rows.
Rows from ``compare.scorecard.rows(..., recompute=True)`` (the run's measured ceilings where it has them). Usage:
``python scripts/layer2_prefill_oos.py`` from the repository root.
"""

from __future__ import annotations

import glob
import statistics

from compare import scorecard

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def _named(r) -> bool:
    return r["impl"].startswith("pallas:fa_prefill")


def _auto(r) -> bool:
    return r["impl"] == "pallas:auto"


def _one_tile(r) -> bool:
    return _named(r) and ":tiles" not in r["impl"]


def _tiles(r) -> bool:
    return _named(r) and ":tiles" in r["impl"]


_S9 = ["results/fa_prefill/20261126_s9_h100_tiles/short/records.jsonl",
       "results/fa_prefill/20261126_s9_h100_tiles/features/records.jsonl",
       "results/fa_prefill/20261126_s9_h100_call3_features/mistral/records.jsonl"]
_SWEEP = sorted(glob.glob("results/sweep/*/*.records.jsonl"))
# (name, record files, which rows). Session 11 refitted on the H100 sweep's named default / pingpong / serial records
# of session 8 and the double-buffered multi-tile records of session 11 (results/fa_prefill/20261127_s11_h100_{qbuf,
# mid2,mid3}); none of the groups below is in that fit. The session-9 multi-tile records ran the single-buffer kernel
# the model no longer describes: shown apart, for the record.
GROUPS = [
    ("H200 s6 pf_m (other chip)", ["results/fa_prefill/20261123_s6_h200_pf_m/records.jsonl"], _named),
    ("H200 s9 features (other chip)", ["results/fa_prefill/20261126_s9_h200_features/features/records.jsonl"], _named),
    ("H100 s5 pf_a / pf_b / pf_m", [f"results/fa_prefill/20261122_s5_h100_pf_{x}/records.jsonl" for x in "abm"],
     _named),
    ("H100 s9 features, one-tile configs", _S9, _one_tile),
    ("H100 s9 multi-tile (single-buffer kernel, superseded)", _S9, _tiles),
    ("H100 sweep, pallas:auto rows of sessions 8-10", [f for f in _SWEEP if "_s11_" not in f], _auto),
    ("H100 sweep, pallas:auto rows of session 11", [f for f in _SWEEP if "_s11_" in f], _auto),
]


def main() -> None:
    print("| records | n | median abs err | worst | within 25% | mean signed |")
    print("|---|---|---|---|---|---|")
    for name, files, keep in GROUPS:
        errs = []
        for r in scorecard.rows(scorecard.load(files), recompute=True):
            if not r["family"].startswith("prefill/") or r["layer2_err"] is None or not keep(r):
                continue
            errs.append(r["layer2_err"])
        if errs:
            a = [abs(e) for e in errs]
            print(f"| {name} | {len(a)} | {statistics.median(a):.3f} | {max(a):.3f} | "
                  f"{sum(x <= 0.25 for x in a)}/{len(a)} | {statistics.mean(errs):+.3f} |")


if __name__ == "__main__":
    main()
