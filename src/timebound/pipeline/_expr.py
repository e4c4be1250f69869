"""Vectorised expressions over keys (``pl.col("a") + 1``), stored as JSON and evaluated with
``pyarrow.compute``."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Expr", "col", "lit"]

# op -> (arity, pyarrow.compute function). Kleene logic for and/or: null-aware like SQL.
_FUNCS: dict[str, tuple[int, Callable[..., Any]]] = {
    "add": (2, pc.add_checked),
    "subtract": (2, pc.subtract_checked),
    "multiply": (2, pc.multiply_checked),
    "divide": (2, pc.divide),
    "equal": (2, pc.equal),
    "not_equal": (2, pc.not_equal),
    "less": (2, pc.less),
    "less_equal": (2, pc.less_equal),
    "greater": (2, pc.greater),
    "greater_equal": (2, pc.greater_equal),
    "and": (2, pc.and_kleene),
    "or": (2, pc.or_kleene),
    "not": (1, pc.invert),
    "negate": (1, pc.negate_checked),
    "is_null": (1, pc.is_null),
    "fill_null": (2, pc.fill_null),
}


def _wrap(value: object) -> Expr:
    if isinstance(value, Expr):
        return value
    return lit(value)


class Expr:
    """An expression tree; build it with :func:`col`, :func:`lit` and Python operators."""

    __slots__ = ("_node",)
    __hash__ = None  # type: ignore[assignment]  # == builds an expression, it does not compare

    def __init__(self, node: dict[str, Any]) -> None:
        self._node = node

    def to_json(self) -> dict[str, Any]:
        return self._node

    def _call(self, fn: str, *others: object) -> Expr:
        return Expr({"fn": fn, "args": [self._node, *(_wrap(o)._node for o in others)]})

    def _rcall(self, fn: str, other: object) -> Expr:
        return Expr({"fn": fn, "args": [_wrap(other)._node, self._node]})

    def __add__(self, other: object) -> Expr:
        return self._call("add", other)

    def __radd__(self, other: object) -> Expr:
        return self._rcall("add", other)

    def __sub__(self, other: object) -> Expr:
        return self._call("subtract", other)

    def __rsub__(self, other: object) -> Expr:
        return self._rcall("subtract", other)

    def __mul__(self, other: object) -> Expr:
        return self._call("multiply", other)

    def __rmul__(self, other: object) -> Expr:
        return self._rcall("multiply", other)

    def __truediv__(self, other: object) -> Expr:
        return self._call("divide", other)

    def __rtruediv__(self, other: object) -> Expr:
        return self._rcall("divide", other)

    def __eq__(self, other: object) -> Expr:  # type: ignore[override]
        return self._call("equal", other)

    def __ne__(self, other: object) -> Expr:  # type: ignore[override]
        return self._call("not_equal", other)

    def __lt__(self, other: object) -> Expr:
        return self._call("less", other)

    def __le__(self, other: object) -> Expr:
        return self._call("less_equal", other)

    def __gt__(self, other: object) -> Expr:
        return self._call("greater", other)

    def __ge__(self, other: object) -> Expr:
        return self._call("greater_equal", other)

    def __and__(self, other: object) -> Expr:
        return self._call("and", other)

    def __or__(self, other: object) -> Expr:
        return self._call("or", other)

    def __invert__(self) -> Expr:
        return self._call("not")

    def __neg__(self) -> Expr:
        return self._call("negate")

    def __bool__(self) -> bool:
        raise TypeError("an expression has no truth value; combine conditions with & | ~")

    def is_null(self) -> Expr:
        return self._call("is_null")

    def fill_null(self, value: object) -> Expr:
        return self._call("fill_null", value)

    def __repr__(self) -> str:
        return f"Expr({self._node!r})"


def col(key: str) -> Expr:
    """The column of key ``key``."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"col() takes a key id, got {key!r}")
    return Expr({"col": key})


def lit(value: object) -> Expr:
    """A constant (None, bool, int, finite float or str)."""
    if not (value is None or isinstance(value, bool | int | float | str)):
        raise TypeError(f"{value!r} is not an expression constant")
    if isinstance(value, float) and not math.isfinite(value):
        raise TypeError(f"{value!r} cannot be stored in a plan")
    return Expr({"lit": value})


def columns(node: Mapping[str, Any]) -> set[str]:
    """The keys an expression (JSON form) reads."""
    if "col" in node:
        return {node["col"]}
    if "fn" in node:
        out: set[str] = set()
        for a in node["args"]:
            out |= columns(a)
        return out
    return set()


# Deeper expressions are refused: evaluation recurses, and no real expression comes close.
MAX_DEPTH = 64


def check(node: object, path: str = "expr", depth: int = 0) -> None:
    """Raise ValueError naming where a (possibly hostile) JSON expression is malformed."""
    if depth > MAX_DEPTH:
        raise ValueError(f"{path}: expression nested more than {MAX_DEPTH} deep")
    if not isinstance(node, dict):
        raise ValueError(f"{path}: an expression is an object, got {type(node).__name__}")
    if set(node) == {"col"}:
        if not isinstance(node["col"], str):
            raise ValueError(f"{path}.col: a key id string is expected")
        return
    if set(node) == {"lit"}:
        v = node["lit"]
        if not (v is None or isinstance(v, bool | int | float | str)):
            raise ValueError(f"{path}.lit: a scalar is expected")
        return
    if set(node) == {"fn", "args"}:
        spec = _FUNCS.get(node["fn"]) if isinstance(node["fn"], str) else None
        if spec is None:
            raise ValueError(f"{path}.fn: unknown function {node['fn']!r}")
        args = node["args"]
        if not isinstance(args, list) or len(args) != spec[0]:
            raise ValueError(f"{path}.args: {node['fn']} takes {spec[0]} argument(s)")
        for i, a in enumerate(args):
            check(a, f"{path}.args[{i}]", depth + 1)
        return
    raise ValueError(f"{path}: unknown expression form with fields {sorted(node)}")


def evaluate(node: Mapping[str, Any], column: Callable[[str], pa.Array], nrows: int) -> Any:
    """Evaluate on columns of ``nrows`` rows; a literal alone becomes a column."""
    value = _eval(node, column)
    if isinstance(value, pa.Scalar):
        return pa.array([value.as_py()] * nrows, type=value.type)
    return value


def _eval(node: Mapping[str, Any], column: Callable[[str], pa.Array]) -> Any:
    if "col" in node:
        return column(node["col"])
    if "lit" in node:
        return pa.scalar(node["lit"])
    fn = _FUNCS[node["fn"]][1]
    return fn(*(_eval(a, column) for a in node["args"]))
