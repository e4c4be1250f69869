"""The check pass over expressions: each form's types, one diagnostic per mistake, and the
typed expression (``_ir.py``) it becomes.

``lifted`` says whether an expression is in an unconditional position: a module call there
becomes a DAG node of its own (or, with ``lazy``, a thunk) so independent calls run
concurrently; a call inside an ``if``/``else`` branch, on the right of ``??``/``and``/``or``, in a
``when`` value, a later ``branch`` case, a ``match`` arm, a lambda or a ``fallback:`` runs in
place, only when that part is taken. Module calls themselves are checked in ``_calls.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from . import _ast as A
from . import _ir as I
from ._calls import check_call
from ._stdlib import HIGHER_ORDER
from ._types import (
    BOOLEAN,
    ERROR,
    FLOAT,
    INT,
    NOTHING,
    STRING,
    ErrorType,
    ListType,
    OptionalType,
    RecordType,
    ResultType,
    SeqType,
    Type,
    UnionType,
    admits_none,
    elements,
    is_assignable,
    join,
    without_none,
)

if TYPE_CHECKING:
    from ._check import Checker

__all__ = ["check_expr", "check_higher_order", "merge_record_types"]

_NONE: frozenset[str] = frozenset()


def merge_record_types(a: RecordType, b: RecordType) -> RecordType:
    """``A + B``: A's fields in order (B's type where B has the field too), then B's others."""
    right = b.field_map()
    fields = [(n, right.get(n, t)) for n, t in a.fields]
    have = {n for n, _ in a.fields}
    fields += [(n, t) for n, t in b.fields if n not in have]
    return RecordType(tuple(fields))


def _numeric(t: Type) -> bool:
    return t in (INT, FLOAT) or isinstance(t, ErrorType)


def const(value: object) -> I.Const:
    t: Type
    if isinstance(value, bool):
        t = BOOLEAN
    elif isinstance(value, int):
        t = INT
    elif isinstance(value, float):
        t = FLOAT
    else:
        t = STRING
    return I.Const(t, _NONE, value)


def invalid() -> I.Invalid:
    return I.Invalid(ERROR, _NONE)


def check_expr(c: Checker, e: A.Expr, *, lifted: bool) -> I.Expr:
    """The typed form of ``e``; its mistakes are reported on ``c``."""
    if isinstance(e, A.Lit):
        return const(e.value)
    if isinstance(e, A.Name):
        return _name(c, e)
    if isinstance(e, A.Call):
        checked = check_call(c, e, lifted=lifted, key=None)
        return checked if checked is not None else invalid()
    if isinstance(e, A.Lambda):
        hof = ", ".join(HIGHER_ORDER.values())
        c.error("E011", f"A lambda can only be passed to {hof}", e.pos)
        return invalid()
    return _FORMS[type(e)](c, e, lifted)


def _name(c: Checker, e: A.Name) -> I.Expr:
    var = c.scope.get(e.name)
    if var is None:
        if e.name in c.later:
            line = c.later[e.name][0]
            c.error("E007", f"'{e.name}' is used before it is defined (at line {line})", e.pos)
        else:
            parts = e.name.split("-")
            if len(parts) > 1 and parts[0] in c.scope:
                # `total-tax` is one (hyphenated) name, as upstream reads it.
                spaced = " - ".join(parts)
                hint = f" (a hyphen joins a name: write '{spaced}' to subtract)"
            else:
                hint = c.suggest(e.name, list(c.scope))
            c.error("E007", f"Undefined name '{e.name}'{hint}", e.pos)
        return invalid()
    return I.Read(var.type, var.deps, var.key, var.lazy)


# Operators -------------------------------------------------------------------------------------


def _binary(c: Checker, e: A.Binary, lifted: bool) -> I.Expr:
    op = e.op
    left = check_expr(c, e.left, lifted=lifted)
    # The right side of ?? / and / or is evaluated only when needed: conditional position.
    conditional = op in ("??", "and", "or")
    right = check_expr(c, e.right, lifted=lifted and not conditional)
    lt, rt = left.type, right.type
    deps = left.deps | right.deps
    if op == "??":
        return I.Logic(join(without_none(lt), rt), deps, op, left, right)
    if op in ("and", "or"):
        for side, st in ((e.left, lt), (e.right, rt)):
            if not is_assignable(st, BOOLEAN):
                c.error("E011", f"Operator '{op}' needs Boolean operands, got {st}", A.start(side))
        return I.Logic(BOOLEAN, deps, op, left, right)
    t: Type
    if op in ("==", "!=", "<", ">", "<=", ">="):
        if op in ("==", "!="):
            ok = is_assignable(lt, rt) or is_assignable(rt, lt)
        else:
            ok = (_numeric(lt) and _numeric(rt)) or (
                is_assignable(lt, STRING) and is_assignable(rt, STRING)
            )
        if not ok:
            c.error("E011", f"Cannot compare {lt} with {rt} using '{op}'", e.pos)
        t = BOOLEAN
    elif isinstance(lt, ErrorType) or isinstance(rt, ErrorType):
        t = ERROR  # the operand's own error is reported: one mistake, one diagnostic
    elif op == "+" and (merged := _merge(left, right)) is not None:
        return merged
    elif _numeric(lt) and _numeric(rt):
        t = FLOAT if FLOAT in (lt, rt) else INT
    elif op == "+" and is_assignable(lt, STRING) and is_assignable(rt, STRING):
        t = STRING
    elif op == "+" and isinstance(lt, ListType) and isinstance(rt, ListType):
        t = ListType(join(lt.elem, rt.elem))
    elif op == "+" and elements(lt) is not None and elements(rt) is not None:
        t = join(lt, rt)  # concatenation of sequences
    else:
        c.error("E011", f"Operator '{op}' cannot be applied to {lt} and {rt}", e.pos)
        t = ERROR
    return I.Binary(t, deps, op, left, right, e.pos)


def _merge(left: I.Expr, right: I.Expr) -> I.Merge | None:
    """``a + b`` on records (the fields of both, b's win), on a record and a list of records
    (every element gets the record's fields) and on two Seqs of records (element-wise).
    None when ``+`` means something else for these types."""
    lt, rt = left.type, right.type
    le, re_ = elements(lt), elements(rt)
    deps = left.deps | right.deps
    if isinstance(lt, RecordType) and isinstance(rt, RecordType):
        return I.Merge(merge_record_types(lt, rt), deps, "records", left, right)
    if isinstance(le, RecordType) and isinstance(rt, RecordType):
        t = merge_record_types(le, rt)
        lt_ = ListType(t) if isinstance(lt, ListType) else SeqType(t)
        return I.Merge(lt_, deps, "each-left", left, right)
    if isinstance(lt, RecordType) and isinstance(re_, RecordType):
        t = merge_record_types(lt, re_)
        rt_ = ListType(t) if isinstance(rt, ListType) else SeqType(t)
        return I.Merge(rt_, deps, "each-right", left, right)
    if (
        isinstance(lt, SeqType)
        and isinstance(rt, SeqType)
        and isinstance(le, RecordType)
        and isinstance(re_, RecordType)
    ):
        return I.Merge(SeqType(merge_record_types(le, re_)), deps, "seqs", left, right)
    return None


def _unary(c: Checker, e: A.Unary, lifted: bool) -> I.Expr:
    inner = check_expr(c, e.operand, lifted=lifted)
    t: Type
    if e.op == "not":
        if not is_assignable(inner.type, BOOLEAN):
            c.error("E011", f"Operator 'not' needs a Boolean, got {inner.type}", e.pos)
        t = BOOLEAN
    else:
        if not _numeric(inner.type):
            c.error("E011", f"Operator '-' needs a number, got {inner.type}", e.pos)
        t = inner.type
    return I.Unary(t, inner.deps, e.op, inner)


def _check_boolean(c: Checker, x: I.Expr, e: A.Expr, what: str) -> None:
    if not is_assignable(x.type, BOOLEAN):
        c.error("E011", f"The condition of {what} must be Boolean, got {x.type}", A.start(e))


def _cond(c: Checker, e: A.Cond, lifted: bool) -> I.Expr:
    cond = check_expr(c, e.cond, lifted=lifted)
    _check_boolean(c, cond, e.cond, "'if'")
    a = check_expr(c, e.then, lifted=False)
    b = check_expr(c, e.other, lifted=False)
    return I.Cond(join(a.type, b.type), cond.deps | a.deps | b.deps, cond, a, b)


def _guard(c: Checker, e: A.Guard, lifted: bool) -> I.Expr:
    cond = check_expr(c, e.cond, lifted=lifted)
    _check_boolean(c, cond, e.cond, "'when'")
    # The guarded value is computed only when the condition holds (a conditional position).
    value = check_expr(c, e.expr, lifted=False)
    vt = value.type
    t = vt if admits_none(vt) or isinstance(vt, ErrorType) else OptionalType(vt)
    return I.Guard(t, cond.deps | value.deps, value, cond)


def _branch(c: Checker, e: A.Branch, lifted: bool) -> I.Expr:
    cases: list[tuple[I.Expr, I.Expr]] = []
    for i, (cond_e, value_e) in enumerate(e.cases):
        # Only the first condition is always evaluated; the rest are conditional.
        cond = check_expr(c, cond_e, lifted=lifted and i == 0)
        _check_boolean(c, cond, cond_e, "a 'branch' case")
        cases.append((cond, check_expr(c, value_e, lifted=False)))
    other = check_expr(c, e.otherwise, lifted=False)
    t = other.type
    for _, value in reversed(cases):
        t = join(value.type, t)
    deps = other.deps.union(*(k.deps | v.deps for k, v in cases))
    return I.Branch(t, deps, tuple(cases), other)


# Lists, records, strings -----------------------------------------------------------------------


def _list_lit(c: Checker, e: A.ListLit, lifted: bool) -> I.Expr:
    items = tuple(check_expr(c, x, lifted=lifted) for x in e.items)
    t: Type = NOTHING
    for i in items:
        t = join(t, i.type)
    return I.ListOf(ListType(t), _NONE.union(*(i.deps for i in items)), items)


def _record_lit(c: Checker, e: A.RecordLit, lifted: bool) -> I.Expr:
    items = tuple(check_expr(c, x, lifted=lifted) for _, x, _ in e.fields)
    names = tuple(n for n, _, _ in e.fields)
    t = RecordType(tuple((n, i.type) for n, i in zip(names, items, strict=True)))
    return I.RecordOf(t, _NONE.union(*(i.deps for i in items)), names, items)


def _interp(c: Checker, e: A.Interp, lifted: bool) -> I.Expr:
    parts = tuple(
        const(p) if isinstance(p, str) else check_expr(c, p, lifted=lifted) for p in e.parts
    )
    return I.Interp(STRING, _NONE.union(*(p.deps for p in parts)), parts)


def _field(c: Checker, e: A.FieldAccess, lifted: bool) -> I.Expr:
    obj = check_expr(c, e.obj, lifted=lifted)
    t = obj.type
    elem = elements(t)
    if isinstance(elem, RecordType):
        # `users.name` on a list (or Seq) of records: the list of each record's field.
        fields = elem.field_map()
        if e.name not in fields:
            hint = c.suggest(e.name, list(fields))
            c.error("E012", f"Record {elem} (in {t}) has no field '{e.name}'{hint}", e.name_pos)
            return invalid()
        ft = fields[e.name]
        result = ListType(ft) if isinstance(t, ListType) else SeqType(ft)
        return I.Field(result, obj.deps, obj, e.name, "each")
    ft = _field_type(c, t, e.name, e.name_pos)
    return I.Field(ft, obj.deps, obj, e.name, "record" if isinstance(t, RecordType) else "value")


def _field_type(c: Checker, t: Type, name: str, pos: A.Pos) -> Type:
    if isinstance(t, ErrorType):
        return ERROR
    if isinstance(t, RecordType):
        fields = t.field_map()
        if name in fields:
            return fields[name]
        hint = c.suggest(name, list(fields))
        c.error("E012", f"Record {t} has no field '{name}'{hint}", pos)
        return ERROR
    if isinstance(t, ResultType):
        rf = t.field_types()
        if name in rf:
            return rf[name]
        c.error("E012", f"{t} has no field '{name}' (it has ok, value, error)", pos)
        return ERROR
    if isinstance(t, UnionType) and all(isinstance(m, RecordType) for m in t.members):
        found = [m.field_map().get(name) for m in t.members if isinstance(m, RecordType)]
        if all(f is not None for f in found):
            out: Type = NOTHING
            for f in found:
                assert f is not None
                out = join(out, f)
            return out
        c.error("E012", f"Not every member of {t} has a field '{name}'", pos)
        return ERROR
    if isinstance(t, OptionalType):
        c.error(
            "E012",
            f"Cannot read field '{name}' of an optional value ({t}); give a default first with ??",
            pos,
        )
        return ERROR
    c.error("E012", f"Cannot read field '{name}' of a value of type {t}", pos)
    return ERROR


def _projection(c: Checker, e: A.Projection, lifted: bool) -> I.Expr:
    obj = check_expr(c, e.obj, lifted=lifted)
    t = obj.type
    if isinstance(t, ErrorType):
        return invalid()
    elem = elements(t)
    record = t if isinstance(t, RecordType) else elem
    if not isinstance(record, RecordType):
        c.error(
            "E012",
            f"Cannot project fields of a value of type {t} (a projection needs a record or "
            "a list of records)",
            e.pos,
        )
        return invalid()
    have = record.field_map()
    missing = False
    for name, pos in e.fields:
        if name not in have:
            hint = c.suggest(name, list(have))
            c.error("E012", f"Record {record} has no field '{name}'{hint}", pos)
            missing = True
    if missing:
        return invalid()
    names = tuple(n for n, _ in e.fields)
    cut = RecordType(tuple((n, have[n]) for n in names))
    result: Type = cut
    if elem is not None:
        result = ListType(cut) if isinstance(t, ListType) else SeqType(cut)
    return I.Project(result, obj.deps, obj, names, elem is not None)


# match -----------------------------------------------------------------------------------------


def _match(c: Checker, e: A.Match, lifted: bool) -> I.Expr:
    subject = check_expr(c, e.subject, lifted=lifted)
    st = subject.type
    members = st.members if isinstance(st, UnionType) else (st,)
    broken = isinstance(st, ErrorType)
    arms: list[I.Arm] = []
    covered: set[int] = set()
    for case in e.cases:
        bound: list[tuple[str, Type, A.Pos]] = []
        pt: Type | None = None
        if case.kind == "record":
            fields = case.fields
            fits = [
                i
                for i, m in enumerate(members)
                if isinstance(m, RecordType) and all(f in m.field_map() for f in fields)
            ]
            if not fits and not broken:
                have = [n for m in members if isinstance(m, RecordType) for n, _ in m.fields]
                missing = next(f for f in fields if f not in have) if fields else ""
                hint = c.suggest(missing, have) if missing else ""
                c.error(
                    "E012",
                    f"No member of {st} has the field{'s' * (len(fields) > 1)} "
                    f"{', '.join(fields)}{hint}",
                    case.pos,
                )
            covered.update(fits)
            records = [m for i, m in enumerate(members) if i in fits]
            for f in fields:
                ft: Type = ERROR
                for r in records:
                    assert isinstance(r, RecordType)
                    ft = r.field_map()[f] if ft is ERROR else join(ft, r.field_map()[f])
                bound.append((f, ft, case.pos))
        elif case.kind == "type":
            assert case.type is not None
            pt = c.type_of(case.type)
            covered.update(i for i, m in enumerate(members) if is_assignable(m, pt))
        else:
            covered.update(range(len(members)))
        keys, saved = c.bind(bound)
        body = check_expr(c, case.body, lifted=False)
        c.unbind(saved)
        binds = tuple(zip(keys, (b[0] for b in bound), strict=True))
        test: Literal["record", "type", "any"] = (
            "record" if case.kind == "record" else "type" if case.kind == "type" else "any"
        )
        arms.append(I.Arm(test, tuple(case.fields), pt, binds, body))
    uncovered = [str(m) for i, m in enumerate(members) if i not in covered]
    if uncovered and not broken:
        c.error(
            "E021",
            f"'match' does not cover {' | '.join(uncovered)} (add a case for it, or '_ -> value')",
            e.pos,
        )
    t = arms[0].body.type
    for arm in arms[1:]:
        t = join(t, arm.body.type)
    deps = subject.deps.union(*(arm.body.deps for arm in arms))
    return I.Match(t, deps, subject, tuple(arms), e.pos)


# Higher-order functions ------------------------------------------------------------------------


def check_higher_order(c: Checker, e: A.Call, kind: str, lifted: bool) -> I.Expr:
    """``filter``/``map``/``all``/``any`` (items, (x) => body), computed in place."""
    if e.options:
        first = next(iter(e.options.values()))
        c.error(
            "E013",
            f"'{e.module}' takes no options: it is computed in place, not a module call",
            first.pos,
        )
    if len(e.args) != 2:
        c.error(
            "E010",
            f"'{e.module}' takes 2 arguments (a list and a lambda) but {len(e.args)} "
            f"{'was' if len(e.args) == 1 else 'were'} given",
            e.pos,
        )
        return invalid()
    items = check_expr(c, e.args[0], lifted=lifted)
    fn = e.args[1]
    it = items.type
    elem = elements(it)
    if elem is None and not isinstance(it, ErrorType):
        c.error(
            "E011",
            f"Argument 1 of '{e.module}' expects a List or Seq, got {it}",
            A.start(e.args[0]),
        )
    if not isinstance(fn, A.Lambda):
        c.error(
            "E011", f"Argument 2 of '{e.module}' must be a lambda such as (x) => ...", A.start(fn)
        )
        return invalid()
    if len(fn.params) != 1:
        c.error(
            "E010",
            f"The lambda given to '{e.module}' takes 1 parameter, not {len(fn.params)}",
            fn.pos,
        )
        return invalid()
    pname, ptype, ppos = fn.params[0]
    param_t: Type = ERROR if elem is None else elem
    if ptype is not None:
        declared = c.type_of(ptype)
        if elem is not None and not is_assignable(elem, declared):
            c.error(
                "E011",
                f"Parameter '{pname}' is declared {declared} but the elements are {elem}",
                ppos,
            )
        param_t = declared
    (key,), saved = c.bind([(pname, param_t, ppos)])
    body = check_expr(c, fn.body, lifted=False)
    c.unbind(saved)
    if kind != "map" and not is_assignable(body.type, BOOLEAN):
        c.error(
            "E011",
            f"The lambda given to '{e.module}' must return Boolean, got {body.type}",
            A.start(fn.body),
        )
    result: Type
    if kind == "filter":
        result = it if elem is not None else ERROR
    elif kind == "map":
        result = SeqType(body.type) if isinstance(it, SeqType) else ListType(body.type)
    else:
        result = BOOLEAN
    return I.HigherOrder(result, items.deps | body.deps, kind, items, key, body)


_FORMS: dict[type, Callable[[Checker, Any, bool], I.Expr]] = {
    A.Binary: _binary,
    A.Unary: _unary,
    A.Cond: _cond,
    A.ListLit: _list_lit,
    A.RecordLit: _record_lit,
    A.FieldAccess: _field,
    A.Guard: _guard,
    A.Projection: _projection,
    A.Branch: _branch,
    A.Match: _match,
    A.Interp: _interp,
}
