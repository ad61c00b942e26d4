"""One horizontal bar chart per workload of a GPU run (``img/bars_<run>_<workload>.png``), for ``compare report``.

One bar per implementation with a timed ``ok`` record (kernel time p50 in µs, whiskers p10–p90), fastest at the
top; ours (``impl.kind`` other than ``"peer"``: the Pallas and CUDA mirrors, frontier configs and ``pallas:auto``)
in one colour, the peers in another; the workload's layer-1 roofline floor as a vertical line. ``bar_data`` is the
chart's data (pure, tested), ``plot_bars`` draws it, ``bars_filename`` names the file.

The floor is the workload's: the layer-1 prediction a **peer** record carries (the model of the workload at its
own dtype, fused: what ``compare run`` prints as the workload's floor), read from ``prediction[basis].floor_us``
of any record of the workload, refused ones included (they carry the prediction too). Without a peer record the
smallest floor any record carries is used (the loosest of the implementations' own models); with none, no line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import records

__all__ = ["Bar", "BarChart", "bar_data", "bars_filename", "is_ours", "plot_bars", "workload_floor"]

OURS_COLOR, PEER_COLOR, FLOOR_COLOR = "tab:blue", "tab:gray", "tab:red"
LOG_SPREAD = 30.0  # slowest / fastest (floor included) above which the time axis is logarithmic


@dataclasses.dataclass(frozen=True)
class Bar:
    name: str
    us: float  # kernel time p50
    ours: bool
    p10: float | None = None
    p90: float | None = None


@dataclasses.dataclass(frozen=True)
class Floor:
    us: float
    limiter: str | None  # HBM | MMA | MUFU ... (the layer-1 bound that sets it)
    basis: str | None  # measured | datasheet: which ceilings it was predicted with
    source: str  # "peer model" | "smallest implementation floor"


@dataclasses.dataclass(frozen=True)
class BarChart:
    workload: str
    gpu: str | None
    bars: tuple[Bar, ...]  # fastest first
    floor: Floor | None

    @property
    def floor_us(self) -> float | None:
        return None if self.floor is None else self.floor.us


def _num(x: Any) -> float | None:
    if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0:
        return float(x)
    return None


def is_ours(r: dict) -> bool:
    """Not a peer: ``impl.kind`` (mirror, frontier, auto) when the record has it, else the ``pallas:`` / ``cuda:``
    name prefix (``jax-pallas:`` is a peer)."""
    impl = r.get("impl") or {}
    kind = impl.get("kind")
    if kind is not None:
        return kind != "peer"
    return str(impl.get("name", "")).startswith(("pallas:", "cuda:"))


def _record_floor(r: dict) -> tuple[float, str | None, str | None] | None:
    pred = r.get("prediction") or {}
    basis = pred.get("basis")
    b = pred.get(basis) if basis else None
    us = _num((b or {}).get("floor_us"))
    if us is not None:
        return us, (b or {}).get("limiter"), basis
    us = _num(records.get(r, "metrics.floor_us"))  # the timed copy the runner keeps beside the rates
    return (us, records.get(r, "metrics.limiter"), basis) if us is not None else None


def workload_floor(recs: Iterable[dict]) -> Floor | None:
    """The workload's layer-1 floor: a peer record's prediction, else the smallest any record carries, else None."""
    recs = list(recs)
    for r in recs:
        if not is_ours(r) and (f := _record_floor(r)) is not None:
            return Floor(f[0], f[1], f[2], "peer model")
    floors = [f for r in recs if (f := _record_floor(r)) is not None]
    if not floors:
        return None
    f = min(floors, key=lambda x: x[0])
    return Floor(f[0], f[1], f[2], "smallest implementation floor")


def bar_data(workload: str, recs: Iterable[dict], gpu: str | None = None) -> BarChart:
    """The chart of one workload: a bar per timed ``ok`` record (fastest first, ties by name) and the floor."""
    recs = list(recs)
    bars = []
    for r in recs:
        t = _num(records.get(r, "metrics.time_us_p50"))
        if r.get("status") != "ok" or t is None:
            continue
        p10, p90 = _num(records.get(r, "metrics.time_us_p10")), _num(records.get(r, "metrics.time_us_p90"))
        bars.append(Bar(r["impl"]["name"], t, is_ours(r), p10, p90))
    bars.sort(key=lambda b: (b.us, b.name))
    return BarChart(workload, gpu, tuple(bars), workload_floor(recs))


def bars_filename(run_id: str, workload: str) -> str:
    """``bars_<run>_<workload>.png`` with every character outside ``[A-Za-z0-9._-]`` replaced; a name that had
    to change gets a short hash of the original so two workloads never share a file."""
    def safe(s: str) -> str:
        t = re.sub(r"[^A-Za-z0-9._-]+", "-", s).strip("-.") or "x"
        return t if t == s else f"{t}-{hashlib.sha1(s.encode()).hexdigest()[:6]}"

    return f"bars_{safe(run_id)}_{safe(workload)}.png"


def _us(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def plot_bars(chart: BarChart, path: Path) -> bool:
    """Draw ``chart`` into ``path`` (False, nothing written, when it has no bar). Raises ImportError without
    matplotlib."""
    if not chart.bars:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = len(chart.bars)
    fig, ax = plt.subplots(figsize=(8, max(2.4, 0.38 * n + 1.4)))
    ys = list(range(n))
    colors = [OURS_COLOR if b.ours else PEER_COLOR for b in chart.bars]
    xerr = None
    if all(b.p10 is not None and b.p90 is not None for b in chart.bars):
        xerr = [[max(0.0, b.us - b.p10) for b in chart.bars], [max(0.0, b.p90 - b.us) for b in chart.bars]]
    ax.barh(ys, [b.us for b in chart.bars], color=colors, xerr=xerr, error_kw={"lw": 0.8, "capsize": 2})
    ax.set_yticks(ys)
    ax.set_yticklabels([b.name for b in chart.bars], fontsize=8)
    ax.invert_yaxis()  # fastest at the top
    lo, top = min(b.us for b in chart.bars), max(b.p90 or b.us for b in chart.bars)
    for y, b in zip(ys, chart.bars):
        ax.text(b.p90 or b.us, y, f"  {_us(b.us)}", va="center", ha="left", fontsize=7)
    handles = [Patch(color=OURS_COLOR, label="ours (pallas / cuda)"), Patch(color=PEER_COLOR, label="peer")]
    if chart.floor is not None:
        f = chart.floor
        detail = ", ".join(x for x in (f"{f.limiter}-bound" if f.limiter else None,
                                       f"{f.basis} ceilings" if f.basis else None) if x)
        label = f"layer-1 floor {_us(f.us)} µs" + (f" ({detail})" if detail else "")
        handles.append(ax.axvline(f.us, color=FLOOR_COLOR, ls="--", lw=1.2, label=label))
        lo, top = min(lo, f.us), max(top, f.us)
    log = top / lo > LOG_SPREAD  # one slow outlier would flatten every other bar on a linear axis
    if log:
        ax.set_xscale("log")
        ax.set_xlim(lo / 2, top * 2.5)
    else:
        ax.set_xlim(0, top * 1.18)
    ax.set_xlabel("kernel time p50 (µs" + (", log scale" if log else "") + ")"
                  + (", whiskers p10–p90" if xerr is not None else ""))
    ax.set_ylabel("implementation")
    ax.set_title(f"{chart.workload} on {chart.gpu or 'unknown GPU'}", fontsize=10)
    ax.grid(True, axis="x", which="both" if log else "major", alpha=0.3)
    fig.tight_layout()
    fig.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles),
               frameon=False)  # under the figure: savefig's tight box takes it in
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits under the axes
    plt.close(fig)
    return True
