"""What each CUDA twin launches, as the schedule model (layer 2 of the roofline, ``compare.layer2``) sees it.

The twins declare their launches here, beside their code, in the vocabulary both twins share
(``attn_core.launches.Launch``): ``compare.layer2`` prices what a twin declares with its own fitted constants and
modelling choices (the spill threshold, the L2 residency rule) and holds no twin's facts. Like ``cuda_ref.table``,
this module lists no generation by hand:

* a twin's kernels, in order, are read off its source: the ``<<<`` launches of ``launch_<id>`` in
  ``csrc/kernels/<id>.cu`` and of the ``launch_*`` helpers it calls (v1's softmax pass, the paged merge); template
  arguments as written there (``<D>``; the MLA twins ``<DQK, DV[, T], F>``, T the 16-bit type, F the latent format);
* the builder that turns them into launches is the row's entry's (``_dense``: one builder per kernel name;
  ``_paged``; ``_mla``); a partial whose dataflow is not the default says so by kernel name (``PARTIALS``); a kernel
  no builder knows by name is priced by the dataflow its generation declares (``attn_core.generations``
  ``twin_dataflow``: for a dense twin one of ``DENSE_DATAFLOWS``, for a paged or MLA one a ``Partial`` dataflow), so
  a new twin of a known dataflow needs no edit here;
* registers and static shared memory come from the ptxas report (``resources/ptxas_sm90a.txt``, package data,
  written from the sources by tests/test_cuda_ref_cpu.py).

``plan(gen, shape, plan, num_sm=)`` completes a record's plan with what the twin would choose (the split plan of
``attn_core.splits``, the CTA tile) and the kernel names (``plan["launches"]``); ``launches(gen, shape, plan)``
returns the ``Launch`` list of that call. A buffer an earlier launch wrote and a later one re-reads is declared as
``reread_bytes`` of a ``reread_buffer``: layer 2 decides whether L2 still holds it. A row whose entry has no builder
(quantized: v9_fp8, v10_nvfp4) declares no launches, and layer 2 refuses it by name. The problem arrives as
``compare.layer2.Shape``; a builder reads its fields and never imports its type. Imports neither torch nor JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from attn_core import generations as _core
from attn_core.launches import Launch, cast_launches, cdiv, kv_bytes, kv_tokens, mla_dims

from .table import by_id, table

__all__ = ["Twin", "Partial", "PARTIALS", "DENSE_DATAFLOWS", "PTXAS_REPORT", "ptxas_resources", "resources", "twins",
           "kernels", "reads_kv_dtype", "plan", "launches"]

# cuda_ref's ptxas resource report, package data (cuda_ref/resources): registers and static shared memory per kernel
PTXAS_REPORT = Path(__file__).resolve().parent / "resources" / "ptxas_sm90a.txt"

_PTXAS_LINE = re.compile(r"^(\S+\.cu)\s+(\S+(?:<[^>]*>)?)\s+(\d+)\s+\d+\s+\d+\s+\d+\s+(\d+)\s+\d+\s*$")


@functools.lru_cache(maxsize=1)
def ptxas_resources() -> dict[str, tuple[int, int]]:
    """kernel -> (registers per thread, static shared memory bytes), from the ptxas report (package data)."""
    out = {}
    if not PTXAS_REPORT.is_file():  # cuda_ref installed without its data files: a note on the record
        shown = "/".join(PTXAS_REPORT.parts[-3:])  # package-relative: a record never carries this machine's path
        raise LookupError(f"the ptxas report {shown} is not here (cuda_ref without its resources/): the CUDA "
                          "kernels' registers and shared memory are unknown, so layer 2 cannot price them")
    for line in PTXAS_REPORT.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = _PTXAS_LINE.match(line)  # a template name may hold spaces: <576, 512, __half, 0>
        if m:
            out[m.group(2)] = (int(m.group(3)), int(m.group(4)))
    return out


def resources(kernel: str, d: int) -> tuple[int, int]:
    """(registers per thread, static shared memory bytes) of ``kernel`` (``<D>`` instantiated at ``d``)."""
    res = ptxas_resources()
    key = kernel.replace("<D>", f"<{d}>")
    if key not in res:
        raise KeyError(f"{key} is not in the ptxas report {PTXAS_REPORT.name}")
    return res[key]


# --------------------------------------------------------------------------------------------------------
# The dense twins (v1-v6): one builder per kernel, by kernel name; any other kernel by its declared dataflow
# --------------------------------------------------------------------------------------------------------


def _dense(twin: Twin, row: Any, s: Any, plan: Mapping[str, Any]) -> list[Launch]:
    """kernels/v1_naive.cu ... v6_splitkv.cu: S in HBM (v1, v2: its re-reads declared), row stats (v3), warp per
    query row (v4, v6's partial), WMMA (v5), the split merge (v6). A kernel not named here (a frontier kernel's
    twin) is priced by its generation's ``twin_dataflow`` (``DENSE_DATAFLOWS``), from the row's tile."""
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    s_bytes = bh * tq * tk * 4
    vf = s.vis_frac
    tm, tn = row.tile(d)
    out: list[Launch] = []
    if row.operand == "fp16":
        out += cast_launches(s, "host")
    ob = 4 if row.operand == "fp32" else 2
    qkv = bh * (tq + 2 * tk) * d * ob
    o_bytes = bh * tq * d * 4
    for k in twin.kernels:
        regs, smem = resources(k, d)
        base = k.split("<")[0]
        if base == "v1_qk_kernel":
            total = bh * tq * tk
            P = min(cdiv(total, 256), 1 << 30)
            out.append(Launch(k, base, P, 256, regs, smem, units=256 * d, steps=d,
                              dram_bytes=qkv * 2 / 3 + s_bytes, l2_bytes=total * d * 4 * 2, unit="FMA",
                              note="thread per S element, Q and K rows from global"))
        elif base == "v1_softmax_kernel":
            rows = bh * tq
            out.append(Launch(k, base, cdiv(rows, 256), 256, regs, smem, units=256 * 3 * tk, steps=3 * tk,
                              dram_bytes=0.0, reread_bytes=5 * s_bytes * (0.6 + 0.4 * vf), reread_buffer=s_bytes,
                              unit="S element", note="thread per row, three serial sweeps"))
        elif base == "v1_pv_kernel":
            total = bh * tq * d
            out.append(Launch(k, base, cdiv(total, 256), 256, regs, smem, units=256 * tk, steps=tk,
                              dram_bytes=qkv / 3 + o_bytes, l2_bytes=total * tk * 4, reread_bytes=s_bytes,
                              reread_buffer=s_bytes, unit="FMA", note="thread per output element, sums all keys"))
        elif base == "v2_qk_kernel":
            P = cdiv(tk, tn) * cdiv(tq, tm) * bh
            out.append(Launch(k, base, P, 256, regs, smem, units=tm * tn * d, steps=tm * tn * d / 256,
                              dram_bytes=qkv * 2 / 3 + s_bytes, l2_bytes=P * (tm + tn) * d * 4, unit="FMA",
                              note="TMxTN tile of S, d-long dots from shared memory"))
        elif base == "v2_pv_kernel":
            P = cdiv(tq, tm) * bh
            steps = cdiv(tk, tn)
            out.append(Launch(k, base, P, 256, regs, smem, units=tm * d * tk, steps=steps * tn * tm * d / 256,
                              dram_bytes=qkv / 3 + o_bytes, l2_bytes=P * tk * d * 4, reread_bytes=s_bytes,
                              reread_buffer=s_bytes, unit="FMA", note="TMxD output tile, keys in chunks of TN"))
        elif base in ("v3_stats_kernel", "v3_output_kernel"):
            P = cdiv(tq, tm) * bh
            keys = tk * vf
            mult = 1 if base == "v3_stats_kernel" else 2
            out.append(Launch(k, base, P, 256, regs, smem, units=mult * tm * keys * d, steps=mult * keys * d,
                              dram_bytes=qkv * (2 if mult == 2 else 1) / 3 + (o_bytes if mult == 2 else 0),
                              l2_bytes=P * keys * d * 4 * mult, unit="FMA",
                              note="thread per query row (TM of 256 threads active), serial over keys x d"))
        elif base in ("v4_fused_kernel", "v6_partial_kernel"):
            out += _dense_warp_rows(k, row, s, plan, regs, smem, qkv=qkv, o_bytes=o_bytes,
                                    split=base == "v6_partial_kernel")
            if base == "v6_partial_kernel":
                splits = plan["splits"]
                ws = bh * tq * splits * (d + 2) * 4
                out.append(Launch("v6_merge_kernel", "v6_merge_kernel", tq * bh, d, *resources("v6_merge_kernel", d),
                                  units=splits, steps=splits, dram_bytes=ws + o_bytes, unit="split",
                                  note="thread per output dim"))
        elif base == "v5_wmma_kernel":
            out += _dense_wmma(k, row, s, plan, regs, smem, qkv=qkv, o_bytes=o_bytes)
        elif base == "v6_merge_kernel":
            continue  # added with its partial
        elif twin.partial in DENSE_DATAFLOWS:  # a kernel not known by name: its generation's declared dataflow
            out += DENSE_DATAFLOWS[twin.partial](k, row, s, plan, regs, smem, qkv=qkv, o_bytes=o_bytes,
                                                 split=row.split_kv)
        else:
            raise NotImplementedError(
                f"cuda_ref.launches has no launch builder for the kernel {k}: not known by name, and its generation "
                f"declares no dense dataflow layer 2 can price (attn_core.generations twin_dataflow="
                f"{twin.partial or None!r}; known: {', '.join(DENSE_DATAFLOWS)})")
    return out


def _dense_warp_rows(k: str, row: Any, s: Any, plan: Mapping[str, Any], regs: int, smem: int, *, qkv: float,
                     o_bytes: float, split: bool = False) -> list[Launch]:
    """Warp per query row (common/warp_rows.cuh: v4_fused, v6_splitkv's partial): ``tile_m`` rows (warps) per CTA,
    per key a shuffle all-reduce and an online-softmax update; K/V staged as fp32 tiles. ``split``: the row's split
    plan, partials (O, m, l) to the workspace (the merge is its own launch, by name)."""
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    tm = row.tile(d)[0]
    splits, chunk = (plan["splits"], plan["chunk"]) if split else (1, tk)
    P = cdiv(tq, tm) * splits * bh
    keys = max(1.0, min(chunk, tk) * s.vis_frac)
    ws = bh * tq * splits * (d + 2) * 4 if splits > 1 or split else 0
    return [Launch(k, "warp_rows", P, 32 * tm, regs, smem, units=min(tm, tq) * keys, steps=keys,
                   dram_bytes=qkv + (ws if ws else o_bytes), l2_bytes=P * keys * 2 * d * 4,
                   unit="warp x key", note="warp per query row: per key a shuffle all-reduce + update")]


def _dense_wmma(k: str, row: Any, s: Any, plan: Mapping[str, Any], regs: int, smem: int, *, qkv: float,
                o_bytes: float, split: bool = False) -> list[Launch]:
    """WMMA 16x16x16 on a ``tile_m x tile_n`` tile (v5_wmma): ``tile_m / 16`` warps, softmax and the running O in
    shared memory; fp16 operands, fp32 accumulation."""
    if split:
        raise NotImplementedError(f"cuda_ref.launches prices {k} (WMMA) without a split plan only")
    d, bh, tq, tk = s.head_dim, s.bh, s.q_len, s.kv_len
    tm, tn = row.tile(d)
    P = cdiv(tq, tm) * bh
    steps = max(1.0, cdiv(tk, tn) * (s.vis_frac if tq > tm else 1.0))
    return [Launch(k, "v5_wmma_kernel", P, tm // 16 * 32, regs, smem, units=4 * tm * tn * d * steps, steps=steps,
                   dram_bytes=qkv + o_bytes, l2_bytes=P * steps * 2 * tn * d * 2, unit="MMA FLOP",
                   note="WMMA 16x16x16, softmax and running O in shared memory")]


# A dense kernel the builder does not know by name is priced by its generation's declared dataflow
# (attn_core.generations ``twin_dataflow``, a compare.layer2.COSTS key): the dataflows whose launches follow from the
# row's tile alone.
DENSE_DATAFLOWS: dict[str, Callable[..., list[Launch]]] = {"warp_rows": _dense_warp_rows,
                                                           "v5_wmma_kernel": _dense_wmma}


# --------------------------------------------------------------------------------------------------------
# The paged twins (v7_paged, the v8 family) and the MLA twins (v11_mla, v12_mla_tc)
# --------------------------------------------------------------------------------------------------------


def _paged_merge(s: Any, rows: int, dv: int, d_res: int, splits: int, ws: float) -> Launch:
    """The shared paged merge (kernels/v7_paged.cu ``lse_merge``): a max pass over the S split maxima, then a weighted
    pass over (m, l, o); the loads of a pass are independent (unrolled), so the chain is two dependent memory round
    trips = one gather step. DV threads per output row."""
    m_regs, m_smem = resources("paged_merge_kernel", d_res)
    return Launch("paged_merge_kernel", "paged_merge", rows, dv, m_regs, m_smem, units=splits, steps=0.0,
                  gather_steps=1.0, dram_bytes=ws + rows * dv * 4, unit="split",
                  note="thread per output dim: two dependent passes over the splits")


def _paged(twin: Twin, row: Any, s: Any, plan: Mapping[str, Any]) -> list[Launch]:
    """common/paged_warp_rows.cuh, common/ss_tile.cuh, kernels/v8_gqa_tc.cu: grid ``(ceil(G*Tq / rows), S, B*Hkv)``;
    every key tile is first gathered through the block table by the whole CTA, ``TN*D / threads`` strided
    iterations, each a table read then the K/V pool reads it addresses (a serial chain: ordinary loads, then a
    shared-memory store), then computed; then the shared paged merge. ``twin.partial`` names the partial's dataflow:
    ``warp_rows`` (warp per packed row, per key a shuffle all-reduce), ``ss_group`` (v8_gqa_ss: lane per key, D + 32
    dependent lane steps per 32-key group) or ``wmma`` (v8_gqa_tc: one warp, WMMA on a 16-row tile)."""
    d, tk = s.head_dim, s.kv_len
    rows_tile, tn = row.tile(d)
    packed = (s.heads_q // s.heads_kv) * s.q_len
    row_tiles = cdiv(packed, rows_tile)
    splits, chunk = plan["splits"], plan["chunk"]
    P = row_tiles * splits * s.batch * s.heads_kv
    keys = max(1.0, min(chunk, tk) * s.vis_frac)  # the busiest program's keys
    tiles = max(1, math.ceil(keys / tn))
    kname = twin.kernels[0]
    regs, smem = resources(kname, d)
    threads = twin.threads
    gather = tiles * cdiv(tn * d, threads)
    kv = 2 * s.heads_kv * kv_tokens(s) * d * 2  # every sequence's own length (ragged: their sum)
    ws = s.bh * s.q_len * splits * (d + 2) * 4
    dram = kv + s.bh * s.q_len * d * 2 + ws
    l2 = (row_tiles - 1) * kv
    out = cast_launches(s, "host") if row.operand == "fp16" else []
    common = dict(dram_bytes=dram, l2_bytes=l2, gather_steps=gather)
    name = kname.replace("<D>", f"<{d}>")
    if twin.partial == "ss_group":
        groups = tiles * max(1, tn // 32)
        out.append(Launch(name, "v8_gqa_ss_group", P, threads, regs, smem, units=0.0, steps=groups * (d + 32),
                          unit="-", note=f"lane per key: {groups} groups of 32 keys, D + 32 dependent lane steps "
                          f"each; {tiles} gathered {tn}-key tiles", **common))
    elif twin.partial == "wmma":
        out.append(Launch(name, "paged_wmma", P, threads, regs, smem, units=4 * rows_tile * tn * d * tiles,
                          steps=tiles, unit="MMA FLOP",
                          note=f"one warp, WMMA 16x16x16 on a 16-row tile, {tn}-key blocks gathered by 32 lanes",
                          **common))
    elif twin.partial == "warp_rows":
        active = min(rows_tile, packed)
        out.append(Launch(name, "paged_warp_rows", P, threads, regs, smem, units=active * keys, steps=keys,
                          unit="warp x key", note=f"warp per packed row, per key a shuffle all-reduce + update; "
                          f"{tiles} gathered {tn}-key tiles", **common))
    else:
        raise NotImplementedError(f"cuda_ref.launches has no paged partial {twin.partial!r}")
    out.append(_paged_merge(s, s.bh * s.q_len, d, d, splits, ws))
    return out


def _mla(twin: Twin, row: Any, s: Any, plan: Mapping[str, Any]) -> list[Launch]:
    """common/mla.cuh: grid ``(ceil(h_q Tq / rows), S, B)``, the latent tile staged by the whole CTA through the block
    table, then v7's paged merge (DV threads per row). ``twin.partial`` names the partial's dataflow:

    * ``lanes`` (v11_mla: 256 threads, 8 heads, ``v11_mla_group``): lane per key, a DQK-long dot from shared memory,
      then 32 broadcast steps of DV / 32 FMAs each: ``DQK + DV`` dependent lane steps per 32-key tile, and the staging
      of ``TN x DQK / 256`` elements per tile (global loads, coalesced, one table read per key: not the paged twins'
      serial table walk; priced inside the lane-step constant).
    * ``mma`` (v12_mla_tc: 256 threads, 64 heads, mma.sync, 224 registers, ~190 KB dynamic shared memory: 1 CTA per
      SM, ``v12_mla_tc_mma``): a fitted latency per 32-key tile (cp.async ring, mma.sync QK over DQK and PV over DV,
      two shared-memory reductions); an fp8 latent adds an in-shared-memory convert of ``TN x DQK`` elements per
      tile (``Cost.dequant`` per element, on the chain)."""
    dqk, dv = mla_dims(s)
    rows_tile, tn = row.tile(dqk)
    rows = s.heads_q * s.q_len
    row_tiles = cdiv(rows, rows_tile)
    splits, chunk = plan["splits"], plan["chunk"]
    P = row_tiles * splits * s.batch
    keys = max(1.0, min(chunk, s.kv_len) * s.vis_frac)
    tiles = max(1, math.ceil(keys / tn))
    fmt = {"nvfp4": 3, "fp8_e4m3": 2}.get(s.kv_dtype or "", 1 if s.dtype == "bfloat16" else 0)
    tname = "__nv_bfloat16" if s.dtype == "bfloat16" else "__half"
    kname = twin.kernels[0].replace("DQK", str(dqk)).replace("DV", str(dv)).replace("T,", f"{tname},")
    kname = kname.replace("F>", f"{fmt}>")
    regs, smem = resources(kname, dqk)
    latent = kv_tokens(s) * dqk * kv_bytes(s)  # every sequence's own length (ragged: their sum)
    ws = s.batch * rows * splits * (dv + 2) * 4
    common = dict(dram_bytes=latent + s.batch * rows * dqk * 2 + ws, l2_bytes=(row_tiles - 1) * latent)
    out = cast_launches(s, "host") if s.dtype == "float32" else []
    if twin.partial == "lanes":
        out.append(Launch(kname, "v11_mla_group", P, twin.threads, regs, smem, units=0.0, steps=tiles * (dqk + dv),
                          unit="-", note=f"lane per key: {tiles} tiles of {tn} keys, DQK + DV = {dqk + dv} lane "
                          "steps each", **common))
    elif twin.partial == "mma":
        pad = 8  # dynamic shared memory (ptxas reports the static part only): sQ, the latent ring, sP, sRed
        if s.kv_dtype == "fp8_e4m3":
            smem = 64 * (dqk + pad) * 2 + 3 * tn * dqk + tn * (dqk + pad) * 2 + 64 * (tn + pad) * 2 + 4 * 64 * 4
        else:
            smem = 64 * (dqk + pad) * 2 + 3 * tn * (dqk + pad) * 2 + 64 * (tn + pad) * 2 + 4 * 64 * 4
        out.append(Launch(kname, "v12_mla_tc_mma", P, twin.threads, regs, smem, units=0.0, steps=tiles,
                          dequant_elems=tiles * tn * dqk if s.kv_dtype else 0.0, unit="-",
                          note=f"64 heads x {tn}-key tiles, mma.sync m16n8k16, {tiles} per CTA", **common))
    else:
        raise NotImplementedError(f"cuda_ref.launches has no MLA partial {twin.partial!r}")
    out.append(_paged_merge(s, s.batch * rows, dv, dqk, splits, ws))
    return out


# --------------------------------------------------------------------------------------------------------
# A twin's kernels, read off its .cu; what layer 2 needs of a kernel beyond its name
# --------------------------------------------------------------------------------------------------------

KERNELS_DIR = Path(__file__).resolve().parent / "csrc" / "kernels"


@dataclasses.dataclass(frozen=True)
class Partial:
    """A paged or MLA partial kernel whose dataflow is not the default (``warp_rows``, 256 threads): the dataflow
    its builder prices (``_paged`` / ``_mla``) and its threads per CTA."""

    dataflow: str
    threads: int = 256


# keyed by kernel name (the .cu's ``__global__`` function); a paged partial not named here has its generation's
# declared dataflow (attn_core.generations ``twin_dataflow``), else ``warp_rows``
PARTIALS: dict[str, Partial] = {
    "v8_gqa_ss_partial_kernel": Partial("ss_group"),
    "v8_gqa_tc_partial_kernel": Partial("wmma", threads=32),  # ONE warp per CTA (kernels/v8_gqa_tc.cu)
    "v11_mla_partial_kernel": Partial("lanes"),
    "v12_mla_tc_partial_kernel": Partial("mma"),
}

# the builder of each entry's twins; a row of another entry (quantized: v9_fp8, v10_nvfp4) declares no launches
_BUILDERS: dict[str, Callable[[Twin, Any, Any, Mapping[str, Any]], list[Launch]]] = {
    "dense": _dense, "paged": _paged, "mla": _mla}


@dataclasses.dataclass(frozen=True)
class Twin:
    """What one CUDA twin launches: its kernels in order (read off ``csrc/kernels/<id>.cu``, template arguments as
    written there), the builder of its ``Launch`` list (by the row's entry), and its partial's dataflow and threads
    (``PARTIALS``; paged and MLA twins)."""

    kernels: tuple[str, ...]
    build: Callable[[Twin, Any, Any, Mapping[str, Any]], list[Launch]]
    threads: int = 256
    partial: str = ""


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _balanced(text: str, i: int, open_: str, close: str) -> int:
    """The index just past the ``close`` that matches the ``open_`` at ``text[i]``."""
    depth = 0
    for j in range(i, len(text)):
        depth += (text[j] == open_) - (text[j] == close)
        if depth == 0:
            return j + 1
    raise ValueError(f"unbalanced {open_}{close} in a cuda_ref source")


def _targs(text: str) -> str:
    """``<DQK, DV, static_cast<int>(F)>`` -> ``<DQK, DV, F>``: a kernel's template arguments as layer 2 names them."""
    if not text:
        return ""
    args, depth, cur = [], 0, ""
    for ch in text[1:-1]:
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        depth += (ch in "<(") - (ch in ">)")
        cur += ch
    args.append(cur)
    return "<" + ", ".join(re.sub(r"^static_cast<\w+>\((\w+)\)$", r"\1", a.strip()) for a in args) + ">"


@functools.cache
def _sources() -> dict[str, str]:
    return {p.stem: _strip_comments(p.read_text()) for p in sorted(KERNELS_DIR.glob("*.cu"))}


def _body(name: str) -> str | None:
    """The body of the host function ``name`` (``void name(...) { ... }``) in any kernels/*.cu, else None."""
    for text in _sources().values():
        m = re.search(rf"\bvoid\s+{name}\s*\(", text)
        if m:
            start = text.index("{", _balanced(text, m.end() - 1, "(", ")"))
            return text[start:_balanced(text, start, "{", "}")]
    return None


_LAUNCH_TOKEN = re.compile(r"\b(?:auto\s+(\w+)\s*=\s*)?(\w+)\s*(<)?")


def _launched(name: str, seen: tuple[str, ...] = ()) -> list[str]:
    """The kernels host function ``name`` launches, in order: ``kernel<...><<<``, a kernel launched through an
    ``auto k = kernel<...>;`` alias, and those of the ``launch_*`` helpers it calls (recursively)."""
    body = _body(name)
    if body is None or name in seen:
        return []
    out: list[str] = []
    alias: dict[str, str] = {}
    i = 0
    while True:
        m = _LAUNCH_TOKEN.search(body, i)
        if m is None:
            return out
        var, ident = m.group(1), m.group(2)
        end = m.end()
        targs = ""
        if m.group(3) and body.startswith("<<<", m.start(3)):
            end = m.start(3)
        elif m.group(3) and (ident.endswith("_kernel") or ident.startswith("launch_")):
            close = _balanced(body, m.start(3), "<", ">")
            targs, end = body[m.start(3):close], close
        rest = body[end:].lstrip()
        if var and ident.endswith("_kernel"):
            alias[var] = ident + _targs(targs)
        elif rest.startswith("<<<") and (ident.endswith("_kernel") or ident in alias):
            out.append(alias.get(ident) or ident + _targs(targs))
        elif ident.startswith("launch_") and rest.startswith("(") and ident != name:
            out += _launched(ident, (*seen, name))
        i = max(end, m.start() + 1)


@functools.cache
def _twins() -> dict[str, Twin]:
    """Every row of the generation table whose entry has a builder, with the kernels its ``launch_<id>`` runs."""
    out = {}
    for row in table():
        if row.entry not in _BUILDERS:
            continue
        kernels = tuple(dict.fromkeys(_launched(f"launch_{row.id}")))  # a branch per instantiation: one launch
        if not kernels:
            continue
        part = PARTIALS.get(kernels[0].split("<")[0])
        declared = _core.get(row.id).twin_dataflow  # a twin the builders do not know by name says its dataflow
        default = declared or ("warp_rows" if row.entry == "paged" else "")
        out[row.id] = Twin(kernels, _BUILDERS[row.entry], threads=part.threads if part else 256,
                           partial=part.dataflow if part else default)
    return out


def _row(gen: str) -> Any:
    try:
        return by_id(gen)
    except KeyError:
        raise NotImplementedError(f"cuda_ref has no row {gen!r}") from None


def _twin(gen: str) -> Twin:
    _row(gen)
    twins = _twins()
    if gen not in twins:
        raise NotImplementedError(f"layer 2 has no launches for the cuda_ref twin {gen!r}: it declares none "
                                  f"(cuda_ref.launches: no builder for its entry)")
    return twins[gen]


def twins() -> dict[str, Twin]:
    """Generation id -> ``Twin`` for every twin that declares its launches, in table order."""
    return dict(_twins())


def kernels(gen: str) -> tuple[str, ...]:
    """The kernels one call of twin ``gen`` runs, in order (template arguments unfilled)."""
    return _twin(gen).kernels


def reads_kv_dtype(gen: str) -> bool:
    """Whether twin ``gen``'s launches read a quantized storage format (``Shape.kv_dtype``): the MLA twins' latent
    format; False for an unknown id."""
    try:
        return _twin(gen).build is _mla
    except NotImplementedError:
        return False


def plan(gen: str, s: Any, given: Mapping[str, Any] | None = None, *, num_sm: int) -> dict[str, Any]:
    """The plan one call of twin ``gen`` on shape ``s`` runs: ``given`` (a record's plan) completed with what the
    twin would choose where it carries none: the split plan of ``attn_core.splits`` on ``num_sm`` SMs (the plan's own
    ``num_sm`` first, for the paged and MLA twins), the CTA tile, and the kernel names (``launches``)."""
    row = _row(gen)
    twin = _twin(gen)
    from attn_core.splits import choose_splits

    pl = dict(given or {})
    if row.entry == "mla":
        if not (isinstance(pl.get("splits"), int) and pl.get("chunk")):
            sms = pl.get("num_sm") if isinstance(pl.get("num_sm"), int) else num_sm
            sp, ch = choose_splits(bh=s.batch, n_q=s.heads_q * s.q_len, n_k=s.kv_len, num_sm=sms,
                                   rows_per_program=row.tile(s.head_dim)[0])
            pl.update(splits=sp, chunk=ch)
    elif row.entry == "paged":
        if not (pl.get("splits") and pl.get("chunk")):
            sms = pl.get("num_sm") if isinstance(pl.get("num_sm"), int) else num_sm
            sp, ch = choose_splits(bh=s.batch * s.heads_kv, n_q=(s.heads_q // s.heads_kv) * s.q_len,
                                   n_k=s.kv_len, num_sm=sms, rows_per_program=row.tile(s.head_dim)[0])
            pl.update(splits=sp, chunk=ch, num_sm=sms)
        pl.setdefault("tile", list(row.tile(s.head_dim)))
    else:
        if row.split_kv and not pl.get("splits"):
            sp, ch = choose_splits(bh=s.bh, n_q=s.q_len, n_k=s.kv_len, num_sm=num_sm)
            pl.update(splits=sp, chunk=ch, num_sm=num_sm)
        pl.setdefault("tile", list(row.tile(s.head_dim)))
    pl["launches"] = list(twin.kernels)
    return pl


def launches(gen: str, s: Any, plan: Mapping[str, Any]) -> list[Launch]:
    """The launches of one call of twin ``gen`` on shape ``s`` with ``plan`` (as :func:`plan` completes it)."""
    twin = _twin(gen)
    return twin.build(twin, _row(gen), s, plan)
