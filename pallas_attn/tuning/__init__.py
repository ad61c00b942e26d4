"""Per-GPU heuristic tables: which named config a kernel runs at a shape when the caller names none.

The tables are data (``<chip>.json`` beside this file), made from model-shape sweep records by
``python -m compare tune --table`` (``compare/tune_table.py``); nothing here measures anything at call time.
A kernel's heuristic asks ``choose(kernel, problem)`` for a config name:

* the chip is the GPU jax computes on, by its device kind ("NVIDIA H100 80GB HBM3" -> ``h100``, "NVIDIA H200"
  -> ``h200``); no GPU, or a chip without a table, gives None (the kernel's own rule);
* a table row is a shape bucket: the exact keys of the kernel's ``KEYS`` entry must match (dtype, head dim, causal,
  page size, ...), and among the rows that match, the one nearest in the numeric keys (batch, lengths, heads: the
  sum of |log2| distances) wins. That is the rule for shapes outside the table: the nearest measured shape of the
  same kind, never a guess across kinds. A kind can also be a key derived from the numeric ones (``DERIVED``:
  fa_decode's one query a sequence against several). No matching row gives None.

A chip without its own rows for a kernel reads a sibling's for the kernels whose choices carry over (``SIBLING``,
``SIBLING_KERNELS``): the H200 is the H100's 132 SMs (the same tensor cores, registers and shared memory) with
faster, larger memory, so the compute-bound Hopper schedules of fa_prefill and its backward, chosen by per-tile
latencies, read the H100's rows there; the memory-bound decode kernels and MLA keep their own rules unless the
H200's table has rows for them (docs/sweep.md, "Session 22: the H200"; since session 23 it has fa_decode's).
Where the chip has rows of its own for such a kernel (the H200's fa_prefill and drop-in backward rows from its own
sweep, session 29), they rule the shape kinds they cover, and a kind they never measured (e.g. non-causal prefill)
still reads the sibling's rows of that kind: rows of two chips are never mixed within one kind.

``PALLAS_ATTN_TUNING=off`` in the environment turns the tables off (each kernel's own rule), for measuring what the
tables buy; ``PALLAS_ATTN_TUNING=<path.json>`` reads that table instead of the shipped one (for a new chip).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["KEYS", "DERIVED", "chip", "chip_of", "table", "table_for", "sibling_table", "choose", "bucket", "CHIPS",
           "use_chip", "SIBLING", "SIBLING_KERNELS"]

# kernel -> (exact keys, numeric keys) of its shape buckets; a problem's values come from ``bucket``.
KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # heads_q is exact for MLA: a schedule measured at 128 heads is never assumed to run at 16
    "fa_mla": (("dtype", "kv_dtype", "kv_lora_rank", "head_dim", "heads_q"), ("q_len", "batch", "kv_len")),
    "fa_prefill": (("dtype", "head_dim", "causal"), ("q_len", "kv_len", "batch", "heads_q", "group")),
    "fa_prefill_bwd": (("dtype", "head_dim", "causal"), ("q_len", "kv_len", "batch", "heads_q", "group")),
    "fa_decode": (("dtype", "kv_dtype", "head_dim", "paged"), ("q_len", "batch", "kv_len", "heads_kv", "group")),
}
# kernel -> {name: f(bucket values)}: exact keys derived from a row's (or a problem's) bucket values, so that rows
# written before a derived key existed keep matching. fa_decode's query regime: one query a sequence and several
# (speculative decode, Tq 2-16) plan differently (row tiles, warps, the one-split rule), so a row measured at one never
# stands in for the other by nearest bucket (session 36: the H200's spec rows at Tq 2 / 8, 128-key tiles or 4 stages,
# were the nearest rows of Tq 1 shapes the table had not measured, e.g. Llama-3.1-70B B 16 S 8k).
DERIVED: dict[str, dict[str, Any]] = {"fa_decode": {"multi_query": lambda k: int(k.get("q_len") or 1) > 1}}
# device-kind prefixes -> table name (the first that matches)
CHIPS: tuple[tuple[str, str], ...] = (("NVIDIA H100", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA GH200", "h200"))
_HERE = Path(__file__).parent
# chip -> the chip whose table it reads while it has none of its own, for SIBLING_KERNELS only (module docstring)
SIBLING: dict[str, str] = {"h200": "h100"}
SIBLING_KERNELS: tuple[str, ...] = ("fa_prefill", "fa_prefill_bwd")


def bucket(kernel: str, problem: Any) -> dict[str, Any]:
    """The bucket values of ``problem`` (a kernels.contract.Problem) for ``kernel``'s table."""
    exact, numeric = KEYS[kernel]
    vals = {"dtype": problem.dtype, "kv_dtype": getattr(problem, "kv_dtype", None), "head_dim": problem.head_dim,
            "causal": bool(problem.causal), "paged": getattr(problem, "page_size", None) is not None,
            "kv_lora_rank": getattr(problem, "kv_lora_rank", None), "q_len": problem.q_len, "kv_len": problem.kv_len,
            "batch": problem.batch, "heads_q": problem.heads_q, "heads_kv": problem.heads_kv,
            "group": problem.heads_q // problem.heads_kv}
    return {k: vals[k] for k in exact + numeric}


def chip_of(device_kind: str | None) -> str | None:
    """The table name of a GPU by its device kind (``CHIPS``; also the ``env.gpu`` of compare's records)."""
    for prefix, name in CHIPS:
        if isinstance(device_kind, str) and device_kind.startswith(prefix):
            return name
    return None


_CHIP_OVERRIDE: list[str | None] = []


@contextlib.contextmanager
def use_chip(name: str | None):
    """Inside the block the heuristics read chip ``name``'s table whatever GPU (if any) this is: what the defaults
    choose on an H100 or H200, asked from any machine (``compare predict --model``). Not thread-safe; nests."""
    _CHIP_OVERRIDE.append(name)
    try:
        yield
    finally:
        _CHIP_OVERRIDE.pop()


def chip() -> str | None:
    """The table name of the GPU jax computes on (``CHIPS``), None without a GPU or for another chip; inside
    ``use_chip(name)``, ``name``."""
    if _CHIP_OVERRIDE:
        return _CHIP_OVERRIDE[-1]
    return _gpu_chip()


@functools.cache
def _gpu_chip() -> str | None:
    try:
        import jax

        kinds = [d.device_kind for d in jax.devices() if d.platform == "gpu"]
    except RuntimeError:
        return None
    return chip_of(kinds[0]) if kinds else None


@functools.cache
def _load(path: str) -> Mapping[str, Any]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), dict):
        raise ValueError(f"{path}: a tuning table is a JSON object with a 'kernels' object (compare tune --table)")
    return data


def table(name: str | None = None) -> Mapping[str, Any] | None:
    """The table for chip ``name`` (default: this GPU's), None when tables are off or there is none."""
    env = os.environ.get("PALLAS_ATTN_TUNING", "")
    if env.lower() in ("off", "0", "none"):
        return None
    if env:
        return _load(env)
    name = chip() if name is None else name
    if name is None:
        return None
    path = _HERE / f"{name}.json"
    return _load(str(path)) if path.is_file() else None


def table_for(kernel: str, name: str | None = None) -> Mapping[str, Any] | None:
    """The table ``kernel``'s heuristic reads on chip ``name`` (default: this GPU's): the chip's own where it has
    rows for ``kernel``, else for ``SIBLING_KERNELS`` its sibling's (``SIBLING``), else the chip's own (None or
    without the kernel: the kernel's own rule). A chip's table may hold some kernels only (the H200's: fa_decode,
    session 23), and its other kernels still read the sibling. ``PALLAS_ATTN_TUNING`` rules both as in ``table``."""
    own = table(name)
    has = bool(own) and bool(((own.get("kernels") or {}).get(kernel) or {}).get("rows"))
    if has:
        return own
    return sibling_table(kernel, name) or own


def sibling_table(kernel: str, name: str | None = None) -> Mapping[str, Any] | None:
    """The sibling chip's table (``SIBLING``) for a kernel of ``SIBLING_KERNELS`` on chip ``name`` (default: this
    GPU's), None otherwise or while ``PALLAS_ATTN_TUNING`` is set. ``choose`` reads its rows for a shape kind (the
    kernel's exact keys: dtype, head dim, causal, ...) that the chip's own rows lack."""
    if kernel not in SIBLING_KERNELS or os.environ.get("PALLAS_ATTN_TUNING", ""):
        return None
    sib = SIBLING.get(chip() if name is None else name)
    return table(sib) if sib else None


def _nearest(tbl: Mapping[str, Any], kernel: str, want: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The row of ``tbl`` for ``kernel`` with ``want``'s exact keys and the nearest numeric ones, None if none."""
    exact, numeric = KEYS[kernel]
    derived = DERIVED.get(kernel, {})
    want_derived = {n: f(want) for n, f in derived.items()}
    best, best_d = None, math.inf
    for row in (tbl.get("kernels") or {}).get(kernel, {}).get("rows", []):
        key = row.get("key", {})
        if any(key.get(k) != want[k] for k in exact) or any(f(key) != want_derived[n] for n, f in derived.items()):
            continue
        d = _distance(key, want, numeric)
        if d < best_d:
            best, best_d = row, d
    return best


def _distance(row_key: Mapping[str, Any], want: Mapping[str, Any], numeric: tuple[str, ...]) -> float:
    d = 0.0
    for k in numeric:
        a, b = row_key.get(k), want.get(k)
        if a is None or b is None:
            continue
        d += abs(math.log2(max(float(a), 1.0)) - math.log2(max(float(b), 1.0)))
    return d


def choose(kernel: str, problem: Any, *, names: Mapping[str, Any] | None = None,
           tbl: Mapping[str, Any] | None = None, fallback_to_row_best: bool = False) -> str | None:
    """The config name the table gives ``kernel`` at ``problem`` (None: no table, no row of this kind, or a name
    that ``names``, the kernel's named configs, does not hold: a stale table never picks a removed config).
    ``fallback_to_row_best``: when the row's config is not in ``names`` (a caller that excludes some configs, e.g.
    the non-deterministic ones), the fastest of the row's measured configs that ``names`` holds instead, by the
    table's rule: the row's default config stays unless the fastest allowed one beats it by more than the table's
    ``min_gain``. Without ``tbl`` and without a table for this chip, a kernel of ``SIBLING_KERNELS`` reads the
    sibling chip's table (``table_for``)."""
    implicit = tbl is None
    tbl = table_for(kernel) if implicit else tbl
    if not tbl:
        return None
    want = bucket(kernel, problem)
    best = _nearest(tbl, kernel, want)
    if best is None and implicit:
        # a shape kind (the exact keys) this chip's own rows never measured: its sibling's rows of that kind
        sib = sibling_table(kernel)
        if sib is not None and sib is not tbl:
            tbl, best = sib, _nearest(sib, kernel, want)
    if best is None:
        return None
    name = best.get("config")
    if names is not None and name not in names:
        if not fallback_to_row_best:
            return None
        times = {n: t for n, t in (best.get("time_us") or {}).items() if n in names and t}
        if not times:
            return None
        fastest, dflt = min(times, key=times.get), best.get("default")
        # the table's own policy: the kernel's default stays unless another is faster by more than min_gain
        if dflt in times and times[fastest] * (1.0 + float(tbl.get("min_gain", 0.0))) >= times[dflt]:
            return dflt
        return fastest
    return name
