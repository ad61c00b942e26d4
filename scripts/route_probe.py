"""``compare run`` with one of the drop-in's routing lengths changed, in this process (session 37, issue 29).

The drop-in sends a differentiated causal D 128 self-attention call to fa_prefill's forward and jax.nn cuDNN's
backward from ``dropin.TRAIN_ON_CUDNN_MIN_Q_LEN`` on (``APART``); below it, fa_prefill's own pair. Whether the row
should start lower is a question for the training step at N 1024-2048 beside the peers, and ``pallas:auto`` is what
a user gets, so this probe moves the row's start and runs compare unchanged: its ``pallas:auto`` records are the
drop-in *with the moved row*, so the probe renames them ``pallas:auto@apart<N>`` in the records file it writes (never
the shipped default's name). Run compare a second time without the probe, on the same workloads and peers, for the
shipped route: each run's ratios to its own peers are what compare.

Usage: ``PYTHONPATH=. python scripts/route_probe.py --train-on-cudnn-from 1024 -- run --config sweep --only ...
--out DIR``
"""

from __future__ import annotations

import json
import pathlib
import sys

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only
SHIPPED = None  # the shipped row's start, read before the probe moves it


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] != "--train-on-cudnn-from" or "--" not in argv:
        raise SystemExit(__doc__)
    start = int(argv[1])
    rest = argv[argv.index("--") + 1:]
    from pallas_attn import dropin

    global SHIPPED
    SHIPPED = dropin.TRAIN_ON_CUDNN_MIN_Q_LEN.get((128, True))

    dropin.TRAIN_ON_CUDNN_MIN_Q_LEN = {**dropin.TRAIN_ON_CUDNN_MIN_Q_LEN, (128, True): start}
    from compare.cli import main as compare_main

    rc = compare_main(rest)
    out = pathlib.Path(rest[rest.index("--out") + 1]) / "records.jsonl"
    if out.exists():
        name = f"pallas:auto@apart{start}"
        lines = []
        for line in out.read_text().splitlines():
            r = json.loads(line)
            if (r.get("impl") or {}).get("name") == "pallas:auto":
                r["impl"]["name"] = name
                r["impl"]["probe"] = (f"scripts/route_probe.py: TRAIN_ON_CUDNN_MIN_Q_LEN[(128, True)] = {start} in "
                                      f"this process (shipped: {SHIPPED})")
            lines.append(json.dumps(r))
        out.write_text("\n".join(lines) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
