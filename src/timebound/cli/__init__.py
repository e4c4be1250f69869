"""The ``timebound`` command line, thin over the public API.

Each command lives in its own module exposing ``register(subparsers)``. Only the module of the
command being run is imported: ``timebound --help`` and ``timebound --version`` import none,
and a command whose extra is missing says which extra to install.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__

# typing.TYPE_CHECKING without importing typing: `timebound --help` should cost little more than
# starting Python (mypy treats any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
del TYPE_CHECKING

__all__ = ["main"]


class _Command:
    """A command: its module defines ``register(subparsers)``, which adds it (and maybe
    others); ``extra`` names the extra whose packages that module imports."""

    __slots__ = ("extra", "help", "module", "name")

    def __init__(self, name: str, module: str, help: str, extra: str | None = None) -> None:
        self.name, self.module, self.help, self.extra = name, module, help, extra


# One line per command, in --help order.
_COMMANDS: tuple[_Command, ...] = (
    _Command("demo", "timebound.cli._demo", "nested deadlines, a retry and a fallback, live"),
    _Command("run", "timebound.cli._dsl", "run a Constellation program", "dsl"),
    _Command(
        "check",
        "timebound.cli._check",
        "check the worst-case time of programs, policies, plans and workflows",
    ),
    _Command(
        "pipeline", "timebound.cli._pipeline", "compile, validate and run pipelines", "pipeline"
    ),
    _Command(
        "workflow", "timebound.cli._workflow", "validate and run durable workflows", "workflow"
    ),
    _Command("worker", "timebound.cli._workflow", "work on a workflow store's runs", "workflow"),
    _Command("serve", "timebound.cli._host", "serve workflows: HTTP API, operator UI", "host"),
    _Command(
        "runs", "timebound.cli._runs", "a host's runs: list, show, start, cancel, events", "host"
    ),
    _Command(
        "ops",
        "timebound.cli._ops",
        "a host's deferred operations: list, show, poll, cancel",
        "host",
    ),
)

# Options whose value may start with "-" (a negative duration is a mistake worth a clear error,
# not argparse's "expected one argument").
_VALUE_OPTIONS = ("--timeout", "--budget")

# 128 + SIGPIPE, what a shell reports for a program cut off by `| head`.
_BROKEN_PIPE = 141
# 128 + SIGINT.
_INTERRUPTED = 130


def _missing_extra(command: str, extra: str, missing: str) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        print(
            f"timebound {command}: needs the '{extra}' extra ({missing} is not installed); "
            f"install it with: pip install 'timebound[{extra}]'",
            file=sys.stderr,
        )
        return 2

    return handler


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named on the command line, if any (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


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
            prog, indent_increment, max_help_position, _columns() - 2 if width is None else width
        )


def _columns() -> int:
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns if columns > 0 else 80


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser; only the module of the command named in ``argv`` is imported."""
    parser = argparse.ArgumentParser(
        prog="timebound",
        description="One deadline model for Python: run demos and Constellation programs.",
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"timebound {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((c for c in _COMMANDS if c.name == _chosen(argv)), None)
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
    for command in _COMMANDS:
        if command.name not in registered:
            # Listed for --help; never parsed, because a named command is registered above.
            sub.add_parser(command.name, help=command.help, formatter_class=_Formatter)
    return parser


def _join_values(argv: Sequence[str]) -> list[str]:
    """``--timeout -1s`` as ``--timeout=-1s``, so the value reaches the command's own check."""
    out: list[str] = []
    it = iter(argv)
    for word in it:
        if word in _VALUE_OPTIONS:
            value = next(it, None)
            out.append(word if value is None else f"{word}={value}")
        else:
            out.append(word)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    words = _join_values(sys.argv[1:] if argv is None else argv)
    try:
        try:
            parser = build_parser(words)
            args = parser.parse_args(words)
            handler = getattr(args, "handler", None)
            if handler is None:
                parser.print_help()
                return 2
            result: int = handler(args)
            return result
        finally:
            # A closed pipe shows here (also after --help, which exits through SystemExit),
            # not at interpreter exit where it would print a traceback.
            sys.stdout.flush()
    except KeyboardInterrupt:
        # Ctrl-C: one line, the shell's exit code for SIGINT, never a traceback (D8.17). The
        # command's own cleanup (an engine's close, a scope's exit) has run on the way out.
        command = _chosen(words) or "timebound"
        print(f"timebound {command}: interrupted", file=sys.stderr)
        return _INTERRUPTED
    except BrokenPipeError:
        # The reader (`| head`) went away: stop quietly. Point stdout at devnull so the
        # interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _BROKEN_PIPE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
