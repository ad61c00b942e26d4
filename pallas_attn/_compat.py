"""jax 0.10.2 (CPU CI, Python 3.11) vs 0.11.2 (GPU machine, Python 3.12): every difference, in one place.

What differs, and what we do about it (ANCHORS.md §4):
  * The Triton lowering is deprecated in 0.11 and warns on every ``pallas_call``; we filter exactly that
    warning (``silence_triton_deprecation``) and nothing else.
  * A ``pallas_call`` without ``compiler_params`` lowers through Mosaic GPU; the Triton lowering needs
    ``jax.experimental.pallas.triton.CompilerParams`` (``triton_params``).
  * ``pl.load``/``pl.store`` are gone: kernels use ``load``/``store`` from here, which wrap
    ``jax.experimental.pallas.triton.load/store`` (masked) and fall back to ref indexing.
  * Interpret mode: ``interpret=None`` in the public API means "interpret when no GPU backend is present"
    (``default_interpret``).
"""

from __future__ import annotations

import functools
import warnings

import jax
from jax.experimental import pallas as pl

try:  # both versions ship it; keep the import failure readable if a future one does not
    from jax.experimental.pallas import triton as pltriton
except ImportError as e:  # pragma: no cover
    raise ImportError(f"jax {jax.__version__} has no jax.experimental.pallas.triton: {e}") from e

__all__ = [
    "JAX_VERSION",
    "pl",
    "pltriton",
    "has_gpu",
    "default_interpret",
    "triton_params",
    "load",
    "store",
    "silence_triton_deprecation",
    "device_sm_count",
]

JAX_VERSION = tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())

# 0.11.2 says: "The Pallas Triton backend is deprecated and will be removed in a future JAX version. ..."
_TRITON_DEPRECATION = r".*(Pallas Triton backend is deprecated|Triton lowering|triton lowering).*"


def silence_triton_deprecation() -> None:
    """Filter the 0.11 deprecation warning of the Triton lowering (and only that one)."""
    for cat in (DeprecationWarning, FutureWarning, UserWarning):
        warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION, category=cat)


silence_triton_deprecation()


@functools.cache
def has_gpu() -> bool:
    try:
        return any(d.platform == "gpu" for d in jax.devices())
    except RuntimeError:
        return False


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
