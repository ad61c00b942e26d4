"""Kernel timing with one clock for both frameworks, a cold L2 for every repetition, and percentiles.

The clock is CUPTI's activity timestamps (what Nsight uses): device-side start/end of every kernel in the
process, whichever framework launched it (docs/peers.md §4: torch CUDA events cannot see JAX's streams).
  * JAX implementations: ``jax.experimental.mosaic.gpu.profiler.measure(f, aggregate=False,
    iterations=N)``, which returns per-iteration lists of ``(kernel name, ms)``;
  * torch implementations (SDPA, cuda_ref): ``torch.profiler`` with CUDA activity (kineto, also CUPTI);
  * fallbacks, each labelled in ``metrics.clock`` and never silent: kineto for JAX when the JAX profiler is
    unavailable; CUDA events around each call (torch only, ``cuda-events``); host wall-clock with a
    device sync (``host-wall``, includes dispatch).

L2 flush: before every repetition a kernel rewrites a buffer of twice the L2 size (``bitwise_not`` over
uint32 words: a kernel name no attention implementation launches). Its kernels are recognised by name
(learned by profiling the flush alone) and excluded from the per-repetition sum; each repetition's time is
the sum of the implementation's own kernels (split-KV partials + merge count together, launch gaps do not).
The end-to-end time per call (host wall-clock, dispatch and sync included, warm L2) is measured separately
and labelled as such.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "Timing",
    "percentiles",
    "time_kernels",
    "time_e2e",
    "time_cpu",
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
    clock: str  # "cupti:jax-measure" | "cupti:torch-profiler" | "cuda-events" | "host-wall" | "cpu-interpret"
    l2_flushed: bool
    notes: tuple[str, ...] = ()  # why a fallback clock was used

    @functools.cached_property
    def stats(self) -> dict[str, float]:
        return percentiles(self.samples_us)


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
    from jax.experimental.mosaic.gpu import profiler

    buf = _jax_flush_buffer(nbytes)
    _, t = profiler.measure(_jax_flush_fn(), aggregate=False, iterations=1)(buf)
    if not t:
        raise RuntimeError("CUPTI recorded no kernel for the L2 flush")
    return frozenset(name for name, _ in t)


def _cupti_samples(per_iter: list[list[tuple[str, float]]], flush_names: frozenset[str]) -> list[float]:
    """Per-repetition µs from ``measure``'s ``[[(kernel, ms), ...], ...]``, the flush kernel excluded."""
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


def _time_jax_cupti(fn: Callable, args: tuple, *, reps: int, flush_bytes: int) -> Timing:
    from jax.experimental.mosaic.gpu import profiler

    flush_names = _jax_flush_kernel_names(flush_bytes)
    buf = _jax_flush_buffer(flush_bytes)
    _, per_iter = profiler.measure(_jax_timed(fn), aggregate=False, iterations=reps)(buf, *args)
    if per_iter is None:
        raise RuntimeError("CUPTI recorded no kernels")
    if reps == 1:  # measure returns one flat list for a single iteration
        per_iter = [per_iter]
    return Timing(tuple(_cupti_samples(per_iter, flush_names)), "cupti:jax-measure", True)


# ---------------------------------------------------------------------------------------------- torch


@functools.cache
def _torch_flush_buffer(nbytes: int):
    import torch

    return torch.arange(nbytes // 4, dtype=torch.int32, device="cuda")


def _kineto_kernels(step: Callable[[], Any], reps: int, sync: Callable[[], None]) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every device activity in ``reps`` calls of ``step``, in start order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    keep = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            keep.append(step())
        sync()
    del keep
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
                 clock: str = "cupti") -> Timing:
    """Device time per call of ``fn(*args)`` (already warm), cold L2, ``reps`` repetitions.

    ``framework`` is ``"jax"`` (fn is jit-able on JAX arrays) or ``"torch"``. ``clock``: ``"cupti"`` (JAX
    profiler for JAX, kineto for torch), ``"kineto"`` (torch.profiler for both) or ``"events"`` (CUDA events
    for torch, host wall for JAX). On failure each step falls back to the next and says why in ``notes``.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1; got {reps}")
    notes: list[str] = []
    chain: list[tuple[str, Callable[[], Timing]]] = []
    if framework == "jax":
        def via_kineto() -> Timing:
            buf = _jax_flush_buffer(flush_bytes)
            fl = _jax_flush_fn()
            return _time_kineto(lambda: fn(*args), lambda: fl(buf), _torch_sync, reps=reps,
                                clock="cupti:torch-profiler", flush_key=f"jax{flush_bytes}")

        if clock == "cupti":
            chain.append(("jax-measure", lambda: _time_jax_cupti(fn, args, reps=reps, flush_bytes=flush_bytes)))
        if clock in ("cupti", "kineto"):
            chain.append(("torch-profiler", via_kineto))
        chain.append(("host-wall", lambda: _time_host_flushed_jax(fn, args, reps=reps, flush_bytes=flush_bytes)))
    elif framework == "torch":
        def via_kineto_t() -> Timing:
            buf = _torch_flush_buffer(flush_bytes)
            return _time_kineto(lambda: fn(*args), buf.bitwise_not_, _torch_sync, reps=reps,
                                clock="cupti:torch-profiler", flush_key=f"torch{flush_bytes}")

        if clock in ("cupti", "kineto"):
            chain.append(("torch-profiler", via_kineto_t))
        chain.append(("cuda-events", lambda: _time_torch_events(fn, args, reps=reps, flush_bytes=flush_bytes)))
    else:
        raise ValueError(f"framework must be 'jax' or 'torch'; got {framework!r}")
    for label, attempt in chain:
        try:
            t = attempt()
            return dataclasses.replace(t, notes=tuple(notes))
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
    """Host wall-clock per call, dispatch and device sync included (warm L2): what a caller waits."""
    sync = _jax_sync if framework in ("jax", "cpu") else _torch_sync
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sync(fn(*args))
        samples.append(1e6 * (time.perf_counter() - t0))
    return Timing(tuple(samples), "host-wall-e2e", False)


def time_cpu(fn: Callable, args: tuple, *, reps: int) -> Timing:
    """CPU interpret mode: wall-clock of the interpreter, labelled so it is never read as a kernel time."""
    t = time_e2e(fn, args, framework="cpu", reps=reps)
    return dataclasses.replace(t, clock="cpu-interpret")


def time_loop(fn: Callable, args: tuple, *, reps: int, iters: int = 20) -> Timing:
    """Device time per step of a JAX program that spans several devices (no single CUPTI span covers it).

    The step is chained inside one jitted program (each step's first argument is the last one's plus 0 x its
    output, so no step is hoisted or dropped; the output must have the first argument's shape, as
    attention's does). A sample is ``(T(2 * iters) - T(iters)) / iters``: the difference of two loop
    lengths cancels what every call pays once (dispatch, the sync, the program's launch on each device),
    which a plain ``T / iters`` spreads over the steps (measured 2026-11-22 on 4 H200s: ~40 µs per step at
    20 steps, a third of the multi-device merge cost). Warm L2, no flush (the label says so).
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    first, rest = args[0], args[1:]

    def make(n: int):
        @jax.jit
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
