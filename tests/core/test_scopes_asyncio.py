"""Deadline scopes under asyncio, on virtual time (DECISIONS D1, D2)."""

from __future__ import annotations

import asyncio
import contextvars
import math

import pytest

import timebound as tb
from timebound.testing import VirtualClock


async def never() -> None:
    await asyncio.sleep(math.inf)


async def test_fail_after_raises_exactly_at_deadline(virtual_clock: VirtualClock) -> None:
    """fail_after cancels the awaiting task at its deadline and raises DeadlineExceeded."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(2.5):
            await never()
    assert virtual_clock.now() == 2.5
    assert info.value.source == "scope"
    assert info.value.timeout == 2.5
    assert info.value.deadline == tb.Deadline(2.5)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)


async def test_move_on_after_swallows_and_sets_expired(virtual_clock: VirtualClock) -> None:
    """move_on_after stops the body quietly at the deadline and sets .expired."""
    async with tb.move_on_after(3) as scope:
        await never()
    assert scope.expired
    assert virtual_clock.now() == 3.0


async def test_happy_path_not_expired(virtual_clock: VirtualClock) -> None:
    """A body that finishes in time leaves .expired false and returns its result."""
    async with tb.fail_after(3) as scope:
        await asyncio.sleep(1)
    assert not scope.expired
    assert virtual_clock.now() == 1.0


async def test_plain_with_in_coroutine_is_the_same_scope(virtual_clock: VirtualClock) -> None:
    """A plain `with` inside a coroutine cancels awaits exactly like `async with` (D1.6)."""
    with tb.move_on_after(1) as scope:
        await never()
    assert scope.expired and virtual_clock.now() == 1.0


async def test_relative_budget_starts_at_entry(virtual_clock: VirtualClock) -> None:
    """A scope built at t=0 and entered at t=5 ends at t=15 (D1.4)."""
    scope = tb.move_on_after(10)
    await asyncio.sleep(5)
    async with scope:
        await never()
    assert virtual_clock.now() == 15.0
    assert scope.deadline == tb.Deadline(15.0)


async def test_outer_binding_reported_by_outer(virtual_clock: VirtualClock) -> None:
    """When the outer deadline is earlier, the outer scope fires and the inner is not expired."""
    outer = tb.move_on_after(1)
    inner = tb.fail_after(5)
    async with outer:
        async with inner:
            await never()
    assert outer.expired and not inner.expired
    assert virtual_clock.now() == 1.0


async def test_inner_binding_reported_by_inner(virtual_clock: VirtualClock) -> None:
    """When the inner deadline is earlier, the inner scope fires and the outer goes on."""
    async with tb.fail_after(10) as outer:
        async with tb.move_on_after(2) as inner:
            await never()
        await asyncio.sleep(1)
    assert inner.expired and not outer.expired
    assert virtual_clock.now() == 3.0


async def test_inner_fail_not_confused_with_outer_move_on(virtual_clock: VirtualClock) -> None:
    """An inner fail_after's DeadlineExceeded passes through an outer move_on_after untouched."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.move_on_after(10) as outer:
            async with tb.fail_after(2):
                await never()
    assert info.value.timeout == 2
    assert not outer.expired


async def test_current_deadline_is_min_of_enclosing(virtual_clock: VirtualClock) -> None:
    """current_deadline() and remaining() report the earliest enclosing bound (D1.5)."""
    assert tb.current_deadline() == tb.Deadline.never()
    assert tb.remaining() == math.inf
    async with tb.fail_after(5):
        async with tb.fail_after(9):
            assert tb.current_deadline() == tb.Deadline(5.0)
            async with tb.fail_after(2):
                assert tb.remaining() == 2.0
            assert tb.remaining() == 5.0
    assert tb.current_deadline().is_never


async def test_explicit_cancel_is_not_a_timeout(virtual_clock: VirtualClock) -> None:
    """An explicit cancel propagates as CancelledError, never as DeadlineExceeded (D2.2)."""

    async def victim() -> None:
        async with tb.fail_after(5):
            await never()

    task = asyncio.create_task(victim())
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 1.0


async def test_cancel_racing_the_deadline_wins(virtual_clock: VirtualClock) -> None:
    """A cancel delivered in the same loop iteration as the deadline propagates (D2.2)."""

    async def victim() -> None:
        async with tb.fail_after(1):
            await never()

    task = asyncio.create_task(victim())
    loop = asyncio.get_running_loop()
    loop.call_at(1.0, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancel_after_timer_fired_is_cancel(virtual_clock: VirtualClock) -> None:
    """A cancel arriving after the timer fired but before the scope exits is a cancel."""
    loop = asyncio.get_running_loop()
    cancelled_after_fire: list[bool] = []

    async def victim() -> None:
        async with tb.fail_after(1):
            try:
                await never()
            except asyncio.CancelledError:
                # The timer fired; now someone else cancels us while we clean up.
                task = asyncio.current_task()
                assert task is not None
                loop.call_soon(task.cancel)
                cancelled_after_fire.append(True)
                await asyncio.sleep(0.5)
                raise

    task = asyncio.create_task(victim())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled_after_fire == [True]


async def test_uncancel_bookkeeping_restored(virtual_clock: VirtualClock) -> None:
    """After a scope times out, the task's cancel count is back to its value at entry."""
    task = asyncio.current_task()
    assert task is not None
    async with tb.move_on_after(1):
        await never()
    assert task.cancelling() == 0
    async with tb.move_on_after(1):
        await never()
    assert task.cancelling() == 0


async def test_swallowed_cancel_still_raises_at_exit(virtual_clock: VirtualClock) -> None:
    """A body that swallows the cancellation and returns late still fails (D1.7, cpython#111379)."""
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(1):
            try:
                await never()
            except asyncio.CancelledError:
                pass
            await asyncio.sleep(1)
    assert virtual_clock.now() == 2.0


async def test_inherited_deadline_reported_as_inherited(virtual_clock: VirtualClock) -> None:
    """A scope under an earlier inherited deadline ends there and reports 'inherited'."""
    with tb.inherit_deadline(tb.Deadline.after(1), timeout=1.0):
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.move_on_after(10) as scope:
                await never()
    assert info.value.source == "inherited"
    assert not scope.expired
    assert virtual_clock.now() == 1.0


async def test_inherited_deadline_alone_does_not_cancel(virtual_clock: VirtualClock) -> None:
    """An inherited deadline is visible but cancels nothing by itself (D4.4's default)."""
    with tb.inherit_deadline(tb.Deadline.after(1)):
        await asyncio.sleep(2)
        assert tb.remaining() == 0.0
        with pytest.raises(tb.DeadlineExceeded) as info:
            tb.checkpoint()
    assert info.value.source == "inherited"


async def test_attempt_source_when_own_deadline_binds(virtual_clock: VirtualClock) -> None:
    """A scope built with source='attempt' reports it when its own deadline fires."""
    with tb.inherit_deadline(tb.Deadline.after(100)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(10, source="attempt", what="GetUser"):
                await never()
    assert info.value.source == "attempt"
    assert str(info.value) == "GetUser timed out after 10s (attempt deadline)"


async def test_child_task_inherits_deadline(virtual_clock: VirtualClock) -> None:
    """asyncio child tasks see the parent's effective deadline."""
    seen: list[tb.Deadline] = []

    async def child() -> None:
        seen.append(tb.current_deadline())

    async with tb.fail_after(4):
        await asyncio.create_task(child())
    assert seen == [tb.Deadline(4.0)]


async def test_child_task_scope_ends_at_parent_deadline(virtual_clock: VirtualClock) -> None:
    """A child task's own later scope still ends at the parent's earlier deadline (D1.5)."""

    async def child() -> None:
        async with tb.fail_after(10):
            await never()

    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.move_on_after(20):
            with tb.inherit_deadline(tb.Deadline.after(3)):
                await asyncio.create_task(child())
    assert info.value.source == "inherited"
    assert virtual_clock.now() == 3.0


async def test_to_thread_inherits_deadline(virtual_clock: VirtualClock) -> None:
    """asyncio.to_thread workers see the deadline and their checkpoints raise at it."""

    def work() -> float:
        return tb.remaining()

    async with tb.fail_after(7):
        assert await asyncio.to_thread(work) == 7.0


async def test_spawn_background_does_not_inherit(virtual_clock: VirtualClock) -> None:
    """spawn_background starts a task with no deadline, which outlives the scope."""
    seen: list[float] = []

    async def background() -> None:
        seen.append(tb.remaining())
        await asyncio.sleep(5)
        seen.append(virtual_clock.now())

    async with tb.move_on_after(1):
        task = tb.spawn_background(background())
        await never()
    await task
    assert seen == [math.inf, 5.0]


async def test_no_deadline_blocks_propagation(virtual_clock: VirtualClock) -> None:
    """Inside no_deadline() nothing is visible, but the enclosing scope still cancels the task."""
    async with tb.move_on_after(2) as outer:
        with tb.no_deadline():
            assert tb.current_deadline().is_never
            async with tb.fail_after(10):
                assert tb.remaining() == 10.0
                await never()
    assert outer.expired
    assert virtual_clock.now() == 2.0


async def test_shield_protects_from_outer(virtual_clock: VirtualClock) -> None:
    """A shielded scope is not cancelled by an enclosing deadline; the outer fires after it."""
    async with tb.move_on_after(1) as outer:
        async with tb.move_on_after(5, shield=True) as inner:
            await asyncio.sleep(3)
            assert tb.remaining() == 2.0
        assert virtual_clock.now() == 3.0
        await never()
    assert outer.expired and not inner.expired
    assert virtual_clock.now() == 3.0


async def test_stale_timer_rearms_and_fires_on_time(virtual_clock: VirtualClock) -> None:
    """The shared per-task timer, armed for an earlier scope, re-arms for a later one exactly."""
    async with tb.fail_after(10):
        pass
    async with tb.fail_after(5):  # arms the timer at 5
        await asyncio.sleep(1)
    async with tb.move_on_after(20) as scope:  # timer still armed at 5: must re-arm to 21
        await never()
    assert scope.expired
    assert virtual_clock.now() == 21.0


async def test_many_sequential_scopes_fire_correctly(virtual_clock: VirtualClock) -> None:
    """After thousands of happy scopes, the next expiring one still fires exactly on time."""
    for _ in range(2000):
        async with tb.fail_after(1):
            await asyncio.sleep(0)
    start = virtual_clock.now()
    async with tb.move_on_after(0.5) as scope:
        await never()
    assert scope.expired and virtual_clock.now() == start + 0.5


async def test_taskgroup_children_cancelled_at_deadline(virtual_clock: VirtualClock) -> None:
    """A scope around a TaskGroup cancels the group and reports the deadline."""
    done: list[str] = []

    async def worker(name: str, delay: float) -> None:
        await asyncio.sleep(delay)
        done.append(name)

    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(2):
            async with asyncio.TaskGroup() as tg:
                tg.create_task(worker("fast", 1))
                tg.create_task(worker("slow", 5))
    assert done == ["fast"]
    assert virtual_clock.now() == 2.0
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_already_expired_scope_fires_at_first_await(virtual_clock: VirtualClock) -> None:
    """A zero budget cancels at the first await and never later."""
    async with tb.move_on_after(0) as scope:
        await asyncio.sleep(1)
    assert scope.expired and virtual_clock.now() == 0.0


async def test_scope_entered_twice_is_an_error(virtual_clock: VirtualClock) -> None:
    """A scope object is single-use, like trio's."""
    scope = tb.fail_after(1)
    async with scope:
        pass
    with pytest.raises(RuntimeError, match="only once"):
        async with scope:
            pass


def test_fail_at_rejects_non_deadline() -> None:
    """fail_at/move_on_at take a Deadline, and say what to use instead."""
    with pytest.raises(tb.ConfigurationError, match="use fail_after"):
        tb.fail_at(5)  # type: ignore[arg-type]
    with pytest.raises(tb.ConfigurationError, match="use move_on_after"):
        tb.move_on_at(5)  # type: ignore[arg-type]


def test_nan_budget_rejected() -> None:
    """A NaN budget is a ConfigurationError naming the parameter."""
    with pytest.raises(tb.ConfigurationError) as info:
        tb.fail_after(math.nan)
    assert info.value.option == "seconds"


async def test_fail_at_absolute(virtual_clock: VirtualClock) -> None:
    """fail_at ends at the absolute instant given."""
    d = tb.Deadline.after(4)
    await asyncio.sleep(1)
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_at(d):
            await never()
    assert virtual_clock.now() == 4.0


async def test_checkpoint_inside_scope_is_caught_by_move_on(virtual_clock: VirtualClock) -> None:
    """acheckpoint() past the scope's own deadline is absorbed by that move_on scope."""
    async with tb.move_on_after(1) as scope:
        virtual_clock.advance(2)  # time passes without yielding (CPU-bound work)
        await tb.acheckpoint()
        pytest.fail("acheckpoint should have raised")
    assert scope.expired


async def test_context_copy_sees_frozen_deadline(virtual_clock: VirtualClock) -> None:
    """A context copied inside a scope keeps that scope's deadline visible (no lengthening)."""
    async with tb.fail_after(3):
        ctx = contextvars.copy_context()
    assert ctx.run(tb.remaining) == 3.0
    assert tb.remaining() == math.inf


async def test_nested_later_scope_overruns_after_swallowing(virtual_clock: VirtualClock) -> None:
    """A nested later fail_after whose body swallows the outer cancel and overruns raises its own
    error at exit; the outer scope lets it through and the task's cancel count is restored."""
    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.move_on_after(1) as outer:
            async with tb.fail_after(2) as inner:
                try:
                    await never()
                except asyncio.CancelledError:
                    pass
                await asyncio.sleep(5)
    assert info.value.timeout == 2
    assert inner.expired and outer.expired
    assert virtual_clock.now() == 6.0
    assert task.cancelling() == 0


async def test_nested_equal_deadline_scope_reports_outer(virtual_clock: VirtualClock) -> None:
    """Two scopes with the same deadline: the outer one catches, the inner still reads expired."""
    async with tb.move_on_after(3) as outer:
        async with tb.fail_after(3) as inner:
            await never()
    assert outer.expired and inner.expired
    assert virtual_clock.now() == 3.0


async def test_swallowed_cancel_under_inherited_reports_inherited(
    virtual_clock: VirtualClock,
) -> None:
    """A body that swallows the cancel of an inherited deadline and returns late still reports
    the inherited bound, not success and not this scope's own timeout."""
    with tb.inherit_deadline(tb.Deadline.after(1)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.move_on_after(10) as scope:
                try:
                    await never()
                except asyncio.CancelledError:
                    pass
    assert info.value.source == "inherited"
    assert not scope.expired
    assert virtual_clock.now() == 1.0
