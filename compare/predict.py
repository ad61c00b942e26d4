"""``python -m compare predict``: the layer-1 roofline for one problem, with the reference's flags.

Flags follow the reference's ``roofline.predict`` (ORIGINAL.md §3.3) plus ``--arch t4|a100|h100|h200|b200|
b300`` (``sm_XY`` spellings accepted), ``--q-len``, ``--causal``, ``--reference-conventions`` and ``--json``.
``--shape BxHxNxd``: N is the query length and, unless ``--kv-len`` is given, the key length.
"""

from __future__ import annotations

import argparse
import json

from . import hardware, roofline

__all__ = ["add_parser", "run"]


def _shape(text: str) -> tuple[int, int, int, int]:
    try:
        b, h, n, d = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be BxHxNxd (e.g. 1x8x2048x64); got {text!r}") from None
    if min(b, h, n, d) < 1:
        raise argparse.ArgumentTypeError(f"--shape sizes must be >= 1; got {text!r}")
    return b, h, n, d


def _tile(text: str) -> tuple[int, int]:
    try:
        m, n = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tile must be MxN (e.g. 64x64); got {text!r}") from None
    return m, n


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="layer-1 roofline prediction for one problem (no GPU needed)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="t4", help="t4 | a100 | h100 | h200 | b200 | b300 (or sm_XY); default t4")
    p.add_argument("--shape", type=_shape, default=(1, 8, 2048, 64), help="BxHxNxd, H = query heads")
    p.add_argument("--precision", default="fp32", choices=sorted(roofline.BYTES))
    p.add_argument("--materialize-s", action="store_true", help="v1/v2 model: S round-trips through HBM")
    p.add_argument("--tile", type=_tile, default=(1, 1), help="MxN tile reuse for --materialize-s")
    p.add_argument("--no-tensor-core", action="store_true", help="use the fp32 CUDA-core peak")
    p.add_argument("--kv-len", type=int, default=None, help="key length N_k (decode); default N")
    p.add_argument("--q-len", type=int, default=None, help="query length; default N from --shape")
    p.add_argument("--gqa-group", type=int, default=1, help="G = Hq / Hkv")
    p.add_argument("--causal", action="store_true", help="count only visible (i, j) pairs (fused path)")
    p.add_argument("--mla", action="store_true", help="MLA latent decode model (uses --h-q, ranks)")
    p.add_argument("--h-q", type=int, default=128)
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--rope-dim", type=int, default=64)
    p.add_argument("--mma-engine", default="fp16", choices=("fp16", "bf16", "fp8", "nvfp4"))
    p.add_argument("--reference-conventions", action="store_true",
                   help="reproduce the reference tool exactly (MLA Q/O at storage width, causal ignored)")
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    hw = hardware.get(args.arch)
    b, h, n, d = args.shape
    q_len = args.q_len or n
    kv_len = args.kv_len or n
    if args.mla:
        prob = roofline.Problem(
            batch=b, heads_q=args.h_q, q_len=q_len, kv_len=kv_len, head_dim=args.kv_lora_rank + args.rope_dim,
            precision=args.precision, group=args.h_q, mla=True, kv_lora_rank=args.kv_lora_rank,
            rope_dim=args.rope_dim, mma_engine=args.mma_engine, use_tensor_core=not args.no_tensor_core,
            reference_conventions=args.reference_conventions,
        )
        shape = f"B={b} h_q={args.h_q} Nq={q_len} Nk={kv_len} latent {args.kv_lora_rank}+{args.rope_dim}"
    else:
        prob = roofline.Problem(
            batch=b, heads_q=h, q_len=q_len, kv_len=kv_len, head_dim=d, precision=args.precision,
            group=args.gqa_group, materialize_s=args.materialize_s, tile=args.tile,
            use_tensor_core=not args.no_tensor_core, causal=args.causal, q_offset=max(0, kv_len - q_len),
            mma_engine=args.mma_engine, reference_conventions=args.reference_conventions,
        )
        shape = f"B={b} Hq={h} Hkv={h // args.gqa_group} (G={args.gqa_group}) Nq={q_len} Nk={kv_len} d={d}"
    est = roofline.estimate(prob, hw)
    if args.json:
        print(json.dumps({"arch": hw.key, "problem": prob.__dict__, "estimate": est.as_dict()}, default=str))
        return 0
    side = "BELOW -> memory-bound" if est.ai < est.ridge else "ABOVE -> compute-bound"
    print(f"arch      : {hw.name} ({hw.sm}), {hw.num_sm} SMs, HBM {hw.hbm_bw / 1e12:.2f} TB/s, "
          f"{est.engine} peak {est.peak_flops / 1e12:.1f} TFLOP/s  [datasheet; see compare/hardware.py]")
    print(f"shape     : {shape} {args.precision}{' causal' if args.causal else ''}"
          f"{' materialized-S tile ' + 'x'.join(map(str, args.tile)) if args.materialize_s else ''}")
    print(f"LIMITER   : {est.limiter} (predicted lower bound {est.floor_s * 1e3:.4g} ms)")
    for k, t in est.times.items():
        print(f"t_{k.lower():<8}: {t * 1e3:.4g} ms ({100 * t / est.floor_s:.1f}% of bound)")
    print(f"intensity : {est.ai:.2f} FLOP/byte (ridge {est.ridge:.1f}; {side})")
    print(f"work      : {est.flops / 1e9:.4g} GFLOP, {est.bytes / 1e6:.4g} MB, {est.exps / 1e6:.4g} M exp")
    frac = roofline.tc_ceiling_fraction(est)
    print(f"ceiling   : at most {100 * frac:.2f}% of the {est.engine} "
          f"{'tensor-core' if est.engine != 'fp32' else 'CUDA-core'} peak can be used (t_mma / floor)")
    return 0
