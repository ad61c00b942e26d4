"""compare's method, on the CPU: read ceilings by several methods (best wins, every figure kept), the clock
that was asked for (a simulated CUPTI with a subscriber conflict marks every record that fell back and the
run exits 3), both end-to-end figures, honest fractions above 100%, records that say where their git sha
came from and repeat every non-default option, shared-memory limits named as such."""

from __future__ import annotations

import shlex

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from compare import ceilings, cli, records, runner, timing

# ------------------------------------------------------------------------------------- 1. read ceiling


def _fake_methods(**overrides):
    """The measurement backend stand-in: key -> (how, clock, fn) as ``ceilings._cuda_methods`` builds."""

    def boom():
        raise RuntimeError("Triton: out of resource")

    m = {
        "hbm_read.torch_sum": ("x.sum()", "cuda-events", lambda: 3.02e12),
        "hbm_read.jnp_sum": ("jnp.sum", "cupti", lambda: 3.20e12),
        "hbm_read.pallas_stream": ("stream", "cupti", lambda: (3.15e12, {"config": {"block_rows": 16}})),
        "hbm_copy_Bps": ("copy", "cuda-events", lambda: 2.99e12),
        "flops.fp16": ("mm", "cuda-events", lambda: 700e12),
        "flops.fp8": ("fp8", "cuda-events", boom),
    }
    m.update(overrides)
    return m


def test_read_ceiling_is_the_best_method_and_every_method_is_kept():
    meas, reason = ceilings.measure(methods=_fake_methods())
    assert reason is None
    assert meas["hbm_read_Bps"] == 3.20e12 and meas["hbm_read_best"] == "jnp_sum"
    assert set(meas["hbm_read_methods"]) == {"torch_sum", "jnp_sum", "pallas_stream"}
    assert meas["hbm_read_methods"]["torch_sum"] == {"Bps": 3.02e12, "how": "x.sum()", "clock": "cuda-events"}
    assert meas["hbm_read_methods"]["pallas_stream"]["config"] == {"block_rows": 16}
    assert meas["hbm_copy_Bps"] == 2.99e12 and meas["flops"] == {"fp16": 700e12}
    assert "out of resource" in meas["errors"]["flops.fp8"] and "jnp_sum" in meas["how"]["hbm_read_Bps"]
    # a method that fails (or returns garbage) is an error entry; the best of the others still wins
    nan = {"hbm_read.jnp_sum": ("jnp.sum", "cupti", lambda: float("nan"))}
    meas, _ = ceilings.measure(methods=_fake_methods(**nan))
    assert meas["hbm_read_best"] == "pallas_stream" and "jnp_sum" not in meas["hbm_read_methods"]
    assert "hbm_read.jnp_sum" in meas["errors"]


def test_stream_read_kernel_sums_exactly_what_it_reads():
    cfg = ceilings.StreamConfig(block_rows=8, cols=128, num_warps=4, num_stages=2, programs_per_sm=1)
    x = jax.random.normal(jax.random.key(0), (8 * 3 * 3 + 5, 128), jnp.float16)  # 5 rows past the chunks
    out = ceilings.stream_read_sum(x, programs=3, config=cfg, interpret=True)
    assert out.shape == (3, 128) and out.dtype == jnp.float32
    read = np.asarray(x[: 8 * 3 * 3], np.float64)
    np.testing.assert_allclose(float(jnp.sum(out)), read.sum(), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(np.asarray(out[1]), read[24:48].sum(0), rtol=1e-3, atol=1e-2)  # contiguous chunks
    assert ceilings.read_bytes(x.shape, 2, programs=3, config=cfg) == 72 * 128 * 2
    with pytest.raises(ValueError, match="do not fill"):
        ceilings.stream_read_sum(x[:16], programs=3, config=cfg, interpret=True)


def test_a_fraction_above_the_ceiling_is_explained():
    assert ceilings.over_ceiling_note(0.99, what="HBM read ceiling", bytes_=1e9, l2_bytes=50e6,
                                      datasheet_fraction=0.9) is None
    small = ceilings.over_ceiling_note(1.3, what="HBM read ceiling", bytes_=8 << 20, l2_bytes=50 << 20,
                                       datasheet_fraction=1.2)
    assert "130.0%" in small and "smaller than the L2" in small
    methods = ceilings.over_ceiling_note(1.04, what="HBM read ceiling", bytes_=1 << 30, l2_bytes=50 << 20,
                                         datasheet_fraction=0.95)
    assert "95.0% of the datasheet" in methods
    model = ceilings.over_ceiling_note(1.2, what="HBM read ceiling", bytes_=1 << 30, l2_bytes=50 << 20,
                                       datasheet_fraction=1.1)
    assert "above the datasheet" in model


# ----------------------------------------------------------------------------------- 2. the JAX clock


class FakeCupti:
    """A CUPTI with one subscriber per process: kineto, once used, keeps it (as on the device)."""

    def __init__(self, script=None, conflict=False):
        self.script = list(script or [])
        self.conflict = conflict
        self.calls = 0

    def start(self):
        self.calls += 1
        if self.conflict:
            raise RuntimeError("Mosaic GPU profiler error: Attempted to subscribe to CUPTI while another "
                               "subscriber, such as Nsight Systems or Nsight Compute, is active")

    def stop(self):
        return self.script.pop(0) if self.script else []


def test_clock_chains_never_hand_cupti_to_kineto():
    for fw in ("jax", "torch"):
        assert timing.expected_clock("cupti", fw) == "cupti:mosaic"
        assert "cupti:torch-profiler" not in timing.clock_chain("cupti", fw)  # kineto would keep the subscription
        assert timing.clock_chain("kineto", fw)[0] == "cupti:torch-profiler"
    assert timing.clock_chain("events", "torch") == ["cuda-events"]
    assert timing.expected_clock("events", "jax") == "host-wall"


def test_jax_is_timed_through_the_collector_when_it_answers(monkeypatch):
    timing._jax_flush_kernel_names.cache_clear()
    rep = [("wrapped_not", 0.5), ("attn", 0.010), ("merge", 0.002)]
    fake = FakeCupti(script=[[("wrapped_not", 0.5)], rep * 3])
    monkeypatch.setattr(timing, "_CUPTI", fake)
    f = jax.jit(lambda x: x * 2)
    x = jnp.arange(256.0)
    t = timing.time_kernels(f, (x,), framework="jax", reps=3, flush_bytes=1 << 12)
    timing._jax_flush_kernel_names.cache_clear()
    assert t.clock == t.requested == "cupti:mosaic" and not t.fallback and t.notes == ()
    assert t.samples_us == pytest.approx((12.0, 12.0, 12.0))  # the flush dropped, partial + merge summed
    assert fake.calls == 2  # flush names, then the repetitions
    assert t.program == "direct"  # a jitted call is timed as it is (no second compile)


def test_a_jitted_call_is_timed_without_a_second_compile(monkeypatch):
    """Session 25: the flush and the call traced into one program compiled every pair twice. A jitted ``fn`` is now
    dispatched as it is after the flush program; a plain function still goes through the wrapped program."""
    from jax._src import monitoring

    timing._jax_flush_kernel_names.cache_clear()
    rep = [("wrapped_not", 0.5), ("attn", 0.010)]
    fake = FakeCupti(script=[[("wrapped_not", 0.5)], rep * 2, rep * 2])
    monkeypatch.setattr(timing, "_CUPTI", fake)
    compiles = []

    def listener(name, _secs, **_kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    f = jax.jit(lambda x: x * 3 + 1)
    x = jnp.arange(256.0)
    f(x).block_until_ready()
    timing._jax_flush_kernel_names(1 << 12)  # the flush program compiled first: what is counted below is fn's
    monitoring.register_event_duration_secs_listener(listener)
    try:
        t = timing.time_kernels(f, (x,), framework="jax", reps=2, flush_bytes=1 << 12)
        assert compiles == [] and t.program == "direct"
        assert t.samples_us == pytest.approx((10.0, 10.0))
        t = timing.time_kernels(f, (x,), framework="jax", reps=2, flush_bytes=1 << 12, direct=False)
        assert len(compiles) == 1 and t.program == "wrapped"  # the wrapped program is a compile of its own
    finally:
        monitoring.unregister_event_duration_listener(listener)
        timing._jax_flush_kernel_names.cache_clear()
    assert not timing.is_jitted(lambda x: x) and timing.is_jitted(f)


def test_a_subscriber_conflict_marks_every_jax_record_and_fails_the_run(tmp_path, monkeypatch, capsys):
    """The regression the runs before 2026-11-23 had: CUPTI taken by another subscriber, JAX records timed by
    another clock. A silent fallback fails this test."""
    timing._jax_flush_kernel_names.cache_clear()
    monkeypatch.setattr(timing, "_CUPTI", FakeCupti(conflict=True))
    monkeypatch.setattr(runner, "detect_ctx", lambda: runner.Ctx(jax_gpu=False, torch_cuda=False, hopper=False,
                                                                  interpret=True))

    def gpu_run(extra):
        opts = runner.RunOptions.from_args(cli.build_parser().parse_args(
            ["run", "--config", "smoke", "--only", "smoke_prefill_f32_c1:jax:xla", "--no-ceilings", "--quiet",
             "--reps", "3", "--e2e-reps", "2", "--e2e-calls", "3", "--out", str(tmp_path / f"r{len(extra)}"),
             *extra]))
        run = runner._Run(opts)
        run.gpu = True  # the GPU branch, driven on the CPU
        run.env = {**run.env, "device_kind": "gpu", "gpu": "stand-in"}
        return run.main(), [r for r in records.read_jsonl(run.path) if r["type"] == "result"]

    code, recs = gpu_run([])
    assert code == 3 and "clock fallback: 1 records" in capsys.readouterr().err
    (r,) = recs
    m = r["metrics"]
    assert r["status"] == "ok" and m["clock"] == "host-wall" and m["clock_requested"] == "cupti:mosaic"
    assert "another subscriber" in m["clock_fallback"]
    # both end-to-end figures, labelled
    assert m["e2e_synced_us"] > 0 and m["e2e_pipelined_us"] > 0 and m["e2e_pipelined_calls"] == 3
    assert m["e2e_us_p50"] == m["e2e_synced_us"] and "pipelined" in m["e2e_clock"]
    code, recs = gpu_run(["--allow-clock-fallback"])
    assert code == 0 and recs[0]["metrics"]["clock_fallback"]  # accepted, still marked
    assert "--allow-clock-fallback" not in recs[0]["repro"]


# ---------------------------------------------------------------------------------------- 6. records


def test_repro_repeats_every_non_default_option():
    args = cli.build_parser().parse_args(["run", "--config", "smoke", "--reps", "7", "--clock", "kineto",
                                          "--budget-s", "5", "--arch", "h200", "--quiet", "--out", "x"])
    opts = runner.RunOptions.from_args(args)
    flags = opts.repro_flags()
    assert flags == ["--reps", "7", "--budget-s", "5", "--clock", "kineto", "--arch", "h200"]
    plain = runner.RunOptions.from_args(cli.build_parser().parse_args(["run"]))
    assert plain.repro_flags() == []


def test_repro_in_a_record_carries_the_flags(tmp_path):
    out = tmp_path / "r"
    assert cli.main(["run", "--config", "smoke", "--only", "smoke_decode_f16", "--impl", "torch:cudnn", "--quiet",
                     "--no-ceilings", "--reps", "7", "--clock", "events", "--out", str(out)]) == 0
    recs = list(records.read_jsonl(out / "records.jsonl"))
    (r,) = [x for x in recs if x["type"] == "result"]
    argv = shlex.split(r["repro"])
    assert argv[argv.index("--reps") + 1] == "7" and argv[argv.index("--clock") + 1] == "events"
    assert "--no-ceilings" in argv and argv[argv.index("--only") + 1] == "smoke_decode_f16:torch:cudnn"
    header = recs[0]
    from attn_core import generations as core

    assert header["generations"] == list(core.ids())  # report orders generations without the live table
    assert header["clocks_requested"] == {"jax": "host-wall", "torch": "cuda-events"}
    assert header["env"]["git_sha_source"] in ("git", "env PALLAS_ATTN_GIT_SHA", None)


def test_git_sha_source_and_dirty_flag(monkeypatch):
    monkeypatch.delenv("PALLAS_ATTN_GIT_SHA", raising=False)
    monkeypatch.delenv("PALLAS_ATTN_GIT_DIRTY", raising=False)
    local = records.git_state()
    if local["git_sha"] is not None:  # a checkout: the real sha, never suffixed, and a boolean flag
        assert local["git_sha_source"] == "git" and len(local["git_sha"]) == 40 and isinstance(local["dirty"], bool)
    monkeypatch.setenv("PALLAS_ATTN_GIT_SHA", "0123456789abcdef0123456789abcdef01234567")
    sent = records.git_state()
    assert sent["git_sha"] == "0123456789abcdef0123456789abcdef01234567"
    assert sent["git_sha_source"] == "env PALLAS_ATTN_GIT_SHA" and sent["dirty"] is None  # not sent: unknown
    monkeypatch.setenv("PALLAS_ATTN_GIT_DIRTY", "1")
    assert records.git_state()["dirty"] is True
    monkeypatch.setenv("PALLAS_ATTN_GIT_DIRTY", "0")
    assert records.git_state()["dirty"] is False


@pytest.mark.parametrize("msg, need, limit", [
    ("RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 262144, available: 232448, context: []",
     262144, 232448),
    ("out of resource: shared memory, Required: 276480, Hardware limit: 232448. Reducing block sizes or "
     "`num_stages` may help.", 276480, 232448),
])
def test_shared_memory_limits_say_so(msg, need, limit):
    e = RuntimeError(msg)
    assert runner._is_oom(e)
    reason = runner._reason(e)
    assert reason.startswith(f"shared memory: needs {need} bytes, limit {limit}") and msg[:40] in reason
    assert runner._shared_memory_reason("RESOURCE_EXHAUSTED: out of memory while trying to allocate") is None


# ------------------------------------------------------------------------------- 4. peers prepared alike


def test_decode_gqa_peer_is_timed_without_its_kv_transposes():
    """JAX's decode_attention.gqa transposes K and V inside its op; the peer calls its per-head kernel on
    K/V transposed once (untimed), and gets gqa's own answer."""
    import types

    from jax.experimental.pallas.ops.gpu import decode_attention

    from compare import peers
    from compare.schema import Ctx

    assert peers._gqa_inner() is not None  # this JAX: the untimed-transpose path, not the fallback
    b, t, hq, hkv, d = 2, 64, 4, 2, 16
    kq, kk, kv = jax.random.split(jax.random.key(3), 3)
    cache = {}
    inp = types.SimpleNamespace(q=jax.random.normal(kq, (b, 1, hq, d), jnp.float32),
                                k=jax.random.normal(kk, (b, t, hkv, d), jnp.float32),
                                v=jax.random.normal(kv, (b, t, hkv, d), jnp.float32), scale=d ** -0.5,
                                cached=lambda key, make: cache.setdefault(key, make()))
    w = types.SimpleNamespace(family="decode", kv_len=t, ragged=False, q_len=1, causal=False, q_offset=0)
    prep = peers._decode_gqa_prepare(w, inp, Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True))
    assert "transposed once" in prep.notes and "untimed" in prep.notes
    assert prep.args[1].shape == (b, hkv, t, d)  # the timed call receives the transposed layout
    ref = decode_attention.gqa(inp.q[:, 0], inp.k, inp.v, sm_scale=inp.scale, k_splits=4, interpret=True)
    np.testing.assert_allclose(np.asarray(prep.fn(*prep.args)), np.asarray(ref), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- 7. configs ship with compare


def test_configs_ship_as_package_data(tmp_path):
    """The packages copied as a wheel installs them (links resolved), run from another folder: --config smoke
    is found in the installed harness's package data (pallas_attn_compare), not in a checkout."""
    import os
    import shutil
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "configs/*.toml" in setup["package-data"]["pallas_attn_compare"]
    assert setup["package-dir"]["pallas_attn_compare"] == "compare"  # installed under a name that cannot collide
    site = tmp_path / "site"
    for pkg, src in (("pallas_attn_compare", "compare"), ("attn_core", "attn_core"), ("pallas_attn", "pallas_attn"),
                     ("cuda_ref", "cuda_ref")):
        shutil.copytree(root / src, site / pkg, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    assert (site / "pallas_attn_compare" / "configs" / "smoke.toml").is_file() and not (site / "configs").exists()
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = ("from pallas_attn_compare import workloads; d = workloads.config_dir(); "
            "ws = workloads.load_config('smoke'); print(d, len(ws))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    p = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    where, n = p.stdout.split()
    assert Path(where) == site / "pallas_attn_compare" / "configs" and int(n) >= 5


# ----------------------------------------------------------------------------- 8. a CPU run, for a newcomer


def test_a_cpu_run_shows_what_ran_then_one_line_per_other_workload(tmp_path, capsys):
    assert cli.main(["run", "--config", "smoke", "--only", "smoke_prefill_f32_c1", "--only", "smoke_decode_f16",
                     "--impl", "jax:*", "--impl", "torch:*", "--no-ceilings", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "jax:xla" in out and "vs best peer" not in out  # the compact CPU table, not the GPU one
    i = next(n for n, ln in enumerate(lines) if ln.startswith("Not run on this machine (1 workloads"))
    (decode,) = [ln for ln in lines[i + 1:] if "smoke_decode_f16" in ln]
    assert "H100" in decode and "H200" in decode and "µs" in decode and "unavailable" in decode
    assert any("records in" in ln and "ok" in ln and "unavailable" in ln for ln in lines)  # the closing summary
    assert "No GPU here" in out and max(map(len, lines)) <= 200


def test_the_e2e_figures_of_a_long_call_fit_their_budget(tmp_path):
    """``--e2e-budget-s`` (session 25): a call of >= 50 ms gets 3-5 synced calls and 2 pipelined calls a sample under a
    0.5 s budget (not 10 and 20: 3.5 s), and the record says so; a fast call keeps the defaults."""
    import time as _time
    import types as _types

    opts = runner.RunOptions.from_args(cli.build_parser().parse_args(
        ["run", "--config", "smoke", "--quiet", "--out", str(tmp_path / "r"), "--warmup", "0"]))
    assert opts.e2e_budget_s == 0.5
    run = runner._Run(opts)
    slow = _types.SimpleNamespace(fn=lambda: _time.sleep(0.05), args=(), framework="cpu")
    rec = _types.SimpleNamespace(metrics={})
    run.budget_s = 30.0
    reps, e2e_reps, e2e_calls = run.timing_plan(slow, rec)
    assert reps == 20 and 3 <= e2e_reps <= 5 and e2e_calls == 2 and rec.metrics["e2e_reduced_for_budget"]
    fast = _types.SimpleNamespace(fn=lambda: None, args=(), framework="cpu")
    rec = _types.SimpleNamespace(metrics={})
    assert run.timing_plan(fast, rec) == (20, 10, 20) and "e2e_reduced_for_budget" not in rec.metrics


def test_with_compile_workers_the_pairs_that_wait_for_none_run_first(tmp_path, monkeypatch, fake_gpu_clocks):
    """Session 25: while a workload's Pallas programs compile on workers, its other JAX pairs run to their agreement
    first (their own compiles behind the workers'), torch last; then every pair is timed, one round, and the records
    keep the implementations' order with no rounds note."""
    from compare.impls import all_impls
    from compare.workloads import Workload

    fake_gpu_clocks(lambda fn, args, **kw: timing.Timing((2.0,) * kw["reps"], "cupti:mosaic", True, (),
                                                         requested="cupti:mosaic"))
    w = Workload(name="t_order", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                 head_dim=64, dtype="float32", causal=True, seed=1)
    names = ["pallas:v4_fused:faithful", "jax:xla", "pallas:v3_online:faithful"]
    impls = sorted((i for i in all_impls() if i.name in names), key=lambda i: names.index(i.name))
    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / "o"), reps=3, warmup=0, e2e_reps=1,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[], compile_workers=2)
    run = runner._Run(opts, workloads=[w], impls=impls)
    run.gpu = True
    monkeypatch.setattr(run, "fill_rates", lambda rec: None)
    seen = []
    real = run.execute

    def execute(pp, *a, **kw):
        seen.append(pp.impl.name)
        return real(pp, *a, **kw)

    monkeypatch.setattr(run, "execute", execute)
    try:
        recs = run.run_workload(w, impls)
    finally:
        run._pool.shutdown()
    assert seen == ["jax:xla", "pallas:v4_fused:faithful", "pallas:v3_online:faithful"]
    assert [r["impl"]["name"] for r in recs] == names and [r["status"] for r in recs] == ["ok"] * 3
    for r in recs:
        assert "timing_rounds" not in r["metrics"] and not any("rounds" in n for n in r["metrics"]["clock_notes"])
        assert r["metrics"]["time_us_p50"] == 2.0


def test_the_next_workloads_inputs_compile_ahead_and_never_under_the_host_clock(tmp_path, monkeypatch,
                                                                                fake_gpu_clocks):
    """Session 25: with compile workers, the next workload's input program compiles on a worker while this one runs
    (``interop.compile_inputs``: shapes only); the end-to-end (host-wall) figures wait for it. Without workers
    nothing is looked ahead."""
    import threading as _threading
    import time as _time

    from compare import interop
    from compare.impls import all_impls
    from compare.workloads import Workload

    done = _threading.Event()
    looked = []

    def slow_compile(w):
        looked.append(w.name)
        _time.sleep(0.3)
        done.set()
        return True

    monkeypatch.setattr(interop, "compile_inputs", slow_compile)
    e2e_after_done = []

    def wall(fn, args, **kw):
        e2e_after_done.append(done.is_set())
        return timing.Timing((4.0, 5.0, 6.0), "host-wall", False)

    fake_gpu_clocks(lambda fn, args, **kw: timing.Timing((2.0,) * kw["reps"], "cupti:mosaic", True, (),
                                                         requested="cupti:mosaic"))
    monkeypatch.setattr(timing, "time_e2e", wall)
    ws = [Workload(name=f"t_look{i}", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                   head_dim=64, dtype="float32", causal=True, seed=1) for i in range(2)]
    impls = [i for i in all_impls() if i.name == "jax:xla"]
    for workers, expect in ((2, ["t_look1"]), (0, [])):
        looked.clear()
        e2e_after_done.clear()
        done.clear()
        opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / f"o{workers}"), reps=3, warmup=0,
                                 e2e_reps=1, budget_s=30.0, max_run_s=None, clock="cupti", arch="h100",
                                 cpu_max_flops=1e8, no_ceilings=True, quiet=True, argv=[], compile_workers=workers)
        run = runner._Run(opts, workloads=ws, impls=impls)
        run.gpu = True
        monkeypatch.setattr(run, "fill_rates", lambda rec: None)
        run._next_workload = ws[1]
        try:
            recs = run.run_workload(ws[0], impls)
        finally:
            if getattr(run, "_pool", None) is not None:
                run._pool.shutdown()
        assert [r["status"] for r in recs] == ["ok"] and looked == expect
        if workers:
            assert e2e_after_done == [True]


def test_which_pairs_compile_on_workers():
    """Jitted JAX programs whose compile runs nothing on the GPU compile on workers; XLA's own attention (its matrix
    products are autotuned by running them) and torch / CUDA twins compile at their first call."""
    from compare.impls import all_impls

    by = {i.name: i for i in all_impls()}
    ahead = {n: runner._compiled_ahead(by[n]) for n in ("pallas:auto", "jax:cudnn", "fa3:mha", "jax:xla",
                                                         "torch:cudnn", "cuda:v4_fused")}
    assert ahead == {"pallas:auto": True, "jax:cudnn": True, "fa3:mha": True, "jax:xla": False, "torch:cudnn": False,
                     "cuda:v4_fused": False}


def test_look_ahead_compiles_the_next_workload_while_this_one_is_timed(tmp_path, monkeypatch, fake_gpu_clocks):
    """``--look-ahead`` (session 25, off by default, not yet GPU-run): after a workload's agreements and host-wall
    figures, the next workload's inputs are made and its Pallas programs handed to the workers, then this workload's
    kernel clock runs (the next one's compile may still be going); the next workload adopts that state (its Pallas
    program compiled once), and every record is the one a run without it writes."""
    import time as _time

    from compare.impls import all_impls
    from compare.workloads import Workload

    events = []
    real_compile = runner._compile_ahead

    def slow_compile(fn, args):
        events.append("compile")
        _time.sleep(0.2)
        return real_compile(fn, args)

    monkeypatch.setattr(runner, "_compile_ahead", slow_compile)

    def kernels(fn, args, **kw):
        ahead = getattr(run_ref[0], "_ahead", None)
        events.append("kernel" + ("+ahead" if ahead is not None else ""))
        return timing.Timing((2.0,) * kw["reps"], "cupti:mosaic", True, (), requested="cupti:mosaic")

    def wall(fn, args, **kw):
        events.append("e2e")
        return timing.Timing((4.0, 5.0, 6.0), "host-wall", False)

    fake_gpu_clocks(kernels)
    monkeypatch.setattr(timing, "time_e2e", wall)
    monkeypatch.setattr(timing, "time_pipelined", wall)
    ws = [Workload(name=f"t_ahead{i}", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16 + 8 * i,
                   kv_len=16 + 8 * i, head_dim=64, dtype="float32", causal=True, seed=1) for i in range(2)]
    names = ["pallas:v4_fused:faithful", "jax:xla"]
    impls = sorted((i for i in all_impls() if i.name in names), key=lambda i: names.index(i.name))
    run_ref = []

    def records(look):
        events.clear()
        opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / f"o{look}"), reps=3, warmup=0,
                                 e2e_reps=1, budget_s=30.0, max_run_s=None, clock="cupti", arch="h100",
                                 cpu_max_flops=1e8, no_ceilings=True, quiet=True, argv=[], compile_workers=2,
                                 look_ahead=look)
        run = runner._Run(opts, workloads=ws, impls=impls)
        run.gpu = True
        run_ref[:] = [run]
        monkeypatch.setattr(run, "fill_rates", lambda rec: None)
        out = []
        try:
            for i, w in enumerate(ws):
                run._next_workload, run._next_impls = (ws[1], impls) if i == 0 else (None, None)
                out += run.run_workload(w, impls)
        finally:
            run._pool.shutdown()
        return out, list(events)

    plain, ev_plain = records(False)
    ahead, ev_ahead = records(True)
    assert [r["status"] for r in ahead] == [r["status"] for r in plain] == ["ok"] * 4
    for a, b in zip(ahead, plain):
        assert a["agreement"]["rel_l2_err"] == b["agreement"]["rel_l2_err"]
    assert ev_plain.count("compile") == ev_ahead.count("compile") == 2  # one Pallas program a workload, once
    k = next(i for i, e in enumerate(ev_ahead) if e.startswith("kernel"))  # workload 0's first kernel-clock sample
    assert ev_ahead[:k].count("e2e") == 4  # both pairs' host-wall figures (synced, pipelined) before any of it
    assert ev_ahead[k] == "kernel+ahead"  # and the next workload already begun when it runs
    assert "kernel+ahead" not in ev_plain
