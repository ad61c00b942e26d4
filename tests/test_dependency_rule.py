"""The dependency rule (docs/architecture.md, issue 26 item 4), read statically from the source with ``ast``.

* A block (the shared pieces under ``pallas_attn/kernels`` that kernels are written from) never imports a kernel (a
  module with ``KERNEL = ...`` at top level), directly or through other modules of ``pallas_attn``, and at module
  level or inside a function alike.
* Nothing in ``pallas_attn`` imports ``compare`` or ``cuda_ref`` (they sit above it).
* ``attn_core`` imports numpy and the standard library only (both twins stand on it).

The checks are pure functions of source text, so the tests at the bottom also show each one failing on a
synthetic tree that breaks the rule (the function-local ``from .fa_decode import validate_block_table`` that
``mla_common`` carried before the move to ``kv_source`` among them).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNELS_DIR = ROOT / "pallas_attn" / "kernels"

# The blocks docs/architecture.md lists under pallas_attn/kernels, plus the shared modules it does not list one by one.
DOC_BLOCKS = {"contract", "softmax", "splitkv", "kv_source", "gqa", "seqlen", "planner", "launches"}
BLOCKS = DOC_BLOCKS | {"common", "mla_common"}


# --------------------------------------------------------------------------------------------------------
# reading a tree
# --------------------------------------------------------------------------------------------------------


def _modules(root: Path, package: str) -> dict[str, tuple[str, bool]]:
    """``{dotted name: (source, is_package)}`` for every ``.py`` file under ``root / package``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path.read_text(), is_pkg)
    return out


def _imported(name: str, source: str, is_pkg: bool) -> set[str]:
    """Every dotted name an ``import`` / ``from ... import`` anywhere in ``source`` may bind (relative ones resolved
    against the module ``name``): for ``from p import x`` both ``p`` and ``p.x``; ``importlib.import_module`` and
    ``__import__`` with a literal name count too."""
    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names if a.name != "*")
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name) and node.func.id == "__import__"))):
            found.add(node.args[0].value)
    return found


def _is_kernel(source: str) -> bool:
    """A kernel module assigns ``KERNEL`` at top level."""
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "KERNEL" for t in targets):
            return True
    return False


def block_violations(mods: dict[str, tuple[str, bool]], blocks: set[str],
                     kernels_pkg: str = "pallas_attn.kernels") -> list[str]:
    """``"block -> ... -> kernel"`` for every block that reaches a kernel through imports of modules in ``mods``.

    Edges go to modules only (``from . import x`` reaches ``x``, not the package ``__init__``, which Python runs as a
    parent either way); the chain may pass through any module of ``mods``."""
    kernels = {m for m, (src, _) in mods.items() if m.startswith(kernels_pkg + ".") and _is_kernel(src)}
    edges = {}
    for m, (src, is_pkg) in mods.items():
        names = _imported(m, src, is_pkg)
        # a package counts only when nothing under it was named (``import p`` or ``from p import a_function``)
        edges[m] = {n for n in names if n in mods and n != m
                    and not (mods[n][1] and any(x.startswith(n + ".") and x in mods for x in names))}
    bad = []
    for b in sorted(blocks):
        start = f"{kernels_pkg}.{b}"
        seen, stack = {start: [start]}, [start]
        while stack:
            cur = stack.pop()
            for nxt in sorted(edges.get(cur, ())):
                if nxt in seen:
                    continue
                seen[nxt] = seen[cur] + [nxt]
                if nxt in kernels:
                    bad.append(" -> ".join(seen[nxt]))
                else:
                    stack.append(nxt)
    return bad


def forbidden_imports(mods: dict[str, tuple[str, bool]], forbidden: set[str]) -> list[str]:
    """``"module imports name"`` for every import whose top-level package is in ``forbidden``."""
    return [f"{m} imports {n}" for m, (src, is_pkg) in sorted(mods.items())
            for n in sorted(_imported(m, src, is_pkg)) if n.split(".")[0] in forbidden]


def attn_core_violations(mods: dict[str, tuple[str, bool]]) -> list[str]:
    """``"module imports name"`` for every import in attn_core that is not numpy, the stdlib or attn_core."""
    allowed = set(sys.stdlib_module_names) | {"__future__", "numpy", "attn_core"}
    return [f"{m} imports {n}" for m, (src, is_pkg) in sorted(mods.items())
            for n in sorted(_imported(m, src, is_pkg)) if n.split(".")[0] not in allowed]


# --------------------------------------------------------------------------------------------------------
# the rule on this tree
# --------------------------------------------------------------------------------------------------------


def test_the_blocks_are_the_documented_ones():
    """The ``kernels/<name>.py`` rows of docs/architecture.md's tree are DOC_BLOCKS; every block exists, no kernel."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"^\s+kernels/([a-z_0-9]+)\.py\s", doc, flags=re.M))
    assert named == DOC_BLOCKS, f"docs/architecture.md names {sorted(named)}; this test knows {sorted(DOC_BLOCKS)}"
    for b in BLOCKS:
        path = KERNELS_DIR / f"{b}.py"
        assert path.is_file(), path
        assert not _is_kernel(path.read_text()), f"{b} declares KERNEL: it is a kernel, not a block"


def test_blocks_never_import_kernels():
    mods = _modules(ROOT, "pallas_attn")
    kernels = [m for m, (s, _) in mods.items() if _is_kernel(s)]
    assert len(kernels) >= 17, kernels  # the check sees the kernels (a broken _is_kernel would pass vacuously)
    assert block_violations(mods, BLOCKS) == []


def test_pallas_attn_never_imports_compare_or_cuda_ref():
    assert forbidden_imports(_modules(ROOT, "pallas_attn"), {"compare", "cuda_ref"}) == []


def test_attn_core_imports_only_numpy_and_the_stdlib():
    mods = _modules(ROOT, "attn_core")
    assert "attn_core.oracle" in mods
    assert attn_core_violations(mods) == []


# --------------------------------------------------------------------------------------------------------
# each check fails where the rule is broken (synthetic trees)
# --------------------------------------------------------------------------------------------------------

_KERNEL_SRC = "from .contract import Kernel\n\ndef validate_block_table(*a, **k):\n    pass\n\nKERNEL = Kernel()\n"
_CONTRACT_SRC = "class Kernel:\n    pass\n"


def _tree(**blocks: str) -> dict[str, tuple[str, bool]]:
    mods = {"pallas_attn": ("", True), "pallas_attn.kernels": ("", True),
            "pallas_attn.kernels.contract": (_CONTRACT_SRC, False),
            "pallas_attn.kernels.fa_decode": (_KERNEL_SRC, False)}
    mods.update({f"pallas_attn.kernels.{n}": (s, False) for n, s in blocks.items()})
    return mods


def test_detects_a_function_local_kernel_import():
    """mla_common before the move: a lazy ``from .fa_decode import validate_block_table`` inside a function."""
    old = ("import numpy as np\n\n"
           "def validate_table_eagerly(block_table, kv_lens, *, num_pages, page):\n"
           "    from .fa_decode import validate_block_table\n\n"
           "    validate_block_table(np.asarray(block_table), kv_lens, num_pages=num_pages, page_size=page)\n")
    assert block_violations(_tree(mla_common=old), {"mla_common", "contract"}) == [
        "pallas_attn.kernels.mla_common -> pallas_attn.kernels.fa_decode"]


def test_detects_every_import_form_and_a_chain():
    forms = ["from . import fa_decode\n", "from . import fa_decode as d\n", "from .fa_decode import KERNEL\n",
             "import pallas_attn.kernels.fa_decode\n", "from pallas_attn.kernels import fa_decode\n",
             "from ..kernels.fa_decode import KERNEL\n",
             "import importlib\nm = importlib.import_module('pallas_attn.kernels.fa_decode')\n"]
    for src in forms:
        assert block_violations(_tree(softmax=src), {"softmax"}) != [], src
    # through another block: softmax -> splitkv -> fa_decode
    chain = _tree(softmax="from . import splitkv\n", splitkv="from .fa_decode import KERNEL\n")
    assert block_violations(chain, {"softmax"}) == [
        "pallas_attn.kernels.softmax -> pallas_attn.kernels.splitkv -> pallas_attn.kernels.fa_decode"]
    # what is allowed: blocks importing blocks, and the package itself
    ok = _tree(softmax="from . import contract\nfrom .contract import Kernel\nimport pallas_attn\n")
    assert block_violations(ok, {"softmax", "contract"}) == []


def test_detects_compare_cuda_ref_and_a_non_numpy_attn_core():
    pa = {"pallas_attn.api": ("def f():\n    from compare import runner\n", False),
          "pallas_attn.mla": ("import cuda_ref.api as c\n", False),
          "pallas_attn.quant": ("import numpy\nfrom . import _compat\n", False)}
    assert forbidden_imports(pa, {"compare", "cuda_ref"}) == [
        "pallas_attn.api imports compare", "pallas_attn.api imports compare.runner",
        "pallas_attn.mla imports cuda_ref.api"]
    core = {"attn_core": ("from . import oracle\n", True),
            "attn_core.oracle": ("from __future__ import annotations\nimport math\nimport numpy as np\n", False),
            "attn_core.paging": ("import jax.numpy as jnp\n", False),
            "attn_core.splits": ("def f():\n    import torch\n", False)}
    assert attn_core_violations(core) == ["attn_core.paging imports jax.numpy", "attn_core.splits imports torch"]
