"""Identical concurrent calls under a cache are coalesced (D3.6): one runs, others wait."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import trio

import timebound as tb
from timebound.policies import Policy
from timebound.testing import VirtualClock


class Slow:
    """An async call that takes ``seconds`` and records when each run started."""

    def __init__(self, seconds: float, clock: VirtualClock, fail: int = 0) -> None:
        self.seconds = seconds
        self.clock = clock
        self.fail = fail
        self.starts: list[float] = []

    async def __call__(self, key: str) -> list[str]:
        self.starts.append(self.clock.now())
        await asyncio.sleep(self.seconds)
        if len(self.starts) <= self.fail:
            raise ConnectionError(f"failure {len(self.starts)}")
        return [key]


async def test_calls_that_start_together_run_once(virtual_clock: VirtualClock) -> None:
    """Three identical calls started at once: one runs, all get its result at t=1."""
    slow = Slow(1, virtual_clock)
    policy = Policy("s", cache="1min")
    results = await asyncio.gather(*(policy.execute(slow, ("k",)) for _ in range(3)))
    assert results == [["k"], ["k"], ["k"]]
    assert slow.starts == [0.0]
    assert virtual_clock.now() == 1.0


async def test_followers_get_their_own_copy(virtual_clock: VirtualClock) -> None:
    """A follower's result is read from the cache: mutating one never changes another."""
    slow = Slow(1, virtual_clock)
    policy = Policy("s", cache="1min")
    a, b = await asyncio.gather(policy.execute(slow, ("k",)), policy.execute(slow, ("k",)))
    a.append("mutated")
    assert b == ["k"]


async def test_different_arguments_are_not_coalesced(virtual_clock: VirtualClock) -> None:
    """Only identical calls wait for each other."""
    slow = Slow(1, virtual_clock)
    policy = Policy("s", cache="1min")
    await asyncio.gather(policy.execute(slow, ("a",)), policy.execute(slow, ("b",)))
    assert slow.starts == [0.0, 0.0]


async def test_a_failure_reaches_every_waiter_and_is_not_cached(
    virtual_clock: VirtualClock,
) -> None:
    """The leader's own failure is every follower's failure; the next call runs again."""
    slow = Slow(1, virtual_clock, fail=1)
    policy = Policy("s", cache="1min")
    results = await asyncio.gather(
        *(policy.execute(slow, ("k",)) for _ in range(3)), return_exceptions=True
    )
    assert [type(r) for r in results] == [ConnectionError] * 3
    assert slow.starts == [0.0]
    assert await policy.execute(slow, ("k",)) == ["k"]
    assert slow.starts == [0.0, 1.0]


async def test_followers_apply_their_fallback_to_a_shared_failure(
    virtual_clock: VirtualClock,
) -> None:
    """A shared failure goes through the follower's fallback like its own would."""
    slow = Slow(1, virtual_clock, fail=1)
    policy = Policy("s", cache="1min", fallback=["fallback"])
    results = await asyncio.gather(*(policy.execute(slow, ("k",)) for _ in range(2)))
    assert results == [["fallback"], ["fallback"]]


async def test_a_leader_whose_caller_ran_out_hands_over(virtual_clock: VirtualClock) -> None:
    """A leader stopped by its own caller's deadline says nothing about the call: a follower
    runs it again and succeeds."""
    slow = Slow(2, virtual_clock)
    policy = Policy("s", cache="1min")

    async def impatient() -> Any:
        with pytest.raises(tb.DeadlineExceeded):
            async with tb.fail_after(1):
                await policy.execute(slow, ("k",))

    async def patient() -> Any:
        await asyncio.sleep(0)  # start after the leader
        return await policy.execute(slow, ("k",))

    _, result = await asyncio.gather(impatient(), patient())
    assert result == ["k"]
    assert slow.starts == [0.0, 1.0]
    assert virtual_clock.now() == 3.0


async def test_a_cancelled_follower_leaves_the_flight_alone(virtual_clock: VirtualClock) -> None:
    """A follower whose own deadline passes stops waiting; the leader finishes and stores."""
    slow = Slow(2, virtual_clock)
    policy = Policy("s", cache="1min")

    async def follower() -> None:
        await asyncio.sleep(0)
        with pytest.raises(tb.DeadlineExceeded):
            async with tb.fail_after(1):
                await policy.execute(slow, ("k",))

    leader, _ = await asyncio.gather(policy.execute(slow, ("k",)), follower())
    assert leader == ["k"]
    assert slow.starts == [0.0]
    assert policy._flights is not None and len(policy._flights) == 0


def test_threads_are_coalesced() -> None:
    """Sync calls in threads: one runs, the others block until its result is stored."""
    started = threading.Event()
    release = threading.Event()
    calls = 0

    def work(key: str) -> str:
        nonlocal calls
        calls += 1
        started.set()
        release.wait(5)
        return key

    policy = Policy("t", cache="1min")
    results: list[str] = []
    lead = threading.Thread(target=lambda: results.append(policy.execute_sync(work, ("k",))))
    lead.start()
    assert started.wait(5)
    followers = [
        threading.Thread(target=lambda: results.append(policy.execute_sync(work, ("k",))))
        for _ in range(2)
    ]
    for t in followers:
        t.start()
    # Let the followers reach the flight: they must be waiting, not running the call.
    deadline = time.monotonic() + 5
    while policy._flights is not None and not _waiting(policy, 2) and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    for t in (lead, *followers):
        t.join(5)
    assert results == ["k", "k", "k"]
    assert calls == 1


def _waiting(policy: Policy[Any], n: int) -> bool:
    flights = policy._flights
    assert flights is not None
    with flights._lock:
        return any(len(f.waiters) >= n for f in flights._flights.values())


def test_trio_tasks_are_coalesced(virtual_clock: VirtualClock) -> None:
    """Under trio, identical calls started together run once."""
    calls: list[float] = []

    async def work(key: str) -> str:
        calls.append(trio.current_time())
        await trio.sleep(1)
        return key

    policy = Policy("t", cache="1min")
    results: list[str] = []

    async def main() -> None:
        async def one() -> None:
            results.append(await policy.execute(work, ("k",)))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)

    trio.run(main, clock=virtual_clock.trio_clock())
    assert results == ["k", "k", "k"]
    assert len(calls) == 1


async def test_a_cancelled_leader_hands_over(virtual_clock: VirtualClock) -> None:
    """A leader task cancelled mid-call shares nothing: its follower runs the call itself."""
    slow = Slow(2, virtual_clock)
    policy = Policy("s", cache="1min")
    leader = asyncio.ensure_future(policy.execute(slow, ("k",)))
    await asyncio.sleep(0)
    follower = asyncio.ensure_future(policy.execute(slow, ("k",)))
    await asyncio.sleep(1)
    leader.cancel()
    assert await follower == ["k"]
    assert leader.cancelled()
    assert slow.starts == [0.0, 1.0]


async def test_storm_of_deadlines_and_cancels_leaves_no_flight_behind(
    virtual_clock: VirtualClock,
) -> None:
    """200 identical and near-identical calls with deadlines and cancels at random instants
    (seeded): every call ends with the right value or its own deadline/cancellation, nothing
    waits forever, and no flight is left behind."""
    import random

    rng = random.Random(7)
    policy = Policy("storm", cache="100ms", retry=1, timeout=0.3)
    runs: list[str] = []

    async def work(key: str) -> str:
        runs.append(key)
        await asyncio.sleep(rng.uniform(0.01, 0.4))
        if rng.random() < 0.2:
            raise ConnectionError(key)
        return key.upper()

    async def caller(i: int) -> str:
        key = f"k{i % 3}"
        await asyncio.sleep(rng.uniform(0, 1))
        try:
            async with tb.fail_after(rng.uniform(0.001, 0.8)):
                value = await policy.execute(work, (key,))
        except (tb.DeadlineExceeded, tb.RetryExhausted, ConnectionError):
            return "failed"
        assert value == key.upper()
        return "ok"

    tasks = [asyncio.ensure_future(caller(i)) for i in range(200)]
    for t in rng.sample(tasks, 20):
        asyncio.get_running_loop().call_later(rng.uniform(0, 1), t.cancel)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(r in ("ok", "failed") or isinstance(r, asyncio.CancelledError) for r in results)
    assert "ok" in results
    assert policy._flights is not None and len(policy._flights) == 0
    assert len(runs) < 200  # coalescing and the cache spared calls


async def test_policies_sharing_a_cache_coalesce_together(virtual_clock: VirtualClock) -> None:
    """Two policies given one InMemoryCache also share its calls in flight."""
    from timebound.policies import InMemoryCache

    slow = Slow(1, virtual_clock)
    shared = InMemoryCache()
    a = Policy("s", cache="1min", cache_backend=shared)
    b = Policy("s", cache="1min", cache_backend=shared, retry=1)
    assert await asyncio.gather(a.execute(slow, ("k",)), b.execute(slow, ("k",))) == [["k"]] * 2
    assert slow.starts == [0.0]
