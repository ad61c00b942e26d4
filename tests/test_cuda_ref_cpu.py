"""cuda_ref on a machine without a GPU: every kernel compiles for sm_90a with no register spills, the binding
compiles against torch's headers, the generation table (generations.def, rendered from attn_core's twin rows at
build time) reads the same in C++ and Python, the split heuristic is the same in C++ and Python, every argument check
(dense and paged) raises the documented error before any GPU is needed, and ``import cuda_ref`` stays free of
torch and JAX.

nvcc runs once per session for all sources, in parallel (conftest's ``nvcc_sm90a``, shared with test_cuda_mla.py;
the host-compiler jobs of fixture ``compiled`` run beside it). The ptxas resource report is written to
cuda_ref/resources/ptxas_sm90a.txt (committed, shipped with the package: compare's layer 2 reads it; docs/cuda_ref.md
summarises it).
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

import cuda_ref
from attn_core import generations as core_generations
from attn_core import splits as core_splits
from cuda_ref import api, build

cuda_table = importlib.import_module("cuda_ref.table")  # the module (cuda_ref.table is its table() function)
# A reference generation cuda_ref does not build (the first in attn_core's order), for "no CUDA twin" errors. Once
# all 17 are built, v12_mla_tc stands in and the tests that use it drop its row from the table (_drop_unbuilt).
_UNBUILT_REFERENCE_ID = next((i for i in core_generations.REFERENCE_IDS if i not in set(cuda_ref.generations())),
                             "v12_mla_tc")


def _drop_unbuilt(monkeypatch):
    """Make _UNBUILT_REFERENCE_ID unbuilt in cuda_ref's table (a no-op while it is)."""
    rows = tuple(g for g in cuda_table.table() if g.id != _UNBUILT_REFERENCE_ID)
    monkeypatch.setattr(cuda_table, "table", lambda: rows)

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
PTXAS_REPORT = ROOT / "cuda_ref" / "resources" / "ptxas_sm90a.txt"  # package data: layer 2 prices from it
# Every kernel the six generations launch, with the static shared memory the specification implies
# (docs/reference.md §2.1-§2.6): v2-v4/v6 stage 32 KB of fp32 tiles, v5 carries its six buffers (44 KB / 46 KB).
EXPECTED_SMEM = {
    "v1_qk_kernel": 0,
    "v1_softmax_kernel": 0,
    "v1_pv_kernel": 0,
    "v2_qk_kernel<64>": 32768,
    "v2_qk_kernel<128>": 32768,
    "v2_pv_kernel<64>": 32768,
    "v2_pv_kernel<128>": 20480,
    "v3_stats_kernel<64>": 32768,
    "v3_stats_kernel<128>": 32768,
    "v3_output_kernel<64>": 32768,
    "v3_output_kernel<128>": 32768,
    "v4_fused_kernel<64>": 32768,
    "v4_fused_kernel<128>": 32768,
    "v5_wmma_kernel<64>": 45056,
    "v5_wmma_kernel<128>": 47104,
    "v6_partial_kernel<64>": 32768,
    "v6_partial_kernel<128>": 32768,
    "v6_merge_kernel": 0,
    # Paged (docs/reference.md §2.7-§2.13, §2.19): v7/Cut 1/ilp 32 KB fp32 tiles, db two fp16 tiles (32 KB), occ one
    # fp16 tile (16 KB), ss sQ + transposed padded sK + sV in fp16 (17.5 / 18.7 KB), tc v5's six buffers at M = 16.
    "v7_paged_partial_kernel<64>": 32768,
    "v7_paged_partial_kernel<128>": 32768,
    "paged_merge_kernel": 0,
    "v8_gqa_partial_kernel<64>": 32768,
    "v8_gqa_partial_kernel<128>": 32768,
    "v8_gqa_tc_partial_kernel<64>": 28672,
    "v8_gqa_tc_partial_kernel<128>": 31744,
    "v8_gqa_db_partial_kernel<64>": 32768,
    "v8_gqa_db_partial_kernel<128>": 32768,
    "v8_gqa_occ_partial_kernel<64>": 16384,
    "v8_gqa_occ_partial_kernel<128>": 16384,
    "v8_gqa_ilp_partial_kernel<64>": 32768,
    "v8_gqa_ilp_partial_kernel<128>": 32768,
    "v8_gqa_ss_partial_kernel<64>": 17536,
    "v8_gqa_ss_partial_kernel<128>": 18688,
    # Quantized KV (§2.14, §2.15): v8_gqa_ss's fp16 tile unchanged, the gather dequantizes (common/paged_quant.cuh).
    "v9_fp8_partial_kernel<64>": 17536,
    "v9_fp8_partial_kernel<128>": 18688,
    "v10_nvfp4_partial_kernel<64>": 17536,
    "v10_nvfp4_partial_kernel<128>": 18688,
}
# MLA (§2.16, §2.17): v11_mla's sQ [8][DQK] + transposed latent tile [DQK][33] in fp16 (static), per latent format
# (0 fp16, 1 bf16, 3 NVFP4); v12_mla_tc's plan is dynamic shared memory (0 static; its sizes are static_asserted in
# the source and reported by tests/test_cuda_mla.py).
EXPECTED_SMEM.update({f"v11_mla_partial_kernel<{dqk}, {dv}, {f}>": smem
                      for dqk, dv, smem in ((96, 64, 7872), (160, 128, 13120), (576, 512, 47232)) for f in (0, 1, 3)})
EXPECTED_SMEM.update({f"v12_mla_tc_partial_kernel<{dqk}, {dv}, {t}, {f}>": 0
                      for dqk, dv in ((96, 64), (160, 128), (576, 512))
                      for t, f in (("__half", 0), ("__half", 2), ("__nv_bfloat16", 1), ("__nv_bfloat16", 2))})


def declared_smem() -> dict[str, int]:
    """The static shared memory a frontier kernel's CUDA twin declares on its generation row (attn_core.generations
    ``twin_smem``), kernel -> bytes: checked against ptxas like EXPECTED_SMEM. A row may not redeclare a reference
    kernel's (those are pinned above, from the specification)."""
    out: dict[str, int] = {}
    for g in core_generations.GENERATIONS:
        for name, smem in g.twin_smem or ():
            assert name not in EXPECTED_SMEM and name not in out, f"{g.id}: twin_smem redeclares {name}"
            out[name] = smem
    return out


@dataclass
class Kernel:
    name: str
    source: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    smem: int
    barriers: int


_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:.*?, (\d+) bytes smem)?")


def _demangle(names: list[str]) -> dict[str, str]:
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt or not names:
        return {n: n for n in names}
    out = subprocess.run([cxxfilt], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    short = {}
    for mangled, full in zip(names, out.splitlines()):
        name = full.replace("(anonymous namespace)::", "").removeprefix("void ")  # templates show a return type
        name = name.split("(")[0].removeprefix("cuda_ref::")  # drop the parameter list and namespace
        short[mangled] = name
    return short


def parse_ptxas(log: str, source: str) -> list[Kernel]:
    kernels: list[Kernel] = []
    cur: dict | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            cur = {"mangled": m.group(1)}
        elif cur is not None and (m := _PROPS.search(line)):
            cur.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif cur is not None and (m := _USED.search(line)):
            cur.update(registers=int(m.group(1)), barriers=int(m.group(2) or 0), smem=int(m.group(3) or 0))
            kernels.append(Kernel(name=cur["mangled"], source=source, registers=cur["registers"],
                                  spill_stores=cur["spill_stores"], spill_loads=cur["spill_loads"],
                                  stack=cur["stack"], smem=cur["smem"], barriers=cur["barriers"]))
            cur = None
    names = _demangle([k.name for k in kernels])
    for k in kernels:
        k.name = names[k.name]
    return kernels


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def compiled(request, cuda_toolchain, tmp_path_factory):
    """Every job of this file: nvcc per kernel source (conftest's ``nvcc_sm90a``: it runs while this pool does
    unless test_cuda_mla.py's report asked for it first) and, in a thread pool, the binding's syntax check and the
    split-plan and table parity programs. Returns {job: CompletedProcess}."""
    _, cuda_inc = cuda_toolchain
    tmp = tmp_path_factory.mktemp("cuda_ref_build")
    csrc = build.CSRC
    inc = [f"-I{p}" for p in build.include_dirs(build.write_generated(tmp / "generated"))]  # generations.def first
    jobs: dict[str, list[str]] = {}
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        # The split heuristic compiled from the C++ header, printing plans for a grid of inputs.
        prog = tmp / "split_plan_main.cpp"
        prog.write_text(
            '#include <cstdio>\n#include "common/split_plan.cuh"\n'
            "int main(){for(long bh:{1,2,8,16,64,300})for(long nq:{1,7,8,9,64,2048})"
            "for(long nk:{1,255,256,257,2048,8190,8192,16384,100000})for(int sm:{1,40,132}){"
            "auto p=cuda_ref::choose_splits(bh,nq,nk,cuda_ref::kSplitRowsPerCta,sm);"
            'std::printf("%ld %ld %ld %d %d %d\\n",bh,nq,nk,sm,p.num_splits,p.chunk);}}\n'
        )
        jobs["split_plan"] = [cxx, "-std=c++17", *inc, "-I", str(cuda_inc), str(prog),
                              "-o", str(tmp / "split_plan")]
        # The generation table as C++ sees it (common/generations.cuh over generations.def), one row a line.
        table_prog = tmp / "table_main.cpp"
        table_prog.write_text(
            '#include <cstdio>\n#include "common/generations.cuh"\n'
            "int main(){for(const auto& g:cuda_ref::kGenerations)"
            'std::printf("%d %s %d %d %d %d %d %d %d %d %d %d %d %d\\n",g.number(),g.name,int(g.entry),'
            "int(g.operand),int(g.head_dims),g.gqa,g.materialize_s,g.tile_m_d64,g.tile_n_d64,g.tile_m_d128,"
            "g.tile_n_d128,int(g.workspace),g.split_kv,g.writes_lse);}\n"
        )
        jobs["table_main"] = [cxx, "-std=c++17", "-Wall", "-Werror", *inc, str(table_prog),
                              "-o", str(tmp / "table_main")]
        stub = tmp / "stub"
        # The CPU wheel of torch ships c10/cuda headers but not this generated one; it only sets export macros.
        (stub / "c10" / "cuda" / "impl").mkdir(parents=True)
        (stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
        from torch.utils import cpp_extension

        incs = [f"-I{p}" for p in cpp_extension.include_paths()]
        std = "-std=c++20" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 12) else "-std=c++17"
        jobs["binding.cpp"] = [cxx, "-fsyntax-only", std, "-w", *inc, *incs, f"-I{stub}",
                               f"-I{sysconfig.get_paths()['include']}", "-I", str(cuda_inc),
                               "-DTORCH_EXTENSION_NAME=cuda_ref_ext", "-DTORCH_API_INCLUDE_EXTENSION_H",
                               str(csrc / "binding.cpp")]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(_run, cmd) for name, cmd in jobs.items()}
        results = dict(request.getfixturevalue("nvcc_sm90a").results)  # nvcc runs while the host jobs do
        results.update({name: f.result() for name, f in futures.items()})
    if "split_plan" in results and results["split_plan"].returncode == 0:
        results["split_plan_run"] = _run([str(tmp / "split_plan")])
    if "table_main" in results and results["table_main"].returncode == 0:
        results["table_main_run"] = _run([str(tmp / "table_main")])
    return results


@pytest.fixture(scope="session")
def ptxas_kernels(compiled) -> list[Kernel]:
    kernels = []
    for name, res in compiled.items():
        if name.endswith(".cu") and res.returncode == 0:
            kernels += parse_ptxas(res.stdout + res.stderr, name)
    return sorted(kernels, key=lambda k: (k.source, k.name))


# --- compilation ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("src", [p.name for p in sorted((build.CSRC / "kernels").glob("*.cu"))])
def test_kernel_source_compiles_for_sm90a(compiled, src):
    res = compiled[src]
    assert res.returncode == 0, f"nvcc failed on {src}:\n{res.stderr[-4000:]}"
    warnings = [ln for ln in (res.stdout + res.stderr).splitlines() if "warning" in ln.lower()]
    assert not warnings, f"{src} compiles with warnings:\n" + "\n".join(warnings)


def test_one_kernel_file_per_generation():
    stems = sorted(p.stem for p in (build.CSRC / "kernels").glob("*.cu"))
    assert stems == sorted(cuda_ref.generations())


def test_binding_never_streams_numbers_into_messages():
    # On the GPU image (torch 2.11 + g++ 13.3) `std::ostream << int64_t` inside an extension segfaults, so a
    # TORCH_CHECK with numeric arguments (formatted by c10::str through an ostringstream) would kill the
    # process instead of raising. binding.cpp builds every message with msg() (std::to_string) instead.
    code = re.sub(r"//[^\n]*", "", (build.CSRC / "binding.cpp").read_text())
    assert "<<" not in code and "c10::str" not in code
    calls = list(re.finditer(r"TORCH_CHECK\w*\(", code))
    assert calls
    for m in calls:
        assert m.group(0) in ("TORCH_CHECK_VALUE(", "TORCH_CHECK_NOT_IMPLEMENTED("), m.group(0)
        depth, i, comma = 1, m.end(), None
        while depth:
            ch = code[i]
            depth += ch in "([{"
            depth -= ch in ")]}"
            if ch == "," and depth == 1 and comma is None:
                comma = i
            i += 1
        message = code[comma + 1:i - 1].strip()
        assert message.startswith("msg(") and message.endswith(")"), f"raw TORCH_CHECK message: {message[:80]}"


def test_kernel_sources_do_not_include_torch():
    # The kernels must compile with plain nvcc; only binding.cpp may know about torch.
    for p in [*(build.CSRC / "kernels").glob("*.cu"), *build.headers()]:
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', p.read_text())
        bad = [i for i in includes if i.startswith(("torch", "ATen", "c10", "pybind11"))]
        assert not bad, f"{p.name} includes {bad}"


@pytest.mark.slow
def test_ptxas_report_no_spills_and_expected_smem(ptxas_kernels, compiled, nvcc_sm90a):
    assert all(compiled[s].returncode == 0 for s in compiled if s.endswith(".cu")), "a source failed to compile"
    by_name = {k.name: k for k in ptxas_kernels}
    expected = {**EXPECTED_SMEM, **declared_smem()}
    assert set(by_name) == set(expected), (
        f"kernels seen, not expected: {sorted(set(by_name) - set(expected))} (a frontier kernel's twin declares each "
        f"kernel's static shared memory on its generation row, twin_smem); expected, not seen: "
        f"{sorted(set(expected) - set(by_name))}")
    _write_ptxas_report(ptxas_kernels, nvcc_sm90a)
    spilled = [k for k in ptxas_kernels if k.spill_stores or k.spill_loads or k.stack]
    assert not spilled, "register spills / stack use:\n" + "\n".join(map(str, spilled))
    for name, smem in expected.items():
        assert by_name[name].smem == smem, f"{name}: {by_name[name].smem} B static smem, expected {smem}"
        assert by_name[name].smem <= 48 * 1024  # static shared memory only, as in the reference


def _write_ptxas_report(kernels: list[Kernel], nvcc) -> None:
    lines = [
        "# cuda_ref ptxas resource report, sm_90a (written by tests/test_cuda_ref_cpu.py; do not edit)",
        f"# nvcc {nvcc.version()}",
        "# flags: nvcc -c " + " ".join(nvcc.flags),
        "#",
        f"{'source':<16} {'kernel':<32} {'regs':>4} {'spill_st':>8} {'spill_ld':>8} {'stack':>5} "
        f"{'smem_B':>7} {'bars':>4}",
    ]
    for k in kernels:
        lines.append(f"{k.source:<16} {k.name:<32} {k.registers:>4} {k.spill_stores:>8} {k.spill_loads:>8} "
                     f"{k.stack:>5} {k.smem:>7} {k.barriers:>4}")
    PTXAS_REPORT.parent.mkdir(parents=True, exist_ok=True)
    PTXAS_REPORT.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_binding_compiles_against_torch_headers(compiled):
    if "binding.cpp" not in compiled:
        pytest.skip("no host C++ compiler")
    res = compiled["binding.cpp"]
    assert res.returncode == 0, f"binding.cpp does not compile:\n{res.stderr[-4000:]}"


@pytest.mark.slow
def test_split_heuristic_same_in_cpp_and_python(compiled):
    if "split_plan_run" not in compiled:
        res = compiled.get("split_plan")
        if res is None:
            pytest.skip("no host C++ compiler")
        pytest.fail(f"split_plan.cuh does not compile as host C++:\n{res.stderr[-3000:]}")
    rows = compiled["split_plan_run"].stdout.split("\n")
    rows = [list(map(int, r.split())) for r in rows if r.strip()]
    assert len(rows) == 6 * 6 * 9 * 3
    for bh, nq, nk, sm, s, chunk in rows:
        assert api.choose_splits(bh, nq, nk, sm) == (s, chunk), (bh, nq, nk, sm)


# --- the split heuristic ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_k", "splits"), [(2048, 8), (8192, 10), (16384, 10)])
def test_choose_splits_reference_worked_examples(n_k, splits):
    # docs/reference.md §2.0: v6 B=1, H=8, N_q=1 with num_sm=40.
    s, chunk = cuda_ref.choose_splits(8, 1, n_k, cuda_ref.REFERENCE_NUM_SM)
    assert s == splits
    assert chunk == -(-n_k // splits) and (s - 1) * chunk < n_k <= s * chunk


def test_choose_splits_bounds():
    assert cuda_ref.choose_splits(8, 2048, 2048, 132) == (1, 2048)  # prefill degenerates to one split
    assert cuda_ref.choose_splits(1, 1, 1 << 20, 132)[0] == 32  # capped
    assert cuda_ref.choose_splits(1, 1, 300, 132) == (2, 150)  # by size: ceil(300 / 256)
    assert cuda_ref.choose_splits(8, 1, 8192, 132) == (32, 256)  # H200: 264 target CTAs


def test_choose_splits_rejects_bad_input():
    with pytest.raises(ValueError, match="n_k"):
        cuda_ref.choose_splits(1, 1, 0, 40)
    with pytest.raises(ValueError, match="num_sm"):
        cuda_ref.choose_splits(1, 1, 10, 0)
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_ref.choose_splits(1, 1, 10)  # the device count needs a device


# --- import and the no-GPU error ----------------------------------------------------------------------


def test_import_on_cpu_and_generations():
    assert cuda_ref.generations()[:13] == (
        "v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv", "v7_paged", "v8_gqa", "v8_gqa_tc",
        "v8_gqa_db", "v8_gqa_occ", "v8_gqa_ilp", "v8_gqa_ss")
    assert callable(cuda_ref.attention) and callable(cuda_ref.paged_attention)


# --- the generation table (generations.def, rendered from attn_core's CudaTwin rows) ----------------------


def test_table_rows_ids_order_and_numbers():
    rows = cuda_ref.table()
    assert all(isinstance(g, cuda_ref.CudaGeneration) for g in rows)
    got = [g.id for g in rows]
    assert len(got) == len(set(got)), f"duplicate ids: {got}"
    assert len({g.number for g in rows}) == len(rows), "duplicate numbers"
    # Every row is a generation attn_core knows, in attn_core's order (a subsequence of it).
    core = core_generations.ids()
    assert set(got) <= set(core), f"ids unknown to attn_core: {set(got) - set(core)}"
    assert got == [i for i in core if i in set(got)], "rows must follow attn_core.generations' order"
    # The integers the binding dispatches on are stable: the reference's 17 keep these forever (append-only).
    first = {"v1_naive": 1, "v2_tiled": 2, "v3_online": 3, "v4_fused": 4, "v5_wmma": 5, "v6_splitkv": 6,
             "v7_paged": 7, "v8_gqa": 8, "v8_gqa_tc": 9, "v8_gqa_db": 10, "v8_gqa_occ": 11, "v8_gqa_ilp": 12,
             "v8_gqa_ss": 13, "v9_fp8": 14, "v10_nvfp4": 15, "v11_mla": 16, "v12_mla_tc": 17}
    assert {g.id: g.number for g in rows if g.id in first} == first
    assert all(g.number > 17 for g in rows if g.id not in first)  # a frontier twin takes the next free number
    for g in rows:
        assert g.entry in core_generations.get(g.id).entries, f"{g.id}: entry {g.entry} not in attn_core's"
        assert core_generations.get(g.id).twin, f"{g.id}: its attn_core row declares no CUDA twin (twin=)"


def test_twin_flags_are_the_table():
    # attn_core's twin rows are the table (rendered from them), every reference generation has one (the 17 are built);
    # and only a row with a twin declares twin facts.
    assert set(core_generations.TWIN_IDS) == set(cuda_ref.generations())
    assert set(core_generations.REFERENCE_IDS) <= set(core_generations.TWIN_IDS)
    for g in core_generations.GENERATIONS:
        assert g.twin or (g.twin_dataflow is None and g.twin_smem is None), g.id
    gen, twin = core_generations.Generation, core_generations.CudaTwin
    with pytest.raises(ValueError, match="describe a CUDA twin"):
        gen("x", "frontier_prefill", None, "d", "s", {"dense"}, frontier=True, twin_dataflow="warp_rows")
    with pytest.raises(ValueError, match="twin_smem maps kernel names"):
        gen("x", "frontier_prefill", None, "d", "s", {"dense"}, frontier=True, twin=twin(18, "fp32", (8, 64), (8, 32)),
            twin_smem={"k<64>": -1})
    with pytest.raises(ValueError, match=r"twin= takes the CUDA twin's table row, CudaTwin\("):
        gen("x", "frontier_prefill", None, "d", "s", {"dense"}, frontier=True, twin=True)
    with pytest.raises(ValueError, match="a reference generation has a CUDA twin"):
        gen("x", "prefill", None, "d", "s", {"dense"})
    with pytest.raises(ValueError, match=r"its twin serves one: CudaTwin\(entry="):
        gen("x", "frontier_decode", None, "d", "s", {"dense", "paged"}, frontier=True,
            twin=twin(18, "fp16", (8, 64), (8, 32)))
    assert gen("x", "frontier_decode", None, "d", "s", {"dense", "paged"}, frontier=True,
               twin=twin(18, "fp16", (8, 64), (8, 32), entry="paged")).twin.entry == "paged"
    assert gen("x", "prefill", None, "d", "s", {"dense"}, twin=twin(1, "fp32", (1, 1), (1, 1))).twin.entry == "dense"
    for bad, match in (({"operand": "bf16"}, "operand"), ({"workspace": "s"}, "workspace"),
                       ({"head_dims": (64,)}, "head_dims"), ({"tile_d64": (8, 0)}, "tile_d64"),
                       ({"number": 0}, "number"), ({"gqa": 1}, "gqa"), ({"entry": "ragged"}, "entry")):
        with pytest.raises(ValueError, match=f"CudaTwin: bad {match}"):
            twin(**{"number": 18, "operand": "fp32", "tile_d64": (8, 64), "tile_d128": (8, 32), **bad})


def test_twin_numbers_are_stable_and_ascending():
    # attn_core refuses, at import, a reference twin off its position and a frontier twin out of order or reused.
    import dataclasses

    gens, check = core_generations.GENERATIONS, core_generations._check_twin_numbers
    check(gens)
    v4 = core_generations.get("v4_fused")
    renumbered = tuple(dataclasses.replace(g, twin=dataclasses.replace(g.twin, number=40)) if g is v4 else g
                       for g in gens)
    with pytest.raises(ValueError, match=r"position among the reference rows: v4_fused=40 \(expected 4\)"):
        check(renumbered)
    twin = core_generations.CudaTwin

    def frontier(i, n):
        return core_generations.Generation(i, "frontier_prefill", "v4_fused", "d", "s", {"dense"}, frontier=True,
                                           twin=twin(n, "fp32", (8, 64), (8, 32)))

    top = max(g.twin.number for g in gens if g.twin)  # 17 while no frontier kernel has a twin
    check(gens + (frontier("a", top + 1), frontier("b", top + 3)))
    for a, b in ((top, top + 1), (top + 2, top + 1), (top + 1, top + 1)):
        with pytest.raises(ValueError, match="unique and ascend in table order"):
            check(gens + (frontier("a", a), frontier("b", b)))


# Three rows as the hand-written table had them (csrc/generations.def until session 24), spacing and all, and the
# session-24 toy's hand-written row: the renderer lays every row out the same way.
_HAND_ROWS = {
    "v1_naive": "CUDA_REF_GEN(v1_naive,   1, kDense, kF32,   kHeadDimsAny,     0,  1,   1,  1,  1,   1,  kWsScores,"
                "        0,  1)",
    "v8_gqa_occ": "CUDA_REF_GEN(v8_gqa_occ,11, kPaged, kF16,   kHeadDims64_128,  1,  0,   8, 64,  8,  32,  "
                  "kWsSplitPartials, 1,  1)",
    "v9_fp8": "CUDA_REF_GEN(v9_fp8,    14, kQuantized, kF16, kHeadDims64_128, 1,  0,   8, 64,  8,  32,  "
              "kWsSplitPartials, 1,  1)",
    "v12_mla_tc": "CUDA_REF_GEN(v12_mla_tc,17, kMla,   kNative, kHeadDimsAny,    1,  0,  64, 32, 64,  32,  "
                  "kWsSplitPartials, 1,  1)",
    "toy_dense": "CUDA_REF_GEN(toy_dense, 18, kDense, kF32,   kHeadDims64_128,  0,  0,   8, 64,  8,  32,  kWsNone,"
                 "          0,  1)",
}


def test_rendered_table_is_the_twin_rows():
    # The text the C++ includes, parsed back, is attn_core's CudaTwin rows field for field, in order; rows laid out
    # as the hand-written table was.
    text = cuda_table.def_text()
    assert text == build.generated()[cuda_table.DEF_NAME] and text.endswith("\n#undef CUDA_REF_GEN\n")
    rows = cuda_table.parse(text)
    twins = [g for g in core_generations.GENERATIONS if g.twin]
    assert [r.id for r in rows] == [g.id for g in twins] and rows == cuda_ref.table()
    for r, g in zip(rows, twins):
        t = g.twin
        assert (r.number, r.entry, r.operand, r.head_dims, r.gqa, r.materializes_s, r.tile_d64, r.tile_d128,
                r.workspace, r.split_kv, r.writes_lse) == (
            t.number, t.entry, t.operand, t.head_dims, t.gqa, t.materializes_s, t.tile_d64, t.tile_d128, t.workspace,
            t.split_kv, t.writes_lse), g.id
    lines = {ln.split("(")[1].split(",")[0]: ln for ln in text.splitlines() if ln.startswith("CUDA_REF_GEN(")}
    for gid in ("v1_naive", "v8_gqa_occ", "v9_fp8", "v12_mla_tc"):
        assert lines[gid] == _HAND_ROWS[gid], gid
    toy = core_generations.Generation("toy_dense", "frontier_prefill", "v4_fused", "d", "s", {"dense"},
                                      frontier=True, twin=core_generations.CudaTwin(18, "fp32", (8, 64), (8, 32)))
    assert cuda_table.render((toy,)).splitlines()[-3] == _HAND_ROWS["toy_dense"]
    # the C++ enumerator spellings cover attn_core's value sets, both ways
    assert set(cuda_table._OPERANDS.values()) == set(core_generations.TWIN_OPERANDS)
    assert set(cuda_table._WORKSPACES.values()) == set(core_generations.TWIN_WORKSPACES)
    assert set(cuda_table._ENTRIES.values()) == set(core_generations.ENTRIES)


def test_no_hand_written_table_in_csrc():
    # The table is generated; a copy under csrc/ would shadow it for binding.cpp (its own directory is searched
    # first) and go stale.
    assert not [p for p in build.CSRC.rglob("*.def")], "generations.def is rendered from attn_core; do not commit one"
    for p in [build.CSRC / "binding.cpp", *build.headers()]:
        for inc in re.findall(r'#include\s+"([^"]*generations\.def)"', p.read_text()):
            assert inc == cuda_table.DEF_NAME, f"{p.name} includes {inc!r}: the generated file is found on the path"


def test_table_columns_of_the_six():
    # the reference's six dense twins (a frontier kernel's dense twin, if any, is checked by its own row's tests)
    t = {g.id: g for g in cuda_ref.table() if g.entry == "dense" and g.id in core_generations.REFERENCE_IDS}
    assert list(t) == ["v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv"]
    assert [i for i, g in t.items() if g.operand == "fp16"] == ["v5_wmma", "v6_splitkv"]
    assert [i for i, g in t.items() if g.head_dims is None] == ["v1_naive"]
    assert [i for i, g in t.items() if g.materializes_s] == ["v1_naive", "v2_tiled"]
    assert [i for i, g in t.items() if g.split_kv] == ["v6_splitkv"]
    assert all(g.entry == "dense" and not g.gqa and g.writes_lse for g in t.values())
    assert t["v2_tiled"].tile(64) == (64, 64) and t["v2_tiled"].tile(128) == (32, 32)
    assert t["v5_wmma"].tile(64) == (64, 32) and t["v4_fused"].tile(128) == (8, 32)
    assert [g.workspace for g in t.values()] == ["scores", "scores", "row_stats", "none", "none", "split_partials"]


@pytest.mark.slow
def test_table_same_in_cpp_and_python(compiled):
    if "table_main_run" not in compiled:
        res = compiled.get("table_main")
        if res is None:
            pytest.skip("no host C++ compiler")
        pytest.fail(f"common/generations.cuh does not compile as host C++:\n{res.stderr[-3000:]}")
    entries, operands = ["dense", "paged", "quantized", "mla"], ["fp32", "fp16", "native"]
    workspaces = ["none", "scores", "row_stats", "split_partials"]
    cpp = []
    for line in compiled["table_main_run"].stdout.splitlines():
        num, name, entry, operand, hd, gqa, mat, m64, n64, m128, n128, ws, split, lse = line.split()
        cpp.append(cuda_table.CudaGeneration(
            id=name, number=int(num), entry=entries[int(entry)], operand=operands[int(operand)],
            head_dims=None if hd == "0" else (64, 128), gqa=gqa == "1", materializes_s=mat == "1",
            tile_d64=(int(m64), int(n64)), tile_d128=(int(m128), int(n128)), workspace=workspaces[int(ws)],
            split_kv=split == "1", writes_lse=lse == "1"))
    assert tuple(cpp) == cuda_ref.table()


def test_operand_precision():
    v4, v5 = cuda_table.by_id("v4_fused"), cuda_table.by_id("v5_wmma")
    assert v4.operand_precision(torch.float32) == "fp32"
    assert v4.operand_precision("float32") == "fp32"
    for dt in (torch.float32, torch.float16, torch.bfloat16, "bf16", "float16"):
        assert v5.operand_precision(dt) == "fp16"
    with pytest.raises(NotImplementedError, match="float32 only"):
        v4.operand_precision(torch.bfloat16)
    with pytest.raises(ValueError, match="int32"):
        v5.operand_precision(torch.int32)


_DEF_HEADER = "// COLUMNS: " + " ".join(cuda_table.COLUMNS) + "\n"


def _def_row(gen="v1_naive", num="1", operand="kF32", gqa="0", extra=""):
    cols = f"{gen}, {num}, kDense, {operand}, kHeadDimsAny, {gqa}, 1, 1, 1, 1, 1, kWsScores, 0, 1{extra}"
    return f"CUDA_REF_GEN({cols})\n"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("// COLUMNS: id number\n" + _def_row(), "COLUMNS"),
        (_DEF_HEADER, "no CUDA_REF_GEN row"),
        (_DEF_HEADER + "CUDA_REF_GEN(v1_naive, 1, kDense, kF32)", "columns"),
        (_DEF_HEADER + _def_row(extra=", 1"), "columns"),
        (_DEF_HEADER + _def_row(operand="kF64"), "operand"),
        (_DEF_HEADER + _def_row(gqa="2"), "gqa"),
        (_DEF_HEADER + _def_row(num="0"), "number"),
        (_DEF_HEADER + _def_row(gen="V1"), "id"),
        (_DEF_HEADER + _def_row() + _def_row(num="2"), "duplicate id"),
        (_DEF_HEADER + _def_row() + _def_row(gen="v2_tiled"), "duplicate number"),
        (_DEF_HEADER + _def_row(gen="v2_tiled", num="2") + _def_row(), "ascend"),
    ],
)
def test_table_parser_rejects_malformed_rows(text, match):
    with pytest.raises(ValueError, match=match):
        cuda_table.parse(text)


def test_table_parser_ignores_comments():
    row = "CUDA_REF_GEN(v1_naive, 1, kDense, kF32, kHeadDimsAny, 0, 1, 1, 1, 1, 1, kWsScores, 0, 1)"
    text = _DEF_HEADER + "// CUDA_REF_GEN(v9, 9, x)\n/* CUDA_REF_GEN(v8, 8,\n y) */\n" + row + "  // trailing\n"
    assert [g.id for g in cuda_table.parse(text)] == ["v1_naive"]


def test_api_tables_are_derived_from_the_table():
    assert api.GENERATION_IDS == {g.id: g.number for g in cuda_ref.table()}
    assert cuda_ref.generations() == tuple(g.id for g in cuda_ref.table())
    # No second list of generations anywhere in cuda_ref's Python.
    for p in (ROOT / "cuda_ref").glob("*.py"):
        assert '"v3_online"' not in p.read_text(), f"{p.name} lists generations by hand"


@pytest.mark.parametrize("gen", api._table.ids("dense"))
def test_api_checks_follow_each_row(gen):
    row = cuda_table.by_id(gen)
    q, k, v = _qkv(d=96)
    if row.head_dims is None:
        assert _validate(q, k, v, generation=gen)[0] == row.number
    else:
        with pytest.raises(NotImplementedError, match="head dims"):
            _validate(q, k, v, generation=gen)
    q, k, v = _qkv(dtype=torch.bfloat16)
    if row.operand == "fp16":
        assert _validate(q, k, v, generation=gen)[0] == row.number
    else:
        with pytest.raises(NotImplementedError, match="float32 only"):
            _validate(q, k, v, generation=gen)
    q, k, v = _qkv()
    assert _validate(q, k, v, generation=gen, return_lse=True)[0] == row.number


def _with_rows(monkeypatch, *changed):
    """Monkeypatch cuda_ref's table: replace rows by id, or append new ones."""
    rows = {g.id: g for g in cuda_table.table()}
    for new in changed:
        rows[new.id] = new
    monkeypatch.setattr(cuda_table, "table", lambda: tuple(rows.values()))


def test_return_lse_not_implemented_for_a_row_without_it(monkeypatch):
    import dataclasses

    _with_rows(monkeypatch, dataclasses.replace(cuda_table.by_id("v4_fused"), writes_lse=False))
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="does not write the log-sum-exp"):
        _validate(q, k, v, generation="v4_fused", return_lse=True)
    assert _validate(q, k, v, generation="v4_fused")[0] == 4


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_return_lse_must_be_bool(bad):
    with pytest.raises(ValueError, match="return_lse"):
        _validate(*_qkv(), return_lse=bad)
    with pytest.raises(ValueError, match="return_lse"):
        cuda_ref.attention(*_qkv(), return_lse=bad)


# --- attn_core agreement: split constants ------------------------------------------------------------------


def test_split_plan_constants_equal_attn_core():
    text = (build.CSRC / "common" / "split_plan.cuh").read_text()
    consts = dict(re.findall(r"constexpr\s+int\s+(k\w+)\s*=\s*(\d+)\s*;", text))
    assert int(consts["kSplitCap"]) == core_splits.S_CAP
    assert int(consts["kMinSplitChunk"]) == core_splits.MIN_CHUNK
    assert int(consts["kSplitRowsPerCta"]) == core_splits.ROWS_PER_PROGRAM
    assert "kReferenceNumSm" not in text  # the dead constant is gone; 40 lives in attn_core.splits only
    assert cuda_ref.REFERENCE_NUM_SM == core_splits.REFERENCE_NUM_SM


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("gen", api._table.ids("dense"))
def test_calling_a_kernel_without_gpu_raises_runtime_error(gen):
    q = torch.randn(1, 2, 16, 64)
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_ref.attention(q, q, q, generation=gen)
    with pytest.raises(RuntimeError, match="CUDA"):
        build.load()


# --- argument checks (cuda_ref/api.py), all before any GPU is touched --------------------------------


def _qkv(b=1, h=2, nq=16, nk=16, d=64, dtype=torch.float32):
    return torch.randn(b, h, nq, d, dtype=dtype), torch.randn(b, h, nk, d, dtype=dtype), torch.randn(
        b, h, nk, d, dtype=dtype)


def _validate(q, k, v, **kw):
    kw = {"causal": False, "scale": None, "q_offset": 0, "generation": "v4_fused", **kw}
    return api.validate(q, k, v, **kw)


def test_validate_accepts_good_input_and_defaults_scale():
    q, k, v = _qkv(nq=5, nk=9, d=128)
    gen_id, scale, sms = _validate(q, k, v)
    assert gen_id == 4 and scale == pytest.approx(128**-0.5) and sms == 0
    assert _validate(q, k, v, scale=0.1, generation="v6_splitkv", num_sm=40) == (6, 0.1, 40)


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda q, k, v: (q[0], k, v), "q must be rank 4"),
        (lambda q, k, v: (q, k[..., None], v), "k must be rank 4"),
        (lambda q, k, v: (q, k, v[:, :, :3]), "k and v must have the same shape"),
        (lambda q, k, v: (q, k[:1].expand(2, -1, -1, -1), v[:1].expand(2, -1, -1, -1)), "batch size"),
        (lambda q, k, v: (q[..., :32], k, v), "head dim"),
        (lambda q, k, v: (q.to(torch.int32), k, v), "q must be float32, float16 or bfloat16"),
        (lambda q, k, v: (q, k.to(torch.float64), v), "k must be float32"),
        (lambda q, k, v: (q, k.half(), v.half()), "share a dtype"),
        (lambda q, k, v: (q[:, :, :0], k, v), ">= 1"),
        (lambda q, k, v: (torch.cat([q, q, q], 1), torch.cat([k, k], 1), torch.cat([v, v], 1)), "multiple of H_kv"),
        (lambda q, k, v: (q.numpy(), k, v), "torch.Tensor"),
    ],
)
def test_validate_rejects_bad_tensors(mutate, match):
    q, k, v = mutate(*_qkv())
    with pytest.raises(ValueError, match=match):
        _validate(q, k, v)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"q_offset": -1}, "q_offset"),
        ({"q_offset": True}, "q_offset"),
        ({"q_offset": 1.5}, "q_offset"),
        ({"causal": 1}, "causal"),
        ({"scale": float("nan")}, "scale"),
        ({"scale": "big"}, "scale"),
        ({"generation": "v99"}, "unknown generation"),
        ({"generation": 4}, "generation must be a string"),
        ({"num_sm": 40}, "num_sm only applies to v6_splitkv"),
        ({"generation": "v6_splitkv", "num_sm": 0}, "num_sm"),
    ],
)
def test_validate_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        _validate(*_qkv(), **kw)


def test_num_sm_env_knob(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setenv(api.NUM_SM_ENV, "40")
    assert _validate(q, k, v, generation="v6_splitkv")[2] == 40
    assert _validate(q, k, v, generation="v4_fused")[2] == 0  # only v6 reads it
    assert _validate(q, k, v, generation="v6_splitkv", num_sm=7)[2] == 7  # the argument wins
    monkeypatch.setenv(api.NUM_SM_ENV, "forty")
    with pytest.raises(ValueError, match=api.NUM_SM_ENV):
        _validate(q, k, v, generation="v6_splitkv")


@pytest.mark.parametrize(
    ("gen", "kw", "match"),
    [
        ("v4_fused", {"h_kv": 1}, "MHA"),
        ("v6_splitkv", {"h_kv": 1}, "MHA"),
        ("v1_naive", {"dtype": torch.float16}, "float32 only"),
        ("v4_fused", {"dtype": torch.bfloat16}, "float32 only"),
        ("v2_tiled", {"d": 96}, "head dims"),
        ("v5_wmma", {"d": 32}, "head dims"),
        (_UNBUILT_REFERENCE_ID, {}, "no CUDA twin"),
        ("fa_decode", {}, "no CUDA twin"),
    ],
)
def test_validate_unsupported_is_not_implemented(gen, kw, match, monkeypatch):
    _drop_unbuilt(monkeypatch)
    d, dtype, h_kv = kw.get("d", 64), kw.get("dtype", torch.float32), kw.get("h_kv", 2)
    q = torch.randn(1, 2, 8, d, dtype=dtype)
    k = torch.randn(1, h_kv, 8, d, dtype=dtype)
    with pytest.raises(NotImplementedError, match=match):
        _validate(q, k, k.clone(), generation=gen)


def test_validate_what_v1_and_v5_v6_accept():
    q, k, v = _qkv(d=96)
    assert _validate(q, k, v, generation="v1_naive")[0] == 1  # v1 takes any head dim, like the reference
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        q, k, v = _qkv(dtype=dtype)
        assert _validate(q, k, v, generation="v5_wmma")[0] == 5
        assert _validate(q, k, v, generation="v6_splitkv")[0] == 6


def test_validate_accepts_non_contiguous():
    q = torch.randn(1, 16, 2, 64).transpose(1, 2)  # BTNH storage seen as BHND
    assert not q.is_contiguous()
    assert _validate(q, q, q)[0] == 4


def test_bad_input_error_comes_before_the_missing_gpu_error():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q_offset"):
        cuda_ref.attention(q, k, v, q_offset=-3)


# --- the paged entry (cuda_ref.paged_attention), validated in pure Python ---------------------------------

_I32 = torch.int32


def _paged(b=2, hq=4, hkv=2, nq=1, d=64, num_blocks=8, page=16, pages=4, dtype=torch.float32, device="cpu"):
    """Valid paged arguments: pools [num_blocks, page, H_kv, D], int32 table [B, pages] and lens [B]."""
    q = torch.randn(b, hq, nq, d, dtype=dtype, device=device)
    k_pool = torch.randn(num_blocks, page, hkv, d, dtype=dtype, device=device)
    v_pool = torch.randn(num_blocks, page, hkv, d, dtype=dtype, device=device)
    block_table = (torch.arange(b * pages, dtype=_I32) % num_blocks).reshape(b, pages).to(device)
    kv_lens = torch.tensor([min(20 + 13 * i, pages * page) for i in range(b)], dtype=_I32, device=device)
    return {"q": q, "k_pool": k_pool, "v_pool": v_pool, "block_table": block_table, "kv_lens": kv_lens}


def _validate_paged(args, **kw):
    kw = {"generation": "v7_paged", "causal": False, "scale": None, "q_offset": None, "return_lse": False, **kw}
    return api.validate_paged(args["q"], args["k_pool"], args["v_pool"], args["block_table"], args["kv_lens"], **kw)


def test_paged_valid_call_resolves_the_row():
    # v7_paged is MHA (the _paged default has G = 2); the v8 family takes the GQA call.
    assert _validate_paged(_paged(hkv=4)) == api.PagedCall(7, pytest.approx(0.125), 0, None)
    with pytest.raises(NotImplementedError, match="v7_paged is MHA"):
        _validate_paged(_paged())
    assert _validate_paged(_paged(), generation="v8_gqa", return_lse=True) == api.PagedCall(8, pytest.approx(0.125),
                                                                                            0, None)


def test_paged_validation_runs_on_meta_tensors():
    # Shapes and dtypes only (values are unreadable): the same answer as on the GPU.
    assert _validate_paged(_paged(device="meta"), causal=True, generation="v8_gqa_ss").gen_id == 13
    with pytest.raises(ValueError, match="page_size"):
        _validate_paged(_paged(device="meta", page=12))


@pytest.mark.parametrize(
    ("gen", "exc", "match"),
    [
        ("v99", ValueError, "unknown generation 'v99'"),
        ("v4_fused", ValueError, "v4_fused is a dense generation: call cuda_ref.attention"),
        ("fa_decode", NotImplementedError, "Pallas-only"),
        (7, ValueError, "generation must be a string"),
    ],
)
def test_paged_generation_errors(gen, exc, match):
    with pytest.raises(exc, match=match):
        cuda_ref.paged_attention(**_paged(), generation=gen)


@pytest.mark.parametrize(
    ("mutate", "kw", "match"),
    [
        (lambda a: {**a, "q": a["q"].numpy()}, {}, "q must be a torch.Tensor"),
        (lambda a: {**a, "kv_lens": [20, 33]}, {}, "kv_lens must be a torch.Tensor"),
        (lambda a: {**a, "q": a["q"][0]}, {}, "q must be rank 4"),
        (lambda a: {**a, "k_pool": a["k_pool"][0]}, {}, "k_pool must be rank 4"),
        (lambda a: {**a, "v_pool": a["v_pool"][:4]}, {}, "k_pool and v_pool must have the same shape"),
        (lambda a: {**a, "q": a["q"].to(torch.int32)}, {}, "q must be float32, float16 or bfloat16"),
        (lambda a: {**a, "v_pool": a["v_pool"].double()}, {}, "v_pool must be float32"),
        (lambda a: {**a, "k_pool": a["k_pool"].half(), "v_pool": a["v_pool"].half()}, {}, "share a dtype"),
        (lambda a: {**a, "q": a["q"][:, :, :0]}, {}, "q must be >= 1"),
        (lambda a: {**a, "q": a["q"][..., :32]}, {}, "head dim D"),
        (lambda a: {**a, "k_pool": a["k_pool"][:, :12], "v_pool": a["v_pool"][:, :12]}, {}, "page_size"),
        (lambda a: {**a, "q": a["q"][:, :3]}, {}, "H_q must be a multiple of H_kv"),
        (lambda a: {**a, "block_table": a["block_table"].long()}, {}, "block_table must be int32"),
        (lambda a: {**a, "block_table": a["block_table"][0]}, {}, r"block_table must be int32 \[B, pages_per_seq\]"),
        (lambda a: {**a, "block_table": a["block_table"][:1]}, {}, "block_table must be int32 .*B=2"),
        (lambda a: {**a, "kv_lens": a["kv_lens"].long()}, {}, "kv_lens must be int32"),
        (lambda a: {**a, "kv_lens": a["kv_lens"][:1]}, {}, r"kv_lens must be int32 \[B\]"),
        (lambda a: {**a, "block_table": a["block_table"].to("meta")}, {}, "block_table must be on q's device"),
        (lambda a: a, {"q_offset": -1}, "q_offset"),
        (lambda a: a, {"q_offset": 1.5}, "q_offset"),
        (lambda a: a, {"q_offset": True}, "q_offset"),
        (lambda a: a, {"q_offset": torch.zeros(2, dtype=torch.int64)}, "q_offset as a tensor must be int32"),
        (lambda a: a, {"q_offset": torch.zeros(3, dtype=_I32)}, "q_offset as a tensor must be int32 .*B=2"),
        (lambda a: a, {"causal": 1}, "causal"),
        (lambda a: a, {"scale": float("inf")}, "scale"),
        (lambda a: a, {"return_lse": "yes"}, "return_lse"),
        # Values, readable on the CPU:
        (lambda a: {**a, "kv_lens": torch.tensor([20, 65], dtype=_I32)}, {}, r"kv_lens must lie in \[0, .* = 64\]"),
        (lambda a: {**a, "kv_lens": torch.tensor([-1, 5], dtype=_I32)}, {}, "kv_lens must lie in"),
        (lambda a: {**a, "block_table": torch.tensor([[0, 99, 0, 0], [1, 2, 3, 4]], dtype=_I32)}, {},
         "block_table entries .* num_blocks=8"),
        (lambda a: a, {"q_offset": torch.tensor([0, -2], dtype=_I32)}, "q_offset must be >= 0"),
        (lambda a: {**a, "q": torch.randn(2, 4, 30, 64)}, {"causal": True}, "kv_len >= N_q.*q_offset"),
    ],
)
def test_paged_bad_argument_is_value_error_naming_it(mutate, kw, match):
    # Argument errors come before the generation's NotImplementedError (the default v7_paged is not built).
    with pytest.raises(ValueError, match=match):
        _validate_paged(mutate(_paged()), **kw)


def test_paged_accepts_what_it_documents():
    # Unused pages may hold anything (-1 padding); an explicit offset lifts the kv_len >= N_q rule.
    args = _paged()
    args["block_table"] = torch.tensor([[0, 1, -1, -1], [2, 3, 4, -1]], dtype=_I32)
    for kw in ({}, {"q_offset": 0, "causal": True}, {"q_offset": torch.tensor([3, 0], dtype=_I32)},
               {"scale": 0.5, "return_lse": True}):
        assert _validate_paged(args, generation="v8_gqa", **kw).gen_id == 8
    long_q = {**_paged(), "q": torch.randn(2, 4, 30, 64)}
    assert _validate_paged(long_q, causal=True, q_offset=0, generation="v8_gqa").q_offset == 0


def _fake_paged_row(**kw):
    import dataclasses

    fields = {"id": "v7_paged", "number": 7, "entry": "paged", "gqa": True, **kw}
    return dataclasses.replace(cuda_table.by_id("v6_splitkv"), **fields)


def test_paged_with_a_paged_row_in_the_table(monkeypatch):
    # The table drives resolution, support checks and the split knob (v7_paged's row replaced by a fake).
    _with_rows(monkeypatch, _fake_paged_row())
    call = _validate_paged(_paged(), return_lse=True, causal=True)
    assert call == api.PagedCall(7, pytest.approx(64**-0.5), 0, None)
    assert _validate_paged(_paged(), q_offset=5, num_sm=40) == api.PagedCall(7, pytest.approx(0.125), 40, 5)
    with pytest.raises(NotImplementedError, match="head dims"):
        _validate_paged(_paged(d=96))
    with pytest.raises(ValueError, match="v4_fused is a dense generation.*serves v7_paged"):
        _validate_paged(_paged(), generation="v4_fused")
    _drop_unbuilt(monkeypatch)
    with pytest.raises(NotImplementedError, match=f"'{_UNBUILT_REFERENCE_ID}' has no CUDA twin: not built"):
        _validate_paged(_paged(), generation=_UNBUILT_REFERENCE_ID)
    _with_rows(monkeypatch, _fake_paged_row(gqa=False, split_kv=False, writes_lse=False))
    with pytest.raises(NotImplementedError, match="MHA"):
        _validate_paged(_paged())
    with pytest.raises(NotImplementedError, match="log-sum-exp"):
        _validate_paged(_paged(hkv=4), return_lse=True)
    with pytest.raises(ValueError, match="num_sm only applies to v6_splitkv"):
        _validate_paged(_paged(hkv=4), num_sm=40)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_paged_with_a_paged_row_needs_a_gpu(monkeypatch):
    _with_rows(monkeypatch, _fake_paged_row())
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_ref.paged_attention(**_paged())


# --- build configuration (no GPU needed) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "arch"),
    [("90a", "90a"), ("9.0a", "90a"), ("sm_90a", "90a"), ("compute_80", "80"), ("8.6", "86"), ("100a", "100a")],
)
def test_parse_arch(spec, arch):
    assert build.parse_arch(spec) == arch


def test_parse_arch_rejects_garbage():
    with pytest.raises(ValueError, match=build.ARCH_ENV):
        build.parse_arch("hopper")


def test_arch_for_capability():
    assert build.arch_for_capability(9, 0) == "90a"
    assert build.arch_for_capability(8, 0) == "80"
    assert build.arch_for_capability(10, 0) == "100"


def test_flags_key_and_build_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(build.ARCH_ENV, "sm_90a")
    flags = build.nvcc_flags()
    assert flags == ["-O3", "-lineinfo", "-gencode=arch=compute_90a,code=sm_90a"]
    key = build.build_key(flags)
    assert key == build.build_key(list(flags))  # stable
    assert key != build.build_key(build.nvcc_flags("80"))  # keyed by the flags
    monkeypatch.setenv(build.BUILD_DIR_ENV, str(tmp_path))
    assert build.build_dir(key) == tmp_path / key
    srcs = [p.name for p in build.sources()]
    assert srcs[-1] == "binding.cpp" and len(srcs) == len(cuda_ref.generations()) + 1


def test_module_import_needs_neither_torch_nor_jax():
    # A fresh interpreter: importing cuda_ref (and reading its table) must not build, import torch or JAX,
    # or fail on a CPU machine. JAX must never come in through a "known generation" lookup either.
    code = ("import cuda_ref, sys; cuda_ref.table(); cuda_ref.generations(); "
            "assert 'jax' not in sys.modules, 'jax imported'; print('torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_build_key_covers_the_generation_table(monkeypatch, tmp_path):
    # The generated table is part of the build key and is written first on the include path: a changed twin row
    # (attn_core) is a new build, never a stale cached one.
    import dataclasses

    monkeypatch.setenv(build.ARCH_ENV, "sm_90a")
    flags = build.nvcc_flags()
    key = build.build_key(flags)
    gen_dir = build.write_generated(tmp_path / "g")
    assert (gen_dir / cuda_table.DEF_NAME).read_text() == cuda_table.def_text()
    assert build.include_dirs(gen_dir) == [gen_dir, build.CSRC]
    v4 = core_generations.get("v4_fused")
    changed = tuple(dataclasses.replace(g, twin=dataclasses.replace(g.twin, tile_d128=(8, 64))) if g is v4 else g
                    for g in core_generations.GENERATIONS)
    monkeypatch.setattr(core_generations, "GENERATIONS", changed)
    assert "8, 64,  8,  64,  kWsNone" in build.generated()[cuda_table.DEF_NAME]
    assert build.build_key(flags) != key
    build.write_generated(gen_dir)
    assert (gen_dir / cuda_table.DEF_NAME).read_text() == cuda_table.render(changed)
