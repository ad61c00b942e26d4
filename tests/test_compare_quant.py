"""compare on quantized-KV workloads (docs/quantized_kv.md §6): the ``kv_dtype`` workload field, the quantized
entry's support and refusals, inputs quantized over the whole cache and paged with one permutation, the
same-quantized oracle and the quantization error, the roofline at storage bytes with the dequant ALU bound, the
capacity table, and ``compare run --config quant_decode`` on the CPU."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from attn_core import oracle as core_oracle
from compare import accuracy, cli, hardware, impls, interop, layer2, records, roofline
from compare.schema import Ctx
from compare.workloads import ConfigError, Workload, load_config

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)


def _w(**kw) -> Workload:
    base = dict(name="t", family="decode", batch=2, heads_q=8, heads_kv=2, q_len=1, kv_len=96, head_dim=64,
                dtype="float16", q_offset=95, kv_dtype="fp8_e4m3", seed=3)
    base.update(kw)
    return Workload(**base)


# ------------------------------------------------------------------------------------------------ schema


def _write(tmp_path, body: str):
    p = tmp_path / "q.toml"
    p.write_text(body)
    return p


_BASE = ('[[workload]]\nname = "d_{kv_dtype}"\nfamily = "decode"\nbatch = 1\nheads_q = 4\nq_len = 1\n'
         'kv_len = 64\nhead_dim = 64\ndtype = "float16"\n')


def test_kv_dtype_sweeps_and_names(tmp_path):
    ws = load_config(_write(tmp_path, _BASE + 'kv_dtype = ["fp8_e4m3", "nvfp4", "float16"]\n'))
    assert [(w.name, w.kv_dtype) for w in ws] == [("d_fp8_e4m3", "fp8_e4m3"), ("d_nvfp4", "nvfp4"),
                                                  ("d_float16", None)]  # the workload dtype spelt out = absent
    assert ws[0].as_dict()["kv_dtype"] == "fp8_e4m3"


@pytest.mark.parametrize("extra,msg", [
    ('kv_dtype = "int4"\n', "kv_dtype must be one of"),
    ('kv_dtype = "bfloat16"\n', "kv_dtype must be one of"),
    ('kv_dtype = 8\n', "kv_dtype must be one of"),
    ('kv_dtype = "nvfp4"\nhead_dim = 72\n', "multiple of 16"),
    ('kv_dtype = "fp8_e4m3"\ndevices = 2\n', "one device"),
])
def test_bad_kv_dtype_names_file_and_entry(tmp_path, extra, msg):
    body = _BASE.replace("head_dim = 64\n", "") if "head_dim" in extra else _BASE
    with pytest.raises(ConfigError, match=msg) as e:
        load_config(_write(tmp_path, body + extra))
    assert "q.toml" in str(e.value) and "workload[0]" in str(e.value)


def test_quant_decode_config_ships_the_issue_workloads():
    ws = {w.name: w for w in load_config("quant_decode")}
    for n in ("decode_gqa_b32_s8192_fp8_e4m3", "decode_gqa_b32_s8192_nvfp4", "decode_gqa_b1_s131072_fp8_e4m3",
              "decode_gqa_b1_s131072_nvfp4", "paged_gqa_b32_s8192_page64_fp8_e4m3", "paged_gqa_b1_s131072_page64_nvfp4",
              "decode_gqa_b32_s8192_fp16", "decode_gqa_b1_s131072_fp16", "paged_gqa_b32_s8192_page64_fp16",
              "paged_gqa_b1_s131072_page64_fp16"):
        assert n in ws, n
    assert ws["paged_gqa_b32_s8192_page64_nvfp4"].page_size == 64
    assert ws["decode_gqa_b32_s8192_fp16"].kv_dtype is None
    # every quantized shape and layout has its fp16-KV baseline in the same config (the ratio to fp16 within one run)
    for w in ws.values():
        if w.kv_dtype and "smoke" not in w.tags:
            base = ws[w.name.replace(w.kv_dtype, "fp16")]
            assert base.kv_dtype is None and not base.ragged and not w.ragged, w.name
            assert [getattr(base, f) for f in ("family", "batch", "heads_q", "heads_kv", "kv_len", "page_size")] == \
                [getattr(w, f) for f in ("family", "batch", "heads_q", "heads_kv", "kv_len", "page_size")], w.name
    small = [w for w in ws.values() if "smoke" in w.tags]
    assert {w.kv_dtype for w in small} == {"fp8_e4m3", "nvfp4"} and {w.family for w in small} == {"decode",
                                                                                                  "paged_decode"}


# ----------------------------------------------------------------------------------- support and refusals


def _by_name():
    return {i.name: i for i in impls.all_impls()}


@pytest.mark.parametrize("family", ["decode", "paged_decode"])
def test_quantized_entry_and_refusals(family):
    kw = {"page_size": 16} if family == "paged_decode" else {}
    w = _w(family=family, kv_dtype="nvfp4", **kw)
    p = impls.problem_of(w)
    assert p.entry == "quantized" and p.kv_dtype == "nvfp4"
    assert (p.page_size is not None) == (family == "paged_decode")
    by = _by_name()
    assert by["pallas:fa_decode:default"].supports(w, CPU).ok
    facts = by["pallas:fa_decode:default"].roofline(w)
    from pallas_attn import registry

    assert facts.precision == "nvfp4" and facts.dequant_ops == registry.kernel("fa_decode").kv_dequant_ops["nvfp4"]
    mirror = "pallas:v8_gqa_ss:faithful" if family == "paged_decode" else "pallas:fa_train:default"
    twin = "cuda:v8_gqa_ss" if family == "paged_decode" else "cuda:v6_splitkv"
    for name in (mirror, twin, "jax:xla", "jax:cudnn", "torch:flash"):
        s = by[name].supports(w, CPU)
        assert not s.ok and s.status == "unsupported" and "nvfp4" in s.reason and "fp16" in s.reason, (name, s)
    # the paged quantized generations (v9_fp8 / v10_nvfp4) read their own format, from paged pools only
    v9, v10 = by["pallas:v9_fp8:faithful"].supports(w, CPU), by["pallas:v10_nvfp4:faithful"].supports(w, CPU)
    assert v9.status == "unsupported" and "fp8_e4m3" in v9.reason, v9
    if family == "paged_decode":
        assert v10.ok, v10
    else:
        assert v10.status == "unsupported" and "paged pools only" in v10.reason, v10
    assert by["pallas:fa_decode_cp:psum"].supports(w, CPU).status in ("unsupported", "n/a")
    # the same workload with fp16 KV: the mirror generation and the CPU peer apply again
    plain = _w(family=family, kv_dtype=None, **kw)
    assert by[mirror].supports(plain, CPU).ok
    assert impls.problem_of(plain).entry == ("paged" if kw else "dense")


def test_layer2_charges_quantized_kv_at_storage_bytes_not_fp16():
    """Layer 2 prices a quantized-KV fa_decode by its storage bytes plus decode work, never as fp16 KV."""
    shape = dict(batch=32, heads_q=32, heads_kv=8, kv_len=8192, head_dim=128, q_offset=8191)
    kv_elems = 2 * 32 * 8 * 8192 * 128
    quant = layer2.predict("pallas:fa_decode:default", _w(**shape), "h100")
    plain = layer2.predict("pallas:fa_decode:default", _w(kv_dtype=None, **shape), "h100")
    q_bytes = sum(lt.launch.dram_bytes for lt in quant.launches)
    p_bytes = sum(lt.launch.dram_bytes for lt in plain.launches)
    assert p_bytes >= kv_elems * 2 and q_bytes < p_bytes - kv_elems * 0.9  # 1 B per fp8 element, not 2
    assert sum(lt.launch.dequant_elems * lt.launch.programs for lt in quant.launches) >= kv_elems
    assert all(lt.launch.dequant_elems == 0 for lt in plain.launches)
    rec = layer2.predict_record(_w(**shape).as_dict(), "pallas:fa_decode:default", None, hardware.get("h100"))
    assert "error" not in rec and rec["time_us"] > 0


# ---------------------------------------------------------------------------------------------- roofline


def _decode_problem(kv_dtype, ops, **kw):
    w = _w(batch=32, heads_q=32, heads_kv=8, kv_len=8192, head_dim=128, q_offset=8191, kv_dtype=kv_dtype, **kw)
    from compare.schema import RooflineFacts

    return roofline.problem_for(w, RooflineFacts(roofline.kv_precision(w), dequant_ops=ops))


@pytest.mark.parametrize("fmt,bpe", [("fp8_e4m3", 1.0), ("nvfp4", 0.5625)])
def test_roofline_charges_kv_at_storage_bytes_and_q_o_at_two(fmt, bpe):
    h100 = hardware.get("h100")
    kv_elems = 2 * 32 * 8 * 8192 * 128
    qo = 2 * 32 * 32 * 128 * 2.0
    est = roofline.estimate(_decode_problem(fmt, 4.5), h100)
    assert est.bytes == kv_elems * bpe + qo + roofline.SCALE_BYTES
    assert est.t_alu == pytest.approx(kv_elems * 4.5 / (132 * 64 * 1.98e9))
    assert est.times["ALU"] == est.t_alu and est.engine == "fp16"
    # NVFP4 at 4.5 ops per element: the decode, not the bytes, is the floor (docs/quantized_kv.md §3)
    assert est.limiter == ("ALU" if fmt == "nvfp4" else "HBM") and est.floor_s == max(est.times.values())
    no_ops = roofline.estimate(_decode_problem(fmt, 0.0), h100)
    assert "ALU" not in no_ops.times and no_ops.limiter == "HBM" and no_ops.bytes == est.bytes


def test_fp16_workloads_keep_the_three_bounds():
    w = _w(batch=32, heads_q=32, heads_kv=8, kv_len=8192, head_dim=128, q_offset=8191, kv_dtype=None)
    p = roofline.problem_for(w, None)
    est = roofline.estimate(p, hardware.get("h100"))
    assert not p.quantized_kv and est.t_alu == 0.0 and set(est.times) == {"MMA", "HBM", "MUFU"}
    assert est.bytes == 2 * 32 * 8 * 8192 * 128 * 2 + 2 * 32 * 32 * 128 * 2
    with pytest.raises(ValueError, match="dequant_ops"):
        roofline.Problem(batch=1, heads_q=1, q_len=1, kv_len=8, head_dim=64, dequant_ops=1.0)


def test_capacity_table_reproduces_the_reference_figures(capsys):
    # KV [1, 8, 65536, 128]: fp16 268.44 MB, fp8 134.22 MB, NVFP4 75.50 MB; MHA at 128 heads 4294.97 MB
    # (docs/reference.md §2.15, §2.16); a quantized cache adds its 8 bytes of tensor scales
    rows = {(r["layout"], r["format"]): r for r in roofline.capacity_table(heads_q=128, head_dim=128, tokens=65536)}
    assert round(rows[("GQA-8", "fp16")]["total_bytes"] / 1e6, 2) == 268.44
    assert round(rows[("GQA-8", "fp8_e4m3")]["total_bytes"] / 1e6, 2) == 134.22
    assert round(rows[("GQA-8", "nvfp4")]["total_bytes"] / 1e6, 2) == 75.50
    assert round(rows[("MHA", "fp16")]["total_bytes"] / 1e6, 2) == 4294.97
    assert rows[("GQA-8", "nvfp4")]["bytes_per_token"] == 2 * 8 * 128 * 0.5625
    assert rows[("GQA-8", "fp8_e4m3")]["total_bytes"] == 2 * 8 * 128 * 65536 + 8
    assert cli.main(["predict", "--capacity", "--shape", "1x128x65536x128"]) == 0
    out = capsys.readouterr().out
    assert "GQA-8" in out and "75.50" in out and "4294.97" in out
    assert cli.main(["predict", "--capacity", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["heads_q"] == 32 and len(got["rows"]) == 6
    assert cli.main(["predict", "--capacity", "--shape", "1x12x64x64", "--gqa-group", "5"]) == 2


def test_predict_kv_dtype_with_the_generation(capsys):
    argv = ["predict", "--arch", "h100", "--shape", "32x32x1x128", "--kv-len", "8192", "--gqa-group", "4",
            "--generation", "fa_decode", "--kv-dtype", "nvfp4", "--json"]
    assert cli.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["problem"]["quantized_kv"] and got["problem"]["precision"] == "nvfp4"
    assert got["estimate"]["limiter"] == "ALU" and "error" in got["layer2"]
    assert cli.main(argv[:-3] + ["--generation", "v8_gqa_ss", "--kv-dtype", "fp8_e4m3"]) == 2


# ------------------------------------------------------------------------------------ inputs and the oracle


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4"])
def test_dense_oracle_is_the_same_quantized_reference(fmt):
    w = _w(kv_dtype=fmt)
    inp = interop.make_inputs(w)
    from pallas_attn import quant

    assert quant.kv_format(inp.k_quant) == fmt and inp.k_quant.shape == inp.k.shape
    sub = accuracy.choose_subset(w)
    got = accuracy.oracle(w, inp, sub)
    want, _ = core_oracle.quantized_attention_reference(np.asarray(inp.q), np.asarray(inp.k), np.asarray(inp.v),
                                                        kv_format=roofline.KV_PRECISION[fmt], scale=inp.scale)
    np.testing.assert_allclose(got, sub.take(want), rtol=0, atol=1e-12)
    fp16 = accuracy.oracle(w, inp, sub, kv="fp16")
    q = accuracy.quantization_error(got, fp16)
    assert 0 < q["rmse"] <= q["max_abs"] < 0.2
    # an implementation that ignored the quantization would be judged against the storage oracle: for NVFP4 the
    # format's error is far above the fp16 tolerance, so such a run fails agreement
    if fmt == "nvfp4":
        assert accuracy.errors(fp16, got)[1] > accuracy.tolerance("fp16")


def test_paged_inputs_page_every_field_with_one_permutation():
    w = _w(family="paged_decode", batch=3, kv_len=40, q_offset=39, page_size=8, ragged=True, kv_dtype="nvfp4")
    inp = interop.make_inputs(w)
    lens = interop.kv_lengths(w)
    assert inp.k_quant is None and inp.k_pool.packed.shape[1:] == (8, 2, 32) and inp.k_pool.micro.shape[-1] == 4
    table = np.asarray(inp.block_table)
    from pallas_attn import quant

    dense = quant.quantize_nvfp4(inp.k)  # the whole dense cache's bytes, one tensor scale
    assert float(inp.k_pool.scale) == float(dense.scale)
    for b in range(w.batch):
        n_pages = -(-int(lens[b]) // 8)
        for f in ("packed", "micro"):
            pool = np.asarray(getattr(inp.k_pool, f))[table[b, :n_pages]].reshape(n_pages * 8, 2, -1)
            np.testing.assert_array_equal(pool[: lens[b]], np.asarray(getattr(dense, f))[b, : lens[b]])
    sub = accuracy.choose_subset(w)
    got = accuracy.oracle(w, inp, sub)  # gathered through the table from the quantized pools
    want, _ = core_oracle.quantized_attention_reference(
        np.asarray(inp.q), np.asarray(inp.k), np.asarray(inp.v), kv_format="nvfp4", scale=inp.scale, kv_len=lens)
    np.testing.assert_allclose(got, sub.take(want), rtol=0, atol=1e-12)
    fp16 = accuracy.oracle(w, inp, sub, kv="fp16")
    assert accuracy.errors(got, fp16)[1] > 0


# --------------------------------------------------------------------------------------- compare run, CPU


@pytest.fixture(scope="module")
def quant_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("qrun")
    argv = ["run", "--config", "quant_decode", "--quiet", "--out", str(out),
            "--only", "quant_smoke_*:pallas:fa_decode:default", "--only", "decode_gqa_b32_s8192_nvfp4"]
    assert cli.main(argv) == 0
    return [r for r in records.read_jsonl(out / "records.jsonl") if r["type"] == "result"]


@pytest.mark.slow
def test_run_quant_decode_on_cpu(quant_run):
    res = {(r["workload"]["name"], r["impl"]["name"]): r for r in quant_run}
    for r in quant_run:
        assert records.validate(r) == []
    for fmt in ("fp8_e4m3", "nvfp4"):
        for wl in (f"quant_smoke_decode_{fmt}", f"quant_smoke_paged_ragged_{fmt}"):
            r = res[(wl, "pallas:fa_decode:default")]
            ag = r["agreement"]
            assert r["status"] == "ok", r["reason"]
            assert r["workload"]["kv_dtype"] == fmt and ag["precision"] == "fp16" and ag["tol_rel_l2"] == 1e-2
            assert ag["rel_l2_err"] < 2e-3 and fmt in ag["subset"]["oracle"]
            assert ag["quantization"]["rmse"] > 0 and ag["vs_fp16_kv"]["rmse"] > 0
            assert math.isclose(ag["vs_fp16_kv"]["rmse"], ag["quantization"]["rmse"], rel_tol=0.1)
            pred = r["prediction"]
            assert pred["precision"] == roofline.KV_PRECISION[fmt] and pred["quantized_kv"]["kv_dtype"] == fmt
            assert pred["datasheet"]["t_alu_us"] > 0
    big = "decode_gqa_b32_s8192_nvfp4"
    fa = res[(big, "pallas:fa_decode:default")]
    assert fa["status"] == "skipped" and "too large for CPU interpret mode" in fa["reason"]
    assert fa["prediction"]["by_arch"]["h100"]["limiter"] == "ALU"
    for name in ("jax:cudnn", "torch:cudnn", "pallas:v6_splitkv:faithful", "cuda:v6_splitkv"):
        assert res[(big, name)]["status"] == "unsupported" and "nvfp4" in res[(big, name)]["reason"]
    v10 = res[(big, "pallas:v10_nvfp4:faithful")]  # a dense cache: v10_nvfp4 reads paged pools only
    assert v10["status"] == "unsupported" and "paged pools only" in v10["reason"]
