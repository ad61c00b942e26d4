"""Paged fa_decode: kernel time against the split count, uniform and ragged lengths, one process.

Question it answers (docs/fa_decode.md): the paged plan forces >= ``paged_min_waves`` waves of programs so a
ragged batch balances; compare measured 4 splits costing 8.6% on uniform lengths and 3 splits costing 12%
on ragged ones. Where is the split count that serves both? Reuses the timing and input builders of
``scripts/tune_fa_decode.py``. Usage (GPU): ``PYTHONPATH=. python3 scripts/sweep_fa_decode_paged_splits.py``.
"""

import dataclasses
import json
import os
import sys

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # an entry point: before jax is imported

sys.path.insert(0, os.path.dirname(__file__))
import jax.numpy as jnp  # noqa: E402
import tune_fa_decode as T  # noqa: E402  (also installs the Triton deprecation filter)

from pallas_attn import registry  # noqa: E402

SPLITS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def main() -> int:
    if "--dry-run" in sys.argv:  # tiny shapes in interpret mode: checks this script on a CPU
        T.INTERPRET, T.ITERS, T.PAGED_SHAPE = True, 2, (2, 256)
    ceiling = T.read_ceiling_tbs()
    b, s = T.PAGED_SHAPE
    q, k, v = T._dense_inputs(b, s, seed=7)
    rng = np.random.default_rng(3)
    ragged = rng.integers(s // 2, s + 1, size=b).astype(np.int32)
    base = registry.configs("fa_decode")["default"]
    rows = []
    dense = T.time_fa("dense", (q, k, v), base, T._bytes(b, s), ceiling, shape=(b, s))
    for page in (16, 64):
        kp, vp, bt = T._paged_inputs(k, v, page, seed=1)
        for label, lens in (("uniform", np.full(b, s, np.int32)), ("ragged", ragged)):
            nbytes = T._bytes(b, int(lens.sum()) / b) if label == "ragged" else T._bytes(b, s)
            for sp in SPLITS:
                cfg = dataclasses.replace(base, splits=sp)
                r = T.time_fa(f"{label}_p{page}", (q, kp, vp, bt, jnp.asarray(lens)), cfg, nbytes, ceiling,
                              page=page, shape=(b, s), note=f"splits={sp}")
                rows.append((page, label, sp, r.get("us"), r.get("tbs")))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "sweep_paged_splits.json"), "w") as f:
            json.dump({"ceiling_tbs": ceiling, "records": T.RECORDS}, f, indent=1)
    print(f"\npaged fa_decode, B={b} S={s} Hq=32 Hkv=8 D=128 fp16; read ceiling {ceiling:.2f} TB/s")
    print(f"dense default: {dense.get('us', float('nan')):.1f} us, {dense.get('tbs', float('nan')):.2f} TB/s")
    print("page  lengths  " + " ".join(f"s={sp:<5d}" for sp in SPLITS))
    for page in (16, 64):
        for label in ("uniform", "ragged"):
            us = [f"{r[3]:7.1f}" if r[3] else "   fail" for r in rows if r[0] == page and r[1] == label]
            print(f"{page:4d}  {label:8s} " + " ".join(us))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
