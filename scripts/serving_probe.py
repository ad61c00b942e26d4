"""Serving-path timings the sweep does not take (issue 32; docs/serving.md): where a chunk's time goes, a mixed batch
against its parts, and a windowed decode against the cache length.

    PYTHONPATH=. python scripts/serving_probe.py --out $OUT/serving      # the GPU run
    PYTHONPATH=. python scripts/serving_probe.py --smoke                 # CPU, tiny, interpret mode

Llama-3.1-8B heads (Hq 32, Hkv 8, D 128, bf16), page 16, shuffled tables. Three parts, each record one timing on
compare's clock (``compare.timing.time_kernels``: CUPTI, L2 flushed before every repetition, p10/p50/p90; the sum of
all kernels of one call, the gather included):

* ``chunk``: B 4 chunks of C queries at the end of S cached keys (the sweep's chunked shapes): ``paged_attention`` as a
  user calls it (fa_prefill reading the pages through the table), the same with the pages gathered first
  (``chunked.PAGED_IN_KERNEL`` off), the gather alone, and fa_prefill on the dense cache already gathered (the
  issue's "dense fa_prefill at the same shape");
* ``mixed``: one call over [a 2048-query chunk over 8k, two decodes over 8k and 32k, a 512-query chunk over 8k]
  (``q_lens``, Tq 2048) against the sum of its parts called separately (each chunk alone; the two decodes together on
  fa_decode); since session 34 also a batch of mostly decodes (the 2048 chunk, six decodes over 2k-32k, a 512 chunk
  over 16k);
* ``window``: fa_decode, B 8, Tq 1, a 4096-key window against no window at S 8k / 32k / 128k;
* ``pagecfg`` (asked for by name): fa_prefill's in-kernel pages at page 16 (and 64) against the dense cache under a
  few configs (the producer's register budget, 64-key tiles with a four-deep ring), chunks of 512 and 2048 over 8k.

Records (JSONL, with the environment) go to ``--out/records.jsonl``; a table is printed last.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pallas_attn  # noqa: E402
from compare import records, timing  # noqa: E402
from pallas_attn import _compat, chunked, dropin  # noqa: E402
from pallas_attn.kernels import fa_prefill  # noqa: E402

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

HQ, HKV, D = 32, 8, 128


def _pool(rng, b, pps, page):
    n = b * pps + 3
    kp = jnp.asarray(rng.standard_normal((n, page, HKV, D), np.float32), jnp.bfloat16)
    vp = jnp.asarray(rng.standard_normal((n, page, HKV, D), np.float32), jnp.bfloat16)
    tbl = jnp.asarray(rng.permutation(n)[: b * pps].reshape(b, pps).astype(np.int32))
    return kp, vp, tbl


def _packed_call(q, kp, vp, t, kv, cu, **kw):
    return pallas_attn.paged_attention_varlen(q, kp, vp, t, kv, cu, **kw)


def _q(rng, b, tq):
    return jnp.asarray(rng.standard_normal((b, tq, HQ, D), np.float32), jnp.bfloat16)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--parts", default="chunk,mixed,window")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode on the CPU")
    ap.add_argument("--packed-variants", action="store_true",
                    help="the packed mixed call also with chunked.ROW_WORDS off")
    ap.add_argument("--kernels", action="store_true",
                    help="also print (and record) every kernel of each timed call, median us per launch position "
                         "(scripts/call_breakdown.py's clock; GPU only)")
    args = ap.parse_args(argv)
    interpret = args.smoke or not _compat.has_gpu()
    page = 16
    scale = 1.0 / np.sqrt(D)
    out_f = records.open_new(args.out)
    env = records.collect_env()
    flush = timing.default_flush_bytes(None if interpret else 50 << 20)
    rows = []

    def timed(part, name, fn, fargs, **info):
        jax.block_until_ready(fn(*fargs))
        if interpret:
            t = timing.time_cpu(fn, fargs, reps=1)
        else:
            t = timing.time_kernels(fn, fargs, framework="jax", reps=args.reps, flush_bytes=flush)
        st = t.stats
        rec = {"type": "serving_probe", "part": part, "name": name, "info": info, "clock": t.clock,
               "l2_flushed": t.l2_flushed, "time_us_p50": st["p50"], "time_us_p10": st["p10"],
               "time_us_p90": st["p90"], "notes": list(t.notes), "env": env}
        if args.kernels and not interpret:  # where the call's time goes, launch by launch
            from call_breakdown import kernels_jax, summarize

            ks, total = summarize(kernels_jax(fn, fargs, args.reps, flush))
            rec["kernels_us_p50"] = [[n, round(us, 2)] for n, us in ks]
            for n, us in ks:
                print(f"          {us:9.1f} us  {n[:90]}", flush=True)
            print(f"          {total:9.1f} us  (sum of one call's kernels, median)", flush=True)
        if out_f:
            out_f.write(json.dumps(rec) + "\n")
            out_f.flush()
        rows.append((part, name, st["p50"], info))
        print(f"{part:7s} {name:44s} {st['p50']:10.1f} us  {info}", flush=True)
        return st["p50"]

    rng = np.random.default_rng(0)
    parts = set(args.parts.split(","))
    chunk_shapes = [(512, 8192), (2048, 8192), (512, 32768), (2048, 32768)] if not args.smoke else [(32, 128)]
    b = 4 if not args.smoke else 2

    if "chunk" in parts:
        for c, s in chunk_shapes:
            pps = s // page
            kp, vp, tbl = _pool(rng, b, pps, page)
            q = _q(rng, b, c)
            kv = jnp.full((b,), s, jnp.int32)
            info = dict(batch=b, chunk=c, cached=s, page=page)
            user = jax.jit(lambda q, kp, vp, t, kv: pallas_attn.paged_attention(q, kp, vp, t, kv, causal=True))
            timed("chunk", f"c{c}_s{s} paged_attention (in-kernel pages)", user, (q, kp, vp, tbl, kv), **info)
            chunked.PAGED_IN_KERNEL = False
            try:
                gathered = jax.jit(lambda q, kp, vp, t, kv: pallas_attn.paged_attention(q, kp, vp, t, kv,
                                                                                        causal=True))
                timed("chunk", f"c{c}_s{s} paged_attention (gather first)", gathered, (q, kp, vp, tbl, kv), **info)
            finally:
                chunked.PAGED_IN_KERNEL = True
            gather = jax.jit(lambda kp, vp, t: (chunked._gather(kp, t), chunked._gather(vp, t)))
            timed("chunk", f"c{c}_s{s} gather alone", gather, (kp, vp, tbl), **info)
            kd, vd = gather(kp, vp, tbl)
            cfg = dropin.prefill_config(chunked._problem(q, s, HKV), None)
            off = jnp.full((b,), s - c, jnp.int32)
            dense = jax.jit(lambda q, k, v, off, cfg=cfg: fa_prefill.forward(
                q, k, v, causal=True, scale=scale, q_offset=off, interpret=interpret, config=cfg))
            timed("chunk", f"c{c}_s{s} fa_prefill on the dense cache", dense, (q, kd, vd, off), **info)

    if "pagecfg" in parts:  # issue 32: page 16's cost against fa_prefill's knobs (the producer's registers, the ring)
        cfgs = {"default": fa_prefill.CONFIGS["default"],
                "regs224_56": fa_prefill.PrefillConfig(consumer_regs=224, producer_regs=56),
                "kv64_s4": fa_prefill.PrefillConfig(block_kv=64, stages=4),
                "kv64_s4_regs224_56": fa_prefill.PrefillConfig(block_kv=64, stages=4, consumer_regs=224,
                                                               producer_regs=56)}
        for c, s in chunk_shapes[:2]:
            q = _q(rng, b, c)
            off = jnp.full((b,), s - c, jnp.int32)
            for pg in (16, 64):
                kp, vp, tbl = _pool(rng, b, s // pg, pg)
                kd, vd = chunked._gather(kp, tbl), chunked._gather(vp, tbl)
                info = dict(batch=b, chunk=c, cached=s, page=pg)
                for cname, cfg in cfgs.items():
                    if pg == 64 and cname != "default":
                        continue
                    paged = jax.jit(lambda q, kp, vp, t, off, cfg=cfg: fa_prefill.forward(
                        q, kp, vp, causal=True, scale=scale, q_offset=off, interpret=interpret, config=cfg,
                        block_table=t))
                    timed("pagecfg", f"c{c}_s{s} p{pg} {cname} in-kernel pages", paged, (q, kp, vp, tbl, off),
                          config=cname, **info)
                    if pg == 16:
                        dense = jax.jit(lambda q, k, v, off, cfg=cfg: fa_prefill.forward(
                            q, k, v, causal=True, scale=scale, q_offset=off, interpret=interpret, config=cfg))
                        timed("pagecfg", f"c{c}_s{s} {cname} dense cache", dense, (q, kd, vd, off), config=cname,
                              **info)
                del kp, vp, kd, vd

    if "mixed" in parts:
        # two mixes: the probe's since session 12 (a chunk, two decodes, a chunk) and, since session 34, a batch of
        # mostly decodes (a chunk, six decodes over 2k-32k, a chunk)
        big, small, s8, s32 = (2048, 512, 8192, 32768) if not args.smoke else (64, 16, 128, 256)
        mixes = [("", [big, 1, 1, small], [s8, s8, s32, s8])]
        if not args.smoke:
            mixes.append((" (6 decodes)", [big, 1, 1, 1, 1, 1, 1, small],
                          [s8, 4096, s8, 16384, s32, s8, 2048, 16384]))
        for tag, qls, kvs in mixes:
            nb = len(qls)
            kp, vp, tbl = _pool(rng, nb, s32 // page, page)
            kv = jnp.asarray(np.array(kvs, np.int32))
            ql = jnp.asarray(np.array(qls, np.int32))
            q = _q(rng, nb, big)
            f = jax.jit(lambda q, kp, vp, t, kv, ql: pallas_attn.paged_attention(q, kp, vp, t, kv, causal=True,
                                                                                 q_lens=ql))
            t_mixed = timed("mixed", f"one call{tag}: q_lens {qls}"[:44], f, (q, kp, vp, tbl, kv, ql), q_lens=qls,
                            kv_lens=kvs)
            one = jax.jit(lambda q, kp, vp, t, kv: pallas_attn.paged_attention(q, kp, vp, t, kv, causal=True))
            dec = np.flatnonzero(np.array(qls) == 1)
            first, last = 0, nb - 1  # the two chunks
            p1 = timed("mixed", f"part{tag}: chunk {qls[first]} over {kvs[first]}", one,
                       (q[first:first + 1], kp, vp, tbl[first:first + 1], kv[first:first + 1]))
            p2 = timed("mixed", f"part{tag}: chunk {qls[last]} over {kvs[last]}", one,
                       (q[last:last + 1, :qls[last]], kp, vp, tbl[last:last + 1], kv[last:last + 1]))
            p3 = timed("mixed", f"part{tag}: {len(dec)} decodes", one, (q[dec, :1], kp, vp, tbl[dec], kv[dec]),
                       kv_lens=[kvs[i] for i in dec])
            r = t_mixed / (p1 + p2 + p3)
            rows.append(("mixed", f"ratio{tag} one call / sum of parts", r, {}))
            print(f"mixed   ratio{tag} one call / sum of parts: {r:.3f}", flush=True)
            # the same batch packed (paged_attention_varlen: no padding rows), traced cu_q_lens
            cu = np.concatenate([[0], np.cumsum(qls)]).astype(np.int32)
            qpk = jnp.concatenate([q[i, :n] for i, n in enumerate(qls)], axis=0)
            # session 36: the packed call as shipped, then with its row copies (the tiles' Q gather, the output's
            # assembly) element by element (chunked.ROW_WORDS off: session 34's glue); each variant a fresh jit (the
            # knob is read while tracing).
            # Session 36 call 1 also timed the traced decode part planned for one / every sequence (a knob removed
            # after it: both slower)
            # Session 39: also with the scheduler's hint that its decodes are single tokens (decode_max_q 1: the
            # decode part sized for one query a sequence, not 16)
            variants = [("", {}, {}), (" decode_max_q 1", {}, {"decode_max_q": 1})]
            if args.packed_variants:
                variants.append((" elem copies", {"ROW_WORDS": False}, {}))
            for vtag, knobs, kw in variants:
                saved = {k: getattr(chunked, k) for k in knobs}
                try:
                    for k, v in knobs.items():
                        setattr(chunked, k, v)
                    fv = jax.jit(functools.partial(_packed_call, **kw))
                    t_packed = timed("mixed", f"packed{tag}{vtag}: {int(cu[-1])} rows", fv,
                                     (qpk, kp, vp, tbl, kv, jnp.asarray(cu)), q_lens=qls, kv_lens=kvs, **knobs, **kw)
                finally:
                    for k, v in saved.items():
                        setattr(chunked, k, v)
                r = t_packed / (p1 + p2 + p3)
                rows.append(("mixed", f"ratio{tag}{vtag} packed / parts", r, {}))
                print(f"mixed   ratio{tag}{vtag} packed / sum of parts: {r:.3f}", flush=True)
            del kp, vp

    if "window" in parts:
        bd = 8 if not args.smoke else 2
        for s in ((8192, 32768, 131072) if not args.smoke else (256,)):
            pps = s // page
            kp, vp, tbl = _pool(rng, bd, pps, page)
            q = _q(rng, bd, 1)
            kv = jnp.full((bd,), s, jnp.int32)
            for w in (None, 4096 if not args.smoke else 64):
                f = jax.jit(lambda q, kp, vp, t, kv, w=w: pallas_attn.paged_attention(q, kp, vp, t, kv, causal=True,
                                                                                      window=w))
                timed("window", f"decode b{bd} s{s} window {w}", f, (q, kp, vp, tbl, kv), batch=bd, cached=s,
                      window=w)
            del kp, vp

    if out_f:
        out_f.close()
    print("\npart    name                                         p50 us")
    for part, name, t, _ in rows:
        print(f"{part:7s} {name:44s} {t:10.3f}" if "ratio" in name else f"{part:7s} {name:44s} {t:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
