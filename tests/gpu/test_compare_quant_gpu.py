"""compare on quantized-KV workloads on the device: the small cases of configs/quant_decode.toml timed end to end
(fa_decode on fp8 and NVFP4 KV, dense and paged ragged), agreement against the same-quantized oracle, the
quantization error recorded beside it, and the roofline at storage bytes with the dequant bound."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402

from compare import cli, records  # noqa: E402

pytestmark = pytest.mark.gpu


def test_quant_smoke_runs_and_is_timed_on_the_gpu(tmp_path):
    argv = ["run", "--config", "quant_decode", "--quiet", "--no-ceilings", "--reps", "5", "--e2e-reps", "3",
            "--e2e-calls", "5", "--allow-clock-fallback", "--out", str(tmp_path),
            "--only", "quant_smoke_*:pallas:fa_decode:*", "--only", "quant_smoke_*:jax:cudnn"]
    assert cli.main(argv) == 0
    res = [r for r in records.read_jsonl(tmp_path / "records.jsonl") if r["type"] == "result"]
    fa = [r for r in res if r["impl"]["name"].startswith("pallas:fa_decode:")]
    assert len(fa) == 16, [(r["workload"]["name"], r["impl"]["name"]) for r in fa]
    for r in res:
        assert records.validate(r) == [], records.validate(r)
    for r in fa:
        ag, m = r["agreement"], r["metrics"]
        assert r["status"] == "ok", (r["workload"]["name"], r["impl"]["name"], r["reason"])
        assert ag["rel_l2_err"] < 2e-3 and ag["quantization"]["rmse"] > 0, ag
        assert m["time_us_p50"] > 0 and m["limiter"] in ("HBM", "ALU", "MUFU", "MMA")
        assert r["prediction"]["quantized_kv"]["kv_dtype"] == r["workload"]["kv_dtype"]
    for r in res:
        if r["impl"]["name"] == "jax:cudnn":
            assert r["status"] == "unsupported" and r["workload"]["kv_dtype"] in r["reason"]
