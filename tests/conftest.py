"""Shared fixtures. GPU tests carry ``@pytest.mark.gpu`` and are skipped where no CUDA GPU is visible.

Speed (DESIGN.md "Testing": ``make test`` <= 8 minutes on 2 cores, ``make test-fast`` <= 2): tests that take more
than a few seconds on the CPU carry ``@pytest.mark.slow`` (``make test-fast`` leaves them out, ``make test`` runs
them); ``make test`` runs on two pytest-xdist workers, scheduled so that a file's module- or session-scoped fixtures
are set up once (``pytest_xdist_make_scheduler``: nvcc and the compare runs happen once); and the Mosaic GPU
interpreter compiles each thread program once instead of once per grid point (``_memoize_gpu_interpreter_compiles``).
"""

import dataclasses
import functools
import inspect
import os
import re
import shutil
import subprocess
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch and jax share the GPU in tests

# On a machine without a GPU (CI), XLA's CPU backend compiles the interpret-mode programs with its optimisations and
# its fusion emitters off: the tests run tiny shapes, so compile time is what they spend (measured on the interpreter
# files: the optimisations off 16-20% less wall time, the fusion emitters off a further 30-40%; the same answers
# within every tolerance). A GPU machine keeps XLA's defaults. PALLAS_ATTN_TEST_XLA_OPT=1 keeps them here too.
CPU_TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false")
if not shutil.which("nvidia-smi") and os.environ.get("PALLAS_ATTN_TEST_XLA_OPT") != "1":
    if CPU_TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {CPU_TEST_XLA_FLAGS}".strip()


@pytest.fixture
def rng(request):
    """A fresh seeded generator per test (seeded by the test's name, so failures reproduce)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def fake_gpu_clocks(monkeypatch):
    """compare's GPU timing without a GPU: ``install(kernels)`` puts ``kernels(fn, args, **kw) -> Timing`` in place of
    ``compare.timing.time_kernels``; the e2e and pipelined clocks read 4 / 5 / 6 us and syncing is a no-op."""
    from compare import runner, timing

    def wall(fn, args, **kw):
        return timing.Timing((4.0, 5.0, 6.0), "host-wall", False)

    def install(kernels):
        monkeypatch.setattr(timing, "time_kernels", kernels)
        monkeypatch.setattr(timing, "time_e2e", wall)
        monkeypatch.setattr(timing, "time_pipelined", wall)
        monkeypatch.setattr(runner, "_sync_for", lambda framework: lambda _: None)

    return install


def _gpu_present() -> bool:
    try:
        import jax

        return any(d.platform == "gpu" for d in jax.devices())
    except Exception:
        return False


# --- the Mosaic GPU interpreter: one compile per thread program, not one per grid point ---------------------------
#
# jax's GPU interpreter (jax._src.pallas.mosaic_gpu.interpret, used by the emulate_* functions of fa_prefill_bwd and
# v12_mla_tc and by fa_prefill's interpret path) runs every grid point as a host callback that starts one Python
# thread per simulated thread and, in each, traces, lowers and XLA-compiles the *same* kernel jaxpr again
# (thread_map._run_jaxpr: ``jax.jit(...).trace(...).lower().compile()``; the AOT path keeps no in-memory cache). That
# compile was ~85% of an interpreter case's time. Here the compiled program is kept per (jaxpr object, argument
# types) for the length of one test and called by every thread and grid point: the same XLA program on the same
# arguments, so the same shared-memory simulation, the same callbacks (race detection, barrier checks) and the same
# numbers; only the redundant compiles go. A jax whose _run_jaxpr no longer reads as expected is left unpatched
# (slower, never different).

_INTERP_CACHE: dict = {}
_INTERP_LOCK = threading.Lock()


def _memoize_gpu_interpreter_compiles() -> None:
    try:
        import jax
        import jax.core as jax_core
        from jax._src.pallas.mosaic.interpret import thread_map
    except Exception:
        return
    original = getattr(thread_map, "_run_jaxpr", None)
    if original is None or getattr(original, "_memoized", False):
        return
    try:
        src = inspect.getsource(original)
    except (OSError, TypeError):
        return
    if "jax_core.eval_jaxpr(jaxpr, consts, *args)" not in src or ".lower().compile()(consts, *args)" not in src:
        return

    def _run(jaxpr, consts, *args):  # what thread_map._run_jaxpr jits
        jax_core.eval_jaxpr(jaxpr, consts, *args)

    def _run_jaxpr(jaxpr, consts, *args):
        leaves = jax.tree.leaves((consts, args))
        key = (jaxpr, tuple((tuple(np.shape(x)), str(getattr(x, "dtype", type(x))), getattr(x, "weak_type", None))
                            for x in leaves))
        with _INTERP_LOCK:
            entry = _INTERP_CACHE.setdefault(key, [threading.Lock(), None])
        with entry[0]:  # the first thread compiles; the others wait for that program instead of compiling their own
            if entry[1] is None:
                entry[1] = jax.jit(_run, static_argnums=(0,)).trace(jaxpr, consts, *args).lower().compile()
        entry[1](consts, *args)

    _run_jaxpr._memoized = True
    thread_map._run_jaxpr = _run_jaxpr


_memoize_gpu_interpreter_compiles()


# Every Triton module a test lowers (``lowering_platforms=("cuda",)`` on this CPU, or a real compile on a GPU) is run
# through MLIR's verifier as it is built, as Triton's own parser does on the device (session 39: a merge whose loop
# bound ``jnp.where(live, 1, 0)`` lowered to an i1 passed every CPU test, interpret mode and the CUDA lowering alike,
# and failed to compile on the GPU: "'scf.for' op failed to verify"). tests/test_triton_verify.py proves the hook is
# in place and catches that case. A jax without this lowering entry point is left unpatched (the test then fails).


def _verify_triton_modules() -> None:
    try:
        from jax._src.pallas.triton import lowering as triton_lowering
    except Exception:
        return
    original = getattr(triton_lowering, "lower_jaxpr_to_triton_module", None)
    if original is None or getattr(original, "_verifies", False):
        return

    @functools.wraps(original)
    def lower_and_verify(*args, **kwargs):
        result = original(*args, **kwargs)
        result.module.operation.verify()  # raises MLIRError with the op that fails
        return result

    lower_and_verify._verifies = True
    triton_lowering.lower_jaxpr_to_triton_module = lower_and_verify


_verify_triton_modules()


@pytest.fixture(autouse=True)
def _fresh_interpreter_programs():
    """Compiled interpreter programs live for one test (each test compiles its own, as on a fresh machine)."""
    yield
    with _INTERP_LOCK:
        _INTERP_CACHE.clear()


# --- nvcc: every cuda_ref kernel source compiled once per session for sm_90a ---------------------------------------

# -Xptxas -v for the resource reports (results/ptxas/). torch's cpp_extension adds the defines to every nvcc call;
# compiling with them here catches code that only builds with the fp16 operator overloads enabled.
NVCC_SM90A_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "-O3", "-lineinfo", "-Xptxas", "-v",
                    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr")


@dataclasses.dataclass(frozen=True)
class NvccBuild:
    nvcc: str
    cuda_include: Path
    flags: tuple[str, ...]
    results: dict  # kernel source file name (csrc/kernels/*.cu) -> subprocess.CompletedProcess of its nvcc -c

    def version(self) -> str:
        out = subprocess.run([self.nvcc, "--version"], capture_output=True, text=True).stdout
        return out.strip().splitlines()[-1]


def _find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    if os.environ.get("CUDA_HOME"):
        cand = Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"
        if cand.is_file():
            return str(cand)
    return None


@pytest.fixture(scope="session")
def cuda_toolchain():
    """(nvcc, the CUDA include directory); skips where either is missing."""
    nvcc = _find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC or CUDA_HOME)")
    for root in (Path(nvcc).resolve().parent.parent, Path("/usr/local/cuda")):
        if (root / "include" / "cuda_runtime.h").is_file():
            return nvcc, root / "include"
    pytest.skip("cuda_runtime.h not found next to nvcc")


@pytest.fixture(scope="session")
def nvcc_sm90a(cuda_toolchain, tmp_path_factory) -> NvccBuild:
    """Every kernel source (csrc/kernels/*.cu) through ``nvcc -c`` for sm_90a, in parallel, once per session: the
    compile checks and ptxas reports of test_cuda_ref_cpu.py (all sources) and test_cuda_mla.py (the MLA ones) read
    the same run."""
    from cuda_ref import build

    nvcc, cuda_inc = cuda_toolchain
    tmp = tmp_path_factory.mktemp("nvcc_sm90a")
    inc = [f"-I{p}" for p in build.include_dirs(build.write_generated(tmp / "generated"))]  # generations.def first
    jobs = {src.name: [nvcc, "-c", str(src), "-o", str(tmp / (src.stem + ".o")), *inc, *NVCC_SM90A_FLAGS]
            for src in sorted((build.CSRC / "kernels").glob("*.cu"))}
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        futures = {name: pool.submit(subprocess.run, cmd, capture_output=True, text=True, timeout=600)
                   for name, cmd in jobs.items()}
        results = {name: f.result() for name, f in futures.items()}
    return NvccBuild(nvcc=nvcc, cuda_include=cuda_inc, flags=NVCC_SM90A_FLAGS, results=results)


# --- pytest-xdist: which tests share a worker ------------------------------------------------------------------
#
# xdist's own loadgroup cannot be used here: with pytest 9.2 it can no longer tag a test's id with its group. So
# ``make test`` (``-n 2``, --dist load) gets this scheduler instead: xdist's LoadScopeScheduling, where the files
# that use this conftest's nvcc fixtures are one unit of work, a test file that defines a module- or session-scoped
# fixture is one unit (its compare run is set up once, on one worker), and every other test is a unit of its own
# (the best balance). Units with more tests go first.

_SHARED_SCOPE = re.compile(r"""scope\s*=\s*["'](?:module|package|session)["']""")
_SESSION_FIXTURES = re.compile(r"\b(?:cuda_toolchain|nvcc_sm90a)\b")


@functools.cache
def _unit_of_file(path: str) -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    if _SESSION_FIXTURES.search(text):
        return "nvcc"
    return path if _SHARED_SCOPE.search(text) else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit_of_file(str(root / nodeid.split("::", 1)[0])) or nodeid

    return SharedFixtureScheduling(config, log)


# --- collection: GPU skips ----------------------------------------------------------------------------------------


def pytest_collection_modifyitems(config, items):
    if _gpu_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def run_on_virtual_devices():
    """``run(path, n)``: run ``path``'s ``-k inner`` tests again in a subprocess with ``n`` virtual CPU devices
    (``--xla_force_host_platform_device_count`` must be set before JAX starts); fail with their output unless they
    all passed and none skipped (a skip there would mean the devices did not appear). The outer tests of
    tests/test_distributed.py and tests/test_ring.py."""
    import os
    import subprocess
    import sys

    def run(path: str, n: int) -> None:
        import jax

        if jax.device_count() >= n:
            pytest.skip("already inside the virtual-device process")
        env = {**os.environ, "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"--xla_force_host_platform_device_count={n} {os.environ.get('XLA_FLAGS', '')}".strip()}
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, "-k", "inner"],
                           env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
        assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]

    return run


@pytest.fixture(scope="module")
def all_impls():
    """compare's every implementation (pallas, cuda, peers), built once per test module."""
    from compare import impls
    return impls.all_impls()
