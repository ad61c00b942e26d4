"""Issue 16: layer 2 covers every built generation. The new launch builders (quantized KV, MLA on both
frameworks, the Mosaic prefill, fa_train's forward) pinned on hand-computed cases: the arithmetic of the launch
(programs, units, MMA FLOPs, bytes, shared memory) and of its time, not the fitted values."""

from __future__ import annotations

import dataclasses
import math

import pytest

from compare import hardware, layer2
from compare.layer2 import Cost, Launch, Shape, time_launch

H100 = hardware.get("h100")
CLK = H100.clock_mhz * 1e6  # 1.98 GHz
GLOB = {"l2_bytes_per_clk_sm": 40.0, "l2_resident_fraction": 0.75, "launch_us": 2.0, "gather_lat": 1000.0}
MLA = Shape(batch=64, heads_q=128, heads_kv=1, q_len=1, kv_len=8192, head_dim=576, dtype="bfloat16",
            page_size=64, family="mla", kv_lora_rank=512)


def test_mma_is_priced_at_the_datasheet_rate_on_issue_and_on_the_chain():
    rate = 989.4e12 / (132 * CLK)  # bf16 dense FLOPs per SM-cycle
    assert layer2.mma_per_clk_sm(H100) == pytest.approx(rate)
    # 264 programs of 384 threads with 200 KB of shared memory: 1 resident, 2 on the busiest SM -> 2 rounds
    ln = Launch("k", "c", 264, 384, 168, 200 * 1024, units=0.0, steps=10.0, dram_bytes=0.0, mma=1e6,
                dequant_elems=1000.0)
    lt = time_launch(ln, H100, {"c": Cost(issue=0.0, lat=100.0, fixed=500.0, dequant=0.5)}, GLOB)
    assert lt.resident == 1 and lt.rounds == 2
    assert lt.t_issue == pytest.approx(2 * (1e6 / rate + 1000 * 0.5) / CLK)
    assert lt.t_latency == pytest.approx(2 * (10 * 100 + 500 + 1e6 / rate + 1000 * 0.5) / CLK)
    assert lt.limiter == "latency"


def test_quantized_storage_bytes():
    fp16 = Shape(2, 8, 2, 1, 256, 64)
    assert fp16.kv_bytes == 2.0
    assert Shape(2, 8, 2, 1, 256, 64, kv_dtype="fp8_e4m3").kv_bytes == 1.0
    assert Shape(2, 8, 2, 1, 256, 64, kv_dtype="nvfp4").kv_bytes == 0.5 + 1 / 16  # nibble + micro-scale byte


def test_fa_decode_quantized_bytes_decode_work_and_stages():
    plan = {"block_m": 16, "row_tiles": 1, "block_k": 64, "chunk_blocks": 128, "splits": 1, "num_warps": 4,
            "num_stages": 3, "programs": 256}
    s16 = Shape(32, 32, 8, 1, 8192, 128)
    s8 = Shape(32, 32, 8, 1, 8192, 128, kv_dtype="fp8_e4m3")
    names = ["partial", "merge"]
    from pallas_attn.kernels.fa_decode import CONFIGS, KERNEL

    k = type("K", (), {"passes": names, "name": "fa_decode", "launches": staticmethod(KERNEL.launches)})()
    (a,) = layer2._pallas_launches("fa_decode", k, s16, plan, H100, CONFIGS["default"])
    (b,) = layer2._pallas_launches("fa_decode", k, s8, plan, H100, CONFIGS["default"])
    kv16 = 2 * 32 * 8 * 8192 * 128 * 2
    assert a.dram_bytes == kv16 + 32 * 32 * 128 * 2 and a.dequant_elems == 0
    assert b.dram_bytes == kv16 / 2 + 32 * 32 * 128 * 2
    assert b.cost == "pallas_attn_fa_decode_fp8_e4m3_cast"
    assert b.dequant_elems == 2 * 128 * 64 * 128  # K and V: chunk_blocks x block_k x D each
    assert a.smem == 16 * 128 * 2 + 2 * 64 * 128 * 2 * 2 and b.smem == 16 * 128 * 2 + 2 * 64 * 128 * 2 * 1
    # quant_alt_decode decodes fp8 by bit placement: its own dataflow
    (c,) = layer2._pallas_launches("fa_decode", k, s8, plan, H100, CONFIGS["quant_alt_decode"])
    assert c.cost == "pallas_attn_fa_decode_fp8_e4m3_bits"


def test_mla_mosaic_tile_mma_per_config():
    from pallas_attn.kernels.v12_mla_tc import CONFIGS, KERNEL, launches

    assert KERNEL.launches is launches  # declared beside the kernel; layer 2 prices them
    plan = {"engine": "mosaic", "splits": 1, "chunk": 8192, "block_m": 64, "block_kv": 32, "ctas": 128,
            "smem_bytes": 220044}
    names = ["twin", "mosaic", "mosaic_gpu", "finish"]
    f = launches(MLA, plan, names, H100, CONFIGS["faithful"])
    q = launches(MLA, plan, names, H100, CONFIGS["split_qk"])
    tiles = 8192 // 32
    qk, pv = 2 * 64 * 32 * 576, 2 * 64 * 32 * 512
    assert f[0].steps == tiles and f[0].programs == 128 and f[0].threads == 384
    assert f[0].mma == tiles * (2 * qk + pv)  # S in both consumers
    assert q[0].mma == tiles * (qk + pv)  # S once
    latent = 64 * 8192 * 576 * 2
    assert f[0].dram_bytes == latent + 64 * 128 * 576 * 2 + 64 * 2 * 64 * 1 * 513 * 4
    assert f[0].l2_bytes == latent  # the second 64-head row tile re-reads the latent
    # the finish (session 20's default): one Pallas launch, merge + table check + layout, a program per packed row
    (fin,) = f[1:]
    assert fin.cost == "pallas_attn_merge" and fin.name == "finish" and fin.programs == 64 * 128
    assert fin.dram_bytes == 64 * 2 * 64 * 1 * 513 * 4 + 64 * 128 * 512 * 2  # the split states in, the output out
    # with the kernel's own pass names (layer 2's call) the finish is named the finish, not the work list's plan
    from pallas_attn.kernels.v12_mla_tc import PASS_FINISH

    assert launches(MLA, plan, list(KERNEL.passes), H100, CONFIGS["faithful"])[1].name == PASS_FINISH
    # finish="jnp" (the XLA merge, cast, unpack and select): two XLA launches
    old = launches(MLA, plan, names, H100, dataclasses.replace(CONFIGS["faithful"], finish="jnp"))
    assert [ln.cost for ln in old[1:]] == ["xla_glue", "xla_glue"]  # jnp merge, unpack + poison select
    # kv64: 64-key tiles, S once
    k64 = launches(MLA, dict(plan, block_kv=64), names, H100, CONFIGS["kv64"])
    assert k64[0].steps == 128 and k64[0].mma == 128 * (2 * 64 * 64 * 576 + 2 * 64 * 64 * 512)
    # the fitted chain: one round of steps x lat + fixed + MMA at the datasheet rate
    lt = time_launch(f[0], H100)
    c = layer2.COSTS["pallas_attn_v12_mla_mosaic"]
    assert lt.t_latency == pytest.approx((tiles * c.lat + c.fixed + f[0].mma / layer2.mma_per_clk_sm(H100)) / CLK)


@pytest.mark.parametrize(("batch", "units", "ragged", "restarts"), [
    (64, 64, False, 0.0),  # units a multiple of the batch, equal lengths: one whole sequence a unit, no restart
    (64, 64, True, 63 / 64),  # ragged: a unit crosses (B - 1) / U sequence boundaries on average
    (128, 66, False, 127 / 66),  # more sequences than units: boundaries inside units even at equal lengths
])
def test_mla_work_list_prices_each_pieces_restart(batch, units, ragged, restarts):
    """The work list's chain per unit: its share of the batch's tiles, one tile for a piece boundary, and
    WL_RESTART_TILES for each further piece it runs (session 33's ~12 us restart; docs/mla.md)."""
    from pallas_attn.kernels.v12_mla_tc import CONFIGS, KERNEL, WL_RESTART_TILES, launches

    s = dataclasses.replace(MLA, batch=batch, kv_tokens=batch * 6144 if ragged else None)
    plan = {"engine": "mosaic", "splits": 1, "chunk": 8192, "block_m": 64, "block_kv": 64, "ctas": 2 * units,
            "smem_bytes": 231488, "units": units}
    kern = launches(s, plan, list(KERNEL.passes), H100, CONFIGS["kv64_mc_wl"])[1]
    share = (batch * (6144 if ragged else 8192)) / 64 / units
    assert kern.steps == math.ceil(share + restarts * WL_RESTART_TILES) + 1


def test_v11_mla_pallas_units_are_the_paged_partials():
    plan = {"splits": 16, "chunk": 512, "partial": {"grid": [16, 16, 1], "rows_per_program": 8, "key_tile": 32,
                                                    "keys_per_update": 32, "num_warps": 8},
            "merge": {"grid": [128]}}
    s = Shape(1, 128, 1, 1, 8192, 576, dtype="bfloat16", page_size=64, family="mla", kv_lora_rank=512)
    from pallas_attn.kernels import v11_mla

    part, merge, glue = (layer2._priced(ln, H100) for ln in v11_mla.KERNEL.launches(s, plan, ["p", "m"]))
    assert part.cost == "pallas_attn_paged_cuda_cores" and part.programs == 256
    assert part.units == 8 * 16 * 32 * (576 + 512) / 2 and part.spill_units == 0  # 16 tiles of 32 keys
    assert merge.cost == "pallas_attn_merge" and merge.programs == 128 and glue.cost == "xla_glue"
    # 256 programs: 2 on the busiest SM, issue-bound
    lt = time_launch(part, H100)
    assert lt.t_issue == pytest.approx(2 * part.units * layer2.COSTS["pallas_attn_paged_cuda_cores"].issue / CLK)


def test_cuda_mla_twins_launches():
    from cuda_ref import launches as twins

    lns = twins.launches("v12_mla_tc", MLA, {"splits": 3, "chunk": 2731})
    part, merge = lns
    assert part.name == "v12_mla_tc_partial_kernel<576, 512, __nv_bfloat16, 1>"
    assert part.regs == 224 and part.programs == 2 * 3 * 64
    # dynamic shared memory: sQ 64 x 584 + ring 3 x 32 x 584 (16-bit) + sP 64 x 40 + sRed 4 x 64 fp32
    assert part.smem == 193_024 and part.steps == 86  # ceil(2731 / 32) tiles
    assert merge.name == "paged_merge_kernel" and merge.threads == 512 and merge.gather_steps == 1.0
    fp8 = twins.launches("v12_mla_tc", Shape(**{**MLA.__dict__, "kv_dtype": "fp8_e4m3"}),
                         {"splits": 3, "chunk": 2731})[0]
    assert fp8.smem == 173_568 and fp8.dequant_elems == 86 * 32 * 576 and fp8.name.endswith(", 2>")
    s11 = Shape(1, 128, 1, 1, 8192, 96, dtype="float16", page_size=64, family="mla", kv_dtype="nvfp4")
    p11 = twins.launches("v11_mla", s11, {"splits": 17, "chunk": 482})[0]
    assert p11.name == "v11_mla_partial_kernel<96, 64, 3>" and p11.smem == 7872
    assert p11.steps == 16 * (96 + 64) and p11.programs == 16 * 17  # lane steps: DQK dot + DV broadcast FMAs
    assert p11.dram_bytes == 8192 * 96 * (0.5 + 1 / 16) + 128 * 96 * 2 + 128 * 17 * 66 * 4


def test_fa_prefill_tiles_and_mma():
    plan = {"block_q": 64, "block_kv": 128, "stages": 2, "pingpong": False, "overlap": True, "ctas": 256,
            "warpgroups": 3, "smem_bytes": 85132}
    s = Shape(1, 8, 8, 2048, 2048, 64)
    from pallas_attn.kernels import fa_prefill

    assert fa_prefill.KERNEL.launches is fa_prefill.launches  # the kernel declares them; layer 2 only prices them
    (ln,) = fa_prefill.launches(s, plan, ["fwd"])
    assert ln.cost == "pallas_attn_fa_prefill_overlap" and ln.steps == 16
    assert ln.mma == 4 * 128 * 128 * 64 * 16
    serial = fa_prefill.launches(s, {**plan, "overlap": False}, ["fwd"])[0]
    assert serial.cost == "pallas_attn_fa_prefill_serial"
    assert layer2.cost_of("pallas_attn_fa_prefill_serial").fixed == layer2.COSTS["pallas_attn_fa_prefill_overlap"].fixed
    # causal, no offset: the busiest CTA (the last query block) sees every key tile; the MMA is the mean
    c = fa_prefill.launches(Shape(1, 8, 8, 2048, 2048, 64, causal=True), plan, ["fwd"])[0]
    assert c.steps == 16 and c.mma < ln.mma


def test_v5_wmma_launch_units_steps_and_stage_buffers():
    """v5_wmma's tile program (session 37: an edit once dropped its ``units`` / ``steps`` from the launch, which no
    test saw): two 16-bit dots per key block over every key block, and its K/V buffers by fa_decode's stage rule
    (Triton: ``num_stages`` on wgmma, block_m >= 64; one fewer at block_m 32)."""
    from pallas_attn.kernels import v5_wmma

    for d, bm, bn, buffers in ((64, 64, 64, 3), (128, 32, 64, 2)):
        plan = {"grid": [1024 // bm, 2 * 8], "block_m": bm, "block_n": bn, "num_warps": 4, "num_stages": 3}
        (ln,) = v5_wmma.launches(Shape(2, 8, 8, 1024, 1024, d), plan, ["fwd"])
        assert ln.steps == 1024 // bn and ln.units == 4 * bm * bn * d * (1024 // bn), (d, ln)
        assert ln.programs == (1024 // bm) * 16
        assert ln.smem == (bm * d + 2 * bn * d * buffers) * 2, (d, ln.smem)


def test_ptxas_template_names_with_spaces():
    from cuda_ref import launches as twins

    res = twins.ptxas_resources()
    assert res["v11_mla_partial_kernel<576, 512, 0>"] == (63, 47232)
    assert res["v5_wmma_kernel<64>"][0] > 0  # the single-argument names still parse


def test_quantized_kv_is_refused_where_no_builder_reads_it():
    w = {"name": "w", "family": "paged_decode", "batch": 2, "heads_q": 8, "heads_kv": 2, "q_len": 1,
         "kv_len": 256, "head_dim": 64, "dtype": "float16", "page_size": 16, "kv_dtype": "fp8_e4m3"}
    with pytest.raises(NotImplementedError, match="quantized KV"):
        layer2.predict("pallas:v8_gqa:faithful", w, H100)
    assert "error" in layer2.predict_record(w, "cuda:v9_fp8", None, H100)


def test_every_built_pallas_kernel_declares_its_launches():
    """Issue 26 item 1: layer 2 holds no Pallas kernel's facts; every built generation's kernel declares its launches
    (``Kernel.launches``), and a kernel that declares none is refused by name, not priced by a guess."""
    from pallas_attn import registry

    built = [g for g in registry.ids() if registry.built(g)]
    assert built and all(registry.kernel(g).launches is not None for g in built), [
        g for g in built if registry.kernel(g).launches is None]
    bare = type("K", (), {"name": "nope", "passes": ("p",), "launches": None})()
    with pytest.raises(NotImplementedError, match="'nope'.*declares none"):
        layer2._pallas_launches("nope", bare, Shape(1, 1, 1, 1, 64, 64), {}, H100)


def test_every_cuda_twin_declares_its_launches_in_cuda_ref():
    """Issue 26 item 1, the CUDA side: each twin declares its launches in cuda_ref (``cuda_ref.launches``), its kernels
    read off its .cu; compare.layer2 names no CUDA generation; a twin that declares none is refused by name."""
    import ast
    import re
    from pathlib import Path

    import cuda_ref
    from cuda_ref import launches as twins

    root = Path(layer2.__file__).resolve().parent.parent
    ids = {r.id for r in cuda_ref.table()}
    declared = twins.twins()
    assert set(declared) == {r.id for r in cuda_ref.table() if r.entry in ("dense", "paged", "mla")}
    # the kernels read off the sources, pinned (what layer 2 held by hand before the move)
    assert declared["v1_naive"].kernels == ("v1_qk_kernel", "v1_softmax_kernel", "v1_pv_kernel")
    assert declared["v2_tiled"].kernels == ("v2_qk_kernel<D>", "v1_softmax_kernel", "v2_pv_kernel<D>")
    assert declared["v6_splitkv"].kernels == ("v6_partial_kernel<D>", "v6_merge_kernel")
    assert declared["v8_gqa_tc"].kernels == ("v8_gqa_tc_partial_kernel<D>", "paged_merge_kernel")
    assert declared["v11_mla"].kernels == ("v11_mla_partial_kernel<DQK, DV, F>", "paged_merge_kernel")
    assert declared["v12_mla_tc"].kernels == ("v12_mla_tc_partial_kernel<DQK, DV, T, F>", "paged_merge_kernel")
    assert (declared["v8_gqa_tc"].threads, declared["v8_gqa_tc"].partial) == (32, "wmma")
    assert declared["v8_gqa_ss"].partial == "ss_group" and declared["v8_gqa_occ"].partial == "warp_rows"
    csrc = root / "cuda_ref" / "csrc"
    defined = "".join(p.read_text() for p in sorted(csrc.rglob("*.cu*")))
    for gen, twin in declared.items():
        assert twins.kernels(gen) == twin.kernels and twin.kernels
        own = (csrc / "kernels" / f"{gen}.cu").read_text()
        for i, k in enumerate(twin.kernels):  # a shared kernel (v1's softmax, v7's merge) is defined by its owner
            base = k.split("<")[0]
            assert re.search(rf"__global__[^;{{]*\b{re.escape(base)}\s*\(", defined), (gen, k)
            assert i or base in own, (gen, k)  # the first kernel is the twin's own
    assert set(twins.PARTIALS) <= {twin.kernels[0].split("<")[0] for twin in declared.values()}
    assert {g for g in ids if twins.reads_kv_dtype(g)} == {"v11_mla", "v12_mla_tc"}
    # layer 2 holds no CUDA generation id (the old CUDA_LAUNCHES keys, `gen == "v8_gqa_tc"`, "cuda:(v11_mla|...)")
    tree = ast.parse((root / "compare" / "layer2.py").read_text())
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert not [c for c in consts if c in ids or "cuda:(" in c], [c for c in consts if c in ids or "cuda:(" in c]
    assert not hasattr(layer2, "CUDA_LAUNCHES")
    # the plan the twin runs, and what layer 2 records of it
    s = Shape(2, 8, 2, 1, 4096, 128, page_size=16)
    pl = twins.plan("v8_gqa_tc", s, None, num_sm=132)
    assert pl["launches"] == list(declared["v8_gqa_tc"].kernels) and pl["tile"] == [16, 32]
    part, merge = twins.launches("v8_gqa_tc", s, pl)
    assert part.name == "v8_gqa_tc_partial_kernel<128>" and part.threads == 32 and part.cost == "paged_wmma"
    lns, got = layer2.launches_for("cuda:v8_gqa_tc", s, H100)
    assert got == pl and [ln.name for ln in lns] == [part.name, merge.name]
    # v1/v2 declare S's re-reads; layer 2's residency rule places them (here: 8 MB of S stays in L2)
    soft = twins.launches("v1_naive", Shape(1, 8, 8, 512, 512, 64, "float32"), {})[1]
    assert soft.reread_buffer == 8 * 512 * 512 * 4 and soft.dram_bytes == 0.0
    assert layer2._priced(soft, H100).l2_bytes == soft.reread_bytes
    # a row with no declaration, and no row at all
    w = {"batch": 1, "heads_q": 8, "heads_kv": 8, "q_len": 1, "kv_len": 256, "head_dim": 64, "dtype": "float16"}
    assert "'v9_fp8': it declares none" in layer2.predict_record(w, "cuda:v9_fp8", None, H100)["error"]
    assert "no row 'v99'" in layer2.predict_record(w, "cuda:v99", None, H100)["error"]


def test_a_dense_twin_not_known_by_name_is_priced_by_its_declared_dataflow(monkeypatch):
    """Issue 26 item 7: a frontier kernel's dense CUDA twin needs no branch in cuda_ref.launches; its generation's
    ``twin_dataflow`` picks the builder. A kernel v4_fused's builder does not know by name, declared ``warp_rows`` on
    v4's row (tile 8 x 64), is priced exactly as v4's own kernel; WMMA likewise against v5; an undeclared or unknown
    dataflow is refused by name."""
    from cuda_ref import launches as twins
    from cuda_ref.table import by_id

    real = twins.resources
    monkeypatch.setattr(twins, "resources", lambda k, d: real(k.replace("toy_kernel", "v4_fused_kernel")
                                                              .replace("toy_mma", "v5_wmma_kernel"), d))
    for gen, kern, flow in (("v4_fused", "toy_kernel<D>", "warp_rows"), ("v5_wmma", "toy_mma<D>", "v5_wmma_kernel")):
        row = by_id(gen)
        for s in (Shape(2, 8, 8, 300, 1000, 64, "float32", causal=True, q_offset=700),
                  Shape(1, 4, 4, 1, 4096, 128, "float16")):
            own = twins.launches(gen, s, {})
            toy = twins._dense(twins.Twin((kern,), twins._dense, partial=flow), row, s, {})
            assert [dataclasses.replace(ln, name="") for ln in toy] == [dataclasses.replace(ln, name="") for ln in own]
            assert toy[-1].cost == flow
    for flow in ("", "ss_group"):
        with pytest.raises(NotImplementedError, match=r"toy_kernel<D>.*twin_dataflow"):
            twins._dense(twins.Twin(("toy_kernel<D>",), twins._dense, partial=flow), by_id("v4_fused"),
                         Shape(1, 1, 1, 1, 64, 64, "float32"), {})
