"""Layer 1 and layer 2 of the roofline for one (generation, config, workload) with the plan layer 2 assumed.

    python -m compare.predict_l2 --impl pallas:v6_splitkv:faithful --arch h100 \\
        --batch 1 --heads 8 --q-len 1 --kv-len 8192 --head-dim 128 --dtype float16 [--causal] [--json]
    python -m compare.predict_l2 --model llama-3.1-8b --entry prefill --q-len 3000 [--arch h100] [--json]

``--impl`` is ``pallas:<gen>[:<config>]`` (config: a name of the generation's configs; default the kernel's
default) or ``cuda:<gen>``. ``run(args)`` is the function ``compare predict`` can call for ``--impl``.

``--model NAME`` (a model of the sweep, ``configs/sweep.toml``'s ``[models]``: heads, head dim and features such as a
window or soft-cap from its table) with ``--entry prefill|train|decode`` and any ``--q-len`` / ``--kv-len``: the
workload as the sweep would build it (``--tokens`` per batch, default 32768 for prefill / train; ``--batch`` wins),
and ``--impl`` defaults to ``pallas:auto``: the kernel and config the public entry's defaults choose on ``--arch``
(its tuning table, as on that GPU), priced as that config, the way a sweep record's before-the-run layer 2 is.
Layer 1 is the workload's floor as compare run counts it (window / visible pairs, soft-cap). Train (session 21):
layer 2 prices the drop-in's step (``pallas:auto`` or ``pallas:dropin:<bwd config>``: fa_prefill's forward, the
loss, fa_prefill_bwd's launches; ``compare.layer2.train_launches``).
"""

from __future__ import annotations

import argparse
import json
import sys

from . import hardware, layer2, roofline

__all__ = ["add_arguments", "run", "main"]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--impl", default=None, help="pallas:<gen>[:<config>] or cuda:<gen> (with --model: default "
                    "pallas:auto)")
    ap.add_argument("--arch", default="h100", help=f"hardware row: {', '.join(hardware.keys())}")
    ap.add_argument("--model", default=None, help="a model of configs/sweep.toml's [models] (heads, head dim, "
                    "features from its table)")
    ap.add_argument("--entry", default="prefill", choices=("prefill", "train", "decode"),
                    help="with --model: the public entry (default prefill)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="with --model: tokens per batch (batch = tokens // q_len; default 32768 for prefill / "
                         "train, batch 1 for decode)")
    ap.add_argument("--batch", type=int, default=None, help="batch (default 1; with --model see --tokens)")
    ap.add_argument("--heads", type=int, default=8, help="query heads")
    ap.add_argument("--heads-kv", type=int, default=None)
    ap.add_argument("--q-len", type=int, required=True)
    ap.add_argument("--kv-len", type=int, default=None)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"),
                    help="default float16 (with --model: bfloat16, as the sweep)")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--json", action="store_true")


def run(a: argparse.Namespace) -> dict:
    if getattr(a, "model", None):
        return run_model(a)
    if not a.impl:
        raise ValueError("--impl is required without --model")
    a.batch = a.batch or 1
    a.dtype = a.dtype or "float16"
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


def model_workload(model: str, entry: str, q_len: int, kv_len: int | None = None, *, tokens: int | None = None,
                   batch: int | None = None, dtype: str = "bfloat16"):
    """The compare workload of ``model`` (configs/sweep.toml's [models]) at this entry and size, built as the sweep
    builds its own (the model's heads, head dim and features; causal; decode: one query row on the last key)."""
    import tomllib

    from . import workloads

    path = workloads.resolve_config("sweep")
    models = workloads._check_models(tomllib.loads(path.read_text()).get("models", {}), path)
    if model not in models:
        raise ValueError(f"--model {model!r} is not a model of {path.name}: {', '.join(sorted(models))}")
    fam = {"prefill": "prefill", "train": "train", "decode": "decode"}[entry]
    q = 1 if entry == "decode" else q_len
    kv = kv_len or q_len
    size = f"s{kv}" if entry == "decode" else f"n{q_len}"
    raw = {"name": f"predict_{entry}_{model}_{size}", "family": fam, "entry": entry, "model": model, "q_len": q,
           "kv_len": kv, "causal": True, "dtype": dtype}
    if batch:
        raw["batch"] = batch
    elif entry == "decode":
        raw["batch"] = 1
    else:
        raw["tokens"] = tokens or 32768
    where = f"--model {model}"
    return workloads._build(workloads._with_model(raw, models, where), where)


def _as_on(arch: str):
    """The public entries' choice as on ``arch`` from this (maybe GPU-less) process: the drop-in's device query
    answers "a Hopper" for h100 / h200, interpret mode is off, and the tuning table is that chip's (or off). The
    three are restored on exit; nothing runs meanwhile (only the routing and the plan are asked)."""
    import contextlib
    import os
    from pathlib import Path

    from pallas_attn import _compat, dropin

    @contextlib.contextmanager
    def ctx():
        table = Path(__file__).resolve().parents[1] / "pallas_attn" / "tuning" / f"{arch}.json"
        saved = (dropin._is_sm90, _compat.default_interpret, os.environ.get("PALLAS_ATTN_TUNING"))
        hopper = arch in ("h100", "h200")
        dropin._is_sm90 = lambda: hopper
        _compat.default_interpret = lambda interpret=None: False if interpret is None else interpret
        os.environ["PALLAS_ATTN_TUNING"] = str(table) if table.exists() else "off"
        try:
            yield table.exists()
        finally:
            dropin._is_sm90, _compat.default_interpret = saved[0], saved[1]
            if saved[2] is None:
                os.environ.pop("PALLAS_ATTN_TUNING", None)
            else:
                os.environ["PALLAS_ATTN_TUNING"] = saved[2]

    return ctx()


def plan_for(impl: str, w, ctx) -> dict | None:
    """The plan a record of ``impl`` on ``w`` would carry (made under ``_as_on``): auto's choice, the drop-in pair's
    forward and backward configs for ``pallas:dropin:<bwd>``, else None (the kernel's own plan)."""
    from . import auto, impls

    if impl == layer2.AUTO:
        return auto._plan(w, ctx)
    if impl.startswith(layer2.DROPIN):
        return impls._dropin_plan(impl[len(layer2.DROPIN):], w, ctx)
    return None


def run_model(a: argparse.Namespace) -> dict:
    """``--model``: layer 1 of the model's workload and layer 2 of ``--impl`` (default the public entry's choice)."""
    from . import interop
    from .schema import Ctx

    hw = hardware.get(a.arch)
    w = model_workload(a.model, a.entry, a.q_len, a.kv_len, tokens=a.tokens, batch=a.batch,
                       dtype=a.dtype or "bfloat16")
    prob = roofline.problem_for(interop.roofline_view(w))
    est = roofline.estimate(prob, hw)
    impl = a.impl or layer2.AUTO
    out = {"hardware": hw.name, "impl": impl, "workload": {k: getattr(w, k) for k in (
        "name", "family", "batch", "heads_q", "heads_kv", "q_len", "kv_len", "head_dim", "dtype", "causal", "window",
        "softcap", "sinks")},
        "layer1": {"floor_us": est.floor_s * 1e6, "limiter": est.limiter, "precision": prob.precision}}
    with _as_on(hw.key) as has_table:
        ctx = Ctx(jax_gpu=True, torch_cuda=False, hopper=hw.key in ("h100", "h200"), interpret=False)
        plan = plan_for(impl, w, ctx)
    out["tuning_table"] = has_table
    if plan is not None:
        out["chose"] = plan.get("chose")
    out["layer2"] = layer2.predict_record(w, impl, plan, hw)
    return out


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
    if "workload" in out:
        w = out["workload"]
        feats = ", ".join(f"{k} {w[k]}" for k in ("window", "softcap") if w.get(k)) + (", sinks" if w.get("sinks")
                                                                                       else "")
        print(f"  workload: {w['name']}: B{w['batch']} Hq{w['heads_q']}/Hkv{w['heads_kv']} Tq{w['q_len']} "
              f"Tk{w['kv_len']} D{w['head_dim']} {w['dtype']}{' causal' if w['causal'] else ''}"
              f"{', ' + feats if feats else ''}")
    if out.get("chose"):
        table = "its tuning table" if out.get("tuning_table") else "no tuning table for this chip: the kernels' rules"
        print(f"  the public entry chooses: {out['chose']} ({table})")
    print(f"  layer 1: {l1['floor_us']:.2f} us floor, limiter {l1['limiter']} (operands {l1['precision']})")
    if "error" in l2:
        print(f"  layer 2: not priced: {l2['error']}")
        return
    via = f" (as {l2['via']})" if l2.get("via") else ""
    print(f"  layer 2: {l2['time_us']:.2f} us{via}, limiter {l2['limiter']}")
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
