"""The constructs upstream Constellation programs use beyond the first subset: parsing, types,
results and diagnostics of each."""

from __future__ import annotations

import json
import pathlib
from typing import Any, TypedDict

import pytest

from timebound.cli import main
from timebound.dsl import CompileError, Diagnostic, ModuleRegistry, Program, compile

from ._modules import Log, make_registry


def _build(source: str, registry: ModuleRegistry | None = None) -> Program:
    return compile(source, modules=registry if registry is not None else make_registry())


def _run(source: str, inputs: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    return _build(source, **kw).run_sync(inputs or {})


def _errors(source: str, registry: ModuleRegistry | None = None) -> list[Diagnostic]:
    with pytest.raises(CompileError) as info:
        _build(source, registry)
    return [d for d in info.value.diagnostics if d.severity == "error"]


def _one(source: str, registry: ModuleRegistry | None = None) -> Diagnostic:
    errors = _errors(source, registry)
    assert len(errors) == 1, errors
    return errors[0]


# when guards -------------------------------------------------------------------------------

GUARD = "in n: Int\nbig = n * 10 when n > 5\nout big"


def test_guard_gives_the_value_when_the_condition_holds() -> None:
    """`e when cond` is e's value when cond is true."""
    assert _run(GUARD, {"n": 7}) == {"big": 70}


def test_guard_gives_none_when_the_condition_fails() -> None:
    """`e when cond` is none when cond is false."""
    assert _run(GUARD, {"n": 3}) == {"big": None}


def test_guard_has_an_optional_type() -> None:
    """A guarded Int is an Optional<Int>."""
    assert str(_build(GUARD).outputs["big"]) == "Optional<Int>"


def test_guarded_call_runs_only_when_the_condition_holds() -> None:
    """The call under a guard whose condition is false is never made."""
    log = Log()
    source = "in n: Int\nx = Echo(n) when n > 5\nout x"
    assert _run(source, {"n": 1}, registry=make_registry(log)) == {"x": None}
    assert log.names() == []


def test_coalesce_gives_a_guard_its_default() -> None:
    """`(e when c) ?? d` is d when c is false, and its type is no longer optional."""
    source = "in n: Int\nx = n when n > 5 ?? 0\nout x"
    program = _build(source)
    assert program.run_sync({"n": 2}) == {"x": 0}
    assert str(program.outputs["x"]) == "Int"


def test_guard_condition_must_be_boolean() -> None:
    """A guard whose condition is not Boolean is E011 at the condition."""
    d = _one("in n: Int\nx = n when n + 1\nout x")
    assert (d.code, d.line, d.column) == ("E011", 2, 12)
    assert d.message == "The condition of 'when' must be Boolean, got Int"


# annotations -------------------------------------------------------------------------------


def test_example_values_are_kept_on_the_program() -> None:
    """`@example(...)` before an input gives Program.examples its value."""
    program = _build(
        '@example("Ada")\nin name: String\n@example([1, 2])\nin xs: List<Int>\nout name'
    )
    assert program.examples == {"name": "Ada", "xs": [1, 2]}


def test_example_may_follow_the_input_on_its_line() -> None:
    """`in q: String @example("hi")` annotates q (the same line), not the next input."""
    program = _build('in q: String @example("hi")\nin n: Int\nout q')
    assert program.examples == {"q": "hi"}


def test_example_must_fit_the_input_type() -> None:
    """An example of the wrong type is E011 at the example."""
    d = _one('@example("x")\nin n: Int\nout n')
    assert (d.code, d.line, d.column) == ("E011", 1, 10)
    assert d.message == "The '@example' of input 'n' must be Int, got String"


def test_example_must_be_a_constant() -> None:
    """An example that reads a value is E020."""
    d = _one("in a: Int\n@example(a)\nin b: Int\nout b")
    assert (d.code, d.line, d.column) == ("E020", 2, 10)


def test_source_and_sink_are_metadata() -> None:
    """@source/@sink keep their connector kind and properties on Program.annotations."""
    source = (
        '@source("kafka", topic: "events")\nin e: String\n'
        '@sink("s3", bucket: "b", retries: 2)\nout e'
    )
    program = _build(source)
    (src,) = program.annotations["e"][:1]
    assert (src.kind, src.values, src.props) == ("source", ("kafka",), {"topic": "events"})
    sink = program.annotations["e"][1]
    assert (sink.kind, sink.values, sink.props) == ("sink", ("s3",), {"bucket": "b", "retries": 2})


def test_unknown_annotation_is_named() -> None:
    """An annotation other than @example, @source, @sink is E020 at the '@'."""
    d = _one("@retry(3)\nin x: Int\nout x")
    assert (d.code, d.line, d.column) == ("E020", 1, 1)
    assert d.message == "Unknown annotation '@retry' (known: @example, @source, @sink)"


def test_sink_belongs_on_outputs() -> None:
    """`@sink` on an input is E020."""
    d = _one('@sink("s3")\nin x: Int\nout x')
    assert d.message == "'@sink' belongs on an 'out' declaration, not on 'in'"


# projections, element-wise access, merge --------------------------------------------------


class Person(TypedDict):
    name: str
    age: int
    email: str


def _people() -> ModuleRegistry:
    r = ModuleRegistry()

    @r.module
    def People(n: int) -> list[Person]:
        return [{"name": f"p{i}", "age": 20 + i, "email": f"p{i}@x"} for i in range(n)]

    @r.module
    def One(n: int) -> Person:
        return {"name": "Ada", "age": n, "email": "ada@x"}

    return r


def test_bracket_projection_keeps_the_named_fields() -> None:
    """`x[a, b]` is the record with only those fields."""
    out = _run("p = One(36)\ny = p[name, age]\nout y", registry=_people())
    assert out == {"y": {"name": "Ada", "age": 36}}


def test_brace_projection_is_the_same() -> None:
    """`x{a, b}` projects like `x[a, b]`, and its type has just those fields."""
    program = _build("p = One(36)\ny = p{name}\nout y", _people())
    assert program.run_sync({}) == {"y": {"name": "Ada"}}
    assert str(program.outputs["y"]) == "{ name: String }"


def test_projection_over_a_list_projects_each_record() -> None:
    """Projecting a list of records gives a list of projected records."""
    out = _run("ps = People(2)\ny = ps[age]\nout y", registry=_people())
    assert out == {"y": [{"age": 20}, {"age": 21}]}


def test_projection_of_an_unknown_field_suggests_one() -> None:
    """A projected field the record lacks is E012 at the field, with a suggestion."""
    d = _one("p = One(1)\ny = p[name, emial]\nout y", _people())
    assert (d.code, d.line, d.column) == ("E012", 2, 13)
    assert d.message.endswith("has no field 'emial' (did you mean 'email'?)")


def test_field_access_on_a_list_reads_each_record() -> None:
    """`people.name` on a List of records is the List of names."""
    program = _build("ps = People(3)\nnames = ps.name\nout names", _people())
    assert program.run_sync({}) == {"names": ["p0", "p1", "p2"]}
    assert str(program.outputs["names"]) == "List<String>"


def test_record_merge_takes_the_right_fields_last() -> None:
    """`a + b` on records has the fields of both; b's value wins on a shared field."""
    out = _run('a = { x: 1, y: 2 }\nb = { y: "two", z: 3 }\nc = a + b\nout c')
    assert out == {"c": {"x": 1, "y": "two", "z": 3}}


def test_merged_record_type() -> None:
    """The merged type has a's fields in order with b's types, then b's other fields."""
    program = _build('a = { x: 1, y: 2 }\nb = { y: "two", z: 3 }\nc = a + b\nout c')
    assert str(program.outputs["c"]) == "{ x: Int, y: String, z: Int }"


def test_type_merge() -> None:
    """`type C = A + B` is the merged record type."""
    source = "type A = { x: Int }\ntype B = { y: String }\nin c: A + B\nout c"
    assert str(_build(source).inputs["c"]) == "{ x: Int, y: String }"


def test_type_merge_needs_records() -> None:
    """Merging a non-record type is E011 at that type."""
    d = _one("type A = { x: Int }\nin c: A + Int\nout c")
    assert (d.code, d.line, d.column) == ("E011", 2, 11)
    assert d.message == "Only record types can be merged with '+', got Int"


def test_list_of_records_plus_record_adds_to_each() -> None:
    """A record merged into a list of records is merged into every element."""
    out = _run('ps = People(2)\ny = ps[age] + { tag: "t" }\nout y', registry=_people())
    assert out == {"y": [{"age": 20, "tag": "t"}, {"age": 21, "tag": "t"}]}


def test_seqs_of_records_merge_element_wise() -> None:
    """Two Seqs of records merge element by element."""
    source = "in a: Seq<{ x: Int }>\nin b: Seq<{ y: Int }>\nc = a + b\nout c"
    out = _run(source, {"a": [{"x": 1}, {"x": 2}], "b": [{"y": 3}, {"y": 4}]})
    assert out == {"c": [{"x": 1, "y": 3}, {"x": 2, "y": 4}]}


def test_seqs_of_different_lengths_fail_the_run() -> None:
    """Merging Seqs of different lengths fails the run with both lengths in the message."""
    program = _build("in a: Seq<{ x: Int }>\nin b: Seq<{ y: Int }>\nc = a + b\nout c")
    with pytest.raises(ValueError, match=r"different lengths element-wise \(1 and 2\)"):
        program.run_sync({"a": [{"x": 1}], "b": [{"y": 1}, {"y": 2}]})


# lambdas and higher-order functions ---------------------------------------------------------

NUMBERS = {"xs": [3, -1, 4, -5]}


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("filter(xs, (x) => x > 0)", [3, 4]),
        ("map(xs, (x) => x * 2)", [6, -2, 8, -10]),
        ("all(xs, (x) => x > -10)", True),
        ("all(xs, (x) => x > 0)", False),
        ("any(xs, (x) => x < -4)", True),
        ("any(xs, (x) => x > 100)", False),
        ("filter(xs, (x: Int) => gt(x, 0))", [3, 4]),
        ("stdlib.collection.map(xs, (x) => to-string(x))", ["3", "-1", "4", "-5"]),
    ],
)
def test_higher_order_functions(expression: str, expected: object) -> None:
    """filter, map, all and any apply the lambda to each element."""
    assert _run(f"in xs: List<Int>\ny = {expression}\nout y", NUMBERS) == {"y": expected}


def test_lambda_body_reads_program_values() -> None:
    """A lambda's body may use the program's other values."""
    source = "in xs: List<Int>\nin t: Int\ny = filter(xs, (x) => x > t)\nout y"
    assert _run(source, {**NUMBERS, "t": 3}) == {"y": [4]}


def test_map_type_follows_the_lambda() -> None:
    """`map` over a List<Int> with a String-valued lambda is a List<String>."""
    program = _build('in xs: List<Int>\ny = map(xs, (x) => "${x}")\nout y')
    assert str(program.outputs["y"]) == "List<String>"


def test_lambda_outside_a_higher_order_function() -> None:
    """A lambda anywhere else is E011 at the lambda."""
    d = _one("f = (x) => x\nout f")
    assert (d.code, d.line, d.column) == ("E011", 1, 5)
    assert d.message == "A lambda can only be passed to filter, map, all, any"


def test_filter_needs_a_boolean_lambda() -> None:
    """filter's lambda must return Boolean: E011 at the body."""
    d = _one("in xs: List<Int>\ny = filter(xs, (x) => x + 1)\nout y")
    assert (d.code, d.line, d.column) == ("E011", 2, 23)
    assert d.message == "The lambda given to 'filter' must return Boolean, got Int"


def test_lambda_parameter_type_must_fit_the_elements() -> None:
    """A declared parameter type the elements do not fit is E011 at the parameter."""
    d = _one("in xs: List<Int>\ny = map(xs, (s: String) => s)\nout y")
    assert (d.code, d.line, d.column) == ("E011", 2, 14)


def test_higher_order_functions_take_no_options() -> None:
    """`filter(...) with retry: 1` is E013: it is not a module call."""
    d = _one("in xs: List<Int>\ny = filter(xs, (x) => x > 0) with retry: 1\nout y")
    assert d.code == "E013" and "takes no options" in d.message


def test_higher_order_function_needs_a_list() -> None:
    """filter over a non-list is E011 at the argument."""
    d = _one("in n: Int\ny = filter(n, (x) => true)\nout y")
    assert (d.code, d.column) == ("E011", 12)
    assert d.message == "Argument 1 of 'filter' expects a List or Seq, got Int"


# Seq and Candidates ------------------------------------------------------------------------


def test_candidates_is_seq() -> None:
    """`Candidates<T>` is `Seq<T>`; a Seq input takes a JSON list."""
    program = _build("in c: Candidates<Int>\nout c")
    assert str(program.inputs["c"]) == "Seq<Int>"
    assert program.run_sync({"c": [1, 2]}) == {"c": [1, 2]}


def test_a_list_is_a_seq_but_not_the_reverse() -> None:
    """A List fits where a Seq is expected; a Seq where a List is expected is E011."""
    r = ModuleRegistry()

    @r.module
    def Total(xs: list[int]) -> int:
        return sum(xs)

    assert _run("in xs: List<Int>\nn = list-length(xs)\nout n", {"xs": [1, 2]}) == {"n": 2}
    d = _one("in s: Seq<Int>\nn = Total(s)\nout n", r)
    assert d.code == "E011" and "expects List<Int>, got Seq<Int>" in d.message


# hyphenated names --------------------------------------------------------------------------


def test_hyphenated_name_is_one_identifier() -> None:
    """`total-tax` is a name; `total - tax` subtracts."""
    source = "in total: Int\nin tax: Int\ntotal-tax = total - tax\nout total-tax"
    assert _run(source, {"total": 10, "tax": 3}) == {"total-tax": 7}


def test_hyphen_without_spaces_suggests_subtraction() -> None:
    """An undefined `a-b` whose first part is defined says how to subtract."""
    d = _one("in total: Int\nin tax: Int\ny = total-tax\nout y")
    assert (d.code, d.column) == ("E007", 5)
    assert d.message == (
        "Undefined name 'total-tax' (a hyphen joins a name: write 'total - tax' to subtract)"
    )


def test_hyphenated_module_names() -> None:
    """Modules may be registered and called under hyphenated names."""
    r = ModuleRegistry()

    def rank(x: int) -> int:
        return x + 1

    r.register("ide-ranker-v2", rank)
    assert _run("y = ide-ranker-v2(1)\nout y", registry=r) == {"y": 2}


# branch and match --------------------------------------------------------------------------

BRANCH = (
    'in s: Int\ng = branch {\n  s >= 90 -> "A",\n  s >= 80 -> "B",\n  otherwise -> "C"\n}\nout g'
)


@pytest.mark.parametrize(("score", "grade"), [(95, "A"), (85, "B"), (10, "C")])
def test_branch_takes_the_first_true_case(score: int, grade: str) -> None:
    """branch gives the value of the first case whose condition holds, else otherwise's."""
    assert _run(BRANCH, {"s": score}) == {"g": grade}


def test_branch_needs_otherwise() -> None:
    """A branch without an otherwise case is a syntax error that says so."""
    d = _one('in s: Int\ng = branch { s > 1 -> "a" }\nout g')
    assert d.code == "E001" and "needs an 'otherwise -> value' case last" in d.message


def test_branch_conditions_are_boolean() -> None:
    """A branch condition that is not Boolean is E011 at the condition."""
    d = _one('in s: Int\ng = branch { s -> "a", otherwise -> "b" }\nout g')
    assert (d.code, d.column) == ("E011", 14)


MATCH = (
    "type R = { value: Int, status: String } | { error: String, code: Int }\n"
    "in r: R\n"
    'm = match r {\n  { value, status } -> "${status}: ${value}",\n'
    '  { error, code } -> "E${code}: ${error}"\n}\nout m'
)


@pytest.mark.parametrize(
    ("value", "text"),
    [({"value": 1, "status": "ok"}, "ok: 1"), ({"error": "boom", "code": 7}, "E7: boom")],
)
def test_match_record_patterns_bind_fields(value: dict[str, Any], text: str) -> None:
    """A record pattern matches a value with those fields and binds them in its case."""
    assert _run(MATCH, {"r": value}) == {"m": text}


def test_match_type_patterns_and_wildcard() -> None:
    """`is T` tests the value's type; `_` takes the rest."""
    source = 'in v: Int | String\nm = match v { is Int -> "int", _ -> "other" }\nout m'
    program = _build(source)
    assert program.run_sync({"v": 3}) == {"m": "int"}
    assert program.run_sync({"v": "x"}) == {"m": "other"}


def test_match_must_cover_every_member() -> None:
    """A match missing a union member (and no `_`) is E021 naming the member."""
    d = _one("in v: Int | String | Boolean\nm = match v { is Int -> 1, is String -> 2 }\nout m")
    assert (d.code, d.line, d.column) == ("E021", 2, 5)
    assert d.message == "'match' does not cover Boolean (add a case for it, or '_ -> value')"


def test_match_record_pattern_no_member_has_the_fields() -> None:
    """A record pattern no member fits is E012 at the pattern, and only that."""
    source = "type R = { a: Int } | { b: Int }\nin r: R\nm = match r { { c } -> 1, _ -> 2 }\nout m"
    d = _one(source)
    assert (d.code, d.line, d.column) == ("E012", 3, 15)
    assert d.message == "No member of { a: Int } | { b: Int } has the field c"


# use, namespaces, the standard library ------------------------------------------------------


def test_use_brings_a_namespace_into_scope() -> None:
    """After `use stdlib.math`, add(a, b) is stdlib.math.add."""
    assert _run("use stdlib.math\nx = add(2, 3)\nout x") == {"x": 5}


def test_simple_names_resolve_without_use() -> None:
    """A program without `use` may call a standard function by its simple name."""
    assert _run('n = string-length("héllo")\nout n') == {"n": 5}


def test_use_of_another_namespace_hides_simple_names() -> None:
    """With `use` declarations only imported namespaces resolve; the error says which to use."""
    d = _one("use stdlib.string\nx = add(1, 2)\nout x")
    assert d.code == "E009"
    assert d.message == "Unknown module 'add' (it is stdlib.math.add: add 'use stdlib.math')"


def test_use_as_aliases_a_namespace() -> None:
    """`use stdlib.math as m` makes m.add callable."""
    assert _run("use stdlib.math as m\nx = m.multiply(6, 7)\nout x") == {"x": 42}


def test_ambiguous_simple_name() -> None:
    """A simple name two namespaces define is E009 listing both."""
    r = ModuleRegistry()

    @r.module(name="mine.add")
    def add(a: int, b: int) -> int:
        return a + b

    d = _one("x = add(1, 2)\nout x", r)
    assert d.message.startswith("'add' is ambiguous: it may be mine.add or stdlib.math.add")


def test_program_module_shadows_the_standard_library() -> None:
    """A module the program registers under a standard name is the one called."""
    r = ModuleRegistry()

    @r.module(name="stdlib.math.add")
    def add(a: int, b: int) -> int:
        return 100

    assert _run("x = stdlib.math.add(1, 2)\nout x", registry=r) == {"x": 100}


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("divide(-7, 2)", -3),
        ("modulo(-7, 2)", -1),
        ("round(2.5)", 3),
        ("round(-2.5)", -2),
        ("max(3, 9)", 9),
        ("abs(-4)", 4),
        ('concat("a", "b")', "ab"),
        ('join(["a", "b"], "-")', "a-b"),
        ('split("a,b", ",")', ["a", "b"]),
        ('trim("  x ")', "x"),
        ('replace("aXa", "X", "-")', "a-a"),
        ("list-sum([1, 2, 3])", 6),
        ("list-reverse([1, 2])", [2, 1]),
        ("list-first([4, 5])", 4),
        ("list-is-empty([])", True),
        ('eq-string("a", "a")', True),
        ("to-int(2.9)", 2),
        ("to-float(2)", 2.0),
    ],
)
def test_standard_library(call: str, expected: object) -> None:
    """Each standard function computes what upstream's does (64-bit integer semantics)."""
    assert _run(f"y = {call}\nout y") == {"y": expected}


def test_list_first_of_an_empty_list_fails() -> None:
    """list-first of [] fails the run with an IndexError naming the function."""
    with pytest.raises(IndexError, match="list-first"):
        _run("in xs: List<Int>\ny = list-first(xs)\nout y", {"xs": []})


# input rebinding ---------------------------------------------------------------------------


def test_an_input_may_be_rebound() -> None:
    """`text = trim(text)` rebinds the input: later uses and `out` see the new value."""
    source = "in text: String\ntext = trim(text)\nn = string-length(text)\nout text\nout n"
    assert _run(source, {"text": "  ab "}) == {"text": "ab", "n": 2}


def test_a_value_may_not_be_bound_twice() -> None:
    """Two assignments of one name stay E008 naming the first line."""
    d = _one("x = 1\ny = 2\nx = 3\nout x")
    assert (d.code, d.line, d.message) == ("E008", 3, "'x' is already defined at line 1")


# one mistake, one diagnostic -----------------------------------------------------------------


def test_misspelled_higher_order_function_is_one_error() -> None:
    """`filtr(xs, (x) => ...)` is one E009 suggesting filter; the lambda adds nothing."""
    d = _one("in xs: List<Int>\ny = filtr(xs, (x) => x > 0)\nout y")
    assert (d.code, d.message) == ("E009", "Unknown module 'filtr' (did you mean 'filter'?)")


def test_unknown_namespace_in_use_is_one_error() -> None:
    """A `use` of an unknown namespace is one E015 suggesting a namespace; it hides no name."""
    d = _one("use stdlib.nope\ny = add(1, 2)\nout y")
    assert d.message == (
        "No module or namespace 'stdlib.nope' is registered (did you mean 'stdlib.compare'?)"
    )


@pytest.mark.parametrize(
    "source",
    [
        "in xs: List<Int>\ny = filter(zs, (x) => x > 0)\nout y",
        "in v: Int | String\ny = match w { is Int -> 1, _ -> 2 }\nout y",
        "in v: Int\ny = branch { nope -> 1, otherwise -> 2 }\nout y",
        "in r: { a: Int }\ny = r[b] + { c: 1 }\nout y",
        "in xs: List<Int>\ny = map(xs, (x) => nope)\nz = y\nout z",
        "in s: Strin\ny = s when true\nout y",
        '@example("x")\nin n: Intt\nout n',
    ],
    ids=[
        "filter-list",
        "match-subject",
        "branch-cond",
        "projection",
        "map-body",
        "guard",
        "example",
    ],
)
def test_a_broken_part_does_not_cascade(source: str) -> None:
    """An error inside a new construct is reported once; the construct adds no second error."""
    assert len(_errors(source)) == 1


# node identities ----------------------------------------------------------------------------


def _nodes(source: str) -> set[tuple[str, str | None]]:
    result = _build(source).run_traced_sync({"x": 1})
    return {(t.module, t.node) for t in result.trace}


def test_call_identities_survive_unrelated_edits() -> None:
    """A call keeps its trace `node` when other declarations are added or removed before it."""
    before = "in x: Int\ny = Echo(Echo(x)) + 1\nz = Echo(x)\nout y\nout z"
    after = "in x: Int\nw = Echo(x) * 2\ny = Echo(Echo(x)) + 1\nout y\nout w"
    assert _nodes(before) == {("Echo", "y%1"), ("Echo", "y%2"), ("Echo", "z")}
    assert {("Echo", "y%1"), ("Echo", "y%2")} <= _nodes(after)


def test_rebinding_an_input_twice() -> None:
    """An input rebound twice keeps each binding apart; out sees the last."""
    source = "in x: Int\nx = x + 1\nx = x * 10\nout x"
    assert _run(source, {"x": 1}) == {"x": 20}


def test_json_trace_carries_node_identities(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`timebound run --json --trace` gives each call its stable `node` identity."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.cst").write_text("n = add(1, 2)\nm = multiply(add(n, 1), 2)\nout m\n")
    assert main(["run", "p.cst", "--json", "--trace"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["outputs"] == {"m": 8}
    assert sorted(t["node"] for t in doc["trace"]) == ["m", "m%1", "n"]


def test_misspelled_annotation_suggests_one() -> None:
    """`@exampel(...)` suggests @example."""
    d = _one("@exampel(1)\nin x: Int\nout x")
    assert d.message == "Unknown annotation '@exampel' (did you mean '@example'?)"


def test_misspelled_pattern_field_suggests_one() -> None:
    """A record pattern with a misspelled field suggests the field a member has."""
    source = "type R = { value: Int } | { error: String }\nin r: R\n"
    d = _one(source + "m = match r { { valeu } -> 1, _ -> 2 }\nout m")
    assert d.message.endswith("has the field valeu (did you mean 'value'?)")
