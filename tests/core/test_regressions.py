"""Upstream timeout bugs replayed against timebound's scopes (virtual time, exact instants)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import timebound as tb
from timebound.testing import VirtualClock
from timebound.testing._virtual import VirtualEventLoop


class _HookTask(asyncio.Task[Any]):
    """A task that runs ``after_first_cancel`` right after its first ``cancel()`` call."""

    after_first_cancel: Callable[[], None] | None = None

    def cancel(self, msg: Any = None) -> bool:
        result = super().cancel(msg)
        hook, self.after_first_cancel = self.after_first_cancel, None
        if hook is not None:
            hook()
        return result


async def _sleep_in_scope(seconds: float, body: float = 10) -> None:
    async with tb.fail_after(seconds):
        await asyncio.sleep(body)


async def test_cancel_with_deadline_propagates_cpython_86296(virtual_clock: VirtualClock) -> None:
    """cpython#86296: an explicit cancel at the deadline's instant propagates as CancelledError."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(_sleep_in_scope(1))
    loop.call_at(1.0, task.cancel)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 1.0


async def test_explicit_cancel_after_timer_fired_async_timeout_229(
    virtual_clock: VirtualClock,
) -> None:
    """async-timeout#229: a cancel right after the timer fired is CancelledError, not a timeout."""
    loop = asyncio.get_running_loop()
    task = _HookTask(_sleep_in_scope(1), loop=loop)
    # The scope's own cancel comes first; the explicit one arrives before the task runs again.
    task.after_first_cancel = task.cancel
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 1.0


async def test_uncancel_bookkeeping_cpython_102780(virtual_clock: VirtualClock) -> None:
    """cpython#102780: after a timeout, cancelling() is back at its entry value; scopes work."""
    task = asyncio.current_task()
    assert task is not None
    before = task.cancelling()
    with pytest.raises(tb.DeadlineExceeded):
        await _sleep_in_scope(1)
    assert task.cancelling() == before
    # A TaskGroup and nested scopes still behave: the inner deadline fires, then the outer one.
    async with asyncio.TaskGroup() as group:
        child = group.create_task(asyncio.sleep(2, result="done"))
    assert child.result() == "done"
    assert virtual_clock.now() == 3.0
    with pytest.raises(tb.DeadlineExceeded) as outer:
        async with tb.fail_after(5, source="total"):
            with pytest.raises(tb.DeadlineExceeded) as inner:
                async with tb.fail_after(1, source="attempt"):
                    await asyncio.sleep(10)
            assert inner.value.source == "attempt"
            assert virtual_clock.now() == 4.0
            await asyncio.sleep(10)
    assert outer.value.source == "total"
    assert virtual_clock.now() == 8.0
    assert task.cancelling() == before


async def test_swallowed_cancel_still_raises_cpython_111379(virtual_clock: VirtualClock) -> None:
    """cpython#111379: a callee swallowing CancelledError cannot hide the deadline (D1.7)."""

    async def stubborn() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await asyncio.sleep(0.5)  # swallowed: keeps working past the deadline
        return "late result"

    task = asyncio.current_task()
    assert task is not None
    with pytest.raises(tb.DeadlineExceeded):
        async with tb.fail_after(1):
            await stubborn()
    assert virtual_clock.now() == 1.5
    assert task.cancelling() == 0


async def test_swallowed_cancel_sets_expired_on_move_on(virtual_clock: VirtualClock) -> None:
    """cpython#111379: a move_on scope whose body swallowed the cancel reports ``expired``."""

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass

    async with tb.move_on_after(1) as scope:
        await stubborn()
    assert scope.expired
    assert virtual_clock.now() == 1.0


@pytest.mark.parametrize("factory", [tb.fail_after, tb.move_on_after])
async def test_pending_cancel_not_swallowed_by_zero_scope_cpython_134471(
    virtual_clock: VirtualClock, factory: Callable[[float], tb.CancelScope]
) -> None:
    """cpython#134471: a cancel requested before entering an expired scope is not swallowed."""

    async def body() -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        async with factory(0):
            await asyncio.sleep(1)

    task = asyncio.get_running_loop().create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 0.0


async def test_pending_cancel_at_entry_wins_over_firing_scope_cpython_134471(
    virtual_clock: VirtualClock,
) -> None:
    """cpython#134471: with a cancel pending at entry, the scope never claims the cancellation."""

    async def body() -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        async with tb.fail_after(0):  # fires at the first await too: both land as one cancel
            await asyncio.sleep(1)

    task = asyncio.get_running_loop().create_task(body())
    with pytest.raises(asyncio.CancelledError):
        await task
    assert virtual_clock.now() == 0.0


async def test_cancellation_never_retried_tenacity_529(virtual_clock: VirtualClock) -> None:
    """tenacity#529: a policy never retries CancelledError and never falls back on it."""
    resilient = _resilient()
    calls: list[float] = []

    @resilient(retry=3, fallback="fallback")
    async def fetch() -> str:
        calls.append(virtual_clock.now())
        await asyncio.sleep(10)
        return "value"

    task = asyncio.get_running_loop().create_task(fetch())
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == [0.0]


def _resilient() -> Any:
    resilient = getattr(tb, "resilient", None)
    if resilient is None:
        from timebound.policies import resilient
    return resilient


class _EarlyLoop(VirtualEventLoop):
    """A loop whose long timers fire 1 ms early, like uvloop's ms rounding (uvloop PR#755)."""

    early: int = 0

    def call_at(self, when: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        if when - self.time() > 0.002:
            self.early += 1
            when -= 0.001
        return super().call_at(when, callback, *args, **kw)


def test_early_timer_never_expires_early_cpython_127859(virtual_clock: VirtualClock) -> None:
    """cpython#127859: a timer that wakes early re-arms; expiry is exactly at the deadline."""
    observed: list[float] = []

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded):
            async with tb.fail_after(1):
                await asyncio.sleep(10)
        observed.append(virtual_clock.now())

    loops: list[_EarlyLoop] = []

    def factory() -> _EarlyLoop:
        loops.append(_EarlyLoop(virtual_clock))
        return loops[0]

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
    assert loops[0].early >= 1
    assert observed == [1.0]
