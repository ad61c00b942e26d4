"""Does JAX's persistent compilation cache carry a Mosaic GPU program across processes, and do N processes compile
in parallel? Usage: python cache_probe.py CACHE_DIR WORKLOAD IMPL [IMPL ...]"""
import sys, time, json
import jax
cache, wl, names = sys.argv[1], sys.argv[2], sys.argv[3:]
jax.config.update("jax_compilation_cache_dir", cache)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
from compare import interop, runner
from compare.impls import all_impls
from compare.workloads import load_config
w = {x.name: x for x in load_config("sweep")}[wl]
impls = {i.name: i for i in all_impls()}
ctx = runner.detect_ctx()
inp = interop.make_inputs(w)
out = []
for n in names:
    prep = impls[n].prepare(w, inp, ctx)
    t0 = time.perf_counter(); prep.fn.lower(*prep.args).compile(); c = time.perf_counter() - t0
    t0 = time.perf_counter(); jax.block_until_ready(prep.fn(*prep.args)); f = time.perf_counter() - t0
    out.append((n, round(c, 3), round(f, 4)))
print(json.dumps({"pid_args": sys.argv[2:], "compile_s_first_call_s": out}))
