"""The check pass: a parsed program in, its typed representation (``_ir.py``) out, with every
diagnostic of the compiler reported on the way.

:class:`Checker` holds what checking a program needs: the type aliases, the names in scope, the
modules a call may mean (``use`` declarations, the registry, the standard library) and the keys
that identify calls and values. Declarations are checked here, in source order; expressions in
``_check_expr.py``, module calls and their options in ``_calls.py``. Nothing here runs the
program: the lower pass (``_lower.py``) builds the run from a checked program without errors.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._core._errors import ConfigurationError
from . import _ast as A
from . import _ir as I
from ._calls import check_call
from ._check_expr import check_expr, check_higher_order, merge_record_types
from ._diagnostics import Diagnostic
from ._registry import ModuleRegistry, ModuleSpec
from ._stdlib import HIGHER_ORDER, standard_library
from ._types import (
    BOOLEAN,
    ERROR,
    FLOAT,
    INT,
    STRING,
    ErrorType,
    ListType,
    MapType,
    OptionalType,
    RecordType,
    SeqType,
    Type,
    is_assignable,
    union_of,
)

__all__ = ["Checker", "check_program"]


@dataclass(slots=True)
class Var:
    """A name in scope: the key of its value in the run, its type, what a reader depends on
    (``{key}``, a lazy value's own deps, or nothing for inputs and local names), whether it is
    a lazy call's value, and where it is defined."""

    key: str
    type: Type
    deps: frozenset[str]
    lazy: bool
    pos: A.Pos


class Checker:
    """The state of checking one program (see the module's docstring)."""

    def __init__(self, registry: ModuleRegistry, diags: list[Diagnostic]) -> None:
        self.registry = registry
        self.diags = diags
        self.types: dict[str, Type] = {}
        self.scope: dict[str, Var] = {}
        self.later: dict[str, A.Pos] = {}
        self.aliases: dict[str, str] = {}
        self.calls: list[I.CallNode] = []  # the IR's module calls, in source order
        self.bindings: list[I.Binding] = []
        self.counter = 0
        self.decl = ""  # the declaration being checked (see new_key)
        self.rebound: dict[str, int] = {}  # input name -> how many bindings it has had
        # (module, option) -> (value, position) of the first call site declaring a limit.
        self.limits: dict[tuple[str, str], tuple[Any, A.Pos]] = {}
        # (module, options) -> why Policy refused them (None: it did not), see check_policy.
        self.refusals: dict[tuple[ModuleSpec, I.CallOptions], ConfigurationError | None] = {}
        self.stdlib = standard_library()
        # `use ns` makes ns's functions callable by their simple names (upstream's wildcard).
        self.wildcards: list[str] = []
        self.uses = False
        self.inputs: set[str] = set()
        self._known: list[str] | None = None
        self._alias_names: dict[str, A.TypeDef] = {}
        self._alias_resolver: Callable[[str, A.Pos], Type] | None = None

    def error(self, code: str, message: str, pos: A.Pos) -> None:
        self.diags.append(Diagnostic(code, "error", message, pos[0], pos[1]))

    def warn(self, code: str, message: str, pos: A.Pos) -> None:
        self.diags.append(Diagnostic(code, "warning", message, pos[0], pos[1]))

    def failed(self) -> bool:
        """Whether an error has been reported (the program will not be lowered)."""
        return any(d.severity == "error" for d in self.diags)

    @staticmethod
    def suggest(name: str, candidates: list[str]) -> str:
        close = difflib.get_close_matches(name, candidates, n=1)
        return f" (did you mean '{close[0]}'?)" if close else ""

    def expr(self, e: A.Expr, *, lifted: bool) -> I.Expr:
        """The typed form of ``e`` (see ``_check_expr.py``)."""
        return check_expr(self, e, lifted=lifted)

    def higher_order(self, e: A.Call, kind: str, lifted: bool) -> I.Expr:
        """The typed ``filter``/``map``/``all``/``any`` call ``e``."""
        return check_higher_order(self, e, kind, lifted)

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
            names = self._alias_names
            if te.name in names:
                r = resolve or self._alias_resolver
                assert r is not None
                return r(te.name, te.pos)
            hint = self.suggest(te.name, [*names, "String", "Int", "Float", "Boolean"])
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
                    merged = merge_record_types(merged, mt)
            return ERROR if merged is None else merged
        assert isinstance(te, A.TUnion)
        return union_of([self.type_of(m, resolve) for m in te.members])

    # Names and modules -----------------------------------------------------------------------

    def define(self, name: str, var: Var) -> bool:
        if name in self.scope:
            first = self.scope[name].pos
            self.error("E008", f"'{name}' is already defined at line {first[0]}", var.pos)
            return False
        self.scope[name] = var
        return True

    def bind(self, names: list[tuple[str, Type, A.Pos]]) -> tuple[list[str], list[Any]]:
        """Bind local ``names`` (a lambda's parameter, a ``match`` case's fields) for a body
        being checked; returns their run keys and what :meth:`unbind` restores."""
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
            hint = self.suggest(q, [*spaces, *names])
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

    # Declarations ----------------------------------------------------------------------------

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
                self.scope[d.name] = var  # the value (checked first) read the input
            else:
                self.define(d.name, var)

        e = d.expr
        if isinstance(e, A.Call):
            # A binding that is a call: the call's own node carries the binding's name.
            x = check_call(self, e, lifted=True, key=key)
            if x is None:
                define(Var(key, ERROR, frozenset(), False, d.pos))
                return
            self.bindings.append(I.Binding(key, x))
            if isinstance(x, I.Call) and x.node.placement == "thunk":
                define(Var(key, x.type, x.deps, True, d.pos))
            else:
                # The call's own node, or a node made for a higher-order function's value.
                define(Var(key, x.type, frozenset({key}), False, d.pos))
            return
        x = check_expr(self, e, lifted=True)
        # The executor stores each node's value under its key in run.env (results=env).
        self.bindings.append(I.Binding(key, x))
        define(Var(key, x.type, frozenset({key}), False, d.pos))

    def annotations(
        self, name: str, found: list[A.Annotation], t: Type | None, examples: dict[str, I.Expr]
    ) -> tuple[I.TypedAnnotation, ...]:
        """Check a declaration's annotations; their values must be constants (literals, lists,
        records): they describe the program, they do not run in it."""
        out: list[I.TypedAnnotation] = []
        for a in found:
            exprs = [*a.args, *(e for _, e, _ in a.props)]
            bad = next((x for x in exprs if not _constant(x)), None)
            if bad is not None:
                self.error(
                    "E020",
                    f"The values of '@{a.name}' must be constants (literals, lists, records)",
                    A.start(bad),
                )
                continue
            values = tuple(check_expr(self, x, lifted=False) for x in a.args)
            props = tuple((k, check_expr(self, x, lifted=False)) for k, x, _ in a.props)
            if a.name == "example":
                if t is None:
                    # On an output: already reported (E020, "belongs on an 'in' declaration").
                    continue
                if not is_assignable(values[0].type, t):
                    self.error(
                        "E011",
                        f"The '@example' of input '{name}' must be {t}, got {values[0].type}",
                        A.start(a.args[0]),
                    )
                    continue
                # D3.16a: repeated @example: every one is kept in the annotations; the first is the
                # input's example value.
                examples.setdefault(name, values[0])
            out.append(I.TypedAnnotation(a.name, values, props))
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


def check_program(
    prog: A.Program, registry: ModuleRegistry, diags: list[Diagnostic]
) -> I.ProgramIR | None:
    """Check ``prog``: its typed representation, or None when ``diags`` got an error."""
    c = Checker(registry, diags)
    c.resolve_aliases([d for d in prog.decls if isinstance(d, A.TypeDef)])
    for d in prog.decls:
        if isinstance(d, A.UseDecl):
            c.use(d)
    for d in prog.decls:
        if isinstance(d, A.Assign):
            c.later.setdefault(d.name, d.pos)
    inputs: dict[str, Type] = {}
    outputs_decl: list[A.OutputDecl] = []
    examples: dict[str, I.Expr] = {}
    annotations: dict[str, tuple[I.TypedAnnotation, ...]] = {}
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
    results: list[I.Output] = []
    for o in outputs_decl:
        if o.name in outputs:
            c.error("E014", f"Output '{o.name}' is declared twice", o.pos)
            continue
        var = c.scope.get(o.name)
        if var is None:
            hint = c.suggest(o.name, list(c.scope))
            c.error("E014", f"Output '{o.name}' is not defined{hint}", o.pos)
            continue
        outputs[o.name] = var.type
        results.append(I.Output(o.name, var.key, var.lazy, var.deps))
    if not outputs_decl:
        c.error("E014", "A program needs at least one 'out' declaration", (1, 1))
    if c.failed():
        return None
    return I.ProgramIR(
        inputs=inputs,
        outputs=outputs,
        calls=tuple(c.calls),
        bindings=tuple(c.bindings),
        results=tuple(results),
        annotations=annotations,
        examples=examples,
    )
