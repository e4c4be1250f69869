"""Retry and backoff (D3.1, D3.2), async and sync, on virtual time."""

from __future__ import annotations

import pytest

from timebound import DeadlineExceeded, RetryExhausted
from timebound.policies import Policy
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky, Hang, SlowSync, gaps


async def test_retry_n_allows_n_plus_one_attempts(virtual_clock: VirtualClock) -> None:
    """retry=3 makes four attempts; the fourth succeeds."""
    fn = AsyncFlaky(3)
    assert await Policy("op", retry=3).execute(fn) == "ok"
    assert len(fn.calls) == 4


async def test_retry_zero_surfaces_the_error_unwrapped(virtual_clock: VirtualClock) -> None:
    """retry=0 raises the call's own exception, not RetryExhausted."""
    fn = AsyncFlaky(1, error=KeyError)
    with pytest.raises(KeyError):
        await Policy("op").execute(fn)
    assert len(fn.calls) == 1


async def test_exhausted_retries_raise_retry_exhausted(virtual_clock: VirtualClock) -> None:
    """All attempts failing raise RetryExhausted with every error, chained to the last."""
    fn = AsyncFlaky(10)
    with pytest.raises(RetryExhausted) as info:
        await Policy("GetUser", retry=2).execute(fn)
    err = info.value
    assert err.attempts == 3
    assert [str(e) for e in err.errors] == ["failure 1", "failure 2", "failure 3"]
    assert err.__cause__ is err.errors[-1]
    assert "GetUser failed after 3 attempts" in str(err)
    assert "attempt 3: ConnectionError: failure 3" in str(err)


def test_sync_exhausted_retries_raise_retry_exhausted(virtual_clock: VirtualClock) -> None:
    """The sync path exhausts retries the same way."""
    fn = Flaky(10)
    with pytest.raises(RetryExhausted) as info:
        Policy("op", retry=2).execute_sync(fn)
    assert info.value.attempts == 3


async def test_fixed_backoff_waits_the_same_delay(virtual_clock: VirtualClock) -> None:
    """fixed waits D between attempts."""
    fn = AsyncFlaky(3)
    await Policy("op", retry=3, delay=2).execute(fn)
    assert fn.calls == [0.0, 2.0, 4.0, 6.0]


async def test_linear_backoff_waits_n_times_delay(virtual_clock: VirtualClock) -> None:
    """linear waits n·D after failed attempt n."""
    fn = AsyncFlaky(3)
    await Policy("op", retry=3, delay=1, backoff="linear").execute(fn)
    assert gaps(fn.calls) == [1.0, 2.0, 3.0]


async def test_exponential_backoff_doubles(virtual_clock: VirtualClock) -> None:
    """exponential waits 50, 100, 200 ms."""
    fn = AsyncFlaky(3)
    await Policy("op", retry=3, delay="50ms", backoff="exponential").execute(fn)
    assert gaps(fn.calls) == [0.05, 0.1, 0.2]


def test_sync_exponential_backoff_doubles(virtual_clock: VirtualClock) -> None:
    """The sync path sleeps the same exponential schedule on timebound's clock."""
    fn = Flaky(3)
    Policy("op", retry=3, delay="50ms", backoff="exponential").execute_sync(fn)
    assert gaps(fn.calls) == [0.05, 0.1, 0.2]


async def test_backoff_is_capped_at_30_seconds_by_default(virtual_clock: VirtualClock) -> None:
    """exponential 10 s, 20 s, then the 30 s cap."""
    fn = AsyncFlaky(4)
    await Policy("op", retry=4, delay=10, backoff="exponential").execute(fn)
    assert gaps(fn.calls) == [10.0, 20.0, 30.0, 30.0]


async def test_max_delay_sets_the_cap(virtual_clock: VirtualClock) -> None:
    """max_delay replaces the 30 s cap."""
    fn = AsyncFlaky(3)
    await Policy("op", retry=3, delay=1, backoff="linear", max_delay="2s").execute(fn)
    assert gaps(fn.calls) == [1.0, 2.0, 2.0]


async def test_no_delay_after_the_last_attempt(virtual_clock: VirtualClock) -> None:
    """The failure of the last attempt is raised at once, without a trailing delay."""
    fn = AsyncFlaky(10)
    with pytest.raises(RetryExhausted):
        await Policy("op", retry=2, delay=5).execute(fn)
    assert virtual_clock.now() == 10.0


async def test_never_answering_call_ends_at_exactly_43s(virtual_clock: VirtualClock) -> None:
    """timeout=10, retry=3, delay=1 against a hung call: 4 x 10 s + 3 x 1 s = 43 s."""
    fn = Hang()
    with pytest.raises(RetryExhausted) as info:
        await Policy("Hung", timeout=10, retry=3, delay=1).execute(fn)
    assert virtual_clock.now() == 43.0
    assert fn.calls == [0.0, 11.0, 22.0, 33.0]
    errors = info.value.errors
    assert len(errors) == 4
    assert all(isinstance(e, DeadlineExceeded) and e.source == "attempt" for e in errors)
    assert "Hung timed out after 10s (attempt deadline)" in str(errors[0])


def test_sync_late_attempts_end_at_exactly_51s(virtual_clock: VirtualClock) -> None:
    """A sync call that overruns each 10 s attempt (12 s) is late four times: 4 x 12 + 3 = 51 s."""
    fn = SlowSync(12)
    with pytest.raises(RetryExhausted) as info:
        Policy("Slow", timeout=10, retry=3, delay=1).execute_sync(fn)
    assert virtual_clock.now() == 51.0
    assert fn.calls == [0.0, 13.0, 26.0, 39.0]
    assert all(e.source == "attempt" for e in info.value.errors)  # type: ignore[attr-defined]


async def test_attempt_timeout_does_not_include_the_delay(virtual_clock: VirtualClock) -> None:
    """Each attempt gets its full timeout after the delay: attempts start at 0, 7, 14."""
    fn = Hang()
    with pytest.raises(RetryExhausted):
        await Policy("op", timeout=5, retry=2, delay=2).execute(fn)
    assert fn.calls == [0.0, 7.0, 14.0]
    assert virtual_clock.now() == 19.0


async def test_timeout_then_success_returns_the_value(virtual_clock: VirtualClock) -> None:
    """A timed-out attempt is retried and a later success is returned."""
    calls: list[float] = []

    async def slow_then_fast() -> str:
        calls.append(virtual_clock.now())
        if len(calls) == 1:
            await Hang()()
        return "fast"

    assert await Policy("op", timeout=3, retry=1, delay=1).execute(slow_then_fast) == "fast"
    assert calls == [0.0, 4.0]


async def test_sync_callable_runs_under_execute(virtual_clock: VirtualClock) -> None:
    """execute() accepts a sync callable and retries it."""
    fn = Flaky(1)
    assert await Policy("op", retry=1).execute(fn, ("a",), {"b": 1}) == "ok"
    assert len(fn.calls) == 2


async def test_arguments_are_passed_through(virtual_clock: VirtualClock) -> None:
    """args and kwargs reach the callable unchanged on every attempt."""
    seen: list[tuple[object, ...]] = []

    async def fn(a: int, *, b: int) -> int:
        seen.append((a, b))
        if len(seen) < 2:
            raise ValueError
        return a + b

    assert await Policy("op", retry=1).execute(fn, (1,), {"b": 2}) == 3
    assert seen == [(1, 2), (1, 2)]


def test_jitter_is_additive_and_bounded(virtual_clock: VirtualClock) -> None:
    """jitter=0.5s adds between 0 and 0.5 s to a 1 s fixed delay, never less than the delay."""
    policy = Policy("op", retry=50, delay=1, jitter="500ms")
    delays = [policy.delay_after(n) for n in range(1, 51)]
    assert all(1.0 <= d <= 1.5 for d in delays)
    assert len(set(delays)) > 1


def test_jitter_never_passes_the_cap(virtual_clock: VirtualClock) -> None:
    """jitter=True adds up to the delay itself, but never past max_delay."""
    policy = Policy("op", retry=10, delay=4, backoff="exponential", jitter=True, max_delay=5)
    assert all(4.0 <= policy.delay_after(1) <= 5.0 for _ in range(50))
    assert policy.delay_after(2) == 5.0


def test_retry_with_no_delay_does_not_sleep(virtual_clock: VirtualClock) -> None:
    """Without a delay every attempt starts at the same instant."""
    fn = Flaky(3)
    Policy("op", retry=3).execute_sync(fn)
    assert fn.calls == [0.0, 0.0, 0.0, 0.0]


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    """exponential backoff never overflows: attempt 5000 waits the cap."""
    policy = Policy("op", retry=5000, delay="1ms", backoff="exponential", max_delay=7)
    assert policy.delay_after(5000) == 7.0
