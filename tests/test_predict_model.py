"""``python -m compare.predict_l2 --model``: layer 1 and layer 2 for any sweep model and size from the command line
(issue 35). The workload is built as the sweep builds its own; pallas:auto is priced as the config the public entry
chooses on the named chip (its tuning table); the process's routing state is left as it was."""

from __future__ import annotations

import argparse

import pytest

from compare import layer2, predict_l2, workloads


def _args(**kw):
    base = dict(model=None, entry="prefill", q_len=None, kv_len=None, tokens=None, batch=None, impl=None, arch="h100",
                heads=8, heads_kv=None, head_dim=64, dtype=None, causal=False, json=False)
    base.update(kw)
    return argparse.Namespace(**base)


def test_model_workload_is_the_sweeps_own():
    sweep = {w.name: w for w in workloads.load_config("sweep")}
    for model, n in (("llama-3.1-8b", 4096), ("mistral-7b-v0.1", 8192), ("gemma-2-9b", 4096), ("gpt-oss-20b", 1024)):
        ours = predict_l2.model_workload(model, "prefill", n)
        theirs = sweep[f"sweep_prefill_{model}_n{n}"]
        for f in ("batch", "heads_q", "heads_kv", "q_len", "kv_len", "head_dim", "dtype", "causal", "window",
                  "softcap", "sinks"):
            assert getattr(ours, f) == getattr(theirs, f), (model, f)
    dec = predict_l2.model_workload("llama-3.1-8b", "decode", 1, 32768, batch=8)
    assert (dec.q_len, dec.kv_len, dec.batch, dec.causal, dec.q_offset) == (1, 32768, 8, True, 32767)
    with pytest.raises(ValueError, match="llama-3.1-8b"):
        predict_l2.model_workload("llama-9", "prefill", 512)


def test_auto_is_priced_as_the_chosen_config_and_routing_is_restored():
    from pallas_attn import _compat, dropin

    before = (dropin._is_sm90, _compat.default_interpret)
    out = predict_l2.run(_args(model="gpt-2", q_len=512))
    assert (dropin._is_sm90, _compat.default_interpret) == before
    assert out["chose"] == "fa_prefill:tiles4" and out["tuning_table"]  # the H100 table's row for this shape
    l2 = out["layer2"]
    assert l2["via"] == "pallas:fa_prefill:tiles4"
    w = predict_l2.model_workload("gpt-2", "prefill", 512)
    named = layer2.predict("pallas:fa_prefill:tiles4", w, predict_l2.hardware.get("h100"))
    assert l2["time_us"] == pytest.approx(named.as_dict()["time_us"])
    assert out["layer1"]["floor_us"] > 0 and l2["time_us"] > out["layer1"]["floor_us"]
    # an arch without a table: the kernels' own rules (fa_prefill's default for this shape)
    h200 = predict_l2.run(_args(model="gpt-2", q_len=512, arch="h200"))
    assert not h200["tuning_table"] and h200["chose"] == "fa_prefill:default"


def test_train_is_layer_1_only_and_the_cli_reports_errors(capsys):
    out = predict_l2.run(_args(model="llama-3.1-8b", entry="train", q_len=4096))
    assert out["layer1"]["floor_us"] > 0 and "backward" in out["layer2"]["error"]
    assert predict_l2.main(["--model", "no-such-model", "--q-len", "512"]) == 2
    assert "not a model" in capsys.readouterr().err
    assert predict_l2.main(["--q-len", "512"]) == 2  # neither --impl nor --model
    assert predict_l2.main(["--model", "qwen2.5-7b", "--q-len", "2048"]) == 0
    text = capsys.readouterr().out
    assert "the public entry chooses: fa_prefill:tiles4" in text and "layer 2:" in text
