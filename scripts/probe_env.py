"""One-shot probe of the GPU machine's software: versions, APIs and Pallas/Triton behaviours we rely on.

Prints facts only; the lead runs it once per fresh machine image to pin down API shapes
(profiler.measure, Pallas ops signatures, Triton-lowering gathers) before building on them.
"""

import inspect
import os
import subprocess
import sys
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def section(t):
    print(f"\n=== {t} ===", flush=True)


def attempt(label, fn):
    try:
        r = fn()
        print(f"[ok] {label}: {r}", flush=True)
        return r
    except Exception as e:  # noqa: BLE001 - a probe reports every failure and goes on
        print(f"[FAIL] {label}: {type(e).__name__}: {str(e)[:600]}", flush=True)
        traceback.print_exc(limit=2)
        return None


section("versions")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

print(sys.version)
print("jax", jax.__version__, "devices", jax.devices())
d0 = jax.devices()[0]
print("device_kind", getattr(d0, "device_kind", None), "core_count", getattr(d0, "core_count", None))
try:
    import torch

    print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    p = torch.cuda.get_device_properties(0)
    print("torch device", p.name, "SMs", p.multi_processor_count, "L2", getattr(p, "L2_cache_size", None))
except Exception as e:  # noqa: BLE001
    print("torch FAIL", e)
try:
    import triton

    print("triton", triton.__version__)
except Exception as e:  # noqa: BLE001
    print("triton FAIL", e)
print(subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem",
                      "--format=csv"], capture_output=True, text=True).stdout)

section("profiler.measure")
from jax.experimental.mosaic.gpu import profiler  # noqa: E402

print(inspect.signature(profiler.measure))
x = jnp.ones((4096, 4096), jnp.float16)
f = jax.jit(lambda a: (a @ a).sum())
r = attempt("measure(f)(x) default", lambda: profiler.measure(f)(x))
r = attempt("measure(f, iterations=5)(x)", lambda: profiler.measure(f, iterations=5)(x))
if r is not None:
    print("  type", type(r), "len", len(r) if hasattr(r, "__len__") else None)
    print("  repr", repr(r)[:400])

section("pallas triton lowering")
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import triton as pltriton  # noqa: E402

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only


def kern(idx_ref, x_ref, o_ref):
    rows = idx_ref[...]  # gather rows through an index vector (paged-KV style)
    xs = x_ref[rows, :]
    acc = jnp.zeros((16, 64), jnp.float32)

    def body(i, acc):
        blk = x_ref[pl.ds(i * 16, 16), :]
        s = jnp.dot(xs, blk.T, preferred_element_type=jnp.float32)
        return acc + jnp.dot(s.astype(blk.dtype), blk, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, 4, body, acc)
    o_ref[...] = acc


idx = jnp.arange(16, dtype=jnp.int32)[::-1]
xx = jnp.arange(64 * 64, dtype=jnp.float16).reshape(64, 64) / 100
call = pl.pallas_call(kern, out_shape=jax.ShapeDtypeStruct((16, 64), jnp.float32),
                      compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2), name="probe")
attempt("triton gather + fori + dot", lambda: float(call(idx, xx).sum()))

section("peer APIs")
for mod, names in [
    ("jax.experimental.pallas.ops.gpu.attention", ["mha"]),
    ("jax.experimental.pallas.ops.gpu.attention_mgpu", ["attention"]),
    ("jax.experimental.pallas.ops.gpu.decode_attention", ["gqa", "mqa"]),
    ("jax.experimental.pallas.ops.gpu.paged_attention", ["paged_attention"]),
]:
    try:
        m = __import__(mod, fromlist=names)
        for n in names:
            fn = getattr(m, n, None)
            print(mod, n, inspect.signature(fn) if fn else "MISSING")
    except Exception as e:  # noqa: BLE001
        print("[FAIL] import", mod, type(e).__name__, e)
print("jax.nn.dot_product_attention", inspect.signature(jax.nn.dot_product_attention))
try:
    from torch.nn.attention import SDPBackend

    print("SDPBackend", list(SDPBackend.__members__))
except Exception as e:  # noqa: BLE001
    print("SDPBackend FAIL", e)
section("done")
