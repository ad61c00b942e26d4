"""Micro-benchmark: how fast does one warpgroup's QK wgmma run at fa_mla's shape, alone and beside others?

    PYTHONPATH=. python scripts/mla_qk_probe.py [--reps 4000] [--out FILE]

Each CTA (one per SM, 132) loads Q (64 x 576) and a key tile (N x 576) into shared memory once, then ``wgs``
warpgroups each run ``reps`` QKs S = Q K^T (64 x N over K = 576, both operands from shared memory, fp32
accumulator, waited after each as fa_mla waits) into their own accumulator. Printed per case: microseconds per QK
and the achieved rate per SM in FLOP per clock at the SM clock given (--clock-ghz, default 1.70: what Nsight
Compute read during fa_mla). N = 64 is fa_mla's tile (docs/mla.md, "kv64_wsq_mc, measured"): if one warpgroup's QK
alone runs near the tensor cores' 4,096 FLOP per clock, the QK's shape is not what limits fa_mla.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from compare.records import write_jsonl

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def build(n_keys: int, wgs: int, reps: int, ctas: int):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    dqk, bm = 576, 64
    f32 = jnp.float32

    def tile(shape):
        return plgpu.SMEM(shape, jnp.bfloat16, transforms=(plgpu.TilingTransform((8, 64)),
                                                           plgpu.SwizzleTransform(128)))

    def body(q_ref, k_ref, o_ref, q_smem, k_smem, bar, o_smem):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _():
            plgpu.copy_gmem_to_smem(q_ref, q_smem, bar.at[0])
            plgpu.copy_gmem_to_smem(k_ref, k_smem, bar.at[0])

        plgpu.barrier_wait(bar.at[0])

        def step(i, acc):
            def issue(acc_ref):
                plgpu.wgmma(acc_ref, q_smem, k_smem.transpose((1, 0)))
            return pl.run_state(issue)(plgpu.ACC.init(acc))

        acc = lax.fori_loop(0, reps, step, plgpu.layout_cast(jnp.zeros((bm, n_keys), f32), plgpu.Layout.WGMMA))
        # the row sums of each warpgroup's accumulator keep the loop alive
        o_smem.at[wg][...] = acc.sum(axis=1)
        plgpu.commit_smem()
        plgpu.copy_smem_to_gmem(o_smem.at[wg], o_ref.at[lax.axis_index("c"), wg])
        plgpu.wait_smem_to_gmem(0)

    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((ctas, wgs, bm), f32),
                        scratch_types=[tile((bm, dqk)), tile((n_keys, dqk)),
                                       plgpu.Barrier(num_arrivals=2, num_barriers=1), plgpu.SMEM((wgs, bm), f32)],
                        grid=(ctas,), grid_names=("c",), num_threads=wgs, thread_name="wg")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--ctas", type=int, default=132)
    ap.add_argument("--clock-ghz", type=float, default=1.70)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    q = jax.random.normal(jax.random.key(0), (64, 576), jnp.float32).astype(jnp.bfloat16) * 0.01
    rows = []
    for n_keys in (32, 64, 128):
        k = jax.random.normal(jax.random.key(1), (n_keys, 576), jnp.float32).astype(jnp.bfloat16) * 0.01
        for wgs in (1, 2):
            try:
                f = jax.jit(build(n_keys, wgs, args.reps, args.ctas))
                jax.block_until_ready(f(q, k))
                t0 = time.perf_counter()
                for _ in range(3):
                    out = f(q, k)
                jax.block_until_ready(out)
                dt = (time.perf_counter() - t0) / 3
                us_per_qk = dt * 1e6 / args.reps
                flop = 2 * 64 * n_keys * 576 * wgs  # per SM per step (all warpgroups)
                rate = flop / (us_per_qk * 1e-6) / (args.clock_ghz * 1e9)
                row = dict(n_keys=n_keys, warpgroups=wgs, reps=args.reps, ctas=args.ctas, us_per_step=us_per_qk,
                           flop_per_clock_per_sm=rate, clock_ghz_assumed=args.clock_ghz)
            except Exception as e:  # a refusal is a row, not a lost run
                row = dict(n_keys=n_keys, warpgroups=wgs, error=f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            print(json.dumps(row))
    if args.out:  # compare's record writer (it appends: the file starts empty, as "w" made it)
        out = Path(args.out)
        out.unlink(missing_ok=True)
        write_jsonl(out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
