"""``compare run --jobs K`` (compare/lanes.py): the GPU lock between processes, the shared counter, the lanes'
command lines, the merge, and one CPU run over two lanes against the same run in one process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from compare import cli, lanes, runner
from compare.workloads import UsageError

ROOT = Path(__file__).resolve().parents[1]


def _child(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env)


def _wait_file(p: Path, timeout: float = 30.0) -> None:
    t0 = time.monotonic()
    while not p.exists():
        assert time.monotonic() - t0 < timeout, f"{p} never appeared"
        time.sleep(0.02)


def test_exclusive_waits_for_another_process_shared_section(tmp_path):
    lock_path, held, log = tmp_path / "gpu.lock", tmp_path / "held", tmp_path / "log"
    child = _child(f"""
        import time
        from compare.lanes import GpuLock
        lk = GpuLock({str(lock_path)!r})
        with lk.shared():
            open({str(held)!r}, "w").close()
            time.sleep(0.6)
            open({str(log)!r}, "w").write(repr(time.time()))
    """)
    try:
        _wait_file(held)
        lk = lanes.GpuLock(lock_path)
        with lk.exclusive():
            got = time.time()
            child_end = float(log.read_text())  # the child's section ended before this one began
        assert got >= child_end
        assert lk.waits()["exclusive"] > 0.2
    finally:
        assert child.wait(30) == 0


def test_shared_sections_of_two_processes_overlap(tmp_path):
    lock_path, held = tmp_path / "gpu.lock", tmp_path / "held"
    child = _child(f"""
        import time
        from compare.lanes import GpuLock
        lk = GpuLock({str(lock_path)!r})
        with lk.shared():
            open({str(held)!r}, "w").close()
            time.sleep(1.0)
    """)
    try:
        _wait_file(held)
        lk = lanes.GpuLock(lock_path)
        t0 = time.perf_counter()
        with lk.shared():
            waited = time.perf_counter() - t0
        assert waited < 0.5  # readers do not wait for readers
    finally:
        assert child.wait(30) == 0


def test_a_waiting_writer_holds_new_readers_back(tmp_path):
    """Writer first: while one process waits to time, another's new shared section waits behind it."""
    lock_path, held, wrote, read = (tmp_path / n for n in ("gpu.lock", "held", "wrote", "read"))
    reader = _child(f"""
        import time
        from compare.lanes import GpuLock
        lk = GpuLock({str(lock_path)!r})
        with lk.shared():
            open({str(held)!r}, "w").close()
            time.sleep(0.8)
    """)
    _wait_file(held)
    writer = _child(f"""
        import time
        from compare.lanes import GpuLock
        lk = GpuLock({str(lock_path)!r})
        with lk.exclusive():
            time.sleep(0.5)
            open({str(wrote)!r}, "w").write(repr(time.time()))
    """)
    try:
        time.sleep(0.3)  # the writer is now waiting for the first reader
        lk = lanes.GpuLock(lock_path)
        with lk.shared():
            read.write_text(repr(time.time()))
        assert float(read.read_text()) >= float(wrote.read_text())
    finally:
        assert reader.wait(30) == 0 and writer.wait(30) == 0


def test_lock_reentry_and_exclusive_inside_shared(tmp_path):
    lk = lanes.GpuLock(tmp_path / "gpu.lock")
    with lk.shared():
        assert lk.mode == "shared"
        with lk.shared():
            assert lk.mode == "shared"
        with lk.exclusive():
            assert lk.mode == "exclusive"
            with lk.shared():  # covered by the exclusive hold
                assert lk.mode == "exclusive"
        assert lk.mode == "shared"  # the shared hold is back
    assert lk.mode is None


def test_claim_hands_each_index_to_one_process(tmp_path):
    counter, outs = tmp_path / "next", [tmp_path / f"got{i}" for i in range(3)]
    kids = [_child(f"""
        from compare.lanes import claim
        got = [claim({str(counter)!r}) for _ in range(40)]
        open({str(o)!r}, "w").write(" ".join(map(str, got)))
    """) for o in outs]
    for k in kids:
        assert k.wait(60) == 0
    got = [int(x) for o in outs for x in o.read_text().split()]
    assert sorted(got) == list(range(120))


def test_claim_role_goes_to_one_lane(tmp_path):
    assert lanes.claim_role(tmp_path) is True
    assert lanes.claim_role(tmp_path) is False


def test_a_lane_stops_waiting_when_the_role_lane_is_gone(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / lanes.ROLE_FILE).write_text(gone.stdout.strip())  # a pid that has exited
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="ended without publishing"):
        lanes.wait_for(tmp_path / lanes.CEILINGS_FILE, timeout_s=30)
    assert time.monotonic() - t0 < 5
    (tmp_path / lanes.ROLE_FILE).write_text(str(os.getpid()))  # alive: waits, then times out
    with pytest.raises(RuntimeError, match="after 0.5 s"):
        lanes.wait_for(tmp_path / lanes.CEILINGS_FILE, timeout_s=0.5)
    lanes.publish(tmp_path / lanes.CEILINGS_FILE, {"lane": 0, "ceil": None})
    assert lanes.wait_for(tmp_path / lanes.CEILINGS_FILE) == {"lane": 0, "ceil": None}


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    runner.add_parser(sub)
    return sub.choices["run"]


def _dests() -> set[str]:
    return {a.dest for a in _run_parser()._actions if a.option_strings and a.dest != "help"}


def _parent_argv(tmp_path) -> list[str]:
    """Every option of ``compare run`` away from its default."""
    return ["--config", "smoke", "--only", "smoke_prefill*", "--only", "smoke_decode_f16", "--impl", "pallas:*",
            "--reps", "7", "--warmup", "2", "--rounds", "2", "--e2e-reps", "4", "--e2e-calls", "9",
            "--e2e-budget-s", "0.25", "--budget-s", "1.5", "--max-run-s", "100", "--clock", "events",
            "--allow-clock-fallback", "--arch", "h200", "--cpu-max-flops", "1000", "--no-ceilings", "--jobs", "3",
            "--compile-workers", "6", "--run-up-hold", "one", "--out", str(tmp_path / "o")]


def test_every_run_option_is_forwarded_to_the_lanes_or_set_by_the_parent(tmp_path):
    """Each option a lane takes from the parent is set away from its default in the test below, so a new option is
    checked there as soon as it exists (or named parent-only)."""
    parser = _run_parser()
    given = vars(parser.parse_args(_parent_argv(tmp_path)))
    defaults = {a.dest: a.default for a in parser._actions if a.option_strings}
    forwarded = _dests() - lanes.PARENT_ONLY
    assert {d for d in forwarded if given[d] == defaults[d]} == set(), "set them in _parent_argv"
    assert lanes.PARENT_ONLY - {"argv"} <= _dests()


def test_a_lane_repeats_the_parent_options(tmp_path):
    parent = runner.RunOptions.from_args(_run_parser().parse_args(_parent_argv(tmp_path)))
    cmd = lanes.lane_argv(parent, lane=1, lanes=3, lane_dir=tmp_path, run_id="rid", out=tmp_path / "lane1.jsonl",
                          pass_name="main", names_file=None, compile_workers=2)
    assert cmd[1:4] == ["-m", "compare", "run"]
    child = runner.RunOptions.from_args(_run_parser().parse_args(cmd[4:]))
    for dest in _dests() - lanes.PARENT_ONLY:
        assert getattr(child, dest) == getattr(parent, dest), dest
    assert (child.lane, child.lane_dir, child.run_id, child.jobs) == ("1/3", str(tmp_path), "rid", 1)
    assert child.compile_workers == 2 and child.quiet and child.out == str(tmp_path / "lane1.jsonl")


def test_lane_options_are_checked():
    with pytest.raises(UsageError, match="lane"):
        runner.RunOptions.from_args(_run_parser().parse_args(["--lane", "0/2"]))
    with pytest.raises(UsageError, match="0 <= i < K"):
        lanes.parse_lane("2/2")
    with pytest.raises(UsageError, match="i/K"):
        lanes.parse_lane("two")
    with pytest.raises(UsageError, match="jobs"):
        runner.RunOptions.from_args(_run_parser().parse_args(["--jobs", "0"]))


def test_jobs_refuses_append_and_look_ahead(tmp_path):
    for extra in (["--append"], ["--look-ahead"]):
        opts = runner.RunOptions.from_args(_run_parser().parse_args(
            ["--config", "smoke", "--jobs", "2", "--out", str(tmp_path / "x"), *extra]))
        with pytest.raises(UsageError, match="--jobs"):
            lanes.run_jobs(opts)


def _res(name, impl, status="ok"):
    return {"type": "result", "run_id": "r", "workload": {"name": name}, "impl": {"name": impl}, "status": status}


def _write(p: Path, recs):
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_merge_orders_by_plan_and_takes_reruns(tmp_path):
    d = tmp_path
    plan = ["a", "b", "c", "d"]
    _write(d / "lane0.jsonl", [{"type": "header", "run_id": "r", "options": {"lane": "0/2", "jobs": 1}},
                               _res("c", "x"), _res("c", "y"), _res("a", "x", "oom")])
    _write(d / "lane1.jsonl", [{"type": "header", "run_id": "r", "options": {"lane": "1/2"}}, _res("b", "x"),
                               _res("d", "x", "oom")])
    lanes.publish(d / lanes.CEILINGS_FILE, {"lane": 0, "records": [{"type": "ceilings", "run_id": "r"}]})
    (d / "done.main.0").write_text("c\na\n")
    (d / "done.main.1").write_text("b\nd\n")
    recs = [r for f in ("lane0.jsonl", "lane1.jsonl") for r in map(json.loads, (d / f).read_text().splitlines())]
    rerun = lanes.rerun_names(plan, recs, lanes.done_names(d, "main"))
    assert rerun == ["a", "d"]
    _write(d / "rerun.jsonl", [{"type": "header", "run_id": "r"}, _res("a", "x")])  # d's rerun never finished
    (d / "done.rerun.0").write_text("a\n")
    opts = argparse.Namespace(out=str(d), quiet=False, argv=["python", "-m", "compare", "run", "--jobs", "2"])
    merged, missing = lanes.merge(plan, [d / "lane0.jsonl", d / "lane1.jsonl"], d / "rerun.jsonl", rerun, d, opts, 2)
    assert missing == []
    assert [r["type"] for r in merged[:2]] == ["header", "ceilings"]
    got = [(r["workload"]["name"], r["impl"]["name"], r["status"]) for r in merged[2:]]
    # a: the rerun's record replaces the lane's oom; d: its rerun did not finish, so the lane's record stays
    assert got == [("a", "x", "ok"), ("b", "x", "ok"), ("c", "x", "ok"), ("c", "y", "ok"), ("d", "x", "oom")]
    h = merged[0]
    assert h["options"]["jobs"] == 2 and "lane" not in h["options"]
    assert h["lanes"]["rerun_alone"] == ["a", "d"] and h["lanes"]["rerun_unfinished"] == ["d"]


def test_merge_takes_each_workload_from_the_last_pass_that_finished_it(tmp_path):
    """Main lanes, then the second stage (2 lanes), then the pass alone: a from the second stage (its oom in a main
    lane replaced), b from the second stage (left by the main lanes), c from its main lane, d from the pass alone
    (left by both stages), e from its main lane (its second-stage run never finished)."""
    d = tmp_path
    plan = ["a", "b", "c", "d", "e"]
    _write(d / "lane0.jsonl", [{"type": "header", "run_id": "r", "options": {"lane": "0/3"}}, _res("a", "x", "oom"),
                               _res("c", "x")])
    _write(d / "lane1.jsonl", [{"type": "header", "run_id": "r", "options": {"lane": "1/3"}},
                               _res("e", "x", "oom")])
    lanes.publish(d / lanes.CEILINGS_FILE, {"lane": 0, "records": []})
    (d / "done.main.0").write_text("a\nc\n")
    (d / "done.main.1").write_text("e\n")
    recs = [r for f in ("lane0.jsonl", "lane1.jsonl") for r in map(json.loads, (d / f).read_text().splitlines())]
    left = lanes.rerun_names(plan, recs, lanes.done_names(d, "main"))
    assert left == ["a", "b", "d", "e"]
    _write(d / "stage20.jsonl", [{"type": "header", "run_id": "r"}, _res("a", "y"), _res("e", "y", "failed")])
    _write(d / "stage21.jsonl", [{"type": "header", "run_id": "r"}, _res("b", "y")])
    (d / "done.stage2.0").write_text("a\n")
    (d / "done.stage2.1").write_text("b\n")
    recs2 = [r for f in ("stage20.jsonl", "stage21.jsonl") for r in map(json.loads, (d / f).read_text().splitlines())]
    alone = lanes.rerun_names(left, recs2, lanes.done_names(d, lanes.STAGE2))
    assert alone == ["d", "e"]
    _write(d / "rerun.jsonl", [{"type": "header", "run_id": "r"}, _res("d", "z")])
    (d / "done.rerun.0").write_text("d\n")
    opts = argparse.Namespace(out=str(d), quiet=False, argv=[])
    merged, missing = lanes.merge(plan, [d / "lane0.jsonl", d / "lane1.jsonl"], d / "rerun.jsonl", alone, d, opts, 3,
                                  stage2=([d / "stage20.jsonl", d / "stage21.jsonl"], left))
    assert missing == []
    got = [(r["workload"]["name"], r["impl"]["name"], r["status"]) for r in merged[1:]]
    assert got == [("a", "y", "ok"), ("b", "y", "ok"), ("c", "x", "ok"), ("d", "z", "ok"), ("e", "x", "oom")]
    h = merged[0]["lanes"]
    assert h["second_stage"]["workloads"] == left and h["second_stage"]["unfinished"] == ["d", "e"]
    assert h["second_stage"]["jobs"] == lanes.SECOND_STAGE_LANES
    assert h["rerun_alone"] == ["d", "e"] and h["rerun_unfinished"] == ["e"]


def test_a_hand_set_lane_limit_scales_with_the_stage(monkeypatch):
    monkeypatch.setenv("PALLAS_ATTN_LANE_BYTES_LIMIT", "700000")
    assert lanes._lane_env(3)["PALLAS_ATTN_LANE_BYTES_LIMIT"] == "700000"
    assert lanes._lane_env(2, 3)["PALLAS_ATTN_LANE_BYTES_LIMIT"] == "1050000"
    assert lanes._lane_env(6, 6)["PALLAS_ATTN_LANE_BYTES_LIMIT"] == "700000"
    assert lanes._lane_env(2, 3)["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.450"


def test_a_clock_fallback_for_memory_reruns_the_workload():
    ok = _res("a", "x")
    why = ("requested cupti:mosaic, timed with host-wall: cupti:mosaic failed: JaxRuntimeError: RESOURCE_EXHAUSTED: "
           "Out of memory")
    fell = {**_res("b", "x"), "metrics": {"clock_fallback": why}}
    other = {**_res("c", "x"), "metrics": {"clock_fallback": "requested cupti, timed with events: no CUPTI"}}
    said = {**_res("d", "x", "failed"), "reason": "CUDA error: out of memory"}
    assert lanes.rerun_names(["a", "b", "c", "d"], [ok, fell, other, said], {"a", "b", "c", "d"}) == ["b", "d"]


def test_merge_names_workloads_no_lane_finished(tmp_path):
    d = tmp_path
    _write(d / "lane0.jsonl", [{"type": "header", "run_id": "r", "options": {}}, _res("a", "x")])
    (d / "done.main.0").write_text("a\n")
    opts = argparse.Namespace(out=str(d), quiet=False, argv=[])
    merged, missing = lanes.merge(["a", "b"], [d / "lane0.jsonl"], d / "rerun.jsonl", [], d, opts, 1)
    assert missing == ["b"]


def _strip(p: Path):
    out = []
    for r in map(json.loads, p.read_text().splitlines()):
        out.append((r["type"], (r.get("workload") or {}).get("name"), (r.get("impl") or {}).get("name"),
                    r.get("status"), (r.get("agreement") or {}).get("rel_l2_err"), r.get("run_id") is not None))
    return out


def test_a_lane_leaves_a_workload_too_large_for_its_memory_to_the_pass_alone():
    from compare.workloads import load_config

    ws = {w.name: w for w in load_config("sweep")}
    limit = int(0.15 * 79.18 * 2**30)  # an H100 lane of six (session 26)
    # session 26's 12 GB lanes: every decode workload with a 3 GiB cache ran, every one with 4 GiB ran out of memory
    assert not lanes.defer_alone(ws["sweep_decode_qwen2.5-7b_b128_s8192"], limit)  # 3 GiB of KV
    assert lanes.defer_alone(ws["sweep_decode_llama-3.1-8b_b128_s8192"], limit)  # 4 GiB
    assert not lanes.defer_alone(ws["sweep_prefill_llama-3.1-70b_n16384"], limit)
    assert not lanes.defer_alone(ws["sweep_decode_llama-3.1-8b_b128_s8192"], None)  # unknown limit: never
    # MLA and NVFP4 (``HEAVY_FACTOR``): what ran and what ran out of memory in H100 lanes (session 28) and H200 lanes
    # (0.15 of 139.8 GiB, session 37)
    for gpu_gib, ran, oom in (
            (79.18, ["sweep_mla_deepseek-v3_b32_s32768", "sweep_mla_deepseek-v3_ragged_b64_s32768",
                     "sweep_quant_llama-3.1-8b_nvfp4_b32_s8192"],
             ["sweep_mla_deepseek-v3_b64_s32768", "sweep_mla_deepseek-v2-lite_b64_s32768"]),
            (139.8, ["sweep_mla_deepseek-v3_b64_s32768", "sweep_mla_deepseek-v2-lite_b64_s32768",
                     "sweep_mla_deepseek-v3_ragged_b128_s32768", "sweep_quant_llama-3.1-8b_fp8_e4m3_b32_s32768",
                     "sweep_quant_llama-3.1-70b_nvfp4_b32_s8192"],
             ["sweep_mla_deepseek-v3_b128_s32768", "sweep_mla_deepseek-v2-lite_b128_s32768",
              "sweep_quant_llama-3.1-8b_nvfp4_b32_s32768", "sweep_quant_llama-3.1-70b_nvfp4_b32_s32768"])):
        lim = int(0.15 * gpu_gib * 2**30)
        assert not [n for n in ran if lanes.defer_alone(ws[n], lim)], gpu_gib
        assert all(lanes.defer_alone(ws[n], lim) for n in oom), gpu_gib


def test_a_cpu_run_over_two_lanes_writes_the_one_process_run(tmp_path):
    sel = ["--config", "smoke", "--only", "smoke_prefill*", "--only", "smoke_decode*", "--impl", "pallas:v1*",
           "--impl", "pallas:auto", "--quiet"]
    assert cli.main(["run", *sel, "--out", str(tmp_path / "one")]) == 0
    # a lane's memory set below smoke_decode_f16's estimate (1.8 MB): the lanes leave it to the pass alone
    env = dict(os.environ, PYTHONPATH=str(ROOT), PALLAS_ATTN_LANE_BYTES_LIMIT="1000000")
    got = subprocess.run([sys.executable, "-m", "compare", "run", *sel, "--jobs", "2", "--out", str(tmp_path / "two")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    assert "lane 0" in got.stdout and "lane 1" in got.stdout  # a progress line per workload
    one, two = _strip(tmp_path / "one" / "records.jsonl"), _strip(tmp_path / "two" / "records.jsonl")
    assert one == two
    recs = [json.loads(x) for x in (tmp_path / "two" / "records.jsonl").read_text().splitlines()]
    assert len({r["run_id"] for r in recs}) == 1  # one run
    assert recs[0]["lanes"]["jobs"] == 2
    assert recs[0]["lanes"]["rerun_alone"] == ["smoke_decode_f16"] and "left to a later pass" in got.stdout
    lanes_seen = {r["metrics"]["lane"]["lane"] for r in recs if r["type"] == "result" and r["status"] == "ok"}
    assert lanes_seen <= {"0/2", "1/2"} and lanes_seen
    assert (tmp_path / "two" / "lanes" / "lane0.jsonl").exists()


def test_one_run_up_hold_takes_the_shared_lock_fewer_times_for_the_same_records(tmp_path):
    """--run-up-hold one (a lane holds the shared GPU lock once over a workload's run-up, giving it up only for host
    work and timing) records what --run-up-hold each records, in fewer takes of the shared lock per workload
    (metrics.lane.lock_holds_shared, counted by the lock itself)."""
    sel = ["--config", "smoke", "--only", "smoke_prefill*", "--impl", "pallas:v1*", "--impl", "pallas:v4*",
           "--impl", "pallas:auto", "--quiet", "--jobs", "2"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    holds = {}
    for mode in ("each", "one"):
        got = subprocess.run([sys.executable, "-m", "compare", "run", *sel, "--run-up-hold", mode,
                              "--out", str(tmp_path / mode)], env=env, capture_output=True, text=True, timeout=600)
        assert got.returncode == 0, got.stderr[-2000:]
        recs = [json.loads(x) for x in (tmp_path / mode / "records.jsonl").read_text().splitlines()]
        by_w = {r["workload"]["name"]: r["metrics"]["lane"] for r in recs
                if r["type"] == "result" and isinstance(r.get("metrics"), dict) and r["metrics"].get("lane")}
        assert by_w and all(v["lock_holds_shared"] >= 1 for v in by_w.values()), by_w
        holds[mode] = by_w
    assert _strip(tmp_path / "each" / "records.jsonl") == _strip(tmp_path / "one" / "records.jsonl")
    assert holds["each"].keys() == holds["one"].keys()
    for w in holds["each"]:
        assert holds["one"][w]["lock_holds_shared"] < holds["each"][w]["lock_holds_shared"], (w, holds)


def test_a_cpu_run_over_three_lanes_passes_what_they_left_to_two_lanes_then_alone(tmp_path):
    """--jobs 3 with a lane's memory set by hand below both decode workloads' estimates (0.80 and 1.85 MB): the main
    lanes leave both; the second stage (2 lanes, 1.5x the share: 1.05 MB) runs the smaller one and leaves the other
    to the pass alone; the merged run is the one-process run's, record by record."""
    sel = ["--config", "smoke", "--only", "smoke_prefill*", "--only", "smoke_decode*", "--impl", "pallas:v1*",
           "--impl", "pallas:auto", "--quiet"]
    assert cli.main(["run", *sel, "--out", str(tmp_path / "one")]) == 0
    env = dict(os.environ, PYTHONPATH=str(ROOT), PALLAS_ATTN_LANE_BYTES_LIMIT="700000")
    got = subprocess.run([sys.executable, "-m", "compare", "run", *sel, "--jobs", "3", "--out",
                          str(tmp_path / "three")], env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    one, three = _strip(tmp_path / "one" / "records.jsonl"), _strip(tmp_path / "three" / "records.jsonl")
    assert one == three
    recs = [json.loads(x) for x in (tmp_path / "three" / "records.jsonl").read_text().splitlines()]
    h = recs[0]["lanes"]
    assert sorted(h["second_stage"]["workloads"]) == ["smoke_decode_f16", "smoke_decode_gqa_bf16"]
    assert h["second_stage"]["unfinished"] == ["smoke_decode_f16"] and h["rerun_alone"] == ["smoke_decode_f16"]
    passes = {r["workload"]["name"]: r["metrics"]["lane"]["pass"] for r in recs
              if r["type"] == "result" and (r.get("metrics") or {}).get("lane")}
    assert passes["smoke_decode_gqa_bf16"] == lanes.STAGE2 and passes["smoke_decode_f16"] == "rerun"
    assert set(passes.values()) == {"main", lanes.STAGE2, "rerun"}
    assert "over 2 lanes" in got.stdout


def test_every_pair_of_a_workload_whose_inputs_ran_out_of_memory_is_oom():
    """The first pair and the later ones alike (session 26 call 4: the later pairs said 'failed')."""

    class _Fake:
        def make_inputs(self, w, state):
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4.00GiB")

    state: dict = {}
    first = runner._Run.workload_inputs(_Fake(), None, state)
    later = runner._Run.workload_inputs(_Fake(), None, state)
    assert first.status == later.status == "oom"
    assert first.reason == later.reason and "Out of memory" in later.reason

    class _Broken:
        def make_inputs(self, w, state):
            raise ValueError("bad shape")

    state = {}
    assert runner._Run.workload_inputs(_Broken(), None, state).status == "failed"
    assert runner._Run.workload_inputs(_Broken(), None, state).status == "failed"


def test_released_lets_a_writer_in_during_host_only_work(tmp_path):
    lock_path, inside, done = tmp_path / "gpu.lock", tmp_path / "inside", tmp_path / "done"
    child = _child(f"""
        import time
        from compare.lanes import GpuLock
        lk = GpuLock({str(lock_path)!r})
        with lk.shared():
            with lk.released():
                assert lk.mode is None
                open({str(inside)!r}, "w").close()
                time.sleep(1.0)
            assert lk.mode == "shared"
            open({str(done)!r}, "w").write(repr(time.time()))
    """)
    try:
        _wait_file(inside)
        lk = lanes.GpuLock(lock_path)
        t0 = time.perf_counter()
        with lk.exclusive():
            waited = time.perf_counter() - t0
            held_at = time.time()
            time.sleep(0.3)
        assert waited < 0.5  # the child's host-only stretch does not hold the lock
    finally:
        assert child.wait(30) == 0
    assert float(done.read_text()) >= held_at  # the child's shared hold came back after the writer


def test_the_oracle_runs_its_numpy_inside_the_host_sections():
    import contextlib

    from compare import accuracy, interop
    from compare.workloads import load_config

    entered = []

    @contextlib.contextmanager
    def mark():
        entered.append(1)
        yield

    ws = {w.name: w for w in load_config("smoke")}
    w = ws["smoke_prefill_f16"]
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    plain = accuracy.oracle(w, inp, sub)
    with accuracy.host_sections(mark):
        got = accuracy.oracle(w, inp, sub)
    assert len(entered) >= 2  # the float64 pass and its check against attn_core
    assert (got == plain).all()
    assert accuracy._HOST_ONLY is contextlib.nullcontext  # restored


def test_agreement_programs_compile_from_shapes():
    from compare import accuracy
    from compare.workloads import load_config

    ws = {w.name: w for w in load_config("sweep")}
    assert accuracy.compile_checks(ws["sweep_prefill_gpt-2_n512"]) == 1
    assert accuracy.compile_checks(ws["sweep_train_gpt-2_n512"]) == 2
    assert accuracy.compile_checks(ws["sweep_mla_deepseek-v2-lite_b1_s2048"]) == 1


def test_a_lanes_compile_worker_runs_at_a_lower_cpu_priority(monkeypatch):
    """Compile workers of a lane start with their nice value raised (lanes.lower_thread_priority); the process's own
    thread keeps its priority; PALLAS_ATTN_LANE_COMPILE_NICE=0 leaves the worker as it was."""
    import concurrent.futures
    import threading

    def nice_of_worker():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    for env, want in (({}, min(19, base + lanes.COMPILE_NICE)), ({"PALLAS_ATTN_LANE_COMPILE_NICE": "0"}, base)):
        monkeypatch.delenv("PALLAS_ATTN_LANE_COMPILE_NICE", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        with concurrent.futures.ThreadPoolExecutor(1, initializer=lanes.lower_thread_priority) as pool:
            assert pool.submit(nice_of_worker).result() == want
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


def test_with_the_compile_lock_a_compile_on_any_thread_keeps_every_timing_window_out(tmp_path, monkeypatch):
    """PALLAS_ATTN_LANE_COMPILE_LOCK=1 (``GpuLock.compiling``): a compile on a worker thread holds the lock shared
    through file descriptions of its own, so another process's exclusive section waits for it, even while this
    process's main thread holds nothing; off (the default), ``compiling`` takes nothing and the writer walks in."""
    import threading

    lock_path, done = tmp_path / "gpu.lock", tmp_path / "done"
    lk = lanes.GpuLock(lock_path)
    for on in (True, False):
        monkeypatch.setenv("PALLAS_ATTN_LANE_COMPILE_LOCK", "1" if on else "0")
        inside, release = threading.Event(), threading.Event()

        def compile_job(inside=inside, release=release):
            with lk.compiling():
                inside.set()
                release.wait(10)

        th = threading.Thread(target=compile_job)
        th.start()
        assert inside.wait(10)
        done.unlink(missing_ok=True)
        child = _child(f"""
            from compare.lanes import GpuLock
            with GpuLock({str(lock_path)!r}).exclusive():
                open({str(done)!r}, "w").close()
        """)
        try:
            time.sleep(0.8)
            assert done.exists() is (not on)  # held out while the compile runs, only with the lock on
            assert lk.mode is None
        finally:
            release.set()
            th.join(10)
            assert child.wait(30) == 0
        assert done.exists()
    assert lk.waits().get("compile", 0.0) < 1.0
    monkeypatch.delenv("PALLAS_ATTN_LANE_COMPILE_LOCK")
    assert lanes.compile_under_lock() is lanes.COMPILE_UNDER_LOCK
