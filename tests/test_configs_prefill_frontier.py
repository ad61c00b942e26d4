"""configs/prefill_frontier.toml (issue 14): the workloads expand as intended, the three calls ``--only 'pf_m_*'``,
``--only 'pf_a_*'`` and ``--only 'pf_b_*'`` split them, and compare's fa_prefill rows accept every one (supports() on
CPU metadata: no kernel runs, no GPU)."""

import fnmatch

import pytest

from compare import impls, peers, runner
from compare.schema import Ctx
from compare.workloads import load_config
from pallas_attn.kernels import fa_prefill

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)
PEERS = {"torch:cudnn", "jax:cudnn", "jax-pallas:mgpu", "torch:flash"}
FA = {f"pallas:fa_prefill:{n}" for n in fa_prefill.CONFIGS}


@pytest.fixture(scope="module")
def ws():
    return load_config("prefill_frontier")


def test_expansion_covers_the_issue(ws):
    names = [w.name for w in ws]
    a = [w for w in ws if fnmatch.fnmatchcase(w.name, "pf_a_*")]
    b = [w for w in ws if fnmatch.fnmatchcase(w.name, "pf_b_*")]
    m = [w for w in ws if fnmatch.fnmatchcase(w.name, "pf_m_*")]
    assert len(a) == 16 and len(b) == 11 and len(m) == 4 and len(a) + len(b) + len(m) == len(ws) == len(set(names))
    # call M: the issue's bar shape, both dtypes, causal and not
    shapes = {(w.batch, w.heads_q, w.heads_kv, w.q_len, w.kv_len, w.head_dim) for w in m}
    assert shapes == {(4, 16, 16, 4096, 4096, 128)}
    assert {(w.dtype, w.causal) for w in m} == {(t, c) for t in ("float16", "bfloat16") for c in (False, True)}
    assert all(w.family == "prefill" for w in ws)
    # call A: D 64 and 256 at B4 H16 N4096 in both dtypes, causal and not; the N sweep at D 128, 16384 tokens
    d_sweep = {(w.head_dim, w.dtype, w.causal) for w in a if w.q_len == 4096}
    assert d_sweep == {(d, t, c) for d in (64, 256) for t in ("float16", "bfloat16") for c in (False, True)}
    n_sweep = {(w.q_len, w.causal) for w in a if w.head_dim == 128}
    assert n_sweep == {(n, c) for n in (1024, 2048, 8192, 16384) for c in (False, True)}
    assert all(w.batch * w.q_len == 16384 for w in a if w.head_dim == 128)
    assert all(w.heads_q == w.heads_kv == 16 and w.q_offset == 0 and w.kv_len == w.q_len for w in a)
    # call B: GQA Hq 32 / Hkv 8, and causal Tq < Tk with the bottom-right offset
    gqa = [w for w in b if w.heads_kv != w.heads_q]
    assert gqa and all((w.heads_q, w.heads_kv, w.group) == (32, 8, 4) for w in gqa)
    br = [w for w in b if w.q_len < w.kv_len]
    assert len(br) == 5 and all(w.causal and w.q_offset == w.kv_len - w.q_len for w in br)
    assert all(peers.causal_mode(w) == "bottom_right" for w in br)
    assert {w.dtype for w in br} == {w.dtype for w in gqa} == {"float16", "bfloat16"}
    assert max(w.kv_len for w in ws) == 16384 and min(w.q_len for w in ws) == 1024
    assert all(w.generations == ("fa_prefill", "pallas:v5_wmma:tuned") and set(w.peers) == PEERS for w in ws)


def test_two_calls_split_the_plan(ws, all_impls):
    runner.check_workload_lists(ws, all_impls)  # every generations / peers entry names something compare knows
    seen = set()
    for glob in ("pf_m_*", "pf_a_*", "pf_b_*"):
        plan = runner.make_plan(ws, all_impls, [glob], [], "prefill_frontier")
        for w, lst in plan:
            got = {i.name for i in lst}
            assert got == FA | PEERS | {"pallas:v5_wmma:tuned"}, (w.name, sorted(got))
            assert w.name not in seen
            seen.add(w.name)
    assert seen == {w.name for w in ws}


def test_fa_prefill_supports_every_workload(ws, all_impls):
    rows = [i for i in all_impls if i.name in FA]
    assert {i.name for i in rows} == FA
    for w in ws:
        for i in rows:
            s = i.supports(w, CPU)
            assert s.ok, (w.name, i.name, s.status, s.reason)
    # the reference generation refuses only what it never served: GQA and D 256 (a record saying so, not a skip)
    v5 = next(i for i in all_impls if i.name == "pallas:v5_wmma:tuned")
    for w in ws:
        assert v5.supports(w, CPU).ok == (w.group == 1 and w.head_dim in (64, 128)), w.name


def _fits(w, cfg) -> bool:
    return fa_prefill.smem_bytes(w.head_dim, 2, cfg) <= fa_prefill._SMEM_LIMIT


def test_named_configs_fit_shared_memory_below_d256(ws):
    for w in ws:
        if w.head_dim < 256:
            assert all(_fits(w, cfg) for cfg in fa_prefill.CONFIGS.values()), w.name


def test_every_named_config_runs_at_d256_with_64_key_tiles(ws):
    """A named config whose 128-key ring does not fit shared memory at D=256 runs with 64-key tiles and two
    stages (``fa_prefill.fit``), and the plan compare records says so; at D <= 128 nothing changes; a config the
    caller built is not changed (forward refuses it: tests/test_fa_prefill.py)."""
    d256 = [w for w in ws if w.head_dim == 256]
    assert d256
    for w in d256:
        for name, cfg in fa_prefill.CONFIGS.items():
            assert not _fits(w, cfg), name  # why the fit exists
            got = fa_prefill.fit(cfg, w.head_dim)
            assert (got.block_kv, got.stages) == (64, 2) and _fits(w, got), name
            assert (got.overlap, got.pingpong) == (cfg.overlap, cfg.pingpong), name  # the schedule is kept
            # three consumers' Q/O tiles do not fit beside the smallest ring at D 256: two consumers run
            assert got.consumers == (2 if cfg.consumers == 3 else cfg.consumers), name
            plan = fa_prefill.KERNEL.plan(impls.problem_of(w), cfg)
            assert (plan["block_kv"], plan["stages"]) == (64, 2), (name, plan)
    for cfg in fa_prefill.CONFIGS.values():
        assert fa_prefill.fit(cfg, 128) is cfg
    built = fa_prefill.PrefillConfig()  # equal to "default", but the caller's own object: taken as is (refused later)
    assert fa_prefill.fit(built, 256) is built
