"""The device's own ceilings, measured at the start of every run in the same process (docs/compare.md).

  * HBM read, by several methods, each recorded (``hbm_read_methods``); the best is the ceiling every
    fraction is quoted against (``hbm_read_Bps``, ``hbm_read_best``):
      - ``torch_sum``: ``x.sum()`` over ``read_gib`` GiB of fp16, torch CUDA events;
      - ``jnp_sum``: ``jnp.sum`` over the same size, CUPTI (the run's JAX clock);
      - ``pallas_stream``: our own streaming-read Pallas kernel (``stream_read_sum``, Triton lowering: a grid
        of programs, each summing one large contiguous chunk in big blocks with several pipeline stages),
        a few launch configurations tried (``STREAM_CONFIGS``), CUPTI;
    on an H100 the torch reduction read 3.02 TB/s where ``jnp.sum`` under CUPTI read 3.20 (datasheet 3.35),
    so one method alone understates the ceiling and overstates every fraction against it;
  * HBM copy: a 1 GiB device-to-device copy, bytes read + written (CUDA events);
  * matmul: fp16 and bf16 at 8192^3, fp32 (CUDA cores: TF32 off) at 4096^3, fp8 e4m3 through
    ``torch._scaled_mm`` at 8192^3 where this torch has it (CUDA events).

The copy ceiling is timed with CUDA events, deliberately a different clock from the CUPTI one that times the
kernels, so that the run's clock check (a copy timed under CUPTI landing near it) is a real cross-check. The
measured values replace the datasheet's in the roofline model for the fractions (``Hardware.with_measured``);
the datasheet fractions are recorded next to them. On a machine without a CUDA GPU nothing is measured:
``measure()`` returns ``(None, reason)``. ``measure(methods=...)`` takes another set of measurements (the
tests' fake backend); the bookkeeping (best read method, errors, ``how``) is the same.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["measure", "copy_bytes_per_s", "stream_read_sum", "StreamConfig", "STREAM_CONFIGS", "READ_METHODS",
           "over_ceiling_note", "over_compute_note"]

READ_METHODS = ("torch_sum", "jnp_sum", "pallas_stream")  # keys of hbm_read_methods, in the order measured


def _events_median_s(fn, *, reps: int, warmup: int = 2) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return float(np.median(times))


def copy_bytes_per_s(nbytes: int = 1 << 30, reps: int = 10) -> float:
    """Device-to-device copy bandwidth (read + write bytes) with CUDA events."""
    import torch

    x = torch.randn(nbytes // 2, dtype=torch.float16, device="cuda")
    y = torch.empty_like(x)
    t = _events_median_s(lambda: y.copy_(x), reps=reps)
    return 2 * nbytes / t


# ------------------------------------------------------------------------------ streaming-read kernel


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """One launch of ``stream_read_sum``: ``programs_per_sm`` x SMs programs, each reading its contiguous
    chunk ``block_rows`` x ``cols`` elements at a time (fp16: ``2 * block_rows * cols`` bytes per load)."""

    block_rows: int = 16
    cols: int = 1024
    num_warps: int = 8
    num_stages: int = 3
    programs_per_sm: int = 1

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


# A handful, not a sweep: 32-64 KiB per load, 2-4 loads in flight, one to four programs per SM.
STREAM_CONFIGS = (
    StreamConfig(16, 1024, 8, 3, 1),
    StreamConfig(16, 1024, 8, 4, 2),
    StreamConfig(32, 1024, 8, 3, 1),
    StreamConfig(8, 1024, 4, 4, 4),
    StreamConfig(32, 1024, 16, 2, 1),
    StreamConfig(16, 1024, 4, 3, 2),
)


def stream_read_sum(x, *, programs: int, config: StreamConfig = StreamConfig(), interpret: bool = False):
    """Sum of the first ``programs * steps * block_rows`` rows of ``x`` ``[rows, cols]`` (fp32 per column
    partials, one row per program, ``[programs, cols]``), reading each element once.

    Program ``p`` owns rows ``[p * steps * block_rows, (p + 1) * steps * block_rows)``, a contiguous chunk, and
    walks it in a loop of ``steps`` loads of ``block_rows`` whole rows (Triton pipelines the loop over
    ``num_stages`` stages). The rows past the last full chunk are not read: callers count
    ``read_bytes(x.shape, ...)``, not ``x.nbytes``. The loop accumulates elementwise in fp32 registers
    (``block_rows x cols``), so the only cross-lane reduction is one per program at the end.
    """
    import jax
    import jax.numpy as jnp

    from pallas_attn import _compat

    pl = _compat.pl
    rows, cols = x.shape
    br = config.block_rows
    if cols != config.cols:
        raise ValueError(f"x has {cols} columns; config wants {config.cols}")
    steps = rows // (programs * br)
    if steps < 1:
        raise ValueError(f"{rows} rows do not fill {programs} programs x {br} rows")

    def kernel(x_ref, o_ref):
        base = pl.program_id(0) * (steps * br)

        def body(i, acc):
            blk = _compat.load(x_ref.at[pl.ds(base + i * br, br), pl.ds(0, cols)])
            return acc + blk.astype(jnp.float32)

        acc = jax.lax.fori_loop(0, steps, body, jnp.zeros((br, cols), jnp.float32))
        _compat.store(o_ref.at[pl.ds(pl.program_id(0), 1), pl.ds(0, cols)], jnp.sum(acc, axis=0, keepdims=True))

    return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((programs, cols), jnp.float32), grid=(programs,),
                          compiler_params=_compat.triton_params(num_warps=config.num_warps,
                                                                num_stages=config.num_stages),
                          interpret=interpret, name="compare_stream_read")(x)


def read_bytes(shape: tuple[int, int], itemsize: int, *, programs: int, config: StreamConfig) -> int:
    """Bytes ``stream_read_sum`` reads from an array of ``shape``."""
    rows, cols = shape
    steps = rows // (programs * config.block_rows)
    return programs * steps * config.block_rows * cols * itemsize


# ------------------------------------------------------------------------------------ JAX under CUPTI


def _cupti_median_s(fn: Callable, args: tuple, *, reps: int, keep: Callable[[str], bool] = lambda n: True) -> float:
    """Median over ``reps`` calls of the summed CUPTI kernel time of ``fn(*args)`` (the run's JAX clock,
    ``compare.timing.cupti_kernels``). ``keep`` selects the kernels that count."""
    import jax

    from . import timing

    jax.block_until_ready(fn(*args))  # compiled and warm
    per_call = []
    for _ in range(reps):
        kernels = timing.cupti_kernels(lambda: jax.block_until_ready(fn(*args)))
        t = sum(ms for name, ms in kernels if keep(name))
        if t <= 0:
            raise RuntimeError(f"CUPTI recorded no kernel to count (got {[n for n, _ in kernels][:4]})")
        per_call.append(t * 1e-3)
    return float(np.median(per_call))


def _jnp_sum_Bps(n_elems: int, reps: int) -> float:
    import jax
    import jax.numpy as jnp

    x = jax.random.normal(jax.random.key(1), (n_elems,), jnp.float16)
    try:
        t = _cupti_median_s(jax.jit(jnp.sum), (x,), reps=reps)
        return 2 * n_elems / t
    finally:
        x.delete()


def _pallas_stream_Bps(n_elems: int, reps: int, sm_count: int, configs=STREAM_CONFIGS) -> tuple[float, dict]:
    import jax
    import jax.numpy as jnp

    cols = configs[0].cols
    x = jax.random.normal(jax.random.key(2), (n_elems // cols, cols), jnp.float16)
    tried: list[dict[str, Any]] = []
    best: tuple[float, dict] | None = None
    try:
        for cfg in configs:
            progs = cfg.programs_per_sm * sm_count
            entry: dict[str, Any] = {**cfg.as_dict(), "programs": progs}
            try:
                fn = jax.jit(functools.partial(stream_read_sum, programs=progs, config=cfg))
                t = _cupti_median_s(fn, (x,), reps=reps, keep=lambda n: "stream_read" in n)
                bps = read_bytes(x.shape, 2, programs=progs, config=cfg) / t
                entry["Bps"] = bps
                if best is None or bps > best[0]:
                    best = (bps, entry)
            except Exception as e:  # one launch configuration that does not compile must not lose the others
                entry["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            tried.append(entry)
    finally:
        x.delete()
    if best is None:
        raise RuntimeError("no streaming-read configuration ran: " + "; ".join(t.get("error", "") for t in tried))
    return best[0], {"config": best[1], "tried": tried}


# ------------------------------------------------------------------------------------------- measure


def _cuda_methods(read_gib: float, reps: int) -> dict[str, tuple[str, str, Callable[[], Any]]]:
    """``key -> (how, clock, fn)``; a ``hbm_read.<method>`` fn returns B/s or ``(B/s, details)``."""
    import torch

    n = int(read_gib * (1 << 30)) // 2 // 1024 * 1024  # fp16 elements, whole 1024-wide rows

    def torch_sum() -> float:
        x = torch.randn(n, dtype=torch.float16, device="cuda")
        t = _events_median_s(lambda: x.sum(), reps=reps)
        return 2 * n / t

    def mm(dtype, size: int) -> float:
        a = torch.randn(size, size, dtype=dtype, device="cuda")
        b = torch.randn(size, size, dtype=dtype, device="cuda")
        t = _events_median_s(lambda: a @ b, reps=reps)
        return 2.0 * size**3 / t

    def mm_fp32() -> float:
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # the CUDA-core fp32 rate, as the roofline's "fp32"
        try:
            return mm(torch.float32, 4096)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev

    def mm_fp8() -> float:
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            raise RuntimeError("this torch has no _scaled_mm / float8_e4m3fn")
        size = 8192
        a = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(size, size, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.tensor(1.0, device="cuda")
        t = _events_median_s(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                             reps=reps)
        return 2.0 * size**3 / t

    from pallas_attn import _compat

    gib = f"{read_gib:g} GiB fp16"
    return {
        "hbm_read.torch_sum": (f"x.sum() over {gib} (torch)", "cuda-events", torch_sum),
        "hbm_read.jnp_sum": (f"jax.jit(jnp.sum) over {gib}", "cupti", lambda: _jnp_sum_Bps(n, reps)),
        "hbm_read.pallas_stream": (f"compare.ceilings.stream_read_sum over {gib} (Pallas, Triton lowering), best "
                                   f"of {len(STREAM_CONFIGS)} launch configurations", "cupti",
                                   lambda: _pallas_stream_Bps(n, reps, _compat.device_sm_count())),
        "hbm_copy_Bps": ("1 GiB device copy, read + write bytes", "cuda-events", copy_bytes_per_s),
        "flops.fp16": ("8192^3 fp16 matmul (torch)", "cuda-events", lambda: mm(torch.float16, 8192)),
        "flops.bf16": ("8192^3 bf16 matmul (torch)", "cuda-events", lambda: mm(torch.bfloat16, 8192)),
        "flops.fp32": ("4096^3 fp32 matmul, TF32 off (torch)", "cuda-events", mm_fp32),
        "flops.fp8": ("8192^3 e4m3 torch._scaled_mm", "cuda-events", mm_fp8),
    }


def empty_torch_cache() -> None:
    """Trim torch's CUDA cache when torch is loaded (best effort; the runner calls it between workloads)."""
    import sys

    if "torch" in sys.modules:
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except Exception:  # cache trimming is best effort
            pass


def measure(*, read_gib: float = 2.0, reps: int = 10,
            methods: dict[str, tuple[str, str, Callable[[], Any]]] | None = None,
            ) -> tuple[dict[str, Any] | None, str | None]:
    """``({"hbm_read_Bps", "hbm_read_best", "hbm_read_methods", "hbm_copy_Bps", "flops": {precision: FLOP/s},
    "errors", "how", "clocks"}, None)`` or ``(None, reason)``. A ceiling that cannot be measured is absent,
    with its error under ``errors`` (``hbm_read.<method>`` for one read method)."""
    if methods is None:
        try:
            import torch
        except ImportError as e:
            return None, f"torch is not importable ({e}): ceilings are measured with torch CUDA events and CUPTI"
        if not torch.cuda.is_available():
            return None, "no CUDA GPU: ceilings are measured on the device only (CPU runs report agreement only)"
        methods = _cuda_methods(read_gib, reps)
    out: dict[str, Any] = {"clock": "cuda-events", "reps": reps, "flops": {}, "errors": {}, "how": {},
                           "clocks": {}, "hbm_read_methods": {}}
    for key, (how, clock, fn) in methods.items():
        try:
            val = fn()
            details: dict[str, Any] = {}
            if isinstance(val, tuple):
                val, details = val
            if not (isinstance(val, (int, float)) and np.isfinite(val) and val > 0):
                raise ValueError(f"not a positive finite rate: {val!r}")
            if key.startswith("hbm_read."):
                out["hbm_read_methods"][key.split(".", 1)[1]] = {"Bps": float(val), "how": how, "clock": clock,
                                                                 **details}
            elif key.startswith("flops."):
                out["flops"][key.split(".", 1)[1]] = float(val)
            else:
                out[key] = float(val)
            out["how"][key] = how
            out["clocks"][key] = clock
        except Exception as e:  # one missing ceiling (e.g. no fp8 on this torch) must not lose the others
            out["errors"][key] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            empty_torch_cache()
    reads = out["hbm_read_methods"]
    if reads:
        best = max(reads, key=lambda k: reads[k]["Bps"])
        out["hbm_read_Bps"] = reads[best]["Bps"]
        out["hbm_read_best"] = best
        out["how"]["hbm_read_Bps"] = f"best of {len(reads)} read methods: {best} ({reads[best]['how']})"
        out["clocks"]["hbm_read_Bps"] = reads[best]["clock"]
    return out, None


def over_ceiling_note(fraction: float | None, *, what: str, bytes_: float | None, l2_bytes: float | None,
                      datasheet_fraction: float | None) -> str | None:
    """Why a fraction of a measured ceiling is above 1 (None when it is not): never a bare >100%."""
    if fraction is None or fraction <= 1.0:
        return None
    pct = f"{100 * fraction:.1f}% of the measured {what}"
    if bytes_ is not None and l2_bytes and bytes_ <= l2_bytes:
        return (f"{pct}: the working set ({bytes_ / 2**20:.1f} MiB) is smaller than the L2 "
                f"({l2_bytes / 2**20:.0f} MiB), so part of it can be served at L2 bandwidth within one call")
    if datasheet_fraction is not None and datasheet_fraction <= 1.0:
        return (f"{pct} but {100 * datasheet_fraction:.1f}% of the datasheet: this access pattern streams "
                "faster than every ceiling method measured here")
    return (f"{pct} and above the datasheet: the model counts more bytes than the implementation moves "
            "(see prediction.roofline_inputs), or the time misses part of its work")


def over_compute_note(fraction: float | None, *, engine: str | None, impl: dict | None) -> str | None:
    """Why a compute-limited fraction is above 1 (None when it is not). The known case: an fp32 floor is priced
    at the fp32 FMA rate, but a peer that does not ask for IEEE fp32 dots (XLA's default precision, Triton's
    default ``tf32`` input precision in JAX's Pallas ops) runs them on TF32 tensor cores on sm_80+."""
    if fraction is None or fraction <= 1.0:
        return None
    pct = f"{100 * fraction:.1f}% of the compute floor ({engine} engine)"
    kind = (impl or {}).get("kind")
    if engine == "fp32" and kind == "peer":
        return (f"{pct}: this peer's fp32 dots run at its framework's default precision, TF32 on the tensor cores "
                "(XLA's default for float32 on sm_80+; Triton's default input precision in JAX's Pallas ops), while "
                "the floor prices fp32 at the FMA rate; our fp32 generations compute IEEE fp32. The fraction is "
                "against another engine, not a kernel beyond the hardware")
    return (f"{pct}: the model counts more FLOPs than the implementation performs, or it runs on a faster engine "
            "than the one the floor prices (see prediction.roofline_inputs)")
