"""Workload configs: every shipped file loads; bad entries are clear errors naming file and entry."""

from pathlib import Path

import pytest

from compare.workloads import ConfigError, config_dir, load_config

SHIPPED = sorted(p.name for p in config_dir().glob("*.toml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load(name):
    ws = load_config(name)
    assert ws and all(w.heads_q % w.heads_kv == 0 for w in ws)


def test_the_default_is_the_headline_set_and_its_cpu_checks_are_tagged():
    """configs/default.toml (issue 33): one headline shape per sweep entry with pallas:auto, the generation ladder at
    one prefill and one decode shape, and smoke.toml's interpret-mode checks tagged cpu-only (a GPU run leaves them
    out: tests/test_workloads.py::test_a_gpu_run_leaves_the_cpu_only_workloads_out)."""
    from compare.workloads import CPU_ONLY

    ws = load_config("default")
    head = [w for w in ws if "headline" in w.tags]
    assert {w.entry for w in head if w.entry} == {"prefill", "train", "decode", "paged", "quant", "chunked", "mla"}
    assert all("pallas:auto" in (w.generations or ()) for w in head if w.entry)
    ladder = [w for w in head if "reference" in w.tags]
    assert {w.family for w in ladder} == {"prefill", "decode"}
    assert all("cuda:*" in w.generations and "pallas:*:faithful" in w.generations for w in ladder)
    smoke = [w for w in ws if w.name.startswith("smoke_")]
    assert smoke and all(CPU_ONLY in w.tags for w in smoke) and not any(CPU_ONLY in w.tags for w in head)
    assert len(ws) == len(head) + len(smoke)


def test_a_gpu_run_leaves_the_cpu_only_workloads_out(monkeypatch, tmp_path):
    from compare import runner
    from compare.schema import Ctx
    from compare.workloads import CPU_ONLY

    def opts(out):
        return runner.RunOptions(config="default", only=[], out=str(out), reps=1, warmup=0, e2e_reps=1, budget_s=60.0,
                                 max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8, no_ceilings=True,
                                 quiet=True, argv=[])

    cpu = runner._Run(opts(tmp_path / "cpu"))
    assert cpu.cpu_only_left_out == [] and any(CPU_ONLY in w.tags for w, _ in cpu.plan)
    monkeypatch.setattr(runner, "detect_ctx", lambda: Ctx(jax_gpu=True, torch_cuda=True, hopper=True, interpret=False))
    gpu = runner._Run(opts(tmp_path / "gpu"))
    assert gpu.cpu_only_left_out and all(n.startswith("smoke_") for n in gpu.cpu_only_left_out)
    assert not any(CPU_ONLY in w.tags for w, _ in gpu.plan)
    assert len(gpu.plan) + len(gpu.cpu_only_left_out) == len(cpu.plan)
    named = opts(tmp_path / "named")
    named.only = ["smoke_*"]  # asked for by name: they run on the GPU too
    run = runner._Run(named)
    assert run.cpu_only_left_out == [] and run.plan and all(CPU_ONLY in w.tags for w, _ in run.plan)


def test_a_config_sets_its_own_per_record_budget(tmp_path):
    """Top-level ``budget_s``: the config's per-record budget when --budget-s is not given; --budget-s wins; the
    header records the one in force; a bad value is refused naming the file."""
    from compare import runner
    from compare.workloads import ConfigError, config_budget_s

    assert config_budget_s("ring_train") == 60.0  # training steps of about a second: 17 calls need more than 3 s
    assert config_budget_s("smoke") is None and config_budget_s(tmp_path / "absent.toml") is None
    assert config_budget_s(None) is None and config_budget_s("") is None

    def opts(budget):
        return runner.RunOptions(config="ring_train", only=["ring_smoke_*"], out=str(tmp_path / "o"), reps=1,
                                 warmup=0, e2e_reps=1, budget_s=budget, max_run_s=None, clock="cupti", arch="h100",
                                 cpu_max_flops=1e8, no_ceilings=True, quiet=True, argv=[])

    run = runner._Run(opts(None))
    assert run.budget_s == 60.0 and run.header()["budget_s"] == 60.0
    assert "--budget-s" not in run.opts.repro_flags()  # the config holds it: a repro of the config reproduces it
    explicit = runner._Run(opts(5.0))
    assert explicit.budget_s == 5.0 and "--budget-s" in explicit.opts.repro_flags()
    smoke = opts(None)
    smoke.config = "smoke"
    smoke.only = []
    assert runner._Run(smoke).budget_s == runner.DEFAULT_BUDGET_S
    bad = tmp_path / "bad.toml"
    bad.write_text('budget_s = -1\n[[workload]]\nname = "x"\nfamily = "prefill"\nbatch = 1\nheads_q = 1\n'
                   'heads_kv = 1\nq_len = 8\nhead_dim = 64\ndtype = "float32"\n')
    with pytest.raises(ConfigError, match="budget_s must be a positive number"):
        load_config(bad)


def test_required_workload_names_present():
    names = {w.name for w in load_config("full")}
    for n in ("decode_gqa_b32_s8192", "decode_gqa_b64_s4096", "decode_gqa_b1_s131072"):
        assert n in names
    prefill = [w for w in load_config("reference_prefill") if not w.causal]
    assert {(w.q_len, w.head_dim) for w in prefill} == {(n, d) for n in (512, 2048, 8192) for d in (64, 128)}


def test_sweep_expansion_and_decode_offset():
    ws = load_config("reference_decode")
    assert len(ws) == 6 and all(w.q_offset == w.kv_len - 1 for w in ws)


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "bad.toml"
    p.write_text(body)
    return p


BASE = 'name = "x"\nfamily = "prefill"\nbatch = 1\nheads_q = 4\nq_len = 8\nhead_dim = 64\ndtype = "float16"\n'


@pytest.mark.parametrize("extra,msg", [
    ("colour = 3\n", "unknown key"),
    ("heads_kv = 3\n", "multiple of heads_kv"),
    ("page_size = 16\n", "paged_decode"),
    ("q_offset = -1\n", "q_offset"),
])
def test_bad_entries_name_file_and_entry(tmp_path, extra, msg):
    p = _write(tmp_path, "[[workload]]\n" + BASE + extra)
    with pytest.raises(ConfigError, match=msg) as e:
        load_config(p)
    assert "bad.toml" in str(e.value) and "workload[0]" in str(e.value)


def test_bad_shape_and_dtype(tmp_path):
    with pytest.raises(ConfigError, match="batch must be a positive int"):
        load_config(_write(tmp_path, "[[workload]]\n" + BASE.replace("batch = 1", "batch = 0")))
    with pytest.raises(ConfigError, match="dtype"):
        load_config(_write(tmp_path, "[[workload]]\n" + BASE.replace("float16", "int8")))
    with pytest.raises(ConfigError, match="no config"):
        load_config(tmp_path / "missing.toml")
