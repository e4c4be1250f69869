"""The lower pass over expressions: each typed expression (``_ir.py``) becomes a closure
``fn(run) -> value``, a synchronous one unless it must await (it forces a lazy value, makes a
call in place, or runs a ``match`` or a higher-order function).

Names bound inside a form (a lambda's parameter, a ``match`` case's fields) live in a child run:
a copy of the run's values plus the bound ones, so no other evaluation can see them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _ir as I
from ._runtime import _Run, error_text, lazy_ref, render_text
from ._types import Type, conforms

if TYPE_CHECKING:
    from ._lower import Lowering

__all__ = ["Closure", "Fn", "lower_expr"]

Fn = Callable[[_Run], Any]


@dataclass(frozen=True, slots=True)
class Closure:
    """A lowered expression: its closure, whether the closure is async, and the run key it
    reads when it is a plain read of one value (a call's arguments are then read at once)."""

    fn: Fn
    is_async: bool
    key: str | None = None


def lower_expr(lw: Lowering, x: I.Expr) -> Closure:
    """The closure of ``x``; the calls in it are added to ``lw``."""
    if isinstance(x, I.Call):
        return lw.call(x)
    return _FORMS[type(x)](lw, x)


def _to_async(c: Closure) -> Fn:
    if c.is_async:
        return c.fn
    f = c.fn

    async def wrapped(run: _Run) -> Any:
        return f(run)

    return wrapped


def _apply(obj: Closure, func: Callable[[Any], Any]) -> Closure:
    """``func`` applied to ``obj``'s value."""
    f = obj.fn
    if not obj.is_async:
        return Closure(lambda run: func(f(run)), False)

    async def g(run: _Run) -> Any:
        return func(await f(run))

    return Closure(g, True)


def _pair(left: Closure, right: Closure, func: Callable[[Any, Any], Any]) -> Closure:
    lf, rf = left.fn, right.fn
    if not left.is_async and not right.is_async:
        return Closure(lambda run: func(lf(run), rf(run)), False)
    la, ra = _to_async(left), _to_async(right)

    async def both(run: _Run) -> Any:
        return func(await la(run), await ra(run))

    return Closure(both, True)


def _many(items: Iterable[Closure]) -> Closure:
    """A closure producing the list of ``items``' values (async if any item is)."""
    items = tuple(items)
    if not any(i.is_async for i in items):
        fns = tuple(i.fn for i in items)
        return Closure(lambda run: [f(run) for f in fns], False)
    afns = tuple(_to_async(i) for i in items)

    async def g(run: _Run) -> list[Any]:
        return [await f(run) for f in afns]

    return Closure(g, True)


def _child(run: _Run, bound: Iterable[tuple[str, Any]]) -> _Run:
    env = dict(run.env)
    env.update(bound)
    return _Run(env, run.trace, run.t0)


# Values and operators --------------------------------------------------------------------------


def _invalid(lw: Lowering, x: I.Invalid) -> Closure:
    raise AssertionError("a program with errors is not lowered")


def _const(lw: Lowering, x: I.Const) -> Closure:
    value = x.value
    return Closure(lambda run: value, False)


def _read(lw: Lowering, x: I.Read) -> Closure:
    key = x.key
    if x.lazy:
        return Closure(lazy_ref(key), True)
    return Closure(lambda run: run.env[key], False, key)


def _logic(lw: Lowering, x: I.Logic) -> Closure:
    left, right = lower_expr(lw, x.left), lower_expr(lw, x.right)
    lf, rf = left.fn, right.fn
    sync = not left.is_async and not right.is_async
    if x.op == "??":
        if sync:
            return Closure(lambda run: v if (v := lf(run)) is not None else rf(run), False)
        la, ra = _to_async(left), _to_async(right)

        async def coalesce(run: _Run) -> Any:
            v = await la(run)
            return v if v is not None else await ra(run)

        return Closure(coalesce, True)
    is_and = x.op == "and"
    if sync:
        if is_and:
            return Closure(lambda run: lf(run) and rf(run), False)
        return Closure(lambda run: lf(run) or rf(run), False)
    la, ra = _to_async(left), _to_async(right)

    async def logic(run: _Run) -> Any:
        v = await la(run)
        if bool(v) != is_and:
            return v
        return await ra(run)

    return Closure(logic, True)


def _divide(pos: tuple[int, int]) -> Callable[[Any, Any], Any]:
    def div(a: Any, b: Any) -> Any:
        if b == 0:
            raise ZeroDivisionError(f"division by zero at line {pos[0]}, column {pos[1]}")
        if type(a) is int and type(b) is int:
            # Int / Int is an Int truncated toward zero, as upstream's 64-bit division.
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return a / b

    return div


_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


def _binary(lw: Lowering, x: I.Binary) -> Closure:
    func = _divide(x.pos) if x.op == "/" else _OPERATORS[x.op]
    return _pair(lower_expr(lw, x.left), lower_expr(lw, x.right), func)


def _merge_seqs(a: list[Any], b: list[Any]) -> list[Any]:
    if len(a) != len(b):
        raise ValueError(
            f"cannot merge sequences of different lengths element-wise ({len(a)} and {len(b)})"
        )
    return [{**x, **y} for x, y in zip(a, b, strict=True)]


_MERGES: dict[str, Callable[[Any, Any], Any]] = {
    "records": lambda a, b: {**a, **b},
    "each-left": lambda xs, b: [{**x, **b} for x in xs],
    "each-right": lambda a, ys: [{**a, **y} for y in ys],
    "seqs": _merge_seqs,
}


def _merge(lw: Lowering, x: I.Merge) -> Closure:
    return _pair(lower_expr(lw, x.left), lower_expr(lw, x.right), _MERGES[x.kind])


def _unary(lw: Lowering, x: I.Unary) -> Closure:
    func = operator.not_ if x.op == "not" else operator.neg
    return _apply(lower_expr(lw, x.operand), func)


def _cond(lw: Lowering, x: I.Cond) -> Closure:
    c, a, b = lower_expr(lw, x.cond), lower_expr(lw, x.then), lower_expr(lw, x.other)
    cf, af, bf = c.fn, a.fn, b.fn
    if not (c.is_async or a.is_async or b.is_async):
        return Closure(lambda run: af(run) if cf(run) else bf(run), False)
    ca, aa, ba = _to_async(c), _to_async(a), _to_async(b)

    async def g(run: _Run) -> Any:
        return await aa(run) if await ca(run) else await ba(run)

    return Closure(g, True)


def _guard(lw: Lowering, x: I.Guard) -> Closure:
    cond, value = lower_expr(lw, x.cond), lower_expr(lw, x.value)
    cf, vf = cond.fn, value.fn
    if not cond.is_async and not value.is_async:
        return Closure(lambda run: vf(run) if cf(run) else None, False)
    ca, va = _to_async(cond), _to_async(value)

    async def guarded(run: _Run) -> Any:
        return await va(run) if await ca(run) else None

    return Closure(guarded, True)


def _branch(lw: Lowering, x: I.Branch) -> Closure:
    cases = [(lower_expr(lw, c), lower_expr(lw, v)) for c, v in x.cases]
    other = lower_expr(lw, x.otherwise)
    if not other.is_async and not any(c.is_async or v.is_async for c, v in cases):
        pairs = tuple((c.fn, v.fn) for c, v in cases)
        of = other.fn

        def pick(run: _Run) -> Any:
            for cf, vf in pairs:
                if cf(run):
                    return vf(run)
            return of(run)

        return Closure(pick, False)
    apairs = tuple((_to_async(c), _to_async(v)) for c, v in cases)
    oa = _to_async(other)

    async def apick(run: _Run) -> Any:
        for ca, va in apairs:
            if await ca(run):
                return await va(run)
        return await oa(run)

    return Closure(apick, True)


# Lists, records, strings -----------------------------------------------------------------------


def _list_of(lw: Lowering, x: I.ListOf) -> Closure:
    return _many(lower_expr(lw, i) for i in x.items)


def _record_of(lw: Lowering, x: I.RecordOf) -> Closure:
    names = x.names
    many = _many(lower_expr(lw, i) for i in x.items)
    return _apply(many, lambda values: dict(zip(names, values, strict=True)))


def _get_field(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value[name]
    # Ok/Err of `on_error: wrap`
    if name == "ok":
        return bool(value.ok)
    if name == "value":
        return value.value if value.ok else None
    if name == "error":
        return None if value.ok else error_text(value.error)
    raise KeyError(name)


def _field(lw: Lowering, x: I.Field) -> Closure:
    obj = lower_expr(lw, x.obj)
    name = x.name
    if x.of == "each":
        return _apply(obj, lambda vs: [v[name] for v in vs])
    f = obj.fn
    if not obj.is_async:
        if x.of == "record":
            return Closure(lambda run: f(run)[name], False)
        return Closure(lambda run: _get_field(f(run), name), False)
    return _apply(obj, lambda v: _get_field(v, name))


def _project(lw: Lowering, x: I.Project) -> Closure:
    names = x.names

    def project(v: dict[str, Any]) -> dict[str, Any]:
        return {n: v[n] for n in names}

    func: Callable[[Any], Any] = project
    if x.each:

        def func(vs: list[Any]) -> list[Any]:
            return [project(v) for v in vs]

    return _apply(lower_expr(lw, x.obj), func)


def _interp(lw: Lowering, x: I.Interp) -> Closure:
    many = _many(lower_expr(lw, p) for p in x.parts)
    return _apply(many, lambda values: "".join(map(render_text, values)))


# match, higher-order functions -----------------------------------------------------------------


def _test(arm: I.Arm) -> Callable[[Any], bool]:
    if arm.test == "record":
        names = arm.fields
        return lambda v: isinstance(v, dict) and all(n in v for n in names)
    if arm.test == "type":
        t: Type | None = arm.of
        assert t is not None
        return lambda v: conforms(v, t)
    return lambda v: True


def _match(lw: Lowering, x: I.Match) -> Closure:
    sf = _to_async(lower_expr(lw, x.subject))
    plan = tuple((_test(arm), arm.binds, _to_async(lower_expr(lw, arm.body))) for arm in x.arms)
    line, col = x.pos

    async def run_match(run: _Run) -> Any:
        v = await sf(run)
        for test, binds, body in plan:
            if test(v):
                inner = _child(run, ((k, v[f]) for k, f in binds)) if binds else run
                return await body(inner)
        raise ValueError(f"no case of the 'match' at line {line}, column {col} fits {v!r}")

    return Closure(run_match, True)


def _higher_order(lw: Lowering, x: I.HigherOrder) -> Closure:
    items_a = _to_async(lower_expr(lw, x.items))
    body_a = _to_async(lower_expr(lw, x.body))
    kind, key = x.kind, x.param

    async def run_hof(run: _Run) -> Any:
        values = await items_a(run)
        inner = _child(run, ())
        env = inner.env
        out: list[Any] = []
        for v in values:
            env[key] = v  # one element at a time: the body is awaited before the next
            r = await body_a(inner)
            if kind == "filter":
                if r:
                    out.append(v)
            elif kind == "map":
                out.append(r)
            elif bool(r) != (kind == "all"):
                return kind == "any"
        return out if kind in ("filter", "map") else kind == "all"

    return Closure(run_hof, True)


_FORMS: dict[type, Callable[[Lowering, Any], Closure]] = {
    I.Invalid: _invalid,
    I.Const: _const,
    I.Read: _read,
    I.Logic: _logic,
    I.Binary: _binary,
    I.Merge: _merge,
    I.Unary: _unary,
    I.Cond: _cond,
    I.Guard: _guard,
    I.Branch: _branch,
    I.ListOf: _list_of,
    I.RecordOf: _record_of,
    I.Field: _field,
    I.Project: _project,
    I.Interp: _interp,
    I.Match: _match,
    I.HigherOrder: _higher_order,
}
