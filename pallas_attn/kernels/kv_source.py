"""Where a program's K/V tiles come from, written once: a dense cache or a paged pool (reference §1.3).

Both are indexed in place, in the caller's layout, with no copy of the cache outside the kernel:

* dense BTNH ``k [B, Tk, Hkv, D]`` is viewed (free) as ``[B*Tk, Hkv*D]``; the key tile of head h at keys
  ``j0 .. j0+bk`` is rows ``b*Tk + j``, columns ``h*D : h*D + D``;
* a paged pool ``[num_pages, page, Hkv, D]`` is viewed as ``[num_pages*page, Hkv*D]``; key j of sequence b
  is row ``table[b, j // page] * page + j % page``. When ``page >= block_k`` (and tiles start at multiples
  of block_k) a tile lies in one page: one table read, contiguous rows. Otherwise each key's row is
  gathered through the table.

Bounds: page indices are clamped into the pool (no out-of-bounds read, ever) and ``bad`` reports an index
that was outside it, so the caller can poison that sequence's output. ``dequant`` (optional) turns the
loaded storage tiles into compute tiles: the hook the quantized pools use.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from .. import _compat
from .._compat import pl

__all__ = ["KVLayout", "KVSource", "flat_dense", "flat_pool"]


def flat_dense(x):
    """BTNH ``[B, Tk, Hkv, D] -> [B*Tk, Hkv*D]`` (a free reshape)."""
    b, tk, h, d = x.shape
    return x.reshape(b * tk, h * d)


def flat_pool(x):
    """Pool ``[num_pages, page, Hkv, W] -> [num_pages*page, Hkv*W]`` (a free reshape)."""
    n, page, h, w = x.shape
    return x.reshape(n * page, h * w)


@dataclasses.dataclass(frozen=True)
class KVLayout:
    """Static facts of the K/V operands of one launch."""

    paged: bool
    block_k: int
    d: int
    tk: int = 0  # dense: keys per sequence
    page: int = 1
    pages_per_seq: int = 1
    num_pages: int = 1
    gather: bool = False  # paged with page < block_k

    @property
    def capacity(self) -> int:
        """The most keys a sequence can hold."""
        return self.pages_per_seq * self.page if self.paged else self.tk


class KVSource:
    """In-kernel tile loader for sequence ``b``, KV head ``h``."""

    def __init__(self, layout: KVLayout, k_ref, v_ref, bt_ref=None, *, b, h,
                 dequant: Callable | None = None):
        self.lay, self.k_ref, self.v_ref, self.bt_ref = layout, k_ref, v_ref, bt_ref
        self.b, self.dequant = b, dequant
        self.col0 = h * layout.d
        self.cols = self.col0 + jnp.arange(layout.d, dtype=jnp.int32)
        self.tbl0 = b * layout.pages_per_seq

    def _page(self, lp):
        lay = self.lay
        raw = self.bt_ref[self.tbl0 + jnp.minimum(lp, lay.pages_per_seq - 1)]
        return jnp.clip(raw, 0, lay.num_pages - 1), (raw < 0) | (raw >= lay.num_pages)

    def tile(self, j0, j, kmask):
        """K and V ``[block_k, D]`` for keys ``j = j0 + arange(block_k)`` (masked by ``kmask``), and ``bad``."""
        lay, bk, d = self.lay, self.lay.block_k, self.lay.d
        m2 = jnp.broadcast_to(kmask[:, None], (bk, d))
        if not lay.paged:
            src = pl.ds(self.b * lay.tk + j0, bk)
            idx, bad = (src, pl.ds(self.col0, d)), False
        elif not lay.gather:
            pg, bad = self._page(j0 // lay.page)
            idx = (pl.ds(pg * lay.page + j0 % lay.page, bk), pl.ds(self.col0, d))
        else:
            pg, bad_k = self._page(j // lay.page)
            bad = jnp.max(jnp.where(kmask & bad_k, 1, 0)) > 0  # no reduce_or in Triton
            idx = ((pg * lay.page + j % lay.page)[:, None], self.cols[None, :])
        k = _compat.load(self.k_ref.at[idx], mask=m2, other=0.0)
        v = _compat.load(self.v_ref.at[idx], mask=m2, other=0.0)
        if self.dequant is not None:
            k, v = self.dequant(k, v)
        return k, v, bad
