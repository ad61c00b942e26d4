"""cuda_ref on a machine without a GPU: every kernel compiles for sm_90a with no register spills, the binding
compiles against torch's headers, the split heuristic is the same in C++ and Python, and every argument
check raises the documented error before any GPU is needed.

nvcc runs once per session for all sources, in parallel (fixture ``compiled``). The ptxas resource report is
written to results/ptxas/ptxas_sm90a.txt (committed; docs/cuda_ref.md summarises it).
"""

from __future__ import annotations

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
from cuda_ref import api, build

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
PTXAS_REPORT = ROOT / "results" / "ptxas" / "ptxas_sm90a.txt"
ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a", "-O3", "-lineinfo", "-Xptxas", "-v"]
# torch's cpp_extension adds these to every nvcc call; compiling with them here catches code that only
# builds with the fp16 operator overloads enabled.
TORCH_NVCC_DEFINES = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]
# Every kernel the six generations launch, with the static shared memory the specification implies
# (ORIGINAL.md §2.1-§2.6): v2-v4/v6 stage 32 KB of fp32 tiles, v5 carries its six buffers (44 KB / 46 KB).
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
}


def _nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    if os.environ.get("CUDA_HOME"):
        cand = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        if cand.is_file():
            return str(cand)
    return None


def _cuda_include(nvcc: str) -> Path:
    real = Path(nvcc).resolve()
    for root in (real.parent.parent, Path("/usr/local/cuda")):
        if (root / "include" / "cuda_runtime.h").is_file():
            return root / "include"
    pytest.skip("cuda_runtime.h not found next to nvcc")


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
def toolchain():
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC or CUDA_HOME)")
    return nvcc, _cuda_include(nvcc)


@pytest.fixture(scope="session")
def compiled(toolchain, tmp_path_factory):
    """Every job of this file in one thread pool: nvcc per kernel source, the binding's syntax check, and the
    split-plan parity program. Returns {job: CompletedProcess}."""
    nvcc, cuda_inc = toolchain
    tmp = tmp_path_factory.mktemp("cuda_ref_build")
    csrc = build.CSRC
    jobs: dict[str, list[str]] = {}
    for src in sorted((csrc / "kernels").glob("*.cu")):
        jobs[src.name] = [nvcc, "-c", str(src), "-o", str(tmp / (src.stem + ".o")), "-I", str(csrc),
                          *ARCH_FLAGS, *TORCH_NVCC_DEFINES]
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx:
        # The split heuristic compiled from the C++ header, printing plans for a grid of inputs.
        prog = tmp / "split_plan_main.cpp"
        prog.write_text(
            '#include <cstdio>\n#include "common/split_plan.cuh"\n'
            "int main(){for(long bh:{1,2,8,16,64,300})for(long nq:{1,7,8,9,64,2048})"
            "for(long nk:{1,255,256,257,2048,8190,8192,16384,100000})for(int sm:{1,40,132}){"
            "auto p=cuda_ref::choose_splits(bh,nq,nk,8,sm);"
            'std::printf("%ld %ld %ld %d %d %d\\n",bh,nq,nk,sm,p.num_splits,p.chunk);}}\n'
        )
        jobs["split_plan"] = [cxx, "-std=c++17", "-I", str(csrc), "-I", str(cuda_inc), str(prog),
                              "-o", str(tmp / "split_plan")]
        stub = tmp / "stub"
        # The CPU wheel of torch ships c10/cuda headers but not this generated one; it only sets export macros.
        (stub / "c10" / "cuda" / "impl").mkdir(parents=True)
        (stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text("#pragma once\n")
        from torch.utils import cpp_extension

        incs = [f"-I{p}" for p in cpp_extension.include_paths()]
        std = "-std=c++20" if tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 12) else "-std=c++17"
        jobs["binding.cpp"] = [cxx, "-fsyntax-only", std, "-w", "-I", str(csrc), *incs, f"-I{stub}",
                               f"-I{sysconfig.get_paths()['include']}", "-I", str(cuda_inc),
                               "-DTORCH_EXTENSION_NAME=cuda_ref_ext", "-DTORCH_API_INCLUDE_EXTENSION_H",
                               str(csrc / "binding.cpp")]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(_run, cmd) for name, cmd in jobs.items()}
        results = {name: f.result() for name, f in futures.items()}
    if "split_plan" in results and results["split_plan"].returncode == 0:
        results["split_plan_run"] = _run([str(tmp / "split_plan")])
    return results


@pytest.fixture(scope="session")
def ptxas_kernels(compiled) -> list[Kernel]:
    kernels = []
    for name, res in compiled.items():
        if name.endswith(".cu") and res.returncode == 0:
            kernels += parse_ptxas(res.stdout + res.stderr, name)
    return sorted(kernels, key=lambda k: (k.source, k.name))


# --- compilation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("src", [p.name for p in sorted((build.CSRC / "kernels").glob("*.cu"))])
def test_kernel_source_compiles_for_sm90a(compiled, src):
    res = compiled[src]
    assert res.returncode == 0, f"nvcc failed on {src}:\n{res.stderr[-4000:]}"
    warnings = [ln for ln in (res.stdout + res.stderr).splitlines() if "warning" in ln.lower()]
    assert not warnings, f"{src} compiles with warnings:\n" + "\n".join(warnings)


def test_one_kernel_file_per_generation():
    stems = sorted(p.stem for p in (build.CSRC / "kernels").glob("*.cu"))
    assert stems == sorted(cuda_ref.generations())


def test_kernel_sources_do_not_include_torch():
    # The kernels must compile with plain nvcc; only binding.cpp may know about torch.
    for p in [*(build.CSRC / "kernels").glob("*.cu"), *build.headers()]:
        includes = re.findall(r'#include\s+[<"]([^>"]+)[>"]', p.read_text())
        bad = [i for i in includes if i.startswith(("torch", "ATen", "c10", "pybind11"))]
        assert not bad, f"{p.name} includes {bad}"


def test_ptxas_report_no_spills_and_expected_smem(ptxas_kernels, compiled):
    assert all(compiled[s].returncode == 0 for s in compiled if s.endswith(".cu")), "a source failed to compile"
    by_name = {k.name: k for k in ptxas_kernels}
    assert set(by_name) == set(EXPECTED_SMEM), f"kernels seen: {sorted(by_name)}"
    _write_ptxas_report(ptxas_kernels)
    spilled = [k for k in ptxas_kernels if k.spill_stores or k.spill_loads or k.stack]
    assert not spilled, "register spills / stack use:\n" + "\n".join(map(str, spilled))
    for name, smem in EXPECTED_SMEM.items():
        assert by_name[name].smem == smem, f"{name}: {by_name[name].smem} B static smem, expected {smem}"
        assert by_name[name].smem <= 48 * 1024  # static shared memory only, as in the reference


def _write_ptxas_report(kernels: list[Kernel]) -> None:
    version = subprocess.run([_nvcc(), "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    lines = [
        "# cuda_ref ptxas resource report, sm_90a (written by tests/test_cuda_ref_cpu.py; do not edit)",
        f"# nvcc {version}",
        "# flags: nvcc -c " + " ".join(ARCH_FLAGS + TORCH_NVCC_DEFINES),
        "#",
        f"{'source':<16} {'kernel':<24} {'regs':>4} {'spill_st':>8} {'spill_ld':>8} {'stack':>5} "
        f"{'smem_B':>7} {'bars':>4}",
    ]
    for k in kernels:
        lines.append(f"{k.source:<16} {k.name:<24} {k.registers:>4} {k.spill_stores:>8} {k.spill_loads:>8} "
                     f"{k.stack:>5} {k.smem:>7} {k.barriers:>4}")
    PTXAS_REPORT.parent.mkdir(parents=True, exist_ok=True)
    PTXAS_REPORT.write_text("\n".join(lines) + "\n")


def test_binding_compiles_against_torch_headers(compiled):
    if "binding.cpp" not in compiled:
        pytest.skip("no host C++ compiler")
    res = compiled["binding.cpp"]
    assert res.returncode == 0, f"binding.cpp does not compile:\n{res.stderr[-4000:]}"


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
    # ORIGINAL.md §2.0: v6 B=1, H=8, N_q=1 with num_sm=40.
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
    assert cuda_ref.generations() == ("v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv")
    assert callable(cuda_ref.attention)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
@pytest.mark.parametrize("gen", api.generations())
def test_calling_a_kernel_without_gpu_raises_runtime_error(gen):
    q = torch.randn(1, 2, 16, 64)
    with pytest.raises(RuntimeError, match="CUDA"):
        cuda_ref.attention(q, q, q, generation=gen)
    with pytest.raises(RuntimeError, match="CUDA"):
        build.load()


def test_registry_cuda_rows_match_what_is_built():
    from pallas_attn import registry

    claimed = {g.id for g in registry.generations() if g.cuda}
    assert claimed == set(cuda_ref.generations())


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
        ("v7_paged", {}, "no CUDA twin"),
        ("fa_decode", {}, "no CUDA twin"),
    ],
)
def test_validate_unsupported_is_not_implemented(gen, kw, match):
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


def test_module_import_does_not_need_torch_cuda():
    # A fresh interpreter: importing cuda_ref must not build, import torch's CUDA or fail on a CPU machine.
    code = "import cuda_ref, sys; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
