"""The retry loop's worst case (D14.2): each finding code, and agreement with the real loop."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import timebound as tb
from timebound.analysis import check_policy
from timebound.analysis._retries import follow, worst_case
from timebound.lowlevel import RetryPlan
from timebound.policies import Policy
from timebound.testing import VirtualClock


def codes(**options: Any) -> list[str]:
    budget = options.pop("budget", None)
    return check_policy(Policy("op", **options), budget=budget).codes()


def finding(code: str, **options: Any) -> Any:
    budget = options.pop("budget", None)
    found = [f for f in check_policy(Policy("op", **options), budget=budget).findings]
    return next(f for f in found if f.code == code)


# TB-T001 -------------------------------------------------------------------------------------


def test_t001_a_retry_the_waits_alone_cannot_reach() -> None:
    """Exponential waits of 1+2+4 s reach a 5 s total: attempt 4 never starts."""
    f = finding("TB-T001", retry=3, delay=1, backoff="exponential", total_timeout=5)
    assert f.severity == "error"
    assert (f.numbers["attempt"], f.numbers["delays"], f.numbers["budget"]) == (4, 7.0, 5.0)
    assert "attempt 4 of 4 can never start" in f.message
    assert f.fix is not None and "lower retry to 2" in f.fix


def test_t001_not_when_the_waits_fit() -> None:
    """Waits of 1+2+4 s fit a budget of 7.5 s: no TB-T001."""
    assert "TB-T001" not in codes(retry=3, delay=1, backoff="exponential", total_timeout=7.5)


def test_t001_a_wait_equal_to_what_is_left_stops_the_loop() -> None:
    """D3.3 stops when the wait is >= what is left: waits of 2 + 3 s against 5 s stop attempt 3."""
    f = finding("TB-T001", retry=2, delay=1, backoff="linear", total_timeout=3)
    assert f.numbers["attempt"] == 3  # 1 s, then 2 s reaches the 3 s total


def test_t001_under_the_callers_budget() -> None:
    """The caller's budget bounds the loop as a total does."""
    f = finding("TB-T001", retry=2, delay=2, budget=3)
    assert "the caller's budget" in f.message and f.numbers["attempt"] == 3


def test_t001_the_cap_and_jitter_as_the_plan_computes_them() -> None:
    """Exponential waits capped at 1.5 s: 1 + 1.5 + 1.5 = 4 s reach 4 s; jitter never shortens."""
    f = finding(
        "TB-T001",
        retry=5,
        delay=1,
        backoff="exponential",
        max_delay=1.5,
        jitter=True,
        total_timeout=4,
    )
    assert (f.numbers["attempt"], f.numbers["delays"]) == (4, 4.0)


# TB-T002 -------------------------------------------------------------------------------------


def test_t002_timed_out_attempts_leave_no_room() -> None:
    """Two 2 s attempts and a 100 ms wait, then another wait, past a 4.1 s total."""
    f = finding("TB-T002", timeout=2, retry=3, delay=0.1, total_timeout=4.1)
    assert f.numbers["attempt"] == 3
    assert "attempt 3 of 4 never starts after timed-out attempts" in f.message


def test_t002_not_when_every_attempt_fits() -> None:
    """Four 1 s attempts and three 100 ms waits fit 4.4 s."""
    assert "TB-T002" not in codes(timeout=1, retry=3, delay=0.1, total_timeout=4.4)


def test_t002_not_when_timeouts_are_not_retried() -> None:
    """retry_on without DeadlineExceeded never retries a timed-out attempt: nothing to report."""
    assert "TB-T002" not in codes(
        timeout=2, retry=3, delay=0.1, total_timeout=4.1, retry_on=ConnectionError
    )


def test_t002_a_predicate_that_raises_counts_as_retrying() -> None:
    """A retry_on predicate that cannot judge the timeout is taken to retry it."""

    def broken(exc: Exception) -> bool:
        raise RuntimeError("no")

    assert "TB-T002" in codes(timeout=2, retry=3, total_timeout=4.1, retry_on=broken)


# TB-T003 -------------------------------------------------------------------------------------


def test_t003_a_retry_only_the_jitter_can_push_out() -> None:
    """With waits of 1 s (2 s with full jitter) attempt 3 fits 5.5 s only when jitter is small."""
    f = finding("TB-T003", timeout=1, retry=3, delay=1, jitter=True, total_timeout=5.5)
    assert f.severity == "warning"
    assert f.numbers["attempt"] == 3
    assert (f.numbers["delays"], f.numbers["delays_with_jitter"]) == (2.0, 4.0)


def test_t003_not_without_jitter() -> None:
    """The same loop without jitter has no jitter-only finding."""
    assert "TB-T003" not in codes(timeout=1, retry=3, delay=1, total_timeout=5.5)


def test_t003_jitter_is_capped_by_max_delay() -> None:
    """Jitter never passes max_delay: capped at the base wait, it cannot push anything out."""
    assert "TB-T003" not in codes(
        timeout=1, retry=2, delay=1, jitter=True, max_delay=1, total_timeout=4.5
    )


# TB-T004 -------------------------------------------------------------------------------------


def test_t004_an_attempt_timeout_at_the_total() -> None:
    """timeout=5 under total_timeout=4: the total always ends the attempt first."""
    f = finding("TB-T004", timeout=5, retry=3, total_timeout=4)
    assert f.where.parameter == "timeout" and f.severity == "error"
    assert codes(timeout=5, retry=3, total_timeout=4)[:2] == ["TB-T004", "TB-T002"]


def test_t004_a_tie_goes_to_the_budget() -> None:
    """An attempt timeout equal to the caller's budget never fires (the enclosing bound wins)."""
    assert "TB-T004" in codes(timeout=2, budget=2)


def test_t004_not_below_the_budget() -> None:
    """An attempt timeout below every budget fires."""
    assert "TB-T004" not in codes(timeout=1.9, budget=2, total_timeout=3)


# TB-T005 -------------------------------------------------------------------------------------


def test_t005_a_fallback_the_callers_deadline_always_beats() -> None:
    """Three 1 s attempts under 2.5 s: the caller's deadline ends the loop, not the fallback."""
    f = finding("TB-T005", timeout=1, retry=2, fallback="x", budget=2.5)
    assert f.severity == "error" and f.numbers["worst_case"] == 3.0


def test_t005_a_single_attempt_at_the_budget() -> None:
    """One attempt of 3 s under a 2 s budget: no time for the fallback."""
    assert "TB-T005" in codes(timeout=3, fallback="x", budget=2)


def test_t005_not_when_a_total_ends_the_loop_first() -> None:
    """A total_timeout below the caller's budget ends the loop with time left: no finding."""
    assert "TB-T005" not in codes(timeout=1, retry=2, fallback="x", budget=2.5, total_timeout=2)


def test_t005_not_when_the_fallback_is_not_for_timeouts() -> None:
    """fallback_on=ConnectionError never covers timed-out attempts: no time is owed to it."""
    assert "TB-T005" not in codes(
        timeout=1, retry=2, fallback="x", fallback_on=ConnectionError, budget=2.5
    )
    assert "TB-T005" in codes(
        timeout=1, retry=2, fallback="x", fallback_on=TimeoutError, budget=2.5
    )


def test_t005_not_when_the_loop_fits() -> None:
    """Three 1 s attempts fit 3.5 s: the fallback runs in time."""
    assert "TB-T005" not in codes(timeout=1, retry=2, fallback="x", budget=3.5)


# TB-T030, TB-T031 ------------------------------------------------------------------------------


def test_t030_the_worst_case_of_a_bounded_loop() -> None:
    """Three 1 s attempts and waits of 1 s and 2 s: 6 s."""
    f = finding("TB-T030", timeout=1, retry=2, delay=1, backoff="linear")
    assert f.numbers["worst_case"] == 6.0 and f.severity == "info"


def test_t030_not_for_an_unbounded_loop() -> None:
    """Without an attempt timeout or a budget there is no worst case to state."""
    assert codes(retry=2, delay=1) == []


def test_t031_the_last_attempt_is_cut() -> None:
    """Three 1 s attempts under 2.5 s: every attempt starts, the last is cut short."""
    f = finding("TB-T031", timeout=1, retry=2, budget=2.5)
    assert f.severity == "warning" and f.numbers["worst_case"] == 3.0


def test_t031_not_when_everything_fits() -> None:
    """Three 1 s attempts under 3 s: nothing is cut."""
    assert "TB-T031" not in codes(timeout=1, retry=2, budget=3)


# Hostile numbers -------------------------------------------------------------------------------


def test_a_retry_count_past_a_float() -> None:
    """10^400 retries: strides, counts shown by magnitude, JSON-safe numbers."""
    report = check_policy(Policy("op", timeout=1, retry=10**400, delay=1), budget=1e300)
    assert report.codes()[:2] == ["TB-T001", "TB-T002"]
    assert "about 10^400" in report.findings[0].message
    json.dumps(report.to_json(), allow_nan=False)


def test_durations_past_a_float() -> None:
    """Timeouts and waits near the float limit make an unbounded worst case, never inf in JSON."""
    report = check_policy(Policy("op", timeout=1e308, retry=10**20, delay=1e308, max_delay=1e308))
    json.dumps(report.to_json(), allow_nan=False)
    assert report.ok


# The schedule is the loop's --------------------------------------------------------------------


async def _run(policy: Policy[Any], *, hang: bool, clock: VirtualClock) -> tuple[int, float]:
    calls = 0

    async def work() -> None:
        nonlocal calls
        calls += 1
        if hang:
            await asyncio.sleep(3600)
        raise ConnectionError("down")

    start = clock.now()
    try:
        await policy.execute(work)
    except (tb.DeadlineExceeded, tb.RetryExhausted, ConnectionError):
        pass
    return calls, clock.now() - start


@settings(max_examples=60, deadline=None)
@given(
    timeout=st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0]),
    retry=st.integers(0, 6),
    delay=st.sampled_from([None, 0.25, 0.5, 1.0]),
    backoff=st.sampled_from(["fixed", "linear", "exponential"]),
    max_delay=st.sampled_from([30.0, 1.0]),
    total=st.sampled_from([1.0, 2.5, 4.0, 6.0, 10.0]),
    hang=st.booleans(),
)
def test_the_schedule_matches_the_real_loop(
    timeout: float,
    retry: int,
    delay: float | None,
    backoff: str,
    max_delay: float,
    total: float,
    hang: bool,
) -> None:
    """On virtual time the real policy starts exactly the attempts the check says, and a loop of
    hung attempts ends at the worst case the check computes."""
    policy: Policy[Any] = Policy(
        "op",
        timeout=timeout,
        retry=retry,
        delay=delay,
        backoff=backoff,
        max_delay=max_delay,
        total_timeout=total,
    )
    clock = VirtualClock()
    calls, took = clock.run(_run(policy, hang=hang, clock=clock))
    schedules = follow(policy.plan, timeout, total)
    track = schedules.timeouts if hang else schedules.errors
    assert track is not None
    expected = retry + 1 if track.stopped is None else track.stopped - 1
    assert calls == expected
    if hang:
        assert math.isclose(took, worst_case(policy.plan, timeout, total), abs_tol=1e-9)


@given(
    attempt=st.integers(1, 2000),
    delay=st.floats(1e-3, 100),
    backoff=st.sampled_from(["fixed", "linear", "exponential"]),
    max_delay=st.floats(1e-3, 1000),
    jitter=st.one_of(st.booleans(), st.floats(1e-3, 100)),
)
def test_delay_bounds_hold_every_delay(
    attempt: int, delay: float, backoff: str, max_delay: float, jitter: bool | float
) -> None:
    """delay_after always lies within delay_bounds, and never past max_delay."""
    plan = RetryPlan(
        "op", retry=3, delay=delay, backoff=backoff, max_delay=max_delay, jitter=jitter
    )
    shortest, longest = plan.delay_bounds(attempt)
    assert shortest <= plan.delay_after(attempt) <= longest <= max_delay
    if jitter is False:
        assert shortest == longest


@pytest.mark.parametrize("budget", [None, 10.0])
def test_worst_case_without_a_timeout(budget: float | None) -> None:
    """Attempts without a timeout are bounded only by the budget."""
    plan = Policy("op", retry=2).plan
    assert worst_case(plan, None, budget) == (math.inf if budget is None else budget)


@pytest.mark.parametrize("budget", [2.5, 3.0, 3.5])
def test_t005_matches_the_real_loop(budget: float) -> None:
    """Under the caller's deadline the real policy reaches its fallback exactly when the check
    finds time left for it (three hung 1 s attempts)."""
    policy: Policy[Any] = Policy("op", timeout=1, retry=2, fallback="fallback")
    reported = "TB-T005" in check_policy(policy, budget=budget).codes()

    async def hang() -> str:
        await asyncio.sleep(3600)
        return "answer"

    async def main() -> str:
        try:
            with tb.fail_after(budget):
                return await policy.execute(hang)
        except tb.DeadlineExceeded:
            return "deadline"

    outcome = VirtualClock().run(main())
    assert outcome == ("deadline" if reported else "fallback")


def test_an_infinite_budget_with_a_huge_retry_count() -> None:
    """total_timeout=inf and 10^30 retries: every attempt starts, and the check ends."""
    report = check_policy(Policy("op", timeout=1, retry=10**30, delay=1, total_timeout=math.inf))
    assert report.ok and "TB-T001" not in report.codes()


def test_a_schedule_still_growing_past_the_steps_followed() -> None:
    """Linear waits from 1 ns that stay below their cap for 10^6 attempts: followed to
    MAX_STEPS, then only the budget is claimed as the end."""
    plan = Policy("op", timeout=1e-9, retry=10**6, delay=1e-9, backoff="linear").plan
    schedules = follow(plan, 1e-9, 1000.0)
    assert schedules.worst is not None and schedules.worst.stopped is None
    assert schedules.worst.end == 1000.0
