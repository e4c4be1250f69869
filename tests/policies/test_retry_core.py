"""The retry decision core (RetryPlan): decisions from a serialisable state, no I/O."""

from __future__ import annotations

import asyncio
import pickle

import pytest

import timebound as tb
from timebound.lowlevel import AttemptNow, FallBack, RetryAt, RetryPlan, RetryState, Stop
from timebound.policies import Policy
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky


def test_the_first_decision_is_attempt_one(virtual_clock: VirtualClock) -> None:
    """A fresh state may start attempt 1 at once."""
    plan = RetryPlan("op", retry=2)
    assert plan.begin(plan.start()) == AttemptNow(1)


def test_a_failure_with_retries_left_is_retried_at_the_backoff(
    virtual_clock: VirtualClock,
) -> None:
    """Failure 2 of an exponential plan with delay 1 s: retry at now + 2 s."""
    plan = RetryPlan("op", retry=3, delay=1.0, backoff="exponential")
    state = plan.start()
    state, first = plan.failed(state, ConnectionError("1"))
    assert first == RetryAt(2, tb.Deadline(1.0), 1.0)
    virtual_clock.advance(1)
    assert plan.begin(state) == AttemptNow(2)
    state, second = plan.failed(state, ConnectionError("2"))
    assert isinstance(second, RetryAt)
    assert (second.attempt, second.at.when, second.delay) == (3, 3.0, 2.0)
    assert state.attempt == 2 and state.next_at == tb.Deadline(3.0)


def test_the_last_failure_stops_with_retry_exhausted(virtual_clock: VirtualClock) -> None:
    """retry=1: the second failure ends the call with every error, chained to the last."""
    plan = RetryPlan("op", retry=1)
    state, _ = plan.failed(plan.start(), ConnectionError("1"))
    last = ConnectionError("2")
    state, decision = plan.failed(state, last)
    assert isinstance(decision, Stop) and decision.absorbable
    assert isinstance(decision.error, tb.RetryExhausted)
    assert decision.error.attempts == 2 and decision.error.__cause__ is last


def test_a_fallback_plan_falls_back(virtual_clock: VirtualClock) -> None:
    """With a fallback configured the same ending is FallBack."""
    plan = RetryPlan("op", fallback=True)
    err = ConnectionError("down")
    _, decision = plan.failed(plan.start(), err)
    assert decision == FallBack(err)


def test_a_spent_caller_deadline_stops_unabsorbably(virtual_clock: VirtualClock) -> None:
    """A DeadlineExceeded of the caller's spent bound is never retried nor absorbed (D2.5)."""
    plan = RetryPlan("op", retry=5, fallback=True)
    with tb.move_on_after(1):
        virtual_clock.advance(1)
        err = tb.DeadlineExceeded(source="scope")
        _, decision = plan.failed(plan.start(), err)
    assert decision == Stop(err, False)


def test_a_delay_that_cannot_fit_stops_before_waiting(virtual_clock: VirtualClock) -> None:
    """D3.3: a 2 s delay under a total budget of 1.5 s ends the call now."""
    plan = RetryPlan("op", retry=3, delay=2.0, total_timeout=1.5)
    cause = ConnectionError("1")
    _, decision = plan.failed(plan.start(), cause)
    assert isinstance(decision, Stop)
    assert isinstance(decision.error, tb.DeadlineExceeded)
    assert decision.error.source == "total" and decision.error.__cause__ is cause


def test_begin_refuses_an_attempt_once_the_total_passed(virtual_clock: VirtualClock) -> None:
    """No attempt starts at or after the total budget's end (never early, D1.3)."""
    plan = RetryPlan("op", retry=3, total_timeout=2.0)
    state = plan.start()
    virtual_clock.advance(1.999)
    assert plan.begin(state) == AttemptNow(1)
    virtual_clock.advance(0.001)
    decision = plan.begin(state)
    assert isinstance(decision, Stop)
    assert isinstance(decision.error, tb.DeadlineExceeded) and decision.error.source == "total"


def test_the_state_survives_pickling(virtual_clock: VirtualClock) -> None:
    """A persisted state (errors included) restores to an equal decision sequence."""
    plan = RetryPlan("op", retry=2, delay=1.0)
    state, _ = plan.failed(plan.start(), ConnectionError("1"))
    restored = pickle.loads(pickle.dumps(state))
    assert isinstance(restored, RetryState)
    assert restored.attempt == 1 and [str(e) for e in restored.errors] == ["1"]
    _, again = plan.failed(restored, ConnectionError("2"))
    assert isinstance(again, RetryAt) and again.attempt == 3


def test_retry_on_types_retry_only_those(virtual_clock: VirtualClock) -> None:
    """retry_on=ConnectionError: a ValueError surfaces at once, unwrapped."""
    fn = Flaky(2, error=ValueError)
    with pytest.raises(ValueError):
        Policy("op", retry=3, retry_on=ConnectionError).execute_sync(fn)
    assert len(fn.calls) == 1


def test_retry_on_a_predicate(virtual_clock: VirtualClock) -> None:
    """retry_on=predicate: retried while it says so."""
    fn = Flaky(2)
    policy = Policy("op", retry=3, retry_on=lambda e: "failure" in str(e))
    assert policy.execute_sync(fn) == "ok"
    assert len(fn.calls) == 3


@pytest.mark.parametrize("bad", [(), "ConnectionError", asyncio.CancelledError, KeyboardInterrupt])
def test_retry_on_refuses_what_cannot_be_retried(bad: object) -> None:
    """retry_on must name Exception types: cancellation and interrupts are never retried."""
    with pytest.raises(tb.ConfigurationError) as info:
        Policy("op", retry=1, retry_on=bad)  # type: ignore[arg-type]
    assert info.value.option == "retry_on"


async def test_cancellation_is_never_retried_even_if_retry_on_says_so(
    virtual_clock: VirtualClock,
) -> None:
    """tenacity#529: a CancelledError raised by the call passes through, attempted once."""
    calls = 0

    async def cancelled() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await Policy("op", retry=3, retry_on=lambda e: True).execute(cancelled)
    assert calls == 1


def test_keyboard_interrupt_is_never_retried(virtual_clock: VirtualClock) -> None:
    """stamina: only Exceptions are retried; KeyboardInterrupt ends the call at once."""
    calls = 0

    def interrupted() -> None:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Policy("op", retry=3).execute_sync(interrupted)
    assert calls == 1


async def test_both_drivers_take_the_same_decisions(virtual_clock: VirtualClock) -> None:
    """Sync and async runs of one plan make the same attempts at the same instants."""
    policy = Policy("op", retry=3, delay=1.0, backoff="linear")
    sync_fn, async_fn = Flaky(2), AsyncFlaky(2)
    t0 = virtual_clock.now()
    assert policy.execute_sync(sync_fn) == "ok"
    t1 = virtual_clock.now()
    assert await policy.execute(async_fn) == "ok"
    assert [t - t0 for t in sync_fn.calls] == [t - t1 for t in async_fn.calls] == [0, 1, 3]


def test_a_failing_retry_on_predicate_says_where_it_failed(virtual_clock: VirtualClock) -> None:
    """A predicate that raises ends the call with its error, noted with the policy and the
    error it was judging."""

    def broken(exc: Exception) -> bool:
        raise KeyError("oops")

    with pytest.raises(KeyError) as info:
        Policy("op", retry=3, retry_on=broken).execute_sync(Flaky(1))
    assert "retry_on predicate of op" in "".join(info.value.__notes__)
    assert isinstance(info.value.__context__, ConnectionError)
