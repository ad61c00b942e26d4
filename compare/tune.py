"""``python -m compare tune --config tune_<name>``: a grid of one kernel's config knobs, as data, run by compare.

A tune config is a workload config (``[[workload]]`` tables and/or ``include``) plus:

* ``baselines = ["pallas:fa_decode:default", "jax:cudnn"]``: globs over compare's implementations timed beside
  the grid (each must match one);
* ``[[grid]]`` tables, one per sweep: ``generation`` (a Pallas generation), ``base`` (the named config the points
  start from; default the kernel's own default), ``workloads`` (globs; default every workload), and the config
  fields to set: a list value sweeps (cartesian product over the list-valued fields), a scalar is fixed, and
  ``points = [{block_k = 64, num_warps = 4}, ...]`` adds explicit combinations (each joined with the product).

Every point becomes an implementation ``pallas:<gen>:<base>+<field>=<value>,...`` (``impl.overrides`` holds the
fields), checked at load against the kernel's config class (unknown field, bad value: an error naming the file and
the grid entry). The run itself is ``compare run``'s: the same options, clock, agreement, roofline and records
(so ``compare report`` renders a tune run too); each record's ``repro`` is a ``compare tune`` command. After the
run, one line per workload: the base config, the best point and the baselines.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import functools
import itertools
import tomllib
from typing import Any

from . import impls as _impls
from . import tune_table
from .runner import RunOptions, _Run, add_run_options
from .schema import Ctx, Impl, Support
from .workloads import ConfigError, UsageError, Workload, load_config, resolve_config

__all__ = ["GridPoint", "load_tune", "tune_impls", "add_parser", "run"]

_GRID_KEYS = {"generation", "base", "workloads", "points"}


@dataclasses.dataclass(frozen=True)
class GridPoint:
    """One point of a grid: ``config`` is the base config with ``overrides`` set, run on ``workloads`` (globs)."""

    generation: str
    base: str
    overrides: tuple[tuple[str, Any], ...]
    config: Any
    workloads: tuple[str, ...]
    where: str

    @property
    def label(self) -> str:
        return self.base + "+" + ",".join(f"{k}={v}" for k, v in self.overrides) if self.overrides else self.base

    @property
    def name(self) -> str:
        return f"pallas:{self.generation}:{self.label}"


def _points(grid: dict[str, Any], where: str) -> list[dict[str, Any]]:
    fields = {k: v for k, v in grid.items() if k not in _GRID_KEYS}
    sweep = {k: v for k, v in fields.items() if isinstance(v, list)}
    fixed = {k: v for k, v in fields.items() if not isinstance(v, list)}
    explicit = grid.get("points", [{}])
    if not isinstance(explicit, list) or not all(isinstance(p, dict) for p in explicit) or not explicit:
        raise ConfigError(f"{where}: points must be a non-empty list of tables; got {explicit!r}")
    for k, v in sweep.items():
        if not v:
            raise ConfigError(f"{where}: {k} is an empty list (sweeps nothing)")
    out = []
    for combo in itertools.product(*sweep.values()):
        for p in explicit:
            clash = set(p) & (set(sweep) | set(fixed))
            if clash:
                raise ConfigError(f"{where}: points set {sorted(clash)}, which the grid also sets")
            out.append({**fixed, **dict(zip(sweep, combo)), **p})
    return out


def load_tune(path_or_name) -> tuple[list[Workload], list[GridPoint], list[str]]:
    """``(workloads, points, baseline globs)`` of a tune config; ConfigError names the file and the entry."""
    from pallas_attn import registry

    path = resolve_config(path_or_name)
    workloads = load_config(path)
    data = tomllib.loads(path.read_text())
    grids = data.get("grid")
    if not isinstance(grids, list) or not grids or not all(isinstance(g, dict) for g in grids):
        raise ConfigError(f"{path}: a tune config needs [[grid]] tables (compare run runs a config without a grid)")
    baselines = data.get("baselines", [])
    if not isinstance(baselines, list) or not all(isinstance(b, str) for b in baselines):
        raise ConfigError(f"{path}: baselines must be a list of implementation globs; got {baselines!r}")
    names = [w.name for w in workloads]
    points: list[GridPoint] = []
    for i, g in enumerate(grids):
        where = f"{path.name}: grid[{i}]"
        gen = g.get("generation")
        built = [r.generation for r in registry.rows()]
        if not isinstance(gen, str) or gen not in built:
            known = ", ".join(built)
            raise ConfigError(f"{where}: generation must name a generation built in Pallas ({known}); got {gen!r}")
        kern, named = registry.kernel(gen), registry.configs(gen)
        base = g.get("base", kern.default_config_name() if kern.default_config_name() in named else next(iter(named)))
        if base not in named:
            raise ConfigError(f"{where}: base must be one of {gen}'s configs {sorted(named)}; got {base!r}")
        globs = g.get("workloads", ["*"])
        if not isinstance(globs, list) or not all(isinstance(x, str) for x in globs):
            raise ConfigError(f"{where}: workloads must be a list of globs; got {globs!r}")
        for glob in globs:
            if not any(fnmatch.fnmatchcase(n, glob) for n in names):
                raise ConfigError(f"{where}: workloads glob {glob!r} matches no workload of {path.name}")
        allowed = {f.name for f in dataclasses.fields(kern.config_cls)}
        for ov in _points(g, where):
            unknown = set(ov) - allowed
            if unknown:
                raise ConfigError(f"{where}: {sorted(unknown)} are not fields of {kern.config_cls.__name__}; "
                                  f"allowed: {sorted(allowed)}")
            try:
                cfg = dataclasses.replace(named[base], **ov)
            except (TypeError, ValueError) as e:
                raise ConfigError(f"{where}: point {ov}: {e}") from None
            points.append(GridPoint(gen, base, tuple(ov.items()), cfg, tuple(globs), where))
    seen: dict[str, GridPoint] = {}
    for p in points:
        seen.setdefault(p.name, p)  # the same point twice (two grids overlap) runs once
    return workloads, list(seen.values()), list(baselines)


def _on_workloads(globs: tuple[str, ...], inner, w, ctx: Ctx) -> Support:
    if not any(fnmatch.fnmatchcase(w.name, g) for g in globs):
        return Support(False, "", "n/a")  # this grid does not sweep this workload
    return inner(w, ctx)


def tune_impls(points: list[GridPoint], baselines: list[str], known: list[Impl] | None = None) -> list[Impl]:
    """The baselines (compare's own implementations matching the globs, in compare's order), then one
    implementation per grid point, built from the same Pallas hooks as ``pallas:<gen>:<config>``."""
    from attn_core import generations as core
    from pallas_attn import registry

    known = _impls.all_impls() if known is None else known
    for glob in baselines:
        if not any(fnmatch.fnmatchcase(i.name, glob) for i in known):
            raise UsageError(f"baselines entry {glob!r} matches no implementation")
    out = [i for i in known if any(fnmatch.fnmatchcase(i.name, g) for g in baselines)]
    have = {i.name for i in out}
    for p in points:
        if p.name in have:
            continue
        have.add(p.name)
        kern = registry.kernel(p.generation)
        kind = "frontier" if core.get(p.generation).frontier else "mirror"
        ov = ", ".join(f"{k}={v}" for k, v in p.overrides)
        # fa_prefill's points take the model features its named configs take (window, soft-cap, sinks, packed)
        prefill = p.generation == _impls._FA_PREFILL
        prepare = (functools.partial(_impls._fa_prefill_prepare, p.config) if prefill else
                   functools.partial(_impls._pallas_prepare, p.generation, p.config))
        out.append(Impl(
            p.name, "pallas", p.generation, p.label, kind, kern.lowering,
            f"tuning point: {p.generation} config {p.base!r}" + (f" with {ov}" if ov else ""),
            functools.partial(_on_workloads, p.workloads, functools.partial(_impls._pallas_supports, p.generation,
                                                                            p.config)),
            prepare,
            roofline_fn=functools.partial(_impls._pallas_roofline, p.generation, p.config),
            plan_fn=functools.partial(_impls._pallas_plan, p.generation, p.config),
            overrides=dict(p.overrides), **({"features": _impls._PREFILL_FEATURES} if prefill else {})))
    return out


class _TuneRun(_Run):
    command = "tune"

    def __init__(self, opts: RunOptions, points: list[GridPoint], workloads, impls, baselines):
        self.points = points
        grids = [{"name": p.name, "generation": p.generation, "base": p.base, "overrides": dict(p.overrides),
                  "workloads": list(p.workloads), "source": p.where} for p in points]
        super().__init__(opts, workloads=workloads, impls=impls,
                         header_extra={"tune": {"points": grids, "baselines": baselines}})

    def summarize(self, recs: list[dict], console) -> None:
        for line in summary_lines(recs, self.points):
            console.print(line, highlight=False, overflow="ellipsis", no_wrap=True)


def summary_lines(recs: list[dict], points: list[GridPoint]) -> list[str]:
    """Per workload: the base config, the best grid point (and its ratio to the base), the baselines."""
    point_names = {p.name for p in points}
    bases = {f"pallas:{p.generation}:{p.base}" for p in points}
    by_wl: dict[str, list[dict]] = {}
    for r in recs:
        by_wl.setdefault(r["workload"]["name"], []).append(r)
    lines = ["", "tune summary (kernel time p50, µs; best = the fastest grid point that agreed with the oracle):"]
    for wl, rs in by_wl.items():
        timed = {r["impl"]["name"]: r["metrics"]["time_us_p50"] for r in rs
                 if r["status"] == "ok" and isinstance(r["metrics"].get("time_us_p50"), (int, float))}
        pts = [r for r in rs if r["impl"]["name"] in point_names]
        ran = [r for r in pts if r["status"] == "ok"]
        if not timed:
            lines.append(f"  {wl}: no kernel times ({len(ran)} of {len(pts)} points agreed with the oracle"
                         + (", CPU interpret mode" if ran else "") + ")")
            continue
        best = min((n for n in timed if n in point_names), key=timed.__getitem__, default=None)
        base = next((n for n in timed if n in bases), None)
        parts = []
        if base:
            parts.append(f"base {base.split(':', 2)[2]} {timed[base]:.1f}")
        if best:
            parts.append(f"best {best.split(':', 2)[2]} {timed[best]:.1f}"
                         + (f" ({timed[best] / timed[base]:.3f}x base)" if base else ""))
        parts += [f"{n} {t:.1f}" for n, t in timed.items() if n not in point_names and n != base]
        lines.append(f"  {wl}: " + "; ".join(parts) + f"  [{len(ran)}/{len(pts)} points ok]")
    return lines


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="sweep a kernel's config knobs (a grid in a tune config) through compare run",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help="tune config name (configs/tune_<name>.toml) or path")
    add_run_options(p)
    tune_table.add_arguments(p)
    p.set_defaults(func=run_cli)


def run_cli(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.table is None):
        raise UsageError("tune takes one of --config (run a grid) or --table RECORDS... (make the heuristic tables)")
    if args.table is not None:
        return tune_table.run_table(args)
    return run(RunOptions.from_args(args))


def run(opts: RunOptions) -> int:
    workloads, points, baselines = load_tune(opts.config)
    impls = tune_impls(points, baselines)
    return _TuneRun(opts, points, workloads, impls, baselines).main()
