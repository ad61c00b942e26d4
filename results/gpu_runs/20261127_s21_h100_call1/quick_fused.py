"""Session 21 quick check: fused vs wide backward on the GPU (agreement and time)."""
import functools, sys, time
import jax, jax.numpy as jnp, numpy as np
import pallas_attn
from pallas_attn.kernels import fa_prefill_bwd as fb

def arrays(b, tq, tk, hq, hkv, d, dt=jnp.bfloat16):
    ks = jax.random.split(jax.random.key(0), 4)
    sh = ((b, tq, hq, d), (b, tk, hkv, d), (b, tk, hkv, d), (b, tq, hq, d))
    return tuple(jax.random.normal(k, s, jnp.float32).astype(dt) for k, s in zip(ks, sh))

def tm(f, *a, n=10):
    jax.block_until_ready(f(*a)); ts = []
    for _ in range(n):
        t = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6

for (b, n, hq, hkv, d, causal) in [(2, 1000, 8, 4, 128, True), (2, 777, 4, 4, 64, False), (1, 4096, 32, 8, 128, True),
                                   (2, 16384, 32, 8, 128, True), (4, 8192, 12, 12, 64, True)]:
    q, k, v, w = arrays(b, n, n, hq, hkv, d)
    scale = 1 / np.sqrt(d)
    o, lse = pallas_attn.attention(q, k, v, causal=causal, generation="fa_prefill", interpret=False, return_lse=True)
    res = {}
    for cfg in ("wide", "fused"):
        f = jax.jit(functools.partial(fb.backward, causal=causal, scale=scale, config=fb.CONFIGS[cfg]))
        try:
            g = f(q, k, v, o, lse, w)
            res[cfg] = (g, tm(f, q, k, v, o, lse, w, n=5 if n >= 8192 else 10))
        except Exception as e:
            print("ERR", cfg, type(e).__name__, str(e)[:3000], flush=True)
    if len(res) == 2:
        rel = [float(jnp.max(jnp.abs(a.astype(jnp.float32) - r.astype(jnp.float32))) /
                     jnp.max(jnp.abs(r.astype(jnp.float32)))) for a, r in zip(res["fused"][0], res["wide"][0])]
        print(f"B{b} N{n} Hq{hq} Hkv{hkv} D{d} causal={causal}: wide {res['wide'][1]:.0f} us, fused "
              f"{res['fused'][1]:.0f} us ({res['fused'][1] / res['wide'][1]:.3f}x); rel diff dq/dk/dv "
              f"{[f'{x:.2e}' for x in rel]}", flush=True)
