"""compare's MLA side (issue 13, docs/mla.md): workloads, the paged latent inputs, the MLA oracle subset, the peers,
the capacity table and the layer-1 numbers (pinned by hand), and the compare run end to end on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from attn_core import oracle
from compare import accuracy, cli, interop, peers, predict, records, roofline
from compare.schema import Ctx
from compare.workloads import ConfigError, load_config

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)
GPU = Ctx(jax_gpu=True, torch_cuda=True, hopper=True, interpret=False)

ISSUE = ("mla_b1_s8192_bf16", "mla_b1_s32768_bf16", "mla_b64_s8192_bf16", "mla_b64_s8192_fp8", "mla_b64_s32768_bf16")


def _by_name():
    return {w.name: w for w in load_config("mla")}


# -------------------------------------------------------------------------------------------- workloads


def test_mla_config_ships_the_issue_and_reference_workloads():
    ws = _by_name()
    for name in ISSUE:
        w = ws[name]
        assert (w.family, w.heads_q, w.heads_kv, w.q_len, w.head_dim, w.kv_lora_rank, w.rope_dim, w.page_size) == (
            "mla", 128, 1, 1, 576, 512, 64, 64)
        assert w.dtype == "bfloat16" and w.q_offset == w.kv_len - 1
        assert w.kv_dtype == ("fp8_e4m3" if name.endswith("fp8") else None)
        assert (w.batch, w.kv_len) == (int(name.split("_")[1][1:]), int(name.split("_")[2][1:]))
    ref = {(w.head_dim, w.kv_lora_rank, w.kv_len) for w in ws.values() if "reference" in w.tags}
    assert ref == {(d, dv, n) for d, dv in ((96, 64), (160, 128), (576, 512)) for n in (8192, 32768)}
    for w in ws.values():
        if "reference" in w.tags:
            assert (w.batch, w.heads_q, w.kv_dtype, w.dtype, w.page_size) == (1, 128, "nvfp4", "float16", 64)


@pytest.mark.parametrize("extra,msg", [
    ({"page_size": 48}, "mla needs page_size, a power of two"),
    ({"heads_kv": 2, "heads_q": 16}, "heads_kv must be 1"),
    ({"head_dim": 100}, "kv_lora_rank \\+ rope_dim"),
    ({"kv_dtype": "nvfp4", "head_dim": 72, "kv_lora_rank": 64, "rope_dim": 8}, "multiple of 16"),
])
def test_mla_workload_errors_name_the_entry(tmp_path, extra, msg):
    base = {"name": "m", "family": "mla", "batch": 1, "heads_q": 16, "heads_kv": 1, "q_len": 1, "kv_len": 64,
            "head_dim": 96, "kv_lora_rank": 64, "rope_dim": 32, "page_size": 16, "dtype": "bfloat16"}
    base.update(extra)
    lines = ["[[workload]]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in base.items() if v is not None]
    (tmp_path / "c.toml").write_text("\n".join(lines).replace("True", "true") + "\n")
    with pytest.raises(ConfigError, match=msg):
        load_config(tmp_path / "c.toml")


# ------------------------------------------------------------------------------------------ capacity


def test_mla_page_size_defaults_to_64():
    w = next(w for w in load_config("models") if w.family == "mla")
    assert w.page_size == 64 and interop.kv_lengths(w).tolist() == [w.kv_len] * w.batch


def test_mla_capacity_table_reproduces_the_reference_exactly(capsys):
    rows = {(r["layout"], r["format"]): r for r in roofline.mla_capacity_table()}
    assert rows[("MHA", "fp16")]["total_bytes"] == 2 * 128 * 128 * 2 * 65536 == 4_294_967_296
    assert rows[("GQA-8", "fp16")]["total_bytes"] == 2 * 8 * 128 * 2 * 65536 == 268_435_456
    assert rows[("MLA latent", "nvfp4")]["bytes_per_token"] == 576 * 0.5625 == 324
    assert rows[("MLA latent", "nvfp4")]["total_bytes"] == 324 * 65536 + 4 == 21_233_668  # + one float32 scale
    assert rows[("MLA latent", "fp8_e4m3")]["total_bytes"] == 576 * 65536 + 4
    assert rows[("MLA latent", "bf16")]["total_bytes"] == 1152 * 65536
    assert round(rows[("MLA latent", "nvfp4")]["vs_mha"], 1) == 202.3  # "202x less than MHA"
    assert round(rows[("MLA latent", "nvfp4")]["vs_gqa"], 2) == 12.64  # "12.6x less than GQA-8"
    assert cli.main(["predict", "--capacity", "--mla"]) == 0
    out = capsys.readouterr().out
    for mb in ("4294.97", "268.44", "21.23", "75.50", "37.75"):
        assert mb in out
    with pytest.raises(ValueError, match="multiple of the GQA"):
        roofline.mla_capacity_table(heads_q=12, gqa_heads_kv=8)


# --------------------------------------------------------------------------------------------- layer 1


def test_layer1_at_the_measured_ceilings_by_hand():
    rows = {(r["workload"], r["arch"], r["basis"]): r for r in predict.workload_table("mla", ["h100", "h200"])}
    flops = 2 * 64 * 128 * 8192 * (576 + 512)
    assert flops == 146_028_888_064
    qo = 64 * 128 * (576 + 512) * 2  # q read and O written in bf16
    for name, latent_b in (("mla_b64_s8192_bf16", 2), ("mla_b64_s8192_fp8", 1)):
        nbytes = 64 * 8192 * 576 * latent_b + qo
        h100, h200 = rows[(name, "h100", "measured")], rows[(name, "h200", "measured")]
        assert h100["flops"] == flops and h100["bytes"] == nbytes
        assert h100["t_mma_us"] == pytest.approx(flops / 771e12 * 1e6)  # the bf16 MMA (fp8 is dequantized)
        assert h100["t_hbm_us"] == pytest.approx(nbytes / 3.18e12 * 1e6)
        assert h200["t_mma_us"] == pytest.approx(flops / 786e12 * 1e6)
        assert h200["t_hbm_us"] == pytest.approx(nbytes / 4.63e12 * 1e6)
    bf = rows[("mla_b64_s8192_bf16", "h100", "measured")]
    assert round(bf["ai"], 1) == 234.8 and round(bf["ridge"], 1) == 242.5
    assert bf["limiter"] == "HBM" and round(bf["floor_us"], 1) == 195.5  # just under the H100's ridge
    assert rows[("mla_b64_s8192_bf16", "h200", "measured")]["limiter"] == "MMA"  # above the H200's (169.8)
    assert rows[("mla_b64_s8192_fp8", "h100", "measured")]["limiter"] == "MMA"
    ds = rows[("mla_b64_s8192_bf16", "h100", "datasheet")]
    assert ds["t_hbm_us"] == pytest.approx(621_805_568 / 3.35e12 * 1e6) and ds["engine"] == "bf16"


def test_ragged_mla_counts_the_real_keys():
    w = _by_name()["mla_smoke_ragged_bfloat16"]
    lens = interop.kv_lengths(w)
    assert lens.max() == w.kv_len and lens.min() >= w.kv_len // 2
    row = next(r for r in predict.workload_table("mla", ["h100"]) if r["workload"] == w.name)
    assert row["flops"] == 2 * 16 * int(lens.sum()) * (96 + 64)
    assert row["bytes"] == int(lens.sum()) * 96 * 2 + 2 * 16 * (96 + 64) * 2


# ---------------------------------------------------------------------------------------------- inputs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mla_smoke_ragged_bfloat16", "mla_smoke_fp8", "mla_smoke_nvfp4"])
def test_latent_pool_holds_the_dense_latent_through_the_table(name):
    w = _by_name()[name]
    inp = interop.make_inputs(w)
    table = np.asarray(inp.block_table)
    assert inp.q.shape == (w.batch, 1, w.heads_q, w.head_dim) and inp.k.shape == (w.batch, w.kv_len, 1, w.head_dim)
    assert inp.latent_pool.shape[1:3] == (w.page_size, 1) and table.dtype == np.int32
    order = []
    for b in range(w.batch):
        n = int(inp.kv_lens[b])
        pages = table[b, : -(-n // w.page_size)]
        assert len(set(pages.tolist())) == len(pages)  # distinct pages, shuffled (not the identity)
        order += pages.tolist()
        if w.kv_dtype is None:
            got = oracle.gather_paged_kv(inp.latent_pool, table[b], n)
            assert np.array_equal(got, oracle.to_f64(inp.k[b, :n]))
        else:  # every field paged with the same table: the pool's pages are the quantized dense latent's
            pool_b = interop.take_quantized(inp.latent_pool, pages)
            dense_b = interop.take_quantized(inp.k_quant, (b,))
            got = oracle.gather_paged_kv(interop.dequantized(pool_b), np.arange(len(pages)), n)
            assert np.array_equal(got, np.asarray(interop.dequantized(dense_b))[:n])
    assert order != sorted(order)  # the pages are shuffled over the pool: a kernel ignoring the table fails
    assert inp.latent_pool.shape[0] >= len(order)  # (plus the builder's spare blocks, never in a table)


def test_mla_oracle_subset_is_the_absorbed_reference():
    w = _by_name()["mla_smoke_fp8"]
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    got = accuracy.oracle(w, inp, sub)
    lat = np.asarray(interop.dequantized(inp.k_quant))  # the dequantized latent
    ref, _ = oracle.mla_attention_reference(np.asarray(inp.q.astype("float32")), lat, kv_lora_rank=w.kv_lora_rank,
                                           scale=inp.scale)
    assert got.shape == (w.batch, 1, w.heads_q, w.kv_lora_rank)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    fp16 = accuracy.oracle(w, inp, sub, kv="fp16")
    qe = accuracy.quantization_error(got, fp16)
    assert 0 < qe["rmse"] < 0.05


# ----------------------------------------------------------------------------------------------- peers


def test_mla_peers_say_why():
    by = {p.name: p for p in peers.peer_impls()}
    mla, prefill = _by_name()["mla_b64_s8192_fp8"], load_config("smoke")[0]
    for name in ("jax:xla_mla", "jax-pallas:decode_mla", "flashinfer:mla"):
        assert by[name].supports(prefill, GPU).status == "n/a"
    assert by["jax:xla_mla"].supports(mla, GPU).ok  # reads the fp8 latent itself (dequantized in its call)
    s = by["jax-pallas:decode_mla"].supports(mla, GPU)
    assert s.status == "unsupported" and "one head dim" in s.reason and "power of two" in s.reason
    s = by["flashinfer:mla"].supports(mla, GPU)
    assert s.status == "unavailable" and "not installed" in s.reason
    for name in ("torch:cudnn", "jax:xla", "jax-pallas:decode_gqa", "jax-pallas:paged"):
        assert by[name].supports(mla, GPU).status == "n/a"  # dense/paged peers do not take MLA


# ---------------------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def mla_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mla")
    argv = ["run", "--config", "mla", "--quiet", "--out", str(out), "--only", "mla_smoke*:pallas:v11_mla*",
            "--only", "mla_smoke*:jax:xla_mla", "--only", "mla_smoke*:flashinfer:*", "--only", "mla_b64_s8192_fp8"]
    assert cli.main(argv) == 0
    return {(r["workload"]["name"], r["impl"]["name"]): r
            for r in records.read_jsonl(out / "records.jsonl") if r["type"] == "result"}


@pytest.mark.slow
def test_xla_peer_runs_mla_against_the_oracle(mla_run):
    for wl, fmt in (("mla_smoke_ragged_bfloat16", None), ("mla_smoke_fp8", "fp8_e4m3"), ("mla_smoke_nvfp4", "nvfp4")):
        r = mla_run[(wl, "jax:xla_mla")]
        assert records.validate(r) == []
        assert r["status"] == "ok", r["reason"]
        ag = r["agreement"]
        assert ag["rel_l2_err"] < 4e-3  # output rounding of the 16-bit dtype only
        if fmt:
            assert fmt in ag["subset"]["oracle"] and ag["quantization"]["rmse"] > 0
            assert r["prediction"]["precision"] == roofline.KV_PRECISION[fmt]
    big = mla_run[("mla_b64_s8192_fp8", "jax:xla_mla")]
    assert big["status"] == "skipped" and "too large for CPU" in big["reason"]
    assert big["prediction"]["by_arch"]["h100"]["limiter"] == "MMA"
    assert mla_run[("mla_b64_s8192_fp8", "jax-pallas:decode_mla")]["status"] == "unsupported"
    assert mla_run[("mla_smoke_fp8", "flashinfer:mla")]["status"] == "unavailable"


@pytest.mark.slow
def test_pallas_v11_mla_runs_through_compare_in_interpret_mode(mla_run):
    from pallas_attn import registry

    if not registry.built("v11_mla"):
        pytest.skip("pallas v11_mla not built yet: compare's MLA path is covered by the XLA peer above")
    r = mla_run[("mla_smoke_ragged_bfloat16", "pallas:v11_mla:faithful")]
    assert r["status"] == "ok", r["reason"]
    assert r["agreement"]["rel_l2_err"] < 4e-3
    twin = mla_run[("mla_smoke_ragged_bfloat16", "jax:xla_mla")]
    assert r["agreement"]["subset"] == twin["agreement"]["subset"]
    nv = mla_run[("mla_smoke_nvfp4", "pallas:v11_mla:faithful")]  # v11 reads NVFP4 latents (the reference's format)
    assert nv["status"] == "ok", nv["reason"]
    assert nv["agreement"]["rel_l2_err"] < 4e-3 and nv["agreement"]["quantization"]["rmse"] > 0
