"""v2_tiled: v1's three passes with tiles that reuse operands; S still in HBM (docs/reference.md §2.2).

Delta from v1_naive: the QK and PV passes work on tiles, so each loaded Q/K/P/V element is reused by a
whole tile instead of one output element. Tiles are the reference's: TM = TN = 64 for D = 64, 32 for
D = 128 (its shared-memory budget, (TM+TN)·D·4 B = 32 KB).

* ``pallas_attn_v2_tiled_qk``: grid (ceil(Tk/TN), ceil(Tq/TM), B·H); one TM x TN tile of S per program,
  zero-filled out of range, written as FP32 to HBM.
* ``pallas_attn_v2_tiled_softmax``: v1's in-place three-sweep row softmax, unchanged (imported).
* ``pallas_attn_v2_tiled_pv``: grid (ceil(Tq/TM), B·H); the key contraction chunked by TK = TN,
  a TM x D FP32 accumulator per program.

Both tile products are ``dot_general`` with ``precision=HIGHEST``: Triton's IEEE FP32 dot, i.e. FMAs on
CUDA cores, as the reference's per-thread smem dot (TF32 tensor cores would change the numerics).
Pallas has no shared memory to stage into: the "tile in smem" is a tile in registers, loaded once.

Query offsets and ``return_lse`` are v1's: only the softmax pass reads the int32 ``[B]`` offsets, and with
``return_lse`` it also writes each row's natural-log LSE (FP32 ``[B*H*Tq]`` = ``[B, H, Tq]``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .._compat import load, pl, store, triton_params
from . import common as c
from . import launches as _l
from . import seqlen
from .contract import Kernel, Precision, Problem
from .v1_naive import NaiveConfig, softmax_launch, softmax_pass, softmax_plan, three_pass_sizes

GEN = "v2_tiled"


@dataclasses.dataclass(frozen=True)
class TiledConfig(c.SquareTiles):
    """Tiles per head dim; TK (the PV contraction chunk) equals TN as in the reference."""

    generation = GEN
    softmax: NaiveConfig = NaiveConfig()  # pass 2 is v1's


CONFIGS: dict[str, TiledConfig] = {"faithful": TiledConfig()}


def _qk_kernel(q_ref, k_ref, s_ref, *, scale: float, tq: int, tk: int, tm: int, tn: int):
    jb, ib, bh = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    d = q_ref.shape[-1]
    rows = ib * tm + jnp.arange(tm)
    cols = jb * tn + jnp.arange(tn)
    qt = load(q_ref.at[pl.ds(ib * tm, tm), :], mask=c.row_mask(rows, tq, d), other=0.0)
    kt = load(k_ref.at[pl.ds(jb * tn, tn), :], mask=c.row_mask(cols, tk, d), other=0.0)
    s = c.dot_nt(qt, kt, precision=c.FP32_EXACT) * scale
    store(s_ref.at[pl.ds(bh * tq + ib * tm, tm), pl.ds(jb * tn, tn)], s,
          mask=(rows < tq)[:, None] & (cols < tk)[None, :])


def _pv_kernel(p_ref, v_ref, o_ref, *, tq: int, tk: int, tm: int, tn: int):
    ib, bh = pl.program_id(0), pl.program_id(1)
    d = v_ref.shape[-1]
    rows = ib * tm + jnp.arange(tm)

    def body(cb, acc):
        cols = cb * tn + jnp.arange(tn)
        pt = load(p_ref.at[pl.ds(bh * tq + ib * tm, tm), pl.ds(cb * tn, tn)],
                  mask=(rows < tq)[:, None] & (cols < tk)[None, :], other=0.0)
        vt = load(v_ref.at[pl.ds(cb * tn, tn), :], mask=c.row_mask(cols, tk, d), other=0.0)
        return acc + c.dot_nn(pt, vt, precision=c.FP32_EXACT)

    acc = lax.fori_loop(0, c.cdiv(tk, tn), body, jnp.zeros((tm, d), jnp.float32))
    store(o_ref.at[pl.ds(ib * tm, tm), :], acc.astype(o_ref.dtype), mask=c.row_mask(rows, tq, d))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool,
            config: TiledConfig = CONFIGS["faithful"], return_lse: bool = False):
    """BTNH FP32 in, FP32 out (with ``return_lse``: ``(out, lse [B, H, Tq] FP32)``); S ``[B*H*Tq, Tk]``
    FP32 lives in HBM between the passes. ``q_offset``: int32 ``[B]`` (or a scalar; traced either way)."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    if q.dtype != jnp.float32:
        raise NotImplementedError(f"{GEN} takes float32 only (as the reference); got {q.dtype}")
    off = seqlen.q_offsets(q_offset, b)
    t = config.tile(d)
    params = triton_params(num_warps=config.num_warps, num_stages=config.num_stages)
    s = pl.pallas_call(
        functools.partial(_qk_kernel, scale=scale, tq=tq, tk=tk, tm=t, tn=t),
        out_shape=jax.ShapeDtypeStruct((b * h * tq, tk), jnp.float32),
        grid=(c.cdiv(tk, t), c.cdiv(tq, t), b * h),
        in_specs=[c.btnh_spec(tq, d, h, bh_axis=2), c.btnh_spec(tk, d, h, bh_axis=2)],
        out_specs=c.full_spec((b * h * tq, tk)),
        compiler_params=params,
        interpret=interpret,
        name=f"pallas_attn_{GEN}_qk",
    )(q, k)
    res = softmax_pass(s, off, tq=tq, heads=h, causal=causal, cfg=config.softmax, interpret=interpret,
                       name=f"pallas_attn_{GEN}_softmax", return_lse=return_lse)
    p, lse = res if return_lse else (res, None)
    out = pl.pallas_call(
        functools.partial(_pv_kernel, tq=tq, tk=tk, tm=t, tn=t),
        out_shape=jax.ShapeDtypeStruct((b, tq, h, d), q.dtype),
        grid=(c.cdiv(tq, t), b * h),
        in_specs=[c.full_spec(p.shape), c.btnh_spec(tk, d, h, bh_axis=1)],
        out_specs=c.btnh_spec(tq, d, h, bh_axis=1),
        compiler_params=params,
        interpret=interpret,
        name=f"pallas_attn_{GEN}_pv",
    )(p, v)
    return (out, lse.reshape(b, h, tq)) if return_lse else out


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: TiledConfig) -> dict:
    p = problem
    bh, tq, tk, t = p.batch * p.heads_q, p.q_len, p.kv_len, config.tile(p.head_dim)
    return {
        "tile": t,
        "qk": {"grid": [c.cdiv(tk, t), c.cdiv(tq, t), bh], "tile_m": t, "tile_n": t,
               "num_warps": config.num_warps},
        "softmax": softmax_plan(bh * tq, tk, config.softmax),
        "pv": {"grid": [c.cdiv(tq, t), bh], "tile_m": t, "tile_k": t, "num_warps": config.num_warps},
    }


def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan): S = Q K^T
    in T x T tiles to HBM, v1's row softmax over S, then P V in T x D output tiles."""
    del hw, cfg
    d, bh, tq, tk, s_bytes, qkv_f32, by_suffix = three_pass_sizes(s, names)
    qk, pv = lp["qk"], lp["pv"]
    t = lp["tile"]
    P = math.prod(qk["grid"])
    out = [_l.Launch(by_suffix["qk"], "pallas_attn_v2_tiled_qk", P, 32 * qk["num_warps"], 128,
                     2 * t * d * 4, units=t * t * d, steps=1, dram_bytes=qkv_f32 * 2 / 3 + s_bytes,
                     l2_bytes=P * 2 * t * d * 4, unit="FMA", note="one TxT tile of S, fp32 dot"),
           softmax_launch(s, lp["softmax"], by_suffix["softmax"])]
    P = math.prod(pv["grid"])
    steps = _l.cdiv(tk, t)
    out.append(_l.Launch(by_suffix["pv"], "pallas_attn_v2_tiled_pv", P, 32 * pv["num_warps"], 128,
                         2 * t * max(t, d) * 4, units=t * t * d * steps, steps=steps,
                         dram_bytes=qkv_f32 / 3 + bh * tq * d * 4, l2_bytes=P * steps * t * d * 4,
                         reread_bytes=s_bytes, reread_buffer=s_bytes, unit="FMA", note="TxD output tile"))
    return out


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_qk", f"pallas_attn_{GEN}_softmax", f"pallas_attn_{GEN}_pv"),
    config_cls=TiledConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=("float32",),
    precision={"float32": Precision(operand="fp32", accumulate="fp32", engine="fp32",
                                    note="IEEE-fp32 tile dots (precision=HIGHEST, FMA, no TF32); S in HBM as fp32")},
    head_dims=(64, 128),
    gqa=False,
    max_q_len=None,
    dense=forward,
    materializes_s=True,
    s_tile=lambda problem, config: (config.tile(problem.head_dim),) * 2,  # TM x TN reuse of Q and K
    plan=plan,
    launches=launches,
)
