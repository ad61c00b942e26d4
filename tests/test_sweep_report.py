"""The model-shape sweep's report (compare/sweep_report.py, through ``python -m compare report``) on small
synthetic records written here: ratios and geomeans against hand-computed values, the worst case named, chips kept
apart, auto's missing records counted with their reasons, the verdicts at their bars, the heatmap, and the README
headline block (replaced idempotently, refused without its markers). CPU only, no kernel runs."""

from __future__ import annotations

import dataclasses
import math
import sys

import pytest

from compare import cli, records, report, sweep_report
from compare.sweep_report import END, START

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"


def _wl(name, *, model="llama", entry="prefill", family=None, **kw):
    fam = family or {"prefill": "prefill", "train": "train", "paged": "paged_decode", "mla": "mla"}.get(entry, "decode")
    w = {"name": name, "family": fam, "entry": entry, "model": model, "batch": 1, "heads_q": 8, "heads_kv": 8,
         "q_len": 1024, "kv_len": 1024, "head_dim": 128, "dtype": "bfloat16", "causal": True, "page_size": None,
         "ragged": False, "kv_dtype": None, "packed": False}
    w.update(kw)
    return w


_KIND = {"pallas:auto": "auto", "torch:cudnn": "peer", "jax:cudnn": "peer", "torch:flash": "peer", "fa3:mha": "peer",
         "fa3:kvcache": "peer", "pallas:chunked:dense": "twin"}


def _rec(run, gpu, w, impl, t=None, *, status="ok", reason=None, chose=None, overrides=None, roofline=None,
         sha="1234abc", dirty=False):
    kind = _KIND.get(impl, "frontier")
    fw = impl.split(":")[0]
    impl_d = {"name": impl, "framework": fw, "generation": impl.split(":")[1] if fw == "pallas" else None,
              "config": impl.split(":")[2] if impl.count(":") == 2 else None, "kind": kind,
              "plan": {"chose": chose} if chose else None}
    if overrides:
        impl_d["overrides"] = overrides
    m = {} if t is None else {"time_us_p50": t, "time_us_p10": t, "time_us_p90": t, "roofline_fraction": roofline}
    return {"schema": 1, "type": "result", "run_id": run,
            "env": {"gpu": gpu, "device_kind": "gpu" if gpu else "cpu-interpret", "versions": {}, "git_sha": sha,
                    "git_sha_source": "git", "dirty": dirty},
            "workload": w, "impl": impl_d, "status": status, "reason": reason, "metrics": m, "agreement": {},
            "repro": "python -m compare run"}


def _header(run, gpu, sha="1234abc"):
    return {"schema": 1, "type": "header", "run_id": run, "argv": ["python", "-m", "compare", "run"],
            "env": {"gpu": gpu, "device_kind": "gpu", "versions": {}, "git_sha": sha, "git_sha_source": "git",
                    "dirty": False}}


def _write(path, recs):
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_jsonl(path, recs)
    return path


def _collect(*paths):
    return sweep_report.collect(report.load_runs(list(paths)))


def _prefill_run(run="r1", gpu=H100, sha="1234abc"):
    """Three prefill workloads, two models. By hand: vs peer 0.9, 1.1 (llama), 0.5 (gpt); vs named 90/88,
    110/100, 50/50."""
    a, b, c = (_wl("p_llama_n1024"), _wl("p_llama_n2048", q_len=2048, kv_len=2048),
               _wl("p_gpt_n1024", model="gpt"))
    return [
        _header(run, gpu, sha),
        _rec(run, gpu, a, "pallas:auto", 90.0, chose="fa_prefill:default", sha=sha),
        _rec(run, gpu, a, "torch:cudnn", 100.0, sha=sha),
        _rec(run, gpu, a, "jax:cudnn", 120.0, sha=sha),
        _rec(run, gpu, a, "torch:flash", 1.0, status="wrong", reason="rel L2 0.5", sha=sha),  # not ok: no peer time
        _rec(run, gpu, a, "pallas:fa_prefill:default", 92.0, sha=sha),
        _rec(run, gpu, a, "pallas:fa_prefill:wide", 88.0, sha=sha),
        _rec(run, gpu, a, "pallas:fa_prefill:default+block=64", 10.0, overrides={"block": 64}, sha=sha),  # tuning
        _rec(run, gpu, b, "pallas:auto", 110.0, chose="fa_train:default", sha=sha),
        _rec(run, gpu, b, "torch:cudnn", 130.0, sha=sha),
        _rec(run, gpu, b, "jax:cudnn", 100.0, sha=sha),
        _rec(run, gpu, b, "pallas:fa_train:default", 100.0, sha=sha),
        _rec(run, gpu, c, "pallas:auto", 50.0, sha=sha),
        _rec(run, gpu, c, "torch:cudnn", 100.0, sha=sha),
        _rec(run, gpu, c, "pallas:fa_prefill:default", 50.0, sha=sha),
    ]


# --------------------------------------------------------------------------------------- ratios by hand


def test_ratios_geomeans_and_worst_by_hand(tmp_path):
    path = _write(tmp_path / "r" / "records.jsonl", _prefill_run())
    by_chip, notes = _collect(path)
    assert list(by_chip) == [H100] and notes == {"replaced": 0, "cpu": 0, "no_auto_later": 0, "named_earlier": 0}
    res = {r.name: r for r in by_chip[H100]}
    assert res["p_llama_n1024"].peer == ("torch:cudnn", 100.0)  # the wrong torch:flash at 1 µs is not a peer time
    assert res["p_llama_n1024"].named == ("pallas:fa_prefill:wide", 88.0)  # the tuning point at 10 µs is not named
    assert res["p_llama_n2048"].peer == ("jax:cudnn", 100.0)

    llama = sweep_report.aggregate([r for r in by_chip[H100] if r.model == "llama"])
    assert llama.n == 2
    assert llama.peer_geomean == pytest.approx(math.sqrt(0.9 * 1.1))
    assert llama.peer_worst == pytest.approx((1.1, "p_llama_n2048"))
    assert llama.named_geomean == pytest.approx(math.sqrt(90 / 88 * 110 / 100))

    every = sweep_report.aggregate(by_chip[H100])
    assert every.peer_geomean == pytest.approx((0.9 * 1.1 * 0.5) ** (1 / 3))
    assert every.named_geomean == pytest.approx((90 / 88 * 1.1 * 1.0) ** (1 / 3))
    assert every.named_worst == pytest.approx((1.1, "p_llama_n2048"))
    assert every.near == 2 and every.with_named == 3  # 90/88 = 1.023 and 1.0 within 3%; 1.1 not
    assert every.best_peers == {"torch:cudnn": 2, "jax:cudnn": 1}

    out = tmp_path / "out" / "results.md"
    report.render([path], out, tmp_path / "out" / "img", plots=False)
    md = out.read_text()
    g = (0.9 * 1.1 * 0.5) ** (1 / 3)
    all_row = next(line for line in md.splitlines() if line.startswith("| **all models** |"))
    assert f"| {g:.3f}× | 1.100× (p_llama_n2048) |" in all_row and "torch:cudnn (2 of 3)" in all_row
    assert "auto chose `fa_train:default`, best named `pallas:fa_train:default`" in md
    # auto ran the best named config itself: the line says the gap is the timing spread (the verdict still counts it)
    assert ("(100.0 µs vs auto 110.0 µs): the same config as auto's choice, so the gap is the run's timing spread, "
            "not the routing; p10 110.0 vs 100.0 µs") in md
    assert res["p_llama_n2048"].same_config and not res["p_llama_n1024"].same_config  # default chosen, wide best
    assert md.index("## Model-shape sweep") < md.index("## Run `r1`")  # the summary comes first


def test_chips_are_never_mixed(tmp_path):
    h100 = _write(tmp_path / "a" / "records.jsonl", _prefill_run("r1", H100))
    # the H200 run: the same workload names, other times, and no auto record for p_llama_n1024
    h200_recs = [r for r in _prefill_run("r2", H200, sha="5678def")
                 if not (r["type"] == "result" and r["workload"]["name"] == "p_llama_n1024"
                         and r["impl"]["name"] == "pallas:auto")]
    for r in h200_recs:
        if r["type"] == "result" and r["impl"]["name"] == "pallas:auto":
            r["metrics"] = {k: v * 0.5 for k, v in r["metrics"].items() if v is not None}
    h200 = _write(tmp_path / "b" / "records.jsonl", h200_recs)
    by_chip, _ = _collect(h100, h200)
    assert set(by_chip) == {H100, H200}
    r200 = {r.name: r for r in by_chip[H200]}
    assert r200["p_llama_n1024"].auto is None  # the H100's auto record is not borrowed
    assert r200["p_llama_n1024"].missing == "no pallas:auto record in the run"
    assert r200["p_llama_n2048"].vs_peer == pytest.approx(0.55)
    assert {r.name: r.vs_peer for r in by_chip[H100]}["p_llama_n2048"] == pytest.approx(1.1)
    assert sweep_report.aggregate(by_chip[H200]).peer_geomean == pytest.approx(math.sqrt(0.55 * 0.25))

    out = tmp_path / "docs" / "results.md"
    assert cli.main(["report", str(h100), str(h200), "--out", str(out), "--no-plots"]) == 0
    md = out.read_text()
    assert f"### {H100}" in md and f"### {H200}" in md
    assert "`5678def` (clean)" in md.split(f"### {H200}")[1] and "5678def" not in md.split(f"### {H200}")[0]


def test_a_later_run_of_the_same_chip_replaces_a_workload(tmp_path):
    first = _prefill_run("r1")
    second = [_header("r2", H100), _rec("r2", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:auto", 80.0),
              _rec("r2", H100, _wl("p_gpt_n1024", model="gpt"), "torch:cudnn", 100.0)]
    path = _write(tmp_path / "r" / "records.jsonl", first + second)
    by_chip, notes = _collect(path)
    assert notes["replaced"] == 1 and len(by_chip[H100]) == 3
    gpt = next(r for r in by_chip[H100] if r.model == "gpt")
    assert gpt.run_id == "r2" and gpt.vs_peer == pytest.approx(0.8) and gpt.named is None  # not r1's named
    # r2 timed no named config: auto / best named is r1's, read within r1 (50 / 50), never r2's auto over r1's named
    assert notes["named_earlier"] == 1 and gpt.named_from.run_id == "r1" and gpt.vs_named == pytest.approx(1.0)
    agg = sweep_report.aggregate(by_chip[H100])
    assert agg.with_named == 3 and agg.near == 2  # llama n1024 90 / 88 is 2.3% over (within 3%); n2048 1.1x is not
    text, _ = sweep_report.render_section(by_chip, notes, tmp_path / "out.md", tmp_path / "img", plots=False)
    assert "latest run timed no named config" in text
    # a third run with a named config of its own reads its own ratio again
    third = [_header("r3", H100), _rec("r3", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:auto", 60.0),
             _rec("r3", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:fa_prefill:default", 50.0)]
    path = _write(tmp_path / "s" / "records.jsonl", first + second + third)
    by_chip, notes = _collect(path)
    gpt = next(r for r in by_chip[H100] if r.model == "gpt")
    assert gpt.named_from is None and gpt.vs_named == pytest.approx(1.2) and notes["named_earlier"] == 1


def test_a_later_run_without_auto_does_not_replace_autos_run(tmp_path):
    """A later run of named configs only (a config experiment) leaves the workload's earlier run, which timed auto
    against its peers, in the tables (session 22: such a run had dropped the two worst training workloads from the
    headline's geomean); counted as ``no_auto_later``. A later run with auto still replaces it."""
    first = _prefill_run("r1")
    experiment = [_header("r2", H100), _rec("r2", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:fa_prefill:x", 40.0)]
    path = _write(tmp_path / "r" / "records.jsonl", first + experiment)
    by_chip, notes = _collect(path)
    gpt = next(r for r in by_chip[H100] if r.model == "gpt")
    assert notes["no_auto_later"] == 1 and notes["replaced"] == 0
    assert gpt.run_id == "r1" and gpt.vs_peer == pytest.approx(0.5)
    again = [_header("r3", H100), _rec("r3", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:auto", 80.0)]
    path = _write(tmp_path / "s" / "records.jsonl", first + experiment + again)
    by_chip, notes = _collect(path)
    gpt = next(r for r in by_chip[H100] if r.model == "gpt")
    assert notes["replaced"] == 1 and gpt.run_id == "r3" and gpt.peer is None


def test_a_later_run_that_skipped_auto_for_its_budget_does_not_replace_autos_run(tmp_path):
    """A later run cut by its ``--max-run-s`` writes auto as ``skipped``: it measured nothing, so the earlier timed
    run stays (session 23: two chunked and two quant workloads had lost their timed auto to such a run)."""
    first = _prefill_run("r1")
    cut = [_header("r2", H100),
           _rec("r2", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:auto", status="skipped",
                reason="over time budget: run budget --max-run-s 102 s exhausted before this record")]
    path = _write(tmp_path / "r" / "records.jsonl", first + cut)
    by_chip, notes = _collect(path)
    gpt = next(r for r in by_chip[H100] if r.model == "gpt")
    assert notes["no_auto_later"] == 1 and notes["replaced"] == 0
    assert gpt.run_id == "r1" and gpt.vs_peer == pytest.approx(0.5)
    unsupported = [_header("r3", H100), _rec("r3", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:auto",
                                            status="unsupported", reason="no kernel")]
    path = _write(tmp_path / "s" / "records.jsonl", first + unsupported)
    by_chip, notes = _collect(path)
    gpt = next(r for r in by_chip[H100] if r.model == "gpt")
    assert notes["replaced"] == 1 and gpt.run_id == "r3"  # a refusal is a finding: it replaces


def test_the_chunked_bar_is_judged_against_the_dense_twin(tmp_path):
    """The chunked entry's bar: auto's speed over its dense twin's (``pallas:chunked:dense``: fa_prefill on the same
    keys as one dense cache) >= 0.95 at every workload, and <= 1.0x FA3's kvcache time; the twin is neither a peer nor
    a named config. By hand: speeds 100 / 102 = 0.980 and 100 / 90 = 0.9 -> missed at the second."""
    a = _wl("sweep_chunked_llama_p64_c512_s8192", entry="chunked", family="paged_decode", q_len=512, kv_len=8192)
    b = _wl("sweep_chunked_llama_p16_c512_s8192", entry="chunked", family="paged_decode", q_len=512, kv_len=8192,
            page_size=16)
    recs = [_header("r1", H100),
            _rec("r1", H100, a, "pallas:auto", 100.0), _rec("r1", H100, a, "pallas:chunked:dense", 102.0),
            _rec("r1", H100, a, "fa3:kvcache", 110.0),
            _rec("r1", H100, b, "pallas:auto", 100.0), _rec("r1", H100, b, "pallas:chunked:dense", 90.0),
            _rec("r1", H100, b, "fa3:kvcache", 104.0)]
    by_chip, _ = _collect(_write(tmp_path / "r" / "records.jsonl", recs))
    res = by_chip[H100]
    assert all(r.named is None and r.peer[0] == "fa3:kvcache" for r in res)
    assert {r.name: r.twin for r in res} == {a["name"]: ("pallas:chunked:dense", 102.0),
                                           b["name"]: ("pallas:chunked:dense", 90.0)}
    verdict, detail = sweep_report.kernel_verdict("chunked", res)
    assert verdict == "missed" and "lowest 0.900 (sweep_chunked_llama_p16_c512_s8192) over 2" in detail
    verdict, _ = sweep_report.kernel_verdict("chunked", [r for r in res if r.name == a["name"]])
    assert verdict == "met"
    verdict, detail = sweep_report.kernel_verdict("chunked", [dataclasses.replace(r, twin=None) for r in res])
    assert verdict == "missed" and "no workload with auto and its dense twin" in detail  # half a bar is not met


def test_the_later_run_wins_whatever_the_order_of_the_files(tmp_path):
    """Run ids start with the run's start time: the later run replaces the earlier one when its file is read first
    (the README's report command listed session 10's files before session 8's, which let older records win)."""
    older = _prefill_run("20261126T100000_h100")
    newer = [_header("20261126T200000_h100", H100),
             _rec("20261126T200000_h100", H100, _wl("p_gpt_n1024", model="gpt"), "pallas:auto", 80.0),
             _rec("20261126T200000_h100", H100, _wl("p_gpt_n1024", model="gpt"), "torch:cudnn", 100.0)]
    p_new = _write(tmp_path / "a_new" / "records.jsonl", newer)
    p_old = _write(tmp_path / "b_old" / "records.jsonl", older)
    for order in ((p_new, p_old), (p_old, p_new)):
        by_chip, notes = _collect(*order)
        gpt = next(r for r in by_chip[H100] if r.model == "gpt")
        assert notes["replaced"] == 1 and gpt.run_id == "20261126T200000_h100" and gpt.vs_peer == pytest.approx(0.8)


def test_the_scorecard_scores_the_latest_record_of_each_workload_and_impl():
    from compare import scorecard

    w = _wl("p_llama_n1024")
    old = _rec("20261126T100000_h100", H100, w, "pallas:fa_prefill:default", 100.0)
    new = _rec("20261127T100000_h100", H100, w, "pallas:fa_prefill:default", 90.0)
    other = _rec("20261126T100000_h100", H100, w, "pallas:fa_train:default", 200.0)
    for recs in ([old, new, other], [new, other, old]):
        kept = [r for r in scorecard.latest(recs) if r.get("type") == "result"]
        assert {(r["impl"]["name"], r["metrics"]["time_us_p50"]) for r in kept} == {
            ("pallas:fa_prefill:default", 90.0), ("pallas:fa_train:default", 200.0)}


def test_the_scorecard_keeps_a_timed_record_over_a_later_skipped_one():
    """A record its run's time budget skipped measured nothing: the earlier timed record of the same workload and
    implementation stays the one scored; a key with only skipped records keeps its latest."""
    from compare import scorecard

    w = _wl("p_llama_n1024")
    timed = _rec("20261126T100000_h100", H100, w, "pallas:fa_prefill:default", 100.0)
    cut = _rec("20261127T100000_h100", H100, w, "pallas:fa_prefill:default", status="skipped", reason="over budget")
    only_cut = _rec("20261127T100000_h100", H100, w, "pallas:fa_prefill:c3", status="skipped", reason="over budget")
    kept = [r for r in scorecard.latest([timed, cut, only_cut]) if r.get("type") == "result"]
    assert [(r["impl"]["name"], r["status"]) for r in kept] == [("pallas:fa_prefill:default", "ok"),
                                                                ("pallas:fa_prefill:c3", "skipped")]


def test_the_sweep_scorecard_per_kernel_and_its_misses():
    """scorecard.sweep_kernels: auto grouped under the kernel its plan chose, a named config under its generation;
    a miss above 25% listed with its cause from CAUSES or "open"; render_sweep_scorecard has all three tables."""
    from compare import scorecard

    def rec(name, impl, t, pred_us, plan=None):
        r = _rec("20261127T100000_h100", H100, _wl(name), impl, t)
        r["prediction"] = {"layer2": {"time_us": pred_us, "limiter": "latency"}}
        if plan is not None:
            r["impl"]["plan"] = plan
        return r

    recs = [rec("sweep_prefill_gpt-2_n512", "pallas:auto", 100.0, 104.0, {"generation": "fa_prefill"}),
            rec("sweep_prefill_gpt-2_n512", "pallas:fa_prefill:c3", 200.0, 130.0),
            rec("sweep_prefill_llama-3.1-8b_n512", "pallas:fa_prefill:c3", 900.0, 400.0),
            rec("sweep_prefill_llama-3.1-8b_n512", "pallas:fa_prefill:default", 400.0, 410.0),
            rec("sweep_prefill_llama-3.1-8b_n512", "pallas:chunked:dense", 400.0, 100.0)]  # a twin: not scored
    sk = scorecard.sweep_kernels(recs)
    assert all(i["side"] != "named" or i["records"] == 3 for i in scorecard.sweep_layer2(recs))
    groups = {(g["kernel"], g["records"]) for g in sk["groups"]}
    assert groups == {("fa_prefill", 4)}
    g = sk["groups"][0]
    assert g["priced"] == 4 and g["within"] == 2 and g["worst"] == pytest.approx(500 / 900)
    causes = {m["workload"]: m["cause"] for m in sk["misses"]}
    assert set(causes) == {"sweep_prefill_gpt-2_n512", "sweep_prefill_llama-3.1-8b_n512"}
    assert causes["sweep_prefill_llama-3.1-8b_n512"].startswith("c3 at D 128")
    md = scorecard.render_sweep_scorecard(recs)
    assert "#### Per entry and kernel" in md and "| fa_prefill | 4 | 4 |" in md
    assert "Misses above 25% (before the run; 2)" in md


def test_report_writes_the_scorecard_block_into_its_doc(tmp_path):
    """``compare report --scorecard-doc``: the block between the markers is replaced, the rest kept; a file without
    the markers is refused before anything is written."""
    from compare import report

    recs = [_header("r1", H100), _rec("r1", H100, _wl("sweep_prefill_gpt-2_n512"), "pallas:fa_prefill:default", 10.0)]
    recs[1]["prediction"] = {"layer2": {"time_us": 11.0, "limiter": "latency"}}
    path = _write(tmp_path / "r" / "records.jsonl", recs)
    doc = tmp_path / "results.md"
    doc.write_text("# head\n\n<!-- sweep-scorecard:start -->\nold\n<!-- sweep-scorecard:end -->\n\ntail\n")
    args = report.argparse.Namespace(files=[str(path)], out=str(tmp_path / "out.md"), img_dir=None, no_plots=True,
                                     readme=None, rescore=False, scorecard_doc=str(doc))
    assert report._cli(args) == 0
    text = doc.read_text()
    assert text.startswith("# head\n") and text.endswith("\ntail\n") and "old" not in text
    assert "Layer 2 on the model-shape sweep" in text and "| fa_prefill | 1 | 1 | 10% / 10% | 1 |" in text
    bare = tmp_path / "bare.md"
    bare.write_text("# nothing\n")
    args.scorecard_doc = str(bare)
    with pytest.raises(report.UsageError, match="sweep-scorecard:start"):
        report._cli(args)
    assert bare.read_text() == "# nothing\n"


def test_layer2_on_the_sweep_scores_the_latest_records_before_and_now():
    """scorecard.sweep_layer2: per (GPU, entry, side) the carried (before-the-run) layer 2 against the measured p50 of
    the latest record of each workload and implementation; auto and named apart; training steps scored as their own
    entry (layer 2 prices them since session 21)."""
    from compare import scorecard

    def rec(run, name, impl, t, pred_us, entry="decode", family="decode"):
        w = _wl(name, entry=entry, family=family)
        r = _rec(run, H100, w, impl, t)
        r["prediction"] = {"layer2": {"time_us": pred_us, "limiter": "dram"}}
        return r

    recs = [rec("20261126T100000_h100", "sweep_decode_a", "pallas:fa_decode:default", 100.0, 50.0),  # superseded
            rec("20261127T100000_h100", "sweep_decode_a", "pallas:fa_decode:default", 100.0, 110.0),
            rec("20261127T100000_h100", "sweep_decode_b", "pallas:fa_decode:default", 100.0, 130.0),
            rec("20261127T100000_h100", "sweep_decode_a", "pallas:auto", 100.0, 95.0),
            rec("20261127T100000_h100", "sweep_train_c", "pallas:dropin:wide", 100.0, 10.0, "train", "train"),
            rec("20261127T100000_h100", "other_decode", "pallas:fa_decode:default", 100.0, 10.0)]  # not a sweep one
    items = {(i["entry"], i["side"]): i for i in scorecard.sweep_layer2(recs)}
    assert set(items) == {("decode", "named"), ("decode", "auto"), ("train", "named")}
    train = items[("train", "named")]["before"]
    assert train["priced"] == 1 and train["median"] == pytest.approx(0.9) and train["within_25"] == 0
    named = items[("decode", "named")]["before"]
    assert named["priced"] == 2 and named["median"] == pytest.approx(0.2) and named["worst"] == pytest.approx(0.3)
    assert named["within_25"] == 1 and named["limiters"] == {"dram": 2}
    assert items[("decode", "auto")]["before"]["median"] == pytest.approx(0.05)
    assert "| decode | named | 2 | 2: 20% / 30%, 1 within 25% |" in scorecard.render_sweep_layer2(recs)


# ------------------------------------------------------------------------------ missing auto and peers


def test_missing_auto_and_missing_peers_are_counted_with_reasons(tmp_path):
    run, g = "r1", H100
    ws = [_wl(f"d_{i}", entry="decode", batch=1 << i, q_len=1, kv_len=8192) for i in range(5)]
    recs = [_header(run, g)]
    recs += [_rec(run, g, ws[0], "pallas:auto", status="unsupported", reason="window  is not\nsupported"),
             _rec(run, g, ws[0], "torch:cudnn", 10.0),
             _rec(run, g, ws[1], "pallas:auto", status="unsupported", reason="window is not supported"),
             _rec(run, g, ws[1], "pallas:fa_decode:default", 10.0),
             _rec(run, g, ws[2], "pallas:auto", status="failed", reason="RuntimeError: boom"),
             _rec(run, g, ws[3], "torch:cudnn", 10.0),  # no auto record at all
             _rec(run, g, ws[4], "pallas:auto", 9.0),  # auto ran, no peer ran (one was refused)
             _rec(run, g, ws[4], "torch:cudnn", status="unsupported", reason="softcap")]
    path = _write(tmp_path / "r" / "records.jsonl", recs)
    by_chip, _ = _collect(path)
    a = sweep_report.aggregate(by_chip[H100])
    assert a.n == 5
    assert a.no_auto == {"unsupported: window is not supported": 2, "failed: RuntimeError: boom": 1,
                         "no pallas:auto record in the run": 1}
    assert a.no_peer == 3 and a.no_auto_with_peer == 2 and a.no_auto_with_named == 1
    assert a.vs_peer == [] and a.peer_geomean is None  # nothing to divide: no number is made up
    kv, detail = sweep_report.kernel_verdict("decode", by_chip[H100])
    assert kv == "not judged" and "no workload with both auto and a peer timed" in detail

    out = tmp_path / "r" / "results.md"
    report.render([path], out, tmp_path / "r" / "img", plots=False)
    md = out.read_text()
    assert "- no timed `pallas:auto` on 2: unsupported: window is not supported" in md
    assert "- no timed `pallas:auto` on 1: failed: RuntimeError: boom" in md
    assert "- no timed `pallas:auto` on 1: no pallas:auto record in the run" in md
    row = next(line for line in md.splitlines() if line.startswith("| **all models** |"))
    assert row.split(" | ")[7:9] == ["4", "3"]  # no timed auto, no peer


# -------------------------------------------------------------------------------------------- verdicts


def _named_sweep(ratios, *, entry="prefill", peer=None, drop_auto=()):
    """One workload per ratio: auto = ratio x the named config's 100 µs (and the peer's, when given)."""
    out = []
    for i, x in enumerate(ratios):
        w = _wl(f"w{i}", entry=entry)
        if i not in drop_auto:
            out.append(_rec("r", H100, w, "pallas:auto", 100.0 * x))
        out.append(_rec("r", H100, w, "pallas:fa_prefill:default", 100.0))
        if peer is not None:
            out.append(_rec("r", H100, w, "torch:cudnn", 100.0 * x / peer[i]))
    return out


@pytest.mark.parametrize("ratios, drop, verdict", [
    ([1.0] * 19 + [1.08], (), "met"),  # 95% within 3%, worst 1.08
    ([1.0] * 18 + [1.04, 1.04], (), "missed"),  # 90% within
    ([1.0] * 19 + [1.12], (), "missed"),  # one more than 10% slower
    ([1.0] * 20, (19,), "missed"),  # auto missing where a named config ran
])
def test_sweep_bar(tmp_path, ratios, drop, verdict):
    path = _write(tmp_path / "records.jsonl", _named_sweep(ratios, drop_auto=drop))
    by_chip, _ = _collect(path)
    v, detail = sweep_report.sweep_verdict(sweep_report.aggregate(by_chip[H100]))
    assert v == verdict, detail
    near = sum(1 for i, x in enumerate(ratios) if x <= 1.03 and i not in drop)
    assert f"({near}/20)" in detail


@pytest.mark.parametrize("peer_ratios, verdict", [
    ([0.95, 0.95, 0.99], "met"),  # geomean 0.963, worst 0.99
    ([0.90, 0.95, 1.06], "missed"),  # geomean 0.969 but one over 1.05
    ([0.97, 0.97, 0.99], "missed"),  # geomean 0.977
])
def test_prefill_kernel_bar(tmp_path, peer_ratios, verdict):
    path = _write(tmp_path / "records.jsonl", _named_sweep([1.0] * 3, peer=peer_ratios))
    by_chip, _ = _collect(path)
    assert sweep_report.aggregate(by_chip[H100]).peer_geomean == pytest.approx(
        math.prod(peer_ratios) ** (1 / 3))
    v, detail = sweep_report.kernel_verdict("prefill", by_chip[H100])
    assert v == verdict, detail


def test_quant_and_mla_bars(tmp_path):
    recs = []
    for kv, t in ((None, 100.0), ("fp8_e4m3", 50.0), ("nvfp4", 50.0)):
        w = _wl(f"q_{kv}", entry="quant", kv_dtype=kv, q_len=1, kv_len=8192, batch=32)
        recs.append(_rec("r", H100, w, "pallas:auto", t))
    for i, fr in enumerate((0.75, 0.72)):
        recs.append(_rec("r", H100, _wl(f"m{i}", entry="mla", model="dsv3", batch=8 << i), "pallas:auto", 10.0,
                         roofline=fr))
    by_chip, _ = _collect(_write(tmp_path / "records.jsonl", recs))
    quant = [r for r in by_chip[H100] if r.entry == "quant"]
    v, detail = sweep_report.kernel_verdict("quant", quant)
    assert v == "missed" and "fp8_e4m3 / bf16 KV: geomean 0.500×" in detail and "nvfp4" in detail  # 0.5 > 0.45
    mla = [r for r in by_chip[H100] if r.entry == "mla"]
    v, detail = sweep_report.kernel_verdict("mla", mla)
    assert v == "met" and "lowest roofline fraction 0.720 (m1)" in detail
    mla[1].auto["metrics"]["roofline_fraction"] = 0.69
    assert sweep_report.kernel_verdict("mla", mla)[0] == "missed"


def test_records_without_sweep_workloads_render_as_before(tmp_path):
    plain = {**_wl("plain"), "model": None, "tags": ["frontier"]}  # no model: not a sweep workload, auto or not
    recs = [_rec("r", H100, plain, "torch:cudnn", 10.0), _rec("r", H100, plain, "pallas:fa_prefill:default", 12.0),
            _rec("r", H100, plain, "pallas:auto", 11.0)]
    path = _write(tmp_path / "records.jsonl", recs)
    assert _collect(path)[0] == {}
    out = tmp_path / "results.md"
    report.render([path], out, tmp_path / "img", plots=False)
    assert "Model-shape sweep" not in out.read_text() and "| pallas:auto | ok |" in out.read_text()
    tagged = [{**r, "workload": {**plain, "tags": ["sweep", "prefill"]}} for r in recs]
    assert list(_collect(_write(tmp_path / "t.jsonl", tagged))[0]) == [H100]


# --------------------------------------------------------------------------------------------- heatmap


def _decode_run():
    recs = [_header("r", H100)]
    for model in ("llama", "qwen"):
        for page in (16, 64):
            for b in (1, 32):
                for s in (8192, 32768):
                    w = _wl(f"pg_{model}_p{page}_b{b}_s{s}", model=model, entry="paged", batch=b, q_len=1,
                            kv_len=s, page_size=page, ragged=True)
                    if not (model == "qwen" and b == 32 and s == 32768):
                        recs.append(_rec("r", H100, w, "pallas:auto", 100.0 * (0.8 if page == 16 else 1.2)))
                    else:
                        recs.append(_rec("r", H100, w, "pallas:auto", status="oom", reason="out of memory"))
                    if not (model == "llama" and b == 1 and s == 8192):
                        recs.append(_rec("r", H100, w, "fa3:mha", 100.0))
    return recs


def test_heatmap_grid_rows_and_columns():
    runs = {"r": {"path": "x", "results": [r for r in _decode_run() if r["type"] == "result"]}}
    by_chip, _ = sweep_report.collect(runs)
    rows, cols, cells = sweep_report.heatmap_grid("paged", by_chip[H100])
    assert cols == ["B1 S8k", "B1 S32k", "B32 S8k", "B32 S32k"]  # B x S, numeric order
    assert rows == ["llama p16", "llama p64", "qwen p16", "qwen p64"]  # the page size tells two rows apart
    assert cells[("llama p16", "B32 S32k")].vs_peer == pytest.approx(0.8)
    assert cells[("qwen p64", "B32 S32k")].missing == "oom: out of memory"
    assert cells[("llama p64", "B1 S8k")].peer is None


def test_heatmap_png_is_written_and_linked(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is optional: without it the report says there is no picture")
    path = _write(tmp_path / "run" / "records.jsonl", _decode_run())
    out = tmp_path / "docs" / "results.md"
    written = report.render([path], out, tmp_path / "docs" / "img")
    png = tmp_path / "docs" / "img" / "sweep_paged_nvidia-h100-80gb-hbm3.png"
    assert png in written and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![sweep paged NVIDIA H100 80GB HBM3](img/sweep_paged_nvidia-h100-80gb-hbm3.png)" in out.read_text()


def test_without_matplotlib_the_report_says_why(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    path = _write(tmp_path / "run" / "records.jsonl", _decode_run())
    out = tmp_path / "run" / "results.md"
    written = report.render([path], out, tmp_path / "run" / "img")
    assert not any(p.name.startswith("sweep_") for p in written)
    assert "_no heatmap: matplotlib is not installed" in out.read_text()


# ---------------------------------------------------------------------------------------- README block


_README = f"# project\n\nIntro paragraph.\n\n{START}\nold text\n{END}\n\n## Rest\n\nkept | as is\n"


def test_readme_block_is_replaced_idempotently(tmp_path):
    h100 = _write(tmp_path / "results" / "a" / "records.jsonl", _prefill_run("r1", H100))
    h200 = _write(tmp_path / "results" / "b" / "records.jsonl", _prefill_run("r2", H200, sha="5678def"))
    readme = tmp_path / "README.md"
    readme.write_text(_README)
    argv = ["report", str(h100), str(h200), "--out", str(tmp_path / "docs" / "results.md"), "--no-plots",
            "--readme", str(readme)]
    assert cli.main(argv) == 0
    once = readme.read_text()
    assert cli.main(argv) == 0
    assert readme.read_text() == once  # the same records give the same block
    head, block = once.split(START)
    block, tail = block.split(END)
    assert head == "# project\n\nIntro paragraph.\n\n" and tail == "\n\n## Rest\n\nkept | as is\n"
    assert "old text" not in block
    assert "`results/a/records.jsonl`" in block and "`results/b/records.jsonl`" in block
    assert "`1234abc` (clean)" in block and "`5678def` (clean)" in block
    # the command it names regenerates it: records from two folders need --out, so the command carries it
    assert ("generated by `python -m compare report results/a/records.jsonl results/b/records.jsonl --out "
            "docs/results.md --readme README.md`") in block
    rows = [line for line in block.splitlines() if line.startswith("| prefill |")]
    assert len(rows) == 2 and rows[0].startswith(f"| prefill | {H100} | 3 |") and H200 in rows[1]
    g = (0.9 * 1.1 * 0.5) ** (1 / 3)
    assert f"| {g:.3f}× | 1.100× (p_llama_n2048) |" in rows[0] and "torch:cudnn (2 of 3)" in rows[0]


def test_readme_without_markers_is_refused_and_untouched(tmp_path, capsys):
    path = _write(tmp_path / "r" / "records.jsonl", _prefill_run())
    for text in ("# project\n\nno markers here\n", f"# p\n{END}\n{START}\n", f"{START}\n{START}\n{END}\n"):
        readme = tmp_path / "README.md"
        readme.write_text(text)
        assert cli.main(["report", str(path), "--readme", str(readme)]) == 2
        err = capsys.readouterr().err
        assert "sweep-headline:start" in err and "Traceback" not in err
        assert readme.read_text() == text
    assert not (tmp_path / "r" / "results.md").exists()  # refused before anything was written


def test_readme_from_records_without_a_sweep_is_refused(tmp_path, capsys):
    path = _write(tmp_path / "r" / "records.jsonl",
                  [_rec("r", H100, {**_wl("plain"), "model": None}, "torch:cudnn", 10.0)])
    readme = tmp_path / "README.md"
    readme.write_text(_README)
    assert cli.main(["report", str(path), "--readme", str(readme)]) == 2
    assert "no sweep workload" in capsys.readouterr().err
    assert readme.read_text() == _README


def test_the_committed_readme_has_the_markers():
    from pathlib import Path

    text = sweep_report.check_readme(Path(__file__).resolve().parent.parent / "README.md")
    assert text.index(START) < text.index("## ")  # near the top, before the first section


def test_floor_fractions_of_auto_and_the_best_peer(tmp_path):
    """``floor / time``: the workload's layer-1 floor (auto's record) over auto's and the best peer's time, geomean
    over the workloads where both ran; by hand: floors 60 and 50 us, auto 90 / 100, best peer 100 / 80."""
    run, gpu = "rf", H100
    a, b, c = (_wl("sweep_prefill_f_n1024"), _wl("sweep_prefill_f_n2048", q_len=2048, kv_len=2048),
               _wl("sweep_prefill_f_n4096", q_len=4096, kv_len=4096))
    ch = "fa_prefill:default"
    recs = [_header(run, gpu), _rec(run, gpu, a, "pallas:auto", 90.0, chose=ch),
            _rec(run, gpu, a, "torch:cudnn", 100.0), _rec(run, gpu, b, "pallas:auto", 100.0, chose=ch),
            _rec(run, gpu, b, "jax:cudnn", 80.0),
            _rec(run, gpu, c, "pallas:auto", 70.0, chose=ch)]
    recs[1]["metrics"]["floor_us"], recs[3]["metrics"]["floor_us"] = 60.0, 50.0
    recs[5]["metrics"]["floor_us"] = 35.0  # no peer: not in the geomean
    by_chip, _ = _collect(_write(tmp_path / "f.jsonl", recs))
    (res,) = by_chip.values()
    agg = sweep_report.aggregate(res)
    assert sorted(agg.auto_floor) == pytest.approx(sorted([60 / 90, 50 / 100]))
    assert sorted(agg.peer_floor) == pytest.approx(sorted([60 / 100, 50 / 80]))
    row = sweep_report._agg_row("all", agg)
    assert row[-1] == f"{math.sqrt(60 / 90 * 50 / 100):.2f}, {math.sqrt(60 / 100 * 50 / 80):.2f} (2)"
