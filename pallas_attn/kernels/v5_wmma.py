"""v5_wmma: FP16/BF16 operands on tensor cores, FP32 accumulation, online softmax (docs/reference.md §2.5).

Delta from v4_fused: the two products run on tensor cores. A program owns BM query rows and streams key
blocks of BN: ``S = Q K^T`` (``jnp.dot`` of 16-bit operands, FP32 result), scale and mask in FP32
(``j >= Tk`` or causal ``j > i + q_offset``), the block online update (§2.0) on FP32 ``m, l``, the
running O rescaled by ``alpha``, then ``P V`` with P rounded to the operand dtype (the reference writes
``p`` as half into ``sP``) and FP32 accumulation. Finally ``O / l`` (0 if ``l = 0``; NaN stays NaN).
One ``pallas_call``: ``pallas_attn_v5_wmma_fwd``, grid (ceil(Tq/BM), B·H).

Faithful blocks (the reference's 48 KB smem budget): D = 64 -> BM = 64, BN = 32, 4 warps;
D = 128 -> BM = 32, BN = 32, 2 warps (one warp per 16-row M tile). K is contracted on its D axis
(``dot_general``), the col-major-fragment trick of the reference: no transpose in HBM.

Precision: FP16 and BF16 inputs are staged as they are. FP32 input is refused with an error naming the
dtypes (a silent cast to FP16 overflows near 6.5e4 and loses 3 decimal digits); the reference host's cast
stays available when asked for, ``WmmaConfig(host_cast=True)``: FP32 is then cast to FP16 inside ``forward``
(so inside any timed region, as in the reference) and the output is FP32. ``KERNEL`` declares both.

Causal offsets are per sequence (int32 ``[B]``, an input read once per program; the block count is a
traced loop bound). ``return_lse=True``: the kernel also writes each row's natural-log LSE from its final
``(m, l)`` (-inf with no visible key) into FP32 ``[B*H, Tq]`` = ``[B, H, Tq]``; without it, O only.

Differences from the CUDA original: the running O lives in registers, not in an ``oRun`` smem buffer
that every PV MMA reloads (Pallas has no scratch memory under the Triton lowering; Triton keeps the
accumulator in registers), and Triton picks the MMA instruction (mma.sync/wgmma) instead of WMMA 16x16x16.
``CONFIGS["tuned"]`` uses the larger blocks and software pipelining usual for Triton FA-2 forward
kernels; it is a starting point labelled as such, to be confirmed by ``compare`` on the device.
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
from . import seqlen, softmax
from .contract import Kernel, Precision, Problem

GEN = "v5_wmma"


@dataclasses.dataclass(frozen=True)
class WmmaConfig:
    block_m_d64: int = 64
    block_n_d64: int = 32
    block_m_d128: int = 32
    block_n_d128: int = 32
    num_warps_d64: int = 4
    num_warps_d128: int = 2
    num_stages: int = 1  # the reference loads, syncs, computes: no pipelining
    fp32_stage_dtype: str = "float16"  # what FP32 input is cast to (the reference host casts to half)
    # FP32 input is refused unless asked: True casts it to fp32_stage_dtype before the kernel (the reference
    # host's cast, kept for faithful reproductions); never silent.
    host_cast: bool = False

    def __post_init__(self) -> None:
        owner = type(self).__name__
        for name in ("block_m_d64", "block_n_d64", "block_m_d128", "block_n_d128"):
            c.check_pow2(owner, name, getattr(self, name), minimum=16)  # tensor-core dot: dims >= 16
        for name in ("num_warps_d64", "num_warps_d128"):
            c.check_pow2(owner, name, getattr(self, name))
        c.check_positive(owner, "num_stages", self.num_stages)
        if self.fp32_stage_dtype not in ("float16", "bfloat16"):
            raise ValueError(f"{owner}.fp32_stage_dtype must be 'float16' or 'bfloat16'; "
                             f"got {self.fp32_stage_dtype!r}")

    def blocks(self, d: int) -> tuple[int, int, int]:
        """(BM, BN, num_warps) for head dim ``d``."""
        return c.per_head_dim(GEN, d, d64=(self.block_m_d64, self.block_n_d64, self.num_warps_d64),
                              d128=(self.block_m_d128, self.block_n_d128, self.num_warps_d128))


CONFIGS: dict[str, WmmaConfig] = {
    "faithful": WmmaConfig(),
    # Not the reference's: BM = 128 query rows per program, BN = 64, pipelined loads (num_stages).
    "tuned": WmmaConfig(block_m_d64=128, block_n_d64=64, block_m_d128=128, block_n_d128=64,
                        num_warps_d64=4, num_warps_d128=8, num_stages=3),
}


def stage(x, config: WmmaConfig):
    """16-bit inputs stay as they are; FP32 is refused unless ``config.host_cast`` (``common.host_stage``)."""
    return c.host_stage(x, config, gen=GEN, alternatives="use a float32 generation (v1-v4, fa_train)")


def _kernel(off_ref, q_ref, k_ref, v_ref, o_ref, *lse_ref, scale, heads, tq, tk, causal, bm, bn):
    d = q_ref.shape[-1]
    i0 = pl.program_id(0) * bm
    rows = i0 + jnp.arange(bm)
    off = c.seq_offset(off_ref, pl.program_id(1) // heads, tq=tq, tk=tk) if causal else None
    qt = load(q_ref.at[pl.ds(i0, bm), :], mask=c.row_mask(rows, tq, d), other=0.0)
    last = jnp.minimum(i0 + bm, tq) - 1
    n_blocks = c.cdiv(c.key_limit(last, tk=tk, causal=causal, q_offset=off), bn)

    def body(jb, carry):
        m, l, acc = carry
        cols = jb * bn + jnp.arange(bn)
        kmask = c.row_mask(cols, tk, d)
        kt = load(k_ref.at[pl.ds(jb * bn, bn), :], mask=kmask, other=0.0)
        vt = load(v_ref.at[pl.ds(jb * bn, bn), :], mask=kmask, other=0.0)
        s = c.dot_nt(qt, kt) * scale  # tensor cores, FP32 accumulate; scale after the dot
        vis = c.visible(rows[:, None], cols[None, :], tk=tk, causal=causal, q_offset=off)
        m, l, alpha, p = softmax.step(m, l, s, vis)
        acc = acc * alpha[:, None] + c.dot_nn(p.astype(vt.dtype), vt)
        return m, l, acc

    m, l, acc = lax.fori_loop(0, n_blocks, body, softmax.init_state((bm,), d))
    rmask = rows < tq
    store(o_ref.at[pl.ds(i0, bm), :], softmax.finalize(acc, l).astype(o_ref.dtype), mask=c.row_mask(rows, tq, d))
    if lse_ref:
        store(lse_ref[0].at[pl.ds(i0, bm)], softmax.lse(m, l), mask=rmask)


@functools.partial(jax.jit, static_argnames=("causal", "scale", "interpret", "config", "return_lse"))
def forward(q, k, v, *, causal: bool, scale: float, q_offset, interpret: bool,
            config: WmmaConfig = CONFIGS["faithful"], return_lse: bool = False):
    """BTNH in (FP32/FP16/BF16), operands staged in 16 bits, FP32 accumulation, output in q's dtype
    (with ``return_lse``: ``(out, lse [B, H, Tq] FP32)``). ``q_offset``: int32 ``[B]`` (or a scalar)."""
    b, tq, h, d, tk = c.check_dense_shapes(GEN, q, k, v)
    out_dtype = q.dtype
    off = seqlen.q_offsets(q_offset, b)
    q, k, v = (stage(x, config) for x in (q, k, v))
    bm, bn, warps = config.blocks(d)
    out_shape = (jax.ShapeDtypeStruct((b, tq, h, d), out_dtype),)
    out_specs = (c.btnh_spec(tq, d, h, bh_axis=1),)
    if return_lse:
        out_shape += (jax.ShapeDtypeStruct((b * h, tq), jnp.float32),)
        out_specs += (c.full_spec((b * h, tq), bh_axis=1),)
    res = pl.pallas_call(
        functools.partial(_kernel, scale=scale, heads=h, tq=tq, tk=tk, causal=causal, bm=bm, bn=bn),
        out_shape=out_shape,
        grid=(c.cdiv(tq, bm), b * h),
        in_specs=[c.offset_spec(b), c.btnh_spec(tq, d, h, bh_axis=1), c.btnh_spec(tk, d, h, bh_axis=1),
                  c.btnh_spec(tk, d, h, bh_axis=1)],
        out_specs=out_specs,
        compiler_params=triton_params(num_warps=warps, num_stages=config.num_stages),
        interpret=interpret,
        name=f"pallas_attn_{GEN}_fwd",
    )(off, q, k, v)
    return (res[0], res[1].reshape(b, h, tq)) if return_lse else res[0]


# --- contract --------------------------------------------------------------------------------------------


def plan(problem: Problem, config: WmmaConfig) -> dict:
    p = problem
    bm, bn, warps = config.blocks(p.head_dim)
    return {"grid": [c.cdiv(p.q_len, bm), p.batch * p.heads_q], "block_m": bm, "block_n": bn,
            "num_warps": warps, "num_stages": config.num_stages}


_FP32_REFUSED = ("float32 input is refused (no silent cast); WmmaConfig(host_cast=True) casts it to fp16 before "
                 "the kernel, as the reference host does")

def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan): the
    staging casts (fp32 input) and one BM x BN tile program with two 16-bit dots per key block."""
    del hw, cfg
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    bm, bn, warps, stages = lp["block_m"], lp["block_n"], lp["num_warps"], lp["num_stages"]
    P = math.prod(lp["grid"])
    steps = max(1.0, _l.cdiv(tk, bn) * (s.vis_frac if tq > bm else 1.0))
    out = _l.cast_launches(s, "stage")
    out.append(_l.Launch(names[0], "pallas_attn_v5_wmma_fwd", P, 32 * warps, 128,
                         (bm * d + 2 * bn * d * c.stage_buffers(bm, stages)) * 2,
                         units=4 * bm * bn * d * steps, steps=steps,
                         dram_bytes=bh * (tq + 2 * tk) * d * 2 + bh * tq * d * s.in_bytes,
                         l2_bytes=P * steps * 2 * bn * d * 2, unit="MMA FLOP",
                         note=f"BM={bm} x BN={bn} tile, two 16-bit dots per key block"))
    return out


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_fwd",),
    config_cls=WmmaConfig,
    configs=CONFIGS,
    entries={"dense"},
    dtypes=("float16", "bfloat16"),
    precision={
        "float16": Precision(operand="fp16", accumulate="fp32", engine="tensor",
                             note="P is rounded to fp16 before the PV product; " + _FP32_REFUSED),
        "bfloat16": Precision(operand="bf16", accumulate="fp32", engine="tensor",
                              note="P is rounded to bf16 before the PV product; " + _FP32_REFUSED),
    },
    head_dims=(64, 128),
    gqa=False,
    max_q_len=None,
    dense=forward,
    plan=plan,
    launches=launches,
)
