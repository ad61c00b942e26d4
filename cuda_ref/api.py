"""cuda_ref's public functions: validate in pure Python, then call the one JIT-built extension.

Everything here up to the extension call runs without a GPU, so the argument checks are tested on the
CPU (tests/test_cuda_ref_cpu.py). Conventions (ORIGINAL.md §1.1, DESIGN.md decisions 4-5):

  * tensors are torch's BHND: q ``[B, H, Nq, D]``, k/v ``[B, H, Nk, D]``; the output is BHND **float32**
    whatever the input dtype, like the reference (the compare layer casts);
  * causal is top-left: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``. The reference's
    v1-v6 have no ``q_offset`` (it is always 0 there); we accept it in all six, a deliberate extension;
  * v1-v4 take float32 only (the reference TORCH_CHECKs it); v5/v6 take float32/float16/bfloat16 and cast
    to float16 on the host, inside the call, as the reference does (so bf16 inputs are rounded to fp16);
  * v1_naive takes any head dim (as the reference); v2-v6 take D in {64, 128};
  * non-contiguous inputs are made contiguous before the kernel (a copy, outside the kernel).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

__all__ = [
    "GENERATION_IDS",
    "attention",
    "generations",
    "choose_splits",
    "validate",
    "REFERENCE_NUM_SM",
]

# Generation id -> the integer the binding dispatches on (csrc/common/params.cuh, enum Gen).
GENERATION_IDS: dict[str, int] = {
    "v1_naive": 1,
    "v2_tiled": 2,
    "v3_online": 3,
    "v4_fused": 4,
    "v5_wmma": 5,
    "v6_splitkv": 6,
}
_FP32_ONLY = frozenset({"v1_naive", "v2_tiled", "v3_online", "v4_fused"})
_ANY_HEAD_DIM = frozenset({"v1_naive"})
_HEAD_DIMS = (64, 128)
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_MAX_GRID_Y = 65535  # B*H rides in a grid dimension capped at 65535

# choose_splits constants (csrc/common/split_plan.cuh; ORIGINAL.md §2.0). Change both sides together.
S_CAP = 32
MIN_CHUNK = 256
V6_ROWS_PER_CTA = 8
REFERENCE_NUM_SM = 40  # the reference's hard-coded T4 SM count, behind every recorded v6 number (§7.3)

NUM_SM_ENV = "CUDA_REF_NUM_SM"  # e.g. 40 to reproduce the reference's split plans for every v6 call
DEBUG_ENV = "CUDA_REF_DEBUG"  # 1: poison output/workspace with NaN and synchronise after each call


def generations() -> tuple[str, ...]:
    """Generation ids cuda_ref builds kernels for, in reference order."""
    return tuple(GENERATION_IDS)


def _dtype_name(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_splits(bh: int, n_q: int, n_k: int, num_sm: int | None = None) -> tuple[int, int]:
    """v6_splitkv's split plan ``(num_splits, chunk)``; mirrors ``choose_splits`` in split_plan.cuh exactly.

    ``num_sm=None`` uses the current CUDA device's SM count (needs a GPU); pass ``REFERENCE_NUM_SM`` (40)
    for the reference's plans, e.g. ``choose_splits(8, 1, 8192, 40) == (10, 820)``.
    """
    for name, val in (("bh", bh), ("n_q", n_q), ("n_k", n_k)):
        if not _is_int(val) or val < 1:
            raise ValueError(f"{name} must be an int >= 1; got {name}={val!r}")
    if num_sm is None:
        num_sm = _device_sm_count()
    elif not _is_int(num_sm) or num_sm < 1:
        raise ValueError(f"num_sm must be an int >= 1 or None; got {num_sm=!r}")
    target_blocks = 2 * num_sm
    row_tiles = _ceil_div(n_q, V6_ROWS_PER_CTA)
    base = max(bh * row_tiles, 1)
    by_occ = _ceil_div(target_blocks, base)
    by_size = _ceil_div(n_k, MIN_CHUNK)
    s = min(max(min(by_occ, by_size), 1), S_CAP)
    return s, _ceil_div(n_k, s)


def _device_sm_count() -> int:
    from . import build

    build.require_cuda()
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def validate(q, k, v, *, causal: bool, scale, q_offset, generation: str, num_sm=None) -> tuple[int, float, int]:
    """Every argument check that needs no GPU. Returns ``(gen_id, scale, num_sm)`` with ``num_sm`` 0 for
    "the device's count". Raises ValueError for bad input, NotImplementedError for what v1-v6 lack."""
    if not isinstance(generation, str):
        raise ValueError(f"generation must be a string id; got {generation!r}")
    if generation not in GENERATION_IDS:
        _unknown_generation(generation)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "dim")):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be rank 4 [B, H, N, D] (BHND); got {name}.shape={tuple(x.shape)}")
        if _dtype_name(x) not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16; got {name}.dtype={_dtype_name(x)}")
    if not (_dtype_name(q) == _dtype_name(k) == _dtype_name(v)):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape [B, H, Nk, D]; got {tuple(k.shape)=}, {tuple(v.shape)=}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch size B; got {q.shape[0]=}, {k.shape[0]=}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share the head dim D; got {q.shape[3]=}, {k.shape[3]=}")
    if min(q.shape) < 1 or min(k.shape) < 1:
        raise ValueError(f"every dimension must be >= 1; got {tuple(q.shape)=}, {tuple(k.shape)=}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"H_q must be a multiple of H_kv; got H_q={hq}, H_kv={hkv}")
    if not _is_int(q_offset) or q_offset < 0:
        raise ValueError(f"q_offset must be a non-negative int; got {q_offset=!r}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool; got {causal=!r}")
    s = _check_scale(scale, q.shape[3])

    # What the reference's v1-v6 do not support.
    if hq != hkv:
        raise NotImplementedError(f"{generation} is MHA (H_q == H_kv) as in the reference; got H_q={hq}, H_kv={hkv}")
    if generation in _FP32_ONLY and _dtype_name(q) != "float32":
        raise NotImplementedError(f"{generation} takes float32 only (as the reference); got {_dtype_name(q)}. "
                                  "v5_wmma and v6_splitkv take float16/bfloat16")
    d = q.shape[3]
    if generation not in _ANY_HEAD_DIM and d not in _HEAD_DIMS:
        raise NotImplementedError(f"{generation} supports head dims {_HEAD_DIMS}; got D={d}")
    if q.shape[0] * hq > _MAX_GRID_Y:
        raise NotImplementedError(f"B*H must be <= {_MAX_GRID_Y} (a CUDA grid dimension); got {q.shape[0] * hq}")
    if max(q.shape[2], k.shape[2], q_offset) > 2**31 - 1:
        raise NotImplementedError("sequence lengths and q_offset must fit in int32")
    return GENERATION_IDS[generation], s, _check_num_sm(num_sm, generation)


def _unknown_generation(generation: str) -> None:
    try:
        from pallas_attn import registry
    except ImportError:  # cuda_ref without pallas_attn installed
        registry = None
    if registry is not None and generation in registry.ids():
        raise NotImplementedError(
            f"generation {generation!r} has no CUDA twin in cuda_ref.attention yet; built: {', '.join(GENERATION_IDS)}"
        )
    raise ValueError(f"unknown generation {generation!r}; cuda_ref.attention serves {', '.join(GENERATION_IDS)}")


def _check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool):
        raise ValueError(f"scale must be a float; got {scale=!r}")
    try:
        s = float(scale)
    except (TypeError, ValueError) as e:
        raise ValueError(f"scale must be a float; got {scale!r}") from e
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite; got {scale=}")
    return s


def _check_num_sm(num_sm, generation: str) -> int:
    """The v6 knob. Explicit argument > CUDA_REF_NUM_SM > the device's SM count (returned as 0)."""
    if num_sm is not None:
        if generation != "v6_splitkv":
            raise ValueError(f"num_sm only applies to v6_splitkv's split heuristic; got it for {generation}")
        if not _is_int(num_sm) or num_sm < 1:
            raise ValueError(f"num_sm must be an int >= 1 (40 = the reference's T4 constant); got {num_sm=!r}")
        return int(num_sm)
    env = os.environ.get(NUM_SM_ENV, "").strip()
    if env and generation == "v6_splitkv":
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"{NUM_SM_ENV} must be a positive integer; got {env!r}")
        return int(env)
    return 0


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, q_offset: int = 0,
              generation: str = "v4_fused", num_sm: int | None = None):
    """Attention on torch BHND CUDA tensors: q ``[B, H, Nq, D]``, k/v ``[B, H, Nk, D]`` -> float32 ``[B, H, Nq, D]``.

    ``generation`` is one of :func:`generations` (v1_naive ... v6_splitkv). ``scale`` defaults to
    ``1/sqrt(D)``. ``num_sm`` (v6_splitkv only) sets the SM count of the split heuristic: ``None`` uses the
    device's (or ``$CUDA_REF_NUM_SM``), ``40`` reproduces the reference's recorded plans. With
    ``CUDA_REF_DEBUG=1`` the output and workspace are NaN-poisoned and each call synchronises, so a missed
    write or an asynchronous fault surfaces at the call. The first call builds the extension (cached).
    """
    gen_id, s, sms = validate(q, k, v, causal=causal, scale=scale, q_offset=q_offset, generation=generation,
                              num_sm=num_sm)
    from . import build

    build.require_cuda()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor; got device {x.device}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}; got {x.device}")
    ext = build.load()
    return ext.forward(gen_id, q, k, v, s, bool(causal), int(q_offset), sms, _debug())
