"""The sha256 of the lowered CUDA programs of the Mosaic GPU kernels, for refactors that must not change them
(issue 26: "traced programs stay identical, hash them before and after"). No GPU needed.

    PYTHONPATH=. python scripts/lowered_hashes.py before.json    # on the tree before the change
    PYTHONPATH=. python scripts/lowered_hashes.py after.json     # after it
    diff before.json after.json                                  # empty: every program is the same

Programs: fa_prefill's forward at every named config and D 64 / 128 / 256, with a window, a soft-cap, q_lens and
paged K/V (pages 16 and 64); every fa_prefill_bwd config (causal D 64 and 256, non-causal D 128); every fa_mla config
at pages 16 and 64. Source locations are left out of the lowered text (``jax_traceback_in_locations_limit`` 0), so
moving code between lines or files does not change a hash (the names of this script's own functions are in the text:
compare runs of one version of it); a program that fails to lower is recorded as "ERR <type>"
(``d256`` at D 64 is expected to). Sensitivity: changing the ring producer's drain bound by one step changed the 17
backward hashes that use it (session 13).

``--extra`` after the path adds ``extra_programs`` (names ``x-...``, 264 more): the forward, backward and fa_mla
feature variants that reach the producer warpgroup's ring loop (~1.5 minutes in all on a CPU). Sensitivity (session
24): computing v12's ring slot before its producer's wait rather than inside it changed the 12 fa_mla hashes with a
producer warpgroup; computing the forward's inside its waits changed all 26 forward ones.

    PYTHONPATH=. python scripts/lowered_hashes.py before.json --extra
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_traceback_in_locations_limit", 0)  # no source lines in the lowered text

from pallas_attn import api  # noqa: E402
from pallas_attn.kernels import fa_prefill as fp  # noqa: E402
from pallas_attn.kernels import fa_prefill_bwd as fb  # noqa: E402
from pallas_attn.kernels import v12_mla_tc  # noqa: E402
from pallas_attn.mla import mla_attention  # noqa: E402

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

SDS = jax.ShapeDtypeStruct


def _lower(fn, *args) -> str:
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _record(out: dict, name: str, fn, *args) -> None:
    try:
        out[name] = hashlib.sha256(_lower(fn, *args).encode()).hexdigest()[:16]
    except Exception as e:  # noqa: BLE001 - a program that does not lower is a row saying so
        out[name] = f"ERR {type(e).__name__}"


def forward_programs(out: dict) -> None:
    off = SDS((2,), jnp.int32)
    for cfg in ("default", "serial", "pingpong", "tiles2", "tiles4", "tiles8", "c3", "warp_producer"):
        for d in (64, 128, 256):
            q, k = SDS((2, 200, 4, d), jnp.bfloat16), SDS((2, 333, 2, d), jnp.bfloat16)

            def f(q, k, off, cfg=cfg):
                return api.attention(q, k, k, causal=True, q_offset=off, generation="fa_prefill", config=cfg,
                                     interpret=False, return_lse=True)

            _record(out, f"fwd-{cfg}-d{d}", f, q, k, off)
    cfg = fp.CONFIGS["default"]
    q, k, ql = SDS((2, 256, 4, 128), jnp.bfloat16), SDS((2, 512, 2, 128), jnp.bfloat16), SDS((2,), jnp.int32)
    for name, kw in (("window", dict(window=(100, 0))), ("softcap", dict(softcap=30.0))):
        def g(q, k, off, kw=kw):
            return fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False, config=cfg, **kw)

        _record(out, f"fwd-{name}", g, q, k, off)

    def with_lens(q, k, off, ql):
        return fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False, config=cfg, q_lens=ql)

    _record(out, "fwd-qlens", with_lens, q, k, off, ql)
    for page in (16, 64):
        pool, bt = SDS((2 * 512 // page, page, 2, 128), jnp.bfloat16), SDS((2, 512 // page), jnp.int32)

        def paged(q, p, bt, off, ql):
            return fp.forward(q, p, p, causal=True, scale=0.1, q_offset=off, interpret=False, config=cfg,
                              block_table=bt, q_lens=ql)

        _record(out, f"fwd-paged{page}", paged, q, pool, bt, off, ql)


def backward_programs(out: dict) -> None:
    for config in fb.CONFIGS:
        for causal, d, dtype in ((True, 64, jnp.bfloat16), (False, 128, jnp.float16), (True, 256, jnp.bfloat16)):
            q, k = SDS((2, 200, 4, d), dtype), SDS((2, 333, 2, d), dtype)
            lse, off = SDS((2, 4, 200), jnp.float32), SDS((2,), jnp.int32)

            def f(q, k, v, o, lse, do, off, causal=causal, config=config):
                return fb.backward(q, k, v, o, lse, do, causal=causal, scale=0.125, q_offset=off,
                                   config=fb.CONFIGS[config])

            _record(out, f"bwd-{config}-{causal}-d{d}", f, q, k, k, q, lse, q, off)


def mla_programs(out: dict) -> None:
    b, dqk, dv = 2, 576, 512
    for config in v12_mla_tc.CONFIGS:
        for page in (64, 16):
            pps = 256 // page
            q, pool = SDS((b, 1, 128, dqk), jnp.bfloat16), SDS((b * pps, page, 1, dqk), jnp.bfloat16)
            bt, lens = SDS((b, pps), jnp.int32), SDS((b,), jnp.int32)
            base = v12_mla_tc.CONFIGS[config]  # two splits (the work list has units instead: 132 SMs' worth)
            cfg = v12_mla_tc.MlaTcConfig(**{**base.__dict__, **({"num_sm": 132} if base.work_list else
                                                                {"num_splits": 2})})

            def f(q, p, bt, lens, cfg=cfg):
                return mla_attention(q, p, bt, lens, kv_lora_rank=dv, generation="fa_mla", config=cfg,
                                     interpret=False, check_block_table=False)

            _record(out, f"mla-{config}-p{page}", f, q, pool, bt, lens)


def extra_programs(out: dict) -> None:
    """Variants added for the warp-specialised producer's move into the kit (session 24, names ``x-...``): the
    forward at every named config with each feature that reaches its producer (a window, a soft-cap, sinks, packed
    documents, q_lens, paged K/V at pages 16 / 32 / 64 / 128, q_lens with paged K/V, no LSE output) on a longer
    sequence (several row tiles per CTA); every backward config with a window, a soft-cap and packed documents; every
    fa_mla config at pages 16 / 32 / 64 / 128, causal two-token decode and the LSE output; and (session 35) every
    fa_mla config but the work list's at one split, where the kernel writes the output itself (``direct``), with
    and without the table check's flag."""
    off, d = SDS((2,), jnp.int32), 128
    q, k = SDS((2, 1024, 4, d), jnp.bfloat16), SDS((2, 1024, 2, d), jnp.bfloat16)
    ql, sinks, seg = SDS((2,), jnp.int32), SDS((4,), jnp.float32), SDS((2, 1024), jnp.int32)
    for name, cfg in fp.CONFIGS.items():
        for feat, kw in (("plain", {}), ("window", dict(window=(100, 0))), ("softcap", dict(softcap=30.0)),
                         ("sinks", "sinks"), ("segments", "segments"), ("qlens", "qlens"), ("nolse", "nolse")):
            def f(q, k, off, x, kw=kw, cfg=cfg):
                extra = {"sinks": dict(sinks=x), "segments": dict(segment_ids=x), "qlens": dict(q_lens=x),
                         "nolse": {}}.get(kw, kw) if isinstance(kw, str) else kw
                return fp.forward(q, k, k, causal=True, scale=0.1, q_offset=off, interpret=False, config=cfg,
                                  return_lse=kw != "nolse", **extra)

            x = {"sinks": sinks, "segments": seg, "qlens": ql}.get(kw, off) if isinstance(kw, str) else off
            _record(out, f"x-fwd-{name}-{feat}", f, q, k, off, x)
        for page in (16, 32, 64, 128):
            pool, bt = SDS((2 * 1024 // page, page, 2, d), jnp.bfloat16), SDS((2, 1024 // page), jnp.int32)
            for feat in ("paged", "paged-qlens"):
                def g(q, p, bt, off, ql, cfg=cfg, feat=feat):
                    return fp.forward(q, p, p, causal=True, scale=0.1, q_offset=off, interpret=False, config=cfg,
                                      block_table=bt, q_lens=ql if feat == "paged-qlens" else None, return_lse=True)

                _record(out, f"x-fwd-{name}-{feat}{page}", g, q, pool, bt, off, ql)
    for config in fb.CONFIGS:
        for d in (64, 128, 256):
            q, k = SDS((2, 256, 4, d), jnp.bfloat16), SDS((2, 256, 2, d), jnp.bfloat16)
            lse, seg = SDS((2, 4, 256), jnp.float32), SDS((2, 256), jnp.int32)
            for feat, kw in (("window", dict(window=100)), ("softcap", dict(softcap=30.0)), ("segments", None)):
                def h(q, k, o, lse, do, off, seg, kw=kw, config=config):
                    extra = dict(segment_ids=seg) if kw is None else kw
                    return fb.backward(q, k, k, o, lse, do, causal=True, scale=0.125, q_offset=off,
                                       config=fb.CONFIGS[config], **extra)

                _record(out, f"x-bwd-{config}-{feat}-d{d}", h, q, k, q, lse, q, SDS((2,), jnp.int32) if
                        feat != "segments" else None, seg)
    b, dqk, dv = 2, 576, 512
    for config in v12_mla_tc.CONFIGS:
        for page in (16, 32, 64, 128):
            pps = 512 // page
            pool = SDS((b * pps, page, 1, dqk), jnp.bfloat16)
            bt, lens = SDS((b, pps), jnp.int32), SDS((b,), jnp.int32)
            for feat, tq, causal, lse in (("plain", 1, False, False), ("causal2", 2, True, True)):
                q = SDS((b, tq, 128 // tq, dqk), jnp.bfloat16)

                def m(q, p, bt, lens, config=config, causal=causal, lse=lse):
                    return mla_attention(q, p, bt, lens, kv_lora_rank=dv, generation="fa_mla",
                                         config=v12_mla_tc.CONFIGS[config], causal=causal, return_lse=lse,
                                         interpret=False, check_block_table=False)

                _record(out, f"x-mla-{config}-{feat}-p{page}", m, q, pool, bt, lens)
        if v12_mla_tc.CONFIGS[config].work_list:
            continue
        pps = 512 // 64  # one split (session 35): the direct epilogue, with and without the table check's flag
        pool, bt = SDS((b * pps, 64, 1, dqk), jnp.bfloat16), SDS((b, pps), jnp.int32)
        q = SDS((b, 1, 128, dqk), jnp.bfloat16)
        for check in (True, False):
            cfg = dataclasses.replace(v12_mla_tc.CONFIGS[config], num_splits=1)

            def m1(q, p, bt, lens, cfg=cfg, check=check):
                return mla_attention(q, p, bt, lens, kv_lora_rank=dv, generation="fa_mla", config=cfg,
                                     return_lse=True, interpret=False, check_block_table=check)

            _record(out, f"x-mla-{config}-direct{'' if check else '_nocheck'}-p64", m1, q, pool, bt, lens)


def main(path: str) -> int:
    out: dict[str, str] = {}
    forward_programs(out)
    backward_programs(out)
    mla_programs(out)
    if "--extra" in sys.argv[2:]:
        extra_programs(out)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=1, sort_keys=True)
    errs = sorted(k for k, v in out.items() if v.startswith("ERR"))
    print(f"{len(out)} programs, {len(errs)} that do not lower: {errs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
