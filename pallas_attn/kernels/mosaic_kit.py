"""The pieces every Mosaic GPU (Hopper) kernel here builds on: fa_prefill, its backward and v12_mla_tc / fa_mla.

Issue 26's "Mosaic kit", first step (session 13): the helpers the three kernels imported from each other's private
names live here, once. Nothing in them is a kernel's own choice; moving them left every lowered program identical
(sha256 of the lowered CUDA text of fa_prefill's forward at every named config and D 64 / 128 / 256, with a window, a
soft-cap, q_lens and paged K/V; every fa_prefill_bwd config; every fa_mla config at pages 16 and 64).

* ``smem_tile``: a shared-memory operand tile in the layout wgmma and TMA want (8-row tiling, a 128-byte swizzle, or
  a narrower one where a tile's inner dimension is shorter);
* ``acc_load``: read a wgmma accumulator once at most ``wait_n`` wgmma groups are still in flight (the software
  pipelines' partial waits);
* ``ring_producer``: the producer warpgroup's loop over an ``ns``-slot TMA ring with "free" barriers, the one
  loop of all three kernels' producers (the forward's K and V rings counted across row tiles, the backward's two
  kernels, v12's latent ring with its slot computed inside the wait), and ``ring_drain``, its last step (observe
  the last frees), also for a kernel whose loads are not one such loop;
* ``WgmmaOps``: the register side of a kernel's math (layout casts, fresh accumulators, iotas, loads into the wgmma
  layout and broadcasts in it, wgmma products waited for: one, two issued together, sums over contraction parts,
  and the software-pipelined steps, ``mma_under``, whose last product runs under the math on the first ones:
  ``pipelined_step``, a consumer's S = Q K^T with the softmax under O += P V, and ``mma2_under``, the backward's
  dQ step), or with ``emulate`` their stand-ins on jax's GPU interpreter (v12_mla_tc's schedules, fa_prefill_bwd's
  two kernels and fa_prefill's forward are written on it);
* ``pad``: zero-pad one axis of an operand to a multiple of the tile (the kernels run whole tiles).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .. import _compat

__all__ = ["smem_tile", "acc_load", "ring_producer", "ring_drain", "WgmmaOps", "pad"]


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


def ring_producer(plgpu, n, ns: int, free, issue, *, start=0, base=None, slot_in_wait: bool = False,
                  drain: bool = True):
    """The producer warpgroup's loop over an ``ns``-slot TMA ring with "free" barriers (every Mosaic kernel here).

    Steps ``s`` in ``[start, n)``; step ``s`` fills ring position ``r``: ``s`` itself, or with ``base`` (a ring
    counted across calls, as the forward's over its row tiles) ``base + s - start``; position ``r`` is slot
    ``r % ns``. ``free`` and ``issue``: one "free" barrier array and ``issue(s, slot)``, the TMA copies of step
    ``s`` into ``slot``, or equal-length sequences of them (rings sharing one index, as the forward's K and V): for
    each pair in turn the step waits for ``free[slot]`` (from the slot's second use, ``r >= ns``), then issues.
    ``slot_in_wait``: the slot index is computed inside each wait, and again just before each issue (rather than
    once per step, before the first wait). ``drain``: then observe the last frees (``ring_drain``; positions from
    0: ``base`` None and ``start`` 0 only).

    Returns ``base + (n - start)``, the ring position after the last step (the next call's ``base``), or None
    without ``base``. Every choice only places the same operations (where a ``rem`` is computed, which wait
    precedes which copy), so each kernel keeps the exact program it had with its own loop."""
    pairs = list(zip(free, issue)) if isinstance(issue, (list, tuple)) else [(free, issue)]
    if isinstance(issue, (list, tuple)) and len(free) != len(issue):
        raise ValueError(f"ring_producer: {len(free)} free barrier arrays for {len(issue)} issue functions")
    if drain and (base is not None or not (isinstance(start, int) and start == 0) or len(pairs) != 1):
        raise ValueError("ring_producer: drain observes one ring's positions from 0 (start 0, no base)")

    @pl.loop(start, n)
    def _load(s):
        r = s if base is None else base + s - start
        slot = None if slot_in_wait else lax.rem(r, ns)
        for fr, iss in pairs:
            @pl.when(r >= ns)
            def _(fr=fr):
                plgpu.barrier_wait(fr.at[lax.rem(r, ns) if slot_in_wait else slot])

            iss(s, lax.rem(r, ns) if slot_in_wait else slot)

    if drain:
        ring_drain(plgpu, n, ns, pairs[0][0])
    return None if base is None else base + (n - start)


def ring_drain(plgpu, n, ns: int, free) -> None:
    """The loader of an ``ns``-slot ring that filled ``n`` slots observes the last frees: it waits for every phase
    of each "free" barrier it waits on (what jax's GPU interpreter checks; idle time on the GPU). Under a cluster
    whose consumers arrive remotely, it also keeps this CTA alive until the last remote arrival has landed."""

    @pl.loop(jnp.maximum(n - ns, 0), n)
    def _drain(s):
        plgpu.barrier_wait(free.at[lax.rem(s, ns)])


class WgmmaOps:
    """The register side of a Mosaic kernel's math: layout casts, fresh fp32 accumulators and row vectors, iotas,
    loads from shared memory into the wgmma layout, and wgmma products waited for (``run_state`` waits). With
    ``emulate`` the same calls run on jax's GPU interpreter, which has no layouts, no ``run_state`` and no
    transposed wgmma operand: a cast is the value itself, a load reads the ref, and a product is a ``jnp`` dot of
    the same shared-memory tiles with fp32 accumulation. A kernel written on these runs on the GPU and on the CPU
    from one source; only the tensor-core operand layouts and the register budgets go unchecked on the CPU."""

    def __init__(self, emulate: bool):
        from jax.experimental.pallas import mosaic_gpu as plgpu

        self.plgpu = plgpu
        self.emulate = emulate

    def cast(self, x, layout):
        """``x`` in register layout ``layout`` (the interpreter: ``x``)."""
        return x if self.emulate else self.plgpu.layout_cast(x, layout)

    def zeros(self, shape, dtype=jnp.float32):
        """A zero tile in the wgmma layout (a fresh accumulator, fp32 unless ``dtype`` says otherwise)."""
        return self.cast(jnp.zeros(shape, dtype), self.plgpu.Layout.WGMMA)

    def rows(self, value: float, n: int):
        """An fp32 vector of ``n`` copies of ``value``, one per row of an ``n``-row wgmma tile (its row layout):
        an online softmax's initial running max or row sum."""
        return self.cast(jnp.full((n,), value, jnp.float32), self.plgpu.Layout.WGMMA.reduce(1))

    def iota(self, shape, dim: int):
        """int32 indices along ``dim`` of a ``shape`` tile in the wgmma layout (masks)."""
        if self.emulate:
            return lax.broadcasted_iota(jnp.int32, shape, dim)
        return self.plgpu.broadcasted_iota(jnp.int32, shape, dim, layout=self.plgpu.Layout.WGMMA)

    def tile(self, ref):
        """A shared-memory tile (a ref already indexed) into registers in the wgmma layout."""
        return ref[...] if self.emulate else _compat.mgpu_load(ref, layout=self.plgpu.Layout.WGMMA)

    def vec(self, ref, axis: int = 1):
        """A shared-memory vector into registers in the wgmma layout reduced over ``axis`` (1: one value per row of
        a tile; 0: one per column)."""
        return ref[...] if self.emulate else _compat.mgpu_load(ref, layout=self.plgpu.Layout.WGMMA.reduce(axis))

    def bcast(self, x, shape, axis: int):
        """A vector of ``vec(.., axis)`` broadcast over the other dimension of ``shape``, in the wgmma layout (a
        per-row or per-column value against a whole tile)."""
        return self.cast(lax.broadcast_in_dim(x, shape, (1 - axis,)), self.plgpu.Layout.WGMMA)

    def mma(self, a, b, *, shape=None, acc=None, b_t: bool = False, issued=None):
        """``acc + a @ b`` (``b_t``: ``a @ b^T``) as one wgmma with an fp32 accumulator, waited for. ``acc`` None: a
        fresh zero accumulator of ``shape`` (the interpreter: the product alone). ``a``: a shared-memory ref or a
        16-bit register array; ``b``: a shared-memory ref. ``issued``: called once the wgmma is issued, before the
        wait (a ping-pong schedule hands the tensor cores to the other consumer there)."""
        if self.emulate:
            out = _dot(a, b, b_t)
            if issued is not None:
                issued()
            return out if acc is None else acc + out
        plgpu = self.plgpu
        init = self.zeros(shape) if acc is None else acc

        def issue(acc_ref):
            plgpu.wgmma(acc_ref, a, b.transpose((1, 0)) if b_t else b)
            if issued is not None:
                issued()

        return pl.run_state(issue)(plgpu.ACC.init(init))

    def mma2(self, acc1, a1, b1, acc2, a2, b2, *, b_t: bool):
        """``(acc1 + a1 @ op(b1), acc2 + a2 @ op(b2))``, op the transpose when ``b_t``: two wgmmas issued back to
        back, fp32 accumulators, waited for together. ``a``: a shared-memory ref or a 16-bit register array; ``b``: a
        shared-memory ref."""
        return self.mma2_sum(acc1, [(a1, b1)], acc2, [(a2, b2)], b_t=b_t)

    def mma2_sum(self, acc1, terms1, acc2, terms2, *, b_t: bool):
        """``(acc1 + the sum of a @ op(b) over the (a, b) pairs of terms1, acc2 + the same over terms2)``: ``mma2``
        with each product split along its contraction (one pair, or one per column part of tiles kept in parts), every
        wgmma issued back to back and all waited for together. The interpreter adds each product to its accumulator
        in turn."""
        if self.emulate:
            for a, b in terms1:
                acc1 = acc1 + _dot(a, b, b_t)
            for a, b in terms2:
                acc2 = acc2 + _dot(a, b, b_t)
            return acc1, acc2
        plgpu = self.plgpu

        def issue(refs):
            r1, r2 = refs
            for r, terms in ((r1, terms1), (r2, terms2)):
                for a, b in terms:
                    plgpu.wgmma(r, a, b.transpose((1, 0)) if b_t else b)

        return pl.run_state(issue)((plgpu.ACC.init(acc1), plgpu.ACC.init(acc2)))

    def mma_sum_ta(self, acc, terms):
        """``acc + the sum of a^T @ b`` over the ``(a, b)`` pairs of ``terms`` (shared-memory refs; ``a`` read
        transposed, as wgmma reads a 16-bit A operand): one wgmma per pair into one fp32 accumulator, waited for
        together. The backward's dQ from dS^T tiles (fa_prefill_bwd's ``fused_dq``)."""
        if self.emulate:
            for a, b in terms:
                acc = acc + lax.dot_general(a[...], b[...], (((0,), (0,)), ((), ())),
                                            preferred_element_type=jnp.float32)
            return acc
        plgpu = self.plgpu

        def issue(r):
            for a, b in terms:
                plgpu.wgmma(r, a.transpose((1, 0)), b)

        return pl.run_state(issue)(plgpu.ACC.init(acc))

    def mma2_under(self, acc, a, b, a1, b1, a2, b2, fn):
        """One software-pipelined step: issue ``x1 = a1 @ b1^T`` and ``x2 = a2 @ b2^T`` (fresh fp32 accumulators),
        then ``acc += a @ b`` (three wgmmas, one commit group each, in that order); wait for the first two only,
        compute ``fn(x1, x2)`` while the third still runs, then wait for it. ``a``: a 16-bit register array of
        ``fn``'s output shape and dtype (the in-flight wgmma reads its registers, so ``fn``'s result is a new value);
        ``a1``, ``a2``: shared-memory refs or register arrays; ``b``, ``b1``, ``b2``: shared-memory refs. Returns
        ``(acc + a @ b, fn(x1, x2))``."""
        return self.mma_under([(a1, b1), (a2, b2)], acc, a, b, (), lambda xs, state: (fn(*xs),))

    def pipelined_step(self, carry, q, k, v, softmax, *, issued=None, scored=None, done=None):
        """One step of a consumer's software pipeline over key blocks (FA-3 §3.2): issue ``S = q @ k^T`` (a fresh
        fp32 accumulator) and then ``O = acc + P_prev @ v``, wait for S only, and run the online softmax on S while
        the P V wgmma still runs; then wait for it and rescale. ``carry``: ``(acc, m, l, P_prev)``, acc already
        scaled by the previous step's alpha, ``P_prev`` a 16-bit register array. ``softmax(S, m, l)`` returns
        ``(P, alpha, m_new, l_new)``. Hooks: ``issued()`` once both wgmmas are issued (a ping-pong turn handoff),
        ``scored(S)`` once S is done, returning the scores the softmax takes (a soft-cap, a mask, a free arrival
        for k's slot), ``done()`` once the P V wgmma is done (the free arrival for v's slot). Returns the next
        carry ``(alpha * O, m_new, l_new, P)``."""
        acc, m_i, l_i, p_prev = carry

        def math(xs, state):
            m, l, _ = state
            sc = xs[0] if scored is None else scored(xs[0])
            p, alpha, m_new, l_new = softmax(sc, m, l)
            return p, m_new, l_new, alpha

        # the last state slot holds alpha (m_i: a placeholder of its shape)
        o, p, m_new, l_new, alpha = self.mma_under([(q, k)], acc, p_prev, v, (m_i, l_i, m_i), math, issued)
        if done is not None:
            done()
        return o * lax.broadcast_in_dim(alpha, o.shape, (0,)), m_new, l_new, p

    def mma_under(self, fresh, acc, a, b, state, fn, issued=None):
        """The pipelined step under ``mma2_under`` and ``pipelined_step``: issue ``x_i = a_i @ b_i^T`` for each
        ``(a_i, b_i)`` of ``fresh`` (fresh fp32 accumulators), then ``acc += a @ b``, one commit group each in that
        order; call ``issued()``; wait for the ``x_i`` only and compute ``fn(xs, state) -> (a', *state')`` while
        the last wgmma still runs (``state``: arrays carried through the step; ``a``: a 16-bit register array,
        read by the in-flight wgmma, so ``a'`` is a new value); then wait for it. Returns
        ``(acc + a @ b, a', *state')``. The interpreter computes the same products in the same order."""
        if self.emulate:
            xs = [_dot(ai, bi, True) for ai, bi in fresh]
            if issued is not None:
                issued()
            return (acc + _dot(a, b, False), *fn(xs, state))
        plgpu = self.plgpu
        n = len(fresh)

        def issue(refs):
            x_refs, (r_acc, a_ref, *s_refs) = refs[:n], refs[n:]
            for r, (ai, bi) in zip(x_refs, fresh):
                plgpu.wgmma(r, ai, bi.transpose((1, 0)))
            plgpu.wgmma(r_acc, a_ref[...], b)
            if issued is not None:
                issued()
            xs = [acc_load(r, wait_n=1) for r in x_refs]  # <= 1 group in flight: the x_i are done, acc += a b may run
            outs = fn(xs, tuple(r[...] for r in s_refs))
            for r, o in zip((a_ref, *s_refs), outs):
                r[...] = o

        inits = [plgpu.ACC.init(self.zeros((ai.shape[0], bi.shape[0]))) for ai, bi in fresh]
        outs = pl.run_state(issue)((*inits, plgpu.ACC.init(acc), a, *state))
        return tuple(outs[n:])  # run_state waited for every wgmma


def _dot(a, b, b_t: bool):
    """The interpreter's stand-in for one wgmma product: ``a @ b`` (``b_t``: ``a @ b^T``) with fp32 accumulation;
    ``a`` a ref or an array, ``b`` a ref."""
    av = a[...] if hasattr(a, "at") else a
    return lax.dot_general(av, b[...], (((1,), (1 if b_t else 0,)), ((), ())), preferred_element_type=jnp.float32)


def pad(x, axis: int, mult: int):
    """``x`` zero-padded along ``axis`` to a multiple of ``mult`` (``x`` itself when it already is one)."""
    n = x.shape[axis]
    extra = -n % mult
    if not extra:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def kernel_with_refs(body, *, out_type, scratch_types, grid, grid_names, num_threads, thread_name, compiler_params,
                     kernel_name):
    """``plgpu.kernel(body, ...)`` whose operands may include JAX Refs (read and written in place, aliased in and out):
    the same mesh, scratch and launch as ``plgpu.kernel``, through ``pl.kernel`` directly, as ``plgpu.kernel``'s
    ``custom_vmap`` wrapper does not take a Ref operand. Call it inside a ``jit`` (a global-memory Ref lives there
    only). No vmap rule: the callers do not batch it."""
    import functools

    from jax.experimental.pallas import mosaic_gpu as plgpu

    mesh = plgpu.Mesh(grid=grid, grid_names=grid_names, num_threads=num_threads, thread_name=thread_name,
                      kernel_name=kernel_name)

    def kernel_body(*refs):
        pl.run_scoped(functools.partial(body, *refs), *scratch_types, collective_axes=thread_name)

    return pl.kernel(kernel_body, out_type=out_type, mesh=mesh, compiler_params=compiler_params, name=kernel_name)
