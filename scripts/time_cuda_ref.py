"""Build cuda_ref (printing the build time) and time every generation with CUDA events.

    python scripts/time_cuda_ref.py --build-only && python scripts/time_cuda_ref.py

The first command does the cold build; the second shows the cached load time of a new process, then the
table: median of --iters timed calls after --warmup, at B=1, H=8, N=2048, D=64 fp32 (v1-v5, prefill,
non-causal) and v6 at decode Tq=1, Tk=8192, D=128 (fp32 inputs cast to fp16 inside the call, as in the
reference; v6 also with the reference's num_sm=40). This is a smoke timing for the issue, not a
benchmark: the compare package owns measurements (DESIGN.md decision 8).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import cuda_ref  # noqa: E402
from cuda_ref import build  # noqa: E402


def time_ms(fn, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()

    t0 = time.perf_counter()
    build.load()
    print(f"extension ready in {time.perf_counter() - t0:.1f} s (arch {build.arch()}, "
          f"{torch.cuda.get_device_name()})")
    if args.build_only:
        return 0

    b, h, n, d = 1, 8, 2048, 64
    q, k, v = (torch.randn(b, h, n, d, device="cuda") for _ in range(3))
    rows = []
    flops = 4 * b * h * n * n * d
    prefill = [g.id for g in cuda_ref.table() if g.entry == "dense" and not g.split_kv]  # v1-v5
    for gen in prefill:
        ms = time_ms(lambda g=gen: cuda_ref.attention(q, k, v, generation=g), args.warmup, args.iters)
        rows.append((gen, f"{b}x{h}x{n}x{d} prefill", ms, f"{flops / ms / 1e9:8.2f} TFLOP/s"))

    nk, dd = 8192, 128
    qd = torch.randn(1, 8, 1, dd, device="cuda")
    kd, vd = (torch.randn(1, 8, nk, dd, device="cuda") for _ in range(2))
    kv_bytes = 2 * 8 * nk * dd * 2  # fp16 K and V, as the kernel reads them
    decode = [g.id for g in cuda_ref.table() if g.entry == "dense" and g.split_kv]  # v6
    for gen in decode:
        for num_sm in (None, cuda_ref.REFERENCE_NUM_SM):
            s, _ = cuda_ref.choose_splits(8, 1, nk, num_sm)
            ms = time_ms(lambda g=gen, m=num_sm: cuda_ref.attention(qd, kd, vd, generation=g, num_sm=m),
                         args.warmup, args.iters)
            label = f"1x8x1x{dd}/{nk} decode S={s}" + (" (num_sm=40)" if num_sm else "")
            rows.append((gen, label, ms, f"{kv_bytes / ms / 1e6:8.1f} GB/s (incl. host fp16 cast)"))

    print(f"\n{'generation':<12} {'shape':<36} {'p50 ms':>9}  rate")
    for gen, shape, ms, rate in rows:
        print(f"{gen:<12} {shape:<36} {ms:9.3f}  {rate}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
