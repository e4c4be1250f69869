"""The syntax tree of a Constellation program. Positions are 1-based (line, column)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Annotation",
    "Assign",
    "Binary",
    "Branch",
    "Call",
    "Cond",
    "Decl",
    "Expr",
    "FieldAccess",
    "Guard",
    "InputDecl",
    "Interp",
    "Lambda",
    "ListLit",
    "Lit",
    "Match",
    "MatchCase",
    "Name",
    "Option",
    "OutputDecl",
    "Pos",
    "Program",
    "Projection",
    "RecordLit",
    "TList",
    "TMap",
    "TMerge",
    "TName",
    "TOptional",
    "TPrim",
    "TRecord",
    "TSeq",
    "TUnion",
    "TypeDef",
    "TypeExpr",
    "Unary",
    "UseDecl",
    "start",
]

Pos = tuple[int, int]


# Type expressions --------------------------------------------------------------------------


@dataclass(slots=True)
class TypeExpr:
    pos: Pos


@dataclass(slots=True)
class TPrim(TypeExpr):
    name: str


@dataclass(slots=True)
class TName(TypeExpr):
    name: str


@dataclass(slots=True)
class TList(TypeExpr):
    elem: TypeExpr


@dataclass(slots=True)
class TMap(TypeExpr):
    key: TypeExpr
    value: TypeExpr


@dataclass(slots=True)
class TOptional(TypeExpr):
    inner: TypeExpr


@dataclass(slots=True)
class TRecord(TypeExpr):
    fields: list[tuple[str, TypeExpr, Pos]]


@dataclass(slots=True)
class TUnion(TypeExpr):
    members: list[TypeExpr]


@dataclass(slots=True)
class TSeq(TypeExpr):
    """``Seq<T>`` (also spelled ``Candidates<T>``, its older name)."""

    elem: TypeExpr


@dataclass(slots=True)
class TMerge(TypeExpr):
    """``A + B``: the record with the fields of both (B's win)."""

    members: list[TypeExpr]


# Expressions -------------------------------------------------------------------------------


@dataclass(slots=True)
class Expr:
    pos: Pos


@dataclass(slots=True)
class Lit(Expr):
    value: str | int | float | bool


@dataclass(slots=True)
class Interp(Expr):
    """A string with ``${expr}`` parts: literal text and expressions, in order."""

    parts: list[str | Expr]


@dataclass(slots=True)
class Name(Expr):
    name: str


@dataclass(slots=True)
class Binary(Expr):
    op: str
    left: Expr
    right: Expr


@dataclass(slots=True)
class Unary(Expr):
    op: str  # "-" or "not"
    operand: Expr


@dataclass(slots=True)
class Cond(Expr):
    cond: Expr
    then: Expr
    other: Expr


@dataclass(slots=True)
class ListLit(Expr):
    items: list[Expr]


@dataclass(slots=True)
class RecordLit(Expr):
    fields: list[tuple[str, Expr, Pos]]


@dataclass(slots=True)
class FieldAccess(Expr):
    obj: Expr
    name: str
    name_pos: Pos


@dataclass(slots=True)
class Guard(Expr):
    """``expr when cond``: the value when ``cond`` holds, none otherwise (``pos``: ``when``)."""

    expr: Expr
    cond: Expr


@dataclass(slots=True)
class Projection(Expr):
    """``x[a, b]`` or ``x{a, b}``: a record (or each record of a list) cut to those fields."""

    obj: Expr
    fields: list[tuple[str, Pos]]


@dataclass(slots=True)
class Lambda(Expr):
    """``(x) => body``; a parameter may carry a type (``(x: Int) => ...``)."""

    params: list[tuple[str, TypeExpr | None, Pos]]
    body: Expr


@dataclass(slots=True)
class Branch(Expr):
    """``branch { cond -> value, ..., otherwise -> value }``."""

    cases: list[tuple[Expr, Expr]]
    otherwise: Expr


@dataclass(slots=True)
class MatchCase:
    """One ``pattern -> value`` of a ``match``: ``kind`` is ``record`` (``{ a, b }``: has those
    fields), ``type`` (``is T``) or ``any`` (``_``)."""

    kind: str
    fields: list[str]
    type: TypeExpr | None
    pos: Pos
    body: Expr


@dataclass(slots=True)
class Match(Expr):
    subject: Expr
    cases: list[MatchCase]


@dataclass(slots=True)
class Option:
    """One ``name: value`` of a ``with`` clause. ``value`` is already a literal (or an Expr for
    ``fallback``); ``text`` is the value as written, for messages."""

    name: str
    value: Any
    pos: Pos
    value_pos: Pos
    text: str


@dataclass(slots=True)
class Call(Expr):
    module: str
    module_pos: Pos
    args: list[Expr]
    options: dict[str, Option] = field(default_factory=dict)


# Declarations ------------------------------------------------------------------------------


@dataclass(slots=True)
class Decl:
    pos: Pos


@dataclass(slots=True)
class TypeDef(Decl):
    name: str
    type: TypeExpr


@dataclass(slots=True)
class Annotation:
    """``@example(expr)``, ``@source("kind", key: expr, ...)`` or ``@sink(...)``."""

    name: str
    pos: Pos
    args: list[Expr]
    props: list[tuple[str, Expr, Pos]]


@dataclass(slots=True)
class InputDecl(Decl):
    name: str
    type: TypeExpr
    annotations: list[Annotation] = field(default_factory=list)


@dataclass(slots=True)
class OutputDecl(Decl):
    name: str
    annotations: list[Annotation] = field(default_factory=list)


@dataclass(slots=True)
class UseDecl(Decl):
    qualname: str
    alias: str | None


@dataclass(slots=True)
class Assign(Decl):
    name: str
    expr: Expr


@dataclass(slots=True)
class Program:
    decls: list[Decl]


def start(e: Expr) -> Pos:
    """Where ``e`` begins in the source: a binary expression's and a field access's own position
    is their operator's (for errors about the operator); errors about the whole value point here.
    """
    while isinstance(e, Binary | FieldAccess):
        e = e.left if isinstance(e, Binary) else e.obj
    return e.pos
