"""Split a causal prefill kernel's time into a cost per key block and a fixed cost per row tile, from two records of
one run at two lengths (same heads and tokens per call), for ours and for a peer.

    PYTHONPATH=. python scripts/tile_cost_fit.py RECORDS.jsonl [...] --short WORKLOAD --long WORKLOAD
        [--ours pallas:fa_prefill:default] [--peer jax:cudnn] [--rows 128] [--block 128] [--sms 132]

The model (docs/fa_prefill.md, "What limits D 64 below N 8192"): SM-time = time x SMs = a x (row-tile x key-block
pairs a causal schedule computes) + b x (row tiles), with row tiles of ``--rows`` query rows and key blocks of
``--block`` keys (the diagonal block computed whole). Two lengths give two equations; a and b come out in SM-us. The
peer's tiling is not known: the same tiles are assumed for it, which the output says. Both records of a side must come
from one run (the script refuses otherwise).
"""

from __future__ import annotations

import argparse
import json
import sys

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def _blocks(q_len: int, rows: int, block: int) -> tuple[int, int]:
    """(row tiles, row-tile x key-block pairs) of one causal head."""
    tiles = -(-q_len // rows)
    pairs = sum(-(-min(q_len, (t + 1) * rows) // block) for t in range(tiles))
    return tiles, pairs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+")
    ap.add_argument("--short", required=True)
    ap.add_argument("--long", required=True)
    ap.add_argument("--ours", default="pallas:fa_prefill:default")
    ap.add_argument("--peer", default="jax:cudnn")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--sms", type=int, default=132)
    a = ap.parse_args(argv)
    recs = {}
    for f in a.records:
        for line in open(f):
            r = json.loads(line)
            if r.get("type") == "result" and r.get("status") == "ok":
                recs[(r["workload"]["name"], r["impl"]["name"])] = r  # a later file wins
    for impl in (a.ours, a.peer):
        got = [recs.get((w, impl)) for w in (a.short, a.long)]
        if not all(got):
            print(f"{impl}: no ok record at {'both workloads' if not any(got) else 'one of the workloads'}")
            continue
        if got[0]["run_id"] != got[1]["run_id"]:
            print(f"{impl}: the two records come from different runs ({got[0]['run_id']}, {got[1]['run_id']}): "
                  f"refused (a run-to-run drift would enter the fit)")
            continue
        eq = []
        for r in got:
            w = r["workload"]
            if not w.get("causal") or w["q_len"] != w["kv_len"]:
                print(f"{impl}: {w['name']} is not causal self-attention: the model does not apply")
                return 2
            tiles, pairs = _blocks(w["q_len"], a.rows, a.block)
            heads = w["batch"] * w["heads_q"]
            eq.append((heads * pairs, heads * tiles, r["metrics"]["time_us_p50"] * a.sms, r["metrics"]["time_us_p50"]))
        (p1, t1, s1, u1), (p2, t2, s2, u2) = eq
        det = p1 * t2 - p2 * t1
        if det == 0:
            print(f"{impl}: the two workloads give one equation twice")
            continue
        ca = (s1 * t2 - s2 * t1) / det
        cb = (p1 * s2 - p2 * s1) / det
        note = "" if impl == a.ours else f" (assuming {a.rows}-row tiles and {a.block}-key blocks for it too)"
        print(f"{impl}: a = {ca:.3f} SM-us per key block, b = {cb:.3f} SM-us per row tile{note}; the row tiles' "
              f"share: {cb * t1 / s1:.1%} at {a.short} ({u1:.1f} us), {cb * t2 / s2:.1%} at {a.long} ({u2:.1f} us); "
              f"run {got[0]['run_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
