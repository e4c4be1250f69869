"""The ``timebound`` command line, thin over the public API.

Each command lives in its own module exposing ``register(subparsers)``. Only the module of the
command being run is imported: ``timebound --help`` and ``timebound --version`` import none,
and a command whose extra is missing says which extra to install.
"""

from __future__ import annotations

import os
import sys

from .. import __version__

# typing.TYPE_CHECKING without importing typing: `timebound --help` should cost little more than
# starting Python (mypy treats any name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
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


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named on the command line, if any (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def columns() -> int:
    """The help's width by shutil's rule: ``$COLUMNS``, else stdout's terminal, else 80."""
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
    from ._parser import build_parser as build

    return build(_COMMANDS, argv)


def _top_level_help(columns: int) -> str | None:
    """``timebound --help`` as argparse prints it, without importing argparse (D15.7).

    argparse's import and formatter are half of what the help costs beyond starting Python;
    the top-level help is one usage line, the description and two lists, so it is laid out
    here by argparse's own rules (help column, wrapping with ``textwrap``), and a test compares
    it with argparse's output at every width. ``None`` (argparse formats it) when the usage line
    would wrap, a layout not reproduced here.
    """
    width = columns - 2
    usage = "usage: timebound [-h] [--version] COMMAND ..."
    if len(usage) > width:
        return None
    items = [(2, "COMMAND", "")]
    items += [(4, c.name, c.help) for c in _COMMANDS]
    options = [(2, "-h, --help", "show this help message and exit")]
    options.append((2, "--version", "show program's version number and exit"))
    longest = max(indent + len(name) for indent, name, _ in items + options)
    position = min(longest + 2, min(24, max(width - 20, 4)))
    help_width = max(width - position, 11)

    def entry(indent: int, name: str, text: str) -> str:
        if not text:
            return f"{'':{indent}}{name}\n"
        lines = _wrap(text, help_width)
        if len(name) <= position - indent - 2:
            head = f"{'':{indent}}{name:{position - indent - 2}}  {lines[0]}\n"
        else:
            head = f"{'':{indent}}{name}\n{'':{position}}{lines[0]}\n"
        return head + "".join(f"{'':{position}}{line}\n" for line in lines[1:])

    description = "\n".join(
        _wrap(
            "One deadline model for Python: run demos and Constellation programs.", max(width, 11)
        )
    )
    return (
        f"{usage}\n\n{description}\n\npositional arguments:\n"
        + "".join(entry(*item) for item in items)
        + "\noptions:\n"
        + "".join(entry(*item) for item in options)
    )


def _wrap(text: str, width: int) -> list[str]:
    """``textwrap.wrap`` of a single-spaced text, imported only when the text does not fit."""
    if len(text) <= width:
        return [text]
    import textwrap

    return textwrap.wrap(text, width)


def _fast(words: Sequence[str]) -> tuple[str, int] | None:
    """What ``timebound``, ``--help`` and ``--version`` print and their exit code, or ``None``
    for everything else (parsed by argparse)."""
    if list(words) == ["--version"]:
        return f"timebound {__version__}\n", 0
    if list(words) in ([], ["-h"], ["--help"]):
        text = _top_level_help(columns())
        if text is not None:
            return text, 2 if not words else 0
    return None


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
            fast = _fast(words)
            if fast is not None:
                sys.stdout.write(fast[0])
                return fast[1]
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
