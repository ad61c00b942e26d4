"""Explain recorded fractions above 100% of a measured ceiling: ``python -m compare.annotate_ceilings FILE...``.

Why it exists: until compare measured the HBM read ceiling three ways (``ceilings.py``: torch ``x.sum()`` with
CUDA events, ``jnp.sum`` under CUPTI, our own streaming Pallas kernel; the best is quoted), a run measured it one
way only, torch ``x.sum()`` timed with CUDA events. That method reads low (3.02 TB/s on an H100 where ``jnp.sum``
under CUPTI reads 3.18-3.20; 3.97-4.22 on an H200 where it reads 4.59-4.67), so decode records of those runs show
101-113% "of the ceiling": the ceiling is low, the kernels are not faster than the memory. This adds, to every
``result`` record whose ``metrics.hbm_fraction`` or ``metrics.roofline_fraction`` (HBM-limited) is above 1 and
has no note yet, the note the runner writes today (``ceilings.over_ceiling_note``) followed by that cause, and
touches nothing else: measured numbers and fractions stay as recorded (re-basing them would need a ceiling the run
did not measure). Compute-limited fractions above 1 get ``ceilings.over_compute_note`` (an fp32 peer on TF32 tensor
cores, priced at the fp32 FMA rate). One exception re-bases a derived fraction: a workload over ``devices > 1``
GPUs divided by ONE GPU's measured ceiling before session 11 (211-423% "of the ceiling"); its HBM and tensor-core
fractions are divided by the device count (the aggregate, as the runner computes them now), the recorded values
kept as ``*_one_gpu_ceiling``. ``--check`` only reports (exit status 1 when a record lacks its note).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .ceilings import over_ceiling_note, over_compute_note

__all__ = ["annotate_lines", "main"]

_CAUSE = ("; this run measured its read ceiling one way only, torch x.sum() timed with CUDA events ({bw:.2f} TB/s), "
          "which reads below what the HBM delivers (jnp.sum under CUPTI reads 3.18-3.20 TB/s on an H100 and "
          "4.59-4.67 on an H200): the ceiling is low, not the kernel faster than the memory. compare now measures "
          "three ways and quotes the best (docs/compare.md)")


def _single_method(ceilings: dict | None) -> bool:
    meas = (ceilings or {}).get("measured") or {}
    return bool(meas.get("hbm_read_Bps")) and not meas.get("hbm_read_methods")


def _rebase_multi_device(rec: dict | None, ceil: dict | None = None) -> bool:
    """A result over ``devices > 1`` GPUs whose fractions were taken against ONE GPU's measured ceilings (the runner
    before session 11): the fractions re-based on the aggregate of its GPUs (a division by the device count, what
    the runner computes today), the recorded values kept as ``*_one_gpu_ceiling``, and the note replaced. True when
    it changed the record."""
    if rec is None or rec.get("type") != "result":
        return False
    ndev = int(((rec.get("workload") or {}).get("devices")) or 1)
    m = rec.get("metrics") or {}
    # already re-based, or written by today's runner (its ceiling label names the GPUs it aggregates)
    if ndev <= 1 or "hbm_fraction_one_gpu_ceiling" in m or "GPUs" in str(m.get("hbm_ceiling", "")):
        return False
    changed = False
    for k in ("hbm_fraction", "tc_fraction"):
        if isinstance(m.get(k), (int, float)):
            m[f"{k}_one_gpu_ceiling"] = m[k]
            m[k] = m[k] / ndev
            changed = True
    if not changed:
        return False
    if "hbm_ceiling" in m:
        m["hbm_ceiling"] = f"{m['hbm_ceiling']}, x {ndev} GPUs"
    m["hbm_fraction_note"] = (f"re-based: the run divided by one GPU's measured HBM read ceiling "
                              f"({100 * m['hbm_fraction_one_gpu_ceiling']:.1f}%) for a workload over {ndev} GPUs; "
                              f"against their aggregate it is {100 * m['hbm_fraction']:.1f}% "
                              f"(compare.annotate_ceilings)")
    bw = ((ceil or {}).get("measured") or {}).get("hbm_read_Bps")
    if m["hbm_fraction"] > 1.0 and _single_method(ceil) and bw:  # still above: the one-method ceiling reads low
        m["hbm_fraction_note"] += _CAUSE.format(bw=bw / 1e12)
    return True


def annotate_lines(lines: list[str]) -> tuple[list[str], int]:
    """``(new_lines, n_annotated)``: the notes added to a run's records (one JSONL file)."""
    recs = [json.loads(ln) if ln.strip() else None for ln in lines]
    ceil = next((r for r in recs if r and r.get("type") == "ceilings"), None)
    bw = ((ceil or {}).get("measured") or {}).get("hbm_read_Bps")
    l2 = ((ceil or {}).get("datasheet") or {}).get("l2_mb")
    l2_bytes = l2 * 2**20 if l2 else None
    out, n = [], 0
    for line, rec in zip(lines, recs):
        if _rebase_multi_device(rec, ceil):  # its own cause first: one GPU's ceiling for a workload over several
            n += 1
            out.append(json.dumps(rec, allow_nan=True) + ("\n" if line.endswith("\n") else ""))
            continue
        m = (rec or {}).get("metrics") or {}
        pred = (rec or {}).get("prediction") or {}
        basis = pred.get(pred.get("basis") or "") or {}
        fields = [k for k in ("hbm_fraction", "roofline_fraction")
                  if isinstance(m.get(k), (int, float)) and m[k] > 1.0 and not m.get(f"{k}_note")
                  and (k == "hbm_fraction" or basis.get("limiter") == "HBM")]
        mma = (isinstance(m.get("roofline_fraction"), (int, float)) and m["roofline_fraction"] > 1.0
               and not m.get("roofline_fraction_note") and basis.get("limiter") == "MMA")
        if rec is not None and rec.get("type") == "result" and mma:  # compute side: its own cause (TF32 peers)
            m["roofline_fraction_note"] = over_compute_note(m["roofline_fraction"], engine=basis.get("engine"),
                                                            impl=rec.get("impl"))
            n += 1
            if not fields:
                out.append(json.dumps(rec, allow_nan=True) + ("\n" if line.endswith("\n") else ""))
                continue
            n -= 1  # counted once below
        if rec is None or rec.get("type") != "result" or not fields:
            out.append(line)
            continue
        for k in fields:
            what = "HBM read ceiling" if k == "hbm_fraction" else "roofline floor (HBM)"
            ds = m.get("hbm_fraction_datasheet" if k == "hbm_fraction" else "roofline_fraction_datasheet")
            b = basis.get("bytes")
            in_l2 = b is not None and l2_bytes and b <= l2_bytes
            if _single_method(ceil) and bw and not in_l2 and (ds is None or ds <= 1.0):  # the low ceiling is the cause
                note = (f"{100 * m[k]:.1f}% of the measured {what}"
                        + (f" ({100 * ds:.1f}% of the datasheet)" if ds is not None else "")
                        + _CAUSE.format(bw=bw / 1e12))
            else:  # what the runner writes today (an L2-resident working set, or bytes the model over-counts)
                note = over_ceiling_note(m[k], what=what, bytes_=b, l2_bytes=l2_bytes, datasheet_fraction=ds)
            m[f"{k}_note"] = note
        n += 1
        out.append(json.dumps(rec, allow_nan=True) + ("\n" if line.endswith("\n") else ""))
    return out, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m compare.annotate_ceilings", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true", help="report only; exit 1 when a record lacks its note")
    a = ap.parse_args(argv)
    total = 0
    for f in a.files:
        lines = f.read_text().splitlines(keepends=True)
        new, n = annotate_lines(lines)
        total += n
        if n:
            print(f"{f}: {n} record(s) {'lack' if a.check else 'given'} a note")
            if not a.check:
                f.write_text("".join(new))
    return 1 if (a.check and total) else 0


if __name__ == "__main__":
    sys.exit(main())
