"""Pieces every Triton-lowered generation shares, written once (DESIGN.md decision 2, docs/reference.md §2.0).

The online-softmax recurrence, its finalize and the log-sum-exp live in ``softmax``; the split-KV state and
its merge in ``splitkv``; the split heuristic and its constants in ``attn_core.splits``; the query-offset
normaliser in ``seqlen``. What is left here is indexing and masking:

* ``visible`` / ``key_limit``: the top-left causal mask ``j <= i + q_offset`` plus the ragged-length mask
  ``j < Tk``, and how many keys a block of rows can see (the reference's "stop at j > i"). ``q_offset`` is
  a traced int32 (one sequence's value, read in the kernel with ``seq_offset``), so loop bounds are traced.
* ``offset_spec`` / ``seq_offset``: the int32 ``[B]`` offsets as a kernel input and one sequence's value,
  clamped to ``[-Tq, Tk]`` (outside that range the mask is all-or-nothing, and the clamp keeps
  ``i + q_offset + 1`` far from int32 overflow).
* ``btnh_spec`` / ``dot_nt``: BTNH indexing through BlockSpecs and the Q.K^T contraction.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._compat import load, pl
from . import seqlen

__all__ = [
    "SMEM_LIMIT",
    "stage_buffers",
    "cdiv",
    "next_pow2",
    "check_pow2",
    "check_positive",
    "per_head_dim",
    "btnh_spec",
    "full_spec",
    "visible",
    "key_limit",
    "offset_spec",
    "seq_offset",
    "dot_nt",
    "dot_nn",
    "FP32_EXACT",
    "row_mask",
    "check_dense_shapes",
]

# The shared memory one CTA may use on sm_90 (H100 / H200: the 227 KiB opt-in maximum), for every kernel that sizes
# its buffers against it (fa_prefill, its backward, fa_mla's tensor-core kernel, fa_decode's stage fit).
SMEM_LIMIT = 227 * 1024


def stage_buffers(block_m: int, num_stages: int) -> int:
    """The K/V buffers Triton's pipeliner keeps in shared memory for ``num_stages`` stages of a ``block_m``-row
    program: ``num_stages`` where the dots run on wgmma (``block_m`` >= 64: the asynchronous dot holds one buffer
    while the next loads land), one fewer on the mma.sync path (``block_m`` 16 / 32). Pinned by three launches of
    fa_decode's `spec_st4` (docs/fa_decode.md, "Session 37: the buffers a stage takes")."""
    return num_stages if block_m >= 64 else max(1, num_stages - 1)


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


def visible(q_pos, k_pos, *, tk, causal: bool, q_offset=None):
    """True where key ``k_pos`` exists (``< tk``) and, if causal, ``k_pos <= q_pos + q_offset``.

    Top-left alignment (DESIGN.md decision 5); the reference's v1-v6 are the ``q_offset = 0`` case.
    ``q_offset`` is the (traced) offset of the rows' sequence; it is not read when not causal.
    Arguments broadcast (rows [R, 1] against keys [1, N], or a scalar row against keys [N]).
    """
    ok = k_pos < tk
    if causal:
        ok = ok & (k_pos <= q_pos + q_offset)
    return ok


def key_limit(last_row, *, tk: int, causal: bool, q_offset=None):
    """Number of leading keys that rows up to ``last_row`` can see: the loop bound that replaces the
    reference's per-row "stop at the first j > i". A Python int when not causal (the loop stays static),
    else a traced int32 in ``[0, tk]`` (0 when the offset hides every key from these rows)."""
    if not causal:
        return tk
    return jnp.clip(last_row + (q_offset + 1), 0, tk)


def offset_spec(batch: int) -> pl.BlockSpec:
    """The int32 ``[B]`` query offsets as a whole-array kernel input (read per program with ``seq_offset``)."""
    return pl.BlockSpec((batch,), lambda *g: (0,))


def seq_offset(off_ref, b, *, tq: int, tk: int, mask=None):
    """Sequence ``b``'s query offset, clamped to ``[-tq, tk]`` (the mask is the same for every value
    beyond, and ``i + q_offset + 1`` cannot overflow int32). ``b`` may be a vector of sequence ids (one
    per flattened row, v1's softmax); ``mask`` then marks the real rows."""
    if mask is None:
        off = seqlen.offset_of(off_ref, b)
    else:
        off = load(off_ref.at[b], mask=mask, other=0)
    return jnp.clip(off, -tq, tk)


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


def check_host_cast(x, config, *, gen: str, alternatives: str = "pass float16 or bfloat16 arrays") -> None:
    """A 16-bit-operand kernel refuses FP32 input (no silent cast) unless ``config.host_cast`` asks for the
    reference host's cast (v5_wmma, v6_splitkv and the paged family share this rule)."""
    if x.dtype == jnp.float32 and not config.host_cast:
        raise NotImplementedError(
            f"{gen} takes 16-bit operands; got float32, refused (no silent cast). The reference host casts float32 "
            f"to {config.fp32_stage_dtype} before the kernel: pass {type(config).__name__}(host_cast=True) (or "
            f"dataclasses.replace(config, host_cast=True)) to do that explicitly, or {alternatives}")


def host_stage(x, config, *, gen: str, alternatives: str = "pass float16 or bfloat16 arrays"):
    """16-bit arrays stay as they are; FP32 is refused unless ``config.host_cast`` (``check_host_cast``), and then
    cast to ``config.fp32_stage_dtype`` before the kernel, as the reference host does."""
    check_host_cast(x, config, gen=gen, alternatives=alternatives)
    return x.astype(config.fp32_stage_dtype) if x.dtype == jnp.float32 else x


def validate_table_if_concrete(validate, block_table, kv_lens, *, num_pages: int, page_size: int) -> None:
    """Eager block-table validation when the table and lengths are concrete; under tracing the kernel poisons the
    sequence's output with NaN instead (``validate`` is ``kv_source.validate_block_table``)."""
    try:
        bt_np, lens_np = np.asarray(block_table), np.asarray(kv_lens)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    validate(bt_np, lens_np, num_pages=num_pages, page_size=page_size)

