"""v11_mla: MLA latent decode on CUDA cores, the reference's Step 11 (docs/reference.md §2.16).

Delta from v10_nvfp4 / v8_gqa_ss (the GQA machinery with ``H_kv = 1``, ``G = h_q``): the KV cache is ONE latent
head of width ``DQK = DV + R`` (kv_lora_rank + rope_dim), read through the block table; the scores run over all DQK
columns and the values are the first DV columns of the **same** tile (no V pool, one gather per key serves both
products); the output is ``[B, Tq, Hq, DV]``. Templates ``(TN, DQK, DV)`` in {(32, 96, 64), (32, 160, 128),
(32, 576, 512)}; anything else is refused by ``supports`` (as the reference's template instances are).

The rest is v8_gqa_ss's dataflow: 8 packed rows per program (head-major ``r = h * Tq + t``; the reference's 8
warps, one query head each at ``Tq = 1``), grid ``(ceil(Hq*Tq / 8), S, B)``, key tiles of TN = 32 keys and ONE
online-softmax update per 32 keys (score-stationary: each key's full dot over DQK, then one max, one sum, the
alpha rescale and ``p V`` over the 32 keys), fp32 arithmetic on CUDA cores (broadcast-multiply + sum, never a dot),
natural-log softmax, the shared split state and merge, and the reference's ``choose_splits`` over ``B`` programs
of ``ceil(Hq*Tq / 8)`` row tiles (``faithful``: this device's SM count, as the post-audit reference host;
``reference_sm40``: the T4's 40 of the measured runs).

The latent tile is loaded in 64-column chunks (Triton needs power-of-two tensors and DQK = 576 is not one; the
reference unrolls its DQK loop by 8 the same way), and each chunk stays in the tile dtype until it is used.

Latent formats: NVFP4 (the reference's: an ``Nvfp4Tensor`` pool, packed nibbles + E4M3 micro-scale per 16 columns
+ a tensor scale, decoded at the gather to the fp16 tile, ``mla_common.LatentSource``) with fp16 q, and plain
fp16 / bf16 latents (q of the same dtype).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from attn_core import splits as split_plan
from attn_core.generations import MLA_TEMPLATES as TEMPLATES

from .. import _compat
from . import common as c
from . import launches as _l
from . import softmax
from .contract import Kernel, Precision, Problem
from .mla_common import run, visible

__all__ = ["MlaConfig", "CONFIGS", "KERNEL", "mla_forward", "TEMPLATES"]

GEN = "v11_mla"
# TEMPLATES: the (DQK, kv_lora_rank) pairs it takes, the reference's MLA templates (attn_core.generations)
TN = 32


@dataclasses.dataclass(frozen=True)
class MlaConfig:
    """rows: packed rows per program (8 warps). num_sm: SMs ``choose_splits`` assumes (None: this device; 40: the
    reference's T4). num_splits forces S. num_warps / num_stages: Triton launch knobs."""

    rows: int = split_plan.ROWS_PER_PROGRAM
    num_sm: int | None = None
    num_splits: int | None = None
    num_warps: int = 8
    num_stages: int = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        c.check_pow2(owner, "rows", self.rows)
        c.check_pow2(owner, "num_warps", self.num_warps)
        c.check_positive(owner, "num_stages", self.num_stages)
        for name in ("num_sm", "num_splits"):
            if getattr(self, name) is not None:
                c.check_positive(owner, name, getattr(self, name))

    def splits(self, *, batch: int, rows: int, n_k: int) -> tuple[int, int]:
        """``(S, chunk)`` with ``chunk`` a multiple of TN (a split starts on a tile boundary)."""
        n_k = max(int(n_k), 1)
        if self.num_splits is not None:
            s = min(self.num_splits, c.cdiv(n_k, TN))
        else:
            sm = self.num_sm or _compat.device_sm_count()
            s, _ = split_plan.choose_splits(bh=batch, n_q=rows, n_k=n_k, num_sm=sm, rows_per_program=self.rows)
        chunk = c.cdiv(c.cdiv(n_k, s), TN) * TN
        return c.cdiv(n_k, chunk), chunk


CONFIGS = {
    "faithful": MlaConfig(),
    "reference_sm40": MlaConfig(num_sm=split_plan.REFERENCE_NUM_SM),
}


def attend_cuda_cores(q_chunks, q_rope, src, *, lo, hi, pos, q_off, causal: bool, scale: float, base2: bool = False):
    """Online softmax of the program's rows over keys ``[lo, hi)``: one update per TN = 32 keys, CUDA-core fp32."""
    del base2
    f32 = jnp.float32
    rows = q_rope.shape[0]
    qc = [x.astype(f32) for x in q_chunks]
    qr = q_rope.astype(f32)
    n_tiles = c.cdiv(jnp.maximum(hi - lo, 0), TN)

    def body(t, carry):
        m, l, accs = carry
        j0 = lo + t * TN
        j = j0 + jnp.arange(TN, dtype=jnp.int32)
        chunks, rope = src.tile(j0, j < hi)
        s = jnp.sum(qr[:, None, :] * rope.astype(f32)[None, :, :], axis=-1)
        for qx, kx in zip(qc, chunks):
            s = s + jnp.sum(qx[:, None, :] * kx.astype(f32)[None, :, :], axis=-1)
        s = s * scale
        m_new, l_new, alpha, p = softmax.step(m, l, s, visible(j, hi, pos, q_off, causal=causal))
        accs = tuple(a * alpha[:, None] + jnp.sum(p[:, :, None] * kx.astype(f32)[None, :, :], axis=1)
                     for a, kx in zip(accs, chunks))
        return m_new, l_new, accs

    m0, l0 = softmax.init_state((rows,))
    init = (m0, l0, tuple(jnp.zeros((rows, x.shape[1]), f32) for x in q_chunks))
    return jax.lax.fori_loop(0, n_tiles, body, init)


@functools.cache
def _attend(causal: bool, scale: float):
    return functools.partial(attend_cuda_cores, causal=causal, scale=scale, base2=False)


def mla_forward(q, latent_pool, block_table, kv_lens, *, kv_lora_rank: int, causal: bool, scale: float, q_offset,
                interpret: bool, config: MlaConfig = CONFIGS["faithful"], return_lse: bool = False,
                check_block_table: bool = True):
    """v11_mla on validated inputs (``pallas_attn.mla_attention``)."""
    if not isinstance(config, MlaConfig):
        raise ValueError(f"{GEN}: config must be an MlaConfig; got {config!r}")
    b, tq, hq, dqk = q.shape
    if (dqk, kv_lora_rank) not in TEMPLATES:
        raise NotImplementedError(f"{GEN} takes (DQK, kv_lora_rank) templates {list(TEMPLATES)}; got "
                                  f"({dqk}, {kv_lora_rank})")
    page = latent_pool.shape[1]
    s, chunk = config.splits(batch=b, rows=hq * tq, n_k=block_table.shape[1] * page)
    return run(f"pallas_attn_{GEN}", _attend(bool(causal), float(scale)), q, latent_pool, block_table, kv_lens,
               q_offset, dv=kv_lora_rank, rpp=config.rows, tn=TN, splits=s, chunk=chunk, causal=causal,
               interpret=interpret, return_lse=return_lse, num_warps=config.num_warps, num_stages=config.num_stages,
               check_block_table=check_block_table)


def _plan(p: Problem, cfg: MlaConfig) -> dict:
    rows = p.heads_q * p.q_len
    s, chunk = cfg.splits(batch=p.batch, rows=rows, n_k=p.kv_len)
    return {"splits": s, "chunk": chunk, "num_sm": cfg.num_sm or _compat.device_sm_count(),
            "partial": {"grid": [c.cdiv(rows, cfg.rows), s, p.batch], "rows_per_program": cfg.rows,
                        "key_tile": TN, "keys_per_update": TN, "num_warps": cfg.num_warps},
            "merge": {"grid": [p.batch * rows]}}


_NOTE = ("16-bit latent tile (one tile serves K and V = its first DV columns); CUDA-core fp32 scores and p V, one "
         "online-softmax update per 32 keys")

def launches(s, lp, names: list[str], hw=None, cfg=None) -> list[_l.Launch]:
    """The launches of one call (``Kernel.launches``, priced by ``compare.layer2``; ``lp`` the call's plan). v11_mla
    (Pallas, Triton): v8_gqa_ss's CUDA-core program on ONE latent head (H_kv = 1, G = h_q): grid (row
    tiles, S, B), R packed rows, TN-key tiles, one update per tile. The same issue-bound dataflow as the paged
    partial (``pallas_attn_paged_cuda_cores``, no new constant): per key a row does DQK score FMAs and DV output
    FMAs, i.e. (DQK + DV) / 2 of the paged family's row x key x dim units (each one QK and one PV FMA)."""
    del hw, cfg
    dqk, dv = _l.mla_dims(s)
    pp = lp["partial"]
    P, R, tn = math.prod(pp["grid"]), pp["rows_per_program"], pp["key_tile"]
    row_tiles, splits = pp["grid"][0], lp["splits"]
    keys = max(1.0, min(lp["chunk"], s.kv_len) * s.vis_frac)
    tiles = max(1, math.ceil(keys / tn))
    latent = _l.kv_tokens(s) * dqk * _l.kv_bytes(s)  # every sequence's own length (ragged: their sum)
    rows = s.heads_q * s.q_len
    ws = s.batch * rows * splits * (dv + 1) * 4
    units = R * tiles * tn * (dqk + dv) / 2
    # the live [R, TN, 64-column chunk] fp32 product per thread (8 x 32 x 64 / 256 = 64): under layer 2's threshold
    live = R * tn * 64 / (32 * pp.get("num_warps", 8))
    out = [_l.Launch(names[0], "pallas_attn_paged_cuda_cores", P, 32 * pp.get("num_warps", 8), 128, 0, units=units,
                     steps=tiles, live_values=live,
                     dram_bytes=latent + s.batch * rows * dqk * s.in_bytes + ws, l2_bytes=(row_tiles - 1) * latent,
                     unit="row x key x dim", note=f"{R} heads x {tn}-key latent tiles (DQK {dqk}, DV {dv}), one update "
                     f"per tile; {s.kv_dtype or 'fp16/bf16'} latent")]
    out.append(_l.merge_launch(names[1], math.prod(lp["merge"]["grid"]), 4, splits, dv,
                               ws + s.batch * rows * dv * s.in_bytes))
    o = s.batch * rows * dv * s.in_bytes
    out.append(_l.xla_glue("mla_unpack_poison", s, o, o,
                           "unpack [B*Hq*Tq, DV] -> [B, Tq, Hq, DV] and the bad-table NaN select (XLA)"))
    return out


KERNEL = Kernel(
    name=GEN,
    lowering="triton",
    passes=(f"pallas_attn_{GEN}_partial", f"pallas_attn_{GEN}_merge"),
    config_cls=MlaConfig,
    configs=CONFIGS,
    entries=frozenset({"mla"}),
    dtypes=("float16", "bfloat16"),
    precision={"float16": Precision("fp16", "fp32", "fp32", _NOTE),
               "bfloat16": Precision("bf16", "fp32", "fp32", _NOTE)},
    head_dims=tuple(d for d, _ in TEMPLATES),
    gqa=True,
    max_q_len=None,
    mla=mla_forward,
    plan=_plan,
    launches=launches,
    templates=TEMPLATES,
    latent_precision={"nvfp4": Precision("nvfp4", "fp32", "fp32", "NVFP4 latent decoded at the gather to an fp16 "
                                         "tile (level x micro x tensor scale, rounded to fp16); then " + _NOTE)},
    latent_q_dtypes={"nvfp4": ("float16",)},
    kv_dequant_ops={"nvfp4": 6.5},
)
