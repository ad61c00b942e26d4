"""Implementations as data: an ``Impl`` per thing compare can run, built by iterating the registry.

  * ``pallas:<gen>:<config>`` — every generation whose Pallas twin is built, once per entry of its module's
    ``CONFIGS`` ("faithful" first, then "tuned", then any other); an unbuilt generation is one
    ``pallas:<gen>`` impl whose records say ``not_built``;
  * ``cuda:<gen>`` — every generation ``cuda_ref.generations()`` builds (torch BHND in, fp32 BHND out);
  * the peers (``compare.peers``).

No per-generation code: what a generation supports comes from its registry row (checked by
``pallas_attn.api``'s own capability check, and by ``cuda_ref.api.validate`` on meta tensors for the CUDA
twin), and which entry serves it from ``row.entry``. ``supports()`` answers ``Support(ok, reason, status)``;
``status == "n/a"`` means the family does not apply at all (a prefill generation on an MLA workload) and
no record is written; every other refusal is a record with its reason.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Support", "Prepared", "Ctx", "Impl", "pallas_impls", "cuda_impls", "all_impls", "ENTRY_FAMILIES"]


class Support(NamedTuple):
    ok: bool
    reason: str = ""
    status: str = "unsupported"  # when not ok: unsupported | unavailable | not_built | skipped | n/a


YES = Support(True, "", "ok")

# Which workload families each public entry serves (registry row .entry).
ENTRY_FAMILIES: dict[str, tuple[str, ...]] = {
    "attention": ("prefill", "decode"),
    "paged_attention": ("paged_decode",),
    "fp8_attention": ("paged_decode",),
    "nvfp4_attention": ("paged_decode",),
    "mla_attention": ("mla",),
}


@dataclasses.dataclass
class Prepared:
    """``fn(*args)`` is the timed call: pure, all layout work already done. ``framework`` picks the clock."""

    fn: Callable
    args: tuple
    framework: str  # "jax" | "torch"
    layout: str  # output layout: "BTNH" | "BHND" | "BND"
    notes: str = ""


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What the machine offers; supports() decisions depend on it."""

    jax_gpu: bool
    torch_cuda: bool
    hopper: bool
    interpret: bool  # Pallas generations run in interpret mode (CPU)

    @property
    def gpu(self) -> bool:
        return self.jax_gpu


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    framework: str  # pallas | cuda | torch | jax | jax-pallas
    generation: str | None
    config: str | None
    kind: str  # mirror | frontier | peer
    lowering: str | None
    notes: str
    supports_fn: Callable[[Any, Ctx], Support] = dataclasses.field(repr=False, compare=False)
    prepare_fn: Callable[[Any, Any, Ctx], Prepared] | None = dataclasses.field(repr=False, compare=False,
                                                                                 default=None)

    def supports(self, w, ctx: Ctx) -> Support:
        return self.supports_fn(w, ctx)

    def prepare(self, w, inp, ctx: Ctx) -> Prepared:
        if self.prepare_fn is None:
            raise RuntimeError(f"{self.name} cannot run")
        return self.prepare_fn(w, inp, ctx)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "framework": self.framework, "generation": self.generation,
                "config": self.config, "kind": self.kind, "lowering": self.lowering, "notes": self.notes}


# ------------------------------------------------------------------------------------------ Pallas


def _gen_applies(row, w, module=None) -> bool:
    fams = ENTRY_FAMILIES.get(row.entry, ())
    if w.family in fams:
        return True
    # A dense-entry generation that also has a paged entry (the frontier decode kernel) serves paged work.
    return w.family == "paged_decode" and module is not None and hasattr(module, "paged_forward")


def _capability(row, w) -> Support:
    from pallas_attn import api

    try:
        api._check_capabilities(row, dtype=w.dtype, d=w.head_dim, hq=w.heads_q, hkv=w.heads_kv, tq=w.q_len)
    except NotImplementedError as e:
        return Support(False, str(e), "unsupported")
    return YES


def _pallas_supports(row, module, w, ctx: Ctx) -> Support:
    if not _gen_applies(row, w, module):
        return Support(False, "", "n/a")
    if module is None:
        return Support(False, f"{row.id} has no Pallas implementation yet (registry)", "not_built")
    if w.family == "paged_decode":
        if not hasattr(module, "paged_forward"):
            return Support(False, f"{row.id} has no paged entry (paged_forward)", "unsupported")
        if row.entry in ("fp8_attention", "nvfp4_attention"):
            return Support(False, f"compare has no quantized-pool path for {row.entry} yet", "unsupported")
    elif w.family == "mla":
        return Support(False, "compare has no MLA input path yet", "unsupported")
    elif not hasattr(module, "forward"):
        return Support(False, f"{row.id} has no dense entry (forward)", "unsupported")
    return _capability(row, w)


def _pallas_prepare(gen_id: str, config: str, w, inp, ctx: Ctx) -> Prepared:
    import jax

    import pallas_attn

    if w.family == "paged_decode":
        fn = jax.jit(functools.partial(
            pallas_attn.paged_attention, scale=inp.scale, causal=w.causal, generation=gen_id,
            interpret=ctx.interpret, config=config,
            # compare builds valid tables; the bounds check is validation cost, not attention
            check_block_table=False))
        return Prepared(fn, (inp.q, inp.k_pool, inp.v_pool, inp.block_table, inp.kv_lens_jax()), "jax", "BTNH")
    fn = jax.jit(functools.partial(
        pallas_attn.attention, causal=w.causal, scale=inp.scale, q_offset=w.q_offset, generation=gen_id,
        interpret=ctx.interpret, config=config))
    return Prepared(fn, (inp.q, inp.k, inp.v), "jax", "BTNH")


def _config_order(names) -> list[str]:
    first = [n for n in ("faithful", "tuned") if n in names]
    return first + sorted(n for n in names if n not in first)


def pallas_impls() -> list[Impl]:
    from pallas_attn import registry

    out: list[Impl] = []
    for row in registry.generations():
        kind = "frontier" if row.frontier else "mirror"
        lowering = "mosaic-gpu" if row.frontier and row.family == "frontier_decode" else "triton"
        if not row.built["pallas"]:
            out.append(Impl(f"pallas:{row.id}", "pallas", row.id, None, kind, None, row.delta,
                            functools.partial(_pallas_supports, row, None)))
            continue
        try:
            module = registry.pallas_module(row.id)
        except Exception as e:  # a module that fails to import is a record per workload, not a crash
            err = f"importing pallas_attn.kernels.{row.pallas} failed: {type(e).__name__}: {e}"
            out.append(Impl(f"pallas:{row.id}", "pallas", row.id, None, kind, None, row.delta,
                            lambda w, ctx, _r=row, _e=err: (Support(False, "", "n/a") if not _gen_applies(_r, w)
                                                            else Support(False, _e, "failed"))))
            continue
        lowering = getattr(module, "LOWERING", lowering)
        for cfg in _config_order(getattr(module, "CONFIGS", {"faithful": None})):
            out.append(Impl(
                f"pallas:{row.id}:{cfg}", "pallas", row.id, cfg, kind, lowering, row.delta,
                functools.partial(_pallas_supports, row, module),
                functools.partial(_pallas_prepare, row.id, cfg)))
    return out


# -------------------------------------------------------------------------------------------- CUDA


def _cuda_supports(row, built: bool, w, ctx: Ctx) -> Support:
    if w.family not in ENTRY_FAMILIES.get(row.entry, ()):
        return Support(False, "", "n/a")
    if not built:
        return Support(False, f"{row.id} has no CUDA implementation yet (cuda_ref)", "not_built")
    if row.entry != "attention":
        return Support(False, f"compare has no cuda_ref path for {row.entry} yet", "unsupported")
    try:  # cuda_ref's own checks, on meta tensors: the same answer on a CPU machine as on the GPU
        import torch

        from cuda_ref import api as capi

        dt = getattr(torch, w.dtype)
        q = torch.empty((w.batch, w.heads_q, w.q_len, w.head_dim), dtype=dt, device="meta")
        k = torch.empty((w.batch, w.heads_kv, w.kv_len, w.head_dim), dtype=dt, device="meta")
        capi.validate(q, k, k, causal=w.causal, scale=None, q_offset=w.q_offset, generation=row.id)
    except NotImplementedError as e:
        return Support(False, str(e), "unsupported")
    except ImportError as e:
        return Support(False, f"cuda_ref or torch not importable: {e}", "unavailable")
    if not ctx.torch_cuda:
        return Support(False, "needs a CUDA GPU (torch.cuda unavailable)", "unavailable")
    return YES


def _cuda_prepare(gen_id: str, w, inp, ctx: Ctx) -> Prepared:
    import cuda_ref

    q, k, v = inp.torch_bhnd()
    fn = functools.partial(cuda_ref.attention, causal=w.causal, scale=inp.scale, q_offset=w.q_offset,
                           generation=gen_id)
    return Prepared(fn, (q, k, v), "torch", "BHND", notes="fp32 output")


def cuda_impls() -> list[Impl]:
    from pallas_attn import registry

    try:
        import cuda_ref

        built = set(cuda_ref.generations())
    except Exception:  # cuda_ref not importable: fall back to the registry's claim; calls will say why
        built = {r.id for r in registry.generations() if r.built["cuda"]}
    out = []
    for row in registry.generations():
        if row.frontier:
            continue  # frontier kernels are Pallas-only: no CUDA twin by design
        b = row.id in built
        out.append(Impl(f"cuda:{row.id}", "cuda", row.id, None, "mirror", "cuda-jit" if b else None, row.delta,
                        functools.partial(_cuda_supports, row, b),
                        functools.partial(_cuda_prepare, row.id) if b else None))
    return out


def all_impls() -> list[Impl]:
    """Pallas generations, CUDA twins, then the peers, in that order (twins pair by generation id)."""
    from . import peers

    return pallas_impls() + cuda_impls() + peers.peer_impls()
