"""The model-shape sweep (configs/sweep.toml, docs/sweep.md): the config parses into the models and entries the issue
names, every model x entry maps to workloads that pallas:auto either takes or refuses with a reason, the per-GPU
tables are read by the defaults, ``compare tune --table`` makes them from records, and auto's choice is recorded."""

import dataclasses
import json

import jax.numpy as jnp
import pytest

from compare import auto, hardware, impls, layer2, runner, tune_table
from compare.schema import Ctx
from compare.workloads import DROPPED_BY_MEMORY, ConfigError, load_config

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)
MODELS = {"llama-3.1-8b": (32, 8, 128), "llama-3.1-70b": (64, 8, 128), "qwen2.5-7b": (28, 4, 128),
          "mistral-7b-v0.1": (32, 8, 128), "gemma-2-9b": (16, 8, 256), "gemma-2-9b:local": (16, 8, 256),
          "phi-3-mini": (32, 32, 96), "gpt-2": (12, 12, 64), "gpt-oss-20b": (64, 8, 64),
          "gpt-oss-20b:local": (64, 8, 64), "deepseek-v3": (128, 1, 576), "deepseek-v2-lite": (16, 1, 576)}
ENTRIES = {"prefill", "train", "decode", "spec", "paged", "chunked", "mla", "quant"}


@pytest.fixture(scope="module")
def ws():
    return load_config("sweep")


def test_models_entries_and_sizes(ws):
    seen = {(w.model, w.entry_group) for w in ws}
    assert {m for m, _ in seen} == set(MODELS)
    assert {e for _, e in seen} == ENTRIES
    for w in ws:
        hq, hkv, d = MODELS[w.model]
        assert (w.heads_q, w.heads_kv, w.head_dim) == (hq, hkv, d), w.name
        assert w.dtype == "bfloat16" and w.as_dict()["model"] == w.model and w.as_dict()["entry"] == w.entry_group
    # every dense model has prefill and train at every N of the issue, about 32k tokens a batch
    for e in ("prefill", "train"):
        for m in ("llama-3.1-8b", "gemma-2-9b:local", "phi-3-mini", "gpt-oss-20b"):
            got = {w.q_len: w.batch for w in ws if w.model == m and w.entry_group == e and not w.packed}
            assert got == {n: 32768 // n for n in (512, 1024, 2048, 4096, 8192, 16384)}, (m, e, got)
    assert {w.entry_group for w in ws if w.packed} == {"prefill", "train"}
    # features from the model tables
    by = {w.model: w for w in ws if w.entry_group == "prefill"}
    assert by["mistral-7b-v0.1"].window == 4096 and by["gemma-2-9b"].softcap == 50.0
    assert by["gemma-2-9b:local"].features == {"window", "softcap"}
    assert by["gpt-oss-20b:local"].features == {"window", "sinks"} and by["gpt-oss-20b:local"].window == 128
    mla = [w for w in ws if w.entry_group == "mla"]
    assert {(w.batch, w.kv_len) for w in mla if w.model == "deepseek-v3" and not w.ragged and w.q_len == 1} == {
        (b, s) for b in (1, 8, 32, 64, 128) for s in (2048, 8192, 32768)}
    assert any(w.ragged for w in mla) and any(w.q_len == 2 for w in mla)
    assert {w.q_len for w in ws if w.entry_group == "spec"} == {2, 4, 8}
    assert {w.kv_dtype for w in ws if w.entry_group == "quant"} == {None, "fp8_e4m3", "nvfp4"}
    # the decode grid's memory bound: B x S <= 2^20, the dropped names recorded
    dropped = next(v for k, v in DROPPED_BY_MEMORY.items() if k.name == "sweep.toml")
    assert "sweep_decode_llama-3.1-8b_b128_s131072" in dropped
    assert all(w.batch * w.kv_len <= 1 << 20 for w in ws if w.entry_group in ("decode", "paged") and
               w.model in ("llama-3.1-8b",))


def test_every_workload_has_a_plan_and_auto_takes_it_or_says_why(ws):
    all_impls = impls.all_impls()
    runner.check_workload_lists(ws, all_impls)
    plan = dict((w.name, lst) for w, lst in runner.make_plan(ws, all_impls, [], [], "sweep"))
    assert set(plan) == {w.name for w in ws}
    a = auto.auto_impl()
    for w in ws:
        assert "pallas:auto" in {i.name for i in plan[w.name]}, w.name
        s = a.supports(w, CPU)
        assert s.ok or (s.status == "unsupported" and s.reason), (w.name, s)
        missing = w.features - a.features
        if missing or (w.features - auto._ENTRY_FEATURES.get(w.family, frozenset())):
            assert not s.ok and any(f in s.reason for f in w.features), (w.name, s.reason)
        elif w.features and w.family in ("decode", "paged_decode"):  # fa_decode's window / soft-cap / sinks (s11)
            assert s.ok, (w.name, s.reason)


def test_feature_refusal_names_the_feature_before_anything_runs(tmp_path):
    """A named config without soft-cap on a soft-capped workload: an 'unsupported' record naming soft-cap."""
    cfg = tmp_path / "f.toml"
    cfg.write_text('''
[models.m]
heads_q = 2
heads_kv = 1
head_dim = 32
softcap = 50.0

[[workload]]
name = "f_{model}"
model = "m"
family = "prefill"
batch = 1
q_len = 16
causal = true
dtype = "float32"
generations = ["pallas:auto", "pallas:fa_train:default"]
peers = []
''')
    from compare import cli

    out = tmp_path / "out"
    assert cli.main(["run", "--config", str(cfg), "--out", str(out)]) == 0
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    res = {r["impl"]["name"]: r for r in recs if r.get("type") == "result"}
    assert set(res) == {"pallas:auto", "pallas:fa_train:default"}
    for r in res.values():
        assert r["status"] == "unsupported" and "softcap" in r["reason"], r
        assert r["workload"]["features"] == ["softcap"] and r["workload"]["model"] == "m"


def test_model_table_errors(tmp_path):
    bad = tmp_path / "b.toml"
    bad.write_text('[models.m]\nheads_q = 2\nhidden = 3\n[[workload]]\nname="x"\nmodel="m"\nfamily="prefill"\n'
                   'batch=1\nq_len=8\nhead_dim=32\ndtype="float32"\n')
    with pytest.raises(ConfigError, match="hidden"):
        load_config(bad)
    bad.write_text('[[workload]]\nname="x"\nmodel="nope"\nfamily="prefill"\nbatch=1\nq_len=8\nheads_q=2\n'
                   'head_dim=32\ndtype="float32"\n')
    with pytest.raises(ConfigError, match="nope"):
        load_config(bad)
    bad.write_text('[[workload]]\nname="x"\nfamily="prefill"\nbatch=1\nq_len=8\nheads_q=2\nhead_dim=32\n'
                   'dtype="float32"\nwindow=4\n')
    with pytest.raises(ConfigError, match="causal"):
        load_config(bad)


# ---------------------------------------------------------------------------------------------- tables


def _mla_problem(batch, kv_len, heads_q=128):
    from pallas_attn.kernels.contract import Problem

    return Problem(entry="mla", dtype="bfloat16", batch=batch, q_len=1, kv_len=kv_len, heads_q=heads_q, heads_kv=1,
                   head_dim=576, causal=True, page_size=64, kv_lora_rank=512)


def test_shipped_h100_table_routes_mla_and_off_switch(monkeypatch):
    """The committed H100 table (from the sweep records) is what fa_mla's heuristic reads on an H100: at DeepSeek-V3
    B64 S8192 it gives the row's config, which is not the reference's plan; PALLAS_ATTN_TUNING=off restores it; no
    table on a CPU."""
    from pallas_attn import tuning
    from pallas_attn.kernels import v12_mla_tc

    assert tuning.table() is None or tuning.chip() is not None  # this CPU has no GPU: no table
    monkeypatch.setattr(tuning, "chip", lambda: "h100")
    tbl = tuning.table()
    row = next(r for r in tbl["kernels"]["fa_mla"]["rows"] if r["workload"] == "sweep_mla_deepseek-v3_b64_s8192")
    assert row["config"] != "default" and min(row["time_us"], key=row["time_us"].get) == row["config"]
    p = _mla_problem(64, 8192)
    assert v12_mla_tc.KERNEL.heuristic(p) == v12_mla_tc.CONFIGS[row["config"]]
    # a shape outside the table: the nearest measured row of the same kind (heads 128, DQK 576)
    assert tuning.choose("fa_mla", _mla_problem(48, 12000)) in ("kv64_mc", "kv64_ws_mc")
    # a kind the table never measured (heads 64): no row, the kernel's own rule (session 20: kv64_mc at the 576 / 512
    # template with pages >= 16, kv64 at page 8, the reference's plan at the other templates; session 33: the work
    # list kv64_mc_wl from 64 sequences of 8192 keys)
    assert tuning.choose("fa_mla", _mla_problem(64, 8192, heads_q=64)) is None
    assert v12_mla_tc.KERNEL.heuristic(_mla_problem(64, 8192, heads_q=64)) == v12_mla_tc.CONFIGS["kv64_mc_wl"]
    assert v12_mla_tc.KERNEL.heuristic(_mla_problem(32, 8192, heads_q=64)) == v12_mla_tc.CONFIGS["kv64_mc"]
    assert v12_mla_tc.KERNEL.heuristic(_mla_problem(64, 4096, heads_q=64)) == v12_mla_tc.CONFIGS["kv64_mc"]
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")
    assert v12_mla_tc.KERNEL.heuristic(p) == v12_mla_tc.CONFIGS["kv64_mc_wl"]
    p8 = dataclasses.replace(p, page_size=8)
    assert v12_mla_tc.KERNEL.heuristic(p8) == v12_mla_tc.CONFIGS["kv64"]
    small = dataclasses.replace(p, head_dim=320, kv_lora_rank=256)
    assert v12_mla_tc.KERNEL.heuristic(small) == v12_mla_tc.CONFIGS["faithful"]
    monkeypatch.setattr(tuning, "chip", lambda: "h200")  # no H200 MLA rows: the own rule, not the reference's plan
    monkeypatch.delenv("PALLAS_ATTN_TUNING")
    assert tuning.choose("fa_mla", p) is None and v12_mla_tc.KERNEL.heuristic(p) == v12_mla_tc.CONFIGS["kv64_mc_wl"]
    p8k = dataclasses.replace(p, batch=8)
    assert v12_mla_tc.KERNEL.heuristic(p8k) == v12_mla_tc.CONFIGS["kv64_mc"]
    assert not (tuning.table_for("fa_mla") or {}).get("kernels", {}).get("fa_mla")


def test_h200_reads_its_own_prefill_rows_and_the_h100_rows_of_kinds_it_never_measured(monkeypatch):
    """Since session 29 the H200's table holds fa_prefill and drop-in backward rows from its own sweep (causal, the
    sweep's kinds) beside its fa_decode rows: there they rule (gpt-oss-20b N 2048: a multi-tile config on the H200,
    where the H100's nearest row says default); a kind the H200 never measured (non-causal D 64) reads the H100's
    rows of that kind, never a row of another kind; fa_mla keeps its own rule; PALLAS_ATTN_TUNING=off turns them all
    off."""
    from pallas_attn import tuning
    from pallas_attn.kernels import fa_prefill
    from pallas_attn.kernels.contract import Problem

    oss = Problem(entry="dense", dtype="bfloat16", batch=16, q_len=2048, kv_len=2048, heads_q=64, heads_kv=8,
                  head_dim=64, causal=True)
    noncausal = dataclasses.replace(oss, batch=32, q_len=1024, kv_len=1024, heads_q=12, heads_kv=12, causal=False)
    monkeypatch.setattr(tuning, "chip", lambda: "h100")
    assert tuning.choose("fa_prefill", oss, names=fa_prefill.CONFIGS) == "default"
    on_h100 = tuning.choose("fa_prefill", noncausal, names=fa_prefill.CONFIGS)
    assert on_h100 not in (None, "default")
    monkeypatch.setattr(tuning, "chip", lambda: "h200")
    own = tuning.table()
    assert set(own["kernels"]) == {"fa_decode", "fa_prefill", "fa_prefill_bwd"}
    assert tuning.table_for("fa_prefill") is own and tuning.table_for("fa_prefill_bwd") is own
    assert not any(r["key"]["causal"] is False for r in own["kernels"]["fa_prefill"]["rows"])
    # the H200's own row: a multi-tile config (tiles8 from session 29's records, tiles4 from session 30's)
    row = next(r for r in own["kernels"]["fa_prefill"]["rows"] if r["workload"] == "sweep_prefill_gpt-oss-20b_n2048")
    assert row["config"] in ("tiles4", "tiles8"), row["config"]
    assert tuning.choose("fa_prefill", oss, names=fa_prefill.CONFIGS) == row["config"]
    assert fa_prefill.KERNEL.heuristic(oss) == fa_prefill.CONFIGS[row["config"]]
    assert tuning.sibling_table("fa_prefill") is tuning.table("h100")
    assert tuning.choose("fa_prefill", noncausal, names=fa_prefill.CONFIGS) == on_h100  # the H100's row of that kind
    # given a table explicitly, no sibling is read: a kind it lacks gives None
    assert tuning.choose("fa_prefill", noncausal, names=fa_prefill.CONFIGS, tbl=own) is None
    assert tuning.sibling_table("fa_decode") is None and tuning.sibling_table("fa_mla") is None
    assert tuning.table_for("fa_mla") is own  # no MLA rows in it: choose() finds none, the kernel's own rule
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")
    assert tuning.choose("fa_prefill", oss, names=fa_prefill.CONFIGS) is None
    assert tuning.choose("fa_prefill", noncausal, names=fa_prefill.CONFIGS) is None


def test_every_default_reads_its_table(tmp_path, monkeypatch):
    """A table that picks a non-default config for each tuned kernel: fa_prefill's, fa_decode's and the drop-in's
    backward heuristics return it at the bucket, and their own rule elsewhere."""
    from pallas_attn import dropin, tuning
    from pallas_attn.kernels import fa_decode, fa_prefill
    from pallas_attn.kernels.contract import Problem

    dense = Problem(entry="dense", dtype="bfloat16", batch=8, q_len=4096, kv_len=4096, heads_q=32, heads_kv=8,
                    head_dim=128, causal=True)
    dec = Problem(entry="dense", dtype="bfloat16", batch=32, q_len=1, kv_len=8192, heads_q=32, heads_kv=8,
                  head_dim=128, causal=True)
    tbl = {"kernels": {
        "fa_prefill": {"rows": [{"key": tuning.bucket("fa_prefill", dense), "config": "pingpong"}]},
        "fa_prefill_bwd": {"rows": [{"key": tuning.bucket("fa_prefill_bwd", dense), "config": "wide_ovl"}]},
        "fa_decode": {"rows": [{"key": tuning.bucket("fa_decode", dec), "config": "tuned"}]}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(tbl))
    monkeypatch.setenv("PALLAS_ATTN_TUNING", str(path))
    assert fa_prefill.KERNEL.heuristic(dense) == fa_prefill.CONFIGS["pingpong"]
    assert dropin.bwd_config_name(dense) == "wide_ovl"
    assert fa_decode.KERNEL.heuristic(dec) == fa_decode.CONFIGS["tuned"]
    d64 = Problem(entry="dense", dtype="bfloat16", batch=8, q_len=4096, kv_len=4096, heads_q=32, heads_kv=8,
                  head_dim=64, causal=True)  # another head dim: not this row's kind
    assert fa_prefill.KERNEL.heuristic(d64) == fa_prefill.fit(fa_prefill.CONFIGS["default"], 64)
    # the own rule there: the fastest path (fused at causal D 64), the rule by causal when determinism is asked
    assert dropin.bwd_config_name(d64) == dropin.NONDET_BWD_CONFIG
    assert dropin.bwd_config_name(d64, deterministic=True) == dropin.DROPIN_BWD_CONFIG[True]
    # a stale table naming a config the kernel no longer has is ignored, never an error
    tbl["kernels"]["fa_decode"]["rows"][0]["config"] = "removed_config"
    stale = tmp_path / "stale.json"
    stale.write_text(json.dumps(tbl))
    monkeypatch.setenv("PALLAS_ATTN_TUNING", str(stale))
    assert fa_decode.KERNEL.heuristic(dec) == fa_decode.CONFIGS["default"]


def test_drop_in_backward_is_the_fastest_unless_determinism_is_asked(tmp_path, monkeypatch):
    """A table row whose fastest config is ``fused`` (dQ by reduce-adds, not bit-reproducible): the drop-in's default
    takes it; ``deterministic=True``, or XLA's deterministic-ops flag, takes the row's fastest deterministic config.
    Without a row: ``fused`` at causal D 64 by default, the rule by causal elsewhere and when determinism is asked."""
    from pallas_attn import dropin, tuning
    from pallas_attn.kernels.contract import Problem

    d64 = Problem(entry="dense", dtype="bfloat16", batch=4, q_len=8192, kv_len=8192, heads_q=12, heads_kv=12,
                  head_dim=64, causal=True)
    row = {"key": tuning.bucket("fa_prefill_bwd", d64), "config": "fused",
           "time_us": {"fused": 3388.3, "wide": 3704.3, "wide_ovl": 3660.3, "default": 4659.8}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"kernels": {"fa_prefill_bwd": {"rows": [row]}}}))
    monkeypatch.setenv("PALLAS_ATTN_TUNING", str(path))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert dropin.bwd_config_name(d64) == dropin.bwd_config_name(d64, deterministic=False) == "fused"
    assert dropin.bwd_config_name(d64, deterministic=True) == "wide_ovl"
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0 --xla_gpu_deterministic_ops=true")
    assert dropin.deterministic_asked() and dropin.bwd_config_name(d64) == "wide_ovl"
    assert dropin.bwd_config_name(d64, deterministic=False) == "fused"  # the caller's word wins over the flag
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setenv("PALLAS_ATTN_TUNING", "off")
    d128 = dataclasses.replace(d64, head_dim=128)
    for p, det, want in ((d64, True, "wide"), (d64, None, "fused"), (d128, None, "wide"),
                         (dataclasses.replace(d64, causal=False), None, "wide_ovl")):
        assert dropin.bwd_config_name(p, deterministic=det) == want, (p, det)
    # the shipped H100 table (session 21 records): GPT-2 N 8192's training step row is fused's (0.91x wide there):
    # the default takes it, deterministic=True that row's deterministic choice; Llama-8B stays wide either way
    monkeypatch.delenv("PALLAS_ATTN_TUNING")
    monkeypatch.setattr(tuning, "chip", lambda: "h100")
    gpt2 = Problem(entry="dense", dtype="bfloat16", batch=4, q_len=8192, kv_len=8192, heads_q=12, heads_kv=12,
                   head_dim=64, causal=True)
    assert dropin.bwd_config_name(gpt2) == "fused"
    assert not dropin.fa_prefill_bwd.CONFIGS[dropin.bwd_config_name(gpt2, deterministic=True)].fused_dq
    llama = Problem(entry="dense", dtype="bfloat16", batch=2, q_len=16384, kv_len=16384, heads_q=32, heads_kv=8,
                    head_dim=128, causal=True)
    assert dropin.bwd_config_name(llama, deterministic=True) == dropin.bwd_config_name(llama) == "wide"
    import pallas_attn

    x = jnp.zeros((1, 8, 2, 64), jnp.float16)
    with pytest.raises(ValueError, match="deterministic must be None or a bool"):
        pallas_attn.dot_product_attention(x, x, x, deterministic="no")


def _rec(wl, impl, t, status="ok", gpu="NVIDIA H100 80GB HBM3"):
    return {"type": "result", "workload": wl, "impl": {"name": impl, "kind": "frontier"}, "status": status,
            "metrics": {"time_us_p50": t}, "env": {"gpu": gpu, "git_sha": "abc"}}


def test_tune_table_from_records(tmp_path):
    w = load_config("sweep")
    mla = next(x for x in w if x.name == "sweep_mla_deepseek-v3_b64_s8192").as_dict()
    dec = next(x for x in w if x.name == "sweep_decode_llama-3.1-8b_b1_s8192").as_dict()
    recs = [_rec(mla, "pallas:fa_mla:default", 405.8), _rec(mla, "pallas:fa_mla:kv64_mc", 273.9),
            _rec(mla, "pallas:fa_mla:kv64_ws_mc", 276.3), _rec(mla, "pallas:auto", 200.0),
            _rec(mla, "pallas:fa_mla:kv64", 100.0, status="wrong"),  # not agreeing with the oracle: never chosen
            _rec(dec, "pallas:fa_decode:default", 20.7), _rec(dec, "pallas:fa_decode:tuned", 20.5),  # within 2%
            _rec(dec, "pallas:fa_decode:default", 10.0, gpu="NVIDIA A100")]  # another chip: not in the H100 table
    for r in recs:
        r["_file"] = "x.jsonl"
    tables = tune_table.build_tables(recs, min_gain=0.02)
    assert set(tables) == {"h100"}
    rows = {r["workload"]: r for k in tables["h100"]["kernels"].values() for r in k["rows"]}
    assert rows[mla["name"]]["config"] == "kv64_mc" and rows[mla["name"]]["key"]["heads_q"] == 128
    assert rows[dec["name"]]["config"] == "default"  # tuned is faster by 1%: the default stays
    assert set(rows[mla["name"]]["time_us"]) == {"default", "kv64_mc", "kv64_ws_mc"}


def test_tune_table_compares_configs_within_one_run():
    """A config is chosen by its time over the default's in one run, not by absolute times from different runs: a later
    run that timed the default 3% slower (another machine) does not make an older run's pingpong the choice, and a
    config timed beside the default in the latest run is judged by that run."""
    w = load_config("sweep")
    pre = next(x for x in w if x.name == "sweep_prefill_llama-3.1-8b_n16384").as_dict()
    run1 = [_rec(pre, "pallas:fa_prefill:default", 6749.0), _rec(pre, "pallas:fa_prefill:pingpong", 6690.0)]
    run2 = [_rec(pre, "pallas:fa_prefill:default", 6906.0), _rec(pre, "pallas:fa_prefill:c3", 10246.0)]
    for i, r in enumerate(run1 + run2):
        r["_file"], r["run_id"] = "x.jsonl", "r1" if i < 2 else "r2"
    row = tune_table.build_tables(run1 + run2, min_gain=0.02)["h100"]["kernels"]["fa_prefill"]["rows"][0]
    assert row["config"] == "default"  # pingpong 0.9% ahead in its own run; 3.1% ahead of run 2's default
    assert row["time_us"] == {"default": 6906.0, "pingpong": 6690.0, "c3": 10246.0}  # the latest absolute times
    assert row["margin"] == round(6749.0 / 6690.0, 4)
    run3 = [_rec(pre, "pallas:fa_prefill:default", 7000.0), _rec(pre, "pallas:fa_prefill:pingpong", 6790.0)]
    for r in run3:
        r["_file"], r["run_id"] = "y.jsonl", "r3"
    row = tune_table.build_tables(run1 + run2 + run3, min_gain=0.02)["h100"]["kernels"]["fa_prefill"]["rows"][0]
    assert row["config"] == "pingpong"  # 3% ahead of the default within run 3
    # a windowed or packed workload makes no row (its bucket would overrule the plain shape's)
    loc = next(x for x in w if x.name == "sweep_prefill_gpt-oss-20b:local_n8192").as_dict()
    pk = next(x for x in w if x.name == "sweep_prefill_packed_gpt-2_n16384").as_dict()
    extra = [_rec(x, f"pallas:fa_prefill:{c}", t) for x in (loc, pk)
             for c, t in (("default", 800.0), ("serial", 700.0))]
    for r in extra:
        r["_file"], r["run_id"] = "z.jsonl", "r4"
    rows = tune_table.build_tables(run1 + extra, min_gain=0.02)["h100"]["kernels"]["fa_prefill"]["rows"]
    assert [r["workload"] for r in rows] == [pre["name"]]


def test_tune_table_cli(tmp_path):
    from compare import cli

    w = load_config("sweep")
    mla = next(x for x in w if x.name == "sweep_mla_deepseek-v3_b64_s8192").as_dict()
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (
        {"type": "header", "env": {"gpu": "NVIDIA H100 80GB HBM3", "git_sha": "abc"}},
        {k: v for k, v in _rec(mla, "pallas:fa_mla:default", 400.0).items() if k != "env"},
        {k: v for k, v in _rec(mla, "pallas:fa_mla:kv64_mc", 270.0).items() if k != "env"})) + "\n")
    out = tmp_path / "h100.json"
    assert cli.main(["tune", "--table", str(f), "--write", str(out)]) == 0
    tbl = json.loads(out.read_text())
    assert tbl["kernels"]["fa_mla"]["rows"][0]["config"] == "kv64_mc" and tbl["sources"] == [str(f)]
    assert cli.main(["tune", "--table", str(tmp_path / "missing.jsonl")]) == 2
    assert cli.main(["tune"]) == 2  # neither --config nor --table
    # rewriting that table from other records alone would drop the rows of its sources: refused, then --replace
    g = tmp_path / "other.jsonl"
    g.write_text(f.read_text())
    before = out.read_text()
    assert cli.main(["tune", "--table", str(g), "--write", str(out)]) == 2
    assert out.read_text() == before
    assert cli.main(["tune", "--table", str(f), str(g), "--write", str(out)]) == 0  # every source given: fine
    assert cli.main(["tune", "--table", str(g), "--write", str(out), "--replace"]) == 0
    assert json.loads(out.read_text())["sources"] == [str(g)]


def test_auto_records_its_choice_cpu(tmp_path):
    """compare run on the CPU with pallas:auto on a decode, a paged and an MLA workload: each record agrees with the
    oracle and says which kernel and config the defaults chose (the same as the named config beside it)."""
    from compare import cli

    cfg = tmp_path / "a.toml"
    cfg.write_text('''
[models.m]
heads_q = 4
heads_kv = 2
head_dim = 64

[models.mla]
heads_q = 16
heads_kv = 1
kv_lora_rank = 128
rope_dim = 64
head_dim = 192

[[workload]]
name = "a_decode"
model = "m"
family = "decode"
batch = 2
q_len = 1
kv_len = 64
causal = true
dtype = "float16"
generations = ["pallas:auto", "pallas:fa_decode:default"]
peers = []

[[workload]]
name = "a_paged"
model = "m"
family = "paged_decode"
batch = 2
q_len = 1
kv_len = 64
page_size = 16
ragged = true
causal = true
dtype = "float16"
generations = ["pallas:auto"]
peers = []

[[workload]]
name = "a_mla"
model = "mla"
family = "mla"
batch = 2
q_len = 1
kv_len = 128
causal = true
dtype = "float16"
generations = ["pallas:auto"]
peers = []
''')
    out = tmp_path / "out"
    assert cli.main(["run", "--config", str(cfg), "--out", str(out)]) == 0
    recs = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    autos = {r["workload"]["name"]: r for r in recs if r.get("type") == "result" and r["impl"]["name"] == "pallas:auto"}
    assert set(autos) == {"a_decode", "a_paged", "a_mla"}
    assert all(r["status"] == "ok" for r in autos.values()), {k: r.get("reason") for k, r in autos.items()}
    assert autos["a_decode"]["impl"]["plan"]["chose"] == "fa_decode:default"
    assert autos["a_paged"]["impl"]["plan"]["chose"] == "fa_decode:default"
    assert autos["a_mla"]["impl"]["plan"]["chose"] == "fa_mla:default"  # no table on a CPU: the reference's plan
    assert autos["a_decode"]["workload"]["model"] == "m" and autos["a_mla"]["workload"]["entry"] == "mla"


@pytest.mark.parametrize("chip,named", [("h100", ("sweep_prefill_llama-3.1-70b_n512", "tiles8")),
                                        ("h200", ("sweep_prefill_llama-3.1-8b_n4096", "tiles8"))])
def test_on_a_hopper_auto_picks_each_prefill_row_of_the_shipped_table(monkeypatch, ws, chip, named):
    """The default is the best path: at every sweep prefill workload the shipped table of the chip has a row for,
    pallas:auto (the drop-in as a user calls it, on a faked Hopper) chooses that row's config, the fastest named config
    of the records the row was made from (e.g. H100: Llama-3.1-70B N 512 -> tiles8, which the run before the rebuild
    timed at 714.9 us where auto's default took 923.5; H200: Llama-3.1-8B N 4096 -> tiles8, 1698.7 us where auto's
    default took 1758.6 in session 30's call 2, the snake order's)."""
    from pallas_attn import dropin, tuning
    from pallas_attn.kernels import fa_prefill

    monkeypatch.setattr(tuning, "chip", lambda: chip)
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)  # nothing runs: the choice only
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    ws = {w.name: w for w in ws}
    rows = [r for r in tuning.table()["kernels"]["fa_prefill"]["rows"] if r["workload"].startswith("sweep_prefill_")]
    assert any(r["workload"] == named[0] and r["config"] == named[1] for r in rows)
    skipped = 0
    for r in rows:
        assert min(r["time_us"], key=r["time_us"].get) == r["config"] or r["config"] == r["default"], r["workload"]
        if r["key"].get("head_dim") in dropin.DEFAULT_SKIPS_HEAD_DIMS:
            # D 96: the drop-in's default keeps cuDNN (our padded backward is slower); the row serves fa_prefill's own
            # heuristic (attention(generation="fa_prefill"), the drop-in forced to the pair)
            assert auto.choice(ws[r["workload"]])["chose"] != f"fa_prefill:{r['config']}", r["workload"]
            assert fa_prefill.KERNEL.heuristic(impls.problem_of(ws[r["workload"]])) == fa_prefill.CONFIGS[r["config"]]
            skipped += 1
            continue
        assert auto.choice(ws[r["workload"]])["chose"] == f"fa_prefill:{r['config']}", r["workload"]
    assert skipped == sum(r["key"].get("head_dim") == 96 for r in rows)


def test_on_a_hopper_auto_names_cudnns_forward_at_short_prefill_and_our_pair_in_training(monkeypatch, ws):
    """The drop-in's CUDNN_FORWARD route as compare's auto plan names it (a faked Hopper with a GPU, nothing runs):
    GPT-2 N 512 prefill chose "cudnn" (its forward), the same shape's training step cuDNN's forward and fa_prefill's
    backward (session 31, "cudnn+bwd:<config>"; layer 2 refuses to price it), or with ``dropin.CUDNN_FORWARD_STEP =
    "ours"`` fa_prefill's pair; GPT-2 N 8192 and Llama-3.1-8B N 1024 prefill stay on fa_prefill."""
    from pallas_attn import dropin, tuning

    monkeypatch.setattr(tuning, "chip", lambda: "h100")
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    monkeypatch.setattr(dropin._compat, "has_gpu", lambda: True)
    ws = {w.name: w for w in ws}
    pre = auto.choice(ws["sweep_prefill_gpt-2_n512"])
    assert pre["chose"] == "cudnn" and pre["generation"] is None and "cuDNN forward" in pre["why"]
    train = auto.choice(ws["sweep_train_gpt-2_n512"])
    assert train["generation"] == "fa_prefill" and train["chose"] == f"cudnn+bwd:{train['bwd_config']}"
    assert train["forward_impl"] == "jax:cudnn" and "softmax statistics" in train["why"]
    assert auto._supports(ws["sweep_train_gpt-2_n512"], None).ok
    with pytest.raises(NotImplementedError, match="fa_prefill_bwd only"):
        layer2.train_launches(layer2.AUTO, layer2.Shape.of(ws["sweep_train_gpt-2_n512"]), hardware.get("h100"), train)
    monkeypatch.setattr(dropin, "CUDNN_FORWARD_STEP", "ours")
    train = auto.choice(ws["sweep_train_gpt-2_n512"])
    assert train["generation"] == "fa_prefill" and train["chose"].startswith("fa_prefill:") and "+bwd:" in \
        train["chose"] and "forward_impl" not in train
    for name in ("sweep_prefill_gpt-2_n8192", "sweep_prefill_llama-3.1-8b_n1024"):
        assert auto.choice(ws[name])["chose"].startswith("fa_prefill:"), name


def test_on_a_hopper_auto_times_the_steps_the_drop_in_differentiates_through_cudnn(monkeypatch, ws):
    """A training step the drop-in differentiates through cuDNN (causal D 128 from N 4096, D 96: dropin.APART) is
    timed as what a user gets, not left 'unsupported': since session 31 fa_prefill's forward and cuDNN's backward
    (chose "fa_prefill:<config>+bwd:cudnn"; layer 2 has no model of cuDNN's backward), with
    ``dropin.APART_STEP = "cudnn"`` cuDNN's pair (chose "cudnn"); its prefill twin keeps fa_prefill's forward; XLA's
    fallback stays 'unsupported'."""
    from pallas_attn import dropin, tuning

    monkeypatch.setattr(tuning, "chip", lambda: "h100")
    monkeypatch.setattr(dropin, "_is_sm90", lambda: True)
    monkeypatch.setattr(dropin._compat, "default_interpret", lambda interpret: False)
    monkeypatch.setattr(dropin._compat, "has_gpu", lambda: True)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    ws = {w.name: w for w in ws}
    for name in ("sweep_train_llama-3.1-8b_n4096", "sweep_train_llama-3.1-8b_n8192", "sweep_train_qwen2.5-7b_n16384",
                 "sweep_train_phi-3-mini_n4096", "sweep_train_mistral-7b-v0.1_n4096"):  # Mistral's window masks nothing
        c = auto.choice(ws[name])
        fwd = auto.prefill_forward_config(ws[name])[1]
        assert c["chose"] == f"fa_prefill:{fwd}+bwd:cudnn" and c["generation"] == "fa_prefill", name
        assert c["bwd_config"] == "jax:cudnn" and "cuDNN's backward on them" in c["why"], name
        assert auto._supports(ws[name], None).ok, name
        with pytest.raises(NotImplementedError, match="fa_prefill_bwd only"):
            layer2.train_launches(layer2.AUTO, layer2.Shape.of(ws[name]), hardware.get("h100"), c)
    assert auto.choice(ws["sweep_prefill_llama-3.1-8b_n8192"])["chose"].startswith("fa_prefill:")
    assert auto.choice(ws["sweep_train_llama-3.1-8b_n2048"])["generation"] == "fa_prefill"
    mistral = auto.choice(ws["sweep_train_mistral-7b-v0.1_n8192"])  # its window masks: measured
    assert mistral["chose"].endswith("+bwd:cudnn") and "window left 4095" in mistral["why"]
    monkeypatch.setattr(dropin, "APART_STEP", "cudnn")
    for name in ("sweep_train_llama-3.1-8b_n8192", "sweep_train_phi-3-mini_n4096", "sweep_train_mistral-7b-v0.1_n8192"):
        c = auto.choice(ws[name])
        assert c["chose"] == "cudnn" and c["generation"] is None and "APART_STEP" in c["why"], name
        assert auto._supports(ws[name], None).ok, name
    assert auto.choice(ws["sweep_prefill_mistral-7b-v0.1_n8192"])["chose"].startswith("fa_prefill:")
    monkeypatch.setattr(dropin._compat, "has_gpu", lambda: False)  # no cuDNN: Phi-3's step falls back to XLA
    assert not auto._supports(ws["sweep_train_phi-3-mini_n4096"], None).ok
