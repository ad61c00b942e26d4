"""Command line: ``python -m compare {predict,run,report}`` (console script ``pallas-attn-compare``)."""

from __future__ import annotations

import argparse
import sys

from . import predict

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m compare", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    predict.add_parser(sub)
    # --- run / report subcommands register here (compare/runner.py, compare/report.py) ---
    _register_optional(sub)
    return parser


def _register_optional(sub: argparse._SubParsersAction) -> None:
    """``run`` and ``report`` live in their own modules; each exposes ``add_parser(sub)``."""
    import importlib

    for name in ("runner", "report"):
        try:
            mod = importlib.import_module(f"compare.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"compare.{name}":
                raise
            continue
        mod.add_parser(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
