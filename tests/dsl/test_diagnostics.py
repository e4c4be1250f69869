"""Every diagnostic: code, position, message (D3.9 verbatim for E016-E019 and the warnings)."""

from __future__ import annotations

import pickle

import pytest

from timebound.dsl import CODES, CompileError, Diagnostic, compile, format_diagnostic

from ._modules import build, make_registry


def _errors(source: str) -> list[Diagnostic]:
    with pytest.raises(CompileError) as info:
        build(source)
    return [d for d in info.value.diagnostics if d.severity == "error"]


def _one(source: str) -> Diagnostic:
    errors = _errors(source)
    assert len(errors) == 1, errors
    return errors[0]


CASES = [
    # code, source, line, column, message (exact)
    (
        "E001",
        "in x: Int\ny = Echo(x\nout y",
        3,
        1,
        "Expected ')' to close the call of 'Echo' at 2:9, found keyword 'out'",
    ),
    (
        "E001",
        "in x: Int\n+ 1\nout x",
        2,
        1,
        "Expected a declaration (type, in, out, use or NAME = expression), found '+'",
    ),
    (
        "E001",
        "in x: Int\ny = if (true) 1\nout y",
        3,
        1,
        "Expected 'else' for the 'if' at 2:5, found keyword 'out'",
    ),
    (
        "E001",
        "in x: Int\ny = x < 1 < 2\nout y",
        2,
        11,
        "Comparisons do not chain: parenthesise '<' (e.g. (a < b) == c)",
    ),
    ("E001", 'y = "${}"\nout y', 1, 6, "Empty interpolation '${}'"),
    ("E002", 'y = "abc\nout y', 1, 5, "Unterminated string"),
    ("E002", 'y = "a ${1 + 2"\nout y', 1, 8, "Unterminated interpolation '${' in string"),
    ("E003", "y = 1 ~ 2\nout y", 1, 7, "Unexpected character '~'"),
    ("E003", 'y = "\\q"\nout y', 1, 6, "Invalid escape '\\q' in string"),
    (
        "E003",
        "y = Echo(1) with timeout: 1.5s\nout y",
        1,
        27,
        "Invalid literal '1.5s': durations are whole numbers (use 1500ms, not 1.5s)",
    ),
    (
        "E003",
        "y = Echo(1) with timeout: 5sec\nout y",
        1,
        27,
        "Invalid literal '5sec': a duration unit is one of ms, s, min, h, d",
    ),
    (
        "E003",
        "y = 99999999999999999999\nout y",
        1,
        5,
        "Integer literal too large (max 9223372036854775807)",
    ),
    (
        "E004",
        "y = " + "(" * 100 + "1" + ")" * 100 + "\nout y",
        1,
        69,
        "Nesting too deep (more than 64 levels)",
    ),
    ("E005", "in x: Usr\nout x", 1, 7, "Unknown type 'Usr'"),
    (
        "E006",
        "type A = B\ntype B = A\nin x: A\nout x",
        2,
        10,
        "Type alias 'A' refers to itself (A -> B -> A)",
    ),
    (
        "E006",
        "type A = Int\ntype A = String\nin x: A\nout x",
        2,
        1,
        "Type 'A' is already defined at line 1",
    ),
    ("E007", "y = Echo(z)\nout y", 1, 10, "Undefined name 'z'"),
    ("E007", "y = Echo(z)\nz = 1\nout y", 1, 10, "'z' is used before it is defined (at line 2)"),
    ("E008", "x = 1\nx = 2\nout x", 2, 1, "'x' is already defined at line 1"),
    (
        "E020",
        "@example(1)\ntype T = Int\nout T",
        2,
        1,
        "Expected an 'in' or 'out' declaration after the annotation '@example', found keyword "
        "'type'",
    ),
    (
        "E021",
        "in v: Int | String\ny = match v { is Int -> 1 }\nout y",
        2,
        5,
        "'match' does not cover String (add a case for it, or '_ -> value')",
    ),
    ("E009", "in x: Int\ny = Ech(x)\nout y", 2, 5, "Unknown module 'Ech' (did you mean 'Echo'?)"),
    (
        "E010",
        "in x: Int\ny = Echo(x, x)\nout y",
        2,
        5,
        "Module 'Echo' takes 1 argument but 2 were given",
    ),
    ("E011", 'y = Echo("one")\nout y', 1, 10, "Argument 1 ('x') of 'Echo' expects Int, got String"),
    ("E011", 'y = 1 + "a"\nout y', 1, 7, "Operator '+' cannot be applied to Int and String"),
    ("E011", "y = if (1) 2 else 3\nout y", 1, 9, "The condition of 'if' must be Boolean, got Int"),
    (
        "E012",
        'u = GetUser("1")\ny = u.nam\nout y',
        2,
        7,
        "Record { id: String, name: String, score: Int } has no field 'nam' (did you mean 'name'?)",
    ),
    (
        "E012",
        "m = Maybe(1)\ny = m.x\nout y",
        2,
        7,
        "Cannot read field 'x' of an optional value (Optional<Int>); give a default first with ??",
    ),
    (
        "E013",
        "in n: Int\ny = Echo(1) with retry: n\nout y",
        2,
        25,
        "Option 'retry' expects a whole number literal, found 'n'",
    ),
    (
        "E013",
        "y = Echo(1) with backoff: quadratic\nout y",
        1,
        27,
        "Option 'backoff' expects one of fixed, linear, exponential, found 'quadratic'",
    ),
    (
        "E013",
        "y = Echo(1) with timeout: 5\nout y",
        1,
        27,
        "Option 'timeout' expects a duration literal such as 250ms, 5s, 2min, 1h or 1d, or a "
        "percentile p1 to p99 such as p99, found '5'",
    ),
    (
        "E013",
        "y = 5s\nout y",
        1,
        5,
        "A duration like '5s' is only allowed as an option value (timeout, delay, cache, throttle)",
    ),
    ("E014", "y = 1\nout z", 2, 5, "Output 'z' is not defined"),
    ("E014", "y = 1\nout y\nout y", 3, 5, "Output 'y' is declared twice"),
    ("E014", "y = 1", 1, 1, "A program needs at least one 'out' declaration"),
    (
        "E015",
        "use nothing.here\ny = 1\nout y",
        1,
        5,
        "No module or namespace 'nothing.here' is registered",
    ),
    (
        "E016",
        "y = Echo(1) with timeout: 0s\nout y",
        1,
        27,
        "Invalid value for 'timeout': 0s (must be > 0)",
    ),
    (
        "E016",
        "y = Echo(1) with retry: 1, delay: 0ms\nout y",
        1,
        35,
        "Invalid value for 'delay': 0ms (must be > 0)",
    ),
    (
        "E016",
        "y = Echo(1) with cache: 0min\nout y",
        1,
        25,
        "Invalid value for 'cache': 0min (must be > 0)",
    ),
    (
        "E016",
        "y = Echo(1) with concurrency: 0\nout y",
        1,
        31,
        "Invalid value for 'concurrency': 0 (must be > 0)",
    ),
    (
        "E016",
        "y = Echo(1) with throttle: 0/1s\nout y",
        1,
        28,
        "Invalid value for 'throttle': 0/1s (must be > 0)",
    ),
    (
        "E017",
        'y = Echo(1) with fallback: "zero"\nout y',
        1,
        28,
        "Fallback type mismatch: module returns Int but fallback is String",
    ),
    (
        "E017",
        'u = GetUser("1") with fallback: { id: "0", name: "nobody" }\nout u',
        1,
        33,
        "Fallback type mismatch: module returns { id: String, name: String, score: Int } but "
        "fallback is { id: String, name: String }",
    ),
    ("E018", "y = Echo(1) with retry: 1, retry: 2\nout y", 1, 28, "Duplicate option 'retry'"),
    ("E019", "y = Echo(1) with retries: 3\nout y", 1, 18, "Unknown option 'retries'"),
]


@pytest.mark.parametrize(("code", "source", "line", "column", "message"), CASES)
def test_diagnostic(code: str, source: str, line: int, column: int, message: str) -> None:
    """Each error has its stable code, the exact position and the exact message."""
    d = _one(source)
    assert (d.code, d.line, d.column, d.message) == (code, line, column, message)


def test_every_error_code_is_exercised() -> None:
    """Every error code appears in the table above."""
    codes = {c for c in CODES if c.startswith("E")}
    assert codes == {case[0] for case in CASES}


WARNINGS = [
    ("W001", "y = Echo(1) with delay: 1s\nout y", 1, 18, "'delay' without 'retry' has no effect"),
    (
        "W002",
        "y = Echo(1) with retry: 1, backoff: linear\nout y",
        1,
        28,
        "'backoff' without 'delay' has no effect",
    ),
    (
        "W004",
        'y = Echo(1) with cache_backend: "w004"\nout y',
        1,
        18,
        "'cache_backend' without 'cache' has no effect",
    ),
    (
        "W005",
        "y = Echo(1) with retry: 11\nout y",
        1,
        18,
        "High retry count (11) - consider using a lower value with exponential backoff",
    ),
]


@pytest.mark.parametrize(("code", "source", "line", "column", "message"), WARNINGS)
def test_warning(code: str, source: str, line: int, column: int, message: str) -> None:
    """Each D3.9 warning, verbatim, on a program that still compiles."""
    program = build(source)
    assert [(w.code, w.line, w.column, w.message) for w in program.warnings] == [
        (code, line, column, message)
    ]
    assert program.warnings[0].severity == "warning"


def test_backoff_without_retry_warns_twice() -> None:
    """'backoff' with a delay but no retry: W001 for the delay and W003 for the backoff."""
    program = build("y = Echo(1) with delay: 1s, backoff: exponential\nout y")
    assert [w.message for w in program.warnings] == [
        "'delay' without 'retry' has no effect",
        "'backoff' without 'retry' has no effect",
    ]


def test_retry_ten_is_not_high() -> None:
    """The high-retry warning starts above 10."""
    assert build("y = Echo(1) with retry: 10\nout y").warnings == []


def test_several_errors_are_reported_together() -> None:
    """Type errors do not stop at the first one; they come sorted by position."""
    errors = _errors('a = Echo("x")\nb = Nope(1)\nc = a + true\nout zz')
    assert [e.code for e in errors] == ["E011", "E009", "E011", "E014"]


def test_one_mistake_gives_one_error() -> None:
    """An undefined name does not cascade into type errors where it is used."""
    errors = _errors("y = Echo(nope) + 1\nz = y * 2\nout z")
    assert [e.code for e in errors] == ["E007"]


def test_format_shows_the_line_and_a_caret() -> None:
    """The rendering is FILE:LINE:COL: error CODE: message, then the source line and a caret."""
    source = "in x: Int\ny = Echo(x) with timeout: 0s\nout y"
    d = _one(source)
    assert format_diagnostic(d, source, "prog.cst") == (
        "prog.cst:2:27: error E016: Invalid value for 'timeout': 0s (must be > 0)\n"
        "    y = Echo(x) with timeout: 0s\n"
        "                              ^"
    )


def test_compile_error_message_contains_rendered_diagnostics() -> None:
    """str(CompileError) shows each error with its caret; it pickles with its diagnostics."""
    with pytest.raises(CompileError) as info:
        build("y = Nope(1)\nout y")
    assert "E009" in str(info.value) and "^" in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))
    assert again.diagnostics == info.value.diagnostics


def test_compile_error_is_a_value_error() -> None:
    """CompileError is a ValueError (and a TimeboundError)."""
    import timebound

    with pytest.raises(ValueError):
        build("out")
    assert issubclass(CompileError, timebound.TimeboundError)


def test_unknown_cache_backend_is_an_option_error() -> None:
    """A cache_backend nobody registered is reported at compile time (E013)."""
    d = _one('y = Echo(1) with cache: 1s, cache_backend: "nowhere"\nout y')
    assert d.code == "E013" and "unknown cache_backend 'nowhere'" in d.message


def test_compile_rejects_wrong_argument_types() -> None:
    """compile() wants a str and a ModuleRegistry."""
    with pytest.raises(TypeError):
        compile(b"out x", modules=make_registry())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compile("out x", modules={})  # type: ignore[arg-type]
