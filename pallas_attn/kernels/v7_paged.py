"""v7_paged: v6's split-KV decode with K/V gathered from a paged pool through a block table (docs/reference.md §2.7).

Delta from v6_splitkv: K and V come from physical pools ``[num_pages, page, H, D]`` through the per-sequence
block table (``kv_source``, docs/reference.md §1.3); every key is gathered on its own (a split may start and
end anywhere in a page); the causal mask is ``j <= i + q_offset[b]`` with the paged default offset
``kv_len - Tq`` (set by the API), so a decode query sees its whole cache. Lengths are per sequence
(``kv_lens``, ragged); keys at or past a sequence's length are never read. Everything else is v6's: grid
``(ceil(Tq/8), S, B*H)``, 8 query rows per program (the reference's 8 warps), key tile TN = 64 (D=64) /
32 (D=128), K/V staged FP16 and upcast to FP32 (the reference's FP32 smem tile), CUDA-core FP32
arithmetic (no dot), one partial pass writing the shared split state (``splitkv``) and the shared merge.
``choose_splits`` is the reference's with its 40 SMs (``faithful``) or the device's count (``device_sm``).
v7 is MHA only, as in the reference: GQA is v8_gqa's (its ``supports()`` refuses Hq != Hkv).

**The recurrence, per key.** The reference advances each row's online softmax once per key (a warp per
row: shuffle-reduced dot, then the update). Triton has no warp-per-row idiom and no addressable shared
memory, so the faithful program here stages one tile as TN separate one-key loads (each through the
table, all issued before the tile's compute, as the reference's cooperative gather fills smem) and then
runs TN dependent updates, all 8 rows of the program vectorized (the reference's 8 warps in lock-step).
``update_keys`` is the knob: 1 (faithful, per key), 32 (v8_gqa_ss's one update per 32 keys) or None (one
update per staged tile: what our v4/v6 Pallas twins do, Triton's natural block form; the ``per_tile``
config, so v7-vs-v6 can be measured on the paging alone).

This module also holds what the whole paged family (v7, the v8 family) shares: the config, the partial
kernel skeleton (program -> (row tile, split, b, h_kv), lengths, offsets, split range, the split-state
store, bad-table poisoning), the wrapper (host cast, M-packing, ``choose_splits``, launch, merge, unpack)
and the plan. A generation supplies its ``attend`` (the tile loop) and its rows per program. The v8 family
packs ``G = Hq / Hkv`` query heads x Tq positions into the program's rows (``gqa``); with G = 1 the packed
rows are v7's query positions, which is why v7 runs through the same skeleton.

Precision: FP32 input is cast to FP16 before the kernel (the reference host's cast, declared in
``KERNEL.precision``); FP16 is staged as is. Tiles are upcast to FP32 (``stage_fp32``) or kept 16-bit and
upcast at use (v8_gqa_occ), accumulation FP32. Output in q's dtype; ``return_lse`` gives the merged
natural-log LSE.

Block tables: page indices are clamped in the kernel (no out-of-bounds read, ever); with
``check_block_table`` a page index outside the pool among the pages a sequence uses, or a ``kv_len`` the
table cannot hold, raises ValueError on concrete inputs and, under jit, makes that sequence's output NaN.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from attn_core import splits as split_plan

from .. import _compat
from .._compat import pl
from . import common as c
from . import gqa, seqlen, softmax, splitkv
from . import launches as _l
from .contract import Kernel, Precision, Problem
from .kv_source import KVLayout, KVSource, flat_pool, validate_block_table

__all__ = ["PagedConfig", "CONFIGS", "KERNEL", "Family", "Launch", "paged_forward", "attend_cuda_cores", "make_plan",
           "run", "cuda_core_launch", "cuda_core_plan", "cuda_core_precision"]

GEN = "v7_paged"
MAX_GRID_Z = 65535  # CUDA's grid.y / grid.z limit: B*Hkv programs along z


@dataclasses.dataclass(frozen=True)
class PagedConfig:
    """Knobs of the paged CUDA-core decode kernel (v7_paged and the v8 family built on it).

    rows: packed rows per program (the reference's 8 warps). key_tile_d64 / _d128: keys staged per tile
    (TN). update_keys: keys per online-softmax update (1 = per key, the reference's Cut 1; 32 = v8_gqa_ss;
    None = the whole tile). key_ilp: independent key dots issued before their updates (v8_gqa_ilp's KU).
    prefetch: load tile t+1 before computing tile t, carried in registers (v8_gqa_db's explicit double
    buffer with ordinary loads). stage_fp32: upcast the staged tile to FP32 at load (the reference's FP32
    smem tile) or keep it 16-bit and upcast at use (v8_gqa_occ, db, ss). num_sm: SMs ``choose_splits``
    assumes (40: the reference's T4 constant; None: this device). num_splits forces S.
    """

    rows: int = split_plan.ROWS_PER_PROGRAM
    key_tile_d64: int = 64
    key_tile_d128: int = 32
    update_keys: int | None = 1
    key_ilp: int = 1
    prefetch: bool = False
    stage_fp32: bool = True
    num_warps: int = 8
    num_stages: int = 1
    num_sm: int | None = split_plan.REFERENCE_NUM_SM
    num_splits: int | None = None
    s_cap: int = split_plan.S_CAP
    min_chunk: int = split_plan.MIN_CHUNK
    merge_num_warps: int | None = None  # None: D/32 (the reference's D threads)
    fp32_stage_dtype: str = "float16"
    host_cast: bool = False  # fp32 input: refused unless asked; then cast on the host as the reference does

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("rows", "key_tile_d64", "key_tile_d128", "num_warps", "key_ilp"):
            c.check_pow2(owner, name, getattr(self, name))
        for name in ("num_stages", "s_cap", "min_chunk"):
            c.check_positive(owner, name, getattr(self, name))
        for name in ("num_sm", "num_splits"):
            if getattr(self, name) is not None:
                c.check_positive(owner, name, getattr(self, name))
        if self.update_keys is not None:
            c.check_pow2(owner, "update_keys", self.update_keys)
            for name in ("key_tile_d64", "key_tile_d128"):
                if getattr(self, name) % self.update_keys:
                    raise ValueError(f"{owner}.update_keys={self.update_keys} must divide {name}="
                                     f"{getattr(self, name)} (a tile holds whole update groups)")
        if self.key_ilp > 1 and self.update_keys != 1:
            raise ValueError(f"{owner}.key_ilp={self.key_ilp} needs update_keys=1 (ILP over per-key updates)")
        if self.merge_num_warps is not None:
            c.check_pow2(owner, "merge_num_warps", self.merge_num_warps)
        if self.fp32_stage_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"{owner}.fp32_stage_dtype must be 'float16' or 'bfloat16'; got {self.fp32_stage_dtype!r}")
        if not isinstance(self.prefetch, bool) or not isinstance(self.stage_fp32, bool):
            raise ValueError(f"{owner}.prefetch and stage_fp32 must be bools")

    def key_tile(self, d: int) -> int:
        return c.per_head_dim(GEN, d, d64=self.key_tile_d64, d128=self.key_tile_d128)

    def group(self, d: int) -> int:
        """Keys per online-softmax update at head dim ``d``."""
        return self.key_tile(d) if self.update_keys is None else min(self.update_keys, self.key_tile(d))

    def sm_count(self) -> int:
        return self.num_sm or _compat.device_sm_count()

    def merge_warps(self, d: int) -> int:
        return self.merge_num_warps or max(1, d // 32)

    def splits(self, *, bh: int, rows: int, n_k: int) -> tuple[int, int]:
        """``(S, chunk)``: the override, else the reference's ``choose_splits`` over ``bh`` (B*Hkv)
        programs of ``ceil(rows / self.rows)`` row tiles each."""
        n_k = max(int(n_k), 1)
        if self.num_splits is not None:
            s = min(self.num_splits, n_k)
            return s, c.cdiv(n_k, s)
        return split_plan.choose_splits(bh=bh, n_q=rows, n_k=n_k, num_sm=self.sm_count(),
                                        rows_per_program=self.rows, s_cap=self.s_cap, min_chunk=self.min_chunk)


CONFIGS: dict[str, PagedConfig] = {
    "faithful": PagedConfig(),  # the reference: 40 SMs in choose_splits, per-key recurrence, FP32 stage
    "device_sm": PagedConfig(num_sm=None),  # the same with this device's SM count
    # one update per staged tile (our v6's granularity): v7:per_tile vs v6:faithful isolates the paging
    "per_tile": PagedConfig(update_keys=None, num_sm=None),
}


# --------------------------------------------------------------------------------------------------------
# The tile loop on CUDA cores (v7, v8_gqa and its knobs, v8_gqa_ss)
# --------------------------------------------------------------------------------------------------------


def attend_cuda_cores(q, src: KVSource, *, lo, hi, i_q, q_off, causal: bool, scale: float, tile: int,
                      group: int, key_ilp: int = 1, prefetch: bool = False, stage_fp32: bool = True):
    """Online softmax of the program's rows ``q [R, D]`` over keys ``[lo, hi)`` on CUDA cores.

    Tiles of ``tile`` keys are staged, then the recurrence advances once per ``group`` keys:

    * ``group == 1`` (the reference's per-key loop): the tile is one load (``src.block_k == tile``), its
      scores ``[R, tile]`` one broadcast-multiply + sum over D; then a loop over the tile's keys takes key
      c's score with a masked row-sum (a cross-lane reduction, as the reference's per-key shuffle
      reduction is) and applies the update to ``(m, l)``. Its ``p`` enters a per-tile weight vector ``w``
      that every later key's ``alpha`` rescales, so O gets exactly the per-key rescale of the reference;
      ``p V`` is one broadcast-multiply + sum per tile (Triton cannot address one key of a register
      tile). ``key_ilp`` keys' scores are taken before their updates (v8_gqa_ilp's KU).
    * ``group > 1`` (v8_gqa_ss: 32; a whole tile): ``tile // group`` loads of ``group`` keys (``src.block_k
      == group``), and one update per group: scores, one max, one sum, ``p V`` as a broadcast-multiply +
      sum over the group's keys.

    ``prefetch`` loads tile t+1 before computing tile t and carries it through the loop (ordinary loads,
    v8_gqa_db). ``stage_fp32``: upcast at load, else keep the 16-bit tile and upcast at use. Returns
    ``(m, l, acc, bad)``.
    """
    rows, d = q.shape
    q32 = q.astype(jnp.float32)
    f32 = jnp.float32
    n_loads = 1 if group == 1 else tile // group
    width = tile // n_loads  # keys per load
    n_tiles = c.cdiv(jnp.maximum(hi - lo, 0), tile)

    def stage(t):
        j0 = lo + t * tile
        ks, vs, bad = [], [], jnp.zeros((), jnp.bool_)
        for g in range(n_loads):
            g0 = j0 + g * width
            j = g0 + jnp.arange(width, dtype=jnp.int32)
            k, v, bd = src.tile(g0, j, j < hi)
            if stage_fp32:
                k, v = k.astype(f32), v.astype(f32)
            ks.append(k)
            vs.append(v)
            # a page only counts as bad if this load really needs it (its first key is in range)
            bad = bad | (jnp.asarray(bd) & (g0 < hi))
        return tuple(ks), tuple(vs), bad

    def visible(j):
        vis = (j < hi)[None, :]
        if causal:
            vis = vis & (j[None, :] <= (i_q + q_off)[:, None])
        return vis

    def scores(k):
        return jnp.sum(q32[:, None, :] * k.astype(f32)[None, :, :], axis=-1) * scale

    def compute_groups(t, staged, state):
        ks, vs, _ = staged
        j0 = lo + t * tile
        m, l, acc = state
        for g in range(n_loads):
            j = j0 + g * width + jnp.arange(width, dtype=jnp.int32)
            m, l, alpha, p = softmax.step(m, l, scores(ks[g]), visible(j))
            acc = acc * alpha[:, None] + jnp.sum(p[:, :, None] * vs[g].astype(f32)[None, :, :], axis=1)
        return m, l, acc

    def compute_per_key(t, staged, state):
        (k,), (v,), _ = staged
        j = lo + t * tile + jnp.arange(tile, dtype=jnp.int32)
        s_all = jnp.where(visible(j), scores(k), -jnp.inf)  # [R, tile]
        col = jnp.arange(tile, dtype=jnp.int32)[None, :]
        m0, l0, acc = state

        def keys(step, carry):
            m, l, w = carry
            c0 = step * key_ilp
            # key_ilp independent score extractions first, then their updates in order
            s_cs = [jnp.sum(jnp.where(col == c0 + u, s_all, 0.0), axis=1) for u in range(key_ilp)]
            for u, s_c in enumerate(s_cs):
                m_new = jnp.maximum(m, s_c)
                alpha = jnp.exp(m - m_new)
                p = jnp.exp(s_c - m_new)
                l = l * alpha + p
                w = w * alpha[:, None] + jnp.where(col == c0 + u, p[:, None], 0.0)
                m = m_new
            return m, l, w

        m, l, w = jax.lax.fori_loop(0, tile // key_ilp, keys, (m0, l0, jnp.zeros((rows, tile), f32)))
        acc = acc * jnp.exp(m0 - m)[:, None] + jnp.sum(w[:, :, None] * v.astype(f32)[None, :, :], axis=1)
        return m, l, acc

    compute = compute_per_key if group == 1 else compute_groups
    init = softmax.init_state((rows,), d)
    no_bad = jnp.zeros((), jnp.bool_)
    if not prefetch:
        def body(t, carry):
            state, bad = carry
            staged = stage(t)
            return compute(t, staged, state), bad | staged[2]

        (m, l, acc), bad = jax.lax.fori_loop(0, n_tiles, body, (init, no_bad))
        return m, l, acc, bad

    def body_pf(t, carry):
        state, cur, bad = carry
        nxt = stage(t + 1)  # issued before tile t's compute; keys past hi are masked (no traffic)
        return compute(t, cur, state), nxt, bad | cur[2]

    (m, l, acc), _, bad = jax.lax.fori_loop(0, n_tiles, body_pf, (init, stage(0), no_bad))
    return m, l, acc, bad


# --------------------------------------------------------------------------------------------------------
# The partial kernel skeleton and the wrapper, shared by the family
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Geometry:
    """Static facts of one partial launch."""

    rows: int  # packed rows per (b, h_kv): G * Tq
    rpp: int  # rows per program
    tq: int
    hkv: int
    splits: int
    chunk: int
    causal: bool
    check: bool


def _partial_kernel(q_ref, k_ref, v_ref, bt_ref, lens_ref, off_ref, *refs, geo: Geometry,
                    lay: KVLayout, attend: Callable, dequant: Callable | None, n_quant: int = 0):
    # refs: the quantized pools' operands (``n_quant``: micro pools when lay.micro, then the scales
    # [scale_k, scale_v]), then the outputs o_ref, lse_ref
    quant_refs, (o_ref, lse_ref) = refs[:n_quant], refs[n_quant:]
    rpp, d = geo.rpp, lay.d
    t, sp, bh = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    b, h = bh // geo.hkv, bh % geo.hkv
    kv_len, bad0 = seqlen.clamp_len(lens_ref[b], lay.capacity)
    r = t * rpp + jnp.arange(rpp, dtype=jnp.int32)
    row_ok = r < geo.rows
    row0 = bh * geo.rows + t * rpp
    q = _compat.load(q_ref.at[pl.ds(row0, rpp), pl.ds(0, d)], mask=jnp.broadcast_to(row_ok[:, None], (rpp, d)),
                     other=0.0)
    _, i_q = gqa.row_position(r, geo.tq)
    lo = sp * geo.chunk
    hi = jnp.minimum(kv_len, lo + geo.chunk)
    q_off = None
    if geo.causal:
        q_off = jnp.clip(seqlen.offset_of(off_ref, b), -geo.tq, lay.capacity)
        # no row of this program sees a key past its last query position (the reference: stop at j > i)
        last = jnp.max(jnp.where(row_ok, i_q, -1))
        hi = jnp.minimum(hi, last + q_off + 1)
    km_ref, vm_ref = quant_refs[:2] if lay.micro else (None, None)
    hook = dequant
    if n_quant:  # a quantized pool: the hook also gets the two tensor scales
        sk, sv = quant_refs[-1][0], quant_refs[-1][1]

        def hook(k, v):
            return dequant(k, v, sk, sv)
    src = KVSource(lay, k_ref, v_ref, bt_ref, b=b, h=h, dequant=hook, k_micro_ref=km_ref, v_micro_ref=vm_ref)
    m, l, acc, bad = attend(q, src, lo=lo, hi=hi, i_q=i_q, q_off=q_off)
    o, lse = splitkv.partial(m, l, acc, base2=False)
    if geo.check:
        o = jnp.where(bad | bad0, jnp.nan, o)
    _compat.store(o_ref.at[pl.ds(row0, rpp), sp, pl.ds(0, d)], o,
                  mask=jnp.broadcast_to(row_ok[:, None], (rpp, d)))
    _compat.store(lse_ref.at[pl.ds(row0, rpp), sp], lse, mask=row_ok)


@dataclasses.dataclass(frozen=True)
class Launch:
    """How one generation of the paged family launches at one head dim: rows per program, keys per
    KVSource load, its ``attend`` (the tile loop) and its launch knobs."""

    rpp: int
    block_k: int  # keys per KVSource load
    attend: Callable
    num_warps: int
    num_stages: int
    merge_warps: int
    stage_dtype: str  # what FP32 input is cast to on the host


@dataclasses.dataclass(frozen=True)
class Family:
    """A generation's name (its pass names), its config and the module-level function that turns
    ``(config, d)`` into its ``Launch``. Hashable by value, so the jitted wrapper caches per config."""

    gen: str
    config: object
    launch: Callable


def stage(x, dtype: str):
    """The reference decode host's cast: FP32 becomes ``dtype`` (FP16); 16-bit inputs stay as they are."""
    return x.astype(dtype) if x.dtype == jnp.float32 else x


def check_shapes(gen: str, q, k_pool, v_pool, block_table, kv_lens, *, gqa_ok: bool, width: int | None = None) -> None:
    """What the wrapper relies on (the API validates the public path; compare may call a kernel directly).
    ``width``: the pools' storage columns per head when they are not D (NVFP4 packed nibbles: D/2)."""
    if q.ndim != 4 or k_pool.ndim != 4 or k_pool.shape != v_pool.shape:
        raise ValueError(f"{gen}: q [B, Tq, Hq, D] and pools [num_pages, page, Hkv, D] of equal shape; got "
                         f"{q.shape=}, {k_pool.shape=}, {v_pool.shape=}")
    b, _, hq, d = q.shape
    _, page, hkv, dk = k_pool.shape
    if dk != (d if width is None else width) or hq % hkv:
        raise ValueError(f"{gen}: pools must share D with q and Hq must be a multiple of Hkv; got {q.shape=}, "
                         f"{k_pool.shape=}")
    if hq != hkv and not gqa_ok:
        raise NotImplementedError(f"{gen} is MHA (Hq == Hkv) as in the reference; got Hq={hq}, Hkv={hkv} "
                                  "(GQA is v8_gqa's)")
    if page < 1 or page & (page - 1):
        raise ValueError(f"{gen}: page_size (k_pool.shape[1]) must be a power of two; got {page}")
    if block_table.ndim != 2 or block_table.shape[0] != b or jnp.dtype(block_table.dtype) != jnp.int32:
        raise ValueError(f"{gen}: block_table must be int32 [B={b}, pages_per_seq]; got {block_table.shape=}, "
                         f"{block_table.dtype=}")
    if tuple(kv_lens.shape) != (b,) or jnp.dtype(kv_lens.dtype) != jnp.int32:
        raise ValueError(f"{gen}: kv_lens must be int32 [B={b}]; got {kv_lens.shape=}, {kv_lens.dtype=}")
    if b * hkv > MAX_GRID_Z:
        raise NotImplementedError(f"{gen}: B*Hkv = {b * hkv} programs exceed the grid's z limit {MAX_GRID_Z}")


@functools.partial(jax.jit, static_argnames=("fam", "splits", "chunk", "causal", "scale", "interpret",
                                             "return_lse", "check", "dequant"))
def _paged(q, k_pool, v_pool, block_table, kv_lens, q_offset, quant=(), *, fam: Family, splits: int, chunk: int,
           causal: bool, scale: float, interpret: bool, return_lse: bool, check: bool, dequant=None):
    gen = fam.gen
    b, tq, hq, d = q.shape
    num_pages, page, hkv, w = k_pool.shape
    out_dtype = q.dtype
    ln = fam.launch(fam.config, d)
    q, k_pool, v_pool = (stage(x, ln.stage_dtype) for x in (q, k_pool, v_pool))
    rows = (hq // hkv) * tq
    n_rows = b * hkv * rows
    pps = block_table.shape[1]
    # A load lies in one page only if it starts at a multiple of its width and the page holds it. The
    # reference's chunk = ceil(N / S) is any number, so a split (and every load after its start) may
    # straddle pages: then each key is gathered through the table on its own, as the reference does.
    # quant: () for 16-bit pools; (scales,) for fp8 bytes; (k_micro, v_micro, scales) for NVFP4 (pools [.., D/2])
    micro = quant[0].shape[-1] if len(quant) == 3 else 0
    lay = KVLayout(paged=True, block_k=ln.block_k, d=d, page=page, pages_per_seq=pps, num_pages=num_pages,
                   gather=page < ln.block_k or chunk % ln.block_k != 0, width=0 if w == d else w, micro=micro)
    quant_args = tuple(flat_pool(x) for x in quant[:-1]) + tuple(quant[-1:])
    geo = Geometry(rows=rows, rpp=ln.rpp, tq=tq, hkv=hkv, splits=splits, chunk=chunk, causal=causal, check=check)
    attend = functools.partial(ln.attend, causal=causal, scale=scale)
    o_part, lse_part = pl.pallas_call(
        functools.partial(_partial_kernel, geo=geo, lay=lay, attend=attend, dequant=dequant, n_quant=len(quant)),
        out_shape=(jax.ShapeDtypeStruct((n_rows, splits, d), jnp.float32),
                   jax.ShapeDtypeStruct((n_rows, splits), jnp.float32)),
        grid=(c.cdiv(rows, ln.rpp), splits, b * hkv),
        compiler_params=_compat.triton_params(num_warps=ln.num_warps, num_stages=ln.num_stages),
        interpret=interpret,
        name=f"pallas_attn_{gen}_partial",
    )(gqa.pack_q(q, hkv), flat_pool(k_pool), flat_pool(v_pool), block_table.reshape(-1), kv_lens,
      q_offset.astype(jnp.int32), *quant_args)
    res = splitkv.merge(o_part, lse_part, out_dtype=out_dtype, interpret=interpret,
                        name=f"pallas_attn_{gen}_merge", num_warps=ln.merge_warps, return_lse=return_lse)
    o, lse = res if return_lse else (res, None)
    out = gqa.unpack_o(o, b, tq, hq, hkv)
    return (out, gqa.unpack_lse(lse, b, tq, hq)) if return_lse else out


def run(fam: Family, cfg, q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
        interpret: bool, return_lse: bool, check_block_table: bool, gqa_ok: bool, dequant=None, quant=(),
        width: int | None = None):
    """The family's ``paged`` entry: checks, eager table validation, ``choose_splits``, launch. A quantized
    pool passes its storage pools as ``k_pool`` / ``v_pool`` (uint8, ``width`` columns per head), its other
    operands as ``quant`` and a ``dequant(k, v, scale_k, scale_v)`` hook (v9_fp8 / v10_nvfp4)."""
    check_shapes(fam.gen, q, k_pool, v_pool, block_table, kv_lens, gqa_ok=gqa_ok, width=width)
    for x in (q, k_pool, v_pool):  # the cast itself happens in _paged (stage), the output keeping q's dtype
        c.check_host_cast(x, cfg, gen=fam.gen, alternatives="pass float16 arrays")
    b, tq, hq, _ = q.shape
    num_pages, page, hkv, _ = k_pool.shape
    if check_block_table:
        c.validate_table_if_concrete(validate_block_table, block_table, kv_lens, num_pages=num_pages, page_size=page)
    splits, chunk = cfg.splits(bh=b * hkv, rows=(hq // hkv) * tq, n_k=block_table.shape[1] * page)
    off = seqlen.q_offsets(q_offset, b)
    return _paged(q, k_pool, v_pool, block_table, kv_lens, off, tuple(quant), fam=fam, splits=splits, chunk=chunk,
                  causal=bool(causal), scale=float(scale), interpret=bool(interpret), return_lse=bool(return_lse),
                  check=bool(check_block_table), dequant=dequant)


def cuda_core_launch(cfg: PagedConfig, d: int) -> Launch:
    """The Launch of a CUDA-core config at head dim ``d`` (v7, v8_gqa and its knobs, v8_gqa_ss)."""
    tile, group = cfg.key_tile(d), cfg.group(d)
    attend = functools.partial(attend_cuda_cores, tile=tile, group=group, key_ilp=cfg.key_ilp,
                               prefetch=cfg.prefetch, stage_fp32=cfg.stage_fp32)
    return Launch(rpp=cfg.rows, block_k=tile if group == 1 else group, attend=attend, num_warps=cfg.num_warps,
                  num_stages=cfg.num_stages, merge_warps=cfg.merge_warps(d), stage_dtype=cfg.fp32_stage_dtype)


def paged_forward(q, k_pool, v_pool, block_table, kv_lens, *, causal: bool, scale: float, q_offset,
                  interpret: bool, config: PagedConfig = CONFIGS["faithful"], return_lse: bool = False,
                  check_block_table: bool = True):
    """v7_paged on validated arrays (the contract's ``paged`` convention): BTNH q ``[B, Tq, H, D]``, pools
    ``[num_pages, page, H, D]``, int32 ``block_table [B, P]``, ``kv_lens [B]``, ``q_offset [B]``."""
    return run(Family(GEN, config, cuda_core_launch), config, q, k_pool, v_pool, block_table, kv_lens,
               causal=causal, scale=scale, q_offset=q_offset, interpret=interpret, return_lse=return_lse,
               check_block_table=check_block_table, gqa_ok=False)


# --- contract --------------------------------------------------------------------------------------------


def make_plan(problem: Problem, *, rpp: int, key_tile: int, group: int, num_warps: int, num_stages: int,
              splits: tuple[int, int], num_sm: int, merge_warps: int, extra: dict | None = None) -> dict:
    """The launch plan a record carries (grid per pass, rows per program, tiles, splits)."""
    p = problem
    rows = p.group * p.q_len
    s, chunk = splits
    out = {
        "splits": s, "chunk": chunk, "num_sm": num_sm,
        "partial": {"grid": [c.cdiv(rows, rpp), s, p.batch * p.heads_kv], "rows_per_program": rpp,
                    "packed_rows": rows, "key_tile": key_tile, "keys_per_update": group,
                    "num_warps": num_warps, "num_stages": num_stages,
                    "programs": c.cdiv(rows, rpp) * s * p.batch * p.heads_kv},
        "merge": {"grid": [p.batch * p.heads_q * p.q_len], "rows_per_program": 1, "num_warps": merge_warps},
        "workspace_floats_per_row_split": p.head_dim + 1,
    }
    out["partial"].update(extra or {})
    return out


def cuda_core_plan(problem: Problem, config: PagedConfig) -> dict:
    d = problem.head_dim
    return make_plan(problem, rpp=config.rows, key_tile=config.key_tile(d), group=config.group(d),
                     num_warps=config.num_warps, num_stages=config.num_stages,
                     splits=config.splits(bh=problem.batch * problem.heads_kv, rows=problem.group * problem.q_len,
                                          n_k=problem.kv_len),
                     num_sm=config.sm_count(), merge_warps=config.merge_warps(d),
                     extra={"key_ilp": config.key_ilp, "prefetch": config.prefetch, "stage_fp32": config.stage_fp32})


UPCAST = "16-bit staged K/V tiles; CUDA-core fp32 arithmetic (broadcast-multiply + sum, no dot)"


def cuda_core_precision() -> dict[str, Precision]:
    return {
        "float16": Precision(operand="fp16", accumulate="fp32", engine="fp32", note=UPCAST),
    }


def paged_launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan). The paged
    family (v7_paged, v8_gqa and its db / occ / ilp knobs, v8_gqa_ss, v8_gqa_tc), from the
    plan ``kernels.v7_paged.make_plan`` writes: grid (row tiles, splits, B*Hkv), R packed rows per program,
    key tiles of TN, ``keys_per_update`` keys per online-softmax update (1: per key; TN: per tile)."""
    del hw, cfg
    d, tk = s.head_dim, s.kv_len
    pp = lp["partial"]
    P, R, tn = pp["programs"], pp["rows_per_program"], pp["key_tile"]
    grp = pp.get("keys_per_update") or tn
    row_tiles = pp["grid"][0]
    keys = max(1.0, min(lp["chunk"], tk) * s.vis_frac)  # the busiest program's keys
    tiles = max(1, math.ceil(keys / tn))
    # fp16 pools (fp32 input is cast before the kernel); v9_fp8 / v10_nvfp4 read their storage bytes and decode
    # in the gather (a few ALU ops per element against R x D FMA units per key: under 1% here, not priced)
    kv = 2 * s.heads_kv * _l.kv_tokens(s) * d * _l.kv_bytes(s)  # every sequence's own length (ragged: their sum)
    ws = s.batch * s.heads_kv * pp["packed_rows"] * lp["splits"] * (d + 1) * 4
    dram = kv + s.bh * s.q_len * d * 2 + ws
    l2 = (row_tiles - 1) * kv  # G*Tq > R: every further row tile re-stages the same K/V
    out = _l.cast_launches(s, "host")
    st = pp.get("num_stages", 1)
    if "padded_rows" in pp:  # v8_gqa_tc: one 16-row M tile per program, both products 16-bit MMAs
        # unpipelined (num_stages 1): each block's K/V load waits on its block-table read, one exposed gather
        out.append(_l.Launch(names[0], "pallas_attn_paged_tc", P, 32 * pp["num_warps"], 128,
                             (R * d + 2 * tn * d * max(1, st - 1)) * 2, units=4 * R * tn * d * tiles, steps=tiles,
                             gather_steps=tiles if st <= 1 else 0.0, dram_bytes=dram, l2_bytes=l2, unit="MMA FLOP",
                             note=f"{R} padded rows x {tn}-key blocks, one update per block"))
    else:
        per_key = grp == 1
        steps = tiles if per_key else tiles * max(1, tn // grp)
        # per tile: R x TN x D scores and p.V; a per-key update also sweeps the [R, TN] tile twice (masked
        # row-sum for key c's score, rescale of the weight vector). Issue-bound on the SM (the co-resident
        # programs of the busiest SM share it); the live [R, width, D] FP32 product per thread (``live_values``:
        # layer 2 prices the share beyond its threshold as spilled)
        units = R * tiles * tn * (d + (2 * tn if per_key else 0))
        width = tn if per_key else grp
        live = R * width * d / (32 * pp["num_warps"])
        out.append(_l.Launch(names[0], "pallas_attn_paged_cuda_cores", P, 32 * pp["num_warps"], 128, 0,
                             units=units, steps=steps, live_values=live, dram_bytes=dram,
                             l2_bytes=l2, unit="row x key x dim",
                             note=(f"{R} rows vectorized, {tn}-key tiles, one update per "
                                   + ("key" if per_key else f"{grp} keys")
                                   + f"; {live:.0f} live product values per thread")))
    m = lp["merge"]
    out.append(_l.merge_launch(names[1], math.prod(m["grid"]), m["num_warps"], lp["splits"], d,
                               ws + s.bh * s.q_len * d * s.in_bytes))
    return out


def family_kernel(gen: str, *, configs, paged, config_cls=None, dtypes=("float16",), precision=None, gqa=True,
                  plan=None) -> Kernel:
    """The declaration every paged-family kernel shares (two passes, partial + merge, on the paged entry, head
    dims 64 / 128, any Tq); each generation names only what differs. fp16 only: fp32 input is refused by the
    API; the reference host's cast is ``host_cast=True`` on the kernel module's config (v7_paged shows it)."""
    return Kernel(
        name=gen,
        lowering="triton",
        passes=(f"pallas_attn_{gen}_partial", f"pallas_attn_{gen}_merge"),
        config_cls=config_cls or PagedConfig,
        configs=configs,
        entries={"paged"},
        dtypes=tuple(dtypes),
        precision=precision if precision is not None else {d: cuda_core_precision()[d] for d in dtypes},
        head_dims=(64, 128),
        gqa=gqa,
        max_q_len=None,
        paged=paged,
        plan=plan or cuda_core_plan,
        launches=paged_launches,
    )


KERNEL = family_kernel(
    GEN, configs=CONFIGS, paged=paged_forward, gqa=False,
    precision={"float16": dataclasses.replace(
        cuda_core_precision()["float16"],
        note="fp16 operands; float32 input is refused (no silent cast): a config with host_cast=True, called on "
             "the kernel module, casts it to fp16 before the kernel as the reference host does; " + UPCAST)})
