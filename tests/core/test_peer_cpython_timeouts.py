"""The ideas of CPython's ``Lib/test/test_asyncio/test_timeouts.py``, asked of timebound's scopes.

Each test restates a behaviour ``asyncio.timeout`` is tested for, on virtual time, and asserts
that ``fail_after``/``move_on_after`` behave the same (or as D1/D2 decide where they differ).
"""

from __future__ import annotations

import asyncio
import math

import pytest

import timebound as tb
from timebound.testing import VirtualClock


async def test_basic_timeout_raises_a_timeout_error(virtual_clock: VirtualClock) -> None:
    """A scope around a long sleep raises a TimeoutError at its deadline and reports expiry."""
    with pytest.raises(TimeoutError):
        async with tb.fail_after(0.01) as scope:
            await asyncio.sleep(10)
    assert scope.expired and virtual_clock.now() == 0.01


async def test_absolute_deadline_in_the_past_stops_the_first_await(
    virtual_clock: VirtualClock,
) -> None:
    """fail_at a deadline already passed raises at the first await (timeout_at in the past)."""
    past = tb.Deadline.after(0)
    await asyncio.sleep(1)
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_at(past):
            await asyncio.sleep(0)
    assert virtual_clock.now() == 1.0


async def test_disabled_timeout_never_fires(virtual_clock: VirtualClock) -> None:
    """A scope with no budget (None) lets a long sleep finish (timeout(None))."""
    async with tb.fail_after(None) as scope:
        await asyncio.sleep(100)
    assert not scope.expired and virtual_clock.now() == 100.0


async def test_nested_shorter_outer_catches_and_inner_is_not_expired(
    virtual_clock: VirtualClock,
) -> None:
    """With nested scopes the outer, earlier one fires; the inner one is not expired."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(0.01) as outer:
            async with tb.fail_after(10) as inner:
                await asyncio.sleep(100)
    assert outer.expired and not inner.expired
    assert info.value.timeout == 0.01


async def test_foreign_exception_passes_unchanged(virtual_clock: VirtualClock) -> None:
    """An error the body raises before the deadline propagates as itself."""
    with pytest.raises(KeyError):
        async with tb.fail_after(10):
            raise KeyError("boom")


async def test_foreign_exception_raised_while_unwinding_propagates(
    virtual_clock: VirtualClock,
) -> None:
    """An error raised while the scope's cancellation unwinds propagates, its context the cancel."""
    with pytest.raises(KeyError) as info:
        async with tb.fail_after(0.01):
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise KeyError("cleanup failed") from None
    assert info.value.__suppress_context__


async def test_foreign_cancel_is_not_a_timeout(virtual_clock: VirtualClock) -> None:
    """A task cancelled from outside before the deadline ends with CancelledError, not a timeout."""

    async def body() -> None:
        async with tb.fail_after(10):
            await asyncio.sleep(100)

    task = asyncio.get_running_loop().create_task(body())
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 1.0


async def test_outer_task_is_not_cancelled(virtual_clock: VirtualClock) -> None:
    """A scope that fires inside a child task leaves the awaiting parent untouched."""

    async def child() -> str:
        async with tb.move_on_after(0.01):
            await asyncio.sleep(10)
        return "done"

    assert await asyncio.get_running_loop().create_task(child()) == "done"
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0


async def test_concurrent_tasks_each_have_their_own_timeout(virtual_clock: VirtualClock) -> None:
    """Two tasks with different budgets each stop at their own deadline."""
    ended: dict[str, float] = {}

    async def run(name: str, budget: float) -> None:
        async with tb.move_on_after(budget):
            await asyncio.sleep(100)
        ended[name] = virtual_clock.now()

    await asyncio.gather(run("a", 1), run("b", 2))
    assert ended == {"a": 1.0, "b": 2.0}


async def test_busy_inner_work_is_stopped_by_the_outer_deadline(
    virtual_clock: VirtualClock,
) -> None:
    """When both deadlines pass during blocking work, the outer one fires and is reported."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(1) as outer:
            async with tb.fail_after(2) as inner:
                virtual_clock.advance(3)  # blocking work past both deadlines
                await asyncio.sleep(1)
    assert info.value.timeout == 1
    assert outer.expired and inner.expired  # both passed before their scope exited (D1.7)
    assert virtual_clock.now() == 3.0


async def test_error_is_chained_from_the_cancellation(virtual_clock: VirtualClock) -> None:
    """The DeadlineExceeded has the CancelledError as its cause and suppresses the context."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(0.01):
            await asyncio.sleep(10)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert info.value.__suppress_context__


async def test_task_group_children_are_cancelled_by_the_scope(virtual_clock: VirtualClock) -> None:
    """A scope around a TaskGroup stops its children and reports its own deadline."""
    started: list[int] = []

    async def child(i: int) -> None:
        started.append(i)
        await asyncio.sleep(math.inf)

    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(1), asyncio.TaskGroup() as group:
            for i in range(3):
                group.create_task(child(i))
    assert started == [0, 1, 2] and virtual_clock.now() == 1.0


def test_repr_says_kind_state_and_deadline(virtual_clock: VirtualClock) -> None:
    """The scope's repr names its kind, source and state."""
    scope = tb.move_on_after(1, source="attempt")
    assert repr(scope).startswith("<CancelScope move_on source=attempt new")
