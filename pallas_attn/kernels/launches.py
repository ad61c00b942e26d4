"""What a Pallas kernel declares for the schedule model (layer 2 of the roofline, ``compare.layer2``): its launches.

A kernel module that declares ``Kernel.launches`` returns, for one problem and its plan, the ``Launch`` list one call
runs: programs, threads, registers, shared memory, work units and serial steps per program, bytes. ``compare.layer2``
prices the list with its fitted constants (a launch's ``cost`` names the dataflow whose constants apply); it holds no
facts of the kernel itself. The vocabulary both twins share lives in ``attn_core.launches`` (cuda_ref's twins declare
theirs in ``cuda_ref.launches``); this block re-exports it for the kernels and adds what only Pallas kernels launch,
so a kernel never imports compare:

* ``Launch``, ``SMLimits`` / ``SM90``, ``occupancy``, ``cdiv``, ``KV_STORAGE_BYTES`` / ``kv_bytes``,
  ``cast_launches``, ``mla_dims``: from ``attn_core.launches``;
* ``merge_launch``: the shared split-state merge (``kernels.splitkv.merge``) every split kernel launches after its
  partials; ``xla_glue``: an XLA kernel inside the timed call (a jnp merge, an unpack).
"""

from __future__ import annotations

from typing import Any

from attn_core.launches import (
    KV_STORAGE_BYTES,
    SM90,
    Launch,
    SMLimits,
    cast_launches,
    cdiv,
    kv_bytes,
    kv_tokens,
    mla_dims,
    occupancy,
)

from .planner import next_pow2

__all__ = ["Launch", "SMLimits", "SM90", "occupancy", "cdiv", "KV_STORAGE_BYTES", "kv_bytes", "kv_tokens",
           "merge_launch", "xla_glue", "cast_launches", "mla_dims"]


def merge_launch(name: str, rows: int, warps: int, splits: int, d: int, dram_bytes: float, block: int = 64) -> Launch:
    """The shared split-state merge (``kernels.splitkv.merge``): one program per output row, ``sb =
    min(block, next_pow2(S))`` splits per serial step (a ``[sb, D]`` FP32 load and one online-softmax step)."""
    sb = min(block, next_pow2(splits))
    return Launch(name, "pallas_attn_merge", rows, 32 * warps, 32, 0, units=splits * (d + 1),
                  steps=cdiv(splits, sb), dram_bytes=dram_bytes, unit="float",
                  note=f"LSE merge of {splits} split states, {sb} per step")


def xla_glue(name: str, s: Any, read: float, write: float, note: str) -> Launch:
    """An XLA kernel inside the timed call (a jnp merge, the unpack / poison select): DRAM bytes and a launch."""
    return Launch(name, "xla_glue", programs=max(1, cdiv(write / 2, 1024)), threads=256, regs=32, smem=0, units=0.0,
                  steps=0.0, dram_bytes=read + write, unit="-", note=note)
