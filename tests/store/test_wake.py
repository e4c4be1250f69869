"""The store's wake loop and detached tasks, shared by the workflow engine and the deferred
poller (D12.1, D12.2), on virtual time."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from timebound._core import _clock
from timebound._store import Detached, Wake, run_rounds, sleep_until_set
from timebound.testing import VirtualClock


async def test_a_stored_instant_is_reached_when_the_loop_wakes(
    virtual_clock: VirtualClock,
) -> None:
    """Sleeping until an epoch-ms instant wakes at it or after it, never a millisecond early,
    whatever the fraction of a millisecond the clock starts at."""
    wake = Wake()
    for start_fraction in (0.0, 0.0004, 0.0009999):
        virtual_clock.advance(1 + start_fraction)
        due = _clock.wall_ms() + 250
        await wake.sleep(until_ms=due)
        assert _clock.wall_ms() >= due
        assert _clock.wall_ms() <= due + 1


async def test_at_most_and_until_take_the_earlier(virtual_clock: VirtualClock) -> None:
    wake = Wake()
    start = _clock.now()
    await wake.sleep(0.1, until_ms=_clock.wall_ms() + 5_000)
    assert _clock.now() - start == pytest.approx(0.1)
    start = _clock.now()
    await wake.sleep(5.0, until_ms=_clock.wall_ms() + 200)
    assert 0.2 <= _clock.now() - start <= 0.202


async def test_a_wake_up_ends_the_sleep_at_once(virtual_clock: VirtualClock) -> None:
    wake = Wake()
    start = _clock.now()
    asyncio.get_running_loop().call_later(0.3, wake.set)
    await wake.sleep()  # until woken
    assert _clock.now() - start == pytest.approx(0.3)


async def test_news_due_later_than_the_sleep_does_not_wake(virtual_clock: VirtualClock) -> None:
    """News of work due after the instant the loop sleeps until is found by its next round:
    it does not cost a round now; news due earlier (or now) wakes it."""
    wake = Wake()
    sleeper = asyncio.ensure_future(wake.sleep(until_ms=_clock.wall_ms() + 1_000))
    await asyncio.sleep(0)
    wake.news_at(_clock.wall_ms() + 5_000)
    assert not wake.is_set()
    wake.news_at(_clock.wall_ms() + 500)
    assert wake.is_set()
    await sleeper
    wake.clear()
    wake.news_at(_clock.wall_ms() + 5_000)  # awake (in a round): it must look again
    assert wake.is_set()


async def test_a_cancel_racing_a_wake_up_is_not_swallowed(virtual_clock: VirtualClock) -> None:
    """A stop that cancels the loop in the turn its wake-up is set still stops it (the reason
    the loop never uses asyncio.wait_for)."""
    wake = Wake()
    sleeper = asyncio.ensure_future(wake.sleep(10.0))
    await asyncio.sleep(0)
    wake.set()
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    event = asyncio.Event()
    waiter = asyncio.ensure_future(sleep_until_set(event, 10.0))
    await asyncio.sleep(0)
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_news_during_a_round_is_not_lost(virtual_clock: VirtualClock) -> None:
    """The wake is cleared before a round, never after it: news set while the round runs makes
    the next round start at once, though the round asked to sleep until woken."""
    wake = Wake()
    rounds: list[float] = []

    async def round() -> float | None:
        rounds.append(_clock.now())
        if len(rounds) == 1:
            wake.set()  # e.g. a poll that ended during the round's last query
        if len(rounds) == 2:
            return 0.5
        return None

    loop = asyncio.ensure_future(run_rounds(wake, round))
    await asyncio.sleep(2)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert len(rounds) == 3
    assert rounds[1] - rounds[0] == pytest.approx(0.0)
    assert rounds[2] - rounds[1] == pytest.approx(0.5)


async def test_rounds_are_at_least_the_gap_apart(virtual_clock: VirtualClock) -> None:
    wake = Wake()
    rounds: list[float] = []

    async def round() -> float | None:
        rounds.append(_clock.now())
        return 0.0 if len(rounds) < 4 else None

    loop = asyncio.ensure_future(run_rounds(wake, round, min_gap=0.005))
    await asyncio.sleep(1)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    gaps = [b - a for a, b in itertools.pairwise(rounds)]
    assert len(gaps) == 3
    assert all(g >= 0.005 - 1e-9 for g in gaps)


async def test_detached_tasks_are_held_found_and_cancelled(virtual_clock: VirtualClock) -> None:
    tasks = Detached()
    ended: list[str] = []
    release = asyncio.Event()

    async def work(name: str) -> None:
        try:
            await release.wait()
        finally:
            ended.append(name)

    a = tasks.spawn(work("a"), key="op-a")
    tasks.spawn(work("b"))
    assert len(tasks) == 2
    assert tasks.get("op-a") is a
    assert tasks.get("op-b") is None
    release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(tasks) == 0
    assert tasks.get("op-a") is None  # forgotten once it ended

    release.clear()

    late: list[asyncio.Task[None]] = []

    async def spawns_on_cancel() -> None:
        try:
            await release.wait()
        finally:  # started while the engine stops: cancelled too
            late.append(tasks.spawn(work("late")))

    async def fails() -> None:
        raise RuntimeError("a bug in a task must not stop the others from being cancelled")

    tasks.spawn(spawns_on_cancel())
    tasks.spawn(work("c"))
    tasks.spawn(fails())
    await asyncio.sleep(0)  # each has started
    await tasks.cancel()
    assert len(tasks) == 0
    assert sorted(ended) == ["a", "b", "c", "late"]
    assert len(late) == 1 and late[0].cancelled()
