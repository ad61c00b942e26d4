"""Chunked prefill over a paged KV cache: ``paged_attention`` with more queries per sequence than a decode kernel
serves (issue 32, first path; docs/serving.md).

A serving engine appends a chunk of new tokens to each sequence's paged cache and attends the chunk to everything
cached so far, causally; a batch may mix long chunks and single-token decodes (``q_lens``: each sequence's real
query count, the rest of its ``Tq`` rows padding). This path runs a dense kernel with the per-sequence query offsets:

* ``fa_prefill`` (the Mosaic GPU kernels, a Hopper; interpret mode on a CPU) for fp16 / bf16 at D 64 / 128 / 256. On a
  Hopper its producer reads K / V pages through the block table (``PAGED_IN_KERNEL``; one TMA copy per page of a key
  block), and consumers whose rows are all padding idle (``q_lens``: no Q load, no key, zeros stored); elsewhere
  (interpret mode, a page size the kernel does not take) the pages are gathered into a dense ``[B, pages_per_seq *
  page, Hkv, D]`` cache first. It takes the offsets but no key lengths: the keys past a sequence's ``kv_len`` (the
  rest of its last page and unused pages) are invisible to every real row because a real row ``i < q_len`` sits at ``i
  + q_offset <= kv_len - 1`` (checked: eagerly when the arrays are concrete, else the sequence's output is poisoned
  with NaN); padding rows come back 0 (LSE -inf) and a poisoned sequence's rows NaN from fa_prefill itself (on the GPU
  its kernel writes them, so no pass over the padded output follows it). With ``mixed_decodes`` the sequences of 1-16
  queries run on fa_decode instead.
* ``fa_train`` (Triton) otherwise (fp32, other head dims, a GPU that is not a Hopper), over the gathered pages: it
  masks ``q_lens`` and ``kv_lens`` itself.

Semantics are ``paged_attention``'s: query ``i`` of sequence ``b`` sees key ``j`` iff ``j < kv_lens[b]`` and ``j <=
i + q_offset[b]`` (and, with ``window=W``, ``j > i + q_offset[b] - W``; ``softcap`` and ``sinks`` as fa_prefill's);
``q_offset`` defaults to ``kv_lens - q_lens`` (the chunk is the last ``q_lens[b]`` tokens of its cache, what a serving
engine appends). Only causal: a non-causal chunk would see the whole padded cache. Measured (docs/serving.md, an H200):
at or ahead of FA3's paged prefill at the sweep's eight chunk shapes; 0.89-0.93x dense fa_prefill's speed at page 16,
0.96-1.03x at page 64.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, api
from .kernels import seqlen

__all__ = ["chunked_paged_attention", "varlen_paged_attention", "uses_fa_prefill", "paged_in_kernel",
           "resolve_chunk"]

# fa_prefill's producer reads K / V pages through the block table on the GPU (TMA per page; no gather). Off: every
# page is gathered into a dense cache first (the path of session 11). GPU-tested: tests/gpu/test_serving_gpu.py.
PAGED_IN_KERNEL = True
# The packed entry's row copies (the Q gather into row tiles, and the output's assembly with its selects) move 16-bit
# rows as 32-bit words: XLA's gather runs a thread an element, so two elements a word halve its threads (session 36,
# issue 32, H200: the Q gather 24.2 -> 14.5 us at the probe's mix B). The assembly is done in words throughout, every
# operand of its selects a word: call 1 gathered the tiles' rows as words and selected in bf16, and the gather lost
# its fusion into the select (a 16 us kernel of its own). Off: session 34's element copies.
ROW_WORDS = True


def uses_fa_prefill(dtype_name: str, head_dim: int, interpret: bool) -> bool:
    """Whether the chunked path runs fa_prefill (else fa_train): fp16 / bf16, D 64 / 96 / 128 / 256 (D 96 on a
    gathered dense cache), on a Hopper or in interpret mode."""
    from . import dropin
    from .kernels import fa_prefill

    return (dtype_name in fa_prefill.KERNEL.dtypes and head_dim in fa_prefill._HEAD_DIMS
            and (interpret or dropin._is_sm90()))


def resolve_chunk(problem, band, on_prefill: bool):
    """``(generation, config)`` of the dense kernel a chunk runs on, through the one resolver (``api.resolve``: the
    kernel's ``supports``, then its heuristic, this GPU's table else its rule) on ``problem``, the chunk's dense shape
    over the page-rounded cache (``_problem``): fa_prefill with ``fa_prefill.config_for_window`` for the window
    ``band`` (``(left, 0)`` or None), the drop-in's forward config at that shape (``dropin.prefill_config``), when
    ``on_prefill`` (``uses_fa_prefill``); else fa_train. The decodes of a mixed batch resolve fa_decode in
    ``_decode_part``."""
    if on_prefill:
        from .kernels import fa_prefill

        _, cfg = api.resolve("fa_prefill", problem, None)
        return "fa_prefill", fa_prefill.config_for_window(cfg, bool(problem.causal), band)
    return "fa_train", api.resolve("fa_train", problem, None)[1]


def _check_q_lens(q_lens, b: int, tq: int):
    if q_lens is None:
        return jnp.full((b,), tq, jnp.int32)
    if not hasattr(q_lens, "shape") or tuple(q_lens.shape) != (b,) or jnp.dtype(q_lens.dtype) != jnp.int32:
        raise ValueError(f"q_lens must be int32 [B={b}]; got {getattr(q_lens, 'shape', q_lens)!r}, "
                         f"{getattr(q_lens, 'dtype', None)}")
    try:
        ql = np.asarray(q_lens)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return q_lens
    if np.any(ql < 0) or np.any(ql > tq):
        bad = int(np.argmax((ql < 0) | (ql > tq)))
        raise ValueError(f"q_lens must lie in [0, Tq={tq}]; got q_lens[{bad}]={int(ql[bad])}")
    return q_lens


def _concrete(x):
    try:
        return np.asarray(x)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


def chunked_paged_attention(q, k_pool, v_pool, block_table, kv_lens, *, scale: float, q_offset=None, q_lens=None,
                            interpret: bool | None = None, return_lse: bool = False, check_block_table: bool = True,
                            window: int | None = None, softcap: float | None = None, sinks=None,
                            mixed_decodes: bool = False):
    """Causal paged attention for any ``Tq`` (validated pools ``[num_pages, page, Hkv, D]``, int32 tables). Returns
    ``out [B, Tq, Hq, D]`` (padding rows 0) and, with ``return_lse``, ``lse [B, Hq, Tq]`` float32 (padding rows
    -inf). ``window=W``: a query sees its last ``W`` positions (``i + off - W < j <= i + off``; Mistral's 4096);
    ``softcap`` / ``sinks [Hq]``: fa_prefill's (Gemma-2, gpt-oss; on fa_prefill's path only). See the module
    docstring. ``mixed_decodes`` (the caller passed ``q_lens``): sequences with 1 to 16 queries run on fa_decode
    (one extra launch; skipped when concrete ``q_lens`` hold no such sequence) and fa_prefill skips their rows, so a
    decode in a batch of chunks costs a decode, not a 64-row tile over its whole cache."""
    from .kernels import fa_prefill, fa_train

    b, tq, hq, d = q.shape
    num_pages, page, hkv, _ = k_pool.shape
    pps = block_table.shape[1]
    interp = _compat.default_interpret(interpret)
    on_prefill = uses_fa_prefill(jnp.dtype(q.dtype).name, d, interp)
    if (softcap is not None or sinks is not None) and not on_prefill:
        raise NotImplementedError(f"paged_attention: softcap / sinks run on fa_prefill's path only (fp16 / bf16, D 64 /"
                                  f" 128 / 256, a Hopper or interpret mode); got {jnp.dtype(q.dtype).name}, D {d}")
    band = _window_band(window)
    q_lens = _check_q_lens(q_lens, b, tq)
    offs, bad, tbl = _offsets_and_checks(q_lens, kv_lens, q_offset, block_table, num_pages=num_pages, page=page,
                                         check_block_table=check_block_table)
    dec = _decode_rows(q_lens, tq) if (mixed_decodes and on_prefill and page & (page - 1) == 0) else None
    if dec is not None:  # the batch's decodes run on fa_decode; fa_prefill sees their rows as padding
        q_lens_pf = jnp.where(dec, 0, q_lens)
        out_d, lse_d = _decode_part(q, k_pool, v_pool, tbl, kv_lens, offs, dec, q_lens, scale=scale, interpret=interp,
                                    window=window, softcap=softcap, sinks=sinks)
    else:
        q_lens_pf = q_lens
    if on_prefill:
        _, cfg = resolve_chunk(_problem(q, pps * page, hkv), band, True)  # this GPU's table / the rule, as the drop-in
        fitted = fa_prefill.fit(cfg, d, jnp.dtype(q.dtype).itemsize, True)  # the block_kv the kernel will run
        # gather the pages into a dense cache where the in-kernel page reads do not apply (D 96: dense only)
        if interp or not paged_in_kernel(page, fitted) or d not in fa_prefill._PAGED_HEAD_DIMS:
            k_in, v_in, bt = _gather(k_pool, tbl), _gather(v_pool, tbl), None
        else:  # fa_prefill's producer reads the pages through the table (TMA per page), no gather
            k_in, v_in, bt = k_pool, v_pool, tbl
        # the padding rows come back 0 / -inf and a bad sequence's rows NaN from fa_prefill itself (on the GPU the
        # kernel writes them: no pass over the padded output here)
        out, lse = fa_prefill.forward(q, k_in, v_in, causal=True, scale=scale, q_offset=offs, interpret=interp,
                                      config=cfg, return_lse=True, window=band, softcap=softcap, sinks=sinks,
                                      block_table=bt, q_lens=q_lens_pf, poison=bad)
        if dec is not None:  # the decodes' real rows (the first q_lens of the 16 fa_decode ran) scattered in place:
            # a row not taken gets an index past the batch and is dropped, so nothing reads the output (a
            # dynamic-update-slice whose update read the output's own rows copied the whole padded output: 41 us of
            # 652 at the probe's mixed batch, session 34 call 1)
            n = out_d.shape[1]
            rows_n = jnp.arange(n, dtype=jnp.int32)
            take = dec[:, None] & ~bad[:, None] & (rows_n[None, :] < q_lens[:, None])
            bidx = jnp.where(take, jnp.arange(b, dtype=jnp.int32)[:, None], jnp.int32(b))  # [B, n]
            out = out.at[bidx, rows_n[None, :]].set(out_d.astype(out.dtype), mode="drop")
            lse = lse.at[bidx[:, None, :], jnp.arange(hq, dtype=jnp.int32)[None, :, None], rows_n[None, None, :]].set(
                lse_d, mode="drop")
        return (out, lse) if return_lse else out
    k, v = _gather(k_pool, tbl), _gather(v_pool, tbl)
    _, cfg = resolve_chunk(_problem(q, pps * page, hkv), band, False)
    out, lse = fa_train.attention_lse(q, k, v, causal=True, scale=scale, q_offset=offs, q_lens=q_lens,
                                      kv_lens=kv_lens, window=band, interpret=interp, config=cfg)
    out, lse = seqlen.cut_padding(out, lse, q_lens, bad)
    return (out.astype(q.dtype), lse) if return_lse else out.astype(q.dtype)


def varlen_paged_attention(q, k_pool, v_pool, block_table, kv_lens, cu_q_lens, *, scale: float, q_offset=None,
                           interpret: bool | None = None, return_lse: bool = False, check_block_table: bool = True,
                           window: int | None = None, softcap: float | None = None, sinks=None,
                           decode_max_q: int | None = None):
    """Causal paged attention over packed queries (validated pools and tables; ``cu_q_lens`` int32 ``[B + 1]``): ``q [T,
    Hq, D]`` holds sequence ``b``'s queries in rows ``cu_q_lens[b] : cu_q_lens[b + 1]``, with no padding between
    sequences; rows past ``cu_q_lens[B]`` are unused (output 0, LSE -inf). Returns ``out [T, Hq, D]`` and, with
    ``return_lse``, ``lse [Hq, T]``. Semantics per sequence are ``chunked_paged_attention``'s (offsets default to
    ``kv_lens - q_lens``; window, soft-cap, sinks as fa_prefill's).

    How it runs (session 34, issue 32): the sequences of 1 to ``decode_max_q`` queries (None: fa_decode's 16) on
    fa_decode (their rows gathered into ``[B, decode_max_q]``, query-major row-limited tiles: ``_decode_part``; the
    part's partial outputs and their merge are sized by it, session 39); every longer one cut into row tiles of the
    fa_prefill config's rows (``R``: 128 at two consumers of 64), each tile a pseudo-sequence of ``R`` rows with its own
    offset and its sequence's block-table row, gathered into ``[NT, R, Hq, D]`` with ``NT = cdiv(T, R) + B`` (a static
    bound: each sequence wastes at most one partial tile); tiles past the real ones are empty (``q_lens`` 0: the
    kernel's consumers idle). So the kernel launches about ``T / R`` tiles per head, where the padded layout launches
    ``B * Tq / R``. The results are scattered back into the packed rows. fa_prefill reads the pages in the kernel (a
    Hopper; pages a multiple of 8 that divides or is divided by its key block) or, in interpret mode, gathers them;
    other cases (fp32, a head dim fa_prefill lacks, D 96, other pages) refuse by name."""
    from .kernels import fa_decode

    t_rows, hq, d = q.shape
    num_pages, page, hkv, _ = k_pool.shape
    b = block_table.shape[0]
    interp = _compat.default_interpret(interpret)
    if not uses_fa_prefill(jnp.dtype(q.dtype).name, d, interp):
        raise NotImplementedError(f"paged_attention_varlen runs fa_prefill (fp16 / bf16, D 64 / 128 / 256 on a Hopper, "
                                  f"or interpret mode); got {jnp.dtype(q.dtype).name}, D {d}")
    band = _window_band(window)
    cu = jnp.asarray(cu_q_lens)
    c = _concrete(cu)
    if c is not None and (c[0] != 0 or np.any(np.diff(c) < 0) or c[-1] > t_rows):
        raise ValueError(f"cu_q_lens must start at 0, never decrease and end at most at T={t_rows}; got "
                         f"{c.tolist() if c.size <= 16 else c}")
    q_lens = cu[1:] - cu[:-1]
    ql = _concrete(q_lens)
    offs, bad, tbl = _offsets_and_checks(q_lens, kv_lens, q_offset, block_table, num_pages=num_pages, page=page,
                                         check_block_table=check_block_table)
    # a layout that is not one (cu_q_lens not starting at 0, decreasing, or past T) poisons every row: no row belongs
    # to a sequence for sure
    no_layout = jnp.any(q_lens < 0) | (cu[-1] > t_rows) | (cu[0] != 0)
    bad = bad | no_layout
    n = fa_decode.KERNEL.max_q_len if decode_max_q is None else int(decode_max_q)
    if not 1 <= n <= fa_decode.KERNEL.max_q_len:
        raise ValueError(f"decode_max_q must be in [1, {fa_decode.KERNEL.max_q_len}]; got {n}")
    dec = (q_lens >= 1) & (q_lens <= n)
    # Each packed row p takes its value from the decode part or from its chunk's row tile: one gather-and-select
    # pass over the T rows (a zero-filled output with the parts scattered into it cost 95 us at the probe's mixes,
    # XLA's row scatter alone 82: session 34 call 4).
    p = jnp.arange(t_rows, dtype=jnp.int32)
    # the sequence of row p, as a compare-and-count (fuses into the gather below; jnp.searchsorted's loop of small
    # launches cost ~1 us each: call 5)
    seq_p = _segment_of(cu[1:], p)
    i_p = p - cu[seq_p]  # its index inside the sequence
    inside = p < cu[-1]
    # the output is assembled as 32-bit words where the rows allow it (``ROW_WORDS``: every operand of the select a
    # word, so the gathers stay fused into it), else element by element
    words = _row_words(q)
    wrap, unwrap = (_to_words, lambda x: _from_words(x, q.dtype, (hq, d))) if words else (lambda x: x, lambda x: x)
    nan_o = wrap(jnp.full((1, hq, d), jnp.nan, q.dtype))[0]
    out = jnp.broadcast_to(wrap(jnp.zeros((1, hq, d), q.dtype))[0], (t_rows,) + nan_o.shape)
    lse = jnp.broadcast_to(jnp.float32(-jnp.inf), (t_rows, hq))
    # the chunks first (skipped when concrete lengths hold none)
    if ql is None or np.any(ql > n):
        o_c, l_c, tile_of, r = _varlen_chunks(q, k_pool, v_pool, tbl, cu, q_lens, offs, dec, bad, scale=scale,
                                              interp=interp, band=band, softcap=softcap, sinks=sinks)
        take = inside & ~dec[seq_p] & (q_lens[seq_p] > 0)
        src = jnp.clip(tile_of[seq_p] * r + i_p, 0, o_c.shape[0] - 1)
        sel = (slice(None),) + (None,) * (out.ndim - 1)
        out = jnp.where(take[sel], wrap(o_c)[src], out)
        lse = jnp.where(take[:, None], l_c[src], lse)
    # the decodes: their first n rows (clamped into q), fa_decode's row-limited decode part (skipped when concrete
    # lengths hold none)
    if ql is None or np.any((ql >= 1) & (ql <= n)):
        rows_n = jnp.arange(n, dtype=jnp.int32)
        qd = q[jnp.clip(cu[:-1, None] + rows_n[None, :], 0, t_rows - 1)]
        out_d, lse_d = _decode_part(qd, k_pool, v_pool, tbl, kv_lens, offs, dec, q_lens, scale=scale,
                                    interpret=interp, window=window, softcap=softcap, sinks=sinks)
        take = inside & dec[seq_p]
        src = seq_p * n + jnp.clip(i_p, 0, n - 1)
        poisoned = bad[seq_p]
        sel = (slice(None),) + (None,) * (out.ndim - 1)
        out = jnp.where(take[sel], jnp.where(poisoned[sel], nan_o,
                                             wrap(out_d.reshape(b * n, hq, d).astype(q.dtype))[src]), out)
        lse = jnp.where(take[:, None], jnp.where(poisoned[:, None], jnp.nan,
                                                 jnp.swapaxes(lse_d, 1, 2).reshape(b * n, hq)[src]), lse)
    out = unwrap(jnp.where(no_layout, nan_o, out))  # (fuses into the pass above)
    lse = jnp.where(no_layout, jnp.nan, lse)
    return (out, lse.T) if return_lse else out


def _varlen_chunks(q, k_pool, v_pool, tbl, cu, q_lens, offs, dec, bad, *, scale, interp, band, softcap, sinks):
    """``varlen_paged_attention``'s chunks: row tiles of R rows, each a pseudo-sequence of fa_prefill's batch.
    Returns ``(out [NT * R, Hq, D], lse [NT * R, Hq], tile_of [B], R)``: the tiles' rows in order, and each
    sequence's first tile (its row i is tile row ``tile_of[b] * R + i``)."""
    from .kernels import fa_prefill

    t_rows, hq, d = q.shape
    _, page, hkv, _ = k_pool.shape
    b, pps = tbl.shape
    _, cfg = resolve_chunk(_problem(jax.ShapeDtypeStruct((1,) + q.shape, q.dtype), pps * page, hkv), band,
                           True)  # one long chunk's config
    fitted = fa_prefill.fit(cfg, d, jnp.dtype(q.dtype).itemsize, True)
    r = fitted.consumers * fitted.block_q
    if not interp and (not paged_in_kernel(page, fitted) or d not in fa_prefill._PAGED_HEAD_DIMS):
        raise NotImplementedError(f"paged_attention_varlen reads the pages in fa_prefill's kernel: pages a multiple of "
                                  f"8 that divides or is divided by its {fitted.block_kv}-key block, D in "
                                  f"{fa_prefill._PAGED_HEAD_DIMS}; got page {page}, D {d} (use paged_attention with "
                                  f"q_lens)")
    ql_pf = jnp.where(dec, 0, jnp.maximum(q_lens, 0))
    n_t = (ql_pf + r - 1) // r  # [B] row tiles a sequence needs
    ends = jnp.cumsum(n_t)
    nt = -(-t_rows // r) + b  # static bound on the tiles: each sequence wastes at most one partial tile
    j = jnp.arange(nt, dtype=jnp.int32)
    seq = _segment_of(ends, j)  # a tile's sequence
    k_t = j - (ends - n_t)[seq]  # the tile's index inside its sequence
    valid = j < ends[-1]
    rows_t = jnp.where(valid, jnp.clip(ql_pf[seq] - k_t * r, 0, r), 0).astype(jnp.int32)  # real rows of the tile
    tidx = cu[seq][:, None] + k_t[:, None] * r + jnp.arange(r, dtype=jnp.int32)[None, :]  # [NT, R]
    qt = _rows(q, jnp.clip(tidx, 0, t_rows - 1))
    off_t = jnp.where(valid, offs[seq] + k_t * r, 0).astype(jnp.int32)
    sinks_t = None if sinks is None else jnp.asarray(sinks, jnp.float32)
    out_t, lse_t = fa_prefill.forward(qt, k_pool, v_pool, causal=True, scale=scale, q_offset=off_t, interpret=interp,
                                      config=cfg, return_lse=True, window=band, softcap=softcap, sinks=sinks_t,
                                      block_table=tbl[seq], q_lens=rows_t, poison=bad[seq] & valid)
    return (out_t.reshape(nt * r, hq, d), jnp.swapaxes(lse_t, 1, 2).reshape(nt * r, hq),
            (ends - n_t).astype(jnp.int32), r)


def _row_words(x) -> bool:
    """Whether ``x [T, ...]``'s rows move as 32-bit words (``ROW_WORDS``, 16-bit rows of an even length)."""
    return ROW_WORDS and jnp.dtype(x.dtype).itemsize == 2 and int(np.prod(x.shape[1:])) % 2 == 0


def _to_words(x):
    """``[N, ...]`` 16-bit -> ``[N, W]`` uint32, two elements a word (a bitcast: no copy)."""
    return jax.lax.bitcast_convert_type(x.reshape(x.shape[0], -1, 2), jnp.uint32)


def _from_words(w, dtype, tail):
    """``_to_words``' inverse: ``[..., W]`` uint32 -> ``[..., *tail]`` of ``dtype``."""
    return jax.lax.bitcast_convert_type(w, dtype).reshape(tuple(w.shape[:-1]) + tuple(tail))


def _rows(x, idx):
    """``x[idx]`` for ``x [T, ...]``: whole rows, gathered as 32-bit words where ``_row_words`` says so (a bitcast
    each way), else element by element."""
    if not _row_words(x):
        return x[idx]
    return _from_words(_to_words(x)[idx], x.dtype, x.shape[1:])


def _segment_of(ends, idx):
    """int32: for each of ``idx``, the segment it falls in given the segments' ascending ends ``[B]`` (a
    compare-and-count, clamped to the last segment; ``jnp.searchsorted``'s loop of small launches cost ~1 us each,
    session 34 call 5)."""
    return jnp.minimum(jnp.sum(ends[None, :] <= idx[:, None], axis=1), ends.shape[0] - 1).astype(jnp.int32)


def _window_band(window):
    """fa_prefill's band ``(left, 0)`` of a causal window of ``window`` keys (None: no window), the window checked."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be a positive int (keys a query sees, itself included); got {window!r}")
    return int(window) - 1, 0


def _offsets_and_checks(q_lens, kv_lens, q_offset, block_table, *, num_pages: int, page: int,
                        check_block_table: bool):
    """``(offsets [B], bad [B], clamped table)`` of a chunked call: the offsets (``kv_lens - q_lens`` by default), the
    sequences to poison, and the table with every entry clamped into the pool (a kernel never reads out of bounds; a
    bad entry poisons its sequence). A real row ``i < q_len`` sits at ``i + offset``: past the cache (``offset +
    q_len > kv_len``) it would see keys that are not there; concrete arrays raise, traced ones poison that sequence
    (no silent wrong answer); so do lengths the table cannot hold and (``check_block_table``) page indices outside
    the pool."""
    from .kernels import common, kv_source

    b, pps = block_table.shape
    offs = kv_lens - q_lens if q_offset is None else seqlen.q_offsets(q_offset, b)
    ql, kl, of = _concrete(q_lens), _concrete(kv_lens), _concrete(offs)
    if ql is not None and kl is not None and of is not None and np.any(of + ql > kl):
        i = int(np.argmax(of + ql > kl))
        raise ValueError(f"sequence {i}: q_offset + q_lens = {int(of[i] + ql[i])} exceeds kv_lens = {int(kl[i])} (a "
                         f"chunk's queries sit on cached positions: q_offset <= kv_lens - q_lens)")
    bad = (offs + q_lens > kv_lens) | (kv_lens < 0) | (kv_lens > pps * page)
    if check_block_table:
        common.validate_table_if_concrete(kv_source.validate_block_table, block_table, kv_lens,
                                          num_pages=num_pages, page_size=page)
        used = jnp.arange(pps, dtype=jnp.int32)[None, :] < ((kv_lens + page - 1) // page)[:, None]
        bad = bad | jnp.any(used & ((block_table < 0) | (block_table >= num_pages)), axis=1)
    return offs, bad, jnp.clip(block_table, 0, num_pages - 1)


def _decode_rows(q_lens, tq: int):
    """bool ``[B]``: the sequences with 1 to fa_decode's 16 queries (None when there are none, known eagerly)."""
    from .kernels import fa_decode

    n = fa_decode.KERNEL.max_q_len
    if tq <= n:
        return None
    ql = _concrete(q_lens)
    if ql is not None and not np.any((ql > 0) & (ql <= n)):
        return None
    return (q_lens > 0) & (q_lens <= n)


def _decode_part(q, k_pool, v_pool, tbl, kv_lens, offs, dec, q_lens, *, scale, interpret, window, softcap, sinks):
    """fa_decode over the first ``n = min(Tq, 16)`` rows of the decoding sequences (the others get no key: nothing
    read): ``(out [B, n, Hq, D], lse [B, Hq, n])``."""
    from .kernels import fa_decode

    qd = q[:, :fa_decode.KERNEL.max_q_len]
    _, cfg = api.resolve("fa_decode", api.problem_paged(qd, k_pool, tbl, causal=True), None)  # the one resolver
    # 16-row tiles of query-major rows (q_rows): a plain decode's program runs its first tile and its other tiles
    # read no key (session 34: the 16 rows a sequence as one 64-row tile took 97 us where the same two decodes called
    # alone, one query each, took 54)
    cfg = dataclasses.replace(cfg, splits=decode_part_splits(qd.shape, k_pool.shape, tbl.shape[1], dec, cfg),
                              split1_fill=None, block_m_max=16)
    kv_d = jnp.where(dec, kv_lens, 0).astype(jnp.int32)
    off_d = jnp.where(dec, offs, 0).astype(jnp.int32)
    return fa_decode.paged_forward(qd, k_pool, v_pool, tbl, kv_d, causal=True, scale=scale, q_offset=off_d,
                                   interpret=interpret, config=cfg, return_lse=True,
                                   check_block_table=False, window=window, softcap=softcap, sinks=sinks,
                                   q_rows=jnp.where(dec, q_lens, 0).astype(jnp.int32))


def decode_part_splits(q_shape, pool_shape, pages_per_seq: int, dec, cfg) -> int:
    """The split count of a mixed batch's decode part. fa_decode's wave model plans for every sequence of the batch
    at the full cache, but only the decoding ones have keys there (the others get ``kv_len`` 0 and their programs
    exit at once): at session 34's probe mix (B 4, two decodes over 8k and 32k) it gave 8 splits of 4096 keys, and
    the part took 108 us against 54 for the two decodes called alone (call 1). So the plan is made for the decoding
    sequences only, one query each: their count when ``q_lens`` is concrete, else (traced) half the batch, rounded
    up; a wrong guess costs programs that are too long (fewer decodes than guessed: at worst half the machine idle)
    or too many short ones (more decodes than guessed). Session 36 measured the two other guesses at the probe's
    mixes (H200, `results/gpu_runs/20261128_s36_h200_call1_nvfp4_occ_varlen_words/`): one decode (32 splits) left the
    partial kernel as it was and tripled the merge (+11-21 us); the whole batch (4 splits) cost 35-65 us."""
    from .kernels import fa_decode

    b, _, hq, d = q_shape
    _, page, hkv, _ = pool_shape
    n = _concrete(dec)
    guess = int(np.count_nonzero(n)) if n is not None else -(-b // 2)
    # one query a decoding sequence (a plain decode: its first 16-row tile; a speculative one's further tiles come
    # on top of the plan)
    return fa_decode.plan(batch=max(guess, 1), hkv=hkv, rows=hq // hkv, d=d, max_kv=pages_per_seq * page,
                          config=cfg, page_size=page).splits


def _gather(pool, tbl):
    """``[B, pages_per_seq * page, Hkv, D]``: each sequence's pages in order (one XLA gather)."""
    b, pps = tbl.shape
    return pool[tbl].reshape((b, pps * pool.shape[1]) + tuple(pool.shape[2:]))


def paged_in_kernel(page: int, cfg) -> bool:
    """Whether fa_prefill reads this page size through the table itself (``PAGED_IN_KERNEL`` on, the page a multiple
    of 8 that divides or is divided by the config's ``block_kv``); else the pages are gathered first."""
    bkv = cfg.block_kv
    return PAGED_IN_KERNEL and page % 8 == 0 and (page % bkv == 0 or bkv % page == 0)


def _problem(q, kv_len: int, hkv: int):
    from .kernels.contract import Problem

    return Problem(entry="dense", dtype=jnp.dtype(q.dtype).name, batch=q.shape[0], q_len=q.shape[1],
                   kv_len=kv_len, heads_q=q.shape[2], heads_kv=hkv, head_dim=q.shape[3], causal=True)
