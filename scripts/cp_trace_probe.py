"""A timeline of context-parallel decode calls on the GPUs of this host (issue 36: where a pipelined call's time goes).

Records, at B1 S1M (Hq 32, Hkv 8, D 128, fp16) on the first ``CP_DEVICES`` devices (default 4):

* per-call wall (20 calls issued back to back, one sync; median of 5) and host issue time of the program with every
  input pre-placed, with and without XLA command buffers (``compiler_options``, this program only), and of the wrapper
  with q committed to device 0;
* the program's step on the in-jit loop clock with and without command buffers;
* a ``jax.profiler`` trace (perfetto JSON) of 10 pipelined calls of the pre-placed program and of the wrapper, for
  ``scripts/cp_trace_read.py`` to read: host threads (dispatch, per-device launches, waits) and GPU streams.

With ``CP_VARIANTS=1`` it instead times per-program XLA option variants (``VARIANTS``) on ``CP_DEVICES`` devices and
one, with traces of the variant ``CP_TRACE_VARIANT`` under ``/tmp/cpt_v``.

Usage: ``PYTHONPATH=. python scripts/cp_trace_probe.py OUT_DIR`` on a GPU host. ``CP_INTERP=1`` runs a tiny shape on
CPU virtual devices in interpret mode (a check that the script runs, not a measurement).
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from compare import timing
from pallas_attn import distributed

ROLE = "probe"  # tests/test_scripts_roles.py: scripts/ holds probes and tools only

INTERP = bool(os.environ.get("CP_INTERP"))
CMD_BUFFERS = {"xla_gpu_enable_command_buffer": "FUSION,CUSTOM_CALL,COLLECTIVES,CUBLAS,CUBLASLT",
               "xla_gpu_graph_min_graph_size": 1}


class _Setup:
    """The inputs every mode times: a B ``b`` S ``s`` fp16 cache on the first ``n`` devices split along the sequence, q
    pre-placed (``qs``), on device 0 (``q0``) and on the host (``q_host``), full lengths, the decode offsets, and the
    cached program and wrapper step of ``distributed``."""

    def __init__(self, n: int, shape: tuple):
        b, s, hq, hkv, d = shape
        self.b, self.s = b, s
        self.q_host = np.random.default_rng(0).standard_normal((b, 1, hq, d)).astype(np.float16)
        self.mesh = Mesh(np.array(jax.devices()[:n]), ("cp",))
        self.rep = NamedSharding(self.mesh, P())
        self.kv_sh = NamedSharding(self.mesh, P(None, "cp"))

        def make(key):
            kk, kv = jax.random.split(key)
            return (jax.random.normal(kk, (b, s, hkv, d), jnp.float32).astype(jnp.float16),
                    jax.random.normal(kv, (b, s, hkv, d), jnp.float32).astype(jnp.float16))

        self.k, self.v = jax.jit(make, out_shardings=(self.kv_sh, self.kv_sh))(jax.random.PRNGKey(0))
        self.qs = jax.device_put(self.q_host, self.rep)
        self.q0 = jax.device_put(self.q_host, jax.devices()[0])
        self.lens = jax.device_put(jnp.full((b,), s, jnp.int32), self.rep)
        self.off = jax.device_put(jnp.full((b,), s - 1, jnp.int32), self.rep)
        opts = dict(axis="cp", head_axis=None, t_local=s // n, batch=b, causal=True, scale=None, merge="all_gather",
                    generation="fa_decode", config=None, interpret=INTERP or None)
        self.prog = distributed.decode_program(self.mesh, **opts)
        self.step = distributed.step_program(self.mesh, tq=1, has_len=False, has_off=False, **opts)


SHAPE = (1, 2048, 8, 2, 64) if INTERP else (1, 1048576, 32, 8, 128)


def _trace(f, tdir: str, calls: int = 10) -> None:
    """A ``jax.profiler`` timeline (perfetto JSON under ``tdir``) of ``calls`` pipelined calls of ``f``, warmed."""
    jax.block_until_ready(f())
    with jax.profiler.trace(tdir, create_perfetto_trace=True):
        r = None
        for _ in range(calls):
            r = f()
        jax.block_until_ready(r)
    print("trace:", tdir, flush=True)


def wall_and_issue(f, calls: int = 20, reps: int = 5) -> tuple[float, float]:
    """Median over ``reps`` batches of the wall time per call (``calls`` issued back to back, one sync), and the median
    host time for one call to return."""
    jax.block_until_ready(f())
    walls, issues = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        r = None
        for _ in range(calls):
            t1 = time.perf_counter()
            r = f()
            issues.append(time.perf_counter() - t1)
        jax.block_until_ready(r)
        walls.append((time.perf_counter() - t0) / calls)
    return float(np.median(walls) * 1e6), float(np.median(issues) * 1e6)


# per-program XLA options tried against the host's launch cost (session 17 call 3): the call-2 timeline put ~90 us a
# call per device in updating and launching the command buffer of the step's small fusions, ~50 us in acquiring the
# collective cliques and ~50 us in two rendezvous
VARIANTS = {
    "default": None,
    "no command buffers": {"xla_gpu_enable_command_buffer": ""},
    "no command buffers + clique optimization": {"xla_gpu_enable_command_buffer": "",
                                                 "xla_gpu_enable_nccl_clique_optimization": True},
    "clique optimization": {"xla_gpu_enable_nccl_clique_optimization": True},
}


def rounds(out: str, n: int, n_rounds: int) -> None:
    """Every (variant, case) callable built and warmed first, then ``n_rounds`` rounds over all of them in turn (20
    pipelined calls a sample), so host-load drift hits every callable alike; per callable the median and the
    quartiles of the samples, wall and issue time per call. Session 17 call 3's one-sample-per-variant reads moved
    by up to 30% between variants that the timeline says cost the same."""
    st = _Setup(n, SHAPE)
    b, s, mesh, rep, kv_sh = st.b, st.s, st.mesh, st.rep, st.kv_sh
    k, v, qs, q0, q_host, lens, off, prog, step = st.k, st.v, st.qs, st.q0, st.q_host, st.lens, st.off, st.prog, st.step
    # a lean program: the identity block table and each device's lengths and offsets made once, outside the program
    # (they are per mesh and shape here), so each device launches no iota / clip / subtract fusions per call
    t_local = s // n
    page = distributed._page_for(t_local)
    per = t_local // page
    table = jax.device_put((np.arange(b, dtype=np.int32)[:, None] * per + np.arange(per, dtype=np.int32)[None, :]), rep)
    starts = np.repeat(np.arange(n, dtype=np.int32) * t_local, b)
    st_sh = NamedSharding(mesh, P("cp"))
    loc_len = jax.device_put(np.clip(s - starts, 0, t_local).astype(np.int32), st_sh)
    loc_off = jax.device_put((s - 1 - starts).astype(np.int32), st_sh)

    def lean_local(q, k, v, table, ll, lo):
        from pallas_attn import api
        o, lse = api.paged_attention(q, distributed._as_pool(k, page), distributed._as_pool(v, page), table, ll,
                                     causal=True, q_offset=lo, generation="fa_decode", return_lse=True,
                                     check_block_table=False, interpret=INTERP or None)
        return distributed.merge_across(o, lse, axis_name="cp", merge="all_gather")

    lean = jax.shard_map(lean_local, mesh=mesh, in_specs=(P(), P(None, "cp"), P(None, "cp"), P(), P("cp"), P("cp")),
                         out_specs=(P(), P()), check_vma=False)
    calls = {}
    for vname, co in VARIANTS.items():
        lean_v = jax.jit(lean, compiler_options=co)
        calls[(vname, "lean program, pre-placed")] = lambda f=lean_v: f(qs, k, v, table, loc_len, loc_off)[0]
        p_v = jax.jit(prog, compiler_options=co)
        s_v = jax.jit(step, in_shardings=(rep, kv_sh, kv_sh), compiler_options=co)
        calls[(vname, "program, pre-placed")] = lambda p_v=p_v: p_v(qs, k, v, lens, off)[0]
        calls[(vname, "wrapper step, q committed dev0")] = lambda s_v=s_v: s_v(q0, k, v)[0]
        calls[(vname, "wrapper step, q numpy")] = lambda s_v=s_v: s_v(q_host, k, v)[0]
    for f in calls.values():
        jax.block_until_ready(f())
        jax.block_until_ready(f())
    ref = np.asarray(calls[("default", "program, pre-placed")](), np.float32)
    for key, f in calls.items():  # every callable computes the same step
        err = float(np.max(np.abs(np.asarray(f(), np.float32) - ref)))
        print(f"agreement {key}: max abs {err:.2e}", flush=True)
        assert err < 1e-2, (key, err)
    samples = {key: ([], []) for key in calls}
    for r in range(n_rounds):
        for key, f in calls.items():
            w, i = wall_and_issue(f, calls=20, reps=1)
            samples[key][0].append(w)
            samples[key][1].append(i)
        print(f"round {r + 1}/{n_rounds} done", flush=True)
    rows = []
    for (vname, cname), (ws, iss) in samples.items():
        q1, med, q3 = np.percentile(ws, [25, 50, 75])
        rows.append(dict(devices=n, variant=vname, case=cname, wall_us_median=float(med), wall_us_q1=float(q1),
                         wall_us_q3=float(q3), issue_us_median=float(np.median(iss)), wall_samples=ws))
        print(f"{vname:42s} {cname:32s} wall {med:7.1f} [{q1:7.1f}, {q3:7.1f}]  issue {np.median(iss):7.1f}",
              flush=True)
    for vname, co in VARIANTS.items():
        lt = timing.time_loop(lambda q, k, v: prog(q, k, v, lens, off)[0], (qs, k, v), reps=7,
                              iters=2 if INTERP else 50, compiler_options=co).samples_us
        rows.append(dict(devices=n, variant=vname, case="program, loop clock", loop_us_median=float(np.median(lt)),
                         loop_samples=list(lt)))
        print(f"{vname:42s} {'program, loop clock':32s} median {np.median(lt):7.1f} (samples {min(lt):.1f}-"
              f"{max(lt):.1f})", flush=True)
    env = dict(gpu=[dv.device_kind for dv in jax.devices()[:n]], jax=jax.__version__, devices=n, rounds=n_rounds,
               git=os.environ.get("PALLAS_ATTN_GIT_SHA"), xla_flags=os.environ.get("XLA_FLAGS"), interpret=INTERP)
    with open(os.path.join(out, "cp_rounds.json"), "w") as fh:
        json.dump(dict(env=env, rows=rows), fh, indent=1)


def variants(out: str, n: int) -> None:
    """Per variant: the pre-placed program, the wrapper's step with q committed to device 0 (the options on a top-level
    jit with the step's input shardings), an explicit device_put of q then the program, each per call (wall, issue),
    and the program's loop clock; then a one-device baseline; then traces of the program and the wrapper under the
    variant given by CP_TRACE_VARIANT."""
    env = dict(gpu=[dv.device_kind for dv in jax.devices()[:n]], jax=jax.__version__, devices=n,
               git=os.environ.get("PALLAS_ATTN_GIT_SHA"), xla_flags=os.environ.get("XLA_FLAGS"), interpret=INTERP)
    rows = []

    def emit(**r):
        rows.append(r)
        print("  ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()), flush=True)
        with open(os.path.join(out, "cp_variants.json"), "w") as fh:
            json.dump(dict(env=env, rows=rows), fh, indent=1)

    for nd in (n, 1):
        _variants_on(nd, emit)


def _variants_on(nd: int, emit) -> None:
    st = _Setup(nd, SHAPE)
    rep, kv_sh = st.rep, st.kv_sh
    k, v, qs, q0, lens, off, prog, step = st.k, st.v, st.qs, st.q0, st.lens, st.off, st.prog, st.step
    chosen = VARIANTS if nd > 1 else {x: VARIANTS[x] for x in ("default", "no command buffers")}
    for vname, co in chosen.items():
        p_v = jax.jit(prog, compiler_options=co)
        s_v = jax.jit(step, in_shardings=(rep, kv_sh, kv_sh), compiler_options=co)
        cases = {
            "program, pre-placed": lambda p_v=p_v: p_v(qs, k, v, lens, off)[0],
            "wrapper step, q committed dev0": lambda s_v=s_v: s_v(q0, k, v)[0],
            "device_put(q) then program": lambda p_v=p_v: p_v(jax.device_put(q0, rep), k, v, lens, off)[0],
        }
        for cname, f in cases.items():
            w, i = wall_and_issue(f)
            emit(devices=nd, variant=vname, case=cname, wall_us=w, issue_us=i)
        lt = timing.time_loop(lambda q, k, v: prog(q, k, v, lens, off)[0], (qs, k, v), reps=5,
                              iters=2 if INTERP else 50, compiler_options=co).samples_us
        emit(devices=nd, variant=vname, case="program, loop clock", loop_us_min=min(lt),
             loop_us_median=float(np.median(lt)))
        if vname == os.environ.get("CP_TRACE_VARIANT", "no command buffers") and nd > 1:
            for cname in ("program, pre-placed", "wrapper step, q committed dev0"):
                _trace(cases[cname], os.path.join("/tmp/cpt_v", cname.split(",")[0].replace(" ", "_")))


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    n = int(os.environ.get("CP_DEVICES", "4"))
    st = _Setup(n, SHAPE)
    mesh, k, v, qs, q0, lens, off, prog = st.mesh, st.k, st.v, st.qs, st.q0, st.lens, st.off, st.prog
    # the same program compiled with XLA command buffers (per program, through jit's compiler_options)
    prog_cb = jax.jit(prog, compiler_options=CMD_BUFFERS)

    def wrapper(q):
        return distributed.context_parallel_decode(mesh, q, k, v, causal=True, interpret=INTERP or None)

    cases = {
        "program, pre-placed": lambda: prog(qs, k, v, lens, off)[0],
        "program + command buffers, pre-placed": lambda: prog_cb(qs, k, v, lens, off)[0],
        "wrapper, q committed dev0": lambda: wrapper(q0),
    }
    env = dict(gpu=[dv.device_kind for dv in jax.devices()[:n]], jax=jax.__version__, devices=n,
               git=os.environ.get("PALLAS_ATTN_GIT_SHA"), xla_flags=os.environ.get("XLA_FLAGS"), interpret=INTERP)
    rows = []
    for name, f in cases.items():
        w, i = wall_and_issue(f)
        rows.append(dict(case=name, wall_us=w, issue_us=i))
        print(f"{name:44s} wall {w:8.1f} us/call  issue {i:8.1f} us/call", flush=True)
    for name, co in (("program", None), ("program + command buffers", CMD_BUFFERS)):
        lt = min(timing.time_loop(lambda q, k, v: prog(q, k, v, lens, off)[0], (qs, k, v), reps=3,
                                  iters=2 if INTERP else 50, compiler_options=co).samples_us)
        rows.append(dict(case=name + ", loop clock", loop_us=lt))
        print(f"{name + ', loop clock':44s} {lt:8.1f} us/step", flush=True)
    with open(os.path.join(out, "cp_trace.json"), "w") as fh:
        json.dump(dict(env=env, rows=rows), fh, indent=1)
    for name in ("program, pre-placed", "wrapper, q committed dev0"):
        _trace(cases[name], os.path.join(out, "trace_" + name.split(",")[0]))


if __name__ == "__main__":
    if os.environ.get("CP_ROUNDS"):
        os.makedirs(sys.argv[1], exist_ok=True)
        rounds(sys.argv[1], int(os.environ.get("CP_DEVICES", "4")), int(os.environ["CP_ROUNDS"]))
    elif os.environ.get("CP_VARIANTS"):
        os.makedirs(sys.argv[1], exist_ok=True)
        variants(sys.argv[1], int(os.environ.get("CP_DEVICES", "4")))
    else:
        main(sys.argv[1])
