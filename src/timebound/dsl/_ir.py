"""The typed intermediate representation of a checked program: what the check pass decides,
before anything runs.

The check pass (``_check.py``) turns the syntax tree into these frozen dataclasses and reports
every diagnostic on the way; the lower pass (``_lower.py``) turns them into the closures, call
sites and DAG the runtime runs, and reports nothing. Every expression carries its checked
``type`` and ``deps``, the keys of the run values it reads (what a DAG node built from it waits
for). A module call is one :class:`CallNode`: where it is written, its stable identity, the
argument and result types it checked, its options as typed values (read through the one option
table, ``_options.OPTIONS``) and where it runs (a DAG node of its own, a lazy thunk, or in place
inside a conditional expression). ``Program.ir`` keeps the representation for tools.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import _ast as A
from ._runtime import CallSite
from ._types import Type

__all__ = [
    "Arm",
    "Binary",
    "Binding",
    "Branch",
    "Call",
    "CallNode",
    "CallOptions",
    "Cond",
    "Const",
    "Expr",
    "Field",
    "Guard",
    "HigherOrder",
    "Interp",
    "Invalid",
    "ListOf",
    "Logic",
    "Match",
    "Merge",
    "Output",
    "ProgramIR",
    "Project",
    "Read",
    "RecordOf",
    "TypedAnnotation",
    "Unary",
]

Placement = Literal["node", "thunk", "inline"]


@dataclass(frozen=True, slots=True)
class CallOptions:
    """A call's ``with`` options as checked values; ``declared`` names the ones written.

    Durations are seconds; ``throttle`` is ``(count, per seconds, text as written)``; ``timeout``
    and ``hedge`` are seconds or a percentile's text (``"p99"``, ``"p95"``);
    ``fallback`` says whether one is declared (its expression is the call's ``fallback``).
    """

    declared: frozenset[str] = frozenset()
    retry: int = 0
    timeout: float | str | None = None
    timeout_floor: float | None = None
    delay: float | None = None
    backoff: str | None = None
    cache: float | None = None
    cache_backend: str | None = None
    throttle: tuple[int, float, str] | None = None
    concurrency: int | None = None
    hedge: float | str | None = None
    on_error: str = "propagate"
    reserve: float | None = None
    lazy: bool = False
    priority: int = 50
    fallback: bool = False

    @classmethod
    def of(cls, options: Mapping[str, A.Option]) -> CallOptions:
        """The options of a parsed call (the parser has checked each value's form)."""
        values: dict[str, Any] = {
            name: opt.value for name, opt in options.items() if name != "fallback"
        }
        if "priority" in values:
            values["priority"] = int(values["priority"])
        if "lazy" in values:
            values["lazy"] = bool(values["lazy"])
        return cls(declared=frozenset(options), fallback="fallback" in options, **values)


@dataclass(frozen=True, slots=True)
class CallNode:
    """One module call of the program, type-checked.

    ``key`` is its identity, stable across edits of other declarations: the binding's name for
    ``y = F(x)``, else the declaration's name and the call's place in it. ``params`` are the
    argument types as checked, ``returns`` the call's value type (``Result<T>`` under
    ``on_error: wrap``). ``deps`` are the keys of the values it reads (the fallback's too).
    ``positions`` say where each option's value is written.
    """

    key: str
    module: str
    site: CallSite
    params: tuple[Type, ...]
    returns: Type
    options: CallOptions
    deps: tuple[str, ...]
    placement: Placement
    positions: Mapping[str, A.Pos] = field(default_factory=dict)


# Typed expressions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expr:
    """A checked expression: its type and the run values it reads."""

    type: Type
    deps: frozenset[str]


@dataclass(frozen=True, slots=True)
class Invalid(Expr):
    """An expression with an error (already reported); a program holding one is not lowered."""


@dataclass(frozen=True, slots=True)
class Const(Expr):
    """A literal, or a piece of literal text."""

    value: Any


@dataclass(frozen=True, slots=True)
class Read(Expr):
    """The value under ``key`` in the run: an input, a binding, a bound local name; ``lazy``
    when it is a lazy call's, forced on first read."""

    key: str
    lazy: bool


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A module call: its node, its arguments and its ``fallback:`` expression."""

    node: CallNode
    args: tuple[Expr, ...]
    fallback: Expr | None


@dataclass(frozen=True, slots=True)
class Logic(Expr):
    """``??``, ``and`` or ``or``: the right side is evaluated only when needed."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Binary(Expr):
    """A comparison or arithmetic; ``pos`` is the operator's (a division by zero names it)."""

    op: str
    left: Expr
    right: Expr
    pos: A.Pos


@dataclass(frozen=True, slots=True)
class Merge(Expr):
    """``+`` on records: ``records`` (both), ``each-left`` (a list of records and a record),
    ``each-right`` (a record and a list), ``seqs`` (two Seqs, element-wise)."""

    kind: Literal["records", "each-left", "each-right", "seqs"]
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Unary(Expr):
    op: str  # "-" or "not"
    operand: Expr


@dataclass(frozen=True, slots=True)
class Cond(Expr):
    cond: Expr
    then: Expr
    other: Expr


@dataclass(frozen=True, slots=True)
class ListOf(Expr):
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class RecordOf(Expr):
    names: tuple[str, ...]
    items: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Field(Expr):
    """``obj.name``: of a ``record``, of a Result's ``value`` (ok, value, error), or of
    ``each`` record of a list."""

    obj: Expr
    name: str
    of: Literal["record", "value", "each"]


@dataclass(frozen=True, slots=True)
class Project(Expr):
    """``obj[a, b]``: a record cut to ``names``, or each record of a list when ``each``."""

    obj: Expr
    names: tuple[str, ...]
    each: bool


@dataclass(frozen=True, slots=True)
class Guard(Expr):
    """``value when cond``."""

    value: Expr
    cond: Expr


@dataclass(frozen=True, slots=True)
class Branch(Expr):
    cases: tuple[tuple[Expr, Expr], ...]
    otherwise: Expr


@dataclass(frozen=True, slots=True)
class Arm:
    """One case of a ``match``: the test (``record``: has ``fields``; ``type``: is ``of``;
    ``any``), the run keys its fields are bound to (``binds``: key, field) and its body."""

    test: Literal["record", "type", "any"]
    fields: tuple[str, ...]
    of: Type | None
    binds: tuple[tuple[str, str], ...]
    body: Expr


@dataclass(frozen=True, slots=True)
class Match(Expr):
    subject: Expr
    arms: tuple[Arm, ...]
    pos: A.Pos


@dataclass(frozen=True, slots=True)
class HigherOrder(Expr):
    """``filter``/``map``/``all``/``any`` (items, (x) => body); ``param`` is x's run key."""

    kind: str
    items: Expr
    param: str
    body: Expr


@dataclass(frozen=True, slots=True)
class Interp(Expr):
    """A string with ``${expr}`` parts (the literal text is :class:`Const`)."""

    parts: tuple[Expr, ...]


# Declarations --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Binding:
    """``name = expr``, whose value the run stores under ``key`` (the name, or ``name@2`` for a
    rebound input). A binding that is a lifted call is the call's own node (or thunk)."""

    key: str
    expr: Expr


@dataclass(frozen=True, slots=True)
class Output:
    """An ``out``: the key of its value, and the lazy call it forces (with that call's deps)
    when the value is lazy."""

    name: str
    key: str
    lazy: bool
    deps: frozenset[str]


@dataclass(frozen=True, slots=True)
class TypedAnnotation:
    """An annotation's checked constant values (evaluated when the program is lowered)."""

    kind: str
    values: tuple[Expr, ...]
    props: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True, slots=True)
class ProgramIR:
    """A checked program: its typed inputs and outputs, its module calls in source order, and
    what the lower pass builds the run from (bindings, outputs, annotations and the input
    examples' expressions)."""

    inputs: Mapping[str, Type]
    outputs: Mapping[str, Type]
    calls: tuple[CallNode, ...]
    bindings: tuple[Binding, ...] = ()
    results: tuple[Output, ...] = ()
    annotations: Mapping[str, tuple[TypedAnnotation, ...]] = field(default_factory=dict)
    examples: Mapping[str, Expr] = field(default_factory=dict)

    def call(self, key: str) -> CallNode:
        """The call whose identity is ``key`` (a trace record's ``node``)."""
        for node in self.calls:
            if node.key == key:
                return node
        raise KeyError(key)
