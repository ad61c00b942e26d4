"""Per-sequence lengths and query offsets (DESIGN.md decision 6), written once.

* ``q_offsets(q_offset, batch)``: the API's normaliser. A Python int, a traced int32 scalar or a ``[B]``
  array become one int32 ``[B]`` array that kernels read per sequence (``offset_of``), so a jitted decode
  loop passes its cache position as data, not as a compile-time constant.
* ``paged_q_offsets``: the paged default, ``kv_len - Tq`` per sequence (the last query sits on the last key).
* ``clamp_len``: a paged length the table cannot hold is clamped (never a read past the table) and flagged.
* ``cut_padding``: rows past each sequence's real queries (``q_lens``) set to output 0 / LSE -inf, and poisoned
  sequences to NaN (the padded chunked entry, fa_prefill's ``q_lens`` contract, the decode entry's ``q_lens``).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["q_offsets", "paged_q_offsets", "offset_of", "clamp_len", "cut_padding"]


def q_offsets(q_offset, batch: int):
    """int32 ``[B]`` offsets from an int, an int32 scalar (traced or not) or a ``[B]`` int array.

    Negative offsets are allowed: query ``i`` then sees keys ``j <= i + q_offset``, possibly none (output 0,
    LSE -inf). Raises ValueError for floats, bools, wrong shapes or out-of-int32 values.
    """
    if isinstance(q_offset, bool) or q_offset is None:
        raise ValueError(f"q_offset must be an int, an int32 scalar or an int32 [B={batch}] array; got {q_offset!r}")
    if isinstance(q_offset, numbers.Integral):
        if not -(2**31) <= int(q_offset) < 2**31:
            raise ValueError(f"q_offset must fit in int32; got {q_offset}")
        return jnp.full((batch,), int(q_offset), jnp.int32)
    if not (hasattr(q_offset, "shape") and hasattr(q_offset, "dtype")):
        raise ValueError(f"q_offset must be an int or an int32 array; got {type(q_offset).__name__}")
    dt = np.dtype(q_offset.dtype)
    if dt.kind not in "iu":
        raise ValueError(f"q_offset must have an integer dtype; got q_offset.dtype={dt.name}")
    if tuple(q_offset.shape) not in ((), (batch,)):
        raise ValueError(f"q_offset must be a scalar or shaped [B={batch}]; got q_offset.shape={tuple(q_offset.shape)}")
    arr = jnp.asarray(q_offset)
    if not isinstance(arr, jax.core.Tracer) and dt.itemsize > 4:
        vals = np.asarray(arr)
        if vals.size and (vals.min() < -(2**31) or vals.max() >= 2**31):
            raise ValueError("q_offset values must fit in int32")
    return jnp.broadcast_to(arr.astype(jnp.int32), (batch,))


def paged_q_offsets(kv_lens, q_len: int):
    """The paged default: ``kv_len[b] - Tq`` (causal decode puts the last query on the last key)."""
    return kv_lens.astype(jnp.int32) - jnp.int32(q_len)


def offset_of(off_ref, b):
    """In-kernel: sequence ``b``'s offset from the int32 ``[B]`` ref."""
    return off_ref[b]


def clamp_len(raw_len, capacity: int):
    """In-kernel: ``(kv_len, bad)`` with ``kv_len`` clamped to ``[0, capacity]`` and ``bad`` set when it was not."""
    bad = (raw_len < 0) | (raw_len > capacity)
    return jnp.clip(raw_len, 0, capacity), bad


def cut_padding(out, lse, q_lens, poison=None):
    """Rows at or past each sequence's ``q_lens`` (padding): output 0, LSE -inf; with ``poison`` (bool ``[B]``) those
    sequences' every row NaN. ``out [B, Tq, Hq, D]`` and ``lse [B, Hq, Tq]``; either may be None (left as is)."""
    tq = out.shape[1] if out is not None else lse.shape[2]
    real = jnp.arange(tq, dtype=jnp.int32)[None, :] < q_lens[:, None]  # [B, Tq]
    if out is not None:
        out = jnp.where(real[:, :, None, None], out, jnp.zeros((), out.dtype))
        if poison is not None:
            out = jnp.where(poison[:, None, None, None], jnp.nan, out).astype(out.dtype)
    if lse is not None:
        lse = jnp.where(real[:, None, :], lse, -jnp.inf)
        if poison is not None:
            lse = jnp.where(poison[:, None, None], jnp.nan, lse)
    return out, lse
