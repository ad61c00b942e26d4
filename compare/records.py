"""The record schema of a ``compare run``: one JSON object per line in ``results/<run-id>/records.jsonl``.

Record types (``type``):
  * ``header``   — once per run: run id, command, env, config, options;
  * ``ceilings`` — once per run: the device's measured ceilings (or ``null`` with a reason on the CPU) and
    the datasheet values they sit next to;
  * ``clock_check`` — once per run and clock: a device copy of known size timed under that clock, the
    achieved GB/s over the measured copy ceiling (a clock that lies shows here);
  * ``result``   — one per (workload, implementation): ``workload``, ``impl`` (with the declared
    ``lowering`` and the launch ``plan`` made before the run), ``status``, ``reason``, ``metrics``,
    ``agreement``, ``prediction`` (with the ``roofline_inputs`` it assumed), ``env``, ``repro``;
  * ``probe``    — written by a probe script (``scripts/*_probe.py``, through :class:`ProbeWriter`), never by
    ``compare run``: one measurement compare has no workload form for, after the probe's own ``header``:
    ``probe`` (the script), ``kind``, ``workload`` (the shape it ran at, ``name`` first), ``metrics`` (compare's
    names: ``time_us_p10/p50/p90`` on a GPU, ``cpu_interpret_us_*`` on the CPU, ``clock``, and the probe's own),
    ``env``, ``repro``; ``validate`` checks them.

Statuses: ``ok`` (ran, finite, within the precision's tolerance of the oracle), ``wrong`` (ran and finite but
beyond that tolerance), ``failed`` (raised, produced NaN/Inf, or its kernel module does not import),
``oom``, ``unsupported`` (the implementation refuses the workload: dtype, head dim, GQA, shape rules),
``unavailable`` (the machine lacks what it needs: a CUDA GPU, Hopper, cuda_ref's build or table),
``not_built`` (the generation has no twin on that side yet),
``skipped`` (over the time budget, too large for CPU interpret mode). Every non-``ok`` status carries a
``reason``; a record is never silently missing.

``validate(record)`` returns the list of schema violations (empty when valid); the end-to-end test uses it.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "RAN_STATUSES",
    "FRAMEWORKS",
    "validate",
    "write_jsonl",
    "read_jsonl",
    "collect_env",
    "get",
    "ProbeWriter",
]

SCHEMA_VERSION = 1
STATUSES = ("ok", "wrong", "failed", "oom", "unsupported", "unavailable", "not_built", "skipped")
RAN_STATUSES = ("ok", "wrong")  # the implementation produced an output we could check
FRAMEWORKS = ("pallas", "cuda", "torch", "jax", "jax-pallas")
RECORD_TYPES = ("header", "ceilings", "clock_check", "result", "probe")

# Present on every result record (values may be null where the status says why).
_RESULT_KEYS = (
    "workload.name", "workload.family", "workload.dtype", "impl.name", "impl.framework", "impl.generation",
    "impl.config", "status", "reason", "env.gpu", "env.versions", "env.device_kind", "repro",
)
# Present (and numeric where a GPU clock ran) on a result that ran.
_TIMING_KEYS = (
    "metrics.time_us_p50", "metrics.time_us_p10", "metrics.time_us_p90", "metrics.tflops", "metrics.gbps",
    "metrics.roofline_fraction", "metrics.hbm_fraction", "metrics.tc_fraction", "metrics.limiter",
    "metrics.clock", "metrics.e2e_us_p50",
)
_AGREEMENT_KEYS = ("agreement.max_abs_err", "agreement.rel_l2_err", "agreement.subset", "agreement.tol_rel_l2")


def get(record: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``get(r, "metrics.time_us_p50")``: nested lookup, ``default`` when any level is missing."""
    cur: Any = record
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def _has(record: dict[str, Any], dotted: str) -> bool:
    sentinel = object()
    return get(record, dotted, sentinel) is not sentinel


def _finite_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate(record: dict[str, Any]) -> list[str]:
    """Schema violations of one record (empty list: valid)."""
    errs: list[str] = []
    t = record.get("type")
    if t not in RECORD_TYPES:
        return [f"type must be one of {RECORD_TYPES}; got {t!r}"]
    if record.get("schema") != SCHEMA_VERSION:
        errs.append(f"schema must be {SCHEMA_VERSION}; got {record.get('schema')!r}")
    if not record.get("run_id"):
        errs.append("run_id missing")
    if t == "ceilings":
        if "measured" not in record or "datasheet" not in record:
            errs.append("ceilings record needs 'measured' (dict or null) and 'datasheet' (dict or null)")
        if record.get("measured") is None and not record.get("reason"):
            errs.append("ceilings.measured is null without a reason")
        return errs
    if t == "probe":
        return errs + _validate_probe(record)
    if t != "result":
        if not isinstance(record.get("env"), dict):
            errs.append(f"{t} record needs env")
        return errs

    for k in _RESULT_KEYS:
        if not _has(record, k):
            errs.append(f"missing {k}")
    status = record.get("status")
    if status not in STATUSES:
        errs.append(f"status must be one of {STATUSES}; got {status!r}")
    fw = get(record, "impl.framework")
    if fw not in FRAMEWORKS:
        errs.append(f"impl.framework must be one of {FRAMEWORKS}; got {fw!r}")
    if status != "ok" and not record.get("reason"):
        errs.append(f"status {status!r} needs a reason")
    if status in RAN_STATUSES:
        for k in _AGREEMENT_KEYS:
            if not _has(record, k):
                errs.append(f"ran ({status}) but missing {k}")
        for k in ("agreement.max_abs_err", "agreement.rel_l2_err"):
            v = get(record, k)
            if not _finite_number(v):  # NaN never passes: a non-finite output is status 'failed'
                errs.append(f"{k} must be a finite number on a record that ran; got {v!r}")
        for k in _TIMING_KEYS:
            if not _has(record, k):
                errs.append(f"ran ({status}) but missing {k}")
        kind = get(record, "env.device_kind")
        if kind == "gpu":
            for k in ("metrics.time_us_p50", "metrics.time_us_p10", "metrics.time_us_p90"):
                if not _finite_number(get(record, k)):
                    errs.append(f"GPU record that ran needs a finite {k}")
            p10, p50, p90 = (get(record, f"metrics.time_us_{p}") for p in ("p10", "p50", "p90"))
            if all(_finite_number(x) for x in (p10, p50, p90)) and not p10 <= p50 <= p90:
                errs.append(f"percentiles out of order: {p10=} {p50=} {p90=}")
        elif kind == "cpu-interpret":
            # CPU interpret timings are not kernel timings: they live under their own key, never in time_us_*.
            for k in ("metrics.time_us_p50", "metrics.tflops", "metrics.roofline_fraction"):
                if get(record, k) is not None:
                    errs.append(f"CPU-interpret record must not carry {k} (labelled cpu_interpret_us_* instead)")
    return errs


def _validate_probe(record: dict[str, Any]) -> list[str]:
    errs = [f"probe record needs {k}" for k in ("probe", "kind", "workload.name", "metrics.clock", "repro")
            if not get(record, k)]
    if not isinstance(record.get("env"), dict):
        errs.append("probe record needs env")
    key = "time_us" if get(record, "env.device_kind") == "gpu" else "cpu_interpret_us"
    ps = [get(record, f"metrics.{key}_{p}") for p in ("p10", "p50", "p90")]
    if not all(_finite_number(x) for x in ps):
        errs.append(f"probe record needs finite metrics.{key}_p10/p50/p90; got {ps}")
    elif not ps[0] <= ps[1] <= ps[2]:
        errs.append(f"percentiles out of order: {ps}")
    if key != "time_us" and get(record, "metrics.time_us_p50") is not None:
        errs.append("a CPU probe record must not carry metrics.time_us_p50 (labelled cpu_interpret_us_* instead)")
    return errs


class ProbeWriter:
    """A probe script's records in the compare schema: one ``header`` (``schema``, ``type``, ``run_id``, ``env``
    from :func:`collect_env`, ``probe``, ``argv``, ``options``), then :meth:`emit` per measurement (a ``probe``
    record). ``out_dir``: ``out_dir/records.jsonl`` through :func:`open_new` (never overwritten); None prints only.
    Every record is printed as one JSON line without its ``env``."""

    def __init__(self, probe: str, out_dir: str | Path | None, argv: list[str] | None, options: dict[str, Any]):
        self.probe = probe
        self.env = collect_env()
        kind = re.sub(r"[^a-z0-9]+", "-", (self.env["gpu"] or "cpu-interpret").lower()).strip("-")[:40]
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}_{probe}_{kind}"
        self.argv = list(sys.argv[1:] if argv is None else argv)
        self.repro = " ".join(["PYTHONPATH=. python", f"scripts/{probe}.py", *self.argv])
        self.records: list[dict[str, Any]] = []
        self._f = open_new(out_dir)
        self.path = Path(self._f.name) if self._f else None
        self._write({"schema": SCHEMA_VERSION, "type": "header", "run_id": self.run_id, "env": self.env,
                     "probe": probe, "argv": self.argv, "options": options,
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    def emit(self, kind: str, workload: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
        rec = {"schema": SCHEMA_VERSION, "type": "probe", "run_id": self.run_id, "env": self.env, "probe": self.probe,
               "kind": kind, "workload": workload, "metrics": metrics, "repro": self.repro}
        self.records.append(rec)
        self._write(rec)
        return rec

    def timing_metrics(self, t: Any) -> dict[str, Any]:
        """A ``compare.timing.Timing`` as compare's metric names: ``time_us_p10/p50/p90`` (+ min, mean, n) on a GPU,
        ``cpu_interpret_us_*`` on the CPU (never read as a kernel time there), the clock and its notes."""
        key = "time_us" if self.env["device_kind"] == "gpu" else "cpu_interpret_us"
        st = t.stats
        return {**{f"{key}_{p}": st[p] for p in ("p10", "p50", "p90", "min", "mean")}, "samples": st["n"],
                "clock": t.clock, "l2_flushed": t.l2_flushed, "clock_notes": list(t.notes)}

    def _write(self, rec: dict[str, Any]) -> None:
        if self._f:
            self._f.write(json.dumps(rec, default=_json_default, allow_nan=True) + "\n")
            self._f.flush()
        print(json.dumps({k: v for k, v in rec.items() if k != "env"}, default=_json_default), flush=True)

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Append records (the run writes as it goes, so a crash keeps what finished)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r, default=_json_default, allow_nan=True) + "\n")


def open_new(out_dir: str | Path | None):
    """A probe script's ``out_dir/records.jsonl``, opened for writing, or None without ``out_dir``; a file already
    there is never overwritten (SystemExit naming it)."""
    if not out_dir:
        return None
    path = Path(out_dir) / "records.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return path.open("x")
    except FileExistsError:
        raise SystemExit(f"{path} exists; pick a new --out") from None


def _json_default(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, frozenset, tuple)):
        return list(x)
    return str(x)


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a ``.jsonl`` file, or of a gzipped one (``.jsonl.gz``: how results/ keeps them)."""
    path = Path(path)
    with (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not JSON: {e}") from None


def _cmd(args: list[str]) -> str | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _version(mod: str) -> str | None:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", None)
    except Exception:  # an optional library that fails to import is simply absent from the record
        return None


def git_state() -> dict[str, Any]:
    """``git_sha``, ``git_sha_source``, ``dirty`` (and ``git_sha_local`` when both sources exist).

    The device machine gets a copy of the tree whose ``.git`` (when there is one) is the last *landed* commit
    with the session's work on top as uncommitted changes, so the sha the caller sends in
    ``PALLAS_ATTN_GIT_SHA`` wins (``git_sha_source: "env PALLAS_ATTN_GIT_SHA"``), with ``dirty`` from
    ``PALLAS_ATTN_GIT_DIRTY`` (``1``/``0``; unknown, ``null``, when not sent). Otherwise the checkout's own
    ``git rev-parse`` and ``git status`` (tracked files) answer (``git_sha_source: "git"``); ``null`` when
    neither exists. The sha is never suffixed: ``dirty`` says it.
    """
    repo = Path(__file__).resolve().parent.parent
    sha = _cmd(["git", "-C", str(repo), "rev-parse", "HEAD"])
    status = _cmd(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"]) if sha else None
    local_dirty = None if sha is None else bool(status)
    sent = (os.environ.get("PALLAS_ATTN_GIT_SHA") or "").strip()
    if sent:
        flag = os.environ.get("PALLAS_ATTN_GIT_DIRTY")
        dirty = None if flag is None or flag.strip() == "" else flag.strip().lower() not in ("0", "false", "no")
        out: dict[str, Any] = {"git_sha": sent, "git_sha_source": "env PALLAS_ATTN_GIT_SHA", "dirty": dirty}
        if sha and sha != sent:
            out["git_sha_local"] = sha + ("-dirty" if local_dirty else "")
        return out
    if sha:
        return {"git_sha": sha, "git_sha_source": "git", "dirty": local_dirty}
    return {"git_sha": None, "git_sha_source": None, "dirty": None}


def collect_env() -> dict[str, Any]:
    """GPU, driver, CUDA, library versions and the git sha: what every record carries."""
    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "jax": _version("jax"),
        "jaxlib": _version("jaxlib"),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "triton": _version("triton"),
    }
    gpu = None
    device_kind = "cpu-interpret"
    driver = cuda = cudnn = None
    try:
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if gpus:
            gpu = gpus[0].device_kind
            device_kind = "gpu"
    except RuntimeError:
        pass
    if "torch" in sys.modules or versions["torch"]:
        try:
            import torch

            cuda = torch.version.cuda
            if torch.cuda.is_available():
                gpu = gpu or torch.cuda.get_device_name(0)
                device_kind = "gpu"
                cudnn = torch.backends.cudnn.version()
        except Exception:  # torch present but broken: the record says so through the missing fields
            pass
    smi = _cmd(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem",
                "--format=csv,noheader"]) if device_kind == "gpu" else None
    clocks = None
    if smi:
        parts = [p.strip() for p in smi.splitlines()[0].split(",")]
        driver = parts[0]
        clocks = dict(zip(("sm_mhz", "max_sm_mhz", "mem_mhz"), parts[1:]))
    versions.update({"cuda": cuda, "cudnn": cudnn, "driver": driver})
    git = git_state()
    return {
        "gpu": gpu,
        "device_kind": device_kind,
        "clocks": clocks,
        "versions": versions,
        **git,
        "host": platform.node(),
        "env_flags": {k: os.environ.get(k) for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_FLAGS") if k in os.environ},
    }
