"""``compare run --jobs K``: one run split over K processes ("lanes") on one GPU, its timing windows one at a time.

Why: most of a sweep workload's host time is compiles (Mosaic GPU, XLA), the float64 oracle and first calls, work
that several workloads can do at once; only the timing windows (the kernel clock and the host-wall e2e figures) need
the GPU to themselves (docs/compare.md, "Lanes").

How:
* the parent (``run_jobs``) starts K children, each the same ``compare run`` with ``--lane i/K``; it never touches
  the GPU itself;
* a child claims the plan's workloads one at a time from a shared counter (``claim``), so long and short workloads
  spread over the lanes as they come;
* a child holds ``GpuLock`` *shared* around everything it runs on the GPU (inputs, oracle copies, first calls,
  agreement, warm-up) and *exclusive* around its timing windows and the ceilings: an exclusive holder waits until no
  other lane is inside a shared section, and no lane enters one while it holds or waits (a writer-first
  readers-writer lock over two ``flock`` files). Compiles that run nothing on the GPU (Mosaic GPU, cuDNN and FA3
  custom calls on the compile workers; a workload's input and agreement programs) and the oracle's numpy arithmetic
  on host copies (``GpuLock.released``, through ``accuracy.host_sections``) run outside any lock;
* one lane (whichever claims the role first) measures the ceilings and runs the clock check, exclusively; the others
  wait for them (``ceilings.json``) and use the same values;
* each lane's JAX memory is capped at 0.9/K of the GPU (``XLA_PYTHON_CLIENT_MEM_FRACTION``, and torch's
  ``set_per_process_memory_fraction``); a workload whose estimate is over that (``defer_alone``), that ran out of
  memory in a lane, or whose lane died before it finished, runs once the lanes are done: with K > 2 first in a second
  stage of ``SECOND_STAGE_LANES`` lanes (0.45 of the GPU each; session 27), then, what that stage leaves or runs out
  of memory in, alone, in one process with the whole GPU;
* the parent merges the lanes' records into one run (one run id, one header, the role lane's ceilings and clock
  check, the results in the plan's order): the same file a one-process run writes. The lanes' own files stay in
  ``<out>/lanes/``.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

LANE_MEMORY = 0.9  # of the GPU, shared by the lanes (the rest: CUDA contexts, cuDNN and cuBLAS workspaces)
ROLE_FILE = "ceilings.claim"
CEILINGS_FILE = "ceilings.json"
PLAN_FILE = "plan.json"
CEILINGS_WAIT_S = 900.0  # how long a lane waits for the role lane's ceilings before giving up
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
SECOND_STAGE_LANES = 2  # the lanes of the second stage (the workloads the main pass left), when --jobs is more
STAGE2 = "stage2"  # its pass name (lane files stage2<i>.jsonl, done.stage2.<i>, names in stage2.json)


# ------------------------------------------------------------------------------------------- the lock


class NoLock:
    """One process: nothing to share the GPU with."""

    @contextlib.contextmanager
    def released(self):
        yield

    @contextlib.contextmanager
    def shared(self):
        yield

    @contextlib.contextmanager
    def exclusive(self):
        yield

    @contextlib.contextmanager
    def compiling(self):
        yield

    def waits(self) -> dict[str, float]:
        return {}

    def holds(self) -> dict[str, int]:
        return {}


def _through_turnstile(turn, main, mode: str) -> None:
    """Take ``main`` (``"shared"`` or ``"exclusive"``) through the turnstile ``turn``: held exclusively while waiting,
    so a writer waiting for the readers to leave keeps new readers out (``GpuLock``'s writer-first rule)."""
    fcntl.flock(turn, fcntl.LOCK_EX)
    try:
        fcntl.flock(main, fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH)
    finally:
        fcntl.flock(turn, fcntl.LOCK_UN)


class GpuLock:
    """A writer-first readers-writer lock between processes: ``shared()`` around GPU work that needs no quiet GPU,
    ``exclusive()`` around timing windows. Two ``flock`` files: the turnstile ``<path>.turn`` (everyone passes
    through it, exclusively, to change their hold on the main file) and ``<path>`` (shared or exclusive). A writer
    keeps the turnstile while it waits for the readers to leave, so no new reader enters meanwhile.

    Re-entrant within the process (a shared section inside an exclusive one is already covered; an exclusive one
    inside a shared one gives up the shared hold first, so two lanes that both want to time never wait on each
    other's shared hold) and for the main thread only: the compile workers never take it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._main = open(self.path, "a+")  # noqa: SIM115 -- held for the process's life
        self._turn = open(str(self.path) + ".turn", "a+")  # noqa: SIM115
        self.mode: str | None = None
        self._wait = {"shared": 0.0, "exclusive": 0.0}
        self._holds = {"shared": 0, "exclusive": 0}

    def _acquire(self, mode: str) -> None:
        t0 = time.perf_counter()
        _through_turnstile(self._turn, self._main, mode)
        self._wait[mode] += time.perf_counter() - t0
        self._holds[mode] += 1
        self.mode = mode

    def _release(self) -> None:
        fcntl.flock(self._main, fcntl.LOCK_UN)
        self.mode = None

    @contextlib.contextmanager
    def shared(self):
        if self.mode is not None:  # already shared or exclusive: covered
            yield
            return
        self._acquire("shared")
        try:
            yield
        finally:
            self._release()

    @contextlib.contextmanager
    def exclusive(self):
        if self.mode == "exclusive":
            yield
            return
        was_shared = self.mode == "shared"
        if was_shared:
            self._release()
        self._acquire("exclusive")
        try:
            yield
        finally:
            self._release()
            if was_shared:
                self._acquire("shared")

    @contextlib.contextmanager
    def released(self):
        """Within a shared section, a stretch of host-only work (numpy on host copies) with the shared hold given up,
        so a lane waiting to time need not wait for it; the hold is taken again after. Elsewhere: nothing."""
        if self.mode != "shared":
            yield
            return
        self._release()
        try:
            yield
        finally:
            self._acquire("shared")

    @contextlib.contextmanager
    def compiling(self):
        """Around a compile (any thread) when ``COMPILE_UNDER_LOCK`` is on: a shared hold of its own, through file
        descriptions of its own (``flock`` treats each open file description as another holder, so a compile worker
        thread holds beside the main thread and no timing window of any lane overlaps it). An XLA compile may run
        autotuning kernels and loads the executable onto the GPU: GPU work from another process during another lane's
        timing window. Off: nothing (the compiles run outside any lock, as before session 28)."""
        if not compile_under_lock():
            yield
            return
        main = open(self.path, "a+")  # noqa: SIM115 -- closed below, which releases the hold
        turn = open(str(self.path) + ".turn", "a+")  # noqa: SIM115
        t0 = time.perf_counter()
        try:
            _through_turnstile(turn, main, "shared")
            self._wait["compile"] = self._wait.get("compile", 0.0) + time.perf_counter() - t0
            yield
        finally:
            main.close()
            turn.close()

    def waits(self) -> dict[str, float]:
        """Host seconds spent waiting for the lock so far, by mode."""
        return {k: round(v, 3) for k, v in self._wait.items()}

    def holds(self) -> dict[str, int]:
        """How many times this process took the lock so far, by mode (each take may wait behind another lane)."""
        return dict(self._holds)


# ------------------------------------------------------------------------------------ shared files


def claim(path: str | os.PathLike) -> int:
    """The next index of a counter file shared by the lanes (0, 1, 2, ... across all of them)."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        text = f.read().strip()
        i = int(text) if text else 0
        f.seek(0)
        f.truncate()
        f.write(str(i + 1))
        f.flush()
        return i


def claim_role(lane_dir: Path) -> bool:
    """True for the first lane to ask (it measures the ceilings and runs the clock check)."""
    try:
        fd = os.open(lane_dir / ROLE_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def publish(path: Path, obj: Any) -> None:
    """Write JSON so that a reader sees all of it or nothing (rename)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, default=str))
    os.replace(tmp, path)


def wait_for(path: Path, *, timeout_s: float = CEILINGS_WAIT_S, poll_s: float = 0.2) -> Any:
    """The JSON the role lane publishes at ``path``; RuntimeError after ``timeout_s``, or at once when the role lane's
    process (its pid in ``ROLE_FILE``) is gone without publishing it."""
    t0 = time.monotonic()
    while not path.exists():
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"lanes: no {path.name} from the lane that measures the ceilings after {timeout_s:g} s")
        if not _role_alive(path.parent) and not path.exists():
            raise RuntimeError(f"lanes: the lane that measures the ceilings ended without publishing {path.name}")
        time.sleep(poll_s)
    return json.loads(path.read_text())


def _role_alive(lane_dir: Path) -> bool:
    """Whether the process that claimed the role is still running (True while its pid is not yet written)."""
    try:
        pid = int((lane_dir / ROLE_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return True
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_done(lane_dir: Path, lane: int, pass_name: str, name: str) -> None:
    """A workload's records are written (the parent reruns a claimed workload that never got here)."""
    with open(lane_dir / f"done.{pass_name}.{lane}", "a") as f:
        f.write(name + "\n")


def done_names(lane_dir: Path, pass_name: str = "*") -> set[str]:
    """The workloads whose records a lane of ``pass_name`` (every pass by default) wrote in full."""
    names: set[str] = set()
    for p in lane_dir.glob(f"done.{pass_name}.*"):
        names.update(x for x in p.read_text().splitlines() if x)
    return names


def parse_lane(spec: str) -> tuple[int, int]:
    """``"i/K"`` -> ``(i, K)`` with 0 <= i < K."""
    from .workloads import UsageError

    try:
        i, k = (int(x) for x in spec.split("/"))
    except ValueError:
        raise UsageError(f"--lane wants i/K (e.g. 0/4); got {spec!r}") from None
    if not 0 <= i < k:
        raise UsageError(f"--lane {spec}: want 0 <= i < K")
    return i, k


def cap_torch_memory() -> None:
    """A lane's torch allocations capped as its JAX ones are (``PALLAS_ATTN_LANE_TORCH_FRACTION``), best effort:
    torch missing or without CUDA leaves nothing to cap."""
    frac = os.environ.get("PALLAS_ATTN_LANE_TORCH_FRACTION")
    if not frac:
        return
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(float(frac))
    except Exception:  # noqa: BLE001 -- no torch: nothing to cap
        pass


def estimated_bytes(w) -> int:
    """A workload's device memory in a lane, roughly: 3x its KV cache (twice for a paged one: the pools and the dense
    view) and its query-sized tensors (q and the output; train also the cotangent and the gradients). Session 26's
    12 GB lanes ran every workload with a 3 GiB cache and ran out of memory at every one with 4 GiB (XLA's and Triton's
    autotuners, torch's copies). MLA and an NVFP4 cache take 6x (``HEAVY_FACTOR``), and a ragged MLA batch its mean
    length (3/4 of ``kv_len``: lengths drawn in [kv_len / 2, kv_len])."""
    item = 4 if str(w.dtype) == "float32" else 2
    if w.family == "mla":
        kv = w.batch * w.kv_len * w.head_dim * item
        if getattr(w, "ragged", False):
            kv = kv * 3 // 4
    else:
        kv = 2 * w.batch * w.kv_len * w.heads_kv * w.head_dim * item
    if w.family == "paged_decode":
        kv *= 2
    q = w.batch * w.q_len * w.heads_q * w.head_dim * item
    heavy = w.family == "mla" or getattr(w, "kv_dtype", None) == "nvfp4"
    return (HEAVY_FACTOR if heavy else 3) * (kv + q * (4 if w.family == "train" else 2))


# The estimate's factor for MLA (its peers and oracle hold the latent cache several times over, XLA's MLA peer its
# fp32 scores) and an NVFP4 cache (made from a bf16 one through fp32): the lanes that ran out of memory say 6, where 3
# said they fit. DeepSeek MLA, 576-wide latent rows, 32k tokens each: B 64 (2.4 GB of latent) out of memory in an H100
# lane of 12 GiB (session 28) and ran in an H200 lane of 21 GiB (session 37), B 128 out of memory there, B 32 and the
# ragged B 64 ran in 12 GiB, the ragged B 128 in 21. NVFP4 Llama B 32 S 32k (a 4.3 GB bf16 cache) out of memory in 21
# GiB (session 37, twice) where its fp8 twin ran; B 32 S 8k ran.
HEAVY_FACTOR = 6


# The CPU priority (nice) of a lane's compile workers, and the ptxas processes they start (session 27): built against
# a suspected cause of the lanes' timing spread (the other lanes' compiles taking the cores from the timed lane's
# launch thread). Measured in session 28: no effect on the spread (50 against 46 of 156 prefill records with p90/p10 >
# 1.05 at nice +10 and 0), which is no lanes effect at all (one process at --rounds 1 spreads as much; docs/compare.md,
# "Timing noise, measured"). Kept: it costs nothing and keeps the compiles polite. PALLAS_ATTN_LANE_COMPILE_NICE=0
# turns it off.
COMPILE_NICE = 10

# Whether a lane's compiles (the compile workers' and the main thread's ahead-of-the-lock ones) hold the GPU lock
# shared (``GpuLock.compiling``), so no lane's timing window overlaps any compile: an XLA compile can run kernels on
# the GPU (autotuning) and loads its executable there. A diagnostic, off: measured in session 28, it left the spread
# as it was (45 of 156 either way) and doubled the lanes' wall time. PALLAS_ATTN_LANE_COMPILE_LOCK=1 turns it on.
COMPILE_UNDER_LOCK = False


def compile_under_lock() -> bool:
    v = os.environ.get("PALLAS_ATTN_LANE_COMPILE_LOCK")
    return COMPILE_UNDER_LOCK if v is None else v not in ("", "0")


def lower_thread_priority() -> None:
    """A compile worker's initializer in a lane: this thread's nice value raised by ``COMPILE_NICE`` (Linux: nice is
    per thread, and a process it starts inherits it); nothing where the OS does not allow it."""
    try:
        step = int(os.environ.get("PALLAS_ATTN_LANE_COMPILE_NICE", COMPILE_NICE))
        if step > 0 and hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + step))
    except (OSError, ValueError):
        pass


def gib(n: int) -> str:
    """Bytes for a progress line: GiB, or MiB below one GiB."""
    return f"{n / 2**30:.0f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def defer_alone(w, bytes_limit: int | None) -> bool:
    """True when a lane should leave ``w`` to the pass that runs alone with the whole GPU: its estimate
    (``estimated_bytes``) is over the lane's memory limit (None: unknown, never defer)."""
    return bytes_limit is not None and estimated_bytes(w) > bytes_limit


def device_bytes_limit() -> int | None:
    """This process's JAX memory limit on its first GPU (a lane's share), or None; ``PALLAS_ATTN_LANE_BYTES_LIMIT``
    (bytes) sets it instead (a smaller share by hand; the CPU tests)."""
    if os.environ.get("PALLAS_ATTN_LANE_BYTES_LIMIT"):
        return int(os.environ["PALLAS_ATTN_LANE_BYTES_LIMIT"])
    try:
        import jax

        dev = jax.devices()[0]
        if dev.platform != "gpu":
            return None
        return int((dev.memory_stats() or {}).get("bytes_limit") or 0) or None
    except Exception:  # noqa: BLE001 -- unknown: never defer
        return None


# ----------------------------------------------------------------------------------------- the parent

# the options a lane does not take from the parent: the parent's own (where the run goes, how it is shown, its exit
# code, --jobs itself; --look-ahead is refused with --jobs) and the lane options set per lane. Every other option is
# repeated as the parent has it: the selection, and the record's own flags (``RunOptions.repro_flags``: every
# measurement option that differs from its default); tests/test_lanes.py checks a lane's options equal the parent's
PARENT_ONLY = frozenset({"jobs", "out", "append", "quiet", "compile_workers", "allow_clock_fallback", "look_ahead",
                         "lane", "lane_dir", "lane_pass", "lane_names", "run_id", "argv"})


def lane_argv(opts, *, lane: int, lanes: int, lane_dir: Path, run_id: str, out: Path, pass_name: str,
              names_file: Path | None, compile_workers: int) -> list[str]:
    """The child command of one lane."""
    args = [sys.executable, "-m", "compare", "run", "--config", str(opts.config)]
    for flag, vals in (("--only", opts.only), ("--impl", opts.impl)):
        for v in vals:
            args += [flag, str(v)]
    args += opts.repro_flags()
    args += ["--out", str(out), "--quiet", "--compile-workers", str(compile_workers), "--lane", f"{lane}/{lanes}",
             "--lane-dir", str(lane_dir), "--lane-pass", pass_name, "--run-id", run_id]
    if names_file is not None:
        args += ["--lane-names", str(names_file)]
    return args


def _spawn(cmds: list[tuple[list[str], dict[str, str]]]) -> tuple[list[int], bool]:
    """Start the lanes and wait for them; ``(exit codes, interrupted)``."""
    procs = [subprocess.Popen(cmd, env=env) for cmd, env in cmds]
    try:
        return [p.wait() for p in procs], False
    except KeyboardInterrupt:  # the lanes got the same SIGINT: let them write what finished
        return [p.wait() for p in procs], True


def _lane_env(lanes: int, main_lanes: int | None = None) -> dict[str, str]:
    """A lane's environment at ``lanes`` lanes. A hand-set ``PALLAS_ATTN_LANE_BYTES_LIMIT`` is a lane's share at
    ``main_lanes`` (the run's ``--jobs``): a stage with fewer lanes gets it scaled by ``main_lanes / lanes``, as the
    memory fraction is."""
    env = dict(os.environ)
    hand = env.get("PALLAS_ATTN_LANE_BYTES_LIMIT")
    if hand and main_lanes and lanes > 1 and lanes != main_lanes:
        env["PALLAS_ATTN_LANE_BYTES_LIMIT"] = str(int(int(hand) * main_lanes / lanes))
    env.setdefault("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    # one BLAS thread a lane: each lane is ``python -m compare``, whose __main__ sets BLAS_THREAD_VARS unless given
    if lanes > 1:
        frac = f"{LANE_MEMORY / lanes:.3f}"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = frac
        env["PALLAS_ATTN_LANE_TORCH_FRACTION"] = frac
    else:  # the rerun pass: the whole GPU, as a one-process run has it
        env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
        env.pop("PALLAS_ATTN_LANE_TORCH_FRACTION", None)
    return env


def run_jobs(opts) -> int:
    """``--jobs K``: the lanes, the rerun pass, the merge; the exit code (0; 1 nothing ran; 2 workloads missing; 3 a
    clock fallback, unless accepted)."""
    from . import records
    from .workloads import UsageError, ensure_writable

    k = int(opts.jobs)
    if getattr(opts, "append", False):
        raise UsageError("--jobs and --append: a run over lanes writes a new records file; give a new --out")
    if getattr(opts, "look_ahead", False):
        raise UsageError("--jobs and --look-ahead: lanes already overlap one workload's compiles with another's "
                         "timing; use one or the other")
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out = Path(opts.out) if opts.out else Path("results") / f"{stamp}_lanes{k}"
    path = out if out.suffix == ".jsonl" else out / "records.jsonl"
    if path.is_file() and path.stat().st_size > 0:
        raise UsageError(f"{path} already holds records; not overwriting it: give a new --out")
    ensure_writable(path, f"--out {opts.out or path}")
    lane_dir = path.parent / (f"{path.stem}.lanes" if out.suffix == ".jsonl" else "lanes")
    if lane_dir.exists() and any(lane_dir.iterdir()):
        raise UsageError(f"{lane_dir} is not empty (the lanes of an earlier run?); give a new --out")
    lane_dir.mkdir(parents=True, exist_ok=True)
    run_id = f"{stamp}_lanes{k}"
    t0 = time.perf_counter()
    print(f"compare run --jobs {k}: {k} lanes, {_workers_per_lane(opts, k)} compile workers each, lane files in "
          f"{lane_dir}", flush=True)
    rcs, interrupted = _run_pass(opts, k, k, lane_dir, run_id, "main", [lane_dir / f"lane{i}.jsonl" for i in range(k)])
    plan_path = lane_dir / PLAN_FILE
    if not plan_path.exists():
        print(f"lanes: no lane published the plan (exit codes {rcs}); nothing to merge", file=sys.stderr)
        return 2
    plan = json.loads(plan_path.read_text())["workloads"]
    lane_files = [lane_dir / f"lane{i}.jsonl" for i in range(k)]
    recs = [r for p in lane_files if p.exists() for r in records.read_jsonl(p)]
    rerun = [] if interrupted else rerun_names(plan, recs, done_names(lane_dir, "main"))
    stage2: tuple[list[Path], list[str]] | None = None
    k2 = SECOND_STAGE_LANES
    if rerun and k > k2 and len(rerun) > 1:
        # the second stage: the workloads the main pass left, over fewer lanes with a larger share of memory each
        # (session 27: the 27 left by six lanes ran over two in 231 s, against ~12 s each alone); what is still too
        # large for its share, or runs out of memory there, goes on to the pass alone
        stage_opts = _left_of_budget(opts, t0, len(rerun), f"over {k2} lanes")
        if stage_opts is None:
            rerun = []
        else:
            print(f"lanes: {len(rerun)} workloads over {k2} lanes of {LANE_MEMORY / k2:.2f} of the GPU each (too large "
                  f"for a lane's memory, out of memory in a lane, or their lane ended before them): "
                  f"{', '.join(rerun[:6])}{' ...' if len(rerun) > 6 else ''}", flush=True)
            names_file = lane_dir / f"{STAGE2}.json"
            names_file.write_text(json.dumps(rerun))
            files2 = [lane_dir / f"{STAGE2}{i}.jsonl" for i in range(k2)]
            rc, interrupted = _run_pass(stage_opts, k2, k, lane_dir, run_id, STAGE2, files2, names_file)
            rcs += rc
            recs2 = [r for p in files2 if p.exists() for r in records.read_jsonl(p)]
            stage2 = (files2, rerun)
            rerun = [] if interrupted else rerun_names(rerun, recs2, done_names(lane_dir, STAGE2))
    rerun_opts = _left_of_budget(opts, t0, len(rerun), "alone") if rerun else copy.copy(opts)
    if rerun_opts is None:
        rerun = []
    if rerun:
        print(f"lanes: {len(rerun)} workloads alone with the whole GPU (too large for a lane's memory, out of memory "
              f"in a lane, or their lane ended before them): {', '.join(rerun[:6])}{' ...' if len(rerun) > 6 else ''}",
              flush=True)
        names_file = lane_dir / "rerun.json"
        names_file.write_text(json.dumps(rerun))
        rc, interrupted = _run_pass(rerun_opts, 1, k, lane_dir, run_id, "rerun", [lane_dir / "rerun.jsonl"], names_file)
        rcs += rc
    merged, missing = merge(plan, lane_files, lane_dir / "rerun.jsonl", rerun, lane_dir, opts, k, stage2=stage2)
    records.write_jsonl(path, merged)
    results = [r for r in merged if r.get("type") == "result"]
    from . import report

    wall = time.perf_counter() - t0
    print(f"{len(results)} records in {wall:.0f} s over {k} lanes -> {path}: {report.status_summary(results)}")
    print(f"render: python -m compare report {path}")
    if interrupted:
        print(f"interrupted: the finished records of the lanes are merged into {path}", file=sys.stderr)
        return 130
    if missing:
        print(f"lanes: {len(missing)} workloads have no finished records (lane exit codes {rcs}): "
              f"{', '.join(missing[:6])}", file=sys.stderr)
        return 2
    if not results:
        return 1
    fallbacks = sum(1 for r in results if (r.get("metrics") or {}).get("clock_fallback"))
    if fallbacks and not getattr(opts, "allow_clock_fallback", False):
        print(f"clock fallback: {fallbacks} records were timed by a clock other than the one requested; exit 3 "
              "(--allow-clock-fallback accepts them)", file=sys.stderr)
        return 3
    return 0


def _workers_per_lane(opts, lanes: int) -> int:
    """A lane's share of ``--compile-workers`` (at least one when there are any)."""
    workers = int(getattr(opts, "compile_workers", 0) or 0)
    return max(1, workers // lanes) if workers else 0


def _run_pass(opts, lanes: int, main_lanes: int, lane_dir: Path, run_id: str, pass_name: str, outs: list[Path],
              names_file: Path | None = None) -> tuple[list[int], bool]:
    """One pass of ``lanes`` lane processes (each writing ``outs[i]``), with that pass's memory share and compile
    workers; ``(exit codes, interrupted)``."""
    env = _lane_env(lanes, main_lanes)
    return _spawn([(lane_argv(opts, lane=i, lanes=lanes, lane_dir=lane_dir, run_id=run_id, out=outs[i],
                              pass_name=pass_name, names_file=names_file,
                              compile_workers=_workers_per_lane(opts, lanes)), env) for i in range(lanes)])


def _left_of_budget(opts, t0: float, n: int, how: str):
    """The options of a later pass: the same, with what is left of ``--max-run-s`` (None when nothing is)."""
    later = copy.copy(opts)
    if opts.max_run_s is not None:
        later.max_run_s = opts.max_run_s - (time.perf_counter() - t0)
        if later.max_run_s < 1.0:
            print(f"lanes: no time left in --max-run-s {opts.max_run_s:g} to run {n} workloads again {how}; their "
                  "lanes' records stay", flush=True)
            return None
    return later


def rerun_names(plan: list[str], recs: list[dict], done: set[str]) -> list[str]:
    """The workloads to run alone after the lanes: any record out of memory, or not finished by a lane (a lane's
    memory too small for it, ``defer_alone``, or the lane ended before it)."""
    oom = {(r.get("workload") or {}).get("name") for r in recs if r.get("type") == "result" and _out_of_memory(r)}
    return [n for n in plan if n in oom or n not in done]


def _out_of_memory(r: dict) -> bool:
    """An 'oom' record, or one whose timing or reason says it ran out of memory (a clock that failed for memory
    falls back to another clock, so the record can be 'ok' with ``metrics.clock_fallback`` naming it)."""
    from .record import says_out_of_memory

    if r.get("status") == "oom":
        return True
    return says_out_of_memory(" ".join(str(x) for x in (r.get("reason"), (r.get("metrics") or {}).get("clock_fallback"))
                                       if x))


def merge(plan: list[str], lane_files: list[Path], rerun_file: Path, rerun: list[str], lane_dir: Path, opts,
          k: int, stage2: tuple[list[Path], list[str]] | None = None) -> tuple[list[dict], list[str]]:
    """One run's records from the lanes': the role lane's header (the parent's options), its ceilings and clock
    check, then every workload's results in the plan's order, each from the last pass that finished it (the pass
    alone, else the second stage's lanes ``stage2 = (their files, the workloads given them)``, else the main lanes;
    a workload no pass finished keeps the main lanes' records). Also the names of planned workloads that finished
    nowhere."""
    from . import records

    by_lane = [list(records.read_jsonl(p)) if p.exists() else [] for p in lane_files]
    again = list(records.read_jsonl(rerun_file)) if rerun and rerun_file.exists() else []
    files2, names2 = stage2 if stage2 is not None else ([], [])
    second = [r for p in files2 if p.exists() for r in records.read_jsonl(p)]
    role = json.loads((lane_dir / CEILINGS_FILE).read_text()) if (lane_dir / CEILINGS_FILE).exists() else {}
    role_lane = role.get("lane", 0)
    header = next((r for r in by_lane[role_lane] if r.get("type") == "header"), None) if by_lane else None
    header = dict(header or {})
    main_done, again_done = done_names(lane_dir, "main"), done_names(lane_dir, "rerun")
    redone = {n for n in rerun if n in again_done}  # a rerun that did not finish keeps the earlier records
    done2 = done_names(lane_dir, STAGE2) if stage2 is not None else set()
    redone2 = {n for n in names2 if n in done2 and n not in redone}  # the second stage's, unless the pass alone's
    if header:
        options = dict(header.get("options") or {})
        for key in ("lane", "lane_dir", "lane_pass", "lane_names", "run_id"):
            options.pop(key, None)
        options.update(jobs=k, out=getattr(opts, "out", None), quiet=getattr(opts, "quiet", False))
        header["options"] = options
        header["argv"] = list(getattr(opts, "argv", []) or [])
        header["lanes"] = {"jobs": k, "lane_memory_fraction": round(LANE_MEMORY / k, 3),
                           "role_lane": role_lane,
                           "second_stage": None if stage2 is None else {
                               "jobs": SECOND_STAGE_LANES,
                               "lane_memory_fraction": round(LANE_MEMORY / SECOND_STAGE_LANES, 3),
                               "workloads": names2, "unfinished": [n for n in names2 if n not in done2]},
                           "rerun_alone": rerun,
                           "rerun_unfinished": [n for n in rerun if n not in redone],
                           "lane_files": [str(p.name) for p in lane_files if p.exists()]
                           + [str(p.name) for p in files2 if p.exists()] + (["rerun.jsonl"] if again else []),
                           "what": "one run over lanes (docs/compare.md, \"Lanes\"): the lanes' results in the plan's "
                                   "order; the ceilings and clock check of the role lane"}
    out: list[dict] = [header] if header else []
    out += [r for r in role.get("records", [])]
    results: dict[str, list[dict]] = {}
    for recs in by_lane:
        for r in recs:
            name = (r.get("workload") or {}).get("name")
            if r.get("type") == "result" and name not in redone and name not in redone2:
                results.setdefault(name, []).append(r)
    for r in second:
        name = (r.get("workload") or {}).get("name")
        if r.get("type") == "result" and name in redone2:
            results.setdefault(name, []).append(r)
    for r in again:
        name = (r.get("workload") or {}).get("name")
        if r.get("type") == "result" and name in redone:
            results.setdefault(name, []).append(r)
    for name in plan:
        out += results.get(name, [])
    missing = [n for n in plan if n not in main_done and n not in again_done and n not in done2]
    return out, missing
