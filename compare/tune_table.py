"""``python -m compare tune --table RECORDS... [--chip h100] [--write PATH]``: the per-GPU heuristic tables from sweep
records (pallas_attn/tuning, docs/sweep.md).

For each chip (the records' ``env.gpu``, mapped to a table name by ``pallas_attn.tuning.CHIPS``) and each tuned
kernel, every workload where at least two named configs of that kernel ran and agreed with the oracle becomes one
row: the workload's bucket (``pallas_attn.tuning.bucket``), the fastest named config, every config's time, the
margin (second best / best) and the records it came from. Which records count for which kernel:

* ``fa_mla``, ``fa_prefill``, ``fa_decode``: ``pallas:<kernel>:<config>`` records (``impl.generation`` the kernel);
* ``fa_prefill_bwd``: the train family's ``pallas:dropin:<bwd config>`` records (the drop-in's forward + that
  backward: the step a user pays for).

Records of several runs of one chip are pooled: a workload measured twice keeps the later run's times (the order of
the files given). The choice compares ratios within one run: each config's time over the default's in the latest
run that timed both (a config never timed beside the default falls back to a cross-run ratio); the row's ``time_us``
are the latest absolute times. Workloads with a window or packed documents make no row: a bucket has neither key, and
their schedules follow rules (``fa_prefill.config_for_window``), so a windowed row would overrule the plain shape's.
Timing-tie policy: a config replaces the kernel's current default only when it is faster by more than ``--min-gain``
(default 1%) at that workload; within the noise the default stays, so a table never flips a default on noise. Tuning
points (``impl.overrides``) are never table entries: a table names named configs only.
"""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path
from typing import Any

from . import records
from .workloads import UsageError

__all__ = ["kernel_of", "bucket_of", "build_tables", "add_arguments", "run_table"]

# the config a kernel's heuristic falls back to without a table (what a row must beat by --min-gain)
DEFAULTS = {"fa_mla": "default", "fa_prefill": "default", "fa_decode": "default"}


def _default_of(kernel: str, wl: dict[str, Any]) -> str:
    if kernel == "fa_prefill_bwd":  # the drop-in's rule without a table: by causal
        from pallas_attn.dropin import DROPIN_BWD_CONFIG

        return DROPIN_BWD_CONFIG[bool(wl.get("causal"))]
    return DEFAULTS[kernel]


def kernel_of(rec: dict[str, Any]) -> tuple[str, str] | None:
    """``(table kernel, config name)`` a record measures, None when it is no named config of a tuned kernel."""
    impl = rec.get("impl") or {}
    name = impl.get("name") or ""
    if impl.get("overrides") or impl.get("kind") in ("peer", "auto"):
        return None
    parts = name.split(":")
    if len(parts) != 3 or parts[0] != "pallas":
        return None
    fam = (rec.get("workload") or {}).get("family")
    if parts[1] == "dropin" and fam == "train":
        return "fa_prefill_bwd", parts[2]
    if parts[1] in ("fa_mla", "fa_prefill", "fa_decode") and fam != "train":
        return parts[1], parts[2]
    return None


def bucket_of(kernel: str, wl: dict[str, Any]) -> dict[str, Any]:
    """The table bucket of a record's workload (the same keys the heuristic computes from its Problem)."""
    from pallas_attn import tuning

    page = wl.get("page_size") if wl.get("family") in ("paged_decode", "mla") else None
    kv_len = wl["kv_len"] if not page else -(-wl["kv_len"] // page) * page
    prob = types.SimpleNamespace(
        dtype=wl["dtype"], kv_dtype=wl.get("kv_dtype"), head_dim=wl["head_dim"], causal=bool(wl.get("causal")),
        page_size=page, kv_lora_rank=wl.get("kv_lora_rank"), q_len=wl["q_len"], kv_len=kv_len, batch=wl["batch"],
        heads_q=wl["heads_q"], heads_kv=wl["heads_kv"])
    return tuning.bucket(kernel, prob)


def _chip_of(rec: dict[str, Any]) -> str | None:
    from pallas_attn import tuning

    return tuning.chip_of((rec.get("env") or {}).get("gpu"))


def _read(paths: list[str]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise UsageError(f"--table: no records file {p}")
        head_env = None
        for r in records.read_jsonl(path):
            if r.get("type") == "header":
                head_env = r.get("env")
            if r.get("type") == "result":
                if "env" not in r and head_env is not None:
                    r["env"] = head_env
                r["_file"] = str(path)
                out.append(r)
    return out


def _relative_times(cfgs: dict[str, dict[str, Any]], by_run: dict[Any, dict[str, float]],
                    dflt: str) -> dict[str, float]:
    """Each config's time over the default's, both from one run: the latest run (in the order the files were given)
    that timed the config beside the default; a config never timed beside the default keeps its time over the
    default's latest (a cross-run ratio, the only one there is). Without the default anywhere: the times themselves.
    Ratios within one run keep a machine's run-to-run drift (2-3% between H100 machines) out of the choice."""
    if dflt not in cfgs:
        return {c: v["time_us"] for c, v in cfgs.items()}
    rel = {c: v["time_us"] / cfgs[dflt]["time_us"] for c, v in cfgs.items()}
    for run_times in by_run.values():  # insertion order = file order: later runs override
        if dflt in run_times:
            for c, t in run_times.items():
                rel[c] = t / run_times[dflt]
    return rel


def build_tables(records: list[dict[str, Any]], *, min_gain: float = 0.01) -> dict[str, dict[str, Any]]:
    """chip -> table (the JSON ``pallas_attn.tuning`` reads)."""
    # chip -> kernel -> workload name -> {config: (time, record file, git sha)}
    times: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    runs: dict[tuple[str, str, str], dict[Any, dict[str, float]]] = {}  # (chip, kernel, workload) -> run -> cfg -> us
    wls: dict[str, dict[str, Any]] = {}
    for r in records:
        k = kernel_of(r)
        chip = _chip_of(r)
        t = (r.get("metrics") or {}).get("time_us_p50")
        if k is None or chip is None or r.get("status") != "ok" or not isinstance(t, (int, float)):
            continue
        kern, cfg = k
        if r["workload"].get("window") or r["workload"].get("packed"):
            continue  # a bucket does not see a window or packing (their schedules follow rules, not the table)
        wname = r["workload"]["name"]
        wls[wname] = r["workload"]
        sha = (r.get("env") or {}).get("git_sha")
        times.setdefault(chip, {}).setdefault(kern, {}).setdefault(wname, {})[cfg] = {
            "time_us": float(t), "file": r["_file"], "git_sha": sha}
        runs.setdefault((chip, kern, wname), {}).setdefault(r.get("run_id"), {})[cfg] = float(t)
    out: dict[str, dict[str, Any]] = {}
    for chip, kernels in times.items():
        tbl: dict[str, Any] = {"chip": chip, "made_by": "python -m compare tune --table", "min_gain": min_gain,
                               "kernels": {}}
        for kern, by_wl in sorted(kernels.items()):
            rows = []
            for wname, cfgs in sorted(by_wl.items()):
                if len(cfgs) < 2:
                    continue
                dflt = _default_of(kern, wls[wname])
                rel = _relative_times(cfgs, runs[(chip, kern, wname)], dflt)
                ranked = sorted(cfgs, key=lambda c: rel[c])
                best = ranked[0]
                if dflt in cfgs and best != dflt and rel[dflt] <= rel[best] * (1 + min_gain):
                    best = dflt  # within the noise of the default: keep the default
                rows.append({"key": bucket_of(kern, wls[wname]), "config": best, "default": dflt, "workload": wname,
                             "margin": round(rel[ranked[1]] / rel[ranked[0]], 4),
                             "time_us": {c: round(v["time_us"], 2) for c, v in cfgs.items()},
                             "records": sorted({v["file"] for v in cfgs.values()}),
                             "git_sha": sorted({str(v["git_sha"]) for v in cfgs.values()})})
            tbl["kernels"][kern] = {"rows": rows}
        out[chip] = tbl
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--table", nargs="+", metavar="RECORDS", default=None,
                   help="make the per-GPU heuristic tables from these sweep records (instead of running a grid)")
    p.add_argument("--chip", default=None, help="with --table: only this chip's table (h100, h200)")
    p.add_argument("--write", default=None,
                   help="with --table: the JSON path to write (default pallas_attn/tuning/<chip>.json)")
    p.add_argument("--replace", action="store_true",
                   help="with --table: write even when the table being replaced was made from record files not given "
                        "here (their rows are dropped); without it that is refused, naming the files")
    p.add_argument("--min-gain", type=float, default=0.01,
                   help="with --table: a config replaces the default only when faster by more than this; default 0.01")


def _dropped_sources(path: Path, given: list[str]) -> list[str]:
    """The ``sources`` of the table at ``path`` (if any) that are not among the record files ``given``."""
    try:
        old = json.loads(path.read_text()).get("sources", [])
    except (OSError, ValueError, AttributeError):
        return []
    mine = {str(Path(g)) for g in given}
    return sorted(f for f in old if str(Path(f)) not in mine)


def run_table(args: argparse.Namespace) -> int:
    import pallas_attn.tuning as tuning

    tables = build_tables(_read(args.table), min_gain=args.min_gain)
    if args.chip is not None:
        tables = {k: v for k, v in tables.items() if k == args.chip}
    if not tables:
        raise UsageError("--table: no ok records of a named config of fa_mla / fa_prefill / fa_decode / pallas:dropin "
                         f"on a known chip ({', '.join(c for _, c in tuning.CHIPS)}) in {' '.join(args.table)}")
    if args.write and len(tables) > 1:
        raise UsageError(f"--write names one file; the records hold {len(tables)} chips: add --chip")
    for chip, tbl in tables.items():
        tbl["sources"] = sorted({f for k in tbl["kernels"].values() for row in k["rows"] for f in row["records"]})
        path = Path(args.write) if args.write else Path(tuning.__file__).parent / f"{chip}.json"
        lost = _dropped_sources(path, args.table)
        if lost and not getattr(args, "replace", False):
            raise UsageError(f"--table: {path} was made from record files not given here, and its rows from them would "
                             f"be dropped: {' '.join(lost)}. Give them too (a table is a function of all its sources), "
                             f"or --replace")
        path.write_text(json.dumps(tbl, indent=1, sort_keys=True) + "\n")
        n = {k: len(v["rows"]) for k, v in tbl["kernels"].items()}
        changed = {k: sum(1 for r in v["rows"] if r["config"] != r["default"]) for k, v in tbl["kernels"].items()}
        here, full = Path.cwd().resolve(), path.resolve()
        shown = full.relative_to(here) if full.is_relative_to(here) else path.name  # no machine path in a kept log
        print(f"{chip}: {shown} rows {n}; rows away from the kernel's default: {changed}")
    return 0
