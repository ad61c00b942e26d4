"""cuda_ref's generation table, read from the same file the C++ is generated from: ``csrc/generations.def``.

The C++ side includes that file as an X-macro (``CUDA_REF_GEN(...)`` rows); this module parses it with a
regex, so the table is known on any machine, with no build, no torch and no GPU. ``cuda_ref.api`` derives
every list, check and message from it. Nothing else in cuda_ref lists the generations.

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
from pathlib import Path
from typing import Any

__all__ = ["DEF_FILE", "COLUMNS", "CudaGeneration", "table", "by_id", "ids", "parse"]

DEF_FILE = Path(__file__).resolve().parent / "csrc" / "generations.def"

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


@functools.cache
def table() -> tuple[CudaGeneration, ...]:
    """Every generation cuda_ref builds, in generations.def (= reference) order."""
    return parse(DEF_FILE.read_text(), source=str(DEF_FILE))


def ids(entry: str | None = None) -> tuple[str, ...]:
    """Ids of the built generations (of one entry, if given), in order."""
    return tuple(g.id for g in table() if entry is None or g.entry == entry)


def by_id(gen_id: str) -> CudaGeneration:
    """The row of a built generation; KeyError if cuda_ref builds none of that id."""
    for g in table():
        if g.id == gen_id:
            return g
    raise KeyError(gen_id)
