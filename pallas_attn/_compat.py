"""jax 0.10.2 (CPU CI, Python 3.11) vs 0.11.2 (GPU machine, Python 3.12): every difference, in one place.

What differs, and what we do about it (docs/peers.md §4):
  * The Triton lowering is deprecated in 0.11 and warns when a Triton ``pallas_call`` is lowered. Importing
    this package installs no filter (DESIGN.md decision 9): ``quiet_triton()`` hides exactly that warning
    around our own calls (the public entries run inside it, so an eager call, whose kernels lower inside
    it, is quiet), and ``silence_triton_deprecation()`` is for entry points (compare, scripts) that want
    it gone for the whole process. Under a caller's ``jax.jit`` the lowering happens after our call
    returns, so the caller sees JAX's warning: it is JAX's to give, and true.
  * A ``pallas_call`` without ``compiler_params`` lowers through Mosaic GPU; the Triton lowering needs
    ``jax.experimental.pallas.triton.CompilerParams`` (``triton_params``).
  * ``pl.load``/``pl.store`` are gone: kernels use ``load``/``store`` from here, which wrap
    ``jax.experimental.pallas.triton.load/store`` (masked) and fall back to ref indexing.
  * Interpret mode: ``interpret=None`` in the public API means "interpret when no GPU backend is present"
    (``default_interpret``).
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import jax
from jax.experimental import pallas as pl

try:  # both versions ship it; keep the import failure readable if a future one does not
    from jax.experimental.pallas import triton as pltriton
except ImportError as e:  # pragma: no cover
    raise ImportError(f"jax {jax.__version__} has no jax.experimental.pallas.triton: {e}") from e

__all__ = [
    "pl",
    "pltriton",
    "has_gpu",
    "default_interpret",
    "triton_params",
    "load",
    "store",
    "silence_triton_deprecation",
    "quiet_triton",
    "device_sm_count",
    "traced_index",
]

# 0.11.2 says: "The Pallas Triton backend is deprecated and will be removed in a future JAX version. ..."
_TRITON_DEPRECATION = r".*(Pallas Triton backend is deprecated|Triton lowering|triton lowering).*"


def silence_triton_deprecation() -> None:
    """For entry points only: filter the 0.11 Triton-lowering deprecation warning for the whole process
    (that one message, as the DeprecationWarning JAX raises, and nothing else)."""
    warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION, category=DeprecationWarning)


@contextlib.contextmanager
def quiet_triton():
    """Hide the Triton-lowering deprecation warning inside the block only (the filter list is restored)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION, category=DeprecationWarning)
        yield


@functools.cache
def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


def gpu_compute_capability() -> str:
    """The compute capability of the GPU jax computes on, e.g. "9.0" (Hopper); "" without a GPU."""
    if not has_gpu():
        return ""
    dev = next(d for d in jax.devices() if d.platform == "gpu")
    return str(getattr(dev, "compute_capability", "") or "")


def default_interpret(interpret: bool | None) -> bool:
    return (not has_gpu()) if interpret is None else bool(interpret)


def triton_params(num_warps: int = 4, num_stages: int = 2) -> pltriton.CompilerParams:
    """Compiler params that select the Triton lowering (without them, 0.11 picks Mosaic GPU)."""
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def load(ref, *, mask=None, other=None):
    """Masked load of a (sliced) ref: ``load(ref.at[rows, cols], mask=m, other=0.)``."""
    if mask is None:
        return ref[...]
    return pltriton.load(ref, mask=mask, other=other)


def store(ref, value, *, mask=None) -> None:
    if mask is None:
        ref[...] = value
        return
    pltriton.store(ref, value, mask=mask)


@functools.cache
def device_sm_count(default: int = 132) -> int:
    """Streaming multiprocessors of the first GPU (``default`` on a CPU-only machine: an H100/H200)."""
    if not has_gpu():
        return default
    dev = next(d for d in jax.devices() if d.platform == "gpu")
    n = getattr(dev, "core_count", None)
    return int(n) if n else default


def traced_index(i: int, anchor):
    """The Python int ``i`` as a traced int32 (``anchor``: any traced int32 scalar of the kernel), for a ref index
    that reaches a Mosaic GPU ``run_state``: jax 0.11.2's lowering receives a Python int there as a TypedInt and
    fails ("Shaped arrays must be represented by ir.Values"; seen on an H100 and an H200 for fa_prefill_bwd's
    ``wide_ovl`` / ``d256`` and v12_mla_tc's ``pipelined``), while jax 0.10.2 on a CPU lowers it."""
    zero = anchor - anchor
    return zero if i == 0 else zero + i


def mgpu_load(ref, **kw):
    """``plgpu.load(ref, **kw)`` of a ref already indexed (``ref.at[...]``): jax 0.10.2 requires the separate index
    argument (``()``); newer jax deprecates passing it ("index the reference via ref.at[idx]"), so it is passed only
    where the signature has no default for it. The same load either way."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    return plgpu.load(ref, **kw) if _load_idx_optional(plgpu.load) else plgpu.load(ref, (), **kw)


def _load_idx_optional(load) -> bool:
    import inspect

    try:
        idx = inspect.signature(load).parameters.get("idx")
    except (TypeError, ValueError):  # pragma: no cover
        return False
    return idx is None or idx.default is not inspect.Parameter.empty

