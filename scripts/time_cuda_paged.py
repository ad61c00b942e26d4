"""Kernel times of cuda_ref's paged twins (v7_paged, the v8 family) on the reference's sweeps, one JSON line each.

    PYTHONPATH=. python scripts/time_cuda_paged.py --out $OUT/paged_times.jsonl [--sweeps gsweep,reclaim,...]

Sweeps (docs/reference.md §2.7-§2.13, §4.2): ``v7_vs_v6`` (B 1, H 8, N_k 8192, D 64/128, v6 dense vs v7 paged on
the same cache), ``v7_batch`` (H 8, N_k 8192, B 1-64), ``gsweep`` (B 1, H_q 32, N_k 8192, G 1-32, D 64/128, every
paged generation, the device's SM count and the reference's 40), ``reclaim`` (G 8, H_q 8, H_kv 1, B 1-64),
``past_l2`` (G 8, H_kv 1, D 128, N_k 32768-131072 at B 1 and N_k 32768 at B 1/8/32/64). fp16 pools and q (no host
cast inside the call), shuffled block table, page 256 (as the reference's regime sweep), non-causal decode.

Time = the sum of the launch's kernel durations (partial + merge) from the CUDA profiler (CUPTI via
torch.profiler), median over --iters calls, each after an L2 flush (2 x L2 bytes zeroed, outside the kernels'
time). %HBM is against the measured read ceiling (a 4 GiB fp16 ``x.sum()``, same clock) and the data sheet's peak.
A smoke measurement for the issue's findings; the compare package owns the recorded runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

import cuda_ref  # noqa: E402
from cuda_ref import api, build  # noqa: E402

ROLE = "benchmark"  # not yet a probe: tests/test_scripts_roles.py lists it as pending (issue 26 item 5)

PEAK_GBPS = {"H100": 3350.0, "H200": 4800.0}
PAGED = tuple(g.id for g in cuda_ref.table() if g.entry == "paged")


def kernel_us(fn, flush: torch.Tensor, iters: int, match: tuple[str, ...]) -> float:
    """Median over iters of the summed durations (µs) of the kernels whose names contain one of `match`."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            flush.zero_()
            fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA" and any(m in e.name for m in match)]
    evs.sort(key=lambda e: e.time_range.start)
    per_call = len(evs) // iters
    if per_call < 1 or len(evs) % iters:
        raise RuntimeError(f"expected a whole number of kernels per call, got {len(evs)} for {iters} calls: "
                           f"{sorted({e.name for e in evs})}")
    sums = [sum(e.time_range.elapsed_us() for e in evs[i * per_call:(i + 1) * per_call]) for i in range(iters)]
    return statistics.median(sums)


def read_ceiling_gbps(flush, iters) -> float:
    x = torch.ones(2 << 30, dtype=torch.float16, device="cuda")  # 4 GiB
    us = kernel_us(x.sum, flush, iters, ("reduce", "Reduce"))
    return (2 << 30) * 2 / us / 1e3


def paged_inputs(b, hq, hkv, n_k, d, page, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pps = -(-n_k // page)
    q = torch.randn(b, hq, 1, d, generator=g, device="cuda").half()
    kp = torch.randn(b * pps, page, hkv, d, generator=g, device="cuda").half()
    vp = torch.randn(b * pps, page, hkv, d, generator=g, device="cuda").half()
    table = torch.randperm(b * pps, generator=g, device="cuda").to(torch.int32).reshape(b, pps)
    lens = torch.full((b,), n_k, dtype=torch.int32, device="cuda")
    return q, kp, vp, table, lens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweeps", default="v7_vs_v6,v7_batch,gsweep,reclaim,past_l2")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--page", type=int, default=256)
    args = ap.parse_args()
    sweeps = set(args.sweeps.split(","))

    ext = build.load()
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_GBPS.items() if k in name), None)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    ceiling = read_ceiling_gbps(flush, args.iters)
    sms = ext.device_sm_count()
    print(f"{name}: {sms} SMs, read ceiling {ceiling:.0f} GB/s (peak {peak}), L2 {l2 >> 20} MiB", flush=True)
    out = open(args.out, "a")

    def record(sweep, gen, *, b, hq, hkv, n_k, d, num_sm, us, splits):
        kv_bytes = 2 * b * n_k * hkv * d * 2
        gbps = kv_bytes / us / 1e3
        rec = {"sweep": sweep, "gen": gen, "device": name, "B": b, "H_q": hq, "H_kv": hkv, "G": hq // hkv,
               "N_k": n_k, "D": d, "page": args.page, "num_sm": num_sm or sms, "splits": splits, "kernel_us": us,
               "us_per_token": us / (b * hq), "kv_GBps": gbps, "pct_read_ceiling": 100 * gbps / ceiling,
               "pct_peak": 100 * gbps / peak if peak else None, "read_ceiling_GBps": ceiling}
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print(f"{sweep:<9} {gen:<11} B={b:<3} Hq={hq:<3} Hkv={hkv:<3} Nk={n_k:<6} D={d:<3} sm={num_sm or sms:<3} "
              f"S={splits:<2} {us:9.1f} us  {us / (b * hq):8.3f} us/tok  {100 * gbps / ceiling:5.1f}% ceiling",
              flush=True)

    def run_paged(sweep, gen, b, hq, hkv, n_k, d, num_sm=0):
        q, kp, vp, table, lens = paged_inputs(b, hq, hkv, n_k, d, args.page)
        offs = lens - 1
        gid = api.GENERATION_IDS[gen]
        s, _ = ext.split_plan(gid, b, hq, hkv, 1, table.shape[1] * args.page, d, num_sm)
        call = functools.partial(ext.forward_paged, gid, q, kp, vp, table, lens, offs, d**-0.5, False, num_sm, False,
                                 False)
        us = kernel_us(call, flush, args.iters, ("partial_kernel", "merge_kernel"))
        record(sweep, gen, b=b, hq=hq, hkv=hkv, n_k=n_k, d=d, num_sm=num_sm, us=us, splits=s)

    t0 = time.perf_counter()
    if "v7_vs_v6" in sweeps:
        for d in (64, 128):
            for num_sm in (0, cuda_ref.REFERENCE_NUM_SM):
                q, kp, vp, table, lens = paged_inputs(1, 8, 8, 8192, d, args.page)
                # The dense cache v6 reads: the same keys, logical order, BHND.
                k = kp[table[0].long()].reshape(-1, 8, d)[:8192].transpose(0, 1).unsqueeze(0).contiguous()
                v = vp[table[0].long()].reshape(-1, 8, d)[:8192].transpose(0, 1).unsqueeze(0).contiguous()
                s, _ = ext.split_plan(6, 1, 8, 8, 1, 8192, d, num_sm)
                call = functools.partial(ext.forward, 6, q, k, v, d**-0.5, False, 0, num_sm, False, False)
                us = kernel_us(call, flush, args.iters, ("v6_partial", "v6_merge"))
                record("v7_vs_v6", "v6_splitkv", b=1, hq=8, hkv=8, n_k=8192, d=d, num_sm=num_sm, us=us, splits=s)
                run_paged("v7_vs_v6", "v7_paged", 1, 8, 8, 8192, d, num_sm)
    if "v7_batch" in sweeps:
        for d in (64, 128):
            for b in (1, 8, 16, 32, 64):
                run_paged("v7_batch", "v7_paged", b, 8, 8, 8192, d)
    if "gsweep" in sweeps:
        for d in (64, 128):
            for num_sm in (0, cuda_ref.REFERENCE_NUM_SM):
                for g in (1, 2, 4, 8, 16, 32):
                    for gen in PAGED:
                        if gen == "v7_paged" and g > 1:
                            continue
                        run_paged("gsweep", gen, 1, 32, 32 // g, 8192, d, num_sm)
    if "reclaim" in sweeps:
        for d in (64, 128):
            for b in (1, 8, 16, 32, 64):
                for gen in PAGED[1:]:
                    run_paged("reclaim", gen, b, 8, 1, 8192, d)
    if "past_l2" in sweeps:
        for gen in PAGED[1:]:
            for n_k in (32768, 65536, 131072):
                run_paged("past_l2", gen, 1, 8, 1, n_k, 128)
            for b in (8, 32, 64):
                run_paged("past_l2", gen, b, 8, 1, 32768, 128)
    print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
