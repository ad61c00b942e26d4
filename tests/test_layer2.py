"""Layer 2 of the roofline (compare/layer2.py) and its scorecard: the arithmetic pinned on hand-computed cases."""

from __future__ import annotations

import dataclasses
import json

import pytest

from compare import hardware, layer2, scorecard
from compare.layer2 import Cost, Launch, occupancy, time_launch
from pallas_attn.kernels import fa_prefill
from pallas_attn.kernels.launches import merge_launch

H200 = hardware.get("h200")
CLK = H200.clock_mhz * 1e6  # 1.98 GHz
GLOB = {"l2_bytes_per_clk_sm": 40.0, "l2_resident_fraction": 0.75, "launch_us": 2.0}


# --- residency -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads,regs,smem,want", [
    (1024, 32, 0, (2, "threads")),  # 2048 threads per SM
    (256, 128, 0, (2, "regs")),  # 128 regs x 256 threads = 32768 of 65536
    (256, 36, 0, (6, "regs")),  # 36 regs -> 1152 per warp, allocated as 1280: 65536 // (1280 * 8) = 6
    (128, 32, 100 * 1024, (2, "smem")),  # (100 + 1 reserved) KB of 228 KB
    (32, 16, 0, (32, "blocks")),  # 32 blocks per SM
])
def test_occupancy_limits(threads, regs, smem, want):
    assert occupancy(threads, regs, smem) == want


def test_occupancy_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        occupancy(256, 32, 240 * 1024)
    with pytest.raises(ValueError, match="threads per program"):
        occupancy(2048, 32, 0)


# --- one launch ------------------------------------------------------------------------------------------


def _ln(**kw):
    base = dict(name="k", cost="c", programs=1000, threads=256, regs=64, smem=0, units=100.0, steps=10.0,
                dram_bytes=0.0, l2_bytes=0.0)
    base.update(kw)
    return Launch(**base)


def test_waves_rounds_and_issue_bound():
    # 256 threads x 64 regs -> 4 per SM (regs); 1000 programs: busiest SM runs ceil(1000/132) = 8 -> 2 rounds
    lt = time_launch(_ln(), H200, {"c": Cost(issue=50.0, lat=0.0)}, GLOB)
    assert (lt.resident, lt.occupancy_limit, lt.rounds) == (4, "regs", 2)
    assert lt.waves == pytest.approx(1000 / (4 * 132))
    assert lt.t_issue == pytest.approx(8 * 100 * 50.0 / CLK)  # 8 programs x 100 units x 50 cycles
    assert lt.limiter == "issue"
    assert lt.time_s == pytest.approx(lt.t_issue + 2e-6)  # plus the launch cost


def test_latency_bound_is_littles_law_at_low_occupancy():
    # 132 programs, one per SM, 64 serial steps of 1000 cycles: one round of 64k cycles; with 16 KB per step in
    # flight per SM the bandwidth it can draw is 132 x 16 KB / (1000 cycles) = 4.2 GB/ms, so 64 x 132 x 16 KB
    # takes the same 64k cycles: the latency term IS the Little's-law bound
    ln = _ln(programs=132, units=0.0, steps=64.0, dram_bytes=64 * 132 * 16384.0)
    lt = time_launch(ln, H200, {"c": Cost(issue=0.0, lat=1000.0)}, GLOB)
    assert lt.rounds == 1
    assert lt.t_latency == pytest.approx(64 * 1000 / CLK)
    littles_bw = 132 * 16384 / (1000 / CLK)
    assert lt.t_latency == pytest.approx(ln.dram_bytes / littles_bw)
    assert lt.t_dram == pytest.approx(ln.dram_bytes / H200.hbm_bw)
    assert lt.t_latency > lt.t_dram and lt.limiter == "latency"  # 2.1 TB/s drawn: below the 4.8 TB/s of HBM


def test_fixed_cycles_per_program_and_rounds():
    # 3 programs per SM but 2 resident (threads) -> 2 rounds of (5 steps x 100 + 300 fixed)
    ln = _ln(programs=3 * 132, threads=1024, regs=32, units=0.0, steps=5.0)
    lt = time_launch(ln, H200, {"c": Cost(issue=0.0, lat=100.0, fixed=300.0)}, GLOB)
    assert (lt.resident, lt.rounds) == (2, 2)
    assert lt.t_latency == pytest.approx(2 * (5 * 100 + 300) / CLK)


def test_dram_and_l2_terms():
    ln = _ln(units=0.0, steps=0.0, dram_bytes=4.8e9, l2_bytes=1e9)
    lt = time_launch(ln, H200, {"c": Cost(0.0, 0.0)}, GLOB)
    assert lt.t_dram == pytest.approx(4.8e9 / H200.hbm_bw)
    assert lt.t_l2 == pytest.approx(1e9 / (40.0 * 132 * CLK))
    assert lt.limiter == "dram"


def test_l2_residency_switch():
    cap = layer2.GLOBAL["l2_resident_fraction"] * H200.l2_mb * 1e6  # 45 MB on the H200
    assert layer2._split_dram_l2(1e8, cap * 0.9, H200) == (0.0, 1e8)  # fits: re-read from L2
    assert layer2._split_dram_l2(1e8, cap * 1.1, H200) == (1e8, 0.0)  # does not: from HBM


def test_prediction_sums_launches_and_their_launch_costs():
    # v1_naive: three launches, each with its own launch cost
    s = layer2.Shape(1, 8, 8, 512, 512, 64, "float32")
    p = layer2.predict("pallas:v1_naive:faithful", s, H200)
    assert [lt.launch.name for lt in p.launches] == ["pallas_attn_v1_naive_qk", "pallas_attn_v1_naive_softmax",
                                                     "pallas_attn_v1_naive_pv"]
    parts = [max(lt.t_issue, lt.t_latency, lt.t_dram, lt.t_l2) for lt in p.launches]
    assert p.time_s == pytest.approx(sum(parts) + 3 * layer2.GLOBAL["launch_us"] * 1e-6)
    # S (8 MB) fits the H200's L2: the softmax pass re-reads it from L2, not HBM
    sm = p.launches[1].launch
    assert sm.dram_bytes == 0 and sm.l2_bytes > 0


def test_plan_drives_programs_and_casts():
    s = layer2.Shape(1, 8, 8, 1, 8192, 128, "float16", q_offset=8191)
    p = layer2.predict("pallas:v6_splitkv:faithful", s, H200)
    part = p.launches[0].launch
    assert part.programs == 32 * 8  # 32 splits x 8 heads (the plan)
    assert part.steps == 8  # one active row x 256 / 32 key tiles
    s32 = dataclasses.replace(s, dtype="float32")
    names = [lt.launch.name for lt in layer2.predict("cuda:v6_splitkv", s32, H200).launches]
    assert names[:3] == ["host_cast_q", "host_cast_k", "host_cast_v"]  # fp32 input: the host's fp16 casts


def test_predict_record_reports_what_it_cannot_model():
    w = {"batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1, "kv_len": 2048, "head_dim": 64, "dtype": "float16"}
    out = layer2.predict_record(w, {"name": "torch:sdpa"}, None, H200)
    assert "error" in out and "peers excluded" in out["error"]
    ok = layer2.predict_record(w, {"name": "cuda:v6_splitkv"}, None, H200)
    assert ok["time_us"] > 0 and ok["limiter"] in ("issue", "latency", "dram", "l2")


def test_the_ptxas_report_is_cuda_ref_package_data_not_a_results_file():
    """The CUDA twins' registers and shared memory come from the report shipped in the cuda_ref package, read where the
    twins declare their launches (cuda_ref.launches; issue 26 item 1, issue 33: a copy without results/, as on a GPU
    machine or an installed package, still prices CUDA rows)."""
    from cuda_ref import launches as twins

    assert twins.PTXAS_REPORT.parts[-3:] == ("cuda_ref", "resources", "ptxas_sm90a.txt")
    assert twins.PTXAS_REPORT.is_file() and "results" not in twins.PTXAS_REPORT.parts
    w = {"batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1, "kv_len": 2048, "head_dim": 64, "dtype": "float16"}
    out = layer2.predict_record(w, {"name": "cuda:v6_splitkv"}, None, H200)
    assert "error" not in out and out["time_us"] > 0


def test_predict_record_without_the_ptxas_report_is_a_note(monkeypatch, tmp_path):
    """A copy without results/ (an installed package, a GPU machine's checkout copy): the CUDA rows' layer 2 is an
    error note naming the missing report, never an exception that fails the measurement."""
    w = {"batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1, "kv_len": 2048, "head_dim": 64, "dtype": "float16"}
    from cuda_ref import launches as twins

    monkeypatch.setattr(twins, "PTXAS_REPORT", tmp_path / "absent.txt")
    twins.ptxas_resources.cache_clear()
    try:
        out = layer2.predict_record(w, {"name": "cuda:v6_splitkv"}, None, H200)
    finally:
        twins.ptxas_resources.cache_clear()
    assert "error" in out and "absent.txt" in out["error"] and "ptxas" in out["error"]
    assert str(tmp_path) not in out["error"]  # no path of this machine in a record


def test_score_errors():
    w = {"name": "x", "family": "decode", "batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1, "kv_len": 2048,
         "head_dim": 64, "dtype": "float16"}
    pred = layer2.predict_record(w, "cuda:v6_splitkv", None, H200)
    rec = {"workload": w, "impl": {"name": "cuda:v6_splitkv"}, "metrics": {"time_us_p50": pred["time_us"] / 2},
           "prediction": {"basis": "measured", "measured": {"floor_us": 1.0, "limiter": "HBM"}, "layer2": pred}}
    sc = layer2.score(rec)
    assert sc["layer2_err"] == pytest.approx(1.0)  # predicted twice the measured time
    assert sc["layer1_err"] == pytest.approx(1.0 / (pred["time_us"] / 2) - 1)


# --- scorecard -------------------------------------------------------------------------------------------


def _records(tmp_path):
    env = {"gpu": "NVIDIA H200"}
    w = {"name": "ref_decode_tk2048_d64", "family": "decode", "batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1,
         "kv_len": 2048, "head_dim": 64, "dtype": "float16", "causal": False, "q_offset": 2047}
    t = layer2.predict("cuda:v6_splitkv", w, H200).time_s * 1e6
    lines = [{"type": "header", "run_id": "r"}]
    for impl, fw, meas in (("cuda:v6_splitkv", "cuda", t * 1.1), ("cuda:v4_fused", "cuda", None),
                           ("pallas:v6_splitkv:faithful", "pallas", 1.0), ("torch:sdpa", "torch", 5.0)):
        if meas is None:
            lines.append({"type": "result", "run_id": "r", "env": env, "workload": w, "status": "unsupported",
                          "impl": {"name": impl, "framework": fw}})
            continue
        lines.append({"type": "result", "run_id": "r", "env": env, "workload": w, "status": "ok",
                      "impl": {"name": impl, "framework": fw}, "metrics": {"time_us_p50": meas},
                      "prediction": {"basis": "measured", "measured": {"floor_us": 1.0, "limiter": "HBM"}}})
    path = tmp_path / "records.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_scorecard_renders_from_a_records_file(tmp_path, capsys):
    path = _records(tmp_path)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    sc = scorecard.scorecard(recs)
    allg = next(g for g in sc["groups"] if g["family"] == "all")
    assert allg["n"] == 2  # the peer and the unsupported record are excluded
    dec_cuda = next(g for g in sc["groups"] if g["family"] == "decode/cuda")
    assert dec_cuda["l2_median"] == pytest.approx(abs(1 / 1.1 - 1))
    # the Pallas record measured at 1 us is a miss far above 30%; no stated cause matches it
    assert [m["impl"] for m in sc["misses"]] == ["pallas:v6_splitkv:faithful"]
    assert sc["misses"][0]["cause"] == "open"
    assert scorecard.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| NVIDIA H200 | decode/cuda | 1 |" in out and "misses above 30% (1)" in out and "open" in out


# --- issue 16: per-key steps, aliases, the merge's serial steps, the paged family ---------------------------


def test_key_steps_add_to_the_latency_chain():
    # 132 programs (1 round): 4 steps x 1000 + 64 one-key updates x 200 + 500 fixed cycles
    ln = _ln(programs=132, units=0.0, steps=4.0, key_steps=64.0)
    lt = time_launch(ln, H200, {"c": Cost(issue=0.0, lat=1000.0, fixed=500.0, key=200.0)}, GLOB)
    assert lt.t_latency == pytest.approx((4 * 1000 + 64 * 200 + 500) / CLK)


def test_aliases_follow_their_sources():
    costs = dict(layer2.COSTS)
    costs["warp_rows"] = Cost(issue=9.0, lat=77.0)
    c = layer2.cost_of("paged_warp_rows", costs)
    assert (c.issue, c.lat, c.key, c.fixed) == (9.0, 77.0, 0.0, 0.0)
    assert layer2.cost_of("pallas_attn_paged_tc") == Cost(issue=layer2.COSTS["pallas_attn_v5_wmma_fwd"].issue,
                                                          lat=layer2.COSTS["pallas_attn_v5_wmma_fwd"].lat)


@pytest.mark.parametrize("splits,steps", [(1, 1), (20, 1), (64, 1), (65, 2), (256, 4)])
def test_merge_serial_steps(splits, steps):
    # splitkv.merge: sb = min(64, next_pow2(S)) splits per step of one program per row
    ln = merge_launch("m", rows=8, warps=4, splits=splits, d=128, dram_bytes=0.0)
    assert (ln.steps, ln.units, ln.threads) == (steps, splits * 129, 128)


PAGED = {"batch": 1, "heads_q": 8, "heads_kv": 1, "q_len": 1, "kv_len": 8192, "head_dim": 128,
         "dtype": "float16", "page_size": 256, "q_offset": 8191}


def test_paged_family_launches_from_the_plan():
    # v8_gqa faithful: 40-SM choose_splits -> S 32, chunk 256; TN 32 at d128 -> 8 tiles, 256 one-key updates
    p = layer2.predict("pallas:v8_gqa:faithful", PAGED, H200)
    part, merge = (lt.launch for lt in p.launches)
    assert (p.plan["splits"], p.plan["chunk"]) == (32, 256)
    assert (part.cost, part.programs, part.steps, part.spill_units) == ("pallas_attn_paged_cuda_cores", 32, 8, 0)
    assert part.units == 8 * 8 * 32 * (128 + 2 * 32)  # R x tiles x TN x (D + the per-key [R, TN] sweeps)
    kv, q, ws = 2 * 8192 * 128 * 2, 8 * 128 * 2, 8 * 32 * 129 * 4
    assert part.dram_bytes == kv + q + ws and part.l2_bytes == 0  # G = 8 rows: one row tile
    assert (merge.programs, merge.steps) == (8, 1)
    # v8_gqa_ss: one update per 32 keys, no per-key chain
    ss = layer2.predict("pallas:v8_gqa_ss:faithful", PAGED, H200).launches[0].launch
    assert (ss.steps, ss.spill_units, ss.units) == (8, 0.0, 8 * 8 * 32 * 128)
    # v8_gqa_tc: 16-row MMA tiles, priced as v5's Pallas block
    tc = layer2.predict("pallas:v8_gqa_tc:faithful", PAGED, H200).launches[0].launch
    assert (tc.cost, tc.steps, tc.units, tc.gather_steps) == ("pallas_attn_paged_tc", 8, 4 * 16 * 32 * 128 * 8, 8)


def test_registry_row_configs_resolve_to_the_kernels():
    # v8_gqa_db's 'faithful' is v8_gqa's 'double_buffered' (prefetch), not v8_gqa's 'faithful'
    db = layer2.predict("pallas:v8_gqa_db:faithful", PAGED, H200)
    assert db.plan["partial"]["prefetch"] is True
    assert layer2.predict("pallas:v8_gqa:faithful", PAGED, H200).plan["partial"]["prefetch"] is False


def test_score_recompute_ignores_the_carried_prediction():
    w = {"name": "x", "family": "decode", "batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1, "kv_len": 2048,
         "head_dim": 64, "dtype": "float16", "env": None}
    t = layer2.predict("cuda:v6_splitkv", w, H200).time_s * 1e6
    rec = {"workload": w, "impl": {"name": "cuda:v6_splitkv"}, "metrics": {"time_us_p50": t},
           "env": {"gpu": "NVIDIA H200"}, "prediction": {"layer2": {"time_us": 2 * t, "limiter": "dram"}}}
    assert layer2.score(rec)["layer2_err"] == pytest.approx(1.0)  # the carried prediction
    assert layer2.score(rec, recompute=True)["layer2_err"] == pytest.approx(0.0, abs=1e-9)


def test_scoring_run_workloads_take_the_reference_shapes_causes():
    from compare import scorecard

    ref = scorecard._cause("cuda:v5_wmma", "ref_prefill_causal_n8192_d64_f16")
    assert ref.startswith("causal imbalance")
    assert scorecard._cause("cuda:v5_wmma", "score_a_prefill_causal_n8192_d64_f16") == ref
    assert scorecard._cause("pallas:fa_train:d64", "score_a_train_n2048_d64_f16") == "open"


def test_fa_prefill_schedule_counts_window_tiles_and_balance():
    """fa_prefill's layer-2 work counts by hand (session 10, issue 35): the busiest CTA's key tiles under causal,
    a window and several row tiles per CTA; the balanced rounds; pallas:auto priced as the config it chose."""
    from compare import hardware

    s = layer2.Shape(batch=1, heads_q=1, heads_kv=1, q_len=1024, kv_len=1024, head_dim=128, causal=True)
    plan = {"block_q": 64, "block_kv": 128, "tiles": 1, "ctas": 8, "overlap": True, "smem_bytes": 100_000}
    (ln,) = fa_prefill.launches(s, plan, ["k"])
    assert ln.steps == 8  # the last 128-row tile sees keys [0, 1024): 8 tiles of 128
    # window 256: the last tile's rows 896..1023 see keys from 896 - 255 = 641: [641, 1024) = 383 keys, 3 tiles
    (ln,) = fa_prefill.launches(dataclasses.replace(s, window=256), plan, ["k"])
    assert ln.steps == 3
    # 4 row tiles per CTA (2 CTAs a head): the first CTA runs row tiles 7, 5, 3, 1: 8 + 6 + 4 + 2 key tiles
    (ln,) = fa_prefill.launches(s, dict(plan, tiles=4, ctas=2), ["k"])
    assert ln.steps == 20
    vis = 1025 / 2048  # the causal pair fraction at 1024 x 1024: 8 key tiles x vis on the mean row tile
    assert ln.mma == pytest.approx(4 * 128 * 128 * 128 * 8 * vis * 4)  # x 4 row tiles a CTA
    # balanced rounds: 64 heads x 8 tiles = 512 CTAs on 132 SMs, one resident -> 4 rounds; a round costs the mean
    # CTA (8 x vis = 4.004 key tiles), not the busiest (8): max(4.004, 8 / 4)
    h100 = hardware.get("h100")
    (ln,) = fa_prefill.launches(dataclasses.replace(s, heads_q=64, heads_kv=64), dict(plan, ctas=512), ["k"], h100)
    assert layer2.occupancy(384, 168, 100_000)[0] == 1 and ln.steps == pytest.approx(8 * vis)


def test_fa_prefill_prices_each_row_tile_a_cta_runs():
    """Session 11: every row tile a CTA runs pays Cost.key (its Q wait, first and diagonal steps, epilogue), the CTA
    once Cost.fixed; serial and ping-pong share both with the pipelined dataflow. By hand on one round."""
    from compare import hardware

    h100 = hardware.get("h100")
    s = layer2.Shape(batch=1, heads_q=1, heads_kv=1, q_len=1024, kv_len=1024, head_dim=128, causal=True)
    plan = {"block_q": 64, "block_kv": 128, "tiles": 4, "ctas": 2, "overlap": True, "smem_bytes": 200_000}
    (ln,) = fa_prefill.launches(s, plan, ["k"], h100)
    assert ln.key_steps == 4  # 8 row tiles of 128 over 2 CTAs
    (one,) = fa_prefill.launches(s, dict(plan, tiles=1, ctas=8), ["k"], h100)
    assert one.key_steps == 1
    c = layer2.COSTS["pallas_attn_fa_prefill_overlap"]
    assert c.key > 0 and c.fixed > 0
    for name in ("pallas_attn_fa_prefill_serial", "pallas_attn_fa_prefill_pingpong"):
        assert layer2.cost_of(name).key == c.key and layer2.cost_of(name).fixed == c.fixed
    clk = h100.clock_mhz * 1e6
    t = layer2.time_launch(ln, h100)
    mma = ln.mma / layer2.mma_per_clk_sm(h100)
    assert t.rounds == 1
    sfu = max(0.0, ln.sfu / layer2.SFU_PER_CLK_SM - c.sfu_hide * mma)  # session 22: the exposed exponentials
    assert t.t_latency == pytest.approx((ln.steps * c.lat + 4 * c.key + c.fixed + mma + sfu) / clk)


def test_the_softmax_exponentials_are_priced_on_the_sfu_beyond_what_the_mma_hides():
    """Session 22: a launch's ``sfu`` exponentials cost sfu / 16 cycles (the datasheet SFU rate) on its chain, less
    ``Cost.sfu_hide`` times its MMA cycles, never below zero. By hand: D 64 exposes them, D 256 hides them; fa_prefill
    declares one exponential per (row, key) of every key tile it runs."""
    from compare import hardware

    h100 = hardware.get("h100")
    clk = h100.clock_mhz * 1e6
    rate = layer2.mma_per_clk_sm(h100)
    cost = layer2.Cost(issue=0, lat=0.0, sfu_hide=0.25)
    for mma_clk, sfu_ops, exposed in ((1000.0, 16_000, 750.0), (8000.0, 16_000, 0.0)):
        ln = layer2.Launch("k", "x", programs=1, threads=384, regs=168, smem=0, units=0, steps=0, dram_bytes=0,
                           mma=mma_clk * rate, sfu=sfu_ops)
        t = layer2.time_launch(ln, h100, costs={"x": cost})
        assert t.t_latency == pytest.approx((mma_clk + exposed) / clk)
    s = layer2.Shape(batch=1, heads_q=1, heads_kv=1, q_len=1024, kv_len=1024, head_dim=64, causal=False)
    plan = {"block_q": 64, "block_kv": 128, "tiles": 1, "ctas": 8, "overlap": True, "smem_bytes": 100_000}
    (ln,) = fa_prefill.launches(s, plan, ["k"], h100)
    assert ln.sfu == 128 * 128 * 8  # 128 rows x 128 keys per tile, 8 key tiles a CTA (non-causal)
    assert layer2.cost_of("pallas_attn_fa_prefill_serial").sfu_hide == layer2.COSTS[
        "pallas_attn_fa_prefill_overlap"].sfu_hide > 0


def test_auto_is_priced_as_the_config_it_chose():
    from compare import hardware

    h100 = hardware.get("h100")
    w = {"name": "w", "family": "prefill", "batch": 2, "heads_q": 8, "heads_kv": 8, "q_len": 2048, "kv_len": 2048,
         "head_dim": 128, "dtype": "bfloat16", "causal": True}
    kplan = {"block_q": 64, "block_kv": 128, "stages": 2, "pingpong": False, "overlap": True, "tiles": 1,
             "ctas": 2 * 8 * 16, "warpgroups": 3, "smem_bytes": 150_000}
    auto = layer2.predict_record(w, "pallas:auto", {"chose": "fa_prefill:default", "generation": "fa_prefill",
                                                    "config": "default", "kernel_plan": kplan}, h100)
    named = layer2.predict_record(w, "pallas:fa_prefill:default", kplan, h100)
    assert auto["via"] == "pallas:fa_prefill:default" and auto["time_us"] == pytest.approx(named["time_us"])
    fell = layer2.predict_record(w, "pallas:auto", {"chose": "cudnn", "generation": None, "config": None}, h100)
    assert "cudnn" in fell["error"]


def test_windowed_decode_is_priced_by_its_band():
    """fa_decode with a window tiles only the band (session 11): layer 2 plans the splits over the band and charges
    its keys, so Mistral's decode at 32k cached tokens costs what it costs at 4k, an eighth of Llama's full read."""
    from compare import hardware

    h100 = hardware.get("h100")

    def t(kv, window):
        s = layer2.Shape(batch=32, heads_q=32, heads_kv=8, q_len=1, kv_len=kv, head_dim=128, dtype="bfloat16",
                         causal=True, q_offset=kv - 1, window=window)
        return layer2.predict("pallas:fa_decode:default", s, h100).time_s

    assert t(32768, 4096) == pytest.approx(t(4096 + 512, 4096), rel=0.1)
    assert t(32768, 4096) < 0.2 * t(32768, None)


def test_stream_loss_and_ramp_capped_by_the_stream():
    """Session 16's streaming terms: DRAM time is bytes / bandwidth * (1 + dram_loss); the fill / drain ``ramp`` is
    added on top of the limiter, never longer than the stream itself (a short kernel never reaches full rate)."""
    cst = {"c": Cost(0.0, 0.0, ramp=2e-6 * CLK, dram_loss=0.1)}  # a 2 us ramp
    big = time_launch(_ln(units=0.0, steps=0.0, dram_bytes=4.8e9), H200, cst, GLOB)
    assert big.t_dram == pytest.approx(1.1 * 4.8e9 / H200.hbm_bw)
    assert big.t_launch == pytest.approx(2e-6 + 2e-6)  # GLOB launch_us 2.0, then the full ramp
    assert big.time_s == pytest.approx(big.t_dram + 4e-6)
    small = time_launch(_ln(units=0.0, steps=0.0, dram_bytes=1e6), H200, cst, GLOB)  # ~0.23 us of stream
    assert small.t_launch == pytest.approx(2e-6 + small.t_dram)
    assert small.time_s == pytest.approx(2e-6 + 2 * small.t_dram)


def test_ragged_pools_are_priced_at_their_own_lengths():
    """A ragged paged workload reads each sequence's own keys: layer 2's Shape carries their sum (the lengths are
    drawn from the workload's seed, compare.interop.kv_lengths, as layer 1 counts them), and fa_decode's and fa_mla's
    partials charge those bytes, not batch x the longest sequence."""
    from compare import interop
    from compare.workloads import Workload

    h100 = hardware.get("h100")
    w = Workload(name="t", family="paged_decode", batch=32, heads_q=32, heads_kv=8, q_len=1, kv_len=8192,
                 head_dim=128, dtype="bfloat16", causal=True, page_size=64, ragged=True)
    lens = interop.kv_lengths(w)
    s = layer2.Shape.of(w)
    assert s.kv_tokens == int(lens.sum()) and 32 * 4096 <= s.kv_tokens < 32 * 8192
    full = dataclasses.replace(s, kv_tokens=None)
    part = layer2.predict("pallas:fa_decode:default", s, h100).launches[0].launch
    part_full = layer2.predict("pallas:fa_decode:default", full, h100).launches[0].launch
    kv_full = 2 * 32 * 8 * 8192 * 128 * 2
    assert part_full.dram_bytes - part.dram_bytes == pytest.approx(kv_full * (1 - s.kv_tokens / (32 * 8192)))
    assert part.programs == part_full.programs  # the busiest program still walks the longest sequence
    assert layer2.Shape.of(dataclasses.replace(w, ragged=False)).kv_tokens is None


def test_measured_matmul_rate_does_not_move_layer2():
    """Layer 2 prices tensor-core work at the datasheet rate its constants were fitted at, also for the runner's
    ``Hardware`` that carries the run's measured matmul rate (the before-the-run prediction must equal a re-score)."""
    h100 = hardware.get("h100")
    live = h100.with_measured(hbm_bw=3.18e12, flops={"bf16": 762e12, "fp16": 731e12})
    rescore = h100.with_measured(hbm_bw=3.18e12)
    assert layer2.mma_per_clk_sm(live) == layer2.mma_per_clk_sm(h100) == pytest.approx(989.4e12 / (132 * 1.98e9),
                                                                                          rel=0.01)
    s = layer2.Shape(batch=2, heads_q=16, heads_kv=16, q_len=4096, kv_len=4096, head_dim=128, dtype="bfloat16",
                     causal=True)
    assert layer2.predict("pallas:fa_prefill:default", s, live).time_s == \
        layer2.predict("pallas:fa_prefill:default", s, rescore).time_s


def test_fa_decode_head_dim_96_stages_128_columns_and_reads_96():
    """fa_decode at D 96 (session 16) stages and multiplies 128-column tiles (the padding masked) but reads 96 columns
    from HBM: layer 2's partial has D 128's shared memory and MMA units, and D 96's bytes."""
    h100 = hardware.get("h100")

    def partial(d):
        s = layer2.Shape(batch=4, heads_q=32, heads_kv=32, q_len=1, kv_len=8192, head_dim=d, dtype="bfloat16",
                         causal=True, q_offset=8191)
        return layer2.predict("pallas:fa_decode:default", s, h100).launches[0].launch

    p96, p128 = partial(96), partial(128)
    assert (p96.smem, p96.units, p96.programs) == (p128.smem, p128.units, p128.programs)
    kv128 = 2 * 4 * 32 * 8192 * 128 * 2
    assert p96.dram_bytes < p128.dram_bytes and p128.dram_bytes - p96.dram_bytes >= 0.25 * kv128 * 0.99


def test_train_step_launches_by_hand():
    """The train family (session 21): fa_prefill_bwd's declared launches at B 1, H 1, N 256, D 64, non-causal (every
    query block visible): dK/dV CTAs of 128 keys, 4 query-block steps each, 4 products per consumer per step
    (2 x 64 x 64 x 64 FLOP each, two consumers); dQ CTAs of 128 rows, 4 key-block steps, 3 products per consumer;
    fused: dQ over the CTA's keys added to the dK/dV step (one more product per consumer), no dQ kernel, the fp32
    accumulator zeroed and cast by XLA."""
    from pallas_attn.kernels import fa_prefill_bwd as fb

    s = layer2.Shape(batch=1, heads_q=1, heads_kv=1, q_len=256, kv_len=256, head_dim=64, dtype="bfloat16",
                     causal=False, family="train")
    tile = 2 * 64 * 64 * 64  # FLOP of one 64 x 64 x 64 product
    wide = {ln.name: ln for ln in fb.launches(s, fb.CONFIGS["wide"])}
    assert list(wide) == ["delta", fb.PASS_DKDV, fb.PASS_DQ]
    kv, dq = wide[fb.PASS_DKDV], wide[fb.PASS_DQ]
    assert (kv.programs, kv.steps, kv.mma, kv.cost) == (2, 4.0, 4 * 8 * tile, "pallas_attn_fa_prefill_bwd_dkdv")
    assert (dq.programs, dq.steps, dq.mma, dq.cost) == (2, 4.0, 4 * 6 * tile, "pallas_attn_fa_prefill_bwd_dq")
    assert wide["delta"].dram_bytes == 2 * 256 * 64 * 2 + 256 * 4  # dO and O read, one fp32 per row written
    fused = {ln.name: ln for ln in fb.launches(s, fb.CONFIGS["fused"])}
    assert list(fused) == ["delta", fb.PASS_DKDV, "dq_zero", "dq_cast"]
    f = fused[fb.PASS_DKDV]
    assert (f.mma, f.cost) == (4 * 10 * tile, "pallas_attn_fa_prefill_bwd_fused")
    assert f.l2_bytes == kv.l2_bytes + 2 * 4 * 64 * 64 * 4  # + each step's 64 x 64 fp32 reduce-add
    assert fused["dq_cast"].dram_bytes == 256 * 64 * 4 + 256 * 64 * 2
    ovl = {ln.name: ln for ln in fb.launches(s, fb.CONFIGS["wide_ovl"])}
    assert ovl[fb.PASS_DQ].cost == "pallas_attn_fa_prefill_bwd_dq_ovl"


def test_train_records_are_priced_as_forward_loss_and_backward():
    """A train record's layer 2: fa_prefill's forward at the plan's config, the loss, the backward's launches; auto
    through the backward config its plan names; fa_train's pair and a path auto took that layer 2 does not model are
    notes, not predictions."""
    h100 = hardware.get("h100")
    w = {"name": "w", "family": "train", "batch": 4, "heads_q": 12, "heads_kv": 12, "q_len": 2048, "kv_len": 2048,
         "head_dim": 64, "dtype": "bfloat16", "causal": True}
    s = layer2.Shape.of(w)
    lns, pl = layer2.launches_for("pallas:dropin:fused", s, h100, {"forward_config": "default"})
    assert [ln.name for ln in lns][1:] == ["loss", "delta", "pallas_attn_fa_prefill_bwd_dkdv", "dq_zero", "dq_cast"]
    assert lns[0].cost.startswith("pallas_attn_fa_prefill_") and pl["backward_config"] == "fused"
    named = layer2.predict_record(w, "pallas:dropin:wide", {"forward_config": "default"}, h100)
    auto = layer2.predict_record(w, "pallas:auto", {"generation": "fa_prefill", "config": "default",
                                                    "bwd_config": "wide", "chose": "fa_prefill:default+bwd:wide"}, h100)
    assert named["time_us"] > 0 and auto["time_us"] == pytest.approx(named["time_us"])
    parts = layer2.predict("pallas:dropin:wide", w, h100, {"forward_config": "default"})
    assert parts.time_s * 1e6 == pytest.approx(named["time_us"]) and len(parts.launches) == 5
    assert "fa_train" in layer2.predict_record(w, "pallas:fa_train:default", None, h100)["error"]
    fell = layer2.predict_record(w, "pallas:auto", {"generation": "fa_prefill", "config": "default",
                                                    "bwd_config": "fa_train:default"}, h100)
    assert "train family" in fell["error"]
