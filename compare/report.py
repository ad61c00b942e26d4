"""Tables, plots and ``docs/results.md``, rendered from run records only (nothing is measured here).

``python -m compare report results/<run>/records.jsonl [more.jsonl ...] [--out docs/results.md]`` writes,
into the run's folder (next to the records: ``results/<run>/results.md`` and ``results/<run>/img/``) unless
``--out`` names another file — the committed ``docs/results.md`` is rewritten only when asked by name:
  * ``results.md``: per run, the environment header (GPU, versions, git sha, measured ceilings, the
    clock check) and the record file it came from; per workload a table of implementations sorted by
    kernel time, with speed-ups against the best peer and the twin, roofline fraction and errors; refused
    implementations listed with their reasons;
  * ``img/roofline_<run>.png``: every timed implementation as a point (arithmetic intensity of its
    model vs achieved FLOP/s), under the run's measured roofs (HBM read x AI, matmul peaks), log-log;
  * ``img/generations_<run>.png``: kernel time per generation, in the generation table's order,
    Pallas (each config) and CUDA side by side, one panel per workload;
  * ``img/bars_<run>_<workload>.png`` (``compare/report_bars.py``), linked under each workload's table: one bar
    per implementation with a timed ok record (kernel time p50, fastest first), ours and the peers in two colours,
    the workload's layer-1 roofline floor as a vertical line.
GPU runs and CPU-interpret runs are never mixed: a CPU run gets agreement tables and no plots (results.md says why).

Records of the model-shape sweep (``configs/sweep.toml``) add a section at the top (``compare/sweep_report.py``):
per chip, entry and model, ``pallas:auto`` over the best peer and over the best named config (geomean, worst,
what has no record and why), a verdict per entry against its bars, and one heatmap per entry
(``img/sweep_<entry>_<chip>.png``). ``--readme README.md`` also rewrites the README's generated headline block
(between ``<!-- sweep-headline:start -->`` and ``<!-- sweep-headline:end -->``) from the same records.
"""

from __future__ import annotations

import argparse
import math
import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import records, report_bars, scorecard, sweep_report
from .workloads import UsageError, ensure_writable

__all__ = ["add_parser", "console", "workload_table", "render", "load_runs"]

_STATUS_STYLE = {"ok": "green", "wrong": "bold red", "failed": "red", "oom": "red", "unsupported": "dim",
                 "unavailable": "dim", "not_built": "dim", "skipped": "yellow"}


def console():
    """Wide (200 columns) into a log or pipe, the terminal's own width on a terminal."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def status_summary(recs: list[dict]) -> str:
    """``"2 ok, 3 skipped, 12 unavailable"``: counts by status, in the table's order."""
    order = ("ok", "wrong", "failed", "oom", "skipped", "unsupported", "unavailable", "not_built")
    counts = defaultdict(int)
    for r in recs:
        counts[r.get("status")] += 1
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


_CPU_COLS = ("impl", "status", "CPU interpret", "max abs", "rel L2", "note")


def cpu_table(name: str, recs: list[dict]):
    """A CPU run's compact table for one workload: what ran (interpret mode, agreement only); everything
    else in one summary line under it."""
    from rich.table import Table

    ran = sorted((r for r in recs if r["status"] in ("ok", "wrong", "failed", "oom")), key=_sort_key)
    rest = [r for r in recs if r not in ran]
    w = recs[0]["workload"] if recs else {}
    caption = f"also: {status_summary(rest)}" if rest else None
    t = Table(title=f"{name}  [dim]{_shape(w)}[/]", caption=caption, title_justify="left", caption_justify="left")
    for c in _CPU_COLS:
        t.add_column(c, overflow="fold", max_width=50 if c == "note" else None)
    for r in ran:
        a = r.get("agreement") or {}
        style = _STATUS_STYLE.get(r["status"], "")
        us = (r.get("metrics") or {}).get("cpu_interpret_us_p50")
        t.add_row(r["impl"]["name"], f"[{style}]{r['status']}[/]" if style else r["status"],
                  "—" if us is None else f"{us / 1e3:.3g} ms",
                  _f(a.get("max_abs_err"), ".2g"), _f(a.get("rel_l2_err"), ".2g"), (r.get("reason") or "")[:120])
    return t


def _f(x: Any, spec: str = ".3g", none: str = "—") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return none
    return format(x, spec)


def _pct(x: Any) -> str:
    return _f(None if x is None else 100 * x, ".1f") + ("%" if x is not None else "")


def _x(x: Any) -> str:
    return _f(x, ".2f") + ("x" if x is not None else "")


def _sort_key(r: dict) -> tuple:
    order = {"ok": 0, "wrong": 1, "skipped": 2, "failed": 3, "oom": 3, "unsupported": 4, "unavailable": 5,
             "not_built": 6}
    t = records.get(r, "metrics.time_us_p50")
    return (order.get(r.get("status"), 9), t if isinstance(t, (int, float)) else math.inf, r["impl"]["name"])


def _time_cell(r: dict) -> str:
    m = r.get("metrics") or {}
    if m.get("time_us_p50") is not None:
        return f"{m['time_us_p50']:.1f} ({m['time_us_p10']:.1f}–{m['time_us_p90']:.1f})"
    if m.get("cpu_interpret_us_p50") is not None:
        return f"CPU-interpret {m['cpu_interpret_us_p50'] / 1e3:.3g} ms"
    return "—"


_COLS = ("impl", "status", "p50 µs (p10–p90)", "e2e µs", "TFLOP/s", "GB/s", "roofline", "HBM", "TC",
         "vs best peer", "vs twin", "max abs", "rel L2", "note")


_E2E_COL = "e2e µs synced / pipelined"


def _cols(recs: list[dict]) -> tuple[str, ...]:
    """The table's columns: records with both e2e figures get the labelled column (older records keep theirs)."""
    if any((r.get("metrics") or {}).get("e2e_pipelined_us") is not None for r in recs):
        return tuple(_E2E_COL if c == "e2e µs" else c for c in _COLS)
    return _COLS


def _e2e_cell(m: dict) -> str:
    if m.get("e2e_pipelined_us") is not None:
        return f"{_f(m.get('e2e_synced_us', m.get('e2e_us_p50')), '.1f')} / {_f(m['e2e_pipelined_us'], '.1f')}"
    return _f(m.get("e2e_us_p50"), ".1f")


_OWN_CLOCKS = (None, "cupti:mosaic", "cupti:jax-measure", "cupti:torch-profiler", "cpu-interpret")


def _row(r: dict) -> list[str]:
    m, a = r.get("metrics") or {}, r.get("agreement") or {}
    note = r.get("reason") or ""
    if m.get("clock_fallback"):
        note = (note + "; " if note else "") + f"CLOCK FALLBACK to {m.get('clock')} (asked {m.get('clock_requested')})"
    elif not note and m.get("clock") not in _OWN_CLOCKS:
        note = f"clock {m['clock']}"
    for k in ("hbm_fraction_note",):
        if m.get(k):
            note = (note + "; " if note else "") + m[k]
    tw = a.get("twin") or {}
    if tw.get("rel_l2_err") is not None:
        note = (note + "; " if note else "") + f"twin rel L2 {tw['rel_l2_err']:.2g}"
    return [r["impl"]["name"], r["status"], _time_cell(r), _e2e_cell(m), _f(m.get("tflops"), ".1f"),
            _f(m.get("gbps"), ".0f"), _pct(m.get("roofline_fraction")), _pct(m.get("hbm_fraction")),
            _pct(m.get("tc_fraction")), _x(m.get("speedup_vs_best_peer")), _x(m.get("speedup_vs_twin")),
            _f(a.get("max_abs_err"), ".2g"), _f(a.get("rel_l2_err"), ".2g"), note]


_FOLD = ("not_built", "unavailable", "unsupported")  # long lists: one line per status under the table


def workload_table(name: str, recs: list[dict]):
    """A rich table for one workload (the run prints one after each workload)."""
    from rich.table import Table

    shown = sorted((r for r in recs if r["status"] not in _FOLD), key=_sort_key)
    folded = defaultdict(list)
    for r in recs:
        if r["status"] in _FOLD:
            folded[r["status"]].append(r["impl"]["name"])
    w = recs[0]["workload"] if recs else {}
    title = f"{name}  [dim]{_shape(w)}[/]" if w else name
    caption = "; ".join(f"{k}: {', '.join(v)}" for k, v in folded.items()) or None
    if not shown:
        from rich.text import Text

        return Text.from_markup(f"[bold]{title}[/]: nothing ran — {caption or 'no records'}")
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for c in _cols(shown):
        t.add_column(c, overflow="fold", max_width=60 if c == "note" else None)
    for r in shown:
        row = _row(r)
        style = _STATUS_STYLE.get(r["status"], "")
        row[1] = f"[{style}]{row[1]}[/]" if style else row[1]
        t.add_row(*row)
    return t


def _shape(w: dict) -> str:
    s = (f"B{w.get('batch')} Hq{w.get('heads_q')}/Hkv{w.get('heads_kv')} Tq{w.get('q_len')} Tk{w.get('kv_len')} "
         f"D{w.get('head_dim')} {w.get('dtype')}")
    if w.get("kv_dtype"):
        s += f" KV {w['kv_dtype']}"
    if w.get("page_size"):
        s += f" page{w['page_size']}" + (" ragged" if w.get("ragged") else "")
    return s + (" causal" if w.get("causal") else "")


# ------------------------------------------------------------------------------------------- report


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="render results.md and plots from run records (into the run's folder)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="records.jsonl files (or run directories)")
    p.add_argument("--out", default=None,
                   help="markdown output; default <run folder>/results.md, next to the records. "
                        "'--out docs/results.md' regenerates the committed docs")
    p.add_argument("--img-dir", default=None, help="plot directory; default <out dir>/img")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--readme", default=None, metavar="README.md",
                   help="also replace the sweep headline block between the README's '<!-- sweep-headline:start -->' "
                        "and '<!-- sweep-headline:end -->' markers with one row per entry and chip from these sweep "
                        "records (refused when the markers are absent or the records hold no timed sweep workload)")
    p.add_argument("--scorecard-doc", default=None, metavar="docs/results.md",
                   help="also replace the block between '<!-- sweep-scorecard:start -->' and "
                        "'<!-- sweep-scorecard:end -->' in this file with the sweep's layer-2 scorecard (per entry "
                        "and side, per entry and kernel, every miss above 25%% with its cause), from the predictions "
                        "the records carry from before their runs, latest record of each workload and "
                        "implementation (refused when the markers are absent)")
    p.add_argument("--rescore", action="store_true",
                   help="the roofline scorecard recomputes layer 2 with today's model and constants (labelled with "
                        "its git sha) instead of the prediction each record carries from before its run; records "
                        "are never rewritten")
    p.set_defaults(func=_cli)


def _cli(args: argparse.Namespace) -> int:
    paths = [Path(f) / "records.jsonl" if Path(f).is_dir() else Path(f) for f in args.files]
    for p in paths:
        if not p.is_file():
            raise UsageError(f"no records file {str(p)!r}")
    if args.out is None:
        folders = sorted({str(p.resolve().parent) for p in paths})
        if len(folders) > 1:
            raise UsageError(f"records from {len(folders)} folders ({', '.join(folders)}): name the report "
                             "with --out")
        out = paths[0].parent / "results.md"
    else:
        out = Path(args.out)
    img = Path(args.img_dir) if args.img_dir else out.parent / "img"
    try:
        runs = load_runs(paths)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    if not runs:
        raise UsageError(f"no records in {', '.join(map(str, paths))}")
    readme = Path(args.readme) if args.readme else None
    if readme is not None:  # refused before anything is written
        try:
            sweep_report.check_readme(readme)
        except ValueError as e:
            raise UsageError(str(e)) from None
        by_chip, _ = sweep_report.collect(runs)
        if not by_chip:
            raise UsageError(f"--readme {readme}: no sweep workload recorded on a GPU in {', '.join(map(str, paths))}; "
                             "the README is left as it is")
    card_doc = Path(args.scorecard_doc) if args.scorecard_doc else None
    if card_doc is not None:  # refused before anything is written
        try:
            sweep_report.check_readme(card_doc, sweep_report.SCORECARD_START, sweep_report.SCORECARD_END,
                                      "--scorecard-doc", "sweep scorecard")
        except ValueError as e:
            raise UsageError(str(e)) from None
    ensure_writable(out, f"--out {out}")
    written = render(paths, out, img, plots=not args.no_plots, rescore=args.rescore)
    if card_doc is not None:
        sweep_report.update_readme(card_doc, scorecard_block(runs, paths, card_doc), sweep_report.SCORECARD_START,
                                   sweep_report.SCORECARD_END, "--scorecard-doc")
        written.append(card_doc)
    if readme is not None:
        sweep_report.update_readme(readme, sweep_report.headline(by_chip, paths, readme, out, card_doc))
        written.append(readme)
    for p in written:
        print(p)
    return 0


def scorecard_block(runs: dict[str, dict[str, Any]], paths: Iterable[Path], doc: Path) -> str:
    """The body of docs/results.md's generated scorecard block: what it is, the records it reads, the tables."""
    every = [r for run in runs.values() for r in run["results"] + ([run["ceilings"]] if run["ceilings"] else [])]
    table = scorecard.render_sweep_scorecard(every)
    base = doc.resolve().parent
    files = sorted({os.path.relpath(Path(p).resolve(), base) for p in paths})
    return "\n".join([
        "## Layer 2 on the model-shape sweep (the scorecard)", "",
        "Generated by `python -m compare report <the sweep's records> --scorecard-doc docs/results.md` (the README's "
        "sweep command carries it). Error = layer 2's predicted time / the measured p50 - 1, on the latest record of "
        "each sweep workload and Pallas implementation on each GPU; \"before the run\" is the prediction the record "
        "carries, made by the runner before the timing from the kernel's declared launches and the plan the default "
        "chose; \"today's model\" recomputes it with the current constants. `pallas:auto` is priced as the kernel and "
        f"config its plan chose. Model {scorecard.model_sha()}. docs/roofline.md explains the misses and the fits.",
        "", table or "_no sweep result in these records_", "",
        f"Records ({len(files)} files): " + ", ".join(f"`{f}`" for f in files)])


def load_runs(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """``{run_id: {"path", "header", "ceilings", "clock_checks", "results"}}`` in file order."""
    runs: dict[str, dict[str, Any]] = {}
    for path in paths:
        for r in records.read_jsonl(path):
            run = runs.setdefault(r.get("run_id", "?"), {"path": str(path), "header": None, "ceilings": None,
                                                          "clock_checks": [], "results": []})
            t = r.get("type")
            if t == "header":
                run["header"] = r
            elif t == "ceilings":
                run["ceilings"] = r
            elif t == "clock_check":
                run["clock_checks"].append(r)
            elif t == "result":
                run["results"].append(r)
    return runs


def _md_table(rows: list[list[str]], cols: Iterable[str]) -> str:
    cols = list(cols)
    esc = [[c.replace("|", "\\|") for c in r] for r in rows]
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(r) + " |"
                                                                                  for r in esc])


def _is_gpu(run: dict) -> bool:
    env = (run["header"] or (run["results"][0] if run["results"] else {})).get("env", {})
    return env.get("device_kind") == "gpu"


def _git_detail(env: dict) -> str:
    if "git_sha_source" not in env:  # recorded before the source and dirty flag were
        return ""
    dirty = {True: "dirty", False: "clean", None: "dirty unknown"}[env.get("dirty")]
    return f" ({dirty}; from {env.get('git_sha_source')})"


def _env_md(run: dict) -> str:
    env = (run["header"] or (run["results"][0] if run["results"] else {})).get("env", {})
    v = env.get("versions", {})
    lines = [f"- device: **{env.get('gpu') or 'no GPU (CPU interpret mode: agreement only, no kernel timings)'}**"
             + (f", clocks {env['clocks']}" if env.get("clocks") else ""),
             "- versions: " + ", ".join(f"{k} {v[k]}" for k in sorted(v) if v[k] is not None),
             f"- git: `{env.get('git_sha')}`{_git_detail(env)}; records: `{run['path']}`"]
    if run["header"]:
        lines.append(f"- command: `{' '.join(run['header'].get('argv') or [])}`")
    c = run["ceilings"] or {}
    meas = c.get("measured")
    ds = c.get("datasheet")
    if meas and meas.get("hbm_read_methods"):
        fl = ", ".join(f"{k} {val / 1e12:.0f} TFLOP/s" for k, val in meas.get("flops", {}).items())
        sheet = f" (datasheet {ds['hbm_bw_Bps'] / 1e12:.2f} TB/s)" if ds else ""
        methods = "; ".join(f"{k} {v['Bps'] / 1e12:.2f} TB/s ({v.get('clock')})"
                            for k, v in meas["hbm_read_methods"].items())
        lines.append(f"- measured HBM read ceiling: **{_f((meas.get('hbm_read_Bps') or 0) / 1e12, '.2f')} TB/s**, "
                     f"best of {len(meas['hbm_read_methods'])} methods ({meas.get('hbm_read_best')}){sheet}: "
                     f"{methods}; every HBM fraction is against the best")
        lines.append(f"- measured ceilings (cuda-events): HBM copy {_f((meas.get('hbm_copy_Bps') or 0) / 1e12, '.2f')} "
                     f"TB/s; {fl}")
        if meas.get("errors"):
            lines.append(f"- ceilings not measured: {meas['errors']}")
    elif meas:
        fl = ", ".join(f"{k} {val / 1e12:.0f} TFLOP/s" for k, val in meas.get("flops", {}).items())
        lines.append(f"- measured ceilings ({meas.get('clock')}): HBM read "
                     f"{_f((meas.get('hbm_read_Bps') or 0) / 1e12, '.2f')} TB/s, copy "
                     f"{_f((meas.get('hbm_copy_Bps') or 0) / 1e12, '.2f')} TB/s; {fl}")
        if meas.get("errors"):
            lines.append(f"- ceilings not measured: {meas['errors']}")
    elif c:
        lines.append(f"- ceilings: not measured ({c.get('reason')})")
    if ds:
        lines.append(f"- datasheet ({ds['name']}): HBM {ds['hbm_bw_Bps'] / 1e12:.2f} TB/s, "
                     + ", ".join(f"{k} {val / 1e12:.0f} TFLOP/s" for k, val in ds["flops"].items()))
    for cc in run["clock_checks"]:
        if cc.get("clock"):
            fb = (f"; FALLBACK from {cc['clock_requested']}" if cc.get("clock_fallback") else "")
            lines.append(f"- clock check ({cc['framework']}, {cc['clock']}{fb}): 1 GiB copy at "
                         f"{cc['achieved_Bps'] / 1e12:.2f} TB/s = {100 * cc['ratio']:.0f}% of the copy ceiling "
                         f"({'ok' if cc['ok'] else 'SUSPECT'})")
        else:
            lines.append(f"- clock check ({cc['framework']}) failed: {cc.get('reason')}")
    return "\n".join(lines)


# a run with more workloads than this gets no per-workload bar charts (a sweep's report would write hundreds of PNGs
# into the repository; its heatmaps summarize it instead)
BARS_MAX_WORKLOADS = 40

CPU_NO_PLOTS = ("No timing plots for this run: CPU interpret mode times the Pallas interpreter, not a kernel, so its "
                "times say nothing about kernel speed; run on a GPU for timings.")


def _rel(p: Path, out: Path) -> Path:
    return p.relative_to(out.parent) if p.is_relative_to(out.parent) else p


def _bars_md(run_id: str, run: dict, name: str, recs: list[dict], out: Path, img_dir: Path,
             written: list[Path]) -> list[str]:
    """The workload's bar chart (``img/bars_<run>_<workload>.png``) and its markdown line; nothing when no record
    of the workload is a timed ok one. A chart failing leaves a line saying so, never loses the tables."""
    env = (run["header"] or recs[0]).get("env") or {}
    chart = report_bars.bar_data(name, recs, env.get("gpu"))
    if not chart.bars:
        return []
    p = img_dir / report_bars.bars_filename(run_id, name)
    try:
        made = report_bars.plot_bars(chart, p)
    except ImportError as e:
        return [f"_no bar chart: matplotlib is not installed ({e})_", ""]
    except Exception as e:  # a plot failing must not lose the tables
        return [f"_bar chart failed: {type(e).__name__}: {e}_", ""]
    if not made:
        return []
    written.append(p)
    return [f"![kernel time per implementation, {name}]({_rel(p, out)})", ""]


def render(paths: list[Path], out: Path, img_dir: Path, *, plots: bool = True, rescore: bool = False) -> list[Path]:
    runs = load_runs(paths)
    if not runs:
        raise ValueError(f"no records in {[str(p) for p in paths]}")
    parts = ["# Results", "",
             "Generated by `python -m compare report` from the record files named below; every number here "
             "traces to one JSONL record (its `repro` field reruns it). Kernel times are CUPTI device times "
             "with a cold L2 (median, p10–p90); e2e is host wall-clock per call with dispatch. "
             "`roofline` = predicted floor / measured time (layer 1, measured ceilings); HBM and TC are the "
             "achieved byte and FLOP rates over the measured HBM-read and matmul ceilings. CPU-interpret runs "
             "report agreement only.", ""]
    written: list[Path] = []
    by_chip, notes = sweep_report.collect(runs)
    if by_chip or notes["cpu"]:  # the model-shape sweep's summary first (absent for other records)
        section, pngs = sweep_report.render_section(by_chip, notes, out, img_dir, plots=plots)
        parts += [section, ""]
        written += pngs
        try:  # layer 2 on the sweep (issue 35): before the runs and with today's model, latest records only
            every = [r for run in runs.values()
                     for r in run["results"] + ([run["ceilings"]] if run["ceilings"] else [])]
            table = scorecard.render_sweep_layer2(every)
        except Exception as e:  # the scorecard failing must not lose the tables
            table = f"_layer-2 table failed: {type(e).__name__}: {e}_"
        if table:
            parts += ["### Layer 2 on the sweep", "",
                      "Layer 2's prediction against the measured p50 (|predicted / measured - 1|), the latest record "
                      "of each sweep workload and Pallas implementation (training steps included: layer 2 prices the "
                      "forward, the backward's launches and the loss): as each record carries it from before its run, "
                      "and recomputed with today's model "
                      f"and constants (model {scorecard.model_sha()}). `pallas:auto` is priced as the kernel and "
                      "config its plan says it chose; a record made before auto had a layer 2 is \"not priced\" "
                      "before. docs/roofline.md explains the misses.", "", table, ""]
    for run_id, run in runs.items():
        gpu = _is_gpu(run)
        parts += [f"## Run `{run_id}`" + ("" if gpu else " (CPU interpret)"), "", _env_md(run), ""]
        if not gpu:
            parts += [CPU_NO_PLOTS, ""]
        if plots and gpu:
            for kind, fn in (("roofline", plot_roofline), ("generations", plot_generations)):
                p = img_dir / f"{kind}_{run_id}.png"
                try:
                    if fn(run, p):
                        written.append(p)
                        parts += [f"![{kind}]({_rel(p, out)})", ""]
                except Exception as e:  # a plot failing must not lose the tables
                    parts += [f"_{kind} plot failed: {type(e).__name__}: {e}_", ""]
        by_wl: dict[str, list[dict]] = defaultdict(list)
        for r in run["results"]:
            by_wl[r["workload"]["name"]].append(r)
        bars = plots and gpu and len(by_wl) <= BARS_MAX_WORKLOADS
        if plots and gpu and not bars:
            parts += [f"_Per-workload bar charts skipped: {len(by_wl)} workloads in this run, more than "
                      f"{BARS_MAX_WORKLOADS} (a sweep's runs have its heatmaps instead; render a subset of the records "
                      f"for the charts)._", ""]
        for name, recs in by_wl.items():
            shown = sorted((r for r in recs if r["status"] not in _FOLD), key=_sort_key)
            parts += [f"### {name}", "", f"`{_shape(recs[0]['workload'])}` — {recs[0]['workload'].get('source', '')}",
                      ""]
            if shown:
                parts += [_md_table([_row(r) for r in shown], _cols(shown)), ""]
                if bars:
                    parts += _bars_md(run_id, run, name, recs, out, img_dir, written)
            for st in _FOLD:
                by_reason: dict[str, list[str]] = defaultdict(list)
                for r in recs:
                    if r["status"] == st:
                        by_reason[" ".join((r.get("reason") or "").split())[:200]].append(r["impl"]["name"])
                for reason, names in by_reason.items():
                    parts += [f"- {st}: {', '.join(names)} — {reason}"]
            parts += [""]
        if gpu:  # layer 1 vs layer 2 against this run's measurements (docs/roofline.md)
            label = f", re-scored with the model of {scorecard.model_sha()}" if rescore else ""
            try:
                card = scorecard.render(run["results"] + ([run["ceilings"]] if run["ceilings"] else []),
                                        recompute=rescore)
            except Exception as e:  # the scorecard failing must not lose the tables
                card = f"_scorecard failed: {type(e).__name__}: {e}_"
            parts += [f"### Roofline scorecard (run `{run_id}`{label})", "", card, ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n")
    return [out, *written]


# -------------------------------------------------------------------------------------------- plots

_FW_STYLE = {"pallas": ("tab:blue", "o"), "cuda": ("tab:orange", "s"), "torch": ("tab:green", "^"),
             "jax": ("tab:red", "v"), "jax-pallas": ("tab:purple", "D")}


def _timed(run: dict) -> list[dict]:
    return [r for r in run["results"] if r["status"] in records.RAN_STATUSES
            and isinstance(records.get(r, "metrics.time_us_p50"), (int, float))]


def plot_roofline(run: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = []
    for r in _timed(run):
        pred = r.get("prediction") or {}
        b = pred.get(pred.get("basis") or "", {})
        if b.get("ai") and r["metrics"].get("tflops"):
            pts.append((b["ai"], r["metrics"]["tflops"] * 1e12, r["impl"]["framework"]))
    if not pts:
        return False
    meas = (run["ceilings"] or {}).get("measured") or {}
    ds = (run["ceilings"] or {}).get("datasheet") or {}
    bw = meas.get("hbm_read_Bps") or ds.get("hbm_bw_Bps")
    peaks = dict(ds.get("flops", {}))
    peaks.update(meas.get("flops", {}))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ais = [p[0] for p in pts]
    lo, hi = min(ais) / 2, max(ais) * 4
    if bw:
        for prec in ("fp32", "fp16", "fp8"):
            if prec in peaks:
                ridge = peaks[prec] / bw
                xs = [lo, ridge, max(hi, ridge * 2)]
                ax.plot(xs, [min(x * bw, peaks[prec]) for x in xs], "--", lw=1, label=f"roof {prec} "
                        f"({peaks[prec] / 1e12:.0f} TFLOP/s, {bw / 1e12:.2f} TB/s)")
    for fw, (color, marker) in _FW_STYLE.items():
        sel = [(a, f) for a, f, k in pts if k == fw]
        if sel:
            ax.scatter([a for a, _ in sel], [f for _, f in sel], c=color, marker=marker, label=fw, s=28, zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity of the model (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s (model FLOPs / kernel time)")
    env = (run["header"] or {}).get("env", {})
    ax.set_title(f"roofline: {env.get('gpu')} ({len(pts)} implementation x workload points)")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def plot_generations(run: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = list((run["header"] or {}).get("generations") or [])
    if not ids:  # runs recorded before the header carried the order: the live table
        from attn_core import generations as core

        ids = core.ids()
    order = {g: i for i, g in enumerate(ids)}
    by_wl: dict[str, list[dict]] = defaultdict(list)
    for r in _timed(run):
        if r["impl"]["framework"] in ("pallas", "cuda") and r["impl"]["generation"] in order:
            by_wl[r["workload"]["name"]].append(r)
    wls = sorted(by_wl, key=lambda n: -len({r["impl"]["generation"] for r in by_wl[n]}))[:9]
    if not wls:
        return False
    n = len(wls)
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, wls):
        series: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for r in by_wl[name]:
            label = r["impl"]["framework"] + (f":{r['impl']['config']}" if r["impl"]["config"] else "")
            series[label].append((order[r["impl"]["generation"]], r["metrics"]["time_us_p50"]))
        gens = sorted({g for s in series.values() for g, _ in s})
        for label, pts in sorted(series.items()):
            pts.sort()
            ax.plot([gens.index(g) for g, _ in pts], [t for _, t in pts], marker="o", label=label)
        ax.set_xticks(range(len(gens)))
        ax.set_xticklabels([ids[g] for g in gens], rotation=45, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("kernel time p50 (µs)")
        ax.set_title(name, fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
