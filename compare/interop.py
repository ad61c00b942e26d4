"""Inputs made once per workload and shared by every implementation, JAX and torch, without copies.

Inputs are seeded standard-normal draws (``jax.random``) on the default JAX device, cast once to the
workload's dtype; never zeros, whose products a compiler or a sparsity-aware unit could skip. torch sees
the *same* device buffers through DLPack (``torch.utils.dlpack.from_dlpack``); layout changes (BTNH ->
BHND for SDPA and cuda_ref, the peers' own page layouts, pre-scaled queries) are made here, once, outside
every timed region, and cached on the ``Inputs`` object so several implementations share them. Outputs
come back to BTNH JAX arrays through DLPack too (``to_jax_btnh``), also outside the timed region.

JAX and torch share the GPU, so JAX must not preallocate most of its memory: the entry points
(``compare.cli.main``, the scripts) set ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` before JAX is imported;
importing this module sets nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Inputs", "make_inputs", "make_mla_inputs", "page_latent", "torch_cuda_available", "to_torch", "to_jax",
           "to_jax_btnh", "kv_lengths", "packed_lengths", "roofline_view",
           "dequantized", "take_quantized"]


def torch_cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # no torch, or a broken one: torch implementations are then 'unavailable'
        return False


def to_torch(x: jax.Array):
    """Zero-copy JAX -> torch (same device buffer)."""
    import torch.utils.dlpack

    return torch.utils.dlpack.from_dlpack(x)


def to_jax(t) -> jax.Array:
    """Zero-copy torch -> JAX (a contiguous tensor; strided views are made contiguous first)."""
    return jax.dlpack.from_dlpack(t.contiguous())


def to_jax_btnh(out: Any, layout: str) -> jax.Array:
    """Any implementation's output as a BTNH JAX array (fp32 if the implementation returned fp32)."""
    if hasattr(out, "detach"):  # torch
        if layout == "BHND":
            out = out.transpose(1, 2)
        elif layout == "BND":  # [B, H, D] decode output
            out = out.unsqueeze(1)
        elif layout != "BTNH":
            raise ValueError(f"unknown layout {layout!r}")
        return to_jax(out)
    out = jnp.asarray(out)
    if layout == "BHND":
        return jnp.swapaxes(out, 1, 2)
    if layout == "BND":
        return out[:, None]
    if layout != "BTNH":
        raise ValueError(f"unknown layout {layout!r}")
    return out


def kv_lengths(w) -> np.ndarray | None:
    """Per-sequence key counts of a paged workload (None for dense ones), from their own seeded stream so
    the roofline can count ragged bytes before any input exists. Ragged: drawn in [kv_len/2, kv_len]
    (workloads.py), the longest exactly kv_len so the workload's kv_len is the real maximum."""
    if w.family not in ("paged_decode", "mla"):
        return None
    if not w.ragged:
        return np.full((w.batch,), w.kv_len, np.int32)
    rng = np.random.default_rng([w.seed, 1])
    lens = rng.integers(max(1, w.kv_len // 2), w.kv_len + 1, size=w.batch)
    lens[int(rng.integers(w.batch))] = w.kv_len
    return lens.astype(np.int32)


@dataclasses.dataclass
class Inputs:
    """One workload's inputs. Dense arrays are BTNH; ``k``/``v`` are also the dense view of a paged cache."""

    q: jax.Array
    k: jax.Array
    v: jax.Array
    scale: float
    kv_lens: np.ndarray | None = None  # int32 [B] (paged workloads)
    k_pool: Any = None  # [num_blocks, page, Hkv, D] (an Fp8Tensor / Nvfp4Tensor pool for a quantized workload)
    v_pool: Any = None
    block_table: jax.Array | None = None  # int32 [B, pages_per_seq]
    # quantized workloads (kv_dtype): k and v quantized on the device, each over the whole dense cache
    # (pallas_attn.quant.Fp8Tensor / Nvfp4Tensor); k / v stay the fp16 values they were quantized from
    k_quant: Any = None
    v_quant: Any = None
    kv_dtype: str | None = None
    # MLA workloads (make_mla_inputs): q [B, Tq, Hq, DQK]; k (and v, the same array) the dense latent
    # [B, Tk, 1, DQK] in the workload dtype (values are its first kv_lora_rank columns); latent_pool its paged
    # pool [num_blocks, page, 1, DQK] (an Fp8Tensor / Nvfp4Tensor pool when kv_dtype is set, with k_quant the
    # quantized dense latent it was paged from); block_table / kv_lens as for paged workloads
    latent_pool: Any = None
    kv_lora_rank: int | None = None
    # workload features (compare.workloads.FEATURES) and the train family (make_inputs):
    sinks: jax.Array | None = None  # float32 [Hq]: each query head's sink logit (sinks)
    doc_lengths: tuple[tuple[int, ...], ...] | None = None  # per batch row, its documents' lengths (packed)
    segment_ids: jax.Array | None = None  # int32 [B, T]: each token's document within its row (packed)
    cu_seqlens: jax.Array | None = None  # int32 [docs + 1]: document starts over the flattened [B * T] tokens
    max_doc_len: int | None = None  # the longest document (packed)
    w: jax.Array | None = None  # the cotangent weight of a train workload's loss sum(out * w), q's shape and dtype
    _cache: dict[str, Any] = dataclasses.field(default_factory=dict)

    def cached(self, key: str, make):
        """Derived inputs (layouts, pre-scaled q, torch views), built once and shared by implementations."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def kv_lens_jax(self) -> jax.Array:
        return self.cached("kv_lens_jax", lambda: jnp.asarray(self.kv_lens, dtype=jnp.int32))

    def torch_bhnd(self) -> tuple[Any, Any, Any]:
        """q, k, v as contiguous torch BHND tensors on the same device (one layout copy, untimed)."""
        def make():
            return tuple(to_torch(x).transpose(1, 2).contiguous() for x in (self.q, self.k, self.v))
        return self.cached("torch_bhnd", make)



def packed_lengths(w) -> tuple[tuple[int, ...], ...] | None:
    """A packed workload's documents, per batch row (None otherwise): row ``b`` holds
    ``attn_core.oracle.packed_doc_lengths(q_len, seed=w.seed + b)``, so rows differ and a workload's mix is fixed
    by its seed (available before any input exists: the roofline counts the visible pairs from it)."""
    if not getattr(w, "packed", False):
        return None
    from attn_core.oracle import packed_doc_lengths

    return tuple(tuple(packed_doc_lengths(w.q_len, w.seed + b)) for b in range(w.batch))


def _window_pairs(tq: int, tk: int, off: int, window: int | None, causal: bool) -> tuple[int, int, int]:
    """``(visible pairs, first key read, end of keys read)`` of one sequence: query ``i`` sees keys
    ``max(0, i + off - W + 1) <= j <= min(tk - 1, i + off)`` (causal, window W; no window: from 0)."""
    i = np.arange(tq, dtype=np.int64)
    hi = np.minimum(i + off, tk - 1) if causal else np.full(tq, tk - 1)
    lo = np.maximum(0, i + off - window + 1) if window is not None else np.zeros(tq, np.int64)
    n = np.maximum(0, hi - lo + 1)
    seen = n > 0
    if not seen.any():
        return 0, 0, 0
    return int(n.sum()), int(lo[seen].min()), int(hi[seen].max()) + 1


def roofline_view(w):
    """The workload as ``compare.roofline.problem_for`` should count it: ``w`` itself, or a namespace of its
    fields plus ``kv_tokens`` (the keys read over the batch: ragged lengths; a window that leaves keys no query
    sees, e.g. a decode row over a long cache) and ``mask_pairs`` (visible (query, key) pairs per batch row and head,
    averaged over the batch, where a window or packed documents leave fewer than the causal count)."""
    import types

    lens = kv_lengths(w)
    window = getattr(w, "window", None)
    docs = packed_lengths(w)
    extra: dict = {}
    if lens is not None and w.ragged:
        extra["kv_tokens"] = int(lens.sum())
    if docs is not None:  # causal within each document (and its window)
        extra["mask_pairs"] = sum(_window_pairs(d, d, 0, window, True)[0] for row in docs for d in row) / w.batch
    elif window is not None:
        per_seq = lens if lens is not None else np.full(w.batch, w.kv_len)
        pairs = tokens = 0
        cache = {}
        for n in per_seq.tolist():
            off = n - w.q_len if w.family in ("paged_decode", "mla") else w.q_offset
            if (n, off) not in cache:
                cache[(n, off)] = _window_pairs(w.q_len, n, off, window, bool(w.causal))
            p, lo, hi = cache[(n, off)]
            pairs, tokens = pairs + p, tokens + (hi - lo)
        extra["mask_pairs"] = pairs / w.batch
        extra["kv_tokens"] = tokens
    if not extra:
        return w
    return types.SimpleNamespace(**{**w.as_dict(), **extra})


def _feature_inputs(w, inp: Inputs, key, dt, seed: int) -> None:
    """What a workload's features and family add to its inputs, drawn from streams of their own so that q, k and v
    are the draws a workload without them gets: sink logits (``sinks``: float32 ``[Hq]``, standard normal from
    ``numpy.random.default_rng([seed, 3])``), the packed documents (``packed``: ``packed_lengths``, their segment
    ids ``[B, T]`` and ``cu_seqlens`` over the flattened ``[B * T]`` tokens), the train loss's cotangent weight
    (``train``: standard normal from ``jax.random.fold_in(key, 3)``, cast to the workload dtype, q's shape)."""
    from attn_core import oracle as reference

    if getattr(w, "sinks", False):
        inp.sinks = jnp.asarray(np.random.default_rng([seed, 3]).standard_normal(w.heads_q).astype(np.float32))
    docs = packed_lengths(w)
    if docs is not None:
        inp.doc_lengths = docs
        inp.segment_ids = jnp.asarray(np.stack([reference.segment_ids_from_lengths(d) for d in docs]))
        flat = [n for d in docs for n in d]
        inp.cu_seqlens = jnp.asarray(np.concatenate([[0], np.cumsum(flat)]).astype(np.int32))
        inp.max_doc_len = int(max(flat))
    if w.family == "train" and inp.w is None:  # make_inputs draws it with q, k, v (_draw_qkv)
        inp.w = jax.random.normal(jax.random.fold_in(key, 3), inp.q.shape, jnp.float32).astype(dt)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _draw_qkv(root, shape_q: tuple, shape_kv: tuple, dt, with_w: bool = False):
    """q, k, v: three streams split from ``root``, standard normal in float32, cast to ``dt``; ``with_w``: also the
    train family's cotangent weight (``_feature_inputs``'s stream, ``fold_in(root, 3)``, q's shape). One program per
    shape: the same values as the draws and casts run one by one, which compiled a program each."""
    kq, kk, kv = jax.random.split(root, 3)
    out = tuple(jax.random.normal(key, shp, jnp.float32).astype(dt)
                for key, shp in ((kq, shape_q), (kk, shape_kv), (kv, shape_kv)))
    if with_w:
        out += (jax.random.normal(jax.random.fold_in(root, 3), shape_q, jnp.float32).astype(dt),)
    return out


@functools.partial(jax.jit, static_argnames=("n_pages", "page_size", "spare", "fill"))
def _page_field(x, batch, page, slots, *, n_pages: int, page_size: int, spare: int = 0, fill=None):
    """One field ``[B, Tk, ...]`` of a device cache paged as ``attn_core.paging`` pages it, from its layout
    (``paging.paged_layout``: logical page ``page[i]`` of sequence ``batch[i]`` to slot ``slots[i]`` of ``n_pages``),
    zero elsewhere, then ``spare`` extra blocks set to ``fill`` (an int code, or ``"amax"``: the largest finite
    magnitude in the placed pages, else 0, as ``build_paged_latent`` fills them); one compiled program a shape."""
    b, tk, rest = x.shape[0], x.shape[1], x.shape[2:]
    pps = -(-tk // page_size)
    xp = jnp.pad(x, ((0, 0), (0, pps * page_size - tk)) + ((0, 0),) * len(rest)).reshape(b, pps, page_size, *rest)
    pool = jnp.zeros((n_pages, page_size, *rest), x.dtype).at[slots].set(xp[batch, page])
    if spare:
        if fill == "amax":
            amax = jnp.max(jnp.abs(pool.astype(jnp.float32)))
            value = jnp.where(jnp.isfinite(amax), amax, 0.0)
        else:
            value = jnp.asarray(fill)
        pool = jnp.concatenate([pool, jnp.full((spare, page_size, *rest), value.astype(x.dtype))])
    return pool


def _layout_on_device(lay) -> tuple:
    """A ``paging.PagedLayout``'s placement arrays on the device (int32), for ``_page_field``."""
    return tuple(jax.device_put(np.asarray(a, np.int32)) for a in (lay.batch, lay.page, lay.slots))


def compile_inputs(w) -> bool:
    """Compile the program ``make_inputs`` draws ``w``'s q, k, v (and train's cotangent) with, from shapes alone (no
    data, no device work): a runner warms it on a worker thread while the workload before ``w`` runs (an MLA
    workload's ``_draw_mla``)."""
    key = jax.random.key(0)
    draw, args = _draw_of(w)
    draw.lower(jax.ShapeDtypeStruct(key.shape, key.dtype), *args).compile()
    return True


def _draw_of(w) -> tuple[Callable, tuple]:
    """The program that draws ``w``'s inputs and its static arguments after the key: ``_draw_mla`` (q, latent) for
    MLA, else ``_draw_qkv`` (q, k, v, and the cotangent of a train workload)."""
    dt = jnp.dtype(w.dtype)
    shape_q = (w.batch, w.q_len, w.heads_q, w.head_dim)
    if w.family == "mla":
        return _draw_mla, (shape_q, (w.batch, w.kv_len, 1, w.head_dim), dt)
    return _draw_qkv, (shape_q, (w.batch, w.kv_len, w.heads_kv, w.head_dim), dt, w.family == "train")


def make_inputs(w, *, seed: int | None = None) -> Inputs:
    """Seeded inputs for a workload (``w.seed`` unless given). Paged workloads also get shuffled pools
    (``attn_core.paging.build_paged_kv``) holding the same keys and values as the dense ``k``/``v``; a workload's
    features and the train family add their own inputs (``_feature_inputs``) without changing q, k, v."""
    if w.family == "mla":
        return make_mla_inputs(w, seed=seed)
    dt = jnp.dtype(w.dtype)
    # Drawn on the device (a 1e9-element KV cache takes seconds in numpy, microseconds on a GPU), seeded,
    # standard normal in float32, then cast once: every implementation and the oracle see these values.
    root = jax.random.key(w.seed if seed is None else seed)
    draw, args = _draw_of(w)
    q, k, v, *wt = draw(root, *args)
    scale = 1.0 / float(np.sqrt(w.head_dim))
    inp = Inputs(q=q, k=k, v=v, scale=scale)
    if wt:
        inp.w = wt[0]
    _feature_inputs(w, inp, root, dt, w.seed if seed is None else seed)
    kvd = getattr(w, "kv_dtype", None)
    if kvd:
        _quantize_inputs(w, inp, kvd)
    elif w.family == "paged_decode":
        from attn_core import paging

        lens = kv_lengths(w)
        # attn_core.paging's placement (build_paged_kv's, seeded), the values moved on the device: the pools hold
        # the dense view's numbers (session 25: built on the host, a B32 S8k workload's inputs took ~16 s of numpy)
        lay = paging.paged_layout(w.batch, w.kv_len, w.page_size, seed=w.seed, shuffle=True, kv_lens=lens)
        where = _layout_on_device(lay)
        inp.kv_lens = lens
        inp.k_pool, inp.v_pool = (_page_field(x, *where, n_pages=lay.n_pages, page_size=w.page_size) for x in (k, v))
        inp.block_table = jax.device_put(lay.table)
    return inp


def _quantize_inputs(w, inp: Inputs, kvd: str) -> None:
    """A quantized-KV workload's cache: K and V (the workload-dtype values every oracle sees) quantized on the
    device with ``pallas_attn.quant``, each as one whole tensor (one per-tensor scale; NVFP4 micro-blocks along
    the head dim), as docs/quantized_kv.md defines the formats; a paged workload then pages every field of the
    quantized cache with one permutation (``quant.build_paged_quantized``: quantize first, then page)."""
    from pallas_attn import quant

    fn = {"fp8_e4m3": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}.get(kvd)
    if fn is None:
        raise ValueError(f"unknown kv_dtype {kvd!r}; known: fp8_e4m3, nvfp4")
    inp.kv_dtype = kvd
    inp.k_quant, inp.v_quant = fn(inp.k), fn(inp.v)
    if w.family == "paged_decode":
        lens = kv_lengths(w)
        inp.kv_lens = lens
        inp.k_pool, inp.v_pool, table = quant.build_paged_quantized(inp.k_quant, inp.v_quant, w.page_size,
                                                                    seed=w.seed, kv_lens=lens)
        inp.block_table = jnp.asarray(table, dtype=jnp.int32)
        inp.k_quant = inp.v_quant = None  # the paged entry reads the pools only; the dense copy is not kept


def dequantized(t) -> jax.Array:
    """float32 values of a quantized tensor (or a slice of one: any leading shape), ``pallas_attn.quant``."""
    from pallas_attn import quant

    fmt = quant.kv_format(t)
    if fmt == "fp8_e4m3":
        return quant.dequantize_fp8_e4m3(t)
    if fmt == "nvfp4":
        return quant.dequantize_nvfp4(t)
    raise ValueError(f"not a quantized tensor: {type(t).__name__}")


def take_quantized(t, index) -> Any:
    """The same quantized tensor type holding ``field[index]`` of every array field (scale unchanged): a slice of
    batches, pages or heads of a quantized cache, still exactly the bytes the kernel reads."""
    from pallas_attn import quant

    fmt = quant.kv_format(t)
    if fmt == "fp8_e4m3":
        return quant.Fp8Tensor(data=t.data[index], scale=t.scale)
    if fmt == "nvfp4":
        return quant.Nvfp4Tensor(packed=t.packed[index], micro=t.micro[index], scale=t.scale)
    raise ValueError(f"not a quantized tensor: {type(t).__name__}")


# ------------------------------------------------------------------------------------------------- MLA


def page_latent(latent, page_size: int, *, seed: int, kv_lens) -> tuple[Any, jax.Array]:
    """Page a dense latent ``[B, Tk, 1, DQK]`` (a JAX array in any dtype, or a pallas_attn.quant Fp8Tensor /
    Nvfp4Tensor of it) into ``(pool [num_blocks, page, 1, ...], block_table int32 [B, pages_per_seq])``.

    The table and the page placement are ``attn_core.paging.build_paged_latent``'s (its layout,
    ``paging.paged_layout``, and its ``LATENT_SPARE_BLOCKS`` spare blocks), every field of the latent placed on the
    device (``_page_field``). So the pool holds the bytes the builder would have placed (same permutation, zeros where
    it pads, and in its spare blocks, which no table entry points at, the builder's fill: the largest magnitude of the
    placed pages, for a quantized latent the largest finite code, which leaves the per-tensor scale unchanged) without
    copying a multi-GB latent through the host; a quantized latent is quantized first (one per-tensor scale over the
    whole cache) and then paged, as ``pallas_attn.quant.build_paged_quantized`` does."""
    from attn_core import paging
    from pallas_attn import quant

    fmt = quant.kv_format(latent)
    shape = tuple(latent.shape)
    if len(shape) != 4 or shape[2] != 1:
        raise ValueError(f"latent must be [B, Tk, 1, DQK]; got shape {shape}")
    lay = paging.paged_layout(shape[0], shape[1], page_size, seed=seed, shuffle=True, kv_lens=kv_lens)
    where = _layout_on_device(lay)

    def page(field, fill):  # [B, Tk, 1, W] -> [num_blocks + spare, page, 1, W]
        return _page_field(field, *where, n_pages=lay.n_pages, page_size=page_size,
                           spare=paging.LATENT_SPARE_BLOCKS, fill=fill)

    if fmt == "fp8_e4m3":  # 0x7E: 448, the largest finite E4M3 code; NVFP4 0x77: level 6 twice
        pool = quant.Fp8Tensor(data=page(latent.data, 0x7E), scale=latent.scale)
    elif fmt == "nvfp4":
        pool = quant.Nvfp4Tensor(packed=page(latent.packed, 0x77), micro=page(latent.micro, 0x7E), scale=latent.scale)
    else:
        pool = page(jnp.asarray(latent), "amax")
    return pool, jax.device_put(lay.table)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _draw_mla(root, shape_q: tuple, shape_lat: tuple, dt):
    """An MLA workload's q and latent: two streams split from ``root``, standard normal in float32, cast to ``dt``
    (one program a shape; the same values as the draws one by one)."""
    kq, kl = jax.random.split(root, 2)
    return (jax.random.normal(kq, shape_q, jnp.float32).astype(dt),
            jax.random.normal(kl, shape_lat, jnp.float32).astype(dt))


def make_mla_inputs(w, *, seed: int | None = None) -> Inputs:
    """An MLA workload's inputs (docs/mla.md): absorbed queries ``q [B, Tq, Hq, DQK]`` and one shared latent
    ``[B, Tk, 1, DQK]`` (``DQK = kv_lora_rank + rope_dim``), seeded standard normal cast once to the workload
    dtype, the latent paged into a shuffled pool of ``page_size`` (``page_latent``) with per-sequence lengths
    (``kv_lengths``: ragged when the workload says so). A quantized workload (``kv_dtype``) quantizes the whole
    dense latent on the device (pallas_attn.quant: one per-tensor scale; NVFP4 micro-blocks along DQK), then
    pages every field; ``k`` keeps the workload-dtype values it was quantized from (the fp16 reference).
    ``scale`` is 1/sqrt(DQK), the entries' default (a real model passes its own, 1/sqrt(Dn + R))."""
    if w.family != "mla":
        raise ValueError(f"make_mla_inputs takes an mla workload; got family {w.family!r}")
    draw, args = _draw_of(w)
    q, latent = draw(jax.random.key(w.seed if seed is None else seed), *args)
    lens = kv_lengths(w)
    inp = Inputs(q=q, k=latent, v=latent, scale=1.0 / float(np.sqrt(w.head_dim)), kv_lens=lens,
                 kv_lora_rank=int(w.kv_lora_rank))
    kvd = getattr(w, "kv_dtype", None)
    page = w.page_size or 64
    if kvd:
        from pallas_attn import quant

        fn = {"fp8_e4m3": quant.quantize_fp8_e4m3, "nvfp4": quant.quantize_nvfp4}.get(kvd)
        if fn is None:
            raise ValueError(f"unknown kv_dtype {kvd!r}; known: fp8_e4m3, nvfp4")
        inp.kv_dtype = kvd
        inp.k_quant = fn(latent)
        inp.latent_pool, inp.block_table = page_latent(inp.k_quant, page, seed=w.seed, kv_lens=lens)
    else:
        inp.latent_pool, inp.block_table = page_latent(latent, page, seed=w.seed, kv_lens=lens)
    return inp
