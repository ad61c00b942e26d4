"""Host time per call (dispatch + kernel + sync) of jitted JAX attention, before and after CUPTI is used.

Question (docs/fa_decode.md): compare runs show JAX implementations' end-to-end time several hundred µs
above their kernel time, torch's ~40 µs above. Is that JAX's dispatch of these calls, or the CUPTI
profiler that compare attaches in the same process? Usage (GPU): ``PYTHONPATH=. python3 scripts/e2e_dispatch.py``.
"""

import os
import statistics
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import functools  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import pallas_attn  # noqa: E402
from pallas_attn import _compat  # noqa: E402

_compat.silence_triton_deprecation()  # an entry point: the jitted calls below lower Triton kernels


def wall_us(f, args, n=50):
    jax.block_until_ready(f(*args))
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        jax.block_until_ready(f(*args))
        ts.append((time.perf_counter() - t) * 1e6)
    return statistics.median(ts)


def main() -> int:
    key = jax.random.key(0)
    b, s, hq, hkv, d = 32, 8192, 32, 8, 128
    kq, kk, kv = jax.random.split(key, 3)
    q = jax.random.normal(kq, (b, 1, hq, d), jnp.float16)
    k = jax.random.normal(kk, (b, s, hkv, d), jnp.float16)
    v = jax.random.normal(kv, (b, s, hkv, d), jnp.float16)
    small = (q[:1], k[:1, :256], v[:1, :256])
    fns = {
        "fa_decode B32 S8192": (jax.jit(functools.partial(pallas_attn.attention, generation="fa_decode")), (q, k, v)),
        "fa_decode B1 S256": (jax.jit(functools.partial(pallas_attn.attention, generation="fa_decode")), small),
        "jax.nn cudnn B32 S8192": (jax.jit(functools.partial(jax.nn.dot_product_attention, implementation="cudnn")),
                                   (q, k, v)),
        "jnp add (tiny)": (jax.jit(lambda x: x + 1), (q[:1],)),
    }
    before = {name: wall_us(f, a) for name, (f, a) in fns.items()}
    from jax.experimental.mosaic.gpu import profiler

    kernel = {}
    for name, (f, a) in fns.items():
        _, ms = profiler.measure(f, iterations=10)(*a)
        kernel[name] = statistics.median(ms) * 1e3
    after = {name: wall_us(f, a) for name, (f, a) in fns.items()}
    print(f"{'call':26s} {'kernel us':>10s} {'e2e before CUPTI':>17s} {'e2e after CUPTI':>16s}")
    for name in fns:
        print(f"{name:26s} {kernel[name]:10.1f} {before[name]:17.1f} {after[name]:16.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
