"""One kernel call under Nsight Compute: compile and warm up outside the profiled range, then run once inside it.

    ncu --clock-control none --profile-from-start off --set full -o $OUT/rep \
        python scripts/ncu_case.py prefill [--config default] [--causal] [--dtype float16]
    ncu ... python scripts/ncu_case.py cudnn [--causal]
    ncu ... python scripts/ncu_case.py mla [--config kv64] [--batch 64] [--seq 8192]
    ncu ... python scripts/ncu_case.py decode --kv nvfp4 [--config quant_alt_decode] [--dtype bfloat16]
    ncu ... python scripts/ncu_case.py chunked --page 16 [--batch 4 --seq 8192 --chunk 512]   (--page 0: dense twin)

The profiled range is opened with ``cudaProfilerStart`` (through torch's binding) after three warm-up calls, so
compilation, autotuning and the inputs' creation stay outside it; the range holds one call and its sync.
Prefill shape: B4 H16 N4096 D128 (the issue's forward shape) unless ``--batch / --heads / --seq / --head-dim`` say
otherwise (GPT-2 N 4096: ``--batch 8 --heads 12 --head-dim 64 --causal --dtype bfloat16``); MLA: the DeepSeek-V3
decode shape (h_q 128, 512 + 64, page 64); decode: fa_decode at Llama-3.1-8B's heads (Hq 32, Hkv 8, D 128), B32 S8192
dense, Tq 1, with a 16-bit (``--kv dtype``), fp8 E4M3 or NVFP4 cache (session 18, issue 31); chunked: fa_prefill
over a paged cache as ``pallas_attn.chunked`` runs it (the sweep's ``sweep_chunked_*``: Llama-3.1-8B heads, B 4, a
chunk of ``--chunk`` queries ending at key ``--seq``, pages shuffled over the pool), at the config the chunk takes
(``pallas_attn.chunked.resolve_chunk``); ``--page 0`` is its dense twin (the same keys as one dense cache, compare's
``pallas:chunked:dense``) (session 32, issue 32).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROLE = "tool"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def _prefill_call(a):
    from pallas_attn.kernels import fa_prefill as fp

    b, h, n, d = a.batch, a.heads, a.seq, a.head_dim
    key = jax.random.PRNGKey(0)
    kq, kk, kv = jax.random.split(key, 3)
    dt = jnp.dtype(a.dtype)
    q = jax.random.normal(kq, (b, n, h, d), dt)
    k = jax.random.normal(kk, (b, n, h, d), dt)
    v = jax.random.normal(kv, (b, n, h, d), dt)
    if a.case == "cudnn":
        f = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=a.causal,
                                                                 implementation="cudnn"))
    else:
        cfg = fp.CONFIGS[a.config]
        f = jax.jit(lambda q, k, v: fp.forward(q, k, v, causal=a.causal, scale=d ** -0.5,
                                                q_offset=jnp.zeros((b,), jnp.int32),
                                                interpret=False, config=cfg))
    return lambda: f(q, k, v)


def _mla_call(a):
    import pallas_attn

    b, n, hq, dl, dr, page = a.batch, a.seq, 128, 512, 64, 64
    key = jax.random.PRNGKey(0)
    kq, kl = jax.random.split(key)
    q = jax.random.normal(kq, (b, 1, hq, dl + dr), jnp.bfloat16)
    nblk = n // page
    pool = jax.random.normal(kl, (b * nblk, page, 1, dl + dr), jnp.bfloat16)
    perm = np.random.default_rng(0).permutation(b * nblk).astype(np.int32)
    table = jnp.asarray(perm.reshape(b, nblk))
    lens = jnp.full((b,), n, jnp.int32)
    f = jax.jit(lambda q, pool, table, lens: pallas_attn.mla_attention(
        q, pool, table, lens, kv_lora_rank=dl, generation="fa_mla", config=a.config))
    return lambda: f(q, pool, table, lens)


def _decode_call(a):
    import pallas_attn
    from pallas_attn import quant

    b, n, hq, hkv, d = a.batch, a.seq, 32, 8, 128
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    dt = jnp.dtype(a.dtype)
    q = jax.random.normal(kq, (b, 1, hq, d), dt)
    k = jax.random.normal(kk, (b, n, hkv, d), jnp.float32)
    v = jax.random.normal(kv, (b, n, hkv, d), jnp.float32)
    if a.kv == "dtype":
        k, v = k.astype(dt), v.astype(dt)
    else:
        qz = quant.quantize_fp8_e4m3 if a.kv == "fp8" else quant.quantize_nvfp4
        k, v = jax.block_until_ready((qz(k), qz(v)))
    f = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, causal=True, q_offset=n - 1,
                                                      generation="fa_decode", config=a.config))
    return lambda: f(q, k, v)


def _chunked_call(a):
    from pallas_attn import chunked
    from pallas_attn.kernels import fa_prefill as fp

    b, n, c, hq, hkv, d, page = a.batch, a.seq, a.chunk, 32, 8, 128, a.page
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
    dt = jnp.dtype(a.dtype)
    q = jax.random.normal(kq, (b, c, hq, d), dt)
    k = jax.random.normal(kk, (b, n, hkv, d), dt)
    v = jax.random.normal(kv, (b, n, hkv, d), dt)
    # the config the chunk itself runs (pallas_attn.chunked's resolver, no window)
    _, cfg = chunked.resolve_chunk(chunked._problem(jax.ShapeDtypeStruct(q.shape, dt), n, hkv), None, True)
    off = jnp.full((b,), n - c, jnp.int32)
    kw = dict(causal=True, scale=d ** -0.5, q_offset=off, interpret=False, config=cfg)
    if page == 0:
        f = jax.jit(lambda q, k, v: fp.forward(q, k, v, **kw))
        return lambda: f(q, k, v)
    if n % page:
        raise SystemExit(f"--seq {n} must be a multiple of --page {page}")
    npg = n // page
    perm = np.random.default_rng(0).permutation(b * npg).astype(np.int32)
    pool_k = jnp.zeros((b * npg, page, hkv, d), dt).at[perm].set(k.reshape(b * npg, page, hkv, d))
    pool_v = jnp.zeros((b * npg, page, hkv, d), dt).at[perm].set(v.reshape(b * npg, page, hkv, d))
    table = jnp.asarray(perm.reshape(b, npg))
    f = jax.jit(lambda q, pk, pv, t: fp.forward(q, pk, pv, block_table=t, **kw))
    return lambda: f(q, pool_k, pool_v, table)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=("prefill", "cudnn", "mla", "decode", "chunked"))
    ap.add_argument("--kv", choices=("dtype", "fp8", "nvfp4"), default="dtype", help="decode: the cache's format")
    ap.add_argument("--config", default=None)
    ap.add_argument("--page", type=int, default=16, help="chunked: page size (0: the dense twin)")
    ap.add_argument("--chunk", type=int, default=512, help="chunked: queries in the chunk")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--heads", type=int, default=16, help="prefill / cudnn: heads (default 16)")
    ap.add_argument("--head-dim", type=int, default=128, help="prefill / cudnn: head dim (default 128)")
    a = ap.parse_args(argv)
    if a.case == "mla":
        a.batch, a.seq, a.config = a.batch or 64, a.seq or 8192, a.config or "kv64"
        call = _mla_call(a)
    elif a.case == "chunked":
        a.batch, a.seq, a.config = a.batch or 4, a.seq or 8192, "chunk_prefill_config"
        call = _chunked_call(a)
    elif a.case == "decode":
        a.batch, a.seq, a.config = a.batch or 32, a.seq or 8192, a.config or "default"
        call = _decode_call(a)
    else:
        a.batch, a.seq, a.config = a.batch or 4, a.seq or 4096, a.config or "default"
        call = _prefill_call(a)
    for _ in range(3):
        jax.block_until_ready(call())
    import torch.cuda.profiler as prof

    prof.start()
    jax.block_until_ready(call())
    prof.stop()
    print(f"ncu_case {a.case} kv={a.kv} config={a.config} causal={a.causal} dtype={a.dtype} B={a.batch} N={a.seq} "
          f"H={a.heads} D={a.head_dim}: done",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
