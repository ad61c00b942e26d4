"""Issue 16: layer 2 of the paged family pinned on hand-computed cases (issue-bound CUDA-core partial with its
spill share, the serial gather of the cuda_ref twins, their merge) and the re-scoring path."""

from __future__ import annotations

import json

import pytest

from compare import hardware, layer2, scorecard
from compare.layer2 import Cost, Launch, time_launch

H100 = hardware.get("h100")
CLK = H100.clock_mhz * 1e6  # 1.98 GHz
GLOB = {"l2_bytes_per_clk_sm": 40.0, "l2_resident_fraction": 0.75, "launch_us": 2.0, "gather_lat": 1000.0}
# B 1, G 8 (Hq 8, Hkv 1), N_k 8192, d128, page 256: the reference's reclaim shape
W = {"name": "w", "family": "paged_decode", "batch": 1, "heads_q": 8, "heads_kv": 1, "q_len": 1, "kv_len": 8192,
     "head_dim": 128, "dtype": "float16", "page_size": 256, "q_offset": 8191}


def test_spill_units_and_gather_steps_in_one_launch():
    # 264 programs -> 2 on the busiest SM; issue 2 x (1000 units x 0.5 + 400 spilled x 2) cycles;
    # latency: one round (256 threads x 64 regs: 4 resident) of 10 gather steps x 1000 cycles
    ln = Launch("k", "c", 264, 256, 64, 0, units=1000.0, steps=0.0, dram_bytes=0.0, spill_units=400.0,
                gather_steps=10.0)
    lt = time_launch(ln, H100, {"c": Cost(issue=0.5, lat=0.0, spill=2.0)}, GLOB)
    assert lt.t_issue == pytest.approx(2 * (1000 * 0.5 + 400 * 2.0) / CLK)
    assert lt.t_latency == pytest.approx(10 * 1000 / CLK)
    assert lt.limiter == "latency" and lt.time_s == pytest.approx(lt.t_latency + 2e-6)


def test_pallas_cuda_core_partial_is_issue_bound_with_its_spill_share():
    # faithful: 8 warps, R 8, TN 32, per key: 8 x 32 x 128 / 256 = 128 live values per thread: no spill
    part = layer2.predict("pallas:v8_gqa:faithful", W, H100).launches[0]
    ln = part.launch
    assert ln.units == 8 * 8 * 32 * (128 + 64) and ln.spill_units == 0  # 8 tiles of 32 keys (chunk 256)
    c = layer2.COSTS["pallas_attn_paged_cuda_cores"]
    assert part.t_issue == pytest.approx(ln.units * c.issue / CLK)  # 32 programs: one per SM
    assert part.limiter == "issue"
    # tuned: 4 warps, one update per 32-key tile: 8 x 32 x 128 / 128 = 256 live values -> half the units spill
    tuned = layer2.predict("pallas:v8_gqa:tuned", W, H100).launches[0]
    assert tuned.launch.units == 8 * 8 * 32 * 128
    assert tuned.launch.spill_units == pytest.approx(tuned.launch.units * (1 - 128 / 256))
    assert tuned.t_issue == pytest.approx(tuned.launch.units * (c.issue + 0.5 * c.spill) / CLK)


def test_cuda_paged_twin_gathers_per_strided_iteration():
    # cuda v8_gqa on the device's 132 SMs: choose_splits(bh 1, rows 8 -> 1 row tile) = S 32, chunk 256
    p = layer2.predict("cuda:v8_gqa", W, H100)
    part, merge = (lt.launch for lt in p.launches)
    assert (p.plan["splits"], p.plan["chunk"]) == (32, 256)
    assert (part.name, part.cost, part.programs, part.threads) == ("v8_gqa_partial_kernel<128>", "paged_warp_rows",
                                                                   32, 256)
    assert (part.regs, part.smem) == (47, 32768)  # the ptxas report
    # 256 keys = 8 tiles of 32; each tile 32 x 128 / 256 = 16 strided (table -> pool) iterations
    assert (part.units, part.steps, part.gather_steps) == (8 * 256, 256, 8 * 16)
    wr, g = layer2.COSTS["warp_rows"], layer2.GLOBAL["gather_lat"]
    assert p.launches[0].t_latency == pytest.approx((256 * wr.lat + 128 * g) / CLK)
    # the merge: 8 rows (B x Hq), D threads, two dependent passes = one gather step, no constant of its own
    assert (merge.cost, merge.programs, merge.threads, merge.gather_steps) == ("paged_merge", 8, 128, 1.0)
    assert p.launches[1].time_s == pytest.approx(g / CLK + layer2.GLOBAL["launch_us"] * 1e-6)


def test_cuda_tc_and_ss_twins():
    # tc: one warp gathers 32 x 128 elements: 128 iterations per 32-key block; 16-row tiles -> S from 16 rows
    tc = layer2.predict("cuda:v8_gqa_tc", W, H100).launches[0].launch
    assert (tc.threads, tc.cost, tc.steps, tc.gather_steps) == (32, "paged_wmma", 8, 8 * 128)
    # ss: 8 groups of 32 keys, D + 32 dependent lane steps each, 16 gather iterations per tile
    ss = layer2.predict("cuda:v8_gqa_ss", W, H100).launches[0].launch
    assert (ss.cost, ss.steps, ss.gather_steps) == ("v8_gqa_ss_group", 8 * (128 + 32), 8 * 16)


def test_paged_times_lines_become_records_and_rescore(tmp_path, capsys):
    line = {"sweep": "reclaim", "gen": "v8_gqa", "device": "NVIDIA H100 80GB HBM3", "B": 1, "H_q": 8, "H_kv": 1,
            "G": 8, "N_k": 8192, "D": 128, "page": 256, "num_sm": 132, "splits": 32, "kernel_us": 100.0,
            "read_ceiling_GBps": 3000.0}
    path = tmp_path / "paged_times.jsonl"
    path.write_text(json.dumps(line) + "\n")
    recs = scorecard.load([str(path)])
    ceil, rec = recs
    assert ceil["type"] == "ceilings" and ceil["measured"]["hbm_read_Bps"] == 3e12
    assert rec["impl"]["plan"] == {"splits": 32, "chunk": 256, "num_sm": 132}
    assert rec["workload"]["family"] == "paged_decode" and rec["prediction"] == {}
    want = layer2.predict("cuda:v8_gqa", rec["workload"], H100.with_measured(hbm_bw=3e12)).time_s * 1e6
    row = scorecard.rows(recs)[0]
    assert row["layer2_us"] == pytest.approx(want) and row["layer2_err"] == pytest.approx(want / 100 - 1)
    assert scorecard.main([str(path), "--recompute"]) == 0
    assert "re-scored with the model of" in capsys.readouterr().out


def test_carried_prediction_is_kept_unless_rescored():
    w = dict(W)
    rec = {"type": "result", "status": "ok", "run_id": "r", "env": {"gpu": "NVIDIA H100 80GB HBM3"}, "workload": w,
           "impl": {"name": "cuda:v8_gqa", "framework": "cuda"}, "metrics": {"time_us_p50": 100.0},
           "prediction": {"layer2": {"error": "KeyError: 'v8_gqa'"}}}
    assert layer2.score(rec)["layer2_us"] is None  # the model of that run could not price it: stays so
    assert layer2.score(rec, recompute=True)["layer2_us"] > 0
