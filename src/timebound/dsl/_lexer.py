"""The lexer of Constellation programs: source text to tokens with exact positions.

Hand-written (see ``_parser.py`` for why): string interpolation recurses into ``${...}`` with
exact source positions, and every lexing error stops at once with a diagnostic (E002, E003,
E004).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any, Final

from . import _ast as A
from ._diagnostics import Diagnostic
from ._options import DURATION_UNITS_MS

__all__ = ["KEYWORDS", "MAX_DEPTH", "Lexer", "ParseFailure", "Token", "describe", "tokenize"]

KEYWORDS: Final = frozenset(
    {
        "type", "in", "out", "use", "as", "if", "else", "true", "false", "and", "or", "not",
        "with", "when", "branch", "otherwise", "match", "is",
    }
)  # fmt: skip
#: How deeply brackets, calls, conditionals and operators may nest (E004 beyond).
MAX_DEPTH: Final = 64
_MAX_INT: Final = 2**63 - 1

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r\n\f]+|\#[^\n]*)
  | (?P<num>[0-9]+(?:\.[0-9]+)?)
  | (?P<op>==|!=|<=|>=|\?\?|=>|->|[-+*/<>()\[\]{},:.=|@])
  | (?P<ident>[^\W\d]\w*(?:-\w+)*)
    """,
    re.VERBOSE,
)
# An identifier may contain hyphens between word characters, as upstream Constellation's do
# (`string-length`, `ide-ranker-v2`): `a-b` is one name; subtraction is written `a - b`.
_WORD_TAIL = re.compile(r"\w+")
# Numbers are ASCII: `\d` would also take Arabic-Indic or full-width digits (U+0665, U+FF15),
# which the grammar does not allow and which would silently read as 5.


@dataclass(slots=True)
class Token:
    kind: str  # ident, kw, int, float, duration, string, op, eof
    text: str
    value: Any
    line: int
    col: int

    @property
    def pos(self) -> A.Pos:
        return (self.line, self.col)


class ParseFailure(Exception):
    """Raised internally at the first lexing or syntax error."""

    def __init__(self, diag: Diagnostic) -> None:
        super().__init__(diag.message)
        self.diag = diag


def describe(tok: Token) -> str:
    if tok.kind == "eof":
        return "end of input"
    if tok.kind == "string":
        return "a string"
    text = tok.text if len(tok.text) <= 20 else tok.text[:17] + "..."
    if tok.kind == "kw":
        return f"keyword '{text}'"
    return f"'{text}'"


class Lexer:
    def __init__(self, source: str) -> None:
        self.src = source
        self.depth = 0
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", source)]

    def pos(self, index: int) -> A.Pos:
        line = bisect.bisect_right(self.line_starts, index)
        return (line, index - self.line_starts[line - 1] + 1)

    def fail(self, code: str, message: str, index: int) -> ParseFailure:
        line, col = self.pos(index)
        return ParseFailure(Diagnostic(code, "error", message, line, col))

    def tokens(self, start: int, end: int) -> list[Token]:
        src = self.src
        out: list[Token] = []
        i = start
        match = _TOKEN_RE.match
        while i < end:
            ch = src[i]
            if ch == '"':
                out.append(self.string(i, end))
                i = self._string_end
                continue
            m = match(src, i, end)
            if m is None:
                char = src[i]
                if char.isdigit():
                    raise self.fail(
                        "E003",
                        f"Invalid digit {char!r} (U+{ord(char):04X}): numbers are written with "
                        "the ASCII digits 0-9",
                        i,
                    )
                shown = repr(char) if char.isprintable() else f"U+{ord(char):04X}"
                raise self.fail("E003", f"Unexpected character {shown}", i)
            kind = m.lastgroup
            text = m.group()
            j = m.end()
            if kind == "ws":
                i = j
                continue
            line, col = self.pos(i)
            if kind == "num":
                tail = _WORD_TAIL.match(src, j, end)
                if tail is not None:
                    unit = tail.group()
                    if unit[0].isdigit():  # a non-ASCII digit right after ASCII ones
                        raise self.fail(
                            "E003",
                            f"Invalid digit {unit[0]!r} (U+{ord(unit[0]):04X}): numbers are "
                            "written with the ASCII digits 0-9",
                            j,
                        )
                    if "." in text:
                        raise self.fail(
                            "E003",
                            f"Invalid literal '{text}{unit}': durations are whole numbers "
                            "(use 1500ms, not 1.5s)",
                            i,
                        )
                    if unit not in DURATION_UNITS_MS:
                        raise self.fail(
                            "E003",
                            f"Invalid literal '{text}{unit}': a duration unit is one of ms, s, "
                            "min, h, d",
                            i,
                        )
                    n = self._int(text, i)
                    out.append(Token("duration", text + unit, (n, unit), line, col))
                    i = tail.end()
                    continue
                if "." in text:
                    out.append(Token("float", text, float(text), line, col))
                else:
                    out.append(Token("int", text, self._int(text, i), line, col))
            elif kind == "ident":
                out.append(Token("kw" if text in KEYWORDS else "ident", text, text, line, col))
            else:
                out.append(Token("op", text, text, line, col))
            i = j
        line, col = self.pos(end)
        out.append(Token("eof", "", None, line, col))
        return out

    def _int(self, text: str, index: int) -> int:
        # Check the length before int(): CPython refuses to convert very long digit strings.
        if len(text.lstrip("0")) > 19 or int(text) > _MAX_INT:
            raise self.fail("E003", f"Integer literal too large (max {_MAX_INT})", index)
        return int(text)

    _string_end: int = 0

    def string(self, start: int, end: int) -> Token:
        """Lex a string starting at the quote; parts are text and interpolation token lists."""
        src = self.src
        parts: list[str | tuple[int, list[Token]]] = []
        buf: list[str] = []
        i = start + 1
        while True:
            if i >= end or src[i] == "\n":
                raise self.fail("E002", "Unterminated string", start)
            ch = src[i]
            if ch == '"':
                i += 1
                break
            if ch == "\\":
                if i + 1 >= end:
                    raise self.fail("E002", "Unterminated string", start)
                esc = src[i + 1]
                simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "$": "$"}
                if esc in simple:
                    buf.append(simple[esc])
                    i += 2
                    continue
                if esc == "u":
                    m = re.match(r"u\{([0-9a-fA-F]{1,6})\}", src[i + 1 : i + 11])
                    if m is None or int(m.group(1), 16) > 0x10FFFF:
                        raise self.fail("E003", "Invalid unicode escape (use \\u{1F600})", i)
                    buf.append(chr(int(m.group(1), 16)))
                    i += 1 + m.end()
                    continue
                shown = esc if esc.isprintable() else f"U+{ord(esc):04X}"
                raise self.fail("E003", f"Invalid escape '\\{shown}' in string", i)
            if ch == "$" and i + 1 < end and src[i + 1] == "{":
                close = self._interp_end(i + 2, end, i)
                if buf:
                    parts.append("".join(buf))
                    buf = []
                self.depth += 1
                if self.depth > MAX_DEPTH:
                    raise self.fail(
                        "E004", f"Interpolations nested too deep (more than {MAX_DEPTH})", i
                    )
                inner = self.tokens(i + 2, close)
                self.depth -= 1
                if inner[0].kind == "eof":
                    raise self.fail("E001", "Empty interpolation '${}'", i)
                parts.append((i, inner))
                i = close + 1
                continue
            buf.append(ch)
            i += 1
        if buf or not parts:
            parts.append("".join(buf))
        self._string_end = i
        line, col = self.pos(start)
        return Token("string", src[start:i], parts, line, col)

    def _skip_string(self, start: int, end: int) -> int:
        """Index just after the string starting at ``start`` (scanned, not tokenised)."""
        src = self.src
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(
                "E004", f"Strings nested too deep (more than {MAX_DEPTH} levels)", start
            )
        i = start + 1
        while i < end and src[i] != "\n":
            ch = src[i]
            if ch == '"':
                self.depth -= 1
                return i + 1
            if ch == "\\":
                i += 2
                continue
            if ch == "$" and i + 1 < end and src[i + 1] == "{":
                i = self._interp_end(i + 2, end, i) + 1
                continue
            i += 1
        raise self.fail("E002", "Unterminated string", start)

    def _interp_end(self, i: int, end: int, opener: int) -> int:
        """Index of the '}' closing an interpolation that starts at ``i``."""
        src = self.src
        depth = 0
        while i < end:
            ch = src[i]
            if ch == "\n":
                break
            if ch == '"':
                try:
                    i = self._skip_string(i, end)
                except ParseFailure as exc:
                    if exc.diag.code != "E002":
                        raise
                    break  # `"${a + "` : the interpolation is what was left open
                continue
            if ch == "{":
                depth += 1
            elif ch == "}":
                if depth == 0:
                    return i
                depth -= 1
            i += 1
        raise self.fail("E002", "Unterminated interpolation '${' in string", opener)


def tokenize(source: str) -> tuple[Lexer, list[Token]]:
    """The lexer (it keeps the line table) and the tokens of ``source``."""
    lexer = Lexer(source)
    return lexer, lexer.tokens(0, len(source))
