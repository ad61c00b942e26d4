"""The launch vocabulary both twins declare for the schedule model (layer 2 of the roofline, ``compare.layer2``).

A Pallas kernel (``Kernel.launches``, beside its code in ``pallas_attn/kernels``) and a CUDA twin
(``cuda_ref.launches``) each return, for one problem and its plan, the ``Launch`` list one call runs: programs,
threads, registers, shared memory, work units and serial steps per program, bytes. ``compare.layer2`` prices the
list with its fitted constants (a launch's ``cost`` names the dataflow whose constants apply) and its own modelling
choices; it holds no facts of a kernel. The vocabulary sits here, below both twins, because cuda_ref imports neither
JAX nor pallas_attn (docs/architecture.md, the dependency rule):

* ``Launch``: one kernel launch as the schedule sees it;
* ``SMLimits`` / ``SM90`` and ``occupancy``: programs resident per SM under the sm_90 limits;
* ``KV_STORAGE_BYTES`` / ``kv_bytes``: bytes per stored K/V element of the quantized formats;
* ``cast_launches``: fp32 inputs cast to 16 bits inside the timed call;
* ``mla_dims``: an MLA shape's (DQK, DV) (the templates are ``attn_core.generations.MLA_TEMPLATES``).

The problem arrives as ``compare.layer2.Shape`` (batch, heads, lengths, head dim, dtype, causal, offset, page, window,
longest document, visible fraction ``vis_frac``); a builder reads its fields and never imports its type.
Standard library only (no numpy needed).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .generations import MLA_TEMPLATES

__all__ = ["Launch", "SMLimits", "SM90", "occupancy", "cdiv", "KV_STORAGE_BYTES", "kv_bytes", "kv_tokens",
           "cast_launches", "mla_dims"]


@dataclasses.dataclass(frozen=True)
class SMLimits:
    """Per-SM residency limits of sm_90 (CUDA C++ Programming Guide, compute capability 9.0 table)."""

    threads: int = 2048
    regs: int = 65536
    smem: int = 228 * 1024  # per SM; a block may use up to 227 KB
    smem_reserved: int = 1024  # the runtime's per-block reservation
    blocks: int = 32
    reg_alloc: int = 256  # registers are allocated per warp in units of 256
    schedulers: int = 4


SM90 = SMLimits()


def occupancy(threads: int, regs: int, smem: int, lim: SMLimits = SM90) -> tuple[int, str]:
    """Programs resident per SM and the limit that binds (threads, regs, smem or blocks)."""
    if threads < 1 or threads > 1024:
        raise ValueError(f"threads per program must be in 1..1024; got {threads}")
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // lim.reg_alloc) * lim.reg_alloc
    by = {
        "threads": lim.threads // (warps * 32),
        "regs": lim.regs // (regs_per_warp * warps),
        "blocks": lim.blocks,
    }
    if smem > 0:
        by["smem"] = lim.smem // (smem + lim.smem_reserved)
    limit = min(by, key=by.__getitem__)
    if by[limit] < 1:
        raise ValueError(f"a program of {threads} threads x {regs} regs with {smem} B of shared memory does not fit "
                         f"on one SM ({by})")
    return by[limit], limit


def cdiv(a: float, b: float) -> int:
    return int(-(-int(a) // int(b)))


# Storage bytes per K/V element of the quantized formats (docs/quantized_kv.md): fp8 E4M3 one byte; NVFP4 half a byte
# of packed E2M1 codes plus one E4M3 micro-scale byte per 16 elements (the per-tensor scale is 4 bytes in all)
KV_STORAGE_BYTES: dict[str, float] = {"fp8_e4m3": 1.0, "nvfp4": 0.5 + 1.0 / 16}


def kv_bytes(s: Any) -> float:
    """Bytes per K/V element a 16-bit kernel reads: the quantized storage format's, else 2."""
    return KV_STORAGE_BYTES[s.kv_dtype] if s.kv_dtype else 2.0


def kv_tokens(s: Any) -> float:
    """Keys a decode reads over the whole batch: the shape's ``kv_tokens`` (the sum of ragged per-sequence lengths)
    where it has one, else ``batch * kv_len``. A kernel that never reads past a sequence's length moves these bytes;
    its busiest program still walks the longest sequence (``kv_len``)."""
    return getattr(s, "kv_tokens", None) or s.batch * s.kv_len


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch as the schedule sees it. ``cost`` names the dataflow whose fitted constants price it
    (``compare.layer2.COSTS``)."""

    name: str
    cost: str
    programs: int
    threads: int
    regs: int  # per thread
    smem: int  # bytes per program
    units: float  # work units per program (priced by Cost.issue)
    steps: float  # serial steps per program (priced by Cost.lat)
    dram_bytes: float
    l2_bytes: float = 0.0
    unit: str = ""  # what a work unit is (for the report)
    note: str = ""
    key_steps: float = 0.0  # serial one-key updates per program (priced by Cost.key)
    gather_steps: float = 0.0  # serial block-table -> pool gather steps per program (priced by GLOBAL gather_lat)
    spill_units: float = 0.0  # work units whose operands spill (priced by Cost.spill on the issue side)
    live_values: float = 0.0  # live fp32 product values per thread (layer 2 turns the share beyond its threshold into
    # spill_units: the threshold is a modelling choice, compare.layer2.PAGED_LIVE_VALUES)
    reread_bytes: float = 0.0  # bytes re-read from a buffer of ``reread_buffer`` bytes an earlier launch wrote: layer 2
    reread_buffer: float = 0.0  # adds them to l2_bytes when the buffer fits its L2 residency cap, else to dram_bytes
    mma: float = 0.0  # 16-bit tensor-core FLOPs per program, priced at the SM's datasheet MMA rate (not fitted)
    dequant_elems: float = 0.0  # quantized K/V elements a program decodes (priced by Cost.dequant, issue side)
    sfu: float = 0.0  # exponentials a program's softmax computes (the special-function unit's ex2), priced at the SM's
    # datasheet SFU rate on the program's chain, less the share its MMA hides (Cost.sfu_hide; compare.layer2)


def mla_dims(s: Any) -> tuple[int, int]:
    """(DQK, DV) of an MLA shape: its head dim and its kv_lora_rank (else the template's DV)."""
    dqk = s.head_dim
    dv = s.kv_lora_rank or dict(MLA_TEMPLATES).get(dqk)
    if not dv:
        raise ValueError(f"MLA head_dim {dqk} has no template DV (kv_lora_rank)")
    return dqk, int(dv)


def cast_launches(s: Any, what: str, to_bytes: int = 2) -> list[Launch]:
    """fp32 inputs cast to 16 bits inside the timed call: one elementwise kernel per tensor (q, k, v)."""
    if s.dtype != "float32":
        return []
    out = []
    for name, n in (("q", s.bh * s.q_len * s.head_dim), ("k", s.batch * s.heads_kv * s.kv_len * s.head_dim),
                    ("v", s.batch * s.heads_kv * s.kv_len * s.head_dim)):
        out.append(Launch(f"{what}_cast_{name}", "cast", programs=max(1, cdiv(n, 1024)), threads=256, regs=32,
                          smem=0, units=0, steps=0, dram_bytes=n * (4 + to_bytes), unit="-",
                          note=f"{what}: {name} fp32 -> 16 bit inside the timed call"))
    return out
