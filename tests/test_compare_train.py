"""compare's train family and workload features on the CPU: one training step end to end through the runner
(pallas:fa_train in interpret mode and jax:xla; the output and dq / dk / dv checked against the float64 oracles),
the inputs the features add (without changing the existing draws), the roofline's train and mask counts, the
FlashAttention-3 peers' answers without a GPU, and refusals of features an implementation does not have."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_core import oracle as ref
from compare import accuracy, interop, peers, records, roofline, runner, train
from compare.impls import all_impls
from compare.schema import YES, Ctx, Impl, Prepared
from compare.workloads import Workload

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)


def _wl(**kw) -> Workload:
    base = dict(name="t_train", family="train", batch=2, heads_q=4, heads_kv=2, q_len=32, kv_len=32, head_dim=16,
                dtype="float32", causal=True, seed=1)
    base.update(kw)
    return Workload(**base)


def _run(tmp_path, workloads, names, extra_impls=()):
    impls = [i for i in all_impls() if i.name in names] + list(extra_impls)
    assert {i.name for i in impls} >= set(names)
    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / "out"), reps=1, warmup=0, e2e_reps=1,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[])
    run = runner._Run(opts, workloads=workloads, impls=impls)
    assert run.main() == 0
    recs = [r for r in records.read_jsonl(run.path) if r["type"] == "result"]
    for r in recs:
        assert records.validate(r) == [], (r["impl"]["name"], records.validate(r))
    return {(r["workload"]["name"], r["impl"]["name"]): r for r in recs}


def _broken(name: str, how: str) -> Impl:
    """jax.nn's XLA train step with one gradient spoiled: dk scaled by 1.1 ('scale') or NaN ('nan')."""
    def prepare(w, inp, ctx):
        def attn(q, k, v):
            return jax.nn.dot_product_attention(q, k, v, is_causal=w.causal, implementation="xla")

        def step(q, k, v, wt):
            out, (dq, dk, dv), loss = train.train_core(attn, q, k, v, wt)
            dk = dk * 1.1 if how == "scale" else dk.at[0, 0, 0, 0].set(jnp.nan)
            return out, (dq, dk, dv), loss

        return Prepared(jax.jit(step), (inp.q, inp.k, inp.v, inp.w), "jax", "BTNH")

    return Impl(name, "jax", None, None, "peer", "xla", "", lambda w, ctx: YES, prepare,
                families=frozenset({"train"}))


@pytest.fixture(scope="module")
def train_records(tmp_path_factory):
    wls = [_wl(), _wl(name="t_train_win", batch=1, heads_q=2, heads_kv=1, window=8, seed=2)]
    return _run(tmp_path_factory.mktemp("train"), wls, ["pallas:fa_train:default", "jax:xla"],
                [_broken("test:dk_scaled", "scale"), _broken("test:dk_nan", "nan")])


def test_train_step_end_to_end(train_records):
    for wl in ("t_train", "t_train_win"):
        for impl in ("pallas:fa_train:default", "jax:xla"):
            r = train_records[(wl, impl)]
            assert r["status"] == "ok", (wl, impl, r["reason"])
            ag = r["agreement"]
            assert ag["rel_l2_err"] < 1e-5 and ag["tol_rel_l2"] == 1e-3  # fp32 forward against the oracle
            g = ag["grads"]
            assert g["subset"]["batch"] == r["workload"]["batch"] - 1 and g["subset"]["kv_head"] == \
                r["workload"]["heads_kv"] - 1 and g["subset"]["rows"] == [0, 32]
            for name in ("dq", "dk", "dv"):
                assert 0 < g[name]["rel_l2_err"] < 1e-5, (wl, impl, name, g[name])
            assert r["metrics"]["clock"] == "cpu-interpret" and r["metrics"]["cpu_interpret_us_p50"] > 0
            assert "train step" in r["impl"]["prepared_notes"]
    assert "window (7, 0)" in train_records[("t_train_win", "pallas:fa_train:default")]["impl"]["prepared_notes"]


def test_train_flops_count_the_backward(train_records):
    r = train_records[("t_train", "jax:xla")]
    pairs = sum(i + 1 for i in range(32))  # causal, q_offset 0
    assert r["prediction"]["datasheet"]["flops"] == pytest.approx(4 * 2 * 4 * pairs * 16 * 3.5)
    rw = train_records[("t_train_win", "jax:xla")]
    pairs_w = sum(min(i + 1, 8) for i in range(32))  # window 8
    assert rw["prediction"]["datasheet"]["flops"] == pytest.approx(4 * 1 * 2 * pairs_w * 16 * 3.5)


def test_wrong_and_nan_gradients_are_caught(train_records):
    r = train_records[("t_train", "test:dk_scaled")]
    assert r["status"] == "wrong" and r["reason"].startswith("dk rel_l2_err")
    assert r["agreement"]["grads"]["dk"]["rel_l2_err"] > 0.05 and r["agreement"]["grads"]["dq"]["rel_l2_err"] < 1e-5
    r = train_records[("t_train", "test:dk_nan")]
    assert r["status"] == "failed" and r["reason"] == "non-finite gradient (NaN/Inf) in dk"


def test_packed_prefill_and_windowed_decode(tmp_path):
    w = Workload(name="t_packed", family="prefill", batch=2, heads_q=2, heads_kv=1, q_len=48, kv_len=48,
                 head_dim=16, dtype="float32", causal=True, packed=True, seed=2)
    dec = Workload(name="t_win_decode", family="decode", batch=2, heads_q=4, heads_kv=2, q_len=2, kv_len=64,
                   head_dim=16, dtype="float32", causal=True, q_offset=62, window=9, seed=3)
    res = _run(tmp_path, [w, dec], ["jax:xla", "pallas:fa_train:default"])
    for impl in ("jax:xla", "pallas:fa_train:default"):  # the window at a decode offset (explicit mask / fa_train's)
        r = res[("t_win_decode", impl)]
        assert r["status"] == "ok" and r["agreement"]["rel_l2_err"] < 1e-5, (impl, r["reason"])
    assert res[("t_win_decode", "jax:xla")]["prediction"]["datasheet"]["flops"] == pytest.approx(4 * 2 * 4 * 18 * 16)
    r = res[("t_packed", "jax:xla")]
    assert r["status"] == "ok" and r["agreement"]["rel_l2_err"] < 1e-5, r["reason"]
    assert "segment mask" in r["impl"]["prepared_notes"]
    f = res[("t_packed", "pallas:fa_train:default")]
    assert f["status"] == "unsupported" and "does not implement packed" in f["reason"]
    docs = interop.packed_lengths(w)
    pairs = sum(d * (d + 1) // 2 for row in docs for d in row) / 2
    assert r["prediction"]["datasheet"]["flops"] == pytest.approx(4 * 2 * 2 * pairs * 16)


def test_features_no_implementation_has_are_refused_with_the_reason(tmp_path):
    """softcap and sinks: every implementation refuses before running, whatever the machine (a CPU run says what a
    GPU run says, not 'unavailable')."""
    ws = [Workload(name="t_soft", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                   head_dim=128, dtype="bfloat16", causal=True, softcap=30.0, sinks=True),
          Workload(name="t_soft_train", family="train", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                   head_dim=128, dtype="bfloat16", causal=True, sinks=True),
          Workload(name="t_soft_decode", family="decode", batch=1, heads_q=2, heads_kv=2, q_len=1, kv_len=16,
                   head_dim=128, dtype="bfloat16", causal=True, q_offset=15, softcap=30.0)]
    names = ["fa3:mha", "fa3:kvcache", "jax:cudnn", "jax:xla", "torch:cudnn", "torch:flash",
             "pallas:fa_train:default", "pallas:dropin:wide"]
    res = _run(tmp_path, ws, names)
    seen = set()
    # the drop-in's Hopper pair has the sinks (and soft-cap, window) since session 10: on this CPU it is unavailable
    # for want of a Hopper, not refused for the feature
    r = res.pop(("t_soft_train", "pallas:dropin:wide"))
    assert r["status"] == "unavailable" and "Hopper" in r["reason"], (r["status"], r["reason"])
    for (wl, impl), r in res.items():
        assert r["status"] == "unsupported", (wl, impl, r["status"], r["reason"])
        need = {"t_soft": "sinks, softcap", "t_soft_train": "sinks", "t_soft_decode": "softcap"}[wl]
        assert f"{impl} does not implement {need}" in r["reason"]
        seen.add((wl, impl.split(":")[0]))
    assert {("t_soft", "fa3"), ("t_soft_train", "fa3"), ("t_soft_decode", "fa3"), ("t_soft_train", "torch"),
            ("t_soft_train", "pallas")} <= seen
    assert ("t_soft_decode", "fa3:kvcache") in res and ("t_soft", "fa3:kvcache") not in res  # kvcache: decode only


# ------------------------------------------------------------------------------------------ FA3 peers


def _fa3(name: str) -> Impl:
    return next(i for i in peers.peer_impls() if i.name == name)


def test_fa3_supports_without_a_gpu():
    mod, why = peers._fa3()
    if mod is not None:
        pytest.skip("flash_attn3_jax is installed here")
    bf16 = dict(dtype="bfloat16", head_dim=128)
    for name, w in (("fa3:mha", _wl(family="prefill", **bf16)), ("fa3:mha", _wl(**bf16)),
                    ("fa3:varlen", _wl(packed=True, **bf16)),
                    ("fa3:kvcache", _wl(family="decode", q_len=1, kv_len=64, q_offset=63, **bf16))):
        sup = _fa3(name).supports(w, CPU)
        assert (sup.ok, sup.status) == (False, "unavailable") and "flash_attn3_jax is not importable" in sup.reason
    d64 = _fa3("fa3:mha").supports(_wl(dtype="bfloat16", head_dim=64), CPU)
    assert d64.status == "unsupported" and "the published wheel is built for D 128 only" in d64.reason
    f32 = _fa3("fa3:mha").supports(_wl(head_dim=128), CPU)
    assert f32.status == "unsupported" and "float16/bfloat16" in f32.reason
    off = _fa3("fa3:mha").supports(_wl(family="prefill", q_len=16, kv_len=32, **bf16), CPU)  # top-left, Tq < Tk
    assert off.status == "unsupported" and "bottom-right" in off.reason
    # where they do not apply: no record at all
    assert _fa3("fa3:varlen").supports(_wl(**bf16), CPU).status == "n/a"  # not packed: fa3:mha runs it
    assert _fa3("fa3:kvcache").supports(_wl(family="prefill", **bf16), CPU).status == "n/a"
    assert _fa3("fa3:mha").supports(_wl(family="paged_decode", q_len=1, page_size=16, q_offset=31, **bf16),
                                    CPU).status == "n/a"
    for i in ("fa3:mha", "fa3:varlen", "fa3:kvcache"):
        assert not {"softcap", "sinks"} & _fa3(i).features and "window" in _fa3(i).features


def test_fa3_available_path_with_a_stub(monkeypatch):
    """On a Hopper with the binding importable, the same workloads are supported; the prepared calls pass FA3's
    arguments (window (W - 1, 0), cu_seqlens, page_table / cache_seqlens, num_splits). A stub module stands in."""
    calls = []

    class Stub:
        @staticmethod
        def flash_mha(q, k, v, **kw):
            calls.append(("mha", kw))
            return q

        @staticmethod
        def flash_mha_varlen(q, k, v, **kw):
            calls.append(("varlen", {k_: v_ for k_, v_ in kw.items() if not k_.startswith("cu_")}))
            return q

        @staticmethod
        def flash_mha_with_kvcache(q, kc, vc, **kw):
            calls.append(("kvcache", {k_: v_ for k_, v_ in kw.items() if k_ not in ("cache_seqlens", "page_table")}
                          | {"paged": "page_table" in kw}))
            return q

    monkeypatch.setattr(peers, "_fa3", lambda: (Stub, None))
    gpu = Ctx(jax_gpu=True, torch_cuda=False, hopper=True, interpret=False)
    bf16 = dict(dtype="bfloat16", head_dim=128, heads_q=2, heads_kv=1, batch=2)
    w = _wl(window=8, packed=True, q_len=64, kv_len=64, **bf16)
    assert _fa3("fa3:varlen").supports(w, gpu).ok
    inp = interop.make_inputs(w)
    prep = _fa3("fa3:varlen").prepare(w, inp, gpu)
    out, grads, _ = prep.fn(*prep.args)
    assert out.shape == inp.q.shape and len(grads) == 3
    assert calls[-1] == ("varlen", {"max_seqlen_q": inp.max_doc_len, "max_seqlen_k": inp.max_doc_len,
                                    "softmax_scale": inp.scale, "is_causal": True, "window_size": (7, 0)})
    wd = _wl(family="decode", q_len=1, kv_len=2048, q_offset=2047, **bf16)
    prep = _fa3("fa3:kvcache").prepare(wd, interop.make_inputs(wd), gpu)
    prep.fn(*prep.args)
    assert calls[-1][1]["num_splits"] == 2 and calls[-1][1]["paged"] is False  # 2 programs, 132 SMs, 2048 keys
    wp = _wl(family="paged_decode", q_len=1, kv_len=64, page_size=16, ragged=True, q_offset=63, **bf16)
    prep = _fa3("fa3:kvcache").prepare(wp, interop.make_inputs(wp), gpu)
    prep.fn(*prep.args)
    assert calls[-1][1]["paged"] is True and calls[-1][1]["window_size"] == (-1, -1)


# ------------------------------------------------------------------------------------------ inputs


def test_inputs_keep_the_existing_draws_and_add_the_features():
    pre = _wl(family="prefill", sinks=True, packed=True, q_len=64, kv_len=64)
    old_q = jax.random.normal(jax.random.split(jax.random.key(pre.seed), 3)[0], (2, 64, 4, 16), jnp.float32)
    inp_pre = interop.make_inputs(pre)
    np.testing.assert_array_equal(np.asarray(inp_pre.q), np.asarray(old_q))  # the draws before features existed
    inp_plain = interop.make_inputs(_wl(family="prefill", q_len=64, kv_len=64))
    inp_train = interop.make_inputs(_wl(q_len=64, kv_len=64))
    for a in ("q", "k", "v"):
        np.testing.assert_array_equal(np.asarray(getattr(inp_plain, a)), np.asarray(getattr(inp_train, a)))
    assert inp_plain.w is None and inp_plain.sinks is None and inp_plain.segment_ids is None
    assert inp_train.w.shape == inp_train.q.shape and inp_train.w.dtype == inp_train.q.dtype
    assert not np.allclose(np.asarray(inp_train.w), np.asarray(inp_train.q))
    assert inp_pre.sinks.shape == (4,) and inp_pre.sinks.dtype == jnp.float32
    docs = inp_pre.doc_lengths
    assert [sum(d) for d in docs] == [64, 64] and docs == interop.packed_lengths(pre)
    assert list(docs[0]) == ref.packed_doc_lengths(64, pre.seed) and list(docs[1]) == ref.packed_doc_lengths(64, 2)
    cu = np.asarray(inp_pre.cu_seqlens)
    assert cu[0] == 0 and cu[-1] == 128 and len(cu) == len(docs[0]) + len(docs[1]) + 1
    seg = np.asarray(inp_pre.segment_ids)
    assert seg.shape == (2, 64) and seg[0, 0] == 0 and seg[0, -1] == len(docs[0]) - 1


def test_oracle_subset_uses_the_features():
    w = _wl(family="prefill", sinks=True, window=5, softcap=2.0, q_len=24, kv_len=24, heads_q=4, heads_kv=2)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    got = accuracy.oracle(w, inp, sub)
    full, _ = ref.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale, window=5, softcap=2.0,
                                      sinks=inp.sinks)
    np.testing.assert_allclose(got, sub.take(full), rtol=1e-12, atol=1e-12)
    plain, _ = ref.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale)
    assert np.max(np.abs(sub.take(plain) - got)) > 1e-2


@pytest.mark.parametrize("kw", [dict(window=6), dict(packed=True), dict()], ids=["window", "packed", "causal"])
def test_grad_oracle_subset_matches_the_full_gradient(kw):
    w = _wl(heads_q=6, heads_kv=3, q_len=160, kv_len=160, batch=3, **kw)
    inp = interop.make_inputs(w)
    full = {}
    for b in range(3):  # the float64 gradients of the whole problem, row by row of the batch (packed: own segments)
        g = ref.attention_grad_reference(inp.q[b:b + 1], inp.k[b:b + 1], inp.v[b:b + 1], inp.w[b:b + 1], causal=True,
                                         scale=inp.scale, **accuracy.feature_kwargs(w, inp, b, range(6), (0, 160)))
        for n in ("dq", "dk", "dv"):
            full.setdefault(n, []).append(g[n])
    full = tuple(np.concatenate(full[n]) for n in ("dq", "dk", "dv"))
    every = accuracy.choose_grad_subset(w)
    tail = accuracy.choose_grad_subset(w, max_scores=2 * 100 * 160)  # 100 rows of 160 keys: the last 100
    assert (every.batch, every.kv_head, every.heads, every.rows, every.keys) == (2, 2, (4, 5), (0, 160), (0, 160))
    assert (tail.rows, tail.keys) == ((60, 160), (60, 160))
    for gs in (every, tail):
        got = accuracy.grad_oracle(w, inp, gs)
        sub = gs.take(full)
        for name in ("dq", "dk", "dv"):
            assert got[name].shape == sub[name].shape
            np.testing.assert_allclose(got[name], sub[name], rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="train workload"):
        accuracy.grad_oracle(_wl(family="prefill"), interop.make_inputs(_wl(family="prefill")), every)


# ------------------------------------------------------------------------------------------ roofline, programs


def test_roofline_train_and_window_counts():
    w = _wl(dtype="bfloat16", q_len=1024, kv_len=1024)
    fwd = roofline.problem_for(dataclasses.replace(w, family="prefill"))
    trn = roofline.problem_for(w)
    assert trn.train and not fwd.train
    from compare import hardware

    h100 = hardware.get("h100")
    ef, et = roofline.estimate(fwd, h100), roofline.estimate(trn, h100)
    assert et.flops == pytest.approx(3.5 * ef.flops) and et.exps == pytest.approx(2 * ef.exps)
    assert et.bytes > 2.9 * ef.bytes
    with pytest.raises(ValueError, match="fused dense path only"):
        roofline.Problem(batch=1, heads_q=1, q_len=8, kv_len=8, head_dim=16, train=True, materialize_s=True,
                         tile=(8, 8))
    # a decode row over a long cache with a window reads and sees only the window's keys
    dec = _wl(family="decode", dtype="bfloat16", q_len=1, kv_len=32768, q_offset=32767, window=4096)
    view = interop.roofline_view(dec)
    assert view.mask_pairs == 4096 and view.kv_tokens == 2 * 4096
    e_win = roofline.estimate(roofline.problem_for(view), h100)
    e_full = roofline.estimate(roofline.problem_for(dataclasses.replace(dec, window=None)), h100)
    assert e_win.bytes < e_full.bytes / 7 and e_win.flops == pytest.approx(e_full.flops / 8)
    assert interop.roofline_view(_wl()) is not None


@pytest.mark.parametrize("kw", [dict(heads_q=2, heads_kv=2, q_len=16, kv_len=16),
                                dict(heads_q=4, heads_kv=2, q_len=33, kv_len=33)], ids=["mha", "gqa_odd"])
def test_torch_train_program_on_the_cpu(kw):
    """compare.train.torch_step (SDPA's MATH backend standing in for cuDNN / FLASH): CUDA events requested, the
    step's output and gradients against the float64 oracles, with GQA (``enable_gqa``) at an odd length: the BHND views
    of the BTNH buffers and autograd's dQ / dK / dV back in BTNH at the shapes of q, k and v."""
    w = _wl(**kw)
    inp = interop.make_inputs(w)
    prep = train.torch_step("MATH", w, inp, causal=True)
    assert prep.clock == "events" and prep.framework == "torch" and prep.layout == "BHND"
    out, grads = train.split_output(prep.fn(*prep.args))
    g = ref.attention_grad_reference(inp.q, inp.k, inp.v, inp.w, causal=True, scale=inp.scale)
    np.testing.assert_allclose(np.asarray(interop.to_jax_btnh(out, "BHND")), g["out"], atol=1e-5)
    for name, x, like in zip(("dq", "dk", "dv"), grads, (inp.q, inp.k, inp.v)):
        got = np.asarray(interop.to_jax_btnh(x, "BHND"))
        assert got.shape == like.shape, name
        np.testing.assert_allclose(got, g[name], atol=1e-5)
    with pytest.raises(TypeError, match="a train step returns"):
        train.split_output((out, grads))


def test_the_runner_times_a_torch_train_step_on_cuda_events(monkeypatch, tmp_path, fake_gpu_clocks):
    """A torch training step (``Prepared.clock = "events"``, compare.train.torch_step) is timed by the runner with CUDA
    events, not the Mosaic CUPTI collector, which does not see the kernels torch's autograd thread launches; a program
    that names no clock keeps the requested one. The record says which clock ran and why."""
    from compare import timing
    from compare.record import ResultRecord

    seen = []

    def fake_kernels(fn, args, **kw):
        seen.append(kw["clock"])
        clock = "cuda-events" if kw["clock"] == "events" else "cupti:mosaic"
        return timing.Timing((1.0, 2.0, 3.0), clock, True, (), requested=clock)

    fake_gpu_clocks(fake_kernels)
    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / "out"), reps=3, warmup=0, e2e_reps=1,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[])
    run = runner._Run(opts, workloads=[_wl()], impls=[i for i in all_impls() if i.name == "jax:xla"])
    monkeypatch.setattr(run, "fill_rates", lambda rec: None)
    for clock in ("events", None):
        rec = ResultRecord(head={}, workload={}, impl={}, repro="")
        run.time_gpu(Prepared(lambda: None, (), "torch", "BHND", clock=clock), rec, {})
        m = rec.metrics
        assert m["clock"] == ("cuda-events" if clock else "cupti:mosaic") and "clock_fallback" not in m, m
        assert any("autograd" in n for n in m["clock_notes"]) == (clock == "events"), m["clock_notes"]
    assert seen == ["events", "cupti"]


def test_dropin_rows_on_the_cpu_interpreter():
    """pallas:dropin:<bwd config>: refused off Hopper and for what fa_prefill does not take, with the drop-in's own
    reasons; its train step (fa_prefill's forward + fa_prefill_bwd's backward, here on the Mosaic GPU interpreter)
    against the float64 oracles at bf16 rounding."""
    names = [i.name for i in all_impls() if i.name.startswith("pallas:dropin:")]
    from pallas_attn.kernels import fa_prefill_bwd

    assert names == [f"pallas:dropin:{n}" for n in fa_prefill_bwd.CONFIGS]
    imp = next(i for i in all_impls() if i.name == "pallas:dropin:wide")
    assert (imp.generation, imp.config, imp.families, imp.features) == ("fa_prefill", "wide", {"train"},
                                                                      {"window", "softcap", "sinks", "packed"})
    w = _wl(dtype="bfloat16", heads_q=2, heads_kv=1, batch=1, q_len=128, kv_len=128, head_dim=64)
    assert imp.supports(w, CPU).status == "unavailable" and "Hopper" in imp.supports(w, CPU).reason
    hopper = Ctx(jax_gpu=False, torch_cuda=False, hopper=True, interpret=True)
    for bad, why in ((dict(head_dim=32), "head dims"), (dict(dtype="float32"), "float16 / bfloat16")):
        sup = imp.supports(dataclasses.replace(w, **bad), hopper)
        assert sup.status == "unsupported" and why in sup.reason
    assert imp.supports(w, hopper).ok
    assert imp.plan(w, hopper)["backward_config"] == "wide" and imp.roofline(w).precision == "bf16"
    inp = interop.make_inputs(w)
    prep = imp.prepare(w, inp, hopper)
    out, grads = train.split_output(prep.fn(*prep.args))
    g = ref.attention_grad_reference(inp.q, inp.k, inp.v, inp.w, causal=True, scale=inp.scale)
    for name, x in zip(("out", "dq", "dk", "dv"), (out, *grads)):
        _, rel = accuracy.errors(np.asarray(x, np.float32), g[name])
        assert rel < 1e-2, (name, rel)
    # the model features through the same rows: window (W - 1, 0), soft-cap, sinks (a constant of the step). Row
    # "default" (one consumer warpgroup): a three-warpgroup kernel pair under one jit with a narrow window can stall
    # jax's GPU interpreter on a 2-core machine (its warpgroup threads wait on barriers while the threads that would
    # arrive wait for a CPU worker; session 10 saw it only here, never on a GPU, where the wide configs passed)
    assert imp.supports(dataclasses.replace(w, window=32, softcap=20.0, sinks=True), hopper).ok
    imp = next(i for i in all_impls() if i.name == "pallas:dropin:default")
    wf = dataclasses.replace(w, q_len=80, kv_len=80, window=32, softcap=20.0, sinks=True, name="t_train_feat")
    assert imp.supports(wf, hopper).ok
    inp = interop.make_inputs(wf)
    prep = imp.prepare(wf, inp, hopper)
    assert "with sinks, softcap, window" in prep.notes
    out, grads = train.split_output(prep.fn(*prep.args))
    g = ref.attention_grad_reference(inp.q, inp.k, inp.v, inp.w, causal=True, scale=inp.scale, window=32,
                                     softcap=20.0, sinks=np.asarray(inp.sinks, np.float64))
    for name, x in zip(("out", "dq", "dk", "dv"), (out, *grads)):
        _, rel = accuracy.errors(np.asarray(x, np.float32), g[name])
        assert rel < 1e-2, (name, rel)
    # packed documents (session 29: the named backward configs beside auto on the sweep's packed training steps): the
    # segment ids a constant of the step, fa_prefill's packed forward rule (tiles4 at N <= 4096) in the plan; D 256 or
    # a window with packed documents refused (fa_prefill_bwd's packed kernels)
    wp = dataclasses.replace(w, q_len=96, kv_len=96, packed=True, name="t_train_packed")
    for bad in (dict(head_dim=256), dict(window=32)):
        sup = imp.supports(dataclasses.replace(wp, **bad), hopper)
        assert sup.status == "unsupported" and "packed kernels" in sup.reason, bad
    assert imp.supports(wp, hopper).ok and imp.plan(wp, hopper)["forward_config"] == "tiles4"
    inp = interop.make_inputs(wp)
    prep = imp.prepare(wp, inp, hopper)
    assert "with packed" in prep.notes
    out, grads = train.split_output(prep.fn(*prep.args))
    seg = np.asarray(inp.segment_ids)
    g = ref.attention_grad_reference(inp.q, inp.k, inp.v, inp.w, causal=True, scale=inp.scale, q_segments=seg,
                                     kv_segments=seg)
    for name, x in zip(("out", "dq", "dk", "dv"), (out, *grads)):
        _, rel = accuracy.errors(np.asarray(x, np.float32), g[name])
        assert rel < 1e-2, (name, rel)
