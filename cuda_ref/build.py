"""Build (once, cached) and load cuda_ref's single JIT torch extension.

One extension holds every kernel source (``csrc/kernels/*.cu``, plain CUDA, no torch) plus the one
torch-aware binding (``csrc/binding.cpp``), compiled by ``torch.utils.cpp_extension.load`` with ninja
(parallel; ``MAX_JOBS`` caps the jobs as usual).

Flags: ``-O3 -lineinfo`` and one ``-gencode`` for the current device: ``sm_90a`` on Hopper (H100/H200),
otherwise ``sm_XY`` from the device capability. ``CUDA_REF_ARCH`` overrides it (``90a``, ``9.0``,
``sm_80``, ``compute_86`` ...), which also lets the flags be computed without a GPU.

Generated header: the generation table ``generations.def`` is not a file of ``csrc/``; it is rendered from
``attn_core.generations`` (``cuda_ref.table.def_text``) and written by :func:`write_generated` into a directory
that comes first on the include path (:func:`include_dirs`): the build's ``<build dir>/generated``, or a test's
temporary directory. ``python -m cuda_ref.build`` prints it; ``python -m cuda_ref.build DIR`` writes it into DIR.

Cache: the build directory is ``~/.cache/pallas_attn/cuda_ref/<key>`` (root overridable with
``CUDA_REF_BUILD_DIR``), where ``<key>`` hashes the sources, the generated header, the flags, torch, its CUDA and
Python; a second process finds the finished build there and does not recompile. The first build says what it is
doing and how long it took (stderr).

Importing this module needs neither torch's CUDA nor a GPU; :func:`load` and :func:`require_cuda` raise a
RuntimeError naming what is missing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys
import time
from pathlib import Path

__all__ = ["CSRC", "sources", "headers", "generated", "write_generated", "include_dirs", "arch", "gencode_flags",
           "nvcc_flags", "build_key", "build_dir", "require_cuda", "load"]

CSRC = Path(__file__).resolve().parent / "csrc"
ARCH_ENV = "CUDA_REF_ARCH"
BUILD_DIR_ENV = "CUDA_REF_BUILD_DIR"
VERBOSE_ENV = "CUDA_REF_VERBOSE"
_BASE_NVCC_FLAGS = ("-O3", "-lineinfo")


def sources() -> list[Path]:
    """The kernel translation units (sorted) followed by the binding."""
    return sorted((CSRC / "kernels").glob("*.cu")) + [CSRC / "binding.cpp"]


def headers() -> list[Path]:
    """The headers of ``csrc/`` the sources include: ``common/*.cuh`` (the generated one: :func:`generated`)."""
    return sorted((CSRC / "common").glob("*.cuh"))


def generated() -> dict[str, str]:
    """The headers rendered from Python, file name -> text: ``generations.def`` (``cuda_ref.table.def_text``)."""
    from .table import DEF_NAME, def_text

    return {DEF_NAME: def_text()}


def write_generated(dest: Path | str) -> Path:
    """Write :func:`generated` into ``dest`` (created; a file already holding the text is left alone, another is
    replaced atomically, so concurrent builds of one key agree). Returns ``dest``: put it first on the include
    path (:func:`include_dirs`)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name, text in generated().items():
        p = dest / name
        if p.is_file() and p.read_text() == text:
            continue
        tmp = dest / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, p)
    return dest


def include_dirs(gen_dir: Path | str) -> list[Path]:
    """The include path of every compile of cuda_ref's C++: the generated headers' directory (written by
    :func:`write_generated`), then ``csrc/``."""
    return [Path(gen_dir), CSRC]


def parse_arch(spec: str) -> str:
    """``"90a"``, ``"9.0a"``, ``"sm_90a"``, ``"compute_90a"``, ``"8.6"`` -> ``"90a"`` / ``"86"``."""
    s = spec.strip().lower().removeprefix("sm_").removeprefix("compute_")
    m = re.fullmatch(r"(\d+)\.(\d)([af]?)|(\d{2,3})([af]?)", s)
    if not m:
        raise ValueError(f"{ARCH_ENV} must look like 90a, 9.0, sm_80 or compute_86; got {spec!r}")
    if m.group(1) is not None:
        return f"{m.group(1)}{m.group(2)}{m.group(3)}"
    return f"{m.group(4)}{m.group(5)}"


def arch_for_capability(major: int, minor: int) -> str:
    # Hopper gets the arch-specific target (wgmma/TMA-capable sm_90a), as the project's GPUs are H100/H200.
    if (major, minor) == (9, 0):
        return "90a"
    return f"{major}{minor}"


def arch() -> str:
    env = os.environ.get(ARCH_ENV, "").strip()
    if env:
        return parse_arch(env)
    require_cuda()
    import torch

    return arch_for_capability(*torch.cuda.get_device_capability())


def gencode_flags(arch_: str | None = None) -> list[str]:
    a = arch_ or arch()
    return [f"-gencode=arch=compute_{a},code=sm_{a}"]


def nvcc_flags(arch_: str | None = None) -> list[str]:
    # Passing an explicit -gencode also stops torch from adding its own arch list (TORCH_CUDA_ARCH_LIST).
    return [*_BASE_NVCC_FLAGS, *gencode_flags(arch_)]


def build_key(flags: list[str]) -> str:
    h = hashlib.sha256()
    for p in [*sources(), *headers()]:
        h.update(str(p.relative_to(CSRC)).encode())
        h.update(b"\0")
        h.update(p.read_bytes())
        h.update(b"\0")
    for name, text in sorted(generated().items()):  # the table rendered from attn_core: a new row is a new build
        h.update(f"generated/{name}".encode())
        h.update(b"\0")
        h.update(text.encode())
        h.update(b"\0")
    try:
        import torch

        h.update(f"torch={torch.__version__} cuda={torch.version.cuda}".encode())
    except ImportError:
        pass
    h.update(f"py={sys.version_info[:2]} flags={flags}".encode())
    return h.hexdigest()[:16]


def build_dir(key: str) -> Path:
    root = os.environ.get(BUILD_DIR_ENV) or Path.home() / ".cache" / "pallas_attn" / "cuda_ref"
    return Path(root) / key


def require_cuda() -> None:
    """Raise a RuntimeError naming what is missing for running cuda_ref kernels."""
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("cuda_ref needs torch (with CUDA) to run kernels; torch is not installed") from e
    if torch.version.cuda is None:
        raise RuntimeError(
            f"cuda_ref needs a CUDA build of torch and a CUDA GPU; this torch ({torch.__version__}) is CPU-only"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"cuda_ref needs a CUDA GPU; torch {torch.__version__} (CUDA {torch.version.cuda}) sees none "
            "(torch.cuda.is_available() is False)"
        )
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise RuntimeError("cuda_ref needs the CUDA toolkit (nvcc) to build its extension; set CUDA_HOME")


@functools.cache
def load():
    """The built extension module (building it first if no cached build matches)."""
    require_cuda()
    from torch.utils import cpp_extension

    flags = nvcc_flags()
    key = build_key(flags)
    where = build_dir(key)
    where.mkdir(parents=True, exist_ok=True)
    name = f"cuda_ref_ext_{key[:12]}"
    cached = any(where.glob(f"{name}*.so"))
    srcs = sources()
    gen_dir = write_generated(where / "generated")
    if not cached:
        print(f"cuda_ref: building {len(srcs)} sources for {flags[-1]} in {where} (first call; cached after)",
              file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    mod = cpp_extension.load(
        name=name,
        sources=[str(p) for p in srcs],
        extra_cflags=["-O3"],
        extra_cuda_cflags=flags,
        extra_include_paths=[str(p) for p in include_dirs(gen_dir)],
        build_directory=str(where),
        verbose=os.environ.get(VERBOSE_ENV, "") not in ("", "0"),
    )
    dt = time.perf_counter() - t0
    verb = "loaded cached build" if cached else "built"
    print(f"cuda_ref: {verb} in {dt:.1f} s ({where})", file=sys.stderr, flush=True)
    return mod


if __name__ == "__main__":  # python -m cuda_ref.build [DIR]: print generations.def, or write the generated headers
    if len(sys.argv) > 1:
        print(write_generated(sys.argv[1]))
    else:
        print(generated()["generations.def"], end="")
