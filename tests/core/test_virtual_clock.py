"""VirtualClock: manual moves, installation, autojump with a threshold (asyncio and trio)."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
import trio

import timebound as tb
from timebound._core import _clock
from timebound.testing import VirtualClock, virtual_time


def test_advance_accepts_a_duration_string() -> None:
    """``advance("250ms")`` moves time by exactly 0.25 s."""
    clock = VirtualClock(10.0)
    clock.advance("250ms")
    assert clock.now() == 10.25


def test_advance_rejects_negative() -> None:
    """Time never goes backwards: a negative advance is a ConfigurationError."""
    clock = VirtualClock()
    with pytest.raises(tb.ConfigurationError):
        clock.advance(-1)
    assert clock.now() == 0.0


def test_jump_to_the_past_is_a_no_op() -> None:
    """``jump_to`` an earlier instant leaves time and the jump count unchanged."""
    clock = VirtualClock(5.0)
    clock.jump_to(3.0)
    assert clock.now() == 5.0
    assert clock.jumps == 0
    clock.jump_to(7.5)
    assert clock.now() == 7.5
    assert clock.jumps == 1


def test_sleep_zero_or_negative_does_not_move() -> None:
    """A sleep of zero or less returns at once without moving time."""
    clock = VirtualClock(1.0)
    clock.sleep(0)
    clock.sleep(-3)
    assert clock.now() == 1.0


def test_negative_threshold_rejected() -> None:
    """A negative autojump threshold is refused."""
    with pytest.raises(ValueError, match="autojump_threshold"):
        VirtualClock(autojump_threshold=-0.1)


def test_install_twice_refused_and_uninstall_restores() -> None:
    """Installing twice raises; uninstalling restores the real clock and is idempotent."""
    real_now = _clock.now
    clock = VirtualClock(42.0)
    clock.install()
    try:
        assert _clock.now() == 42.0
        with pytest.raises(RuntimeError, match="already installed"):
            clock.install()
    finally:
        clock.uninstall()
    assert _clock.now is real_now
    clock.uninstall()
    assert _clock.now is real_now


def test_virtual_time_context_manager() -> None:
    """``virtual_time()`` installs a fresh clock for the block; checkpoints use it."""
    with virtual_time(100.0) as clock, tb.move_on_after(1) as scope:
        assert tb.remaining() == 1.0
        clock.advance(1)
        with pytest.raises(tb.DeadlineExceeded):
            tb.checkpoint()
    assert scope.expired
    assert _clock.now is time.monotonic


def test_next_timer_ignores_cancelled_handles() -> None:
    """The loop's next timer skips cancelled handles, and is None when all are cancelled."""
    clock = VirtualClock()
    loop = clock.new_event_loop()
    try:
        early = loop.call_at(1.0, lambda: None)
        loop.call_at(4.0, lambda: None)
        early.cancel()
        assert loop._next_timer() == 4.0
        for handle in loop._scheduled:  # type: ignore[attr-defined]
            handle.cancel()
        assert loop._next_timer() is None
    finally:
        loop.close()


def test_trio_clock_due_and_unbounded_deadlines() -> None:
    """The trio clock asks for no sleep when a deadline is due and infinite sleep without one."""
    trio_clock = VirtualClock(3.0).trio_clock()
    assert trio_clock.deadline_to_sleep_time(2.0) == 0.0
    assert trio_clock.deadline_to_sleep_time(math.inf) == math.inf


@pytest.mark.realtime
def test_asyncio_threshold_lets_a_real_thread_finish_first() -> None:
    """With a threshold, a real thread that finishes in time beats a virtual 30 s deadline."""
    clock = VirtualClock(autojump_threshold=0.5)

    async def main() -> str:
        async with tb.fail_after(30):
            await asyncio.to_thread(time.sleep, 0.01)
        return "finished"

    assert clock.run(main()) == "finished"
    assert clock.now() == 0.0


@pytest.mark.realtime
def test_asyncio_threshold_still_jumps_when_idle() -> None:
    """With a threshold, time still jumps to the next timer once the loop stays idle."""
    clock = VirtualClock(autojump_threshold=0.01)

    async def main() -> None:
        await asyncio.sleep(30)

    clock.run(main())
    assert clock.now() == 30.0


@pytest.mark.realtime
@pytest.mark.timeout(30, method="thread")
def test_trio_threshold_jumps_when_idle() -> None:
    """Under trio with a threshold > 0, time jumps to the next deadline once idle that long."""
    clock = VirtualClock(autojump_threshold=0.01)
    finished: list[float] = []

    def run() -> None:
        trio.run(trio.sleep, 30, clock=clock.trio_clock())
        finished.append(clock.now())

    # trio.run blocks; watch it from here so a hang fails the test instead of the suite.
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(5)
    assert finished == [30.0]


@pytest.mark.realtime
@pytest.mark.timeout(30, method="thread")
def test_trio_threshold_lets_a_real_thread_finish_first() -> None:
    """Under trio with a threshold, a real thread that finishes in time beats a virtual deadline."""
    clock = VirtualClock(autojump_threshold=0.5)

    async def main() -> str:
        with trio.fail_after(30):
            await trio.to_thread.run_sync(time.sleep, 0.01)
        return "finished"

    assert trio.run(main, clock=clock.trio_clock()) == "finished"
    assert clock.now() == 0.0
