"""Where a program's K/V tiles come from, written once: a dense cache or a paged pool (reference §1.3).

Both are indexed in place, in the caller's layout, with no copy of the cache outside the kernel:

* dense BTNH ``k [B, Tk, Hkv, D]`` is viewed (free) as ``[B*Tk, Hkv*D]``; the key tile of head h at keys
  ``j0 .. j0+bk`` is rows ``b*Tk + j``, columns ``h*D : h*D + D``;
* a paged pool ``[num_pages, page, Hkv, D]`` is viewed as ``[num_pages*page, Hkv*D]``; key j of sequence b
  is row ``table[b, j // page] * page + j % page``. When ``page >= block_k`` (and tiles start at multiples
  of block_k) a tile lies in one page: one table read, contiguous rows. Otherwise each key's row is
  gathered through the table.

Bounds: page indices are clamped into the pool (no out-of-bounds read, ever) and ``bad`` reports an index
that was outside it, so the caller can poison that sequence's output; ``validate_block_table`` is the same rule
on the host (a ValueError on a concrete table, before any launch). ``dequant`` (optional) turns the
loaded storage tiles into compute tiles: the hook the quantized pools use.

Quantized pools (docs/quantized_kv.md): the storage width per head may differ from D (``KVLayout.width``:
D for fp16 / fp8 bytes, D/2 for NVFP4 packed nibbles), and NVFP4 adds micro-scale pools of ``KVLayout.micro``
(= D/16) columns per head, read through the same rows. With micro pools the hook receives ``(data, micro)``
pairs: ``dequant((k, k_micro), (v, v_micro))``. ``e4m3_tile`` / ``nvfp4_tile`` are such decoders, each in two
ways (``"cast"``: Triton's fp8 conversion, the hardware cvt on sm_89+; ``"bits"``: integer bit placement into
fp16, any GPU). They return *exact* fp16 tiles short of a power-of-two factor ``2^fold`` (``E4M3_FOLD`` /
``NVFP4_FOLD``), which the caller folds, with the per-tensor scale, into one scalar per score or output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from .._compat import pl
from .planner import next_pow2

__all__ = ["KVLayout", "KVSource", "flat_dense", "flat_pool", "e4m3_tile", "nvfp4_tile", "nvfp4_halves", "E4M3_FOLD",
           "NVFP4_FOLD", "DECODES", "NVFP4_DECODES", "NVFP4_ASM", "validate_block_table"]


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
    width: int = 0  # storage columns per head in the K/V pools (0: d; NVFP4 packed: d // 2)
    micro: int = 0  # columns per head of the micro-scale pools (NVFP4: d // 16; 0: no micro pools)

    @property
    def data_width(self) -> int:
        return self.width or self.d

    @property
    def tile_d(self) -> int:
        """Columns of a loaded K/V tile: ``d`` rounded up to a power of two (Triton's tiles are powers of two; the
        columns past ``d`` load as zeros, masked, and contribute nothing to either product). D 96: 128."""
        return next_pow2(self.d)

    @property
    def capacity(self) -> int:
        """The most keys a sequence can hold."""
        return self.pages_per_seq * self.page if self.paged else self.tk


def validate_block_table(block_table, kv_lens, *, num_pages: int, page_size: int) -> None:
    """Eager check of a concrete block table: every page a sequence uses lies in ``[0, num_pages)``.

    Raises ValueError naming the first bad sequence. Under jit use the in-kernel check instead (``KVSource``'s
    ``bad``). fa_decode, v7_paged (and the kernels built on it) and the MLA kernels (``mla_common``) call this one.
    """
    bt = np.asarray(block_table)
    lens = np.asarray(kv_lens).astype(np.int64)
    cap = bt.shape[1] * page_size
    if np.any(lens < 0) or np.any(lens > cap):
        bad = int(np.argmax((lens < 0) | (lens > cap)))
        raise ValueError(f"kv_lens must lie in [0, pages_per_seq*page_size = {cap}]; got kv_lens[{bad}]={lens[bad]}")
    used = np.arange(bt.shape[1])[None, :] < ((lens + page_size - 1) // page_size)[:, None]
    oob = used & ((bt < 0) | (bt >= num_pages))
    if np.any(oob):
        bi, pi = (int(x[0]) for x in np.nonzero(oob))
        raise ValueError(f"block_table[{bi}, {pi}] = {int(bt[bi, pi])} is outside the pool [0, {num_pages})")


class KVSource:
    """In-kernel tile loader for sequence ``b``, KV head ``h`` (micro-scale refs only for NVFP4 pools)."""

    def __init__(self, layout: KVLayout, k_ref, v_ref, bt_ref=None, *, b, h,
                 dequant: Callable | None = None, k_micro_ref=None, v_micro_ref=None, check_gathered: bool = True):
        self.lay, self.k_ref, self.v_ref, self.bt_ref = layout, k_ref, v_ref, bt_ref
        # check_gathered False: a gathered tile (page < tile) returns no ``bad`` flag; the caller checks the pages its
        # keys span once, outside its loop (fa_decode, ``pages_bad``; session 38). True: one reduction a tile
        self.check_gathered = check_gathered
        self.k_micro_ref, self.v_micro_ref = k_micro_ref, v_micro_ref
        self.b, self.h, self.dequant = b, h, dequant
        self.tbl0 = b * layout.pages_per_seq
        if layout.micro and (k_micro_ref is None or v_micro_ref is None):
            raise ValueError("KVLayout.micro > 0 needs k_micro_ref and v_micro_ref")

    def _page(self, lp):
        lay = self.lay
        raw = self.bt_ref[self.tbl0 + jnp.minimum(lp, lay.pages_per_seq - 1)]
        return jnp.clip(raw, 0, lay.num_pages - 1), (raw < 0) | (raw >= lay.num_pages)

    def _rows(self, j0, j, kmask):
        """The row part of the tile's index (a slice, or per-key rows for the gather) and ``bad``."""
        lay, bk = self.lay, self.lay.block_k
        if not lay.paged:
            return pl.ds(self.b * lay.tk + j0, bk), False
        if not lay.gather:
            pg, bad = self._page(j0 // lay.page)
            return pl.ds(pg * lay.page + j0 % lay.page, bk), bad
        pg, bad_k = self._page(j // lay.page)
        if not self.check_gathered:
            return pg * lay.page + j % lay.page, False
        return pg * lay.page + j % lay.page, jnp.max(jnp.where(kmask & bad_k, 1, 0)) > 0  # no reduce_or in Triton

    def _load(self, ref, rows, kmask, width: int):
        """The ``[block_k, width]`` columns of head ``h``; a width that is not a power of two (D 96) loads the next
        power of two of columns, those past ``width`` masked to zero (never read)."""
        bk = self.lay.block_k
        tw = next_pow2(width)
        if isinstance(rows, pl.Slice):
            idx = (rows, pl.ds(self.h * width, tw))
        else:
            idx = (rows[:, None], (self.h * width + jnp.arange(tw, dtype=jnp.int32))[None, :])
        other = 0.0 if jnp.issubdtype(ref.dtype, jnp.floating) else 0
        if tw == width:
            return _compat.load(ref.at[idx], mask=jnp.broadcast_to(kmask[:, None], (bk, width)), other=other)
        cols_ok = (jnp.arange(tw, dtype=jnp.int32) < width)[None, :]
        return _compat.load(ref.at[idx], mask=jnp.broadcast_to(kmask[:, None], (bk, tw)) & cols_ok, other=other)

    def tile(self, j0, j, kmask):
        """K and V ``[block_k, tile_d]`` (``D`` rounded up to a power of two, zero past ``D``) for keys
        ``j = j0 + arange(block_k)`` (masked by ``kmask``), and ``bad``."""
        lay = self.lay
        rows, bad = self._rows(j0, j, kmask)
        k = self._load(self.k_ref, rows, kmask, lay.data_width)
        v = self._load(self.v_ref, rows, kmask, lay.data_width)
        if lay.micro:
            k = (k, self._load(self.k_micro_ref, rows, kmask, lay.micro))
            v = (v, self._load(self.v_micro_ref, rows, kmask, lay.micro))
        if self.dequant is not None:
            k, v = self.dequant(k, v)
        return k, v, bad


def pages_load(bt_ref, tbl0, first, *, pages_per_seq: int, width: int):
    """Entries ``[first, first + width)`` of one sequence's block-table row (entry 0 at ``tbl0`` of the flattened
    table; indices clamped into the row): one vector load, issued where the caller wants its latency hidden (fa_decode:
    before its key loop, consumed after it by ``pages_flag``; session 39)."""
    idx = first + jnp.arange(width, dtype=jnp.int32)
    return bt_ref[tbl0 + jnp.minimum(idx, pages_per_seq - 1)]


def pages_flag(raw, first, end, *, num_pages: int):
    """Whether an entry of ``raw`` (``pages_load``'s, entries ``first ...``) below ``end`` lies outside ``[0,
    num_pages)``."""
    idx = first + jnp.arange(raw.shape[0], dtype=jnp.int32)
    return jnp.max(jnp.where((idx < end) & ((raw < 0) | (raw >= num_pages)), 1, 0)) > 0


def pages_bad(bt_ref, tbl0, first, end, *, pages_per_seq: int, num_pages: int, width: int):
    """Whether a page index among entries ``[first, end)`` of one sequence's block-table row (entry 0 at ``tbl0`` of
    the flattened table) lies outside ``[0, num_pages)``: ``width``-wide vector loads, one reduction each (session 38:
    fa_decode's block-table check, once a program instead of a per-key flag carried through its loop; one
    ``pages_load`` and ``pages_flag`` a step)."""
    def step(i, acc):
        f = first + i * width
        raw = pages_load(bt_ref, tbl0, f, pages_per_seq=pages_per_seq, width=width)
        return acc | pages_flag(raw, f, end, num_pages=num_pages).astype(jnp.int32)

    n = jnp.maximum(end - first + width - 1, 0) // width
    return jax.lax.fori_loop(0, n, step, jnp.zeros((), jnp.int32)) > 0


# --------------------------------------------------------------------------------------------------------
# Tile decoders for the quantized pools (exact fp16, short of 2^fold)
# --------------------------------------------------------------------------------------------------------

DECODES = ("cast", "bits")
NVFP4_DECODES = (*DECODES, "asm")  # "asm": NVFP4 only, compiled Triton only (interpret mode runs "cast": same values)
E4M3_FOLD = {"cast": 0, "bits": 8}  # log2 of the factor a decoded tile is short of
NVFP4_FOLD = {"cast": 0, "bits": 7, "asm": 0}

# NVFP4 "asm" (session 18, issue 31; docs/quantized_kv.md §8): four packed bytes (eight nibbles) per 32-bit register,
# the cast decode's E4M3 bytes built four at a time with word-wide shifts and masks, then two hardware converts per
# register (cvt.rn.f16x2.e4m3x2, two bytes each). $2 holds four packed bytes (element i in byte i); $0, $1 the four
# levels as fp16 (element i in half i % 2 of register i // 2). A low nibble s e1 e0 m (bits 3..0) becomes the byte
# s 0 0 e1 e0 m 0 0: bit 3 to 7 (x << 4), bits 2..0 to 4..2 (x << 2); a high nibble (bits 7..4): bit 7 stays, bits
# 6..4 to 4..2 (x >> 2). The masks drop what a word-wide shift carries in from the neighbouring byte. Two programs,
# one per half (Pallas' Triton lowering of a multi-result elementwise_inline_asm returns one result in jax 0.10.2:
# "2 outvars do not match 1 outvals"). tests/test_fa_decode_quant.py runs both texts through a small PTX
# interpreter.
_ASM_CVT = """
mov.b32 {p0, p1}, e;
cvt.rn.f16x2.e4m3x2 $0, p0;
cvt.rn.f16x2.e4m3x2 $1, p1;
}"""
NVFP4_ASM = {
    "lo": """{
.reg .b32 a, b, e;
.reg .b16 p0, p1;
shl.b32 a, $2, 4;
and.b32 a, a, 0x80808080;
shl.b32 b, $2, 2;
and.b32 b, b, 0x1C1C1C1C;
or.b32 e, a, b;""" + _ASM_CVT,
    "hi": """{
.reg .b32 a, b, e;
.reg .b16 p0, p1;
and.b32 a, $2, 0x80808080;
shr.b32 b, $2, 2;
and.b32 b, b, 0x1C1C1C1C;
or.b32 e, a, b;""" + _ASM_CVT,
}


def e4m3_tile(x, how: str):
    """E4M3 bytes (uint8 tile) -> fp16, exactly (every E4M3 value is an fp16 value).

    ``cast``: bitcast to float8_e4m3fn and convert (one hardware cvt per two elements on sm_89+); the value.
    ``bits``: sign to bit 15, exponent and mantissa (7 bits) to bits 7..13 of an fp16: the fp16 reads
    ``2^(e-15) (1 + m/8)`` (subnormals included: ``m 2^-17``), the value times 2^-8; 0x7F / 0xFF become NaN.
    """
    if how == "cast":
        return jax.lax.bitcast_convert_type(x, jnp.float8_e4m3fn).astype(jnp.float16)
    if how != "bits":
        raise ValueError(f"decode must be one of {DECODES}; got {how!r}")
    u = x.astype(jnp.uint16)
    f = jax.lax.bitcast_convert_type(((u & 0x80) << 8) | ((u & 0x7F) << 7), jnp.float16)
    return jnp.where((u & 0x7F) == 0x7F, jnp.float16(jnp.nan), f)


def nvfp4_tile(packed, micro, how: str):
    """NVFP4 ``packed [n, D/2]`` + ``micro [n, D/16]`` (uint8 tiles) -> fp16 ``[n, D]`` = ``level * sign *
    e4m3(micro) * 2^-fold``, exactly (the product has at most 7 significant bits and stays >= 2^-24).

    The E2M1 code ``s e1 e0 m`` is placed into a wider float's bits so that the float reads the level times a
    power of two (subnormal included: code 1 is 0.5): ``cast`` builds the E4M3 byte ``s 0 0 e1 e0 m 0 0`` (the
    level times 2^-6) and converts it; ``bits`` builds the fp16 ``s 0 0 0 e1 e0 m 0...`` (the level times
    2^-14). The micro-scale tile (16x fewer elements) absorbs most of the power of two (``cast``: x 2^6, giving
    the value; ``bits``: x 2^7 after its own 2^-8, giving the value times 2^-7) so that typical products are
    normal fp16 numbers. Even elements are the low nibbles: the halves are interleaved by a join (stack + reshape).
    """
    n, half = packed.shape
    d = 2 * half

    def join(lo, hi):
        return jnp.stack([lo, hi], axis=-1).reshape(n, d)

    if how == "cast":  # the E4M3 bytes joined, then one convert
        lvl = e4m3_tile(join(*_nvfp4_level_bits(packed, how)), "cast")
    elif how == "bits":
        lvl = jax.lax.bitcast_convert_type(join(*_nvfp4_level_bits(packed, how)), jnp.float16)
    elif how == "asm":  # joined in float32: a float16 join of the inline-asm results swaps columns (below)
        lvl = join(*(x.astype(jnp.float32) for x in _nvfp4_levels_asm(packed))).astype(jnp.float16)
    else:
        raise ValueError(f"decode must be one of {NVFP4_DECODES}; got {how!r}")
    return lvl * _nvfp4_micro(micro, how, d)


def _nvfp4_levels_asm(p):
    """``_nvfp4_levels(p, "cast")`` through ``NVFP4_ASM`` (compiled Triton on sm_89+ only: no interpreter).

    Measured on an H100 (session 19, jax 0.11.2, Triton 3.6; docs/quantized_kv.md §9): the two float16 results
    joined by ``jnp.stack(..., -1).reshape`` come out with columns 1 and 2 of every four swapped (lo0 lo1 hi0 hi1
    instead of lo0 hi0 lo1 hi1): the packed-register order of a 16-bit inline-asm result and the join's layout
    disagree. Each result on its own is right (``nvfp4_halves``), and so is a join of them widened to float32,
    which ``nvfp4_tile`` does; tests/gpu/test_fa_decode_quant_gpu.py checks both in a compiled kernel."""
    from jax.experimental.pallas import triton as plt

    out = [jax.ShapeDtypeStruct(p.shape, jnp.float16)]
    return tuple(plt.elementwise_inline_asm(NVFP4_ASM[half], args=[p], constraints="=r,=r,r", pack=4,
                                            result_shape_dtypes=out)[0] for half in ("lo", "hi"))


def _nvfp4_micro(micro, how: str, cols: int):
    """The micro-scale tile as fp16 carrying the decode's power of two (``cast``: micro * 2^6 <= 28672; ``bits``:
    micro * 2^-8 from its decode, * 2^15, so micro * 2^7 <= 57344): exact either way; each of its ``blocks`` columns
    repeated to ``cols`` columns (a whole row of D, or one half of D/2)."""
    if how in ("cast", "asm"):
        m = e4m3_tile(micro, "cast") * jnp.float16(64.0)
    else:
        m = e4m3_tile(micro, "bits") * jnp.float16(32768.0)
    n, blocks = micro.shape
    return jnp.broadcast_to(m[:, :, None], (n, blocks, cols // blocks)).reshape(n, cols)


def _nvfp4_level_bits(p, how: str):
    """The two nibbles of each packed byte placed into a wider float's bits, ``(low, high)``: ``cast``: E4M3 bytes
    ``s 0 0 e1 e0 m 0 0`` (level * 2^-6); ``bits``: fp16 bit patterns ``s 0 0 0 e1 e0 m 0...`` as uint16 (level *
    2^-14). The one statement of the E2M1 placement (``NVFP4_ASM`` is the same for "cast", four bytes at a time)."""
    if how == "cast":
        return ((p & 0x8) << 4) | ((p & 0x7) << 2), (p & 0x80) | ((p & 0x70) >> 2)
    u = p.astype(jnp.uint16)
    return ((u & 0x8) << 12) | ((u & 0x7) << 9), ((u & 0x80) << 8) | ((u & 0x70) << 5)


def _nvfp4_levels(p, how: str):
    """The two nibbles of each packed byte as ``(low, high)`` level tiles of ``p``'s shape (fp16 for ``bits``,
    fp16 after the E4M3 convert for ``cast``), each the E2M1 level times ``nvfp4_tile``'s power of two."""
    if how == "cast":
        return tuple(e4m3_tile(x, "cast") for x in _nvfp4_level_bits(p, how))
    if how == "asm":
        return _nvfp4_levels_asm(p)
    if how == "bits":
        return tuple(jax.lax.bitcast_convert_type(x, jnp.float16) for x in _nvfp4_level_bits(p, how))
    raise ValueError(f"decode must be one of {NVFP4_DECODES}; got {how!r}")


def nvfp4_halves(packed, micro, how: str):
    """NVFP4 ``packed [n, D/2]`` + ``micro [n, D/16]`` -> ``(even, odd)``, two fp16 ``[n, D/2]`` tiles: the even
    elements (low nibbles) and the odd ones (high nibbles), each exactly ``nvfp4_tile``'s values at those columns
    (same decodes, same ``NVFP4_FOLD``).

    No interleave: ``nvfp4_tile`` joins the two halves into ``[n, D]`` (a stack and a reshape, which Triton may
    carry out as a register shuffle or a trip through shared memory). Here the caller keeps the halves apart and
    permutes the other operand instead (q's columns even-then-odd, the output's back), so both dots run on the
    halves as they decode: the scores are the sum of two dots over D/2, the output two ``[rows, D/2]``
    accumulators. Column ``i`` of either half belongs to micro block ``i // 8`` (element ``2i`` or ``2i + 1``
    lies in block ``2i // 16``), so one broadcast micro tile of ``[n, D/2]`` scales both halves.
    """
    lo, hi = _nvfp4_levels(packed, how)
    m = _nvfp4_micro(micro, how, packed.shape[1])
    return lo * m, hi * m
