"""The HBM read ceiling at each quantized-KV workload's own bytes: a plain reduction at fp16, fp8 E4M3, NVFP4 sizes.

    PYTHONPATH=. python scripts/quant_read_ceiling_probe.py --out $OUT/quant_read_ceiling   # the GPU run
    PYTHONPATH=. python scripts/quant_read_ceiling_probe.py --smoke                         # CPU, tiny

Shapes: ``configs/quant_decode.toml``'s (Hq 32, Hkv 8, D 128, Tq 1): B32 S8192 and B1 S131072. Per shape and KV
format one ``read_ceiling`` record (``type: "probe"``, compare's record schema through
``compare.records.ProbeWriter``): a jitted ``jnp.sum`` over a uint32 buffer of that format's K+V bytes (fp16 2 B/elem,
fp8 1 B/elem, NVFP4 0.5625 B/elem incl. micro-scales, + 8 B of tensor scales for the quantized two), timed on
compare's kernel clock (``compare.timing.time_kernels``: CUPTI, L2 flushed before every repetition, p10/p50/p90;
``--smoke`` on the CPU: ``timing.time_cpu``, labelled ``cpu_interpret_us_*``), with the bytes and TB/s: what a kernel
that only reads those bytes could do. The workload names are compare's dense ones
(``decode_gqa_b32_s8192_<kv_dtype>``; the paged page-64 workloads read the same bytes), so each pairs with compare's
kernel records of ``configs/quant_decode.toml``.

ROLE: a probe. Why it is not a compare config: compare's HBM read ceiling is measured once per run over a fixed 2 GiB
(``compare/ceilings.py``), never at a workload's own bytes, and a plain reduction is not an attention workload. The
kernel times (every KV format and fa_decode config, dense and paged 64, the fp16 baselines) are
``configs/quant_decode.toml``'s. This file was ``scripts/bench_quant_decode.py`` until issue 26 item 5, which also
timed the kernels (its ``kind: "kernel"`` records, now compare's); records it wrote stay under results/ as they are
(``kind: "read_ceiling"`` with ``shape`` ``b32_s8192`` / ``b1_s131072`` and ``p50_us``).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from attn_core import formats  # noqa: E402
from compare import records, timing  # noqa: E402
from pallas_attn import _compat  # noqa: E402

ROLE = "probe"
PROBE = "quant_read_ceiling_probe"
HQ, HKV, D, TQ = 32, 8, 128, 1
SHAPES = {"b32_s8192": (32, 8192), "b1_s131072": (1, 131072)}
SMOKE = {"b2_s256": (2, 256)}
FORMATS = ("fp16", "fp8_e4m3", "nvfp4")


def kv_bytes(b: int, s: int, fmt: str) -> float:
    """K+V bytes a decode reads at the storage format (tensor scales: 2 x 4 B)."""
    elems = 2 * b * s * HKV * D
    per = 2.0 if fmt == "fp16" else formats.bytes_per_element("fp8" if fmt == "fp8_e4m3" else fmt)
    return elems * per + (0 if fmt == "fp16" else 8)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="directory for records.jsonl (default: print only)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (host clock: a check, not a number)")
    a = ap.parse_args(argv)
    _compat.silence_triton_deprecation()
    on_gpu = _compat.has_gpu() and not a.smoke
    shapes = SMOKE if a.smoke else {k: SHAPES[k] for k in a.shapes.split(",")}
    reps = 3 if a.smoke else a.reps
    flush = timing.default_flush_bytes(50 << 20 if on_gpu else None)
    out = records.ProbeWriter(PROBE, a.out, argv, {**vars(a), "reps": reps, "flush_bytes": flush if on_gpu else None})
    read = jax.jit(lambda x: jnp.sum(x, dtype=jnp.uint32))
    for sname, (b, s) in shapes.items():
        for fmt in a.formats.split(","):
            nbytes = kv_bytes(b, s, fmt)
            buf = jnp.zeros((int(nbytes) // 4,), jnp.uint32)
            jax.block_until_ready(read(buf))
            t = (timing.time_kernels(read, (buf,), framework="jax", reps=reps, flush_bytes=flush) if on_gpu
                 else timing.time_cpu(read, (buf,), reps=reps))
            m = out.timing_metrics(t)
            p50 = t.stats["p50"]
            out.emit("read_ceiling",
                     {"name": f"decode_gqa_{sname}_{fmt}", "family": "decode", "batch": b, "heads_q": HQ,
                      "heads_kv": HKV, "q_len": TQ, "kv_len": s, "head_dim": D, "dtype": "float16", "kv_dtype": fmt,
                      "config": None if a.smoke else "configs/quant_decode.toml"},
                     {**m, "bytes": nbytes, "tb_s": nbytes / p50 / 1e6 if p50 > 0 else None,
                      "fallback": t.fallback})
            del buf
    out.close()
    key = "time_us_p50" if out.env["device_kind"] == "gpu" else "cpu_interpret_us_p50"
    print(f"\n{'workload':28} {'bytes':>12} {'p50 us':>9} {'TB/s':>6}  clock")
    for r in out.records:
        m = r["metrics"]
        print(f"{r['workload']['name']:28} {m['bytes']:12.0f} {m[key]:9.1f} {m['tb_s'] or float('nan'):6.2f}  "
              f"{m['clock']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
