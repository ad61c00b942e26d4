"""cuda_ref's generation table: rendered from ``attn_core.generations`` (each row's ``twin=CudaTwin(...)``) as the
X-macro text ``generations.def`` that the C++ includes, and parsed back from that same text for Python.

Nobody writes ``generations.def`` by hand and no copy is committed: ``cuda_ref.build`` writes it next to each build
(and the tests next to each of their compiles), from :func:`def_text`. The C++ side includes it as an X-macro
(``CUDA_REF_GEN(...)`` rows: ``enum Gen``, the ``GenInfo`` rows the kernels ``static_assert`` their tiles
against, the launcher declarations and the dispatch switch); this module parses the same text with a regex, so
the table is known on any machine, with no build, no torch and no GPU. ``cuda_ref.api`` derives every list, check
and message from it. ``python -m cuda_ref.build`` prints the text.

>>> [g.id for g in table()][:2]
['v1_naive', 'v2_tiled']
>>> by_id("v5_wmma").operand_precision("bfloat16")
'fp16'

The package re-exports ``table`` and ``CudaGeneration``, so the attribute ``cuda_ref.table`` is the
function; this module is reached as ``from cuda_ref.table import parse, by_id`` (or
``importlib.import_module("cuda_ref.table")``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

__all__ = ["DEF_NAME", "COLUMNS", "CudaGeneration", "table", "by_id", "ids", "parse", "render", "def_text"]

DEF_NAME = "generations.def"  # the file name the C++ includes (common/generations.cuh, common/launch.cuh)

# Column order of a CUDA_REF_GEN row; generations.def states it on its "// COLUMNS:" line, which parse()
# checks against this tuple (the C++ macros in common/generations.cuh take the same order).
COLUMNS = ("id", "number", "entry", "operand", "head_dims", "gqa", "materialize_s", "tile_m_d64", "tile_n_d64",
           "tile_m_d128", "tile_n_d128", "workspace", "split_kv", "writes_lse")

# C++ enumerator spellings -> the Python values.
_ENTRIES = {"kDense": "dense", "kPaged": "paged", "kQuantized": "quantized", "kMla": "mla"}
_OPERANDS = {"kF32": "fp32", "kF16": "fp16", "kNative": "native"}
_HEAD_DIMS: dict[str, tuple[int, ...] | None] = {"kHeadDimsAny": None, "kHeadDims64_128": (64, 128)}
_WORKSPACES = {"kWsNone": "none", "kWsScores": "scores", "kWsRowStats": "row_stats",
               "kWsSplitPartials": "split_partials"}
_FLOAT_INPUTS = ("float32", "float16", "bfloat16")
_DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "f32": "float32", "fp16": "float16", "half": "float16",
                  "f16": "float16", "bf16": "bfloat16"}


@dataclasses.dataclass(frozen=True)
class CudaGeneration:
    """One row of ``csrc/generations.def``: what the CUDA twin of a generation is and accepts."""

    id: str  # generation id, as in attn_core.generations ("v4_fused")
    number: int  # the stable integer the binding dispatches on (C++ enum Gen)
    entry: str  # "dense" (cuda_ref.attention) | "paged" (cuda_ref.paged_attention) | "quantized" | "mla"
    operand: str  # what the kernel reads for q, k, v: "fp32" | "fp16" (fp16: host cast inside the call) |
    #               "native" (float16 / bfloat16 as given, no cast; v12_mla_tc's MMA type)
    head_dims: tuple[int, ...] | None  # supported head dims; None = any
    gqa: bool  # H_q may be a multiple of H_kv (False: MHA only)
    materializes_s: bool  # the score matrix S round-trips through HBM
    tile_d64: tuple[int, int]  # CTA tile (query rows, keys) at D = 64; (1, 1) = untiled
    tile_d128: tuple[int, int]  # CTA tile at D = 128
    workspace: str  # HBM scratch: "none" | "scores" | "row_stats" | "split_partials"
    split_kv: bool  # takes a split plan (choose_splits) and the num_sm knob
    writes_lse: bool  # the kernel writes the row log-sum-exp (return_lse=True)

    def operand_precision(self, input_dtype: Any) -> str:
        """The precision the kernel computes on for inputs of ``input_dtype``: ``"fp32"`` or ``"fp16"``.

        ``input_dtype``: a torch/numpy dtype or a name (``"bfloat16"``, ``"fp16"``). fp16-operand rows cast
        float32/float16/bfloat16 to fp16 (so ``"fp16"`` for all three); fp32-operand rows take float32 only
        and raise NotImplementedError otherwise; native rows compute at float16 / bfloat16 as given
        (``"fp16"`` / ``"bf16"``) and refuse float32. A non-float dtype is a ValueError.
        """
        name = dtype_name(input_dtype)
        if name not in _FLOAT_INPUTS:
            raise ValueError(f"input dtype must be one of {', '.join(_FLOAT_INPUTS)}; got {name}")
        if self.operand == "fp16":
            return "fp16"
        if self.operand == "native":
            if name == "float32":
                raise NotImplementedError(f"{self.id} takes float16 or bfloat16 (its MMA type); got float32")
            return "fp16" if name == "float16" else "bf16"
        if name != "float32":
            raise NotImplementedError(f"{self.id} takes float32 only (as the reference); got {name}")
        return "fp32"

    def supports_head_dim(self, d: int) -> bool:
        return self.head_dims is None or d in self.head_dims

    def tile(self, head_dim: int) -> tuple[int, int]:
        """The (query rows, keys) CTA tile at ``head_dim`` (the D = 64 tile up to 64, else the D = 128 one)."""
        return self.tile_d64 if head_dim <= 64 else self.tile_d128


def dtype_name(dtype: Any) -> str:
    """``torch.float16`` / ``np.float16`` / ``"half"`` -> ``"float16"`` (no torch or numpy import needed)."""
    if isinstance(dtype, str):
        s = dtype
    else:
        s = str(dtype)
        if s.startswith("torch."):
            s = s.removeprefix("torch.")
        elif hasattr(dtype, "name") and isinstance(dtype.name, str):  # numpy dtype
            s = dtype.name
        elif isinstance(dtype, type):  # numpy scalar type / ml_dtypes: np.float16 -> "float16"
            s = dtype.__name__
    s = s.strip().lower()
    return _DTYPE_ALIASES.get(s, s)


_COLUMNS_LINE = re.compile(r"^\s*//\s*COLUMNS:\s*(.+?)\s*$", re.M)
_ROW = re.compile(r"\bCUDA_REF_GEN\s*\(([^()]*)\)")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def parse(text: str, *, source: str = "generations.def") -> tuple[CudaGeneration, ...]:
    """Rows of a generations.def text. Raises ValueError naming the row on anything malformed."""
    m = _COLUMNS_LINE.search(text)
    if m is None or tuple(m.group(1).split()) != COLUMNS:
        found = m.group(1).split() if m else None
        raise ValueError(f"{source}: the '// COLUMNS:' line must list {' '.join(COLUMNS)}; got {found}")
    rows: list[CudaGeneration] = []
    for match in _ROW.finditer(_strip_comments(text)):
        cells = [c.strip() for c in match.group(1).split(",")]
        where = f"{source}: row CUDA_REF_GEN({match.group(1).strip()})"
        if len(cells) != len(COLUMNS):
            raise ValueError(f"{where} has {len(cells)} columns, expected {len(COLUMNS)}")
        c = dict(zip(COLUMNS, cells))
        rows.append(CudaGeneration(
            id=_ident(c["id"], where),
            number=_int(c["number"], "number", where),
            entry=_enum(_ENTRIES, c["entry"], "entry", where),
            operand=_enum(_OPERANDS, c["operand"], "operand", where),
            head_dims=_enum(_HEAD_DIMS, c["head_dims"], "head_dims", where),
            gqa=_flag(c["gqa"], "gqa", where),
            materializes_s=_flag(c["materialize_s"], "materialize_s", where),
            tile_d64=(_int(c["tile_m_d64"], "tile_m_d64", where), _int(c["tile_n_d64"], "tile_n_d64", where)),
            tile_d128=(_int(c["tile_m_d128"], "tile_m_d128", where), _int(c["tile_n_d128"], "tile_n_d128", where)),
            workspace=_enum(_WORKSPACES, c["workspace"], "workspace", where),
            split_kv=_flag(c["split_kv"], "split_kv", where),
            writes_lse=_flag(c["writes_lse"], "writes_lse", where),
        ))
    if not rows:
        raise ValueError(f"{source}: no CUDA_REF_GEN row")
    for attr in ("id", "number"):
        vals = [getattr(r, attr) for r in rows]
        dup = sorted({str(v) for v in vals if vals.count(v) > 1})
        if dup:
            raise ValueError(f"{source}: duplicate {attr}: {', '.join(dup)}")
    numbers = [r.number for r in rows]
    if numbers != sorted(numbers):
        raise ValueError(f"{source}: numbers must ascend in row order; got {numbers}")
    return tuple(rows)


def _ident(s: str, where: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", s):
        raise ValueError(f"{where}: id must be a lower-case identifier; got {s!r}")
    return s


def _int(s: str, col: str, where: str) -> int:
    if not re.fullmatch(r"\d+", s) or int(s) < 1:
        raise ValueError(f"{where}: {col} must be a positive integer; got {s!r}")
    return int(s)


def _flag(s: str, col: str, where: str) -> bool:
    if s not in ("0", "1"):
        raise ValueError(f"{where}: {col} must be 0 or 1; got {s!r}")
    return s == "1"


def _enum(values: dict, s: str, col: str, where: str):
    if s not in values:
        raise ValueError(f"{where}: {col} must be one of {', '.join(values)}; got {s!r}")
    return values[s]


_HEADER = """\
// cuda_ref's generation table: ONE row per generation with a CUDA twin, in attn_core's order.
// GENERATED from attn_core/generations.py (each row's twin=CudaTwin(...)) by cuda_ref/table.py; do not edit.
//
// An X-macro file: the includer defines CUDA_REF_GEN(...) and includes this file; the file #undefs it at
// the end. C++ derives from it the Gen enum, the GenInfo table (names, operand cast, head-dim / GQA / LSE
// checks, workspace kind), the launcher declarations and the dispatch switch (common/generations.cuh,
// common/launch.cuh, binding.cpp). Python parses the same text (cuda_ref.table()).
//
// Columns, in order (the parser checks this line against its own list):
// COLUMNS: {columns}
//
//   id             the generation id (attn_core.generations), also the enumerator Gen::<id> and launch_<id>
//   number         the stable integer Python passes to the binding (CudaTwin.number; never reused or renumbered)
//   entry          kDense (cuda_ref.attention) | kPaged (cuda_ref.paged_attention) | kQuantized
//                  (cuda_ref.paged_attention given cuda_ref.quant pools; binding forward_paged_quant: the K/V
//                  pools are the format's bytes, never cast) | kMla (cuda_ref.mla_attention; binding
//                  forward_mla: one latent pool serving K and V)
//   operand        kF32 (float32 inputs only) | kF16 (float32/float16/bfloat16 cast to fp16 on the host inside
//                  the call; bf16 is therefore rounded to fp16) | kNative (float16 or bfloat16 as given)
//   head_dims      kHeadDimsAny | kHeadDims64_128 (MLA rows: any, the (DQK, DV) templates are checked by the
//                  MLA entry itself)
//   gqa            1: H_q may be a multiple of H_kv; 0: MHA only (H_q == H_kv)
//   materialize_s  1: the score matrix S makes a round trip through HBM (the roofline's materialized model)
//   tile_m_d64 ... the CTA tile (query rows x keys) at D = 64 and D = 128; 1 x 1 = no tiling; for the GQA rows
//                  the rows are packed rows (G query heads x N_q), for the MLA rows (heads per CTA, keys per
//                  tile) at every DV. Each kernel static_asserts its own constants against these columns.
//                  Split-KV rows: the split heuristic counts ceil(G * N_q / tile_m) row tiles per (b, h_kv)
//                  (common/split_plan.cuh, split_plan_for).
//   workspace      HBM scratch the binding allocates: kWsNone | kWsScores (S [BH, Nq, Nk]) |
//                  kWsRowStats (M, L [BH, Nq]) | kWsSplitPartials (O, m, l partials [BH, Nq, S, D+2])
//   split_kv       1: takes a split plan (choose_splits, split_plan.cuh) and the num_sm knob
//   writes_lse     1: the kernel writes the row log-sum-exp when AttnParams::lse is set (return_lse=True)
//
// id           num entry   operand head_dims        gqa mat  m64 n64 m128 n128 workspace         split lse
"""


def _spelling(values: dict, value: Any, col: str, gen_id: str) -> str:
    for spelling, v in values.items():
        if v == value:
            return spelling
    raise ValueError(f"{gen_id}: the C++ table has no {col} {value!r} (one of {list(values.values())})")


def _render_row(gen_id: str, tw: Any) -> str:
    """One ``CUDA_REF_GEN(...)`` line, laid out as the hand-aligned table was: id and number in 13 columns, entry,
    operand and head_dims from columns 15, 23 and 31 of the argument list (one space at least after an overflow),
    gqa from column 49, then the fixed-width numeric tail."""
    cells = [_spelling(_ENTRIES, tw.entry, "entry", gen_id) + ",", _spelling(_OPERANDS, tw.operand, "operand", gen_id)
             + ",", _spelling(_HEAD_DIMS, tw.head_dims, "head_dims", gen_id) + ","]
    num = str(tw.number)
    line = f"{gen_id + ',':<{13 - len(num)}}{num}, "
    for col, cell in zip((15, 23, 31, 49), [*cells, ""]):
        line = f"{line:<{col}}" if len(line) < col else line + " " * (not line.endswith(" "))
        line += cell
    (m64, n64), (m128, n128) = tw.tile_d64, tw.tile_d128
    ws = _spelling(_WORKSPACES, tw.workspace, "workspace", gen_id)
    line += (f"{int(tw.gqa)},{int(tw.materializes_s):>3},{m64:>4},{n64:>3},{m128:>3},{n128:>4},  {ws + ',':<18}"
             f"{int(tw.split_kv)},{int(tw.writes_lse):>3}")
    return f"CUDA_REF_GEN({line})"


def render(generations: Any = None) -> str:
    """The ``generations.def`` text of ``generations`` (default: ``attn_core.generations.GENERATIONS``): the
    header, one row per generation with a twin (``twin=CudaTwin(...)``) in table order, and the ``#undef``."""
    if generations is None:
        from attn_core import generations as _core

        generations = _core.GENERATIONS
    rows = [_render_row(g.id, g.twin) for g in generations if g.twin is not None]
    return _HEADER.format(columns=" ".join(COLUMNS)) + "\n".join(rows) + "\n\n#undef CUDA_REF_GEN\n"


def def_text() -> str:
    """The ``generations.def`` the C++ includes: :func:`render` of attn_core's table."""
    return render()


@functools.cache
def table() -> tuple[CudaGeneration, ...]:
    """Every generation cuda_ref builds, in attn_core's (= the reference's) order: :func:`parse` of :func:`def_text`,
    the same text the C++ includes."""
    return parse(def_text(), source=f"{DEF_NAME} (rendered from attn_core.generations)")


def ids(entry: str | None = None) -> tuple[str, ...]:
    """Ids of the built generations (of one entry, if given), in order."""
    return tuple(g.id for g in table() if entry is None or g.entry == entry)


def by_id(gen_id: str) -> CudaGeneration:
    """The row of a built generation; KeyError if cuda_ref builds none of that id."""
    for g in table():
        if g.id == gen_id:
            return g
    raise KeyError(gen_id)
