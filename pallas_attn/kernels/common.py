"""Pieces every Triton-lowered generation shares, written once (DESIGN.md decision 2, ORIGINAL.md §2.0).

* ``online_softmax_step``: the FP32 running (m, l) update with the rescale factor for O. The reference
  updates once per key (v3/v4/v6) or once per key block (v5); a Pallas program works on whole tiles, so
  every generation here updates once per tile. The arithmetic is the §2.0 recurrence applied to a block.
* ``finalize``: O / l, and 0 (never NaN) for a row that saw no visible key.
* ``lse_merge``: the split-KV merge of unnormalized partials (m_s, l_s, O_s) (§2.0, v6+).
* ``visible`` / ``key_limit``: the top-left causal mask ``j <= i + q_offset`` plus the ragged-length mask
  ``j < Tk``, and how many keys a block of rows can see (the reference's "stop at j > i").
* ``choose_splits``: the reference's split-KV heuristic with its constants (S_CAP 32, MIN_CHUNK 256,
  target 2 x num_sm).
* ``btnh_spec`` / ``dot_nt``: BTNH indexing through BlockSpecs and the Q.K^T contraction.

Running max starts at -FLT_MAX (a large finite negative, as in §2.0) and masked scores are -inf, so
``exp(s - m)`` is exactly 0 for a masked key even when a row has seen nothing yet, and no step ever
computes ``-inf - -inf``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
from jax import lax

from .._compat import pl

__all__ = [
    "NEG_BIG",
    "cdiv",
    "next_pow2",
    "check_pow2",
    "check_positive",
    "per_head_dim",
    "btnh_spec",
    "full_spec",
    "visible",
    "key_limit",
    "online_softmax_step",
    "finalize",
    "lse_merge",
    "choose_splits",
    "dot_nt",
    "dot_nn",
    "FP32_EXACT",
    "row_mask",
    "check_dense_shapes",
]

NEG_BIG = float(np.finfo(np.float32).min)  # -FLT_MAX: the reference's running-max init


def cdiv(a, b: int):
    """Ceil division for Python ints and for non-negative traced int32 scalars (truncating lax.div is
    enough there, and it lowers to one Triton op where jnp.floor_divide would add sign fix-ups)."""
    if isinstance(a, (int, np.integer)):
        return -(-int(a) // b)
    return lax.div(a + (b - 1), jnp.int32(b))


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def check_pow2(owner: str, name: str, value: int, *, minimum: int = 1) -> None:
    """Triton tensors must have power-of-two sizes; ``jnp.dot`` operands need every dim >= 16."""
    if not isinstance(value, int) or value < minimum or value & (value - 1):
        raise ValueError(f"{owner}.{name} must be a power of two >= {minimum}; got {name}={value!r}")


def check_positive(owner: str, name: str, value: int) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive int; got {name}={value!r}")


def per_head_dim(owner: str, d: int, *, d64, d128):
    """The reference hard-codes one tile per head dim (templates for d=64 and d=128 only)."""
    if d == 64:
        return d64
    if d == 128:
        return d128
    raise NotImplementedError(f"{owner} has tiles for head dims 64 and 128 (the reference's); got D={d}")


@dataclasses.dataclass(frozen=True)
class SquareTiles:
    """Square tiles TM = TN per head dim with the reference's 256 threads (v2 and v3 share this shape).

    Subclasses set ``generation`` (named in errors) and add their own fields.
    """

    generation: ClassVar[str] = "?"
    tile_d64: int = 64
    tile_d128: int = 32
    num_warps: int = 8  # the reference's 256 threads
    num_stages: int = 1

    def __post_init__(self) -> None:
        owner = type(self).__name__
        # jnp.dot operands need every dim >= 16 under the Triton lowering
        check_pow2(owner, "tile_d64", self.tile_d64, minimum=16)
        check_pow2(owner, "tile_d128", self.tile_d128, minimum=16)
        check_pow2(owner, "num_warps", self.num_warps)
        check_positive(owner, "num_stages", self.num_stages)

    def tile(self, d: int) -> int:
        return per_head_dim(self.generation, d, d64=self.tile_d64, d128=self.tile_d128)


def btnh_spec(t: int, d: int, heads: int, *, bh_axis: int) -> pl.BlockSpec:
    """A [T, D] view of one (batch, head) of a BTNH array, picked by grid axis ``bh_axis``.

    The batch and head dims are squeezed, so the kernel sees a 2-D ref whose row stride is H*D: the
    kernel reads BTNH in place, with no transpose to [B*H, T, D] in HBM.
    """

    def index_map(*g):
        bh = g[bh_axis]
        return (bh // heads, 0, bh % heads, 0)

    return pl.BlockSpec((None, t, None, d), index_map)


def full_spec(shape: tuple[int, ...], *, bh_axis: int | None = None) -> pl.BlockSpec:
    """The whole array (or, with ``bh_axis``, the slice ``[bh]`` of a [BH, ...] array)."""
    if bh_axis is None:
        return pl.BlockSpec(shape, lambda *g: (0,) * len(shape))
    return pl.BlockSpec((None, *shape[1:]), lambda *g: (g[bh_axis],) + (0,) * (len(shape) - 1))


def row_mask(rows, n: int, width: int):
    """[len(rows), width] mask of rows < n, for masked loads/stores of ragged row tiles."""
    return jnp.broadcast_to((rows < n)[:, None], (rows.shape[0], width))


def visible(q_pos, k_pos, *, tk: int, causal: bool, q_offset: int):
    """True where key ``k_pos`` exists (``< Tk``) and, if causal, ``k_pos <= q_pos + q_offset``.

    Top-left alignment (DESIGN.md decision 5); the reference's v1-v6 are the ``q_offset = 0`` case.
    Arguments broadcast (rows [R, 1] against keys [1, N], or a scalar row against keys [N]).
    """
    ok = k_pos < tk
    if causal:
        ok = ok & (k_pos <= q_pos + q_offset)
    return ok


def key_limit(last_row, *, tk: int, causal: bool, q_offset: int):
    """Number of leading keys that rows up to ``last_row`` can see: the loop bound that replaces the
    reference's per-row "stop at the first j > i" (a Python int when not causal, so loops stay static)."""
    if not causal:
        return tk
    return jnp.minimum(last_row + (q_offset + 1), tk)


def online_softmax_step(m, l, s, valid):
    """One block of the §2.0 recurrence on FP32 scores ``s [..., N]`` with running ``m, l [...]``.

    Returns ``(m_new, l_new, alpha, p)``; the caller rescales its O accumulator by ``alpha`` *before*
    adding ``p @ V`` (the reference's order). Masked scores become -inf, so their ``p`` is exactly 0 even
    while ``m`` is still -FLT_MAX (the all-masked-block guard of v8_gqa_tc, §2.9, for free).
    """
    s = jnp.where(valid, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(s - (m_new[..., None] if s.ndim > 1 else m_new))
    l_new = alpha * l + jnp.sum(p, axis=-1)
    return m_new, l_new, alpha, p


def finalize(acc, l):
    """O / l per row; a row that saw no visible key (l == 0) gives 0, never NaN."""
    l_b = l[..., None] if acc.ndim > l.ndim else l
    return jnp.where(l_b > 0, acc / jnp.where(l_b > 0, l_b, 1.0), 0.0)


def lse_merge(m, l, o, valid):
    """Merge unnormalized split partials: ``m, l [S]``, ``o [S, D]`` -> ``[D]`` (§2.0).

    ``m* = max_s m_s``; weights ``exp(m_s - m*)``; ``l* = sum_s w_s l_s``; output ``sum_s w_s O_s / l*``,
    0 if ``l* == 0`` (every split empty). ``valid`` masks padding entries beyond the real split count.
    An empty split (m = -FLT_MAX, l = 0, O = 0) has weight <= 1 and contributes nothing.
    """
    m = jnp.where(valid, m, -jnp.inf)
    m_star = jnp.max(m)
    w = jnp.exp(m - m_star)
    l_star = jnp.sum(w * l)
    o_sum = jnp.sum(w[:, None] * o, axis=0)
    return jnp.where(l_star > 0, o_sum / jnp.where(l_star > 0, l_star, 1.0), 0.0)


S_CAP = 32
MIN_CHUNK = 256
REFERENCE_NUM_SM = 40  # the T4 the reference tuned on; every recorded v6-v8 number used it (§7.3)


def choose_splits(
    *, bh: int, n_q: int, n_k: int, num_sm: int, rows_per_program: int = 8,
    s_cap: int = S_CAP, min_chunk: int = MIN_CHUNK,
) -> tuple[int, int]:
    """The reference's split count (§2.0): returns ``(S, chunk)`` with split ``s`` covering keys
    ``[s*chunk, min((s+1)*chunk, n_k))``.

    ``by_occ`` fills ``2 * num_sm`` programs; ``by_size`` keeps every split >= ``min_chunk`` keys;
    ``S = clamp(min(by_occ, by_size), 1, s_cap)``. Prefill (many row tiles) gives S = 1.
    """
    for name, val in (("bh", bh), ("n_q", n_q), ("n_k", n_k), ("num_sm", num_sm),
                      ("rows_per_program", rows_per_program), ("s_cap", s_cap), ("min_chunk", min_chunk)):
        if not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"choose_splits: {name} must be a positive int; got {name}={val!r}")
    row_tiles = cdiv(n_q, rows_per_program)
    base = bh * row_tiles
    by_occ = cdiv(2 * num_sm, max(base, 1))
    by_size = cdiv(n_k, min_chunk)
    s = max(1, min(by_occ, by_size, s_cap))
    return s, cdiv(n_k, s)


def dot_nt(a, b, *, precision=None):
    """``a [M, K] . b [N, K]^T -> [M, N]`` in FP32 without materializing b^T (the reference loads K as a
    col-major fragment for the same reason). ``precision=HIGHEST`` keeps FP32 operands in IEEE FP32
    (Triton ``input_precision="ieee"``: FMA on CUDA cores) instead of TF32 tensor cores."""
    return lax.dot_general(
        a, b, (((1,), (1,)), ((), ())), precision=precision, preferred_element_type=jnp.float32
    )


FP32_EXACT = lax.Precision.HIGHEST


def dot_nn(a, b, *, precision=None):
    """``a [M, K] . b [K, N] -> [M, N]`` accumulated in FP32."""
    return jnp.dot(a, b, precision=precision, preferred_element_type=jnp.float32)


def check_dense_shapes(owner: str, q, k, v) -> tuple[int, int, int, int, int]:
    """Shapes a kernel wrapper relies on (api.py validates the public path; wrappers may be called
    directly by compare). Returns ``(B, Tq, H, D, Tk)``."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(f"{owner}: q, k, v must be rank 4 BTNH; got {q.shape=}, {k.shape=}, {v.shape=}")
    b, tq, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"{owner}: k and v must be [B={b}, Tk, H, D={d}]; got {k.shape=}, {v.shape=}")
    if k.shape[2] != h:
        raise NotImplementedError(f"{owner} is MHA (Hq == Hkv); got Hq={h}, Hkv={k.shape[2]}")
    return b, tq, h, d, k.shape[1]

