"""Edge cases of scopes: bounds and shields sharing a task timer, no task, direct construction."""

from __future__ import annotations

import asyncio

import pytest

import timebound as tb
from timebound.testing import VirtualClock


async def test_earlier_bound_inside_scope_ends_the_scope_at_the_bound(
    virtual_clock: VirtualClock,
) -> None:
    """An earlier inherited deadline inside a scope is the effective deadline there (D1.5): the
    scope ends at it and reports the inherited bound, not its own later deadline."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(5) as scope:
            with tb.inherit_deadline(tb.Deadline.after(1)):
                await asyncio.sleep(10)
    assert virtual_clock.now() == 1.0
    assert info.value.source == "inherited"
    assert not scope.expired


async def test_later_bound_inside_scope_changes_nothing(virtual_clock: VirtualClock) -> None:
    """A later inherited deadline inside a scope neither lengthens nor moves its cancellation."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(5):
            with tb.inherit_deadline(tb.Deadline.after(9)):
                await asyncio.sleep(10)
    assert virtual_clock.now() == 5.0
    assert info.value.source == "scope"


async def test_bound_exit_after_shield_rearms_the_enclosing_scope(
    virtual_clock: VirtualClock,
) -> None:
    """A deadline that passed inside a shield (under a bound) fires at the first await after it."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        async with tb.fail_after(5):
            with tb.inherit_deadline(tb.Deadline.after(100)):
                async with tb.move_on_after(10, shield=True) as shielded:
                    await asyncio.sleep(7)
                assert not shielded.expired
            await asyncio.sleep(10)
    assert info.value.source == "scope"
    assert virtual_clock.now() == 7.0


async def test_no_deadline_inside_scope_keeps_the_scope_cancelling(
    virtual_clock: VirtualClock,
) -> None:
    """``no_deadline()`` hides the deadline from readers but the enclosing scope still cancels."""
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(3):
            with tb.no_deadline():
                assert tb.current_deadline() == tb.Deadline.never()
                await asyncio.sleep(10)
    assert virtual_clock.now() == 3.0


async def test_scope_in_loop_callback_outside_a_task_is_cooperative(
    virtual_clock: VirtualClock,
) -> None:
    """Entered in a plain loop callback (no task), a scope cannot cancel: it raises at exit."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[BaseException | None] = loop.create_future()

    def callback() -> None:
        try:
            with tb.fail_after(1):
                assert tb.current_deadline().when == virtual_clock.now() + 1
                virtual_clock.advance(2)
        except BaseException as exc:
            outcome.set_result(exc)
        else:
            outcome.set_result(None)

    loop.call_soon(callback)
    error = await outcome
    assert isinstance(error, tb.DeadlineExceeded)
    assert error.source == "scope"


async def test_move_on_in_loop_callback_sets_expired(virtual_clock: VirtualClock) -> None:
    """A ``move_on_after`` that overran in a loop callback only sets ``.expired``."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tb.CancelScope] = loop.create_future()

    def callback() -> None:
        with tb.move_on_after(1) as scope:
            virtual_clock.advance(1)
        done.set_result(scope)

    loop.call_soon(callback)
    assert (await done).expired


def test_cancel_scope_built_directly_relative(virtual_clock: VirtualClock) -> None:
    """A directly built relative CancelScope fixes its deadline at entry (D1.4) and raises."""
    scope = tb.CancelScope(relative=5, raise_on_expiry=True, source="attempt", what="job")
    assert scope.deadline == tb.Deadline(5.0)
    virtual_clock.advance(1)
    assert scope.deadline == tb.Deadline(6.0)
    assert "new" in repr(scope)
    with pytest.raises(tb.DeadlineExceeded) as info, scope:
        assert "entered" in repr(scope)
        virtual_clock.advance(10)
    assert scope.deadline == tb.Deadline(6.0)
    assert scope.expired
    assert info.value.source == "attempt"
    assert "expired" in repr(scope)


def test_cancel_scope_built_directly_absolute_move_on(virtual_clock: VirtualClock) -> None:
    """A directly built absolute, non-raising CancelScope only sets ``.expired``."""
    scope = tb.CancelScope(when=2.0, raise_on_expiry=False, shield=True)
    assert scope.shield
    assert scope.source == "scope"
    assert scope.deadline == tb.Deadline(2.0)
    with scope:
        virtual_clock.advance(3)
    assert scope.expired
    assert "move_on" in repr(scope)


def test_cancel_scope_built_directly_without_deadline() -> None:
    """A CancelScope with neither ``when`` nor ``relative`` never expires."""
    scope = tb.CancelScope(raise_on_expiry=True)
    assert scope.deadline == tb.Deadline.never()
    with scope:
        assert tb.current_deadline() == tb.Deadline.never()
    assert not scope.expired


async def test_inherit_deadline_as_async_with(virtual_clock: VirtualClock) -> None:
    """``async with inherit_deadline(...)`` yields the effective deadline, like ``with``."""
    async with tb.inherit_deadline(tb.Deadline.after(4), source="inherited") as deadline:
        assert deadline == tb.Deadline(4.0)
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(10, source="attempt"):
                await asyncio.sleep(20)
    assert info.value.source == "inherited"
    assert virtual_clock.now() == 4.0
