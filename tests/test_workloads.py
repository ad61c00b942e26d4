"""Workload configs: every shipped file loads; bad entries are clear errors naming file and entry."""

from pathlib import Path

import pytest

from compare.workloads import ConfigError, config_dir, load_config

SHIPPED = sorted(p.name for p in config_dir().glob("*.toml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load(name):
    ws = load_config(name)
    assert ws and all(w.heads_q % w.heads_kv == 0 for w in ws)


def test_required_workload_names_present():
    names = {w.name for w in load_config("default")}
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
