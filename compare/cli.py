"""Command line: ``python -m compare {predict,run,tune,report}`` (console script ``pallas-attn-compare``).

``main`` is compare's entry point, so it owns the process-wide settings a library must not make at import:
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` before JAX is imported (torch and JAX share the GPU; preallocation
would give JAX most of its memory), and the filter for the Triton lowering's deprecation warning
(``pallas_attn._compat.silence_triton_deprecation``), which the library no longer installs itself.

A mistake in what was asked (unknown config or arch, bad TOML or config value, a filter that matches nothing,
an existing records file, an unwritable ``--out``) is a ``workloads.UsageError`` raised while the arguments
are resolved, before anything runs: one line on stderr, exit code 2, no traceback. Nothing else is caught
here (a kernel's failure is already a record; a bug in compare itself keeps its traceback).
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from . import predict, report, runner, tune

    parser = argparse.ArgumentParser(prog=f"python -m {__package__ or 'compare'}", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    predict.add_parser(sub)
    runner.add_parser(sub)
    tune.add_parser(sub)
    report.add_parser(sub)
    return parser


def missing_harness() -> list[str]:
    """The harness extra's packages (pyproject ``harness``) that are not importable here."""
    import importlib.util

    return [m for m in ("rich", "matplotlib") if importlib.util.find_spec(m) is None]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before the first import of jax
    from pallas_attn import _compat

    _compat.silence_triton_deprecation()
    from .workloads import UsageError

    parser = build_parser()
    args = parser.parse_args(argv)
    missing = missing_harness()
    if missing:
        print(f"{parser.prog}: the harness needs {', '.join(missing)}, not installed here: pip install "
              f"'pallas-attn[harness]' (or, from a checkout, pip install '.[harness]')", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except UsageError as e:  # what the user asked for is wrong (flag, file, config): one line, exit 2
        msg = " ".join(str(e).split())
        print(f"{parser.prog} {args.command}: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
