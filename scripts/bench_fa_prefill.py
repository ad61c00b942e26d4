"""fa_prefill on the GPU: correctness against the float64 oracle, then timing against jax.nn's cuDNN.

    PYTHONPATH=. python scripts/bench_fa_prefill.py --out $OUT/fa_prefill [--configs default,pingpong]
        [--shapes 4x16x4096x128] [--check] [--time] [--reps 20]

Every variant (config x shape x causal x dtype) is compiled, checked and timed on its own, inside a
try/except: one failure is a row in the table and a record with its error, never a lost run. Timing uses
compare's CUPTI clock (``compare.timing.time_kernels``: cold L2, device time of the kernels), for our kernel
and for ``jax.nn.dot_product_attention(implementation="cudnn")`` in the same process. FLOPs: 4*B*H*Tq*Tk*D,
half for causal (Tq == Tk). Writes ``records.jsonl`` (one line per measurement, environment on each) and
``table.txt`` under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np


def _oracle_check(fp, cfg, dtype, rng) -> list[str]:
    """Small cases against the float64 oracle; returns failure lines (empty: all pass)."""
    from attn_core import oracle
    from pallas_attn.kernels.contract import Problem

    fails = []
    cases = [  # b, tq, tk, hq, hkv, d, causal, offsets
        (2, 256, 256, 4, 4, 128, False, (0, 0)),
        (2, 256, 256, 4, 4, 128, True, (0, 0)),
        (2, 200, 333, 4, 2, 64, True, (133, 40)),
        (1, 130, 517, 8, 2, 128, False, (0,)),
        (2, 64, 300, 4, 1, 64, True, (-20, 250)),
        (1, 384, 384, 2, 1, 256, True, (0,)),
    ]
    for b, tq, tk, hq, hkv, d, causal, offs in cases:
        tag = f"b{b} tq{tq} tk{tk} hq{hq} hkv{hkv} d{d} causal={causal} off={offs}"
        try:
            q = jnp.asarray(rng.standard_normal((b, tq, hq, d)), dtype)
            k = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), dtype)
            v = jnp.asarray(rng.standard_normal((b, tk, hkv, d)), dtype)
            off = jnp.asarray(offs, jnp.int32)
            # "auto" (None): the kernel's heuristic for this case
            c = fp.KERNEL.config(cfg, Problem(entry="dense", dtype=jnp.dtype(dtype).name, batch=b, q_len=tq,
                                              kv_len=tk, heads_q=hq, heads_kv=hkv, head_dim=d, causal=causal))
            if fp.smem_bytes(d, 2, c) > fp._SMEM_LIMIT:  # D=256: the heuristic's tiles, same schedule knobs
                c = dataclasses.replace(c, block_kv=64, stages=2)
            o, lse = fp.forward(q, k, v, causal=causal, scale=d ** -0.5, q_offset=off, interpret=False,
                                config=c, return_lse=True)
            ro, rl = oracle.attention_reference(q, k, v, causal=causal, q_offset=np.asarray(offs))
            o = np.asarray(jnp.asarray(o, jnp.float32), np.float64)
            lse = np.asarray(lse, np.float64)
            fin = np.isfinite(rl)
            err = float(np.linalg.norm(o - ro) / max(np.linalg.norm(ro), 1e-30))
            lerr = float(np.abs(lse[fin] - rl[fin]).max()) if fin.any() else 0.0
            tol = 2e-2 if dtype == jnp.bfloat16 else 4e-3
            bad = (not np.all(np.isfinite(o))) or err > tol or lerr > 1e-2 or not np.array_equal(np.isfinite(lse), fin)
            print(f"    check {tag}: rel_err={err:.2e} lse_err={lerr:.2e} {'FAIL' if bad else 'ok'}", flush=True)
            if bad:
                fails.append(f"{tag}: rel_err={err:.2e} lse_err={lerr:.2e}")
        except Exception as e:  # noqa: BLE001 - a failing case is a line of the report
            fails.append(f"{tag}: {type(e).__name__}: {str(e)[:300]}")
            print(f"    check {tag}: ERROR {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return fails


def _ours(q, k, v, *, fp, causal, scale, off, cfg):
    if cfg is None:  # the public entry with the kernel's heuristic config
        import pallas_attn

        return pallas_attn.attention(q, k, v, causal=causal, scale=scale, q_offset=off, generation="fa_prefill",
                                     interpret=False)
    return fp.forward(q, k, v, causal=causal, scale=scale, q_offset=off, interpret=False, config=cfg)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--configs", default="default,pingpong")
    ap.add_argument("--shapes", default="4x16x4096x128", help="BxHxNxD or BxHqxHkvxNxD (GQA)[,...]")
    ap.add_argument("--dtypes", default="float16")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--cudnn", type=int, default=1)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    from compare import records, timing
    from pallas_attn.kernels import fa_prefill as fp

    env = records.collect_env()
    print(f"jax {jax.__version__} devices {jax.devices()}", flush=True)
    rng = np.random.default_rng(0)
    recs, table = [], []
    flush = timing.default_flush_bytes(50 * 2**20)

    def cfg_of(name):
        if name == "auto":
            return None
        if "=" in name or ":" in name:  # inline: block_kv=128:stages=3:pingpong=1
            kw = {}
            for part in name.split(":"):
                k, v = part.split("=")
                kw[k] = bool(int(v)) if k in ("pingpong", "overlap") else int(v)
            return fp.PrefillConfig(**kw)
        return fp.CONFIGS[name]

    cfgs = [c for c in a.configs.split(",") if c]
    if a.check:
        for cname in cfgs:
            for dt in a.dtypes.split(","):
                print(f"== check {cname} {dt}", flush=True)
                fails = _oracle_check(fp, cfg_of(cname), jnp.dtype(dt), rng)
                recs.append({"kind": "check", "config": cname, "dtype": dt, "fails": fails, "env": env})
                table.append(f"check {cname:40s} {dt:9s} {'PASS' if not fails else 'FAIL ' + str(len(fails))}")

    if a.time:
        for shp in a.shapes.split(","):
            dims = [int(x) for x in shp.split("x")]
            b, h, hkv, n, d = dims if len(dims) == 5 else (dims[0], dims[1], dims[1], dims[2], dims[3])
            for dt in a.dtypes.split(","):
                dtype = jnp.dtype(dt)
                key = jax.random.PRNGKey(1)
                kq, kk, kv = jax.random.split(key, 3)
                q = jax.random.normal(kq, (b, n, h, d), dtype)
                k = jax.random.normal(kk, (b, n, hkv, d), dtype)
                v = jax.random.normal(kv, (b, n, hkv, d), dtype)
                off = jnp.zeros((b,), jnp.int32)
                for causal in (bool(int(x)) for x in a.causal.split(",")):
                    flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                    impls = []
                    if a.cudnn:
                        impls.append(("jax:cudnn", lambda q, k, v, c=causal: jax.nn.dot_product_attention(
                            q, k, v, is_causal=c, implementation="cudnn")))
                    for cname in cfgs:
                        cfg = cfg_of(cname)
                        impls.append((f"pallas:fa_prefill:{cname}", functools.partial(
                            _ours, fp=fp, causal=causal, scale=d ** -0.5, off=off, cfg=cfg)))
                    ref = None
                    for name, f in impls:
                        tag = f"{name:44s} b{b} h{h}/{hkv} n{n} d{d} {dt:8s} causal={int(causal)}"
                        rec = {"kind": "time", "impl": name, "batch": b, "heads": h, "heads_kv": hkv, "n": n, "d": d,
                               "dtype": dt,
                               "causal": causal, "flops": flops, "env": env}
                        try:
                            fj = jax.jit(f)
                            t0 = time.time()
                            o = jax.block_until_ready(fj(q, k, v))
                            rec["compile_s"] = round(time.time() - t0, 2)
                            if ref is None:
                                ref = o
                            else:
                                rec["max_abs_diff_vs_first"] = float(jnp.max(jnp.abs(
                                    o.astype(jnp.float32) - ref.astype(jnp.float32))))
                            tm = timing.time_kernels(fj, (q, k, v), framework="jax", reps=a.reps, flush_bytes=flush)
                            st = tm.stats
                            rec.update({"p50_us": st["p50"], "p10_us": st["p10"], "p90_us": st["p90"],
                                        "clock": tm.clock, "tflops": flops / st["p50"] / 1e6, "notes": list(tm.notes)})
                            line = f"{tag} p50 {st['p50']:9.1f} us  {rec['tflops']:6.1f} TFLOP/s"
                            if "max_abs_diff_vs_first" in rec:
                                line += f"  |d|max {rec['max_abs_diff_vs_first']:.1e}"
                        except Exception as e:  # noqa: BLE001
                            rec["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
                            line = f"{tag} ERROR {type(e).__name__}: {str(e)[:300]}"
                            traceback.print_exc(limit=3)
                        print(line, flush=True)
                        table.append(line)
                        recs.append(rec)
    with open(out / "records.jsonl", "w") as fh:
        for r in recs:
            fh.write(json.dumps(r, default=str) + "\n")
    (out / "table.txt").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

