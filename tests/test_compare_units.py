"""compare's pieces on the CPU: timing statistics and the flush split, agreement maths and the oracle
subset, the record schema, peer causal mapping, --only filters, which generations apply to which workload
and what their twins declare, the committed records' labels, and the GPU bookkeeping path (rates,
fractions, speed-ups, twin agreement) driven with the host clock."""

from __future__ import annotations

import json
import math
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attn_core import generations as core
from attn_core import oracle as reference
from compare import accuracy, hardware, impls, interop, peers, records, runner, timing
from compare.schema import YES, Ctx, Impl, Prepared
from compare.workloads import Workload

ROOT = Path(__file__).resolve().parent.parent
CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)


def _wl(**kw) -> Workload:
    base = dict(name="t", family="prefill", batch=2, heads_q=4, heads_kv=4, q_len=40, kv_len=40, head_dim=16,
                dtype="float32", causal=False, q_offset=0, seed=3)
    base.update(kw)
    return Workload(**base)


# ------------------------------------------------------------------------------------------ timing


def test_percentiles_known_values():
    st = timing.percentiles(range(1, 101))
    assert st["p50"] == pytest.approx(50.5)
    assert st["p10"] == pytest.approx(10.9)
    assert st["p90"] == pytest.approx(90.1)
    assert st["n"] == 100 and st["min"] == 1 and st["max"] == 100


@pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
def test_percentiles_refuse_empty_and_non_finite(bad):
    with pytest.raises(ValueError):
        timing.percentiles(bad)


def test_split_by_flush_sums_kernels_between_flushes():
    f = frozenset({"flush_k"})
    evts = [("flush_k", 0, 50), ("a", 60, 70), ("b", 75, 80),  # rep 1: 10 + 5
            ("flush_k", 100, 150), ("a", 160, 172),  # rep 2: 12
            ("flush_k", 200, 250), ("a", 260, 269), ("memset", 270, 271)]  # rep 3: 9 + 1
    assert timing._split_by_flush(evts, f, 3) == [15, 12, 10]
    with pytest.raises(RuntimeError, match="expected 4"):
        timing._split_by_flush(evts, f, 4)
    with pytest.raises(RuntimeError, match="no implementation kernel"):
        timing._split_by_flush([("flush_k", 0, 1), ("flush_k", 2, 3)], f, 2)


def test_time_kernels_falls_back_with_a_label_on_cpu():
    f = jax.jit(lambda x: x * 2)
    x = jnp.arange(1024.0)
    f(x)
    t = timing.time_kernels(f, (x,), framework="jax", reps=3, flush_bytes=1 << 16)
    assert t.clock == "host-wall"  # no CUPTI here: the fallback says so
    assert len(t.samples_us) == 3 and all(s > 0 for s in t.samples_us)
    assert t.notes and "cupti:mosaic failed" in t.notes[0]
    assert t.requested == "cupti:mosaic" and t.fallback  # the record will say it fell back


# --------------------------------------------------------------------------------------- agreement


def test_errors_max_abs_and_rel_l2():
    ref = np.array([[3.0, 4.0]])
    got = np.array([[3.0, 4.5]])
    mx, rel = accuracy.errors(got, ref)
    assert mx == pytest.approx(0.5)
    assert rel == pytest.approx(0.5 / 5.0)
    mx, rel = accuracy.errors(np.array([[np.nan, 4.0]]), ref)
    assert not math.isfinite(rel)  # NaN propagates; the runner turns it into 'failed'
    with pytest.raises(ValueError, match="shape"):
        accuracy.errors(np.zeros((2, 2)), ref)


def test_twin_errors_and_finiteness():
    a = jnp.ones((1, 2, 3, 4), jnp.float16)
    b = jnp.ones((1, 2, 3, 4), jnp.float32).at[0, 0, 0, 0].set(2.0)
    mx, rel = accuracy.twin_errors(a, b)
    assert mx == pytest.approx(1.0)
    assert rel == pytest.approx(1.0 / math.sqrt(23 + 4))
    assert accuracy.all_finite(a)
    assert not accuracy.all_finite(b.at[0, 1, 2, 3].set(jnp.nan))


def test_tolerance_by_precision():
    assert accuracy.tolerance("fp32") < accuracy.tolerance("fp16") <= accuracy.tolerance("bf16")
    with pytest.raises(ValueError):
        accuracy.tolerance("fp64")


@pytest.mark.parametrize("causal,q_offset", [(False, 0), (True, 0), (True, 37)])
def test_oracle_subset_matches_full_reference(causal, q_offset):
    # 300 rows > 256: every batch and head, sampled row ranges (first and last rows always in), with the
    # causal offset shifted per range.
    w = _wl(batch=3, heads_q=6, heads_kv=2, q_len=300, kv_len=350, causal=causal, q_offset=q_offset)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    assert sub.batches == (0, 1, 2) and sub.heads == tuple(range(6))
    assert sub.rows[0][0] == 0 and sub.rows[-1][1] == 300 and len(sub.rows) >= 3
    assert all(a[1] < b[0] for a, b in zip(sub.rows, sub.rows[1:]))  # disjoint, ordered
    assert 64 < sum(b - a for a, b in sub.rows) <= 256
    full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=causal, scale=inp.scale, q_offset=q_offset)
    ref = accuracy.oracle(w, inp, sub)
    np.testing.assert_allclose(ref, sub.take(full), rtol=0, atol=1e-12)
    # over the oracle budget even for one row: batches and heads sampled too, seeded, ends always in
    small = accuracy.choose_subset(w, max_macs=1e4)
    assert small.batches[0] == 0 and small.batches[-1] == 2 and small.heads[0] == 0 and small.heads[-1] == 5
    assert small == accuracy.choose_subset(w, max_macs=1e4) and small.rows == ((0, 1), (299, 300))
    np.testing.assert_allclose(accuracy.oracle(w, inp, small), small.take(full), rtol=0, atol=1e-12)


@pytest.mark.parametrize("causal,n", [(False, 1), (False, 5), (True, 1)])
def test_grouped_oracle_rows_equal_the_per_head_copy(causal, n):
    # the host path's grouped rows (a paged quantized cache without features: each KV head once, its query heads
    # folded into rows) against the per-query-head copy of K/V it replaced, on an unsorted head map with repeats and
    # an unused KV column
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, n, 5, 16))
    k, v = rng.standard_normal((1, 40, 3, 16)), rng.standard_normal((1, 40, 3, 16))
    hmap = [2, 0, 2, 2, 0]
    got = accuracy._reference_rows_grouped(q, k, v, hmap, causal=causal, scale=0.3, q_offset=17)
    want = accuracy._reference_rows(q, k[:, :, hmap], v[:, :, hmap], causal=causal, scale=0.3, q_offset=17)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    # K/V as the device stores them (bf16 on the host): converted per head inside, the same values as the float64 copy
    kb, vb = k.astype(jnp.bfloat16), v.astype(jnp.bfloat16)
    got16 = accuracy._reference_rows_grouped(q, np.asarray(kb), np.asarray(vb), hmap, causal=causal, scale=0.3,
                                             q_offset=17)
    want16 = accuracy._reference_rows(q, np.asarray(kb, np.float64)[:, :, hmap],
                                      np.asarray(vb, np.float64)[:, :, hmap], causal=causal, scale=0.3, q_offset=17)
    np.testing.assert_allclose(got16, want16, rtol=0, atol=1e-13)
    if causal:
        with pytest.raises(ValueError, match="one query row"):
            accuracy._reference_rows_grouped(np.zeros((1, 2, 5, 16)), k, v, hmap, causal=True, scale=0.3, q_offset=3)


@pytest.mark.parametrize("causal,n,q_offset", [(False, 1, 17), (False, 5, 17), (True, 1, 17), (True, 1, 60)])
def test_dense_oracle_rows_equal_the_numpy_oracle(monkeypatch, causal, n, q_offset):
    """The one-program oracle (``_dense_oracle_f64``, session 25) gives attn_core's numpy rows to float64 rounding
    (relative 1e-12), from bf16 K/V as the device holds them, on sampled query heads out of order with a repeat whose
    KV groups differ in size and leave a KV head unread (non-causal; causal one row, its visible keys, all of them
    when the offset passes the end); a NaN key goes to the heads that read it and nowhere else; and the oracle's check
    against numpy raises, naming the gap, when the program is off by 1e-6 or drops a NaN."""
    rng = np.random.default_rng(4)
    w = _wl(batch=1, heads_q=6, heads_kv=3, q_len=n, kv_len=40, causal=causal, q_offset=q_offset)
    q = jnp.asarray(rng.standard_normal((1, n, 6, 16)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((1, 40, 3, 16)), jnp.bfloat16) for _ in range(2))
    sub = accuracy.Subset((0,), (5, 1, 4, 5, 0), ((0, n),))  # KV heads 2, 0, 2, 2, 0: KV head 1 unread

    def same(got, want):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        assert float(np.max(np.abs(got[ok] - want[ok]))) <= 1e-12 * float(np.max(np.abs(want[ok])))

    def numpy_rows(k):
        full, _ = reference.attention_reference(q, k, v, causal=causal, scale=0.3, q_offset=q_offset)
        return sub.take(full)

    inp = SimpleNamespace(q=q, k=k, v=v, scale=0.3)
    same(accuracy.oracle(w, inp, sub), numpy_rows(k))  # checked inside: agrees
    # a NaN key seen by every row: NaN out for the heads reading KV head 0 (subset positions 1 and 4) only
    k_nan = k.at[0, 0, 0, 0].set(jnp.nan)
    inp_nan = SimpleNamespace(q=q, k=k_nan, v=v, scale=0.3)
    got_nan = accuracy.oracle(w, inp_nan, sub)
    assert np.isnan(got_nan[0, :, [1, 4]]).all() and not np.isnan(got_nan[0, :, [0, 2, 3]]).any()
    same(got_nan, numpy_rows(k_nan))
    real = accuracy._dense_oracle_f64

    def changed(change):
        def run(*a, **kw):
            out, *rest = real(*a, **kw)
            return (change(out), *rest)
        return run

    def bump(o):
        o = np.array(o, copy=True)
        o[0, 0, 0, 0, 3] += 1e-6
        return o

    for change, case, match in ((bump, inp, "disagrees with attn_core.oracle"),
                                (np.nan_to_num, inp_nan, "NaN at different places")):
        # the first KV group (KV head 0) is the one the check recomputes
        monkeypatch.setattr(accuracy, "_dense_oracle_f64", changed(change))
        with pytest.raises(RuntimeError, match=match):
            accuracy.oracle(w, case, sub)
        monkeypatch.undo()


def test_paged_oracle_matches_dense_on_ragged_lengths():
    w = _wl(family="paged_decode", batch=3, heads_q=8, heads_kv=2, q_len=1, kv_len=70, q_offset=69,
            page_size=16, ragged=True, dtype="float16", causal=True)
    inp = interop.make_inputs(w)
    assert inp.kv_lens.max() == 70 and inp.kv_lens.min() >= 35
    sub = accuracy.choose_subset(w)
    ref = accuracy.oracle(w, inp, sub)
    full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale,
                                            q_offset=inp.kv_lens - 1, kv_len=inp.kv_lens)
    np.testing.assert_allclose(ref, sub.take(full), rtol=0, atol=1e-12)


def test_paged_oracle_reads_the_dense_view_and_checks_the_pools():
    """Session 25: a 16-bit paged workload's oracle runs on the dense view in one program (ragged lengths, a chunk of
    Tq 5 at each sequence's end) and first proves the pools hold the dense values for every sequence; a pool that
    differs in one value stops it."""
    w = _wl(family="paged_decode", batch=3, heads_q=8, heads_kv=2, q_len=5, kv_len=70, q_offset=65,
            page_size=16, ragged=True, dtype="bfloat16", causal=True)
    inp = interop.make_inputs(w)
    sub = accuracy.choose_subset(w)
    full, _ = reference.attention_reference(inp.q, inp.k, inp.v, causal=True, scale=inp.scale,
                                            q_offset=inp.kv_lens - 5, kv_len=inp.kv_lens)
    np.testing.assert_allclose(accuracy.oracle(w, inp, sub), sub.take(full), rtol=0, atol=1e-12)
    b = int(np.argmin(inp.kv_lens))
    page = int(np.asarray(inp.block_table)[b, 0])
    inp.v_pool = inp.v_pool.at[page, 3, 1, 0].add(1.0)  # one value of a page the shortest sequence reads
    with pytest.raises(RuntimeError, match="pools differ from the dense"):
        accuracy.oracle(w, inp, sub)


def test_inputs_are_seeded_and_never_zero():
    w = _wl()
    a, b = interop.make_inputs(w), interop.make_inputs(w)
    np.testing.assert_array_equal(np.asarray(a.q), np.asarray(b.q))
    assert float(jnp.abs(a.k).min()) >= 0 and float(jnp.abs(a.v).mean()) > 0.5
    assert not np.array_equal(np.asarray(a.q), np.asarray(interop.make_inputs(w, seed=4).q))


# ---------------------------------------------------------------------------------------- schema


def _good_result(kind="gpu", status="ok") -> dict:
    return {
        "schema": records.SCHEMA_VERSION, "type": "result", "run_id": "r", "status": status, "reason": None,
        "workload": {"name": "w", "family": "prefill", "dtype": "float16"},
        "impl": {"name": "pallas:v4_fused:faithful", "framework": "pallas", "generation": "v4_fused",
                 "config": "faithful"},
        "env": {"gpu": "H100", "versions": {}, "device_kind": kind},
        "metrics": {"time_us_p50": 10.0, "time_us_p10": 9.0, "time_us_p90": 12.0, "tflops": 1.0, "gbps": 2.0,
                    "roofline_fraction": 0.5, "hbm_fraction": 0.4, "tc_fraction": 0.1, "limiter": "HBM",
                    "clock": "cupti:jax-measure", "e2e_us_p50": 20.0},
        "agreement": {"max_abs_err": 1e-3, "rel_l2_err": 1e-4, "subset": {}, "tol_rel_l2": 1e-2},
        "repro": "python -m compare run --config smoke --only 'w:pallas:v4_fused:faithful'",
    }


def test_schema_accepts_a_good_record_and_names_violations():
    assert records.validate(_good_result()) == []
    r = _good_result()
    r["agreement"]["rel_l2_err"] = float("nan")
    assert any("rel_l2_err" in e for e in records.validate(r))
    r = _good_result()
    r["metrics"]["time_us_p50"] = None
    assert any("time_us_p50" in e for e in records.validate(r))
    r = _good_result()
    r["metrics"]["time_us_p10"] = 11.0
    assert any("order" in e for e in records.validate(r))
    r = _good_result(status="unsupported")
    assert any("reason" in e for e in records.validate(r))
    r = _good_result(kind="cpu-interpret")
    assert any("CPU-interpret" in e for e in records.validate(r))
    r = _good_result()
    del r["impl"]["framework"]
    assert any("impl.framework" in e for e in records.validate(r))
    assert records.validate({"type": "bogus"})


# ---------------------------------------------------------------------------------------- peers


@pytest.mark.parametrize("causal,q_len,kv_len,q_offset,mode", [
    (False, 64, 64, 0, "none"), (True, 64, 64, 0, "top_left"), (True, 1, 300, 299, "none"),
    (True, 4, 300, 296, "bottom_right"), (True, 4, 300, 5, "offset")])
def test_causal_mode(causal, q_len, kv_len, q_offset, mode):
    assert peers.causal_mode(_wl(causal=causal, q_len=q_len, kv_len=kv_len, q_offset=q_offset)) == mode


def test_peer_supports_encode_the_anchors_traps():
    gpu = Ctx(jax_gpu=True, torch_cuda=True, hopper=True, interpret=False)
    by = {p.name: p for p in peers.peer_impls()}
    gqa = _wl(heads_q=8, heads_kv=2, dtype="float16")
    assert not by["torch:efficient"].supports(gqa, gpu).ok  # EFFICIENT refuses Hq != Hkv
    assert not by["jax-pallas:mgpu"].supports(_wl(dtype="bfloat16", q_len=128, kv_len=128), gpu).ok
    assert by["jax-pallas:mgpu"].supports(_wl(dtype="float16", q_len=128, kv_len=128, head_dim=64), gpu).ok
    assert not by["jax-pallas:decode_gqa"].supports(_wl(q_len=4), gpu).ok
    assert by["jax-pallas:paged"].supports(_wl(), gpu).status == "n/a"
    s = by["torch:cudnn"].supports(_wl(dtype="float16"), CPU)
    assert (s.ok, s.status, s.reason) == (False, "unavailable", "needs a CUDA GPU")


# ---------------------------------------------------------------------------------------- filters


def test_only_filters_split_at_the_first_colon():
    assert runner.parse_only(["smoke_*:pallas:v4_fused:*", "ref_*", ":torch:*"]) == [
        ("smoke_*", "pallas:v4_fused:*"), ("ref_*", "*"), ("*", "torch:*")]
    impl = Impl("pallas:v4_fused:faithful", "pallas", "v4_fused", "faithful", "mirror", "triton", "", lambda w, c: YES)
    w = _wl(name="smoke_prefill")
    assert runner._selected(runner.parse_only(["smoke_*:pallas:*"]), w, impl)
    assert not runner._selected(runner.parse_only(["smoke_*:torch:*"]), w, impl)
    assert runner._selected([], w, impl)
    # a workload name with ':' in it (the sweep's gpt-oss-20b:local layers): taken whole where the first split matches
    # no workload; a first split that matches keeps the old meaning
    names = ["sweep_prefill_gpt-oss-20b:local_n8192", "sweep_prefill_gpt-oss-20b_n8192", "smoke_prefill"]
    assert runner.parse_only(["sweep_prefill_gpt-oss-20b:local_n8192", "sweep_prefill_gpt-oss-20b:local_n8192:pallas:*",
                              "sweep_*:*", "smoke_*:pallas:*"], names) == [
        ("sweep_prefill_gpt-oss-20b:local_n8192", "*"), ("sweep_prefill_gpt-oss-20b:local_n8192", "pallas:*"),
        ("sweep_*", "*"), ("smoke_*", "pallas:*")]


# ------------------------------------------------------------------------ implementations and entries


def test_entries_map_workload_families_to_the_table():
    assert set(impls.ENTRY_FAMILIES) == set(core.ENTRIES)
    assert {f for fams in impls.ENTRY_FAMILIES.values() for f in fams} == {"prefill", "decode", "paged_decode",
                                                                           "mla"}
    prefill, paged = _wl(), _wl(family="paged_decode", q_len=1, page_size=16, q_offset=39)
    mla = _wl(family="mla", heads_kv=1, head_dim=576, q_len=1, kv_lora_rank=512, rope_dim=64)
    assert impls.applies("v4_fused", prefill) and not impls.applies("v4_fused", paged)
    assert impls.applies("fa_decode", prefill) and impls.applies("fa_decode", paged)  # dense and paged entries
    assert impls.applies("v7_paged", paged) and not impls.applies("v7_paged", prefill)
    assert impls.applies("v11_mla", mla) and not impls.applies("v9_fp8", paged)  # no quantized workloads yet
    p = impls.problem_of(_wl(family="paged_decode", q_len=1, kv_len=70, page_size=16, q_offset=69))
    assert (p.entry, p.kv_len, p.page_size) == ("paged", 80, 16)  # pages_per_seq x page, as the API sees it


def test_pallas_impls_follow_the_registry():
    from pallas_attn import registry

    by = {i.name: i for i in impls.pallas_impls()}
    for row in registry.rows():
        k = registry.kernel(row.generation)
        mine = [i for i in by.values() if i.generation == row.generation]
        assert [i.config for i in mine] == impls._config_order(registry.configs(row.generation))
        assert {i.lowering for i in mine} == {k.lowering}
    assert by["pallas:fa_decode:default"].lowering == "triton" and "pallas:fa_decode:faithful" not in by
    paged = _wl(family="paged_decode", q_len=1, page_size=16, q_offset=39, head_dim=64, dtype="float16")
    assert by["pallas:v7_paged:faithful"].supports(paged, CPU).ok  # built since issue 11
    assert by["pallas:v7_paged:faithful"].supports(_wl(), CPU).status == "n/a"
    mla = _wl(family="mla", heads_kv=1, head_dim=576, q_len=1, kv_lora_rank=512, rope_dim=64)
    assert "pallas:fa_mla:default" in by  # MLA rows built since issue 13
    assert by["pallas:v11_mla:faithful"].supports(mla, CPU).status != "not_built"
    s = by["pallas:v4_fused:faithful"].supports(_wl(dtype="float16"), CPU)
    assert (s.ok, s.status) == (False, "unsupported") and "float32" in s.reason  # the contract's own words


def test_cuda_impls_read_the_cuda_table_and_say_when_it_is_missing(monkeypatch):
    rows = {r.id: r for r in impls.cuda_table()}
    by = {i.name: i for i in impls.cuda_impls()}
    assert [i.generation for i in by.values()] == list(core.TWIN_IDS)  # every generation with a twin, in order
    assert [g for g in core.TWIN_IDS if g in core.REFERENCE_IDS] == list(core.REFERENCE_IDS)  # the 17 among them
    assert all(by[f"cuda:{g.id}"].kind == ("frontier" if g.frontier else "mirror") for g in core.GENERATIONS if g.twin)
    for gen in core.REFERENCE_IDS:
        assert (by[f"cuda:{gen}"].lowering is not None) == (gen in rows)
    w = _wl(q_len=4, kv_len=300, q_offset=296, causal=True, head_dim=64)
    f = by["cuda:v2_tiled"].roofline(w)
    assert (f.precision, f.materialize_s, f.tile) == ("fp32", True, rows["v2_tiled"].tile(64))
    assert by["cuda:v5_wmma"].roofline(_wl(dtype="bfloat16")).precision == "fp16"  # host cast to fp16
    plan = by["cuda:v6_splitkv"].plan(w, CPU)
    assert plan["split_kv"] and plan["splits"] is None and "CUDA GPU" in plan["splits_note"]
    import cuda_ref

    monkeypatch.setattr(cuda_ref, "choose_splits", lambda **kw: (7, 43), raising=False)
    gpu = Ctx(jax_gpu=True, torch_cuda=True, hopper=True, interpret=False)
    assert by["cuda:v6_splitkv"].plan(w, gpu)["splits"] == 7
    monkeypatch.setattr(impls, "cuda_table", lambda: (_ for _ in ()).throw(ImportError("no cuda_ref here")))
    broken = {i.name: i for i in impls.cuda_impls()}
    s = broken["cuda:v4_fused"].supports(_wl(), CPU)
    assert s.status == "unavailable" and "no cuda_ref here" in s.reason


def test_importing_compare_sets_no_environment():
    code = ("import os; import compare.runner, compare.interop, compare.impls, compare.peers, compare.report; "
            "print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "XLA_PYTHON_CLIENT_PREALLOCATE"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr


def test_committed_records_carry_the_declared_lowering():
    """The records under results/ label every Pallas generation with its kernel's declared lowering
    (fa_decode was recorded as mosaic-gpu before the contract said triton; results/README.md)."""
    from pallas_attn import registry

    files = sorted(ROOT.glob("results/*/records.jsonl"))
    assert files
    seen = 0
    for path in files:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("type") != "result" or r["impl"]["framework"] != "pallas" or not r["impl"].get("lowering"):
                continue
            assert r["impl"]["lowering"] == registry.kernel(r["impl"]["generation"]).lowering, (path, r["impl"])
            seen += 1
    assert seen


# ------------------------------------------------------------------------- GPU bookkeeping (host clock)


@pytest.mark.slow
def test_gpu_bookkeeping_rates_speedups_and_twin(tmp_path):
    """The GPU path of a run (warm-up, timing, rates, fractions, best peer, twin agreement), driven on the
    CPU: the clock falls back to host-wall (labelled) and the ceilings are injected."""
    import pallas_attn

    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path), reps=3, warmup=1, e2e_reps=2,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[])
    run = runner._Run(opts)
    run.gpu = True  # exercise the GPU branch
    run.env = {**run.env, "device_kind": "gpu", "gpu": "stand-in (host clock)"}
    hw = hardware.get("h100")
    run.hw_ds = hw
    run.ceil = {"hbm_read_Bps": 3.0e12, "hbm_copy_Bps": 2.9e12, "flops": {"fp32": 50e12, "fp16": 700e12}}
    run.hw = hw.with_measured(hbm_bw=3.0e12, flops=run.ceil["flops"])
    w = _wl(name="bk", batch=1, heads_q=2, heads_kv=2, q_len=32, kv_len=32, head_dim=64, causal=True)

    def dense(gen):
        def prep(w, inp, ctx):
            fn = jax.jit(lambda q, k, v: pallas_attn.attention(q, k, v, causal=w.causal, scale=inp.scale,
                                                               q_offset=w.q_offset, generation=gen, interpret=True))
            return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH")
        return prep

    def xla(w, inp, ctx):
        fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla"))
        return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH")

    sup = lambda w, c: YES  # noqa: E731
    impls = [Impl("pallas:v4_fused:faithful", "pallas", "v4_fused", "faithful", "mirror", "triton", "", sup,
                  dense("v4_fused")),
             Impl("cuda:v4_fused", "cuda", "v4_fused", None, "mirror", "stand-in", "", sup, dense("v3_online")),
             Impl("jax:xla", "jax", None, None, "peer", "xla", "", sup, xla)]
    recs = run.run_workload(w, impls)
    assert [r["status"] for r in recs] == ["ok", "ok", "ok"], [r.get("reason") for r in recs]
    for r in recs:
        assert records.validate(r) == []
        m = r["metrics"]
        assert m["clock"] == "host-wall" and m["clock_notes"]
        assert m["reps"] == 3 and m["time_us_p10"] <= m["time_us_p50"] <= m["time_us_p90"]
        pred = r["prediction"]["measured"]
        assert m["tflops"] == pytest.approx(pred["flops"] / (m["time_us_p50"] * 1e-6) / 1e12)
        assert m["roofline_fraction"] == pytest.approx(pred["floor_us"] / m["time_us_p50"])
        assert m["hbm_fraction"] == pytest.approx(pred["bytes"] / (m["time_us_p50"] * 1e-6) / 3.0e12)
        assert m["tc_fraction"] is not None and m["limiter"] in ("MMA", "HBM", "MUFU")
        assert m["best_peer"] == "jax:xla"
        argv = shlex.split(r["repro"])
        assert argv[argv.index("--only") + 1] == f"bk:{r['impl']['name']}" and "--reps" in argv
    p, c = recs[0], recs[1]
    assert p["metrics"]["twin"] == "cuda:v4_fused" and c["metrics"]["twin"] == "pallas:v4_fused:faithful"
    assert p["metrics"]["speedup_vs_twin"] == pytest.approx(1 / c["metrics"]["speedup_vs_twin"])
    tw = p["agreement"]["twin"]
    assert tw["subset"] == "full output" and tw["rel_l2_err"] < 1e-5  # v4 vs v3 on the same fp32 inputs
    # the report renders GPU-labelled records into tables and both plots
    from compare import report

    path = tmp_path / "gpu.jsonl"
    hdr = {**run.base("header"), "argv": ["python", "-m", "compare", "run"]}
    ceil = {**run.base("ceilings"), "measured": {"clock": "cuda-events", **run.ceil}, "reason": None,
            "datasheet": {"name": hw.name, "hbm_bw_Bps": hw.hbm_bw, "flops": dict(hw.flops), "l2_mb": hw.l2_mb}}
    records.write_jsonl(path, [hdr, ceil, *recs])
    out = report.render([path], tmp_path / "docs" / "results.md", tmp_path / "docs" / "img")
    pngs = sorted(p.name.split("_")[0] for p in out if p.suffix == ".png")
    assert pngs == ["bars", "generations", "roofline"] and all(p.stat().st_size > 10_000 for p in out[1:])
    md = out[0].read_text()
    assert "| pallas:v4_fused:faithful | ok |" in md and "measured ceilings" in md and "![roofline]" in md


def test_cupti_samples_drop_one_flush_kernel_per_rep():
    f = frozenset({"loop_not_fusion"})
    per_iter = [[("loop_not_fusion", 0.5), ("attn", 0.010), ("merge", 0.002)],
                [("loop_not_fusion", 0.5), ("attn", 0.011), ("merge", 0.002)]]
    assert timing._cupti_samples(per_iter, f) == pytest.approx([12.0, 13.0])
    # renamed by fusion numbering but still first: recognised; a generic name later in the list is kept
    assert timing._cupti_samples([[("loop_not_fusion_1", 0.5), ("loop_not_fusion", 0.004)]],
                                 frozenset({"wrapped_not"})) == pytest.approx([4.0])
    with pytest.raises(RuntimeError, match="not found"):
        timing._cupti_samples([[("attn", 0.01)]], f)
    with pytest.raises(RuntimeError, match="no implementation kernel"):
        timing._cupti_samples([[("loop_not_fusion", 0.5)]], f)


def test_multi_device_building_blocks():
    """The loop clock chains steps inside one program; aggregated hardware adds bandwidth and rates; the
    devices field is validated."""
    import jax.numpy as jnp

    from compare import hardware, timing
    from compare.workloads import ConfigError, _build

    t = timing.time_loop(lambda x, y: x * y, (jnp.ones((4, 8)), jnp.full((4, 8), 2.0)), reps=2, iters=3)
    assert t.clock == "host-wall:in-jit-loop-diff" and len(t.samples_us) == 2
    hw = hardware.get("h200")
    agg = hardware.aggregate(hw, 4)
    assert agg.hbm_bw == 4 * hw.hbm_bw and agg.flops["fp16"] == 4 * hw.flops["fp16"]
    assert hardware.aggregate(hw, 1) is hw
    base = dict(name="w", family="decode", batch=1, heads_q=8, heads_kv=2, q_len=1, kv_len=1024, head_dim=64,
                dtype="float16")
    assert _build({**base, "devices": 4}, "t").devices == 4
    with pytest.raises(ConfigError, match="devices"):
        _build({**base, "devices": 3}, "t")  # 1024 keys do not split into 3
    with pytest.raises(ConfigError, match="devices"):
        _build({**base, "family": "prefill", "devices": 2}, "t")


def test_multi_device_fractions_are_against_the_aggregate_ceiling(tmp_path):
    """A workload over 4 GPUs is read against 4 x the one-GPU measured ceilings (session 11: the cp_decode records
    read 211-423% of one GPU's): the same bytes and time give a quarter of the one-GPU fraction."""
    import types

    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path), reps=3, warmup=1, e2e_reps=2,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[])
    run = runner._Run(opts)
    run.hw_ds = hardware.get("h100")
    run.ceil = {"hbm_read_Bps": 3.0e12, "flops": {"fp16": 700e12}}
    basis = {"flops": 1e12, "bytes": 4e9, "floor_us": 300.0, "limiter": "HBM", "engine": "fp16"}
    got = {}
    for n in (1, 4):
        rec = types.SimpleNamespace(metrics={"time_us_p50": 400.0}, prediction={"basis": "measured", "measured": basis},
                                    workload={"devices": n}, impl={"name": "x"})
        run.fill_rates(rec)
        got[n] = rec.metrics
    assert got[1]["hbm_fraction"] == pytest.approx(4e9 / 400e-6 / 3.0e12)
    assert got[4]["hbm_fraction"] == pytest.approx(got[1]["hbm_fraction"] / 4)
    assert got[4]["tc_fraction"] == pytest.approx(got[1]["tc_fraction"] / 4) and "x 4 GPUs" in got[4]["hbm_ceiling"]


def test_rounds_interleave_the_implementations_samples(monkeypatch, tmp_path, fake_gpu_clocks):
    """``--rounds N`` (the sweep's bimodal clock states, docs/compare.md): every pair runs to its agreement first, then
    the kernel-clock samples are taken round-robin, N rounds of ~reps / N each, so each implementation's samples see
    the same stretch of the run; the record keeps every sample, the clock and a note, in the implementations' order.
    A clock that ticks per call stands in for the GPU's: with rounds the two implementations' samples interleave."""
    from compare import runner, timing
    from compare.impls import all_impls
    from compare.workloads import Workload

    tick = {"t": 0}
    calls = []

    def fake_kernels(fn, args, **kw):
        calls.append((fn, kw["reps"]))
        out = []
        for _ in range(kw["reps"]):
            tick["t"] += 1
            out.append(float(tick["t"]))
        return timing.Timing(tuple(out), "cupti:mosaic", True, (), requested="cupti:mosaic")

    fake_gpu_clocks(fake_kernels)
    w = Workload(name="t_rounds", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                 head_dim=64, dtype="float32", causal=True, seed=1)
    names = ["jax:xla", "pallas:v4_fused:faithful"]
    impls = [i for i in all_impls() if i.name in names]
    assert len(impls) == 2

    def records(rounds):
        tick["t"] = 0
        calls.clear()
        opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / f"out{rounds}"), reps=8, warmup=0,
                                 rounds=rounds, e2e_reps=1, budget_s=30.0, max_run_s=None, clock="cupti",
                                 arch="h100", cpu_max_flops=1e8, no_ceilings=True, quiet=True, argv=[])
        run = runner._Run(opts, workloads=[w], impls=impls)
        run.gpu = True  # time as on a GPU: the kernel clock is the fake above
        monkeypatch.setattr(run, "fill_rates", lambda rec: None)
        return [r for r in run.run_workload(w, impls) if r.get("type", "result") == "result"], list(calls)

    seq, seq_calls = records(1)
    assert [r["status"] for r in seq] == ["ok", "ok"], [r["reason"] for r in seq]
    assert [c[1] for c in seq_calls] == [8, 8]
    first = {r["impl"]["name"]: r["metrics"]["time_us_p50"] for r in seq}
    assert max(first.values()) - min(first.values()) == 8  # back to back: the second saw the later clock states

    inter, inter_calls = records(4)
    assert [r["impl"]["name"] for r in inter] == [r["impl"]["name"] for r in seq]
    assert [c[1] for c in inter_calls] == [2] * 8  # 4 rounds x 2 implementations, 2 samples each
    assert [c[0] for c in inter_calls[:2]] != [inter_calls[0][0]] * 2  # round-robin, not back to back
    for r in inter:
        m = r["metrics"]
        assert r["status"] == "ok" and m["reps"] == 8 and m["timing_rounds"] == 4, m
        assert any("4 rounds" in n for n in m["clock_notes"]), m["clock_notes"]
    p50 = [r["metrics"]["time_us_p50"] for r in inter]
    assert abs(p50[0] - p50[1]) <= 2  # the same stretch of clock states: medians 2 ticks apart, not 8
    # the order rotates a round (session 38): each implementation is timed first in half the rounds, and the record
    # keeps each round's median and the pair's place in it
    assert [c[0] for c in inter_calls[2:4]] == [inter_calls[1][0], inter_calls[0][0]]
    places = [r["metrics"]["round_places"] for r in inter]
    assert places == [[0, 1, 0, 1], [1, 0, 1, 0]], places
    assert inter[0]["metrics"]["round_p50_us"] == [1.5, 7.5, 9.5, 15.5]  # ticks 1-2, 7-8, 9-10, 15-16
    assert inter[1]["metrics"]["round_p50_us"] == [3.5, 5.5, 11.5, 13.5]


def test_records_say_where_the_run_time_went(tmp_path):
    """Every executed record carries ``metrics.phase_s``: host wall seconds of its prepare, agreement (and on a GPU its
    warm-up, kernel clock and e2e); the first pair of a workload also the workload's shared plan, inputs and oracle
    (a sweep run spends ~13 s a workload; the next run says on what)."""
    from compare import runner
    from compare.impls import all_impls
    from compare.workloads import Workload

    w = Workload(name="t_phase", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                 head_dim=64, dtype="float32", causal=True, seed=1)
    impls = [i for i in all_impls() if i.name in ("jax:xla", "pallas:v4_fused:faithful")]
    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / "out"), reps=2, warmup=0, e2e_reps=1,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[])
    run = runner._Run(opts, workloads=[w], impls=impls)
    recs = [r for r in run.run_workload(w, impls) if r["status"] == "ok"]
    assert len(recs) == 2
    first, second = (r["metrics"]["phase_s"] for r in recs)
    assert {"plan", "inputs", "oracle", "oracle_host", "oracle_fetch", "prepare", "agreement"} <= set(first), first
    assert first["oracle_host"] + first["oracle_fetch"] <= first["oracle"] + 2e-3  # parts of it (a tiny workload: ~0)
    assert {"prepare", "agreement"} <= set(second) and "inputs" not in second, second
    assert all(v is None or v >= 0 for v in first.values())


def test_compile_ahead_finishes_before_any_timing(monkeypatch, tmp_path, fake_gpu_clocks):
    """``--compile-workers`` (session 25): a workload's Pallas programs are prepared on the run's thread and compiled
    on worker threads while the inputs, oracle and first calls go on; every compile is done before the first timed
    repetition (a CUPTI window counts every kernel of the process). The records are the ones a run without workers
    writes; a compile that fails on a worker is repeated by the pair's first call, which records what it says."""
    from compare import cli, runner, timing
    from compare.impls import all_impls
    from compare.workloads import Workload

    pending_at_timing = []

    def fake_kernels(fn, args, **kw):
        prepared = run_ref[0]._state.get("prepared") or {}
        pending_at_timing.append(sum(1 for p in prepared.values() if p["future"] and not p["future"].done()))
        return timing.Timing((3.0,) * kw["reps"], "cupti:mosaic", True, (), requested="cupti:mosaic")

    fake_gpu_clocks(fake_kernels)
    w = Workload(name="t_ahead", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16,
                 head_dim=64, dtype="float32", causal=True, seed=1)
    names = ["pallas:v4_fused:faithful", "jax:xla", "pallas:v3_online:faithful"]
    impls = sorted((i for i in all_impls() if i.name in names), key=lambda i: names.index(i.name))
    assert len(impls) == 3
    run_ref = []

    def records(workers, tag):
        opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path / tag), reps=3, warmup=0, e2e_reps=1,
                                 budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                                 no_ceilings=True, quiet=True, argv=[], compile_workers=workers)
        run = runner._Run(opts, workloads=[w], impls=impls)
        run.gpu = True
        monkeypatch.setattr(run, "fill_rates", lambda rec: None)
        orig = run.precompile

        def keep_state(w_, impls_, state):  # the test reads the workload's state from the fake clock
            run._state = state
            return orig(w_, impls_, state)

        monkeypatch.setattr(run, "precompile", keep_state)
        run._state = {}
        run_ref[:] = [run]
        try:
            return run.run_workload(w, impls)
        finally:
            if getattr(run, "_pool", None) is not None:
                run._pool.shutdown()

    plain = records(0, "plain")
    ahead = records(2, "ahead")
    assert [r["status"] for r in ahead] == [r["status"] for r in plain] == ["ok"] * 3
    assert pending_at_timing and not any(pending_at_timing)
    phases = [r["metrics"]["phase_s"] for r in ahead]
    # the Pallas pairs on workers; XLA's own attention compiles at its first call (its autotuning runs kernels)
    assert "compile_bg" in phases[0] and "compile_bg" in phases[2] and "compile_bg" not in phases[1]
    assert all("compile_bg" not in r["metrics"]["phase_s"] for r in plain)
    for a, b in zip(ahead, plain):
        assert a["agreement"]["rel_l2_err"] == b["agreement"]["rel_l2_err"]

    def broken(fn, args):
        raise RuntimeError("worker compile failed")

    monkeypatch.setattr(runner, "_compile_ahead", broken)
    again = records(2, "broken")
    assert [r["status"] for r in again] == ["ok"] * 3  # the first call compiled it
    assert all("compile_bg" not in r["metrics"]["phase_s"] for r in again)
    with pytest.raises(runner.UsageError, match="compile-workers"):
        runner.RunOptions.from_args(cli.build_parser().parse_args(["run", "--compile-workers", "-1"]))


def test_inputs_drawn_in_one_program_equal_the_draws_one_by_one():
    """``interop._draw_qkv`` (session 25: one compiled program a workload instead of five) gives bitwise the values the
    draws and casts gave one by one, so records before and after it judged the same inputs."""
    from compare import interop

    for dt, sq, skv in ((jnp.bfloat16, (2, 33, 4, 64), (2, 47, 2, 64)), (jnp.float32, (1, 8, 2, 16), (1, 8, 2, 16))):
        root = jax.random.key(7)
        kq, kk, kv = jax.random.split(root, 3)
        one_by_one = [jax.random.normal(key, shp, jnp.float32).astype(dt)
                      for key, shp in ((kq, sq), (kk, skv), (kv, skv))]
        one_by_one.append(jax.random.normal(jax.random.fold_in(root, 3), sq, jnp.float32).astype(dt))  # train's w
        for a, b in zip(interop._draw_qkv(root, sq, skv, jnp.dtype(dt), True), one_by_one, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            assert np.array_equal(np.asarray(a.astype(jnp.float32)), np.asarray(b.astype(jnp.float32)))
        assert len(interop._draw_qkv(root, sq, skv, jnp.dtype(dt))) == 3


def test_the_oracle_counts_its_host_numpy_and_its_copies_to_host():
    """``accuracy.seconds``: the float64 numpy inside ``_host_only`` counts as "host", ``_to_host``'s copies as
    "fetch", per thread (``metrics.phase_s.oracle_host`` / ``oracle_fetch``, session 27)."""
    import time

    import jax.numpy as jnp

    from compare import accuracy

    h0, f0 = accuracy.seconds("host"), accuracy.seconds("fetch")
    with accuracy._host_only():
        time.sleep(0.02)
    y = jnp.ones((4, 4)).block_until_ready()  # made (and compiled) before the copy is timed
    (x,) = accuracy._to_host(y)
    assert isinstance(x, np.ndarray) and x.shape == (4, 4)
    assert accuracy.seconds("host") - h0 >= 0.02
    assert 0 < accuracy.seconds("fetch") - f0 < accuracy.seconds("host") - h0
