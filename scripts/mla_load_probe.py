"""Micro-benchmark: the latent ring alone. How long does fa_mla's TMA ring take per 64-key tile when the consumer
holds each slot for a fixed time and computes nothing?

    PYTHONPATH=. python scripts/mla_load_probe.py [--out FILE]

The grid is fa_mla's at ``mla_b64_s8192_bf16`` without the multicast: 64 sequences x 2 CTAs (the two 64-head row tiles
of a sequence read the same latent, so half the tile reads hit L2), 128 tiles of 64 keys x 576 bf16 columns per CTA,
one TMA copy per 64-row page through a block table whose pages are a random permutation of the pool. A producer
warpgroup refills a slot once the consumer releases it; the consumer waits for each tile, then holds its slot for
``spin`` dependent multiply-adds (no tensor cores, no shared-memory reads) and releases it. Rows: microseconds per tile
for ``stages`` 2 and 3 (a third slot fits here: no Q tile) over a range of hold times, and the hold time alone
(``loads=False``: the same spin without any copy). With two slots the period is max(hold, (hold + L) / 2) if the
load latency L sets it, with three max(hold, (hold + L) / 3); the table reads L off and says what a third slot
would buy at fa_mla's hold time (docs/mla.md).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from compare.records import write_jsonl

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

B, ROWS_TILES, N_TILES, TN, DQK = 64, 2, 128, 64, 576


def build(stages: int, spin: int, loads: bool, layout: str = "natural", per_seq: int = ROWS_TILES,
          multicast: bool = False, prefetch: int = 0):
    from jax.experimental.pallas import mosaic_gpu as plgpu

    f32 = jnp.float32
    n_pages = B * N_TILES

    def body(lat_ref, bt_ref, o_ref, ring, l_bar, l_free, o_smem):
        bi, t, wg = lax.axis_index("b"), lax.axis_index("t"), lax.axis_index("wg")
        mc = {"collective_axes": "t"} if multicast else {}

        def load(s):
            pg = jnp.clip(bt_ref[bi * N_TILES + s], 0, n_pages - 1)
            rows = TN if layout == "natural" else TN * DQK // 64  # pretiled: the page as 576 rows of 64 columns
            plgpu.copy_gmem_to_smem(lat_ref.at[pl.ds(pg * rows, rows)], ring.at[lax.rem(s, stages)],
                                    l_bar.at[lax.rem(s, stages)], **mc)
            if prefetch:  # fa_mla's l2_prefetch: the tile `prefetch` ahead into L2, in 192-column boxes
                @pl.when(s + prefetch < N_TILES)
                def _():
                    nxt = jnp.clip(bt_ref[bi * N_TILES + s + prefetch], 0, n_pages - 1)
                    for c0 in range(0, DQK, 192):
                        plgpu.async_prefetch(lat_ref.at[pl.ds(nxt * TN, TN), pl.ds(c0, 192)], **mc)

        @pl.when(wg == 0)
        def _consumer():
            def step(s, x):
                slot = lax.rem(s, stages)
                if loads:
                    plgpu.barrier_wait(l_bar.at[slot])
                x = lax.fori_loop(0, spin, lambda i, y: y * 0.999 + 0.001, x)
                if loads:
                    plgpu.barrier_arrive(l_free.at[slot])
                return x

            x = lax.fori_loop(0, N_TILES, step, (t + 1).astype(f32))
            o_smem[...] = lax.broadcast(x, (128,))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(o_smem, o_ref.at[bi, t])
            plgpu.wait_smem_to_gmem(0)

        if loads:
            @pl.when(wg == 1)
            def _producer():
                @pl.loop(0, N_TILES)
                def _(s):
                    @pl.when(s >= stages)
                    def _():
                        plgpu.barrier_wait(l_free.at[lax.rem(s, stages)])

                    load(s)

                @pl.loop(N_TILES - stages, N_TILES)
                def _(s):  # every phase observed
                    plgpu.barrier_wait(l_free.at[lax.rem(s, stages)])

    slot = (TN, DQK) if layout == "natural" else (TN * DQK // 64, 64)
    ring = plgpu.SMEM((stages, *slot), jnp.bfloat16,
                      transforms=(plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128)))
    free = (plgpu.ClusterBarrier(collective_axes=("t",), num_arrivals=1, num_barriers=stages) if multicast
            else plgpu.Barrier(num_arrivals=1, num_barriers=stages))
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((B, per_seq, 128), f32),
                        scratch_types=[ring, plgpu.Barrier(num_arrivals=1, num_barriers=stages), free,
                                       plgpu.SMEM((128,), f32)],
                        **(dict(grid=(1, 1, B), grid_names=("tp", "s", "b"), cluster=(2,), cluster_names=("t",))
                           if multicast else dict(grid=(per_seq, 1, B), grid_names=("t", "s", "b"))),
                        num_threads=2, thread_name="wg")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spins", default="0,250,500,750,1000,1250,1500")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--variants", default="natural,random,2", help="layout,order,CTAs per sequence; ';'-separated. "
                    "layout natural (the pool's [page, 576] rows, what fa_mla reads) or pretiled (each page stored in "
                    "the ring's tiled order, so one page is 72 KiB of contiguous rows); order random (pages a random "
                    "permutation) or sequential; CTAs per sequence 2 (fa_mla's two row tiles), 1, or mc (2 in a "
                    "cluster, each tile read once by a TMA multicast into both, the slot freed cluster-wide: kv64_mc)")
    ap.add_argument("--prefetch", type=int, default=0, help="natural layout: also prefetch the tile this far ahead "
                    "into L2 with each copy (fa_mla's l2_prefetch)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    lat = jnp.asarray(rng.standard_normal((B * N_TILES * TN, DQK), np.float32) * 0.1, jnp.bfloat16)
    perm = jnp.asarray(rng.permutation(B * N_TILES).astype(np.int32))
    seq = jnp.arange(B * N_TILES, dtype=jnp.int32)
    rows = []
    first = args.variants.split(";")[0]
    for variant in args.variants.split(";"):
        layout, order, per_seq = variant.split(",")
        bt = perm if order == "random" else seq
        data = lat if layout == "natural" else lat.reshape(-1, 64)
        for spin in (int(x) for x in args.spins.split(",")):
            for stages, loads in ((0, False), (2, True), (3, True)):
                if not loads and variant != first:
                    continue  # the hold time alone, once
                row = dict(layout=layout, order=order, ctas_per_seq=per_seq, spin=spin, prefetch=args.prefetch,
                           stages=stages if loads else 0, loads=loads)
                try:
                    f = jax.jit(build(max(stages, 2), spin, loads, layout, 2 if per_seq == "mc" else int(per_seq),
                                      multicast=per_seq == "mc", prefetch=args.prefetch))
                    jax.block_until_ready(f(data, bt))
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        out = f(data, bt)
                    jax.block_until_ready(out)
                    us = (time.perf_counter() - t0) / args.calls * 1e6
                    row.update(us_per_call=us, us_per_tile=us / N_TILES)
                except Exception as e:  # a refusal is a row, not a lost run
                    row.update(error=f"{type(e).__name__}: {str(e)[:300]}")
                rows.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}),
                      flush=True)
    if args.out:  # compare's record writer (it appends: the file starts empty, as "w" made it)
        out = Path(args.out)
        out.unlink(missing_ok=True)
        write_jsonl(out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
