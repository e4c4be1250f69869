"""Compiled expressions and the language forms beyond operators and calls: guards (``when``),
projections, record merges, element-wise field access, ``branch``, ``match`` and the
higher-order functions that take lambdas.

The compiler (``_compiler.py``) mixes :class:`ExpressionForms` in; each form type-checks its
parts, reports one diagnostic per mistake, and returns a :class:`CE` whose closure runs it.
Names bound inside a form (a lambda's parameter, a ``match`` case's fields) live in a child run:
a copy of the run's values plus the bound ones, so no other evaluation can see them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import _ast as A
from ._runtime import _Run
from ._types import (
    BOOLEAN,
    ERROR,
    FLOAT,
    INT,
    STRING,
    ErrorType,
    ListType,
    OptionalType,
    RecordType,
    SeqType,
    Type,
    UnionType,
    admits_none,
    conforms,
    elements,
    is_assignable,
    join,
)

__all__ = ["CE", "ExpressionForms", "Fn", "Var"]

Fn = Callable[[_Run], Any]


@dataclass(slots=True)
class CE:
    """A compiled expression: its type, closure, whether the closure is async, and the DAG
    nodes it reads (its dependencies)."""

    type: Type
    fn: Fn
    is_async: bool
    deps: frozenset[str]
    key: str | None = None  # set when the expression is a plain read of one value


@dataclass(slots=True)
class Var:
    key: str
    type: Type
    deps: frozenset[str]  # what a reader depends on: {key}, or a lazy value's own deps
    lazy: bool
    pos: A.Pos


def _const(value: Any) -> CE:
    t: Type
    if isinstance(value, bool):
        t = BOOLEAN
    elif isinstance(value, int):
        t = INT
    elif isinstance(value, float):
        t = FLOAT
    else:
        t = STRING
    return CE(t, lambda run: value, False, frozenset())


def _to_async(ce: CE) -> Callable[[_Run], Any]:
    if ce.is_async:
        return ce.fn
    f = ce.fn

    async def wrapped(run: _Run) -> Any:
        return f(run)

    return wrapped


def _start(e: A.Expr) -> A.Pos:
    """Where ``e`` begins in the source: a binary expression's and a field access's own position
    is their operator's (for errors about the operator); errors about the whole value point here.
    """
    while isinstance(e, A.Binary | A.FieldAccess):
        e = e.left if isinstance(e, A.Binary) else e.obj
    return e.pos


def _merge_record_types(a: RecordType, b: RecordType) -> RecordType:
    """``A + B``: A's fields in order (B's type where B has the field too), then B's others."""
    right = b.field_map()
    fields = [(n, right.get(n, t)) for n, t in a.fields]
    have = {n for n, _ in a.fields}
    fields += [(n, t) for n, t in b.fields if n not in have]
    return RecordType(tuple(fields))


def _merge_seqs(a: list[Any], b: list[Any]) -> list[Any]:
    if len(a) != len(b):
        raise ValueError(
            f"cannot merge sequences of different lengths element-wise ({len(a)} and {len(b)})"
        )
    return [{**x, **y} for x, y in zip(a, b, strict=True)]


def _pair(left: CE, right: CE, func: Callable[[Any, Any], Any], t: Type) -> CE:
    deps = left.deps | right.deps
    lf, rf = left.fn, right.fn
    if not left.is_async and not right.is_async:
        return CE(t, lambda run: func(lf(run), rf(run)), False, deps)
    la, ra = _to_async(left), _to_async(right)

    async def both(run: _Run) -> Any:
        return func(await la(run), await ra(run))

    return CE(t, both, True, deps)


def _has_fields(names: tuple[str, ...]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(n in v for n in names)


def _is_a(t: Type) -> Callable[[Any], bool]:
    return lambda v: conforms(v, t)


def _anything(v: Any) -> bool:
    return True


def _child(run: _Run, bound: Iterable[tuple[str, Any]]) -> _Run:
    env = dict(run.env)
    env.update(bound)
    return _Run(env, run.trace, run.t0)


class ExpressionForms:
    """The forms; mixed into the compiler, which provides the methods declared below."""

    scope: dict[str, Var]

    def expr(self, e: A.Expr, *, lifted: bool) -> CE:
        raise NotImplementedError

    def error(self, code: str, message: str, pos: A.Pos) -> None:
        raise NotImplementedError

    def new_key(self) -> str:
        raise NotImplementedError

    def type_of(self, te: A.TypeExpr) -> Type:
        raise NotImplementedError

    @staticmethod
    def _suggest(name: str, candidates: list[str]) -> str:
        raise NotImplementedError

    # Local names -------------------------------------------------------------------------------

    def bind(self, names: list[tuple[str, Type, A.Pos]]) -> tuple[list[str], list[Any]]:
        """Bind ``names`` for a body being compiled; returns their run keys and what to restore."""
        keys: list[str] = []
        saved: list[tuple[str, Var | None]] = []
        for name, t, pos in names:
            key = f"{self.new_key()}:{name}"  # "decl%n:name": no value or call has such a key
            saved.append((name, self.scope.get(name)))
            self.scope[name] = Var(key, t, frozenset(), False, pos)
            keys.append(key)
        return keys, saved

    def unbind(self, saved: list[tuple[str, Var | None]]) -> None:
        for name, var in reversed(saved):
            if var is None:
                del self.scope[name]
            else:
                self.scope[name] = var

    # Guards, branch ----------------------------------------------------------------------------

    def check_boolean(self, ce: CE, e: A.Expr, what: str) -> None:
        if not is_assignable(ce.type, BOOLEAN):
            self.error("E011", f"The condition of {what} must be Boolean, got {ce.type}", _start(e))

    def guard(self, e: A.Guard, lifted: bool) -> CE:
        cond = self.expr(e.cond, lifted=lifted)
        self.check_boolean(cond, e.cond, "'when'")
        # The guarded value is computed only when the condition holds (a conditional position).
        value = self.expr(e.expr, lifted=False)
        vt = value.type
        t = vt if admits_none(vt) or isinstance(vt, ErrorType) else OptionalType(vt)
        deps = cond.deps | value.deps
        cf, vf = cond.fn, value.fn
        if not cond.is_async and not value.is_async:
            return CE(t, lambda run: vf(run) if cf(run) else None, False, deps)
        ca, va = _to_async(cond), _to_async(value)

        async def guarded(run: _Run) -> Any:
            return await va(run) if await ca(run) else None

        return CE(t, guarded, True, deps)

    def branch(self, e: A.Branch, lifted: bool) -> CE:
        cases: list[tuple[CE, CE]] = []
        for i, (cond_e, value_e) in enumerate(e.cases):
            # Only the first condition is always evaluated; the rest are conditional.
            cond = self.expr(cond_e, lifted=lifted and i == 0)
            self.check_boolean(cond, cond_e, "a 'branch' case")
            cases.append((cond, self.expr(value_e, lifted=False)))
        other = self.expr(e.otherwise, lifted=False)
        t = other.type
        for _, value in reversed(cases):
            t = join(value.type, t)
        deps = other.deps.union(*(c.deps | v.deps for c, v in cases))
        if not other.is_async and not any(c.is_async or v.is_async for c, v in cases):
            pairs = tuple((c.fn, v.fn) for c, v in cases)
            of = other.fn

            def pick(run: _Run) -> Any:
                for cf, vf in pairs:
                    if cf(run):
                        return vf(run)
                return of(run)

            return CE(t, pick, False, deps)
        apairs = tuple((_to_async(c), _to_async(v)) for c, v in cases)
        oa = _to_async(other)

        async def apick(run: _Run) -> Any:
            for ca, va in apairs:
                if await ca(run):
                    return await va(run)
            return await oa(run)

        return CE(t, apick, True, deps)

    # Records: projection, element-wise access, merge ----------------------------------------

    def projection(self, e: A.Projection, lifted: bool) -> CE:
        obj = self.expr(e.obj, lifted=lifted)
        t = obj.type
        names = tuple(n for n, _ in e.fields)
        if isinstance(t, ErrorType):
            return CE(ERROR, obj.fn, obj.is_async, obj.deps)
        elem = elements(t)
        record = t if isinstance(t, RecordType) else elem
        if not isinstance(record, RecordType):
            self.error(
                "E012",
                f"Cannot project fields of a value of type {t} (a projection needs a record or "
                "a list of records)",
                e.pos,
            )
            return CE(ERROR, obj.fn, obj.is_async, obj.deps)
        have = record.field_map()
        missing = False
        for name, pos in e.fields:
            if name not in have:
                hint = self._suggest(name, list(have))
                self.error("E012", f"Record {record} has no field '{name}'{hint}", pos)
                missing = True
        if missing:
            return CE(ERROR, obj.fn, obj.is_async, obj.deps)
        cut = RecordType(tuple((n, have[n]) for n in names))

        def project(v: dict[str, Any]) -> dict[str, Any]:
            return {n: v[n] for n in names}

        func: Callable[[Any], Any] = project
        result: Type = cut
        if elem is not None:
            result = ListType(cut) if isinstance(t, ListType) else SeqType(cut)

            def func(vs: list[Any]) -> list[Any]:
                return [project(v) for v in vs]

        return self.apply(obj, func, result)

    @staticmethod
    def apply(obj: CE, func: Callable[[Any], Any], t: Type) -> CE:
        """``func`` applied to ``obj``'s value."""
        f = obj.fn
        if not obj.is_async:
            return CE(t, lambda run: func(f(run)), False, obj.deps)

        async def g(run: _Run) -> Any:
            return func(await f(run))

        return CE(t, g, True, obj.deps)

    def elementwise_field(self, obj: CE, name: str, pos: A.Pos) -> CE | None:
        """``users.name`` on a list (or Seq) of records: the list of each record's field."""
        t = obj.type
        elem = elements(t)
        if not isinstance(elem, RecordType):
            return None
        fields = elem.field_map()
        if name not in fields:
            hint = self._suggest(name, list(fields))
            self.error("E012", f"Record {elem} (in {t}) has no field '{name}'{hint}", pos)
            return CE(ERROR, obj.fn, obj.is_async, obj.deps)
        ft = fields[name]
        result = ListType(ft) if isinstance(t, ListType) else SeqType(ft)
        return self.apply(obj, lambda vs: [v[name] for v in vs], result)

    @staticmethod
    def merge(left: CE, right: CE) -> CE | None:
        """``a + b`` on records (the fields of both, b's win), on a record and a list of records
        (every element gets the record's fields) and on two Seqs of records (element-wise).
        None when ``+`` means something else for these types."""
        lt, rt = left.type, right.type
        le, re_ = elements(lt), elements(rt)
        if isinstance(lt, RecordType) and isinstance(rt, RecordType):
            return _pair(left, right, lambda a, b: {**a, **b}, _merge_record_types(lt, rt))
        if isinstance(le, RecordType) and isinstance(rt, RecordType):
            t = _merge_record_types(le, rt)
            lt_ = ListType(t) if isinstance(lt, ListType) else SeqType(t)
            return _pair(left, right, lambda xs, b: [{**x, **b} for x in xs], lt_)
        if isinstance(lt, RecordType) and isinstance(re_, RecordType):
            t = _merge_record_types(lt, re_)
            rt_ = ListType(t) if isinstance(rt, ListType) else SeqType(t)
            return _pair(left, right, lambda a, ys: [{**a, **y} for y in ys], rt_)
        if (
            isinstance(lt, SeqType)
            and isinstance(rt, SeqType)
            and isinstance(le, RecordType)
            and isinstance(re_, RecordType)
        ):
            return _pair(left, right, _merge_seqs, SeqType(_merge_record_types(le, re_)))
        return None

    # match ---------------------------------------------------------------------------------

    def match(self, e: A.Match, lifted: bool) -> CE:
        subject = self.expr(e.subject, lifted=lifted)
        st = subject.type
        members = st.members if isinstance(st, UnionType) else (st,)
        broken = isinstance(st, ErrorType)
        arms: list[tuple[Callable[[Any], bool], tuple[tuple[str, str], ...], CE]] = []
        covered: set[int] = set()
        for case in e.cases:
            bound: list[tuple[str, Type, A.Pos]] = []
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
                    hint = self._suggest(missing, have) if missing else ""
                    self.error(
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
                test = _has_fields(tuple(fields))
            elif case.kind == "type":
                assert case.type is not None
                pt = self.type_of(case.type)
                covered.update(i for i, m in enumerate(members) if is_assignable(m, pt))
                test = _is_a(pt)
            else:
                covered.update(range(len(members)))
                test = _anything

            keys, saved = self.bind(bound)
            body = self.expr(case.body, lifted=False)
            self.unbind(saved)
            arms.append((test, tuple(zip(keys, (b[0] for b in bound), strict=True)), body))
        uncovered = [str(m) for i, m in enumerate(members) if i not in covered]
        if uncovered and not broken:
            self.error(
                "E021",
                f"'match' does not cover {' | '.join(uncovered)} (add a case for it, or "
                "'_ -> value')",
                e.pos,
            )
        t = arms[0][2].type
        for _, _, body in arms[1:]:
            t = join(t, body.type)
        deps = subject.deps.union(*(body.deps for _, _, body in arms))
        line, col = e.pos
        sf = _to_async(subject)
        plan = tuple((test, binds, _to_async(body)) for test, binds, body in arms)

        async def run_match(run: _Run) -> Any:
            v = await sf(run)
            for test, binds, body in plan:
                if test(v):
                    inner = _child(run, ((k, v[f]) for k, f in binds)) if binds else run
                    return await body(inner)
            raise ValueError(f"no case of the 'match' at line {line}, column {col} fits {v!r}")

        return CE(t, run_match, True, deps)

    # Higher-order functions ----------------------------------------------------------------

    def higher_order(self, e: A.Call, kind: str, lifted: bool) -> CE:
        """``filter``/``map``/``all``/``any`` (items, (x) => body), compiled in place."""
        failed = CE(ERROR, lambda run: None, False, frozenset())
        if e.options:
            first = next(iter(e.options.values()))
            self.error(
                "E013",
                f"'{e.module}' takes no options: it is computed in place, not a module call",
                first.pos,
            )
        if len(e.args) != 2:
            self.error(
                "E010",
                f"'{e.module}' takes 2 arguments (a list and a lambda) but {len(e.args)} "
                f"{'was' if len(e.args) == 1 else 'were'} given",
                e.pos,
            )
            return failed
        items = self.expr(e.args[0], lifted=lifted)
        fn = e.args[1]
        it = items.type
        elem = elements(it)
        if elem is None and not isinstance(it, ErrorType):
            self.error(
                "E011",
                f"Argument 1 of '{e.module}' expects a List or Seq, got {it}",
                _start(e.args[0]),
            )
        if not isinstance(fn, A.Lambda):
            self.error(
                "E011",
                f"Argument 2 of '{e.module}' must be a lambda such as (x) => ...",
                _start(fn),
            )
            return failed
        if len(fn.params) != 1:
            self.error(
                "E010",
                f"The lambda given to '{e.module}' takes 1 parameter, not {len(fn.params)}",
                fn.pos,
            )
            return failed
        pname, ptype, ppos = fn.params[0]
        param_t: Type = ERROR if elem is None else elem
        if ptype is not None:
            declared = self.type_of(ptype)
            if elem is not None and not is_assignable(elem, declared):
                self.error(
                    "E011",
                    f"Parameter '{pname}' is declared {declared} but the elements are {elem}",
                    ppos,
                )
            param_t = declared
        (key,), saved = self.bind([(pname, param_t, ppos)])
        body = self.expr(fn.body, lifted=False)
        self.unbind(saved)
        if kind != "map" and not is_assignable(body.type, BOOLEAN):
            self.error(
                "E011",
                f"The lambda given to '{e.module}' must return Boolean, got {body.type}",
                _start(fn.body),
            )
        result: Type
        if kind == "filter":
            result = it if elem is not None else ERROR
        elif kind == "map":
            result = SeqType(body.type) if isinstance(it, SeqType) else ListType(body.type)
        else:
            result = BOOLEAN
        deps = items.deps | body.deps
        items_a, body_a = _to_async(items), _to_async(body)

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

        return CE(result, run_hof, True, deps)
