"""The roofline scorecard: layer 1 and layer 2 against the measured time, per family and per GPU.

    python -m compare.scorecard results/<run>/records.jsonl [more.jsonl ...] [--threshold 0.3] [--json]
        [--recompute]

Reads result records, keeps the ``ok`` records of our own kernels (``pallas:*`` and ``cuda:*``; the peers
are excluded) and scores the layer-2 prediction each record carries from before its run (``--recompute``:
layer 2 recomputed with today's model and constants, the table labelled "re-scored with the model of <git
sha>"; the records are never rewritten). Also reads ``scripts/time_cuda_paged.py`` lines (``paged_times.jsonl``:
the cuda_ref paged twins timed outside compare, same CUPTI sum of partial + merge), turned into records with no
carried prediction (``paged_times_records``), so layer 2 is always today's for them.

Layer 2 is ``compare.layer2`` with the run's measured HBM bandwidth when its ``ceilings`` record has it. It
renders: per GPU and family (the workload family x framework), the
count, the median and worst |error| of layer 1 and of layer 2, the limiters each named, and every layer-2
miss above the threshold with its stated cause (``CAUSES``) or "open". ``render(records)`` is what
``compare report`` calls; ``scorecard(records)`` returns the numbers.

Error = predicted / measured - 1 (layer 1 is a floor, so its error is negative by construction).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from . import layer2, records

__all__ = ["CAUSES", "rows", "scorecard", "render", "main", "paged_times_records", "load", "model_sha", "latest",
           "sweep_layer2", "render_sweep_layer2", "sweep_kernels", "render_sweep_scorecard"]

# Stated causes of the layer-2 misses above 30% on the H200 fit run, matched on (impl prefix, workload
# prefix); docs/roofline.md explains each. Anything not matched is "open".
CAUSES: tuple[tuple[str, str, str], ...] = (
    # session 21, the train family (docs/roofline.md "Session 21: the train family")
    ("pallas:", "sweep_train_gpt-oss-20b:local_", "a 128-key window leaves each dK/dV CTA ~3 query blocks per head: "
     "the per-CTA prologue and the dS^T exchange's first steps, fitted on CTAs of hundreds of steps, are "
     "under-charged"),
    *(("pallas:dropin:fused", f"sweep_train_{m}", "fused at D 128 spills (452 B) and couples its consumers; one "
       "per-step latency fitted mostly on D 64 under-charges those steps") for m in ("llama", "qwen", "mistral")),
    # session 22 (docs/roofline.md "Session 22: the softmax on the SFU")
    *(("pallas:fa_prefill:c3", f"sweep_prefill_{m}", "c3 at D 128: three consumers at 160 registers each hold a "
       "64 x 128 fp32 O beside S and spill (ptxas, session 23: 344 bytes of spill stores and loads; 0 at D 64); the "
       "model has no spill term for it (never chosen at D 128: the table gives c3 at D 64 only)")
      for m in ("llama", "packed_llama", "qwen", "mistral")),
    # session 23 (docs/roofline.md "Session 23")
    ("pallas:fa_prefill:c3", "sweep_prefill_gpt-2_n", "c3 at D 64, short N: no spill (ptxas: 0 bytes); a 192-row "
     "tile's causal diagonal spans two 128-key blocks, so each row tile runs two masked serial steps where the "
     "per-row-tile cost (fitted on 128-row tiles) holds one; at N 512 those are 5 of a head's 9 key steps (never "
     "chosen below N 8192)"),
    ("pallas:fa_decode:spec_split1", "sweep_spec_qwen", "a forced single split (the config's definition in session "
     "23's call 2 only): 64 programs on 132 SMs; layer 2 prices the bytes at the chip's bandwidth whatever the "
     "number of SMs drawing them, and 64 SMs with one program each reached 54-73% of it"),
    ("pallas:fa_train:", "sweep_prefill_", "fa_train's Triton forward (no default's path on sm_90): one per-key-block "
     "latency fitted on issue 16's fp16 D 64 non-causal run, over-predicted there; the sweep's causal bf16 rows run "
     "1.4-2.6x that price, most at short N (a per-program cost it was never given; a fit on these rows alone is not "
     "adopted: it contradicts the earlier run)"),
    ("pallas:fa_prefill:", "sweep_prefill_gpt-oss-20b:local_", "a 128-key window: each row tile sees two or three "
     "key tiles; the per-row-tile cost fitted on long rows under-charges such short tiles"),
    ("pallas:fa_decode", "paged_", "ragged lengths: layer 2 charges every sequence at kv_len (the plan cannot "
     "see runtime lengths); they are drawn in [kv_len/2, kv_len], mean 3/4, so KV bytes are over-counted ~4/3"),
    ("pallas:v5_wmma:faithful", "ref_decode_", "same 2-warp d128 plan as the prefill miss: per-block latency "
     "scales with work per warp"),
    ("pallas:v5_wmma:faithful", "peer_prefill_", "d128 faithful plan (BM=32, 2 warps), as on ref_prefill_n*_d128"),
    ("pallas:v5_wmma:faithful", "ref_prefill_n", "d128 faithful plan (BM=32, 2 warps): a key block's latency "
     "grows with the work per warp, which layer 2 prices per block, not per warp (fitted on the 4-warp d64 "
     "plan); at Tq=8192 the L2 term binds instead and under-counts the 2-warp programs' re-reads"),
    ("pallas:v5_wmma:tuned", "ref_prefill_causal", "causal: programs on the diagonal do 1/2 the blocks of the "
     "average; the busiest SM's share is larger than the mean visible fraction layer 2 charges"),
    ("pallas:v5_wmma", "ref_prefill_causal", "causal imbalance (see the tuned row)"),
    ("cuda:v5_wmma", "ref_prefill_causal", "causal imbalance: rows near the end see all keys"),
    ("cuda:v5_wmma", "", "fixed per-block latency across d: the shared-memory softmax (16-way bank conflicts on "
     "the running-O rescale) grows with d, layer 2 has one latency per block for both head dims"),
    ("pallas:v3_online", "", "d128 (TM=32 tiles): a different Triton dot shape, priced with the d64 constant"),
    ("cuda:v4_fused", "ref_prefill_n512_d128", "small grid (512 CTAs, under 1 round): tail effects"),
    ("cuda:v6_splitkv", "ref_decode_", "latency per key differs between d64 (2 elements per lane) and d128 (4)"),
    # issue 16, the paged family (held out on the H100; docs/roofline.md "The paged family")
    ("cuda:v8_gqa_ss", "", "open: at the identical shape (past_l2 B 32, N 32768) the ss twin measures 2139 us on "
     "the H200 fit run and 1637 us on the H100 while v8_gqa measures 1773 / 1732; a GPU or build difference one "
     "set of SM constants cannot carry (its lane-step cost was fitted on the H200's d128 rows only)"),
    ("cuda:v8_gqa_tc", "", "gather-bound (one warp walks the table for 128 strided elements per lane per tile); "
     "gather_lat fitted on the H200's twins, every gather-bound twin runs 14-30% faster on the H100: open "
     "(dependent-load latency per GPU not measured)"),
    ("cuda:v6_splitkv", "v7_vs_v6", "dense v6 twin: priced by the frozen dense fit (v6_merge_kernel's fixed 32 us "
     "per CTA), not refitted here"),
    ("pallas:v8_gqa_ilp", "", "KU = 4 takes four keys' scores before their updates: fewer serial per-key sweeps "
     "than the issue units count (faster than priced at 300 keys); open"),
    ("pallas:v8_gqa:tuned", "pg_reclaim_b8", "4-warp programs, 2 per SM on the busiest SM: the issue term "
     "serialises them, the measurement says they partly overlap"),
    ("pallas:fa_decode", "pg_smoke", "smoke size (4-8 programs, 300 keys): a per-program fixed latency no fitted "
     "cost has; open"),
    ("pallas:fa_decode", "pg_reclaim_b1", "B 1 with 128 splits: merge priced per serial step, 31%: open"),
)


def _cause(impl: str, workload: str) -> str:
    # the scoring run's workloads (configs/layer2_score.toml) are the reference shapes renamed
    # score_a_* / score_b_*: match them against the reference-shape causes
    for half in ("score_a_", "score_b_"):
        if workload.startswith(half):
            workload = "ref_" + workload[len(half):]
    for ip, wp, why in CAUSES:
        if impl.startswith(ip) and workload.startswith(wp):
            return why
    return "open"


def paged_times_records(lines: Iterable[Mapping[str, Any]], source: str = "paged_times") -> list[dict[str, Any]]:
    """``scripts/time_cuda_paged.py`` lines -> result records (family ``paged_decode``; v6_splitkv's dense
    comparison rows ``decode``) with the split plan they ran, their read ceiling as a ``ceilings`` record and no
    carried prediction (so layer 1 is absent and layer 2 is always recomputed)."""
    out: list[dict[str, Any]] = []
    seen = set()
    for x in lines:
        run_id = f"{source}:{x['device']}"
        if run_id not in seen and x.get("read_ceiling_GBps"):
            seen.add(run_id)
            out.append({"type": "ceilings", "run_id": run_id,
                        "measured": {"hbm_read_Bps": float(x["read_ceiling_GBps"]) * 1e9}})
        paged = x["gen"] != "v6_splitkv"
        n_k = int(x["N_k"])
        w = {"name": f"{x['sweep']}_b{x['B']}_hq{x['H_q']}_hkv{x['H_kv']}_n{n_k}_d{x['D']}_sm{x['num_sm']}",
             "family": "paged_decode" if paged else "decode", "batch": int(x["B"]), "heads_q": int(x["H_q"]),
             "heads_kv": int(x["H_kv"]), "q_len": 1, "kv_len": n_k, "head_dim": int(x["D"]), "dtype": "float16",
             "causal": False, "q_offset": n_k - 1, "page_size": int(x["page"]) if paged else None}
        plan = {"splits": int(x["splits"]), "chunk": math.ceil(n_k / int(x["splits"])), "num_sm": int(x["num_sm"])}
        out.append({"type": "result", "status": "ok", "run_id": run_id, "env": {"gpu": x["device"]}, "workload": w,
                    "impl": {"name": f"cuda:{x['gen']}", "framework": "cuda", "plan": plan},
                    "metrics": {"time_us_p50": float(x["kernel_us"])}, "prediction": {}})
    return out


def load(paths: Iterable[str]) -> list[dict[str, Any]]:
    """Records from compare's ``records.jsonl`` files (gzipped ``.jsonl.gz`` too, as results/ keeps them) and
    ``paged_times.jsonl`` lines (converted)."""
    out = []
    for p in paths:
        lines = list(records.read_jsonl(p))
        timed = [x for x in lines if "sweep" in x and "kernel_us" in x]
        out += [x for x in lines if not ("sweep" in x and "kernel_us" in x)]
        out += paged_times_records(timed, source=str(p))
    return out


_load = load


def model_sha() -> str:
    """The git sha of today's layer-2 model (``-dirty`` when compare/layer2.py has uncommitted changes)."""
    root = layer2.ROOT
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "compare/layer2.py"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return sha + ("-dirty" if dirty else "")


def latest(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records with each result replaced by the latest one for the same (GPU, workload, implementation): the
    sweep report's rule (compare/sweep_report.py: a later run of a workload on the same chip takes its place), so a
    measurement a later run superseded (an old default, a path since changed) is not scored twice. Other records
    (headers, ceilings) are kept as they are. "Latest": the greatest run id (it starts with the run's start time),
    then the position in the input; a ``skipped`` record (its run's time budget ran out first) only where the key has
    nothing else."""
    recs = list(records)
    last: dict[tuple, tuple[bool, str, int]] = {}
    for i, r in enumerate(recs):
        if r.get("type") == "result":
            key = ((r.get("env") or {}).get("gpu"), (r.get("workload") or {}).get("name"),
                   (r.get("impl") or {}).get("name"))
            # a record its run's time budget skipped measured nothing: any record that ran outranks it
            last[key] = max(last.get(key, (False, "", -1)),
                            (r.get("status") != "skipped", str(r.get("run_id") or ""), i))
    keep = {i for *_, i in last.values()}
    return [r for i, r in enumerate(recs) if r.get("type") != "result" or i in keep]


def rows(records: Iterable[Mapping[str, Any]], recompute: bool = False, latest_only: bool = False
         ) -> list[dict[str, Any]]:
    """One scored row per ok pallas/cuda result record (``recompute``: layer 2 with the current constants,
    not the prediction the record carries from before its run; ``latest_only``: only the last record of each
    (GPU, workload, implementation), ``latest``)."""
    recs = latest(records) if latest_only else list(records)
    ceilings = {r.get("run_id"): r for r in recs if r.get("type") == "ceilings"}
    out = []
    for r in recs:
        if r.get("type") != "result" or r.get("status") != "ok":
            continue
        impl = (r.get("impl") or {}).get("name", "")
        if not layer2.modelled(impl):
            continue
        hw = layer2.hardware_of(r.get("env") or {}, ceilings.get(r.get("run_id")))
        sc = layer2.score(r, hw, recompute=recompute)
        w = r["workload"]
        fam = f"{w['family']}/{(r.get('impl') or {}).get('framework', impl.split(':')[0])}"
        out.append({"gpu": (r.get("env") or {}).get("gpu", "?"), "family": fam, "workload": w["name"], "impl": impl,
                    **sc})
    return out


def sweep_layer2(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Layer 2 on the model-shape sweep (issue 35), per (GPU, entry, side): the latest record of each sweep workload
    and Pallas implementation (``latest``), ``side`` "auto" (``pallas:auto``, priced as the kernel and config its
    plan says it chose) or "named" (the named configs). For each group: how many records, and for the prediction the
    records carry from before their runs (``before``) and for today's model (``now``): how many were priced, the
    median and worst |error|, how many within 25%, and the limiters layer 2 named. Training steps are priced
    since session 21 (``layer2.train_launches``); older train records carry no prediction ("not priced" before)."""
    recs = list(records)
    groups: dict[tuple, dict[str, list]] = collections.defaultdict(lambda: {"before": [], "now": []})
    for when, rec in (("before", False), ("now", True)):
        for row, _ in _sweep_rows(recs, recompute=rec):
            side = "auto" if row["impl"] == layer2.AUTO else "named"
            groups[(row["gpu"], row["entry"], side)][when].append(row)
    out = []
    for (gpu, entry, side), g in sorted(groups.items()):
        item: dict[str, Any] = {"gpu": gpu, "entry": entry, "side": side, "records": len(g["now"])}
        for when in ("before", "now"):
            summary = _err_summary(g[when], 0.25)
            item[when] = dict(summary, within_25=summary.pop("within"))
        out.append(item)
    return out


def _sweep_rows(records: list[Mapping[str, Any]], recompute: bool = False
                ) -> list[tuple[dict[str, Any], Mapping[str, Any]]]:
    """``(row, record)`` of the scored Pallas rows on the sweep (``rows`` on the latest record of each sweep workload
    and implementation, ``latest``), each row with its ``entry``; the twins (``_twin_names``) left out."""
    recs = [r for r in latest(records) if r.get("type") != "result"
            or str((r.get("workload") or {}).get("name", "")).startswith("sweep_")]
    by_key = {((r.get("env") or {}).get("gpu", "?"), (r.get("workload") or {}).get("name"),
               (r.get("impl") or {}).get("name")): r for r in recs if r.get("type") == "result"}
    twins = _twin_names(recs)
    out = []
    for row in rows(recs, recompute=recompute):
        if not row["impl"].startswith("pallas:") or row["impl"] in twins:
            continue
        r = by_key[(row["gpu"], row["workload"], row["impl"])]
        w = r.get("workload") or {}
        out.append((dict(row, entry=w.get("entry") or w.get("family") or row["family"]), r))
    return out


def _err_summary(group: list[Mapping[str, Any]], threshold: float) -> dict[str, Any]:
    """Of a group of scored rows: how many were priced, the median and worst |layer-2 error|, how many within
    ``threshold``, and the limiters layer 2 named."""
    errs = [abs(x["layer2_err"]) for x in group if x["layer2_err"] is not None]
    return {"priced": len(errs), "median": statistics.median(errs) if errs else None,
            "worst": max(errs) if errs else None, "within": sum(e <= threshold for e in errs),
            "limiters": dict(collections.Counter(x["layer2_limiter"] for x in group if x["layer2_err"] is not None))}


def render_sweep_layer2(records: Iterable[Mapping[str, Any]]) -> str:
    """``sweep_layer2`` as a markdown table (empty string when the records hold no sweep result)."""
    items = sweep_layer2(records)
    if not items:
        return ""

    def cell(d):
        if not d["priced"]:
            return "not priced"
        return f"{d['priced']}: {_pct(d['median'])} / {_pct(d['worst'])}, {d['within_25']} within 25%"

    lines = ["| GPU | entry | side | records | before the run: priced, median / worst, within 25% | "
             "today's model: same | limiters (today) |", "|---|---|---|---|---|---|---|"]
    for it in items:
        lim = ", ".join(f"{k} {v}" for k, v in sorted(it["now"]["limiters"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {it['gpu']} | {it['entry']} | {it['side']} | {it['records']} | {cell(it['before'])} | "
                     f"{cell(it['now'])} | {lim or '—'} |")
    return "\n".join(lines)


def _twin_names(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """Implementations of kind "twin" (compare's ``pallas:chunked:dense``): a yardstick beside auto, not a Pallas
    choice, so not in the sweep's layer-2 tables."""
    return {str((r.get("impl") or {}).get("name")) for r in records
            if r.get("type") == "result" and (r.get("impl") or {}).get("kind") == "twin"}


def _kernel_of(record: Mapping[str, Any]) -> str:
    """The kernel a sweep record timed: a named config's generation (``pallas:fa_prefill:c3`` -> ``fa_prefill``), and
    for ``pallas:auto`` the generation its plan says the defaults chose (``fa_decode``, ``fa_mla``, ...)."""
    impl = record.get("impl") or {}
    name = str(impl.get("name", ""))
    if name == layer2.AUTO:
        plan = impl.get("plan") or {}
        return str(plan.get("generation") or plan.get("chose") or "not chosen")
    parts = name.split(":")
    return parts[1] if len(parts) > 1 else name


def sweep_kernels(records: Iterable[Mapping[str, Any]], threshold: float = 0.25) -> dict[str, Any]:
    """Layer 2 on the sweep per (GPU, entry, kernel), from the prediction each record carries from before its run,
    on the latest record of each sweep workload and Pallas implementation (``latest``): ``{"groups": [{"gpu",
    "entry", "kernel", "records", "priced", "median", "worst", "within", "limiters"}], "misses": [row + cause]}``,
    a miss being a priced row with |error| above ``threshold`` (the issue's 25%)."""
    groups: dict[tuple, list] = collections.defaultdict(list)
    misses = []
    for row, r in _sweep_rows(list(records)):
        row = dict(row, kernel=_kernel_of(r))
        groups[(row["gpu"], row["entry"], row["kernel"])].append(row)
        if row["layer2_err"] is not None and abs(row["layer2_err"]) > threshold:
            misses.append(dict(row, cause=_cause(row["impl"], row["workload"])))
    out = [{"gpu": gpu, "entry": entry, "kernel": kernel, "records": len(g), **_err_summary(g, threshold)}
           for (gpu, entry, kernel), g in sorted(groups.items())]
    return {"groups": out, "misses": misses, "threshold": threshold}


def render_sweep_scorecard(records: Iterable[Mapping[str, Any]], threshold: float = 0.25) -> str:
    """The sweep's layer-2 scorecard for docs/results.md (``compare report --scorecard-doc``): per entry and side
    (``render_sweep_layer2``), per entry and kernel before the run (``sweep_kernels``), and every miss above
    ``threshold`` with its stated cause or "open". Empty string when the records hold no sweep result."""
    records = list(records)
    per_entry = render_sweep_layer2(records)
    if not per_entry:
        return ""
    sk = sweep_kernels(records, threshold)
    pct = lambda x: "—" if x is None else _pct(x)  # noqa: E731
    lines = ["#### Per entry and side (before the run, and with today's model)", "", per_entry, "",
             "#### Per entry and kernel (predictions made before each run)", "",
             f"| GPU | entry | kernel | records | priced | median / worst \\|error\\| | within {100 * threshold:.0f}% "
             "| limiters |", "|---|---|---|---|---|---|---|---|"]
    for g in sk["groups"]:
        lim = ", ".join(f"{k} {v}" for k, v in sorted(g["limiters"].items(), key=lambda kv: -kv[1]))
        lines.append(f"| {g['gpu']} | {g['entry']} | {g['kernel']} | {g['records']} | {g['priced']} | "
                     f"{pct(g['median'])} / {pct(g['worst'])} | {g['within']} | {lim or '—'} |")
    lines += ["", f"#### Misses above {100 * threshold:.0f}% (before the run; {len(sk['misses'])})", ""]
    lines += _misses_table(sorted(sk["misses"], key=lambda m: (m["gpu"], -abs(m["layer2_err"]))))
    return "\n".join(lines) + "\n"


def _misses_table(misses: list[Mapping[str, Any]]) -> list[str]:
    """The Markdown lines of a layer-2 misses table (none when there is no miss)."""
    if not misses:
        return []
    lines = ["| GPU | workload | impl | measured us | layer 2 us | error | limiter | cause |",
             "|---|---|---|---|---|---|---|---|"]
    for m in misses:
        lines.append(f"| {m['gpu']} | {m['workload']} | {m['impl']} | {m['measured_us']:.1f} | "
                     f"{m['layer2_us']:.1f} | {100 * m['layer2_err']:+.0f}% | {m['layer2_limiter']} | "
                     f"{m['cause']} |")
    return lines


def _stats(errs: list[float]) -> tuple[float, float]:
    a = [abs(e) for e in errs if e is not None]
    return (statistics.median(a), max(a)) if a else (float("nan"), float("nan"))


def scorecard(records: Iterable[Mapping[str, Any]], threshold: float = 0.3, recompute: bool = False) -> dict[str, Any]:
    """``{"groups": [...], "misses": [...], "overall": {...}}``; a group is (gpu, family) or (gpu, "all")."""
    rs = rows(records, recompute)
    groups = collections.defaultdict(list)
    for r in rs:
        groups[(r["gpu"], r["family"])].append(r)
        groups[(r["gpu"], "all")].append(r)
    out = []
    for (gpu, fam), g in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] == "all", kv[0][1])):
        m1, w1 = _stats([r["layer1_err"] for r in g])
        m2, w2 = _stats([r["layer2_err"] for r in g])
        out.append({"gpu": gpu, "family": fam, "n": len(g), "l1_median": m1, "l1_worst": w1, "l2_median": m2,
                    "l2_worst": w2,
                    "l1_limiters": dict(collections.Counter(r["layer1_limiter"] for r in g)),
                    "l2_limiters": dict(collections.Counter(r["layer2_limiter"] for r in g)),
                    "l2_unmodelled": sum(1 for r in g if r["layer2_err"] is None)})
    misses = [dict(r, cause=_cause(r["impl"], r["workload"])) for r in rs
              if r["layer2_err"] is not None and abs(r["layer2_err"]) > threshold]
    return {"groups": out, "misses": misses, "threshold": threshold}


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.0f}%"


def render(records: Iterable[Mapping[str, Any]], threshold: float = 0.3, recompute: bool = False) -> str:
    """The scorecard as Markdown (what ``compare report`` puts into its output)."""
    sc = scorecard(records, threshold, recompute)
    lines = ([f"Layer 2 re-scored with the model of {model_sha()} (today's constants, not the predictions the "
              "records carry from before their runs).", ""] if recompute else [])
    lines += ["| GPU | family | n | layer 1 median / worst abs error | layer 2 median / worst abs error | "
             "layer 1 limiters | layer 2 limiters |", "|---|---|---|---|---|---|---|"]
    for g in sc["groups"]:
        lim = lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1]))  # noqa: E731
        lines.append(f"| {g['gpu']} | {g['family']} | {g['n']} | {_pct(g['l1_median'])} / {_pct(g['l1_worst'])} | "
                     f"{_pct(g['l2_median'])} / {_pct(g['l2_worst'])} | {lim(g['l1_limiters'])} | "
                     f"{lim(g['l2_limiters'])} |")
    lines += ["", f"Layer-2 misses above {100 * threshold:.0f}% ({len(sc['misses'])}):", ""]
    lines += _misses_table(sorted(sc["misses"], key=lambda m: -abs(m["layer2_err"])))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m compare.scorecard", description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="+", help="records.jsonl files")
    ap.add_argument("--threshold", type=float, default=0.3, help="list layer-2 misses above this |error|")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--recompute", action="store_true",
                    help="layer 2 with the current model and constants (labelled with its git sha), not the "
                         "prediction each record carries; records are never rewritten")
    a = ap.parse_args(argv)
    recs = _load(a.records)
    if a.json:
        print(json.dumps(scorecard(recs, a.threshold, a.recompute), indent=1, default=str))
    else:
        sys.stdout.write(render(recs, a.threshold, a.recompute))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
