"""Agreement: every output against the float64 oracle (``attn_core.oracle``), and twin against twin.

The oracle runs on the CPU in float64, which is too slow for the full output at real shapes, so it is
computed on a *subset* chosen to catch the usual indexing bugs: the first and last batch element, the
first and last query head (with the KV heads they map to under GQA), and all query rows when there are at
most ``max_rows``, else the first and the last ``max_rows/2`` rows (the last rows see the most keys under a
causal mask). Every implementation is compared on the same subset; the record names it
(``agreement.subset``). Twins (Pallas and CUDA of one generation) are compared on the full output, on the
device.

Errors: ``max_abs_err = max |out - ref|`` and ``rel_l2_err = ||out - ref||_2 / ||ref||_2``. A non-finite
value anywhere in the full output fails the record before any error is computed (NaN never passes).
``tolerance(precision)`` is compare's verdict threshold on ``rel_l2_err`` (status ``ok`` vs ``wrong``),
from the compute precision: a correct fp32 kernel lands far under 1e-3, one whose matmuls ran in TF32 near
3e-4, bf16 operands between 1e-3 and 1e-2 (docs/compare.md, "Agreement"); the tests own the strict
per-kernel tolerances.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np

from attn_core import oracle as reference

__all__ = ["Subset", "choose_subset", "oracle", "errors", "twin_errors", "all_finite", "tolerance", "TOLERANCE"]

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
                "rows": [list(r) for r in self.rows], "oracle": "attn_core.oracle float64 (CPU)"}

    def take(self, out_btnh: Any) -> np.ndarray:
        """The subset of a BTNH output as float64 numpy ``[nb, nrows, nh, D]`` (gathered on the device)."""
        rows = np.concatenate([np.arange(r0, r1) for r0, r1 in self.rows])
        if isinstance(out_btnh, np.ndarray):  # host (e.g. float64 oracle): stay in numpy, keep precision
            return out_btnh[list(self.batches)][:, rows][:, :, list(self.heads)].astype(np.float64)
        x = jnp.asarray(out_btnh)
        sub = x[jnp.asarray(self.batches)][:, jnp.asarray(rows)][:, :, jnp.asarray(self.heads)]
        return reference.to_f64(sub)


def choose_subset(w, *, max_rows: int = 256) -> Subset:
    batches = tuple(sorted({0, w.batch - 1}))
    heads = tuple(sorted({0, w.heads_q - 1}))
    if w.q_len <= max_rows:
        rows: tuple[tuple[int, int], ...] = ((0, w.q_len),)
    else:
        half = max_rows // 2
        rows = ((0, half), (w.q_len - half, w.q_len))
    return Subset(batches, heads, rows)


def oracle(w, inp, subset: Subset) -> np.ndarray:
    """float64 reference output on ``subset``: ``[nb, nrows, nh, D]``.

    Dense: the keys of each sampled row range with ``q_offset`` shifted by the range start (so causal masks
    stay exact). Paged: keys gathered through the block table from the pools (so paging is checked too),
    ``q_offset = kv_len[b] - Tq`` per sequence as the paged contract says.
    """
    g = w.heads_q // w.heads_kv
    kv_heads = [h // g for h in subset.heads]
    q_all = inp.q
    outs = []
    for b in subset.batches:
        qb = reference.to_f64(q_all[b:b + 1][:, :, jnp.asarray(subset.heads)])  # [1, Tq, nh, D]
        if w.family == "paged_decode":
            n = int(inp.kv_lens[b])
            page = int(inp.k_pool.shape[1])
            pages = np.asarray(inp.block_table)[b, : -(-n // page)]
            # Pull only this sequence's pages (and the needed heads) off the device, then gather through
            # the table on the host; the whole pool in float64 would not fit at real shapes.
            idx, kh = jnp.asarray(pages), jnp.asarray(sorted(set(kv_heads)))
            local = np.arange(len(pages))
            hmap = [sorted(set(kv_heads)).index(h) for h in kv_heads]
            kd = reference.gather_paged_kv(inp.k_pool[idx][:, :, kh], local, n)[None][:, :, hmap]
            vd = reference.gather_paged_kv(inp.v_pool[idx][:, :, kh], local, n)[None][:, :, hmap]
            base_offset = n - w.q_len
        else:
            kh = jnp.asarray(kv_heads)  # slice on the device: only the needed heads reach the host
            kd = reference.to_f64(inp.k[b:b + 1][:, :, kh])
            vd = reference.to_f64(inp.v[b:b + 1][:, :, kh])
            base_offset = w.q_offset
        parts = []
        for r0, r1 in subset.rows:
            o, _ = reference.attention_reference(qb[:, r0:r1], kd, vd, causal=w.causal, scale=inp.scale,
                                                 q_offset=base_offset + r0)
            parts.append(o)
        outs.append(np.concatenate(parts, axis=1))
    return np.concatenate(outs, axis=0)


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
