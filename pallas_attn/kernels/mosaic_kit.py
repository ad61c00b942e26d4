"""The pieces every Mosaic GPU (Hopper) kernel here builds on: fa_prefill, its backward and v12_mla_tc / fa_mla.

Issue 26's "Mosaic kit", first step (session 13): the helpers the three kernels imported from each other's private
names live here, once. Nothing in them is a kernel's own choice; moving them left every lowered program identical
(sha256 of the lowered CUDA text of fa_prefill's forward at every named config and D 64 / 128 / 256, with a window, a
soft-cap, q_lens and paged K/V; every fa_prefill_bwd config; every fa_mla config at pages 16 and 64).

* ``smem_tile``: a shared-memory operand tile in the layout wgmma and TMA want (8-row tiling, a 128-byte swizzle, or
  a narrower one where a tile's inner dimension is shorter);
* ``acc_load``: read a wgmma accumulator once at most ``wait_n`` wgmma groups are still in flight (the software
  pipelines' partial waits);
* ``ring_producer``: the producer warpgroup's loop over an ``ns``-slot TMA ring with "free" barriers;
* ``pad``: zero-pad one axis of an operand to a multiple of the tile (the kernels run whole tiles).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

__all__ = ["smem_tile", "acc_load", "ring_producer", "pad"]


def smem_tile(shape, dtype, swizzle: int = 128):
    """``plgpu.SMEM(shape, dtype)`` tiled (8, swizzle / itemsize) and swizzled by ``swizzle`` bytes."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    elems = swizzle // jnp.dtype(dtype).itemsize
    return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(swizzle)))


def acc_load(acc_ref, *, wait_n: int):
    """Read a wgmma accumulator once at most ``wait_n`` wgmma groups are still in flight."""
    from jax.experimental.pallas import mosaic_gpu as plgpu

    load = getattr(plgpu, "wgmma_accumulator_load", None)
    if load is None:  # jax 0.10 has the primitive but does not export it
        from jax._src.pallas.mosaic_gpu.primitives import wgmma_accumulator_load as load
    return load(acc_ref, wait_n=wait_n)


def ring_producer(plgpu, n, ns: int, free, issue) -> None:
    """The producer warpgroup's loop over an ``ns``-slot ring: step ``s`` (of ``n``) waits until slot ``s % ns`` is
    free (from its second use on) and calls ``issue(s, slot)``, the TMA copies into it; then it observes the last
    frees too (every phase of a barrier it waits on; idle time on the GPU anyway)."""

    @pl.loop(0, n)
    def _load(s):
        slot = lax.rem(s, ns)

        @pl.when(s >= ns)
        def _():
            plgpu.barrier_wait(free.at[slot])

        issue(s, slot)

    @pl.loop(jnp.maximum(n - ns, 0), n)
    def _drain(s):
        plgpu.barrier_wait(free.at[lax.rem(s, ns)])


def pad(x, axis: int, mult: int):
    """``x`` zero-padded along ``axis`` to a multiple of ``mult`` (``x`` itself when it already is one)."""
    n = x.shape[axis]
    extra = -n % mult
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)
