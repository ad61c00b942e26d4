"""Layer 2's fa_prefill constants, scored where they were not fitted (session 10, issue 35).

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

GROUPS = {
    "H200 s6 pf_m (other chip)": ["results/fa_prefill/20261123_s6_h200_pf_m/records.jsonl"],
    "H200 s9 features (other chip)": ["results/fa_prefill/20261126_s9_h200_features/features/records.jsonl"],
    "H100 s5 pf_a / pf_b / pf_m": [f"results/fa_prefill/20261122_s5_h100_pf_{x}/records.jsonl" for x in "abm"],
    "H100 s9 tiles + features": ["results/fa_prefill/20261126_s9_h100_tiles/short/records.jsonl",
                                 "results/fa_prefill/20261126_s9_h100_tiles/features/records.jsonl",
                                 "results/fa_prefill/20261126_s9_h100_call3_features/mistral/records.jsonl"],
    "H100 sweep, pallas:auto rows": sorted(glob.glob("results/sweep/*/*.records.jsonl")),
}


def main() -> None:
    print("| records | n | median abs err | worst | within 25% | mean signed |")
    print("|---|---|---|---|---|---|")
    for name, files in GROUPS.items():
        errs = []
        for r in scorecard.rows(scorecard.load(files), recompute=True):
            if not r["family"].startswith("prefill/") or r["layer2_err"] is None:
                continue
            impl = r["impl"]
            if (name.startswith("H100 sweep") and impl != "pallas:auto") or not (
                    impl.startswith("pallas:fa_prefill") or impl == "pallas:auto"):
                continue
            errs.append(r["layer2_err"])
        if errs:
            a = [abs(e) for e in errs]
            print(f"| {name} | {len(a)} | {statistics.median(a):.3f} | {max(a):.3f} | "
                  f"{sum(x <= 0.25 for x in a)}/{len(a)} | {statistics.mean(errs):+.3f} |")


if __name__ == "__main__":
    main()
