"""The ``timebound`` command line, thin over the public API.

Each command lives in its own module exposing ``register(subparsers)``; the module is imported
only when the program starts, and one whose extra is missing says which extra to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]

# Modules that contribute sub-commands, in the order they appear in --help, with the commands
# they provide and the extra their dependencies come from.
_COMMAND_MODULES: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    ("timebound.cli._demo", ("demo",), None),
    ("timebound.cli._dsl", ("run", "check"), "dsl"),
)


def _missing_extra(command: str, extra: str, missing: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        print(
            f"timebound {command}: needs the '{extra}' extra ({missing} is not installed); "
            f"install it with: pip install 'timebound[{extra}]'",
            file=sys.stderr,
        )
        return 2

    return handler


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="timebound",
        description="One deadline model for Python: run demos and Constellation programs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, commands, extra in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.startswith("timebound") or extra is None:
                raise
            for command in commands:
                stub = sub.add_parser(command, help=f"(needs timebound[{extra}])")
                stub.add_argument("rest", nargs=argparse.REMAINDER)
                stub.set_defaults(handler=_missing_extra(command, extra, exc.name))
            continue
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
