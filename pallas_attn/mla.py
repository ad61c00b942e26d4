"""``pallas_attn.mla_attention``: weight-absorbed MLA decode over a paged latent cache (docs/mla.md).

Validation lives here (once, naming the argument); the kernels live in ``kernels/v11_mla.py`` (CUDA cores, the
reference's Step 11) and ``kernels/v12_mla_tc.py`` (tensor cores: Mosaic GPU on Hopper, with a Triton-lowered
tensor-core twin that is also the CPU-interpretable path); ``fa_mla`` is v12's default config on the DeepSeek-V3
shape.
"""

from __future__ import annotations

import numbers

from . import _compat, quant
from .api import _DECODE_HINT, _check_array, _check_scale, _dtype_name, _no_backward, resolve
from .kernels import seqlen
from .kernels.contract import Problem

__all__ = ["mla_attention", "validate_mla", "problem_mla"]

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _latent_view(latent_pool, q):
    """The latent's logical ``(shape, dtype name or format)``; quantized fields are checked."""
    fmt = quant.kv_format(latent_pool)
    if fmt is None:
        _check_array("latent_pool", latent_pool, 4, "[num_blocks, page_size, 1, DQK]")
        return tuple(latent_pool.shape), _dtype_name(latent_pool), None
    quant._check_fields("latent_pool", latent_pool)
    if len(latent_pool.shape) != 4:
        raise ValueError(f"latent_pool must have the logical shape [num_blocks, page_size, 1, DQK]; got "
                         f"{latent_pool.shape}")
    return tuple(latent_pool.shape), _dtype_name(q), fmt


def validate_mla(q, latent_pool, block_table, kv_lens, *, kv_lora_rank, causal, scale) -> float:
    """Shape / dtype checks of the MLA entry. Returns the effective scale (default ``1/sqrt(DQK)``)."""
    _check_array("q", q, 4, "[B, Tq, Hq, DQK] (BTNH, absorbed: [q_nope . W_UK, q_rope])")
    if _dtype_name(q) not in _FLOAT_DTYPES:
        raise ValueError(f"q must be float16, bfloat16 or float32; got q.dtype={_dtype_name(q)}")
    shape, ldt, fmt = _latent_view(latent_pool, q)
    nb, page, heads, dqk = shape
    if heads != 1:
        raise ValueError(f"latent_pool must hold ONE latent head ([num_blocks, page, 1, DQK]); got {heads} heads "
                         f"(latent_pool.shape={shape})")
    if fmt is None and ldt != _dtype_name(q):
        raise ValueError(f"q and a plain latent_pool must share a dtype; got q.dtype={_dtype_name(q)}, "
                         f"latent_pool.dtype={ldt} (quantized latents: pallas_attn.quant.Fp8Tensor / Nvfp4Tensor)")
    if q.shape[3] != dqk:
        raise ValueError(f"q and latent_pool must share DQK = kv_lora_rank + rope_dim; got q.shape[3]={q.shape[3]}, "
                         f"latent_pool DQK={dqk}")
    if min(q.shape) < 1 or min(shape) < 1:
        raise ValueError(f"every dimension must be >= 1; got {q.shape=}, latent_pool.shape={shape}")
    if page & (page - 1):
        raise ValueError(f"page_size (latent_pool.shape[1]) must be a power of two; got {page}")
    if isinstance(kv_lora_rank, bool) or not isinstance(kv_lora_rank, numbers.Integral):
        raise ValueError(f"kv_lora_rank must be an int; got {kv_lora_rank!r}")
    if not 0 < int(kv_lora_rank) <= dqk:
        raise ValueError(f"kv_lora_rank must lie in [1, DQK={dqk}]; got {kv_lora_rank}")
    _check_array("block_table", block_table, 2, "int32 [B, pages_per_seq]")
    if block_table.shape[0] != q.shape[0] or _dtype_name(block_table) != "int32" or block_table.shape[1] < 1:
        raise ValueError(f"block_table must be int32 [B={q.shape[0]}, pages_per_seq >= 1]; got "
                         f"{block_table.shape=}, {block_table.dtype=}")
    if not hasattr(kv_lens, "shape") or tuple(kv_lens.shape) != (q.shape[0],) or _dtype_name(kv_lens) != "int32":
        raise ValueError(f"kv_lens must be int32 [B={q.shape[0]}]; got {getattr(kv_lens, 'shape', kv_lens)!r}, "
                         f"{getattr(kv_lens, 'dtype', None)}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool; got {causal=!r}")
    return _check_scale(scale, dqk)


def problem_mla(q, latent_pool, block_table, *, kv_lora_rank: int, causal: bool) -> Problem:
    shape = tuple(latent_pool.shape)
    return Problem(entry="mla", dtype=_dtype_name(q), batch=q.shape[0], q_len=q.shape[1],
                   kv_len=block_table.shape[1] * shape[1], heads_q=q.shape[2], heads_kv=shape[2],
                   head_dim=shape[3], causal=causal, page_size=shape[1], kv_dtype=quant.kv_format(latent_pool),
                   kv_lora_rank=int(kv_lora_rank))


def mla_attention(q, latent_pool, block_table, kv_lens, *, kv_lora_rank: int, scale: float | None = None,
                  causal: bool = False, q_offset=None, generation: str = "fa_mla", config=None,
                  return_lse: bool = False, interpret: bool | None = None, check_block_table: bool = True):
    """Weight-absorbed MLA attention over a paged latent cache (MQA over one latent head).

    Args:
      q: ``[B, Tq, Hq, DQK]`` float16 / bfloat16, already absorbed: ``[q_nope . W_UK[h], q_rope]`` per head, with
        ``DQK = kv_lora_rank + rope_dim`` (DeepSeek-V3: 512 + 64 = 576).
      latent_pool: ``[num_blocks, page_size, 1, DQK]`` in q's dtype, or a ``pallas_attn.quant.Fp8Tensor`` /
        ``Nvfp4Tensor`` of that logical shape (fp8: uint8 bytes + a float32 tensor scale; NVFP4: packed
        ``[..., DQK/2]``, micro-scales ``[..., DQK/16]``, a tensor scale). Keys are the whole latent row; values
        its first ``kv_lora_rank`` columns (one cache, no V pool).
      block_table: int32 ``[B, pages_per_seq]``: key ``j`` of sequence ``b`` is row ``j % page`` of page
        ``block_table[b, j // page]``.
      kv_lens: int32 ``[B]`` (ragged batch).
      kv_lora_rank: DV, the value / output width.
      scale: static float. **Default ``1/sqrt(DQK)``** (the reference's); a real model passes its own, the scale
        of the materialized attention the absorbed form stands for (DeepSeek: ``1/sqrt(qk_nope_dim + rope_dim)``,
        times its YaRN factor), which is not ``1/sqrt(DQK)``.
      causal: top-left with an offset: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset[b]``;
        ``q_offset`` default ``kv_lens - Tq`` (int, int32 scalar or ``[B]``).
      generation: ``"fa_mla"`` (default: v12's tensor-core kernel, Mosaic GPU on Hopper), ``"v12_mla_tc"`` or
        ``"v11_mla"`` (the reference's CUDA-core kernel; fixed (DQK, DV) templates, NVFP4 latent with fp16 q).
      config: a config object, a name (``pallas_attn.generations()``) or None (the kernel's default).
      return_lse: also return the natural-log LSE ``[B, Hq, Tq]`` float32 (-inf for a row with no visible key).
      interpret: None interprets when no GPU is present.
      check_block_table: a page index outside the pool (among the pages a sequence uses) or a length the table
        cannot hold raises (concrete inputs) or makes that sequence's output NaN (under jit).

    Returns:
      ``[B, Tq, Hq, kv_lora_rank]`` in q's dtype (and the LSE). Apply ``W_UV`` to it for the heads' values.
      NaN in q or the latent gives NaN out. Unsupported combinations raise NotImplementedError naming what the
      generation supports; bad arguments raise ValueError naming the argument.
    """
    s = validate_mla(q, latent_pool, block_table, kv_lens, kv_lora_rank=kv_lora_rank, causal=causal, scale=scale)
    problem = problem_mla(q, latent_pool, block_table, kv_lora_rank=kv_lora_rank, causal=causal)
    kern, cfg = resolve(generation, problem, config)
    b = q.shape[0]
    # One query on the default offset (kv_len - 1) sees every key below kv_len: causal masks nothing the length
    # does not, so the kernels run the non-causal program and no offset is computed (an XLA launch saved;
    # docs/mla.md "The fixed cost").
    k_causal = causal and not (q_offset is None and q.shape[1] == 1)
    if not k_causal:
        offs = kv_lens  # unread by a non-causal kernel
    elif q_offset is None:
        offs = seqlen.paged_q_offsets(kv_lens, q.shape[1])
    else:
        offs = seqlen.q_offsets(q_offset, b)
    if kern.mla is None:
        raise NotImplementedError(f"generation {generation!r} has no MLA entry")

    def call(q, latent_pool, block_table, kv_lens, offs):
        return kern.mla(q, latent_pool, block_table, kv_lens, kv_lora_rank=int(kv_lora_rank), causal=k_causal,
                        scale=s, q_offset=offs, interpret=_compat.default_interpret(interpret), config=cfg,
                        return_lse=bool(return_lse), check_block_table=check_block_table)

    if kern.backward is None:  # no MLA kernel declares one: jax.grad / jax.jvp raise naming the entry and generation
        call = _no_backward(generation, call, entry="mla_attention", hint=_DECODE_HINT)
    with _compat.quiet_triton():
        return call(q, latent_pool, block_table, kv_lens, offs)

