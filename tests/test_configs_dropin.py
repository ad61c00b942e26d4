"""configs/dropin.toml: the drop-in's benchmark as a compare config (it replaced scripts/bench_dropin.py and its
compare.train_bench, issue 26 item 5). Every shape the script timed is there as a forward (family prefill) and a
training step (family train), its parts select by --only as the script's --set did, the implementations it timed are in
each plan, the drop-in's Hopper pair accepts every GPU shape (no silent gap), and the smoke part runs end to end on the
CPU (interpret mode) with the output and dq / dk / dv against the float64 oracles."""

import fnmatch

import pytest

from compare import records, runner
from compare.schema import Ctx
from compare.workloads import load_config
from pallas_attn.kernels import fa_prefill_bwd, fa_train

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)
HOPPER = Ctx(jax_gpu=False, torch_cuda=False, hopper=True, interpret=True)  # supports() only: nothing runs
PEERS = {"jax:cudnn", "jax:xla", "torch:cudnn", "torch:flash"}
FA_TRAIN = {f"pallas:fa_train:{n}" for n in fa_train.CONFIGS}
DROPIN = {f"pallas:dropin:{n}" for n in fa_prefill_bwd.CONFIGS}

# The script's workloads (compare.train_bench, git history): part -> (batch, heads_q, heads_kv, seq, head_dim, dtype,
# causal), i.e. WORKLOADS ("bar", its default), SWEEP (--set sweep), D256 (--set d256) and SMOKE (--smoke).
SCRIPT = {
    "bar": {(4, 16, 16, 4096, 128, "float16", False), (4, 16, 16, 4096, 128, "float16", True),
            (4, 32, 8, 4096, 128, "bfloat16", True)},
    "sweep": {(4, 16, 16, 4096, 64, "float16", False), (4, 16, 16, 4096, 64, "float16", True),
              (16, 16, 16, 1024, 128, "float16", True), (1, 16, 16, 16384, 128, "float16", True),
              (4, 32, 8, 4096, 128, "bfloat16", False), (4, 16, 16, 4096, 128, "bfloat16", False)},
    "d256": {(4, 16, 16, 4096, 256, "float16", False), (4, 16, 16, 4096, 256, "float16", True)},
    "smoke": {(1, 2, 2, 64, 64, "float32", True), (1, 4, 1, 48, 32, "float32", False)},
}


@pytest.fixture(scope="module")
def ws():
    return load_config("dropin")


def _shape(w):
    return (w.batch, w.heads_q, w.heads_kv, w.q_len, w.head_dim, w.dtype, w.causal)


def test_every_shape_of_the_script_is_a_forward_and_a_training_step(ws):
    assert len({w.name for w in ws}) == len(ws) == 2 * sum(len(v) for v in SCRIPT.values())
    for part, shapes in SCRIPT.items():
        for fam in ("prefill", "train"):
            sel = [w for w in ws if fnmatch.fnmatchcase(w.name, f"dropin_{part}_{fam}_*")]
            assert {_shape(w) for w in sel} == shapes and len(sel) == len(shapes), (part, fam)
            assert all(w.family == fam and w.kv_len == w.q_len and w.q_offset == 0 for w in sel), (part, fam)
            assert all({"dropin", fam, part} <= set(w.tags) for w in sel), (part, fam)
    assert {w.name for w in ws} == {w.name for w in ws if fnmatch.fnmatchcase(w.name, "dropin_*_prefill_*")} | {
        w.name for w in ws if fnmatch.fnmatchcase(w.name, "dropin_*_train_*")}


def test_each_part_plans_the_script_implementations(ws, all_impls):
    """The script's implementations: the drop-in forced onto fa_prefill (pallas:auto on a Hopper; pallas:dropin:<bwd
    config> for the training step; fa_prefill's default config for the forward), forced onto fa_train (every named
    config: the drop-in's heuristic picks among them), jax.nn cuDNN and XLA, torch SDPA cuDNN and FLASH."""
    runner.check_workload_lists(ws, all_impls)
    for part in SCRIPT:
        plan = runner.make_plan(ws, all_impls, [f"dropin_{part}_*"], [], "dropin")
        assert len(plan) == 2 * len(SCRIPT[part])
        for w, lst in plan:
            got = {i.name for i in lst}
            if part == "smoke":
                want = FA_TRAIN | {"jax:xla"}
            elif w.family == "train":
                want = {"pallas:auto"} | DROPIN | FA_TRAIN | PEERS
            else:
                want = {"pallas:auto", "pallas:fa_prefill:default"} | FA_TRAIN | PEERS
            assert got == want, (w.name, sorted(got ^ want))


def test_the_dropin_pair_and_fa_train_accept_every_gpu_shape(ws, all_impls):
    """No silent gap: on a Hopper the drop-in's fa_prefill pair takes every training shape (D 64 / 128 / 256, fp16 /
    bf16, GQA; a head dim outside DROPIN_HEAD_DIMS would be an 'unsupported' record here); fa_train and the public
    entry take every shape; off a Hopper the pair is 'unavailable' with the reason."""
    by = {i.name: i for i in all_impls}
    for w in ws:
        if "smoke" in w.tags:
            continue
        for name in FA_TRAIN | {"pallas:auto"} | ({"pallas:fa_prefill:default"} if w.family == "prefill" else set()):
            assert by[name].supports(w, HOPPER).ok, (w.name, name, by[name].supports(w, HOPPER))
        if w.family == "train":
            for name in DROPIN:
                assert by[name].supports(w, HOPPER).ok, (w.name, name, by[name].supports(w, HOPPER))
                s = by[name].supports(w, CPU)
                assert s.status == "unavailable" and "Hopper" in s.reason, (w.name, name, s)


@pytest.mark.slow
def test_the_smoke_part_runs_on_the_cpu(tmp_path):
    """The script's --smoke: fa_train (every config) and jax.nn's XLA, forward and training step, in interpret mode;
    every record ok against the float64 oracle, the training steps with dq / dk / dv checked too."""
    opts = runner.RunOptions(config="dropin", only=["dropin_smoke_*"], out=str(tmp_path / "out"), reps=1, warmup=0,
                             e2e_reps=1, budget_s=30.0, max_run_s=None, clock="cupti", arch="h100", cpu_max_flops=1e8,
                             no_ceilings=True, quiet=True, argv=[])
    run = runner._Run(opts)
    assert run.main() == 0
    recs = [r for r in records.read_jsonl(run.path) if r["type"] == "result"]
    assert len(recs) == 4 * (len(FA_TRAIN) + 1)
    for r in recs:
        assert records.validate(r) == [], (r["impl"]["name"], records.validate(r))
        assert r["status"] == "ok", (r["workload"]["name"], r["impl"]["name"], r["reason"])
        assert r["agreement"]["rel_l2_err"] < 1e-5, (r["workload"]["name"], r["impl"]["name"])
        if r["workload"]["family"] == "train":
            grads = r["agreement"]["grads"]
            assert all(grads[g]["rel_l2_err"] < 1e-5 for g in ("dq", "dk", "dv")), (r["impl"]["name"], grads)
