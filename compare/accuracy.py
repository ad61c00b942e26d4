"""Agreement: every output against the float64 oracle (``attn_core.oracle``), and twin against twin.

The oracle is float64, which is too slow for the full output at real shapes, so it is computed on a *subset of
rows*, over **every batch element and every query head** (a kernel that indexes one batch or head wrong is caught
wherever it sits): all query rows when there are at most ``max_rows`` and the work fits ``max_macs``, else a seeded
sample of row ranges that always holds the first and the last rows (the last see the most keys under a causal
mask). Only when one row over every (batch, head) is already more than ``max_macs`` are batches and heads sampled
too (seeded, first and last always in). Every implementation is compared on the same subset; the record names it
(``agreement.subset``). Twins (Pallas and CUDA of one generation) are compared on the full output, on the device.

Where the float64 math runs (``ORACLE_NOTE``): a workload on a dense cache (16-bit, or quantized and dequantized
exactly) or on a 16-bit paged one (through its dense view, after ``_check_pools`` proved the pools hold the same
values), its features (window, soft-cap, sinks, packed documents) included, in float64 numpy on the host, one pass
over the subset (``_dense_oracle_f64``: session 25; slicing the inputs on the GPU op by op compiled a program each,
and the same math as one XLA program took 1.5-3.2 s of GPU compile a workload; numpy compiles nothing and its BLAS
products beat XLA's CPU float64 ones), checked against attn_core.oracle's numpy (features passed through) on the first
sampled batch, KV head and row range; a 16-bit MLA latent the same way (keys the latent, values its first
``kv_lora_rank`` columns, its pool checked against the dense latent); paged quantized caches and quantized MLA latents
with attn_core.oracle's numpy on the host CPU.

Workload features (window, soft-cap, sinks, packed documents) reach the oracle with the workload's own inputs
(``feature_kwargs``: the sink logits of the sampled heads, the segment ids of the sampled rows). A train workload
also checks the gradients: ``dq``, ``dk``, ``dv`` of ``sum(out * w)`` on one batch row and one KV head with its
group of query heads (``choose_grad_subset``: every row and key, or at long causal sequences the last rows and the
keys only they see, which they fully determine), against ``attn_core.oracle.attention_grad_reference``'s math
(``grad_oracle``): numpy on the host, from copies of the subset's inputs as stored (seconds on the CPU at 32k tokens
per batch).

Errors: ``max_abs_err = max |out - ref|`` and ``rel_l2_err = ||out - ref||_2 / ||ref||_2``. A non-finite
value anywhere in the full output fails the record before any error is computed (NaN never passes).
``tolerance(precision)`` is compare's verdict threshold on ``rel_l2_err`` (status ``ok`` vs ``wrong``),
from the compute precision: a correct fp32 kernel lands far under 1e-3, one whose matmuls ran in TF32 near
3e-4, bf16 operands between 1e-3 and 1e-2 (docs/compare.md, "Agreement"); the tests own the strict
per-kernel tolerances.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from attn_core import oracle as reference

# The oracle's host-only sections (numpy on copies already on the host) run inside ``_host_only()``. The runner of a
# ``--jobs`` lane sets it (``host_sections``) to give up its shared GPU lock there, so a lane waiting to time does not
# wait for another lane's float64 arithmetic (session 26: lanes waited most of their time behind such sections).
_HOST_ONLY: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


@contextlib.contextmanager
def host_sections(factory: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """Within this block, the oracle's host-only sections run inside ``factory()`` (e.g. a lane's lock released)."""
    global _HOST_ONLY
    prev, _HOST_ONLY = _HOST_ONLY, factory
    try:
        yield
    finally:
        _HOST_ONLY = prev


# Seconds this thread spent in the oracle's host-only numpy (``_host_only``) and in copying its inputs to the host
# (``_to_host``), for ``metrics.phase_s.oracle_host`` / ``oracle_fetch`` (session 27: the oracle was 35% of a lane's
# workload time, and which half was not known).
_SECONDS = threading.local()


def seconds(kind: str) -> float:
    """This thread's total seconds so far of ``kind``: "host" (the oracle's numpy) or "fetch" (its copies to host)."""
    return getattr(_SECONDS, kind, 0.0)


def _add_seconds(kind: str, t0: float) -> None:
    setattr(_SECONDS, kind, seconds(kind) + (time.perf_counter() - t0))


@contextlib.contextmanager
def _host_only() -> Iterator[None]:
    with _HOST_ONLY():  # a lane's lock is given up here and taken again after: that wait is not counted
        t0 = time.perf_counter()
        try:
            yield
        finally:
            _add_seconds("host", t0)


def _to_host(*xs) -> tuple[np.ndarray, ...]:
    """Host copies (``np.asarray``) of the given device arrays, the seconds counted as "fetch"."""
    t0 = time.perf_counter()
    try:
        return tuple(np.asarray(x) for x in xs)
    finally:
        _add_seconds("fetch", t0)

__all__ = ["Subset", "choose_subset", "oracle", "quantization_error", "errors", "twin_errors", "all_finite",
           "tolerance", "TOLERANCE", "GradSubset", "choose_grad_subset", "grad_oracle", "feature_kwargs"]

# Verdict thresholds on rel_l2 by compute precision (the implementation's declared operand precision, as
# recorded in prediction.precision).
TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2, "bf16": 2e-2, "fp8": 5e-2, "nvfp4": 1e-1, "int8": 5e-2}


def tolerance(precision: str) -> float:
    try:
        return TOLERANCE[precision]
    except KeyError:
        raise ValueError(f"no tolerance for precision {precision!r}; known: {sorted(TOLERANCE)}") from None


@dataclasses.dataclass(frozen=True)
class Subset:
    batches: tuple[int, ...]
    heads: tuple[int, ...]  # query heads
    rows: tuple[tuple[int, int], ...]  # half-open query-row ranges

    def describe(self) -> dict[str, Any]:
        return {"batches": list(self.batches), "heads_q": list(self.heads),
                "rows": [list(r) for r in self.rows], "oracle": ORACLE_NOTE}

    def take(self, out_btnh: Any) -> np.ndarray:
        """The subset of a BTNH output as float64 numpy ``[nb, nrows, nh, D]`` (gathered on the device)."""
        rows = np.concatenate([np.arange(r0, r1) for r0, r1 in self.rows])
        if isinstance(out_btnh, np.ndarray):  # host (e.g. float64 oracle): stay in numpy, keep precision
            return out_btnh[list(self.batches)][:, rows][:, :, list(self.heads)].astype(np.float64)
        x = jnp.asarray(out_btnh)
        sub = x[jnp.asarray(self.batches)][:, jnp.asarray(rows)][:, :, jnp.asarray(self.heads)]
        return reference.to_f64(sub)

    def take_checked(self, out_btnh: Any) -> tuple[bool, np.ndarray]:
        """``(every value of the output finite, take(out))``; a device output in one compiled program a shape
        (``_finite_and_take``: session 25, the finite check and the three gathers compiled a program each, ~2 s of a
        sweep workload's first agreement on a GPU), only the subset to the host."""
        if isinstance(out_btnh, np.ndarray):
            return all_finite(out_btnh), self.take(out_btnh)
        finite, sub = _finite_and_take(jnp.asarray(out_btnh), batches=tuple(self.batches),
                                       rows=tuple(tuple(r) for r in self.rows), heads=tuple(self.heads))
        return bool(finite), reference.to_f64(np.asarray(sub))


def compile_checks(w) -> int:
    """Compile the agreement's programs for ``w`` from shapes alone (no device work): ``_finite_and_take`` for the
    output as most implementations give it (``[B, Tq, Hq, Dv]`` in the workload dtype) and, for a train workload,
    ``_grads_finite_and_take``; the number compiled. A runner does it off the GPU lock (a ``--jobs`` lane), so the
    first agreement of a workload runs a compiled program; an output of another dtype or shape compiles at its
    agreement as before."""
    dv = int(w.kv_lora_rank) if w.family == "mla" else int(w.head_dim)
    dt = jnp.dtype(w.dtype)
    sub = choose_subset(w)
    out = jax.ShapeDtypeStruct((w.batch, w.q_len, w.heads_q, dv), dt)
    _finite_and_take.lower(out, batches=tuple(sub.batches), rows=tuple(tuple(r) for r in sub.rows),
                           heads=tuple(sub.heads)).compile()
    if w.family != "train":
        return 1
    gs = choose_grad_subset(w)
    q = jax.ShapeDtypeStruct((w.batch, w.q_len, w.heads_q, w.head_dim), dt)
    kv = jax.ShapeDtypeStruct((w.batch, w.kv_len, w.heads_kv, w.head_dim), dt)
    _grads_finite_and_take.lower(q, kv, kv, batch=gs.batch, kv_head=gs.kv_head, heads=tuple(gs.heads),
                                 rows=tuple(gs.rows), keys=tuple(gs.keys)).compile()
    return 2


@functools.partial(jax.jit, static_argnames=("batches", "rows", "heads"))
def _finite_and_take(x, *, batches: tuple, rows: tuple, heads: tuple):
    """``all(isfinite(x))`` and ``x[batches][:, rows][:, :, heads]`` (rows: half-open ranges) of a BTNH array."""
    ridx = np.concatenate([np.arange(r0, r1) for r0, r1 in rows])
    sub = jnp.take(jnp.take(jnp.take(x, jnp.asarray(batches), axis=0), jnp.asarray(ridx), axis=1),
                   jnp.asarray(heads), axis=2)
    return jnp.isfinite(x).all(), sub


ORACLE_NOTE = ("float64. Dense caches (16-bit, or quantized and dequantized exactly on the device) and 16-bit paged "
               "caches (through their dense view, the pools checked value by value against it), window, soft-cap, "
               "sinks and packed documents included: float64 numpy on the host, one pass over the subset "
               "(_dense_oracle_f64, the inputs copied from the device), checked against attn_core.oracle (numpy, CPU) "
               "on the first sampled batch, KV head and row range; a 16-bit MLA latent the same way (its pool checked "
               "against the dense latent); paged quantized caches and quantized MLA latents: attn_core.oracle "
               "(numpy, CPU)")

GRAD_ORACLE_NOTE = ("float64: attn_core.oracle.attention_grad_reference (numpy, CPU) on copies of the subset's "
                    "inputs as stored, the workload's features passed through")


def _sample(n: int, k: int, rng: np.random.Generator) -> tuple[int, ...]:
    """``k`` of ``range(n)``, sorted, always holding 0 and n - 1."""
    if k >= n:
        return tuple(range(n))
    ends = {0, n - 1}
    rest = rng.choice(np.arange(1, n - 1), size=max(0, k - len(ends)), replace=False) if n > 2 else []
    return tuple(sorted(ends | {int(x) for x in rest}))


def _row_ranges(tq: int, n: int, rng: np.random.Generator) -> tuple[tuple[int, int], ...]:
    """About ``n`` of ``tq`` rows as up to four disjoint ranges: the first, the last, two seeded between."""
    if n >= tq:
        return ((0, tq),)
    c = max(1, n // 4)
    starts = {0, tq - c}
    between = min(2, max(0, n // c - 2))  # ranges between the first and the last, within about n rows
    if between and tq - 2 * c > c:
        starts |= {int(x) for x in rng.integers(c, tq - 2 * c + 1, size=between)}
    out: list[list[int]] = []
    for s0 in sorted(starts):
        if out and s0 <= out[-1][1]:
            out[-1][1] = max(out[-1][1], s0 + c)
        else:
            out.append([s0, s0 + c])
    return tuple((a, min(b, tq)) for a, b in out)


def choose_subset(w, *, max_rows: int = 256, max_macs: float = 2e9, seed: int = 0) -> Subset:
    """Every batch and query head, the rows sampled to keep the float64 oracle under ``max_macs``."""
    rng = np.random.default_rng(seed)
    per_row = w.batch * w.heads_q * w.kv_len * w.head_dim  # multiply-adds of QK^T for one row everywhere
    batches, heads = tuple(range(w.batch)), tuple(range(w.heads_q))
    if per_row > max_macs:  # even one row everywhere is too much: sample batches and heads too
        share = max_macs / per_row
        batches = _sample(w.batch, max(2, int(np.ceil(w.batch * np.sqrt(share)))), rng)
        heads = _sample(w.heads_q, max(2, int(np.ceil(w.heads_q * np.sqrt(share)))), rng)
        n_rows = 2
    else:
        n_rows = int(min(w.q_len, max_rows, max(2, max_macs // per_row)))
    return Subset(batches, heads, _row_ranges(w.q_len, n_rows, rng))


def oracle(w, inp, subset: Subset, *, kv: str = "storage") -> np.ndarray:
    """float64 reference output on ``subset``: ``[nb, nrows, nh, D]``.

    Quantized MLA latents and paged quantized caches aside: ``_dense_oracle``, float64 numpy on the host in one pass
    over the subset (a dense cache as stored or dequantized exactly; a 16-bit paged cache through its dense view, the
    pools checked value by value against it; the workload's features included), checked against attn_core.oracle's
    numpy. A paged quantized cache: attn_core.oracle's numpy on the host, row range by row range with ``q_offset``
    shifted by the range start (so causal masks stay exact), its keys gathered through the block table from the pools
    (so paging is checked too), ``q_offset = kv_len[b] - Tq`` per sequence as the paged contract says, rows with a
    feature with the workload's feature inputs (``feature_kwargs``). A quantized MLA latent: ``_mla_oracle``.

    ``kv``: ``"storage"`` (default) is the cache the kernels read: for a quantized-KV workload (``kv_dtype``)
    that is the quantized cache itself (``inp.k_quant`` or the quantized pools), dequantized exactly
    (``pallas_attn.quant``, byte-identical to ``attn_core.formats``), so this is
    ``attn_core.oracle.quantized_attention_reference`` on those rows: the kernel is judged on its arithmetic,
    not on the format's error. ``"fp16"``: the values in the workload dtype the cache was quantized from (the
    dense ``inp.k``/``inp.v``), for the quantization error (``quantization_error``).
    """
    if kv not in ("storage", "fp16"):
        raise ValueError(f"kv must be 'storage' or 'fp16'; got {kv!r}")
    if w.family == "mla":
        if getattr(inp, "kv_dtype", None) is None or kv == "fp16":  # the 16-bit latent: the one-program oracle
            return _dense_oracle(w, inp, subset, mla=True)
        return _mla_oracle(w, inp, subset, kv)
    quant = kv == "storage" and getattr(inp, "kv_dtype", None) is not None
    paged_quant = w.family == "paged_decode" and getattr(inp, "kv_dtype", None) is not None
    if not paged_quant and w.kv_len > 0 and subset.batches and subset.rows:
        return _dense_oracle(w, inp, subset, quant=quant)
    # what is left runs on the host with attn_core.oracle's numpy: a paged quantized cache (its fp16 dense view for
    # kv="fp16"), with or without features
    g = w.heads_q // w.heads_kv
    if list(subset.heads) == list(range(w.heads_q)):  # every head: K/V as they are (the oracle maps GQA)
        kv_heads = list(range(w.heads_kv))
    else:  # a sample of heads: each gets its own KV head (expanded), so the oracle sees Hq == Hkv
        kv_heads = [h // g for h in subset.heads]
    outs = []
    for b in subset.batches:
        qb = reference.to_f64(inp.q[b:b + 1][:, :, jnp.asarray(subset.heads)])  # [1, Tq, nh, D]
        ku, vu, base_offset, hmap = _kv_heads_of_batch(w, inp, b, kv_heads, quant)
        # the K/V column each query head of the subset reads (every head: the oracle's GQA map, head h -> h // g)
        qmap = hmap if len(hmap) == len(subset.heads) else [hmap[h // g] for h in subset.heads]
        expanded = None
        parts = []
        for r0, r1 in subset.rows:
            feats = feature_kwargs(w, inp, b, subset.heads, (r0, r1))
            if not feats and (not w.causal or r1 - r0 == 1) and ku.shape[1] > 0:
                # each KV head once, its query heads folded into rows: no K/V copy per query head (session 17: the
                # per-head copies were ~90% of the oracle's time at sampled heads, ~40 s a large decode workload)
                parts.append(_reference_rows_grouped(qb[:, r0:r1], ku, vu, qmap, causal=w.causal, scale=inp.scale,
                                                     q_offset=base_offset + r0))
                continue
            if expanded is None:
                expanded = (reference.to_f64(ku)[:, :, hmap], reference.to_f64(vu)[:, :, hmap])
            parts.append(_reference_rows(qb[:, r0:r1], *expanded, causal=w.causal, scale=inp.scale,
                                         q_offset=base_offset + r0, **feats))
        outs.append(np.concatenate(parts, axis=1))
    return np.concatenate(outs, axis=0)


def _reference_rows_grouped(q, k, v, hmap, *, causal: bool, scale: float, q_offset: int) -> np.ndarray:
    """``attention_reference`` on ``q [1, n, nh, D]`` whose head ``i`` reads KV head ``hmap[i]`` of ``k, v
    [1, Tk, nu, D]`` (any float dtype: each KV head is converted to float64 on its own, in one pass), computed once
    per KV head with its query heads folded into rows: the same float64 math per row as ``_reference_rows`` on
    ``k[:, :, hmap]`` without that copy. Non-causal, or causal with one row (which sees keys ``<= q_offset``: the
    non-causal problem on those keys)."""
    n, d = q.shape[1], q.shape[3]
    if causal:
        if n != 1:
            raise ValueError("grouped rows: causal needs one query row per call")
        k, v = k[:, : max(0, q_offset + 1)], v[:, : max(0, q_offset + 1)]
    hmap = np.asarray(hmap)
    out = np.empty(q.shape[:3] + (v.shape[3],), np.float64)
    kt, vt = (np.ascontiguousarray(np.moveaxis(x[0], 1, 0)) for x in (k, v))  # head-major [nu, Tk, D], stored dtype
    for u in np.unique(hmap):
        idx = np.nonzero(hmap == u)[0]
        qj = np.asarray(q[:, :, idx]).transpose(0, 2, 1, 3).reshape(1, len(idx) * n, 1, d)
        oj, _ = reference.attention_reference(qj, kt[u].astype(np.float64)[None, :, None],
                                              vt[u].astype(np.float64)[None, :, None], scale=scale)
        out[:, :, idx] = oj.reshape(1, len(idx), n, -1).transpose(0, 2, 1, 3)
    return out


def _head_groups(heads: tuple[int, ...], group: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """The subset's query heads by the KV head they read (``h // group``), as ``((kv_head, (positions in heads)),
    ...)``, every group padded to the largest by repeating its first member (the program wants one shape; the caller
    reads each position once)."""
    by: dict[int, list[int]] = {}
    for i, h in enumerate(heads):
        by.setdefault(h // group, []).append(i)
    m = max(len(v) for v in by.values())
    return tuple((u, tuple(v + [v[0]] * (m - len(v)))) for u, v in sorted(by.items()))


def _dense_oracle_f64(q, k, v, q_offs, kv_valid, sinks=None, segs=None, *, batches: tuple, rows: tuple, heads: tuple,
                      groups: tuple, causal: bool, scale: float, window=None, softcap: float | None = None,
                      v_width: int | None = None):
    """The whole dense oracle of a workload in float64 numpy on the host, BLAS matrix products (session 25: the same
    math as one XLA program took 1.5-3.2 s of XLA's GPU compile a workload on an H100, compiled for the CPU
    0.4-0.6 s and ran its float64 products at a quarter of numpy's BLAS speed; numpy compiles nothing). For each
    batch of ``batches``, the rows ``rows`` (half-open ranges; in the i-th sampled batch row ``r`` is at position
    ``q_offs[i] + r`` and keys ``j < kv_valid[i]`` exist: a paged cache's ragged lengths) of the query heads
    ``heads`` against their KV heads (``groups``, ``_head_groups``; a group's query heads folded into the rows of one
    product), with ``attn_core.oracle.attention_reference``'s math in its order: ``(q k^T) * scale``, soft-capped
    (``softcap * tanh(s / softcap)``), then attn_core's own mask (``visible_mask``: causal, ``window``, packed
    documents ``segs``) and softmax (``masked_softmax``, the head's sink logit ``sinks [Hq]`` in it), ``p V`` (MLA:
    ``v_width``, the latent's first columns). Arrays may be JAX or numpy (read to the host
    once each, as stored). Returns ``(out [nb, R, n_groups, m, Dv], q0 [n0, m, D], k0 [Tk, D], v0 [Tk, Dv])``: the
    output and, for ``_check_dense_oracle``, the first batch's first group as stored (its first range's rows)."""
    q, k, v = _to_host(q, k, v)  # the device copies; what follows is the host's alone
    q_offs, kv_valid = np.asarray(q_offs, np.int64), np.asarray(kv_valid, np.int64)
    sinks = None if sinks is None else reference.to_f64(sinks)
    segs = None if segs is None else np.asarray(segs)
    with _host_only():
        return _dense_oracle_f64_host(q, k, v, q_offs, kv_valid, sinks, segs, batches=batches, rows=rows, heads=heads,
                                      groups=groups, causal=causal, scale=scale, window=window, softcap=softcap,
                                      v_width=v_width)


# Threads the host part of the dense oracle runs its (batch, KV head group) products on (``set_host_threads``; each
# product single-threaded in BLAS, numpy releasing the GIL in its conversions and products; the result is the same
# bit for bit at any count). 1 unless the runner sets it: a lane of K on an N-core host gets N // (2 K) (session 30:
# a large decode workload's oracle spent 6.8 s of numpy on one thread in the sweep's second stage, two lanes on
# sixteen cores).
_HOST_THREADS = 1


def set_host_threads(n: int) -> None:
    """How many threads the dense oracle's host products use (>= 1)."""
    global _HOST_THREADS
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"host threads must be an int >= 1; got {n!r}")
    _HOST_THREADS = n


def host_threads() -> int:
    return _HOST_THREADS


@contextlib.contextmanager
def threads(n: int) -> Iterator[None]:
    """Within this block the dense oracle's host products use ``n`` threads (``set_host_threads``), restored after."""
    prev = _HOST_THREADS
    set_host_threads(n)
    try:
        yield
    finally:
        set_host_threads(prev)


def _dense_oracle_f64_host(q, k, v, q_offs, kv_valid, sinks, segs, *, batches, rows, heads, groups, causal, scale,
                           window, softcap, v_width):
    """``_dense_oracle_f64`` on host arrays (numpy only); the (batch, group) products on ``host_threads()``
    threads, each writing its own slice of the output."""
    if v_width is not None:  # MLA: the values are the latent's first ``v_width`` columns
        v = v[..., :v_width]
    ridx = np.concatenate([np.arange(r0, r1) for r0, r1 in rows])
    n_rows = len(ridx)
    hs = np.array([[heads[i] for i in pos] for _, pos in groups])  # [n_groups, m] query heads
    m = hs.shape[1]
    out = np.empty((len(batches), n_rows, len(groups), m, v.shape[-1]), np.float64)
    per_batch = []
    for bi, b in enumerate(batches):
        n, off = int(kv_valid[bi]), int(q_offs[bi])
        # attn_core's own rules (visible_mask, range by range: the rows are sampled ranges) and softmax
        # (masked_softmax); only the products are grouped here
        visible = np.concatenate([reference.visible_mask(
            1, r1 - r0, n, causal=causal, q_offset=off + r0, kv_len=None, window=window,
            q_segments=None if segs is None else segs[b:b + 1, r0:r1],
            kv_segments=None if segs is None else segs[b:b + 1, :n])[0, 0] for r0, r1 in rows])  # [R, n]
        per_batch.append((b, n, visible, q[b, ridx].astype(np.float64)))  # qb: [R, Hq, D]

    def product(bi: int, gi: int) -> None:
        b, n, visible, qb = per_batch[bi]
        u = groups[gi][0]
        ku, vu = k[b, :n, u].astype(np.float64), v[b, :n, u].astype(np.float64)  # [n, D], [n, Dv]
        qg = qb[:, hs[gi]].transpose(1, 0, 2).reshape(m * n_rows, -1)  # [m * R, D]: the group's heads as rows
        sc = ((qg @ ku.T) * scale).reshape(m, n_rows, n)
        if softcap is not None:
            sc = softcap * np.tanh(sc / softcap)
        sink = None if sinks is None else sinks[hs[gi]][:, None, None]  # [m, 1, 1]
        p, *_ = reference.masked_softmax(sc, visible[None], sink)
        out[bi, :, gi] = (p.reshape(m * n_rows, n) @ vu).reshape(m, n_rows, -1).transpose(1, 0, 2)

    items = [(bi, gi) for bi in range(len(batches)) for gi in range(len(groups))]
    if _HOST_THREADS > 1 and len(items) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(_HOST_THREADS, len(items)), thread_name_prefix="oracle") as pool:
            for f in [pool.submit(product, bi, gi) for bi, gi in items]:
                f.result()  # an error in any product raises here
    else:
        for bi, gi in items:
            product(bi, gi)
    b0, (r0, r1) = batches[0], rows[0]
    u0 = int(groups[0][0])
    return out, q[b0, r0:r1][:, hs[0]], k[b0, :, u0], v[b0, :, u0]


def _dense_oracle(w, inp, subset: Subset, *, quant: bool = False, mla: bool = False) -> np.ndarray:
    """The oracle of a workload (``oracle``'s path for all but quantized MLA latents and paged quantized caches) in
    one pass of float64 numpy (``_dense_oracle_f64``; window, soft-cap, sinks and packed documents as the workload has
    them; a 16-bit MLA latent as keys and its first ``kv_lora_rank`` columns as values): a dense 16-bit cache as stored;
    a quantized dense cache (``quant``) dequantized once on the device (exactly, ``interop.dequantized``); a paged
    16-bit cache through its dense view ``inp.k`` / ``inp.v`` (the pools hold the same values: ``_check_pools`` proves
    it for every sequence) with each sequence's length and offset ``kv_len - Tq`` (the paged contract). The result
    ``[nb, nrows, nh, Dv]``, checked against attn_core's numpy oracle on the first sampled batch, first KV head and
    first row range (``_check_close``: a mismatch raises)."""
    from . import interop

    g = w.heads_q if mla else w.heads_q // w.heads_kv  # MLA: one latent head for every query head
    groups = _head_groups(tuple(subset.heads), g)
    k, v = (interop.dequantized(inp.k_quant), interop.dequantized(inp.v_quant)) if quant else (inp.k, inp.v)
    v_width = int(inp.kv_lora_rank) if mla else None
    if w.family in ("paged_decode", "mla"):
        if getattr(inp, "kv_dtype", None) is not None:
            pass  # kv="fp16" on a quantized cache: the dense values the pool was quantized from; no pool to compare
        elif mla:  # the latent pool (16-bit) holds the dense latent's values, read through the table
            _check_pools(inp, k_pool=inp.latent_pool, v_pool=inp.latent_pool)
        else:
            _check_pools(inp)
        lens = np.asarray(inp.kv_lens, np.int64)[list(subset.batches)]
        q_offs, kv_valid = lens - w.q_len, lens
    else:
        q_offs = np.full(len(subset.batches), int(w.q_offset), np.int64)
        kv_valid = np.full(len(subset.batches), int(w.kv_len), np.int64)
    window = getattr(w, "window", None)
    window = tuple(window) if isinstance(window, (list, tuple)) else (None if window is None else int(window))
    softcap = None if getattr(w, "softcap", None) is None else float(w.softcap)
    sinks = inp.sinks if getattr(w, "sinks", False) else None
    segs = inp.segment_ids if getattr(w, "packed", False) else None
    out, q0, k0, v0 = _dense_oracle_f64(inp.q, k, v, q_offs, kv_valid, sinks, segs, batches=tuple(subset.batches),
                                        rows=tuple(tuple(r) for r in subset.rows), heads=tuple(subset.heads),
                                        groups=groups, causal=bool(w.causal), scale=float(inp.scale), window=window,
                                        softcap=softcap, v_width=v_width)
    nb, n_rows = out.shape[0], out.shape[1]
    n_keys = int(kv_valid[0])
    b0, (r0, r1) = subset.batches[0], subset.rows[0]
    feats = {"window": window, "softcap": softcap}
    if sinks is not None:
        feats["sinks"] = reference.to_f64(sinks)[[subset.heads[i] for i in groups[0][1]]]
    if segs is not None:
        seg = np.asarray(segs)[b0:b0 + 1]
        feats["q_segments"], feats["kv_segments"] = seg[:, r0:r1], seg[:, :n_keys]
    with _host_only():  # q0, k0, v0 came back as host arrays
        res = np.empty((nb, n_rows, len(subset.heads), out.shape[-1]), np.float64)
        for gi, (_, pos) in enumerate(groups):
            for j, i in enumerate(pos):
                res[:, :, i] = out[:, :, gi, j]
        _check_dense_oracle(out, np.asarray(q0), np.asarray(k0)[:n_keys], np.asarray(v0)[:n_keys], rows=(r0, r1),
                            causal=bool(w.causal), scale=float(inp.scale), q_offset=int(np.asarray(q_offs)[0]),
                            **feats)
    return res


@jax.jit
def _pool_mismatches(k, v, k_pool, v_pool, table, kv_lens):
    """How many stored values of the sequences' keys and values (``j < kv_lens[b]``) differ between the dense view
    ``k, v [B, Tk, H, D]`` and the pools read through the block table (``pool[table[b, j // page], j % page]``)."""
    tk = k.shape[1]
    page = k_pool.shape[1]
    j = jnp.arange(tk)
    idx = jnp.take(table, jnp.minimum(j // page, table.shape[1] - 1), axis=1)  # [B, Tk] page of each key
    valid = j[None, :] < kv_lens[:, None]
    bad = 0
    for dense, pool in ((k, k_pool), (v, v_pool)):
        got = pool[jnp.where(valid, idx, 0), (j % page)[None, :]]  # [B, Tk, H, D]
        same = (got == dense) | (jnp.isnan(got) & jnp.isnan(dense))
        bad = bad + jnp.sum(valid[:, :, None, None] & ~same)
    return bad


def _check_pools(inp, *, k_pool=None, v_pool=None) -> None:
    """A paged workload's pools hold its dense view's values for every sequence, key by key (the oracle reads the dense
    view; before session 25 it gathered the sampled sequences' pages on the host, which checked the paging for them);
    a RuntimeError otherwise."""
    k_pool = inp.k_pool if k_pool is None else k_pool
    v_pool = inp.v_pool if v_pool is None else v_pool
    bad = int(_pool_mismatches(inp.k, inp.v, k_pool, v_pool, inp.block_table, jnp.asarray(inp.kv_lens)))
    if bad:
        raise RuntimeError(f"the paged pools differ from the dense keys/values at {bad} places: the oracle would not "
                           "judge what the kernels read")


def _check_dense_oracle(out, q0, k0, v0, *, rows, causal: bool, scale: float, q_offset: int, **features) -> None:
    """``_dense_oracle_f64``'s first batch, first KV head group and first row range against
    ``attn_core.oracle.attention_reference`` (numpy, CPU) on the same stored values (the sequence's keys only)."""
    r0, r1 = rows
    features = {k: v for k, v in features.items() if v is not None}
    ref, _ = reference.attention_reference(q0[None], k0[:, None][None], v0[:, None][None], causal=causal,
                                           scale=scale, q_offset=q_offset + r0, **features)
    _check_close(out[0, : r1 - r0, 0][None], ref, f"batch 0 of the subset, first KV head, rows {r0}..{r1}",
                 "attn_core.oracle (numpy)")


def _check_close(mine: np.ndarray, ref: np.ndarray, where: str, what: str) -> None:
    """The device float64 result ``mine`` against attn_core's numpy ``ref`` (named ``what``; ``where`` says which
    part): NaN at the same places (NaN in -> NaN out on both) and the rest within a relative 1e-10 of the largest
    ``|ref|``, else a RuntimeError naming both."""
    if not np.array_equal(np.isnan(mine), np.isnan(ref)):
        raise RuntimeError(f"the device float64 reference and {what} have NaN at different places ({where})")
    ok = ~np.isnan(ref)
    diff = float(np.max(np.abs(mine[ok] - ref[ok]))) if ok.any() else 0.0
    if not diff <= 1e-10 * max(float(np.max(np.abs(ref[ok]))) if ok.any() else 0.0, 1e-300):
        raise RuntimeError(f"the device float64 reference disagrees with {what} by {diff:.3g} ({where})")


def _kv_heads_of_batch(w, inp, b: int, kv_heads: list[int], quant: bool
                       ) -> tuple[np.ndarray, np.ndarray, int, list[int]]:
    """The host path's K/V of batch ``b``: host ``K, V [1, Tk_b, nu, D]`` holding each needed KV head once, as the
    device holds them (16-bit, dequantized or gathered values; converted to float64 later, per head), the base query
    offset, and ``hmap`` (requested head ``i`` is column ``hmap[i]``). ``quant``: from the quantized cache
    (dequantized exactly on the device, only the needed pages and heads), else from the plain arrays."""
    from . import interop

    host = np.asarray

    uniq = sorted(set(kv_heads))
    every = kv_heads == list(range(w.heads_kv))
    hmap = [uniq.index(h) for h in kv_heads]
    kh = jnp.asarray(uniq)

    def heads(x):  # slice the needed heads on the device: only they reach the host
        if quant:
            x = interop.take_quantized(x, (slice(None), slice(None), kh))
            return interop.dequantized(x)
        return x[:, :, kh]

    if w.family == "paged_decode" and (quant or getattr(inp, "kv_dtype", None) is None):
        n = int(inp.kv_lens[b])
        page = int(inp.k_pool.shape[1])
        pages = np.asarray(inp.block_table)[b, : -(-n // page)]
        # Pull only this sequence's pages (and the needed heads) off the device, then gather through
        # the table on the host; the whole pool in float64 would not fit at real shapes.
        idx = jnp.asarray(pages)
        local = np.arange(len(pages))

        def rows(pool):
            sel = interop.take_quantized(pool, idx) if quant else pool[idx]
            return reference.gather_paged_kv(heads(sel), local, n)[None]

        return rows(inp.k_pool), rows(inp.v_pool), n - w.q_len, hmap
    if w.family == "paged_decode":  # the fp16 values a quantized paged cache was made from: the dense view
        n = int(inp.kv_lens[b])
        k, v = inp.k[b:b + 1, :n], inp.v[b:b + 1, :n]
        return host(k[:, :, kh]), host(v[:, :, kh]), n - w.q_len, hmap
    if quant:
        k, v = (interop.take_quantized(t, slice(b, b + 1)) for t in (inp.k_quant, inp.v_quant))
    else:
        k, v = inp.k[b:b + 1], inp.v[b:b + 1]
    if every and not quant:  # every head: no gather
        return host(k), host(v), w.q_offset, list(range(w.heads_kv))
    return host(heads(k)), host(heads(v)), w.q_offset, hmap


def _mla_oracle(w, inp, subset: Subset, kv: str) -> np.ndarray:
    """MLA (docs/mla.md): ``attn_core.oracle.mla_attention_reference`` on the subset, ``[nb, nrows, nh, L]``.
    Keys are the whole latent, values its first ``kv_lora_rank`` columns, one latent head for every query head.
    ``storage``: the latent gathered through the block table from the pool the kernels read (only this sequence's
    pages leave the device), dequantized exactly for a quantized latent (the oracle on the dequantized latent);
    ``fp16``: the dense workload-dtype latent it was quantized from. Causal uses ``q_offset = kv_len[b] - Tq``."""
    from . import interop

    quant = kv == "storage" and getattr(inp, "kv_dtype", None) is not None
    lora = int(inp.kv_lora_rank)
    pool = inp.latent_pool
    page = int(pool.shape[1])
    heads = jnp.asarray(subset.heads)
    outs = []
    for b in subset.batches:
        n = int(inp.kv_lens[b])
        if kv == "storage":
            pages = np.asarray(inp.block_table)[b, : -(-n // page)]
            idx = jnp.asarray(pages)
            sel = interop.dequantized(interop.take_quantized(pool, idx)) if quant else pool[idx]
            lat = reference.gather_paged_kv(sel, np.arange(len(pages)), n)[None]  # [1, n, 1, DQK] float64
        else:
            lat = reference.to_f64(inp.k[b:b + 1, :n])
        qb = reference.to_f64(inp.q[b:b + 1][:, :, heads])
        base = n - w.q_len
        parts = [_reference_rows(qb[:, r0:r1], lat, lat[..., :lora], causal=w.causal, scale=inp.scale,
                                 q_offset=base + r0) for r0, r1 in subset.rows]
        outs.append(np.concatenate(parts, axis=1))
    return np.concatenate(outs, axis=0)


def quantization_error(ref_quant: np.ndarray, ref_fp16: np.ndarray) -> dict[str, float]:
    """The format's own error on a subset: the float64 oracle on the quantized cache against the oracle on the
    values it was quantized from (``rmse`` = sqrt(mean(d²)), ``max_abs``), as docs/quantized_kv.md §4 reports it."""
    d = np.asarray(ref_quant, np.float64) - np.asarray(ref_fp16, np.float64)
    if d.size == 0:
        return {"rmse": 0.0, "max_abs": 0.0}
    return {"rmse": float(np.sqrt(np.mean(d * d))), "max_abs": float(np.max(np.abs(d)))}


def feature_kwargs(w, inp, b: int, heads, rows: tuple[int, int]) -> dict[str, Any]:
    """The oracle's feature arguments for batch row ``b``, query heads ``heads`` and query rows ``rows`` (half
    open) of workload ``w`` (``attn_core.oracle.attention_reference``): window, soft-cap, the sampled heads' sink
    logits, and for a packed workload the rows' segment ids against every key's (q_offset 0, Tq == Tk)."""
    kw: dict[str, Any] = {}
    if getattr(w, "window", None) is not None:
        kw["window"] = int(w.window)
    if getattr(w, "softcap", None) is not None:
        kw["softcap"] = float(w.softcap)
    if getattr(w, "sinks", False):
        kw["sinks"] = reference.to_f64(inp.sinks)[list(heads)]
    if getattr(w, "packed", False):
        seg = np.asarray(inp.segment_ids)[b:b + 1]
        kw["q_segments"], kw["kv_segments"] = seg[:, rows[0]:rows[1]], seg
    return kw


def _reference_rows(q, k, v, *, causal: bool, scale: float, q_offset: int, **features) -> np.ndarray:
    """``attention_reference`` on one row range ``q [1, n, Hq, D]`` against ``k, v [1, Tk, Hkv, D]``, without
    materializing K/V once per query head: a causal single row sees keys ``<= q_offset``, which is the
    non-causal problem on those keys; a non-causal GQA problem folds each KV head's query heads into rows
    (``Hkv`` problems of ``G x n`` rows and one head). Same float64 math, per row, as the direct call. With a
    workload feature (``features``: ``feature_kwargs``) the direct call, features passed through."""
    if features:
        o, _ = reference.attention_reference(q, k, v, causal=causal, scale=scale, q_offset=q_offset, **features)
        return o
    n = q.shape[1]
    if causal and n == 1:
        k, v, causal = k[:, : max(0, q_offset + 1)], v[:, : max(0, q_offset + 1)], False
    hq, hkv = q.shape[2], k.shape[2]
    g = hq // hkv
    if causal or g == 1 or k.shape[1] == 0:
        o, _ = reference.attention_reference(q, k, v, causal=causal, scale=scale, q_offset=q_offset)
        return o
    d = q.shape[3]
    outs = []
    for j in range(hkv):
        qj = np.asarray(q[:, :, j * g:(j + 1) * g]).transpose(0, 2, 1, 3).reshape(1, g * n, 1, d)
        oj, _ = reference.attention_reference(qj, k[:, :, j:j + 1], v[:, :, j:j + 1], scale=scale)
        outs.append(oj.reshape(1, g, n, -1).transpose(0, 2, 1, 3))
    return np.concatenate(outs, axis=2)


@dataclasses.dataclass(frozen=True)
class GradSubset:
    """Where a train workload's gradients are checked: batch row ``batch``, KV head ``kv_head`` and its group of
    query heads; dQ of query rows ``rows`` and dK, dV of keys ``keys`` (half-open ranges). Exact on a tail: under a
    causal mask, keys ``j >= r0 + q_offset`` are seen only by the rows ``i >= r0``, so those rows (each against
    every key it sees) give those keys' whole dK and dV."""

    batch: int
    kv_head: int
    group: int
    rows: tuple[int, int]
    keys: tuple[int, int]

    @property
    def heads(self) -> tuple[int, ...]:
        return tuple(range(self.kv_head * self.group, (self.kv_head + 1) * self.group))

    def describe(self) -> dict[str, Any]:
        return {"batch": self.batch, "kv_head": self.kv_head, "heads_q": list(self.heads), "rows": list(self.rows),
                "keys": list(self.keys), "oracle": GRAD_ORACLE_NOTE}

    def take(self, grads_btnh) -> dict[str, np.ndarray]:
        """``{"dq", "dk", "dv"}`` of this subset, float64 (``dq [1, rows, G, D]``, ``dk``/``dv [1, keys, 1, D]``)."""
        dq, dk, dv = grads_btnh
        b, kv = self.batch, slice(self.kv_head, self.kv_head + 1)
        rows, keys = slice(*self.rows), slice(*self.keys)
        if isinstance(dq, np.ndarray):  # host (e.g. the float64 oracle): stay in numpy, keep precision
            h = list(self.heads)
            return {"dq": dq[b:b + 1, rows][:, :, h].astype(np.float64),
                    "dk": dk[b:b + 1, keys, kv].astype(np.float64), "dv": dv[b:b + 1, keys, kv].astype(np.float64)}
        h = jnp.asarray(self.heads)  # on the device: only the subset reaches the host
        return {"dq": reference.to_f64(jnp.asarray(dq)[b:b + 1, rows][:, :, h]),
                "dk": reference.to_f64(jnp.asarray(dk)[b:b + 1, keys, kv]),
                "dv": reference.to_f64(jnp.asarray(dv)[b:b + 1, keys, kv])}

    def take_checked(self, grads_btnh) -> tuple[dict[str, bool], dict[str, np.ndarray]]:
        """``({name: every value finite}, take(grads))`` for ``dq``, ``dk``, ``dv``; device gradients in one compiled
        program a shape (``_grads_finite_and_take``), only the subsets to the host."""
        names = ("dq", "dk", "dv")
        if isinstance(grads_btnh[0], np.ndarray):
            return {n: all_finite(g) for n, g in zip(names, grads_btnh)}, self.take(grads_btnh)
        finite, subs = _grads_finite_and_take(*(jnp.asarray(g) for g in grads_btnh), batch=self.batch,
                                              kv_head=self.kv_head, heads=tuple(self.heads), rows=tuple(self.rows),
                                              keys=tuple(self.keys))
        return ({n: bool(f) for n, f in zip(names, finite)},
                {n: reference.to_f64(np.asarray(x)) for n, x in zip(names, subs)})


@functools.partial(jax.jit, static_argnames=("batch", "kv_head", "heads", "rows", "keys"))
def _grads_finite_and_take(dq, dk, dv, *, batch: int, kv_head: int, heads: tuple, rows: tuple, keys: tuple):
    """``GradSubset.take``'s slices of ``dq``, ``dk``, ``dv`` and whether each is finite everywhere."""
    b = slice(batch, batch + 1)
    sub_q = jnp.take(dq[b, rows[0]:rows[1]], jnp.asarray(heads), axis=2)
    sub_k = dk[b, keys[0]:keys[1], kv_head:kv_head + 1]
    sub_v = dv[b, keys[0]:keys[1], kv_head:kv_head + 1]
    return tuple(jnp.isfinite(g).all() for g in (dq, dk, dv)), (sub_q, sub_k, sub_v)


def choose_grad_subset(w, *, max_scores: float = 2**26) -> GradSubset:
    """The last batch row and the last KV head (the ends catch offset and indexing errors the first would not). All
    rows and keys when ``group x Tq x Tk`` fits ``max_scores`` (about 7e10 float64 FLOPs at D 128, seconds on the
    CPU) or the mask is not causal; else, causal, the tail: the last ``max_scores / (group x Tk)`` rows (at least
    64) and the keys only they see (``GradSubset``), e.g. 512 rows and keys at N 16384 with 8 heads a group."""
    g = w.heads_q // w.heads_kv
    r0 = 0
    if w.causal and g * w.q_len * w.kv_len > max_scores:
        n = max(64, int(max_scores // (g * w.kv_len)))
        r0 = max(0, w.q_len - n)
        if r0 + w.q_offset >= w.kv_len:  # no key is seen by the tail alone: every row
            r0 = 0
    k0 = 0 if r0 == 0 else r0 + w.q_offset
    return GradSubset(batch=w.batch - 1, kv_head=w.heads_kv - 1, group=g, rows=(r0, w.q_len), keys=(k0, w.kv_len))


def grad_oracle(w, inp, gs: GradSubset) -> dict[str, np.ndarray]:
    """float64 ``{"dq", "dk", "dv"}`` of ``sum(out * w)`` on ``gs`` (``attn_core.oracle.attention_grad_reference``
    on that batch row, KV head and its query heads, rows ``gs.rows`` against every key, with the workload's features
    and its cotangent ``inp.w``), shaped as ``gs.take`` gives them. numpy on the host, from copies of the inputs as
    stored, cut there (session 25: slicing them on the GPU compiled a program each, and the same math as XLA programs
    took 3.5-6.5 s of GPU compile a train workload on an H100, or ran on the host's XLA CPU backend at a fraction of
    numpy's BLAS speed)."""
    if w.family != "train" or inp.w is None:
        raise ValueError(f"grad_oracle takes a train workload with its cotangent weight; got family {w.family!r}")
    b = gs.batch
    r0, r1 = gs.rows
    h = list(gs.heads)
    hq, hw, hk, hv = _to_host(inp.q, inp.w, inp.k, inp.v)
    q, do = (x[b:b + 1, r0:r1][:, :, h] for x in (hq, hw))
    k, v = (x[b:b + 1, :, gs.kv_head:gs.kv_head + 1] for x in (hk, hv))
    feats = feature_kwargs(w, inp, b, gs.heads, (r0, r1))  # copies of the feature inputs too
    with _host_only():
        g = reference.attention_grad_reference(q, k, v, do, causal=w.causal, scale=inp.scale,
                                               q_offset=w.q_offset + r0, **feats)
    keys = slice(*gs.keys)
    return {"dq": g["dq"], "dk": g["dk"][:, keys], "dv": g["dv"][:, keys]}


def errors(got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """``(max_abs_err, rel_l2_err)`` in float64; NaN in ``got`` propagates (the caller checks finiteness)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"output subset has shape {got.shape}, oracle {ref.shape}")
    d = got - ref
    max_abs = float(np.max(np.abs(d))) if d.size else 0.0
    denom = float(np.linalg.norm(ref))
    rel = float(np.linalg.norm(d)) / denom if denom > 0 else float(np.linalg.norm(d))
    return max_abs, rel


def all_finite(out_btnh: Any) -> bool:
    if isinstance(out_btnh, np.ndarray):
        return bool(np.isfinite(out_btnh).all())
    return bool(jnp.all(jnp.isfinite(jnp.asarray(out_btnh).astype(jnp.float32))))


def twin_errors(a_btnh: Any, b_btnh: Any) -> tuple[float, float]:
    """Full-output ``(max_abs, rel_l2)`` of ``a`` against ``b``, on the device in float32."""
    a = jnp.asarray(a_btnh).astype(jnp.float32)
    b = jnp.asarray(b_btnh).astype(jnp.float32)
    if a.shape != b.shape:
        raise ValueError(f"twin outputs differ in shape: {a.shape} vs {b.shape}")
    d = a - b
    nb = float(jnp.linalg.norm(b.ravel()))
    nd = float(jnp.linalg.norm(d.ravel()))
    return float(jnp.max(jnp.abs(d))), (nd / nb if nb > 0 else nd)
