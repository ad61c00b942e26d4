"""scripts/ holds probes and tools only; every benchmark is a compare config (issue 26 item 5).

Every file in scripts/ declares its role: a module-level ``ROLE = "probe"`` or ``ROLE = "tool"`` in a Python script
(read with ``ast``, nothing imported), a ``# ROLE: tool`` line in a shell script. A probe measures something compare
has no workload form for (a collective alone, a read ceiling at a workload's bytes, one piece of a call); a tool builds,
checks, profiles or reads records. A kernel benchmark belongs in ``configs/*.toml``: a script that declares anything
else (``ROLE = "benchmark"`` included) or nothing fails here, and a synthetic scripts/ shows the check can fail. Then
the probes that replaced ``bench_context_parallel.py``, ``bench_quant_decode.py`` and ``ring_probe.py``'s benchmark
rows, run in their ``--smoke`` CPU modes: records in compare's schema (``records.validate``), the right kinds, finite
values. Last, what the configs took over from the removed benchmarks: every point ``time_cuda_paged.py`` timed is a
``cuda:*`` pair of ``configs/paged_gqa.toml`` (its 40-SM arm: the same pairs under ``$CUDA_REF_NUM_SM``), and every
benchmark row ``ring_probe.py`` had is a pair of ``configs/ring_train.toml``.
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


def _py_role(path: Path) -> str | None:
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "ROLE" and isinstance(node.value, ast.Constant)):
            return node.value.value
    return None


def _sh_role(path: Path) -> str | None:
    m = re.search(r"^# ROLE: (\w+)", path.read_text(), re.M)
    return m.group(1) if m else None


def _roles(folder: Path = SCRIPTS) -> dict[str, str | None]:
    out = {}
    for p in sorted(folder.iterdir()):
        if p.name.startswith(".") or p.name == "__pycache__":
            continue
        out[p.name] = _py_role(p) if p.suffix == ".py" else _sh_role(p) if p.suffix == ".sh" else "unknown kind"
    return out


def _not_probe_or_tool(roles: dict[str, str | None]) -> dict[str, str | None]:
    return {n: r for n, r in roles.items() if r not in ROLES}


def test_every_script_declares_a_probe_or_tool_role():
    roles = _roles()
    assert roles, "scripts/ is empty?"
    bad = _not_probe_or_tool(roles)
    assert not bad, (f"scripts/ keeps probes and tools only; these declare no such role: {bad}. A benchmark is a "
                     "compare config (configs/*.toml); a probe or tool says so with ROLE = 'probe' / 'tool' "
                     "(docs/compare.md, 'scripts/')")


def test_the_role_check_fails_a_benchmark(tmp_path):
    """The check above on a synthetic scripts/: a declared benchmark, a script without a role and an unknown kind of
    file fail; a probe and a shell tool pass."""
    (tmp_path / "bench_x.py").write_text('"""A benchmark."""\nROLE = "benchmark"\n')
    (tmp_path / "silent.py").write_text("x = 1\n")
    (tmp_path / "p.py").write_text('ROLE = "probe"\n')
    (tmp_path / "t.sh").write_text("#!/bin/sh\n# ROLE: tool\n")
    (tmp_path / "notes.txt").write_text("")
    assert _not_probe_or_tool(_roles(tmp_path)) == {"bench_x.py": "benchmark", "silent.py": None,
                                                    "notes.txt": "unknown kind"}


def test_the_replaced_benchmarks_are_gone():
    for old in ("bench_context_parallel.py", "bench_quant_decode.py", "bench_dropin.py", "bench_fa_prefill.py",
                "time_cuda_paged.py"):
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


@pytest.mark.slow
def test_ring_probe_smoke_on_four_virtual_devices(tmp_path):
    """The ring's forward on three input placements and its step on two, on 1, 2 and 4 devices, named as
    configs/ring_train.toml's smoke rows; each agrees with one device's drop-in (output and gradients)."""
    body = _run_probe("ring_probe.py", tmp_path, devices=4)
    rows = {(r["kind"], r["workload"]["inputs"], r["workload"]["devices"]) for r in body}
    assert rows == ({("ring_forward", w, n) for w in ("device0", "mesh", "striped") for n in (1, 2, 4)}
                    | {("ring_step", w, n) for w in ("device0", "striped") for n in (1, 2, 4)})
    assert len(body) == len(rows)
    for r in body:
        wl, m = r["workload"], r["metrics"]
        assert wl["name"] == f"ring_smoke_t64_dev{wl['devices']}" and wl["q_len"] == wl["kv_len"] == 64
        assert wl["family"] == ("train" if r["kind"] == "ring_step" else "prefill") and wl["layout"] == "striped"
        assert m["clock"] == "cpu-interpret"
        errs = [m["out_rel_l2"]] + ([m[f"d{x}_rel_l2"] for x in "qkv"] if r["kind"] == "ring_step" else [])
        assert all(0 <= e < 1e-4 for e in errs), (r["kind"], wl["inputs"], wl["devices"], errs)


def _gpu_plan(config: str) -> dict[tuple, list[str]]:
    """``(family, impl, batch, heads_q, heads_kv, q_len, kv_len, head_dim, dtype, page_size, devices) -> [workload
    names]`` of every (workload, implementation) pair the config runs that an H100 supports (causal and ragged
    workloads left out: the removed benchmarks timed neither, except the ring's causal training)."""
    from compare import impls, runner
    from compare.schema import Ctx
    from compare.workloads import load_config

    gpu = Ctx(jax_gpu=True, torch_cuda=True, hopper=True, interpret=False)
    out: dict[tuple, list[str]] = {}
    for w, lst in runner.make_plan(load_config(config), impls.all_impls(), [], []):
        if w.ragged or w.window is not None or w.features:
            continue
        for i in lst:
            s = i.supports(w, gpu)
            if s.ok or s.status == "unavailable" and "devices" in s.reason:  # this process has one device
                key = (w.family, i.name, w.batch, w.heads_q, w.heads_kv, w.q_len, w.kv_len, w.head_dim, w.dtype,
                       w.page_size, w.devices, bool(w.causal))
                out.setdefault(key, []).append(w.name)
    return out


def _time_cuda_paged_points() -> list[tuple]:
    """Every (gen, B, Hq, Hkv, N_k, D, num_sm) scripts/time_cuda_paged.py timed (git 9b07287 has it: fp16, page 256,
    uniform lengths, non-causal decode; num_sm 0 = the device's), 262 in all."""
    paged = ("v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")
    pts = []
    for d in (64, 128):
        for sm in (0, 40):
            pts += [("v6_splitkv", 1, 8, 8, 8192, d, sm), ("v7_paged", 1, 8, 8, 8192, d, sm)]
        pts += [("v7_paged", b, 8, 8, 8192, d, 0) for b in (1, 8, 16, 32, 64)]
        for sm in (0, 40):
            pts += [(gen, 1, 32, 32 // g, 8192, d, sm) for g in (1, 2, 4, 8, 16, 32) for gen in paged
                    if gen != "v7_paged" or g == 1]
        pts += [(gen, b, 8, 1, 8192, d, 0) for b in (1, 8, 16, 32, 64) for gen in paged[1:]]
    for gen in paged[1:]:
        pts += [(gen, 1, 8, 1, n_k, 128, 0) for n_k in (32768, 65536, 131072)]
        pts += [(gen, b, 8, 1, 32768, 128, 0) for b in (8, 32, 64)]
    return pts


def test_paged_gqa_runs_every_point_time_cuda_paged_timed(monkeypatch):
    """scripts/time_cuda_paged.py (removed in issue 26 item 5) timed the CUDA paged twins on the reference's sweeps;
    configs/paged_gqa.toml runs each of its points as a cuda:* pair, and its 40-SM arm is the same pairs under
    CUDA_REF_NUM_SM=40, whose plan the record carries (num_sm 40, cuda_ref's split plan at 40 SMs)."""
    import cuda_ref
    from compare import impls
    from compare.schema import Ctx
    from compare.workloads import load_config

    cpu = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)
    pts = _time_cuda_paged_points()
    assert len(pts) == 262  # its record count (results/paged_gqa/20261122_h100/paged_times.jsonl: 262 lines)
    plan = _gpu_plan("paged_gqa")
    missing, where = [], {}
    for gen, b, hq, hkv, n_k, d, sm in pts:
        fam, page = ("decode", None) if gen == "v6_splitkv" else ("paged_decode", 256)
        names = plan.get((fam, f"cuda:{gen}", b, hq, hkv, 1, n_k, d, "float16", page, 1, False))
        if not names:
            missing.append((gen, b, hq, hkv, n_k, d, sm))
        else:
            where[(gen, b, hq, hkv, n_k, d, sm)] = names[0]
    assert not missing, f"configs/paged_gqa.toml lost {len(missing)} of time_cuda_paged's points: {missing[:8]}"
    monkeypatch.setenv("CUDA_REF_NUM_SM", "40")
    wls = {w.name: w for w in load_config("paged_gqa")}
    by_name = {i.name: i for i in impls.all_impls()}
    for (gen, b, hq, hkv, n_k, d, sm), name in where.items():
        if sm != 40:
            continue
        plan40 = by_name[f"cuda:{gen}"].plan(wls[name], cpu)  # the variable alone sets it: no GPU asked
        if gen == "v6_splitkv":
            want = cuda_ref.choose_splits(bh=b * hq, n_q=1, n_k=n_k, num_sm=40)
        else:
            want = cuda_ref.api.split_plan(gen, batch=b, h_q=hq, h_kv=hkv, n_q=1, n_k=n_k, head_dim=d, num_sm=40)
        assert (plan40["num_sm"], plan40["splits"], plan40["chunk"]) == (40, *want), (gen, name, plan40)


def test_ring_train_runs_every_benchmark_row_ring_probe_had():
    """scripts/ring_probe.py's benchmark rows (issue 26 item 5 moved them): one GPU's drop-in step at N (pallas:auto,
    pallas:dropin:wide) and its forward (pallas:auto, prefill), the ring's step on 1, 2, 4 devices
    (pallas:ring:striped, inputs on the mesh), one block's step and forward at N/2 and N/4 (pallas:auto); B1 Hq32
    Hkv8 D128 bf16 causal, N 32k and 128k. What the probe keeps (the forward and other input placements) has no
    pair."""
    plan = _gpu_plan("ring_train")

    def has(fam, impl, n, devices=1):
        return (fam, impl, 1, 32, 8, n, n, 128, "bfloat16", None, devices, True) in plan

    for n in (32768, 131072):
        assert has("train", "pallas:auto", n) and has("train", "pallas:dropin:wide", n)
        assert has("prefill", "pallas:auto", n)
        for dev in (1, 2, 4):
            assert has("train", "pallas:ring:striped", n, dev)
            assert has("train", "pallas:auto", n // dev) and has("prefill", "pallas:auto", n // dev)
