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
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Inputs", "make_inputs", "torch_cuda_available", "to_torch", "to_jax", "to_jax_btnh", "kv_lengths",
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
    if w.family != "paged_decode":
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



def make_inputs(w, *, seed: int | None = None) -> Inputs:
    """Seeded inputs for a workload (``w.seed`` unless given). Paged workloads also get shuffled pools
    (``attn_core.paging.build_paged_kv``) holding the same keys and values as the dense ``k``/``v``."""
    if w.family == "mla":
        raise NotImplementedError("compare has no MLA input path yet (needs the latent-cache builder)")
    dt = jnp.dtype(w.dtype)
    # Drawn on the device (a 1e9-element KV cache takes seconds in numpy, microseconds on a GPU), seeded,
    # standard normal in float32, then cast once: every implementation and the oracle see these values.
    kq, kk, kv = jax.random.split(jax.random.key(w.seed if seed is None else seed), 3)
    shape_q = (w.batch, w.q_len, w.heads_q, w.head_dim)
    shape_kv = (w.batch, w.kv_len, w.heads_kv, w.head_dim)
    q, k, v = (jax.random.normal(key, shp, jnp.float32).astype(dt)
               for key, shp in ((kq, shape_q), (kk, shape_kv), (kv, shape_kv)))
    scale = 1.0 / float(np.sqrt(w.head_dim))
    inp = Inputs(q=q, k=k, v=v, scale=scale)
    kvd = getattr(w, "kv_dtype", None)
    if kvd:
        _quantize_inputs(w, inp, kvd)
    elif w.family == "paged_decode":
        from attn_core import paging

        lens = kv_lengths(w)
        # Build pools from the rounded values so dense and paged views hold identical numbers.
        k_r, v_r = np.asarray(k.astype(jnp.float32)), np.asarray(v.astype(jnp.float32))
        k_pool, v_pool, table = paging.build_paged_kv(k_r, v_r, w.page_size, seed=w.seed, shuffle=True,
                                                      kv_lens=lens)
        inp.kv_lens = lens
        inp.k_pool = jnp.asarray(k_pool, dtype=dt)
        inp.v_pool = jnp.asarray(v_pool, dtype=dt)
        inp.block_table = jnp.asarray(table, dtype=jnp.int32)
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
