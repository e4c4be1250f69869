"""Diagnostics users reported as confusing: each mistake gets one error that says what is wrong."""

from __future__ import annotations

import asyncio
import io

import pytest

from timebound.cli._render import call_timeline
from timebound.dsl import CompileError, Diagnostic, ModuleRegistry, compile, format_failure
from timebound.testing import VirtualClock

from ._modules import build, unique


def _errors(source: str) -> list[Diagnostic]:
    with pytest.raises(CompileError) as info:
        build(source)
    return [d for d in info.value.diagnostics if d.severity == "error"]


def test_negative_timeout_is_one_error() -> None:
    """`timeout: -5s` gives one E016 at the minus sign, not a second error about the duration."""
    errors = _errors("in x: Int\ny = Echo(x) with timeout: -5s\nout y")
    assert [(e.code, e.line, e.column, e.message) for e in errors] == [
        ("E016", 2, 27, "Invalid value for 'timeout': -5s (must be > 0)")
    ]


def test_negative_delay_after_other_options_is_one_error() -> None:
    """A negative duration later in the clause is one error too, and parsing goes on after it."""
    errors = _errors("in x: Int\ny = Echo(x) with retry: 1, delay: -1s, nope: 2\nout y")
    assert [(e.code, e.message) for e in errors] == [
        ("E016", "Invalid value for 'delay': -1s (must be > 0)"),
        ("E019", "Unknown option 'nope'"),
    ]


def test_negative_retry_says_it_is_not_allowed() -> None:
    """`retry: -1` says a negative retry is not allowed (and what retry: 0 means)."""
    errors = _errors("in x: Int\ny = Echo(x) with retry: -1\nout y")
    assert [(e.code, e.column, e.message) for e in errors] == [
        (
            "E013",
            25,
            "Invalid value for 'retry': -1 (a negative retry is not allowed; "
            "retry: 0 means a single attempt)",
        )
    ]


def test_missing_comma_between_options() -> None:
    """Two options without a comma between them are reported as a missing comma."""
    errors = _errors("in x: Int\ny = Echo(x) with retry: 1 timeout: 5s\nout y")
    assert [(e.code, e.line, e.column, e.message) for e in errors] == [
        ("E001", 2, 27, "Missing ',' before option 'timeout'")
    ]


def test_missing_comma_across_lines() -> None:
    """An option continued on the next line without a comma is a missing comma as well."""
    errors = _errors("in x: Int\ny = Echo(x) with retry: 1\n    timeout: 5s\nout y")
    assert [(e.line, e.column, e.message) for e in errors] == [
        (3, 5, "Missing ',' before option 'timeout'")
    ]


def test_unknown_cache_backend_points_at_the_option() -> None:
    """An unknown cache_backend is reported at the option's value, not at the call."""
    source = 'in x: Int\ny = Echo(x) with cache: 1s, cache_backend: "nowhere"\nout y'
    (error,) = _errors(source)
    assert (error.code, error.line, error.column) == ("E013", 2, 44)
    assert "unknown cache_backend 'nowhere'" in error.message


def test_misspelled_field_in_arithmetic_is_one_error() -> None:
    """`user.nam + tags` reports the field once; the `+` on the broken operand adds nothing."""
    source = 'in tags: List<String>\nuser = GetUser("u")\ny = user.nam + tags\nout y'
    errors = _errors(source)
    assert [(e.code, e.column) for e in errors] == [("E012", 10)]
    assert "did you mean 'name'?" in errors[0].message


def test_bad_option_value_is_one_error() -> None:
    """A value that is no expression (`retry: three times`) is one E013; parsing goes on."""
    errors = _errors("in x: Int\ny = Echo(x) with retry: three times, timeout: 0s\nout y")
    assert [e.code for e in errors] == ["E013", "E016"]


@pytest.mark.parametrize("digit", ["\u0665", "\uff15"])
def test_non_ascii_digits_are_rejected(digit: str) -> None:
    """Arabic-Indic and full-width digits in a duration are an E003 naming the character."""
    (error,) = _errors(f"in x: Int\ny = Echo(x) with timeout: {digit}s\nout y")
    assert (error.code, error.column) == ("E003", 27)
    assert f"U+{ord(digit):04X}" in error.message and "ASCII digits 0-9" in error.message


def test_non_ascii_digit_after_ascii_digits_is_rejected() -> None:
    """`5` followed by a full-width digit is not a number with a strange unit: it is E003."""
    (error,) = _errors("y = 5\uff15\nout y")
    assert (error.code, error.column) == ("E003", 6)
    assert "U+FF15" in error.message


def _hang_registry() -> tuple[ModuleRegistry, str]:
    r = ModuleRegistry()
    name = unique("GetEmbedding")

    async def hang(x: int) -> int:
        await asyncio.sleep(3600)
        return x

    r.register(name, hang)
    return r, name


def test_timed_out_call_renders_module_timeout_and_hint() -> None:
    """A call's own timeout reads `<Module> timed out after 30s` with Module/Timeout/Hint lines."""
    registry, name = _hang_registry()
    source = f"in x: Int\ny = {name}(x) with timeout: 30s\nout y"
    program = compile(source, modules=registry)
    clock = VirtualClock()
    with clock, pytest.raises(TimeoutError) as info:
        clock.run(program.run({"x": 1}))
    assert str(info.value).startswith(f"{name} timed out after 30s")
    rendered = format_failure(info.value, source, "prog.cst").splitlines()
    caret = " " * 4 + "^"  # under column 5
    assert rendered == [
        f"prog.cst:2:5: run failed: DeadlineExceeded: {name} timed out after 30s "
        "(attempt deadline)",
        f"    y = {name}(x) with timeout: 30s",
        f"    {caret}",
        f"  Module: {name}",
        "  Timeout: 30s",
        "  Hint: raise the timeout, or give the call a fallback",
    ]


def test_run_deadline_failure_has_no_timeout_hint() -> None:
    """The run's own deadline is not a call's timeout: no Module/Timeout/Hint lines."""
    registry, name = _hang_registry()
    source = f"in x: Int\ny = {name}(x) with timeout: 30s\nout y"
    program = compile(source, modules=registry)
    clock = VirtualClock()
    with clock, pytest.raises(TimeoutError) as info:
        clock.run(program.run({"x": 1}, timeout=5))
    assert format_failure(info.value, source, "prog.cst") == (
        "prog.cst: run failed: DeadlineExceeded: run timed out after 5s (scope deadline)"
        # Where the run's 5 s went (D13.7): the call's one attempt, cut by the run's deadline.
        f" [5s went to: attempt {name} 5s]"
    )


def _trace_lines(source: str, registry: ModuleRegistry, timeout: float | None) -> list[str]:
    program = compile(source, modules=registry)
    sink: list = []  # type: ignore[type-arg]
    clock = VirtualClock()
    with clock:
        try:
            clock.run(program._execute({"x": 1}, timeout, None, True, sink=sink))
        except TimeoutError:
            pass
    out = io.StringIO()
    call_timeline(sink, None, out)
    return out.getvalue().splitlines()


def test_trace_draws_the_run_deadline_apart_from_failures() -> None:
    """A call stopped by the run's deadline is outcome `deadline`, drawn with D, not x or T."""
    registry, name = _hang_registry()
    lines = _trace_lines(f"in x: Int\ny = {name}(x) with timeout: 30s\nout y", registry, 5)
    (row,) = [line for line in lines if line.startswith(name)]
    assert "deadline" in row.split()
    bar = row[row.index("|") :]
    assert set(bar.strip("|")) == {"D"}


def test_trace_draws_a_throttle_wait() -> None:
    """Waiting for a throttle token is drawn with w before the attempt's own #."""
    registry = ModuleRegistry()
    name = unique("Fast")

    async def fast(x: int) -> int:
        await asyncio.sleep(1)
        return x

    registry.register(name, fast)
    source = (
        f"in x: Int\na = {name}(x) with throttle: 1/10s\nb = {name}(a) with throttle: 1/10s\nout b"
    )
    lines = _trace_lines(source, registry, None)
    rows = [line for line in lines if line.startswith(name)]
    first, second = (row[row.index("|") :].strip("|") for row in rows)
    assert "w" not in first and first.strip() == "####"
    # b starts at 1s, waits for the next token until 10s, then runs until 11s (of 11s total).
    assert second.strip().startswith("w") and second.rstrip().endswith("#")
    assert "x" not in second and "D" not in second
