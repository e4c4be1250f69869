"""Type checking and compilation of a parsed program into a DAG of calls and closures.

Every expression compiles to a closure ``fn(run) -> value`` (or an ``async`` one when it must
await: it forces a lazy value or makes a call in a conditional position). Calls in unconditional
positions are *lifted*: each becomes its own DAG node (or, with ``lazy``, a thunk), so independent
calls run concurrently. Calls inside ``if``/``else`` branches, the right side of ``??``/``and``/
``or`` and ``fallback:`` run only when that branch is taken, in place.

Calls themselves (module resolution, option checks, lowering to policies and DAG nodes) are in
``_calls.py``, the forms beyond operators in ``_forms.py``; both are mixed into the compiler.
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
from collections.abc import Callable
from typing import Any

from .._engine import DagPlan, Node
from . import _ast as A
from ._calls import CallLowering
from ._diagnostics import Diagnostic
from ._forms import (
    CE,
    Fn,
    Var,
    _const,
    _merge_record_types,
    _pair,
    _start,
    _to_async,
)
from ._ir import CallNode, ProgramIR
from ._registry import ModuleRegistry, ModuleSpec
from ._runtime import (
    Annotation,
    CallSite,
    CompiledCall,
    Program,
    ProgramResources,
    _Run,
    error_text,
    lazy_ref,
    render_text,
)
from ._stdlib import HIGHER_ORDER, standard_library
from ._types import (
    BOOLEAN,
    ERROR,
    FLOAT,
    INT,
    NOTHING,
    STRING,
    ErrorType,
    ListType,
    MapType,
    OptionalType,
    RecordType,
    ResultType,
    SeqType,
    Type,
    UnionType,
    elements,
    is_assignable,
    join,
    union_of,
    without_none,
)

__all__ = ["compile_program"]


def _numeric(t: Type) -> bool:
    return t in (INT, FLOAT) or isinstance(t, ErrorType)


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


def _divide(pos: A.Pos) -> Callable[[Any, Any], Any]:
    def div(a: Any, b: Any) -> Any:
        if b == 0:
            raise ZeroDivisionError(f"division by zero at line {pos[0]}, column {pos[1]}")
        if type(a) is int and type(b) is int:
            # Int / Int is an Int truncated toward zero, as upstream's 64-bit division.
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        return a / b

    return div


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_COMPARE = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}


class _Compiler(CallLowering):
    def __init__(self, registry: ModuleRegistry, diags: list[Diagnostic]) -> None:
        self.registry = registry
        self.diags = diags
        self.types: dict[str, Type] = {}
        self.scope: dict[str, Var] = {}
        self.later: dict[str, A.Pos] = {}
        self.aliases: dict[str, str] = {}
        self.nodes: list[Node[_Run]] = []
        self.lazy: list[tuple[str, CompiledCall]] = []
        self.sites: dict[str, CallSite] = {}
        self.calls: list[CallNode] = []  # the IR's module calls, in source order
        # Call nodes' actions for untraced runs (CompiledCall.fast_action), by node key.
        self.fast: dict[str, Callable[[_Run], Any]] = {}
        self.counter = 0
        self.decl = ""  # the declaration being compiled (see new_key)
        self.rebound: dict[str, int] = {}  # input name -> how many bindings it has had
        # (module, option) -> (value, position) of the first call site declaring a limit.
        self.limits: dict[tuple[str, str], tuple[Any, A.Pos]] = {}
        # The program's own caches and limiters, shared by its call sites (D3.6, D3.7).
        self.resources = ProgramResources(registry)
        self.stdlib = standard_library()
        # `use ns` makes ns's functions callable by their simple names (upstream's wildcard).
        self.wildcards: list[str] = []
        self.uses = False
        self.inputs: set[str] = set()
        self._known: list[str] | None = None

    def error(self, code: str, message: str, pos: A.Pos) -> None:
        self.diags.append(Diagnostic(code, "error", message, pos[0], pos[1]))

    def warn(self, code: str, message: str, pos: A.Pos) -> None:
        self.diags.append(Diagnostic(code, "warning", message, pos[0], pos[1]))

    # Types ---------------------------------------------------------------------------------

    def resolve_aliases(self, defs: list[A.TypeDef]) -> None:
        by_name: dict[str, A.TypeDef] = {}
        for d in defs:
            if d.name in by_name:
                first = by_name[d.name].pos
                self.error("E006", f"Type '{d.name}' is already defined at line {first[0]}", d.pos)
                continue
            if d.name in ("String", "Int", "Float", "Boolean", "List", "Map", "Optional"):
                self.error("E006", f"'{d.name}' is a built-in type and cannot be redefined", d.pos)
                continue
            by_name[d.name] = d
        resolving: list[str] = []

        def resolve(name: str, pos: A.Pos) -> Type:
            if name in self.types:
                return self.types[name]
            if name in resolving:
                cycle = " -> ".join([*resolving[resolving.index(name) :], name])
                self.error("E006", f"Type alias '{name}' refers to itself ({cycle})", pos)
                self.types[name] = ERROR
                return ERROR
            d = by_name[name]
            resolving.append(name)
            t = self.type_of(d.type, resolve)
            resolving.pop()
            self.types.setdefault(name, t)
            return self.types[name]

        self._alias_resolver = resolve
        self._alias_names = by_name
        for name, d in by_name.items():
            resolve(name, d.pos)

    def type_of(self, te: A.TypeExpr, resolve: Callable[[str, A.Pos], Type] | None = None) -> Type:
        if isinstance(te, A.TPrim):
            return {"String": STRING, "Int": INT, "Float": FLOAT, "Boolean": BOOLEAN}[te.name]
        if isinstance(te, A.TName):
            names = getattr(self, "_alias_names", {})
            if te.name in names:
                r = resolve or self._alias_resolver
                return r(te.name, te.pos)
            hint = self._suggest(te.name, [*names, "String", "Int", "Float", "Boolean"])
            self.error("E005", f"Unknown type '{te.name}'{hint}", te.pos)
            return ERROR
        if isinstance(te, A.TList):
            return ListType(self.type_of(te.elem, resolve))
        if isinstance(te, A.TOptional):
            return OptionalType(self.type_of(te.inner, resolve))
        if isinstance(te, A.TMap):
            return MapType(self.type_of(te.key, resolve), self.type_of(te.value, resolve))
        if isinstance(te, A.TRecord):
            seen: set[str] = set()
            fields: list[tuple[str, Type]] = []
            for name, ft, pos in te.fields:
                if name in seen:
                    self.error("E008", f"Duplicate field '{name}' in record type", pos)
                    continue
                seen.add(name)
                fields.append((name, self.type_of(ft, resolve)))
            return RecordType(tuple(fields))
        if isinstance(te, A.TSeq):
            return SeqType(self.type_of(te.elem, resolve))
        if isinstance(te, A.TMerge):
            merged: RecordType | None = RecordType(())
            for m in te.members:
                mt = self.type_of(m, resolve)
                if isinstance(mt, ErrorType):
                    merged = None
                elif not isinstance(mt, RecordType):
                    self.error("E011", f"Only record types can be merged with '+', got {mt}", m.pos)
                    merged = None
                elif merged is not None:
                    merged = _merge_record_types(merged, mt)
            return ERROR if merged is None else merged
        assert isinstance(te, A.TUnion)
        return union_of([self.type_of(m, resolve) for m in te.members])

    @staticmethod
    def _suggest(name: str, candidates: list[str]) -> str:
        close = difflib.get_close_matches(name, candidates, n=1)
        return f" (did you mean '{close[0]}'?)" if close else ""

    # Declarations ----------------------------------------------------------------------------

    def define(self, name: str, var: Var) -> bool:
        if name in self.scope:
            first = self.scope[name].pos
            self.error("E008", f"'{name}' is already defined at line {first[0]}", var.pos)
            return False
        self.scope[name] = var
        return True

    def known(self) -> list[str]:
        """Every callable name: the program's modules, then the standard library's."""
        if self._known is None:
            names = [*self.registry.names(), *sorted(self.stdlib), *HIGHER_ORDER]
            self._known = list(dict.fromkeys(names))
        return self._known

    def lookup(self, name: str) -> ModuleSpec | str | None:
        """The module (or higher-order function's kind) called ``name`` exactly."""
        return self.registry.get(name) or self.stdlib.get(name) or HIGHER_ORDER.get(name)

    def candidates(self, name: str) -> list[str]:
        """The qualified names a call of ``name`` may mean (upstream's resolution): the exact
        name, an alias's target, ``ns.name`` for each ``use ns``, and, in a program without
        ``use``, any qualified name ending in ``.name``."""
        if self.lookup(name) is not None:
            return [name]
        head, _, rest = name.partition(".")
        if head in self.aliases:
            target = self.aliases[head] + ("." + rest if rest else "")
            return [target] if self.lookup(target) is not None else []
        if rest:
            return []
        found = [f"{ns}.{name}" for ns in self.wildcards if self.lookup(f"{ns}.{name}")]
        if found or self.uses:
            return list(dict.fromkeys(found))
        return [q for q in self.known() if q.rpartition(".")[2] == name]

    def use(self, d: A.UseDecl) -> None:
        names = self.known()
        q = d.qualname
        if self.lookup(q) is None and not any(n.startswith(q + ".") for n in names):
            spaces = {n.rpartition(".")[0] for n in names if "." in n}
            hint = self._suggest(q, [*spaces, *names])
            self.error("E015", f"No module or namespace '{q}' is registered{hint}", d.pos)
            return  # as if it were not there: it hides no simple name
        self.uses = True
        if d.alias is None:
            self.wildcards.append(q)
        alias = d.alias or q.rsplit(".", 1)[-1]
        if alias in self.aliases and self.aliases[alias] != q:
            self.error("E015", f"'{alias}' already names '{self.aliases[alias]}'", d.pos)
            return
        self.aliases[alias] = q

    def new_key(self) -> str:
        """A key for a call or a local name: the declaration it is written in and its place
        there, so it stays the same when other declarations change ('%' is in no name)."""
        self.counter += 1
        return f"{self.decl}%{self.counter}"

    def begin(self, decl: str) -> None:
        self.decl, self.counter = decl, 0

    def assign(self, d: A.Assign) -> None:
        key = d.name
        rebinding = d.name in self.inputs and d.name in self.scope
        if rebinding:
            # As upstream's implementation allows (`text = trim(text)`): the new value is what
            # later declarations and `out` see; the input keeps its own key in the run.
            n = self.rebound[d.name] = self.rebound.get(d.name, 1) + 1
            key = f"{d.name}@{n}"
        elif d.name in self.scope:
            self.define(d.name, Var(d.name, ERROR, frozenset(), False, d.pos))
            return
        self.begin(key)
        self.later.pop(d.name, None)

        def define(var: Var) -> None:
            if rebinding:
                self.scope[d.name] = var  # the value (compiled first) read the input
            else:
                self.define(d.name, var)

        e = d.expr
        if isinstance(e, A.Call):
            # A binding that is a call: the call's own node carries the binding's name.
            ce = self.call(e, lifted=True, key=key)
            lazy = bool(ce is not None and ce.is_async and key in dict(self.lazy))
            if ce is None:
                define(Var(key, ERROR, frozenset(), False, d.pos))
            elif lazy:
                define(Var(key, ce.type, ce.deps, True, d.pos))
            elif ce.key != key:  # not a node of its own (a higher-order function): make one
                self.nodes.append(Node(key, ce.fn, tuple(sorted(ce.deps)), 50, ce.is_async))
                define(Var(key, ce.type, frozenset({key}), False, d.pos))
            else:
                define(Var(key, ce.type, frozenset({key}), False, d.pos))
            return
        ce = self.expr(e, lifted=True)
        # The executor stores each node's value under its key in run.env (results=env).
        self.nodes.append(Node(key, ce.fn, tuple(sorted(ce.deps)), 50, ce.is_async))
        define(Var(key, ce.type, frozenset({key}), False, d.pos))

    # Expressions -----------------------------------------------------------------------------

    def expr(self, e: A.Expr, *, lifted: bool) -> CE:
        if isinstance(e, A.Lit):
            return _const(e.value)
        if isinstance(e, A.Name):
            return self.name(e)
        if isinstance(e, A.Call):
            ce = self.call(e, lifted=lifted, key=None)
            return ce if ce is not None else CE(ERROR, lambda run: None, False, frozenset())
        if isinstance(e, A.Binary):
            return self.binary(e, lifted)
        if isinstance(e, A.Unary):
            return self.unary(e, lifted)
        if isinstance(e, A.Cond):
            return self.cond(e, lifted)
        if isinstance(e, A.ListLit):
            return self.list_lit(e, lifted)
        if isinstance(e, A.RecordLit):
            return self.record_lit(e, lifted)
        if isinstance(e, A.FieldAccess):
            return self.field(e, lifted)
        if isinstance(e, A.Guard):
            return self.guard(e, lifted)
        if isinstance(e, A.Projection):
            return self.projection(e, lifted)
        if isinstance(e, A.Branch):
            return self.branch(e, lifted)
        if isinstance(e, A.Match):
            return self.match(e, lifted)
        if isinstance(e, A.Lambda):
            hof = ", ".join(HIGHER_ORDER.values())
            self.error("E011", f"A lambda can only be passed to {hof}", e.pos)
            return CE(ERROR, lambda run: None, False, frozenset())
        assert isinstance(e, A.Interp)
        return self.interp(e, lifted)

    def name(self, e: A.Name) -> CE:
        var = self.scope.get(e.name)
        if var is None:
            if e.name in self.later:
                line = self.later[e.name][0]
                self.error(
                    "E007", f"'{e.name}' is used before it is defined (at line {line})", e.pos
                )
            else:
                parts = e.name.split("-")
                if len(parts) > 1 and parts[0] in self.scope:
                    # `total-tax` is one (hyphenated) name, as upstream reads it.
                    spaced = " - ".join(parts)
                    hint = f" (a hyphen joins a name: write '{spaced}' to subtract)"
                else:
                    hint = self._suggest(e.name, list(self.scope))
                self.error("E007", f"Undefined name '{e.name}'{hint}", e.pos)
            return CE(ERROR, lambda run: None, False, frozenset())
        key = var.key
        if var.lazy:
            return CE(var.type, lazy_ref(key), True, var.deps)
        return CE(var.type, lambda run: run.env[key], False, var.deps, key)

    def binary(self, e: A.Binary, lifted: bool) -> CE:
        op = e.op
        left = self.expr(e.left, lifted=lifted)
        # The right side of ?? / and / or is evaluated only when needed: conditional position.
        conditional = op in ("??", "and", "or")
        right = self.expr(e.right, lifted=lifted and not conditional)
        lt, rt = left.type, right.type
        deps = left.deps | right.deps
        if op == "??":
            ct = join(without_none(lt), rt)
            lf, rf = left.fn, right.fn
            if not left.is_async and not right.is_async:
                return CE(ct, lambda run: v if (v := lf(run)) is not None else rf(run), False, deps)
            la, ra = _to_async(left), _to_async(right)

            async def coalesce(run: _Run) -> Any:
                v = await la(run)
                return v if v is not None else await ra(run)

            return CE(ct, coalesce, True, deps)
        if op in ("and", "or"):
            for side, st in ((e.left, lt), (e.right, rt)):
                if not is_assignable(st, BOOLEAN):
                    self.error(
                        "E011", f"Operator '{op}' needs Boolean operands, got {st}", _start(side)
                    )
            lf, rf = left.fn, right.fn
            is_and = op == "and"
            if not left.is_async and not right.is_async:
                if is_and:
                    return CE(BOOLEAN, lambda run: lf(run) and rf(run), False, deps)
                return CE(BOOLEAN, lambda run: lf(run) or rf(run), False, deps)
            la, ra = _to_async(left), _to_async(right)

            async def logic(run: _Run) -> Any:
                v = await la(run)
                if bool(v) != is_and:
                    return v
                return await ra(run)

            return CE(BOOLEAN, logic, True, deps)
        func: Callable[[Any, Any], Any]
        if op in _COMPARE:
            func = _COMPARE[op]
            if op in ("==", "!="):
                ok = is_assignable(lt, rt) or is_assignable(rt, lt)
            else:
                ok = (_numeric(lt) and _numeric(rt)) or (
                    is_assignable(lt, STRING) and is_assignable(rt, STRING)
                )
            if not ok:
                self.error("E011", f"Cannot compare {lt} with {rt} using '{op}'", e.pos)
            t: Type = BOOLEAN
        else:
            func = _divide(e.pos) if op == "/" else _ARITH[op]
            if isinstance(lt, ErrorType) or isinstance(rt, ErrorType):
                t = ERROR  # the operand's own error is reported: one mistake, one diagnostic
            elif op == "+" and (merged := self.merge(left, right)) is not None:
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
                self.error("E011", f"Operator '{op}' cannot be applied to {lt} and {rt}", e.pos)
                t = ERROR
        return _pair(left, right, func, t)

    def unary(self, e: A.Unary, lifted: bool) -> CE:
        inner = self.expr(e.operand, lifted=lifted)
        f = inner.fn
        if e.op == "not":
            if not is_assignable(inner.type, BOOLEAN):
                self.error("E011", f"Operator 'not' needs a Boolean, got {inner.type}", e.pos)
            t: Type = BOOLEAN
            func: Callable[[Any], Any] = operator.not_
        else:
            if not _numeric(inner.type):
                self.error("E011", f"Operator '-' needs a number, got {inner.type}", e.pos)
            t = inner.type
            func = operator.neg
        if not inner.is_async:
            return CE(t, lambda run: func(f(run)), False, inner.deps)

        async def g(run: _Run) -> Any:
            return func(await f(run))

        return CE(t, g, True, inner.deps)

    def cond(self, e: A.Cond, lifted: bool) -> CE:
        c = self.expr(e.cond, lifted=lifted)
        if not is_assignable(c.type, BOOLEAN):
            self.error(
                "E011", f"The condition of 'if' must be Boolean, got {c.type}", _start(e.cond)
            )
        a = self.expr(e.then, lifted=False)
        b = self.expr(e.other, lifted=False)
        t = join(a.type, b.type)
        deps = c.deps | a.deps | b.deps
        cf, af, bf = c.fn, a.fn, b.fn
        if not (c.is_async or a.is_async or b.is_async):
            return CE(t, lambda run: af(run) if cf(run) else bf(run), False, deps)
        ca, aa, ba = _to_async(c), _to_async(a), _to_async(b)

        async def g(run: _Run) -> Any:
            return await aa(run) if await ca(run) else await ba(run)

        return CE(t, g, True, deps)

    def _many(self, items: list[CE]) -> tuple[bool, Callable[[_Run], Any]]:
        """A closure producing the list of ``items``' values (async if any item is)."""
        if not any(i.is_async for i in items):
            fns = tuple(i.fn for i in items)
            return False, lambda run: [f(run) for f in fns]
        afns = tuple(_to_async(i) for i in items)

        async def g(run: _Run) -> list[Any]:
            return [await f(run) for f in afns]

        return True, g

    def list_lit(self, e: A.ListLit, lifted: bool) -> CE:
        items = [self.expr(x, lifted=lifted) for x in e.items]
        t: Type = NOTHING
        for i in items:
            t = join(t, i.type)
        is_async, fn = self._many(items)
        deps = frozenset().union(*(i.deps for i in items))
        return CE(ListType(t), fn, is_async, deps)

    def record_lit(self, e: A.RecordLit, lifted: bool) -> CE:
        items = [self.expr(x, lifted=lifted) for _, x, _ in e.fields]
        names = tuple(n for n, _, _ in e.fields)
        t = RecordType(tuple((n, i.type) for n, i in zip(names, items, strict=True)))
        is_async, many = self._many(items)
        deps = frozenset().union(*(i.deps for i in items))
        if not is_async:
            return CE(t, lambda run: dict(zip(names, many(run), strict=True)), False, deps)

        async def g(run: _Run) -> Any:
            return dict(zip(names, await many(run), strict=True))

        return CE(t, g, True, deps)

    def field(self, e: A.FieldAccess, lifted: bool) -> CE:
        obj = self.expr(e.obj, lifted=lifted)
        each = self.elementwise_field(obj, e.name, e.name_pos)
        if each is not None:
            return each
        t = self.field_type(obj.type, e.name, e.name_pos)
        name = e.name
        f = obj.fn
        if not obj.is_async:
            if isinstance(obj.type, RecordType):
                return CE(t, lambda run: f(run)[name], False, obj.deps)
            return CE(t, lambda run: _get_field(f(run), name), False, obj.deps)

        async def g(run: _Run) -> Any:
            return _get_field(await f(run), name)

        return CE(t, g, True, obj.deps)

    def field_type(self, t: Type, name: str, pos: A.Pos) -> Type:
        if isinstance(t, ErrorType):
            return ERROR
        if isinstance(t, RecordType):
            fields = t.field_map()
            if name in fields:
                return fields[name]
            hint = self._suggest(name, list(fields))
            self.error("E012", f"Record {t} has no field '{name}'{hint}", pos)
            return ERROR
        if isinstance(t, ResultType):
            rf = t.field_types()
            if name in rf:
                return rf[name]
            self.error("E012", f"{t} has no field '{name}' (it has ok, value, error)", pos)
            return ERROR
        if isinstance(t, UnionType) and all(isinstance(m, RecordType) for m in t.members):
            found = [self.field_type_quiet(m, name) for m in t.members]
            if all(f is not None for f in found):
                out: Type = NOTHING
                for f in found:
                    assert f is not None
                    out = join(out, f)
                return out
            self.error("E012", f"Not every member of {t} has a field '{name}'", pos)
            return ERROR
        if isinstance(t, OptionalType):
            self.error(
                "E012",
                f"Cannot read field '{name}' of an optional value ({t}); give a default first "
                f"with ??",
                pos,
            )
            return ERROR
        self.error("E012", f"Cannot read field '{name}' of a value of type {t}", pos)
        return ERROR

    @staticmethod
    def field_type_quiet(t: Type, name: str) -> Type | None:
        assert isinstance(t, RecordType)
        return t.field_map().get(name)

    def interp(self, e: A.Interp, lifted: bool) -> CE:
        parts: list[CE] = []
        for p in e.parts:
            parts.append(_const(p) if isinstance(p, str) else self.expr(p, lifted=lifted))
        is_async, many = self._many(parts)
        deps = frozenset().union(*(p.deps for p in parts))
        if not is_async:
            return CE(STRING, lambda run: "".join(map(render_text, many(run))), False, deps)

        async def g(run: _Run) -> str:
            return "".join(map(render_text, await many(run)))

        return CE(STRING, g, True, deps)

    # Annotations ---------------------------------------------------------------------------

    def annotations(
        self, name: str, found: list[A.Annotation], t: Type | None, examples: dict[str, Any]
    ) -> tuple[Annotation, ...]:
        """Check a declaration's annotations; their values must be constants (literals, lists,
        records): they describe the program, they do not run in it."""
        out: list[Annotation] = []
        for a in found:
            exprs = [*a.args, *(e for _, e, _ in a.props)]
            bad = next((x for x in exprs if not _constant(x)), None)
            if bad is not None:
                self.error(
                    "E020",
                    f"The values of '@{a.name}' must be constants (literals, lists, records)",
                    _start(bad),
                )
                continue
            run = _Run({}, None, 0.0)
            values = [self.expr(x, lifted=False) for x in a.args]
            props = {k: self.expr(x, lifted=False).fn(run) for k, x, _ in a.props}
            if a.name == "example":
                if t is None:
                    # On an output: already reported (E020, "belongs on an 'in' declaration").
                    continue
                if not is_assignable(values[0].type, t):
                    self.error(
                        "E011",
                        f"The '@example' of input '{name}' must be {t}, got {values[0].type}",
                        _start(a.args[0]),
                    )
                    continue
                # D3.16a: repeated @example: every one is kept in the annotations; the first is the
                # input's example value.
                examples.setdefault(name, values[0].fn(run))
            out.append(Annotation(a.name, tuple(v.fn(run) for v in values), props))
        return tuple(out)


def _constant(e: Any) -> bool:
    """Whether an annotation's expression is known without running the program: it reads no
    name and calls no module (``@example(60 * 1000)``, ``@example([1, 2] + [3])`` are)."""
    if isinstance(e, A.Name | A.Call | A.Lambda):
        return False
    if dataclasses.is_dataclass(e) and not isinstance(e, type):
        return all(_constant(getattr(e, f.name)) for f in dataclasses.fields(e))
    if isinstance(e, list | tuple):
        return all(_constant(x) for x in e)
    return True


def compile_program(
    prog: A.Program, registry: ModuleRegistry, diags: list[Diagnostic], source: str
) -> Program | None:
    """Check ``prog`` and build the runnable :class:`Program` (None when there are errors)."""
    c = _Compiler(registry, diags)
    c.resolve_aliases([d for d in prog.decls if isinstance(d, A.TypeDef)])
    for d in prog.decls:
        if isinstance(d, A.UseDecl):
            c.use(d)
    for d in prog.decls:
        if isinstance(d, A.Assign):
            c.later.setdefault(d.name, d.pos)
    inputs: dict[str, Type] = {}
    outputs_decl: list[A.OutputDecl] = []
    examples: dict[str, Any] = {}
    annotations: dict[str, tuple[Annotation, ...]] = {}
    for d in prog.decls:
        if isinstance(d, A.InputDecl):
            t = c.type_of(d.type)
            if c.define(d.name, Var(d.name, t, frozenset(), False, d.pos)):
                inputs[d.name] = t
                c.inputs.add(d.name)
            if d.annotations:
                c.begin(f"@{d.name}")
                annotations[d.name] = c.annotations(d.name, d.annotations, t, examples)
        elif isinstance(d, A.Assign):
            c.assign(d)
        elif isinstance(d, A.OutputDecl):
            outputs_decl.append(d)
            if d.annotations:
                c.begin(f"@out:{d.name}")
                found = c.annotations(d.name, d.annotations, None, examples)
                annotations[d.name] = annotations.get(d.name, ()) + found
    outputs: dict[str, Type] = {}
    output_keys: list[tuple[str, str]] = []
    for o in outputs_decl:
        if o.name in outputs:
            c.error("E014", f"Output '{o.name}' is declared twice", o.pos)
            continue
        var = c.scope.get(o.name)
        if var is None:
            hint = c._suggest(o.name, list(c.scope))
            c.error("E014", f"Output '{o.name}' is not defined{hint}", o.pos)
            continue
        outputs[o.name] = var.type
        output_keys.append((o.name, var.key))
        if var.lazy:
            # A lazy output is needed: force it (concurrently with the rest) and store the value.
            key, ref = var.key, lazy_ref(var.key)

            async def force(run: _Run, key: str = key, ref: Fn = ref) -> None:
                run.env[key] = await ref(run)
                # returns None: the executor stores it under "out:<name>", which nothing reads

            c.nodes.append(Node(f"out:{o.name}", force, tuple(sorted(var.deps)), 50, True))
    if not outputs_decl:
        c.error("E014", "A program needs at least one 'out' declaration", (1, 1))
    if any(d.severity == "error" for d in diags):
        return None
    plan: DagPlan[_Run] = DagPlan(c.nodes)
    fast_plan: DagPlan[_Run] = DagPlan(
        [
            Node(n.key, c.fast[n.key], n.deps, n.priority, n.is_async) if n.key in c.fast else n
            for n in c.nodes
        ]
    )
    return Program(
        inputs=inputs,
        outputs=outputs,
        warnings=[d for d in diags if d.severity == "warning"],
        plan=plan,
        fast_plan=fast_plan,
        lazy=c.lazy,
        output_keys=output_keys,
        sites=c.sites,
        source=source,
        examples=examples,
        annotations=annotations,
        ir=ProgramIR(inputs=inputs, outputs=outputs, calls=tuple(c.calls)),
    )
