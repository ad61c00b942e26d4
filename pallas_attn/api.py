"""Public entry points: validate once, pick the generation from the registry, call its kernel module.

Kernel-module contract (``pallas_attn.kernels.<module>``):
  * ``CONFIGS: dict[str, <frozen config>]`` with at least ``"faithful"`` (DESIGN.md decision 3);
  * ``forward(q, k, v, *, causal, scale, q_offset, interpret, config) -> out`` on validated BTNH arrays
    (dense entry), and/or
  * ``paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal, scale, interpret, config) -> out``
    (paged entry).
Validation of ranks, shapes and dtypes happens here, once; capability checks (dtype, head dim, GQA,
query length) come from the registry row, so an unsupported combination is a NotImplementedError that
names what is supported.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, registry

__all__ = ["attention", "paged_attention", "generations", "validate_dense", "validate_paged"]

_FLOAT_DTYPES = {"float32", "float16", "bfloat16"}


def generations() -> tuple[registry.Generation, ...]:
    """Every generation id with what it supports (``dtypes``, ``head_dims``, ``gqa``, ``max_q_len``)
    and which twins are built (``.built``)."""
    return registry.generations()


def _dtype_name(x: Any) -> str:
    return jnp.dtype(x.dtype).name


def validate_dense(q, k, v, *, causal: bool, scale, q_offset) -> float:
    """Shape/dtype checks shared by every dense generation. Returns the effective scale."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise ValueError(f"{name} must be an array; got {type(x).__name__}")
        if x.ndim != 4:
            raise ValueError(f"{name} must be rank 4 [B, T, H, D] (BTNH); got {name}.shape={tuple(x.shape)}")
        if _dtype_name(x) not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16; got {name}.dtype={_dtype_name(x)}")
    if not (_dtype_name(q) == _dtype_name(k) == _dtype_name(v)):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [B, Tk, Hkv, D]; got {k.shape=}, {v.shape=}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch size; got {q.shape[0]=}, {k.shape[0]=}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share the head dim D; got {q.shape[3]=}, {k.shape[3]=}")
    if min(q.shape) < 1 or min(k.shape) < 1:
        raise ValueError(f"every dimension must be >= 1; got {q.shape=}, {k.shape=}")
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={q.shape[2]}, Hkv={k.shape[2]}")
    if not isinstance(q_offset, (int, np.integer)) or isinstance(q_offset, bool) or q_offset < 0:
        raise ValueError(f"q_offset must be a non-negative int; got {q_offset=!r}")
    if not isinstance(causal, (bool, np.bool_)):
        raise ValueError(f"causal must be a bool; got {causal=!r}")
    return _check_scale(scale, q.shape[3])


def _check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    try:
        s = float(scale)
    except (TypeError, jax.errors.ConcretizationTypeError) as e:
        raise ValueError(f"scale must be a Python float (it is static); got {scale!r}") from e
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite; got {scale=}")
    return s


def _check_capabilities(gen: registry.Generation, *, dtype: str, d: int, hq: int, hkv: int, tq: int) -> None:
    if dtype not in gen.dtypes:
        raise NotImplementedError(f"{gen.id} takes dtypes {gen.dtypes}; got {dtype}")
    if d not in gen.head_dims:
        raise NotImplementedError(f"{gen.id} supports head dims {gen.head_dims}; got D={d}")
    if hq != hkv and not gen.gqa:
        gqa_ids = [g.id for g in registry.generations() if g.gqa and g.pallas is not None]
        raise NotImplementedError(
            f"{gen.id} is MHA (Hq == Hkv) as in the reference; got Hq={hq}, Hkv={hkv}. "
            f"Generations that support GQA: {', '.join(gqa_ids) or '(none built yet)'}"
        )
    if gen.max_q_len is not None and tq > gen.max_q_len:
        raise NotImplementedError(f"{gen.id} is a decode kernel for Tq <= {gen.max_q_len}; got Tq={tq}")


def attention(
    q,
    k,
    v,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_offset: int = 0,
    generation: str = "v4_fused",
    interpret: bool | None = None,
    config: str | None = None,
):
    """Attention on JAX BTNH arrays: q ``[B, Tq, Hq, D]``, k/v ``[B, Tk, Hkv, D]`` -> ``[B, Tq, Hq, D]``.

    ``causal`` is top-left: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``.
    ``scale`` defaults to ``1/sqrt(D)``. ``interpret=None`` runs in interpret mode when no GPU is present.
    ``config`` picks a kernel config of the generation (``"faithful"`` by default, ``"tuned"`` where one
    exists). Jit-compatible: every keyword argument is static. Output has q's dtype.
    """
    if not isinstance(generation, str):
        raise ValueError(f"generation must be a string id; got {generation!r}")
    gen = registry.get(generation)
    if gen.entry != "attention":
        raise ValueError(f"generation {generation!r} is served by pallas_attn.{gen.entry}, not attention()")
    s = validate_dense(q, k, v, causal=causal, scale=scale, q_offset=q_offset)
    _check_capabilities(gen, dtype=_dtype_name(q), d=q.shape[3], hq=q.shape[2], hkv=k.shape[2], tq=q.shape[1])
    mod = registry.pallas_module(generation)
    cfg = _pick_config(mod, generation, config)
    out = mod.forward(
        q, k, v, causal=bool(causal), scale=s, q_offset=int(q_offset),
        interpret=_compat.default_interpret(interpret), config=cfg,
    )
    return out.astype(q.dtype)


def _pick_config(mod, generation: str, config: str | None):
    name = config or "faithful"
    try:
        return mod.CONFIGS[name]
    except KeyError:
        raise ValueError(f"{generation} has configs {sorted(mod.CONFIGS)}; got {config=!r}") from None


def validate_paged(q, k_pool, v_pool, block_table, kv_lens, *, scale) -> float:
    """Checks for the paged entry (pools ``[num_blocks, page, Hkv, D]``, int32 tables)."""
    if q.ndim != 4:
        raise ValueError(f"q must be rank 4 [B, Tq, Hq, D]; got {q.shape=}")
    for name, x in (("k_pool", k_pool), ("v_pool", v_pool)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be rank 4 [num_blocks, page_size, Hkv, D]; got {x.shape=}")
    if k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool and v_pool must match; got {k_pool.shape=}, {v_pool.shape=}")
    dt = _dtype_name(q)
    if dt not in _FLOAT_DTYPES or _dtype_name(k_pool) != dt or _dtype_name(v_pool) != dt:
        raise ValueError(f"q and the pools must share a float dtype; got {q.dtype=}, {k_pool.dtype=}, {v_pool.dtype=}")
    page = k_pool.shape[1]
    if page < 1 or page & (page - 1):
        raise ValueError(f"page_size (k_pool.shape[1]) must be a power of two; got {page}")
    if q.shape[3] != k_pool.shape[3]:
        raise ValueError(f"q and the pools must share D; got {q.shape[3]=}, {k_pool.shape[3]=}")
    if q.shape[2] % k_pool.shape[2]:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={q.shape[2]}, Hkv={k_pool.shape[2]}")
    if block_table.ndim != 2 or block_table.shape[0] != q.shape[0] or _dtype_name(block_table) != "int32":
        raise ValueError(
            f"block_table must be int32 [B, pages_per_seq]; got {block_table.shape=}, {block_table.dtype=}"
        )
    if kv_lens.shape != (q.shape[0],) or _dtype_name(kv_lens) != "int32":
        raise ValueError(f"kv_lens must be int32 [B]; got {kv_lens.shape=}, {kv_lens.dtype=}")
    return _check_scale(scale, q.shape[3])


def paged_attention(
    q,
    k_pool,
    v_pool,
    block_table,
    kv_lens,
    *,
    scale: float | None = None,
    causal: bool = False,
    generation: str = "fa_decode",
    interpret: bool | None = None,
    config: str | None = None,
    check_block_table: bool = True,
):
    """Paged-KV attention (ragged batch). q ``[B, Tq, Hq, D]``; pools ``[num_blocks, page, Hkv, D]``;
    block_table int32 ``[B, pages_per_seq]``; kv_lens int32 ``[B]``. Causal decode masks with
    ``q_offset = kv_len - Tq`` per sequence. With ``check_block_table`` (default) a page index outside the
    pool raises (eagerly) or poisons the output with NaN (under jit), never reads out of bounds silently.
    """
    gen = registry.get(generation)
    s = validate_paged(q, k_pool, v_pool, block_table, kv_lens, scale=scale)
    _check_capabilities(gen, dtype=_dtype_name(q), d=q.shape[3], hq=q.shape[2], hkv=k_pool.shape[2],
                        tq=q.shape[1])
    mod = registry.pallas_module(generation)
    if not hasattr(mod, "paged_forward"):
        raise NotImplementedError(f"{generation} has no paged entry")
    cfg = _pick_config(mod, generation, config)
    out = mod.paged_forward(
        q, k_pool, v_pool, block_table, kv_lens, causal=bool(causal), scale=s,
        interpret=_compat.default_interpret(interpret), config=cfg, check_block_table=check_block_table,
    )
    return out.astype(q.dtype)
