"""cuda_ref's paged generations (v7_paged and the v8 family) on a machine without a GPU: their table rows, the split
plan (C++ ``split_plan_for`` compiled as host code = ``cuda_ref.api.split_plan``, the reference's worked example,
packed row tiles of 8 or 16), what each row accepts through ``paged_attention``'s validation, and the kernels'
geometry constants against the specification (docs/reference.md §2.7-§2.13, §2.19). The kernels themselves are
compiled for sm_90a, with their shared memory pinned, by tests/test_cuda_ref_cpu.py; their results are checked on
the GPU by tests/gpu/test_cuda_paged_gpu.py.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import cuda_ref
from attn_core import generations as core_generations
from cuda_ref import api, build

torch = pytest.importorskip("torch")
cuda_table = importlib.import_module("cuda_ref.table")

PAGED = ("v7_paged", "v8_gqa", "v8_gqa_tc", "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")
_I32 = torch.int32


def test_paged_rows_follow_attn_core_and_the_specification():
    rows = {g.id: g for g in cuda_ref.table() if g.entry == "paged"}
    assert tuple(rows) == PAGED
    core = core_generations.ids()
    for i, gen in enumerate(PAGED):
        g = rows[gen]
        assert g.number == 7 + i == core.index(gen) + 1  # the position among the reference's generations
        assert core_generations.get(gen).entries == {"paged"}
        assert (g.operand, g.head_dims, g.materializes_s, g.workspace, g.split_kv, g.writes_lse) == (
            "fp16", (64, 128), False, "split_partials", True, True)
        assert g.gqa == (gen != "v7_paged")  # v7 is MHA only (§2.7)
        rows_per_cta = 16 if gen == "v8_gqa_tc" else 8  # §2.19: 8 packed rows; tc one 16-row M tile
        assert g.tile(64) == (rows_per_cta, 64) and g.tile(128) == (rows_per_cta, 32)


def _kernel_source(gen: str) -> str:
    return (build.CSRC / "kernels" / f"{gen}.cu").read_text()


def test_kernel_geometry_constants():
    # What the specification fixes and each source states (the row checks come from the kernels' static_asserts;
    # the shared memory is pinned by test_cuda_ref_cpu.py's ptxas test).
    common = (build.CSRC / "common" / "paged_warp_rows.cuh").read_text()
    assert re.search(r"kPagedRowsThreads = 256;", common) and re.search(r"kIlpKeys = 4;", common)
    stage = {"v7_paged": "kF32", "v8_gqa": "kF32", "v8_gqa_db": "kF16Double", "v8_gqa_occ": "kF16",
             "v8_gqa_ilp": "kF32"}
    for gen, kind in stage.items():
        src = _kernel_source(gen)
        m = re.search(r"paged_rows_partial<D, KvStage::(\w+), (true|false)>", src)
        assert m, gen
        assert m.group(1) == kind, gen
        assert (m.group(2) == "true") == (gen == "v8_gqa_ilp"), gen
    tc = _kernel_source("v8_gqa_tc")
    assert "kTcThreads = 32;" in tc and "kTcRows = 16;" in tc  # one warp, one 16-row M tile (§2.9)
    assert '#include "common/ss_tile.cuh"' in _kernel_source("v8_gqa_ss")  # the tile lives in one header
    ss = (build.CSRC / "common" / "ss_tile.cuh").read_text()
    assert "__half kt[D][SsTile<D>::TN + 1];" in ss  # K transposed with one element of padding (§2.13)
    assert "kSsThreads = 256;" in ss and "kSsGroup = 32;" in ss


# --- the split plan ---------------------------------------------------------------------------------------------


def test_split_plan_reference_worked_example():
    # docs/reference.md §2.0: v8 G = 8, B = 1, H_kv = 1 -> S = 32 at N_k = 8192 with 40 SMs.
    assert api.split_plan("v8_gqa", batch=1, h_q=8, h_kv=1, n_q=1, n_k=8192, head_dim=64, num_sm=40) == (32, 256)
    # v6 / v7 (MHA): the dense plan over B*H, as cuda_ref.choose_splits.
    for gen in ("v6_splitkv", "v7_paged"):
        assert api.split_plan(gen, batch=1, h_q=8, h_kv=8, n_q=1, n_k=8192, head_dim=128, num_sm=40) == (
            cuda_ref.choose_splits(8, 1, 8192, 40))


def test_split_plan_counts_packed_row_tiles():
    # G = 32 packed rows: 4 row tiles of 8 (Cut 1) vs 2 of 16 (tc) per KV head -> different by_occ.
    kw = {"batch": 1, "h_q": 32, "h_kv": 1, "n_q": 1, "n_k": 1 << 20, "head_dim": 128, "num_sm": 40}
    assert api.split_plan("v8_gqa", **kw) == (20, -(-(1 << 20) // 20))  # ceil(80 / 4)
    assert api.split_plan("v8_gqa_tc", **kw)[0] == 32  # ceil(80 / 2) capped at 32
    assert api.split_plan("v8_gqa_ss", **{**kw, "h_kv": 8, "h_q": 64})[0] == 10  # base 8 KV heads x 1 tile


@pytest.mark.parametrize(
    ("kw", "exc", "match"),
    [
        ({"generation": "v4_fused"}, ValueError, "takes no split plan"),
        ({"generation": "v99"}, ValueError, "not a generation cuda_ref builds"),
        ({"h_q": 6, "h_kv": 4}, ValueError, "multiple of h_kv"),
        ({"n_k": 0}, ValueError, "n_k must be an int >= 1"),
        ({"num_sm": 0}, ValueError, "num_sm"),
        ({"num_sm": None}, RuntimeError, "CUDA"),
    ],
)
def test_split_plan_rejects(kw, exc, match):
    if exc is RuntimeError and torch.cuda.is_available():
        pytest.skip("checks the no-GPU error")
    args = {"generation": "v8_gqa", "batch": 1, "h_q": 8, "h_kv": 2, "n_q": 1, "n_k": 100, "head_dim": 64,
            "num_sm": 40, **kw}
    gen = args.pop("generation")
    with pytest.raises(exc, match=match):
        api.split_plan(gen, **args)


def _cuda_include() -> Path | None:
    nvcc = shutil.which("nvcc")
    for root in ([Path(nvcc).resolve().parent.parent] if nvcc else []) + [Path("/usr/local/cuda")]:
        if (root / "include" / "cuda_runtime.h").is_file():
            return root / "include"
    return None


def test_split_plan_same_in_cpp_and_python(tmp_path):
    cxx, inc = shutil.which("g++") or shutil.which("c++"), _cuda_include()
    if cxx is None or inc is None:
        pytest.skip("needs a host C++ compiler and the CUDA headers")
    prog = tmp_path / "plan.cpp"
    prog.write_text(
        '#include <cstdio>\n#include "common/split_plan.cuh"\n'
        "int main(){for(const auto& g:cuda_ref::kGenerations){if(!g.split_kv)continue;"
        "for(long b:{1,4,64})for(long hkv:{1,2,8})for(long G:{1,2,8,32})for(long nq:{1,5,17})"
        "for(long nk:{1,256,300,8192,131072})for(long d:{64,128})for(int sm:{40,132}){"
        "if(!g.gqa&&G!=1)continue;auto p=cuda_ref::split_plan_for(g,b,G*hkv,hkv,nq,nk,d,sm);"
        'std::printf("%s %ld %ld %ld %ld %ld %ld %d %d %d\\n",g.name,b,G*hkv,hkv,nq,nk,d,sm,p.num_splits,p.chunk);}}}\n'
    )
    exe = tmp_path / "plan"
    gen = [f"-I{p}" for p in build.include_dirs(build.write_generated(tmp_path / "generated"))]
    res = subprocess.run([cxx, "-std=c++17", *gen, "-I", str(inc), str(prog), "-o", str(exe)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    assert len(lines) > 1000
    seen = set()
    for line in lines:
        gen, *nums = line.split()
        b, hq, hkv, nq, nk, d, sm, s, chunk = map(int, nums)
        seen.add(gen)
        assert api.split_plan(gen, batch=b, h_q=hq, h_kv=hkv, n_q=nq, n_k=nk, head_dim=d, num_sm=sm) == (s, chunk), line
    assert seen == {g.id for g in cuda_ref.table() if g.split_kv}


# --- what each paged row accepts ----------------------------------------------------------------------------------


def _paged(b=2, hq=8, hkv=2, nq=1, d=64, num_blocks=8, page=16, pages=4, dtype=torch.float32):
    return {"q": torch.randn(b, hq, nq, d, dtype=dtype),
            "k_pool": torch.randn(num_blocks, page, hkv, d, dtype=dtype),
            "v_pool": torch.randn(num_blocks, page, hkv, d, dtype=dtype),
            "block_table": (torch.arange(b * pages, dtype=_I32) % num_blocks).reshape(b, pages),
            "kv_lens": torch.tensor([min(20 + 13 * i, pages * page) for i in range(b)], dtype=_I32)}


def _validate(args, gen, **kw):
    kw = {"causal": False, "scale": None, "q_offset": None, "return_lse": False, **kw}
    return api.validate_paged(args["q"], args["k_pool"], args["v_pool"], args["block_table"], args["kv_lens"],
                              generation=gen, **kw)


@pytest.mark.parametrize("gen", PAGED)
def test_each_paged_row_validates(gen):
    row = cuda_table.by_id(gen)
    for g in (1, 2, 4, 8, 16, 32):
        args = _paged(hq=2 * g, hkv=2)
        if g > 1 and not row.gqa:
            with pytest.raises(NotImplementedError, match=f"{gen} is MHA"):
                _validate(args, gen)
            continue
        call = _validate(args, gen, causal=True, return_lse=True, num_sm=40)
        assert call == api.PagedCall(row.number, pytest.approx(0.125), 40, None)
    for dtype in (torch.float16, torch.bfloat16):  # host-cast to fp16, as the reference
        assert _validate(_paged(hq=2, dtype=dtype), gen).gen_id == row.number
    assert _validate(_paged(hq=2, d=128), gen).scale == pytest.approx(128**-0.5)
    with pytest.raises(NotImplementedError, match="head dims"):
        _validate(_paged(hq=2, d=96), gen)
    with pytest.raises(ValueError, match=f"{gen} is a paged generation: call cuda_ref.paged_attention"):
        q = torch.randn(1, 2, 4, 64)
        api.validate(q, q, q, causal=False, scale=None, q_offset=0, generation=gen)


def test_num_sm_env_applies_to_paged_rows(monkeypatch):
    monkeypatch.setenv(api.NUM_SM_ENV, "40")
    assert _validate(_paged(), "v8_gqa_ss").num_sm == 40
    monkeypatch.delenv(api.NUM_SM_ENV)
    assert _validate(_paged(), "v8_gqa_ss").num_sm == 0  # 0: the device's SM count


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("gen", PAGED)
def test_paged_call_without_gpu_raises_runtime_error(gen):
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_ref.paged_attention(**_paged(hq=2), generation=gen)
