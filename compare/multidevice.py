"""Implementations that span several devices: context-parallel decode and ring attention (``pallas_attn.distributed``).

``pallas:ring:<layout>`` (session 13, issue 34) runs a training-step workload (``family = "train"``, self-attention)
with ring attention over the first ``w.devices`` devices: ``distributed.ring_attention_sharded`` under the train
family's step (``compare.train``: value_and_grad of sum(out * w)), the inputs placed on the mesh split along the
sequence once, outside the timed region (a model's activations already live there), the striped layout's reorder
inside the step. On ``devices = 1`` it is the ring on a one-device mesh. Clock: host wall-clock per synchronized call
(``clock = "wall"``; a training step is milliseconds to seconds, so one call's dispatch is noise).

``pallas:fa_decode_cp:<merge>`` runs a dense decode workload with its KV cache split into ``w.devices``
equal contiguous slices over the first ``w.devices`` devices of this process: fa_decode on each slice, the
partial states merged across the devices inside the same jitted program (``merge`` = ``all_gather`` or
``psum``). On ``devices = 1`` it is the same program on a one-device mesh: the baseline its speed-up is read
against, measured on the same clock. Only these implementations run on workloads with ``devices > 1``
(``runner._allowed_by_workload``).

``pallas:fa_decode_cp_call:<merge>`` is the public wrapper ``context_parallel_decode`` called once per step with q
from the caller (not pre-placed), timed by host wall-clock per call over 50 pipelined calls (issue 36: the
wrapper should keep the program's speed-up).

Inputs: compare's own per-workload arrays, resharded onto the mesh once, outside the timed region. Clock:
``timing.time_loop`` (the step chained inside one jitted program, two loop lengths differenced so the
per-call costs cancel): a program over several devices has no single CUPTI span. The roofline is the
workload's on ``devices`` aggregated GPUs (``hardware.aggregate``).
"""

from __future__ import annotations

from typing import Any

from .schema import YES, Ctx, Impl, Prepared, RooflineFacts, Support

__all__ = ["cp_impls", "ring_impls", "MERGES"]

MERGES = ("all_gather", "psum", "packed")
_GEN = "fa_decode"


def _local_problem(w):
    from pallas_attn.kernels.contract import Problem

    return Problem(entry="paged", dtype=w.dtype, batch=w.batch, q_len=w.q_len, kv_len=w.kv_len // w.devices,
                   heads_q=w.heads_q, heads_kv=w.heads_kv, head_dim=w.head_dim, causal=bool(w.causal),
                   page_size=_page(w))


def _page(w) -> int:
    from pallas_attn import distributed

    return distributed._page_for(w.kv_len // w.devices)


def _supports(merge: str, w, ctx: Ctx) -> Support:
    if w.family != "decode":
        return Support(False, "", "n/a")
    if getattr(w, "kv_dtype", None):
        return Support(False, f"context-parallel decode takes KV in the workload dtype, not kv_dtype={w.kv_dtype} "
                              "(no silent fp16 run)", "unsupported")
    if w.kv_len % w.devices:
        return Support(False, f"kv_len {w.kv_len} does not split into {w.devices} equal slices", "unsupported")
    from pallas_attn import registry

    ok, why = registry.kernel(_GEN).supports(_local_problem(w))
    if not ok:
        return Support(False, why, "unsupported")
    import jax

    if jax.device_count() < w.devices:
        return Support(False, f"needs {w.devices} devices; this process sees {jax.device_count()}", "unavailable")
    return YES


def _roofline(w) -> RooflineFacts:
    from pallas_attn import registry

    k = registry.kernel(_GEN)
    prec = k.precision_for(w.dtype)
    return RooflineFacts(prec.operand, False, (1, 1), prec.engine == "tensor",
                         f"pallas contract ({k.name}) on {w.devices} device(s)")


def _plan(merge: str, w, ctx: Ctx) -> dict[str, Any]:
    from pallas_attn import registry

    k = registry.kernel(_GEN)
    p = _local_problem(w)
    return {"devices": w.devices, "merge": merge, "keys_per_device": w.kv_len // w.devices,
            "page_view": p.page_size, "local": dict(k.plan(p, k.config(None, p)))}


def _prepare(merge: str, w, inp, ctx: Ctx) -> Prepared:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from pallas_attn import distributed

    mesh = Mesh(np.array(jax.devices()[: w.devices]), ("cp",))
    q = jax.device_put(inp.q, NamedSharding(mesh, P()))
    k = jax.device_put(inp.k, NamedSharding(mesh, P(None, "cp")))
    v = jax.device_put(inp.v, NamedSharding(mesh, P(None, "cp")))
    lens = jax.device_put(jnp.full((w.batch,), w.kv_len, jnp.int32), NamedSharding(mesh, P()))
    off = jax.device_put(jnp.full((w.batch,), w.q_offset, jnp.int32), NamedSharding(mesh, P()))
    prog = distributed.decode_program(mesh, axis="cp", head_axis=None, t_local=w.kv_len // w.devices,
                                      batch=w.batch, causal=bool(w.causal), scale=inp.scale, merge=merge,
                                      generation=_GEN, config=None, interpret=ctx.interpret)

    def fn(q, k, v, lens, off):
        return prog(q, k, v, lens, off)[0]

    return Prepared(fn, (q, k, v, lens, off), "jax", "BTNH", clock="loop",
                    notes=f"KV split over {w.devices} device(s) ({w.kv_len // w.devices} keys each), {merge} merge")


def _prepare_call(merge: str, w, inp, ctx: Ctx) -> Prepared:
    """The public wrapper as a user calls it once per decode step: ``distributed.context_parallel_decode(mesh, q, k,
    v, ...)`` with q a plain array (compare's, on the default device: not pre-placed on the mesh) and the cache placed
    once by ``shard_kv`` (untimed), lengths and offsets left to their defaults where the workload's are the defaults.
    Clock: host wall-clock per call, 50 calls issued back to back and one sync (what a decode loop sees)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from pallas_attn import distributed

    mesh = Mesh(np.array(jax.devices()[: w.devices]), ("cp",))
    k, v = distributed.shard_kv(mesh, inp.k), distributed.shard_kv(mesh, inp.v)
    default_off = bool(w.causal) and w.q_offset == w.kv_len - w.q_len
    kw = dict(causal=bool(w.causal), scale=inp.scale, merge=merge, generation=_GEN, interpret=ctx.interpret)
    if not default_off and w.causal:
        kw["q_offset"] = int(w.q_offset)

    def fn(q, k, v):
        return distributed.context_parallel_decode(mesh, q, k, v, **kw)

    return Prepared(fn, (inp.q, k, v), "jax", "BTNH", clock="pipelined",
                    notes=f"the public wrapper per call (q not pre-placed; {w.devices} device(s), {merge} merge); "
                          "host wall-clock per call over 50 pipelined calls")


RING_LAYOUTS = ("striped", "contiguous")


def _ring_supports(layout: str, w, ctx: Ctx) -> Support:
    if w.family != "train":
        return Support(False, "", "n/a")
    if w.q_len != w.kv_len or w.q_offset:
        return Support(False, f"ring attention is self-attention (q_len = kv_len, no offset); got q_len {w.q_len}, "
                              f"kv_len {w.kv_len}, q_offset {w.q_offset}", "unsupported")
    if w.features:
        return Support(False, f"ring attention has no {', '.join(sorted(w.features))} yet", "unsupported")
    if w.q_len % w.devices:
        return Support(False, f"q_len {w.q_len} does not split into {w.devices} equal chunks", "unsupported")
    import jax

    if jax.device_count() < w.devices:
        return Support(False, f"needs {w.devices} devices; this process sees {jax.device_count()}", "unavailable")
    return YES


def _ring_kernel(w, ctx: Ctx) -> str:
    from pallas_attn import distributed

    return distributed.ring_kernel(w.dtype, w.head_dim, bool(ctx.interpret))


def _ring_roofline(w) -> RooflineFacts:
    prec = {"float32": "fp32", "bfloat16": "bf16"}.get(w.dtype, "fp16")
    return RooflineFacts(prec, False, (1, 1), w.dtype != "float32",
                         f"ring attention (each step fa_prefill's pair on a Hopper, else fa_train) on {w.devices} "
                         "device(s)")


def _ring_plan(layout: str, w, ctx: Ctx) -> dict[str, Any]:
    return {"devices": w.devices, "layout": layout, "tokens_per_device": w.q_len // w.devices,
            "steps": w.devices, "kernel_per_step": _ring_kernel(w, ctx)}


def _ring_prepare(layout: str, w, inp, ctx: Ctx) -> Prepared:
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from pallas_attn import distributed

    from . import train

    mesh = Mesh(np.array(jax.devices()[: w.devices]), ("cp",))
    sh = NamedSharding(mesh, P(None, "cp"))
    args = tuple(jax.device_put(x, sh) for x in (inp.q, inp.k, inp.v, inp.w))

    def attn(q, k, v):
        return distributed.ring_attention_sharded(mesh, q, k, v, axis="cp", causal=bool(w.causal), scale=inp.scale,
                                                  interpret=ctx.interpret, layout=layout)

    return Prepared(train.train_step(attn), args, "jax", "BTNH", clock="wall",
                    notes=f"ring attention over {w.devices} device(s), {layout} layout, "
                          f"{_ring_kernel(w, ctx)} per step; inputs split along the sequence on the mesh (untimed); "
                          + train.TRAIN_NOTE)


def ring_impls() -> list[Impl]:
    import functools

    return [Impl(f"pallas:ring:{lay}", "pallas", None, lay, "frontier", "mosaic-gpu",
                 f"ring attention (pallas_attn.distributed.ring_attention_sharded), {lay} layout: a training step "
                 "over the workload's devices",
                 functools.partial(_ring_supports, lay), functools.partial(_ring_prepare, lay), _ring_roofline,
                 functools.partial(_ring_plan, lay), multi_device=True, families=frozenset({"train"}))
            for lay in RING_LAYOUTS]


def cp_impls() -> list[Impl]:
    import functools

    progs = [Impl(f"pallas:{_GEN}_cp:{m}", "pallas", None, m, "frontier", "triton",
                  f"context-parallel fa_decode: the KV cache split over the workload's devices, {m} merge",
                  functools.partial(_supports, m), functools.partial(_prepare, m), _roofline,
                  functools.partial(_plan, m), multi_device=True)
             for m in MERGES]
    calls = [Impl(f"pallas:{_GEN}_cp_call:{m}", "pallas", None, m, "frontier", "triton",
                  f"context_parallel_decode, the public wrapper, called per step ({m} merge)",
                  functools.partial(_supports, m), functools.partial(_prepare_call, m), _roofline,
                  functools.partial(_plan, m), multi_device=True)
             for m in MERGES]
    return progs + calls
