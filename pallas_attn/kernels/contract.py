"""The kernel contract: what every Pallas kernel declares about itself, in one object (DESIGN.md decision 2).

A kernel module ends with ``KERNEL = Kernel(...)``. The object says how the kernel is lowered, which
``pallas_call``s it launches, its config class and named configs, which entries it serves, what inputs it
takes, at what precision it computes, and what the roofline must assume about it. The generation table
(``pallas_attn.registry``) points each generation at a (kernel, configs) pair; the API, ``compare`` and the
tests read these facts and nothing else, so no other place lists generations or guesses their precision.

Calling convention of the entry functions (``dense`` / ``paged``), on validated arrays:

* ``dense(q, k, v, *, causal, scale, q_offset, interpret, config, return_lse)``: BTNH ``q [B, Tq, Hq, D]``,
  ``k, v [B, Tk, Hkv, D]``; ``q_offset`` an int32 ``[B]`` array (the API normalises scalars and traced values);
* ``paged(q, k_pool, v_pool, block_table, kv_lens, *, causal, scale, q_offset, interpret, config,
  return_lse, check_block_table)``: pools ``[num_blocks, page, Hkv, D]``, int32 ``block_table [B, P]`` and
  ``kv_lens [B]``, ``q_offset`` int32 ``[B]`` (the API defaults it to ``kv_lens - Tq``).

* ``mla(q, latent_pool, block_table, kv_lens, *, kv_lora_rank, causal, scale, q_offset, interpret, config,
  return_lse, check_block_table)``: absorbed ``q [B, Tq, Hq, DQK]``, one latent head ``[num_blocks, page, 1, DQK]``
  (plain or quantized), the values its first ``kv_lora_rank`` columns (docs/mla.md).

They return ``out [B, Tq, Hq, D]`` (q's dtype; MLA: ``D = kv_lora_rank``) or, with ``return_lse``, ``(out, lse)`` with
``lse`` float32 ``[B, Hq, Tq]``: the natural-log log-sum-exp of the scaled scores over the visible keys (-inf where
none). Causal is top-left with an offset everywhere: key ``j`` is visible to query ``i`` iff ``j <= i + q_offset``.

One ``Problem`` type and one ``Kernel`` type serve every entry (issue 26, item 2). The fields that only one entry
reads are declared with a neutral default and checked against the entry: ``Problem.kv_lora_rank`` and the kernel's
``mla`` / ``templates`` / ``latent_precision`` / ``latent_q_dtypes`` / ``min_page`` belong to the "mla" entry;
``kv_precision`` / ``quantized_q_dtypes`` to the "quantized" one. A kernel's own refusals beyond the generic checks
are a declared ``limits`` function, which ``Kernel.supports`` consults; no kernel subclasses the contract. A kernel's
backward is a ``Backward`` (``Kernel.backward``): the public functions whose ``jax.grad`` runs it and, for a backward
kernel with configs of its own (fa_prefill_bwd), those configs and its chooser, which ``api.resolve_pair`` resolves
with the forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

__all__ = ["LOWERINGS", "ENTRIES", "CAUSAL_RULE", "GRAD_ENTRIES", "Problem", "Precision", "RooflineInputs", "Backward",
           "Kernel"]

LOWERINGS = ("triton", "mosaic-gpu")
ENTRIES = ("dense", "paged", "quantized", "mla")
# the public functions whose jax.grad a kernel's backward may serve (``Backward.entries``)
GRAD_ENTRIES = ("attention", "paged_attention", "mla_attention", "dot_product_attention")
CAUSAL_RULE = ("top-left with offset: key j is visible to query i iff j <= i + q_offset "
               "(dense default q_offset = 0; paged default q_offset = kv_len - Tq per sequence)")


@dataclasses.dataclass(frozen=True)
class Problem:
    """What a kernel needs to know to accept a call, pick a config and predict its cost.

    ``kv_len`` is the longest sequence a program may have to read: dense ``Tk``, paged
    ``pages_per_seq * page_size``. ``kv_dtype`` is the KV storage format (None: the q dtype).

    The "mla" entry (``pallas_attn.mla.problem_mla``): ``heads_kv=1`` (the latent), ``head_dim=DQK``, ``kv_dtype``
    the latent's storage format (None for a plain fp16/bf16 latent) and ``kv_lora_rank`` the value width DV (None: the
    kernel's template for DQK). ``kv_lora_rank`` means nothing to the other entries, which refuse it.
    """

    entry: str
    dtype: str
    batch: int
    q_len: int
    kv_len: int
    heads_q: int
    heads_kv: int
    head_dim: int
    causal: bool = False
    page_size: int | None = None
    kv_dtype: str | None = None
    kv_lora_rank: int | None = None  # the "mla" entry's value width DV only

    def __post_init__(self) -> None:
        if self.entry not in ENTRIES:
            raise ValueError(f"Problem.entry must be one of {ENTRIES}; got {self.entry!r}")
        if min(self.batch, self.q_len, self.heads_q, self.heads_kv, self.head_dim) < 1 or self.kv_len < 0:
            raise ValueError(f"Problem sizes must be positive: {self}")
        if self.kv_lora_rank is not None and self.entry != "mla":
            raise ValueError(f"Problem.kv_lora_rank is the 'mla' entry's value width (DV); the {self.entry!r} entry "
                             f"takes none: got kv_lora_rank={self.kv_lora_rank}")

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv


@dataclasses.dataclass(frozen=True)
class Precision:
    """How a kernel computes for one input dtype.

    ``operand``: the storage precision of the staged operands (what the roofline charges in bytes);
    ``accumulate``: the accumulator; ``engine``: ``"fp32"`` (CUDA-core FMA) or ``"tensor"`` (MMA on the
    operand precision); ``note`` says what happens on the way (e.g. a host cast)."""

    operand: str
    accumulate: str = "fp32"
    engine: str = "fp32"
    note: str = ""

    def __post_init__(self) -> None:
        if self.engine not in ("fp32", "tensor"):
            raise ValueError(f"Precision.engine must be 'fp32' or 'tensor'; got {self.engine!r}")


@dataclasses.dataclass(frozen=True)
class RooflineInputs:
    """What layer 1 of the roofline needs from a kernel: operand bytes, whether S lives in HBM and with
    which tile reuse, and whether the products run on tensor cores."""

    precision: str
    materialize_s: bool = False
    tile: tuple[int, int] = (1, 1)
    tensor_cores: bool = False
    # quantized KV: ALU instructions per KV element spent decoding it (the roofline's dequant bound)
    dequant_ops: float = 0.0


def _no_plan(problem: Problem, config: Any) -> Mapping[str, Any]:
    return {}


@dataclasses.dataclass(frozen=True, eq=False)
class Backward:
    """How ``jax.grad`` differentiates a kernel's forward, declared with the forward (``Kernel.backward``).

    ``description``: what runs (e.g. a jax.custom_vjp over its own Pallas backward kernels). ``entries``: the public
    functions whose ``jax.grad`` runs it (``GRAD_ENTRIES``: ``"attention"`` differentiates the kernel's dense function
    itself; ``"dot_product_attention"``, the drop-in, pairs the forward with it); any other entry raises naming the
    entry and the generation. ``kernel``: the backward's own kernel when it has configs of its own (fa_prefill_bwd),
    else None: the forward's config sets its backward kernels too (fa_train's one ``TrainConfig``), and a named
    backward config is refused. With a kernel: ``config_cls`` and ``configs`` (its named configs), ``heuristic``
    (``(problem, deterministic) -> config name``: this GPU's table, else its rule; ``deterministic`` keeps to configs
    whose gradients are bit-identical run to run) and ``effective`` (``(problem, config) -> the config it runs``, e.g.
    fa_prefill_bwd's ``d256`` at D 256; None: the config as given)."""

    description: str
    entries: frozenset[str]
    kernel: str | None = None
    config_cls: type | None = None
    configs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    heuristic: Callable[[Problem, bool], str] | None = None
    effective: Callable[[Problem, Any], Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", frozenset(self.entries))
        object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))
        if not self.entries or not self.entries <= set(GRAD_ENTRIES):
            raise ValueError(f"Backward.entries must be a non-empty subset of {GRAD_ENTRIES}; got {set(self.entries)}")
        if self.kernel is None:
            if self.configs or self.config_cls is not None or self.heuristic is not None or self.effective is not None:
                raise ValueError("a Backward without its own kernel (the forward's config sets it) declares no configs")
            return
        if self.config_cls is None or not self.configs or self.heuristic is None:
            raise ValueError(f"Backward {self.kernel}: a backward kernel declares config_cls, configs and heuristic")
        for cname, cfg in self.configs.items():
            if not isinstance(cfg, self.config_cls):
                raise ValueError(f"{self.kernel}: config {cname!r} is not a {self.config_cls.__name__}")

    def config(self, config: Any, problem: Problem, *, deterministic: bool = False, forward: str = "") -> Any:
        """Resolve a backward config: a config object, a name in ``configs`` or None (``heuristic``); the config as
        named (``effective`` is the kernel's to apply). A backward without its own kernel returns None for None and
        refuses anything else, naming ``forward`` (the kernel whose config sets it)."""
        if self.kernel is None:
            if config is None:
                return None
            raise ValueError(f"{forward or 'this kernel'}'s backward runs at its forward config (one config sets "
                             f"both); got bwd_config={config!r}")
        if config is None:
            config = self.heuristic(problem, bool(deterministic))
        if isinstance(config, str):
            try:
                return self.configs[config]
            except KeyError:
                raise ValueError(f"{self.kernel} has configs {sorted(self.configs)}; got bwd_config={config!r}"
                                 ) from None
        if isinstance(config, self.config_cls):
            return config
        raise ValueError(f"bwd_config must be a {self.config_cls.__name__}, a name in {sorted(self.configs)} or None; "
                         f"got {config!r}")

    def runs(self, problem: Problem, config: Any) -> Any:
        """The config the backward runs on ``problem`` (``effective``; the config itself without one)."""
        return config if self.effective is None else self.effective(problem, config)


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    """One Pallas kernel's declaration, for every entry. See the module docstring for the entry calling convention.

    A kernel of the "mla" entry serves that entry alone, through ``mla``; ``templates``: the (DQK, DV) pairs it takes;
    ``latent_precision``: quantized latent format -> how it computes on it; ``latent_q_dtypes``: format -> the q dtypes
    it takes with that format; ``min_page``: the smallest page it reads. ``limits``: a kernel's own refusals (problem
    -> ``(ok, reason)``), asked once the generic checks of ``supports`` pass."""

    name: str
    lowering: str
    passes: tuple[str, ...]
    config_cls: type
    configs: Mapping[str, Any]
    entries: frozenset[str]
    dtypes: tuple[str, ...]
    precision: Mapping[str, Precision]
    head_dims: tuple[int, ...] | None = (64, 128)  # None: any head dim
    gqa: bool = False
    max_q_len: int | None = None
    dense: Callable[..., Any] | None = None
    paged: Callable[..., Any] | None = None
    materializes_s: bool = False
    # (problem, config) -> (tile_m, tile_n) of S's operand reuse (materialized kernels only)
    s_tile: Callable[[Problem, Any], tuple[int, int]] | None = None
    # problem -> the config to use when the caller names none
    heuristic: Callable[[Problem], Any] | None = None
    # (problem, config) -> the launch plan (grid, splits, waves ...), recorded by compare
    plan: Callable[[Problem, Any], Mapping[str, Any]] = _no_plan
    # (problem, config) -> the config as the problem runs it, the knobs that do not apply to it reset (e.g. a quantized
    # decode's knobs on a 16-bit cache): two configs with equal answers launch the same programs, so compare times one
    # of them (None: every named config is its own program)
    effective: Callable[[Problem, Any], Any] | None = None
    # (shape, plan, pass names, hw=, cfg=) -> [launches.Launch]: what one call launches, for the schedule model
    # (compare.layer2 prices it; None: layer 2 refuses to price the kernel, by name)
    launches: Callable[..., list] | None = None
    # how jax.grad differentiates the kernel (a ``Backward``: what runs, through which public entries, with which
    # configs and chooser), or None: no backward kernel, and the public entries make jax.grad / jax.jvp raise naming
    # the entry and the generation (issue 26, item 2)
    backward: Backward | None = None
    # the "quantized" entry: KV storage format (Problem.kv_dtype, e.g. "fp8_e4m3", "nvfp4") -> how the kernel
    # computes on it (operand = the storage precision the roofline charges), the q dtypes it takes with a
    # quantized cache, and the ALU instructions per KV element its decode costs
    kv_precision: Mapping[str, Precision] = dataclasses.field(default_factory=dict)
    quantized_q_dtypes: tuple[str, ...] = ("float16",)
    kv_dequant_ops: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # the "mla" entry (see the class docstring): its function, templates, latent formats and smallest page
    mla: Callable[..., Any] | None = None
    templates: tuple[tuple[int, int], ...] = ()
    latent_precision: Mapping[str, Precision] = dataclasses.field(default_factory=dict)
    latent_q_dtypes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    min_page: int = 1
    # problem -> (ok, reason): refusals of this kernel's own beyond the generic checks (None: none)
    limits: Callable[[Problem], tuple[bool, str]] | None = None
    # passes lowered through Triton in a kernel whose ``lowering`` is another (a Mosaic GPU kernel's small follow-up
    # launch, e.g. v12_mla_tc's finish: the split merge, the table check and the output layout; session 20)
    triton_passes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.lowering not in LOWERINGS:
            raise ValueError(f"{self.name}: lowering must be one of {LOWERINGS}; got {self.lowering!r}")
        object.__setattr__(self, "entries", frozenset(self.entries))
        object.__setattr__(self, "triton_passes", frozenset(self.triton_passes))
        if not self.triton_passes <= set(self.passes):
            raise ValueError(f"{self.name}: triton_passes {sorted(self.triton_passes)} must be among its passes")
        object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))
        object.__setattr__(self, "precision", MappingProxyType(dict(self.precision)))
        object.__setattr__(self, "kv_precision", MappingProxyType(dict(self.kv_precision)))
        object.__setattr__(self, "kv_dequant_ops", MappingProxyType(dict(self.kv_dequant_ops)))
        object.__setattr__(self, "latent_precision", MappingProxyType(dict(self.latent_precision)))
        object.__setattr__(self, "latent_q_dtypes", MappingProxyType(dict(self.latent_q_dtypes)))
        if ("quantized" in self.entries) != bool(self.kv_precision):
            raise ValueError(f"{self.name}: serves 'quantized' iff it declares kv_precision")
        if not self.entries or not self.entries <= set(ENTRIES):
            raise ValueError(f"{self.name}: entries must be a non-empty subset of {ENTRIES}; got {self.entries}")
        if ("dense" in self.entries) != (self.dense is not None):
            raise ValueError(f"{self.name}: serves 'dense' iff it has a dense function")
        if (bool({"paged", "quantized"} & self.entries)) != (self.paged is not None):
            raise ValueError(f"{self.name}: serves 'paged' iff it has a paged function")
        if set(self.precision) != set(self.dtypes):
            raise ValueError(f"{self.name}: precision must be declared for every dtype {self.dtypes}")
        for cname, cfg in self.configs.items():
            if not isinstance(cfg, self.config_cls):
                raise ValueError(f"{self.name}: config {cname!r} is not a {self.config_cls.__name__}")
        if not self.passes or not all(p.startswith("pallas_attn_") for p in self.passes):
            raise ValueError(f"{self.name}: passes must be the pallas_call names pallas_attn_<...>")
        if self.backward is not None and not isinstance(self.backward, Backward):
            raise ValueError(f"{self.name}: backward must be a Backward or None; got {self.backward!r}")
        if self.materializes_s and self.s_tile is None:
            raise ValueError(f"{self.name}: a kernel that materializes S must declare s_tile")
        if ("mla" in self.entries or self.mla is not None) and (self.entries != frozenset({"mla"}) or self.mla is None):
            raise ValueError(f"{self.name}: an MLA kernel serves the 'mla' entry through its mla function")
        if "mla" not in self.entries:
            extra = [n for n, v in (("templates", self.templates), ("latent_precision", self.latent_precision),
                                    ("latent_q_dtypes", self.latent_q_dtypes), ("min_page", self.min_page != 1)) if v]
            if extra:
                raise ValueError(f"{self.name}: {', '.join(extra)} are the 'mla' entry's; the kernel does not serve it")

    # ------------------------------------------------------------------------------------------------------

    def supports(self, p: Problem) -> tuple[bool, str]:
        """``(True, "")`` or ``(False, reason)`` naming what is supported: the generic checks of the problem's entry
        (``_supports_mla`` for "mla"), then the kernel's own ``limits``."""
        ok, why = self._supports_mla(p) if "mla" in self.entries else self._supports_generic(p)
        if ok and self.limits is not None:
            return self.limits(p)
        return ok, why

    def _supports_generic(self, p: Problem) -> tuple[bool, str]:
        if p.entry not in self.entries:
            return False, f"{self.name} serves {sorted(self.entries)}, not the {p.entry!r} entry"
        if p.dtype not in self.dtypes:
            return False, f"{self.name} takes dtypes {self.dtypes}; got {p.dtype}"
        if p.kv_dtype not in (None, p.dtype) and p.entry != "quantized":
            return False, f"{self.name} takes KV in q's dtype; got kv_dtype={p.kv_dtype}"
        if p.entry == "quantized" and p.kv_dtype not in self.kv_precision:
            return False, f"{self.name} reads KV formats {sorted(self.kv_precision)}; got kv_dtype={p.kv_dtype}"
        if p.entry == "quantized" and p.page_size is None and self.dense is None:
            return False, (f"{self.name} reads quantized KV from paged pools only (page the cache with "
                           "pallas_attn.quant.build_paged_quantized); got a dense quantized cache")
        if p.entry == "quantized" and p.dtype not in self.quantized_q_dtypes:
            return False, f"{self.name} takes q dtypes {self.quantized_q_dtypes} with a quantized KV; got {p.dtype}"
        if self.head_dims is not None and p.head_dim not in self.head_dims:
            return False, f"{self.name} supports head dims {self.head_dims}; got D={p.head_dim}"
        if p.heads_q != p.heads_kv and not self.gqa:
            return False, f"{self.name} is MHA (Hq == Hkv) as in the reference; got Hq={p.heads_q}, Hkv={p.heads_kv}"
        if self.max_q_len is not None and p.q_len > self.max_q_len:
            return False, f"{self.name} is a decode kernel for Tq <= {self.max_q_len}; got Tq={p.q_len}"
        return True, ""

    def template_dv(self, dqk: int) -> int | None:
        """The "mla" entry: the value width of the kernel's (DQK, DV) template for ``dqk`` (None: no template)."""
        return next((dv for d, dv in self.templates if d == dqk), None)

    def _supports_mla(self, p: Problem) -> tuple[bool, str]:
        if p.entry != "mla":
            return False, f"{self.name} serves the 'mla' entry (pallas_attn.mla_attention), not {p.entry!r}"
        if p.heads_kv != 1:
            return False, f"{self.name}: the latent has one head (MQA over the latent); got {p.heads_kv} KV heads"
        dv = p.kv_lora_rank or self.template_dv(p.head_dim)
        if (p.head_dim, dv) not in self.templates:
            return False, (f"{self.name} takes (DQK, kv_lora_rank) templates {list(self.templates)}; got "
                           f"({p.head_dim}, {dv})")
        fmt = p.kv_dtype
        if fmt in (None, p.dtype):
            if p.dtype not in self.dtypes:
                return False, (f"{self.name} takes q and a plain latent in {self.dtypes}; got {p.dtype} "
                               f"(quantized latents: {sorted(self.latent_precision) or 'none'})")
        else:
            if fmt not in self.latent_precision:
                return False, (f"{self.name} reads latents in {list(self.dtypes)} or the formats "
                               f"{sorted(self.latent_precision) or '(none)'}; got latent format {fmt}")
            if p.dtype not in self.latent_q_dtypes.get(fmt, ()):
                return False, (f"{self.name} takes q dtypes {self.latent_q_dtypes.get(fmt)} with a {fmt} latent; "
                               f"got {p.dtype}")
        if self.max_q_len is not None and p.q_len > self.max_q_len:
            return False, f"{self.name} is a decode kernel for Tq <= {self.max_q_len}; got Tq={p.q_len}"
        if p.page_size is not None and p.page_size < self.min_page:
            return False, f"{self.name} needs page_size >= {self.min_page}; got {p.page_size}"
        return True, ""

    def differentiates(self, entry: str) -> bool:
        """Whether ``jax.grad`` through the public function ``entry`` (``GRAD_ENTRIES``) runs this kernel's declared
        backward; where not, the entry raises naming itself and the generation."""
        return self.backward is not None and entry in self.backward.entries

    def default_config_name(self) -> str:
        return "faithful" if "faithful" in self.configs else "default"

    def config(self, config: Any, problem: Problem | None = None) -> Any:
        """Resolve ``config``: a config object, a name in ``configs`` or None (the heuristic for the problem)."""
        if config is None:
            if self.heuristic is not None and problem is not None:
                return self.heuristic(problem)
            return self.configs[self.default_config_name()]
        if isinstance(config, str):
            try:
                return self.configs[config]
            except KeyError:
                raise ValueError(f"{self.name} has configs {sorted(self.configs)}; got config={config!r}") from None
        if isinstance(config, self.config_cls):
            return config
        raise ValueError(f"config must be a {self.config_cls.__name__}, a name in {sorted(self.configs)} or None; "
                         f"got {config!r}")

    def precision_for(self, dtype: str) -> Precision:
        try:
            return self.precision[dtype]
        except KeyError:
            raise NotImplementedError(f"{self.name} takes dtypes {self.dtypes}; got {dtype}") from None

    def roofline(self, p: Problem, config: Any = None) -> RooflineInputs:
        if "mla" in self.entries:  # the latent's storage precision; MLA kernels stream S, never materialize it
            prec = self.latent_precision.get(p.kv_dtype) or self.precision_for(p.dtype)
            return RooflineInputs(precision=prec.operand, materialize_s=False, tile=(1, 1),
                                  tensor_cores=prec.engine == "tensor",
                                  dequant_ops=float(self.kv_dequant_ops.get(p.kv_dtype or "", 0.0)))
        prec = self.precision_for(p.dtype)
        ops = 0.0
        if p.entry == "quantized" and p.kv_dtype in self.kv_precision:
            prec, ops = self.kv_precision[p.kv_dtype], float(self.kv_dequant_ops.get(p.kv_dtype, 0.0))
        cfg = self.config(config, p)
        tile = self.s_tile(p, cfg) if self.materializes_s else (1, 1)
        return RooflineInputs(precision=prec.operand, materialize_s=self.materializes_s, tile=tile,
                              tensor_cores=prec.engine == "tensor", dequant_ops=ops)

    def describe(self) -> dict[str, Any]:
        """The declaration as plain data (what ``generations()`` and the records show)."""
        return {
            "kernel": self.name, "lowering": self.lowering, "passes": list(self.passes),
            "configs": list(self.configs), "entries": sorted(self.entries), "dtypes": list(self.dtypes),
            "head_dims": None if self.head_dims is None else list(self.head_dims), "gqa": self.gqa,
            "max_q_len": self.max_q_len, "materializes_s": self.materializes_s,
            "precision": {k: dataclasses.asdict(v) for k, v in self.precision.items()},
            "kv_precision": {k: dataclasses.asdict(v) for k, v in self.kv_precision.items()},
        } | ({"templates": [list(t) for t in self.templates],
              "latent_precision": {k: dataclasses.asdict(v) for k, v in self.latent_precision.items()}}
             if "mla" in self.entries else {})
