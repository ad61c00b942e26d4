"""compare's runner split (docs/compare.md, "The runner's structure"): the typed record and the plan step.

The plan of a workload is made before any of its pairs runs; its refusals never call ``prepare``; a planning
error becomes that pair's 'compare error' record in its place; ``ResultRecord.to_json`` keeps the schema's
key order."""

from __future__ import annotations

import jax
import pytest

from compare import records, runner
from compare.record import PairPlan, Refusal, ResultRecord
from compare.schema import YES, Impl, Prepared, Support
from compare.workloads import Workload

KEYS = ["schema", "type", "run_id", "env", "workload", "impl", "status", "reason", "metrics", "agreement", "repro"]


def _wl(**kw) -> Workload:
    base = dict(name="t", family="prefill", batch=1, heads_q=2, heads_kv=2, q_len=16, kv_len=16, head_dim=16,
                dtype="float32", causal=False, q_offset=0, seed=3)
    base.update(kw)
    return Workload(**base)


def test_result_record_json_keeps_the_schema_order_and_shares_its_parts():
    head = {"schema": records.SCHEMA_VERSION, "type": "result", "run_id": "r", "env": {}}
    rec = ResultRecord(head=head, workload={"name": "w"}, impl={"name": "i"}, repro="python -m compare run")
    assert list(rec.to_json()) == KEYS  # no prediction key until one is set (a compare-error record has none)
    rec.set_prediction(None)
    assert list(rec.to_json()) == [*KEYS, "prediction"] and rec.to_json()["prediction"] is None
    j = rec.refuse(Refusal("skipped", "why")).to_json()
    assert (j["status"], j["reason"]) == ("skipped", "why")
    j["metrics"]["x"] = 1  # the summary fills the JSON's parts after to_json: they are the record's own
    assert rec.metrics == {"x": 1}


@pytest.fixture
def run(tmp_path):
    opts = runner.RunOptions(config="smoke", only=[], out=str(tmp_path), reps=1, warmup=0, e2e_reps=1,
                             budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e6,
                             no_ceilings=True, quiet=True, argv=[])
    return runner._Run(opts)


def _impls(prepared: list[str]) -> list[Impl]:
    def never(w, inp, ctx):
        prepared.append("never")
        raise AssertionError("a refused pair must not be prepared")

    def xla(w, inp, ctx):
        prepared.append("xla")
        fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, implementation="xla"))
        return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH")

    def boom(w, ctx):
        raise RuntimeError("planning bug")

    peer = dict(framework="jax", generation=None, config=None, kind="peer", lowering="xla", notes="")
    return [Impl("jax:na", supports_fn=lambda w, c: Support(False, "", "n/a"), prepare_fn=never, **peer),
            Impl("jax:uns", supports_fn=lambda w, c: Support(False, "needs a GPU", "unsupported"), prepare_fn=never,
                 **peer),
            Impl("jax:boom", supports_fn=boom, prepare_fn=never, **peer),
            Impl("jax:xla", supports_fn=lambda w, c: YES, prepare_fn=xla, **peer)]


def test_plan_decides_refusals_without_running(run):
    prepared: list[str] = []
    impls = _impls(prepared)
    big = _wl(name="big", q_len=256, kv_len=256)  # 4*2*256*256*16 = 8.4e6 FLOPs > --cpu-max-flops 1e6
    plans = run.plan_workload(big, impls)
    na, uns, boom, xla = (plans[id(i)] for i in impls)
    assert na is None
    assert isinstance(uns, PairPlan) and uns.refusal == Refusal("unsupported", "needs a GPU") and uns.skip is None
    assert isinstance(boom, RuntimeError)
    assert isinstance(xla, PairPlan) and xla.refusal is None and xla.skip.status == "skipped"
    assert "too large for CPU interpret mode" in xla.skip.reason
    assert xla.record.has_prediction and xla.basis.get("floor_us", 0) > 0  # the prediction is made in the plan
    recs = run.run_workload(big, impls)
    assert prepared == []  # nothing of a refused or skipped pair ran
    assert [(r["impl"]["name"], r["status"]) for r in recs] == [
        ("jax:uns", "unsupported"), ("jax:boom", "failed"), ("jax:xla", "skipped")]
    assert recs[1]["reason"] == "compare error: RuntimeError: planning bug" and "prediction" not in recs[1]
    assert all(records.validate(r) == [] for r in recs)


def test_execute_fills_agreement_and_cpu_timing_in_schema_order(run):
    prepared: list[str] = []
    recs = run.run_workload(_wl(), _impls(prepared)[1:])
    assert prepared == ["xla"]
    r = recs[-1]
    assert r["status"] == "ok", r["reason"]
    assert list(r) == [*KEYS, "prediction"]
    assert r["agreement"]["rel_l2_err"] < r["agreement"]["tol_rel_l2"]
    assert r["metrics"]["clock"] == "cpu-interpret" and r["metrics"]["time_us_p50"] is None
    assert all(records.validate(x) == [] for x in recs)


def test_open_new_never_overwrites_a_records_file(tmp_path):
    """The probe scripts' records file: created under --out, None without one, and never written over."""
    from compare import records as recs

    assert recs.open_new(None) is None
    with recs.open_new(tmp_path / "run") as f:
        f.write("{}\n")
    with pytest.raises(SystemExit, match="exists; pick a new --out"):
        recs.open_new(tmp_path / "run")
    assert (tmp_path / "run" / "records.jsonl").read_text() == "{}\n"


def test_the_same_programs_are_timed_once(run):
    """Two implementations whose ``program_key_fn`` agree on a workload launch the same programs: the first runs, the
    later one is a 'skipped' record naming it; a key of None (or one that raises) never skips."""
    prepared: list[str] = []
    xla = _impls(prepared)[-1]

    def twin(name, key):
        return Impl(name, "jax", None, None, "peer", "xla", "", supports_fn=lambda w, c: YES, prepare_fn=xla.prepare_fn,
                    program_key_fn=key)

    def bad(w):
        raise RuntimeError("no key")

    impls = [twin("a", lambda w: ("k", 1)), twin("b", lambda w: ("k", 2)), twin("c", lambda w: ("k", 1)),
             twin("d", lambda w: None), twin("e", bad), twin("f", lambda w: ("k", 2))]
    recs = run.run_workload(_wl(), impls)
    assert [(r["impl"]["name"], r["status"]) for r in recs] == [
        ("a", "ok"), ("b", "ok"), ("c", "skipped"), ("d", "ok"), ("e", "ok"), ("f", "skipped")]
    assert "the same programs as a" in recs[2]["reason"] and "the same programs as b" in recs[5]["reason"]
    assert prepared == ["xla"] * 4


def test_fa_decode_named_configs_share_programs_where_their_knobs_do_not_apply():
    """compare's key for pallas:fa_decode:<config> (``Kernel.effective``): on a bf16 cache every quantized-decode
    config is the default's program; on fp8 the NVFP4 ones are; quant_alt_decode never is on a quantized cache."""
    from compare import impls as ci
    from pallas_attn.kernels import fa_decode as fd

    def key(cfg, **kw):
        w = Workload(**{**dict(name="d", family="decode", batch=1, heads_q=32, heads_kv=8, q_len=1, kv_len=8192,
                                head_dim=128, dtype="bfloat16", causal=True, q_offset=8191, seed=0), **kw})
        return ci._pallas_program_key("fa_decode", cfg, w)

    quant = ("quant_alt_decode", "quant_pv16", "quant_pv16_off", "nvfp4_plain", "nvfp4_cast", "quant_qk16",
             "quant_qk16_off")
    assert all(key(c) == key("default") for c in quant)
    assert key("tuned") != key("default")  # its knobs (tile, stages) apply to every cache
    fp8, nv = dict(kv_dtype="fp8_e4m3"), dict(kv_dtype="nvfp4")
    assert key("nvfp4_plain", **fp8) == key("nvfp4_cast", **fp8) == key("default", **fp8)
    assert key("quant_alt_decode", **fp8) != key("default", **fp8)
    # NVFP4 (session 19): the default decodes by "asm" as halves at every batch; "cast" (session 18's default) and the
    # plain path are other programs, the same one below the batch regime (B1), not above it (B32 x Hkv 8 >= 132 SMs)
    assert key("nvfp4_cast", **nv) != key("default", **nv) != key("nvfp4_plain", **nv)
    assert key("nvfp4_cast", **nv) == key("nvfp4_plain", **nv)
    assert key("nvfp4_cast", batch=32, **nv) != key("nvfp4_plain", batch=32, **nv)
    assert key(fd.DecodeConfig(nvfp4_halves=True), **nv) == key("default", **nv)
    # NVFP4's batch-regime occupancy (session 36): another program in the regime only; fp8 / bf16 caches never
    for occ in ("nvfp4_occ8", "nvfp4_occ16"):
        assert key(occ, **nv) == key("default", **nv) and key(occ) == key("default") and key(occ, **fp8) == key(
            "default", **fp8)
        assert key(occ, batch=32, **nv) != key("default", batch=32, **nv)
    assert key("nvfp4_occ8", batch=32, **nv) != key("nvfp4_occ16", batch=32, **nv)
    assert key(fd.DecodeConfig(nvfp4_halves=False), **nv) != key("default", **nv)
    # quant_pv16 (a bf16 q only): the default's is on in the batch regime only
    for kv in (fp8, nv):
        assert key("quant_pv16_off", **kv) == key("default", **kv) != key("quant_pv16", **kv)  # B1
        assert key("quant_pv16", batch=32, **kv) == key("default", batch=32, **kv) != key("quant_pv16_off", batch=32,
                                                                                           **kv)
        assert key("quant_pv16", dtype="float16", **kv) == key("default", dtype="float16", **kv)  # fp16 q: no convert
    # quant_qk16 (session 38, a bf16 q only): on and off are two programs on either cache; the default's is on, except
    # NVFP4 programs of fewer than 8 key tiles (B1 S 8k: 32 splits of 4); an fp16 q runs the default's program
    for kv, b, n, on in ((fp8, 1, 8192, True), (fp8, 32, 8192, True), (nv, 1, 8192, False), (nv, 1, 32768, True),
                         (nv, 32, 8192, True)):
        same, other = ("quant_qk16", "quant_qk16_off") if on else ("quant_qk16_off", "quant_qk16")
        kw = dict(batch=b, kv_len=n, q_offset=n - 1, **kv)
        assert key(same, **kw) == key("default", **kw) != key(other, **kw), kw
        for c in ("quant_qk16", "quant_qk16_off"):
            assert key(c, dtype="float16", **kw) == key("default", dtype="float16", **kw)
