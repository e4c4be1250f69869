"""A policy's reserve (D1.18): the attempts and delays see the caller's deadline less the reserve,
and the fallback (or on_error) still has the reserve when they run out."""

from __future__ import annotations

import asyncio

import pytest

import timebound as tb
from timebound.policies import Policy, resilient
from timebound.testing import VirtualClock


async def test_the_fallback_keeps_the_reserve(virtual_clock: VirtualClock) -> None:
    start = virtual_clock.now()
    seen: dict[str, float] = {}

    async def slow() -> str:
        seen["attempt"] = tb.remaining()
        await asyncio.sleep(60)
        return "fresh"

    def cached() -> str:
        seen["fallback"] = tb.remaining()
        return "cached"

    policy = Policy("GetUser", timeout=5, retry=3, fallback=cached, reserve="200ms")
    async with tb.fail_after(1):
        assert await policy.execute(slow) == "cached"
    assert virtual_clock.now() - start == pytest.approx(0.8)
    assert seen == {"attempt": pytest.approx(0.8), "fallback": pytest.approx(0.2)}


async def test_without_the_reserve_the_fallback_never_runs(virtual_clock: VirtualClock) -> None:
    """The contrast: a spent caller deadline is not replaced by a fallback (D2.5)."""

    async def slow() -> str:
        await asyncio.sleep(60)
        return "fresh"

    policy = Policy("GetUser", timeout=5, fallback="cached")
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(1):
            await policy.execute(slow)


async def test_an_inherited_request_deadline_keeps_the_reserve_too(
    virtual_clock: VirtualClock,
) -> None:
    @resilient(timeout=5, fallback="cached", reserve="200ms")
    async def fetch() -> str:
        await asyncio.sleep(60)
        return "fresh"

    with tb.inherit_deadline(tb.Deadline.after(1), set_by="ASGI middleware"):
        assert await fetch() == "cached"


async def test_a_retry_delay_that_does_not_fit_falls_back_in_the_reserve(
    virtual_clock: VirtualClock,
) -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.5)
        raise ValueError("down")

    policy = Policy("GetUser", retry=3, delay="400ms", fallback="cached", reserve="200ms")
    start = virtual_clock.now()
    async with tb.fail_after(1):
        assert await policy.execute(flaky) == "cached"
    assert calls == 1
    assert virtual_clock.now() - start == pytest.approx(0.5)


async def test_without_a_fallback_the_reserve_error_says_so(virtual_clock: VirtualClock) -> None:
    async def slow() -> str:
        await asyncio.sleep(60)
        return "fresh"

    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(1):
            await Policy("GetUser", timeout=5, reserve="200ms").execute(slow)
    assert info.value.set_by == "reserve of policy GetUser"
    skip = Policy("GetUser", timeout=5, reserve="200ms", on_error="skip", zero="")
    async with tb.fail_after(1):
        assert await skip.execute(slow) == ""


async def test_no_more_than_the_reserve_left_refuses_and_falls_back(
    virtual_clock: VirtualClock,
) -> None:
    calls = 0

    async def fn() -> str:
        nonlocal calls
        calls += 1
        return "fresh"

    policy = Policy("GetUser", fallback="cached", reserve="200ms")
    async with tb.fail_after(0.1):
        assert await policy.execute(fn) == "cached"
    assert calls == 0
    with pytest.raises(tb.DeadlineExceeded, match="refused"):
        async with tb.fail_after(0.1):
            await Policy("GetUser", reserve="200ms").execute(fn)


async def test_no_deadline_means_the_reserve_changes_nothing(virtual_clock: VirtualClock) -> None:
    async def fn() -> float:
        return tb.remaining()

    assert await Policy("GetUser", reserve="200ms").execute(fn) == float("inf")


def test_sync_calls_keep_the_reserve(virtual_clock: VirtualClock) -> None:
    def slow() -> str:
        virtual_clock.advance(0.85)
        tb.checkpoint()
        return "fresh"

    policy = Policy("GetUser", fallback=lambda: f"cached {tb.remaining():.2f}", reserve="200ms")
    with tb.fail_after(1):
        assert policy.execute_sync(slow) == "cached 0.15"


def test_an_invalid_policy_reserve_is_a_configuration_error() -> None:
    with pytest.raises(tb.ConfigurationError) as info:
        Policy("GetUser", reserve="-1s")
    assert info.value.option == "reserve"
    assert Policy("GetUser", reserve="50ms").reserve == pytest.approx(0.05)


async def test_the_fallback_event_says_the_reserve_fired(virtual_clock: VirtualClock) -> None:
    from timebound.telemetry import Event, add_listener

    async def slow() -> str:
        await asyncio.sleep(60)
        return "fresh"

    seen: list[Event] = []
    remove = add_listener(seen.append)
    try:
        async with tb.fail_after(1):
            await Policy("GetUser", timeout=5, fallback="cached", reserve="200ms").execute(slow)
    finally:
        remove()
    [fallback] = [e for e in seen if e.name == "fallback"]
    assert fallback.bound is not None
    assert fallback.bound.set_by == "reserve of policy GetUser"


async def test_a_policy_without_an_attempt_timeout_still_ends_at_the_reserve(
    virtual_clock: VirtualClock,
) -> None:
    """A plain policy has no attempt scope: the reserve itself must end the attempt."""

    async def slow() -> str:
        await asyncio.sleep(60)
        return "fresh"

    start = virtual_clock.now()
    async with tb.fail_after(1):
        assert await Policy("GetUser", fallback="cached", reserve="200ms").execute(slow) == "cached"
    assert virtual_clock.now() - start == pytest.approx(0.8)
