"""Paged-KV builders: dense BTNH caches -> vLLM-style pools + per-sequence block table (docs/reference.md §1.3).

numpy on the host, so the JAX kernels and the torch/CUDA twins page the same bytes with the same table
(``compare`` moves the pools to either framework). Layout (DESIGN.md decision 4): pools
``[num_pages, page_size, Hkv, D]``; ``block_table`` int32 ``[B, pages_per_seq]`` with logical key ``j`` of
sequence ``b`` at ``pool[block_table[b, j // page_size], j % page_size]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

__all__ = ["build_paged_kv", "build_paged_latent", "paged_layout", "PagedLayout", "LATENT_SPARE_BLOCKS"]

LATENT_SPARE_BLOCKS = 2  # build_paged_latent's default spare blocks (filled, pointed at by no table entry)


def _as_numpy(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach"):  # torch: numpy has no bf16, so refuse rather than silently change dtype
        raise ValueError(f"{name} must be a numpy or JAX array; convert torch tensors first")
    a = np.asarray(x)
    if a.ndim != 4:
        raise ValueError(f"{name} must be [B, Tk, Hkv, D] (BTNH); got {name}.shape={a.shape}")
    return a


def build_paged_kv(
    k: Any,
    v: Any,
    page_size: int,
    *,
    seed: int = 0,
    shuffle: bool = True,
    kv_lens: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Page a dense cache. Returns ``(k_pool, v_pool, block_table)``.

    ``k``, ``v``: ``[B, Tk, Hkv, D]`` (numpy or JAX, any dtype; the pools keep it). Each sequence is padded
    with zeros to ``pages_per_seq = ceil(Tk / page_size)`` pages. With ``kv_lens`` (``[B]`` ints in
    ``[0, Tk]``) sequence ``b`` gets only ``ceil(kv_lens[b] / page_size)`` pages (a ragged pool, as a
    server holds it); its remaining table entries are 0, a valid page that a correct kernel never needs.
    ``shuffle`` scatters the logical pages over physical slots with a permutation seeded by ``seed``, so a
    kernel that ignores the table fails.
    """
    k = _as_numpy(k, "k")
    v = _as_numpy(v, "v")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape=}, {v.shape=}")
    if not isinstance(page_size, (int, np.integer)) or page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a positive power of two; got {page_size=!r}")
    b, tk, hkv, d = k.shape
    lay = paged_layout(b, tk, page_size, seed=seed, shuffle=shuffle, kv_lens=kv_lens)
    pps = lay.table.shape[1]
    pad = pps * page_size - tk
    kp = np.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, pps, page_size, hkv, d)
    vp = np.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0))).reshape(b, pps, page_size, hkv, d)
    k_pool = np.zeros((lay.n_pages, page_size, hkv, d), dtype=k.dtype)
    v_pool = np.zeros_like(k_pool)
    if lay.slots.size:
        k_pool[lay.slots] = kp[lay.batch, lay.page]
        v_pool[lay.slots] = vp[lay.batch, lay.page]
    return k_pool, v_pool, lay.table


class PagedLayout(NamedTuple):
    """Where ``build_paged_kv`` puts each page: logical page ``page[i]`` of sequence ``batch[i]`` goes to physical slot
    ``slots[i]`` of a pool of ``n_pages`` pages; ``table [B, pages_per_seq]`` int32 (unused entries 0)."""

    n_pages: int
    batch: np.ndarray
    page: np.ndarray
    slots: np.ndarray
    table: np.ndarray


def paged_layout(b: int, tk: int, page_size: int, *, seed: int = 0, shuffle: bool = True,
                 kv_lens: Any = None) -> PagedLayout:
    """``build_paged_kv``'s placement of a ``[B, Tk, ...]`` cache's pages, without the data (so a caller holding the
    cache elsewhere, e.g. on a GPU, can place the same values in the same slots)."""
    if not isinstance(page_size, (int, np.integer)) or page_size < 1 or page_size & (page_size - 1):
        raise ValueError(f"page_size must be a positive power of two; got {page_size=!r}")
    pps = max(1, -(-tk // page_size))
    if kv_lens is None:
        lens = np.full((b,), tk, dtype=np.int64)
    else:
        lens = np.asarray(kv_lens).astype(np.int64).reshape(-1)
        if lens.shape != (b,) or np.any(lens < 0) or np.any(lens > tk):
            raise ValueError(f"kv_lens must be [B] ints in [0, Tk={tk}]; got {np.asarray(kv_lens)!r}")
    used = (lens + page_size - 1) // page_size  # pages each sequence needs
    owner = [(bi, lp) for bi in range(b) for lp in range(int(used[bi]))]
    n_pages = max(1, len(owner))  # keep a non-empty pool even when every length is 0
    perm = np.random.default_rng(seed).permutation(n_pages) if shuffle else np.arange(n_pages)
    table = np.zeros((b, pps), dtype=np.int32)
    bi = np.array([o[0] for o in owner], dtype=np.int64)
    lp = np.array([o[1] for o in owner], dtype=np.int64)
    slots = perm[: len(owner)]
    if owner:
        table[bi, lp] = slots
    return PagedLayout(n_pages, bi, lp, slots, table)


def build_paged_latent(
    latent: Any,
    page_size: int,
    *,
    seed: int = 0,
    kv_lens: Any = None,
    spare: int = LATENT_SPARE_BLOCKS,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Page an MLA latent cache ``[B, Tk, 1, DQK]`` (one latent head; keys and values both read it).

    Returns ``(pool [num_blocks, page_size, 1, DQK], block_table int32 [B, pages_per_seq], kv_lens int32 [B])``.
    The pages are shuffled (``seed``) as in :func:`build_paged_kv`, which does the paging, and ``spare`` extra
    blocks filled with the cache's largest magnitude are appended (finite, and leaving a per-tensor
    quantization scale of the pool unchanged): no sequence's table points at them, so a kernel
    that reads outside its table shows it. ``kv_lens`` default: ``Tk`` for every sequence.
    """
    lat = _as_numpy(latent, "latent")
    if lat.shape[2] != 1:
        raise ValueError(f"latent must be [B, Tk, 1, DQK] (one latent head); got latent.shape={lat.shape}")
    if not isinstance(spare, (int, np.integer)) or spare < 0:
        raise ValueError(f"spare must be a non-negative int; got {spare=!r}")
    b, tk = lat.shape[:2]
    lens = np.full((b,), tk, np.int64) if kv_lens is None else np.asarray(kv_lens).astype(np.int64).reshape(-1)
    pool, _, table = build_paged_kv(lat, lat, page_size, seed=seed, kv_lens=lens)
    if spare:
        amax = np.abs(pool.astype(np.float64)).max() if pool.size else 0.0
        extra = np.full((spare, *pool.shape[1:]), amax if np.isfinite(amax) else 0.0, dtype=pool.dtype)
        pool = np.concatenate([pool, extra])
    return pool, table, lens.astype(np.int32)
