"""The generation table: the reference's 17 generations plus our frontier kernels, in order.

A row holds what is true of a generation whatever framework implements it: its family, its parent, the one
change it makes, the section of the specification it follows, which public entries serve it, whether it is a
frontier kernel (our own, not one of the reference's) and whether it has a CUDA twin (``twin``: every reference
generation has one; a frontier kernel has one only where its row says so). What each *twin* can do (dtypes, head
dims, configs, precision) is declared by the twin: ``pallas_attn.registry`` (kernel contracts) and ``cuda_ref``'s
generation table (``csrc/generations.def``). ``compare`` pairs the two twins by id.

A frontier kernel with a CUDA twin also declares here the two facts about that twin that no other place holds:
``twin_dataflow`` (the dataflow, a ``compare.layer2.COSTS`` key, that ``cuda_ref.launches`` prices the twin's
kernels by when its builder does not know them by name) and ``twin_smem`` (the static shared memory in bytes
of each of the twin's kernel instantiations, as ptxas names them: tests/test_cuda_ref_cpu.py checks it against
ptxas's report). The reference's twins keep theirs where they were (cuda_ref.launches by kernel name, the
test's ``EXPECTED_SMEM`` from the specification).

Entries (DESIGN.md decision 6): ``dense`` (``attention``), ``paged`` (``paged_attention``), ``quantized``
(``paged_attention`` with an fp8 / NVFP4 pool), ``mla`` (``mla_attention``). Sections refer to the
reference project's write-up (github.com/gkienpham-cmd/flashattention-cuda), as summarised in our docs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

__all__ = ["Generation", "GENERATIONS", "FAMILIES", "ENTRIES", "REFERENCE_IDS", "TWIN_IDS", "MLA_TEMPLATES", "ids",
           "get"]

FAMILIES = ("prefill", "decode", "paged_gqa", "lowp_kv", "mla", "frontier_decode", "frontier_prefill")
ENTRIES = ("dense", "paged", "quantized", "mla")


@dataclasses.dataclass(frozen=True)
class Generation:
    id: str
    family: str
    parent: str | None
    delta: str
    section: str
    entries: frozenset[str]
    frontier: bool = False
    twin: bool | None = None  # has a CUDA twin (cuda_ref); None: a reference generation has one, a frontier one not
    twin_dataflow: str | None = None  # the twin's dataflow (a compare.layer2.COSTS key) where none is known by name
    # the twin's kernels' static shared memory in bytes, as ptxas names them: given as a mapping, kept as sorted pairs
    twin_smem: Mapping[str, int] | tuple[tuple[str, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r} for {self.id}")
        object.__setattr__(self, "entries", frozenset(self.entries))
        bad = self.entries - set(ENTRIES)
        if not self.entries or bad:
            raise ValueError(f"{self.id}: entries must be a non-empty subset of {ENTRIES}; got {sorted(self.entries)}")
        if self.twin is None:
            object.__setattr__(self, "twin", not self.frontier)
        if not self.twin and (self.twin_dataflow is not None or self.twin_smem is not None):
            raise ValueError(f"{self.id}: twin_dataflow and twin_smem describe a CUDA twin; the row has none (twin=)")
        if self.twin_smem is not None:
            smem = dict(self.twin_smem)
            if not smem or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in smem.items()):
                raise ValueError(f"{self.id}: twin_smem maps kernel names to bytes (int >= 0); got {smem}")
            object.__setattr__(self, "twin_smem", tuple(sorted(smem.items())))


_D, _P, _Q, _M = frozenset({"dense"}), frozenset({"paged"}), frozenset({"quantized"}), frozenset({"mla"})

GENERATIONS: tuple[Generation, ...] = (
    # --- prefill (dense) -----------------------------------------------------------------------------------
    Generation("v1_naive", "prefill", None, "three passes, S = QK^T fp32 in HBM, one thread per element/row",
               "§2.1", _D),
    Generation("v2_tiled", "prefill", "v1_naive",
               "shared-memory tiles TM=TN=64 (D=64) / 32 (D=128); S still in HBM", "§2.2", _D),
    Generation("v3_online", "prefill", "v2_tiled",
               "two passes: row stats (M, L) to HBM, then output; S never in HBM", "§2.3", _D),
    Generation("v4_fused", "prefill", "v3_online", "one pass, online softmax, 8 query rows per program (FA-1)",
               "§2.4", _D),
    Generation("v5_wmma", "prefill", "v4_fused", "fp16 operands on tensor cores, fp32 accumulation", "§2.5", _D),
    # --- decode, dense KV ----------------------------------------------------------------------------------
    Generation("v6_splitkv", "decode", "v4_fused", "split-KV partials + LSE merge (Flash-Decoding)", "§2.6", _D),
    # --- decode, paged GQA ---------------------------------------------------------------------------------
    Generation("v7_paged", "paged_gqa", "v6_splitkv", "paged KV through a block table; causal q_offset",
               "§2.7", _P),
    Generation("v8_gqa", "paged_gqa", "v7_paged", "GQA M-packing: G query heads share one staged KV tile",
               "§2.8", _P),
    Generation("v8_gqa_tc", "paged_gqa", "v8_gqa",
               "packed rows padded to 16 on tensor cores (dead end in the reference)", "§2.9", _P),
    Generation("v8_gqa_db", "paged_gqa", "v8_gqa", "double-buffered fp16 KV tiles (null in the reference)",
               "§2.10", _P),
    Generation("v8_gqa_occ", "paged_gqa", "v8_gqa", "single fp16 KV tile for occupancy", "§2.11", _P),
    Generation("v8_gqa_ilp", "paged_gqa", "v8_gqa", "4 independent key dots in flight (null in the reference)",
               "§2.12", _P),
    Generation("v8_gqa_ss", "paged_gqa", "v8_gqa", "score-stationary: lane per key, one update per 32 keys",
               "§2.13", _P),
    # --- decode, low-precision KV --------------------------------------------------------------------------
    Generation("v9_fp8", "lowp_kv", "v8_gqa_ss", "FP8 E4M3 KV pools, per-tensor scales, dequant at the gather",
               "§2.14", _Q),
    Generation("v10_nvfp4", "lowp_kv", "v9_fp8", "NVFP4 KV (E2M1 + E4M3 micro-scale per 16 + tensor scale)",
               "§2.15", _Q),
    # --- decode, MLA ---------------------------------------------------------------------------------------
    Generation("v11_mla", "mla", "v10_nvfp4", "MLA latent decode (576/512) on CUDA cores, NVFP4 latent",
               "§2.16", _M),
    Generation("v12_mla_tc", "mla", "v11_mla", "tensor-core MLA decode (never built in the reference)",
               "§2.17", _M),
    # --- frontier ------------------------------------------------------------------------------------------
    Generation("fa_decode", "frontier_decode", "v8_gqa_ss",
               "GQA decode at the HBM ceiling: packed heads on tensor cores, wide split-KV, dense and paged; "
               "fp16, fp8 or NVFP4 KV",
               "docs/fa_decode.md", _D | _P | _Q, frontier=True),
    Generation("fa_train", "frontier_prefill", "v5_wmma",
               "training attention: forward saving the LSE + dK/dV and dQ backward kernels; GQA, causal, "
               "per-sequence lengths, local window; fp16 / bf16 / fp32", "docs/dropin.md", _D, frontier=True),
    Generation("fa_prefill", "frontier_prefill", "v5_wmma",
               "Hopper forward in Mosaic GPU: TMA K/V ring, wgmma, producer + two consumer warpgroups, "
               "software-pipelined softmax; GQA, causal with offset, any length, LSE; fp16 / bf16",
               "docs/fa_prefill.md", _D, frontier=True),
    Generation("fa_mla", "mla", "v12_mla_tc",
               "MLA decode at the DeepSeek-V3 shape (h_q 128, 512 + 64, page 64): v12_mla_tc's Mosaic GPU kernel "
               "(TMA latent ring, wgmma QK over 576 and PV over 512, split-KV)", "docs/mla.md", _M, frontier=True),
)

_BY_ID = {g.id: g for g in GENERATIONS}
REFERENCE_IDS: tuple[str, ...] = tuple(g.id for g in GENERATIONS if not g.frontier)
TWIN_IDS: tuple[str, ...] = tuple(g.id for g in GENERATIONS if g.twin)  # cuda_ref builds exactly these

# (DQK, DV = kv_lora_rank) the reference's MLA kernels are instantiated for (docs/reference.md §2.16, docs/mla.md):
# v11_mla in both twins and cuda_ref's v12_mla_tc take these; the one definition both twins and compare import.
MLA_TEMPLATES: tuple[tuple[int, int], ...] = ((96, 64), (160, 128), (576, 512))


def ids() -> tuple[str, ...]:
    return tuple(_BY_ID)


def get(gen_id: str) -> Generation:
    try:
        return _BY_ID[gen_id]
    except (KeyError, TypeError):
        raise ValueError(f"unknown generation {gen_id!r}; known: {', '.join(_BY_ID)}") from None
