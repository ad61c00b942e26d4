"""cuda_ref's public functions: validate in pure Python, then call the one JIT-built extension.

Everything here up to the extension call runs without a GPU, so the argument checks are tested on the
CPU (tests/test_cuda_ref_cpu.py). What each generation accepts comes from its row of
``generations.def`` (``cuda_ref.table``, rendered from ``attn_core.generations``); the split constants from
``attn_core.splits``; "known but not built" from ``attn_core.generations``. No JAX is imported. Conventions
(docs/reference.md §1.1, DESIGN.md decisions 4-5):

  * tensors are torch's BHND: q ``[B, H, Nq, D]``, k/v ``[B, H, Nk, D]``; the output is BHND **float32**
    whatever the input dtype, like the reference (the compare layer casts);
  * causal is top-left: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``. The reference's
    v1-v6 have no ``q_offset`` (it is always 0 there); we accept it in all six, a deliberate extension;
  * fp32-operand generations take float32 only (the reference TORCH_CHECKs it); fp16-operand ones take
    float32/float16/bfloat16 and cast to float16 on the host, inside the call, as the reference does (so
    bf16 inputs are rounded to fp16);
  * non-contiguous inputs are made contiguous before the kernel (a copy, outside the kernel);
  * ``return_lse=True`` also returns the kernel's own row log-sum-exp, float32 ``[B, H_q, N_q]``.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
from typing import Any, NamedTuple

from attn_core import generations as _known
from attn_core import splits as _splits
from attn_core.generations import MLA_TEMPLATES

# The module cuda_ref.table (the package attribute ``cuda_ref.table`` is its table() function).
_table = importlib.import_module(".table", __package__)

__all__ = [
    "GENERATION_IDS",
    "attention",
    "paged_attention",
    "generations",
    "choose_splits",
    "split_plan",
    "validate",
    "validate_paged",
    "PagedCall",
    "mla_attention",
    "validate_mla",
    "MlaCall",
    "MLA_TEMPLATES",
    "REFERENCE_NUM_SM",
]

# Generation id -> the integer the binding dispatches on (generations.def, rendered from attn_core.generations).
GENERATION_IDS: dict[str, int] = {g.id: g.number for g in _table.table()}

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_MAX_GRID_Y = 65535  # B*H rides in a grid dimension capped at 65535
_INT32_MAX = 2**31 - 1

# The split heuristic's constants live in attn_core.splits (split_plan.cuh mirrors them; a CPU test checks).
S_CAP = _splits.S_CAP
MIN_CHUNK = _splits.MIN_CHUNK
ROWS_PER_PROGRAM = _splits.ROWS_PER_PROGRAM
REFERENCE_NUM_SM = _splits.REFERENCE_NUM_SM  # the reference's T4 SM count, behind every recorded v6 number

NUM_SM_ENV = "CUDA_REF_NUM_SM"  # e.g. 40 to reproduce the reference's split plans for every split-KV call
DEBUG_ENV = "CUDA_REF_DEBUG"  # 1: poison outputs/workspace with NaN and synchronise after each call


def generations() -> tuple[str, ...]:
    """Generation ids cuda_ref builds kernels for (every entry), in reference order."""
    return _table.ids()


def _dtype_name(x: Any) -> str:
    return str(x.dtype).removeprefix("torch.")


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "dim")


def choose_splits(bh: int, n_q: int, n_k: int, num_sm: int | None = None) -> tuple[int, int]:
    """The split-KV plan ``(num_splits, chunk)`` of ``attn_core.splits``, which split_plan.cuh mirrors.

    ``num_sm=None`` uses the current CUDA device's SM count (needs a GPU); pass ``REFERENCE_NUM_SM`` (40)
    for the reference's plans, e.g. ``choose_splits(8, 1, 8192, 40) == (10, 820)``.
    """
    for name, val in (("bh", bh), ("n_q", n_q), ("n_k", n_k)):
        if not _is_int(val) or val < 1:
            raise ValueError(f"{name} must be an int >= 1; got {name}={val!r}")
    if num_sm is None:
        num_sm = _device_sm_count()
    elif not _is_int(num_sm) or num_sm < 1:
        raise ValueError(f"num_sm must be an int >= 1 or None; got {num_sm=!r}")
    return _splits.choose_splits(bh=bh, n_q=n_q, n_k=n_k, num_sm=num_sm)


def split_plan(generation: str, *, batch: int, h_q: int, h_kv: int, n_q: int, n_k: int, head_dim: int,
               num_sm: int | None = None) -> tuple[int, int]:
    """``(num_splits, chunk)`` a split-KV generation launches with at this shape (the binding's
    ``split_plan_for``): the heuristic of ``attn_core.splits`` over ``B * H_kv`` KV heads and
    ``ceil(G * n_q / rows)`` packed row tiles, ``rows`` = the row's ``tile_m`` at ``head_dim`` (8; 16 for
    v8_gqa_tc). For the MHA rows (v6, v7) this is ``choose_splits(B * H, n_q, n_k)``. ``n_k``: the dense key
    count, or for a paged call the table's capacity ``pages_per_seq * page_size``. ``num_sm=None``: the
    device's SM count (needs a GPU), else as :func:`choose_splits`.

    >>> split_plan("v8_gqa", batch=1, h_q=8, h_kv=1, n_q=1, n_k=8192, head_dim=128, num_sm=40)
    (32, 256)
    """
    _check_generation_type(generation)
    try:
        row = _table.by_id(generation)
    except KeyError:
        raise ValueError(f"{generation!r} is not a generation cuda_ref builds; built: "
                         f"{', '.join(_table.ids())}") from None
    if not row.split_kv:
        raise ValueError(f"{generation} takes no split plan (generations.def split_kv = 0)")
    for name, val in (("batch", batch), ("h_q", h_q), ("h_kv", h_kv), ("n_q", n_q), ("n_k", n_k),
                      ("head_dim", head_dim)):
        if not _is_int(val) or val < 1:
            raise ValueError(f"{name} must be an int >= 1; got {name}={val!r}")
    if h_q % h_kv:
        raise ValueError(f"h_q must be a multiple of h_kv; got h_q={h_q}, h_kv={h_kv}")
    if num_sm is None:
        num_sm = _device_sm_count()
    elif not _is_int(num_sm) or num_sm < 1:
        raise ValueError(f"num_sm must be an int >= 1 or None; got {num_sm=!r}")
    rows = row.tile(head_dim)[0]
    return _splits.choose_splits(bh=batch * h_kv, n_q=(h_q // h_kv) * n_q, n_k=n_k, num_sm=num_sm,
                                 rows_per_program=rows)


def _device_sm_count() -> int:
    from . import build

    build.require_cuda()
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


# --- generation resolution (from the table; attn_core for "known but not built") --------------------------


def _check_generation_type(generation: Any) -> None:
    if not isinstance(generation, str):
        raise ValueError(f"generation must be a string id; got {generation!r}")


def _resolve(generation: str, entry: str) -> _table.CudaGeneration:
    """The table row serving ``entry``. ValueError for an id nobody knows or a row of another entry,
    NotImplementedError for a generation attn_core knows that cuda_ref does not build."""
    calls = {"dense": "cuda_ref.attention", "paged": "cuda_ref.paged_attention",
             "quantized": "cuda_ref.paged_attention with cuda_ref.quant pools", "mla": "cuda_ref.mla_attention"}
    fn = calls.get(entry, "cuda_ref.paged_attention")
    built_here = _table.ids(entry)
    try:
        row = _table.by_id(generation)
    except KeyError:
        row = None
    if row is not None:
        if row.entry != entry:
            other = calls.get(row.entry, f"the {row.entry} entry")
            raise ValueError(f"{generation} is a {row.entry} generation: call {other}; {fn} serves "
                             f"{', '.join(built_here) or 'none yet'}")
        return row
    if generation not in _known.ids():
        raise ValueError(f"unknown generation {generation!r}; {fn} serves {', '.join(built_here) or 'none yet'}")
    known = _known.get(generation)
    if known.frontier and not known.twin:
        why = "frontier kernels are Pallas-only by design"
    elif not built_here:
        why = f"no {entry} generation is built in cuda_ref yet"
    else:
        why = f"not built in cuda_ref yet (its entries: {', '.join(sorted(known.entries))})"
    raise NotImplementedError(f"generation {generation!r} has no CUDA twin: {why}; built: "
                              f"{', '.join(_table.ids())}")


def _check_row_support(row: _table.CudaGeneration, *, dtype: str, d: int, hq: int, hkv: int,
                       return_lse: bool) -> None:
    """NotImplementedError for what the row's generation (and so the reference) does not do."""
    if not row.gqa and hq != hkv:
        raise NotImplementedError(f"{row.id} is MHA (H_q == H_kv) as in the reference; got H_q={hq}, H_kv={hkv}")
    if row.operand == "fp32" and dtype != "float32":
        fp16_rows = [g.id for g in _table.table() if g.operand == "fp16" and g.entry == row.entry]
        raise NotImplementedError(f"{row.id} takes float32 only (as the reference); got {dtype}. "
                                  f"{', '.join(fp16_rows) or 'no generation'} take float16/bfloat16")
    if not row.supports_head_dim(d):
        raise NotImplementedError(f"{row.id} supports head dims {row.head_dims}; got D={d}")
    if return_lse and not row.writes_lse:
        writers = [g.id for g in _table.table() if g.writes_lse and g.entry == row.entry]
        raise NotImplementedError(f"{row.id} does not write the log-sum-exp (generations.def writes_lse=0); "
                                  f"return_lse=True works with {', '.join(writers) or 'no generation'}")


# --- shared scalar checks -------------------------------------------------------------------------------


def _check_scale(scale, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    if isinstance(scale, bool):
        raise ValueError(f"scale must be a float; got {scale=!r}")
    try:
        s = float(scale)
    except (TypeError, ValueError) as e:
        raise ValueError(f"scale must be a float; got {scale!r}") from e
    if not math.isfinite(s):
        raise ValueError(f"scale must be finite; got {scale=}")
    return s


def _check_bool(name: str, val: Any) -> None:
    if not isinstance(val, bool):
        raise ValueError(f"{name} must be a bool; got {name}={val!r}")


def _check_num_sm(num_sm, row: _table.CudaGeneration) -> int:
    """The split-KV knob. Explicit argument > CUDA_REF_NUM_SM > the device's SM count (returned as 0)."""
    if num_sm is not None:
        if not row.split_kv:
            split_rows = [g.id for g in _table.table() if g.split_kv]
            raise ValueError(f"num_sm only applies to {', '.join(split_rows) or 'split-KV generations'}'s split "
                             f"heuristic; got it for {row.id}")
        if not _is_int(num_sm) or num_sm < 1:
            raise ValueError(f"num_sm must be an int >= 1 (40 = the reference's T4 constant); got {num_sm=!r}")
        return int(num_sm)
    env = os.environ.get(NUM_SM_ENV, "").strip()
    if env and row.split_kv:
        if not env.isdigit() or int(env) < 1:
            raise ValueError(f"{NUM_SM_ENV} must be a positive integer; got {env!r}")
        return int(env)
    return 0


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# --- dense entry ------------------------------------------------------------------------------------------


def validate(q, k, v, *, causal: bool, scale, q_offset, generation: str, num_sm=None,
             return_lse: bool = False) -> tuple[int, float, int]:
    """Every check of :func:`attention` that needs no GPU. Returns ``(gen_id, scale, num_sm)`` with
    ``num_sm`` 0 for "the device's count". Raises ValueError for bad input, NotImplementedError for what the
    generation does not support (or a generation cuda_ref does not build)."""
    _check_generation_type(generation)
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not _is_tensor(x):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be rank 4 [B, H, N, D] (BHND); got {name}.shape={tuple(x.shape)}")
        if _dtype_name(x) not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16; got {name}.dtype={_dtype_name(x)}")
    if not (_dtype_name(q) == _dtype_name(k) == _dtype_name(v)):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype=}, {k.dtype=}, {v.dtype=}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape [B, H, Nk, D]; got {tuple(k.shape)=}, {tuple(v.shape)=}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must share the batch size B; got {q.shape[0]=}, {k.shape[0]=}")
    if q.shape[3] != k.shape[3]:
        raise ValueError(f"q and k must share the head dim D; got {q.shape[3]=}, {k.shape[3]=}")
    if min(q.shape) < 1 or min(k.shape) < 1:
        raise ValueError(f"every dimension must be >= 1; got {tuple(q.shape)=}, {tuple(k.shape)=}")
    hq, hkv = q.shape[1], k.shape[1]
    if hq % hkv:
        raise ValueError(f"H_q must be a multiple of H_kv; got H_q={hq}, H_kv={hkv}")
    if not _is_int(q_offset) or q_offset < 0:
        raise ValueError(f"q_offset must be a non-negative int; got {q_offset=!r}")
    _check_bool("causal", causal)
    _check_bool("return_lse", return_lse)
    s = _check_scale(scale, q.shape[3])

    row = _resolve(generation, "dense")
    _check_row_support(row, dtype=_dtype_name(q), d=q.shape[3], hq=hq, hkv=hkv, return_lse=return_lse)
    if q.shape[0] * hq > _MAX_GRID_Y:
        raise NotImplementedError(f"B*H must be <= {_MAX_GRID_Y} (a CUDA grid dimension); got {q.shape[0] * hq}")
    if max(q.shape[2], k.shape[2], q_offset) > _INT32_MAX:
        raise NotImplementedError("sequence lengths and q_offset must fit in int32")
    return row.number, s, _check_num_sm(num_sm, row)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, q_offset: int = 0,
              generation: str = "v4_fused", num_sm: int | None = None, return_lse: bool = False):
    """Attention on torch BHND CUDA tensors: q ``[B, H, Nq, D]``, k/v ``[B, H, Nk, D]`` -> float32 ``[B, H, Nq, D]``.

    ``generation`` is one of :func:`generations` whose entry is dense (v1_naive ... v6_splitkv). ``scale``
    defaults to ``1/sqrt(D)``. Causal is top-left: key ``j`` is visible to query ``i`` iff
    ``j <= i + q_offset``. ``num_sm`` (split-KV generations only) sets the SM count of the split heuristic:
    ``None`` uses the device's (or ``$CUDA_REF_NUM_SM``), ``40`` reproduces the reference's recorded plans.

    ``return_lse=True`` returns ``(out, lse)``: ``lse`` float32 ``[B, H, Nq]``, the natural-log
    log-sum-exp of the scaled scores over the visible keys (``-inf`` for a row that sees none), written by
    the kernel itself from its row statistics (generations.def column ``writes_lse``).

    With ``CUDA_REF_DEBUG=1`` the outputs and workspace are NaN-poisoned and each call synchronises, so a
    missed write or an asynchronous fault surfaces at the call. The first call builds the extension (cached).
    """
    gen_id, s, sms = validate(q, k, v, causal=causal, scale=scale, q_offset=q_offset, generation=generation,
                              num_sm=num_sm, return_lse=return_lse)
    from . import build

    build.require_cuda()
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not x.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor; got device {x.device}")
        if x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}; got {x.device}")
    ext = build.load()
    res = ext.forward(gen_id, q, k, v, s, bool(causal), int(q_offset), sms, _debug(), bool(return_lse))
    return (res[0], res[1]) if return_lse else res[0]


# --- paged entry ------------------------------------------------------------------------------------------


class PagedCall(NamedTuple):
    """What :func:`validate_paged` resolved: the binding's arguments that are not the tensors."""

    gen_id: int
    scale: float
    num_sm: int  # 0: the device's SM count
    q_offset: Any  # None (kv_len - N_q per sequence), an int, or the int32 [B] tensor given
    kv_format: str | None = None  # None: float pools; "fp8" / "nvfp4": cuda_ref.quant pools (v9_fp8 / v10_nvfp4)


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _checkable(x: Any) -> bool:
    """Whether x's values can be read here: CPU tensors always, CUDA tensors in debug mode (a sync), meta
    tensors never."""
    dev = getattr(getattr(x, "device", None), "type", "meta")
    return dev == "cpu" or (dev == "cuda" and _debug())


# --- quantized pools (cuda_ref.quant.Fp8Tensor / Nvfp4Tensor; v9_fp8, v10_nvfp4) -----------------------------

_QUANT_GENERATION = {"fp8": "v9_fp8", "nvfp4": "v10_nvfp4"}


def _kv_format(pool: Any) -> str | None:
    """"fp8" / "nvfp4" for a cuda_ref.quant tensor, None for anything else."""
    from . import quant

    if isinstance(pool, quant.Fp8Tensor):
        return "fp8"
    if isinstance(pool, quant.Nvfp4Tensor):
        return "nvfp4"
    return None


def _check_quant_pool(name: str, pool: Any, fmt: str, q) -> tuple[int, ...]:
    """ValueError for a malformed quantized pool; returns its logical shape [num_blocks, page_size, H_kv, D]."""
    fields = ("data",) if fmt == "fp8" else ("packed", "micro")
    for f in fields:
        x = getattr(pool, f)
        if not _is_tensor(x):
            raise ValueError(f"{name}.{f} must be a torch.Tensor; got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name}.{f} must be rank 4 [num_blocks, page_size, H_kv, ...]; got "
                             f"{name}.{f}.shape={tuple(x.shape)}")
        if _dtype_name(x) != "uint8":
            raise ValueError(f"{name}.{f} must be uint8 (the format's bytes); got {name}.{f}.dtype={_dtype_name(x)}")
        if _is_tensor(q) and x.device != q.device:
            raise ValueError(f"{name}.{f} must be on q's device {q.device}; got {x.device}")
    sc = pool.scale
    if not _is_tensor(sc) or sc.dim() != 0 or _dtype_name(sc) != "float32":
        raise ValueError(f"{name}.scale must be a 0-d float32 tensor (as cuda_ref.quant returns it); got "
                         f"{getattr(sc, 'shape', type(sc).__name__)} {getattr(sc, 'dtype', '')}")
    if fmt == "fp8":
        return tuple(int(x) for x in pool.data.shape)
    packed, micro = pool.packed, pool.micro
    shape = (*(int(x) for x in packed.shape[:3]), 2 * int(packed.shape[3]))
    if tuple(micro.shape) != (*shape[:3], shape[3] // 16) or shape[3] % 32:
        raise ValueError(f"{name}: NVFP4 needs packed [num_blocks, page_size, H_kv, D/2] and micro [..., D/16] with "
                         f"D a multiple of 32; got packed {tuple(packed.shape)}, micro {tuple(micro.shape)}")
    return shape


def _quant_stand_ins(q, k_pool, v_pool, generation):
    """(kv_format, k stand-in, v stand-in, generation) for a call with cuda_ref.quant pools: the stand-ins are
    zero-stride views with the pools' logical shape, q's dtype and device, so the float pools' checks apply
    to the quantized ones word for word. (None, k_pool, v_pool, generation) for float pools."""
    kf, vf = _kv_format(k_pool), _kv_format(v_pool)
    if kf is None and vf is None:
        if generation is None:
            generation = "v7_paged"
        _check_generation_type(generation)
        row = _table.by_id(generation) if generation in _table.ids() else None
        if row is not None and row.entry == "quantized":
            fmt = next(f for f, g in _QUANT_GENERATION.items() if g == generation)
            raise ValueError(f"{generation} reads quantized pools: pass cuda_ref.quant.quantize_{fmt}"
                             f"{'_e4m3' if fmt == 'fp8' else ''}(pool) as k_pool and v_pool; got float pools")
        return None, k_pool, v_pool, generation
    if kf != vf:
        raise ValueError(f"k_pool and v_pool must be in the same format; got {kf or type(k_pool).__name__} and "
                         f"{vf or type(v_pool).__name__}")
    if generation is None:
        generation = _QUANT_GENERATION[kf]
    _check_generation_type(generation)
    if generation in _table.ids() and _table.by_id(generation).entry != "quantized":
        raise ValueError(f"{generation} reads float pools; {kf} pools (cuda_ref.quant) are read by "
                         f"{_QUANT_GENERATION[kf]}")
    if generation in _QUANT_GENERATION.values() and generation != _QUANT_GENERATION[kf]:
        raise ValueError(f"{generation} does not read {kf} pools; {kf} pools are read by {_QUANT_GENERATION[kf]}")
    if not _is_tensor(q):
        raise ValueError(f"q must be a torch.Tensor; got {type(q).__name__}")
    shapes = [_check_quant_pool(n, x, kf, q) for n, x in (("k_pool", k_pool), ("v_pool", v_pool))]
    import torch

    dtype = q.dtype if _dtype_name(q) in _FLOAT_DTYPES else torch.float32
    stand = [torch.empty((1, 1, 1, 1), dtype=dtype, device=q.device).expand(*s) for s in shapes]
    return kf, stand[0], stand[1], generation


def _check_table_lens_offset(block_table, kv_lens, q_offset, b: int):
    """Shapes and dtypes of the paged entries' block table, lengths and offset (values are checked later, on the
    host or in debug mode); returns q_offset when it is a tensor (its device is checked with the others)."""
    if block_table.dim() != 2 or block_table.shape[0] != b or block_table.shape[1] < 1:
        raise ValueError(f"block_table must be int32 [B, pages_per_seq] with B={b}; got "
                         f"block_table.shape={tuple(block_table.shape)}")
    if _dtype_name(block_table) != "int32":
        raise ValueError(f"block_table must be int32; got block_table.dtype={_dtype_name(block_table)}")
    if kv_lens.dim() != 1 or kv_lens.shape[0] != b:
        raise ValueError(f"kv_lens must be int32 [B] with B={b}; got kv_lens.shape={tuple(kv_lens.shape)}")
    if _dtype_name(kv_lens) != "int32":
        raise ValueError(f"kv_lens must be int32; got kv_lens.dtype={_dtype_name(kv_lens)}")
    if q_offset is None:
        return None
    if _is_tensor(q_offset):
        if q_offset.dim() != 1 or q_offset.shape[0] != b or _dtype_name(q_offset) != "int32":
            raise ValueError(f"q_offset as a tensor must be int32 [B] with B={b}; got shape "
                             f"{tuple(q_offset.shape)}, dtype {_dtype_name(q_offset)}")
        return q_offset
    if not _is_int(q_offset) or q_offset < 0:
        raise ValueError(f"q_offset must be None, a non-negative int or an int32 [B] tensor; got {q_offset=!r}")
    if q_offset > _INT32_MAX:
        raise ValueError(f"q_offset must fit in int32; got {q_offset=}")
    return None


def validate_paged(q, k_pool, v_pool, block_table, kv_lens, *, generation: str | None, causal: bool, scale,
                   q_offset, return_lse: bool, num_sm=None) -> PagedCall:
    """Every check of :func:`paged_attention` that needs no GPU, in this order: argument ValueErrors (all
    shapes, dtypes, devices; values too where they are readable, see ``_checkable``), then the generation
    (ValueError unknown, NotImplementedError not built), then what the generation does not support.

    Quantized pools (``cuda_ref.quant.Fp8Tensor`` / ``Nvfp4Tensor``, both pools the same format) select the
    quantized entry: their fields are checked (uint8 data ``[num_blocks, page_size, H_kv, D]``, or packed
    ``[..., D/2]`` + micro ``[..., D/16]``; 0-d float32 scales), then every float-pool check runs on their
    logical shape. ``generation=None`` picks ``v7_paged`` (float pools), ``v9_fp8`` or ``v10_nvfp4``."""
    kv_format, k_pool, v_pool, generation = _quant_stand_ins(q, k_pool, v_pool, generation)
    named = (("q", q), ("k_pool", k_pool), ("v_pool", v_pool), ("block_table", block_table), ("kv_lens", kv_lens))
    for name, x in named:
        if not _is_tensor(x):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be rank 4 [B, H_q, N_q, D] (BHND); got q.shape={tuple(q.shape)}")
    for name, x in (("k_pool", k_pool), ("v_pool", v_pool)):
        if x.dim() != 4:
            raise ValueError(f"{name} must be rank 4 [num_blocks, page_size, H_kv, D]; got "
                             f"{name}.shape={tuple(x.shape)}")
    for name, x in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool)):
        if _dtype_name(x) not in _FLOAT_DTYPES:
            raise ValueError(f"{name} must be float32, float16 or bfloat16; got {name}.dtype={_dtype_name(x)}")
    if not (_dtype_name(q) == _dtype_name(k_pool) == _dtype_name(v_pool)):
        raise ValueError(f"q, k_pool, v_pool must share a dtype; got {q.dtype=}, {k_pool.dtype=}, {v_pool.dtype=}")
    if tuple(k_pool.shape) != tuple(v_pool.shape):
        raise ValueError(f"k_pool and v_pool must have the same shape [num_blocks, page_size, H_kv, D]; got "
                         f"{tuple(k_pool.shape)=}, {tuple(v_pool.shape)=}")
    if min(q.shape) < 1:
        raise ValueError(f"every dimension of q must be >= 1; got q.shape={tuple(q.shape)}")
    if min(k_pool.shape) < 1:
        raise ValueError(f"every dimension of k_pool must be >= 1; got k_pool.shape={tuple(k_pool.shape)}")
    b, hq, n_q, d = (int(x) for x in q.shape)
    num_blocks, page_size, hkv, d_kv = (int(x) for x in k_pool.shape)
    if d_kv != d:
        raise ValueError(f"q and k_pool must share the head dim D; got q D={d}, k_pool D={d_kv}")
    if not _is_pow2(page_size):
        raise ValueError(f"page_size (k_pool.shape[1]) must be a power of two; got page_size={page_size}")
    if hq % hkv:
        raise ValueError(f"H_q must be a multiple of H_kv (k_pool.shape[2]); got H_q={hq}, H_kv={hkv}")
    q_offset_tensor = _check_table_lens_offset(block_table, kv_lens, q_offset, b)
    for name, x in (("k_pool", k_pool), ("v_pool", v_pool), ("block_table", block_table), ("kv_lens", kv_lens),
                    ("q_offset", q_offset_tensor)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}; got {x.device}")
    _check_bool("causal", causal)
    _check_bool("return_lse", return_lse)
    s = _check_scale(scale, d)
    pages_per_seq = int(block_table.shape[1])
    capacity = pages_per_seq * page_size
    if max(n_q, capacity, num_blocks) > _INT32_MAX:
        raise ValueError("N_q, pages_per_seq * page_size and num_blocks must fit in int32")
    _check_paged_values(block_table, kv_lens, q_offset, n_q=n_q, page_size=page_size, num_blocks=num_blocks,
                        capacity=capacity, causal=causal)

    row = _resolve(generation, "paged" if kv_format is None else "quantized")
    _check_row_support(row, dtype=_dtype_name(q), d=d, hq=hq, hkv=hkv, return_lse=return_lse)
    if b * hq > _MAX_GRID_Y:
        raise NotImplementedError(f"B*H_q must be <= {_MAX_GRID_Y} (a CUDA grid dimension); got {b * hq}")
    return PagedCall(row.number, s, _check_num_sm(num_sm, row), q_offset, kv_format)


def _check_paged_values(block_table, kv_lens, q_offset, *, n_q: int, page_size: int, num_blocks: int,
                        capacity: int, causal: bool) -> None:
    """Value checks of the paged metadata, where the values are readable (``_checkable``)."""
    if not (_checkable(kv_lens) and _checkable(block_table)):
        return
    lens = [int(x) for x in kv_lens.tolist()]
    bad = [(i, n) for i, n in enumerate(lens) if not 0 <= n <= capacity]
    if bad:
        i, n = bad[0]
        raise ValueError(f"kv_lens must lie in [0, pages_per_seq * page_size = {capacity}]; got kv_lens[{i}]={n}")
    table = block_table.tolist()
    for i, n in enumerate(lens):
        used = table[i][: -(-n // page_size)]  # only the pages holding keys are read
        out = [p for p in used if not 0 <= p < num_blocks]
        if out:
            raise ValueError(f"block_table entries of used pages must lie in [0, num_blocks={num_blocks}); got "
                             f"{out[0]} in row {i} (kv_lens[{i}]={n})")
    if _is_tensor(q_offset):
        if not _checkable(q_offset):
            return
        offs = [int(x) for x in q_offset.tolist()]
        neg = [(i, o) for i, o in enumerate(offs) if o < 0]
        if neg:
            raise ValueError(f"q_offset must be >= 0 for every sequence; got q_offset[{neg[0][0]}]={neg[0][1]}")
    elif q_offset is None and causal:
        short = [(i, n) for i, n in enumerate(lens) if n < n_q]
        if short:
            i, n = short[0]
            raise ValueError(f"causal with the default q_offset = kv_len - N_q needs kv_len >= N_q; got "
                             f"kv_lens[{i}]={n} < N_q={n_q} (pass q_offset explicitly)")


def _cuda_operands_and_offsets(q, named_tensors, block_table, kv_lens, q_offset):
    """Every operand of a paged entry on a CUDA device (ValueError naming the first that is not), then the
    per-sequence offsets as an int32 [B] tensor: ``kv_len - N_q`` by default, the tensor given, or the int."""
    import torch

    for name, x in (("q", q), *named_tensors, ("block_table", block_table), ("kv_lens", kv_lens)):
        if not x.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor; got device {x.device}")
    if q_offset is None:
        return (kv_lens - q.shape[2]).to(torch.int32)
    if _is_tensor(q_offset):
        return q_offset
    return torch.full((q.shape[0],), int(q_offset), dtype=torch.int32, device=q.device)


def paged_attention(q, k_pool, v_pool, block_table, kv_lens, *, generation: str | None = None, causal: bool = False,
                    scale: float | None = None, q_offset=None, return_lse: bool = False, num_sm: int | None = None):
    """Attention over a paged KV cache: q ``[B, H_q, N_q, D]`` (torch BHND), pools
    ``[num_blocks, page_size, H_kv, D]``, ``block_table`` int32 ``[B, pages_per_seq]``, ``kv_lens`` int32
    ``[B]`` -> float32 ``[B, H_q, N_q, D]`` (and float32 lse ``[B, H_q, N_q]`` with ``return_lse=True``).

    Key ``j`` of sequence ``b`` is row ``j % page_size`` of physical block ``block_table[b, j // page_size]``;
    keys ``j >= kv_lens[b]`` are invisible. ``page_size`` must be a power of two; query head ``h`` reads KV
    head ``h // (H_q // H_kv)``.

    Causal rule (top-left with offset): key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``.
    ``q_offset=None`` (default) is ``kv_len - N_q`` per sequence, i.e. the N_q queries are the last N_q
    tokens of their sequence (decode: the one query sees the whole cache). An int applies to every sequence;
    an int32 ``[B]`` tensor gives one offset per sequence.

    ``generation``: a paged row of :func:`cuda_ref.table` — ``v7_paged`` (MHA only, ``H_q == H_kv``) or the
    v8 family ``v8_gqa``, ``v8_gqa_tc``, ``v8_gqa_db``, ``v8_gqa_occ``, ``v8_gqa_ilp``, ``v8_gqa_ss`` (any
    ``G = H_q / H_kv``, any ``N_q``). Head dims 64 and 128; float32/float16/bfloat16 inputs, q and both pools
    cast to float16 on the host inside the call (as the reference), the output float32. ``None`` (default):
    ``v7_paged`` for float pools, ``v9_fp8`` / ``v10_nvfp4`` for quantized ones.

    Quantized KV (docs/reference.md §2.14, §2.15): ``k_pool`` and ``v_pool`` may instead both be
    ``cuda_ref.quant.Fp8Tensor`` (``data`` uint8 ``[num_blocks, page_size, H_kv, D]``, read by ``v9_fp8``) or
    both ``cuda_ref.quant.Nvfp4Tensor`` (``packed`` uint8 ``[..., D/2]``, ``micro`` ``[..., D/16]``, read by
    ``v10_nvfp4``), each with its own 0-d float32 ``scale`` (quantize each pool as one tensor with
    ``cuda_ref.quantize_fp8_e4m3`` / ``quantize_nvfp4``). The kernel dequantizes in the paged gather (fp32
    value rounded into the fp16 tile), then computes as ``v8_gqa_ss``; q is cast to fp16 as above.

    Every argument is validated in pure Python first (shapes, dtypes, devices; the metadata's values too
    when they are on the CPU, or on the GPU under ``CUDA_REF_DEBUG=1``): ValueError naming the argument.
    Then the generation: ValueError for an unknown id, NotImplementedError for one cuda_ref does not build.
    The kernels check every block-table entry they use and every ``kv_lens`` value once more: a bad one
    loads its keys as NaN (the rows that need them come out NaN, never a read outside the pool), and under
    ``CUDA_REF_DEBUG=1`` the binding raises ValueError naming it. ``num_sm`` is the split-KV knob of
    :func:`attention`; the plan is :func:`split_plan` with ``n_k = pages_per_seq * page_size``.
    """
    call = validate_paged(q, k_pool, v_pool, block_table, kv_lens, generation=generation, causal=causal,
                          scale=scale, q_offset=q_offset, return_lse=return_lse, num_sm=num_sm)
    from . import build

    build.require_cuda()
    import torch

    if call.kv_format is None:
        pools = (("k_pool", k_pool), ("v_pool", v_pool))
    else:
        fields = ("data",) if call.kv_format == "fp8" else ("packed", "micro")
        pools = tuple((f"{n}.{f}", getattr(x, f)) for n, x in (("k_pool", k_pool), ("v_pool", v_pool)) for f in fields)
    q_offsets = _cuda_operands_and_offsets(q, pools, block_table, kv_lens, call.q_offset)
    ext = build.load()
    if call.kv_format is None:
        res = ext.forward_paged(call.gen_id, q, k_pool, v_pool, block_table, kv_lens, q_offsets, call.scale,
                                bool(causal), call.num_sm, _debug(), bool(return_lse))
    else:
        nvfp4 = call.kv_format == "nvfp4"
        k_data, v_data = (k_pool.packed, v_pool.packed) if nvfp4 else (k_pool.data, v_pool.data)
        none = torch.empty(0, dtype=torch.uint8, device=q.device)
        k_micro, v_micro = (k_pool.micro, v_pool.micro) if nvfp4 else (none, none)
        # The scales travel as floats (float32 values, exact in a double): one device sync when they live there.
        res = ext.forward_paged_quant(call.gen_id, int(nvfp4), q, k_data, v_data, k_micro, v_micro,
                                      float(k_pool.scale), float(v_pool.scale), block_table, kv_lens, q_offsets,
                                      call.scale, bool(causal), call.num_sm, _debug(), bool(return_lse))
    return (res[0], res[1]) if return_lse else res[0]


# --- MLA entry (cuda_ref.mla_attention; v11_mla, v12_mla_tc) -------------------------------------------------------

# The MLA kernels are instantiated for attn_core.generations.MLA_TEMPLATES (DQK, kv_lora_rank = DV; docs/reference.md
# §2.16); the latent formats each MLA row reads (the launchers and the binding check the same).
_MLA_FORMATS = {"v11_mla": ("float16", "bfloat16", "nvfp4"), "v12_mla_tc": ("float16", "bfloat16", "fp8")}
_MLA_Q_DTYPES = ("float16", "bfloat16")


class MlaCall(NamedTuple):
    """What :func:`validate_mla` resolved: the binding's arguments that are not the tensors."""

    gen_id: int
    scale: float
    num_sm: int  # 0: the device's SM count
    q_offset: Any  # None (kv_len - N_q per sequence), an int, or the int32 [B] tensor given
    kv_format: str  # "float16" / "bfloat16" (a float pool), "fp8" or "nvfp4" (a cuda_ref.quant tensor)


def _latent_fields(latent_pool: Any, q: Any) -> tuple[str, tuple[int, ...], tuple[tuple[str, Any], ...]]:
    """(format, logical shape [num_blocks, page_size, H, DQK], named data tensors) of a latent pool, or ValueError."""
    fmt = _kv_format(latent_pool)
    if fmt is None:
        if not _is_tensor(latent_pool):
            raise ValueError(f"latent_pool must be a torch.Tensor or a cuda_ref.quant Fp8Tensor / Nvfp4Tensor; got "
                             f"{type(latent_pool).__name__}")
        if latent_pool.dim() != 4:
            raise ValueError(f"latent_pool must be rank 4 [num_blocks, page_size, 1, DQK]; got "
                             f"latent_pool.shape={tuple(latent_pool.shape)}")
        name = _dtype_name(latent_pool)
        if name not in ("float16", "bfloat16"):
            raise ValueError(f"latent_pool must be float16 or bfloat16 (or a cuda_ref.quant Fp8Tensor / Nvfp4Tensor); "
                             f"got latent_pool.dtype={name}")
        return name, tuple(int(x) for x in latent_pool.shape), (("latent_pool", latent_pool),)
    shape = _check_quant_pool("latent_pool", latent_pool, fmt, q)
    fields = ("data",) if fmt == "fp8" else ("packed", "micro")
    return fmt, shape, tuple((f"latent_pool.{f}", getattr(latent_pool, f)) for f in fields)


def validate_mla(q, latent_pool, block_table, kv_lens, *, kv_lora_rank, generation: str = "v11_mla",
                 causal: bool = False, scale=None, q_offset=None, return_lse: bool = False, num_sm=None) -> MlaCall:
    """Every check of :func:`mla_attention` that needs no GPU, in this order: argument ValueErrors (shapes, dtypes,
    devices, the latent pool's fields; the metadata's values where readable, as :func:`validate_paged`), then the
    generation (ValueError unknown or not an MLA row, NotImplementedError not built), then what it does not
    support (NotImplementedError: the (DQK, kv_lora_rank) template, the latent format)."""
    if not _is_tensor(q):
        raise ValueError(f"q must be a torch.Tensor; got {type(q).__name__}")
    if q.dim() != 4:
        raise ValueError(f"q must be rank 4 [B, H_q, N_q, DQK] (BHND); got q.shape={tuple(q.shape)}")
    if _dtype_name(q) not in _MLA_Q_DTYPES:
        raise ValueError(f"q must be float16 or bfloat16; got q.dtype={_dtype_name(q)}")
    fmt, lshape, data = _latent_fields(latent_pool, q)
    if fmt in _MLA_Q_DTYPES and fmt != _dtype_name(q):
        raise ValueError(f"a float latent_pool must have q's dtype; got q {_dtype_name(q)}, latent_pool {fmt}")
    for name, x in (("block_table", block_table), ("kv_lens", kv_lens)):
        if not _is_tensor(x):
            raise ValueError(f"{name} must be a torch.Tensor; got {type(x).__name__}")
    if min(q.shape) < 1:
        raise ValueError(f"every dimension of q must be >= 1; got q.shape={tuple(q.shape)}")
    if min(lshape) < 1:
        raise ValueError(f"every dimension of latent_pool must be >= 1; got {lshape}")
    b, hq, n_q, d_qk = (int(x) for x in q.shape)
    num_blocks, page_size, heads, d_lat = lshape
    if heads != 1:
        raise ValueError(f"latent_pool holds one latent head: [num_blocks, page_size, 1, DQK]; got {lshape}")
    if d_lat != d_qk:
        raise ValueError(f"q and latent_pool must share DQK; got q DQK={d_qk}, latent_pool DQK={d_lat}")
    if not _is_pow2(page_size):
        raise ValueError(f"page_size (latent_pool.shape[1]) must be a power of two; got page_size={page_size}")
    if not _is_int(kv_lora_rank) or not 1 <= kv_lora_rank <= d_qk:
        raise ValueError(f"kv_lora_rank must be an int in [1, DQK={d_qk}]; got {kv_lora_rank=!r}")
    q_offset_tensor = _check_table_lens_offset(block_table, kv_lens, q_offset, b)
    for name, x in (*data, ("block_table", block_table), ("kv_lens", kv_lens), ("q_offset", q_offset_tensor)):
        if x is not None and x.device != q.device:
            raise ValueError(f"{name} must be on q's device {q.device}; got {x.device}")
    _check_bool("causal", causal)
    _check_bool("return_lse", return_lse)
    s = _check_scale(scale, d_qk)
    capacity = int(block_table.shape[1]) * page_size
    if max(n_q, capacity, num_blocks) > _INT32_MAX:
        raise ValueError("N_q, pages_per_seq * page_size and num_blocks must fit in int32")
    _check_paged_values(block_table, kv_lens, q_offset, n_q=n_q, page_size=page_size, num_blocks=num_blocks,
                        capacity=capacity, causal=causal)

    _check_generation_type(generation)
    row = _resolve(generation, "mla")
    if (d_qk, kv_lora_rank) not in MLA_TEMPLATES:
        raise NotImplementedError(f"{row.id} instantiates (DQK, kv_lora_rank) in {list(MLA_TEMPLATES)} only "
                                  f"(docs/reference.md §2.16); got ({d_qk}, {kv_lora_rank})")
    reads = _MLA_FORMATS[row.id]
    if fmt not in reads:
        others = [g for g, f in _MLA_FORMATS.items() if fmt in f]
        raise NotImplementedError(f"{row.id} reads {', '.join(reads)} latents; a {fmt} latent is read by "
                                  f"{', '.join(others) or 'no generation'}")
    if return_lse and not row.writes_lse:
        raise NotImplementedError(f"{row.id} does not write the log-sum-exp")
    if b * hq > _MAX_GRID_Y:
        raise NotImplementedError(f"B*H_q must be <= {_MAX_GRID_Y} (a CUDA grid dimension); got {b * hq}")
    return MlaCall(row.number, s, _check_num_sm(num_sm, row), q_offset, fmt)


def mla_attention(q, latent_pool, block_table, kv_lens, *, kv_lora_rank: int, scale: float | None = None,
                  causal: bool = False, q_offset=None, generation: str = "v11_mla", num_sm: int | None = None,
                  return_lse: bool = False):
    """Absorbed MLA decode over a paged latent cache (docs/reference.md §2.16-§2.17): MQA of every query head over
    ONE latent head that is both K (all ``DQK`` columns) and V (its first ``kv_lora_rank`` columns).

    q ``[B, H_q, N_q, DQK]`` (torch BHND, float16 or bfloat16; absorbed: content part ``q_nope · W_UK``, then
    ``q_rope``), ``latent_pool`` ``[num_blocks, page_size, 1, DQK]`` in q's dtype, or a ``cuda_ref.quant``
    ``Fp8Tensor`` / ``Nvfp4Tensor`` of it (quantize the pool as one tensor, one scale), ``block_table`` int32
    ``[B, pages_per_seq]``, ``kv_lens`` int32 ``[B]`` -> float32 ``[B, H_q, N_q, kv_lora_rank]`` (the caller applies
    ``W_UV``), and with ``return_lse=True`` also the float32 natural-log lse ``[B, H_q, N_q]``.

    ``scale`` defaults to ``1/sqrt(DQK)`` as the reference; real models pass theirs (the scale of the materialized
    attention, ``1/sqrt(Dn + R)``). Causal is top-left with an offset: key ``j`` is visible to query ``i`` iff
    ``j <= i + q_offset``; ``q_offset=None`` is ``kv_len - N_q`` per sequence (an int or an int32 ``[B]`` tensor
    otherwise), as :func:`paged_attention`.

    ``generation``: ``v11_mla`` (default; CUDA cores, §2.16: reads fp16 / bf16 latents and NVFP4 as the
    reference; q is cast to fp16 on the host and every latent element is rounded to fp16 in the tile) or
    ``v12_mla_tc`` (tensor cores, mma.sync at q's dtype with fp32 accumulators; reads fp16 / bf16 latents and fp8
    E4M3, dequantized to q's dtype in shared memory). Both take ``(DQK, kv_lora_rank)`` in :data:`MLA_TEMPLATES`.

    Validation as :func:`paged_attention` (pure Python first: ValueError naming the argument; NotImplementedError
    for what the generation does not do; bounds-checked block table: a bad entry loads NaN, and under
    ``CUDA_REF_DEBUG=1`` the binding raises ValueError naming it). ``num_sm``: the split heuristic's SM count.
    """
    call = validate_mla(q, latent_pool, block_table, kv_lens, kv_lora_rank=kv_lora_rank, generation=generation,
                        causal=causal, scale=scale, q_offset=q_offset, return_lse=return_lse, num_sm=num_sm)
    from . import build

    build.require_cuda()
    import torch

    _, _, data = _latent_fields(latent_pool, q)
    q_offsets = _cuda_operands_and_offsets(q, data, block_table, kv_lens, call.q_offset)
    none = torch.empty(0, dtype=torch.uint8, device=q.device)
    if call.kv_format == "fp8":
        kv_format, lat, micro, lat_scale = 1, latent_pool.data, none, float(latent_pool.scale)
    elif call.kv_format == "nvfp4":
        kv_format, lat, micro, lat_scale = 2, latent_pool.packed, latent_pool.micro, float(latent_pool.scale)
    else:
        kv_format, lat, micro, lat_scale = 0, latent_pool, none, 1.0
    ext = build.load()
    res = ext.forward_mla(call.gen_id, kv_format, q, lat, micro, lat_scale, block_table, kv_lens, q_offsets,
                          int(kv_lora_rank), call.scale, bool(causal), call.num_sm, _debug(), bool(return_lse))
    return (res[0], res[1]) if return_lse else res[0]
