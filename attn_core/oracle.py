"""The oracle: float64 attention on the CPU, for every family.

Every kernel in this project, Pallas or CUDA, is checked against these functions (DESIGN.md decision 7).
They are written for clarity, not speed: numpy float64, explicit max-subtracted softmax, one function per
family, each family built on the dense one.

Conventions (docs/reference.md §1.1, DESIGN.md decisions 4-5):
  * dense inputs are BTNH: q ``[B, Tq, Hq, D]``, k/v ``[B, Tk, Hkv, Dv]``;
  * GQA head map ``h_kv = h_q // G`` with ``G = Hq // Hkv`` (KV expansion is repeat-interleave, never tile);
  * causal is top-left: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``;
  * a fully masked row has output 0 and log-sum-exp ``-inf`` (never NaN);
  * features beyond the mask (``attention_reference`` / ``attention_grad_reference``, compare's workload
    features): ``window=W`` keeps keys ``i + q_offset - W < j <= i + q_offset`` (jax.nn's
    ``local_window_size=(W - 1, 0)``; it needs ``causal``) and the band form ``window=(left, right)`` keeps
    ``i + q_offset - left <= j <= i + q_offset + right`` (either side None = unbounded; jax.nn's
    ``local_window_size`` semantics, with or without ``causal``), ``softcap=c`` maps each scaled score
    ``s -> c * tanh(s / c)`` before the softmax, ``sinks`` (one logit per query head, ``[Hq]``, unscaled and not
    soft-capped) joins every row's softmax denominator with a zero value vector (gpt-oss), and
    ``q_segments`` / ``kv_segments`` (int ``[B, Tq]`` / ``[B, Tk]``) keep only keys of the query's own segment
    (packed documents; :func:`packed_doc_lengths` is the mix compare packs).

Inputs may be numpy arrays, JAX arrays (any float dtype, bf16 and fp8 included) or torch tensors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import formats

__all__ = [
    "to_f64",
    "attention_reference",
    "paged_attention_reference",
    "gather_paged_kv",
    "lse_merge_reference",
    "quantized_attention_reference",
    "mla_attention_reference",
    "mla_materialized_reference",
    "attention_grad_reference",
    "packed_doc_lengths",
    "segment_ids_from_lengths",
]


def to_f64(x: Any) -> np.ndarray:
    """Any array-like (numpy, jax, torch; bf16/fp16/fp8 included) as a float64 numpy array."""
    if hasattr(x, "detach"):  # torch: bf16 has no numpy twin, so go through float32 (exact for bf16/fp16)
        x = x.detach().cpu().float().numpy()
    return np.asarray(x).astype(np.float64)


def _as_f64(x: Any) -> np.ndarray:
    """``to_f64`` without the copy when ``x`` is already a float64 numpy array (for inputs that are only read)."""
    return x if isinstance(x, np.ndarray) and x.dtype == np.float64 else to_f64(x)


def _check_dense(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[int, int]:
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"q, k, v must be rank 4 (BTNH); got {q.shape=}, {k.shape=}, {v.shape=}")
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(f"k and v must share [B, Tk, Hkv]; got {k.shape=}, {v.shape=}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch dim; got {q.shape=}, {k.shape=}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share the head dim; got {q.shape=}, {k.shape=}")
    hq, hkv = q.shape[2], k.shape[2]
    if hkv == 0 or hq % hkv:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={hq}, Hkv={hkv}")
    return hq, hkv


def _check_features(b: int, tq: int, tk: int, hq: int, *, causal: bool, window, softcap, sinks, q_segments,
                    kv_segments):
    """The feature arguments, validated and as numpy: ``(window, softcap, sinks [Hq] f64 | None, q_seg, kv_seg)``."""
    if isinstance(window, tuple):  # the band form (left, right): i + qo - left <= j <= i + qo + right
        if len(window) != 2 or any(isinstance(x, (bool, np.bool_)) or not (x is None or isinstance(x, (int,
                                   np.integer))) for x in window):
            raise ValueError(f"window as a pair must be (left, right), ints or None; got {window!r}")
        return (tuple(None if x is None else int(x) for x in window), *_check_features(
            b, tq, tk, hq, causal=causal, window=None, softcap=softcap, sinks=sinks, q_segments=q_segments,
            kv_segments=kv_segments)[1:])
    if window is not None:
        if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)) or window < 1:
            raise ValueError(f"window must be a positive int W (keys i + q_offset - W < j <= i + q_offset) or a "
                             f"(left, right) pair; got {window!r}")
        if not causal:
            raise ValueError("window needs causal=True (the window ends at the causal bound j <= i + q_offset)")
        window = int(window)
    if softcap is not None:
        if isinstance(softcap, (bool, np.bool_)) or not float(softcap) > 0:
            raise ValueError(f"softcap must be a positive number; got {softcap!r}")
        softcap = float(softcap)
    if sinks is not None:
        sinks = to_f64(sinks)
        if sinks.shape != (hq,):
            raise ValueError(f"sinks must be one logit per query head, shape ({hq},); got {sinks.shape}")
    if q_segments is None and kv_segments is not None:
        raise ValueError("kv_segments needs q_segments")
    if q_segments is not None:
        q_segments = np.asarray(q_segments)
        kv_segments = q_segments if kv_segments is None else np.asarray(kv_segments)
        if q_segments.shape != (b, tq) or kv_segments.shape != (b, tk):
            raise ValueError(f"q_segments must be [B, Tq] = [{b}, {tq}] and kv_segments [B, Tk] = [{b}, {tk}]; got "
                             f"{q_segments.shape}, {kv_segments.shape}")
        if not (np.issubdtype(q_segments.dtype, np.integer) and np.issubdtype(kv_segments.dtype, np.integer)):
            raise ValueError(f"segment ids must be integers; got {q_segments.dtype}, {kv_segments.dtype}")
    return window, softcap, sinks, q_segments, kv_segments


def visible_mask(b: int, tq: int, tk: int, *, causal: bool, q_offset, kv_len, window, q_segments, kv_segments):
    """``[B, 1, Tq, Tk]`` True where key ``j`` is visible to query ``i`` (every rule of the module docstring)."""
    j = np.arange(tk)[None, None, None, :]
    i = np.arange(tq)[None, None, :, None]
    qo = np.broadcast_to(np.asarray(q_offset, dtype=np.int64), (b,))[:, None, None, None]
    visible = np.ones((b, 1, tq, tk), dtype=bool)
    if kv_len is not None:
        kl = np.broadcast_to(np.asarray(kv_len, dtype=np.int64), (b,))[:, None, None, None]
        visible &= j < kl
    if causal:
        visible &= j <= i + qo
    if isinstance(window, tuple):
        left, right = window
        if left is not None:
            visible &= j >= i + qo - left
        if right is not None:
            visible &= j <= i + qo + right
    elif window is not None:
        visible &= j > i + qo - window
    if q_segments is not None:
        visible &= q_segments[:, None, :, None] == kv_segments[:, None, None, :]
    return visible


def masked_softmax(s, visible, sink=None):
    """The softmax of scores ``s [..., Tq, Tk]`` over the keys ``visible`` (broadcast against ``s``) with an optional
    sink logit (``sink``, broadcast against ``s[..., :1]``) in the max and the denominator: ``(p, p_sink, m_safe, l,
    l_safe)``. Masked keys are ``-inf`` (``p = 0``); the max of a row with a NaN score or sink is NaN, taken as 0
    (``m_safe``), so NaN reaches the row; a row that sees nothing sums to 0 and is divided by 1 (``p = 0``). Every
    float64 attention in this project's references goes through it (the reference forward and backward here, compare's
    dense oracle)."""
    s = np.where(visible, s, -np.inf)  # a new array: the steps below work in it in place (no score-sized temporaries)
    shape = s.shape[:-1] + (1,)
    if s.shape[-1] == 0:  # an empty cache: every row is fully masked (a sink alone takes the whole denominator)
        p = np.zeros(s.shape)
        m = np.full(shape, -np.inf) if sink is None else np.broadcast_to(sink, shape)
    else:
        m = s.max(axis=-1, keepdims=True)
        if sink is not None:
            m = np.maximum(m, sink)  # NaN in a score or a sink stays NaN
    m_safe = np.where(np.isfinite(m), m, 0.0)
    if s.shape[-1]:
        p = np.exp(np.subtract(s, m_safe, out=s), out=s)  # exp(-inf) = 0 for masked keys
    l = p.sum(axis=-1, keepdims=True)
    p_sink = None
    if sink is not None:
        p_sink = np.exp(sink - m_safe)
        l = l + p_sink
    l_safe = np.where(l > 0, l, 1.0)
    p = np.divide(p, l_safe, out=p)
    if p_sink is not None:
        p_sink = p_sink / l_safe
    return p, p_sink, m_safe, l, l_safe


def _softmax_rows(q, k, v, *, scale, causal, q_offset, kv_len, window, softcap, sinks, q_segments, kv_segments):
    """The forward of one problem (checked, float64): ``(p [B, Hq, Tq, Tk], p_sink [B, Hq, Tq, 1] | None,
    tanh(s / c) | None, out [B, Tq, Hq, Dv], lse [B, Hq, Tq], k_t, v_t)`` with ``k_t``/``v_t`` K/V head-major
    ``[B, Hkv, Tk, D]`` (views, not repeated to the query heads). Products are batched ``matmul`` (BLAS), not
    ``einsum``; a KV head's G query heads broadcast against it (``_by_kv_head``), so no copy of K/V is made per query
    head (session 28: up to 128 query heads over one MLA latent made that copy 4.8 GB at S 8192), each query head's
    product the same BLAS call on the same values as with the copy."""
    hkv = k.shape[2]
    b, tq, _, _ = q.shape
    tk = k.shape[1]
    k_t, v_t = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, Hkv, Tk, D]: views
    q_h = np.ascontiguousarray(q.transpose(0, 2, 1, 3))  # [B, Hq, Tq, D]
    s = _from_kv_head(_by_kv_head(q_h, hkv) @ k_t[:, :, None].swapaxes(-1, -2)) * scale  # [B, Hq, Tq, Tk]
    th = None
    if softcap is not None:
        th = np.tanh(s / softcap)
        s = softcap * th
    visible = visible_mask(b, tq, tk, causal=causal, q_offset=q_offset, kv_len=kv_len, window=window,
                           q_segments=q_segments, kv_segments=kv_segments)
    sink = None if sinks is None else sinks[None, :, None, None]  # [1, Hq, 1, 1]
    p, p_sink, m_safe, l, l_safe = masked_softmax(s, visible, sink)
    out = _from_kv_head(_by_kv_head(p, hkv) @ v_t[:, :, None]).transpose(0, 2, 1, 3)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(l_safe[..., 0]), -np.inf)
    return p, p_sink, th, out, lse, k_t, v_t


def _by_kv_head(a, hkv: int):
    """``[B, Hq, ...]`` as ``[B, Hkv, G, ...]`` (query head ``h`` reads KV head ``h // G``): a view of a contiguous
    array, so a product against ``[B, Hkv, 1, ...]`` broadcasts each KV head over its G query heads."""
    return a.reshape(a.shape[0], hkv, a.shape[1] // hkv, *a.shape[2:])


def _from_kv_head(a):
    """``[B, Hkv, G, ...]`` back to ``[B, Hq, ...]`` (``_by_kv_head``'s inverse; a product's result is contiguous)."""
    return a.reshape(a.shape[0], a.shape[1] * a.shape[2], *a.shape[3:])


def attention_reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
    window: int | tuple | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    q_segments: Any = None,
    kv_segments: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Float64 attention. Returns ``(out [B, Tq, Hq, Dv], lse [B, Hq, Tq])``.

    ``q_offset`` and ``kv_len`` may be scalars or per-sequence ``[B]`` arrays: keys at positions
    ``>= kv_len[b]`` are invisible (ragged batches); causal uses ``j <= i + q_offset[b]``.
    ``lse`` is the natural-log log-sum-exp of the scaled scores over visible keys (``-inf`` if none), with the
    sink's ``exp(sink)`` in the sum when ``sinks`` is given. ``window``, ``softcap``, ``sinks``, ``q_segments`` /
    ``kv_segments``: the features of the module docstring (None: off).
    """
    q, k, v = _as_f64(q), _as_f64(k), _as_f64(v)  # read only below: float64 input is not copied
    hq, _ = _check_dense(q, k, v)
    b, tq, _, d = q.shape
    tk = k.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    window, softcap, sinks, q_segments, kv_segments = _check_features(
        b, tq, tk, hq, causal=causal, window=window, softcap=softcap, sinks=sinks, q_segments=q_segments,
        kv_segments=kv_segments)
    _, _, _, out, lse, _, _ = _softmax_rows(q, k, v, scale=scale, causal=causal, q_offset=q_offset, kv_len=kv_len,
                                            window=window, softcap=softcap, sinks=sinks, q_segments=q_segments,
                                            kv_segments=kv_segments)
    return out, lse


def attention_grad_reference(
    q: Any,
    k: Any,
    v: Any,
    dout: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
    window: int | tuple | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    q_segments: Any = None,
    kv_segments: Any = None,
    block_q: int | None = None,
) -> dict[str, np.ndarray | None]:
    """Float64 gradients of attention: for a loss ``L`` with ``dL/dout = dout`` (``L = sum(out * dout)`` for a
    fixed weight ``dout``), ``{"out", "lse", "dq", "dk", "dv", "dsinks"}`` (``dsinks`` ``[Hq]``, None without
    sinks), the same arguments and semantics as :func:`attention_reference`.

    The analytic backward, written out: with ``P`` the softmax (the sink's share ``P_sink`` beside it, its value
    vector zero), ``dV = P^T dO``; ``dP = dO V^T``; ``delta = rowsum(dO * O)`` (``= sum_j P_ij dP_ij``, the
    sink contributing nothing); ``dS = P * (dP - delta)`` (w.r.t. the soft-capped scores), times
    ``1 - tanh(s / c)^2`` under a soft-cap; ``dQ = scale * dS K``, ``dK = scale * dS^T Q``; GQA sums dK and dV
    over each KV head's query heads; ``dsink_h = -sum P_sink * delta`` over the rows of head ``h``. A masked
    pair has ``P = 0`` and no gradient; NaN anywhere in a row's inputs reaches its gradients.

    Computed over blocks of ``block_q`` query rows (each block holds whole rows, so the blocking is exact; None:
    blocks of at most 256 rows and about 2^24 scores), each against only the keys its rows can see when
    ``q_offset`` is a scalar (causal bound, window), so long sequences (compare's 32k-token train subsets) fit in
    memory and skip the masked half.
    """
    q, k, v, do = to_f64(q), to_f64(k), to_f64(v), to_f64(dout)
    hq, hkv = _check_dense(q, k, v)
    b, tq, _, d = q.shape
    tk, dv_ = k.shape[1], v.shape[3]
    if do.shape != (b, tq, hq, dv_):
        raise ValueError(f"dout must be [B, Tq, Hq, Dv] = {(b, tq, hq, dv_)}; got {do.shape}")
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    window, softcap, sinks, q_segments, kv_segments = _check_features(
        b, tq, tk, hq, causal=causal, window=window, softcap=softcap, sinks=sinks, q_segments=q_segments,
        kv_segments=kv_segments)
    if block_q is None:  # at most 256 rows (causal / window key trimming pays) and about 2^24 scores a block
        block_q = max(1, min(256, (1 << 24) // max(1, b * hq * max(tk, 1))))
    elif isinstance(block_q, bool) or not isinstance(block_q, (int, np.integer)) or block_q < 1:
        raise ValueError(f"block_q must be a positive int or None; got {block_q!r}")
    g = hq // hkv
    scalar_offset = np.ndim(q_offset) == 0
    qo_arr = np.broadcast_to(np.asarray(q_offset, dtype=np.int64), (b,))
    out = np.zeros((b, tq, hq, dv_))
    lse = np.zeros((b, hq, tq))
    dq = np.zeros_like(q)
    dk_h = np.zeros((b, hq, tk, d))  # head-major, per query head (summed over each group at the end)
    dv_h = np.zeros((b, hq, tk, dv_))
    dsinks = None if sinks is None else np.zeros(hq)
    for r0 in range(0, tq, block_q):
        r1 = min(tq, r0 + block_q)
        lo, hi = 0, tk
        if scalar_offset:  # only the keys these rows can see (exact: the rest are masked for every row here)
            qo = int(qo_arr[0])
            if causal:
                hi = min(tk, max(0, r1 - 1 + qo + 1))
            if window is not None:
                lo = min(hi, max(0, r0 + qo - window + 1))
            if hi <= lo:
                lo, hi = 0, tk
        kl = None if kv_len is None else np.asarray(kv_len, dtype=np.int64) - lo
        p, p_sink, th, o, ls, k_t, v_t = _softmax_rows(
            q[:, r0:r1], k[:, lo:hi], v[:, lo:hi], scale=scale, causal=causal, q_offset=qo_arr + r0 - lo,
            kv_len=kl, window=window, softcap=softcap, sinks=sinks,
            q_segments=None if q_segments is None else q_segments[:, r0:r1],
            kv_segments=None if kv_segments is None else kv_segments[:, lo:hi])
        out[:, r0:r1], lse[:, :, r0:r1] = o, ls
        do_h = np.ascontiguousarray(do[:, r0:r1].transpose(0, 2, 1, 3))  # [B, Hq, n, Dv]
        dv_h[:, :, lo:hi] += p.swapaxes(-1, -2) @ do_h
        dp = _from_kv_head(_by_kv_head(do_h, hkv) @ v_t[:, :, None].swapaxes(-1, -2))  # [B, Hq, n, Tk']
        delta = np.sum(do_h * o.transpose(0, 2, 1, 3), axis=-1, keepdims=True)  # [B, Hq, n, 1]
        ds = p * (dp - delta)
        if th is not None:
            ds = ds * (1.0 - th * th)
        dq[:, r0:r1] = scale * _from_kv_head(_by_kv_head(ds, hkv) @ k_t[:, :, None]).transpose(0, 2, 1, 3)
        dk_h[:, :, lo:hi] += scale * (ds.swapaxes(-1, -2) @ np.ascontiguousarray(q[:, r0:r1].transpose(0, 2, 1, 3)))
        if dsinks is not None:
            dsinks -= np.sum(p_sink[..., 0] * delta[..., 0], axis=(0, 2))
    dk = dk_h.reshape(b, hkv, g, tk, d).sum(axis=2).transpose(0, 2, 1, 3)
    dv = dv_h.reshape(b, hkv, g, tk, dv_).sum(axis=2).transpose(0, 2, 1, 3)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv, "dsinks": dsinks}


def packed_doc_lengths(total: int, seed: int) -> list[int]:
    """The lengths of the documents compare packs into one row of ``total`` tokens (a ``packed`` workload).

    Rule (deterministic in ``seed``): the sizes are ``total // 16``, ``total // 8``, ``total // 4`` and
    ``total // 2`` (each at least 1; duplicates once); documents are drawn one at a time, uniformly among the
    sizes that still fit the tokens left (``numpy.random.default_rng([seed, 0x9AC])``), until no size fits; the
    tokens left then (fewer than ``total // 16``) join the last document. So every document holds between
    ``total / 16`` and ``total / 2 + total / 16`` tokens, there are 2 to 16 of them (1 when ``total < 2``), and
    they sum to ``total``.
    """
    if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < 1:
        raise ValueError(f"total must be a positive int; got {total!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    total = int(total)
    sizes = sorted({max(1, total // d) for d in (16, 8, 4, 2)})
    rng = np.random.default_rng([int(seed), 0x9AC])
    out: list[int] = []
    left = total
    while True:
        fit = [s for s in sizes if s <= left]
        if not fit:
            break
        n = fit[int(rng.integers(len(fit)))]
        out.append(n)
        left -= n
    if left:
        out[-1] += left
    return out


def segment_ids_from_lengths(lengths: Any) -> np.ndarray:
    """int32 ``[sum(lengths)]``: token ``t`` holds the index of its document (documents back to back)."""
    lens = np.asarray(lengths, dtype=np.int64)
    if lens.ndim != 1 or np.any(lens < 1):
        raise ValueError(f"lengths must be a 1-D list of positive ints; got {lengths!r}")
    return np.repeat(np.arange(len(lens), dtype=np.int32), lens)


def gather_paged_kv(pool: Any, block_table: Any, length: int) -> np.ndarray:
    """Dense ``[length, H, W]`` view of one sequence from a pool ``[num_blocks, page, H, W]``.

    Logical key ``j`` lives in physical page ``block_table[j // page]`` at offset ``j % page``
    (docs/reference.md §1.3). Raises ValueError on a page index outside the pool.
    """
    pool = to_f64(pool)
    bt = np.asarray(block_table, dtype=np.int64)
    page = pool.shape[1]
    n_pages = -(-int(length) // page)
    if n_pages > bt.shape[0]:
        raise ValueError(f"block_table holds {bt.shape[0]} pages, {length=} needs {n_pages}")
    idx = bt[:n_pages]
    if np.any(idx < 0) or np.any(idx >= pool.shape[0]):
        raise ValueError(f"block_table entries must lie in [0, {pool.shape[0]}); got {idx.min()}..{idx.max()}")
    dense = pool[idx].reshape(n_pages * page, *pool.shape[2:])
    return dense[:length]


def paged_attention_reference(
    q: Any,
    k_pool: Any,
    v_pool: Any,
    block_table: Any,
    kv_lens: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Paged-KV attention oracle (ragged batch). Causal decode uses ``q_offset = kv_len - Tq`` per sequence.

    q ``[B, Tq, Hq, D]``; pools ``[num_blocks, page, Hkv, D]``; block_table int ``[B, pages_per_seq]``;
    kv_lens int ``[B]``. Returns ``(out [B, Tq, Hq, D], lse [B, Hq, Tq])``.
    """
    q = to_f64(q)
    kv_lens = np.asarray(kv_lens, dtype=np.int64)
    bt = np.asarray(block_table, dtype=np.int64)
    if kv_lens.shape != (q.shape[0],) or bt.shape[0] != q.shape[0]:
        raise ValueError(f"kv_lens must be [B] and block_table [B, P]; got {kv_lens.shape=}, {bt.shape=}")
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(kv_lens[b])
        kb = gather_paged_kv(k_pool, bt[b], n)[None]
        vb = gather_paged_kv(v_pool, bt[b], n)[None]
        o, lse = attention_reference(
            q[b : b + 1], kb, vb, causal=causal, scale=scale, q_offset=n - q.shape[1]
        )
        outs.append(o)
        lses.append(lse)
    return np.concatenate(outs), np.concatenate(lses)


def lse_merge_reference(o_parts: Any, lse_parts: Any) -> tuple[np.ndarray, np.ndarray]:
    """Merge normalized partial outputs ``[S, ..., D]`` with their log-sum-exps ``[S, ...]``.

    The exact identity behind split-KV (docs/reference.md §2.0): ``out = Σ_s exp(lse_s - lse*) o_s`` with
    ``lse* = log Σ_s exp(lse_s)``; empty splits carry ``lse = -inf`` and contribute nothing.
    """
    o = to_f64(o_parts)
    lse = to_f64(lse_parts)
    m = lse.max(axis=0)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lse - m_safe)
    tot = w.sum(axis=0)
    tot_safe = np.where(tot > 0, tot, 1.0)
    out = (w[..., None] * o).sum(axis=0) / tot_safe[..., None]
    with np.errstate(divide="ignore"):
        lse_out = np.where(tot > 0, m_safe + np.log(tot_safe), -np.inf)
    return out, lse_out


def _quantize_dequantize(x: np.ndarray, kv_format: str) -> np.ndarray:
    """``x`` after a round trip through ``kv_format``: the values a kernel reading that cache actually sees."""
    if kv_format == "fp8":
        return formats.dequantize_fp8_e4m3(formats.quantize_fp8_e4m3(x))
    if kv_format == "nvfp4":
        return formats.dequantize_nvfp4(formats.quantize_nvfp4(x))
    raise ValueError(f"kv_format must be 'fp8' or 'nvfp4'; got {kv_format!r}")


def quantized_attention_reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    kv_format: str,
    causal: bool = False,
    scale: float | None = None,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention over a quantized KV cache: the oracle run on the operands the kernel sees, not the originals.

    K and V are each quantized as one whole tensor (separate per-tensor scales; NVFP4 micro-blocks run along the
    head dim) with :mod:`attn_core.formats`, dequantized to float32, then passed to :func:`attention_reference`
    in float64. ``q`` stays unquantized. So a kernel is judged on its attention arithmetic alone; the
    quantization error itself is the format's, measured separately. Returns ``(out, lse)`` as the dense oracle.
    """
    k_seen = _quantize_dequantize(to_f64(k), kv_format)
    v_seen = _quantize_dequantize(to_f64(v), kv_format)
    return attention_reference(q, k_seen, v_seen, causal=causal, scale=scale, q_offset=q_offset, kv_len=kv_len)


def mla_attention_reference(
    q: Any,
    latent: Any,
    *,
    kv_lora_rank: int,
    scale: float | None = None,
    causal: bool = False,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Absorbed MLA (multi-head latent attention) decode: every query head attends over one shared latent head.

    q ``[B, Tq, Hq, DQK]`` (already absorbed: ``[q_nope . W_UK, q_rope]``), latent ``[B, Tk, 1, DQK]`` with
    ``DQK = kv_lora_rank + rope_dim``. Keys are the whole latent, values its first ``kv_lora_rank`` columns, and
    the single KV head broadcasts to all query heads (GQA with Hkv = 1). Returns
    ``(out [B, Tq, Hq, kv_lora_rank], lse [B, Hq, Tq])``.

    ``scale`` defaults to ``1/sqrt(DQK)``. That is rarely what a model wants: an absorbed kernel must be given the
    scale of the materialized attention it stands for (``1/sqrt(Dn + R)``, see :func:`mla_materialized_reference`).
    """
    q, latent = to_f64(q), to_f64(latent)
    if q.ndim != 4 or latent.ndim != 4 or latent.shape[2] != 1:
        raise ValueError(f"q must be [B, Tq, Hq, DQK] and latent [B, Tk, 1, DQK]; got {q.shape=}, {latent.shape=}")
    if q.shape[-1] != latent.shape[-1]:
        raise ValueError(f"q and latent must share DQK; got {q.shape=}, {latent.shape=}")
    if not 0 < kv_lora_rank <= latent.shape[-1]:
        raise ValueError(f"kv_lora_rank must lie in [1, DQK={latent.shape[-1]}]; got {kv_lora_rank}")
    return attention_reference(
        q, latent, latent[..., :kv_lora_rank], causal=causal, scale=scale, q_offset=q_offset, kv_len=kv_len
    )


def mla_materialized_reference(
    q_nope: Any,
    q_rope: Any,
    latent: Any,
    *,
    kv_lora_rank: int,
    w_uk: Any,
    w_uv: Any,
    scale: float | None = None,
    causal: bool = False,
    q_offset: int | np.ndarray = 0,
    kv_len: int | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """MLA with per-head K and V materialized from the latent: the oracle for the absorption identity.

    latent ``[B, Tk, 1, L + R]`` splits into content ``c = latent[..., :L]`` and rope part ``r = latent[..., L:]``
    (``L = kv_lora_rank``). Per head ``h``: ``K_h = [c . W_UK[h]^T, r]`` and ``V_h = c . W_UV[h]^T`` with
    ``w_uk [H, Dn, L]`` and ``w_uv [H, Dv, L]``; queries are ``[q_nope, q_rope]`` (``[B, Tq, H, Dn]`` and
    ``[B, Tq, H, R]``). Plain attention then gives ``(out [B, Tq, H, Dv], lse [B, H, Tq])``.

    The identity it checks: with ``q_abs = [q_nope . W_UK[h], q_rope]`` (``[B, Tq, H, L + R]``),
    ``mla_attention_reference(q_abs, latent, scale=s)`` returns ``o_abs`` with ``out = o_abs . W_UV[h]^T`` and the
    same lse, because ``q_nope . (c W_UK[h]^T) = (q_nope W_UK[h]) . c``. ``scale`` defaults to ``1/sqrt(Dn + R)``,
    the materialized head dim; the absorbed form must be passed that same scale explicitly (its own default is
    ``1/sqrt(L + R)``).
    """
    q_nope, q_rope, latent = to_f64(q_nope), to_f64(q_rope), to_f64(latent)
    w_uk, w_uv = to_f64(w_uk), to_f64(w_uv)
    if latent.ndim != 4 or latent.shape[2] != 1 or not 0 < kv_lora_rank <= latent.shape[-1]:
        raise ValueError(f"latent must be [B, Tk, 1, L + R] with L = {kv_lora_rank=}; got {latent.shape=}")
    lora, rope = kv_lora_rank, latent.shape[-1] - kv_lora_rank
    if q_nope.ndim != 4 or q_rope.shape != (*q_nope.shape[:3], rope):
        raise ValueError(
            f"q_nope must be [B, Tq, H, Dn] and q_rope [B, Tq, H, {rope}]; got {q_nope.shape=}, {q_rope.shape=}"
        )
    heads, d_nope = q_nope.shape[2], q_nope.shape[3]
    if w_uk.shape != (heads, d_nope, lora) or w_uv.ndim != 3 or w_uv.shape[::2] != (heads, lora):
        raise ValueError(
            f"w_uk must be [{heads}, {d_nope}, {lora}] and w_uv [{heads}, Dv, {lora}]; got {w_uk.shape=}, {w_uv.shape=}"
        )

    content = latent[:, :, 0, :lora]  # [B, Tk, L]
    rope_k = np.broadcast_to(latent[:, :, :, lora:], (*latent.shape[:2], heads, rope))  # shared by every head
    k = np.concatenate([np.einsum("bkl,hdl->bkhd", content, w_uk), rope_k], axis=-1)  # [B, Tk, H, Dn + R]
    v = np.einsum("bkl,hdl->bkhd", content, w_uv)  # [B, Tk, H, Dv]
    q = np.concatenate([q_nope, q_rope], axis=-1)
    scale = 1.0 / np.sqrt(d_nope + rope) if scale is None else scale
    return attention_reference(q, k, v, causal=causal, scale=scale, q_offset=q_offset, kv_len=kv_len)
