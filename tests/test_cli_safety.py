"""The CLI never loses or hides anything: existing records are never overwritten (``--append`` adds a run),
``report`` writes next to the records unless ``--out`` says otherwise, a selection or config entry that
matches nothing is an error, bad config values are refused at load, user mistakes are one line on stderr
with exit code 2, and Ctrl-C keeps every finished record (exit code 130).

CPU only, on the ``smoke`` config with tiny selections: torch peers are ``unavailable`` without a CUDA GPU
and cost nothing to record, so most runs here select ``--impl 'torch:*'`` on one workload."""

from __future__ import annotations

import json
import textwrap

import pytest

from compare import cli, records, runner
from compare.workloads import ConfigError, load_config

QUICK = ["--config", "smoke", "--only", "smoke_decode_f16", "--impl", "torch:*", "--quiet", "--no-ceilings"]


def _recs(path):
    return list(records.read_jsonl(path))


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert "error:" in err
    return err


# ------------------------------------------------------------------------------------- 1. never overwrite


def test_run_refuses_to_overwrite_records_and_append_adds_a_run(tmp_path, capsys):
    assert cli.main(["run", *QUICK, "--out", str(tmp_path)]) == 0
    path = tmp_path / "records.jsonl"
    first = _recs(path)
    assert first[0]["type"] == "header" and any(r["type"] == "result" for r in first)
    capsys.readouterr()

    assert cli.main(["run", *QUICK, "--out", str(tmp_path)]) == 2
    err = _one_error_line(capsys)
    assert str(path) in err and "--append" in err and "--out" in err
    assert _recs(path) == first  # untouched

    assert cli.main(["run", *QUICK, "--out", str(tmp_path), "--append"]) == 0
    both = _recs(path)
    assert both[: len(first)] == first
    headers = [r for r in both if r["type"] == "header"]
    assert len(headers) == 2 and headers[0]["run_id"] != headers[1]["run_id"]
    assert len({r["run_id"] for r in both}) == 2


def test_run_into_an_empty_records_file_is_fine(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("")
    assert cli.main(["run", *QUICK, "--out", str(path)]) == 0
    assert _recs(path)[0]["type"] == "header"


# ----------------------------------------------------------------------------------- 2. report's output


def test_report_writes_next_to_the_records_by_default(tmp_path, monkeypatch):
    run_dir = tmp_path / "results" / "r1"
    assert cli.main(["run", *QUICK, "--out", str(run_dir)]) == 0
    monkeypatch.chdir(tmp_path)  # a docs/ here must stay untouched
    (tmp_path / "docs").mkdir()
    assert cli.main(["report", str(run_dir / "records.jsonl")]) == 0
    assert (run_dir / "results.md").is_file()
    assert not (tmp_path / "docs" / "results.md").exists()
    assert cli.main(["report", str(run_dir)]) == 0  # a run directory works too
    # an explicit --out still writes exactly there (how the committed docs/results.md is regenerated)
    assert cli.main(["report", str(run_dir / "records.jsonl"), "--out", "docs/results.md"]) == 0
    assert "# Results" in (tmp_path / "docs" / "results.md").read_text()


def test_report_errors_are_one_line(tmp_path, capsys):
    assert cli.main(["report", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in _one_error_line(capsys)
    a, b = tmp_path / "a" / "records.jsonl", tmp_path / "b" / "records.jsonl"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text(json.dumps({"type": "header", "run_id": p.parent.name, "env": {}}) + "\n")
    assert cli.main(["report", str(a), str(b)]) == 2
    assert "--out" in _one_error_line(capsys)


# ------------------------------------------------------------------------------ 3. selections that miss


@pytest.mark.parametrize("argv, needle", [
    (["--only", "nomatch"], "'nomatch'"),
    (["--only", "pallas:fa_decode:*"], "--impl"),  # an impl glob given to --only: says so
    (["--only", "smoke_decode_f16:nomatch:*"], "nomatch"),
    (["--impl", "pallas:nomatch:*"], "pallas:nomatch:*"),
    (["--only", "smoke_decode_f16:cuda:*", "--impl", "torch:*"], "smoke_decode_f16:cuda:*"),  # AND: disjoint
])
def test_a_selection_that_matches_nothing_is_an_error(tmp_path, capsys, argv, needle):
    out = tmp_path / "o"
    assert cli.main(["run", "--config", "smoke", "--quiet", "--out", str(out), *argv]) == 2
    assert needle in _one_error_line(capsys)
    assert not (out / "records.jsonl").exists() or not _recs(out / "records.jsonl")  # nothing written


def test_a_selection_where_every_pair_is_not_applicable_exits_non_zero(tmp_path, capsys):
    # the paged JAX op on a dense workload: selected, but n/a, so no record at all
    argv = ["run", "--config", "smoke", "--quiet", "--no-ceilings", "--out", str(tmp_path), "--only",
            "smoke_decode_f16", "--impl", "jax-pallas:paged"]
    assert cli.main(argv) == 1
    assert "nothing ran" in capsys.readouterr().err
    assert not [r for r in _recs(tmp_path / "records.jsonl") if r["type"] == "result"]


def test_impl_filter_selects_implementations(tmp_path):
    assert cli.main(["run", *QUICK, "--out", str(tmp_path)]) == 0
    res = [r for r in _recs(tmp_path / "records.jsonl") if r["type"] == "result"]
    assert res and {r["workload"]["name"] for r in res} == {"smoke_decode_f16"}
    assert all(r["impl"]["name"].startswith("torch:") for r in res)


def _write(tmp_path, body: str, name: str = "c.toml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


_ENTRY = """
[[workload]]
name = "w"
family = "decode"
batch = 1
heads_q = 2
q_len = 1
kv_len = 64
head_dim = 64
dtype = "float16"
"""


@pytest.mark.parametrize("extra, needle", [
    ('generations = ["fa_decod"]', "'fa_decod'"),
    ('peers = ["torch:flsh"]', "'torch:flsh'"),
])
def test_a_misspelt_generation_or_peer_in_a_config_is_an_error(tmp_path, capsys, extra, needle):
    cfg = _write(tmp_path, _ENTRY + extra + "\n")
    assert cli.main(["run", "--config", str(cfg), "--quiet", "--out", str(tmp_path / "o")]) == 2
    err = _one_error_line(capsys)
    assert needle in err and "c.toml" in err and "workload[0]" in err
    # the configs in the repository all name known implementations
    from compare.impls import all_impls

    for name in ("default", "full", "cp_decode", "ring_train"):
        runner.check_workload_lists(load_config(name), all_impls())


# ------------------------------------------------------------------------------ 4. bad config values


@pytest.mark.parametrize("extra, needle", [
    ('causal = "yes"', "causal must be true or false"),
    ("causal = 1", "causal must be true or false"),
    ('seed = "abc"', "seed must be an int"),
    ("seed = true", "seed must be an int"),
    ("heads_kv = true", "heads_kv must be an int"),
    ('page_size = "16"', "page_size must be an int"),
    ("q_offset = 1.5", "q_offset must be an int"),
    ("devices = false", "devices must be an int"),
])
def test_bad_config_values_are_refused_at_load(tmp_path, extra, needle):
    cfg = _write(tmp_path, _ENTRY.replace('dtype = "float16"', f'dtype = "float16"\n{extra}'))
    with pytest.raises(ConfigError, match=needle) as e:
        load_config(cfg)
    assert "c.toml: workload[0] (w)" in str(e.value)


def test_a_required_int_given_a_bool_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"workload\[0\] \(w\): batch must be an int"):
        load_config(_write(tmp_path, _ENTRY.replace("batch = 1", "batch = true")))


def test_ragged_must_be_a_bool(tmp_path):
    cfg = _write(tmp_path, _ENTRY.replace('family = "decode"', 'family = "paged_decode"\npage_size = 16\nragged = 1'))
    with pytest.raises(ConfigError, match="ragged must be true or false"):
        load_config(cfg)


def test_a_bad_value_in_a_sweep_names_the_entry(tmp_path):
    cfg = _write(tmp_path, _ENTRY.replace('name = "w"', 'name = "w_c{causal}"\ncausal = [false, "yes"]'))
    with pytest.raises(ConfigError, match=r"workload\[0\]\.1 .*causal must be true or false"):
        load_config(cfg)


# ------------------------------------------------------------------------- 5. one line, exit code 2


def test_run_usage_errors_are_one_line_with_exit_code_2(tmp_path, capsys):
    bad_toml = _write(tmp_path, "[[workload]\nname = ", "bad.toml")
    not_dir = tmp_path / "file"
    not_dir.write_text("x")
    cases = [
        (["--config", "no_such_config"], "no_such_config"),
        (["--config", str(bad_toml)], "not valid TOML"),
        (["--config", "smoke", "--arch", "h999"], "h999"),
        (["--config", "smoke", "--only", "smoke_decode_f16", "--out", str(not_dir / "sub")], "cannot write"),
        (["--config", "smoke", "--reps", "0"], "--reps"),
    ]
    for argv, needle in cases:
        assert cli.main(["run", "--quiet", *argv]) == 2, argv
        assert needle in _one_error_line(capsys), argv


@pytest.mark.parametrize("argv, needle", [
    (["--gqa-group", "0"], "--gqa-group must be >= 1"),
    (["--kv-len", "0"], "--kv-len must be >= 1"),
    (["--q-len", "0"], "--q-len must be >= 1"),
    (["--gqa-group", "3"], "multiple of --gqa-group"),
    (["--arch", "h999"], "h999"),
    (["--generation", "v99_nope"], "v99_nope"),
    (["--generation", "v4_fused", "--gqa-group", "0"], "--gqa-group must be >= 1"),
])
def test_predict_usage_errors_are_one_line_with_exit_code_2(capsys, argv, needle):
    assert cli.main(["predict", "--shape", "1x8x128x64", *argv]) == 2
    assert needle in _one_error_line(capsys)


# ---------------------------------------------------------------------------------------- 6. Ctrl-C


def test_ctrl_c_keeps_every_finished_record(tmp_path, monkeypatch, capsys):
    real = runner._Run.run_one
    calls = {"n": 0}

    def run_one(self, w, impl, *a, **k):
        calls["n"] += 1
        if calls["n"] == 7:  # 4 torch backends per workload: mid-way through the second workload
            raise KeyboardInterrupt
        return real(self, w, impl, *a, **k)

    monkeypatch.setattr(runner._Run, "run_one", run_one)
    argv = ["run", "--config", "smoke", "--only", "smoke_decode_*", "--impl", "torch:*", "--quiet", "--no-ceilings",
            "--out", str(tmp_path)]
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    res = [r for r in _recs(tmp_path / "records.jsonl") if r["type"] == "result"]
    assert len(res) == 6  # 4 of the finished workload, 2 of the one in progress
    assert [r["workload"]["name"] for r in res] == ["smoke_decode_f16"] * 4 + ["smoke_decode_gqa_bf16"] * 2
    assert all(records.validate(r) == [] for r in res)
    assert "interrupted: 6 result records kept" in err and str(tmp_path / "records.jsonl") in err
