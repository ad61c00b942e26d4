"""The types every implementation module shares: ``Support``, ``Prepared``, ``Ctx`` and ``Impl``.

``compare.impls`` (the Pallas generations and their CUDA twins) and ``compare.peers`` both build ``Impl``
objects; the runner only ever sees this interface. Keeping the types here means neither implementation
module imports the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = ["Support", "YES", "Prepared", "Ctx", "Impl", "RooflineFacts"]


class Support(NamedTuple):
    ok: bool
    reason: str = ""
    status: str = "unsupported"  # when not ok: unsupported | unavailable | not_built | failed | skipped | n/a


YES = Support(True, "", "ok")


@dataclasses.dataclass
class Prepared:
    """``fn(*args)`` is the timed call: pure, all layout work already done. ``framework`` picks the clock."""

    fn: Callable
    args: tuple
    framework: str  # "jax" | "torch"
    layout: str  # output layout: "BTNH" | "BHND" | "BND"
    notes: str = ""
    # None: the framework's kernel clock (CUPTI). "loop": the step chained inside one jitted program, for
    # programs that span several devices (no single CUPTI span covers them; timing.time_loop). "pipelined": host
    # wall-clock per call over 50 calls issued back to back (a public wrapper as a decode loop calls it)
    clock: str | None = None


@dataclasses.dataclass(frozen=True)
class Ctx:
    """What the machine offers; supports() decisions depend on it."""

    jax_gpu: bool
    torch_cuda: bool
    hopper: bool
    interpret: bool  # Pallas generations run in interpret mode (CPU)


@dataclasses.dataclass(frozen=True)
class RooflineFacts:
    """What the roofline must assume about one implementation on one workload, and who said so.

    ``precision``: the operands' storage precision (bytes charged); ``materialize_s`` and ``tile``: whether
    S makes a round trip through HBM and with which (rows, keys) operand reuse; ``tensor_cores``: what the
    implementation declares about its engine (recorded; the layer-1 engine follows the reference's
    convention, see ``compare.roofline``); ``source``: where the facts come from (a Pallas kernel's
    contract, cuda_ref's generation table, the reference's storage convention for an unbuilt generation);
    ``dequant_ops``: ALU instructions per KV element spent decoding a quantized KV cache (the roofline's t_alu;
    0 for KV in the workload dtype).
    """

    precision: str
    materialize_s: bool = False
    tile: tuple[int, int] = (1, 1)
    tensor_cores: bool | None = None
    source: str = ""
    dequant_ops: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tile"] = list(self.tile)
        return d


def _none(w, ctx) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Impl:
    """One thing compare can run.

    ``roofline_fn(w)`` gives the ``RooflineFacts`` of this implementation on workload ``w`` (None: a peer,
    modelled at the workload's own dtype; it may raise, and the record then says why). ``plan_fn(w, ctx)``
    gives the launch plan recorded under ``impl.plan`` before the run (None: nothing declared).
    """

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
    roofline_fn: Callable[[Any], RooflineFacts] | None = dataclasses.field(repr=False, compare=False, default=None)
    plan_fn: Callable[[Any, Ctx], Mapping[str, Any] | None] = dataclasses.field(repr=False, compare=False,
                                                                              default=_none)
    multi_device: bool = False  # runs on workloads with devices > 1 (single-device impls never see those)
    # the workload families it runs (others: "n/a", no record); "train" (forward + backward) only where declared
    families: frozenset[str] = frozenset({"prefill", "decode", "paged_decode", "mla"})
    # the attention features it implements (compare.workloads.FEATURES); a workload needing another one is refused
    # with the reason, before anything runs
    features: frozenset[str] = frozenset()
    # a tuning point (``compare tune``): the config fields set on top of the named config ``config`` names
    overrides: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)
    # w -> a key of the program this implementation launches on w (None: unknown); two implementations of one run
    # with the same key launch the same programs and the later one is not timed (``compare.runner``)
    program_key_fn: Callable[[Any], Any] | None = dataclasses.field(repr=False, compare=False, default=None)

    def supports(self, w, ctx: Ctx) -> Support:
        return self.supports_fn(w, ctx)

    def prepare(self, w, inp, ctx: Ctx) -> Prepared:
        if self.prepare_fn is None:
            raise RuntimeError(f"{self.name} cannot run")
        return self.prepare_fn(w, inp, ctx)

    def roofline(self, w) -> RooflineFacts | None:
        return None if self.roofline_fn is None else self.roofline_fn(w)

    def plan(self, w, ctx: Ctx) -> Mapping[str, Any] | None:
        return self.plan_fn(w, ctx)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "framework": self.framework, "generation": self.generation,
                "config": self.config, "kind": self.kind, "lowering": self.lowering, "notes": self.notes,
                "multi_device": self.multi_device, "features": sorted(self.features),
                **({"overrides": dict(self.overrides)} if self.overrides else {})}
