"""End to end on the CPU: ``python -m compare run`` on the smoke config (filtered to keep it quick), then
the records (schema, statuses, agreement, the declared lowering and launch plan), a record's ``repro``
command, and ``python -m compare report``."""

from __future__ import annotations

import math
import shlex

import pytest

from compare import cli, records, report

pytestmark = pytest.mark.slow  # one compare run (module fixture) serves every test

ONLY = [
    "smoke_prefill_f32_c*:*:v4_fused*",  # a mirror generation, both twins (CUDA: unavailable here)
    "smoke_prefill_f32_c1:jax:*",  # jax.nn xla runs on the CPU, cudnn is unavailable
    "smoke_paged*:*fa_decode*",  # the paged path: pools, block table, ragged lengths
    "smoke_paged*:jax-pallas:paged",  # a JAX Pallas peer with its scale trap handled
    "*:torch:*",  # torch peers: unavailable without a CUDA GPU, with the reason
]


@pytest.fixture(scope="module")
def run_records(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    argv = ["run", "--config", "smoke", "--out", str(out)]
    for o in ONLY:
        argv += ["--only", o]
    assert cli.main(argv) == 0
    path = out / "records.jsonl"
    return path, list(records.read_jsonl(path))


def _results(recs):
    return {(r["workload"]["name"], r["impl"]["name"]): r for r in recs if r["type"] == "result"}


def test_every_record_is_valid_and_the_run_has_a_header_and_ceilings(run_records):
    _, recs = run_records
    for r in recs:
        assert records.validate(r) == [], (r.get("impl", {}).get("name"), records.validate(r))
    types = [r["type"] for r in recs]
    assert types[0] == "header" and types[1] == "ceilings"
    ceil = recs[1]
    assert ceil["measured"] is None and "no CUDA GPU" in ceil["reason"]
    assert len({r["run_id"] for r in recs}) == 1
    assert all(r["env"]["device_kind"] == "cpu-interpret" for r in recs if r["type"] == "result")


def test_statuses_and_agreement(run_records):
    _, recs = run_records
    res = _results(recs)
    ran = {k: r for k, r in res.items() if r["status"] in records.RAN_STATUSES}
    for wl in ("smoke_prefill_f32_c0", "smoke_prefill_f32_c1"):
        assert res[(wl, "pallas:v4_fused:faithful")]["status"] == "ok"
        cuda = res[(wl, "cuda:v4_fused")]
        assert cuda["status"] == "unavailable" and "CUDA GPU" in cuda["reason"]
    assert res[("smoke_prefill_f32_c1", "jax:xla")]["status"] == "ok"
    assert res[("smoke_prefill_f32_c1", "jax:cudnn")]["status"] == "unavailable"
    assert res[("smoke_paged_gqa_f16", "pallas:fa_decode:default")]["status"] == "ok"
    assert res[("smoke_paged_gqa_f16", "jax-pallas:paged")]["status"] == "ok"
    torch_recs = [r for (_, i), r in res.items() if i.startswith("torch:")]
    assert torch_recs and all(r["status"] == "unavailable" and r["reason"] for r in torch_recs)
    assert len(ran) >= 5
    for (wl, impl), r in ran.items():
        ag = r["agreement"]
        assert math.isfinite(ag["max_abs_err"]) and math.isfinite(ag["rel_l2_err"])
        assert r["status"] == "ok", (wl, impl, r["reason"])
        assert ag["rel_l2_err"] <= ag["tol_rel_l2"]
        assert ag["subset"]["batches"] and ag["subset"]["heads_q"]
        m = r["metrics"]
        # CPU: agreement only; the interpreter's wall-clock is labelled and never a kernel time
        assert m["clock"] == "cpu-interpret" and m["cpu_interpret_us_p50"] > 0
        assert m["time_us_p50"] is None and m["roofline_fraction"] is None
        assert r["prediction"]["datasheet"]["floor_us"] > 0  # predictions still made (datasheet, --arch)
        by_arch = r["prediction"]["by_arch"]  # make compare on a CPU: H100 and H200 predictions by default
        assert set(by_arch) == {"h100", "h200"}
        assert by_arch["h200"]["floor_us"] <= by_arch["h100"]["floor_us"]  # same math, faster HBM
    fp32 = res[("smoke_prefill_f32_c1", "pallas:v4_fused:faithful")]["agreement"]
    assert fp32["rel_l2_err"] < 1e-5  # fp32 end to end through the run matches the float64 oracle


def test_lowering_and_plan_come_from_the_kernel_contract(run_records):
    """Every Pallas record carries its kernel's declared lowering (fa_decode: triton, never mosaic-gpu) and,
    once supported, the launch plan ``kernel.plan`` made before the run; predictions name their source."""
    from pallas_attn import registry

    _, recs = run_records
    res = [r for r in _results(recs).values() if r["impl"]["framework"] == "pallas"]
    fa = [r for r in res if r["impl"]["generation"] == "fa_decode"]
    assert fa and {r["impl"]["lowering"] for r in fa} == {registry.kernel("fa_decode").lowering}
    for r in res:
        gen, impl = r["impl"]["generation"], r["impl"]
        if r["status"] == "not_built":
            assert impl["lowering"] is None and impl["plan"] is None
            continue
        assert impl["lowering"] == registry.kernel(gen).lowering, impl["name"]
        if r["status"] in records.RAN_STATUSES:
            assert isinstance(impl["plan"], dict) and impl["plan"] and "error" not in impl["plan"], impl
            src = r["prediction"]["roofline_inputs"]["source"]
            assert src == f"pallas contract ({registry.kernel(gen).name})"
    plan = _results(recs)[("smoke_paged_gqa_f16", "pallas:fa_decode:default")]["impl"]["plan"]
    assert plan["splits"] >= 1 and plan["block_k"] >= 16 and plan["programs"] >= 1
    v4 = _results(recs)[("smoke_prefill_f32_c1", "pallas:v4_fused:faithful")]
    assert v4["prediction"]["roofline_inputs"]["precision"] == "fp32" and v4["agreement"]["precision"] == "fp32"
    cuda = _results(recs)[("smoke_prefill_f32_c1", "cuda:v4_fused")]
    assert cuda["prediction"]["roofline_inputs"]["source"].startswith("cuda_ref table")


def test_repro_reruns_exactly_one_record(run_records, tmp_path):
    _, recs = run_records
    r = _results(recs)[("smoke_prefill_f32_c1", "pallas:v4_fused:faithful")]
    argv = shlex.split(r["repro"])
    assert argv[:4] == ["python", "-m", "compare", "run"]
    assert cli.main(argv[3:] + ["--out", str(tmp_path), "--quiet"]) == 0
    again = [x for x in records.read_jsonl(tmp_path / "records.jsonl") if x["type"] == "result"]
    assert [(x["workload"]["name"], x["impl"]["name"]) for x in again] == [
        ("smoke_prefill_f32_c1", "pallas:v4_fused:faithful")]
    assert again[0]["agreement"]["max_abs_err"] == r["agreement"]["max_abs_err"]  # seeded: same inputs


def test_report_renders_markdown(run_records, tmp_path):
    path, _ = run_records
    out = tmp_path / "results.md"
    assert cli.main(["report", str(path), "--out", str(out)]) == 0
    md = out.read_text()
    assert "CPU interpret" in md and "### smoke_prefill_f32_c1" in md
    assert "| pallas:v4_fused:faithful | ok | CPU-interpret" in md
    assert "unavailable: " in md and str(path) in md
    assert not list(tmp_path.glob("img/*.png"))  # no plots from a CPU run: nothing timed to plot
    runs = report.load_runs([path])
    assert len(runs) == 1


@pytest.mark.gpu
def test_gpu_run_times_every_record_with_cupti(tmp_path):
    """On the device: ceilings measured, clock check near the copy ceiling, every record that ran has
    finite CUPTI kernel times with a cold L2 and roofline fractions."""
    from pallas_attn import _compat

    if not _compat.has_gpu():
        pytest.skip("needs a CUDA GPU")
    assert cli.main(["run", "--config", "smoke", "--out", str(tmp_path), "--reps", "5", "--quiet"]) == 0
    recs = list(records.read_jsonl(tmp_path / "records.jsonl"))
    assert all(records.validate(r) == [] for r in recs)
    ceil = next(r for r in recs if r["type"] == "ceilings")
    assert ceil["measured"]["hbm_read_Bps"] > 1e11 and ceil["measured"]["flops"]["fp16"] > 1e13
    checks = [r for r in recs if r["type"] == "clock_check"]
    assert checks and all(c["ok"] for c in checks), checks
    ran = [r for r in recs if r["type"] == "result" and r["status"] in records.RAN_STATUSES]
    assert ran
    for r in ran:
        m = r["metrics"]
        assert m["clock"].startswith("cupti") and m["l2_flushed"], (r["impl"]["name"], m.get("clock_notes"))
        assert 0 < m["time_us_p10"] <= m["time_us_p50"] <= m["time_us_p90"]
        assert m["roofline_fraction"] > 0 and m["e2e_us_p50"] > 0
