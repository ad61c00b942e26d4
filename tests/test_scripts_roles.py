"""scripts/ holds probes and tools only; every benchmark is a compare config (issue 26 item 5).

Every file in scripts/ declares its role: a module-level ``ROLE = "probe"`` or ``ROLE = "tool"`` in a Python script
(read with ``ast``, nothing imported), a ``# ROLE: tool`` line in a shell script. A probe measures something compare
has no workload form for (a collective alone, a read ceiling at a workload's bytes, one piece of a call); a tool builds,
checks, profiles or reads records. A kernel benchmark belongs in ``configs/*.toml``. ``PENDING`` names the scripts
that still time what compare could (``ROLE = "benchmark"``), each with why; an entry whose script became a probe or
tool fails here, so the list only shrinks. Then the two probes that replaced ``bench_context_parallel.py`` and
``bench_quant_decode.py``, run in their ``--smoke`` CPU modes: records in compare's schema (``records.validate``),
the right kinds, finite values.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compare import records

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
ROLES = ("probe", "tool")
PENDING = {  # script: why it still benchmarks (issue 26 item 5 left them for a later session)
    "ring_probe.py": "its 'ring step' and 'drop-in step' rows time what configs/ring_train.toml runs (the forward, "
                     "pre-sharded and one-block rows have no compare form), on its own host clock",
    "time_cuda_paged.py": "the CUDA paged twins on the reference's sweeps, which configs/paged_gqa.toml runs "
                          "(cuda:*), on its own torch.profiler clock; only its num_sm=40 arm has no compare form",
}


def _py_role(path: Path) -> str | None:
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "ROLE" and isinstance(node.value, ast.Constant)):
            return node.value.value
    return None


def _sh_role(path: Path) -> str | None:
    m = re.search(r"^# ROLE: (\w+)", path.read_text(), re.M)
    return m.group(1) if m else None


def _roles() -> dict[str, str | None]:
    out = {}
    for p in sorted(SCRIPTS.iterdir()):
        if p.name.startswith(".") or p.name == "__pycache__":
            continue
        out[p.name] = _py_role(p) if p.suffix == ".py" else _sh_role(p) if p.suffix == ".sh" else "unknown kind"
    return out


def test_every_script_declares_a_probe_or_tool_role():
    roles = _roles()
    assert roles, "scripts/ is empty?"
    bad = {n: r for n, r in roles.items() if n not in PENDING and r not in ROLES}
    assert not bad, (f"scripts/ keeps probes and tools only; these declare no such role: {bad}. A benchmark is a "
                     "compare config (configs/*.toml); a probe or tool says so with ROLE = 'probe' / 'tool' "
                     "(docs/compare.md, 'scripts/')")


def test_pending_benchmarks_only_shrink():
    roles = _roles()
    for name in PENDING:
        assert name in roles, f"{name} is gone: take it out of PENDING"
        assert roles[name] == "benchmark", f"{name} now declares {roles[name]!r}: take it out of PENDING"


def test_the_replaced_benchmarks_are_gone():
    for old in ("bench_context_parallel.py", "bench_quant_decode.py", "bench_dropin.py", "bench_fa_prefill.py"):
        assert not (SCRIPTS / old).exists(), old
    assert not [n for n in _roles() if n.startswith("bench_")]


def test_a_probe_record_is_checked_like_a_result():
    w = records.ProbeWriter("unit_probe", None, [], {})
    t = type("T", (), {"stats": {"p10": 1.0, "p50": 2.0, "p90": 3.0, "min": 1.0, "mean": 2.0, "n": 3},
                       "clock": "host-wall", "l2_flushed": False, "notes": ()})()
    rec = w.emit("k", {"name": "x"}, w.timing_metrics(t))
    assert records.validate(rec) == []
    assert records.validate({**rec, "kind": None}) == ["probe record needs kind"]
    bad = {**rec, "metrics": {**rec["metrics"], **{k: float("nan") for k in rec["metrics"] if k.endswith("_p50")}}}
    assert records.validate(bad)
    on_gpu = {**rec, "env": {**rec["env"], "device_kind": "gpu"}}  # a GPU record's times sit under time_us_*
    assert records.validate(on_gpu) == ["probe record needs finite metrics.time_us_p10/p50/p90; got [None, None, None]"]


def _run_probe(script: str, tmp_path: Path, devices: int | None = None) -> list[dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices} {os.environ.get('XLA_FLAGS', '')}".strip()
    r = subprocess.run([sys.executable, str(SCRIPTS / script), "--smoke", "--out", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    recs = list(records.read_jsonl(tmp_path / "records.jsonl"))
    assert recs[0]["type"] == "header" and recs[0]["probe"] == script[:-3]
    for rec in recs:
        assert records.validate(rec) == [], (rec.get("kind"), records.validate(rec))
        assert rec["run_id"] == recs[0]["run_id"] and rec["env"]["device_kind"] == "cpu-interpret"
    body = recs[1:]
    assert body and all(r["type"] == "probe" for r in body)
    for rec in body:  # the CPU's numbers are labelled, never time_us_*
        m = rec["metrics"]
        assert "time_us_p50" not in m
        assert all(math.isfinite(m[f"cpu_interpret_us_{p}"]) for p in ("p10", "p50", "p90", "min", "mean"))
        assert rec["repro"].startswith(f"PYTHONPATH=. python scripts/{script}")
    json.dumps(recs)
    return body


@pytest.mark.slow
def test_cp_merge_probe_smoke_on_four_virtual_devices(tmp_path):
    body = _run_probe("cp_merge_probe.py", tmp_path, devices=4)
    merges = {(r["workload"]["devices"], r["workload"]["merge"]) for r in body if r["kind"] == "cp_merge"}
    assert merges == {(n, m) for n in (1, 2, 4) for m in ("all_gather", "psum", "packed")}
    local = [r for r in body if r["kind"] == "cp_local"]
    assert sorted(r["workload"]["devices"] for r in local) == [1, 2, 4]
    assert {r["kind"] for r in body} == {"cp_merge", "cp_local"}
    for r in body:
        assert r["workload"]["name"] == f"cp_smoke_b2_s512_dev{r['workload']['devices']}"  # configs/cp_decode.toml's
        assert r["metrics"]["clock"] == "host-wall:in-jit-loop-diff"
    assert all(r["workload"]["keys_per_device"] * r["workload"]["devices"] == 512 for r in local)


@pytest.mark.slow
def test_quant_read_ceiling_probe_smoke(tmp_path):
    body = _run_probe("quant_read_ceiling_probe.py", tmp_path)
    assert {r["kind"] for r in body} == {"read_ceiling"}
    by = {r["workload"]["kv_dtype"]: r["metrics"] for r in body}
    assert set(by) == {"fp16", "fp8_e4m3", "nvfp4"}
    elems = 2 * 2 * 256 * 8 * 128  # K + V at B2 S256 Hkv8 D128
    assert by["fp16"]["bytes"] == elems * 2
    assert by["fp8_e4m3"]["bytes"] == elems + 8
    assert by["nvfp4"]["bytes"] == elems * 0.5625 + 8
    assert all(m["clock"] == "cpu-interpret" and m["tb_s"] > 0 and math.isfinite(m["tb_s"]) for m in by.values())
