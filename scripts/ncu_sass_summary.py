"""Summarise the per-SASS-instruction export of ``scripts/ncu_profiles.sh`` (``NAME.sass.csv.gz``).

For each file: warp-stall samples and warp instructions per opcode (the top 16 by samples; ``SYNCS``, ``WARPGROUP``,
``HGMMA``, ``BAR``, ``MUFU`` and ``UTMA`` keep their first suffix) and the 14 instructions with the most samples. XLA's
helper kernels (``loop_*`` fusions) are left out. Session 15 read GPT-2 N 4096 against cuDNN with it
(docs/fa_prefill.md, "The row tile's fixed cost under ncu").

    python scripts/ncu_sass_summary.py results/fa_prefill/20261127_s15_h100_ncu/gpt2_*.sass.csv.gz
"""

from __future__ import annotations

import collections
import csv
import gzip
import re
import sys

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

KEEP_SUFFIX = ("SYNCS", "WARPGROUP", "HGMMA", "BAR", "MUFU", "UTMA")


def load(path: str) -> list[dict[str, str]]:
    rows, kern, hdr = [], "", None
    for r in csv.reader(gzip.open(path, "rt")):
        if r and r[0] == "Kernel Name":
            kern = r[1]
        elif r and r[0] == "Address":
            hdr = r
        elif r and hdr and not kern.startswith("loop_"):
            rows.append(dict(zip(hdr, r)))
    return rows


def opcode(src: str) -> str:
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_.]+)", src)
    o = m.group(2) if m else src
    return ".".join(o.split(".")[:2]) if o.startswith(KEEP_SUFFIX) else o.split(".")[0]


def summary(path: str) -> str:
    rows = load(path)

    def num(r, k):
        return int(r.get(k) or 0)

    samples = [num(r, "Warp Stall Sampling (All Samples)") for r in rows]
    idle = [num(r, "Warp Stall Sampling (Not-issued Samples)") for r in rows]
    execd = [num(r, "Instructions Executed") for r in rows]
    tot = max(sum(samples), 1)
    by, by_i, by_n = collections.Counter(), collections.Counter(), collections.Counter()
    for r, s, n, i in zip(rows, samples, idle, execd):
        o = opcode(r["Source"])
        by[o] += s
        by_n[o] += n
        by_i[o] += i
    out = [f"== {path}: {len(rows)} SASS lines, {sum(samples)} stall samples, {sum(execd)} warp instructions"]
    for o, c in by.most_common(16):
        share = 100 * c / tot
        out.append(f"   {o:<22} samples {c:>8} ({share:4.1f}%)  not issued {by_n[o]:>8}  executed {by_i[o]:>11}")
    for k in sorted(range(len(rows)), key=lambda k: -samples[k])[:14]:
        out.append(f"     {samples[k]:>7} {execd[k]:>10}  {rows[k]['Source'].strip()[:90]}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for p in argv:
        print(summary(p))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
