"""compare's CUDA paged path (cuda_ref.paged_attention for v7_paged and the v8 family), on the CPU.

Support comes from cuda_ref.api.validate_paged on meta tensors, the split plan from cuda_ref.api.split_plan over
the table's capacity, and the prepared call's operands are the workload's own pools, table and lengths (checked
here with validate_paged on CPU tensors, where the binding's value checks run). The kernels themselves need a GPU:
tests/gpu/test_compare_gpu.py runs compare end to end there.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cuda_ref  # noqa: E402
from compare import impls, interop  # noqa: E402
from compare.schema import YES, Ctx  # noqa: E402
from compare.workloads import Workload  # noqa: E402

CPU = Ctx(jax_gpu=False, torch_cuda=False, hopper=False, interpret=True)
GPU = Ctx(jax_gpu=True, torch_cuda=True, hopper=True, interpret=False)
PAGED = tuple(r.id for r in cuda_ref.table() if r.entry == "paged")


def _paged(**kw) -> Workload:
    base = dict(name="p", family="paged_decode", batch=2, heads_q=8, heads_kv=2, q_len=1, kv_len=300, head_dim=64,
                dtype="float16", causal=False, q_offset=299, page_size=16, ragged=True, seed=5)
    base.update(kw)
    return Workload(**base)


@pytest.fixture(scope="module")
def by_name():
    return {i.name: i for i in impls.cuda_impls()}


def test_the_paged_rows_are_wired(by_name):
    assert PAGED == ("v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")
    for gen in PAGED:
        assert by_name[f"cuda:{gen}"].lowering == "cuda-jit"


def test_supports_through_validate_paged(by_name, monkeypatch):
    monkeypatch.delenv("CUDA_REF_NUM_SM", raising=False)
    w = _paged()
    for gen in PAGED[1:]:
        s = by_name[f"cuda:{gen}"].supports(w, CPU)  # every check passes; only the GPU is missing
        assert (s.ok, s.status) == (False, "unavailable") and "CUDA GPU" in s.reason, (gen, s)
        assert by_name[f"cuda:{gen}"].supports(w, GPU) == YES
    s = by_name["cuda:v7_paged"].supports(w, GPU)  # the row's own refusal, in cuda_ref's words
    assert (s.status, s.ok) == ("unsupported", False) and "MHA" in s.reason
    assert by_name["cuda:v7_paged"].supports(_paged(heads_kv=8, page_size=8), GPU) == YES
    s = by_name["cuda:v8_gqa"].supports(_paged(head_dim=96), GPU)  # D 64 / 128 only
    assert s.status == "unsupported" and "96" in s.reason
    assert by_name["cuda:v6_splitkv"].supports(w, GPU).status == "n/a"  # a dense row never sees a paged workload
    assert by_name["cuda:v8_gqa"].supports(_paged(family="decode", page_size=None, ragged=False), GPU).status == "n/a"
    s = by_name["cuda:v8_gqa"].supports(_paged(kv_dtype="fp8_e4m3"), GPU)
    assert s.status == "unsupported" and "kv_dtype=fp8_e4m3" in s.reason


def test_plan_is_split_plan_over_the_table_capacity(by_name, monkeypatch):
    monkeypatch.delenv("CUDA_REF_NUM_SM", raising=False)
    w = _paged()
    plan = by_name["cuda:v8_gqa"].plan(w, CPU)
    assert plan["split_kv"] and plan["splits"] is None and "CUDA GPU" in plan["splits_note"]
    monkeypatch.setenv("CUDA_REF_NUM_SM", "40")  # the reference's plan: known without a GPU
    for gen in PAGED:
        for wl in (w, _paged(batch=1, heads_q=8, heads_kv=1, kv_len=8192, head_dim=128, page_size=256, ragged=False),
                   _paged(batch=1, heads_q=32, heads_kv=32, kv_len=8192, page_size=256, ragged=False)):
            if gen == "v7_paged" and wl.heads_q != wl.heads_kv:
                continue
            plan = by_name[f"cuda:{gen}"].plan(wl, CPU)
            cap = -(-wl.kv_len // wl.page_size) * wl.page_size
            want = cuda_ref.api.split_plan(gen, batch=wl.batch, h_q=wl.heads_q, h_kv=wl.heads_kv, n_q=wl.q_len,
                                           n_k=cap, head_dim=wl.head_dim, num_sm=40)
            assert (plan["splits"], plan["chunk"], plan["num_sm"], plan["n_k"]) == (*want, 40, cap), (gen, wl)
            assert plan["rows_per_program"] == (16 if gen == "v8_gqa_tc" else 8)
    # 300 keys in pages of 16: the plan covers the capacity 304, as the launch does (lengths are runtime data)
    assert by_name["cuda:v8_gqa"].plan(w, CPU)["n_k"] == 304
    # docs/reference.md §2.8's worked example: G 8, B 1, N_k 8192 on 40 SMs -> S 32 of 256 keys; the G-sweep's no-pack
    # point (G 1, H 32) -> S 3 of 2731 keys (docs/paged_gqa.md)
    ex = _paged(batch=1, heads_q=8, heads_kv=1, kv_len=8192, head_dim=128, page_size=256, ragged=False)
    assert (by_name["cuda:v8_gqa"].plan(ex, CPU)["splits"], by_name["cuda:v8_gqa"].plan(ex, CPU)["chunk"]) == (32, 256)
    g1 = by_name["cuda:v7_paged"].plan(_paged(batch=1, heads_q=32, heads_kv=32, kv_len=8192, head_dim=128,
                                               page_size=256, ragged=False), CPU)
    assert (g1["splits"], g1["chunk"]) == (3, 2731)


def test_prepared_call_reads_the_workloads_own_paged_operands(by_name):
    """On the CPU the prepared operands are CPU torch views of compare's inputs: validate_paged then checks their
    values too (table entries inside the pool, lengths within the capacity), exactly the call the GPU makes."""
    w = _paged()
    inp = interop.make_inputs(w)
    prep = by_name["cuda:v8_gqa_ss"].prepare(w, inp, CPU)
    assert (prep.framework, prep.layout) == ("torch", "BHND")
    fn = prep.fn
    assert isinstance(fn, functools.partial) and fn.func is cuda_ref.paged_attention
    assert fn.keywords["generation"] == "v8_gqa_ss" and fn.keywords["causal"] is False
    assert fn.keywords["scale"] == pytest.approx(inp.scale)
    q, kp, vp, table, lens = prep.args
    assert tuple(q.shape) == (w.batch, w.heads_q, w.q_len, w.head_dim) and q.is_contiguous()
    np.testing.assert_array_equal(q.float().numpy(), np.asarray(inp.q, np.float32).transpose(0, 2, 1, 3))
    np.testing.assert_array_equal(kp.float().numpy(), np.asarray(inp.k_pool, np.float32))
    np.testing.assert_array_equal(vp.float().numpy(), np.asarray(inp.v_pool, np.float32))
    np.testing.assert_array_equal(table.numpy(), np.asarray(inp.block_table))
    np.testing.assert_array_equal(lens.numpy(), inp.kv_lens)
    assert table.dtype == lens.dtype == torch.int32 and q.dtype == kp.dtype == torch.float16
    offs = fn.keywords["q_offset"]  # the binding's default kv_len - N_q, made outside the timed call
    assert offs.dtype == torch.int32 and offs.tolist() == [int(n) - w.q_len for n in inp.kv_lens]
    call = cuda_ref.api.validate_paged(*prep.args, generation="v8_gqa_ss", causal=False, scale=inp.scale,
                                       q_offset=offs, return_lse=False)
    assert call.scale == pytest.approx(inp.scale)
    assert by_name["cuda:v8_gqa"].prepare(w, inp, CPU).args[0] is q  # one layout copy per workload, shared
