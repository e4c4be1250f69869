"""Grammar and typing edge cases the language document allows (or forbids), found in review."""

from __future__ import annotations

import pytest

from timebound.dsl import CompileError, Diagnostic, ModuleRegistry, compile, format_diagnostic
from timebound.dsl._types import INT, STRING, OptionalType, is_assignable, union_of

from ._modules import build, make_registry


def _errors(source: str, registry: ModuleRegistry | None = None) -> list[Diagnostic]:
    with pytest.raises(CompileError) as info:
        build(source, registry)
    return [d for d in info.value.diagnostics if d.severity == "error"]


def test_record_field_after_a_call_with_options() -> None:
    """In a record literal, `, b: 2` after `with retry: 1` is the next field, not an option."""
    program = build("in x: Int\ny = {a: Echo(x) with retry: 1, b: 2}\nout y")
    assert program.run_sync({"x": 3}) == {"y": {"a": 3, "b": 2}}


def test_record_field_named_like_an_option_binds_to_the_call() -> None:
    """`, timeout: 1s` inside a record still continues the with clause (the grammar is greedy)."""
    program = build("in x: Int\ny = {a: Echo(x) with retry: 1, timeout: 1s}\nout y")
    assert program.run_sync({"x": 3}) == {"y": {"a": 3}}


def test_unknown_option_outside_a_record_is_still_e019() -> None:
    """A misspelt option after a comma is reported, not taken for something else."""
    (d,) = _errors("in x: Int\ny = Echo(x) with retry: 1, retries: 2\nout y")
    assert (d.code, d.message, d.line, d.column) == ("E019", "Unknown option 'retries'", 2, 28)


def test_negative_priority_is_an_integer() -> None:
    """`priority` takes an Int (the spec says Int, not Nat): `priority: -5` is accepted."""
    program = build("in x: Int\ny = Echo(x) with priority: -5\nout y")
    assert program.run_sync({"x": 3}) == {"y": 3}


def test_byte_order_mark_is_ignored() -> None:
    """A UTF-8 byte order mark at the start (Windows editors) is not a syntax error."""
    program = build("\ufeffin x: Int\r\ny = Echo(x)\r\nout y\r\n")
    assert program.run_sync({"x": 3}) == {"y": 3}


def test_byte_order_mark_keeps_columns() -> None:
    """After a byte order mark, line 1's columns still count from the first real character."""
    (d,) = _errors("\ufeffy = Echo(z)\nout y")
    assert (d.code, d.line, d.column) == ("E007", 1, 10)


def test_coalesce_strips_optional_members_of_a_union() -> None:
    """`x ?? 0` with x: Optional<Int> | String has type Int | String (no none left)."""
    program = build("type A = Optional<Int> | String\nin x: A\ny = x ?? 0\nout y")
    assert str(program.outputs["y"]) == "Int | String"


def test_optional_is_assignable_to_a_union_that_admits_none() -> None:
    """Optional<Int> fits Int | Optional<String>: Int fits Int, none fits the optional."""
    assert is_assignable(OptionalType(INT), union_of([INT, OptionalType(STRING)]))
    assert not is_assignable(OptionalType(INT), union_of([INT, STRING]))


def test_optional_of_union_is_assignable_to_union_of_optionals() -> None:
    """Optional<Int | String> fits Optional<Int> | Optional<String>."""
    src = OptionalType(union_of([INT, STRING]))
    assert is_assignable(src, union_of([OptionalType(INT), OptionalType(STRING)]))


def test_nested_optional_is_assignable_to_optional() -> None:
    """Optional<Optional<Int>> holds the same values as Optional<Int>."""
    assert is_assignable(OptionalType(OptionalType(INT)), OptionalType(INT))


@pytest.mark.parametrize(
    ("source", "column"),
    [
        ("in u: {a: String}\ny = Echo(u.a)\nout y", 10),
        ('in x: Int\ny = Echo("a" + "b")\nout y', 10),
        ("in x: Int\ny = Echo(x * 2 > 1)\nout y", 10),
    ],
)
def test_argument_type_error_points_at_the_argument(source: str, column: int) -> None:
    """E011 for an argument points at where the argument starts, not at its operator or dot."""
    (d,) = _errors(source)
    assert (d.code, d.line, d.column) == ("E011", 2, column)


def test_condition_type_error_points_at_the_condition() -> None:
    """E011 for a non-Boolean `if` condition points at the condition's first token."""
    (d,) = _errors("in x: Int\ny = if (x + 1) 1 else 2\nout y")
    assert (d.code, d.line, d.column) == ("E011", 2, 9)


def test_logic_operand_error_points_at_the_operand() -> None:
    """E011 for a non-Boolean `and` operand points at the operand, not at its operator."""
    (d,) = _errors("in x: Int\ny = true and x + 1\nout y")
    assert (d.code, d.line, d.column) == ("E011", 2, 14)


def test_interpolation_edge_cases() -> None:
    """`${a.b}`, a `$` not followed by `{`, nested quotes and a `}` inside a nested string."""
    source = 'in u: {a: Int}\ny = "$${u.a}$ ${Greet("}")} \\${x}"\nout y'
    assert build(source).run_sync({"u": {"a": 1}}) == {"y": "$1$ hello } ${x}"}


def test_comment_at_end_of_file_without_newline() -> None:
    """A comment on the last line with no newline after it ends the program cleanly."""
    assert build("in x: Int\nout x # the end").run_sync({"x": 1}) == {"x": 1}


def test_crlf_positions() -> None:
    """With CRLF line endings, lines and columns are those of the text (the CR is not a column)."""
    (d,) = _errors("in x: Int\r\n\r\ny = Echo(z)\r\nout y\r\n")
    assert (d.code, d.line, d.column) == ("E007", 3, 10)


def test_fallback_parenthesised_call_with_its_own_options() -> None:
    """`fallback: (B(x) with retry: 1), timeout: 2s`: the timeout belongs to the outer call."""
    program = build(
        "in x: Int\ny = Echo(x) with fallback: (Echo(x) with retry: 1, delay: 1s), timeout: 2s\n"
        "out y"
    )
    assert program.warnings == []
    assert program.run_sync({"x": 4}) == {"y": 4}


def test_with_clause_over_several_lines() -> None:
    """Options may continue on the next lines, with the comma at either end of a line."""
    program = build("in x: Int\ny = Echo(x) with timeout: 1s,\n  retry: 1\n  , delay: 1s\nout y")
    assert program.warnings == []


def test_registry_helper_is_fresh() -> None:
    """Sanity: the shared test registry compiles a trivial program (guards the helpers above)."""
    assert compile("in x: Int\nout x", modules=make_registry()).outputs == {"x": INT}


@pytest.mark.parametrize("separator", ["\u2028", "\x0c", "\x85", "\x1c"])
def test_formatted_diagnostic_shows_the_right_line(separator: str) -> None:
    """Characters Python's splitlines() breaks on but the language does not (in a comment, or
    a form feed, which is whitespace) do not shift the source line shown under a diagnostic."""
    source = f"in x: Int # a{separator}b\ny = Echo(z)\nout y"
    with pytest.raises(CompileError) as info:
        build(source)
    (d,) = info.value.diagnostics
    shown = format_diagnostic(d, source, "p.cst").splitlines()
    assert shown[0] == "p.cst:2:10: error E007: Undefined name 'z'"
    assert shown[1] == "    y = Echo(z)"
    assert shown[2] == "             ^"


def test_unknown_bare_option_is_e019() -> None:
    """`with cached` (no value) is an unknown option, not a syntax error on the next line."""
    (d,) = _errors("y = Echo(1) with cached\nout y")
    assert (d.code, d.message, d.line, d.column) == ("E019", "Unknown option 'cached'", 1, 18)
