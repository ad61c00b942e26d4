"""Relabel recorded runs with the lowering each Pallas kernel declares: ``python -m compare.relabel FILE...``.

Why it exists: until the kernel contract, compare *guessed* a Pallas generation's lowering, and guessed
``mosaic-gpu`` for the frontier decode kernel, which has always been lowered through Triton (its
``pallas_call``s pass Triton compiler params). The JSONL records of those runs carry the wrong label. This
rewrites ``impl.lowering`` of every Pallas ``result`` record whose label differs from
``registry.kernel(generation).lowering`` and touches nothing else: a changed line is re-serialised with the
writer's own settings only after checking that the unchanged record re-serialises to the identical bytes,
and that the parsed records differ in that one field. Measured numbers cannot change.

``--check`` only reports (exit status 1 when a label differs). Run once on ``results/*/records.jsonl``
(results/README.md, "Relabelled records").
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter
from pathlib import Path

__all__ = ["relabel_lines", "main"]


def _dump(record: dict) -> str:
    return json.dumps(record, allow_nan=True)  # what records.write_jsonl writes (no default= needed here)


def relabel_lines(lines: list[str], declared) -> tuple[list[str], Counter]:
    """``(new_lines, counts)``; ``declared(gen_id) -> lowering``; counts[(gen, old, new)] per changed record."""
    out, counts = [], Counter()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            out.append(line)
            continue
        rec = json.loads(line)
        impl = rec.get("impl") or {}
        old = impl.get("lowering")
        if rec.get("type") != "result" or impl.get("framework") != "pallas" or old is None:
            out.append(line)
            continue
        new = declared(impl["generation"])
        if new == old:
            out.append(line)
            continue
        if _dump(rec) != line:
            raise ValueError(f"line {i}: the record does not re-serialise to the same bytes; not touching it")
        fixed = copy.deepcopy(rec)
        fixed["impl"]["lowering"] = new
        text = _dump(fixed)
        back = json.loads(text)
        back["impl"]["lowering"] = old
        if back != rec:  # only that field differs
            raise AssertionError(f"line {i}: relabelling changed more than impl.lowering")
        out.append(text)
        counts[(impl["generation"], old, new)] += 1
    return out, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m compare.relabel", description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="records.jsonl files, rewritten in place")
    ap.add_argument("--check", action="store_true", help="report only; exit 1 if any label differs")
    args = ap.parse_args(argv)

    from pallas_attn import registry

    def declared(gen: str) -> str:
        return registry.kernel(gen).lowering

    total = 0
    for path in args.files:
        text = path.read_text()
        lines = text.split("\n")
        new, counts = relabel_lines(lines, declared)
        n = sum(counts.values())
        total += n
        for (gen, old, lowering), k in sorted(counts.items()):
            print(f"{path}: {k} {gen} record(s) {old} -> {lowering}")
        if n and not args.check:
            path.write_text("\n".join(new))
    verb = "differ" if args.check else "relabelled"
    print(f"{total} record(s) {verb} in {len(args.files)} file(s)")
    return 1 if args.check and total else 0


if __name__ == "__main__":
    sys.exit(main())
