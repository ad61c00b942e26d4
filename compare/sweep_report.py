"""The model-shape sweep's summary (configs/sweep.toml), rendered from run records only.

``python -m compare report <records.jsonl> [...]`` adds, when the records hold sweep workloads (a workload with a
``model`` or the tag ``sweep``; other records, ``pallas:auto``'s included, render as before), a section at the top of
``results.md``:

* per chip (``env.gpu``; records of two chips never meet in one ratio), per entry (``workload.entry``: prefill,
  train, decode, spec, paged, chunked, mla, quant) and model: the number of workloads; the geometric mean and the
  worst (with its workload) of ``pallas:auto``'s kernel time over the **best peer's** (``impl.kind == "peer"``,
  status ok, timed) and over the **best named config's** (every other Pallas implementation of the workload:
  the named configs of the kernels ``pallas:auto`` may route to, never a tuning point); the workloads where auto
  has no timed ok record, with the reasons grouped, and those where no peer ran; the same over all models;
* a verdict per entry against the roadmap's bar for its kernel (``BARS``) and against the sweep's own bar:
  auto within 3% of the best named config on at least 95% of the workloads and never more than 10% slower;
* one heatmap per chip and entry, ``img/sweep_<entry>_<chip>.png``: auto / best peer over model (rows) x size
  (columns), a diverging map centred on 1.0 (blue: auto faster), the ratio in each cell, hatched cells where auto
  or the peers have no timed record.

``--readme README.md`` replaces the block between ``<!-- sweep-headline:start -->`` and
``<!-- sweep-headline:end -->`` with one row per entry and chip (``headline``), naming the record files and the
git shas the numbers come from; a README without both markers is refused, and the same records give the same
block (no dates).

A ratio is always formed inside one run: a workload's auto, peer and named records all come from the run that
holds it. When one chip's records hold a workload in several runs, the latest run is the one used (runs in the order
of their run id, which starts with the run's start time, whatever the order of the files on the command line), and
the section says how many were replaced. CPU-interpret records carry no kernel
times and stay out of the sweep tables.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["BARS", "SWEEP_NEAR", "SWEEP_SHARE", "SWEEP_WORST", "START", "END", "WorkloadResult", "collect",
           "aggregate", "render_section", "headline", "update_readme", "check_readme", "plot_heatmap",
           "heatmap_grid", "is_auto", "is_sweep"]

START = "<!-- sweep-headline:start -->"
END = "<!-- sweep-headline:end -->"
SCORECARD_START = "<!-- sweep-scorecard:start -->"  # docs/results.md: the sweep's layer-2 scorecard (issue 35)
SCORECARD_END = "<!-- sweep-scorecard:end -->"

# The sweep issue's own bar: pallas:auto against the best named config of its kernels.
SWEEP_NEAR = 1.03  # "within 3%"
SWEEP_SHARE = 0.95  # ... on at least this share of the workloads
SWEEP_WORST = 1.10  # ... and never more than 10% slower

_ENTRY_ORDER = ("prefill", "train", "decode", "spec", "paged", "chunked", "mla", "quant")
_DEFAULT_ENTRY = {"prefill": "prefill", "train": "train", "decode": "decode", "paged_decode": "paged", "mla": "mla"}


@dataclasses.dataclass(frozen=True)
class Bar:
    """A frontier kernel's target from the roadmap, as far as records can judge it.

    ``peer_geomean`` / ``peer_worst``: bounds on auto / best peer; ``quant``: kv format -> bound on the quantized
    auto time over the bf16-KV auto time of the same shape; ``floor_fraction``: a lower bound on auto's
    ``metrics.roofline_fraction`` on every workload; ``twin_speed``: a lower bound on the twin's time over auto's (the
    chunk's speed over dense fa_prefill's at the same shape, every workload). ``text`` quotes the target;
    ``unchecked`` is the part of it a kernel-time ratio cannot judge (said, never silently dropped)."""

    text: str
    peer_geomean: float | None = None
    peer_worst: float | None = None
    quant: Mapping[str, float] | None = None
    floor_fraction: float | None = None
    twin_speed: float | None = None  # a lower bound on auto's speed over its dense twin's (``pallas:chunked:dense``)
    unchecked: str = ""


_DECODE = Bar("fa_decode: ahead of cuDNN (read as geomean <= 1.00x the best peer)", peer_geomean=1.00,
              unchecked=">= 93% of the datasheet bandwidth")
# The roadmap's frontier targets (the design's "families and frontier targets" table).
BARS: dict[str, Bar] = {
    "prefill": Bar("fa_prefill: geomean <= 0.97x the best peer, none > 1.05x", peer_geomean=0.97, peer_worst=1.05),
    "train": Bar("fa_prefill backward: step <= 1.00x the best peer, none > 1.10x", peer_geomean=1.00,
                 peer_worst=1.10, unchecked="backward >= 570 TFLOP/s at d128, N >= 4k (H100)"),
    "decode": _DECODE,
    "spec": dataclasses.replace(_DECODE, unchecked="spec decode Tq 2-8 at the read ceiling"),
    "paged": _DECODE,
    "chunked": Bar("serving: paged chunked prefill >= 0.95x dense fa_prefill's speed, <= 1.0x FA3's kvcache time",
                   peer_worst=1.00, twin_speed=0.95),
    "mla": Bar("fa_mla default >= 0.70 of the roofline floor everywhere", floor_fraction=0.70,
               unchecked=">= 600 TFLOP/s at B64 S8192"),
    "quant": Bar("low-precision KV: fp8 <= 0.55x, NVFP4 <= 0.45x the bf16-KV time (H100), every shape",
                 quant={"fp8_e4m3": 0.55, "nvfp4": 0.45}),
}


def is_auto(r: dict) -> bool:
    impl = r.get("impl") or {}
    return impl.get("kind") == "auto" or impl.get("name") == "pallas:auto"


def is_sweep(workload: dict) -> bool:
    """A workload of the model-shape sweep: it names a model (or carries the ``sweep`` tag)."""
    return workload.get("model") is not None or "sweep" in (workload.get("tags") or ())


def _is_peer(r: dict) -> bool:
    return (r.get("impl") or {}).get("kind") == "peer"


def _is_named(r: dict) -> bool:
    impl = r.get("impl") or {}
    return (impl.get("framework") == "pallas" and not is_auto(r) and not impl.get("overrides")
            and impl.get("kind") != "twin")


def _is_twin(r: dict) -> bool:
    return (r.get("impl") or {}).get("kind") == "twin"


def _time(r: dict) -> float | None:
    t = (r.get("metrics") or {}).get("time_us_p50")
    if r.get("status") != "ok" or isinstance(t, bool) or not isinstance(t, (int, float)):
        return None
    return float(t) if math.isfinite(t) and t > 0 else None


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _one_line(s: Any, n: int = 160) -> str:
    s = " ".join(str(s or "").split())
    return s if len(s) <= n else s[: n - 1] + "…"


@dataclasses.dataclass
class WorkloadResult:
    """One sweep workload on one chip, in one run: auto's record and the best peer and named config beside it."""

    chip: str
    run_id: str
    path: str
    name: str
    entry: str
    model: str
    workload: dict
    auto: dict | None
    peer: tuple[str, float] | None  # (impl name, p50 µs) of the best timed ok peer
    named: tuple[str, float] | None  # (impl name, p50 µs) of the best timed ok named Pallas config
    peers_tried: int  # peer records of the workload, any status
    git: tuple[str | None, bool | None]
    named_p10: float | None = None  # p10 µs of the best named config's record (the spread note below)
    twin: tuple[str, float] | None = None  # (impl name, p50 µs) of auto's dense twin (the chunked entry's bar)
    # the latest earlier run of the workload that timed auto beside named configs, where this run timed no named
    # config (a peers-only sweep): auto / best named is read there, within that run
    named_from: WorkloadResult | None = None

    @property
    def same_config(self) -> bool:
        """auto ran the config that is also the best named one (its choice recorded as ``kernel:config``)."""
        return bool(self.named and self.chose and self.named[0] == f"pallas:{self.chose}")

    @property
    def auto_p10(self) -> float | None:
        t = ((self.auto or {}).get("metrics") or {}).get("time_us_p10") if self.auto_us is not None else None
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None

    @property
    def auto_us(self) -> float | None:
        return None if self.auto is None else _time(self.auto)

    @property
    def vs_peer(self) -> float | None:
        return None if self.auto_us is None or self.peer is None else self.auto_us / self.peer[1]

    @property
    def vs_named(self) -> float | None:
        """auto / the best named config, within one run: this one, else ``named_from``'s (an earlier run's)."""
        if self.named is None and self.named_from is not None:
            return self.named_from.vs_named
        return None if self.auto_us is None or self.named is None else self.auto_us / self.named[1]

    @property
    def floor_us(self) -> float | None:
        """The workload's layer-1 floor (auto's record, measured ceilings): the same problem for every impl."""
        f = ((self.auto or {}).get("metrics") or {}).get("floor_us")
        return f if isinstance(f, (int, float)) and f > 0 else None

    @property
    def auto_floor(self) -> float | None:
        """auto's fraction of the floor (floor / time): how far from the limit the default is."""
        return None if self.floor_us is None or not self.auto_us else self.floor_us / self.auto_us

    @property
    def peer_floor(self) -> float | None:
        """The best peer's fraction of the same floor: how far from the limit the best library is."""
        return None if self.floor_us is None or self.peer is None else self.floor_us / self.peer[1]

    @property
    def chose(self) -> str | None:
        plan = (self.auto or {}).get("impl", {}).get("plan")
        return plan.get("chose") if isinstance(plan, dict) else None

    @property
    def missing(self) -> str | None:
        """Why auto has no timed ok record (None when it has one)."""
        if self.auto is None:
            return "no pallas:auto record in the run"
        if self.auto_us is not None:
            return None
        st = self.auto.get("status")
        if st == "ok":
            return "ok but no kernel time"
        return f"{st}: {_one_line(self.auto.get('reason')) or '(no reason given)'}"


def _chip(r: dict) -> str | None:
    env = r.get("env") or {}
    if env.get("device_kind") != "gpu":
        return None
    return env.get("gpu") or "unknown GPU"


def collect(runs: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, list[WorkloadResult]], dict[str, int]]:
    """``{chip: [WorkloadResult, ...]}`` from ``report.load_runs``'s runs (taken in the order of their run ids: the
    start time first, so a later run replaces an earlier one whatever the order of the files), and counts of what was
    left out: ``replaced`` (a workload a later run of the same chip holds again), ``cpu`` (CPU-interpret sweep
    records), ``no_auto_later`` (a later run of a workload without a ``pallas:auto`` record, e.g. a run of named
    configs only, never replaces an earlier run that timed auto: the yardstick is auto's run; nor does a later run
    whose auto record was ``skipped`` by that run's time budget, which measured nothing). Only sweep workloads
    (``is_sweep``)."""
    by_key: dict[tuple[str, str], WorkloadResult] = {}
    notes = {"replaced": 0, "cpu": 0, "no_auto_later": 0, "named_earlier": 0}
    for run_id, run in sorted(runs.items(), key=lambda kv: str(kv[0])):
        groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for r in run["results"]:
            w = r.get("workload") or {}
            groups[(_chip(r) or "", w.get("name", "?"))].append(r)
        for (chip, name), recs in groups.items():
            w = recs[0].get("workload") or {}
            if not is_sweep(w):
                continue
            if not chip:
                notes["cpu"] += len(recs)
                continue
            autos = [r for r in recs if is_auto(r)]
            auto = next((r for r in autos if _time(r) is not None), autos[0] if autos else None)
            peers = sorted((t, r["impl"]["name"]) for r in recs if _is_peer(r) and (t := _time(r)) is not None)
            named = sorted((t, r["impl"]["name"]) for r in recs if _is_named(r) and (t := _time(r)) is not None)
            p10 = {r["impl"]["name"]: (r.get("metrics") or {}).get("time_us_p10") for r in recs if _is_named(r)}
            twins = sorted((t, r["impl"]["name"]) for r in recs if _is_twin(r) and (t := _time(r)) is not None)
            env = recs[0].get("env") or {}
            res = WorkloadResult(
                chip=chip, run_id=run_id, path=str(run["path"]), name=name,
                entry=w.get("entry") or _DEFAULT_ENTRY.get(w.get("family"), w.get("family") or "?"),
                model=w.get("model") or "—", workload=w, auto=auto,
                peer=(peers[0][1], peers[0][0]) if peers else None,
                named=(named[0][1], named[0][0]) if named else None,
                peers_tried=sum(1 for r in recs if _is_peer(r)), git=(env.get("git_sha"), env.get("dirty")),
                named_p10=_finite(p10.get(named[0][1])) if named else None,
                twin=(twins[0][1], twins[0][0]) if twins else None)
            not_run = auto is None or auto.get("status") == "skipped"  # skipped: the run's --max-run-s ran out first
            if (chip, name) in by_key and not_run and by_key[(chip, name)].auto is not None:
                notes["no_auto_later"] += 1  # a config experiment or a cut run: auto's earlier run stays the workload's
                continue
            if (chip, name) in by_key:
                notes["replaced"] += 1
                prev = by_key.pop((chip, name))  # re-inserted: the workload takes the later run's place in the order
                earlier = prev if prev.named is not None else prev.named_from
                if res.named is None and earlier is not None and earlier.vs_named is not None:
                    res.named_from = earlier
                    notes["named_earlier"] += 1
            by_key[(chip, name)] = res
    out: dict[str, list[WorkloadResult]] = defaultdict(list)
    for (chip, _), res in by_key.items():
        out[chip].append(res)
    return dict(sorted(out.items())), notes


# ------------------------------------------------------------------------------------------ aggregates


def _geomean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


@dataclasses.dataclass
class Agg:
    n: int
    vs_peer: list[tuple[float, str]]  # (ratio, workload)
    vs_named: list[tuple[float, str]]
    no_auto: Counter  # reason -> workloads
    no_auto_with_peer: int  # a peer ran and auto has no timed record
    no_auto_with_named: int  # a named config ran and auto has no timed record
    with_named: int  # workloads where a named config ran (the sweep bar's denominator)
    no_peer: int  # no peer has a timed ok record
    best_peers: Counter
    auto_floor: list[float] = dataclasses.field(default_factory=list)  # auto's fraction of the layer-1 floor
    peer_floor: list[float] = dataclasses.field(default_factory=list)  # the best peer's, same workloads

    @property
    def peer_geomean(self) -> float | None:
        return _geomean([r for r, _ in self.vs_peer])

    @property
    def named_geomean(self) -> float | None:
        return _geomean([r for r, _ in self.vs_named])

    @property
    def peer_worst(self) -> tuple[float, str] | None:
        return max(self.vs_peer) if self.vs_peer else None

    @property
    def named_worst(self) -> tuple[float, str] | None:
        return max(self.vs_named) if self.vs_named else None

    @property
    def near(self) -> int:
        """Workloads where auto is within ``SWEEP_NEAR`` of the best named config."""
        return sum(1 for r, _ in self.vs_named if r <= SWEEP_NEAR)


def aggregate(results: Iterable[WorkloadResult]) -> Agg:
    results = list(results)
    no_auto: Counter = Counter(r.missing for r in results if r.missing)
    return Agg(
        n=len(results),
        vs_peer=[(r.vs_peer, r.name) for r in results if r.vs_peer is not None],
        vs_named=[(r.vs_named, r.name) for r in results if r.vs_named is not None],
        no_auto=no_auto,
        no_auto_with_peer=sum(1 for r in results if r.missing and r.peer),
        no_auto_with_named=sum(1 for r in results if r.missing and r.named),
        with_named=sum(1 for r in results if r.named or r.vs_named is not None),
        no_peer=sum(1 for r in results if r.peer is None),
        best_peers=Counter(r.peer[0] for r in results if r.peer),
        auto_floor=[r.auto_floor for r in results if r.auto_floor is not None and r.peer_floor is not None],
        peer_floor=[r.peer_floor for r in results if r.auto_floor is not None and r.peer_floor is not None])


def _entries(results: Iterable[WorkloadResult]) -> list[str]:
    seen = {r.entry for r in results}
    return [e for e in _ENTRY_ORDER if e in seen] + sorted(seen - set(_ENTRY_ORDER))


def _models(results: Iterable[WorkloadResult]) -> list[str]:
    return list(dict.fromkeys(r.model for r in results))  # the order the records (the config) give


# ------------------------------------------------------------------------------------------- verdicts


def _x(x: float | None, spec: str = ".3f") -> str:
    return "—" if x is None else f"{x:{spec}}×"


def _worst(w: tuple[float, str] | None, spec: str = ".3f") -> str:
    return "—" if w is None else f"{w[0]:{spec}}× ({w[1]})"


def sweep_verdict(a: Agg) -> tuple[str, str]:
    """(verdict, detail) of the sweep's own bar. A workload where a named config ran and auto has no timed
    record counts as a miss (it is slower than anything): it is in the denominator and breaks "never > 10%"."""
    if not a.with_named:
        return "not judged", "no named config ran"
    share = a.near / a.with_named
    worst = a.named_worst
    detail = (f"{100 * share:.1f}% within {100 * (SWEEP_NEAR - 1):.0f}% ({a.near}/{a.with_named}), "
              f"worst {_worst(worst)}")
    if a.no_auto_with_named:
        detail += f"; auto has no timed record on {a.no_auto_with_named} where a named config ran"
    ok = share >= SWEEP_SHARE and (worst is None or worst[0] <= SWEEP_WORST) and not a.no_auto_with_named
    return ("met" if ok else "missed"), detail


def _quant_ratios(results: list[WorkloadResult]) -> dict[str, list[tuple[float, str]]]:
    """kv format -> [(auto time / auto time of the same shape with bf16 KV, workload)] within one run."""
    def shape(r: WorkloadResult) -> tuple:
        w = r.workload
        return (r.run_id, r.model, w.get("batch"), w.get("q_len"), w.get("kv_len"), w.get("page_size"),
                w.get("ragged"))

    base = {shape(r): r.auto_us for r in results
            if r.workload.get("kv_dtype") in (None, r.workload.get("dtype")) and r.auto_us is not None}
    out: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for r in results:
        kv = r.workload.get("kv_dtype")
        if kv in (None, r.workload.get("dtype")) or r.auto_us is None or base.get(shape(r)) is None:
            continue
        out[kv].append((r.auto_us / base[shape(r)], r.name))
    return dict(out)


def kernel_verdict(entry: str, results: list[WorkloadResult]) -> tuple[str, str]:
    """(verdict, detail) against ``BARS[entry]``: "met", "missed" or "not judged" (no bar a record can check)."""
    bar = BARS.get(entry)
    if bar is None:
        return "not judged", "no bar for this entry"
    a = aggregate(results)
    parts, ok, judged = [], True, False
    if bar.peer_geomean is not None or bar.peer_worst is not None:
        g, w = a.peer_geomean, a.peer_worst
        if g is None:
            parts.append("no workload with both auto and a peer timed")
        else:
            judged = True
            parts.append(f"geomean {_x(g)} over {len(a.vs_peer)}, worst {_worst(w)}")
            ok &= bar.peer_geomean is None or g <= bar.peer_geomean
            ok &= bar.peer_worst is None or w[0] <= bar.peer_worst
            if a.no_auto_with_peer:
                parts.append(f"auto has no timed record on {a.no_auto_with_peer} where a peer ran")
                ok = False
    if bar.quant:
        ratios = _quant_ratios(results)
        for kv, limit in bar.quant.items():
            rs = ratios.get(kv)
            if not rs:
                parts.append(f"{kv}: no pair of auto records (bf16 KV and {kv}) in one run")
                continue
            judged = True
            worst = max(rs)
            parts.append(f"{kv} / bf16 KV: geomean {_x(_geomean([r for r, _ in rs]))}, worst {_worst(worst)}")
            ok &= worst[0] <= limit
    if bar.floor_fraction is not None:
        fr = [(f, r.name) for r in results if r.auto_us is not None
              and isinstance(f := (r.auto.get("metrics") or {}).get("roofline_fraction"), (int, float))]
        if not fr:
            parts.append("no auto record with a roofline fraction")
        else:
            judged = True
            lo = min(fr)
            parts.append(f"lowest roofline fraction {lo[0]:.3f} ({lo[1]}) over {len(fr)}")
            ok &= lo[0] >= bar.floor_fraction
            if a.no_auto:
                parts.append(f"auto has no timed record on {sum(a.no_auto.values())}")
                ok = False
    if bar.twin_speed is not None:
        sp = [(r.twin[1] / r.auto_us, r.name) for r in results if r.twin is not None and r.auto_us]
        if not sp:  # half the bar unjudged is not the bar met
            parts.append("no workload with auto and its dense twin (pallas:chunked:dense) timed in one run")
            ok = False
        else:
            judged = True
            lo = min(sp)
            parts.append(f"speed / dense fa_prefill's: geomean {_geomean([x for x, _ in sp]):.3f}, lowest "
                         f"{lo[0]:.3f} ({lo[1]}) over {len(sp)}")
            ok &= lo[0] >= bar.twin_speed
    if bar.unchecked:
        parts.append(f"not checked here: {bar.unchecked}")
    return ("met" if ok else "missed") if judged else "not judged", "; ".join(parts)


# ------------------------------------------------------------------------------------------- markdown


def _md_table(rows: list[list[str]], cols: list[str]) -> str:
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(r) + " |" for r in esc])


_MODEL_COLS = ["model", "workloads", "auto / best peer: geomean", "worst", "auto / best named: geomean", "worst",
               f"within {100 * (SWEEP_NEAR - 1):.0f}% of named", "no timed auto", "no peer", "best peer most often",
               "floor / time: auto, best peer (geomean)"]


def _most(c: Counter) -> str:
    if not c:
        return "—"
    name, k = sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[0]
    return f"{name} ({k} of {sum(c.values())})"


def _agg_row(label: str, a: Agg) -> list[str]:
    near = f"{a.near}/{a.with_named}" if a.with_named else "—"
    fl = "—"
    if a.auto_floor:
        fl = f"{_geomean(a.auto_floor):.2f}, {_geomean(a.peer_floor):.2f} ({len(a.auto_floor)})"
    return [label, str(a.n), _x(a.peer_geomean), _worst(a.peer_worst), _x(a.named_geomean), _worst(a.named_worst),
            near, str(sum(a.no_auto.values())), str(a.no_peer), _most(a.best_peers), fl]


def _shas(results: Iterable[WorkloadResult]) -> str:
    tags = {}
    for r in results:
        sha, dirty = r.git
        tags[sha] = {True: "dirty", False: "clean", None: "dirty unknown"}[dirty] if sha else None
    return ", ".join(f"`{s}` ({d})" if s else "no git sha recorded" for s, d in sorted(tags.items(), key=str))


def render_section(by_chip: Mapping[str, list[WorkloadResult]], notes: Mapping[str, int], out: Path,
                   img_dir: Path, *, plots: bool = True) -> tuple[str, list[Path]]:
    """The sweep section of results.md and the heatmaps it links (written under ``img_dir``)."""
    parts = ["## Model-shape sweep: `pallas:auto` against the best peer and the best named config", "",
             "Ratios are `pallas:auto`'s kernel time (p50) over the best peer's (`impl.kind` peer, status ok) and "
             "over the best named Pallas config's (the kernels auto may route to, each named config; tuning "
             "points excluded), in the same run on the same chip; below 1.000× auto is faster. Geomeans and "
             "worst cases are over the workloads where both sides have a timed ok record; the others are "
             "counted (no timed auto, with the reasons, and no peer). Kernel bars: the roadmap's target for the "
             "entry's kernel; sweep bar: auto within "
             f"{100 * (SWEEP_NEAR - 1):.0f}% of the best named config on ≥ {100 * SWEEP_SHARE:.0f}% of the "
             f"workloads and never more than {100 * (SWEEP_WORST - 1):.0f}% slower (a workload where a named "
             "config ran and auto did not counts against it). `floor / time`: the workload's layer-1 roofline "
             "floor (measured ceilings) over the kernel time, for auto and for the best peer, geomean over the "
             "workloads where both ran: how far from the limit the default and the best library are.", ""]
    if notes.get("replaced"):
        parts += [f"_{notes['replaced']} workload results were replaced by a later run of the same workload on "
                  "the same chip (the latest run, by its start time, is used)._", ""]
    if notes.get("no_auto_later"):
        parts += [f"_{notes['no_auto_later']} later workload results without a `pallas:auto` record (runs of named "
                  "configs only) or with auto skipped by the run's time budget left auto's earlier run of the "
                  "workload in place._", ""]
    if notes.get("named_earlier"):
        parts += [f"_{notes['named_earlier']} workloads' latest run timed no named config (e.g. a peers-only sweep): "
                  "their auto / best named ratio is the latest earlier run's that timed both, within that run "
                  "(its auto, at that run's code)._", ""]
    if notes.get("cpu"):
        parts += [f"_{notes['cpu']} CPU-interpret sweep records (no kernel times) are not in these tables._", ""]
    written: list[Path] = []
    for chip, results in by_chip.items():
        runs = sorted({(r.run_id, r.path) for r in results})
        parts += [f"### {chip}", "",
                  "Runs: " + ", ".join(f"`{rid}` (`{p}`)" for rid, p in runs) + f"; git {_shas(results)}.", ""]
        rows = []
        for e in _entries(results):
            sel = [r for r in results if r.entry == e]
            kv, kd = kernel_verdict(e, sel)
            sv, sd = sweep_verdict(aggregate(sel))
            bar = BARS.get(e)
            rows.append([e, str(len(sel)), bar.text if bar else "—", f"**{kv}**: {kd}", f"**{sv}**: {sd}"])
        parts += [_md_table(rows, ["entry", "workloads", "kernel bar", "verdict (kernel bar)",
                                   "verdict (sweep bar)"]), ""]
        for e in _entries(results):
            sel = [r for r in results if r.entry == e]
            parts += [f"#### {e} ({chip})", ""]
            rows = [_agg_row(m, aggregate([r for r in sel if r.model == m])) for m in _models(sel)]
            rows.append(_agg_row("**all models**", aggregate(sel)))
            parts += [_md_table(rows, _MODEL_COLS), ""]
            a = aggregate(sel)
            for reason, k in sorted(a.no_auto.items(), key=lambda kv: (-kv[1], kv[0])):
                parts.append(f"- no timed `pallas:auto` on {k}: {reason}")
            wn = max(((r.vs_named, r) for r in sel if r.vs_named is not None), default=None, key=lambda t: t[0])
            if wn is not None:
                r = wn[1] if wn[1].named is not None else wn[1].named_from  # the run the ratio was read in
                line = (f"- worst against the named configs: `{r.name}`, auto chose `{r.chose or 'not recorded'}`, "
                        f"best named `{r.named[0]}` ({r.named[1]:.1f} µs vs auto {r.auto_us:.1f} µs)")
                if r is not wn[1]:
                    line += f" (run `{r.run_id}`, earlier than the workload's latest)"
                if r.same_config and r.vs_named > SWEEP_NEAR:  # the verdict counts it; the reader learns what it is
                    spread = (f"; p10 {r.auto_p10:.1f} vs {r.named_p10:.1f} µs"
                              if r.auto_p10 is not None and r.named_p10 is not None else "")
                    line += (f": the same config as auto's choice, so the gap is the run's timing spread, not the "
                             f"routing{spread}")
                parts.append(line)
            if a.no_auto or wn is not None:
                parts.append("")
            if plots:
                p = img_dir / f"sweep_{e}_{_slug(chip)}.png"
                try:
                    made = plot_heatmap(chip, e, sel, p)
                except ImportError as ex:
                    parts += [f"_no heatmap: matplotlib is not installed ({ex})_", ""]
                except Exception as ex:  # a plot failing must not lose the tables
                    parts += [f"_heatmap failed: {type(ex).__name__}: {ex}_", ""]
                else:
                    if made:
                        written.append(p)
                        rel = p.relative_to(out.parent) if p.is_relative_to(out.parent) else p
                        parts += [f"![sweep {e} {chip}]({rel})", ""]
                    else:
                        parts += ["_no heatmap: no workload with a timed auto and a timed peer or named config_", ""]
    return "\n".join(parts), written


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "gpu"


# -------------------------------------------------------------------------------------------- heatmap

# The size axis per entry: workload fields and their short labels (the rest of a workload's identity goes in
# the row label when two workloads of one model share a size).
_SIZE_AXES: dict[str, tuple[tuple[str, str], ...]] = {
    "prefill": (("q_len", "N"),), "train": (("q_len", "N"),), "spec": (("q_len", "Tq"),),
    "chunked": (("q_len", "C"), ("kv_len", "S")),
}
_BS = (("batch", "B"), ("kv_len", "S"))
# q_offset is left out: decode families derive it from kv_len - q_len, so it would split every row by length
_VARIANT_FIELDS = ("page_size", "kv_dtype", "packed", "ragged", "q_len", "kv_len", "batch", "dtype", "causal",
                   "window", "softcap", "sinks")


def _num(v: Any) -> str:
    if isinstance(v, int) and not isinstance(v, bool) and v >= 1024 and v % 1024 == 0:
        return f"{v // 1024}k"
    return str(v)


def _variant(field: str, v: Any, w: dict) -> str:
    if field == "page_size":
        return f"p{v}"
    if field == "kv_dtype":
        return str(v or w.get("dtype"))
    if isinstance(v, bool):
        return field if v else ""
    short = {"q_len": "Tq", "kv_len": "S", "batch": "B"}
    return f"{short[field]}{_num(v)}" if field in short else f"{field}={v}"


def heatmap_grid(entry: str, results: list[WorkloadResult]):
    """(row labels, column labels, cells): ``cells[(row, col)]`` is a WorkloadResult; rows are models (with the
    fields that tell two workloads of one model and size apart), columns the entry's size axis."""
    axes = _SIZE_AXES.get(entry, _BS)
    size = {id(r): tuple(r.workload.get(f) for f, _ in axes) for r in results}
    groups: dict[tuple, list[WorkloadResult]] = defaultdict(list)
    for r in results:
        groups[(r.model, size[id(r)])].append(r)
    fields = [f for f in _VARIANT_FIELDS if f not in {a for a, _ in axes}
              and any(len({str(x.workload.get(f)) for x in g}) > 1 for g in groups.values())]

    def row(r: WorkloadResult) -> str:
        tags = [t for f in fields if (t := _variant(f, r.workload.get(f), r.workload))]
        return " ".join([r.model, *tags])

    model_order = {m: i for i, m in enumerate(_models(results))}
    rows = sorted({row(r) for r in results}, key=lambda s: (model_order.get(s.split(" ")[0], 0), s))
    cols_raw = sorted({size[id(r)] for r in results}, key=lambda t: tuple((v is None, v or 0) for v in t))
    label = {c: " ".join(f"{p}{_num(v)}" for (_, p), v in zip(axes, c)) for c in cols_raw}
    cells: dict[tuple[str, str], WorkloadResult] = {}
    for r in results:
        key = (row(r), label[size[id(r)]])
        if key in cells:  # identical in every field we label: keep both apart by name
            key = (f"{key[0]} [{r.name}]", key[1])
            rows.append(key[0])
        cells[key] = r
    return rows, [label[c] for c in cols_raw], cells


def plot_heatmap(chip: str, entry: str, results: list[WorkloadResult], path: Path) -> bool:
    """auto / best peer over model x size (auto / best named where no workload has a peer ratio). Returns False
    when there is nothing to draw. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    against = "peer" if any(r.vs_peer is not None for r in results) else "named"
    if against == "named" and not any(r.vs_named is not None for r in results):
        return False
    rows, cols, cells = heatmap_grid(entry, results)
    ratio = (lambda r: r.vs_peer) if against == "peer" else (lambda r: r.vs_named)
    vals = [ratio(r) for r in cells.values() if ratio(r) is not None]
    lim = min(max(max(abs(math.log2(v)) for v in vals), math.log2(1.25)), 2.0)
    norm = Normalize(vmin=-lim, vmax=lim)
    cmap = plt.get_cmap("RdBu_r")  # low (auto faster) blue, high red, white at 1.0
    fig_w = max(6.0, 1.05 * len(cols) + 3.2)
    fig_h = max(3.0, 0.42 * len(rows) + 1.9)
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))
    for i, rl in enumerate(rows):
        for j, cl in enumerate(cols):
            r = cells.get((rl, cl))
            if r is None:
                continue  # no such workload in the sweep: blank
            v = ratio(r)
            if v is not None:
                c = cmap(norm(math.log2(v)))
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=c, edgecolor="white", lw=1))
                lum = 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]
                ax.text(j + 0.5, i + 0.5, f"{v:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if lum > 0.5 else "white")
                continue
            other = r.peer if against == "peer" else r.named
            text, hatch = ("no auto", "//") if r.auto_us is None and other else (
                ("no peer" if against == "peer" else "no named", "\\\\") if r.auto_us is not None
                else ("neither", "xx"))
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor="0.93", edgecolor="0.6", hatch=hatch, lw=0.5))
            ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6.5, color="0.25")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(cols))])
    ax.set_xticklabels(cols, rotation=45 if len(cols) > 6 else 0, ha="right" if len(cols) > 6 else "center",
                       fontsize=8)
    ax.set_yticks([i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels(rows, fontsize=8)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    sm = plt.cm.ScalarMappable(norm=norm, cmap=cmap)
    cb = fig.colorbar(sm, ax=ax, fraction=0.04, pad=0.02)
    ticks = [t for t in (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0) if abs(math.log2(t)) <= lim + 1e-9]
    cb.set_ticks([math.log2(t) for t in ticks])
    cb.set_ticklabels([f"{t:g}×" for t in ticks])
    cb.ax.tick_params(labelsize=7)
    who = "best peer" if against == "peer" else "best named config (no peer ran)"
    n = sum(1 for v in cells.values() if ratio(v) is not None)
    ax.set_title(f"{entry} on {chip}: pallas:auto time / {who}\n{n} of {len(cells)} workloads compared; "
                 "blue: auto faster, red: slower; hatched: no timed record", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------- README block


def headline(by_chip: Mapping[str, list[WorkloadResult]], paths: Iterable[Path], readme: Path,
             out: Path | None = None, scorecard_doc: Path | None = None) -> str:
    """The README block's body: one row per entry and chip, from the records only, naming them, and the command that
    regenerates it (with ``--out`` when the report was named: records from several folders need it)."""
    base = readme.resolve().parent

    def rel(p: Path) -> str:
        p = Path(p).resolve()
        return str(p.relative_to(base)) if p.is_relative_to(base) else str(p)

    files = sorted({rel(Path(p)) for p in paths})
    rows = []
    every: list[WorkloadResult] = []
    for e in _entries([r for rs in by_chip.values() for r in rs]):
        for chip, results in by_chip.items():
            sel = [r for r in results if r.entry == e]
            if not sel:
                continue
            every += sel
            a = aggregate(sel)
            miss = sum(a.no_auto.values())
            rows.append([e, chip, f"{a.n}" + (f" ({miss} without a timed auto)" if miss else ""),
                         _x(a.peer_geomean), _worst(a.peer_worst), _x(a.named_geomean), _worst(a.named_worst),
                         _most(a.best_peers)])
    cmd = ("python -m compare report " + " ".join(files) + (f" --out {rel(Path(out))}" if out is not None else "")
           + (f" --scorecard-doc {rel(Path(scorecard_doc))}" if scorecard_doc is not None else "")
           + " --readme " + readme.name)
    lines = [f"**Model-shape sweep** (generated by `{cmd}`; do not edit by hand). `pallas:auto`'s kernel time over "
             "the best peer's and over the best named config's, in the same run; below 1.000× auto is faster; "
             "geomean and worst over the workloads where both sides ran. Per-model tables, verdicts and heatmaps: "
             "the `results.md` that command renders from the same records.", ""]
    lines.append(_md_table(rows, ["entry", "chip", "workloads", "auto / best peer: geomean", "worst",
                                  "auto / best named: geomean", "worst", "best peer most often"]))
    lines += ["", "Records: " + ", ".join(f"`{f}`" for f in files) + f"; git {_shas(every)}."]
    return "\n".join(lines)


def check_readme(path: Path, start: str = START, end: str = END, flag: str = "--readme",
                 what: str = "sweep headline") -> str:
    """The file's text, or a ValueError when it lacks one ``start`` marker before one ``end`` marker (the README's
    sweep headline by default; ``SCORECARD_START`` / ``SCORECARD_END`` for docs/results.md's scorecard)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot read it: {e.strerror or e}") from None
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{flag} {path}: needs exactly one '{start}' followed by one '{end}' (the block the "
                         f"{what} replaces); nothing written")
    return text


def update_readme(path: Path, body: str, start: str = START, end: str = END, flag: str = "--readme") -> bool:
    """Replace what lies between the markers with ``body``; True when the file changed."""
    text = check_readme(path, start, end, flag)
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{body.strip()}\n{end}{tail}"
    if new == text:
        return False
    path.write_text(new)
    return True
