"""fa_decode: frontier GQA decode (dense and paged KV) meant to run at the HBM read ceiling.

What it is. Decode attention for a few query tokens (Tq <= 16) against a long KV cache. Its arithmetic
intensity is about G FLOP per KV byte (ORIGINAL.md §2.0, DESIGN.md roofline), so the only thing that
matters is how many KV bytes are in flight; every choice below is about that.

How it differs from its parent (v8_gqa_ss, ORIGINAL.md §2.13), which stalled near 28% of HBM bandwidth:
  * GQA M-packing (§2.0) on tensor cores: the G query heads of one KV head times Tq are the M rows of one
    program, padded to a power of two >= 16 so both dots run as MMAs; each KV tile is read once for all G.
  * One program per (row tile, split, batch·KV head) with the KV tile streamed by a ``fori_loop`` that
    Triton software-pipelines (``num_stages``): several K/V tiles in flight per program, several programs
    per SM. The split count comes from the device SM count and a wave model (``plan``), not from the
    reference's 40-SM constants.
  * KV is indexed in place, in the caller's layout: dense BTNH ``k[B, Tk, Hkv, D]`` is viewed (free) as
    ``[B*Tk, Hkv*D]`` and a key tile of head h is rows ``b*Tk + j``, columns ``h*D : h*D + D``; a paged pool
    ``[num_blocks, page, Hkv, D]`` is viewed as ``[num_blocks*page, Hkv*D]`` and row ``table[b, j // page] *
    page + j % page``. No transpose or copy of the cache outside the kernel (JAX's own decode op transposes
    the whole cache in XLA, ANCHORS.md §3).
  * Split-KV partials are *normalized* fp32 O plus a base-2 LSE per (row, split); a small Pallas merge
    combines them (bytes = splits·rows·D·4, tiny next to the cache). With one split there is no merge: the
    partial kernel writes the output directly.
  * Paged tiles: when ``page_size >= block_k`` a tile lies in one page (one table read, contiguous rows);
    otherwise each key's row is gathered through the table (``page_size < block_k``).

Conventions. Packed row ``r`` of a (b, h_kv) pair is query head ``h_kv*G + r // Tq`` at query position
``r % Tq`` (head-major, §2.0). Causal is top-left with ``j <= i_q + q_offset``; paged decode uses
``q_offset = kv_len[b] - Tq`` per sequence (DESIGN.md decision 5). A row with no visible key outputs 0.
Keys at or past ``kv_len`` are never read (masked loads; splits past the length issue no loads).

Block tables: page indices are clamped in-kernel (no out-of-bounds read, ever). With ``check_block_table``
an index outside ``[0, num_blocks)`` (or a ``kv_len`` the table cannot hold) raises ValueError on concrete
inputs and, under jit, turns that sequence's output into NaN (the kernel sees the bad index on its way).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .. import _compat
from .._compat import pl

__all__ = ["DecodeConfig", "DecodePlan", "CONFIGS", "plan", "forward", "paged_forward", "validate_block_table"]

_LOG2E = 1.4426950408889634
# Finite "minus infinity" for the running max: exp2(m_old - m_new) stays 0/1, never NaN, when a whole tile
# is masked (ORIGINAL.md §2.0 uses -FLT_MAX for the same reason).
_M_INIT = -1e30


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def _next_pow2(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Knobs of the decode kernel; ``None`` means "pick by heuristic" (``plan``).

    block_k: keys per streamed tile (power of two, 16..512). num_warps / num_stages: Triton launch knobs
    (stages = software-pipelining depth of the K/V loads). splits: KV splits per (b, h_kv) (None: wave
    model). occupancy: programs the wave model assumes resident per SM. block_m_max: cap on packed rows per
    program (rows beyond it go to more row tiles, which re-read the tile, mostly from L2).
    merge_block: splits combined per step of the merge kernel.
    """

    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    splits: int | None = None
    occupancy: int = 2
    paged_min_waves: int = 6
    block_m_max: int | None = None
    merge_block: int = 64
    merge_num_warps: int = 4

    def __post_init__(self) -> None:
        if self.block_k is not None and not (_is_pow2(self.block_k) and 16 <= self.block_k <= 512):
            raise ValueError(f"block_k must be a power of two in [16, 512]; got {self.block_k=}")
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16; got {self.num_warps=}")
        if self.num_stages is not None and not (1 <= self.num_stages <= 8):
            raise ValueError(f"num_stages must be in [1, 8]; got {self.num_stages=}")
        if self.splits is not None and not (isinstance(self.splits, int) and self.splits >= 1):
            raise ValueError(f"splits must be a positive int or None; got {self.splits=}")
        if not (isinstance(self.paged_min_waves, int) and 1 <= self.paged_min_waves <= 16):
            raise ValueError(f"paged_min_waves must be an int in [1, 16]; got {self.paged_min_waves=}")
        if not (isinstance(self.occupancy, int) and 1 <= self.occupancy <= 32):
            raise ValueError(f"occupancy must be an int in [1, 32]; got {self.occupancy=}")
        if self.block_m_max is not None and not (_is_pow2(self.block_m_max) and self.block_m_max >= 16):
            raise ValueError(f"block_m_max must be a power of two >= 16; got {self.block_m_max=}")
        if not (_is_pow2(self.merge_block) and 1 <= self.merge_block <= 256):
            raise ValueError(f"merge_block must be a power of two in [1, 256]; got {self.merge_block=}")
        if self.merge_num_warps not in (1, 2, 4, 8):
            raise ValueError(f"merge_num_warps must be one of 1, 2, 4, 8; got {self.merge_num_warps=}")


# "faithful" is the heuristic default (there is no reference kernel to be faithful to: fa_decode is a
# frontier row); the others are measured alternatives that compare runs beside it (docs/fa_decode.md).
CONFIGS: dict[str, DecodeConfig] = {
    "faithful": DecodeConfig(),
    # the paged plan without the ragged-batch balancing (one program per sequence when B·Hkv fills the
    # chip): kept so compare measures what the balancing costs on uniform lengths and buys on ragged ones
    "paged_unbalanced": DecodeConfig(paged_min_waves=1),
    # best dense point of the first H200 sweep (results/fa_decode_tune/20261121_h200_tune1.json): B=32,
    # S=8192 234.2 µs vs 236.4 default; B=1, S=131072 122.7 vs 122.4; B=64, S=4096 240.1 vs 236.9 (bk 128)
    "tuned": DecodeConfig(block_k=32, num_warps=4, num_stages=4),
}


@dataclasses.dataclass(frozen=True)
class DecodePlan:
    """Everything static about one launch, resolved from shapes + config (``plan``)."""

    block_m: int  # packed rows per program (power of two >= 16)
    row_tiles: int
    block_k: int
    chunk_blocks: int  # KV tiles per split
    splits: int
    num_warps: int
    num_stages: int
    paged_gather: bool  # page_size < block_k: per-key row gather through the table

    @property
    def programs_per_head(self) -> int:
        return self.row_tiles * self.splits


_PROGRAM_OVERHEAD_TILES = 2


def _default_block_k(d: int) -> int:
    # One K+V tile = 2·block_k·D·2 bytes = 32 KiB at fp16: with 3 stages ~96 KiB of shared memory, so two
    # programs fit per SM (228 KiB) and each keeps two tiles in flight while it computes on the third.
    return max(16, min(256, 8192 // d))


def plan(
    *,
    batch: int,
    hkv: int,
    rows: int,
    d: int,
    max_kv: int,
    config: DecodeConfig,
    page_size: int | None = None,
    sm_count: int | None = None,
) -> DecodePlan:
    """Resolve tiles, launch knobs and the split count for one call.

    The split count minimizes a wave model: time ~ ceil(programs / slots) · (tiles_per_split + 2), the 2
    standing for a program's fixed cost (pipeline fill, Q load, epilogue), plus a two-tile penalty for the
    merge launch, with slots = SMs × occupancy. Enough programs to fill the chip,
    no partial last wave if a cheaper count avoids it, and no merge at all once B·Hkv fills the chip.
    """
    bm_cap = config.block_m_max or max(16, 8192 // d)
    block_m = min(max(16, _next_pow2(rows)), bm_cap)
    row_tiles = _cdiv(rows, block_m)
    sms = sm_count if sm_count is not None else _compat.device_sm_count()
    slots = max(1, sms * config.occupancy)
    base = batch * hkv * row_tiles
    block_k = config.block_k or _default_block_k(d)
    if config.block_k is None and page_size is None and base >= slots:
        # B·Hkv alone fills the chip (one split, no merge): a program then streams a whole sequence, and a
        # tile twice as large keeps more bytes in flight per SM. Measured on an H200 (tune run 2026-11-21,
        # docs/fa_decode.md): B=64, S=4096 268.7 -> 236.9 µs; B=32, S=8192 236.4 -> 235.7 µs.
        block_k = min(256, 2 * block_k)
    n_blocks = max(1, _cdiv(max(int(max_kv), 1), block_k))

    def realized(s: int) -> tuple[int, int]:
        cb = _cdiv(n_blocks, s)
        return cb, _cdiv(n_blocks, cb)

    # Paged caches serve ragged batches whose lengths are runtime values the plan cannot see: with one
    # program per sequence the longest sequence sets the makespan (H200, B=32, lengths in [S/2, S]:
    # 3.93 TB/s against 4.5 dense). Splitting so that programs cover ``paged_min_waves`` waves lets the
    # hardware scheduler fill in behind the short sequences; splits past a sequence's end exit at once.
    # Split sweep (results/fa_decode_tune/20261121_h200_paged_splits.log, B=32, S=8192, page 16, µs
    # uniform/ragged): s=1 245.5/204.5, s=3 250.7/207.1, s=4 259.3/194.9, s=8 253.5/191.2, dense 242.7:
    # about 6 waves serves both. Only when the sequences alone fill half the chip: below that the wave
    # model already makes many short programs.
    s_min = 1
    if page_size is not None and config.paged_min_waves > 1 and 2 * base >= slots:
        s_min = min(n_blocks, _cdiv(config.paged_min_waves * slots, base))
    if config.splits is not None:
        chunk_blocks, splits = realized(min(config.splits, n_blocks))
    else:
        best = None
        for s in range(s_min, min(n_blocks, 256) + 1):
            cb, s_eff = realized(s)
            cost = _cdiv(base * s_eff, slots) * (cb + _PROGRAM_OVERHEAD_TILES) + (2 if s_eff > 1 else 0)
            if best is None or cost < best[0]:
                best = (cost, cb, s_eff)
        _, chunk_blocks, splits = best
    num_warps = config.num_warps or (4 if block_m * d <= 4096 else 8)
    # Paged: the K/V addresses depend on a table load in the same iteration, and Triton's pipeliner puts
    # that load a stage ahead; 5 stages give the K/V loads the same two buffers 3 stages give dense
    # (read off the sm_90 compile: 72 KiB of shared memory either way; 3 stages paged: one buffer, 39 KiB).
    num_stages = config.num_stages or (5 if page_size is not None else 3)
    gather = page_size is not None and page_size < block_k
    return DecodePlan(block_m, row_tiles, block_k, chunk_blocks, splits, num_warps, num_stages, gather)


# --------------------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------------------


def _decode_kernel(
    *refs,
    p: DecodePlan,
    paged: bool,
    causal: bool,
    check: bool,
    scale_log2: float,
    tq: int,
    rows: int,
    hkv: int,
    d: int,
    tk: int,
    q_offset: int,
    page: int,
    pages_per_seq: int,
    num_pages: int,
):
    if paged:
        q_ref, k_ref, v_ref, bt_ref, lens_ref, *out_refs = refs
    else:
        q_ref, k_ref, v_ref, *out_refs = refs
    bm, bk = p.block_m, p.block_k

    pid = pl.program_id(0)
    t = pid % p.row_tiles
    rest = pid // p.row_tiles
    s = rest % p.splits
    bh = rest // p.splits
    b = bh // hkv
    h = bh % hkv

    if paged:
        raw_len = lens_ref[b]
        # A length the table cannot hold is a bad table too: clamp (no read past the table) and flag.
        bad0 = (raw_len < 0) | (raw_len > pages_per_seq * page)
        kv_len = jnp.clip(raw_len, 0, pages_per_seq * page)
        q_off = kv_len - tq
    else:
        bad0 = jnp.zeros((), jnp.bool_)
        kv_len = tk
        q_off = q_offset

    r = t * bm + jnp.arange(bm, dtype=jnp.int32)  # packed row (head-major: g = r // tq, i_q = r % tq)
    row_ok = r < rows
    q_row0 = bh * rows + t * bm
    q = _compat.load(
        q_ref.at[pl.ds(q_row0, bm), pl.ds(0, d)],
        mask=jnp.broadcast_to(row_ok[:, None], (bm, d)),
        other=0.0,
    )
    i_q = r % tq

    lo = s * (p.chunk_blocks * bk)
    hi = jnp.minimum(kv_len, lo + p.chunk_blocks * bk)
    if causal:
        # No row of this program sees a key past the last query position: stop loading there.
        hi = jnp.minimum(hi, q_off + tq)
    n_tiles = jnp.maximum(hi - lo + bk - 1, 0) // bk

    col0 = h * d
    cols = col0 + jnp.arange(d, dtype=jnp.int32)
    seq_tbl0 = b * pages_per_seq

    def kv_tile(j0, j, kmask):
        """Load one [bk, d] K and V tile; returns (k, v, bad) with bad = a table entry was out of range."""
        m2 = jnp.broadcast_to(kmask[:, None], (bk, d))
        if not paged:
            src = pl.ds(b * tk + j0, bk)
            k = _compat.load(k_ref.at[src, pl.ds(col0, d)], mask=m2, other=0.0)
            v = _compat.load(v_ref.at[src, pl.ds(col0, d)], mask=m2, other=0.0)
            return k, v, False
        if not p.paged_gather:
            # page >= bk and tiles start at multiples of bk: the whole tile lies in one page.
            lp = j0 // page
            raw = bt_ref[seq_tbl0 + jnp.minimum(lp, pages_per_seq - 1)]
            bad = (raw < 0) | (raw >= num_pages)
            pg = jnp.clip(raw, 0, num_pages - 1)
            src = pl.ds(pg * page + j0 % page, bk)
            k = _compat.load(k_ref.at[src, pl.ds(col0, d)], mask=m2, other=0.0)
            v = _compat.load(v_ref.at[src, pl.ds(col0, d)], mask=m2, other=0.0)
            return k, v, bad
        lp = j // page
        raw = bt_ref[seq_tbl0 + jnp.minimum(lp, pages_per_seq - 1)]
        bad = jnp.max(jnp.where(kmask & ((raw < 0) | (raw >= num_pages)), 1, 0)) > 0  # no reduce_or in Triton
        src_rows = jnp.clip(raw, 0, num_pages - 1) * page + j % page
        idx = (src_rows[:, None], cols[None, :])
        k = _compat.load(k_ref.at[idx], mask=m2, other=0.0)
        v = _compat.load(v_ref.at[idx], mask=m2, other=0.0)
        return k, v, bad

    def body(i, carry):
        m_run, l_run, acc, bad_run = carry
        j0 = lo + i * bk
        j = j0 + jnp.arange(bk, dtype=jnp.int32)
        kmask = j < hi
        k, v, bad = kv_tile(j0, j, kmask)
        sc = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        sc = sc * scale_log2
        vis = kmask[None, :]
        if causal:
            vis = vis & (j[None, :] <= (i_q + q_off)[:, None])
        sc = jnp.where(vis, sc, -jnp.inf)
        m_new = jnp.maximum(m_run, jnp.max(sc, axis=1))
        alpha = jnp.exp2(m_run - m_new)
        pr = jnp.exp2(sc - m_new[:, None])
        l_new = l_run * alpha + jnp.sum(pr, axis=1)
        acc = acc * alpha[:, None] + jnp.dot(pr.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l_new, acc, bad_run | bad

    init = (
        jnp.full((bm,), _M_INIT, jnp.float32),
        jnp.zeros((bm,), jnp.float32),
        jnp.zeros((bm, d), jnp.float32),
        bad0,
    )
    m_run, l_run, acc, bad = jax.lax.fori_loop(0, n_tiles, body, init)

    has = l_run > 0
    o = acc / jnp.where(has, l_run, 1.0)[:, None]  # a row with no visible key: acc = 0 -> 0
    if check and paged:
        o = jnp.where(bad, jnp.nan, o)
    omask = jnp.broadcast_to(row_ok[:, None], (bm, d))
    if p.splits == 1:
        (o_ref,) = out_refs
        _compat.store(o_ref.at[pl.ds(q_row0, bm), pl.ds(0, d)], o.astype(o_ref.dtype), mask=omask)
    else:
        op_ref, lse_ref = out_refs
        lse = jnp.where(has, m_run + jnp.log2(jnp.where(has, l_run, 1.0)), -jnp.inf)
        _compat.store(op_ref.at[pl.ds(q_row0, bm), s, pl.ds(0, d)], o, mask=omask)
        _compat.store(lse_ref.at[pl.ds(q_row0, bm), s], lse, mask=row_ok)


def _merge_kernel(op_ref, lse_ref, o_ref, *, splits: int, sb: int, d: int):
    """One program per packed output row: LSE-weighted sum of the normalized split partials (§2.0)."""
    row = pl.program_id(0)

    # A loop (not a Python unroll) so the chunk start is dynamic: the last chunk may run past `splits`
    # (masked), which a static slice would reject at trace time.
    def body(c, carry):
        m_run, l_run, acc = carry
        s0 = c * sb
        ok = s0 + jnp.arange(sb, dtype=jnp.int32) < splits
        lse = _compat.load(lse_ref.at[row, pl.ds(s0, sb)], mask=ok, other=-jnp.inf)
        o = _compat.load(
            op_ref.at[row, pl.ds(s0, sb), pl.ds(0, d)],
            mask=jnp.broadcast_to(ok[:, None], (sb, d)),
            other=0.0,
        )
        m_new = jnp.maximum(m_run, jnp.max(lse))
        alpha = jnp.exp2(m_run - m_new)
        w = jnp.exp2(lse - m_new)  # empty split: lse = -inf -> weight 0
        return m_new, l_run * alpha + jnp.sum(w), acc * alpha + jnp.sum(w[:, None] * o, axis=0)

    init = (jnp.full((), _M_INIT, jnp.float32), jnp.zeros((), jnp.float32), jnp.zeros((d,), jnp.float32))
    _, l_run, acc = jax.lax.fori_loop(0, _cdiv(splits, sb), body, init)
    out = acc / jnp.where(l_run > 0, l_run, 1.0)
    o_ref[row, pl.ds(0, d)] = out.astype(o_ref.dtype)


# --------------------------------------------------------------------------------------------------------
# Wrappers
# --------------------------------------------------------------------------------------------------------


def _pack_q(q, hkv: int):
    """[B, Tq, Hq, D] -> [B*Hkv*G*Tq, D], head-major packed rows (free for Tq == 1)."""
    b, tq, hq, d = q.shape
    g = hq // hkv
    return q.reshape(b, tq, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b * hkv * g * tq, d)


def _unpack_o(o, b: int, tq: int, hq: int, hkv: int, d: int):
    g = hq // hkv
    return o.reshape(b, hkv, g, tq, d).transpose(0, 3, 1, 2, 4).reshape(b, tq, hq, d)


def _launch(q, k2, v2, extra, *, p: DecodePlan, paged: bool, causal: bool, check: bool, scale: float,
            b: int, tq: int, hq: int, hkv: int, d: int, tk: int, q_offset: int, page: int,
            pages_per_seq: int, num_pages: int, interpret: bool, config: DecodeConfig):
    rows = (hq // hkv) * tq
    n_rows = b * hkv * rows
    kernel = functools.partial(
        _decode_kernel, p=p, paged=paged, causal=causal, check=check, scale_log2=scale * _LOG2E, tq=tq,
        rows=rows, hkv=hkv, d=d, tk=tk, q_offset=q_offset, page=page, pages_per_seq=pages_per_seq,
        num_pages=num_pages,
    )
    grid = (p.row_tiles * p.splits * b * hkv,)
    params = _compat.triton_params(num_warps=p.num_warps, num_stages=p.num_stages)
    if p.splits == 1:
        return pl.pallas_call(
            kernel, out_shape=jax.ShapeDtypeStruct((n_rows, d), q.dtype), grid=grid,
            compiler_params=params, interpret=interpret, name="pallas_attn_fa_decode_partial",
        )(q, k2, v2, *extra)
    o_part, lse = pl.pallas_call(
        kernel,
        out_shape=(
            jax.ShapeDtypeStruct((n_rows, p.splits, d), jnp.float32),
            jax.ShapeDtypeStruct((n_rows, p.splits), jnp.float32),
        ),
        grid=grid, compiler_params=params, interpret=interpret, name="pallas_attn_fa_decode_partial",
    )(q, k2, v2, *extra)
    sb = min(config.merge_block, _next_pow2(p.splits))
    return pl.pallas_call(
        functools.partial(_merge_kernel, splits=p.splits, sb=sb, d=d),
        out_shape=jax.ShapeDtypeStruct((n_rows, d), q.dtype), grid=(n_rows,),
        compiler_params=_compat.triton_params(num_warps=config.merge_num_warps, num_stages=1),
        interpret=interpret, name="pallas_attn_fa_decode_merge",
    )(o_part, lse)


def _resolve(config) -> DecodeConfig:
    if config is None:
        return CONFIGS["faithful"]
    if isinstance(config, str):
        return CONFIGS[config]
    if not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig, a name in {sorted(CONFIGS)} or None; got {config!r}")
    return config


def _check_common(q, hkv: int, d_kv: int, dtype) -> None:
    if q.ndim != 4:
        raise ValueError(f"q must be [B, Tq, Hq, D]; got {q.shape=}")
    b, tq, hq, d = q.shape
    if jnp.dtype(q.dtype).name not in ("float16", "bfloat16") or jnp.dtype(dtype) != jnp.dtype(q.dtype):
        raise NotImplementedError(f"fa_decode takes float16 or bfloat16 q and KV of the same dtype; got "
                                  f"{q.dtype=}, kv dtype={jnp.dtype(dtype).name}")
    if d not in (64, 128, 256) or d_kv != d:
        raise NotImplementedError(f"fa_decode supports head dims 64, 128, 256 (same for q and KV); got {d=}, {d_kv=}")
    if hq % hkv:
        raise ValueError(f"Hq must be a multiple of Hkv; got Hq={hq}, Hkv={hkv}")
    if not 1 <= tq <= 16:
        raise NotImplementedError(f"fa_decode is a decode kernel for 1 <= Tq <= 16; got Tq={tq}")


def forward(q, k, v, *, causal: bool = False, scale: float | None = None, q_offset: int = 0,
            interpret: bool | None = None, config=None):
    """Dense decode: q ``[B, Tq, Hq, D]``, k/v ``[B, Tk, Hkv, D]`` (BTNH) -> ``[B, Tq, Hq, D]`` in q's dtype."""
    cfg = _resolve(config)
    b, tq, hq, d = q.shape
    if k.ndim != 4 or k.shape != v.shape or k.shape[0] != b:
        raise ValueError(f"k and v must both be [B, Tk, Hkv, D] with q's B; got {k.shape=}, {v.shape=}")
    _, tk, hkv, dk = k.shape
    _check_common(q, hkv, dk, k.dtype)
    if v.dtype != k.dtype:
        raise ValueError(f"k and v must share a dtype; got {k.dtype=}, {v.dtype=}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rows = (hq // hkv) * tq
    p = plan(batch=b, hkv=hkv, rows=rows, d=d, max_kv=tk, config=cfg)
    o = _launch(
        _pack_q(q, hkv), k.reshape(b * tk, hkv * d), v.reshape(b * tk, hkv * d), (), p=p, paged=False,
        causal=bool(causal), check=False, scale=scale, b=b, tq=tq, hq=hq, hkv=hkv, d=d, tk=tk,
        q_offset=int(q_offset), page=1, pages_per_seq=1, num_pages=1,
        interpret=_compat.default_interpret(interpret), config=cfg,
    )
    return _unpack_o(o, b, tq, hq, hkv, d)


def validate_block_table(block_table, kv_lens, *, num_pages: int, page_size: int) -> None:
    """Eager check of a concrete block table: every page a sequence uses lies in ``[0, num_pages)``.

    Raises ValueError naming the first bad sequence. Under jit use the in-kernel check instead.
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


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool = False, scale: float | None = None,
                  interpret: bool | None = None, config=None, check_block_table: bool = True):
    """Paged decode over pools ``[num_pages, page, Hkv, D]`` with an int32 table ``[B, pages_per_seq]`` and
    int32 ``kv_lens [B]`` (ragged). Causal uses ``q_offset = kv_len[b] - Tq``."""
    cfg = _resolve(config)
    b, tq, hq, d = q.shape
    if k_pool.ndim != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"k_pool and v_pool must both be [num_pages, page, Hkv, D]; got {k_pool.shape=}, "
                         f"{v_pool.shape=}")
    num_pages, page, hkv, dk = k_pool.shape
    _check_common(q, hkv, dk, k_pool.dtype)
    if v_pool.dtype != k_pool.dtype:
        raise ValueError(f"k_pool and v_pool must share a dtype; got {k_pool.dtype=}, {v_pool.dtype=}")
    if not _is_pow2(page):
        raise ValueError(f"page_size must be a power of two; got {page}")
    if block_table.ndim != 2 or block_table.shape[0] != b or jnp.dtype(block_table.dtype) != jnp.int32:
        raise ValueError(
            f"block_table must be int32 [B, pages_per_seq]; got {block_table.shape=}, {block_table.dtype=}"
        )
    if kv_lens.shape != (b,) or jnp.dtype(kv_lens.dtype) != jnp.int32:
        raise ValueError(f"kv_lens must be int32 [B]; got {kv_lens.shape=}, {kv_lens.dtype=}")
    pages_per_seq = block_table.shape[1]
    if check_block_table:
        try:
            bt_np, lens_np = np.asarray(block_table), np.asarray(kv_lens)
        except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
            pass  # traced: the kernel poisons the sequence's output with NaN instead
        else:
            validate_block_table(bt_np, lens_np, num_pages=num_pages, page_size=page)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    rows = (hq // hkv) * tq
    p = plan(batch=b, hkv=hkv, rows=rows, d=d, max_kv=pages_per_seq * page, config=cfg, page_size=page)
    extra = (block_table.reshape(-1), kv_lens)
    o = _launch(
        _pack_q(q, hkv), k_pool.reshape(num_pages * page, hkv * d), v_pool.reshape(num_pages * page, hkv * d),
        extra, p=p, paged=True, causal=bool(causal), check=bool(check_block_table), scale=scale, b=b, tq=tq,
        hq=hq, hkv=hkv, d=d, tk=0, q_offset=0, page=page, pages_per_seq=pages_per_seq, num_pages=num_pages,
        interpret=_compat.default_interpret(interpret), config=cfg,
    )
    return _unpack_o(o, b, tq, hq, hkv, d)
