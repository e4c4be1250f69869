"""Diagnostics: stable codes, positions, and rendering with the source line and a caret."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._core._classify import bound_origin
from .._core._durations import format_duration
from .._core._errors import DeadlineExceeded, InvalidInput

__all__ = ["CODES", "CompileError", "Diagnostic", "format_diagnostic", "format_failure"]

#: Every diagnostic code and what it means (documented in docs/constellation.md).
CODES: dict[str, str] = {
    "E001": "syntax error",
    "E002": "unterminated string or interpolation",
    "E003": "invalid character, escape or literal",
    "E004": "nesting too deep or program too large",
    "E005": "unknown type",
    "E006": "invalid type definition (duplicate or cyclic alias)",
    "E007": "undefined name",
    "E008": "duplicate definition",
    "E009": "unknown module",
    "E010": "wrong number of arguments",
    "E011": "type mismatch",
    "E012": "unknown or invalid field access",
    "E013": "invalid option value",
    "E014": "invalid output",
    "E015": "invalid use declaration",
    "E016": "option value must be > 0",
    "E017": "fallback type mismatch",
    "E018": "duplicate option",
    "E019": "unknown option",
    "E020": "invalid annotation",
    "E021": "non-exhaustive match",
    "W001": "'delay' without 'retry'",
    "W002": "'backoff' without 'delay'",
    "W003": "'backoff' without 'retry'",
    "W004": "'cache_backend' without 'cache'",
    "W005": "high retry count",
}


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One compile-time finding. ``line`` and ``column`` are 1-based."""

    code: str
    severity: Literal["error", "warning"]
    message: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.line}:{self.column}: {self.severity} {self.code}: {self.message}"


def source_line(source: str, line: int) -> str | None:
    """Line ``line`` (1-based) of ``source`` as the lexer counts lines: only ``\n`` ends one
    (``str.splitlines`` would also split at form feeds, U+2028 and others inside comments)."""
    lines = source.split("\n")
    if 1 <= line <= len(lines):
        return lines[line - 1].removesuffix("\r")
    return None


def format_diagnostic(diag: Diagnostic, source: str, filename: str = "<source>") -> str:
    """``FILE:LINE:COL: severity CODE: message`` then the source line and a caret under it."""
    head = f"{filename}:{diag.line}:{diag.column}: {diag.severity} {diag.code}: {diag.message}"
    text = source_line(source, diag.line)
    if text is not None:
        if len(text) > 200:  # keep huge lines readable: show a window around the column
            start = max(0, diag.column - 100)
            text = text[start : start + 200]
            col = diag.column - start
        else:
            col = diag.column
        # Tabs keep their width under the caret so it lines up.
        pad = "".join("\t" if ch == "\t" else " " for ch in text[: max(0, col - 1)])
        return f"{head}\n    {text}\n    {pad}^"
    return head


def format_failure(exc: BaseException, source: str, filename: str = "<source>") -> str:
    """A failed run as the CLI prints it: ``FILE:LINE:COL: run failed: Type: message``, the
    call's source line and a caret; a call whose own timeout fired adds ``Module:``,
    ``Timeout:`` and ``Hint:`` lines (the language's timeout RFC shows errors this way)."""
    site = getattr(exc, "call_site", None)
    message = str(exc)
    if site is not None:
        # The runtime appends "[at <site>]" to the message; the FILE:LINE:COL prefix says it.
        message = message.replace(f" [at {site}]", "")
    if site is None:
        return f"{filename}: run failed: {type(exc).__name__}: {message}"
    lines = [f"{filename}:{site.line}:{site.column}: run failed: {type(exc).__name__}: {message}"]
    text = source_line(source, site.line)
    if text is not None:
        pad = "".join("\t" if ch == "\t" else " " for ch in text[: max(0, site.column - 1)])
        lines += [f"    {text}", f"    {pad}^"]
    if isinstance(exc, DeadlineExceeded) and bound_origin(exc.source) == "own":
        lines.append(f"  Module: {site.module}")
        if exc.timeout is not None:
            lines.append(f"  Timeout: {format_duration(exc.timeout)}")
        lines.append("  Hint: raise the timeout, or give the call a fallback")
    return "\n".join(lines)


class CompileError(InvalidInput):
    """A program did not compile (an :class:`~timebound.InvalidInput`, D2.6). ``diagnostics``
    lists every error (and warning) found."""

    code = "constellation-compile-error"

    @property
    def field(self) -> str | None:
        """Where the first error is, ``line:column`` in the program's text."""
        for d in self.diagnostics:
            if d.severity == "error":
                return f"{d.line}:{d.column}"
        return None

    def __init__(self, diagnostics: list[Diagnostic], source: str = "") -> None:
        self.diagnostics = diagnostics
        self.source = source
        errors = [d for d in diagnostics if d.severity == "error"]
        shown = "\n".join(format_diagnostic(d, source) for d in errors[:20])
        more = f"\n... and {len(errors) - 20} more" if len(errors) > 20 else ""
        super().__init__(f"{len(errors)} error(s) in Constellation program:\n{shown}{more}")

    def __reduce__(self) -> tuple[object, ...]:
        return (CompileError, (self.diagnostics, self.source))
