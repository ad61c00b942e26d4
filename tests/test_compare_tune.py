"""``python -m compare tune``: config grids as data (tune configs load, bad grids are errors naming file and entry),
each point an implementation with its overrides and launch plan, run through compare run's records."""

from __future__ import annotations

import pytest

from compare import cli, records, tune
from compare.workloads import ConfigError

_WL = ('[[workload]]\nname = "tiny_decode"\nfamily = "decode"\nbatch = 2\nheads_q = 4\nheads_kv = 2\nq_len = 1\n'
       'kv_len = 128\nhead_dim = 64\ndtype = "float16"\n\n')


def _write(tmp_path, grid: str, head: str = 'baselines = ["pallas:fa_decode:default"]\n') -> str:
    p = tmp_path / "tune_t.toml"
    p.write_text('description = "t"\n' + head + "\n" + _WL + grid)
    return str(p)


def test_shipped_tune_configs_load():
    ws, pts, base = tune.load_tune("tune_fa_decode")
    names = {p.name for p in pts}
    assert "pallas:fa_decode:default+block_k=64,num_warps=4,num_stages=4" in names
    assert "pallas:fa_decode:default+splits=264" in names and "pallas:fa_decode:default+occupancy=3" in names
    assert base == ["pallas:fa_decode:default", "jax:cudnn", "torch:cudnn"]
    assert {"decode_gqa_b32_s8192", "paged_gqa_b32_s8192_page16_ragged"} <= {w.name for w in ws}
    ws, pts, _ = tune.load_tune("tune_fa_decode_paged_splits")
    assert [dict(p.overrides)["splits"] for p in pts] == [1, 2, 3, 4, 5, 6, 8, 12, 16]
    assert all(p.config.splits == dict(p.overrides)["splits"] for p in pts)
    impls = tune.tune_impls(pts, ["pallas:fa_decode:default"])
    assert impls[0].name == "pallas:fa_decode:default" and impls[1].as_dict()["overrides"] == {"splits": 1}
    assert "overrides" not in impls[0].as_dict()  # compare's own implementations keep their record shape
    # fa_prefill's points take the model features its named configs take: the window grid's points run the window
    # (session 29's first run of it recorded every point "unsupported: does not implement window")
    ws, pts, base = tune.load_tune("tune_fa_prefill_window")
    assert all(w.window == 4096 for w in ws) and pts
    for imp in tune.tune_impls(pts, []):
        assert {"window", "softcap", "sinks", "packed"} <= set(imp.features), imp.name


@pytest.mark.parametrize("grid,msg", [
    ('[[grid]]\ngeneration = "fa_decode"\nblock_kk = [64]\n', "not fields of DecodeConfig"),
    ('[[grid]]\ngeneration = "fa_decode"\nblock_k = [48]\n', "block_k must be a power of two"),
    ('[[grid]]\ngeneration = "v99"\nsplits = [2]\n', "generation must name a generation built"),
    ('[[grid]]\ngeneration = "fa_decode"\nworkloads = ["nope*"]\nsplits = [2]\n', "matches no workload"),
    ('[[grid]]\ngeneration = "fa_decode"\nbase = "fastest"\nsplits = [2]\n', "base must be one of"),
    ('[[grid]]\ngeneration = "fa_decode"\nsplits = []\n', "empty list"),
    ('[[grid]]\ngeneration = "fa_decode"\nsplits = [2]\npoints = [{splits = 3}]\n', "also sets"),
    ("", "needs [[grid]] tables"),
])
def test_bad_grids_name_file_and_entry(tmp_path, grid, msg):
    with pytest.raises(ConfigError, match=msg.replace("[", r"\[")) as e:
        tune.load_tune(_write(tmp_path, grid))
    assert "tune_t.toml" in str(e.value)


def test_cli_errors_are_one_line(tmp_path, capsys):
    path = _write(tmp_path, '[[grid]]\ngeneration = "fa_decode"\nsplits = [2]\n', head='baselines = ["cudnn:*"]\n')
    assert cli.main(["tune", "--config", path, "--out", str(tmp_path / "o")]) == 2
    assert "baselines entry 'cudnn:*' matches no implementation" in capsys.readouterr().err
    assert cli.main(["tune", "--config", "no_such_tune", "--out", str(tmp_path / "o2")]) == 2


@pytest.mark.slow
def test_tune_runs_points_with_their_plans_on_cpu(tmp_path, capsys):
    path = _write(tmp_path, '[[grid]]\ngeneration = "fa_decode"\nsplits = [1, 2]\nblock_k = 32\n')
    out = tmp_path / "run"
    assert cli.main(["tune", "--config", path, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "tune summary" in text and "2 of 2 points agreed" in text
    recs = list(records.read_jsonl(out / "records.jsonl"))
    assert recs[0]["tune"]["baselines"] == ["pallas:fa_decode:default"] and len(recs[0]["tune"]["points"]) == 2
    res = {r["impl"]["name"]: r for r in recs if r["type"] == "result"}
    assert set(res) == {"pallas:fa_decode:default", "pallas:fa_decode:default+block_k=32,splits=1",
                        "pallas:fa_decode:default+block_k=32,splits=2"}
    for r in res.values():
        assert records.validate(r) == [] and r["status"] == "ok", r["reason"]
        assert r["agreement"]["rel_l2_err"] < 2e-3
    for s in (1, 2):
        r = res[f"pallas:fa_decode:default+block_k=32,splits={s}"]
        assert r["impl"]["overrides"] == {"splits": s, "block_k": 32}
        assert r["impl"]["config"] == f"default+block_k=32,splits={s}"
        assert r["impl"]["plan"]["splits"] == s and r["impl"]["plan"]["block_k"] == 32  # the point's own plan
        assert r["repro"].startswith("python -m compare tune --config")
    # a record's repro reruns exactly that point
    argv = r["repro"].split()[3:] + ["--out", str(tmp_path / "again"), "--quiet"]
    assert cli.main(argv) == 0
    again = [x for x in records.read_jsonl(tmp_path / "again" / "records.jsonl") if x["type"] == "result"]
    assert [x["impl"]["name"] for x in again] == [r["impl"]["name"]]
