"""The device's own ceilings, measured at the start of every run in the same process (docs/compare.md).

  * HBM read: ``x.sum()`` over ``read_gib`` GiB of fp16 (bytes = the buffer once; the output is a scalar);
  * HBM copy: a 1 GiB device-to-device copy, bytes read + written;
  * matmul: fp16 and bf16 at 8192^3, fp32 (CUDA cores: TF32 off) at 4096^3, fp8 e4m3 through
    ``torch._scaled_mm`` at 8192^3 where this torch has it.

They are timed with torch CUDA events (median of ``reps`` after warm-up) — deliberately a different clock
from the CUPTI one that times the kernels, so that the run's clock check (a copy timed under CUPTI landing
near this copy ceiling) is a real cross-check. The measured values replace the datasheet's in the roofline
model for the fractions (``Hardware.with_measured``); the datasheet fractions are recorded next to them.
On a machine without a CUDA GPU nothing is measured: ``measure()`` returns ``(None, reason)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["measure", "copy_bytes_per_s"]


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


def measure(*, read_gib: float = 2.0, reps: int = 10) -> tuple[dict[str, Any] | None, str | None]:
    """``({"hbm_read_Bps", "hbm_copy_Bps", "flops": {precision: FLOP/s}, "errors": {...}}, None)`` or
    ``(None, reason)``. A ceiling that cannot be measured is absent, with its error under ``errors``."""
    try:
        import torch
    except ImportError as e:
        return None, f"torch is not importable ({e}): ceilings are measured with torch CUDA events"
    if not torch.cuda.is_available():
        return None, "no CUDA GPU: ceilings are measured on the device only (CPU runs report agreement only)"
    out: dict[str, Any] = {"clock": "cuda-events", "reps": reps, "flops": {}, "errors": {}, "how": {}}

    def attempt(key: str, how: str, fn) -> None:
        try:
            out_val = fn()
            if key.startswith("flops."):
                out["flops"][key.split(".", 1)[1]] = out_val
            else:
                out[key] = out_val
            out["how"][key] = how
        except Exception as e:  # one missing ceiling (e.g. no fp8 on this torch) must not lose the others
            out["errors"][key] = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            torch.cuda.empty_cache()

    def read() -> float:
        n = int(read_gib * (1 << 30)) // 2
        x = torch.randn(n, dtype=torch.float16, device="cuda")
        t = _events_median_s(lambda: x.sum(), reps=reps)
        return 2 * n / t

    def mm(dtype, n: int) -> float:
        a = torch.randn(n, n, dtype=dtype, device="cuda")
        b = torch.randn(n, n, dtype=dtype, device="cuda")
        t = _events_median_s(lambda: a @ b, reps=reps)
        return 2.0 * n**3 / t

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
        n = 8192
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
        one = torch.tensor(1.0, device="cuda")
        t = _events_median_s(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
                             reps=reps)
        return 2.0 * n**3 / t

    attempt("hbm_read_Bps", f"x.sum() over {read_gib:g} GiB fp16", read)
    attempt("hbm_copy_Bps", "1 GiB device copy, read + write bytes", copy_bytes_per_s)
    attempt("flops.fp16", "8192^3 fp16 matmul (torch)", lambda: mm(torch.float16, 8192))
    attempt("flops.bf16", "8192^3 bf16 matmul (torch)", lambda: mm(torch.bfloat16, 8192))
    attempt("flops.fp32", "4096^3 fp32 matmul, TF32 off (torch)", mm_fp32)
    attempt("flops.fp8", "8192^3 e4m3 torch._scaled_mm", mm_fp8)
    return out, None
