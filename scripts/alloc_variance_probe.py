"""Does a memory-bound decode kernel's time depend on where its K/V live? (session 37, issue 27's method)

Session 37's calls 2-4 timed two identical fa_decode programs (``pallas:auto`` and the named config it chose, the
same plan) 3.8% and 6.5% apart in one compare run with disjoint p10-p90, and equal in the next run, while FA3 beside
them moved by 0.2%. Each compare implementation prepares its own copy of the inputs, so one hypothesis is the
allocation: where a 0.5 GB K/V lands decides how its pages spread over the HBM channels. This probe holds one jitted
program and times it on ``--copies`` fresh allocations of the same inputs (a filler of a different size allocated
before each, so the copies do not sit at the same offsets), interleaved over ``--rounds`` rounds (every copy once
a round, ``--reps`` cold-L2 CUPTI samples each, compare's own clock). If the allocation matters, the copies' medians
spread by several percent and each copy is consistent over the rounds; if the state of the GPU over time matters,
the copies agree within a round and the rounds differ.

Usage: ``PYTHONPATH=. python scripts/alloc_variance_probe.py [--copies 6] [--rounds 4] [--reps 10] [--config NAME]``
(Llama-3.1-8B's speculative shape of the sweep: B 16, Hq 32, Hkv 8, Tq 8, S 8192, D 128, bf16, causal).
"""

from __future__ import annotations

import argparse
import json
import statistics

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--copies", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--config", default="spec_st4")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kv-len", type=int, default=8192)
    a = ap.parse_args()

    import jax
    import jax.numpy as jnp

    import pallas_attn
    from compare import timing

    b, tq, hq, hkv, d, s = a.batch, 8, 32, 8, 128, a.kv_len
    fn = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, causal=True, q_offset=s - tq, generation="fa_decode",
                                                       config=a.config))
    copies, fillers = [], []
    for i in range(a.copies):
        fillers.append(jnp.zeros(((i * 37 + 11) << 18,), jnp.uint8))  # 2.75 MB steps: shifts the next allocation
        kq, kk, kv = jax.random.split(jax.random.PRNGKey(i), 3)
        q = jax.random.normal(kq, (b, tq, hq, d), jnp.float32).astype(jnp.bfloat16)
        k = jax.random.normal(kk, (b, s, hkv, d), jnp.float32).astype(jnp.bfloat16)
        v = jax.random.normal(kv, (b, s, hkv, d), jnp.float32).astype(jnp.bfloat16)
        jax.block_until_ready(fn(q, k, v))
        copies.append((q, k, v))
    ptr = [c[1].unsafe_buffer_pointer() for c in copies]
    flush = timing.default_flush_bytes(50 << 20)  # twice the H100 / H200 L2 (50 MB), compare's rule
    p50 = [[0.0] * a.rounds for _ in copies]
    for r in range(a.rounds):
        for i, args in enumerate(copies):
            t = timing.time_kernels(fn, args, framework="jax", reps=a.reps, flush_bytes=flush)
            p50[i][r] = statistics.median(t.samples_us)
        print(f"round {r}: " + " ".join(f"{p50[i][r]:.1f}" for i in range(len(copies))), flush=True)
    med = [statistics.median(x) for x in p50]
    lo = min(med)
    print(json.dumps({"config": a.config, "shape": [b, tq, hq, hkv, d, s],
                      "k_ptr_mod_2MiB": [p % (2 << 20) for p in ptr],
                      "k_ptr_MiB": [round(p / 2**20, 1) for p in ptr], "copy_p50_us": [round(m, 1) for m in med],
                      "copy_over_fastest": [round(m / lo, 3) for m in med],
                      "round_medians_us": [round(statistics.median(p50[i][r] for i in range(len(copies))), 1)
                                           for r in range(a.rounds)],
                      "per_copy_round_spread": [round(max(x) / min(x), 3) for x in p50]}))


if __name__ == "__main__":
    main()
