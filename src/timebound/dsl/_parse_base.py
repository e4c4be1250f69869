"""The token stream under the Constellation parser: position, lookahead, expectations with
errors that say what was expected, and the nesting limit (E004).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from . import _ast as A
from ._diagnostics import Diagnostic
from ._lexer import MAX_DEPTH, Lexer, ParseFailure, Token
from ._lexer import describe as _describe

__all__ = ["TokenParser"]

_T = TypeVar("_T")


class TokenParser:
    """The parser's state and token helpers; the grammar is in the classes built on it."""

    def __init__(self, lexer: Lexer, tokens: list[Token], diags: list[Diagnostic]) -> None:
        self.lexer = lexer
        self.toks = tokens
        self.i = 0
        self.diags = diags
        self.depth = 0
        # True while parsing a record literal's field value (and not inside a nested bracket):
        # there `, name: ...` after a `with` clause is the next field unless `name` is an option.
        self.in_record = False

    # Token helpers -------------------------------------------------------------------------

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def peek(self, n: int = 1) -> Token:
        j = min(self.i + n, len(self.toks) - 1)
        return self.toks[j]

    def advance(self) -> Token:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def at_op(self, text: str) -> bool:
        t = self.toks[self.i]
        return t.kind == "op" and t.text == text

    def at_kw(self, text: str) -> bool:
        t = self.toks[self.i]
        return t.kind == "kw" and t.text == text

    def error(self, message: str, tok: Token | None = None, code: str = "E001") -> ParseFailure:
        t = tok or self.tok
        return ParseFailure(Diagnostic(code, "error", message, t.line, t.col))

    def expect_op(self, text: str, context: str = "") -> Token:
        if not self.at_op(text):
            raise self.error(f"Expected '{text}'{context}, found {_describe(self.tok)}")
        return self.advance()

    def expect_ident(self, what: str) -> Token:
        t = self.tok
        if t.kind != "ident":
            extra = f" ('{t.text}' is a keyword)" if t.kind == "kw" else ""
            raise self.error(f"Expected {what}, found {_describe(t)}{extra}")
        return self.advance()

    def enter(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"Nesting too deep (more than {MAX_DEPTH} levels)", tok, "E004")

    def leave(self) -> None:
        self.depth -= 1

    def separated(self, item: Callable[[], _T], close: str, context: str) -> list[_T]:
        """``item, item, ...`` (possibly none) up to ``close``, which is consumed; ``context``
        ends the message when it is missing."""
        items: list[_T] = []
        if not self.at_op(close):
            while True:
                items.append(item())
                if not self.at_op(","):
                    break
                self.advance()
        self.expect_op(close, context)
        return items

    def nested(self, parse: Callable[[], A.Expr]) -> A.Expr:
        """``parse()`` inside brackets: a comma there is the bracket's, not a record's."""
        outer, self.in_record = self.in_record, False
        try:
            return parse()
        finally:
            self.in_record = outer
