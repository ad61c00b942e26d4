"""Layer 2 on fa_decode's records outside the model-shape sweep, re-scored with the current model (session 16).

The decode stream terms (``compare.layer2.COSTS["pallas_attn_fa_decode_partial"]``) were fitted on sweep records; this
scores every other committed fa_decode record (the reference, frontier, paged and quantized runs), the latest per
(GPU, workload, implementation), per chip, KV format (16-bit or quantized) and family. Run it in a ``git worktree``
of an older commit to score the model as it stood there (docs/roofline.md, "Session 16").

Usage: ``PYTHONPATH=. python scripts/layer2_decode_oos.py``
"""

from __future__ import annotations

import glob
import statistics

from compare import scorecard

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def main() -> None:
    recs = []
    for f in sorted(glob.glob("results/**/*.jsonl", recursive=True)):
        if "/sweep/" in f:
            continue
        try:
            recs += scorecard.load([f])
        except (ValueError, KeyError, OSError):  # not a records file
            continue
    kv_dtype = {r["workload"]["name"]: r["workload"].get("kv_dtype") for r in recs if r.get("type") == "result"}
    rows = [r for r in scorecard.rows(recs, recompute=True, latest_only=True)
            if r["impl"].startswith("pallas:fa_decode") and r["layer2_err"] is not None]
    print("| GPU | KV | family | n | median abs err | worst | mean signed |")
    print("|---|---|---|---|---|---|---|")
    for gpu in sorted({r["gpu"] for r in rows}):
        for quant in (False, True):
            for fam in sorted({r["family"] for r in rows}):
                v = [r for r in rows if r["gpu"] == gpu and r["family"] == fam
                     and bool(kv_dtype.get(r["workload"])) == quant]
                if not v:
                    continue
                a = [abs(r["layer2_err"]) for r in v]
                w = max(v, key=lambda r: abs(r["layer2_err"]))
                kind = "quantized" if quant else "16-bit"
                mean = statistics.mean(r["layer2_err"] for r in v)
                print(f"| {gpu} | {kind} | {fam} | {len(v)} | {statistics.median(a):.3f} | "
                      f"{w['layer2_err']:+.3f} ({w['workload']}) | {mean:+.3f} |")


if __name__ == "__main__":
    main()
