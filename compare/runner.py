"""``python -m compare run``: every implementation on every workload of a config, one JSONL record each.

Order of a run (docs/compare.md has the details):
  1. environment, then the device's ceilings measured in this process (``ceilings.py``), then a clock check
     per clock (a 1 GiB copy timed under CUPTI against the copy ceiling timed with CUDA events);
  2. per workload, plan: for each implementation that applies, its roofline prediction, launch plan
     (``impl.plan``, from its declaration) and layer 2, and its refusals (unsupported, too large for CPU
     interpret mode, predicted over --budget-s), all before anything of the workload runs;
  3. per pair, execute: inputs once per workload (``interop.make_inputs``), the float64 oracle once on a
     subset (``accuracy``), then prepare (layouts, untimed) -> first call (compile) -> agreement -> warm-up
     -> kernel timing (CUPTI, cold L2) -> end-to-end timing;
  4. per workload, summarize: speed-ups against the best peer and the twin, twin-vs-twin agreement; records
     written, the table printed.
The train family (``family = "train"``, ``compare.train``): the timed call is one training step returning
``(out, (dq, dk, dv), loss)``; the output is checked as a prefill's, and dq / dk / dv against the float64 gradient
oracle on one batch row and KV head group (``agreement.grads``; over the tolerance is ``wrong``); FLOPs count the
backward (``compare.roofline``: 3.5x the forward); layer 2 does not model it (``prediction.layer2.error`` says so);
a torch step is timed with CUDA events (``Prepared.clock == "events"``, noted in ``metrics.clock_notes``).
A failure is a record (``failed``/``oom`` with the exception), never the end of the run. On a machine
without a GPU the Pallas generations run in interpret mode at shapes small enough (``--cpu-max-flops``)
and only agreement is reported; CPU timings are labelled ``cpu_interpret_us_*`` and never sit in
``time_us_*``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import gc
import math
import os
import re
import shlex
import statistics
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

from . import accuracy, ceilings, hardware, interop, lanes, layer2, records, roofline, timing
from .impls import all_impls
from .record import PairPlan, Refusal, ResultRecord, says_out_of_memory
from .schema import Ctx, Impl, Support
from .workloads import CPU_ONLY, UsageError, Workload, config_budget_s, ensure_writable, load_config

DEFAULT_BUDGET_S = 3.0  # seconds of calls one record may take (--budget-s; a config may set its own)

__all__ = ["add_parser", "run", "RunOptions", "detect_ctx", "parse_only"]


# ---------------------------------------------------------------------------------------------- CLI


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run every implementation on a config's workloads; write JSONL records",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="default", help="config name (configs/<name>.toml) or path; default: default")
    add_run_options(p)
    p.add_argument("--jobs", type=int, default=1, metavar="K",
                   help="split the run over K processes on the one GPU (lanes): each takes the next workload as it "
                        "frees up; their compiles, oracles and first calls overlap, while every timing window runs "
                        "with the GPU to itself (an exclusive lock between the lanes); each lane gets 0.9/K of the "
                        "GPU's memory, and a workload that runs out of it runs again alone afterwards; the records "
                        "merge into one run in the plan's order (docs/compare.md, \"Lanes\"); default 1")
    # one lane of a --jobs run (set by the parent, not by hand): compare/lanes.py
    p.add_argument("--lane", default=None, help=argparse.SUPPRESS)
    p.add_argument("--lane-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--lane-pass", default="main", help=argparse.SUPPRESS)
    p.add_argument("--lane-names", default=None, help=argparse.SUPPRESS)
    p.add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run_cli)


def add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a run (selection, output, timing, budgets, clock), shared by ``run`` and ``tune``."""
    p.add_argument("--only", action="append", default=[], metavar="WORKLOAD[:IMPL]",
                   help="glob filter, repeatable (OR): 'ref_prefill_*', '*:torch:*', 'smoke_*:pallas:v4_fused:*'. "
                        "The part before the first ':' matches the workload name, the rest the impl name. "
                        "A filter that matches nothing is an error")
    p.add_argument("--impl", action="append", default=[], metavar="GLOB",
                   help="implementation filter, repeatable (OR), on the impl name alone: 'pallas:fa_decode:*', "
                        "'torch:*'. Combines (AND) with --only. A glob that matches no implementation is an error")
    p.add_argument("--out", default=None, help="output directory (records.jsonl inside) or a .jsonl path; "
                                               "default results/<run-id>/. An existing non-empty records file is "
                                               "never overwritten: give a new --out, or --append")
    p.add_argument("--append", action="store_true",
                   help="add this run (its own header and run id) to the end of an existing --out records file")
    p.add_argument("--reps", type=int, default=20, help="timed repetitions per record (cold L2 each); default 20")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls after the first (compile) call; default 3")
    p.add_argument("--rounds", type=int, default=1,
                   help="kernel-clock samples in this many rounds, round-robin over a workload's implementations "
                        "(each round takes about reps / rounds samples of each), so every implementation's samples "
                        "span the same clock and power states; default 1 (each implementation's reps back to back). "
                        "Keeps every prepared implementation of a workload alive until its last round")
    p.add_argument("--e2e-reps", type=int, default=10,
                   help="synchronized calls for the e2e latency (metrics.e2e_synced_us); default 10")
    p.add_argument("--e2e-calls", type=int, default=20,
                   help="calls issued back to back, one sync, per pipelined e2e sample (metrics.e2e_pipelined_us, "
                        "median of 3 samples); default 20")
    p.add_argument("--look-ahead", action="store_true",
                   help="with compile workers: once a workload's pairs have their agreement and host-wall figures, "
                        "make the next workload's inputs and start compiling its Pallas programs, then take this "
                        "workload's kernel-clock samples while they compile (the compiles run on the CPU; a stray "
                        "kernel in a timing window fails that record's timing, never a silent number). Off by "
                        "default until measured on a GPU (docs/compare.md)")
    p.add_argument("--run-up-hold", choices=("each", "one"), default="each",
                   help="--jobs lanes: how a lane holds the shared GPU lock over a workload's run-up (inputs, "
                        "oracle copies, first calls, agreement, warm-ups). each: a hold per step (about ten a "
                        "workload, each of which may wait out another lane's timing window); one: one hold from the "
                        "inputs to the last warm-up, given up only for the oracle's host arithmetic and compile "
                        "waits. Default each, until measured on a GPU (docs/sweep.md, session 30)")
    p.add_argument("--e2e-budget-s", type=float, default=0.5,
                   help="host seconds the end-to-end figures of one record may take (measured one call x calls): "
                        "above it, fewer synced calls (>= 3) and pipelined calls per sample (>= 2), marked "
                        "metrics.e2e_reduced_for_budget; default 0.5")
    p.add_argument("--budget-s", type=float, default=None,
                   help="per-record time budget: predicted or measured time for all calls above it -> fewer reps "
                        "(>= 3) or status 'skipped' with reason 'over time budget'; default: the config's top-level "
                        f"budget_s, else {DEFAULT_BUDGET_S:g}")
    p.add_argument("--compile-workers", type=int, default=8,
                   help="GPU runs: compile a workload's Pallas programs on this many threads while its inputs, oracle "
                        "and first calls run; every compile finishes before the workload's first timed repetition, so "
                        "no timing overlaps one. 0: each program compiles at its first call, one after another; "
                        "default 8")
    p.add_argument("--max-run-s", type=float, default=None,
                   help="whole-run budget: once elapsed, remaining records are 'skipped' (reason says so)")
    p.add_argument("--clock", choices=("cupti", "kineto", "events"), default="cupti",
                   help="cupti: JAX profiler for JAX, torch.profiler for torch (both CUPTI); kineto: torch.profiler "
                        "for both; events: CUDA events / host wall (labelled). A record timed by a fallback clock is "
                        "marked (metrics.clock_fallback) and the run exits 3")
    p.add_argument("--allow-clock-fallback", action="store_true",
                   help="exit 0 even when some records were timed by a fallback clock (they stay marked)")
    p.add_argument("--arch", default="h100,h200",
                   help="hardware rows (comma-separated) for datasheet predictions when no GPU is detected; "
                        "the first fills prediction.datasheet, all go to prediction.by_arch; default h100,h200")
    p.add_argument("--cpu-max-flops", type=float, default=1e8,
                   help="CPU interpret mode runs only workloads under this many FLOPs; default 1e8")
    p.add_argument("--no-ceilings", action="store_true", help="skip measuring ceilings (datasheet values only)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or tables")


def run_cli(args: argparse.Namespace) -> int:
    return run(RunOptions.from_args(args))


class RunOptions(types.SimpleNamespace):
    impl: tuple[str, ...] = ()  # defaults for callers that build RunOptions by hand
    append: bool = False
    rounds: int = 1
    e2e_calls: int = 20
    allow_clock_fallback: bool = False
    compile_workers: int = 0
    look_ahead: bool = False
    e2e_budget_s: float | None = None
    run_up_hold: str = "each"
    jobs: int = 1
    lane: str | None = None
    lane_dir: str | None = None
    lane_pass: str = "main"
    lane_names: str | None = None
    run_id: str | None = None

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> RunOptions:
        if a.budget_s is not None and not a.budget_s > 0:
            raise UsageError(f"--budget-s must be > 0; got {a.budget_s}")
        if a.reps < 1 or a.warmup < 0 or a.e2e_reps < 1 or a.e2e_calls < 1:
            raise UsageError(f"--reps >= 1, --warmup >= 0, --e2e-reps >= 1, --e2e-calls >= 1; got {a.reps}, "
                             f"{a.warmup}, {a.e2e_reps}, {a.e2e_calls}")
        if not a.e2e_budget_s > 0:
            raise UsageError(f"--e2e-budget-s must be > 0; got {a.e2e_budget_s}")
        if a.compile_workers < 0:
            raise UsageError(f"--compile-workers must be >= 0; got {a.compile_workers}")
        if not 1 <= a.rounds <= a.reps:
            raise UsageError(f"--rounds must be in [1, --reps]; got {a.rounds} (reps {a.reps})")
        jobs = getattr(a, "jobs", 1)
        if jobs < 1:
            raise UsageError(f"--jobs must be >= 1; got {jobs}")
        lane = getattr(a, "lane", None)
        if lane is not None:
            from .lanes import parse_lane

            parse_lane(lane)
            if not getattr(a, "lane_dir", None) or not getattr(a, "run_id", None):
                raise UsageError("--lane is set by --jobs for its lanes, with --lane-dir and --run-id")
        lane_opts = {k: getattr(a, k, None) for k in ("lane", "lane_dir", "lane_names", "run_id")}
        return cls(jobs=jobs, lane_pass=getattr(a, "lane_pass", "main"), **lane_opts,
                   config=a.config, only=list(a.only), impl=list(a.impl), append=a.append, out=a.out, reps=a.reps,
                   warmup=a.warmup, rounds=a.rounds, e2e_reps=a.e2e_reps, e2e_calls=a.e2e_calls, budget_s=a.budget_s,
                   max_run_s=a.max_run_s, compile_workers=a.compile_workers, look_ahead=a.look_ahead,
                   e2e_budget_s=a.e2e_budget_s, run_up_hold=getattr(a, "run_up_hold", "each"),
                   clock=a.clock,
                   allow_clock_fallback=a.allow_clock_fallback, arch=a.arch,
                   cpu_max_flops=a.cpu_max_flops, no_ceilings=a.no_ceilings, quiet=a.quiet,
                   argv=["python", "-m", __package__ or "compare", *sys.argv[1:]] if sys.argv and sys.argv[0] else [])

    def repro_flags(self) -> list[str]:
        """Every option that differs from its default, as flags (what a record's ``repro`` must repeat;
        selection, output and display flags excluded)."""
        import argparse as _ap

        sub = _ap.ArgumentParser().add_subparsers()
        add_parser(sub)
        parser = sub.choices["run"]
        flags = []
        for act in parser._actions:
            dest = act.dest
            if dest in _NOT_REPRO or not act.option_strings or not hasattr(self, dest):
                continue
            val = getattr(self, dest)
            if val == act.default:
                continue
            if isinstance(act, _ap._StoreTrueAction):
                if val:
                    flags.append(act.option_strings[0])
                continue
            flags += [act.option_strings[0], f"{val:g}" if isinstance(val, float) else str(val)]
        return flags


# not repeated in a record's repro: what was selected and where it went (repro selects one record itself),
# how it was displayed, and whether a clock fallback fails the exit code
_NOT_REPRO = frozenset({"help", "config", "only", "impl", "out", "append", "quiet", "allow_clock_fallback",
                        "compile_workers", "look_ahead",  # where a program compiles changes no measurement
                        "jobs", "lane", "lane_dir", "lane_pass", "lane_names", "run_id"})  # nor which process


def parse_only(specs: list[str], names: list[str] | None = None) -> list[tuple[str, str]]:
    """``["wl_glob:impl_glob", "wl_glob"]`` -> ``[(wl_glob, impl_glob)]``; split at the first ':'. With the workload
    ``names``, a workload part may itself hold ':' (the sweep's ``gpt-oss-20b:local`` models): where the part before
    the first ':' matches no workload, the split moves to the longest left side that does (the whole spec first)."""
    out = []
    for s in specs:
        wl, _, impl = s.partition(":")
        if names is not None and wl and not any(fnmatch.fnmatchcase(n, wl) for n in names):
            for i in [len(s)] + [i for i in range(len(s) - 1, len(wl), -1) if s[i] == ":"]:
                if any(fnmatch.fnmatchcase(n, s[:i]) for n in names):
                    wl, impl = s[:i], s[i + 1:]
                    break
        out.append((wl or "*", impl or "*"))
    return out


def _selected(only: list[tuple[str, str]], w: Workload, impl: Impl) -> bool:
    if not only:
        return True
    return any(fnmatch.fnmatchcase(w.name, a) and fnmatch.fnmatchcase(impl.name, b) for a, b in only)


def _impl_selected(globs: list[str], impl: Impl) -> bool:
    return not globs or any(fnmatch.fnmatchcase(impl.name, g) for g in globs)


def _name_examples(impls: list[Impl]) -> str:
    seen: dict[str, str] = {}
    for i in impls:
        seen.setdefault(i.name.split(":", 1)[0], i.name)
    return ", ".join(seen.values())


def check_workload_lists(workloads: list[Workload], impls: list[Impl]) -> None:
    """Every entry of a workload's ``generations``/``peers`` list must match some implementation compare
    knows (a misspelt generation would otherwise silently run nothing); ConfigError names the entry."""
    from .workloads import ConfigError

    gens = {i.generation for i in impls if i.generation}
    peers = [i for i in impls if i.kind == "peer"]
    for w in workloads:
        for g in w.generations or ():
            if g not in gens and not any(fnmatch.fnmatchcase(i.name, g) for i in impls):
                raise ConfigError(f"{w.source}: generations entry {g!r} matches no implementation; known "
                                  f"generations: {', '.join(sorted(gens))} (or an impl-name glob)")
        for p in w.peers or ():
            if not any(fnmatch.fnmatchcase(i.name, p) or fnmatch.fnmatchcase(i.name.split(":", 1)[1], p)
                       for i in peers):
                raise ConfigError(f"{w.source}: peers entry {p!r} matches no peer; known peers: "
                                  f"{', '.join(i.name for i in peers)}")


def make_plan(workloads: list[Workload], impls: list[Impl], only_specs: list[str], impl_globs: list[str],
              config: str = "") -> list[tuple[Workload, list[Impl]]]:
    """The (workload, implementations) pairs a run visits; UsageError names any filter that matches nothing."""
    for g in impl_globs:
        if not any(fnmatch.fnmatchcase(i.name, g) for i in impls):
            raise UsageError(f"--impl {g!r} matches no implementation (names look like {_name_examples(impls)})")
    only = parse_only(only_specs, [w.name for w in workloads])
    for spec, (a, b) in zip(only_specs, only):
        wls = [w for w in workloads if fnmatch.fnmatchcase(w.name, a)]
        if not wls:
            hint = ""
            if any(fnmatch.fnmatchcase(i.name, spec) for i in impls):
                hint = f"; {spec!r} names implementations: use --impl {shlex.quote(spec)}"
            raise UsageError(f"--only {spec!r}: workload glob {a!r} matches no workload of config {config!r}{hint}")
        if not any(fnmatch.fnmatchcase(i.name, b) for i in impls):
            raise UsageError(f"--only {spec!r}: impl glob {b!r} matches no implementation "
                             f"(names look like {_name_examples(impls)})")
        if not any(fnmatch.fnmatchcase(i.name, b) and _impl_selected(impl_globs, i) and _allowed_by_workload(w, i)
                   for w in wls for i in impls):
            raise UsageError(f"--only {spec!r} matches no (workload, implementation) pair that the workloads' "
                             "generations/peers lists" + (" and --impl" if impl_globs else "") + " allow")
    plan = [(w, [i for i in impls if _selected(only, w, i) and _impl_selected(impl_globs, i)
                 and _allowed_by_workload(w, i)]) for w in workloads]
    plan = [(w, lst) for w, lst in plan if lst]
    if not plan:
        raise UsageError("the selection (" + " ".join([f"--only {s!r}" for s in only_specs]
                                                      + [f"--impl {g!r}" for g in impl_globs])
                         + f") matches no (workload, implementation) pair of config {config!r}")
    return plan


def _allowed_by_workload(w: Workload, impl: Impl) -> bool:
    """A workload's own ``generations``/``peers`` lists restrict what runs on it (config choice, no record);
    a workload split over several devices is run by multi-device implementations only."""
    if w.devices > 1 and not impl.multi_device:
        return False
    if w.family not in impl.families:  # e.g. the train-only pallas:dropin:* rows on a forward workload
        return False
    if impl.kind == "auto":  # pallas:auto runs where a workload lists it (the sweep's workloads do)
        return w.generations is not None and any(fnmatch.fnmatchcase(impl.name, g) for g in w.generations)
    if impl.kind == "peer":
        if w.peers is None:
            return True
        short = impl.name.split(":", 1)[1]
        return any(fnmatch.fnmatchcase(impl.name, p) or fnmatch.fnmatchcase(short, p) for p in w.peers)
    if w.generations is None or impl.generation in w.generations:
        return True
    return any(fnmatch.fnmatchcase(impl.name, g) for g in w.generations)  # e.g. "pallas:fa_decode_cp:*"


# ------------------------------------------------------------------------------------------ context


def detect_ctx() -> Ctx:
    from pallas_attn import _compat

    jax_gpu = _compat.has_gpu()
    hopper = _compat.gpu_compute_capability().split(".")[0] == "9"
    return Ctx(jax_gpu=jax_gpu, torch_cuda=interop.torch_cuda_available(), hopper=hopper, interpret=not jax_gpu)


def _l2_bytes(hw: hardware.Hardware | None) -> int | None:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).L2_cache_size)
    except Exception:  # fall back to the hardware table's L2
        pass
    return int(hw.l2_mb * 2**20) if hw else None


def _slug(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-")[:40] or "device"


# ------------------------------------------------------------------------------------------ the run


class _Run:
    """One ``compare run`` (``compare tune`` subclasses it): selection when built, then ``main``: header,
    ceilings, clock check, and per workload plan (``plan_workload``) -> execute (``run_one``/``execute``, one
    pair -> one record) -> summarize (``summarize_workload``, the table); docs/compare.md, "The runner's
    structure"."""

    command = "run"  # the subcommand a record's repro repeats

    def __init__(self, opts: RunOptions, *, workloads: list[Workload] | None = None, impls: list[Impl] | None = None,
                 header_extra: dict[str, Any] | None = None):
        self.opts = opts
        self.t_start = time.perf_counter()
        self.header_extra = dict(header_extra or {})
        # what the user asked for is resolved first: a mistake is one UsageError line, before anything is written
        self.workloads = load_config(opts.config) if workloads is None else workloads
        # the per-record budget: --budget-s, else the config's own (a config of multi-second training steps says so),
        # else the default; the header records the one in force
        explicit = getattr(opts, "budget_s", None)
        self.budget_s = float(explicit if explicit is not None else config_budget_s(opts.config) or DEFAULT_BUDGET_S)
        self.impls = all_impls() if impls is None else impls
        check_workload_lists(self.workloads, self.impls)
        self.plan = make_plan(self.workloads, self.impls, list(opts.only), list(opts.impl), str(opts.config))
        archs = []
        for a in str(opts.arch).split(","):
            if a.strip():
                try:
                    archs.append(hardware.get(a.strip()))
                except ValueError as e:
                    raise UsageError(f"--arch: {e}") from None
        self.ctx = detect_ctx()
        # a config's cpu_include workloads (the interpret-mode checks) are left out of a GPU run's plan, unless the
        # run names what it wants with --only (a workload asked for by name runs)
        self.cpu_only_left_out = ([w.name for w, _ in self.plan if CPU_ONLY in w.tags]
                                  if self.ctx.jax_gpu and not opts.only else [])
        if self.cpu_only_left_out:
            self.plan = [(w, lst) for w, lst in self.plan if CPU_ONLY not in w.tags]
        self.env = records.collect_env()
        self.gpu = self.ctx.jax_gpu
        stamp = time.strftime("%Y%m%dT%H%M%S")
        self.run_id = f"{stamp}_{_slug(self.env['gpu'] or 'cpu-interpret')}"
        # one lane of a --jobs run (compare/lanes.py): the parent's run id, the lanes' GPU lock, its share of memory
        self.lane = None
        self.lock = lanes.NoLock()
        if getattr(opts, "lane", None):
            self.lane = lanes.parse_lane(opts.lane)
            self.lane_dir = Path(opts.lane_dir)
            self.run_id = opts.run_id
            self.lock = lanes.GpuLock(self.lane_dir / "gpu.lock")
            lanes.cap_torch_memory()
            if getattr(opts, "lane_names", None):
                import json

                keep = set(json.loads(Path(opts.lane_names).read_text()))
                self.plan = [(w, lst) for w, lst in self.plan if w.name in keep]
        out = Path(opts.out) if opts.out else Path("results") / self.run_id
        self.path = out if out.suffix == ".jsonl" else out / "records.jsonl"
        self._open_out()
        self.hw_ds = hardware.detect(self.env["gpu"]) if self.env["gpu"] else None
        self.hw_pred_archs = [] if self.gpu else archs
        self.hw_pred_only = self.hw_pred_archs[0] if self.hw_pred_archs else None
        self.hw = self.hw_ds
        self.ceil: dict[str, Any] | None = None
        self.flush_bytes = timing.default_flush_bytes(_l2_bytes(self.hw_ds))
        self.config_path = str(opts.config)
        self.clock_fallbacks = 0  # records timed by a clock other than the one requested

    def _open_out(self) -> None:
        """Never lose records: an existing non-empty records file is refused unless --append, which adds this
        run under its own header (and a run id not already in the file)."""
        p = self.path
        if p.is_dir():
            raise UsageError(f"--out {self.opts.out}: {p} is a directory, not a records file")
        if p.is_file() and p.stat().st_size > 0:
            if not self.opts.append:
                raise UsageError(f"{p} already holds records; not overwriting it: give a new --out, or --append "
                                 "to add this run to it")
            try:
                ids = {r.get("run_id") for r in records.read_jsonl(p)}
            except (ValueError, OSError) as e:
                raise UsageError(f"--append: cannot read {p}: {e}") from None
            base, n = self.run_id, 2
            while self.run_id in ids:
                self.run_id, n = f"{base}-{n}", n + 1
        ensure_writable(p, f"--out {self.opts.out or p}")

    # -- bookkeeping ---------------------------------------------------------------------------
    def base(self, rtype: str) -> dict[str, Any]:
        return {"schema": records.SCHEMA_VERSION, "type": rtype, "run_id": self.run_id, "env": self.env}

    def write(self, recs: list[dict[str, Any]]) -> None:
        records.write_jsonl(self.path, recs)

    def over_run_budget(self) -> bool:
        return self.opts.max_run_s is not None and time.perf_counter() - self.t_start > self.opts.max_run_s

    def repro(self, w: Workload, impl_name: str) -> str:
        flags = self.opts.repro_flags() if isinstance(self.opts, RunOptions) else []
        return " ".join([f"python -m {__package__ or 'compare'} {self.command} --config",
                         shlex.quote(self.config_path), "--only", shlex.quote(f"{w.name}:{impl_name}"),
                         *map(shlex.quote, flags)])

    # -- ceilings and clock check --------------------------------------------------------------
    def measure_ceilings(self) -> dict:
        rec = self.base("ceilings")
        ds = None
        if self.hw_ds is not None:
            ds = {"name": self.hw_ds.name, "hbm_bw_Bps": self.hw_ds.hbm_bw, "flops": dict(self.hw_ds.flops),
                  "l2_mb": self.hw_ds.l2_mb, "sources": dict(self.hw_ds.sources)}
        rec["datasheet"] = ds
        if self.opts.no_ceilings:
            meas, reason = None, "--no-ceilings: datasheet values only"
        else:
            meas, reason = ceilings.measure()
        rec["measured"] = meas
        rec["reason"] = reason
        self.use_ceilings(meas)
        if self.gpu and self.hw_ds is None:
            rec["reason"] = (reason or "") + f"; no datasheet row for {self.env['gpu']!r}: predictions omitted"
        self.write([rec])
        return rec

    def use_ceilings(self, meas: dict | None) -> None:
        """The measured ceilings (or None) as the run's: rates and fractions are against them."""
        self.ceil = meas
        if meas and self.hw_ds is not None:
            self.hw = self.hw_ds.with_measured(hbm_bw=meas.get("hbm_read_Bps"), flops=meas.get("flops", {}))

    def clock_check(self) -> list[dict]:
        if not self.gpu or not self.ceil or not self.ceil.get("hbm_copy_Bps"):
            return []
        recs = []
        nbytes = 1 << 30
        for fw in ("jax", "torch") if self.ctx.torch_cuda else ("jax",):
            rec = self.base("clock_check")
            rec.update({"framework": fw, "bytes_moved": 2 * nbytes, "what": "1 GiB negate (read + write)"})
            try:
                if fw == "jax":
                    import jax
                    import jax.numpy as jnp

                    # fp32: XLA's fp16 elementwise negate ran at 0.79 of the copy ceiling on an H200
                    # (run 20261121T092505), a codegen effect, not a clock error.
                    x = jax.random.normal(jax.random.key(0), (nbytes // 4,), jnp.float32)
                    fn, args = jax.jit(lambda a: -a), (x,)
                else:
                    import torch

                    x = torch.randn(nbytes // 2, dtype=torch.float16, device="cuda")
                    y = torch.empty_like(x)
                    fn, args = (lambda a, _y=y: torch.neg(a, out=_y)), (x,)
                fn(*args)
                t = timing.time_kernels(fn, args, framework=fw, reps=5, flush_bytes=self.flush_bytes,
                                        clock=self.opts.clock)
                bps = 2 * nbytes / (t.stats["p50"] * 1e-6)
                ratio = bps / self.ceil["hbm_copy_Bps"]
                rec.update({"clock": t.clock, "clock_requested": t.requested, "clock_fallback": t.fallback,
                            "clock_notes": list(t.notes), "time_us_p50": t.stats["p50"],
                            "achieved_Bps": bps, "copy_ceiling_Bps": self.ceil["hbm_copy_Bps"],
                            "ratio": ratio, "ok": 0.8 <= ratio <= 1.15})
            except Exception as e:  # the check failing is itself the finding; the run goes on
                rec.update({"clock": None, "ok": False, "reason": f"{type(e).__name__}: {str(e)[:300]}"})
            finally:
                x = y = None  # noqa: F841
                gc.collect()
            recs.append(rec)
        self.write(recs)
        return recs

    # -- predictions ---------------------------------------------------------------------------
    def predict(self, w: Workload, impl: Impl | None) -> dict[str, Any] | None:
        """The layer-1 prediction of ``impl`` (None: a peer) on ``w``, from what the implementation declares
        (``Impl.roofline``: a kernel contract, cuda_ref's table, or the workload dtype for a peer)."""
        try:  # ragged lengths, windows and packed documents: the keys read and the pairs the mask leaves
            wl: Any = interop.roofline_view(w)
        except Exception as e:  # noqa: BLE001 -- a prediction that cannot be made is a field, not a crash
            return {"error": f"{type(e).__name__}: {e}"}
        try:
            facts = impl.roofline(w) if impl is not None else None
            prob = roofline.problem_for(wl, facts)
        except Exception as e:  # an undeclared precision or a shape the model refuses: a field, not a crash
            return {"error": f"{type(e).__name__}: {e}"}
        peer_src = (f"workload KV format {w.kv_dtype} (no dequant work counted)" if getattr(w, "kv_dtype", None)
                    else "workload dtype (peer)")
        out: dict[str, Any] = {"precision": prob.precision,
                               "roofline_inputs": facts.as_dict() if facts is not None else {
                                   "precision": prob.precision, "materialize_s": False, "tile": [1, 1],
                                   "tensor_cores": None, "source": peer_src}}
        if prob.quantized_kv:  # K and V at the storage precision, q and O at io_bytes, + the tensor scales
            out["quantized_kv"] = {"kv_dtype": w.kv_dtype, "kv_precision": prob.precision, "io_bytes": prob.io_bytes,
                                   "scale_bytes": roofline.SCALE_BYTES, "dequant_ops": prob.dequant_ops}
        for label, hw in (("measured", self.hw if self.ceil else None), ("datasheet", self.hw_ds or self.hw_pred_only)):
            if hw is None:
                continue
            try:
                est = roofline.estimate(prob, hardware.aggregate(hw, w.devices))
            except Exception as e:  # e.g. no peak for this engine on this hardware
                out[f"{label}_error"] = f"{type(e).__name__}: {e}"
                continue
            out[label] = {"hardware": hw.name, "flops": est.flops, "bytes": est.bytes, "exps": est.exps,
                          "t_mma_us": est.t_mma * 1e6, "t_hbm_us": est.t_hbm * 1e6, "t_mufu_us": est.t_mufu * 1e6,
                          "floor_us": est.floor_s * 1e6, "limiter": est.limiter, "ai": est.ai, "ridge": est.ridge,
                          "engine": est.engine, "peak_flops": est.peak_flops, "bw_Bps": est.bw}
            if prob.quantized_kv:  # the fourth bound: decoding the KV elements (docs/quantized_kv.md §3)
                out[label].update(t_alu_us=est.t_alu * 1e6, alu_ops_per_s=roofline.alu_rate(hw))
        out["basis"] = "measured" if "measured" in out else ("datasheet" if "datasheet" in out else None)
        if not self.gpu:
            by_arch = {}
            for hw in self.hw_pred_archs:
                try:
                    est = roofline.estimate(prob, hw)
                except Exception as e:  # an arch without this engine's peak
                    by_arch[hw.key] = {"error": f"{type(e).__name__}: {e}"}
                    continue
                by_arch[hw.key] = {"hardware": hw.name, "floor_us": est.floor_s * 1e6, "limiter": est.limiter,
                                   "ai": est.ai, "ridge": est.ridge}
            out["by_arch"] = by_arch
            names = ", ".join(hw.name for hw in self.hw_pred_archs)
            out["note"] = f"no GPU in this run: datasheet predictions for {names}"
        return out

    def not_run_line(self, w: Workload, recs: list[dict]) -> str:
        """CPU runs: one line for a workload where nothing ran: its shape, what happened, the floors."""
        from .report import _shape, status_summary

        pred = self.predict(w, None) or {}
        floors = " / ".join(f"{v['hardware'].split()[0]} {v['floor_us']:.4g} µs"
                            for v in (pred.get("by_arch") or {}).values() if "floor_us" in v)
        return f"  {w.name:34.34s} {_shape(w.as_dict()):44.44s} {floors:30s} ({status_summary(recs)})"

    def prediction_line(self, w: Workload) -> str | None:
        """CPU runs: the layer-1 floor of the workload (peer model, workload dtype) on each --arch row."""
        if self.gpu:
            return None
        pred = self.predict(w, None) or {}  # the peer model: workload dtype, fused
        parts = [f"{v['hardware']} {v['floor_us']:.4g} µs ({v['limiter']}, AI {v['ai']:.3g})"
                 for v in (pred.get("by_arch") or {}).values() if "floor_us" in v]
        return ("  predicted floor (datasheet, fused model): " + "; ".join(parts)) if parts else None

    # -- plan: one (workload, implementation) pair, before anything runs --------------------------
    def record(self, w: Workload, impl: Impl, status: str = "ok", reason: str | None = None) -> ResultRecord:
        rec = ResultRecord(head=self.base("result"), workload={**w.as_dict(), "config": self.config_path},
                           impl=impl.as_dict(), repro=self.repro(w, impl.name), status=status, reason=reason)
        rec.impl["generation"] = impl.generation
        rec.impl["config"] = impl.config
        rec.impl["plan"] = None
        return rec

    def plan_pair(self, w: Workload, impl: Impl, flops: float) -> PairPlan | None:
        """Everything about a pair that is decided before it runs: None when the implementation does not apply
        (no record); else its record with the prediction, launch plan and layer 2, and its refusals."""
        if w.family not in impl.families:
            return None
        sup = impl.supports(w, self.ctx)
        if sup.status == "n/a":
            return None
        missing = sorted(w.features - impl.features)
        if missing:  # a fact on every machine: a CPU run's record says what a GPU run's says
            also = f"; also {sup.status}: {sup.reason}" if not sup.ok and sup.reason else ""
            sup = Support(False, f"{impl.name} does not implement {', '.join(missing)} (the workload needs "
                                 f"{', '.join(sorted(w.features))}); not run without it{also}", "unsupported")
        rec = self.record(w, impl)
        pred = self.predict(w, impl)
        rec.set_prediction(pred)
        if not sup.ok:
            return PairPlan(w, impl, rec, refusal=Refusal(sup.status, sup.reason))
        try:  # the launch plan the implementation declares, made before anything runs
            rec.impl["plan"] = impl.plan(w, self.ctx)
        except Exception as e:  # a plan that cannot be made is recorded; the run itself says more
            rec.impl["plan"] = {"error": _reason(e)}
        if self.hw is not None and layer2.modelled(impl.name):  # layer 2, before anything runs
            rec.prediction["layer2"] = layer2.predict_record(w, rec.impl, rec.impl["plan"], self.hw)
        basis = (pred or {}).get((pred or {}).get("basis") or "", {})
        pp = PairPlan(w, impl, rec, basis=basis)
        n_calls = 1 + self.opts.warmup + self.opts.reps + self.opts.e2e_reps
        if not self.gpu and flops > self.opts.cpu_max_flops:
            pp.skip = Refusal("skipped", f"too large for CPU interpret mode ({flops:.2g} FLOPs > --cpu-max-flops "
                                         f"{self.opts.cpu_max_flops:.2g}); run on a GPU")
        elif self.gpu and basis.get("floor_us"):
            predicted_s = basis["floor_us"] * 1e-6 * n_calls
            if predicted_s > self.budget_s:
                pp.skip = Refusal("skipped", f"over time budget: predicted floor {basis['floor_us'] / 1e3:.1f} ms x "
                                             f"{n_calls} calls = {predicted_s:.1f} s > the per-record budget "
                                             f"{self.budget_s:g} s (--budget-s, or the config's budget_s)")
        return pp

    def plan_workload(self, w: Workload, impls: list[Impl]) -> dict[int, PairPlan | BaseException | None]:
        """Every pair of a workload planned before any of them runs (keyed by ``id(impl)``); a planning error
        is kept and becomes that pair's 'compare error' record when its turn comes, in order."""
        plans: dict[int, PairPlan | BaseException | None] = {}
        seen: dict[Any, str] = {}
        for impl in impls:
            try:
                plans[id(impl)] = pp = self.plan_pair(w, impl, _cpu_gate_flops(w))
            except Exception as e:  # noqa: BLE001 -- recorded by run_workload
                plans[id(impl)] = e
                continue
            if pp is None or pp.refusal is not None or pp.skip is not None or impl.program_key_fn is None:
                continue
            try:
                key = impl.program_key_fn(w)
            except Exception:  # noqa: BLE001 -- no key: the pair runs as any other
                key = None
            if key is None:
                continue
            if key in seen:  # named configs differing only in knobs this workload does not use: timed once
                pp.skip = Refusal("skipped", f"the same programs as {seen[key]} at this workload (the knobs that "
                                             f"differ do not apply to it); timed once, under {seen[key]}")
            else:
                seen[key] = impl.name
        return plans

    # -- execute: one pair -> one record -----------------------------------------------------------
    def run_workload(self, w: Workload, impls: list[Impl], progress=None, task=None) -> list[dict[str, Any]]:
        recs: list[dict[str, Any]] = []
        state: dict[str, Any] = {}
        outputs: dict[str, Any] = {}  # impl name -> BTNH output, for twin agreement (freed per workload)
        self._inflight = (recs, outputs)  # what main flushes if the run is interrupted mid-workload
        t0 = time.perf_counter()
        ahead = getattr(self, "_ahead", None)
        if ahead is not None and ahead[0] is w:  # --look-ahead began this workload during the last one
            state, self._ahead = ahead[1], None
        else:
            state["plans"] = self.plan_workload(w, impls)
            state["plan_s"] = round(time.perf_counter() - t0, 3)  # predictions and refusals of every pair
        flops = _cpu_gate_flops(w)
        waits0 = self.lock.waits()
        holds0 = self.lock.holds()
        over = self.over_run_budget()  # every pair is 'skipped' in its turn: nothing to make or compile for them
        if not over and self.lane is not None and self.gpu and "inputs" not in state:
            # a lane compiles its input program and its agreement's before it takes the lock (shapes only: nothing
            # runs on the GPU), so a lane waiting to time does not wait for these compiles; one process runs the
            # input program's on a worker for the next workload instead (look_ahead), which a lane cannot know
            for ahead in (interop.compile_inputs, accuracy.compile_checks):
                try:
                    with self.lock.compiling():
                        ahead(w)
                except Exception:  # noqa: BLE001 -- the program compiles at its first use and records any error
                    pass
        # --run-up-hold one (lanes): one shared hold over the whole run-up; the steps' own holds below are then covered,
        # a timing window inside gives it up and takes it again, compile waits and the oracle's numpy give it up
        run_up = (self.lock.shared() if self.lane is not None and getattr(self.opts, "run_up_hold", "each") == "one"
                  else contextlib.nullcontext())
        with run_up:
            try:
                with self.lock.shared():  # inputs, and prepares that may launch device work
                    if not over:
                        self.precompile(w, impls, state)
            except Exception:  # noqa: BLE001 -- a warm-up only: every pair still compiles at its first call
                self.drain_compiles(state)
            self.look_ahead(getattr(self, "_next_workload", None))
            if self.gpu and (getattr(self.opts, "rounds", 1) > 1 or state.get("prepared")):
                # with programs compiling on workers: every pair's first call and agreement before any timing, the
                # pairs that wait for no worker first, so the compiles run behind them (one round: each pair's
                # repetitions back to back, as below)
                recs += self.run_workload_rounds(w, impls, state, outputs, flops, progress, task)
                impls = []
            for impl in impls:
                if progress is not None:
                    progress.update(task, description=f"{w.name[:34]:34s} {impl.name[:30]:30s}")
                try:
                    rec = self.run_one(w, impl, state, outputs, flops)
                except Exception as e:  # last line of defence: a bug in compare itself is still a record
                    rec = self.record(w, impl, "failed", f"compare error: {type(e).__name__}: {str(e)[:300]}").to_json()
                if progress is not None:
                    progress.advance(task)
                if rec is not None:
                    recs.append(rec)
            self.drain_compiles(state)  # a pair that never ran (budget, error) leaves no compile behind
            with self.lock.shared():  # twin agreement on the full outputs
                self.finalize(recs, outputs)
        wall = round(time.perf_counter() - t0, 3)
        lane = None
        if self.lane is not None:  # which lane, and how long it waited for the GPU lock in this workload
            waits = self.lock.waits()
            holds = self.lock.holds()
            lane = {"lane": f"{self.lane[0]}/{self.lane[1]}", "pass": self.opts.lane_pass,
                    **{f"lock_wait_{k}_s": round(waits[k] - waits0.get(k, 0.0), 3) for k in waits},
                    **{f"lock_holds_{k}": holds[k] - holds0.get(k, 0) for k in holds}}
        for r in recs:  # the workload's host wall seconds, planning to its last record (what a sweep's time is made of)
            if isinstance(r.get("metrics"), dict):
                r["metrics"]["workload_wall_s"] = wall
                if lane is not None:
                    r["metrics"]["lane"] = lane
        outputs.clear()
        state.clear()
        gc.collect()
        ceilings.empty_torch_cache()
        return recs

    def run_workload_rounds(self, w: Workload, impls: list[Impl], state: dict, outputs: dict, flops: float,
                            progress=None, task=None) -> list[dict[str, Any]]:
        """``--rounds N``: every pair run up to its timing (inputs, first call, agreement), then the kernel-clock
        samples of all of them taken in N rounds, round-robin, then each pair's e2e timing; records in the
        implementations' order. Pairs on a clock of their own (multi-device loop / wall / pipelined, torch train
        steps on events) are timed as they come, as without rounds."""
        entries: list[tuple[ResultRecord | dict | None, Any, tuple | None] | None] = [None] * len(impls)
        # the order the pairs run to their agreement in: the JAX peers (compiled on a worker or at their first call:
        # seconds at most), then the Pallas pairs (their Mosaic compiles, the longest, run on the workers meanwhile),
        # then torch and the rest (a torch train step times on its own clock at once, which waits for the workers);
        # records keep the implementations' order
        order = sorted(range(len(impls)), key=lambda i: _PHASE1_RANK.get(impls[i].framework, 2))
        for idx in order:
            impl = impls[idx]
            if progress is not None:
                progress.update(task, description=f"{w.name[:34]:34s} {impl.name[:30]:30s}")
            try:
                pp = self.pair_plan(w, impl, state, flops)
                if pp is None:
                    entries[idx] = (None, None, None)
                    continue
                held: dict[str, Any] = {}
                rec = self.execute(pp, state, outputs, hold=held)
                prep = held.get("prep")
                with self.lock.shared():  # warm-up and one call: no quiet GPU needed
                    plan = self.timing_plan(prep, rec) if prep is not None else None
                entries[idx] = (rec, prep, plan)
            except Exception as e:  # last line of defence: a bug in compare itself is still a record
                bad = self.record(w, impl, "failed", f"compare error: {type(e).__name__}: {str(e)[:300]}")
                entries[idx] = (bad.to_json(), None, None)
            if progress is not None:
                progress.advance(task)
        self.drain_compiles(state)
        with self.lock.exclusive():  # every timing window of the workload with the GPU to itself (lanes)
            return self._time_entries(entries)

    def _time_entries(self, entries: list) -> list[dict[str, Any]]:
        """``run_workload_rounds``' second half: the held pairs' e2e figures and kernel-clock rounds, then every
        entry's record in the implementations' order."""
        live = [i for i, (_, _, plan) in enumerate(entries) if plan is not None]
        n = getattr(self.opts, "rounds", 1)
        e2e: dict[int, tuple] = {}
        if self.gpu and getattr(self.opts, "look_ahead", False) and getattr(self.opts, "compile_workers", 0) > 0:
            # the host-wall figures first, while nothing compiles; then the next workload's compiles start and run
            # while this one's kernel-clock samples are taken (their clock is the device's)
            for i in list(live):
                rec, prep, plan = entries[i]
                try:
                    e2e[i] = self.measure_e2e(prep, rec, plan[1], plan[2])
                except Exception as e:
                    rec.fail("oom" if _is_oom(e) else "failed", "timing: " + _reason(e))
                    live.remove(i)
            self.start_look_ahead()
        parts: dict[int, list[timing.Timing]] = {i: [] for i in live}
        places: dict[int, list[int]] = {i: [] for i in live}  # each part's place in its round (0: timed first)
        for r in range(n):
            # the order rotates by one a round (session 38): a place in the round that costs or gains (the first after
            # the previous workload, or after another framework's kernels) falls on every implementation in turn
            order = live[r % len(live):] + live[:r % len(live)] if live else []
            for place, i in enumerate(order):
                if i not in live:
                    continue
                rec, prep, (reps, _, _) = entries[i]
                share = reps // n + (1 if r < reps % n else 0)
                if share < 1:
                    continue
                try:
                    parts[i].append(self.kernel_timing(prep, rec, share))
                    places[i].append(place)
                except Exception as e:
                    rec.fail("oom" if _is_oom(e) else "failed", "timing: " + _reason(e))
                    live.remove(i)
        out: list[dict[str, Any]] = []
        for i, (rec, prep, plan) in enumerate(entries):
            if i in live:
                try:
                    if n == 1:  # one round (a run with compile workers): the pair's samples as they were taken
                        self.record_timing(prep, rec, parts[i][0], plan[1], plan[2], e2e=e2e.get(i))
                    else:
                        kt = merge_timings(parts[i], rounds=n, others=len(live) - 1)
                        self.record_timing(prep, rec, kt, plan[1], plan[2], e2e=e2e.get(i))
                        rec.metrics["timing_rounds"] = len(parts[i])
                        # per round: the median of its samples and the pair's place in it (what a position effect
                        # between identical programs would show in; docs/compare.md "Rounds")
                        rec.metrics["round_p50_us"] = [float(statistics.median(t.samples_us)) for t in parts[i]]
                        rec.metrics["round_places"] = places[i]
                except Exception as e:
                    rec.fail("oom" if _is_oom(e) else "failed", "timing: " + _reason(e))
            if rec is not None:
                out.append(rec if isinstance(rec, dict) else rec.to_json())
        return out

    def pair_plan(self, w: Workload, impl: Impl, state: dict, flops: float) -> PairPlan | None:
        """A pair's plan, made by ``plan_workload`` (or now); a planning error raises here, in the pair's turn."""
        plans = state.get("plans") or {}
        pp = plans[id(impl)] if id(impl) in plans else self.plan_pair(w, impl, flops)
        if isinstance(pp, BaseException):
            raise pp
        return pp

    def run_one(self, w: Workload, impl: Impl, state: dict, outputs: dict, flops: float) -> dict | None:
        """One pair: its plan executed; None when it does not apply."""
        pp = self.pair_plan(w, impl, state, flops)
        return None if pp is None else self.execute(pp, state, outputs).to_json()

    def execute(self, pp: PairPlan, state: dict, outputs: dict, hold: dict | None = None) -> ResultRecord:
        """One pair's record. ``hold`` (``--rounds``): a pair on a kernel clock is not timed here; its prepared
        program goes into ``hold["prep"]`` and ``run_workload_rounds`` times it with the others."""
        w, impl, rec = pp.workload, pp.impl, pp.record
        if pp.refusal is not None:
            return rec.refuse(pp.refusal)
        if self.over_run_budget():
            return rec.refuse(Refusal("skipped", f"over time budget: run budget --max-run-s "
                                                 f"{self.opts.max_run_s:g} s exhausted before this record"))
        if pp.skip is not None:
            return rec.refuse(pp.skip)
        with self.lock.shared():
            err = self.workload_inputs(w, state)  # inputs and oracle: once per workload, shared by every impl
        if err is not None:
            return rec.refuse(err)
        grads_btnh = None
        phase = rec.metrics.setdefault("phase_s", {})
        phase.update(state.pop("phase_s", {}))
        try:
            pre = state.get("prepared", {}).pop(id(impl), None)
            if pre is not None:  # prepared by precompile, its program compiled (or compiling) on a worker thread
                prep = pre["prep"]
                phase["prepare"] = pre["prepare_s"]
                t0 = time.perf_counter()
                with self.lock.released():  # a worker's compile: host work, no GPU hold (--run-up-hold one)
                    compile_s = _compile_result(pre["future"])
                phase["compile_wait"] = round(time.perf_counter() - t0, 3)
                if compile_s is not None:
                    phase["compile_bg"] = compile_s
            with self.lock.shared():
                if pre is None:
                    t0 = time.perf_counter()
                    prep = impl.prepare(w, state["inputs"], self.ctx)
                    phase["prepare"] = round(time.perf_counter() - t0, 3)
                sync = _sync_for(prep.framework)
                t0 = time.perf_counter()
                out = prep.fn(*prep.args)
                sync(out)
                first_call_s = time.perf_counter() - t0
                if w.family == "train":  # (out, (dq, dk, dv), loss): compare.train
                    from . import train

                    out, grads = train.split_output(out)
                    grads_btnh = tuple(interop.to_jax_btnh(g, prep.layout) for g in grads)
                out_btnh = interop.to_jax_btnh(out, prep.layout)
        except Exception as e:
            return rec.fail("oom" if _is_oom(e) else _failure_status(e), _reason(e))
        rec.impl["prepared_notes"] = prep.notes
        rec.metrics["first_call_s"] = first_call_s
        with self.lock.shared():
            t0 = time.perf_counter()  # after the lock (a lane's wait for it is metrics.lane's)
            if not self.agree(rec, w, state, out_btnh):
                return rec
            if grads_btnh is not None and not self.agree_grads(rec, w, state, grads_btnh):
                return rec
        phase["agreement"] = round(time.perf_counter() - t0, 3)
        del grads_btnh
        if impl.framework in ("pallas", "cuda") and impl.generation:
            outputs[impl.name] = out_btnh
        del out
        try:
            if self.gpu and (hold is None or prep.clock in _OWN_CLOCKS):  # no compile runs while a pair is timed
                self.drain_compiles(state)
            if self.gpu and hold is not None and prep.clock not in _OWN_CLOCKS:
                hold["prep"] = prep
            elif self.gpu:
                self.time_gpu(prep, rec, pp.basis)
            else:
                ct = timing.time_cpu(prep.fn, prep.args, reps=1)
                rec.metrics.update(clock="cpu-interpret", cpu_interpret_us_p50=ct.stats["p50"], time_us_p50=None,
                                   time_us_p10=None, time_us_p90=None, e2e_us_p50=None, tflops=None, gbps=None,
                                   roofline_fraction=None, hbm_fraction=None, tc_fraction=None,
                                   limiter=pp.basis.get("limiter"))
        except Exception as e:
            rec.fail("oom" if _is_oom(e) else "failed", "timing: " + _reason(e))
        return rec

    def workload_inputs(self, w: Workload, state: dict) -> Refusal | None:
        """Inputs, oracle subset and float64 oracle (and the quantized-KV references) into ``state``, once
        per workload; a failure is kept in ``state`` and refuses every later pair of the workload alike."""
        if "inputs_error" in state:  # every later pair of the workload gets the first pair's status and reason
            return Refusal(state.get("inputs_status", "failed"), state["inputs_error"])
        if "oracle" in state:
            return None
        try:
            if "inputs" not in state:
                self.make_inputs(w, state)
            inputs_s = state.pop("inputs_s")
            t1 = time.perf_counter()
            c1 = _thread_compile_s()
            h1, f1 = accuracy.seconds("host"), accuracy.seconds("fetch")
            state["subset"] = accuracy.choose_subset(w)
            state["oracle"] = accuracy.oracle(w, state["inputs"], state["subset"])
            tg, cg = time.perf_counter(), _thread_compile_s()
            if w.family == "train":  # dq, dk, dv in float64 on one batch row and KV head group
                state["grad_subset"] = accuracy.choose_grad_subset(w)
                state["grad_oracle"] = accuracy.grad_oracle(w, state["inputs"], state["grad_subset"])
            if getattr(w, "kv_dtype", None):  # the format's own error; the reference of the fp16 cache
                state["oracle_fp16"] = accuracy.oracle(w, state["inputs"], state["subset"], kv="fp16")
                state["quant_error"] = accuracy.quantization_error(state["oracle"], state["oracle_fp16"])
            # host wall seconds of the workload's shared work, on the first pair that ran it (where a run's time goes)
            state["phase_s"] = {"plan": state.get("plan_s"), "inputs": inputs_s,
                                "oracle": round(time.perf_counter() - t1, 3),
                                # of which: the gradient oracle (train), and JAX compiles on this thread (trace,
                                # lowering, XLA) in the forward and the gradient oracle
                                "oracle_grad": round(time.perf_counter() - tg, 3),
                                "oracle_compile": round(cg - c1, 3),
                                "oracle_grad_compile": round(_thread_compile_s() - cg, 3),
                                # of the oracle: its float64 numpy, and its inputs' copies to the host (session 27)
                                "oracle_host": round(accuracy.seconds("host") - h1, 3),
                                "oracle_fetch": round(accuracy.seconds("fetch") - f1, 3)}
        except Exception as e:
            state["inputs_error"] = f"inputs/oracle: {type(e).__name__}: {str(e)[:300]}"
            state["inputs_status"] = "oom" if _is_oom(e) else "failed"
            return Refusal(state["inputs_status"], state["inputs_error"])
        return None

    def make_inputs(self, w: Workload, state: dict) -> None:
        """The workload's seeded inputs into ``state`` (on the device, synchronized), their host seconds in
        ``state["inputs_s"]``."""
        t0 = time.perf_counter()
        state["inputs"] = interop.make_inputs(w)
        _sync_for("jax")(_device_leaves(state["inputs"]))  # every field made, pools and quantized caches included
        state["inputs_s"] = round(time.perf_counter() - t0, 3)

    # -- compile ahead: a workload's Pallas programs on worker threads ------------------------------
    def precompile(self, w: Workload, impls: list[Impl], state: dict, *, pallas_only: bool = False) -> None:
        """GPU runs with ``--compile-workers`` > 0: the workload's inputs, then every runnable JAX pair (Pallas, the
        JAX peers: ``_compiled_ahead``) prepared here (on this thread: a prepare may launch device work) and its jitted
        program handed to a worker thread (``jit(...).lower(*args).compile()``, the executable its first call then
        finds in JAX's cache), so the compiles run at the same time as each other, the oracle and the first calls.
        ``drain_compiles`` waits for all of them before any repetition is timed (a compile may run autotuning kernels,
        and a CUPTI window counts every kernel of the process). A prepare or compile that fails here is left to the
        pair's own turn, which repeats it and records the error as before."""
        workers = getattr(self.opts, "compile_workers", 0)
        if not self.gpu or workers <= 0:
            return
        plans = state.get("plans") or {}
        done = state.get("prepared") or {}
        todo = []
        for impl in impls:
            pp = plans.get(id(impl))
            if (not _compiled_ahead(impl) or not isinstance(pp, PairPlan) or pp.refusal is not None
                    or pp.skip is not None or id(impl) in done
                    or (pallas_only and impl.framework not in _PALLAS_FRAMEWORKS)):
                continue
            todo.append(impl)
        if not todo:
            return
        if "inputs" not in state:
            try:
                self.make_inputs(w, state)
            except Exception:  # noqa: BLE001 -- workload_inputs repeats it in the first pair's turn and records it
                state.pop("inputs", None)
                return
        pool = self._compile_pool(workers)
        prepared = state.setdefault("prepared", {})
        for impl in todo:
            try:
                t0 = time.perf_counter()
                prep = impl.prepare(w, state["inputs"], self.ctx)
                prepare_s = round(time.perf_counter() - t0, 3)
            except Exception:  # noqa: BLE001 -- the pair's turn prepares again and records the error
                continue
            fut = None
            if prep.framework == "jax" and prep.clock not in _OWN_CLOCKS and timing.is_jitted(prep.fn):
                fut = pool.submit(_compile_locked, self.lock, prep.fn, prep.args)
            prepared[id(impl)] = {"prep": prep, "prepare_s": prepare_s, "future": fut}

    def _compile_pool(self, workers: int):
        import concurrent.futures

        pool = getattr(self, "_pool", None)
        if pool is None:
            init = lanes.lower_thread_priority if self.lane is not None else None
            pool = self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="compile",
                                                                      initializer=init)
        return pool

    def look_ahead(self, nxt: Workload | None) -> None:
        """With compile workers on a GPU: the next workload's input program (``interop.compile_inputs``: shapes only,
        no device work) compiled on a worker while this workload runs (about 1 s of XLA's GPU compile a workload on an
        H100, session 25). ``record_timing`` waits for it before the host-wall figures; a failure is left to the
        next workload's own compile."""
        self._lookahead = None
        workers = getattr(self.opts, "compile_workers", 0)
        if nxt is None or not self.gpu or workers <= 0:
            return
        self._lookahead = self._compile_pool(workers).submit(interop.compile_inputs, nxt)

    def start_look_ahead(self) -> None:
        """``--look-ahead``: the next workload's plans and inputs made now (on this thread, synchronized: device work
        ends before this workload's timing windows open) and its Pallas programs handed to the workers
        (``precompile``, Pallas only: their compiles run nothing on the GPU); ``run_workload`` adopts that state."""
        nxt, impls = getattr(self, "_next_workload", None), getattr(self, "_next_impls", None)
        self._ahead = None
        if nxt is None or not impls:
            return
        state: dict[str, Any] = {}
        try:
            t0 = time.perf_counter()
            state["plans"] = self.plan_workload(nxt, impls)
            state["plan_s"] = round(time.perf_counter() - t0, 3)
            self.precompile(nxt, impls, state, pallas_only=True)
        except Exception:  # noqa: BLE001 -- the next workload starts from nothing, as without look-ahead
            self.drain_compiles(state)
            return
        self._ahead = (nxt, state)

    def _wait_lookahead(self) -> None:
        fut = getattr(self, "_lookahead", None)
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 -- the next workload compiles its inputs itself
                pass

    def drain_compiles(self, state: dict) -> None:
        """Wait for every compile this workload handed to a worker (results and errors are read in each pair's own
        turn)."""
        for pre in (state.get("prepared") or {}).values():
            fut = pre.get("future")
            if fut is not None:
                with self.lock.released():  # host work: a shared hold (--run-up-hold one) is given up meanwhile
                    _compile_result(fut)

    def agree(self, rec: ResultRecord, w: Workload, state: dict, out_btnh) -> bool:
        """The output against the oracle on the subset into ``rec.agreement``; False when the record ends here
        (non-finite output or error: 'failed'). Over the tolerance is 'wrong', and the record goes on to timing."""
        subset, ref = state["subset"], state["oracle"]
        precision = (rec.prediction or {}).get("precision") or roofline.workload_precision(w)
        if getattr(w, "kv_dtype", None):
            # the oracle reads the same quantized operands as the kernel (accuracy.oracle): what is left is the
            # kernel's arithmetic, judged at the tolerance of the q dtype it computes in, not the format's
            precision = roofline.workload_precision(w)
        tol = accuracy.tolerance(precision)
        ag = {"subset": subset.describe(), "tol_rel_l2": tol, "precision": precision}
        if getattr(w, "kv_dtype", None):
            ag["subset"]["oracle"] = (f"{accuracy.ORACLE_NOTE}; on the same {w.kv_dtype} operands the kernel reads "
                                      "(dequantized exactly)")
            ag["quantization"] = {**state["quant_error"], "kv_dtype": w.kv_dtype, "what": (
                "the format's error on the subset: float64 oracle on the quantized cache vs on the "
                f"{w.dtype} values it was quantized from")}
        rec.agreement = ag
        finite, got = subset.take_checked(out_btnh)
        if not finite:
            rec.fail("failed", "non-finite output (NaN/Inf)")
            return False
        max_abs, rel = accuracy.errors(got, ref)
        ag.update(max_abs_err=max_abs, rel_l2_err=rel)
        if getattr(w, "kv_dtype", None):  # what a user of the quantized cache sees vs the fp16 one: kernel + format
            qe = accuracy.quantization_error(got, state["oracle_fp16"])
            ag["vs_fp16_kv"] = {**qe, "what": f"this output vs the float64 oracle on the {w.dtype} KV"}
        if not (math.isfinite(max_abs) and math.isfinite(rel)):
            rec.fail("failed", "non-finite error against the oracle")
            return False
        if rel > tol:
            rec.fail("wrong", f"rel_l2_err {rel:.3g} > {tol:g} (tolerance for {precision})")
        return True

    def agree_grads(self, rec: ResultRecord, w: Workload, state: dict, grads_btnh) -> bool:
        """A train record's dq, dk, dv against the float64 gradient oracle on its subset into
        ``rec.agreement["grads"]`` (the output's precision and tolerance); False when the record ends here (a
        non-finite gradient anywhere: 'failed'). Over the tolerance is 'wrong' (its reason joins the output's)."""
        gs, ref = state["grad_subset"], state["grad_oracle"]
        precision, tol = rec.agreement["precision"], rec.agreement["tol_rel_l2"]
        ag: dict[str, Any] = {"subset": gs.describe(), "tol_rel_l2": tol, "precision": precision,
                              "what": "d/d(q, k, v) of sum(out * w), w the workload's seeded cotangent weight"}
        rec.agreement["grads"] = ag
        finite, got = gs.take_checked(grads_btnh)
        for name in ("dq", "dk", "dv"):
            if not finite[name]:
                rec.fail("failed", f"non-finite gradient (NaN/Inf) in {name}")
                return False
        over = []
        for name in ("dq", "dk", "dv"):
            max_abs, rel = accuracy.errors(got[name], ref[name])
            ag[name] = {"max_abs_err": max_abs, "rel_l2_err": rel}
            if not (math.isfinite(max_abs) and math.isfinite(rel)):
                rec.fail("failed", f"non-finite {name} error against the gradient oracle")
                return False
            if rel > tol:
                over.append(f"{name} rel_l2_err {rel:.3g} > {tol:g}")
        if over:
            why = f"{', '.join(over)} (tolerance for {precision}, gradients)"
            rec.fail("wrong", f"{rec.reason}; {why}" if rec.status == "wrong" and rec.reason else why)
        return True

    def time_gpu(self, prep, rec: ResultRecord, basis: dict) -> None:
        """Warm-up, then kernel timing (the requested clock, cold L2), end-to-end latency and pipelined
        throughput into ``rec.metrics``, scaled down to ``--budget-s`` (or 'skipped'); then the rates."""
        with self.lock.shared():
            plan = self.timing_plan(prep, rec)
        if plan is None:
            return
        reps, e2e_reps, e2e_calls = plan
        with self.lock.exclusive():  # the timing windows with the GPU to itself (lanes)
            self.record_timing(prep, rec, self.kernel_timing(prep, rec, reps), e2e_reps, e2e_calls)

    def timing_plan(self, prep, rec: ResultRecord) -> tuple[int, int, int] | None:
        """Warm-up and one timed call, then ``(reps, e2e_reps, e2e_calls)`` within ``--budget-s``; None when
        even 3 reps exceed it (the record is then 'skipped', its agreement kept)."""
        o = self.opts
        m = rec.metrics
        sync = _sync_for(prep.framework)
        tw = time.perf_counter()
        for _ in range(o.warmup):
            sync(prep.fn(*prep.args))
        t0 = time.perf_counter()
        sync(prep.fn(*prep.args))
        one = time.perf_counter() - t0
        m.setdefault("phase_s", {})["warmup"] = round(time.perf_counter() - tw, 3)
        reps, e2e_reps = o.reps, o.e2e_reps
        e2e_calls = getattr(o, "e2e_calls", 20)
        budget = self.budget_s
        if one * (reps + e2e_reps + 3 * e2e_calls) > budget:
            e2e_calls = max(1, min(e2e_calls, int(budget / one / 6)))
        e2e_budget = getattr(o, "e2e_budget_s", None)
        if e2e_budget is not None and one * (e2e_reps + 3 * e2e_calls) > e2e_budget:
            # the host-wall figures are the record's second measurement: a long step needs few calls for them (a
            # 30 ms training step took 2 s of e2e a pair at the defaults, a tenth of a sweep run: session 25)
            e2e_reps = max(3, min(e2e_reps, int(e2e_budget / 2 / one)))
            e2e_calls = max(2, min(e2e_calls, int(e2e_budget / 2 / 3 / one)))
            m["e2e_reduced_for_budget"] = True
        if one * (reps + e2e_reps) > budget:
            reps = max(3, int(budget / one) - 1)
            e2e_reps = max(1, min(e2e_reps, reps // 2))
            if one * (reps + e2e_reps) > 2 * budget:
                m.update(one_call_s=one)
                rec.fail("skipped", f"over time budget: one call took {one:.2f} s; 3 reps "
                                    f"exceed the per-record budget {budget:g} s (agreement kept)")
                return None
            m["reps_reduced_for_budget"] = True
        return reps, e2e_reps, e2e_calls

    def kernel_timing(self, prep, rec: ResultRecord, reps: int) -> timing.Timing:
        """``reps`` samples of the pair's kernel clock (its own clock where it has one); its host wall seconds add
        to ``metrics.phase_s.kernel_clock``."""
        t0 = time.perf_counter()
        try:
            return self._kernel_timing(prep, reps)
        finally:
            ph = rec.metrics.setdefault("phase_s", {})
            ph["kernel_clock"] = round(ph.get("kernel_clock", 0.0) + time.perf_counter() - t0, 3)

    def _kernel_timing(self, prep, reps: int) -> timing.Timing:
        o = self.opts
        if prep.clock == "loop":  # a program over several devices: no single CUPTI span covers it
            return timing.time_loop(prep.fn, prep.args, reps=max(3, min(reps, 10)), iters=20)
        if prep.clock == "wall":  # a long multi-device call (a ring training step): host wall per synced call
            return timing.time_e2e(prep.fn, prep.args, framework=prep.framework, reps=max(3, min(reps, 10)))
        if prep.clock == "pipelined":  # a public call as a loop makes it: host wall per call, pipelined
            return timing.time_pipelined(prep.fn, prep.args, framework=prep.framework, calls=50,
                                         reps=max(3, min(reps, 10)))
        if prep.clock == "events":  # the implementation's own choice (torch train steps, compare.train)
            kt = timing.time_kernels(prep.fn, prep.args, framework=prep.framework, reps=reps,
                                     flush_bytes=self.flush_bytes, clock="events")
            return dataclasses.replace(kt, notes=(*kt.notes, (
                f"events by the implementation's request (--clock {o.clock} not used): torch's autograd backward "
                "runs on the engine's device thread, whose kernels the CUPTI collector misses; CUDA events on the "
                "stream bracket the whole step")))
        return timing.time_kernels(prep.fn, prep.args, framework=prep.framework, reps=reps,
                                   flush_bytes=self.flush_bytes, clock=o.clock)

    def measure_e2e(self, prep, rec: ResultRecord, e2e_reps: int, e2e_calls: int) -> tuple:
        """The e2e latency and pipelined throughput of a pair, ``(e2e, pipe)`` timings, taken while no worker
        compiles (the host-wall clock would count a worker's hold on the interpreter)."""
        self._wait_lookahead()
        t0 = time.perf_counter()
        e2e = timing.time_e2e(prep.fn, prep.args, framework=prep.framework, reps=e2e_reps)
        pipe = timing.time_pipelined(prep.fn, prep.args, framework=prep.framework, calls=e2e_calls, reps=3)
        rec.metrics.setdefault("phase_s", {})["e2e"] = round(time.perf_counter() - t0, 3)
        return e2e, pipe

    def record_timing(self, prep, rec: ResultRecord, kt: timing.Timing, e2e_reps: int, e2e_calls: int,
                      e2e: tuple | None = None) -> None:
        """The kernel timing ``kt`` and the e2e latency and pipelined throughput (``e2e``: taken before, by
        ``measure_e2e``; else now) into ``rec.metrics``; the rates."""
        m = rec.metrics
        e2e, pipe = e2e if e2e is not None else self.measure_e2e(prep, rec, e2e_reps, e2e_calls)
        st = kt.stats
        requested = ("host-wall:in-jit-loop-diff" if prep.clock == "loop" else
                     "host-wall-pipelined" if prep.clock == "pipelined" else
                     "host-wall-e2e" if prep.clock == "wall" else kt.requested)
        if kt.program is not None:  # JAX on CUPTI: the jitted call itself, or traced into a program of its own
            m["timed_program"] = kt.program
        m.update(clock=kt.clock, clock_requested=requested, clock_notes=list(kt.notes), l2_flushed=kt.l2_flushed,
                 reps=len(kt.samples_us), time_us_p50=st["p50"], time_us_p10=st["p10"], time_us_p90=st["p90"],
                 time_us_mean=st["mean"], e2e_us_p50=e2e.stats["p50"], e2e_synced_us=e2e.stats["p50"],
                 e2e_pipelined_us=pipe.stats["p50"], e2e_pipelined_calls=e2e_calls,
                 e2e_clock=("host wall-clock, warm L2: e2e_synced_us = one call + its sync (latency, p50 of "
                            f"{len(e2e.samples_us)}); e2e_pipelined_us = {e2e_calls} calls issued, one sync, per call "
                            "(throughput, median of 3)"))
        if requested is not None and kt.clock != requested:
            m["clock_fallback"] = (f"requested {requested}, timed with {kt.clock}: "
                                   + ("; ".join(kt.notes) or "no reason recorded"))[:600]
            self.clock_fallbacks += 1
        self.fill_rates(rec)

    def fill_rates(self, rec: ResultRecord) -> None:
        """Rates and fractions of the measured time against the prediction's basis, the datasheet and the
        measured ceilings (with a note above a ceiling); both layers' scores when layer 2 was predicted."""
        m, pred = rec.metrics, rec.prediction or {}
        t = m["time_us_p50"] * 1e-6
        if "layer2" in pred and "error" not in pred["layer2"]:  # both layers scored against the measurement
            sc = layer2.score(rec.to_json(), self.hw)
            pred["score"] = {k: sc[k] for k in ("measured_us", "layer1_us", "layer1_err", "layer2_us", "layer2_err",
                                                "layer1_limiter", "layer2_limiter")}
        basis = pred.get(pred.get("basis") or "", {})
        ds = pred.get("datasheet", {})
        m.update(tflops=None, gbps=None, roofline_fraction=None, hbm_fraction=None, tc_fraction=None,
                 limiter=basis.get("limiter"), floor_us=basis.get("floor_us"))
        if not basis:
            return
        m["tflops"] = basis["flops"] / t / 1e12
        m["gbps"] = basis["bytes"] / t / 1e9
        m["roofline_fraction"] = basis["floor_us"] * 1e-6 / t
        if ds:
            m["roofline_fraction_datasheet"] = ds["floor_us"] * 1e-6 / t
            m["hbm_fraction_datasheet"] = ds["bytes"] / t / ds["bw_Bps"]
            m["tc_fraction_datasheet"] = ds["flops"] / t / ds["peak_flops"]
        if self.ceil:
            # a workload over several GPUs is read against their aggregate (the ceilings are measured on one GPU;
            # its prediction's basis is hardware.aggregate's, docs/compare.md)
            ndev = max(1, int(rec.workload.get("devices") or 1))
            if self.ceil.get("hbm_read_Bps"):
                m["hbm_fraction"] = basis["bytes"] / t / (ndev * self.ceil["hbm_read_Bps"])
                m["hbm_ceiling"] = f"measured HBM read, best method: {self.ceil.get('hbm_read_best', 'torch_sum')}" + (
                    f", x {ndev} GPUs" if ndev > 1 else "")
                l2 = _l2_bytes(self.hw_ds)
                note = ceilings.over_ceiling_note(m["hbm_fraction"], what="HBM read ceiling", bytes_=basis["bytes"],
                                                  l2_bytes=l2, datasheet_fraction=m.get("hbm_fraction_datasheet"))
                if note:
                    m["hbm_fraction_note"] = note
                if (m.get("roofline_fraction") or 0) > 1.0 and basis.get("limiter") == "HBM":
                    m["roofline_fraction_note"] = ceilings.over_ceiling_note(
                        m["roofline_fraction"], what="roofline floor (HBM)", bytes_=basis["bytes"], l2_bytes=l2,
                        datasheet_fraction=m.get("roofline_fraction_datasheet"))
            if (m.get("roofline_fraction") or 0) > 1.0 and basis.get("limiter") == "MMA":
                m["roofline_fraction_note"] = ceilings.over_compute_note(
                    m["roofline_fraction"], engine=basis.get("engine"), impl=rec.impl)
            peak = self.ceil.get("flops", {}).get(basis["engine"])
            if peak:
                m["tc_fraction"] = basis["flops"] / t / (ndev * peak)
            m["tc_ceiling"] = f"measured {basis['engine']} matmul" if peak else f"no measured {basis['engine']} rate"

    # -- summarize: per workload, then the run -------------------------------------------------------
    def finalize(self, recs: list[dict], outputs: dict) -> None:
        summarize_workload(recs, outputs)

    # -- the run: header, ceilings, clock check, then per workload plan -> execute -> summarize -----------
    def header(self) -> dict[str, Any]:
        header = self.base("header")
        header.update({"config": self.config_path, "argv": self.opts.argv, "options": {
            k: v for k, v in vars(self.opts).items() if k != "argv"}, "ctx": dataclasses.asdict(self.ctx),
                       "flush_bytes": self.flush_bytes, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                       "budget_s": self.budget_s,
                       "generations": _generation_order(),
                       "clocks_requested": {fw: timing.expected_clock(self.opts.clock, fw) for fw in ("jax", "torch")}})
        header.update(self.header_extra)
        return header

    def main(self) -> int:
        # a lane: the oracle's numpy without the GPU lock, on its share of the host's cores (accuracy._HOST_THREADS)
        with accuracy.host_sections(self.lock.released), accuracy.threads(oracle_threads(self.lane, os.cpu_count())):
            return self._main()

    def _main(self) -> int:
        from . import report

        self.write([self.header()])
        self._inflight = ([], {})
        n_written = 0
        progress = None
        try:
            if self.lane is None:
                self.measure_ceilings()
                self.clock_check()
            else:
                self.lane_ceilings()
            plan = self.plan
            total = sum(len(lst) for _, lst in plan)
            console = report.console()
            if not self.opts.quiet:
                console.print(f"[bold]compare run[/] {self.run_id}: {len(plan)} workloads, {total} (workload, impl) "
                              f"pairs -> {self.path}")
                if self.cpu_only_left_out:
                    console.print(f"({len(self.cpu_only_left_out)} interpret-mode check workloads of this config are "
                                  "for machines without a GPU and are left out here; --config smoke runs them)")
                from rich.progress import (
                    BarColumn,
                    MofNCompleteColumn,
                    Progress,
                    TextColumn,
                    TimeElapsedColumn,
                    TimeRemainingColumn,
                )

                progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                    TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(), console=console,
                                    transient=True)
                progress.start()
                task = progress.add_task("", total=total)
            not_run: list[str] = []  # CPU runs: one line per workload where nothing ran, after the tables
            all_recs: list[dict] = []
            limit = lanes.device_bytes_limit() if self.lane is not None and self.lane[1] > 1 else None
            for i in self.workload_order(len(plan)):
                w, lst = plan[i]
                if lanes.defer_alone(w, limit):  # left to a later pass with more memory (not marked done)
                    print(f"lane {self.lane[0]} [{i + 1}/{len(plan)}] {w.name}: left to a later pass (about "
                          f"{lanes.gib(lanes.estimated_bytes(w))}, over this lane's {lanes.gib(limit)})", flush=True)
                    continue
                nxt = plan[i + 1] if i + 1 < len(plan) and self.lane is None else (None, None)
                self._next_workload, self._next_impls = nxt
                recs = self.run_workload(w, lst, progress, task if progress else None)
                self.write(recs)
                self._inflight = ([], {})
                n_written += len(recs)
                all_recs += recs
                if self.lane is not None:
                    self.lane_done(i, len(plan), w, recs)
                if not self.opts.quiet:
                    self.show_workload(console, w, recs, not_run)
            if not_run and not self.opts.quiet:
                console.print(f"\n[bold]Not run on this machine[/] ({len(not_run)} workloads; predicted floor from the "
                              "datasheet, fused model at the workload's KV storage precision):")
                for line in not_run:
                    console.print(line, highlight=False, overflow="ellipsis", no_wrap=True)
        except KeyboardInterrupt:
            if progress is not None:
                progress.stop()
                progress = None
            return self.interrupted(n_written)
        finally:
            if progress is not None:
                progress.stop()
            pool = getattr(self, "_pool", None)
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
        return self.close(n_written, all_recs, console)

    # -- one lane of a --jobs run (compare/lanes.py) ------------------------------------------------
    def workload_order(self, n: int):
        """The plan's indices this process runs: all of them in order, or (a lane) each next one no lane took."""
        if self.lane is None:
            yield from range(n)
            return
        counter = self.lane_dir / f"next.{self.opts.lane_pass}"
        while (i := lanes.claim(counter)) < n:
            yield i

    def lane_ceilings(self) -> None:
        """The lane that claims the role publishes the plan, then measures the ceilings and runs the clock check
        with the GPU to itself and publishes them; the others wait for them and use the same values."""
        import json

        names = [w.name for w, _ in self.plan]
        if lanes.claim_role(self.lane_dir):
            lanes.publish(self.lane_dir / lanes.PLAN_FILE, {"workloads": names})
            try:
                with self.lock.exclusive():
                    recs = [self.measure_ceilings(), *self.clock_check()]
            except BaseException as e:
                lanes.publish(self.lane_dir / lanes.CEILINGS_FILE, {"lane": self.lane[0], "error": repr(e)[:300]})
                raise
            lanes.publish(self.lane_dir / lanes.CEILINGS_FILE,
                          {"lane": self.lane[0], "ceil": self.ceil, "records": recs})
            return
        got = lanes.wait_for(self.lane_dir / lanes.CEILINGS_FILE)
        if "error" in got:
            raise RuntimeError(f"lanes: the lane that measures the ceilings failed: {got['error']}")
        self.use_ceilings(got.get("ceil"))
        theirs = json.loads((self.lane_dir / lanes.PLAN_FILE).read_text())["workloads"]
        if (not set(names) <= set(theirs)) if getattr(self.opts, "lane_names", None) else names != theirs:
            raise RuntimeError("lanes: this lane's plan differs from the role lane's (the same command must select "
                               "the same workloads)")

    def lane_done(self, i: int, n: int, w: Workload, recs: list[dict]) -> None:
        """A lane's workload written: marked done for the parent, one progress line."""
        from . import report

        lanes.mark_done(self.lane_dir, self.lane[0], self.opts.lane_pass, w.name)
        m = next((r.get("metrics") for r in recs if isinstance(r.get("metrics"), dict)), None) or {}
        lane = m.get("lane") or {}
        print(f"lane {self.lane[0]}{'' if self.opts.lane_pass == 'main' else ' ' + self.opts.lane_pass} "
              f"[{i + 1}/{n}] {w.name}: {report.status_summary(recs) if recs else 'no records'}; "
              f"{m.get('workload_wall_s', 0.0):.1f} s (lock waits {lane.get('lock_wait_shared_s', 0.0):.1f} s "
              f"shared, {lane.get('lock_wait_exclusive_s', 0.0):.1f} s exclusive)", flush=True)

    def show_workload(self, console, w: Workload, recs: list[dict], not_run: list[str]) -> None:
        """A workload's table once its records are written (GPU: timings; CPU: agreement and the predicted
        floor), or, on a CPU run where nothing of it ran, one line for the list after the tables."""
        from . import report

        if self.gpu:
            console.print(report.workload_table(w.name, recs))
        elif any(r["status"] in ("ok", "wrong", "failed", "oom") for r in recs):
            console.print(report.cpu_table(w.name, recs))
            line = self.prediction_line(w)
            if line:
                console.print(line, highlight=False)
        else:
            not_run.append(self.not_run_line(w, recs))

    def interrupted(self, n_written: int) -> int:
        """Ctrl-C: the finished records of the workload in progress are summarized and written too; exit 130."""
        kept, outputs = self._inflight
        try:  # speed-ups and twin agreement among the records that finished; best effort
            self.finalize(kept, outputs)
        except Exception:  # the records themselves matter more than their summary
            pass
        self.write(kept)
        n_written += len(kept)
        print(f"interrupted: {n_written} result records kept ({len(kept)} of the workload in progress) "
              f"in {self.path}", file=sys.stderr)
        return 130

    def close(self, n_written: int, all_recs: list[dict], console) -> int:
        """The closing lines and the exit code: 1 when nothing ran, 3 on a clock fallback (unless accepted)."""
        from . import report

        if self.lane is not None:  # a lane: the parent merges, reports and sets the run's exit code
            return 0
        if n_written == 0:
            print(f"nothing ran: every selected (workload, implementation) pair is n/a (not applicable) on this "
                  f"machine; no result records in {self.path}", file=sys.stderr)
            return 1
        if not self.opts.quiet:
            console.print(f"{n_written} records in {time.perf_counter() - self.t_start:.0f} s -> {self.path}: "
                          f"{report.status_summary(all_recs)}", highlight=False)
            if not self.gpu:
                console.print("No GPU here: Pallas kernels ran in interpret mode on the smallest shapes (agreement "
                              "only, no kernel times); on a GPU the same command times every implementation.",
                              highlight=False)
            self.summarize(all_recs, console)
            console.print(f"render: python -m {__package__ or 'compare'} report {self.path}")
        if self.clock_fallbacks:
            print(f"clock fallback: {self.clock_fallbacks} records were timed by a clock other than the one requested "
                  f"(--clock {self.opts.clock}); they carry metrics.clock_fallback with the reason, in {self.path}"
                  + ("" if self.opts.allow_clock_fallback else "; exit 3 (--allow-clock-fallback accepts them)"),
                  file=sys.stderr)
            if not self.opts.allow_clock_fallback:
                return 3
        return 0

    def summarize(self, recs: list[dict], console) -> None:
        """After the run, before the closing line: nothing for ``run`` (its tables are per workload)."""


def run(opts: RunOptions) -> int:
    if getattr(opts, "jobs", 1) > 1 and getattr(opts, "lane", None) is None:
        from .lanes import run_jobs

        return run_jobs(opts)
    return _Run(opts).main()


# ------------------------------------------------------------------------------------------ helpers


def summarize_workload(recs: list[dict], outputs: dict) -> None:
    """Over one workload's finished records (in place): speed-up against the best timed peer, the twin (the
    CUDA twin of a Pallas generation; the faithful Pallas config of a CUDA one), the speed-up against it and
    twin-vs-twin agreement on the full outputs (``outputs``: impl name -> BTNH output)."""
    def p50(r):
        v = records.get(r, "metrics.time_us_p50")
        return v if r["status"] == "ok" and isinstance(v, (int, float)) else None

    peers = [(p50(r), r["impl"]["name"]) for r in recs if r["impl"]["kind"] == "peer" and p50(r)]
    best = min(peers) if peers else None
    by_name = {r["impl"]["name"]: r for r in recs}
    for r in recs:
        mine = p50(r)
        if best and mine:
            r["metrics"]["speedup_vs_best_peer"] = best[0] / mine
            r["metrics"]["best_peer"] = best[1]
        gen, fw = r["impl"]["generation"], r["impl"]["framework"]
        if fw not in ("pallas", "cuda") or not gen:
            continue
        twins = ([by_name.get(f"cuda:{gen}")] if fw == "pallas"
                 else [x for x in recs if x["impl"]["framework"] == "pallas" and x["impl"]["generation"] == gen])
        twins = [t for t in twins if t is not None]
        if not twins:
            continue
        tw = twins[0] if fw == "pallas" else next(
            (t for t in twins if t["impl"]["config"] == "faithful"), twins[0])
        r["metrics"]["twin"] = tw["impl"]["name"]
        if mine and p50(tw):
            r["metrics"]["speedup_vs_twin"] = p50(tw) / mine
        a, b = outputs.get(r["impl"]["name"]), outputs.get(tw["impl"]["name"])
        if a is not None and b is not None:
            try:
                mx, rel = accuracy.twin_errors(a, b)
                r["agreement"]["twin"] = {"name": tw["impl"]["name"], "max_abs_err": mx, "rel_l2_err": rel,
                                          "subset": "full output"}
            except Exception as e:  # shape mismatch etc.: recorded, not fatal
                r["agreement"]["twin"] = {"name": tw["impl"]["name"], "error": _reason(e)}


# clocks an implementation chooses for itself (Prepared.clock): timed on their own, never in --rounds
_OWN_CLOCKS = ("loop", "wall", "pipelined", "events")
_PALLAS_FRAMEWORKS = ("pallas", "jax-pallas")  # Mosaic GPU / Triton kernels: their compiles run nothing on the GPU
_PHASE1_RANK = {"jax": 0, "jax-pallas": 0, "pallas": 1}  # with compile workers: JAX peers, Pallas, the rest


def _compiled_ahead(impl: Impl) -> bool:
    """Whether compile workers prepare the pair early and compile its program on a worker: jitted JAX programs whose
    compile runs nothing on the GPU (Pallas, JAX's Pallas ops, the cuDNN and FA3 peers). XLA's own attention
    (``jax:xla*``) is left to its first call: XLA autotunes its matrix products by running them, which other work on
    the GPU at the same time would disturb; torch, the CUDA twins and FlashInfer compile at their first call."""
    if impl.framework in _PALLAS_FRAMEWORKS:
        return True
    return impl.framework == "jax" and not impl.name.startswith("jax:xla")


_COMPILE_EVENTS = frozenset({"/jax/core/compile/jaxpr_trace_duration",
                             "/jax/core/compile/jaxpr_to_mlir_module_duration",
                             "/jax/core/compile/backend_compile_duration"})
_COMPILE_S: dict[int, float] = {}  # thread id -> JAX compile seconds on that thread since the listener was installed
_COMPILE_LISTENER: list = []


def _on_compile_event(name: str, secs: float, **_kw) -> None:
    if name in _COMPILE_EVENTS:
        tid = threading.get_ident()
        _COMPILE_S[tid] = _COMPILE_S.get(tid, 0.0) + float(secs)


def _thread_compile_s() -> float:
    """JAX compile seconds (tracing, lowering, XLA) spent on the calling thread so far; the listener is installed on
    first use (a phase's compile share is the difference of two readings)."""
    if not _COMPILE_LISTENER:
        try:
            from jax._src import monitoring

            monitoring.register_event_duration_secs_listener(_on_compile_event)
            _COMPILE_LISTENER.append(_on_compile_event)
        except Exception:  # noqa: BLE001 -- a JAX without the hook: the share reads 0
            _COMPILE_LISTENER.append(None)
    return _COMPILE_S.get(threading.get_ident(), 0.0)


def _device_leaves(inp) -> list:
    """Every JAX array an ``Inputs`` holds (fields, and the arrays inside quantized-cache pytrees): what to wait for
    before the device may be timed (``--look-ahead`` makes a workload's inputs just before another one's timing)."""
    import jax

    leaves = jax.tree_util.tree_leaves([v for v in vars(inp).values() if v is not None])
    return [x for x in leaves if isinstance(x, jax.Array)]


def _compile_ahead(fn, args: tuple) -> float:
    """A worker thread's job: ``fn`` (jitted) lowered and compiled for ``args``; its host seconds."""
    t0 = time.perf_counter()
    fn.lower(*args).compile()
    return round(time.perf_counter() - t0, 3)


def _compile_locked(lock, fn, args: tuple) -> float:
    """``_compile_ahead`` inside ``lock.compiling()`` (a lane with ``PALLAS_ATTN_LANE_COMPILE_LOCK=1``: the GPU lock
    held shared; otherwise nothing); the wait for the lock is the lane's ``lock_wait_compile_s``, not these seconds."""
    with lock.compiling():
        return _compile_ahead(fn, args)


def oracle_threads(lane: tuple[int, int] | None, cores: int | None) -> int:
    """Threads for the float64 oracle's host products: half the host's cores shared by the run's processes (one
    process, or the K lanes of a pass; the other half is left to the compile workers and the timing loops)."""
    k = 1 if lane is None else max(1, int(lane[1]))
    return max(1, (cores or 1) // (2 * k))


def _compile_result(fut) -> float | None:
    """A compile-ahead future's seconds; None when it failed (the first call compiles again and raises there)."""
    if fut is None:
        return None
    try:
        return fut.result()
    except Exception:  # noqa: BLE001 -- the pair's first call repeats the compile and records its error
        return None


def merge_timings(parts: list[timing.Timing], *, rounds: int, others: int) -> timing.Timing:
    """One ``Timing`` from a pair's ``--rounds`` parts: their samples in order; the clock of the parts (a part on
    another clock, i.e. a fallback in one round, is named in the notes and the clock reads as the first part's
    fallback label so the record is marked); notes and L2 flush of all."""
    if not parts:
        raise ValueError("no timing rounds")
    clocks = [t.clock for t in parts]
    clock = next((c for c in clocks if c != parts[0].requested), clocks[0]) if len(set(clocks)) > 1 else clocks[0]
    notes = [n for t in parts for n in t.notes]
    if len(set(clocks)) > 1:
        notes.append(f"rounds timed on different clocks: {clocks}")
    notes.append(f"samples taken in {len(parts)} rounds of --rounds {rounds}, round-robin with {others} other "
                 f"implementation(s) of the workload")
    return timing.Timing(tuple(x for t in parts for x in t.samples_us), clock, all(t.l2_flushed for t in parts),
                         tuple(dict.fromkeys(notes)), parts[0].requested, parts[0].program)


def _cpu_gate_flops(w: Workload) -> float:
    """The workload's dense FLOPs (a train step's: 3.5x), for the CPU interpret-mode size gate (``--cpu-max-flops``)
    only."""
    f = 4.0 * w.batch * w.heads_q * w.q_len * w.kv_len * w.head_dim
    return f * roofline.TRAIN_FLOPS_FACTOR if w.family == "train" else f


def _sync_for(framework: str):
    if framework == "torch":
        def sync(_):
            import torch

            torch.cuda.synchronize()
        return sync
    import jax

    return jax.block_until_ready


def _is_oom(e: BaseException) -> bool:
    return says_out_of_memory(f"{type(e).__name__} {e}")


_SMEM = (re.compile(r"shared memory size limit exceeded: requested (\d+), available:? (\d+)", re.I),  # XLA / jaxlib
         re.compile(r"out of resource: shared memory, required: (\d+), hardware limit: (\d+)", re.I))  # Triton


def _shared_memory_reason(msg: str) -> str | None:
    """``shared memory: needs N bytes, limit M`` when ``msg`` is a shared-memory limit (not device memory)."""
    for pat in _SMEM:
        m = pat.search(msg)
        if m:
            need, limit = int(m.group(1)), int(m.group(2))
            return (f"shared memory: needs {need} bytes, limit {limit} (per thread block, not device memory; the "
                    "launch configuration asks for too much)")
    return None


def _generation_order() -> list[str]:
    """The generation table's order, written into the run header so that ``report`` needs no live registry."""
    try:
        from attn_core import generations as core

        return list(core.ids())
    except Exception:  # the header is still written; report falls back to the live table
        return []


def _failure_status(e: BaseException) -> str:
    # Refusals raised by the implementations themselves (NotImplementedError, torch's "No available
    # kernel") are 'unsupported', not failures.
    if isinstance(e, NotImplementedError) or "no available kernel" in str(e).lower():
        return "unsupported"
    return "failed"


def _reason(e: BaseException) -> str:
    msg = " ".join(str(e).split())
    full = f"{type(e).__name__}: {msg[:400]}"
    smem = _shared_memory_reason(msg)
    return f"{smem}; {full}" if smem else full
