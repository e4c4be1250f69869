"""Recursive-descent parser for Constellation programs.

Hand-written rather than generated (lark) for three reasons: string interpolation needs the lexer
to recurse into ``${...}`` with exact source positions; a hostile program must hit a clear nesting
limit (E004) instead of Python's recursion limit; and each error can say what was expected and
what closes what ("expected ')' to close '(' at 3:9"). Lexing errors and syntax errors stop at the
first one; option errors (E013, E016, E018, E019) are collected and parsing goes on.

The parser is layered: the token stream (``_parse_base.py``), types, expressions and call
options on it (``_parse_expr.py``), and the declarations of a program here.
"""

from __future__ import annotations

import difflib
from typing import Final

from . import _ast as A
from ._diagnostics import Diagnostic
from ._lexer import ParseFailure, tokenize
from ._lexer import describe as _describe
from ._parse_expr import ExpressionParser

__all__ = ["ParseFailure", "parse"]

#: The annotations a declaration may carry, and the declaration each one belongs to.
ANNOTATIONS: Final = {"example": "in", "source": "in", "sink": "out"}


class _Parser(ExpressionParser):
    """Programs and declarations (inputs, outputs, types, uses, assignments, annotations)."""

    # Declarations ----------------------------------------------------------------------------

    def program(self) -> A.Program:
        decls: list[A.Decl] = []
        while self.tok.kind != "eof":
            decls.append(self.declaration())
        return A.Program(decls)

    def declaration(self) -> A.Decl:
        annotations: list[A.Annotation] = []
        while self.at_op("@"):
            annotations.append(self.annotation())
        t = self.tok
        if annotations:
            if not (t.kind == "kw" and t.text in ("in", "out")):
                last = annotations[-1]
                raise self.error(
                    f"Expected an 'in' or 'out' declaration after the annotation "
                    f"'@{last.name}', found {_describe(t)}",
                    code="E020",
                )
            for a in annotations:
                self.check_annotation(a, t.text)
        if t.kind == "kw":
            if t.text == "type":
                self.advance()
                name = self.expect_ident("a type name after 'type'")
                self.expect_op("=", f" after 'type {name.text}'")
                return A.TypeDef(t.pos, name.text, self.type_expr())
            if t.text == "in":
                self.advance()
                name = self.expect_ident("an input name after 'in'")
                self.expect_op(":", f" and a type after 'in {name.text}'")
                type_expr = self.type_expr()
                # `in q: String @example("hi")`: annotations may also follow on the same line.
                last_line = self.toks[self.i - 1].line
                while self.at_op("@") and self.tok.line == last_line:
                    a = self.annotation()
                    self.check_annotation(a, "in")
                    annotations.append(a)
                return A.InputDecl(t.pos, name.text, type_expr, annotations)
            if t.text == "out":
                self.advance()
                name = self.expect_ident("a name after 'out'")
                return A.OutputDecl(name.pos, name.text, annotations)
            if t.text == "use":
                self.advance()
                first = self.expect_ident("a module name after 'use'")
                parts = [first.text]
                while self.at_op("."):
                    self.advance()
                    parts.append(self.expect_ident("a name after '.'").text)
                alias = None
                if self.at_kw("as"):
                    self.advance()
                    alias = self.expect_ident("a name after 'as'").text
                return A.UseDecl(first.pos, ".".join(parts), alias)
        if t.kind == "ident" and self.peek().kind == "op" and self.peek().text == "=":
            self.advance()
            self.advance()
            return A.Assign(t.pos, t.text, self.expr())
        raise self.error(
            f"Expected a declaration (type, in, out, use or NAME = expression), "
            f"found {_describe(t)}"
        )

    def annotation(self) -> A.Annotation:
        """``@example(expr)``, ``@source("kind", key: value, ...)`` or ``@sink(...)``."""
        at = self.advance()
        name_tok = self.tok
        if name_tok.kind != "ident" or name_tok.text not in ANNOTATIONS:
            shown = name_tok.text if name_tok.kind == "ident" else ""
            similar = difflib.get_close_matches(shown, list(ANNOTATIONS), n=1)
            if similar:
                hint = f"did you mean '@{similar[0]}'?"
            else:
                hint = "known: " + ", ".join(f"@{n}" for n in ANNOTATIONS)
            raise self.error(f"Unknown annotation '@{shown}' ({hint})", at, "E020")
        self.advance()
        open_tok = self.expect_op("(", f" after '@{name_tok.text}'")
        close = f" to close '@{name_tok.text}(' at {open_tok.line}:{open_tok.col}"
        args: list[A.Expr] = []
        props: list[tuple[str, A.Expr, A.Pos]] = []
        if name_tok.text == "example":
            args.append(self.nested(self.expr))
        else:
            kind = self.tok
            if kind.kind != "string":
                raise self.error(
                    f"Expected the connector kind as a string after '@{name_tok.text}(', "
                    f"found {_describe(kind)}"
                )
            args.append(self.nested(self.expr))
            while self.at_op(","):
                self.advance()
                key = self.tok
                if key.kind not in ("ident", "kw"):
                    raise self.error(f"Expected a property name, found {_describe(key)}")
                self.advance()
                self.expect_op(":", f" after property '{key.text}'")
                props.append((key.text, self.nested(self.expr), key.pos))
        self.expect_op(")", close)
        return A.Annotation(name_tok.text, at.pos, args, props)

    def check_annotation(self, a: A.Annotation, decl: str) -> None:
        if ANNOTATIONS[a.name] != decl:
            self._diag(
                "E020",
                f"'@{a.name}' belongs on an '{ANNOTATIONS[a.name]}' declaration, not on '{decl}'",
                a.pos,
            )


def parse(source: str, diags: list[Diagnostic]) -> A.Program:
    """Parse ``source``; option findings go to ``diags``; the first syntax error raises
    :class:`ParseFailure`."""
    lexer, tokens = tokenize(source)
    return _Parser(lexer, tokens, diags).program()
