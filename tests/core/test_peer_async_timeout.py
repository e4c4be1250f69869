"""The ideas of the async-timeout project's test suite, asked of timebound's scopes."""

from __future__ import annotations

import asyncio

import pytest

import timebound as tb
from timebound.testing import VirtualClock


async def test_finishing_in_time_returns_normally(virtual_clock: VirtualClock) -> None:
    """A body that ends before the deadline returns its value and is not expired."""
    async with tb.fail_after(10) as scope:
        await asyncio.sleep(1)
        result = "ok"
    assert result == "ok" and not scope.expired


async def test_zero_budget_expires_at_once(virtual_clock: VirtualClock) -> None:
    """A zero budget raises at the first await without letting time pass."""
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(0):
            await asyncio.sleep(10)
    assert virtual_clock.now() == 0.0


async def test_irrelevant_exception_is_not_converted(virtual_clock: VirtualClock) -> None:
    """An exception unrelated to the deadline passes through even after the deadline."""
    with pytest.raises(ZeroDivisionError):
        async with tb.fail_after(0.01):
            try:
                await asyncio.sleep(10)
            finally:
                1 / 0  # noqa: B018


async def test_blocking_body_that_overran_raises_at_exit(virtual_clock: VirtualClock) -> None:
    """A body that blocked past the deadline without awaiting raises at exit: its result is late."""
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(1) as scope:
            virtual_clock.advance(2)
    assert scope.expired


async def test_cancel_racing_the_timeout_stays_a_cancel(virtual_clock: VirtualClock) -> None:
    """A cancel requested in the instant the scope fires propagates as CancelledError (#229)."""

    async def body() -> None:
        async with tb.fail_after(1):
            await asyncio.sleep(10)

    task = asyncio.get_running_loop().create_task(body())
    loop = asyncio.get_running_loop()
    loop.call_at(1.0, task.cancel)  # the same instant as the scope's own timer
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 1.0


async def test_cancelling_the_outer_coroutine_propagates(virtual_clock: VirtualClock) -> None:
    """Cancelling the task that awaits a scope inside another task ends it with CancelledError."""

    async def inner() -> None:
        async with tb.fail_after(10):
            await asyncio.sleep(100)

    async def outer() -> None:
        await inner()

    task = asyncio.get_running_loop().create_task(outer())
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_remaining_counts_down_inside_the_scope(virtual_clock: VirtualClock) -> None:
    """remaining() inside a scope is its budget minus the time already spent."""
    async with tb.fail_after(10):
        await asyncio.sleep(4)
        assert tb.remaining() == 6.0
        assert tb.current_deadline() == tb.Deadline(10.0)
