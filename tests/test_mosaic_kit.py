"""The Mosaic kit's ``ring_producer`` on jax's GPU interpreter (race detection on): a producer warpgroup fills TMA
rings through it and a consumer warpgroup reads every position back, for each shape the kernels use it in: one ring
with its drain (the backward), the slot index computed inside the wait (v12_mla_tc), two rings sharing one index and
counted across row tiles from a ``start`` block without a drain (fa_prefill's forward; here the rings are drained
after the last tile from the position ``ring_producer`` returns, as the interpreter checks that every phase of a
barrier is observed). The lowered programs of the
three kernels are pinned by scripts/lowered_hashes.py; this checks what the loop does."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pallas_attn.kernels.mosaic_kit import ring_drain, ring_producer

ROWS, COLS = 8, 128  # one block: 8 x 128 fp32


def _interpreter():
    try:
        from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks
        from jax._src.pallas.mosaic_gpu.interpret import params as gpu_interpret
    except ImportError:  # pragma: no cover - a jax without the GPU interpreter
        pytest.skip("this jax has no Mosaic GPU interpret mode")
    return gpu_interpret, gpu_callbacks


def _run(x, y, spans, ns: int, *, two: bool, slot_in_wait: bool = False, drain: bool = True):
    """Tiles ``spans`` (``(start, stop)`` block ranges, counted in one ring across tiles): the consumer copies ring
    position p's block(s) into output row p. One tile without ``two`` and ``start`` 0: no ``base``, as the
    backward and v12 call it; otherwise ``base`` carried over the tiles by ``lax.fori_loop``, as the forward."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    n_pos = sum(b - a for a, b in spans)
    starts = jnp.asarray([a for a, _ in spans], jnp.int32)
    stops = jnp.asarray([b for _, b in spans], jnp.int32)
    counted = two or len(spans) > 1 or spans[0][0] != 0

    def body(x_ref, y_ref, lo_ref, hi_ref, ox_ref, oy_ref, xs, ys, ox_s, oy_s, x_bar, y_bar, x_free, y_free):
        wg = lax.axis_index("wg")

        @pl.when(wg == 0)
        def _consumer():
            def tile(t, pos):
                @pl.loop(lo_ref[t], hi_ref[t])
                def _(s):
                    p = pos + s - lo_ref[t]
                    slot = lax.rem(p, ns)
                    plgpu.barrier_wait(x_bar.at[slot])
                    ox_s.at[p][...] = xs.at[slot][...]
                    plgpu.barrier_arrive(x_free.at[slot])
                    if two:
                        plgpu.barrier_wait(y_bar.at[slot])
                        oy_s.at[p][...] = ys.at[slot][...]
                        plgpu.barrier_arrive(y_free.at[slot])

                return pos + hi_ref[t] - lo_ref[t]

            lax.fori_loop(0, len(spans), tile, jnp.int32(0))
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(ox_s, ox_ref)
            plgpu.copy_smem_to_gmem(oy_s, oy_ref)
            plgpu.wait_smem_to_gmem(0)

        @pl.when(wg == 1)
        def _producer():
            def issue_x(s, slot):
                plgpu.copy_gmem_to_smem(x_ref.at[s], xs.at[slot], x_bar.at[slot])

            def issue_y(s, slot):
                plgpu.copy_gmem_to_smem(y_ref.at[s], ys.at[slot], y_bar.at[slot])

            if not counted:
                ring_producer(plgpu, hi_ref[0], ns, x_free, issue_x, slot_in_wait=slot_in_wait, drain=drain)
                return
            free, issue = ((x_free, y_free), (issue_x, issue_y)) if two else (x_free, issue_x)

            def tile(t, base):
                return ring_producer(plgpu, hi_ref[t], ns, free, issue, start=lo_ref[t], base=base,
                                     slot_in_wait=slot_in_wait, drain=False)

            end = lax.fori_loop(0, len(spans), tile, jnp.int32(0))  # the position after the last tile's
            for fr in (free if two else (free,)):  # the interpreter wants every phase observed: drain each ring
                ring_drain(plgpu, end, ns, fr)

    out = jax.ShapeDtypeStruct((n_pos, ROWS, COLS), jnp.float32)
    ring = plgpu.SMEM((ns, ROWS, COLS), jnp.float32)
    staging = plgpu.SMEM((n_pos, ROWS, COLS), jnp.float32)
    bars = [plgpu.Barrier(num_arrivals=1, num_barriers=ns) for _ in range(4)]
    call = plgpu.kernel(body, out_type=(out, out), scratch_types=[ring, ring, staging, staging, *bars], grid=(1,),
                        grid_names=("c",), num_threads=2, thread_name="wg")
    gpu_interpret, gpu_callbacks = _interpreter()
    try:
        with gpu_interpret.force_gpu_interpret_mode(gpu_interpret.InterpretGPUParams(detect_races=True)):
            ox, oy = jax.block_until_ready(call(x, y, starts, stops))
        races = bool(gpu_callbacks.get_races().races_found)
    finally:
        gpu_callbacks.reset_gpu_interpret_mode_state()
    return np.asarray(ox), np.asarray(oy), races


def _blocks(n: int, sign: float):
    return sign * jnp.arange(n * ROWS * COLS, dtype=jnp.float32).reshape(n, ROWS, COLS)


@pytest.mark.parametrize(("spans", "ns", "two", "slot_in_wait", "drain"), [
    ([(0, 5)], 2, False, False, True),   # the backward: one ring from block 0, drained
    ([(0, 5)], 3, False, True, True),    # v12: the slot index inside the wait
    ([(0, 1)], 3, False, True, True),    # fewer blocks than slots (no wait, a partial drain)
    ([(2, 5), (0, 3), (1, 2)], 2, True, False, False),  # the forward: K and V rings counted across row tiles
    ([(3, 4), (1, 6)], 3, True, True, False),
])
def test_ring_producer_fills_every_position_in_order(spans, ns, two, slot_in_wait, drain):
    x, y = _blocks(6, 1.0), _blocks(6, -1.0)
    ox, oy, races = _run(x, y, spans, ns, two=two, slot_in_wait=slot_in_wait, drain=drain)
    order = [s for a, b in spans for s in range(a, b)]  # ring position p holds block order[p]
    np.testing.assert_array_equal(ox, np.asarray(x)[order])
    if two:
        np.testing.assert_array_equal(oy, np.asarray(y)[order])
    assert not races


def test_ring_producer_refusals():
    with pytest.raises(ValueError, match="drain"):
        ring_producer(None, 4, 2, None, lambda s, slot: None, base=0)
    with pytest.raises(ValueError, match="drain"):
        ring_producer(None, 4, 2, (None, None), (lambda s, slot: None,) * 2)
    with pytest.raises(ValueError, match="free barrier arrays"):
        ring_producer(None, 4, 2, (None,), (lambda s, slot: None,) * 2, drain=False)
