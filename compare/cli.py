"""Command line: ``python -m compare {predict,run,report}`` (console script ``pallas-attn-compare``).

``main`` is compare's entry point, so it owns the process-wide settings a library must not make at import:
``XLA_PYTHON_CLIENT_PREALLOCATE=false`` before JAX is imported (torch and JAX share the GPU; preallocation
would give JAX most of its memory), and the filter for the Triton lowering's deprecation warning
(``pallas_attn._compat.silence_triton_deprecation``), which the library no longer installs itself.
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from . import predict, report, runner

    parser = argparse.ArgumentParser(prog="python -m compare", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    predict.add_parser(sub)
    runner.add_parser(sub)
    report.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before the first import of jax
    from pallas_attn import _compat

    _compat.silence_triton_deprecation()
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
