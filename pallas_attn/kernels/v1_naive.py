"""v1_naive: three passes with the full score matrix S in HBM, FP32 throughout (docs/reference.md §2.1).

What it computes: ``O = softmax(scale * Q K^T [+ causal]) V`` for FP32 BTNH inputs, in three
``pallas_call``s, each reading its operands straight from HBM with no reuse across rows:

1. ``pallas_attn_v1_naive_qk``: S = scale * Q K^T as FP32 ``[B*H*Tq, Tk]`` in HBM. One program per
   (query row, chunk of ``qk_keys`` keys): the reference's 256-thread block with one thread per S element.
   The dot is a CUDA-core multiply + sum (no tensor cores, no tiles shared between rows).
2. ``pallas_attn_v1_naive_softmax``: row softmax *in place* (the S buffer is aliased to the output), in
   three sweeps per row (max over visible keys; write ``exp(s - m)`` and sum, zeroing the masked tail;
   multiply by 1/sum). One program per ``softmax_rows`` flattened rows (the reference: one thread per
   row, 256-thread blocks).
3. ``pallas_attn_v1_naive_pv``: O = P V, one program per output row (``D`` threads, one per output
   element as in the reference), summing over all ``Tk`` keys.

This is the root of the prefill family; it has no parent. Differences from the CUDA original that Pallas
imposes: a program works on a vector of ``qk_keys`` / ``softmax_cols`` / ``pv_keys`` elements at a time
(Triton tensors), and memory coalescing is Triton's, not one-thread-per-element. The causal mask is
top-left with a per-sequence ``q_offset`` (the reference is the ``q_offset = 0`` case): the softmax pass
takes the int32 ``[B]`` offsets as an input and reads the offset of each of its flattened rows' sequence.

``return_lse=True``: the softmax pass, which has each row's max and sum, also writes the row's natural-log
LSE ``m + log(l)`` (-inf for a row with no visible key) as FP32 ``[B*H*Tq]``, which is ``[B, H, Tq]``
without a copy. With ``return_lse=False`` it writes nothing but S. A NaN score reaches the row's sum and
1/sum, so a NaN in q, k or v makes the rows that see it NaN (never 0).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .._compat import load, pl, store, triton_params
from . import common as c
from . import launches as _l
from . import seqlen, softmax
from .contract import Kernel, Precision, Problem

GEN = "v1_naive"


@dataclasses.dataclass(frozen=True)
class NaiveConfig:
    """Vector widths of the three passes (the reference: 256 threads per block, one element each)."""

    qk_keys: int = 256  # S elements of one query row per QK program
    softmax_rows: int = 256  # flattened rows per softmax program (one thread per row)
    softmax_cols: int = 32  # columns per sweep step of the softmax
    pv_keys: int = 64  # keys per step of the PV sum
    num_warps: int = 8  # 256 threads for the QK and softmax passes
    pv_num_warps: int | None = None  # None: D/32 (one thread per output element of the row)
    num_stages: int = 1  # the reference has no software pipelining

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("qk_keys", "softmax_rows", "softmax_cols", "pv_keys", "num_warps"):
            c.check_pow2(owner, name, getattr(self, name))
        if self.pv_num_warps is not None:
            c.check_pow2(owner, "pv_num_warps", self.pv_num_warps)
        c.check_positive(owner, "num_stages", self.num_stages)

    def pv_warps(self, d: int) -> int:
        return self.pv_num_warps or max(1, d // 32)


CONFIGS: dict[str, NaiveConfig] = {"faithful": NaiveConfig()}


# --- pass 1: S = scale * Q K^T ------------------------------------------------------------------------


def _qk_kernel(q_ref, k_ref, s_ref, *, scale: float, tq: int, tk: int, block_k: int):
    jb, i, bh = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    d = q_ref.shape[-1]
    cols = jb * block_k + jnp.arange(block_k)
    kmask = cols < tk
    q = q_ref[pl.ds(i, 1), :]  # [1, D]
    kt = load(k_ref.at[pl.ds(jb * block_k, block_k), :], mask=jnp.broadcast_to(kmask[:, None], (block_k, d)),
              other=0.0)
    s = jnp.sum(q * kt, axis=1) * scale  # one FP32 dot per S element, on CUDA cores
    store(s_ref.at[pl.ds(bh * tq + i, 1), pl.ds(jb * block_k, block_k)], s[None, :], mask=kmask[None, :])


def qk_pass(q, k, *, scale: float, cfg: NaiveConfig, interpret: bool, name: str):
    b, tq, h, d = q.shape
    tk = k.shape[1]
    bk = min(cfg.qk_keys, c.next_pow2(tk))
    return pl.pallas_call(
        functools.partial(_qk_kernel, scale=scale, tq=tq, tk=tk, block_k=bk),
        out_shape=jax.ShapeDtypeStruct((b * h * tq, tk), jnp.float32),
        grid=(c.cdiv(tk, bk), tq, b * h),
        in_specs=[c.btnh_spec(tq, d, h, bh_axis=2), c.btnh_spec(tk, d, h, bh_axis=2)],
        out_specs=c.full_spec((b * h * tq, tk)),
        compiler_params=triton_params(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=interpret,
        name=name,
    )(q, k)


# --- pass 2: row softmax in place (shared by v2_tiled) --------------------------------------------------


def _softmax_kernel(off_ref, s_in_ref, s_ref, *lse_ref, n_rows: int, tq: int, heads: int, tk: int,
                    causal: bool, rows: int, cols: int):
    del s_in_ref  # aliased to s_ref: read and write the one buffer, as the reference does
    r0 = pl.program_id(0) * rows
    r = r0 + jnp.arange(rows)
    rvalid = r < n_rows
    i = lax.rem(r, jnp.int32(tq))  # query position of each flattened (b, h, i) row
    col = jnp.arange(cols)
    if causal:
        seq = lax.div(r, jnp.int32(heads * tq))  # the row's sequence b: its own q_offset
        off = c.seq_offset(off_ref, seq, tq=tq, tk=tk, mask=rvalid)
        lim = jnp.clip(i + (off + 1), 0, tk)  # visible keys per row
        n_vis = c.cdiv(jnp.max(jnp.where(rvalid, lim, 0)), cols)
    else:
        lim = jnp.full((rows,), tk, jnp.int32)
        n_vis = c.cdiv(tk, cols)

    def tile(cb):
        j = cb * cols + col
        inb = rvalid[:, None] & (j < tk)[None, :]
        vis = j[None, :] < lim[:, None]
        return inb, vis

    def sweep_max(cb, m):
        inb, vis = tile(cb)
        s = load(s_ref.at[pl.ds(r0, rows), pl.ds(cb * cols, cols)], mask=inb, other=0.0)
        return jnp.maximum(m, jnp.max(jnp.where(vis, s, -jnp.inf), axis=1))

    m = lax.fori_loop(0, n_vis, sweep_max, softmax.init_state((rows,))[0])

    def sweep_exp(cb, l):
        inb, vis = tile(cb)
        ref = s_ref.at[pl.ds(r0, rows), pl.ds(cb * cols, cols)]
        s = load(ref, mask=inb, other=0.0)
        p = jnp.where(vis, jnp.exp(s - m[:, None]), 0.0)  # the masked tail is written as 0
        store(ref, p, mask=inb)
        return l + jnp.sum(p, axis=1)

    l = lax.fori_loop(0, c.cdiv(tk, cols), sweep_exp, jnp.zeros((rows,), jnp.float32))
    # 1/sum; a row with no visible key (l == 0, every p already 0) keeps its zeros; a NaN sum stays NaN
    inv = 1.0 / jnp.where(l == 0, 1.0, l)

    def sweep_norm(cb, carry):
        inb, _ = tile(cb)
        ref = s_ref.at[pl.ds(r0, rows), pl.ds(cb * cols, cols)]
        store(ref, load(ref, mask=inb, other=0.0) * inv[:, None], mask=inb)
        return carry

    lax.fori_loop(0, n_vis, sweep_norm, 0)
    if lse_ref:
        store(lse_ref[0].at[pl.ds(r0, rows)], softmax.lse(m, l), mask=rvalid)


def softmax_plan(n_rows: int, tk: int, cfg: NaiveConfig) -> dict:
    rows = min(cfg.softmax_rows, c.next_pow2(n_rows))
    cols = min(cfg.softmax_cols, c.next_pow2(tk))
    return {"grid": [c.cdiv(n_rows, rows)], "rows_per_program": rows, "cols_per_step": cols,
            "num_warps": cfg.num_warps}


def softmax_pass(s, q_offset, *, tq: int, heads: int, causal: bool, cfg: NaiveConfig, interpret: bool,
                 name: str, return_lse: bool = False):
    """Softmax of ``s [B*H*Tq, Tk]`` in place; with ``return_lse`` also ``lse [B*H*Tq]`` (FP32)."""
    n_rows, tk = s.shape
    pln = softmax_plan(n_rows, tk, cfg)
    out_shape = [jax.ShapeDtypeStruct(s.shape, s.dtype)]
    out_specs = [c.full_spec(s.shape)]
    if return_lse:
        out_shape.append(jax.ShapeDtypeStruct((n_rows,), jnp.float32))
        out_specs.append(c.full_spec((n_rows,)))
    res = pl.pallas_call(
        functools.partial(_softmax_kernel, n_rows=n_rows, tq=tq, heads=heads, tk=tk, causal=causal,
                          rows=pln["rows_per_program"], cols=pln["cols_per_step"]),
        out_shape=tuple(out_shape),
        grid=tuple(pln["grid"]),
        in_specs=[c.offset_spec(q_offset.shape[0]), c.full_spec(s.shape)],
        out_specs=tuple(out_specs),
        input_output_aliases={1: 0},
        compiler_params=triton_params(num_warps=cfg.num_warps, num_stages=cfg.num_stages),
        interpret=interpret,
        name=name,
    )(q_offset, s)
    return tuple(res) if return_lse else res[0]


# --- pass 3: O = P V -------------------------------------------------------------------------------------


def _pv_kernel(p_ref, v_ref, o_ref, *, tq: int, tk: int, block_k: int):
    i, bh = pl.program_id(0), pl.program_id(1)
    d = v_ref.shape[-1]
    row = bh * tq + i

    def body(cb, acc):
        j = cb * block_k + jnp.arange(block_k)
        kmask = j < tk
        p = load(p_ref.at[pl.ds(row, 1), pl.ds(cb * block_k, block_k)], mask=kmask[None, :], other=0.0)
        vt = load(v_ref.at[pl.ds(cb * block_k, block_k), :],
                  mask=jnp.broadcast_to(kmask[:, None], (block_k, d)), other=0.0)
        return acc + jnp.sum(p.reshape(block_k, 1) * vt, axis=0)

    acc = lax.fori_loop(0, c.cdiv(tk, block_k), body, jnp.zeros((d,), jnp.float32))
    o_ref[pl.ds(i, 1), :] = acc.reshape(1, d).astype(o_ref.dtype)


def pv_pass(p, v, *, tq: int, out_dtype, cfg: NaiveConfig, interpret: bool, name: str):
    b, tk, h, d = v.shape
    bk = min(cfg.pv_keys, c.next_pow2(tk))
    return pl.pallas_call(
        functools.partial(_pv_kernel, tq=tq, tk=tk, block_k=bk),
        out_shape=jax.ShapeDtypeStruct((b, tq, h, d), out_dtype),
        grid=(tq, b * h),
        in_specs=[c.full_spec(p.shape), c.btnh_spec(tk, d, h, bh_axis=1)],
        out_specs=c.btnh_spec(tq, d, h, bh_axis=1),
        compiler_params=triton_params(num_warps=cfg.pv_warps(d), num_stages=cfg.num_stages),
        interpret=interpret,
        name=name,
    )(p, v)


# --- wrapper ---------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool,
            config: NaiveConfig = CONFIGS["faithful"], return_lse: bool = False):
    """BTNH FP32 q ``[B, Tq, H, D]``, k/v ``[B, Tk, H, D]`` -> ``[B, Tq, H, D]`` FP32
    (with ``return_lse``: ``(out, lse [B, H, Tq] FP32)``).

    ``q_offset``: int32 ``[B]`` (or a scalar; traced either way). Jitted so that S is a temporary and the
    in-place softmax really aliases it (no 4·B·H·Tq·Tk-byte copy).
    """
    b, tq, h, _, _ = c.check_dense_shapes(GEN, q, k, v)
    if q.dtype != jnp.float32:
        raise NotImplementedError(f"{GEN} takes float32 only (as the reference); got {q.dtype}")
    off = seqlen.q_offsets(q_offset, b)
    s = qk_pass(q, k, scale=scale, cfg=config, interpret=interpret, name=f"pallas_attn_{GEN}_qk")
    res = softmax_pass(s, off, tq=tq, heads=h, causal=causal, cfg=config, interpret=interpret,
                       name=f"pallas_attn_{GEN}_softmax", return_lse=return_lse)
    p, lse = res if return_lse else (res, None)
    out = pv_pass(p, v, tq=tq, out_dtype=q.dtype, cfg=config, interpret=interpret, name=f"pallas_attn_{GEN}_pv")
    return (out, lse.reshape(b, h, tq)) if return_lse else out


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: NaiveConfig) -> dict:
    """The three launches: grids, and what one program covers."""
    p = problem
    bh, tq, tk, d = p.batch * p.heads_q, p.q_len, p.kv_len, p.head_dim
    qk_keys = min(config.qk_keys, c.next_pow2(tk))
    pv_keys = min(config.pv_keys, c.next_pow2(tk))
    return {
        "qk": {"grid": [c.cdiv(tk, qk_keys), tq, bh], "rows_per_program": 1, "keys_per_program": qk_keys,
               "num_warps": config.num_warps},
        "softmax": softmax_plan(bh * tq, tk, config),
        "pv": {"grid": [tq, bh], "rows_per_program": 1, "keys_per_step": pv_keys,
               "num_warps": config.pv_warps(d)},
    }


def softmax_launch(s, pl_: Mapping[str, Any], name: str) -> _l.Launch:
    """Pass 2 of v1 and v2: max sweep, exp sweep (read + write), normalise sweep (read + write) over S, which the
    first pass wrote (its re-reads come from L2 or HBM by layer 2's residency rule)."""
    rows, cols = pl_["rows_per_program"], pl_["cols_per_step"]
    s_bytes = s.bh * s.q_len * s.kv_len * 4
    n_steps = _l.cdiv(s.kv_len, cols)
    vis_steps = max(1, round(n_steps * s.vis_frac)) if s.causal else n_steps
    return _l.Launch(name, "pallas_attn_row_softmax", programs=math.prod(pl_["grid"]),
                     threads=32 * pl_["num_warps"], regs=64, smem=0, units=rows * s.kv_len,
                     steps=2 * vis_steps + n_steps, dram_bytes=0.0,
                     reread_bytes=s_bytes * (2 * vis_steps + n_steps) / n_steps + s_bytes * 2 * vis_steps / n_steps,
                     reread_buffer=s_bytes, unit="S element",
                     note=f"{rows} rows x {cols} columns per step, one step in flight per program")


def three_pass_sizes(s, names: list[str]):
    """What the three-pass launches of v1 and v2 share: ``(d, bh, tq, tk, S bytes, fp32 Q/K/V bytes, pass name by
    suffix)``."""
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    return d, bh, tq, tk, bh * tq * tk * 4, bh * (tq + 2 * tk) * d * 4, {n.rsplit("_", 1)[-1]: n for n in names}


def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan): S = Q K^T
    to HBM (one query row x a key chunk per program), the row softmax over S, then P V (one output row a program)."""
    del hw, cfg
    d, bh, tq, tk, s_bytes, qkv_f32, by_suffix = three_pass_sizes(s, names)
    qk, pv = lp["qk"], lp["pv"]
    bk = qk["keys_per_program"]
    P = math.prod(qk["grid"])
    out = [_l.Launch(by_suffix["qk"], "pallas_attn_v1_naive_qk", P, 32 * qk["num_warps"], 64, 0,
                     units=bk * d, steps=1, dram_bytes=qkv_f32 * 2 / 3 + s_bytes,
                     l2_bytes=P * (bk + 1) * d * 4, unit="FMA",
                     note="one query row x key chunk; K rows re-read from L2 by every query row"),
           softmax_launch(s, lp["softmax"], by_suffix["softmax"])]
    bk = pv["keys_per_step"]
    P = math.prod(pv["grid"])
    out.append(_l.Launch(by_suffix["pv"], "pallas_attn_v1_naive_pv", P, 32 * pv["num_warps"], 64, 0,
                         units=tk * d, steps=_l.cdiv(tk, bk), dram_bytes=qkv_f32 / 3 + bh * tq * d * 4,
                         l2_bytes=P * tk * d * 4, reread_bytes=s_bytes, reread_buffer=s_bytes, unit="FMA",
                         note="one output row; V re-read from L2 by every row"))
    return out


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_qk", f"pallas_attn_{GEN}_softmax", f"pallas_attn_{GEN}_pv"),
    config_cls=NaiveConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=("float32",),
    precision={"float32": Precision(operand="fp32", accumulate="fp32", engine="fp32",
                                    note="CUDA-core multiply + sum per S element; S in HBM as fp32")},
    # Any power-of-two D would lower (a [1, D] Triton tensor); the reference's dims are 64 and 128.
    head_dims=(64, 128),
    gqa=False,
    max_q_len=None,
    dense=forward,
    materializes_s=True,
    s_tile=lambda problem, config: (1, 1),  # no reuse: every S element reads its Q row and K row
    plan=plan,
    launches=launches,
)
