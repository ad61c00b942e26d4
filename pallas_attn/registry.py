"""The Pallas generation table: each generation id points at (kernel module, configs). Nothing else.

What a generation *is* (family, parent, delta, entries) lives in ``attn_core.generations``, shared with the
CUDA twin; what the Pallas kernel *can do* lives in its ``KERNEL`` declaration (``kernels/contract.py``). A
row joins the two: ``Row("v8_gqa_db", kernel="v8_gqa", configs={"faithful": "double_buffered"})`` makes a
generation that is only a knob of its parent one line.

Every generation of ``attn_core.generations`` whose module ``pallas_attn/kernels/<id>.py`` exists has the
default row ``Row("<id>", "<id>")`` (its kernel's named configs, same names); ``EXPLICIT`` holds only the rows
that differ (another kernel's module, renamed or chosen configs). A generation with neither is not built in
Pallas, and says so. ``ROWS`` is the table in attn_core's order.

``compare``, the API and the tests iterate this table; adding a kernel is its attn_core row plus its module.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from attn_core import generations as _core

from .kernels.contract import CAUSAL_RULE, Kernel

__all__ = ["Row", "ROWS", "EXPLICIT", "has_module", "GenerationInfo", "ids", "get", "rows", "row", "built", "kernel",
           "configs", "generations", "FAMILIES", "REFERENCE_IDS"]

FAMILIES = _core.FAMILIES
REFERENCE_IDS = _core.REFERENCE_IDS


@dataclasses.dataclass(frozen=True)
class Row:
    """Generation ``generation`` runs kernel module ``pallas_attn.kernels.<kernel>``; ``configs`` maps the
    generation's config names to the kernel's (None: every named config of the kernel, same names)."""

    generation: str
    kernel: str
    configs: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _core.get(self.generation)  # unknown ids fail at import
        if self.configs is not None:
            object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))


# The rows that are not the default Row("<id>", "<id>"), in attn_core's order.
EXPLICIT: tuple[Row, ...] = (
    Row("v8_gqa", "v8_gqa", configs={"faithful": "faithful", "device_sm": "device_sm", "tuned": "tuned"}),
    # knobs of v8_gqa's kernel in Pallas (docs/paged_gqa.md): one named config each
    Row("v8_gqa_db", "v8_gqa", configs={"faithful": "double_buffered"}),
    Row("v8_gqa_occ", "v8_gqa", configs={"faithful": "occupancy"}),
    Row("v8_gqa_ilp", "v8_gqa", configs={"faithful": "key_ilp"}),
    # MLA at the DeepSeek-V3 shape (docs/mla.md): v12_mla_tc's kernel, its configs under their names
    Row("fa_mla", "v12_mla_tc", configs={"default": "faithful", "split_qk": "split_qk", "pipelined": "pipelined",
                                         "kv64": "kv64", "kv64_lazy": "kv64_lazy", "kv64_mc": "kv64_mc",
                                         "kv64_ws": "kv64_ws", "kv64_ws_mc": "kv64_ws_mc", "kv64_wsq_mc": "kv64_wsq_mc",
                                         "kv32_ws": "kv32_ws", "kv32_ws_mc": "kv32_ws_mc",
                                         "kv64_wl": "kv64_wl", "kv64_mc_wl": "kv64_mc_wl", "triton": "triton"}),
)


def has_module(kernel_name: str) -> bool:
    """Whether ``pallas_attn/kernels/<kernel_name>.py`` exists (found, not imported)."""
    return importlib.util.find_spec(f"{__package__}.kernels.{kernel_name}") is not None


def _table(explicit: tuple[Row, ...]) -> tuple[Row, ...]:
    """Every built generation's row in attn_core's order: its explicit row, else the default where its module exists.
    An explicit row must name a known generation once, and a module that exists."""
    by_id: dict[str, Row] = {}
    for r in explicit:
        if r.generation in by_id:
            raise ValueError(f"two explicit rows for generation {r.generation!r}")
        if not has_module(r.kernel):
            raise ValueError(f"row {r.generation!r} names kernel module pallas_attn.kernels.{r.kernel}, which does "
                             "not exist")
        by_id[r.generation] = r
    return tuple(by_id[i] if i in by_id else Row(i, i) for i in _core.ids() if i in by_id or has_module(i))


ROWS: tuple[Row, ...] = _table(EXPLICIT)
_BY_ID = {r.generation: r for r in ROWS}


def ids() -> tuple[str, ...]:
    """Every generation id (built or not), in the shared table's order."""
    return _core.ids()


def get(gen_id: str) -> _core.Generation:
    """The shared row of ``gen_id`` (ValueError for an unknown id)."""
    return _core.get(gen_id)


def rows() -> tuple[Row, ...]:
    return ROWS


def built(gen_id: str) -> bool:
    get(gen_id)
    return gen_id in _BY_ID


def row(gen_id: str) -> Row:
    g = get(gen_id)
    try:
        return _BY_ID[gen_id]
    except KeyError:
        raise NotImplementedError(f"generation {g.id!r} is not built in Pallas yet (no module "
                                  f"pallas_attn/kernels/{g.id}.py and no row in pallas_attn.registry.EXPLICIT); "
                                  f"built: {', '.join(_BY_ID)}") from None


@functools.cache
def kernel(gen_id: str) -> Kernel:
    """The contract of the kernel that runs ``gen_id`` (imports its module)."""
    r = row(gen_id)
    mod = importlib.import_module(f"pallas_attn.kernels.{r.kernel}")
    k = getattr(mod, "KERNEL", None)
    if not isinstance(k, Kernel):
        raise TypeError(f"pallas_attn.kernels.{r.kernel} must define KERNEL = Kernel(...)")
    return k


@functools.cache
def configs(gen_id: str) -> Mapping[str, Any]:
    """The generation's named configs (name -> config object), in the kernel's order."""
    r, k = row(gen_id), kernel(gen_id)
    if r.configs is None:
        return MappingProxyType(dict(k.configs))
    missing = [v for v in r.configs.values() if v not in k.configs]
    if missing:
        raise ValueError(f"row {gen_id!r} names configs {missing} that kernel {k.name} does not have")
    return MappingProxyType({name: k.configs[kname] for name, kname in r.configs.items()})


@dataclasses.dataclass(frozen=True)
class GenerationInfo(_core.Generation):
    """What ``pallas_attn.generations()`` shows: the shared row (``attn_core.generations.Generation``),
    whether Pallas builds it, and the kernel's declared facts (``kernel`` is None when not built)."""

    built: bool = False
    kernel: str | None = None
    lowering: str | None = None
    configs: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    head_dims: tuple[int, ...] | None = None
    gqa: bool = False
    max_q_len: int | None = None
    precision: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    causal: str = CAUSAL_RULE

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["entries"] = sorted(self.entries)
        return d


def generations() -> tuple[GenerationInfo, ...]:
    out = []
    for g in _core.GENERATIONS:
        base = {f.name: getattr(g, f.name) for f in dataclasses.fields(g)}
        if not built(g.id):
            out.append(GenerationInfo(**base, built=False))
            continue
        k = kernel(g.id)
        out.append(GenerationInfo(**base, built=True, kernel=k.name, lowering=k.lowering,
                                  configs=tuple(configs(g.id)), dtypes=k.dtypes, head_dims=k.head_dims, gqa=k.gqa,
                                  max_q_len=k.max_q_len, precision=dict(k.precision)))
    return tuple(out)
