"""compare's CUDA paged rows on the GPU: ``cuda:v7_paged`` and the v8 family through ``compare run`` (one process,
one clock with the Pallas rows): every record ok, within the run's tolerance of the float64 oracle, the split plan
in the record equal to what the launch uses (cuda_ref.api.split_plan on the device), and the CUDA output next to its
Pallas twin's on the same inputs. Small ragged, shuffled, non-page-multiple shapes (a few seconds per record)."""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import pytest  # noqa: E402

torch = pytest.importorskip("torch")

from compare import cli, records  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GQA = ("v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")

CONFIG = """
[[workload]]
name = "cpg_g4_page16"
family = "paged_decode"
batch = 3
heads_q = 8
heads_kv = 2
q_len = 1
kv_len = 700
head_dim = {d}
dtype = "float16"
page_size = 16
ragged = true
generations = [{gqa}, "pallas:v8_gqa:faithful", "pallas:v8_gqa_ss:faithful"]
peers = []

[[workload]]
name = "cpg_mha_page64"
family = "paged_decode"
batch = 2
heads_q = 4
q_len = 1
kv_len = 1000
head_dim = 128
dtype = "float16"
page_size = 64
generations = ["cuda:v7_paged", "pallas:v7_paged:faithful"]
peers = []
"""


@pytest.mark.parametrize("d", (64, 128))
def test_compare_runs_the_cuda_paged_rows(tmp_path, d):
    import cuda_ref

    cfg = tmp_path / "cuda_paged.toml"
    cfg.write_text(CONFIG.format(d=d, gqa=", ".join(f'"cuda:{g}"' for g in GQA)))
    out = tmp_path / "run"
    assert cli.main(["run", "--config", str(cfg), "--out", str(out), "--reps", "5", "--e2e-reps", "1", "--quiet"]) == 0
    res = {(r["workload"]["name"], r["impl"]["name"]): r for r in records.read_jsonl(out / "records.jsonl")
           if r["type"] == "result"}
    cuda = {k: r for k, r in res.items() if k[1].startswith("cuda:")}
    assert len(cuda) == len(GQA) + 1, sorted(res)
    for (wl, name), r in cuda.items():
        assert r["status"] == "ok", (wl, name, r["reason"])
        ag = r["agreement"]
        assert ag["rel_l2_err"] <= ag["tol_rel_l2"], (wl, name, ag)
        assert r["metrics"]["time_us_p50"] > 0
        w = r["workload"]
        plan = r["impl"]["plan"]
        cap = -(-w["kv_len"] // w["page_size"]) * w["page_size"]
        want = cuda_ref.api.split_plan(name.split(":")[1], batch=w["batch"], h_q=w["heads_q"], h_kv=w["heads_kv"],
                                       n_q=w["q_len"], n_k=cap, head_dim=w["head_dim"])
        assert (plan["splits"], plan["chunk"], plan["n_k"]) == (*want, cap), (wl, name, plan)
    # the twins' errors against the same oracle rows are of one size (fp16 operands, fp32 accumulation)
    tw = res[("cpg_g4_page16", "pallas:v8_gqa:faithful")]
    assert tw["status"] == "ok"
    assert cuda[("cpg_g4_page16", "cuda:v8_gqa")]["agreement"]["rel_l2_err"] <= 10 * max(
        tw["agreement"]["rel_l2_err"], 1e-4)
