"""One ordered table of every generation: the reference's 17 (ORIGINAL.md §2) plus our frontier kernels.

A row says what the generation is (family, parent, the one change it makes, the reference section) and
whether each twin exists *yet*: ``pallas`` names the module under ``pallas_attn.kernels`` that implements
it, ``cuda`` says whether ``cuda_ref`` compiles a kernel for it. ``None``/``False`` is the honest state
"not built yet"; nothing in the project fakes an implementation for such a row (tests enforce that a
row claiming a module really has one).

``compare`` iterates this table, so a new generation needs a row here and a module, and nothing else.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from types import MappingProxyType, ModuleType
from typing import Any

__all__ = ["Generation", "GENERATIONS", "get", "ids", "generations", "pallas_module", "FAMILIES"]

FAMILIES = ("prefill", "decode", "paged_gqa", "lowp_kv", "mla", "frontier_decode")


@dataclasses.dataclass(frozen=True)
class Generation:
    id: str
    family: str
    parent: str | None
    delta: str
    section: str
    entry: str = "attention"  # which public function serves it: attention | paged_attention | ...
    pallas: str | None = None  # module name under pallas_attn.kernels, once built
    cuda: bool = False  # cuda_ref has a kernel for it
    dtypes: tuple[str, ...] = ("float32",)  # input dtypes the Pallas twin takes
    head_dims: tuple[int, ...] = (64, 128)
    gqa: bool = False  # Hq != Hkv supported
    max_q_len: int | None = None  # None: any Tq
    frontier: bool = False
    knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r} for {self.id}")
        object.__setattr__(self, "knobs", MappingProxyType(dict(self.knobs)))

    @property
    def built(self) -> dict[str, bool]:
        return {"pallas": self.pallas is not None, "cuda": self.cuda}

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["knobs"] = dict(self.knobs)
        d["built"] = self.built
        return d


_LOWP = ("float16", "bfloat16")
_ALL = ("float32", "float16", "bfloat16")

_TABLE: tuple[Generation, ...] = (
    # --- prefill (dense) ---------------------------------------------------------------------------
    Generation("v1_naive", "prefill", None, "three passes, S = QK^T fp32 in HBM, one thread per element/row",
               "§2.1", dtypes=("float32",), knobs={"passes": 3}),
    Generation("v2_tiled", "prefill", "v1_naive", "shared-memory tiles TM=TN=64 (D=64) / 32 (D=128); S still in HBM",
               "§2.2", dtypes=("float32",), knobs={"tile": {"64": [64, 64], "128": [32, 32]}}),
    Generation("v3_online", "prefill", "v2_tiled", "two passes: row stats (M, L) to HBM, then output; S never in HBM",
               "§2.3", dtypes=("float32",), knobs={"tile": {"64": 64, "128": 32}}),
    Generation("v4_fused", "prefill", "v3_online", "one pass, online softmax, 8 query rows per program (FA-1)",
               "§2.4", dtypes=("float32",), knobs={"rows": 8, "key_tile": {"64": 64, "128": 32}}),
    Generation("v5_wmma", "prefill", "v4_fused", "fp16 operands on tensor cores, fp32 accumulation",
               "§2.5", dtypes=_ALL, knobs={"block": {"64": [64, 32], "128": [32, 32]}}),
    # --- decode, dense KV --------------------------------------------------------------------------
    Generation("v6_splitkv", "decode", "v4_fused", "split-KV partials (O, m, l) + LSE merge (Flash-Decoding)",
               "§2.6", dtypes=_ALL, knobs={"s_cap": 32, "min_chunk": 256, "num_sm": "device (40 = reference)"}),
    # --- decode, paged GQA -------------------------------------------------------------------------
    Generation("v7_paged", "paged_gqa", "v6_splitkv", "paged KV through a block table; causal q_offset",
               "§2.7", entry="paged_attention", dtypes=_LOWP),
    Generation("v8_gqa", "paged_gqa", "v7_paged", "GQA M-packing: G query heads share one staged KV tile",
               "§2.8", entry="paged_attention", dtypes=_LOWP, gqa=True),
    Generation("v8_gqa_tc", "paged_gqa", "v8_gqa",
               "packed rows padded to 16 on tensor cores (dead end in the reference)",
               "§2.9", entry="paged_attention", dtypes=_LOWP, gqa=True),
    Generation("v8_gqa_db", "paged_gqa", "v8_gqa", "double-buffered fp16 KV tiles (null in the reference)",
               "§2.10", entry="paged_attention", dtypes=_LOWP, gqa=True, knobs={"stages": 2}),
    Generation("v8_gqa_occ", "paged_gqa", "v8_gqa", "single fp16 KV tile for occupancy", "§2.11",
               entry="paged_attention", dtypes=_LOWP, gqa=True),
    Generation("v8_gqa_ilp", "paged_gqa", "v8_gqa", "4 independent key dots in flight (null in the reference)",
               "§2.12", entry="paged_attention", dtypes=_LOWP, gqa=True, knobs={"key_unroll": 4}),
    Generation("v8_gqa_ss", "paged_gqa", "v8_gqa", "score-stationary: lane per key, one update per 32 keys",
               "§2.13", entry="paged_attention", dtypes=_LOWP, gqa=True),
    # --- decode, low-precision KV ------------------------------------------------------------------
    Generation("v9_fp8", "lowp_kv", "v8_gqa_ss", "FP8 E4M3 KV pools, per-tensor scales, dequant at the gather",
               "§2.14", entry="fp8_attention", dtypes=_LOWP, gqa=True),
    Generation("v10_nvfp4", "lowp_kv", "v9_fp8", "NVFP4 KV (E2M1 + E4M3 micro-scale per 16 + tensor scale)",
               "§2.15", entry="nvfp4_attention", dtypes=_LOWP, gqa=True),
    # --- decode, MLA -------------------------------------------------------------------------------
    Generation("v11_mla", "mla", "v10_nvfp4", "MLA latent decode (576/512) on CUDA cores, NVFP4 latent",
               "§2.16", entry="mla_attention", dtypes=_LOWP, head_dims=(96, 160, 576)),
    Generation("v12_mla_tc", "mla", "v11_mla", "tensor-core MLA decode (never built in the reference)",
               "§2.17", entry="mla_attention", dtypes=_LOWP, head_dims=(96, 160, 576)),
    # --- frontier ----------------------------------------------------------------------------------
    Generation("fa_decode", "frontier_decode", "v8_gqa_ss",
               "GQA decode at the HBM ceiling: packed heads on tensor cores, wide split-KV, dense and paged",
               "ANCHORS.md §1", entry="attention", dtypes=_LOWP, head_dims=(64, 128, 256), gqa=True,
               max_q_len=16, frontier=True),
)


def _with_builds(table: tuple[Generation, ...]) -> tuple[Generation, ...]:
    """Fill in which twins exist, from the single list below (kept next to the table on purpose)."""
    out = []
    for g in table:
        out.append(dataclasses.replace(g, pallas=_PALLAS_BUILT.get(g.id), cuda=g.id in _CUDA_BUILT))
    return tuple(out)


# Which generations have implementations. Edit these when a twin lands (tests check they are real).
_PALLAS_BUILT: dict[str, str] = {
    "v1_naive": "v1_naive", "v2_tiled": "v2_tiled", "v3_online": "v3_online", "v4_fused": "v4_fused",
    "v5_wmma": "v5_wmma", "v6_splitkv": "v6_splitkv", "fa_decode": "fa_decode",
}
_CUDA_BUILT: frozenset[str] = frozenset(
    {"v1_naive", "v2_tiled", "v3_online", "v4_fused", "v5_wmma", "v6_splitkv"}
)

GENERATIONS: tuple[Generation, ...] = _with_builds(_TABLE)
_BY_ID = {g.id: g for g in GENERATIONS}
REFERENCE_IDS: tuple[str, ...] = tuple(g.id for g in GENERATIONS if not g.frontier)


def ids() -> tuple[str, ...]:
    return tuple(_BY_ID)


def get(gen_id: str) -> Generation:
    try:
        return _BY_ID[gen_id]
    except KeyError:
        raise ValueError(f"unknown generation {gen_id!r}; known: {', '.join(_BY_ID)}") from None


def generations() -> tuple[Generation, ...]:
    """All generations in order, with what each supports and whether each twin is built."""
    return GENERATIONS


def pallas_module(gen_id: str) -> ModuleType:
    g = get(gen_id)
    if g.pallas is None:
        raise NotImplementedError(f"generation {gen_id!r} has no Pallas implementation yet (registry row: not built)")
    return importlib.import_module(f"pallas_attn.kernels.{g.pallas}")
