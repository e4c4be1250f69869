"""Fallback (D3.4): lazy, once, only after retries are exhausted, never cached; fallback_on."""

from __future__ import annotations

import asyncio

import pytest

from timebound import Deadline, DeadlineExceeded, RetryExhausted, fail_after, inherit_deadline
from timebound.policies import Policy
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky, Hang


async def test_value_fallback_after_retries(virtual_clock: VirtualClock) -> None:
    """A literal fallback is returned once every attempt failed."""
    fn = AsyncFlaky(10)
    assert await Policy("op", retry=2, fallback="default").execute(fn) == "default"
    assert len(fn.calls) == 3


async def test_fallback_is_lazy_and_evaluated_once(virtual_clock: VirtualClock) -> None:
    """A callable fallback runs only after the last attempt, exactly once, with the call's args."""
    fn = AsyncFlaky(10)
    seen: list[tuple[object, ...]] = []

    def fb(a: int, *, b: int) -> str:
        seen.append((a, b, virtual_clock.now(), len(fn.calls)))
        return "fb"

    assert await Policy("op", retry=2, delay=1, fallback=fb).execute(fn, (1,), {"b": 2}) == "fb"
    assert seen == [(1, 2, 2.0, 3)]


async def test_fallback_not_evaluated_on_success(virtual_clock: VirtualClock) -> None:
    """A call that eventually succeeds never touches the fallback."""
    used = False

    def fb() -> str:
        nonlocal used
        used = True
        return "fb"

    assert await Policy("op", retry=2, fallback=fb).execute(AsyncFlaky(2)) == "ok"
    assert not used


async def test_async_fallback_is_awaited(virtual_clock: VirtualClock) -> None:
    """A coroutine function fallback is awaited."""

    async def fb() -> str:
        await asyncio.sleep(1)
        return "async fb"

    assert await Policy("op", fallback=fb).execute(AsyncFlaky(1)) == "async fb"
    assert virtual_clock.now() == 1.0


def test_sync_fallback(virtual_clock: VirtualClock) -> None:
    """The sync path uses a callable fallback with the call's arguments."""
    assert Policy("op", retry=1, fallback=lambda x: x * 2).execute_sync(Flaky(5), (21,)) == 42


def test_sync_call_rejects_an_async_fallback(virtual_clock: VirtualClock) -> None:
    """execute_sync cannot await a coroutine fallback and says so (chained to the failure)."""

    async def fb() -> str:
        return "x"

    with pytest.raises(TypeError, match="awaitable") as info:
        Policy("op", fallback=fb).execute_sync(Flaky(1))
    assert isinstance(info.value.__cause__, ConnectionError)


async def test_attempt_timeouts_trigger_the_fallback(virtual_clock: VirtualClock) -> None:
    """Timeouts count as failures for the fallback (Constellation: timeout triggers fallback)."""
    fn = Hang()
    assert await Policy("op", timeout=1, retry=1, fallback="fb").execute(fn) == "fb"
    assert virtual_clock.now() == 2.0


async def test_total_timeout_triggers_the_fallback(virtual_clock: VirtualClock) -> None:
    """The call's own total budget is its own: spending it falls back."""
    fn = Hang()
    assert (
        await Policy("op", timeout=3, retry=5, total_timeout=5, fallback="fb").execute(fn) == "fb"
    )
    assert virtual_clock.now() == 5.0


async def test_spent_inherited_deadline_skips_the_fallback(virtual_clock: VirtualClock) -> None:
    """When the caller's deadline is spent the fallback is not run; the deadline is raised."""
    used = False

    def fb() -> str:
        nonlocal used
        used = True
        return "fb"

    with inherit_deadline(Deadline.after(2)):
        with pytest.raises(DeadlineExceeded) as info:
            await Policy("op", timeout=5, fallback=fb).execute(Hang())
    assert info.value.source == "inherited"
    assert not used


async def test_spent_enclosing_scope_skips_the_fallback(virtual_clock: VirtualClock) -> None:
    """A caller's fail_after that fires is reported as its own, not replaced by the fallback."""
    with pytest.raises(DeadlineExceeded) as info:
        async with fail_after(2):
            await Policy("op", timeout=5, fallback="fb").execute(Hang())
    assert info.value.source == "scope"


async def test_explicit_deadline_fallback_on_covers_the_caller_deadline(
    virtual_clock: VirtualClock,
) -> None:
    """fallback_on naming DeadlineExceeded lets a spent inherited deadline fall back."""
    policy = Policy("op", timeout=5, fallback="fb", fallback_on=(DeadlineExceeded,))
    with inherit_deadline(Deadline.after(2)):
        assert await policy.execute(Hang()) == "fb"


async def test_fallback_on_narrows_the_trigger(virtual_clock: VirtualClock) -> None:
    """fallback_on=(TimeoutError,) does not fall back on a ValueError."""
    policy = Policy("op", fallback="fb", fallback_on=(TimeoutError,))
    with pytest.raises(ValueError):
        await policy.execute(AsyncFlaky(1, error=ValueError))
    assert (
        await Policy("op", timeout=1, fallback="fb", fallback_on=TimeoutError).execute(Hang())
        == "fb"
    )


async def test_fallback_on_matches_the_last_error_of_retry_exhausted(
    virtual_clock: VirtualClock,
) -> None:
    """After retries, fallback_on is matched against how the last attempt ended."""
    policy = Policy("op", timeout=1, retry=2, fallback="fb", fallback_on=(TimeoutError,))
    assert await policy.execute(Hang()) == "fb"
    policy = Policy("op", retry=2, fallback="fb", fallback_on=(TimeoutError,))
    with pytest.raises(RetryExhausted):
        await policy.execute(AsyncFlaky(5))


async def test_fallback_on_retry_exhausted_itself(virtual_clock: VirtualClock) -> None:
    """fallback_on=(RetryExhausted,) falls back only after several attempts failed."""
    policy = Policy("op", retry=1, fallback="fb", fallback_on=(RetryExhausted,))
    assert await policy.execute(AsyncFlaky(5)) == "fb"


async def test_fallback_errors_propagate(virtual_clock: VirtualClock) -> None:
    """An error inside the fallback reaches the caller, chained to the call's failure."""

    def fb() -> str:
        raise LookupError("fallback broke")

    with pytest.raises(LookupError) as info:
        await Policy("op", fallback=fb, on_error="skip").execute(AsyncFlaky(1))
    assert isinstance(info.value.__context__, ConnectionError)


async def test_fallback_values_are_not_cached(virtual_clock: VirtualClock) -> None:
    """A fallback result is never stored: the next call tries the module again."""
    fn = AsyncFlaky(1)
    policy = Policy("NoCacheFb", fallback="fb", cache="1min")
    assert await policy.execute(fn, ("k",)) == "fb"
    assert await policy.execute(fn, ("k",)) == "ok"
    assert await policy.execute(fn, ("k",)) == "ok"
    assert len(fn.calls) == 2


async def test_none_is_a_valid_fallback(virtual_clock: VirtualClock) -> None:
    """fallback=None returns None (MISSING marks the absence of a fallback)."""
    assert await Policy("op", fallback=None).execute(AsyncFlaky(1)) is None


async def test_fallback_runs_with_wrap_as_ok(virtual_clock: VirtualClock) -> None:
    """Under on_error=wrap a fallback value comes back as Ok."""
    from timebound.policies import Ok

    assert await Policy("op", fallback=7, on_error="wrap").execute(AsyncFlaky(1)) == Ok(7)


def test_sync_timeouts_trigger_the_fallback(virtual_clock: VirtualClock) -> None:
    """Sync: two late attempts (2 s each against 1 s) fall back at t=4."""
    from ._helpers import SlowSync

    assert Policy("op", timeout=1, retry=1, fallback="fb").execute_sync(SlowSync(2)) == "fb"
    assert virtual_clock.now() == 4.0


def test_sync_call_of_an_async_function_is_a_clear_error(virtual_clock: VirtualClock) -> None:
    """execute_sync on a call returning a coroutine raises TypeError: no retry, no fallback."""
    calls = 0

    async def body() -> None:
        pass

    def fn() -> object:
        nonlocal calls
        calls += 1
        return body()

    with pytest.raises(TypeError, match="awaitable in a sync call"):
        Policy("op", retry=3, fallback="fb", on_error="skip").execute_sync(fn)
    assert calls == 1


async def test_a_deadline_from_a_scope_inside_the_call_falls_back(
    virtual_clock: VirtualClock,
) -> None:
    """The call's own fail_after firing is the call's failure: the fallback applies."""

    async def fn() -> str:
        async with fail_after(1):
            await asyncio.sleep(5)
        return "ok"

    assert await Policy("op", fallback="fb").execute(fn) == "fb"
    assert virtual_clock.now() == 1.0


async def test_caller_deadline_too_short_for_the_delay_skips_the_fallback(
    virtual_clock: VirtualClock,
) -> None:
    """A request deadline that cannot fit the next delay ends the call without the fallback."""
    with inherit_deadline(Deadline.after(4)):
        with pytest.raises(DeadlineExceeded) as info:
            await Policy("op", timeout=3, retry=3, delay=2, fallback="fb").execute(Hang())
    assert virtual_clock.now() == 3.0
    assert info.value.source == "inherited"
    assert isinstance(info.value.__cause__, DeadlineExceeded)
