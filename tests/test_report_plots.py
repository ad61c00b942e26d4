"""``compare report``'s per-workload bar charts (compare/report_bars.py) on small synthetic records written here: the
chart's data (bars fastest first, ours vs peers, the workload's layer-1 floor), the PNGs written and linked under
each workload's table on a GPU run and not with plots off, file names kept filesystem-safe, and a CPU-interpret run
saying why it has no timing plots. CPU only, no kernel runs."""

from __future__ import annotations

import re

import pytest

from compare import records, report, report_bars

H100 = "NVIDIA H100 80GB HBM3"
_KIND = {"pallas": "frontier", "cuda": "mirror", "torch": "peer", "jax": "peer", "jax-pallas": "peer"}


def _wl(name, **kw):
    w = {"name": name, "family": "prefill", "batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1024, "kv_len": 1024,
         "head_dim": 128, "dtype": "bfloat16", "causal": True, "page_size": None, "ragged": False, "kv_dtype": None}
    w.update(kw)
    return w


def _pred(floor_us, limiter="HBM", basis="measured"):
    return {"precision": "bf16", "basis": basis, basis: {"floor_us": floor_us, "limiter": limiter, "ai": 100.0}}


def _rec(run, w, impl, t=None, *, status="ok", reason=None, floor=None, gpu=H100, kind=None):
    fw = impl.split(":")[0]
    impl_d = {"name": impl, "framework": fw, "generation": impl.split(":")[1] if fw in ("pallas", "cuda") else None,
              "config": impl.split(":")[2] if impl.count(":") == 2 else None, "kind": kind or _KIND[fw], "plan": None}
    if gpu:
        m = {} if t is None else {"time_us_p50": t, "time_us_p10": t * 0.95, "time_us_p90": t * 1.05}
    else:  # a CPU-interpret run: its own key, never time_us_*
        m = {} if t is None else {**{k.split(".")[1]: None for k in records._TIMING_KEYS}, "cpu_interpret_us_p50": t}
    return {"schema": 1, "type": "result", "run_id": run,
            "env": {"gpu": gpu, "device_kind": "gpu" if gpu else "cpu-interpret", "versions": {}, "git_sha": "abc",
                    "git_sha_source": "git", "dirty": False},
            "workload": w, "impl": impl_d, "status": status, "reason": reason, "metrics": m,
            "agreement": {"max_abs_err": 1e-3, "rel_l2_err": 1e-3, "subset": None, "tol_rel_l2": 1e-2},
            "prediction": _pred(floor) if floor else None,
            "repro": "python -m compare run"}


def _header(run, gpu=H100):
    return {"schema": 1, "type": "header", "run_id": run, "argv": ["python", "-m", "compare", "run"],
            "env": {"gpu": gpu, "device_kind": "gpu" if gpu else "cpu-interpret", "versions": {}, "git_sha": "abc",
                    "git_sha_source": "git", "dirty": False}}


def _write(path, recs):
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_jsonl(path, recs)
    return path


A, B = _wl("prefill_a"), _wl("decode b/1 Tk:8k", family="decode", q_len=1)  # B's name is not filesystem-safe


def _gpu_run(run="20260101T000000_nvidia-h100"):
    return [
        _header(run),
        _rec(run, A, "torch:cudnn", 120.0, floor=80.0),
        _rec(run, A, "pallas:fa_prefill:default", 100.0, floor=90.0),  # our contract's own floor: not the workload's
        _rec(run, A, "cuda:v5_wmma", 150.0, floor=90.0),
        _rec(run, A, "jax-pallas:mha", 95.0, floor=80.0),  # a peer despite "pallas" in its name
        _rec(run, A, "jax:xla", 50.0, status="wrong", reason="rel L2 0.4", floor=80.0),  # timed, not ok: no bar
        _rec(run, A, "torch:flash", status="unsupported", reason="head dim", floor=80.0),
        _rec(run, B, "pallas:fa_decode:default", 30.0),  # no record of B carries a floor: no line
        _rec(run, B, "jax:cudnn", 40.0),
    ]


# ------------------------------------------------------------------------------------------- chart data


def test_bar_data_order_highlight_and_floor():
    recs = [r for r in _gpu_run() if r["type"] == "result" and r["workload"]["name"] == "prefill_a"]
    chart = report_bars.bar_data("prefill_a", recs, H100)
    assert [b.name for b in chart.bars] == ["jax-pallas:mha", "pallas:fa_prefill:default", "torch:cudnn",
                                            "cuda:v5_wmma"]  # fastest first; the wrong and unsupported have none
    assert [b.us for b in chart.bars] == [95.0, 100.0, 120.0, 150.0]
    assert [b.ours for b in chart.bars] == [False, True, False, True]
    assert (chart.bars[1].p10, chart.bars[1].p90) == (pytest.approx(95.0), pytest.approx(105.0))
    assert chart.floor_us == 80.0  # the peer model's floor, not our contract's 90
    assert (chart.floor.limiter, chart.floor.basis, chart.floor.source) == ("HBM", "measured", "peer model")
    assert chart.gpu == H100 and chart.workload == "prefill_a"


def test_floor_falls_back_to_the_smallest_and_is_absent_without_one():
    ours = [_rec("r", A, "pallas:fa_prefill:default", 10.0, floor=9.0), _rec("r", A, "cuda:v5_wmma", 12.0, floor=7.0)]
    f = report_bars.workload_floor(ours)
    assert f is not None and f.us == 7.0 and f.source == "smallest implementation floor"
    # a refused peer still carries the workload's prediction, and it wins
    peer = _rec("r", A, "torch:flash", status="unsupported", reason="x", floor=8.0)
    assert report_bars.workload_floor([*ours, peer]).us == 8.0
    assert report_bars.bar_data("a", [_rec("r", A, "pallas:fa_prefill:default", 10.0)]).floor is None


def test_ours_is_the_impl_kind_with_the_name_as_fallback():
    assert report_bars.is_ours(_rec("r", A, "pallas:auto", 1.0, kind="auto"))
    assert not report_bars.is_ours(_rec("r", A, "jax-pallas:mgpu", 1.0))
    old = _rec("r", A, "cuda:v5_wmma", 1.0)
    del old["impl"]["kind"]
    assert report_bars.is_ours(old)
    old_peer = _rec("r", A, "jax-pallas:mha", 1.0)
    del old_peer["impl"]["kind"]
    assert not report_bars.is_ours(old_peer)


def test_file_names_are_filesystem_safe_and_distinct():
    assert report_bars.bars_filename("r1", "prefill_a") == "bars_r1_prefill_a.png"
    odd = report_bars.bars_filename("r1", "decode b/1 Tk:8k")
    assert re.fullmatch(r"bars_r1_decode-b-1-Tk-8k-[0-9a-f]{6}\.png", odd)
    assert odd != report_bars.bars_filename("r1", "decode b 1 Tk 8k")  # same slug, different workloads


# ------------------------------------------------------------------------------------------- rendering


def test_gpu_run_writes_and_links_a_bar_chart_per_workload(tmp_path):
    pytest.importorskip("matplotlib")
    run = "20260101T000000_nvidia-h100"
    path = _write(tmp_path / "run" / "records.jsonl", _gpu_run(run))
    out = tmp_path / "run" / "results.md"
    img = tmp_path / "run" / "img"
    written = report.render([path], out, img)
    pa = img / f"bars_{run}_prefill_a.png"
    pb = img / report_bars.bars_filename(run, B["name"])
    for p in (pa, pb):
        assert p in written and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5_000
    assert "/" not in pb.name and " " not in pb.name and ":" not in pb.name
    md = out.read_text()
    link_a = f"![kernel time per implementation, prefill_a](img/{pa.name})"
    link_b = f"![kernel time per implementation, {B['name']}](img/{pb.name})"
    assert md.count(link_a) == 1 and md.count(link_b) == 1
    # each link sits in its own workload's section, right under that workload's table
    sec_a, sec_b = md.index("### prefill_a"), md.index(f"### {B['name']}")
    assert sec_a < md.index(link_a) < sec_b < md.index(link_b)
    before_a = md[sec_a:md.index(link_a)].rstrip().splitlines()
    assert before_a[-1].startswith("| jax:xla | wrong |")  # the table's last row (ok first, then wrong), then it
    assert md.index(link_a) < md.index("- unsupported: torch:flash — head dim") < sec_b  # refusals under the chart
    assert "No timing plots for this run" not in md


def test_plots_off_writes_no_bar_chart(tmp_path):
    path = _write(tmp_path / "run" / "records.jsonl", _gpu_run())
    out = tmp_path / "run" / "results.md"
    written = report.render([path], out, tmp_path / "run" / "img", plots=False)
    assert written == [out]
    assert not (tmp_path / "run" / "img").exists()
    assert "bars_" not in out.read_text()


def test_cpu_run_says_why_and_writes_no_bar_chart(tmp_path):
    run = "cpu1"
    recs = [_header(run, gpu=None),
            _rec(run, A, "pallas:fa_prefill:default", 5000.0, gpu=None, floor=90.0),
            _rec(run, A, "torch:cudnn", status="unavailable", reason="no CUDA GPU", gpu=None, floor=80.0)]
    for r in recs:
        assert r["type"] != "result" or records.validate(r) == []  # a well-formed CPU record
    path = _write(tmp_path / "run" / "records.jsonl", recs)
    out = tmp_path / "run" / "results.md"
    written = report.render([path], out, tmp_path / "run" / "img")
    assert written == [out] and not (tmp_path / "run" / "img").exists()
    md = out.read_text()
    assert "## Run `cpu1` (CPU interpret)" in md
    assert report.CPU_NO_PLOTS in md
    assert "CPU interpret mode times the Pallas interpreter, not a kernel" in md and "run on a GPU" in md
    assert md.index("## Run `cpu1`") < md.index(report.CPU_NO_PLOTS) < md.index("### prefill_a")
    assert "bars_" not in md and "![" not in md


def test_runs_with_many_workloads_get_no_bar_charts(tmp_path, monkeypatch):
    """Above BARS_MAX_WORKLOADS workloads in a run (a sweep), no per-workload charts and one line saying why."""
    monkeypatch.setattr(report, "BARS_MAX_WORKLOADS", 0)
    path = _write(tmp_path / "run" / "records.jsonl", _gpu_run())
    out = tmp_path / "run" / "results.md"
    written = report.render([path], out, tmp_path / "run" / "img")
    md = out.read_text()
    assert "Per-workload bar charts skipped" in md and "bars_" not in md
    assert not any(p.name.startswith("bars_") for p in written)
