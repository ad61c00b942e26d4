"""Compile fa_mla Mosaic configs at the DeepSeek-V3 shape with Mosaic GPU's compiler dumps on, and summarize them.

One process per config compiles it once at B 4 (the environment decides what Mosaic prints: MOSAIC_GPU_DUMP_PTXAS=1
for ptxas's report, MOSAIC_GPU_DUMP_SASS=1 for the SASS, which needs CUDA's nvdisasm on PATH; without
MOSAIC_GPU_DUMP_TO both go to stdout). ``--summarize LOG...`` then prints per log: ptxas's register count, spill
bytes and any "Potential Performance Loss" warning (ptxas serializing wgmma), and SASS counts of HGMMA,
WARPGROUP.DEPBAR (wgmma waits) and WARPGROUP.ARRIVE. A config is a name from fa_mla's configs or
``name:field=value,...`` (an MlaTcConfig override, e.g. ``kv64_ws_mc:s_regs=168,consumer_regs=168``). Needs a
Hopper GPU for the compile.

MLA_DUMP_CUDA_ROOT=/usr/local/cuda points Mosaic's nvdisasm lookup there.

Usage: MOSAIC_GPU_DUMP_PTXAS=1 MOSAIC_GPU_DUMP_SASS=1 python scripts/mla_dump_sass.py CONFIG > LOG 2>&1
       python scripts/mla_dump_sass.py --summarize LOG [LOG ...]
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def parse(spec: str):
    from pallas_attn import registry
    from pallas_attn.kernels import v12_mla_tc

    name, _, over = spec.partition(":")
    base = registry.configs("fa_mla")[name]
    fields = {}
    for kv in filter(None, over.split(",")):
        k, v = kv.split("=")
        fields[k] = type(getattr(base, k))(int(v)) if not isinstance(getattr(base, k), bool) else v == "True"
    return v12_mla_tc.MlaTcConfig(**{**base.__dict__, **fields})


def summarize(d: Path) -> dict:
    files = [d] if d.is_file() else sorted(p for p in d.rglob("*") if p.is_file())
    text = "\n".join(p.read_text(errors="replace") for p in files)
    regs = re.findall(r"Used (\d+) registers", text)
    spill = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
    return {"registers": regs[-1] if regs else "?", "spill_st_ld": spill[-1] if spill else "?",
            "serialized_warnings": len(re.findall(r"Potential Performance Loss", text)),
            "HGMMA": len(re.findall(r"\bHGMMA\.", text)), "DEPBAR": len(re.findall(r"WARPGROUP\.DEPBAR", text)),
            "ARRIVE": len(re.findall(r"WARPGROUP\.ARRIVE", text)), "STL": len(re.findall(r"\bSTL\b", text)),
            "LDL": len(re.findall(r"\bLDL\b", text)),
            "warning_lines": sorted(set(re.findall(r"[^\n]*Potential Performance Loss[^\n]*", text)))[:4]}


def main(argv: list[str]) -> int:
    if argv[0] == "--summarize":  # the logs of earlier runs
        for f in argv[1:]:
            s = summarize(Path(f))
            print(f"{Path(f).name:48s} regs {s['registers']:>4} spill(st,ld) {s['spill_st_ld']} HGMMA {s['HGMMA']} "
                  f"DEPBAR {s['DEPBAR']} ARRIVE {s['ARRIVE']} STL {s['STL']} LDL {s['LDL']} "
                  f"serialized-warnings {s['serialized_warnings']}")
            for w in s["warning_lines"]:
                print("   ", w.strip()[:300])
        return 0
    import jax.numpy as jnp
    import numpy as np

    if os.environ.get("MLA_DUMP_CUDA_ROOT"):  # where nvdisasm lives (jax points Mosaic at its pip CUDA, which has none)
        import jax.experimental.mosaic.gpu  # noqa: F401  (sets MOSAIC_GPU_CUDA_ROOT on import)
        os.environ["MOSAIC_GPU_CUDA_ROOT"] = os.environ["MLA_DUMP_CUDA_ROOT"]
    import pallas_attn
    from attn_core import paging

    rng = np.random.default_rng(0)
    b, lens = 4, [8192, 5000, 8191, 1]
    lat = rng.standard_normal((b, 8192, 1, 576)).astype(np.float32)
    pool, bt, kl = paging.build_paged_latent(lat, 64, seed=0, kv_lens=lens)
    q = jnp.asarray(rng.standard_normal((b, 1, 128, 576)), jnp.bfloat16)
    pool = jnp.asarray(pool, jnp.bfloat16)
    pallas_attn.mla_attention(q, pool, jnp.asarray(bt), jnp.asarray(kl), kv_lora_rank=512, config=parse(argv[0]),
                              interpret=False).block_until_ready()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
