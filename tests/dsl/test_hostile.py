"""Hostile programs and inputs: always a diagnostic or a clear error, never a crash or a hang."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timebound.dsl import CompileError, InputError, Program

from ._modules import build


def _codes(source: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        build(source)
    return [d.code for d in info.value.diagnostics if d.severity == "error"]


@pytest.mark.parametrize(
    "expr",
    [
        "(" * 5000 + "1" + ")" * 5000,
        "[" * 5000 + "]" * 5000,
        "{a: " * 5000 + "1" + "}" * 5000,
        "Echo(" * 5000 + "1" + ")" * 5000,
        "not " * 5000 + "true",
        "-" * 5000 + "1",
        "1" + " + 1" * 5000,
        "if (true) " * 5000 + "1" + " else 2" * 5000,
        "1" + " ?? 1" * 5000,
        "x" + ".a" * 5000,
    ],
    ids=["parens", "lists", "records", "calls", "not", "minus", "plus", "if", "coalesce", "fields"],
)
def test_deep_nesting_is_e004(expr: str) -> None:
    """5000 levels of any construct stop at the nesting limit with E004."""
    assert _codes(f"in x: Int\ny = {expr}\nout y") == ["E004"]


def test_deep_type_nesting_is_e004() -> None:
    """List<List<...>> 5000 deep is E004 as well."""
    assert _codes("in x: " + "List<" * 5000 + "Int" + ">" * 5000 + "\nout x") == ["E004"]


def test_deep_interpolation_nesting_is_e004() -> None:
    """Strings inside interpolations inside strings, 500 deep: E004, quickly."""
    source = "y = " + '"${' * 500 + "1" + '}"' * 500 + "\nout y"
    assert _codes(source) == ["E004"]


def test_moderate_nesting_compiles_and_runs() -> None:
    """Twenty levels of parentheses and a 50-term sum are fine."""
    program = build("y = " + "(" * 20 + "1" + ")" * 20 + " + 1" * 50 + "\nout y")
    assert program.run_sync({}) == {"y": 51}


def test_huge_string_literal_compiles() -> None:
    """A 1 MB string literal is just a value."""
    program = build('y = "' + "a" * 1_000_000 + '"\nout y')
    assert len(program.run_sync({})["y"]) == 1_000_000


def test_huge_integer_literal_is_e003() -> None:
    """A 10 000-digit integer is E003 (no int-conversion limit error leaks)."""
    assert _codes("y = " + "9" * 10_000 + "\nout y") == ["E003"]


def test_huge_duration_compiles() -> None:
    """timeout: 9223372036854775807d is large but valid."""
    program = build("y = Echo(1) with timeout: 9223372036854775807d\nout y")
    assert program.outputs["y"].__str__() == "Int"


def test_huge_retry_is_only_a_warning() -> None:
    """retry: 9223372036854775807 compiles with the high-retry warning."""
    program = build("y = Echo(1) with retry: 9223372036854775807\nout y")
    assert [w.code for w in program.warnings] == ["W005"]


def test_many_declarations() -> None:
    """Ten thousand bindings in a chain compile and run."""
    lines = ["a0 = 0"] + [f"a{i} = a{i - 1} + 1" for i in range(1, 10_000)] + ["out a9999"]
    assert build("\n".join(lines)).run_sync({}) == {"a9999": 9999}


def test_unicode_strings_and_identifiers() -> None:
    """Unicode letters make identifiers; any text (emoji, RTL, combining marks) is a string."""
    program = build('größe = "💥 שלום e\u0301 \\u{1F600}"\nout größe')
    assert program.run_sync({}) == {"größe": "💥 שלום e\u0301 😀"}


@pytest.mark.parametrize(
    "source",
    ["y = 1 \u200b\nout y", "y = \x00\nout y", "y = 1\ufeff\nout y", "y = 1 § 2\nout y"],
    ids=["zero-width-space", "nul", "bom", "section"],
)
def test_odd_characters_are_e003(source: str) -> None:
    """Invisible and stray characters are named in an E003 (a byte order mark too, except as
    the very first character, where it is an encoding mark: test_grammar_edges)."""
    assert _codes(source) == ["E003"]


@pytest.mark.parametrize(
    "source",
    ['y = "abc', 'y = "abc\\', 'y = "a\nb"\nout y', 'y = "${"', 'y = "${x'],
    ids=["eof", "escape-at-eof", "newline", "interp-string", "interp-eof"],
)
def test_unterminated_strings_are_e002(source: str) -> None:
    """Every way of leaving a string open is E002."""
    assert _codes(source) == ["E002"]


@pytest.mark.parametrize(
    "source",
    [
        "type A = A\nin x: A\nout x",
        "type A = List<A>\nin x: A\nout x",
        "type A = { next: Optional<A> }\nin x: A\nout x",
        "type A = B | Int\ntype B = A\nin x: A\nout x",
    ],
    ids=["self", "list", "record", "union"],
)
def test_type_alias_cycles_are_e006(source: str) -> None:
    """Any cycle among aliases is E006 (aliases are not recursive types)."""
    assert "E006" in _codes(source)


def test_unknown_module_and_wrong_arity() -> None:
    """Unknown modules are E009, wrong arity E010, in one report."""
    assert _codes("y = Nope(1)\nz = Echo()\nout y\nout z") == ["E009", "E010"]


@pytest.mark.parametrize("source", ["", "   \n\n", "# only a comment\n"])
def test_empty_programs_need_an_output(source: str) -> None:
    """A program with no declarations is E014 (no output)."""
    assert _codes(source) == ["E014"]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_random_text_never_crashes(source: str) -> None:
    """Arbitrary text compiles or gives diagnostics; nothing else escapes."""
    try:
        build(source)
    except CompileError as exc:
        assert exc.diagnostics


_TOKENS = st.sampled_from(
    [
        "in",
        "out",
        "type",
        "use",
        "x",
        "y",
        "=",
        ":",
        "Int",
        "String",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        ",",
        ".",
        "Echo",
        "with",
        "retry",
        "timeout",
        "1s",
        "0s",
        "3",
        '"a"',
        '"${x}"',
        "+",
        "??",
        "if",
        "else",
        "true",
        "List",
        "<",
        ">",
        "|",
        "fallback",
        "lazy",
        "\n",
        # the constructs upstream programs use
        "when",
        "branch",
        "otherwise",
        "->",
        "match",
        "is",
        "_",
        "=>",
        "filter",
        "map",
        "[",
        "]",
        "@example(1)",
        '@source("k", a: 1)',
        "@sink",
        "use",
        "stdlib.math",
        "add",
        "Seq",
        "Candidates",
        "a-b",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_TOKENS, max_size=40))
def test_random_token_soup_never_crashes(tokens: list[str]) -> None:
    """Sequences of real tokens compile or give diagnostics; nothing else escapes."""
    try:
        build(" ".join(tokens))
    except CompileError as exc:
        assert exc.diagnostics


# Hostile inputs -------------------------------------------------------------------------------

_PROGRAM = """
type User = { id: String, tags: List<String>, score: Optional<Int> }
in user: User
in n: Int
in ratio: Float
in flag: Boolean
in counts: Map<String, Int>
out user
out n
"""


@pytest.fixture(scope="module")
def program() -> Program:
    return build(_PROGRAM)


def _good() -> dict[str, object]:
    return {
        "user": {"id": "u1", "tags": ["a"], "score": None},
        "n": 1,
        "ratio": 0.5,
        "flag": True,
        "counts": {"a": 1},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n": "1"}, "input 'n' must be Int, got str '1'"),
        ({"n": True}, "input 'n' must be Int, got bool True"),
        ({"n": 1.0}, "input 'n' must be Int, got float 1.0"),
        ({"ratio": math.nan}, "input 'ratio' must be a finite Float, got nan"),
        ({"flag": 1}, "input 'flag' must be Boolean, got int 1"),
        (
            {"user": {"id": "u1", "tags": "a"}},
            "input 'user'.tags must be List<String>, got str 'a'",
        ),
        ({"user": {"id": 5, "tags": []}}, "input 'user'.id must be String, got int 5"),
        ({"user": {"tags": []}}, "input 'user' is missing field 'id' (String)"),
        (
            {"user": [1]},
            "input 'user' must be a record { id: String, tags: List<String>, "
            "score: Optional<Int> }, got list [1]",
        ),
        ({"counts": {"a": "1"}}, "input 'counts'['a'] must be Int, got str '1'"),
        ({"counts": {1: 1}}, "input 'counts' key must be String, got int 1"),
        ({"extra": 1}, "unknown input 'extra' (declared inputs: user, n, ratio, flag, counts)"),
    ],
)
def test_bad_inputs_name_the_input(
    program: Program, change: dict[str, object], message: str
) -> None:
    """Each wrong input is an InputError whose message names the input and the path."""
    inputs = {**_good(), **change}
    with pytest.raises(InputError) as info:
        program.run_sync(inputs)
    assert str(info.value) == message


def test_missing_input(program: Program) -> None:
    """A missing input is named with its type."""
    inputs = _good()
    del inputs["ratio"]
    with pytest.raises(InputError, match=r"^missing input 'ratio' \(Float\)$") as info:
        program.run_sync(inputs)
    assert info.value.input == "ratio"


def test_optional_record_field_may_be_absent(program: Program) -> None:
    """An Optional field left out of a record input reads as none."""
    inputs = {**_good(), "user": {"id": "u1", "tags": []}}
    assert program.run_sync(inputs)["user"] == {"id": "u1", "tags": [], "score": None}


def test_int_is_accepted_as_float(program: Program) -> None:
    """An Int where a Float is declared is widened."""
    assert program.run_sync({**_good(), "ratio": 2})["n"] == 1


def test_inputs_must_be_a_mapping(program: Program) -> None:
    """Passing a list instead of a dict is an InputError."""
    with pytest.raises(InputError, match="inputs must be a mapping"):
        program.run_sync([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "expr",
    [
        "filter(x, (a) => " * 3000 + "true" + ")" * 3000,
        "(a) => " * 5000 + "1",
        "1 when true " + "when true " * 5000,
        "branch { true -> " * 3000 + "1, otherwise -> 2 }" * 3000,
        "match x { _ -> " * 3000 + "1 }" * 3000,
        "x" + "[a]" * 5000,
        "x" + "{a}" * 5000,
    ],
    ids=["lambdas", "bare-lambdas", "guards", "branches", "matches", "projections", "braces"],
)
def test_deep_new_constructs_are_diagnosed(expr: str) -> None:
    """Thousands of nested lambdas, guards, branches, matches or projections: one diagnostic."""
    codes = _codes(f"in x: List<Int>\ny = {expr}\nout y")
    assert len(codes) == 1 and codes[0] in ("E001", "E004"), codes


def test_many_annotations_are_fine() -> None:
    """Ten thousand annotations on one input compile (metadata only) or are reported once."""
    source = '@source("k")\n' * 10_000 + "in x: Int\nout x"
    program = build(source)
    assert len(program.annotations["x"]) == 10_000


def test_annotation_without_declaration() -> None:
    """Annotations at the end of a program are one error (E020), not a crash."""
    assert _codes("in x: Int\nout x\n" + "@example(1)\n" * 100) == ["E020"]


def test_lambda_parameter_scan_is_linear() -> None:
    """A 20 000-parameter lambda-like tuple is rejected quickly and once."""
    source = "in x: List<Int>\ny = filter(x, (" + ", ".join(["a"] * 20_000) + ") => true)\nout y"
    assert _codes(source) == ["E008"]


def test_an_example_on_an_output_is_one_diagnostic_not_a_crash() -> None:
    """Found by the token-soup property: `@example` before `out` reached an assertion."""
    with pytest.raises(CompileError) as info:
        build("x = 1 @example(1)\nout x")
    assert [d.code for d in info.value.diagnostics] == ["E020"]
    assert "belongs on an 'in' declaration" in str(info.value)
