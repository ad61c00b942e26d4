"""The generation table: the reference's 17 generations plus our frontier kernels, in order.

A row holds what is true of a generation whatever framework implements it: its family, its parent, the one
change it makes, the section of the specification it follows, which public entries serve it, whether it is a
frontier kernel (our own, not one of the reference's) and its CUDA twin, if any (``twin``: every reference
generation has one; a frontier kernel has one only where its row says so). What the Pallas kernel can do (dtypes,
head dims, configs, precision) is declared by its contract (``pallas_attn.registry``). ``compare`` pairs the two
twins by id.

``twin=CudaTwin(...)`` is the twin's row of cuda_ref's C++ generation table, and the only place it is written:
``cuda_ref.table`` renders the X-macro ``generations.def`` from these rows when the extension (or a test's compile)
builds, and parses the same text for Python (``cuda_ref.table()``). A frontier kernel with a CUDA twin also declares
here the two facts about that twin that no other place holds: ``twin_dataflow`` (the dataflow, a
``compare.layer2.COSTS`` key, that ``cuda_ref.launches`` prices the twin's kernels by when its builder does not
know them by name) and ``twin_smem`` (the static shared memory in bytes of each of the twin's kernel
instantiations, as ptxas names them: tests/test_cuda_ref_cpu.py checks it against ptxas's report). The
reference's twins keep theirs where they were (cuda_ref.launches by kernel name, the test's ``EXPECTED_SMEM``
from the specification).

Entries (DESIGN.md decision 6): ``dense`` (``attention``), ``paged`` (``paged_attention``), ``quantized``
(``paged_attention`` with an fp8 / NVFP4 pool), ``mla`` (``mla_attention``). Sections refer to the
reference project's write-up (github.com/gkienpham-cmd/flashattention-cuda), as summarised in our docs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

__all__ = ["Generation", "CudaTwin", "GENERATIONS", "FAMILIES", "ENTRIES", "REFERENCE_IDS", "TWIN_IDS",
           "TWIN_OPERANDS", "TWIN_WORKSPACES", "MLA_TEMPLATES", "ids", "get"]

FAMILIES = ("prefill", "decode", "paged_gqa", "lowp_kv", "mla", "frontier_decode", "frontier_prefill")
ENTRIES = ("dense", "paged", "quantized", "mla")


TWIN_OPERANDS = ("fp32", "fp16", "native")
TWIN_WORKSPACES = ("none", "scores", "row_stats", "split_partials")
TWIN_HEAD_DIMS = (None, (64, 128))  # any head dim | 64 and 128 (the two sets the C++ table can state)


@dataclasses.dataclass(frozen=True)
class CudaTwin:
    """A generation's CUDA twin: its row of cuda_ref's C++ generation table, which ``cuda_ref.table`` renders from
    these rows (the X-macro ``generations.def`` every C++ source includes; written at build time, never by hand).

    ``number``: the stable integer Python passes to the binding (the C++ ``enum Gen``): a reference generation's
    position among the 17 (v8_gqa_ss = 13), a frontier twin the next free one (18, ...); never reuse or renumber
    one. ``operand``: what the kernel reads for q, k, v: ``fp32`` (float32 inputs only, as the reference) | ``fp16``
    (float32/float16/bfloat16 cast to fp16 on the host inside the call) | ``native`` (float16 or bfloat16 as given,
    the MMA type; float32 refused). ``tile_d64`` / ``tile_d128``: the CTA tile (query rows, keys) at D = 64 and
    D = 128, (1, 1) = untiled; the kernel ``static_assert``s its constants against them. ``workspace``: the HBM
    scratch the binding allocates: ``none`` | ``scores`` (S [BH, Nq, Nk]) | ``row_stats`` (M, L [BH, Nq]) |
    ``split_partials`` (O, m, l partials [BH, Nq, S, D+2]). ``head_dims``: None (any) or (64, 128). ``gqa``: H_q
    may be a multiple of H_kv. ``materializes_s``: S makes a round trip through HBM. ``split_kv``: takes a split
    plan and the num_sm knob. ``writes_lse``: writes the row log-sum-exp when asked. ``entry``: the public entry
    it serves (default: the generation's only one)."""

    number: int
    operand: str
    tile_d64: tuple[int, int]
    tile_d128: tuple[int, int]
    workspace: str = "none"
    head_dims: tuple[int, ...] | None = (64, 128)
    gqa: bool = False
    materializes_s: bool = False
    split_kv: bool = False
    writes_lse: bool = True
    entry: str | None = None

    def __post_init__(self) -> None:
        bad = []
        if type(self.number) is not int or self.number < 1:
            bad.append(f"number {self.number!r} (an int >= 1)")
        if self.operand not in TWIN_OPERANDS:
            bad.append(f"operand {self.operand!r} (one of {TWIN_OPERANDS})")
        if self.workspace not in TWIN_WORKSPACES:
            bad.append(f"workspace {self.workspace!r} (one of {TWIN_WORKSPACES})")
        hd = None if self.head_dims is None else tuple(self.head_dims)
        if hd not in TWIN_HEAD_DIMS:
            bad.append(f"head_dims {self.head_dims!r} (None or (64, 128))")
        for name in ("tile_d64", "tile_d128"):
            t = getattr(self, name)
            if not (isinstance(t, tuple) and len(t) == 2 and all(type(x) is int and x >= 1 for x in t)):
                bad.append(f"{name} {t!r} (a pair of ints >= 1: query rows, keys)")
        for name in ("gqa", "materializes_s", "split_kv", "writes_lse"):
            if type(getattr(self, name)) is not bool:
                bad.append(f"{name} {getattr(self, name)!r} (a bool)")
        if self.entry is not None and self.entry not in ENTRIES:
            bad.append(f"entry {self.entry!r} (one of {ENTRIES})")
        if bad:
            raise ValueError("CudaTwin: bad " + "; ".join(bad))
        object.__setattr__(self, "head_dims", hd)


@dataclasses.dataclass(frozen=True)
class Generation:
    id: str
    family: str
    parent: str | None
    delta: str
    section: str
    entries: frozenset[str]
    frontier: bool = False
    twin: CudaTwin | None = None  # its CUDA twin's table row (cuda_ref); None: no twin (every reference row has one)
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
        if self.twin is not None and not isinstance(self.twin, CudaTwin):
            raise ValueError(f"{self.id}: twin= takes the CUDA twin's table row, CudaTwin(number, operand, tile_d64, "
                             f"tile_d128, ...), or None; got {self.twin!r}")
        if self.twin is None and not self.frontier:
            raise ValueError(f"{self.id}: a reference generation has a CUDA twin; declare its table row "
                             "(twin=CudaTwin(...))")
        if self.twin is not None:
            if self.twin.entry is None and len(self.entries) != 1:
                raise ValueError(f"{self.id}: serves {sorted(self.entries)}; its twin serves one: CudaTwin(entry=...)")
            if self.twin.entry is None:
                object.__setattr__(self, "twin", dataclasses.replace(self.twin, entry=next(iter(self.entries))))
            elif self.twin.entry not in self.entries:
                raise ValueError(f"{self.id}: twin entry {self.twin.entry!r} is not among {sorted(self.entries)}")
        if not self.twin and (self.twin_dataflow is not None or self.twin_smem is not None):
            raise ValueError(f"{self.id}: twin_dataflow and twin_smem describe a CUDA twin; the row has none (twin=)")
        if self.twin_smem is not None:
            smem = dict(self.twin_smem)
            if not smem or not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in smem.items()):
                raise ValueError(f"{self.id}: twin_smem maps kernel names to bytes (int >= 0); got {smem}")
            object.__setattr__(self, "twin_smem", tuple(sorted(smem.items())))


_D, _P, _Q, _M = frozenset({"dense"}), frozenset({"paged"}), frozenset({"quantized"}), frozenset({"mla"})
_SPLIT = {"workspace": "split_partials", "split_kv": True}  # split-KV partials, merged by LSE (§2.0)

GENERATIONS: tuple[Generation, ...] = (
    # --- prefill (dense) -----------------------------------------------------------------------------------
    Generation("v1_naive", "prefill", None, "three passes, S = QK^T fp32 in HBM, one thread per element/row",
               "§2.1", _D, twin=CudaTwin(1, "fp32", (1, 1), (1, 1), "scores", head_dims=None, materializes_s=True)),
    Generation("v2_tiled", "prefill", "v1_naive",
               "shared-memory tiles TM=TN=64 (D=64) / 32 (D=128); S still in HBM", "§2.2", _D,
               twin=CudaTwin(2, "fp32", (64, 64), (32, 32), "scores", materializes_s=True)),
    Generation("v3_online", "prefill", "v2_tiled",
               "two passes: row stats (M, L) to HBM, then output; S never in HBM", "§2.3", _D,
               twin=CudaTwin(3, "fp32", (64, 64), (32, 32), "row_stats")),
    Generation("v4_fused", "prefill", "v3_online", "one pass, online softmax, 8 query rows per program (FA-1)",
               "§2.4", _D, twin=CudaTwin(4, "fp32", (8, 64), (8, 32))),
    Generation("v5_wmma", "prefill", "v4_fused", "fp16 operands on tensor cores, fp32 accumulation", "§2.5", _D,
               twin=CudaTwin(5, "fp16", (64, 32), (32, 32))),
    # --- decode, dense KV ----------------------------------------------------------------------------------
    Generation("v6_splitkv", "decode", "v4_fused", "split-KV partials + LSE merge (Flash-Decoding)", "§2.6", _D,
               twin=CudaTwin(6, "fp16", (8, 64), (8, 32), **_SPLIT)),
    # --- decode, paged GQA ---------------------------------------------------------------------------------
    Generation("v7_paged", "paged_gqa", "v6_splitkv", "paged KV through a block table; causal q_offset",
               "§2.7", _P, twin=CudaTwin(7, "fp16", (8, 64), (8, 32), **_SPLIT)),
    Generation("v8_gqa", "paged_gqa", "v7_paged", "GQA M-packing: G query heads share one staged KV tile",
               "§2.8", _P, twin=CudaTwin(8, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    Generation("v8_gqa_tc", "paged_gqa", "v8_gqa",
               "packed rows padded to 16 on tensor cores (dead end in the reference)", "§2.9", _P,
               twin=CudaTwin(9, "fp16", (16, 64), (16, 32), gqa=True, **_SPLIT)),
    Generation("v8_gqa_db", "paged_gqa", "v8_gqa", "double-buffered fp16 KV tiles (null in the reference)",
               "§2.10", _P, twin=CudaTwin(10, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    Generation("v8_gqa_occ", "paged_gqa", "v8_gqa", "single fp16 KV tile for occupancy", "§2.11", _P,
               twin=CudaTwin(11, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    Generation("v8_gqa_ilp", "paged_gqa", "v8_gqa", "4 independent key dots in flight (null in the reference)",
               "§2.12", _P, twin=CudaTwin(12, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    Generation("v8_gqa_ss", "paged_gqa", "v8_gqa", "score-stationary: lane per key, one update per 32 keys",
               "§2.13", _P, twin=CudaTwin(13, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    # --- decode, low-precision KV --------------------------------------------------------------------------
    Generation("v9_fp8", "lowp_kv", "v8_gqa_ss", "FP8 E4M3 KV pools, per-tensor scales, dequant at the gather",
               "§2.14", _Q, twin=CudaTwin(14, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    Generation("v10_nvfp4", "lowp_kv", "v9_fp8", "NVFP4 KV (E2M1 + E4M3 micro-scale per 16 + tensor scale)",
               "§2.15", _Q, twin=CudaTwin(15, "fp16", (8, 64), (8, 32), gqa=True, **_SPLIT)),
    # --- decode, MLA ---------------------------------------------------------------------------------------
    Generation("v11_mla", "mla", "v10_nvfp4", "MLA latent decode (576/512) on CUDA cores, NVFP4 latent",
               "§2.16", _M, twin=CudaTwin(16, "fp16", (8, 32), (8, 32), head_dims=None, gqa=True, **_SPLIT)),
    Generation("v12_mla_tc", "mla", "v11_mla", "tensor-core MLA decode (never built in the reference)",
               "§2.17", _M, twin=CudaTwin(17, "native", (64, 32), (64, 32), head_dims=None, gqa=True, **_SPLIT)),
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


def _check_twin_numbers(gens: tuple[Generation, ...]) -> None:
    """A reference twin's number is its position among the reference rows (1..17); the others follow, unique and
    ascending in table order (what the C++ ``enum Gen`` and the binding's dispatch need)."""
    ref = [g for g in gens if not g.frontier]
    wrong = [f"{g.id}={g.twin.number} (expected {i})" for i, g in enumerate(ref, 1) if g.twin.number != i]
    if wrong:
        raise ValueError(f"a reference twin's number is its position among the reference rows: {', '.join(wrong)}")
    numbers = [g.twin.number for g in gens if g.twin]
    if numbers != sorted(set(numbers)):
        raise ValueError("CUDA twin numbers must be unique and ascend in table order (a new twin takes the next free "
                         f"one; never renumber): {[(g.id, g.twin.number) for g in gens if g.twin]}")


_check_twin_numbers(GENERATIONS)

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
