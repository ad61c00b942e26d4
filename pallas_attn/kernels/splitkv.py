"""Split-KV state and its merge, written once (reference §2.0 "Split-KV partial + LSE merge"; DESIGN.md 3).

One state format for every split-KV kernel and for merging across devices: per (row, split) the
**normalized** FP32 partial output ``o [.., S, D]`` and the natural-log ``lse [.., S]`` of that split's
scaled scores. An empty split is ``(o = 0, lse = -inf)``. The merge is the exact identity

    lse* = log sum_s exp(lse_s),   out = sum_s exp(lse_s - lse*) o_s

(``out = 0``, ``lse* = -inf`` when every split is empty; a NaN anywhere stays NaN).

The reference's workspace holds the *unnormalized* triple ``(O, m, l)`` (D + 2 floats per row and split);
ours holds ``(O / l, m + log l)`` (D + 1 floats): the same information, one float fewer, and the form that
``jax.nn``-style LSE consumers and a cross-device merge (``merge_jnp``) take directly.

* ``partial(m, l, acc, base2)``: a program's final state as ``(o, lse)``;
* ``merge(o_part, lse, ...)``: the ``pallas_call`` merge, one program per output row, ``block`` splits per
  step (the reference: one thread per output dim over all splits); its loop, ``merge_states``, is also
  v12_mla_tc's finish;
* ``merge_jnp(o, lse, axis)``: the same in ``jnp`` (for splits held on different devices).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from .. import _compat
from .._compat import pl
from . import softmax

__all__ = ["partial", "merge", "merge_jnp", "merge_states"]


def partial(m, l, acc, *, base2: bool):
    """``(o, lse)`` of one split: ``acc / l`` (0 for an empty split) and the natural-log LSE (-inf if empty)."""
    return softmax.finalize(acc, l), softmax.lse(m, l, base2=base2)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def merge_states(lse_at, o_at, *, splits: int, sb: int, d: int, live=None):
    """In-kernel (Triton lowering): one output row's merge of its ``splits`` states, ``sb`` per step. ``lse_at(s0)``
    is the ref view of LSEs ``s0 .. s0 + sb`` of the row, ``o_at(s0)`` the ``[sb, d]`` view of their partial
    outputs (the callers' layouts differ: ``merge``'s ``[R, S, D]``, v12_mla_tc's finish ``[B, rows, S, DV]``).
    ``live`` (a traced bool, or None): False reads nothing and gives the state of no key (the row is padding its
    producer never wrote). Returns the base-2 ``(m, l, acc)`` for ``softmax.finalize`` / ``softmax.lse(...,
    base2=True)``."""

    # A loop (not a Python unroll) so the chunk start is dynamic: the last chunk may run past `splits`
    # (masked), which a static slice would reject at trace time.
    def body(c, carry):
        m_run, l_run, acc = carry
        s0 = c * sb
        ok = s0 + jnp.arange(sb, dtype=jnp.int32) < splits
        lse2 = _compat.load(lse_at(s0), mask=ok, other=-jnp.inf) * softmax.LOG2E
        o = _compat.load(o_at(s0), mask=jnp.broadcast_to(ok[:, None], (sb, d)), other=0.0)
        # lse_s is each split's log-denominator: merging them is one online-softmax step over the splits,
        # with the partial outputs as the values.
        m_new, l_new, alpha, w = softmax.step(m_run, l_run, lse2, ok, base2=True)
        return m_new, l_new, acc * alpha + jnp.sum(w[:, None] * o, axis=0)

    # (an int32 product, not a where: jnp.where(live, 1, 0) lowered to an i1 loop bound, which Triton refuses)
    n = _cdiv(splits, sb) if live is None else jnp.asarray(live, jnp.int32) * _cdiv(splits, sb)
    return jax.lax.fori_loop(0, n, body, softmax.init_state((), d))


def _merge_kernel(op_ref, lse_ref, *refs, splits: int, sb: int, d: int, out_row, with_lse: bool, live_of):
    row = pl.program_id(0)
    live, out_refs = (None, refs) if live_of is None else (live_of(row, refs[0]), refs[1:])
    m_run, l_run, acc = merge_states(lambda s0: lse_ref.at[row, pl.ds(s0, sb)],
                                     lambda s0: op_ref.at[row, pl.ds(s0, sb), pl.ds(0, d)], splits=splits, sb=sb, d=d,
                                     live=live)
    o_ref = out_refs[0]
    r_out = row if out_row is None else out_row(row)
    o_ref[r_out, pl.ds(0, d)] = softmax.finalize(acc, l_run).astype(o_ref.dtype)
    if with_lse:
        out_refs[1][row] = softmax.lse(m_run, l_run, base2=True)


def merge(o_part, lse, *, out_dtype, interpret: bool, name: str, block: int = 64, num_warps: int = 4,
          out_rows: int | None = None, out_row=None, return_lse: bool = False, live=None):
    """Merge ``o_part [R, S, D]`` (FP32) with ``lse [R, S]`` into ``out [R_out, D]`` of ``out_dtype``.

    Row ``r`` is written to output row ``out_row(r)`` (a traced-int function; None: ``r``), so a kernel can
    merge straight into its caller's layout; ``out_rows`` is then the output's row count. With
    ``return_lse`` also returns the merged natural-log ``lse [R]`` (indexed by input row). ``live`` (None, or
    ``(array, fn)``): ``fn(r, array_ref)`` says whether row ``r`` holds states; a row that does not reads nothing
    and gives 0 (LSE -inf), the rows its producer left unwritten (fa_decode's padding rows, session 39).
    """
    r, splits, d = o_part.shape
    sb = min(block, _next_pow2(splits))
    n_out = r if out_rows is None else out_rows
    out_shape = [jax.ShapeDtypeStruct((n_out, d), out_dtype)]
    if return_lse:
        out_shape.append(jax.ShapeDtypeStruct((r,), jnp.float32))
    res = pl.pallas_call(
        functools.partial(_merge_kernel, splits=splits, sb=sb, d=d, out_row=out_row, with_lse=return_lse,
                          live_of=None if live is None else live[1]),
        out_shape=tuple(out_shape), grid=(r,),
        compiler_params=_compat.triton_params(num_warps=num_warps, num_stages=1),
        interpret=interpret, name=name,
    )(o_part, lse, *(() if live is None else (live[0],)))
    return tuple(res) if return_lse else res[0]


def merge_jnp(o, lse, *, axis: int = 0):
    """``(out, lse*)`` merging the states stacked along ``axis`` of ``o [.., S, .., D]`` / ``lse [.., S, ..]``.

    For splits that live on different devices (gather the states, then merge) or anywhere a Pallas launch
    is not wanted. FP32 math; ``out`` keeps ``o``'s dtype.
    """
    o32 = o.astype(jnp.float32)
    lse = lse.astype(jnp.float32)
    if o.shape[axis] == 1:
        # one state: the general formula below reduces to this (w = 1 for a finite LSE, 0 for -inf, NaN for NaN),
        # in one elementwise pass instead of XLA's four (fa_mla at B 64 runs one split: ~10 us of merge kernels)
        o1, l1 = jnp.squeeze(o32, axis), jnp.squeeze(lse, axis)
        empty, bad = jnp.isneginf(l1)[..., None], jnp.isnan(l1)[..., None]
        out = jnp.where(empty, o1 * 0.0, jnp.where(bad, jnp.float32(jnp.nan), o1))
        return out.astype(o.dtype), l1
    m = jnp.max(lse, axis=axis, keepdims=True)
    m_safe = jnp.where(jnp.isneginf(m), 0.0, m)  # every split empty: weights exp(-inf) = 0
    w = jnp.exp(lse - m_safe)
    tot = jnp.sum(w, axis=axis)
    out = jnp.sum(jnp.expand_dims(w, -1) * o32, axis=axis) / jnp.expand_dims(jnp.where(tot == 0, 1.0, tot), -1)
    lse_out = jnp.where(tot == 0, -jnp.inf, jnp.squeeze(m_safe, axis) + jnp.log(jnp.where(tot == 0, 1.0, tot)))
    return out.astype(o.dtype), lse_out
