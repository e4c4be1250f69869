"""The worst-case time check of Constellation programs (D14.4)."""

from __future__ import annotations

import pytest

from timebound.analysis import Report, check_constellation
from timebound.dsl import CompileError


def test_a_call_whose_retries_the_run_budget_cuts() -> None:
    """Per call: the retry option's place, file:line:col, and the run's budget."""
    program = "in x: Int\ny = Fetch(x) with timeout: 1s, retry: 3, delay: 500ms\nout y\n"
    report = check_constellation(program, budget="2s", file="p.cst")
    (f,) = [f for f in report.findings if f.code == "TB-T002"]
    assert str(f.where) == "p.cst:2:32 (retry)"
    assert f.numbers["attempt"] == 3
    assert not report.ok


def test_a_timeout_at_the_run_budget_points_at_the_timeout() -> None:
    """TB-T004 points at the timeout option."""
    report = check_constellation("y = Fetch(1) with timeout: 2s\nout y\n", budget=2, file="p.cst")
    (f,) = [f for f in report.findings if f.code == "TB-T004"]
    assert (f.where.line, f.where.column, f.where.parameter) == (1, 19, "timeout")


def test_a_fallback_the_run_budget_leaves_no_time() -> None:
    """A call whose attempts use up the run's budget never reaches its fallback."""
    program = "y = Fetch(1) with timeout: 1s, retry: 1, fallback: 0\nout y\n"
    assert "TB-T005" in check_constellation(program, budget="1500ms").codes()
    assert "TB-T005" not in check_constellation(program, budget="3s").codes()


def test_the_longest_chain_of_calls() -> None:
    """Calls that read each other add up; the fallback's call runs after the attempts."""
    program = (
        "in x: Int\n"
        "a = F(x) with timeout: 1s, retry: 1, delay: 500ms\n"
        "b = G(a) with timeout: 2s, fallback: H(x) with timeout: 300ms\n"
        "c = K(x) with timeout: 1s\n"
        "out b\nout c\n"
    )
    report = check_constellation(program, budget="5s", file="p.cst")
    (chain,) = [f for f in report.findings if f.code == "TB-T030" and f.subject == "the program"]
    assert chain.numbers["worst_case"] == pytest.approx(2.5 + 2 + 0.3)
    assert "F (2:5) -> G (3:5)" in chain.message and chain.message.endswith("ends with 'b'")
    assert "TB-T031" not in report.codes()
    assert "TB-T031" in check_constellation(program, budget="4s").codes()


def test_no_findings_for_calls_without_timing_options() -> None:
    """A program without options has nothing to check."""
    assert check_constellation("in x: Int\ny = F(x)\nz = G(y)\nout z\n").findings == ()


def test_no_budget_no_contradiction() -> None:
    """Without a run budget only the worst cases are stated."""
    program = "y = F(1) with timeout: 1s, retry: 3\nout y\n"
    assert check_constellation(program).codes() == ["TB-T030"]


def test_a_syntax_error_is_a_compile_error() -> None:
    """A program that does not parse raises CompileError with its diagnostic."""
    with pytest.raises(CompileError) as info:
        check_constellation("y = F(1) with timeout:\n")
    assert info.value.diagnostics[0].severity == "error"


def test_an_invalid_option_value_is_a_compile_error() -> None:
    """Option values the parser refuses (E016) are reported as the compiler reports them."""
    with pytest.raises(CompileError) as info:
        check_constellation("y = F(1) with timeout: 0s\nout y\n")
    assert info.value.diagnostics[0].code == "E016"


def test_deep_nesting_is_a_clear_error() -> None:
    """A hostile, deeply nested program is refused by the parser's nesting limit."""
    with pytest.raises(CompileError):
        check_constellation("y = " + "(" * 5000 + "1" + ")" * 5000 + "\nout y\n")


def test_huge_durations_and_counts() -> None:
    """Durations and retry counts far past any real use are checked without an overflow."""
    program = "y = F(1) with timeout: 9223372036854775807d, retry: 9223372036854775807\nout y\n"
    report = check_constellation(program, budget="1s")
    assert report.codes() == ["TB-T004", "TB-T002", "TB-T030"]
    assert "about 10^18" in report.findings[1].message
    with pytest.raises(CompileError) as info:  # past the language's own integer limit
        check_constellation("y = F(1) with retry: 99999999999999999999\nout y\n")
    assert info.value.diagnostics[0].code == "E003"


def _program_worst_case(report: Report) -> list[float]:
    return [f.numbers["worst_case"] for f in report.findings if f.subject == "the program"]


@pytest.mark.parametrize("floor", [", timeout_floor: 50ms", ""])
def test_a_learned_timeout_is_bounded_by_the_deadline_only(floor: str) -> None:
    """`timeout: p99` (D3.16) is learned at run time: the check bounds those attempts by the
    run's deadline only, so the chain through them has no stated worst case, where a fixed
    timeout gives one. A missing floor is the compiler's error, not a crash of the check."""
    fixed = "in x: Int\na = F(x) with timeout: 1s, retry: 2\nb = G(a) with timeout: 1s\nout b\n"
    assert _program_worst_case(check_constellation(fixed)) == [pytest.approx(4.0)]
    learned = fixed.replace("timeout: 1s, retry", f"timeout: p99{floor}, retry")
    assert _program_worst_case(check_constellation(learned)) == []
    assert check_constellation(learned, budget="10s").ok
