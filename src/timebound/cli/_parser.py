"""The command line's argparse parser, imported only when a command is parsed: ``timebound``,
``--help`` and ``--version`` are answered without argparse (D15.7)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from . import _chosen, _Command, columns


def _missing_extra(command: str, extra: str, missing: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        print(
            f"timebound {command}: needs the '{extra}' extra ({missing} is not installed); "
            f"install it with: pip install 'timebound[{extra}]'",
            file=sys.stderr,
        )
        return 2

    return handler


class _Formatter(argparse.HelpFormatter):
    """argparse's help formatter, sized without ``shutil``.

    argparse asks ``shutil.get_terminal_size()`` for the width whenever it builds a formatter
    (``add_argument`` does, to check a metavar), and ``shutil`` imports ``bz2``, ``lzma`` and
    ``fnmatch``: a third of what ``timebound --help`` cost beyond starting Python
    (bench/startup.py). Same rule as ``shutil``: ``$COLUMNS``, else stdout's terminal, else 80.
    """

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        super().__init__(
            prog, indent_increment, max_help_position, columns() - 2 if width is None else width
        )


def build_parser(commands: Sequence[_Command], argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of ``commands``; only the module of the command named in ``argv`` is
    imported."""
    parser = argparse.ArgumentParser(
        prog="timebound",
        description="One deadline model for Python: run demos and Constellation programs.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"timebound {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((c for c in commands if c.name == _chosen(argv)), None)
    registered: set[str] = set()
    if chosen is not None:
        from importlib import import_module

        try:
            module = import_module(chosen.module)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.startswith("timebound") or chosen.extra is None:
                raise
            stub = sub.add_parser(chosen.name, help=chosen.help)
            stub.add_argument("rest", nargs=argparse.REMAINDER)
            stub.set_defaults(handler=_missing_extra(chosen.name, chosen.extra, exc.name))
            registered.add(chosen.name)
        else:
            before = set(sub.choices)
            module.register(sub)
            registered |= set(sub.choices) - before
    for command in commands:
        if command.name not in registered:
            # Listed for --help; never parsed, because a named command is registered above.
            sub.add_parser(command.name, help=command.help, formatter_class=_Formatter)
    return parser
