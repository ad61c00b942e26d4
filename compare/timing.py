"""Kernel timing with one clock for both frameworks, a cold L2 for every repetition, and percentiles.

The clock is CUPTI's activity timestamps (what Nsight uses): device-side duration of every kernel in the
process, whichever framework launched it (docs/peers.md §4: torch CUDA events cannot see JAX's streams).
One collector serves both frameworks (``cupti_kernels``): the CUPTI subscriber of jaxlib's Mosaic GPU
extension, the one behind ``jax.experimental.mosaic.gpu.profiler.measure``, started before the
repetitions and detached after them (clock label ``cupti:mosaic``). It is detached every time because CUPTI
takes one subscriber per process: torch.profiler (kineto) subscribes on first use and never lets go, so a
run that timed torch with kineto could no longer time JAX through the Mosaic collector (every JAX record of
the runs before 2026-11-23 fell back to kineto that way). Hence:
  * ``--clock cupti`` (default): the Mosaic collector for JAX *and* torch; kineto is never used;
  * ``--clock kineto``: torch.profiler for both (``cupti:torch-profiler``);
  * ``--clock events``: CUDA events for torch (``cuda-events``), host wall-clock for JAX (``host-wall``);
  * a clock that fails falls back to the next of its chain (cupti -> cuda-events / host-wall) and the
    ``Timing`` says which was requested (``requested``) and why it fell back (``notes``); ``fallback`` is
    true when the two differ, and the runner marks the record and exits non-zero (docs/compare.md).

L2 flush: before every repetition a kernel rewrites a buffer of twice the L2 size (``bitwise_not`` over
uint32 words: a kernel name no attention implementation launches). Its kernels are recognised by name
(learned by profiling the flush alone) and excluded from the per-repetition sum; each repetition's time is
the sum of the implementation's own kernels (split-KV partials + merge count together, launch gaps do not).
End to end (host wall-clock, warm L2) is measured separately and labelled: ``time_e2e`` is the latency of one
synchronized call, ``time_pipelined`` the time per call when N calls are issued and synchronized once.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# _LAST_ONLY: a timing window keeps only the last repetition's outputs alive. Each earlier one is freed when the next
# is dispatched (stream-ordered: its memory is reused only after the kernels that read it), so a window's memory is
# one call's, not reps x one call's (20 x 537 MB for a Llama-70B prefill output: with several processes on one GPU,
# ``compare run --jobs``, that ran out of memory; session 26). Before session 26 every output was kept to the end.

__all__ = [
    "Timing",
    "percentiles",
    "time_kernels",
    "is_jitted",
    "time_e2e",
    "time_pipelined",
    "time_cpu",
    "cupti_kernels",
    "expected_clock",
    "clock_chain",
    "default_flush_bytes",
]


def percentiles(samples_us: Sequence[float]) -> dict[str, float]:
    """p10 / p50 / p90 (linear interpolation), mean, min, max and n of a list of times in µs."""
    x = np.asarray(list(samples_us), dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"non-finite timing samples: {x[~np.isfinite(x)][:4]}")
    p10, p50, p90 = np.percentile(x, [10, 50, 90])
    return {"p10": float(p10), "p50": float(p50), "p90": float(p90), "mean": float(x.mean()),
            "min": float(x.min()), "max": float(x.max()), "n": int(x.size)}


@dataclasses.dataclass(frozen=True)
class Timing:
    samples_us: tuple[float, ...]
    clock: str  # "cupti:mosaic" | "cupti:torch-profiler" | "cuda-events" | "host-wall" | "cpu-interpret" | ...
    l2_flushed: bool
    notes: tuple[str, ...] = ()  # why a fallback clock was used
    requested: str | None = None  # the clock asked for (None: no choice, e.g. e2e or CPU interpret)
    # JAX on CUPTI: "direct" (the jitted call itself, the flush its own dispatch before it) or "wrapped" (the call
    # traced into one program after the flush); None: not applicable
    program: str | None = None

    @functools.cached_property
    def stats(self) -> dict[str, float]:
        return percentiles(self.samples_us)

    @property
    def fallback(self) -> bool:
        """True when the clock that ran is not the one requested."""
        return self.requested is not None and self.clock != self.requested


# ---------------------------------------------------------------------------------------------- CUPTI


class _MosaicCupti:
    """CUPTI through jaxlib's Mosaic GPU extension (``_cupti_init`` / ``_cupti_get_timings``): every kernel
    of the process between ``start`` and ``stop``, as ``(name, ms)`` in launch order; ``stop`` detaches
    the subscriber so that the next measurement (or another profiler) can subscribe."""

    def _ext(self):
        from jax._src.lib import mosaic_gpu as mosaic_gpu_lib  # ImportError: this jaxlib has no Mosaic GPU

        ext = getattr(mosaic_gpu_lib, "_mosaic_gpu_ext", None)
        if ext is None or not hasattr(ext, "_cupti_init") or not hasattr(ext, "_cupti_get_timings"):
            raise RuntimeError("this jaxlib's Mosaic GPU extension has no CUPTI collector")
        return ext

    def start(self) -> None:
        self._ext()._cupti_init()

    def stop(self) -> list[tuple[str, float]]:
        ext = self._ext()
        try:
            out = ext._cupti_get_timings(True)  # finalize: detach CUPTI from the process
        except TypeError:  # an older extension takes no argument (and always finalizes)
            out = ext._cupti_get_timings()
        return [(str(n), float(ms)) for n, ms in (out or [])]


_CUPTI: Any = _MosaicCupti()  # the tests put a stand-in here (a simulated CUPTI with subscriber conflicts)


def cupti_kernels(run: Callable[[], Any]) -> list[tuple[str, float]]:
    """``(kernel name, ms)`` of every kernel launched (and finished) while ``run()`` executes; ``run`` must
    synchronize before it returns."""
    _CUPTI.start()
    try:
        run()
    finally:
        kernels = _CUPTI.stop()
    return kernels


def expected_clock(clock: str, framework: str) -> str:
    """The clock label a record timed under ``--clock clock`` must carry (anything else is a fallback)."""
    if clock == "cupti":
        return "cupti:mosaic"
    if clock == "kineto":
        return "cupti:torch-profiler"
    if clock == "events":
        return "cuda-events" if framework == "torch" else "host-wall"
    raise ValueError(f"clock must be cupti, kineto or events; got {clock!r}")


def clock_chain(clock: str, framework: str) -> list[str]:
    """The clocks tried in order for ``framework`` under ``--clock clock`` (labels as recorded)."""
    last = "cuda-events" if framework == "torch" else "host-wall"
    first = {"cupti": "cupti:mosaic", "kineto": "cupti:torch-profiler", "events": last}[clock]
    return [first] if first == last else [first, last]


def default_flush_bytes(l2_bytes: int | None) -> int:
    """Twice the L2 (the reference's regime.py rule, docs/reference.md §4.2); 128 MiB when unknown."""
    return int(2 * l2_bytes) if l2_bytes else 128 << 20


# ------------------------------------------------------------------------------------------------ JAX


@functools.cache
def _jax_flush_buffer(nbytes: int):
    import jax.numpy as jnp

    return jnp.arange(nbytes // 4, dtype=jnp.uint32)  # not zeros: no constant to fold, a real read


@functools.cache
def _jax_flush_fn():
    import jax
    import jax.numpy as jnp

    return jax.jit(lambda b: jnp.bitwise_not(b))


@functools.cache
def _jax_timed(fn: Callable) -> Callable:
    """``(flush_buf, *args) -> (flushed, fn(*args))`` with the flush forced before the implementation."""
    import jax
    import jax.numpy as jnp

    def timed(buf, *args):
        # The barrier makes fn's inputs depend on the flush, so the flush kernel runs first in every rep.
        flushed, args = jax.lax.optimization_barrier((jnp.bitwise_not(buf), args))
        return flushed, fn(*args)

    return jax.jit(timed)


@functools.cache
def _jax_flush_kernel_names(nbytes: int) -> frozenset[str]:
    import jax

    buf = _jax_flush_buffer(nbytes)
    fl = _jax_flush_fn()
    jax.block_until_ready(fl(buf))  # compiled before the collector starts
    names = frozenset(n for n, _ in cupti_kernels(lambda: jax.block_until_ready(fl(buf))))
    if not names:
        raise RuntimeError("CUPTI recorded no kernel for the L2 flush")
    return names


def _cupti_samples(per_iter: list[list[tuple[str, float]]], flush_names: frozenset[str]) -> list[float]:
    """Per-repetition µs from ``[[(kernel, ms), ...], ...]`` (one list per repetition), the flush excluded."""
    samples = []
    for it in per_iter:
        names = [n for n, _ in it]
        # Drop exactly one flush kernel per repetition: the barrier puts it first, and an implementation
        # kernel that happens to share a generic XLA name must still be counted.
        idx = next((i for i, n in enumerate(names) if n in flush_names), None)
        if idx is None and names and re.search(r"(^|_)not(_|\.|$)", names[0]):
            idx = 0  # same op, renamed by this module's fusion numbering
        if idx is None:
            raise RuntimeError(f"flush kernel {sorted(flush_names)} not found among {names[:6]}: it was fused "
                               "or renamed, so it cannot be excluded")
        own = [ms for i, (_, ms) in enumerate(it) if i != idx]
        if not own:
            raise RuntimeError("no implementation kernel recorded in a repetition")
        samples.append(1e3 * float(sum(own)))
    return samples


def _per_rep(kernels: list[tuple[str, float]], reps: int) -> list[list[tuple[str, float]]]:
    """A flat launch-order kernel list cut into ``reps`` equal repetitions (each launches the same kernels)."""
    if not kernels:
        raise RuntimeError("CUPTI recorded no kernels")
    if len(kernels) % reps:
        raise RuntimeError(f"{len(kernels)} kernels recorded over {reps} repetitions: not the same kernels in "
                           "every repetition")
    n = len(kernels) // reps
    per = [kernels[i * n:(i + 1) * n] for i in range(reps)]
    if any([k for k, _ in p] != [k for k, _ in per[0]] for p in per):
        raise RuntimeError("kernel names differ across repetitions")
    return per


def is_jitted(fn: Callable) -> bool:
    """True for a ``jax.jit``-wrapped function: calling it again runs the executable its first call compiled."""
    return callable(getattr(fn, "lower", None)) and callable(getattr(fn, "trace", None))


def _time_jax_cupti(fn: Callable, args: tuple, *, reps: int, flush_bytes: int, direct: bool | None = None) -> Timing:
    """CUPTI samples of ``fn(*args)``, each repetition after an L2 flush.

    ``direct`` (default: ``fn`` is jitted): every repetition dispatches the flush program, then ``fn`` itself, the
    executable the pair's first call compiled (no second compile: session 25 found the wrapped program below cost a
    whole second compile per pair, ~45% of a Pallas pair's host time in a sweep). Both go to the device's one compute
    stream in dispatch order, so the flush runs first, as the barrier makes it in the wrapped program.
    Otherwise (a plain Python ``fn``): ``fn`` traced inside one jitted program after the flush
    (``_jax_timed``), a compile of its own."""
    import jax

    flush_names = _jax_flush_kernel_names(flush_bytes)
    buf = _jax_flush_buffer(flush_bytes)
    if direct is None:
        direct = is_jitted(fn)
    if direct:
        fl = _jax_flush_fn()  # compiled by _jax_flush_kernel_names

        def run() -> None:
            last = None
            for _ in range(reps):
                last = (fl(buf), fn(*args))  # the previous repetition's outputs freed (_LAST_ONLY)
            jax.block_until_ready(last)
    else:
        timed = _jax_timed(fn)
        jax.block_until_ready(timed(buf, *args))  # compiled before the collector starts

        def run() -> None:
            last = None
            for _ in range(reps):
                last = timed(buf, *args)
            jax.block_until_ready(last)

    per_iter = _per_rep(cupti_kernels(run), reps)
    return Timing(tuple(_cupti_samples(per_iter, flush_names)), "cupti:mosaic", True,
                  program="direct" if direct else "wrapped")


# ---------------------------------------------------------------------------------------------- torch


@functools.cache
def _torch_flush_buffer(nbytes: int):
    import torch

    return torch.arange(nbytes // 4, dtype=torch.int32, device="cuda")


def _kineto_kernels(step: Callable[[], Any], reps: int, sync: Callable[[], None]) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every device activity in ``reps`` calls of ``step``, in start order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    last = None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            last = step()  # the previous call's outputs freed (_LAST_ONLY)
        sync()
    del last
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    out.sort(key=lambda x: x[1])
    return out


def _split_by_flush(evts: list[tuple[str, float, float]], flush_names: frozenset[str], reps: int) -> list[float]:
    """Per-repetition sum of kernel durations between consecutive flush kernels."""
    samples: list[float] = []
    cur: float | None = None
    for name, s, e in evts:
        if name in flush_names:
            if cur is not None:
                samples.append(cur)
            cur = 0.0
        elif cur is not None:
            cur += e - s
    if cur is not None:
        samples.append(cur)
    if len(samples) != reps:
        raise RuntimeError(f"found {len(samples)} flush-delimited repetitions, expected {reps}")
    if any(s <= 0 for s in samples):
        raise RuntimeError("a repetition recorded no implementation kernel")
    return samples


_KINETO_FLUSH_NAMES: dict[str, frozenset[str]] = {}


def _time_kineto(step: Callable[[], Any], flush: Callable[[], Any], sync: Callable[[], None], *, reps: int,
                 clock: str, flush_key: str) -> Timing:
    if flush_key not in _KINETO_FLUSH_NAMES:  # learn the flush's kernel names once per process
        flush_evts = _kineto_kernels(flush, 1, sync)
        if not flush_evts:
            raise RuntimeError("torch.profiler recorded no CUDA activity for the L2 flush")
        _KINETO_FLUSH_NAMES[flush_key] = frozenset(n for n, _, _ in flush_evts)
    flush_names = _KINETO_FLUSH_NAMES[flush_key]
    evts = _kineto_kernels(lambda: (flush(), step()), reps, sync)
    return Timing(tuple(_split_by_flush(evts, flush_names, reps)), clock, True)


_MOSAIC_TORCH_FLUSH_NAMES: dict[int, frozenset[str]] = {}


def _time_torch_cupti(fn: Callable, args: tuple, *, reps: int, flush_bytes: int) -> Timing:
    """torch kernels through the same CUPTI collector as JAX (``cupti_kernels``), split at the flush."""
    buf = _torch_flush_buffer(flush_bytes)
    if flush_bytes not in _MOSAIC_TORCH_FLUSH_NAMES:
        names = frozenset(n for n, _ in cupti_kernels(lambda: (buf.bitwise_not_(), _torch_sync())))
        if not names:
            raise RuntimeError("CUPTI recorded no kernel for the torch L2 flush")
        _MOSAIC_TORCH_FLUSH_NAMES[flush_bytes] = names
    flush_names = _MOSAIC_TORCH_FLUSH_NAMES[flush_bytes]
    def run() -> None:
        last = None
        for _ in range(reps):
            buf.bitwise_not_()
            last = fn(*args)  # the previous call's outputs freed (_LAST_ONLY)
        _torch_sync()
        del last

    kernels = cupti_kernels(run)
    evts = [(n, 0.0, 1e3 * ms) for n, ms in kernels]  # durations only (launch order), in µs
    return Timing(tuple(_split_by_flush(evts, flush_names, reps)), "cupti:mosaic", True)


def _time_torch_events(fn: Callable, args: tuple, *, reps: int, flush_bytes: int) -> Timing:
    import torch

    buf = _torch_flush_buffer(flush_bytes)
    pairs = []
    for _ in range(reps):
        buf.bitwise_not_()  # enqueued before the start event: outside the timed window
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*args)
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    return Timing(tuple(1e3 * s.elapsed_time(e) for s, e in pairs), "cuda-events", True)


# -------------------------------------------------------------------------------------------- generic


def _jax_sync(x: Any) -> Any:
    import jax

    return jax.block_until_ready(x)


def _torch_sync(_: Any = None) -> None:
    import torch

    torch.cuda.synchronize()


def time_kernels(fn: Callable, args: tuple, *, framework: str, reps: int, flush_bytes: int,
                 clock: str = "cupti", direct: bool | None = None) -> Timing:
    """Device time per call of ``fn(*args)`` (already warm), cold L2, ``reps`` repetitions.

    ``framework`` is ``"jax"`` (fn is jit-able on JAX arrays) or ``"torch"``. ``clock``: ``"cupti"`` (the
    Mosaic CUPTI collector for both), ``"kineto"`` (torch.profiler for both) or ``"events"`` (CUDA events
    for torch, host wall for JAX). On failure each step falls back to the next of ``clock_chain`` and says
    why in ``notes``; ``Timing.requested`` is ``expected_clock(clock, framework)``. ``direct`` (JAX on CUPTI):
    time the jitted ``fn`` itself (default when it is jitted) or traced into one program after the flush
    (``False``; ``_time_jax_cupti``).
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1; got {reps}")
    if framework not in ("jax", "torch"):
        raise ValueError(f"framework must be 'jax' or 'torch'; got {framework!r}")
    requested = expected_clock(clock, framework)
    if framework == "jax":
        def via_kineto() -> Timing:
            buf = _jax_flush_buffer(flush_bytes)
            fl = _jax_flush_fn()
            return _time_kineto(lambda: fn(*args), lambda: fl(buf), _torch_sync, reps=reps,
                                clock="cupti:torch-profiler", flush_key=f"jax{flush_bytes}")

        how = {"cupti:mosaic": lambda: _time_jax_cupti(fn, args, reps=reps, flush_bytes=flush_bytes, direct=direct),
               "cupti:torch-profiler": via_kineto,
               "host-wall": lambda: _time_host_flushed_jax(fn, args, reps=reps, flush_bytes=flush_bytes)}
    else:
        def via_kineto_t() -> Timing:
            buf = _torch_flush_buffer(flush_bytes)
            return _time_kineto(lambda: fn(*args), buf.bitwise_not_, _torch_sync, reps=reps,
                                clock="cupti:torch-profiler", flush_key=f"torch{flush_bytes}")

        how = {"cupti:mosaic": lambda: _time_torch_cupti(fn, args, reps=reps, flush_bytes=flush_bytes),
               "cupti:torch-profiler": via_kineto_t,
               "cuda-events": lambda: _time_torch_events(fn, args, reps=reps, flush_bytes=flush_bytes)}
    notes: list[str] = []
    for label in clock_chain(clock, framework):
        try:
            t = how[label]()
            return dataclasses.replace(t, notes=tuple(notes), requested=requested)
        except Exception as e:  # a clock that fails falls back to the next; the record says which and why
            notes.append(f"{label} failed: {type(e).__name__}: {str(e)[:200]}")
    raise RuntimeError("every clock failed: " + " | ".join(notes))


def _time_host_flushed_jax(fn: Callable, args: tuple, *, reps: int, flush_bytes: int) -> Timing:
    buf = _jax_flush_buffer(flush_bytes)
    fl = _jax_flush_fn()
    samples = []
    for _ in range(reps):
        _jax_sync(fl(buf))
        t0 = time.perf_counter()
        _jax_sync(fn(*args))
        samples.append(1e6 * (time.perf_counter() - t0))
    return Timing(tuple(samples), "host-wall", True)


def time_e2e(fn: Callable, args: tuple, *, framework: str, reps: int) -> Timing:
    """Latency: host wall-clock per synchronized call, dispatch and device sync included (warm L2): what a
    caller that waits for every call sees."""
    sync = _jax_sync if framework in ("jax", "cpu") else _torch_sync
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sync(fn(*args))
        samples.append(1e6 * (time.perf_counter() - t0))
    return Timing(tuple(samples), "host-wall-e2e", False)


def time_pipelined(fn: Callable, args: tuple, *, framework: str, calls: int = 20, reps: int = 3) -> Timing:
    """Throughput: host wall-clock per call when ``calls`` calls are issued back to back and synchronized
    once (warm L2); one sample per batch of calls. What a caller that keeps the device busy sees."""
    if calls < 1 or reps < 1:
        raise ValueError(f"calls and reps must be >= 1; got {calls}, {reps}")
    sync = _jax_sync if framework in ("jax", "cpu") else _torch_sync
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = None
        for _ in range(calls):
            out = fn(*args)  # in order on the device: the last one done means all are
        sync(out)
        samples.append(1e6 * (time.perf_counter() - t0) / calls)
        del out
    return Timing(tuple(samples), "host-wall-pipelined", False, (f"{calls} calls issued, one sync",))


def time_cpu(fn: Callable, args: tuple, *, reps: int) -> Timing:
    """CPU interpret mode: wall-clock of the interpreter, labelled so it is never read as a kernel time."""
    t = time_e2e(fn, args, framework="cpu", reps=reps)
    return dataclasses.replace(t, clock="cpu-interpret")


def time_loop(fn: Callable, args: tuple, *, reps: int, iters: int = 20,
              compiler_options: dict | None = None) -> Timing:
    """Device time per step of a JAX program that spans several devices (no single CUPTI span covers it).

    The step is chained inside one jitted program (each step's first argument is the last one's plus 0 x its
    output, so no step is hoisted or dropped; the output must have the first argument's shape, as
    attention's does). A sample is ``(T(2 * iters) - T(iters)) / iters``: the difference of two loop
    lengths cancels what every call pays once (dispatch, the sync, the program's launch on each device),
    which a plain ``T / iters`` spreads over the steps (measured 2026-11-22 on 4 H200s: ~40 µs per step at
    20 steps, a third of the multi-device merge cost). Warm L2, no flush (the label says so). ``compiler_options``
    (XLA debug options for this loop's program only, e.g. command buffers) go to the loop's ``jax.jit``.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    first, rest = args[0], args[1:]

    def make(n: int):
        @functools.partial(jax.jit, compiler_options=compiler_options)
        def loop(x, *rest):
            def body(_, x):
                out = fn(x, *rest)
                return (x.astype(jnp.float32) + 0.0 * out.astype(jnp.float32)).astype(x.dtype)

            return lax.fori_loop(0, n, body, x)

        return loop

    short, long = make(iters), make(2 * iters)
    jax.block_until_ready(short(first, *rest))
    jax.block_until_ready(long(first, *rest))

    def wall(loop) -> float:
        t0 = time.perf_counter()
        jax.block_until_ready(loop(first, *rest))
        return time.perf_counter() - t0

    samples = [1e6 * (wall(long) - wall(short)) / iters for _ in range(reps)]
    return Timing(tuple(samples), "host-wall:in-jit-loop-diff", False,
                  (f"(T({2 * iters} steps) - T({iters} steps)) / {iters} per sample, steps chained in one jitted "
                   "program; warm L2; per-call costs cancel",))
