"""Deadline first (D3.3), what is never retried (D2.3, D2.5), sync and async, on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from timebound import (
    Deadline,
    DeadlineExceeded,
    RetryExhausted,
    current_deadline,
    fail_after,
    inherit_deadline,
)
from timebound._core import _clock
from timebound.policies import Policy
from timebound.telemetry import Event
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky, Hang, SlowSync


def _failing_after(seconds: float) -> Flaky:
    """A sync call that takes ``seconds`` and then fails, recording when it started."""
    calls: list[float] = []

    def fn() -> None:
        calls.append(_clock.now())
        _clock.sleep(seconds)
        raise ConnectionError("down")

    fn.calls = calls  # type: ignore[attr-defined]
    return fn  # type: ignore[return-value]


async def test_total_timeout_stops_before_a_delay_that_cannot_fit(
    virtual_clock: VirtualClock,
) -> None:
    """At t=8 a 2 s delay would reach the 10 s total: stop there, without sleeping."""
    fn = Hang()
    policy = Policy("op", timeout=3, retry=5, delay=2, total_timeout=10)
    with pytest.raises(DeadlineExceeded) as info:
        await policy.execute(fn)
    assert virtual_clock.now() == 8.0
    assert fn.calls == [0.0, 5.0]
    err = info.value
    assert err.source == "total"
    assert err.timeout == 10.0
    assert err.deadline == Deadline(10.0)
    assert isinstance(err.__cause__, DeadlineExceeded)
    assert err.__cause__.source == "attempt"
    assert "stopped before attempt 3" in str(err)


def test_sync_total_timeout_stops_before_a_delay_that_cannot_fit(
    virtual_clock: VirtualClock,
) -> None:
    """Sync: attempts of 4 s with 1 s delays under a 10 s total stop at t=9 with no sleep."""
    fn = _failing_after(4)
    with pytest.raises(DeadlineExceeded) as info:
        Policy("op", retry=5, delay=1, total_timeout=10).execute_sync(fn)
    assert virtual_clock.now() == 9.0
    assert fn.calls == [0.0, 5.0]  # type: ignore[attr-defined]
    assert info.value.source == "total"
    assert isinstance(info.value.__cause__, ConnectionError)


async def test_total_timeout_cuts_a_running_attempt(virtual_clock: VirtualClock) -> None:
    """The second attempt (started at 7) is cut at the 10 s total, not at its own 13 s.

    tenacity (tenacity#373) and backoff (backoff#186) check a total budget only between attempts.
    """
    fn = Hang()
    with pytest.raises(DeadlineExceeded) as info:
        await Policy("op", timeout=6, retry=3, delay=1, total_timeout=10).execute(fn)
    assert virtual_clock.now() == 10.0
    assert fn.calls == [0.0, 7.0]
    assert info.value.source == "total"
    assert info.value.timeout == 10.0
    assert info.value.deadline == Deadline(10.0)


async def test_total_timeout_without_attempt_timeout(virtual_clock: VirtualClock) -> None:
    """total_timeout alone bounds a hung call and is not retried."""
    fn = Hang()
    with pytest.raises(DeadlineExceeded) as info:
        await Policy("op", retry=3, total_timeout=5).execute(fn)
    assert virtual_clock.now() == 5.0
    assert fn.calls == [0.0]
    assert info.value.source == "total"


async def test_total_wins_a_tie_with_the_attempt_timeout(virtual_clock: VirtualClock) -> None:
    """When the attempt timeout and the total end together the total is reported (not retried)."""
    fn = Hang()
    with pytest.raises(DeadlineExceeded) as info:
        await Policy("op", timeout=5, retry=3, total_timeout=5).execute(fn)
    assert info.value.source == "total"
    assert fn.calls == [0.0]


def test_sync_late_attempt_past_the_total_is_not_retried(virtual_clock: VirtualClock) -> None:
    """Sync: a 12 s call under a 10 s total returns late: DeadlineExceeded(total) at t=12."""
    fn = SlowSync(12)
    with pytest.raises(DeadlineExceeded) as info:
        Policy("op", timeout=20, retry=3, total_timeout=10).execute_sync(fn)
    assert virtual_clock.now() == 12.0
    assert fn.calls == [0.0]
    assert info.value.source == "total"


async def test_inherited_deadline_clamps_the_attempt_and_is_not_retried(
    virtual_clock: VirtualClock,
) -> None:
    """An inherited deadline at 4 s cuts a 10 s attempt at 4 s, reported as inherited, no retry."""
    fn = Hang()
    with inherit_deadline(Deadline.after(4)):
        with pytest.raises(DeadlineExceeded) as info:
            await Policy("op", timeout=10, retry=3, delay=1).execute(fn)
    assert virtual_clock.now() == 4.0
    assert fn.calls == [0.0]
    assert info.value.source == "inherited"


def test_sync_inherited_deadline_clamps_the_attempt(virtual_clock: VirtualClock) -> None:
    """Sync: a 6 s call under an inherited 4 s deadline is late and reported as inherited."""
    fn = SlowSync(6)
    with inherit_deadline(Deadline.after(4)):
        with pytest.raises(DeadlineExceeded) as info:
            Policy("op", timeout=10, retry=3).execute_sync(fn)
    assert virtual_clock.now() == 6.0
    assert fn.calls == [0.0]
    assert info.value.source == "inherited"


async def test_inherited_deadline_stops_before_a_delay(virtual_clock: VirtualClock) -> None:
    """After a 2 s attempt, a 3 s delay cannot fit a 5 s inherited deadline: stop at 2."""
    fn = Hang()
    with inherit_deadline(Deadline.after(5)):
        with pytest.raises(DeadlineExceeded) as info:
            await Policy("op", timeout=2, retry=3, delay=3).execute(fn)
    assert virtual_clock.now() == 2.0
    assert info.value.source == "inherited"
    assert isinstance(info.value.__cause__, DeadlineExceeded)
    assert info.value.__cause__.source == "attempt"


async def test_inherited_deadline_shortens_the_last_attempt(virtual_clock: VirtualClock) -> None:
    """Attempts at 0 and 4 (2 s each, 2 s delay); the second is cut at the inherited 5 s."""
    fn = Hang()
    with inherit_deadline(Deadline.after(5)):
        with pytest.raises(DeadlineExceeded) as info:
            await Policy("op", timeout=2, retry=3, delay=2).execute(fn)
    assert fn.calls == [0.0, 4.0]
    assert virtual_clock.now() == 5.0
    assert info.value.source == "inherited"


async def test_spent_deadline_starts_no_attempt(virtual_clock: VirtualClock) -> None:
    """With the inherited deadline already reached, the call is never made."""
    fn = AsyncFlaky(0)
    with inherit_deadline(Deadline.after(0)):
        with pytest.raises(DeadlineExceeded) as info:
            await Policy("op", retry=3).execute(fn)
    assert fn.calls == []
    assert info.value.source == "inherited"


def test_sync_spent_deadline_starts_no_attempt(virtual_clock: VirtualClock) -> None:
    """Sync: a spent inherited deadline raises before the first attempt."""
    fn = Flaky(0)
    with inherit_deadline(Deadline.after(0)):
        with pytest.raises(DeadlineExceeded):
            Policy("op", retry=3).execute_sync(fn)
    assert fn.calls == []


async def test_enclosing_scope_is_reported_and_not_retried(virtual_clock: VirtualClock) -> None:
    """A caller's fail_after(4) ends the call at 4 s with source scope; no retry."""
    fn = Hang()
    with pytest.raises(DeadlineExceeded) as info:
        async with fail_after(4):
            await Policy("op", timeout=10, retry=3).execute(fn)
    assert virtual_clock.now() == 4.0
    assert fn.calls == [0.0]
    assert info.value.source == "scope"


async def test_enclosing_scope_stops_before_a_delay(virtual_clock: VirtualClock) -> None:
    """Inside fail_after(5), a failing call with 10 s delays stops after its first failure."""
    fn = AsyncFlaky(5)
    with pytest.raises(DeadlineExceeded) as info:
        async with fail_after(5):
            await Policy("op", retry=3, delay=10).execute(fn)
    assert virtual_clock.now() == 0.0
    assert info.value.source == "scope"
    assert isinstance(info.value.__cause__, ConnectionError)


async def test_foreign_deadline_errors_are_not_retried(virtual_clock: VirtualClock) -> None:
    """A DeadlineExceeded the call raises with a non-attempt source (propagated) is final."""
    calls: list[float] = []

    async def fn() -> None:
        calls.append(virtual_clock.now())
        raise DeadlineExceeded(source="propagated")

    with pytest.raises(DeadlineExceeded) as info:
        await Policy("op", retry=3).execute(fn)
    assert len(calls) == 1
    assert info.value.source == "propagated"


async def test_attempt_deadline_errors_from_the_call_are_retried(
    virtual_clock: VirtualClock,
) -> None:
    """A DeadlineExceeded(source=attempt) raised by an inner call is an ordinary timeout."""
    fn = AsyncFlaky(1, error=lambda msg: DeadlineExceeded(source="attempt"))  # type: ignore[arg-type]
    assert await Policy("op", retry=1).execute(fn) == "ok"


async def test_cancellation_is_never_retried_nor_falls_back(virtual_clock: VirtualClock) -> None:
    """Cancelling the caller's task propagates CancelledError at once (tenacity#529)."""
    fn = Hang()
    policy = Policy("op", retry=5, delay=1, fallback="fb")
    task = asyncio.ensure_future(policy.execute(fn))
    await asyncio.sleep(3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fn.calls == [0.0]
    assert virtual_clock.now() == 3.0


async def test_cancelled_error_raised_by_the_call_is_not_retried(
    virtual_clock: VirtualClock,
) -> None:
    """A CancelledError from the call is never retried, converted or caught (tenacity#529)."""
    calls = 0

    async def fn() -> None:
        nonlocal calls
        calls += 1
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await Policy("op", retry=5, fallback="fb", on_error="skip").execute(fn)
    assert calls == 1


def test_keyboard_interrupt_is_never_retried(virtual_clock: VirtualClock) -> None:
    """KeyboardInterrupt passes through retries, fallback and on_error untouched."""
    calls = 0

    def fn() -> None:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Policy("op", retry=5, fallback="fb").execute_sync(fn)
    assert calls == 1


def test_system_exit_is_never_retried(virtual_clock: VirtualClock) -> None:
    """SystemExit passes through a wrap policy untouched."""

    def fn() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        Policy("op", retry=5, on_error="wrap").execute_sync(fn)


async def test_attempt_scope_is_visible_to_the_call(virtual_clock: VirtualClock) -> None:
    """Inside an attempt the effective deadline is min(timeout, remaining total)."""
    from timebound import current_deadline

    seen: list[float] = []

    async def fn() -> None:
        seen.append(current_deadline().when)

    await Policy("op", timeout=10, total_timeout=4).execute(fn)
    await Policy("op", timeout=3, total_timeout=4).execute(fn)
    assert seen == [4.0, 3.0]


def test_retry_exhausted_is_raised_only_for_own_failures(virtual_clock: VirtualClock) -> None:
    """A mix of errors and attempt timeouts still ends in RetryExhausted."""
    fn = SlowSync(3, value=None)
    calls = Flaky(0)

    def mixed() -> None:
        calls()
        if len(calls.calls) == 1:
            raise ValueError("bad")
        fn()

    with pytest.raises(RetryExhausted) as info:
        Policy("op", timeout=2, retry=1).execute_sync(mixed)
    assert [type(e).__name__ for e in info.value.errors] == ["ValueError", "DeadlineExceeded"]


def test_sync_checkpoint_inside_the_call_sees_the_attempt_deadline(
    virtual_clock: VirtualClock,
) -> None:
    """A sync call that checks tb.checkpoint() stops at its attempt's deadline and is retried."""
    from timebound import checkpoint

    starts: list[float] = []

    def cooperative() -> str:
        starts.append(virtual_clock.now())
        for _ in range(10):
            virtual_clock.advance(1)
            checkpoint()
        return "done"

    with pytest.raises(RetryExhausted) as info:
        Policy("op", timeout="2500ms", retry=1, delay=1).execute_sync(cooperative)
    assert starts == [0.0, 4.0]
    assert virtual_clock.now() == 7.0
    assert all(e.source == "attempt" for e in info.value.errors)  # type: ignore[attr-defined]


@pytest.mark.realtime
@pytest.mark.asyncio_real
async def test_attempt_timeout_on_a_real_event_loop() -> None:
    """On a real asyncio loop a hung attempt is cut by its timeout and retried."""
    fn = Hang()
    with pytest.raises(RetryExhausted) as info:
        await Policy("op", timeout="10ms", retry=1, delay="1ms").execute(fn)
    assert len(fn.calls) == 2
    assert all(e.source == "attempt" for e in info.value.errors)  # type: ignore[attr-defined]


async def test_total_budget_is_visible_during_the_delay(virtual_clock: VirtualClock) -> None:
    """Between attempts current_deadline() includes total_timeout (D1.5), e.g. for listeners."""
    seen: list[Deadline] = []

    def observer(event: Event) -> None:
        if event.name == "retry.delay":
            seen.append(current_deadline())

    policy = Policy("op", retry=1, delay=1, total_timeout=10)
    assert await policy.execute(AsyncFlaky(1), observer=observer) == "ok"
    assert seen == [Deadline(10.0)]
    assert current_deadline() == Deadline.never()


def test_sync_total_budget_is_visible_during_the_delay(virtual_clock: VirtualClock) -> None:
    """Sync: during the delay the effective deadline is min(total, enclosing bounds)."""
    seen: list[Deadline] = []

    def observer(event: Event) -> None:
        if event.name == "retry.delay":
            seen.append(current_deadline())

    policy = Policy("op", retry=2, delay=1, total_timeout=10)
    with inherit_deadline(Deadline.after(20)):
        assert policy.execute_sync(Flaky(1), observer=observer) == "ok"
    with inherit_deadline(Deadline.after(5)):
        assert policy.execute_sync(Flaky(1), observer=observer) == "ok"
    assert seen == [Deadline(10.0), Deadline(6.0)]


async def test_a_deadline_from_a_scope_inside_the_call_is_retried(
    virtual_clock: VirtualClock,
) -> None:
    """The call's own fail_after (source scope) is its failure, not the caller's: retried."""
    calls: list[float] = []

    async def fn() -> str:
        calls.append(virtual_clock.now())
        if len(calls) == 1:
            async with fail_after(1):
                await asyncio.sleep(5)
        return "ok"

    assert await Policy("op", retry=1, delay=2).execute(fn) == "ok"
    assert calls == [0.0, 3.0]


def test_sync_a_deadline_from_a_scope_inside_the_call_is_retried(
    virtual_clock: VirtualClock,
) -> None:
    """Sync: an inner scope that overran raises source scope at its exit; the policy retries."""
    calls: list[float] = []

    def fn() -> str:
        calls.append(virtual_clock.now())
        if len(calls) == 1:
            with fail_after(1):
                _clock.sleep(2)
        return "ok"

    assert Policy("op", retry=1, delay=1).execute_sync(fn) == "ok"
    assert calls == [0.0, 3.0]


async def test_an_inner_scope_error_exhausts_retries_like_any_error(
    virtual_clock: VirtualClock,
) -> None:
    """Retries exhausted on inner-scope timeouts end in RetryExhausted of those errors."""

    async def fn() -> None:
        async with fail_after(1):
            await asyncio.sleep(5)

    with pytest.raises(RetryExhausted) as info:
        await Policy("op", retry=2).execute(fn)
    assert virtual_clock.now() == 3.0
    assert [e.source for e in info.value.errors] == ["scope", "scope", "scope"]  # type: ignore[attr-defined]
