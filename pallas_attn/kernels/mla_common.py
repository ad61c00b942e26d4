"""What the MLA kernels (v11_mla, v12_mla_tc) share: the latent tile, the partial skeleton.

MLA decode after weight absorption (docs/reference.md §2.16, docs/mla.md) is MQA over one latent head: each token
stores one vector of width ``DQK = kv_lora_rank (DV) + rope_dim (R)``; the scores are ``q . latent`` over all DQK
columns and the values are the latent's first DV columns. So one latent tile serves both K and V.

The problem and the contract are the contract's own (``kernels/contract.py``): a ``Problem`` of ``entry="mla"``
carries ``kv_lora_rank`` (DV), ``heads_kv=1``, ``head_dim=DQK`` and ``kv_dtype`` the latent's storage format; a
``Kernel`` serving "mla" declares its ``mla`` function, the (DQK, DV) ``templates`` it accepts and the latent formats
it reads (``latent_precision``, ``latent_q_dtypes``). (``MlaProblem``, a subclass adding
``kv_lora_rank``, is gone: issue 26, item 2.)

* ``LatentSource``: the in-kernel loader. A tile of ``tn`` keys of sequence ``b`` is read through the block table
  (one table read and a contiguous slice when a page holds the tile, else one table read per key), in column
  chunks of ``cw`` (64) columns for the DV part and one chunk of R columns for the rope part (Triton tensors are
  powers of two; 576 is not), and decoded at the gather: fp8 E4M3 bytes and NVFP4 nibbles + micro-scales times
  the tensor scale become 16-bit tiles in the kernel's operand dtype (``fold``: fp8 tiles keep the exact E4M3
  values and the kernel multiplies the scores and the output by the tensor scale instead). Page indices are
  clamped into the pool (no out-of-bounds read, ever).
* ``run``: the partial skeleton every Triton-lowered MLA kernel uses (grid ``(row tiles, splits, B)``, head-major
  packed rows ``r = h * Tq + t``, the shared split state and merge) around a kernel's ``attend``.
* ``table_poison``: the block-table / length check, in jnp: a sequence whose table points outside the pool (or
  whose length the table cannot hold) gets a NaN output, never a silently wrong one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat, quant
from .._compat import pl
from . import gqa, splitkv
from .kv_source import NVFP4_FOLD, e4m3_tile, nvfp4_tile, validate_block_table

__all__ = ["LatentLayout", "LatentSource", "latent_storage", "table_poison", "run",
           "Geometry", "FORMATS", "CHUNK"]

CHUNK = 64  # columns per loaded chunk of the latent's DV part
FORMATS = ("fp8_e4m3", "nvfp4")  # quantized latent storage formats (pallas_attn.quant.kv_format names)


# --------------------------------------------------------------------------------------------------------
# The latent's storage and its tile
# --------------------------------------------------------------------------------------------------------


def latent_storage(latent):
    """``(fmt, data [nb, page, 1, W], micro | None, scale | None)``: a plain latent (fmt None), an ``Fp8Tensor``
    (uint8 bytes, W = DQK) or an ``Nvfp4Tensor`` (packed nibbles W = DQK/2, micro-scales DQK/16)."""
    fmt = quant.kv_format(latent)
    if fmt is None:
        return None, latent, None, None
    scale = jnp.asarray(latent.scale, jnp.float32).reshape(())
    if fmt == "fp8_e4m3":
        return fmt, latent.data, None, scale
    return fmt, latent.packed, latent.micro, scale


@dataclasses.dataclass(frozen=True)
class LatentLayout:
    """Static facts of the latent operand of one launch."""

    dqk: int
    dv: int
    tn: int  # keys per tile
    page: int
    pages_per_seq: int
    num_pages: int
    fmt: str | None  # None (plain), "fp8_e4m3", "nvfp4"
    tile_dtype: str  # the 16-bit dtype the products consume
    gather: bool  # a tile may straddle pages: one table read per key
    fold: bool = False  # fp8: tiles hold the exact E4M3 values; the kernel applies the tensor scale to S and O

    @property
    def rope(self) -> int:
        return self.dqk - self.dv

    @property
    def cw(self) -> int:
        return min(CHUNK, self.dv)

    @property
    def chunks(self) -> int:
        return self.dv // self.cw

    @property
    def capacity(self) -> int:
        return self.pages_per_seq * self.page

    @property
    def width(self) -> int:
        """Storage columns per row of the data pool."""
        return self.dqk // 2 if self.fmt == "nvfp4" else self.dqk


class LatentSource:
    """Tiles of sequence ``b``'s latent: ``tile(j0, kmask) -> (chunks, rope)``, ``chunks`` a list of
    ``[tn, cw]`` tiles of the DV columns and ``rope`` the ``[tn, R]`` tile, in ``layout.tile_dtype``."""

    def __init__(self, lay: LatentLayout, data_ref, bt_ref, *, b, micro_ref=None, scale=None):
        self.lay, self.data_ref, self.bt_ref, self.micro_ref, self.scale = lay, data_ref, bt_ref, micro_ref, scale
        self.tbl0 = b * lay.pages_per_seq

    def _page(self, lp):
        lay = self.lay
        raw = self.bt_ref[self.tbl0 + jnp.clip(lp, 0, lay.pages_per_seq - 1)]
        return jnp.clip(raw, 0, lay.num_pages - 1)

    def rows(self, j0, j):
        lay = self.lay
        if not lay.gather:
            return pl.ds(self._page(j0 // lay.page) * lay.page + j0 % lay.page, lay.tn)
        return self._page(j // lay.page) * lay.page + j % lay.page

    def _load(self, ref, rows, kmask, c0: int, w: int):
        tn = self.lay.tn
        if isinstance(rows, pl.Slice):
            idx = (rows, pl.ds(c0, w))
        else:
            idx = (rows[:, None], (c0 + jnp.arange(w, dtype=jnp.int32))[None, :])
        other = 0.0 if jnp.issubdtype(ref.dtype, jnp.floating) else 0
        return _compat.load(ref.at[idx], mask=jnp.broadcast_to(kmask[:, None], (tn, w)), other=other)

    def _piece(self, rows, kmask, c0: int, w: int):
        """Columns ``[c0, c0 + w)`` of the logical latent, decoded to the tile dtype."""
        lay = self.lay
        dt = jnp.dtype(lay.tile_dtype)
        if lay.fmt is None:
            return self._load(self.data_ref, rows, kmask, c0, w)
        if lay.fmt == "fp8_e4m3":
            x = e4m3_tile(self._load(self.data_ref, rows, kmask, c0, w), "cast")  # exact fp16
            if lay.fold:  # every E4M3 value is exact in fp16 and in bf16: no rounding at all
                return x.astype(dt)
            return (x.astype(jnp.float32) * self.scale).astype(dt)
        packed = self._load(self.data_ref, rows, kmask, c0 // 2, w // 2)
        micro = self._load(self.micro_ref, rows, kmask, c0 // 16, w // 16)
        x = nvfp4_tile(packed, micro, "bits")  # exact fp16, short of 2^7
        return (x.astype(jnp.float32) * (self.scale * jnp.float32(2.0 ** NVFP4_FOLD["bits"]))).astype(dt)

    def tile(self, j0, kmask):
        lay = self.lay
        j = j0 + jnp.arange(lay.tn, dtype=jnp.int32)
        rows = self.rows(j0, j)
        chunks = [self._piece(rows, kmask, i * lay.cw, lay.cw) for i in range(lay.chunks)]
        return chunks, self._piece(rows, kmask, lay.dv, lay.rope)


def _table_checks(block_table, kv_lens, *, num_pages: int, page: int):
    """``(bad_len [B], oob [B, pages])``: a length outside ``[0, capacity]``; a page the length uses outside the pool
    (the rule ``table_poison`` and ``table_flag`` reduce)."""
    pps = block_table.shape[1]
    lens = kv_lens.astype(jnp.int32)
    bad_len = (lens < 0) | (lens > pps * page)
    used = jnp.arange(pps, dtype=jnp.int32)[None, :] < ((jnp.clip(lens, 0, pps * page) + page - 1) // page)[:, None]
    return bad_len, used & ((block_table < 0) | (block_table >= num_pages))


def table_poison(block_table, kv_lens, *, num_pages: int, page: int):
    """bool ``[B]``: the sequence's length lies outside ``[0, capacity]`` or a page it uses lies outside the pool."""
    bad_len, oob = _table_checks(block_table, kv_lens, num_pages=num_pages, page=page)
    return bad_len | jnp.any(oob, axis=1)


def table_flag(block_table, kv_lens, *, num_pages: int, page: int):
    """int32 ``[B]``, nonzero where ``table_poison`` is set: the same rule as one reduction over ``[B, pages]`` (the
    direct epilogue's input; a bool result cast afterwards is a second XLA launch)."""
    bad_len, oob = _table_checks(block_table, kv_lens, num_pages=num_pages, page=page)
    return jnp.max((oob | bad_len[:, None]).astype(jnp.int32), axis=1)


def validate_table_eagerly(block_table, kv_lens, *, num_pages: int, page: int) -> None:
    """ValueError on concrete bad tables / lengths (under jit the output is NaN instead)."""
    try:
        bt, lens = np.asarray(block_table), np.asarray(kv_lens)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    validate_block_table(bt, lens, num_pages=num_pages, page_size=page)


# --------------------------------------------------------------------------------------------------------
# The partial skeleton (Triton lowering / interpret mode)
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Geometry:
    rows: int  # packed rows per sequence: Hq * Tq
    rpp: int  # rows per program
    tq: int
    splits: int
    chunk: int  # keys per split (a multiple of the tile)
    causal: bool


def _partial_kernel(q_ref, lat_ref, bt_ref, lens_ref, off_ref, *refs, geo: Geometry, lay: LatentLayout,
                    attend: Callable, n_quant: int):
    quant_refs, (o_ref, lse_ref) = refs[:n_quant], refs[n_quant:]
    micro_ref = quant_refs[0] if lay.fmt == "nvfp4" else None
    scale = quant_refs[-1][0] if n_quant else None
    rpp, dv = geo.rpp, lay.dv
    t, sp, b = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    kv_len = jnp.clip(lens_ref[b], 0, lay.capacity)
    r = t * rpp + jnp.arange(rpp, dtype=jnp.int32)
    row_ok = r < geo.rows
    row0 = b * geo.rows + t * rpp

    def q_piece(c0: int, w: int):
        return _compat.load(q_ref.at[pl.ds(row0, rpp), pl.ds(c0, w)],
                            mask=jnp.broadcast_to(row_ok[:, None], (rpp, w)), other=0.0)

    q_chunks = [q_piece(i * lay.cw, lay.cw) for i in range(lay.chunks)]
    q_rope = q_piece(dv, lay.rope)
    pos = r % geo.tq
    lo = sp * geo.chunk
    hi = jnp.minimum(kv_len, lo + geo.chunk)
    q_off = None
    if geo.causal:
        q_off = jnp.clip(off_ref[b], -geo.tq, lay.capacity)
        last = jnp.max(jnp.where(row_ok, pos, -1))
        hi = jnp.minimum(hi, last + q_off + 1)
    src = LatentSource(lay, lat_ref, bt_ref, b=b, micro_ref=micro_ref, scale=scale)
    m, l, accs = attend(q_chunks, q_rope, src, lo=lo, hi=hi, pos=pos, q_off=q_off)
    for i, acc in enumerate(accs):
        o, lse = splitkv.partial(m, l, acc, base2=attend.keywords.get("base2", False))
        _compat.store(o_ref.at[pl.ds(row0, rpp), sp, pl.ds(i * lay.cw, lay.cw)], o,
                      mask=jnp.broadcast_to(row_ok[:, None], (rpp, lay.cw)))
    _compat.store(lse_ref.at[pl.ds(row0, rpp), sp], lse, mask=row_ok)


def visible(j, hi, pos, q_off, *, causal: bool):
    """``[R, tn]`` mask: key ``j`` is before ``hi`` and, causal, ``j <= pos + q_off``."""
    ok = (j < hi)[None, :]
    if causal:
        ok = ok & (j[None, :] <= (pos + q_off)[:, None])
    return ok


@functools.partial(jax.jit, static_argnames=("name", "attend", "rpp", "tn", "dv", "splits", "chunk", "causal",
                                             "interpret", "return_lse", "num_warps", "num_stages", "tile_dtype"))
def _launch(q, data, bt, lens, off, quant_ops, *, name: str, attend, rpp: int, tn: int, dv: int, splits: int,
            chunk: int, causal: bool, interpret: bool, return_lse: bool, num_warps: int, num_stages: int,
            tile_dtype: str):
    b, tq, hq, dqk = q.shape
    num_pages, page = data.shape[:2]
    fmt = None if not quant_ops else ("nvfp4" if len(quant_ops) == 2 else "fp8_e4m3")
    lay = LatentLayout(dqk=dqk, dv=dv, tn=tn, page=page, pages_per_seq=bt.shape[1], num_pages=num_pages, fmt=fmt,
                       tile_dtype=tile_dtype, gather=page < tn or chunk % tn != 0)
    rows = hq * tq
    geo = Geometry(rows=rows, rpp=rpp, tq=tq, splits=splits, chunk=chunk, causal=causal)
    flat = [x.reshape(x.shape[0] * x.shape[1], x.shape[-1]) for x in (data, *quant_ops[:-1])]
    o_part, lse_part = pl.pallas_call(
        functools.partial(_partial_kernel, geo=geo, lay=lay, attend=attend, n_quant=len(quant_ops)),
        out_shape=(jax.ShapeDtypeStruct((b * rows, splits, dv), jnp.float32),
                   jax.ShapeDtypeStruct((b * rows, splits), jnp.float32)),
        grid=(-(-rows // rpp), splits, b),
        compiler_params=_compat.triton_params(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name=f"{name}_partial",
    )(gqa.pack_q(q, 1), flat[0], bt.reshape(-1), lens, off, *flat[1:], *quant_ops[-1:])
    return o_part, lse_part


def finish(o_part, lse_part, *, b: int, tq: int, hq: int, out_dtype, interpret: bool, name: str,
           return_lse: bool, poison):
    """The shared merge, the unpacking to ``[B, Tq, Hq, DV]`` and the bad-table poisoning."""
    o_part.shape[-1]
    res = splitkv.merge(o_part, lse_part, out_dtype=out_dtype, interpret=interpret, name=f"{name}_merge",
                        num_warps=4, return_lse=return_lse)
    o, lse = res if return_lse else (res, None)
    out = gqa.unpack_o(o, b, tq, hq, 1)
    out = jnp.where(poison[:, None, None, None], jnp.asarray(jnp.nan, out.dtype), out)
    if not return_lse:
        return out
    lse = gqa.unpack_lse(lse, b, tq, hq)
    return out, jnp.where(poison[:, None, None], jnp.float32(jnp.nan), lse)


def run(name: str, attend, q, latent, block_table, kv_lens, q_offset, *, dv: int, rpp: int, tn: int, splits: int,
        chunk: int, causal: bool, interpret: bool, return_lse: bool, num_warps: int, num_stages: int,
        check_block_table: bool = True, tile_dtype: str | None = None):
    """A Triton-lowered MLA kernel's ``mla`` entry: storage, eager table check, partial, merge, unpack."""
    fmt, data, micro, scale = latent_storage(latent)
    if fmt is not None:
        quant._check_fields("latent_pool", latent)
    quant_ops = () if fmt is None else ((micro, scale[None]) if fmt == "nvfp4" else (scale[None],))
    num_pages, page = data.shape[:2]
    if check_block_table:
        validate_table_eagerly(block_table, kv_lens, num_pages=num_pages, page=page)
    b, tq, hq, _ = q.shape
    o_part, lse_part = _launch(q, data, block_table, kv_lens, q_offset.astype(jnp.int32), quant_ops, name=name,
                               attend=attend, rpp=rpp, tn=tn, dv=dv, splits=splits, chunk=chunk, causal=bool(causal),
                               interpret=bool(interpret), return_lse=bool(return_lse), num_warps=num_warps,
                               num_stages=num_stages, tile_dtype=tile_dtype or jnp.dtype(q.dtype).name)
    poison = table_poison(block_table, kv_lens, num_pages=num_pages, page=page) if check_block_table else \
        jnp.zeros((b,), jnp.bool_)
    return finish(o_part, lse_part, b=b, tq=tq, hq=hq, out_dtype=q.dtype, interpret=bool(interpret), name=name,
                  return_lse=bool(return_lse), poison=poison)
