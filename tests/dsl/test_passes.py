"""The compiler's two passes: the check pass turns the syntax tree into the typed
representation and reports every diagnostic; the lower pass builds the runnable program from a
checked representation and reports none (D11.5)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from timebound.dsl import INT, STRING, ListType, ModuleRegistry, OptionalType, Program
from timebound.dsl import _ir as I
from timebound.dsl._check import check_program
from timebound.dsl._diagnostics import Diagnostic
from timebound.dsl._lower import lower_program
from timebound.dsl._lower_expr import _FORMS
from timebound.dsl._parser import parse
from timebound.dsl._runtime import CallSite
from timebound.dsl._types import Type


def _registry() -> ModuleRegistry:
    r = ModuleRegistry()

    @r.module
    def Fetch(key: str) -> str:
        return key.upper()

    @r.module
    def Size(text: str) -> int:
        return len(text)

    return r


PROGRAM = """
type Item = { name: String, size: Int }
in key: String
@example(["a", "b"])
in keys: List<String>
page = Fetch(key) with timeout: 2s, retry: 3, fallback: "none"
later = Fetch(key) with lazy
n = if (key == "x") Size(page) else Size(later) + 1
items = map(keys, (k) => { name: k, size: Size(k) })
big = filter(items, (i) => i.size > 1).name
label = "${key}: ${n}" when n > 0
kind = match n { is Int -> "count", _ -> "other" }
out n
out big
out label
out kind
out later
"""


def _check(source: str, diags: list[Diagnostic] | None = None) -> I.ProgramIR | None:
    diags = [] if diags is None else diags
    return check_program(parse(source, diags), _registry(), diags)


def _walk(value: Any) -> Iterator[Any]:
    """Every object reachable from ``value`` through dataclass fields, tuples and mappings."""
    yield value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _walk(getattr(value, f.name))
    elif isinstance(value, tuple | list | frozenset):
        for v in value:
            yield from _walk(v)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(k)
            yield from _walk(v)


def test_check_types_every_binding() -> None:
    """Each binding's expression carries its checked type and the run values it reads."""
    ir = _check(PROGRAM)
    assert ir is not None
    by_key = {b.key: b.expr for b in ir.bindings}
    assert list(by_key) == ["page", "later", "n", "items", "big", "label", "kind"]
    n = by_key["n"]
    assert isinstance(n, I.Cond) and n.type == INT
    # The condition reads an input (nothing to wait for); the branches' calls are in place,
    # so `n` waits for what they read: the node `page`, and the lazy call's own inputs (none).
    assert n.deps == {"page"}
    assert isinstance(by_key["later"], I.Call) and by_key["later"].node.placement == "thunk"
    assert by_key["big"].type == ListType(STRING)
    assert by_key["label"].type == OptionalType(STRING)
    assert [o.name for o in ir.results] == ["n", "big", "label", "kind", "later"]
    assert [o.lazy for o in ir.results] == [False, False, False, False, True]


def test_the_representation_holds_nothing_runnable() -> None:
    """The check pass builds no closures, policies or module functions: the representation is
    frozen data (types, keys, positions, typed options)."""
    ir = _check(PROGRAM)
    assert ir is not None
    allowed = (str, int, float, bool, type(None), tuple, frozenset, Mapping, Type, CallSite)
    for obj in _walk(ir):
        assert not callable(obj) or isinstance(obj, type), obj
        if dataclasses.is_dataclass(obj):
            assert type(obj).__dataclass_params__.frozen, type(obj)  # type: ignore[attr-defined]
        else:
            assert isinstance(obj, allowed), type(obj)


def test_every_expression_form_has_a_lowering() -> None:
    """Each kind of typed expression the check pass makes, the lower pass can build."""

    def kinds(cls: type) -> set[type]:
        # `slots=True` makes a new class: the one the module names is the one in use.
        subs = {s for s in cls.__subclasses__() if getattr(I, s.__name__) is s}
        return subs.union(*(kinds(s) for s in subs))

    assert kinds(I.Expr) == set(_FORMS) | {I.Call}


def test_the_check_pass_reports_what_only_the_registry_knows() -> None:
    """An unknown cache backend is the check's finding (E013 at the option), before lowering."""
    diags: list[Diagnostic] = []
    source = 'in k: String\ny = Fetch(k) with cache: 1s, cache_backend: "nowhere"\nout y'
    assert _check(source, diags) is None
    assert [(d.code, d.line, d.column) for d in diags] == [("E013", 2, 45)]
    assert "unknown cache_backend 'nowhere'" in diags[0].message


def test_a_program_with_an_error_has_no_representation() -> None:
    """The check returns None with its diagnostics; lowering never sees a broken program."""
    diags: list[Diagnostic] = []
    assert _check("in k: String\ny = Fetch(k, k)\nout y", diags) is None
    assert [d.code for d in diags] == ["E010"]


def test_lowering_builds_a_program_from_the_representation() -> None:
    """The lower pass alone turns a checked representation into a program that runs."""
    ir = _check(PROGRAM)
    assert ir is not None
    program = lower_program(ir, _registry(), PROGRAM, [])
    assert isinstance(program, Program) and program.ir is ir
    assert program.examples == {"keys": ["a", "b"]}
    assert program.run_sync({"key": "ab", "keys": ["x", "yy"]}) == {
        "n": 3,
        "big": ["yy"],
        "label": "ab: 3",
        "kind": "count",
        "later": "AB",
    }


def test_each_lowering_owns_its_limiters() -> None:
    """Lowering one representation twice gives two programs that share no limiter (D3.7)."""
    ir = _check("in k: String\ny = Fetch(k) with throttle: 1/1min\nout y")
    assert ir is not None
    one, two = (lower_program(ir, _registry(), "", []) for _ in range(2))
    assert one.run_sync({"k": "a"}) == two.run_sync({"k": "a"}) == {"y": "A"}


def test_the_representation_is_frozen() -> None:
    ir = _check(PROGRAM)
    assert ir is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        ir.bindings[0].key = "other"  # type: ignore[misc]
