"""The syntax tree of a Constellation program. Positions are 1-based (line, column)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Assign",
    "Binary",
    "Call",
    "Cond",
    "Decl",
    "Expr",
    "FieldAccess",
    "InputDecl",
    "Interp",
    "ListLit",
    "Lit",
    "Name",
    "Option",
    "OutputDecl",
    "Pos",
    "Program",
    "RecordLit",
    "TList",
    "TMap",
    "TName",
    "TOptional",
    "TPrim",
    "TRecord",
    "TUnion",
    "TypeDef",
    "TypeExpr",
    "Unary",
    "UseDecl",
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
class InputDecl(Decl):
    name: str
    type: TypeExpr


@dataclass(slots=True)
class OutputDecl(Decl):
    name: str


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
