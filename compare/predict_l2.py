"""Layer 1 and layer 2 of the roofline for one (generation, config, workload) with the plan layer 2 assumed.

    python -m compare.predict_l2 --impl pallas:v6_splitkv:faithful --arch h100 \\
        --batch 1 --heads 8 --q-len 1 --kv-len 8192 --head-dim 128 --dtype float16 [--causal] [--json]

``--impl`` is ``pallas:<gen>[:<config>]`` (config: a name of the generation's configs; default the kernel's
default) or ``cuda:<gen>``. ``run(args)`` is the function ``compare predict`` can call for ``--impl``.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import hardware, layer2, roofline

__all__ = ["add_arguments", "run", "main"]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--impl", required=True, help="pallas:<gen>[:<config>] or cuda:<gen>")
    ap.add_argument("--arch", default="h100", help=f"hardware row: {', '.join(hardware.keys())}")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--heads-kv", type=int, default=None)
    ap.add_argument("--q-len", type=int, required=True)
    ap.add_argument("--kv-len", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> dict:
    hw = hardware.get(a.arch)
    kv = a.kv_len or a.q_len
    off = kv - a.q_len if a.q_len < kv else 0
    shape = layer2.Shape(a.batch, a.heads, a.heads_kv or a.heads, a.q_len, kv, a.head_dim, a.dtype, a.causal, off)
    pred = layer2.predict(a.impl, shape, hw)
    facts = _layer1_facts(a.impl, shape)
    prob = roofline.Problem(batch=a.batch, heads_q=a.heads, q_len=a.q_len, kv_len=kv, head_dim=a.head_dim,
                            precision=facts[0], group=a.heads // (a.heads_kv or a.heads), materialize_s=facts[1],
                            tile=facts[2], causal=a.causal, q_offset=off)
    est = roofline.estimate(prob, hw)
    return {"hardware": hw.name, "impl": a.impl,
            "layer1": {"floor_us": est.floor_s * 1e6, "limiter": est.limiter, "precision": facts[0]},
            "layer2": pred.as_dict()}


def _layer1_facts(impl: str, s: layer2.Shape) -> tuple[str, bool, tuple[int, int]]:
    parts = impl.split(":")
    if parts[0] == "pallas":
        from pallas_attn import registry

        k = registry.kernel(parts[1])
        prob = layer2._pallas_problem(s, "dense")
        cfg = parts[2] if len(parts) > 2 and parts[2] in registry.configs(parts[1]) else None
        r = k.roofline(prob, cfg)
        return r.precision, r.materialize_s, tuple(r.tile)
    import cuda_ref

    row = next(r for r in cuda_ref.table() if r.id == parts[1])
    mat = bool(row.materializes_s)
    return row.operand_precision(s.dtype), mat, tuple(row.tile(s.head_dim)) if mat else (1, 1)


def _print(out: dict) -> None:
    l1, l2 = out["layer1"], out["layer2"]
    print(f"{out['impl']} on {out['hardware']}")
    print(f"  layer 1: {l1['floor_us']:.2f} us floor, limiter {l1['limiter']} (operands {l1['precision']})")
    print(f"  layer 2: {l2['time_us']:.2f} us, limiter {l2['limiter']}")
    print(f"  plan: {json.dumps(l2['plan'], default=str)}")
    for ln in l2["launches"]:
        print(f"    {ln['name']}: {ln['programs']} programs x {ln['threads']} threads, {ln['regs']} regs, "
              f"{ln['smem']} B smem -> {ln['resident']}/SM ({ln['occupancy_limit']}), {ln['waves']:.2f} waves, "
              f"{ln['rounds']} rounds; issue {ln['t_issue_us']:.2f} / latency {ln['t_latency_us']:.2f} / "
              f"dram {ln['t_dram_us']:.2f} / l2 {ln['t_l2_us']:.2f} + launch {ln['t_launch_us']:.2f} us "
              f"-> {ln['time_us']:.2f} us ({ln['limiter']})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m compare.predict_l2", description=__doc__.splitlines()[0])
    add_arguments(ap)
    a = ap.parse_args(argv)
    try:
        out = run(a)
    except (NotImplementedError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        _print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
