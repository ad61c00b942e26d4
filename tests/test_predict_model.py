"""``compare predict --model`` (issue 35): layer 1 and layer 2 for any sweep model at any size, from any machine, with
pallas:auto resolved to the kernel and config the public entry picks on each chip's tuning table."""

from __future__ import annotations

import argparse
import json

import pytest

from compare import cli, predict
from compare.workloads import UsageError, load_config, model_workload
from pallas_attn import tuning

SHAPE = ("family", "entry", "model", "batch", "heads_q", "heads_kv", "q_len", "kv_len", "head_dim", "dtype", "causal",
         "page_size", "kv_dtype", "window", "softcap", "kv_lora_rank", "rope_dim")


@pytest.mark.parametrize("name,kw", [
    ("sweep_prefill_llama-3.1-8b_n4096", dict(model="llama-3.1-8b", entry="prefill", q_len=4096)),
    ("sweep_prefill_mistral-7b-v0.1_n2048", dict(model="mistral-7b-v0.1", entry="prefill", q_len=2048)),
    ("sweep_prefill_gemma-2-9b_n4096", dict(model="gemma-2-9b", entry="prefill", q_len=4096)),
    ("sweep_decode_llama-3.1-70b_b32_s8192", dict(model="llama-3.1-70b", entry="decode", batch=32, kv_len=8192)),
    ("sweep_mla_deepseek-v3_b64_s8192", dict(model="deepseek-v3", entry="mla", batch=64, kv_len=8192)),
    ("sweep_chunked_llama-3.1-8b_p64_c512_s8192", dict(model="llama-3.1-8b", entry="chunked", batch=4, q_len=512,
                                                       kv_len=8192, page_size=64)),
])
def test_the_model_workload_is_the_sweep_s_workload_at_that_size(name, kw):
    """Built from the sweep's model tables as the sweep writes its workloads: every shape field equal (heads, window,
    soft-cap, MLA ranks, the batch from 32768 tokens, ...)."""
    sweep = next(w for w in load_config("sweep") if w.name == name)
    mine = model_workload(kw.pop("model"), kw.pop("entry"), **kw)
    for f in SHAPE:
        if f in ("page_size",) and sweep.family != "paged_decode":
            continue
        assert getattr(mine, f) == getattr(sweep, f), f


def test_model_workload_defaults_and_refusals():
    w = model_workload("llama-3.1-8b", "quant", batch=32)
    assert (w.dtype, w.kv_dtype, w.q_len, w.kv_len) == ("float16", "fp8_e4m3", 1, 8192)  # the quant kernels' q
    assert model_workload("llama-3.1-8b", "prefill", q_len=1024).batch == 32  # 32768 tokens
    with pytest.raises(UsageError, match="not a sweep model; one of .*llama-3.1-8b"):
        model_workload("llama-9", "prefill")
    with pytest.raises(UsageError, match="not an MLA model"):
        model_workload("gpt-2", "mla")
    with pytest.raises(UsageError, match="an MLA model takes --entry mla"):
        model_workload("deepseek-v3", "decode")
    with pytest.raises(UsageError, match="--entry"):
        model_workload("gpt-2", "backward")


def test_use_chip_reads_that_chip_s_table_and_nests():
    before = tuning.chip()
    with tuning.use_chip("h100"):
        assert tuning.chip() == "h100" and tuning.table() is not None
        with tuning.use_chip(None):
            assert tuning.chip() is None and tuning.table() is None
        assert tuning.chip() == "h100"
    assert tuning.chip() == before


def _args(**kw):
    base = dict(arch="h100", model="llama-3.1-8b", entry="prefill", q_len=None, kv_len=None, batch=None, tokens=None,
                page_size=16, kv_dtype=None, non_causal=False, dtype=None, impl=None, json=False)
    return argparse.Namespace(**{**base, **kw})


def test_auto_resolves_through_the_chip_s_table_and_layer2_prices_it():
    """pallas:auto at Llama-3.1-8B N 512 B 64 on an H100 is fa_prefill tiles8 (the shipped table's row); layer 2
    prices that config; a training step (session 21) is priced as the drop-in's step, through the forward and
    backward configs auto chose, above layer 1's floor; a train impl layer 2 does not model is a row saying why."""
    w, l1, l2 = predict.model_rows(_args(q_len=4096, batch=8))
    assert [r["basis"] for r in l1] == ["datasheet", "measured"] and l1[0]["limiter"] == "MMA"
    assert l2[0]["time_us"] > l1[0]["floor_us"]
    w, l1, l2 = predict.model_rows(_args(q_len=512, batch=64))
    (row,) = l2
    assert row["via"] == "pallas:fa_prefill:tiles8" and row["time_us"] > l1[0]["floor_us"]
    _, l1, l2 = predict.model_rows(_args(entry="train", q_len=4096, batch=8))
    assert l2[0]["via"].startswith("fa_prefill:") and "+bwd:" in l2[0]["via"]
    assert l2[0]["time_us"] > l1[0]["floor_us"]
    _, _, l2 = predict.model_rows(_args(entry="train", q_len=4096, batch=8, impl=["pallas:fa_train:default"]))
    assert l2[0]["time_us"] is None and "train family" in l2[0]["error"]
    _, _, l2 = predict.model_rows(_args(model="deepseek-v3", entry="mla", batch=64, arch="h100,h200"))
    assert [r["arch"] for r in l2] == ["h100", "h200"] and all(r["via"].startswith("pallas:fa_mla:") for r in l2)


def test_the_cli_prints_and_dumps_json(capsys):
    assert cli.main(["predict", "--model", "llama-3.1-70b", "--entry", "decode", "--batch", "16", "--kv-len",
                     "32768", "--arch", "h100", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["workload"]["heads_q"] == 64 and out["workload"]["kv_len"] == 32768
    assert out["layer2"][0]["via"].startswith("pallas:fa_decode:") and out["layer2"][0]["time_us"] > 0
    assert cli.main(["predict", "--model", "gpt-2", "--entry", "prefill", "--q-len", "512", "--arch", "h100"]) == 0
    text = capsys.readouterr().out
    assert "gpt-2 prefill: B 64 Hq 12" in text and "pallas:auto -> pallas:fa_prefill:" in text
    assert cli.main(["predict", "--model", "nope"]) == 2
