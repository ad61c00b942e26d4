"""Session 19: why nvfp4_asm is wrong on the tile (join) path and right on the halves path; and halves+asm timing."""
import time, sys
import numpy as np, jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from pallas_attn import _compat, quant
import pallas_attn
from pallas_attn.kernels import kv_source as ks, fa_decode as fd

def join(lo, hi):
    n, h = lo.shape
    return jnp.stack([lo, hi], axis=-1).reshape(n, 2 * h)

VARIANTS = {
    "tile": lambda p, m, q: ks.nvfp4_tile(p, m, "asm"),
    "join_lvl": lambda p, m, q: join(*ks._nvfp4_levels(p, "asm")),
    "lo": lambda p, m, q: jnp.concatenate([ks._nvfp4_levels(p, "asm")[0]] * 2, axis=-1),
    "join_f32": lambda p, m, q: join(*[x.astype(jnp.float32) for x in ks._nvfp4_levels(p, "asm")]).astype(jnp.float16),
    "dot": lambda p, m, q: jnp.broadcast_to(jax.lax.dot_general(q, ks.nvfp4_tile(p, m, "asm"), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)[:, :1].astype(jnp.float16), (p.shape[0], 2 * p.shape[1])) if False else jnp.zeros((p.shape[0], 2 * p.shape[1]), jnp.float16) + jax.lax.dot_general(q, ks.nvfp4_tile(p, m, "asm"), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)[:1, :p.shape[0]].T.astype(jnp.float16),
}
REF = {
    "tile": lambda p, m, q: ks.nvfp4_tile(p, m, "cast"),
    "join_lvl": lambda p, m, q: join(*ks._nvfp4_levels(p, "cast")),
    "lo": lambda p, m, q: jnp.concatenate([ks._nvfp4_levels(p, "cast")[0]] * 2, axis=-1),
    "join_f32": lambda p, m, q: join(*ks._nvfp4_levels(p, "cast")),
    "dot": lambda p, m, q: jnp.zeros((p.shape[0], 2 * p.shape[1]), jnp.float16) + jax.lax.dot_general(q, ks.nvfp4_tile(p, m, "cast"), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)[:1, :p.shape[0]].T.astype(jnp.float16),
}

def run(fn, p, m, q, nw):
    def k(p_ref, m_ref, q_ref, o_ref):
        o_ref[...] = fn(p_ref[...], m_ref[...], q_ref[...])
    n, h = p.shape
    return pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((n, 2 * h), jnp.float16), grid=(1,),
                          compiler_params=_compat.triton_params(num_warps=nw, num_stages=1))(p, m, q)

rng = np.random.default_rng(0)
for n, nw in [(64, 4), (32, 4), (128, 8)]:
    p = jnp.asarray(rng.integers(0, 256, (n, 64), dtype=np.uint8))
    m = jnp.asarray(rng.integers(0x30, 0x40, (n, 8), dtype=np.uint8))
    q = jnp.asarray(rng.standard_normal((16, 128)).astype(np.float16))
    for name in VARIANTS:
        try:
            a = np.asarray(run(VARIANTS[name], p, m, q, nw), np.float32); b = np.asarray(run(REF[name], p, m, q, nw), np.float32)
            bad = ~np.isclose(a, b, rtol=1e-3, atol=1e-3)
            msg = f"n={n} nw={nw} {name}: bad {bad.mean():.3f}"
            if bad.any():
                r, c = np.nonzero(bad)
                msg += f" first cols {sorted(set(c.tolist()))[:12]} rows {sorted(set(r.tolist()))[:6]}"
                # is a a column permutation of b?
                perm = []
                for j in range(min(8, a.shape[1])):
                    hit = [jj for jj in range(a.shape[1]) if np.array_equal(a[:, j], b[:, jj])]
                    perm.append(hit[:3])
                msg += f" a[:,j]==b[:,?] {perm}"
            print(msg, flush=True)
        except Exception as e:
            print(f"n={n} nw={nw} {name}: ERROR {type(e).__name__} {str(e)[:300]}", flush=True)

# timing: the nvfp4 sweep shapes, default vs asm (regime) vs asm + halves everywhere vs cast + halves
def timeit(f, *a, reps=5, calls=20):
    f(*a).block_until_ready()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            o = f(*a)
        o.block_until_ready(); ts.append((time.perf_counter() - t) / calls * 1e6)
    return float(np.median(ts))

cfgs = {"default": "default", "asm": "nvfp4_asm", "asm_halves": fd.DecodeConfig(nvfp4_decode="asm", nvfp4_halves=True),
        "halves": "nvfp4_halves", "asm_nohalves": fd.DecodeConfig(nvfp4_decode="asm", nvfp4_halves=False)}
print("timing (us, perf_counter, 20 calls x 5 median), rel err vs default")
for hq in (32, 64):
    for b, s in [(1, 8192), (1, 32768), (4, 8192), (8, 8192), (16, 8192), (32, 8192)]:
        kq_ = jax.random.PRNGKey(b * 7 + s)
        q = jax.random.normal(kq_, (b, 1, hq, 128), jnp.float32).astype(jnp.bfloat16)
        k = quant.quantize_nvfp4(jax.random.normal(jax.random.PRNGKey(1), (b, s, 8, 128), jnp.float32))
        v = quant.quantize_nvfp4(jax.random.normal(jax.random.PRNGKey(2), (b, s, 8, 128), jnp.float32))
        row = []
        ref = None
        for name, c in cfgs.items():
            f = jax.jit(lambda q, k, v, c=c: pallas_attn.attention(q, k, v, generation="fa_decode", config=c))
            try:
                o = np.asarray(f(q, k, v), np.float32)
                if ref is None: ref = o
                err = np.linalg.norm(o - ref) / np.linalg.norm(ref)
                row.append(f"{name}={timeit(f, q, k, v):.1f}({err:.0e})")
            except Exception as e:
                row.append(f"{name}:ERR {str(e)[:80]}")
        print(f"hq={hq} b={b} s={s}", " ".join(row), flush=True)
