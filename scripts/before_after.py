"""Compare two compare runs of the same config: one implementation family's p50 per workload, before vs after.

    python scripts/before_after.py BEFORE.jsonl AFTER.jsonl [--generation fa_decode] [--limit 0.01]

Configs are matched by name, except that a config renamed between the runs can be paired with
``--rename old=new`` (fa_decode's ``faithful`` became ``default`` with the architecture change). A peer
(``--peer jax:cudnn``) measured in both runs is shown as a drift gauge: how much the machine itself moved.
Exits 1 if any pair differs by more than ``--limit`` (relative).
"""

from __future__ import annotations

import argparse
import json
import sys

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def _load(path: str) -> dict[tuple[str, str], float]:
    out = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("type", "record") != "record" and "workload" not in r:
            continue
        if r.get("status") != "ok" or "workload" not in r:
            continue
        out[(r["workload"]["name"], r["impl"]["name"])] = r["metrics"]["time_us_p50"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--generation", default="fa_decode")
    ap.add_argument("--rename", action="append", default=[], metavar="OLD=NEW")
    ap.add_argument("--peer", action="append", default=[], metavar="IMPL")
    ap.add_argument("--limit", type=float, default=0.01)
    a = ap.parse_args(argv)
    ren = dict(x.split("=", 1) for x in a.rename)
    before, after = _load(a.before), _load(a.after)
    prefix = f"pallas:{a.generation}:"
    worst = 0.0
    print(f"{'workload':44s} {'impl (after)':34s} {'before us':>10s} {'after us':>10s} {'after/before':>12s}")
    for (w, impl), t0 in sorted(before.items()):
        if impl.startswith(prefix):
            cfg = impl[len(prefix):]
            new = prefix + ren.get(cfg, cfg)
        elif impl in a.peer:
            new = impl
        else:
            continue
        t1 = after.get((w, new))
        if t1 is None:
            print(f"{w:44s} {new:34s} {t0:10.1f} {'missing':>10s}")
            continue
        r = t1 / t0
        if impl.startswith(prefix):
            worst = max(worst, abs(r - 1))
        print(f"{w:44s} {new:34s} {t0:10.1f} {t1:10.1f} {r:12.4f}{'' if impl.startswith(prefix) else '  (peer)'}")
    print(f"worst |after/before - 1| over {a.generation}: {worst:.4f} (limit {a.limit})")
    return 0 if worst <= a.limit else 1


if __name__ == "__main__":
    sys.exit(main())
