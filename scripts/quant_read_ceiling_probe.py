"""fa_decode with fp16, fp8 E4M3 and NVFP4 KV on the issue-12 shapes: kernel time, ratio to fp16, bytes read.

    PYTHONPATH=. python scripts/bench_quant_decode.py --out $OUT/quant_decode            # the GPU run
    PYTHONPATH=. python scripts/bench_quant_decode.py --smoke                            # CPU, tiny, interpret

Shapes (Hq 32, Hkv 8, D 128, Tq 1, fp16 q, non-causal, the configs/quant_decode.toml workloads): B32 S8192 and
B1 S131072, dense and paged (page 64). For each KV format and fa_decode config (``default``, ``quant_alt_decode``:
the other decode of each quantized format, ``tuned``) one record with the kernel time on compare's clock
(``compare.timing.time_kernels``: CUPTI, L2 flushed before every repetition, p10/p50/p90), the KV bytes read at
the storage size (fp8 1 B/elem, NVFP4 0.5625 B/elem incl. micro-scales, + 8 B of tensor scales), the effective
bandwidth, the ratio to the fp16-KV default on the same shape, and agreement with the same-quantized float64
oracle on a subset (batch row 0, KV heads 0 and 7). A read-ceiling record per shape times a plain ``jnp.sum``
over a uint32 buffer of each format's KV bytes (what a kernel that only reads those bytes could do).
Records (JSONL, with the environment) go to ``--out/records.jsonl``; a summary table is printed.

The kernel records (every format and fa_decode config, dense and paged 64, the fp16 baselines included) are compare's
too: ``configs/quant_decode.toml``, whose records are the ones to keep (oracle agreement on the same quantized cache,
the quantization error, the roofline with its ALU bound). This script stays for the ``read_ceiling`` records, which
compare has no form for: its HBM read ceiling is measured once per run over a fixed 2 GiB (``compare/ceilings.py``),
never at a workload's own bytes, and a plain reduction is not an attention workload.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from attn_core import formats, oracle  # noqa: E402
from compare import records, timing  # noqa: E402
from pallas_attn import _compat, quant  # noqa: E402
from pallas_attn.kernels import fa_decode as fd  # noqa: E402

HQ, HKV, D, TQ = 32, 8, 128, 1
SHAPES = {"b32_s8192": (32, 8192), "b1_s131072": (1, 131072)}
FORMATS = ("fp16", "fp8_e4m3", "nvfp4")
CONFIGS = ("default", "quant_alt_decode", "tuned")


def _env() -> dict:
    dev = jax.devices()[0]
    return {"device_kind": getattr(dev, "device_kind", dev.platform), "platform": dev.platform,
            "jax": jax.__version__, "python": platform.python_version(),
            "git_sha": os.environ.get("PALLAS_ATTN_GIT_SHA"), "sm_count": _compat.device_sm_count()}


def kv_bytes(b: int, s: int, fmt: str) -> float:
    """K+V bytes a decode reads at the storage format (tensor scales: 2 x 4 B)."""
    elems = 2 * b * s * HKV * D
    per = 2.0 if fmt == "fp16" else formats.bytes_per_element("fp8" if fmt == "fp8_e4m3" else fmt)
    return elems * per + (0 if fmt == "fp16" else 8)


def _quantize(x, fmt):
    return x.astype(jnp.float16) if fmt == "fp16" else (
        quant.quantize_fp8_e4m3(x) if fmt == "fp8_e4m3" else quant.quantize_nvfp4(x))


def _page(t, page: int, perm_inv):
    """Dense ``[B, S, ...]`` (array or quantized pytree) -> pool ``[B*S/page, page, ...]`` in the order
    ``perm_inv`` (the same permutation for every field); scales pass through."""
    def one(a):
        if a.ndim == 0:
            return a
        b, s = a.shape[:2]
        return a.reshape(b * (s // page), page, *a.shape[2:])[perm_inv]
    return jax.tree_util.tree_map(one, t)


def _subset_agreement(out, q, k32, v32, fmt: str) -> dict:
    """fp16 KV: oracle on the fp16-rounded cache, batch row 0, KV heads 0 and 7."""
    heads = [0, HKV - 1]
    g = HQ // HKV
    qh = np.concatenate([np.arange(h * g, (h + 1) * g) for h in heads])
    qs = np.asarray(q[:1][:, :, qh], np.float32)
    ks = np.asarray(k32[:1][:, :, jnp.asarray(heads)].astype(jnp.float16), np.float32)
    vs = np.asarray(v32[:1][:, :, jnp.asarray(heads)].astype(jnp.float16), np.float32)
    ref, _ = oracle.attention_reference(qs, ks, vs)
    got = np.asarray(jnp.asarray(out[:1][:, :, qh], jnp.float32), np.float64)
    rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    return {"checked": True, "rel_l2": rel, "max_abs": float(np.max(np.abs(got - ref))),
            "finite": bool(np.all(np.isfinite(got)))}


def _quant_agreement(out, q, kq, vq, fmt: str) -> dict:
    """Oracle on the kernel's own quantized operands (dequantized on the host), batch row 0, KV heads 0, 7."""
    heads = [0, HKV - 1]
    g = HQ // HKV
    qh = np.concatenate([np.arange(h * g, (h + 1) * g) for h in heads])
    deq = quant.dequantize_fp8_e4m3 if fmt == "fp8_e4m3" else quant.dequantize_nvfp4
    sl = jax.tree_util.tree_map(lambda a: a if a.ndim == 0 else a[:1][:, :, jnp.asarray(heads)], kq)
    sv = jax.tree_util.tree_map(lambda a: a if a.ndim == 0 else a[:1][:, :, jnp.asarray(heads)], vq)
    ks, vs = np.asarray(deq(sl), np.float64), np.asarray(deq(sv), np.float64)
    qs = np.asarray(q[:1][:, :, qh], np.float32)
    ref, _ = oracle.attention_reference(qs, ks, vs)
    got = np.asarray(jnp.asarray(out[:1][:, :, qh], jnp.float32), np.float64)
    rel = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
    return {"checked": True, "rel_l2": rel, "max_abs": float(np.max(np.abs(got - ref))),
            "finite": bool(np.all(np.isfinite(got)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="directory for records.jsonl (default: print only)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--layouts", default="dense,paged64")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode on the CPU")
    args = ap.parse_args(argv)
    _compat.silence_triton_deprecation()
    interpret = args.smoke or not _compat.has_gpu()
    shapes = {k: SHAPES[k] for k in args.shapes.split(",")} if not args.smoke else {"smoke_b2_s256": (2, 256)}
    out_f = records.open_new(args.out)
    env = _env()
    flush = timing.default_flush_bytes(None if interpret else 50 << 20)

    def emit(rec):
        rec["env"] = env
        if out_f:
            out_f.write(json.dumps(rec) + "\n")
            out_f.flush()
        print(json.dumps({k: v for k, v in rec.items() if k != "env"}), flush=True)

    summary = []
    for sname, (b, s) in shapes.items():
        key = jax.random.PRNGKey(0)
        kq_, kk, kv = jax.random.split(key, 3)
        q = jax.random.normal(kq_, (b, TQ, HQ, D), jnp.float32).astype(jnp.float16)
        k32 = jax.random.normal(kk, (b, s, HKV, D), jnp.float32)
        v32 = jax.random.normal(kv, (b, s, HKV, D), jnp.float32)
        for fmt in args.formats.split(","):
            if not interpret:  # read ceiling at this format's bytes: a plain reduction over that many bytes
                buf = jnp.zeros((int(kv_bytes(b, s, fmt)) // 4,), jnp.uint32)
                t = timing.time_kernels(jax.jit(lambda x: jnp.sum(x, dtype=jnp.uint32)), (buf,), framework="jax",
                                        reps=args.reps, flush_bytes=flush)
                emit({"kind": "read_ceiling", "shape": sname, "kv_dtype": fmt, "bytes": kv_bytes(b, s, fmt),
                      "p50_us": t.stats["p50"], "clock": t.clock, "stats": t.stats,
                      "tb_s": kv_bytes(b, s, fmt) / t.stats["p50"] / 1e6})
                del buf
            kq, vq = _quantize(k32, fmt), _quantize(v32, fmt)
            for layout in args.layouts.split(","):
                page = None if layout == "dense" else (64 if not args.smoke else 16)
                if layout == "dense":
                    call_args = (q, kq, vq)

                    def run(q, k, v, cfg, b=b):
                        return fd.forward(q, k, v, causal=False, scale=D ** -0.5, q_offset=jnp.zeros(b, jnp.int32),
                                          interpret=interpret, config=cfg)
                else:
                    n = b * (s // page)
                    perm = np.random.default_rng(1).permutation(n)
                    inv = jnp.asarray(np.argsort(perm))
                    kp, vp = _page(kq, page, inv), _page(vq, page, inv)
                    bt = jnp.asarray(perm.reshape(b, s // page).astype(np.int32))
                    lens = jnp.full((b,), s, jnp.int32)
                    call_args = (q, kp, vp)

                    def run(q, k, v, cfg, bt=bt, lens=lens):
                        return fd.paged_forward(q, k, v, bt, lens, causal=False, scale=D ** -0.5,
                                                q_offset=lens - TQ, interpret=interpret, config=cfg,
                                                check_block_table=False)
                for cname in args.configs.split(","):
                    if fmt == "fp16" and cname == "quant_alt_decode":
                        continue  # identical to default for fp16 KV
                    cfg = fd.CONFIGS[cname]
                    fn = jax.jit(lambda q, k, v, cfg=cfg, run=run: run(q, k, v, cfg))
                    try:
                        out = jax.block_until_ready(fn(*call_args))
                        if interpret:
                            t = timing.time_cpu(fn, call_args, reps=1)
                        else:
                            t = timing.time_kernels(fn, call_args, framework="jax", reps=args.reps,
                                                    flush_bytes=flush)
                    except Exception as e:  # a variant that fails to compile or run is a record, not a crash
                        emit({"kind": "kernel", "shape": sname, "layout": layout, "kv_dtype": fmt, "config": cname,
                              "error": f"{type(e).__name__}: {str(e)[:400]}"})
                        continue
                    agree = (_subset_agreement(out, q, k32, v32, fmt) if fmt == "fp16"
                             else _quant_agreement(out, q, kq, vq, fmt))
                    nbytes = kv_bytes(b, s, fmt)
                    rec = {"kind": "kernel", "shape": sname, "layout": layout, "kv_dtype": fmt, "config": cname,
                           "p50_us": t.stats["p50"], "stats": t.stats, "clock": t.clock, "notes": list(t.notes),
                           "bytes": nbytes, "tb_s": nbytes / t.stats["p50"] / 1e6, "agreement": agree,
                           "plan": fd.plan(batch=b, hkv=HKV, rows=HQ // HKV * TQ, d=D, max_kv=s, config=cfg,
                                           page_size=page).as_dict()}
                    emit(rec)
                    summary.append(rec)
            del kq, vq
    base = {(r["shape"], r["layout"]): r["p50_us"] for r in summary
            if r["kv_dtype"] == "fp16" and r["config"] == "default"}
    print(f"\n{'shape':12} {'layout':8} {'kv':9} {'config':17} {'p50 us':>9} {'TB/s':>6} {'x fp16':>7} {'rel_l2':>8}")
    for r in summary:
        ratio = r["p50_us"] / base[(r["shape"], r["layout"])] if (r["shape"], r["layout"]) in base else float("nan")
        print(f"{r['shape']:12} {r['layout']:8} {r['kv_dtype']:9} {r['config']:17} {r['p50_us']:9.1f} "
              f"{r['tb_s']:6.2f} {ratio:7.3f} {r['agreement'].get('rel_l2', float('nan')):8.1e}")
    if out_f:
        out_f.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
