"""Types, expressions and call options of the Constellation grammar (see ``_parser.py`` for
why the parser is written by hand); declarations are built on this in ``_parser.py``.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

from . import _ast as A
from ._diagnostics import Diagnostic
from ._lexer import MAX_DEPTH, ParseFailure, Token
from ._lexer import describe as _describe
from ._options import DURATION_UNITS_MS, OPTIONS, PRIORITIES, OptionSpec
from ._parse_base import TokenParser

__all__ = ["ExpressionParser"]

# `hedge: p95`, `timeout: p99`: a whole percentile, p0 (refused as E016) to p99.
_PERCENTILE: Final = re.compile(r"p[0-9]{1,2}")


class ExpressionParser(TokenParser):
    """Types, expressions (by precedence level, then postfix and primary forms) and the
    ``with`` options of a call."""

    # Types -----------------------------------------------------------------------------------

    def type_expr(self) -> A.TypeExpr:
        start = self.tok
        self.enter(start)
        members = [self.type_merge()]
        while self.at_op("|"):
            self.advance()
            members.append(self.type_merge())
        self.leave()
        return members[0] if len(members) == 1 else A.TUnion(start.pos, members)

    def type_merge(self) -> A.TypeExpr:
        """``A + B + ...``: record types merged (binds tighter than ``|``)."""
        start = self.tok
        parts = [self.type_term()]
        # A `+` starting the next line is not part of this type (`in x: Int` then `+ 1`).
        while self.at_op("+") and self.tok.line == self.toks[self.i - 1].line:
            self.advance()
            parts.append(self.type_term())
        return parts[0] if len(parts) == 1 else A.TMerge(start.pos, parts)

    def type_term(self) -> A.TypeExpr:
        t = self.tok
        if t.kind == "ident":
            self.advance()
            if t.text in ("String", "Int", "Float", "Boolean"):
                return A.TPrim(t.pos, t.text)
            if t.text in ("List", "Optional", "Seq", "Candidates"):
                self.expect_op("<", f" after '{t.text}'")
                inner = self.type_expr()
                self.expect_op(">", f" to close '{t.text}<' at {t.line}:{t.col}")
                if t.text == "List":
                    return A.TList(t.pos, inner)
                if t.text == "Optional":
                    return A.TOptional(t.pos, inner)
                return A.TSeq(t.pos, inner)  # Candidates<T> is Seq<T>'s older name
            if t.text == "Map":
                self.expect_op("<", " after 'Map'")
                key = self.type_expr()
                self.expect_op(",", " between the key and value types of 'Map'")
                value = self.type_expr()
                self.expect_op(">", f" to close 'Map<' at {t.line}:{t.col}")
                return A.TMap(t.pos, key, value)
            return A.TName(t.pos, t.text)
        if self.at_op("{"):
            self.advance()

            def field() -> tuple[str, A.TypeExpr, A.Pos]:
                name = self.expect_ident("a field name")
                self.expect_op(":", f" after field '{name.text}'")
                return (name.text, self.type_expr(), name.pos)

            fields = self.separated(field, "}", f" to close the record type at {t.line}:{t.col}")
            return A.TRecord(t.pos, fields)
        raise self.error(f"Expected a type, found {_describe(t)}")

    # Expressions -----------------------------------------------------------------------------

    def expr(self) -> A.Expr:
        t = self.tok
        self.enter(t)
        if t.kind == "op" and t.text == "(" and self._lambda_ahead():
            left = self.lambda_expr()
        else:
            left = self.guard()
            if self.at_op("??"):
                op = self.advance()
                right = self.expr()
                left = A.Binary(op.pos, "??", left, right)
        self.leave()
        return left

    def guard(self) -> A.Expr:
        """``e when cond`` (looser than ``or``, tighter than ``??``)."""
        e = self.binary(0)
        if self.at_kw("when"):
            w = self.advance()
            return A.Guard(w.pos, e, self.binary(0))
        return e

    def _lambda_ahead(self) -> bool:
        """Whether the ``(`` here opens a lambda's parameters: ``( [name [: Type], ...] ) =>``."""
        toks, j = self.toks, self.i + 1

        def at(k: int, text: str) -> bool:
            return toks[k].kind == "op" and toks[k].text == text

        if at(j, ")"):
            return at(j + 1, "=>")
        while toks[j].kind == "ident":
            j += 1
            if at(j, ":"):  # skip the type up to the ',' or ')' that ends it
                depth = 0
                j += 1
                while toks[j].kind != "eof":
                    if toks[j].kind == "op" and toks[j].text in ("<", "{", "("):
                        depth += 1
                    elif toks[j].kind == "op" and toks[j].text in (">", "}", ")"):
                        if depth == 0:
                            break
                        depth -= 1
                    elif depth == 0 and at(j, ","):
                        break
                    j += 1
            if at(j, ","):
                j += 1
                continue
            return at(j, ")") and at(j + 1, "=>")
        return False

    def lambda_expr(self) -> A.Expr:
        open_tok = self.advance()
        params: list[tuple[str, A.TypeExpr | None, A.Pos]] = []
        seen: set[str] = set()
        if not self.at_op(")"):
            while True:
                name = self.expect_ident("a parameter name")
                if name.text in seen:
                    raise self.error(f"Duplicate parameter '{name.text}'", name, "E008")
                seen.add(name.text)
                type_expr = None
                if self.at_op(":"):
                    self.advance()
                    type_expr = self.type_expr()
                params.append((name.text, type_expr, name.pos))
                if not self.at_op(","):
                    break
                self.advance()
        self.expect_op(")", f" to close the parameters at {open_tok.line}:{open_tok.col}")
        self.expect_op("=>", " after the lambda's parameters")
        return A.Lambda(open_tok.pos, params, self.nested(self.expr))

    # Binary operators by precedence level (lowest first); `not` sits between and and compare.
    _LEVELS: Final = (
        ("or",),
        ("and",),
        None,
        ("==", "!=", "<", ">", "<=", ">="),
        ("+", "-"),
        ("*", "/"),
    )

    def binary(self, level: int) -> A.Expr:
        if level == len(self._LEVELS):
            return self.unary()
        ops = self._LEVELS[level]
        if ops is None:  # the `not` level
            if self.at_kw("not"):
                t = self.advance()
                self.enter(t)
                operand = self.binary(level)
                self.leave()
                return A.Unary(t.pos, "not", operand)
            return self.binary(level + 1)
        left = self.binary(level + 1)
        count = 0
        while True:
            t = self.tok
            if not ((t.kind == "op" or t.kind == "kw") and t.text in ops):
                break
            if level == 3 and count == 1:
                raise self.error(
                    f"Comparisons do not chain: parenthesise '{t.text}' (e.g. (a < b) == c)"
                )
            self.advance()
            count += 1
            # A long operator chain builds a deep tree: it counts as nesting.
            if self.depth + 1 > MAX_DEPTH:
                raise self.error(
                    f"Expression too long: more than {MAX_DEPTH} nested or chained operations "
                    "(split it into named values)",
                    t,
                    "E004",
                )
            self.enter(t)
            right = self.binary(level + 1)
            left = A.Binary(t.pos, t.text, left, right)
        self.depth -= count
        return left

    def unary(self) -> A.Expr:
        if self.at_op("-"):
            t = self.advance()
            self.enter(t)
            operand = self.unary()
            self.leave()
            if (
                isinstance(operand, A.Lit)
                and isinstance(operand.value, int | float)
                and not (isinstance(operand.value, bool))
            ):
                return A.Lit(t.pos, -operand.value)
            return A.Unary(t.pos, "-", operand)
        return self.postfix()

    def postfix(self, braces: bool = True) -> A.Expr:
        """Field access ``x.a`` and projections ``x[a, b]`` / ``x{a, b}`` (``braces=False``
        for a ``match`` subject, whose ``{`` opens the cases)."""
        node = self.primary()
        count = 0
        while True:
            t = self.tok
            if self.at_op("."):
                self.advance()
                name = self.expect_ident("a field name after '.'")
                node = A.FieldAccess(t.pos, node, name.text, name.pos)
            elif self.at_op("[") or (braces and self.at_op("{") and self._brace_projection()):
                node = A.Projection(t.pos, node, self.projection_fields())
            else:
                break
            self.enter(t)
            count += 1
        self.depth -= count
        return node

    def _brace_projection(self) -> bool:
        """``{ a, b }`` after a value is a projection; a record literal has ``name:``."""
        nxt, after = self.peek(1), self.peek(2)
        return nxt.kind == "ident" and after.kind == "op" and after.text in (",", "}")

    def projection_fields(self) -> list[tuple[str, A.Pos]]:
        open_tok = self.advance()
        close = "]" if open_tok.text == "[" else "}"
        fields: list[tuple[str, A.Pos]] = []
        while True:
            name = self.expect_ident(f"a field name in the projection '{open_tok.text}...{close}'")
            if any(n == name.text for n, _ in fields):
                raise self.error(f"Field '{name.text}' is projected twice", name, "E008")
            fields.append((name.text, name.pos))
            if not self.at_op(","):
                break
            self.advance()
        self.expect_op(close, f" to close the projection at {open_tok.line}:{open_tok.col}")
        return fields

    def primary(self) -> A.Expr:
        t = self.tok
        k = t.kind
        if k == "int" or k == "float":
            self.advance()
            return A.Lit(t.pos, t.value)
        if k == "string":
            self.advance()
            return self.string(t)
        if k == "kw":
            if t.text in ("true", "false"):
                self.advance()
                return A.Lit(t.pos, t.text == "true")
            if t.text == "if":
                self.advance()
                self.expect_op("(", " after 'if'")
                cond = self.expr()
                self.expect_op(")", f" to close the condition of 'if' at {t.line}:{t.col}")
                then = self.expr()
                if not self.at_kw("else"):
                    raise self.error(
                        f"Expected 'else' for the 'if' at {t.line}:{t.col}, "
                        f"found {_describe(self.tok)}"
                    )
                self.advance()
                other = self.expr()
                return A.Cond(t.pos, cond, then, other)
            if t.text == "branch":
                return self.branch(t)
            if t.text == "match":
                return self.match(t)
            raise self.error(f"Expected an expression, found {_describe(t)}")
        if k == "duration":
            raise self.error(
                f"A duration like '{t.text}' is only allowed as an option value "
                "(timeout, delay, cache, throttle)",
                t,
                "E013",
            )
        if k == "ident":
            return self.name_or_call()
        if k == "op":
            if t.text == "(":
                self.advance()
                inner = self.nested(self.expr)
                self.expect_op(")", f" to close '(' at {t.line}:{t.col}")
                return inner
            if t.text == "[":
                self.advance()
                item = functools.partial(self.nested, self.expr)
                items = self.separated(item, "]", f" to close '[' at {t.line}:{t.col}")
                return A.ListLit(t.pos, items)
            if t.text == "{":
                self.advance()
                seen: set[str] = set()

                def value_field() -> tuple[str, A.Expr, A.Pos]:
                    name = self.expect_ident("a field name in the record")
                    if name.text in seen:
                        raise self.error(f"Duplicate field '{name.text}' in record", name, "E008")
                    seen.add(name.text)
                    self.expect_op(":", f" after field '{name.text}'")
                    outer, self.in_record = self.in_record, True
                    try:
                        return (name.text, self.expr(), name.pos)
                    finally:
                        self.in_record = outer

                close = f" to close '{{' at {t.line}:{t.col}"
                value_fields = self.separated(value_field, "}", close)
                return A.RecordLit(t.pos, value_fields)
        raise self.error(f"Expected an expression, found {_describe(t)}")

    def branch(self, t: Token) -> A.Expr:
        """``branch { cond -> value, ..., otherwise -> value }``."""
        self.advance()
        self.expect_op("{", " after 'branch'")
        close = f" to close 'branch {{' at {t.line}:{t.col}"
        cases: list[tuple[A.Expr, A.Expr]] = []
        while True:
            if self.at_kw("otherwise"):
                self.advance()
                self.expect_op("->", " after 'otherwise'")
                otherwise = self.nested(self.expr)
                if self.at_op(","):  # a trailing comma is fine
                    self.advance()
                if not self.at_op("}"):
                    found = _describe(self.tok)
                    raise self.error(f"'otherwise' must be the last 'branch' case, found {found}")
                self.advance()
                return A.Branch(t.pos, cases, otherwise)
            if self.at_op("}"):
                raise self.error(
                    f"A 'branch' needs an 'otherwise -> value' case last (branch at "
                    f"{t.line}:{t.col})"
                )
            cond = self.nested(self.expr)
            self.expect_op("->", " between the condition and the value of a 'branch' case")
            cases.append((cond, self.nested(self.expr)))
            if not self.at_op(","):
                if self.at_op("}") or self.at_kw("otherwise"):
                    raise self.error(
                        f"A 'branch' needs an 'otherwise -> value' case last (branch at "
                        f"{t.line}:{t.col})"
                        if self.at_op("}")
                        else f"Expected ',' before 'otherwise'{close}"
                    )
                raise self.error(f"Expected ',' or 'otherwise'{close}, found {_describe(self.tok)}")
            self.advance()

    def match(self, t: Token) -> A.Expr:
        """``match subject { pattern -> value, ... }``; patterns: ``{ a, b }``, ``is T``, ``_``."""
        self.advance()
        subject = self.nested(functools.partial(self.postfix, False))
        open_tok = self.expect_op("{", " after the subject of 'match'")
        close = f" to close 'match {{' at {open_tok.line}:{open_tok.col}"

        def case() -> A.MatchCase:
            p = self.tok
            if self.at_op("{"):
                fields = [n for n, _ in self.projection_fields()]
                kind, type_expr = "record", None
            elif self.at_kw("is"):
                self.advance()
                kind, fields, type_expr = "type", [], self.type_expr()
            elif p.kind == "ident" and p.text == "_":
                self.advance()
                kind, fields, type_expr = "any", [], None
            else:
                raise self.error(
                    f"Expected a pattern ('{{ field, ... }}', 'is Type' or '_'), "
                    f"found {_describe(p)}"
                )
            self.expect_op("->", " after the pattern")
            return A.MatchCase(kind, fields, type_expr, p.pos, self.nested(self.expr))

        cases = self.separated(case, "}", close)
        if not cases:
            raise self.error("A 'match' needs at least one case", open_tok)
        return A.Match(t.pos, subject, cases)

    def string(self, t: Token) -> A.Expr:
        raw: list[str | tuple[int, list[Token]]] = t.value
        if len(raw) == 1 and isinstance(raw[0], str):
            return A.Lit(t.pos, raw[0])
        parts: list[str | A.Expr] = []
        for part in raw:
            if isinstance(part, str):
                parts.append(part)
                continue
            _, toks = part
            sub = ExpressionParser(self.lexer, toks, self.diags)
            sub.depth = self.depth + 1
            e = sub.expr()
            if sub.tok.kind != "eof":
                raise sub.error(f"Unexpected {_describe(sub.tok)} in interpolation")
            parts.append(e)
        return A.Interp(t.pos, parts)

    def name_or_call(self) -> A.Expr:
        first = self.advance()
        parts = [first.text]
        j = self.i
        # a.b.c( ... ) is a call of the qualified module a.b.c; a.b.c alone is field access.
        while (
            self.toks[j].kind == "op"
            and self.toks[j].text == "."
            and self.toks[j + 1].kind == "ident"
        ):
            parts.append(self.toks[j + 1].text)
            j += 2
        if self.toks[j].kind == "op" and self.toks[j].text == "(":
            self.i = j
            open_tok = self.advance()
            args = self.separated(
                functools.partial(self.nested, self.expr),
                ")",
                f" to close the call of '{'.'.join(parts)}' at {open_tok.line}:{open_tok.col}",
            )
            call = A.Call(first.pos, ".".join(parts), first.pos, args)
            if self.at_kw("with"):
                self.advance()
                self.options(call)
            return call
        return A.Name(first.pos, first.text)

    # Options ---------------------------------------------------------------------------------

    def options(self, call: A.Call) -> None:
        while True:
            self.option(call)
            # A comma continues the clause only when an option follows (`, name:` or `, lazy`).
            if not self.at_op(","):
                nxt = self.tok
                if nxt.kind == "ident" and nxt.text in OPTIONS and self.peek().text == ":":
                    # `retry: 1 timeout: 5s`: nothing else can follow an option value like this.
                    raise self.error(f"Missing ',' before option '{nxt.text}'")
                return
            nxt, after = self.peek(1), self.peek(2)
            if nxt.kind == "ident" and (
                nxt.text in OPTIONS
                or (not self.in_record and after.kind == "op" and after.text == ":")
            ):
                self.advance()
                continue
            return

    def _diag(self, code: str, message: str, pos: A.Pos, severity: str = "error") -> None:
        self.diags.append(Diagnostic(code, severity, message, pos[0], pos[1]))  # type: ignore[arg-type]

    def option(self, call: A.Call) -> None:
        name_tok = self.tok
        if name_tok.kind != "ident":
            raise self.error(f"Expected an option name after 'with', found {_describe(name_tok)}")
        self.advance()
        name = name_tok.text
        spec = OPTIONS.get(name)
        if spec is None:
            self._diag("E019", f"Unknown option '{name}'", name_tok.pos)
            if self.at_op(":"):  # consume the value to go on parsing (`with cached` has none)
                self.advance()
                self._skip_value()
            return
        if spec.kind == "flag" and not self.at_op(":"):  # bare `lazy`
            self._store(call, A.Option(name, True, name_tok.pos, name_tok.pos, "true"))
            return
        self.expect_op(":", f" after option '{name}'")
        vt = self.tok
        if spec.kind == "expression":
            value = self.expr()
            self._store(call, A.Option(name, value, name_tok.pos, vt.pos, "expression"))
            return
        negative = vt.kind == "op" and vt.text == "-" and self.peek().kind in ("int", "duration")
        if negative and spec.kind in ("count", "duration", "learnable", "rate"):
            # `timeout: -5s`, `retry: -1`: one precise error, the value consumed with it.
            self.advance()
            text = f"-{self.advance().text}"
            if spec.positive:
                self._diag("E016", f"Invalid value for '{name}': {text} (must be > 0)", vt.pos)
            else:
                message = (
                    f"Invalid value for '{name}': {text} (a negative {name} is not allowed; "
                    f"{name}: 0 means a single attempt)"
                )
                self._diag("E013", message, vt.pos)
            if spec.kind == "rate":  # `-1/1s`: the rest of the rate goes with it
                self._skip_value()
            return
        parsed = self.option_value(spec, vt)
        if parsed is None:
            found = _describe(vt)
            self._diag("E013", f"Option '{name}' expects {spec.expects}, found {found}", vt.pos)
            self._skip_value()
            return
        value, text, zero = parsed
        if zero and spec.positive:
            self._diag("E016", f"Invalid value for '{name}': {text} (must be > 0)", vt.pos)
        self._store(call, A.Option(name, value, name_tok.pos, vt.pos, text))

    def option_value(self, spec: OptionSpec, vt: Token) -> tuple[Any, str, bool] | None:
        """The value of ``spec`` starting at ``vt`` as (value, text as written, is zero), its
        tokens consumed; None (nothing consumed) when it does not have the option's form."""
        kind = spec.kind
        if kind == "duration" and vt.kind == "duration":
            self.advance()
            n, unit = vt.value
            return n * DURATION_UNITS_MS[unit] / 1000, vt.text, n == 0
        if kind == "learnable":
            if vt.kind == "duration":
                self.advance()
                n, unit = vt.value
                return n * DURATION_UNITS_MS[unit] / 1000, vt.text, n == 0
            if vt.kind == "ident" and _PERCENTILE.fullmatch(vt.text):
                self.advance()
                return vt.text, vt.text, int(vt.text[1:]) == 0
            return None
        if kind == "count" and vt.kind == "int":
            self.advance()
            return vt.value, vt.text, vt.value == 0
        if kind == "choice" and vt.kind == "ident" and vt.text in spec.choices:
            self.advance()
            return vt.text, vt.text, False
        if kind == "flag" and vt.kind == "kw" and vt.text in ("true", "false"):
            self.advance()
            return vt.text == "true", vt.text, False
        if kind == "priority":
            if vt.kind == "ident" and vt.text in PRIORITIES:
                self.advance()
                return PRIORITIES[vt.text], vt.text, False
            if vt.kind == "int":
                self.advance()
                return vt.value, vt.text, False
            if vt.kind == "op" and vt.text == "-" and self.peek().kind == "int":
                # priority takes an Int (the spec says Int, not Nat): below background is allowed
                self.advance()
                num = self.advance()
                return -num.value, f"-{num.text}", False
        if kind == "string" and vt.kind == "string":
            parts = vt.value
            if len(parts) == 1 and isinstance(parts[0], str) and parts[0]:
                self.advance()
                return parts[0], vt.text, False
        if (
            kind == "rate"
            and vt.kind == "int"
            and self.peek().kind == "op"
            and self.peek().text == "/"
            and self.peek(2).kind == "duration"
        ):
            self.advance()
            self.advance()
            dur = self.advance()
            n, unit = dur.value
            text = f"{vt.text}/{dur.text}"
            return (
                (vt.value, n * DURATION_UNITS_MS[unit] / 1000, text),
                text,
                vt.value == 0 or n == 0,
            )
        return None

    def _skip_value(self) -> None:
        """Consume the value of an option that already has its error, reporting nothing more:
        as an expression if it is one, otherwise up to the next ',' or closing bracket on its
        line (one mistake, one diagnostic)."""
        start, depth, in_record = self.i, self.depth, self.in_record
        line = self.tok.line
        try:
            self.expr()
            t = self.tok
            if t.kind == "eof" or t.line != line or (t.kind == "op" and t.text in ",)]}"):
                return
        except ParseFailure:
            pass
        self.i, self.depth, self.in_record = start, depth, in_record
        nesting = 0
        while self.tok.kind != "eof":
            t = self.tok
            if t.kind == "op" and t.text in ("(", "[", "{"):
                nesting += 1
            elif nesting == 0 and (t.line != line or (t.kind == "op" and t.text in ",)]}")):
                return
            elif t.kind == "op" and t.text in (")", "]", "}"):
                nesting -= 1
            self.advance()

    def _store(self, call: A.Call, opt: A.Option) -> None:
        if opt.name in call.options:
            self._diag("E018", f"Duplicate option '{opt.name}'", opt.pos)
            return
        call.options[opt.name] = opt
