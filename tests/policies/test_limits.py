"""Throttle and concurrency (D3.7): owned by a policy unless shared as objects, taken per
attempt, waits count against the attempt."""

from __future__ import annotations

import asyncio
import threading

import pytest

from timebound import DeadlineExceeded, RetryExhausted
from timebound._core import _clock
from timebound.policies import Policy, Slots, TokenBucket
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky


async def test_throttle_spaces_calls_by_the_rate(virtual_clock: VirtualClock) -> None:
    """2/1s lets a burst of two through, then one every 0.5 s."""
    fn = AsyncFlaky(0)
    policy = Policy("Throttled", throttle="2/1s")
    for _ in range(5):
        await policy.execute(fn)
    assert fn.calls == [0.0, 0.0, 0.5, 1.0, 1.5]


def test_sync_throttle_spaces_calls(virtual_clock: VirtualClock) -> None:
    """The sync path sleeps on timebound's clock for its token."""
    fn = Flaky(0)
    policy = Policy("ThrottledSync", throttle="1/2s")
    for _ in range(3):
        policy.execute_sync(fn)
    assert fn.calls == [0.0, 2.0, 4.0]


async def test_throttle_is_not_shared_by_name(virtual_clock: VirtualClock) -> None:
    """Two policies named alike each have their own bucket (D3.7)."""
    fn = AsyncFlaky(0)
    a = Policy("ThrottleShared", throttle="1/1s")
    b = Policy("ThrottleShared", throttle="1/1s", retry=2)
    await a.execute(fn)
    await b.execute(fn)
    await a.execute(fn)
    assert fn.calls == [0.0, 0.0, 1.0]


async def test_a_bucket_passed_to_two_policies_is_shared(virtual_clock: VirtualClock) -> None:
    """Sharing is explicit: one TokenBucket object given to two policies."""
    fn = AsyncFlaky(0)
    bucket = TokenBucket(1, "1s")
    a = Policy("A", throttle=bucket)
    b = Policy("B", throttle=bucket, retry=2)
    await a.execute(fn)
    await b.execute(fn)
    await a.execute(fn)
    assert fn.calls == [0.0, 1.0, 2.0]


async def test_each_attempt_takes_its_own_token(virtual_clock: VirtualClock) -> None:
    """Retries are throttled too: attempts at 0, 1 and 2 under 1/1s."""
    fn = AsyncFlaky(2)
    await Policy("ThrottleRetry", throttle="1/1s", retry=2).execute(fn)
    assert fn.calls == [0.0, 1.0, 2.0]


async def test_throttle_wait_counts_against_the_attempt_timeout(
    virtual_clock: VirtualClock,
) -> None:
    """A 10 s wait for a token under a 2 s attempt timeout times out at t=2 (source attempt)."""
    fn = AsyncFlaky(0)
    policy = Policy("ThrottleTimeout", throttle="1/10s", timeout=2)
    await policy.execute(fn)
    with pytest.raises(DeadlineExceeded) as info:
        await policy.execute(fn)
    assert info.value.source == "attempt"
    assert virtual_clock.now() == 2.0
    assert fn.calls == [0.0]


def test_sync_throttle_wait_counts_against_the_attempt_timeout(
    virtual_clock: VirtualClock,
) -> None:
    """Sync: the token wait sleeps to the attempt deadline and fails there."""
    fn = Flaky(0)
    policy = Policy("ThrottleTimeoutSync", throttle="1/10s", timeout=2)
    policy.execute_sync(fn)
    with pytest.raises(DeadlineExceeded) as info:
        policy.execute_sync(fn)
    assert info.value.source == "attempt"
    assert virtual_clock.now() == 2.0


async def test_timed_out_waiter_refunds_its_token(virtual_clock: VirtualClock) -> None:
    """A waiter that timed out gives its reserved token back; the next caller is not delayed."""
    bucket = TokenBucket(1, 10.0)
    assert bucket.reserve() == 0.0
    assert bucket.reserve() == 10.0
    bucket.refund()
    assert bucket.reserve() == 10.0


async def test_concurrency_is_shared_through_one_slots_object(
    virtual_clock: VirtualClock,
) -> None:
    """concurrency=Slots(1) across two policies: the second waits for the first's slot."""
    starts: list[float] = []

    async def work() -> None:
        starts.append(virtual_clock.now())
        await asyncio.sleep(5)

    slots = Slots(1)
    a = Policy("OneAtATime", concurrency=slots)
    b = Policy("Other", concurrency=slots)
    await asyncio.gather(a.execute(work), b.execute(work), a.execute(work))
    assert starts == [0.0, 5.0, 10.0]


async def test_concurrency_is_not_shared_by_name(virtual_clock: VirtualClock) -> None:
    """Two policies named "db" with concurrency=1 each have their own slot (D3.7)."""
    starts: list[float] = []

    async def work() -> None:
        starts.append(virtual_clock.now())
        await asyncio.sleep(5)

    a = Policy("db", concurrency=1)
    b = Policy("db", concurrency=1)
    await asyncio.gather(a.execute(work), b.execute(work), a.execute(work))
    assert starts == [0.0, 0.0, 5.0]


async def test_concurrency_wait_counts_against_the_attempt_timeout(
    virtual_clock: VirtualClock,
) -> None:
    """Waiting 5 s for a slot under a 3 s attempt timeout fails at t=3; the slot is not leaked."""

    async def work() -> str:
        await asyncio.sleep(5)
        return "done"

    holder = Policy("Slot", concurrency=1)
    waiter = Policy("Slot", concurrency=1, timeout=3)
    first = asyncio.ensure_future(holder.execute(work))
    await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded) as info:
        await waiter.execute(work)
    assert info.value.source == "attempt"
    assert virtual_clock.now() == 3.0
    assert await first == "done"
    assert virtual_clock.now() == 5.0
    assert await waiter.execute(AsyncFlaky(0)) == "ok"
    assert virtual_clock.now() == 5.0


async def test_each_attempt_takes_its_own_slot(virtual_clock: VirtualClock) -> None:
    """A failed attempt releases its slot before the delay: another caller runs in the gap."""
    order: list[tuple[str, float]] = []

    async def flaky() -> None:
        order.append(("flaky", virtual_clock.now()))
        raise ConnectionError

    async def other() -> None:
        order.append(("other", virtual_clock.now()))

    a = Policy("SlotRetry", concurrency=1, retry=1, delay=2)
    b = Policy("SlotRetry", concurrency=1)
    task = asyncio.ensure_future(a.execute(flaky))
    await asyncio.sleep(1)
    await b.execute(other)
    with pytest.raises(RetryExhausted):
        await task
    assert order == [("flaky", 0.0), ("other", 1.0), ("flaky", 2.0)]


async def test_cancelled_slot_waiter_does_not_leak(virtual_clock: VirtualClock) -> None:
    """Cancelling a task waiting for a slot leaves the count intact."""
    slots = Slots(1)
    await slots.acquire()
    waiter = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    slots.release()
    assert slots.in_use == 0
    assert slots.try_acquire()


async def test_granted_then_cancelled_waiter_hands_the_slot_on(
    virtual_clock: VirtualClock,
) -> None:
    """A waiter cancelled after being granted a slot passes it on instead of leaking it."""
    slots = Slots(1)
    await slots.acquire()
    first = asyncio.ensure_future(slots.acquire())
    second = asyncio.ensure_future(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # granted to `first`, whose wake-up is still pending
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert slots.in_use == 1


def test_sync_concurrency_blocks_threads(virtual_clock: VirtualClock) -> None:
    """Threads calling a concurrency=1 policy run one after another."""
    policy = Policy("SlotThreads", concurrency=1)
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        order.append("first in")
        inside.set()
        release.wait(5)
        order.append("first out")

    def second() -> None:
        order.append("second in")

    t1 = threading.Thread(target=policy.execute_sync, args=(first,))
    t1.start()
    inside.wait(5)
    t2 = threading.Thread(target=policy.execute_sync, args=(second,))
    t2.start()
    slots = policy._slots
    assert slots is not None
    for _ in range(500):  # until the second thread is queued for the slot
        if slots.waiting:
            break
        release.wait(0.01)
    assert slots.waiting == 1
    assert order == ["first in"]
    release.set()
    t1.join(5)
    t2.join(5)
    assert order == ["first in", "first out", "second in"]


def test_sync_throttle_is_thread_safe(virtual_clock: VirtualClock) -> None:
    """Eight threads drawing from one 4/1s bucket get 4 immediate tokens and 4 waits."""
    bucket = TokenBucket(4, 1.0)
    waits: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        w = bucket.reserve()
        with lock:
            waits.append(w)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(waits) == [0.0, 0.0, 0.0, 0.0, 0.25, 0.5, 0.75, 1.0]
    assert _clock.now() == 0.0


async def test_timed_out_slot_waiter_refunds_its_token(virtual_clock: VirtualClock) -> None:
    """An attempt that got a token but timed out waiting for a slot gives the token back."""

    async def work() -> None:
        await asyncio.sleep(5)

    holder = Policy("TokenAndSlot", throttle="2/1min", concurrency=1)
    waiter = Policy("TokenAndSlot", throttle="2/1min", concurrency=1, timeout=1)
    first = asyncio.ensure_future(holder.execute(work))
    await asyncio.sleep(0)
    with pytest.raises(DeadlineExceeded):
        await waiter.execute(work)
    await first
    # Two tokens per minute: the holder used one, the waiter's was refunded, so one is left now.
    starts: list[float] = []

    async def record() -> None:
        starts.append(virtual_clock.now())

    await holder.execute(record)
    assert starts == [5.0]
