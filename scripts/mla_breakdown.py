"""Where an MLA decode call's time goes: every kernel of one ``mla_attention`` call, CUPTI, cold L2.

    PYTHONPATH=. python scripts/mla_breakdown.py [--reps 20] [--out FILE.json] [--configs kv64_mc,kv64_mc:direct=0]

For DeepSeek-V3's decode shape (h_q 128, latent 512 + 64, page 64, bf16) at several batch x length points, each
variant (a named fa_mla config with ``finish`` pallas (the default) or jnp, the table check on or off, a forced
split count) is jitted and timed as compare times it (an L2 flush before each repetition, excluded), and the
median duration of each kernel it launches is printed: the partial kernel, the merge, the cast / unpack and the
table check (docs/mla.md, "The fixed cost"). The outputs of every variant are checked against the first variant's.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from call_breakdown import kernels_jax, summarize  # scripts/ (this script's folder is on sys.path)

import pallas_attn
from pallas_attn.kernels import v12_mla_tc as v

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

SHAPES = {"b1_s2048": (1, 2048), "b1_s8192": (1, 8192), "b1_s32768": (1, 32768), "b8_s8192": (8, 8192),
          "b32_s2048": (32, 2048), "b64_s2048": (64, 2048), "b64_s8192": (64, 8192), "b128_s2048": (128, 2048),
          "b128_s8192": (128, 8192), "b256_s1024": (256, 1024)}


def inputs(b: int, s: int, *, hq=128, dqk=576, page=64, seed=0):
    rng = np.random.default_rng(seed)
    pps = s // page
    nb = b * pps
    q = jnp.asarray(rng.standard_normal((b, 1, hq, dqk)), jnp.bfloat16)
    lat = jnp.asarray(rng.standard_normal((nb, page, 1, dqk)), jnp.bfloat16)
    bt = jnp.asarray(rng.permutation(nb).reshape(b, pps), jnp.int32)
    lens = jnp.full((b,), s, jnp.int32)
    return q, lat, bt, lens


def variants(shape: str, configs: str | None = None):
    if configs:  # named configs, as the default call runs them; "name:field=value[:field=value]" overrides fields
        out = []
        for spec in configs.split(","):
            name, *over = spec.split(":")
            cfg = v.CONFIGS[name]
            for item in over:
                key, val = item.split("=")
                cur = getattr(cfg, key)
                cfg = dataclasses.replace(cfg, **{key: bool(int(val)) if isinstance(cur, bool) else type(cur)(val)
                                                  if cur is not None else int(val)})
            out.append((spec, cfg, True))
        return out
    out = []
    for name in ("kv64_mc", "kv64_ws_mc"):
        base = v.CONFIGS[name]
        out.append((f"{name}", base, True))
        out.append((f"{name} jnp", dataclasses.replace(base, finish="jnp"), True))
    out.append(("kv64_mc nocheck", v.CONFIGS["kv64_mc"], False))
    b, s = SHAPES[shape]
    if b == 1:
        for ns in ((8, 16) if s <= 2048 else (16, 33)):
            out.append((f"kv64_mc S{ns}", dataclasses.replace(v.CONFIGS["kv64_mc"], num_splits=ns), True))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out")
    ap.add_argument("--configs", help="comma-separated fa_mla config names (default: session 20's variants)")
    a = ap.parse_args()
    flush_bytes = 2 * 50 * 2**20
    results = []
    for shape in a.shapes.split(","):
        b, s = SHAPES[shape]
        q, lat, bt, lens = inputs(b, s)
        ref = None
        for label, cfg, check in variants(shape, a.configs):
            fn = jax.jit(lambda q, lat, bt, lens, cfg=cfg, check=check: pallas_attn.mla_attention(
                q, lat, bt, lens, kv_lora_rank=512, causal=True, config=cfg, check_block_table=check))
            try:
                o = np.asarray(fn(q, lat, bt, lens).astype(jnp.float32))
                ks, tot = summarize(kernels_jax(fn, (q, lat, bt, lens), a.reps, flush_bytes))
            except Exception as e:  # noqa: BLE001 - a variant that cannot run is reported, not fatal
                print(f"{shape:12s} {label:22s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                results.append(dict(shape=shape, variant=label, error=str(e)[:500]))
                continue
            if ref is None:
                ref = o
            err = float(np.max(np.abs(o - ref)))
            splits = cfg.splits(batch=b, rows=128, n_k=s)
            print(f"{shape:12s} {label:22s} {tot:8.1f} us  S={splits[0]:3d}  maxdiff {err:.2e}  | "
                  + "  ".join(f"{n[:40]}={t:.1f}" for n, t in ks), flush=True)
            results.append(dict(shape=shape, variant=label, total_us=tot, splits=splits[0], max_abs_diff=err,
                                kernels=ks))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, jax=jax.__version__, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
