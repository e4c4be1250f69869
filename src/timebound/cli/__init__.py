"""The ``timebound`` command line, thin over the public API.

Each command lives in its own module exposing ``register(subparsers)``; the module is imported
only when the program starts, and one whose extra is missing says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Modules that contribute sub-commands, in the order they appear in --help.
_COMMAND_MODULES = ("timebound.cli._demo", "timebound.cli._dsl")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timebound",
        description="One deadline model for Python: run demos and Constellation programs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.startswith("timebound"):
                continue  # a command module not present in this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    result: int = handler(args)
    return result


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
