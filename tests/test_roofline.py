"""The roofline model pinned to the reference's published figures (docs/reference.md §2-§3)."""

import pytest

from compare import hardware, roofline
from compare.roofline import Problem, estimate

T4 = hardware.get("t4")


def test_v1_naive_ai_and_t4_floors():
    e = estimate(Problem(1, 8, 512, 512, 64, "fp32", materialize_s=True), T4)
    assert round(e.ai, 2) == 0.25 and e.limiter == "HBM"
    assert round(e.floor_s * 1e3, 2) == 6.82
    e = estimate(Problem(1, 8, 2048, 2048, 64, "fp32", materialize_s=True), T4)
    assert round(e.floor_s * 1e3, 1) == 109.1
    e = estimate(Problem(1, 8, 2048, 2048, 128, "fp32", materialize_s=True), T4)
    assert round(e.floor_s * 1e3, 1) == 216.5


@pytest.mark.parametrize("d,tile,ai", [(64, (64, 64), 8.0), (128, (32, 32), 6.4)])
def test_v2_tiled_ai(d, tile, ai):
    e = estimate(Problem(1, 8, 2048, 2048, d, "fp32", materialize_s=True, tile=tile), T4)
    assert round(e.ai, 1) == ai and e.limiter == "HBM"


@pytest.mark.parametrize("n", [512, 2048, 8192])
def test_fused_fp32_ai_is_n_over_4(n):
    e = estimate(Problem(1, 8, n, n, 64, "fp32"), T4)
    assert e.ai == pytest.approx(n / 4, rel=1e-12) and e.limiter == "MMA"


def test_fused_fp32_floors_v3():
    floors = [estimate(Problem(1, 8, n, n, d, "fp32"), T4).floor_s * 1e3
              for n in (512, 2048, 8192) for d in (64, 128)]
    assert [round(f, 3) for f in floors] == [0.066, 0.133, 1.060, 2.121, 16.968, 33.936]


@pytest.mark.parametrize("g", [1, 4, 8])
@pytest.mark.parametrize("prec,b", [("fp16", 2), ("fp8", 1)])
def test_decode_ai_is_2g_over_b(g, prec, b):
    e = estimate(Problem(8, 8 * g, 1, 8192, 128, prec, group=g), hardware.get("a100"))
    assert e.ai == pytest.approx(2 * g / b, rel=2e-3) and e.limiter == "HBM"


@pytest.mark.parametrize("prec,ai", [("fp16", 234.8), ("fp8", 469.7), ("nvfp4", 835.0)])
def test_mla_ai_reference_conventions(prec, ai):
    p = Problem(1, 128, 1, 8192, 576, prec, group=128, mla=True, reference_conventions=True)
    assert round(estimate(p, hardware.get("b300")).ai, 1) == ai


def test_mla_real_width_io_departs_only_in_q_and_o():
    ref = estimate(Problem(1, 128, 1, 8192, 576, "nvfp4", group=128, mla=True, reference_conventions=True),
                   hardware.get("b300"))
    ours = estimate(Problem(1, 128, 1, 8192, 576, "nvfp4", group=128, mla=True), hardware.get("b300"))
    assert ours.flops == ref.flops
    assert ours.bytes - ref.bytes == pytest.approx(128 * (576 + 512) * (2 - 0.5625))


def test_single_stream_decode_uses_about_0p3_percent_of_h100_tensor_cores():
    e = estimate(Problem(1, 32, 1, 8192, 128, "fp16"), hardware.get("h100"))
    assert e.limiter == "HBM"
    frac = roofline.tc_ceiling_fraction(e)
    assert 0.0025 < frac < 0.0040


def test_causal_counts_visible_pairs_unless_reference_conventions():
    full = estimate(Problem(1, 8, 1024, 1024, 64, "fp16", causal=True, reference_conventions=True), T4)
    ours = estimate(Problem(1, 8, 1024, 1024, 64, "fp16", causal=True), T4)
    assert ours.flops / full.flops == pytest.approx(1025 / 2048)
    assert roofline.visible_pairs(3, 10, 0) == 6 and roofline.visible_pairs(1, 10, 9) == 10


def test_problem_for_takes_the_declared_facts():
    from compare.schema import RooflineFacts
    from compare.workloads import Workload

    w = Workload("w", "prefill", 1, 8, 8, 2048, 2048, 128, "float32")
    peer = roofline.problem_for(w, None)  # a peer: the workload's dtype, fused
    assert (peer.precision, peer.materialize_s, peer.tile) == ("fp32", False, (1, 1))
    p = roofline.problem_for(w, RooflineFacts("fp32", materialize_s=True, tile=(32, 32)))
    assert (p.precision, p.materialize_s, p.tile) == ("fp32", True, (32, 32))
    assert roofline.problem_for(w, RooflineFacts("fp16", tile=(8, 64))).tile == (1, 1)  # fused: no S reuse term
    assert roofline.problem_for(w, RooflineFacts("fp16")).precision == "fp16"


def test_problem_for_reads_the_pallas_contract():
    """v2 at D=128 charges its declared 32x32 tiles, v5 its fp16 operands (fp32 input it refuses: no silent
    host cast): from the kernel contracts, through the same path as a run's records."""
    from compare import impls
    from compare.workloads import Workload

    w = Workload("w", "prefill", 1, 8, 8, 2048, 2048, 128, "float32")
    by = {i.name: i for i in impls.pallas_impls()}
    v2 = roofline.problem_for(w, by["pallas:v2_tiled:faithful"].roofline(w))
    assert (v2.precision, v2.materialize_s, v2.tile) == ("fp32", True, (32, 32))
    assert round(estimate(v2, T4).ai, 1) == 6.4
    w16 = Workload("w16", "prefill", 1, 8, 8, 2048, 2048, 128, "float16")
    assert roofline.problem_for(w16, by["pallas:v5_wmma:faithful"].roofline(w16)).precision == "fp16"
    assert not by["pallas:v5_wmma:faithful"].supports(w, impls.Ctx(jax_gpu=False, torch_cuda=False, hopper=False,
                                                                   interpret=True)).ok


def test_hardware_table_has_sources_and_detects_names():
    for key in ("t4", "a100", "h100", "h200", "b200", "b300"):
        hw = hardware.get(key)
        assert hw.sources and hw.hbm_bw > 0 and "fp16" in hw.flops
    assert hardware.detect("NVIDIA H100 80GB HBM3").key == "h100"
    assert hardware.detect("NVIDIA H200").key == "h200"
    assert hardware.detect("Intel Arc") is None
    m = hardware.get("h200").with_measured(hbm_bw=4.27e12, flops={"fp16": 760e12})
    assert m.hbm_bw == 4.27e12 and m.flops["fp16"] == 760e12 and "measured" in m.sources["hbm_bw"]
