"""Scope semantics the peers' tests pin (asyncio, trio, CPython), each on asyncio and on trio.

D1.8: a scope entered after an enclosing bound has passed is bounded by it (its first await is
interrupted) unless shielded, and then its own deadline bounds it. D1.9: negative relative
timeouts are already expired. Cancel counts are judged relative to entry (cpython#134471 only for
a cancel still pending). A deadline already passed at entry interrupts the first await
(cpython#95051). inherit_deadline() inside a scope ends it on every backend.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

import timebound as tb
from timebound.testing import VirtualClock

trio = pytest.importorskip("trio")

Sleep = Callable[[float], Awaitable[None]]


def _run_trio(clock: VirtualClock, fn: Callable[[], Awaitable[None]]) -> None:
    trio.run(fn, clock=clock.trio_clock())


def _now(backend: str, clock: VirtualClock) -> float:
    return float(trio.current_time()) if backend == "trio" else clock.now()


@pytest.fixture(params=["asyncio", "trio"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _go(backend: str, clock: VirtualClock, body: Callable[[Sleep], Awaitable[None]]) -> None:
    """Run ``body(sleep)`` on the backend, on virtual time."""
    if backend == "trio":
        _run_trio(clock, lambda: body(trio.sleep))
    else:
        clock.run(body(asyncio.sleep))


def _cancelled(backend: str) -> tuple[type[BaseException], ...]:
    return (trio.Cancelled,) if backend == "trio" else (asyncio.CancelledError,)


# D1.8: a scope entered after an enclosing bound fired ---------------------------------------


def test_cleanup_scope_in_finally_is_interrupted_by_the_spent_bound(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """A fail_after in the finally of a fired scope stops at its first await, not at its own end."""
    reached: list[str] = []

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(0.01):
                try:
                    await sleep(math.inf)
                finally:
                    async with tb.fail_after(0.05):
                        await sleep(0.5)
                        reached.append("cleanup ran on")
        assert _now(backend, virtual_clock) == 0.01
        assert (info.value.source, info.value.timeout) == ("scope", 0.01)

    _go(backend, virtual_clock, body)
    assert reached == []


def test_cleanup_scope_in_except_cancelled_is_interrupted_by_the_spent_bound(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """A fail_after in an except-cancelled block of a fired scope stops at its first await."""
    cancelled = _cancelled(backend)

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(0.01):
                try:
                    await sleep(math.inf)
                except cancelled:
                    async with tb.fail_after(0.05):
                        await sleep(0.5)
                    raise
        assert _now(backend, virtual_clock) == 0.01
        assert info.value.timeout == 0.01

    _go(backend, virtual_clock, body)


def test_move_on_cleanup_inside_a_fired_move_on_is_interrupted(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """With move_on_after on both levels, the cleanup stops at once and the outer one swallows."""

    async def body(sleep: Sleep) -> None:
        async with tb.move_on_after(0.01) as outer:
            try:
                await sleep(math.inf)
            finally:
                async with tb.move_on_after(0.05) as inner:
                    await sleep(0.5)
        assert _now(backend, virtual_clock) == 0.01
        assert outer.expired and not inner.expired

    _go(backend, virtual_clock, body)


def test_shielded_cleanup_scope_runs_under_its_own_deadline(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """A shielded fail_after in a fired scope's finally runs until its own deadline, then raises."""

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(0.01):
                try:
                    await sleep(math.inf)
                finally:
                    async with tb.fail_after(0.05, shield=True):
                        await sleep(0.5)
        assert _now(backend, virtual_clock) == pytest.approx(0.06)
        assert info.value.timeout == 0.05

    _go(backend, virtual_clock, body)


def test_shielded_move_on_cleanup_swallows_its_own_expiry(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """A shielded move_on_after in a fired scope's cleanup swallows its own expiry only."""

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(0.01):
                try:
                    await sleep(math.inf)
                finally:
                    async with tb.move_on_after(0.05, shield=True) as cleanup:
                        await sleep(0.5)
                    assert cleanup.expired
        assert _now(backend, virtual_clock) == pytest.approx(0.06)
        assert info.value.timeout == 0.01

    _go(backend, virtual_clock, body)


def test_scope_entered_under_a_spent_inherited_deadline_is_interrupted(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """A fail_after entered after the inherited deadline passed stops at its first await."""

    async def body(sleep: Sleep) -> None:
        with tb.inherit_deadline(tb.Deadline.after(1)):
            await sleep(2)  # the inherited bound cancels nothing by itself
            with pytest.raises(tb.DeadlineExceeded) as info:
                async with tb.fail_after(10):
                    await sleep(0)
        assert _now(backend, virtual_clock) == 2.0
        assert info.value.source == "inherited"

    _go(backend, virtual_clock, body)


# A deadline already passed at entry (cpython#95051) -------------------------------------------


def test_zero_timeout_interrupts_the_first_await(virtual_clock: VirtualClock, backend: str) -> None:
    """fail_after(0) stops even a zero-length sleep; the body does not run on."""
    reached: list[str] = []

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(0):
                await sleep(0)
                reached.append("ran on")
        assert isinstance(info.value.__cause__, _cancelled(backend))

    _go(backend, virtual_clock, body)
    assert reached == []


def test_past_absolute_deadline_interrupts_the_first_await(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """move_on_at a deadline already passed stops the body at its first await."""
    reached: list[str] = []

    async def body(sleep: Sleep) -> None:
        past = tb.Deadline.after(1)
        await sleep(2)
        async with tb.move_on_at(past) as scope:
            await sleep(0)
            reached.append("ran on")
        assert scope.expired

    _go(backend, virtual_clock, body)
    assert reached == []


# D1.9: negative relative timeouts -----------------------------------------------------------


@pytest.mark.parametrize("budget", [-1, -0.5, timedelta(seconds=-3)])
def test_negative_timeout_is_already_expired(
    virtual_clock: VirtualClock, backend: str, budget: Any
) -> None:
    """A negative relative timeout is already over: the first await is interrupted (D1.9)."""

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(budget):
                await sleep(1)
        assert _now(backend, virtual_clock) == 0.0
        assert info.value.timeout == 0.0
        async with tb.move_on_after(budget) as scope:
            await sleep(1)
        assert scope.expired

    _go(backend, virtual_clock, body)


def test_negative_deadline_after_is_already_expired(virtual_clock: VirtualClock) -> None:
    """Deadline.after() of a negative duration is the present instant, already expired (D1.9)."""
    virtual_clock.advance(5)
    d = tb.Deadline.after(-2)
    assert d.when == 5.0 and d.expired


# inherit_deadline inside a scope: one behaviour on every backend -----------------------------


def test_inherited_deadline_inside_fail_after_ends_it(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """An inherited deadline earlier than the enclosing fail_after ends it and is reported."""

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(10):
                with tb.inherit_deadline(tb.Deadline.after(2)):
                    await sleep(5)
        assert _now(backend, virtual_clock) == 2.0
        assert info.value.source == "inherited"

    _go(backend, virtual_clock, body)


def test_inherited_deadline_inside_move_on_after_is_not_swallowed(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """move_on_after does not swallow an inherited bound that fired inside it: it is not its own."""

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.move_on_after(10) as scope:
                with tb.inherit_deadline(tb.Deadline.after(2)):
                    await sleep(5)
        assert not scope.expired
        assert info.value.source == "inherited"

    _go(backend, virtual_clock, body)


def test_later_inherited_deadline_inside_fail_after_changes_nothing(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """An inherited deadline later than the scope's own leaves the scope to fire as itself."""

    async def body(sleep: Sleep) -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(1):
                with tb.inherit_deadline(tb.Deadline.after(2)):
                    await sleep(5)
        assert _now(backend, virtual_clock) == 1.0
        assert info.value.source == "scope"

    _go(backend, virtual_clock, body)


def test_inherited_deadline_outside_any_scope_cancels_nothing(
    virtual_clock: VirtualClock, backend: str
) -> None:
    """Without an enclosing scope an inherited deadline is only visible; the sleep completes."""

    async def body(sleep: Sleep) -> None:
        with tb.inherit_deadline(tb.Deadline.after(1)):
            await sleep(3)
            assert tb.current_deadline().expired
        assert _now(backend, virtual_clock) == 3.0

    _go(backend, virtual_clock, body)


# Validation at construction ----------------------------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: tb.fail_after(1, source="regoin"),
        lambda: tb.move_on_after(1, source="regoin"),
        lambda: tb.fail_at(tb.Deadline.never(), source="regoin"),
        lambda: tb.move_on_at(tb.Deadline.never(), source="regoin"),
        lambda: tb.inherit_deadline(tb.Deadline.never(), source="regoin"),
        lambda: tb.CancelScope(relative=1, raise_on_expiry=True, source="regoin"),
    ],
)
def test_unknown_source_is_a_configuration_error_when_built(build: Callable[[], object]) -> None:
    """A misspelt source= fails where the scope is built, naming the option and the choices."""
    with pytest.raises(tb.ConfigurationError, match=r"'regoin'.*region") as info:
        build()
    assert info.value.option == "source"


@pytest.mark.parametrize("build", [tb.fail_after, tb.move_on_after, tb.Deadline.after])
def test_timeout_too_large_is_a_configuration_error(build: Callable[[Any], object]) -> None:
    """fail_after(10**400) is a ConfigurationError naming the option, not an OverflowError."""
    with pytest.raises(tb.ConfigurationError, match="too large") as info:
        build(10**400)
    assert info.value.option == "seconds"


@pytest.mark.parametrize("build", [tb.fail_after, tb.move_on_after])
def test_nan_timeout_is_a_configuration_error_when_built(build: Callable[[Any], object]) -> None:
    """A NaN budget fails when the scope is built, not when it is entered."""
    with pytest.raises(tb.ConfigurationError, match="NaN"):
        build(math.nan)


def test_infinite_timeout_is_no_bound(virtual_clock: VirtualClock) -> None:
    """math.inf is a valid budget meaning no bound at all."""
    with tb.fail_after(math.inf) as scope:
        assert tb.current_deadline().is_never
    assert not scope.expired


# Cancel counts relative to entry (asyncio) -------------------------------------------------


async def test_leftover_cancel_count_does_not_turn_a_timeout_into_a_cancel(
    virtual_clock: VirtualClock,
) -> None:
    """After a cancel was delivered and handled, the scope's own expiry is DeadlineExceeded."""
    task = asyncio.current_task()
    assert task is not None
    task.cancel()
    try:
        await asyncio.sleep(0)
    except asyncio.CancelledError:
        pass  # handled without uncancel(): cancelling() stays 1
    assert task.cancelling() == 1
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(0.01):
            await asyncio.sleep(1)
    assert virtual_clock.now() == 0.01
    assert task.cancelling() == 1
    task.uncancel()


async def test_cancel_requested_before_entry_still_wins(virtual_clock: VirtualClock) -> None:
    """A cancel requested and not yet delivered at entry propagates as a cancel (cpython#134471)."""

    async def body() -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        async with tb.move_on_after(0.01):
            await asyncio.sleep(1)

    task = asyncio.get_running_loop().create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task


def test_none_budget_is_no_bound_of_its_own(virtual_clock: VirtualClock) -> None:
    """fail_after(None) adds no bound (as asyncio.timeout(None)) and still sees enclosing ones."""
    with tb.fail_after(None) as scope:
        assert tb.current_deadline().is_never
        with tb.inherit_deadline(tb.Deadline.after(3)), tb.move_on_after(None):
            assert tb.remaining() == 3.0
    assert scope.deadline.is_never and not scope.expired


def test_deadline_before_entry_counts_from_the_moment_it_is_read(
    virtual_clock: VirtualClock,
) -> None:
    """Before entry a relative scope's .deadline is 'budget from now'; entry fixes it (D1.4)."""
    scope = tb.fail_after(5)
    assert scope.deadline == tb.Deadline(5.0)
    virtual_clock.advance(2)
    assert scope.deadline == tb.Deadline(7.0)
    with scope:
        virtual_clock.advance(1)
        assert scope.deadline == tb.Deadline(7.0)
