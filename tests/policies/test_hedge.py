"""Hedging (D3.14): a backup for a slow attempt; the first success wins, within every cap."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.policies import CircuitBreaker, Hedge, Policy, RetryBudget
from timebound.testing import VirtualClock

from ._helpers import Recorder


class _Replica:
    """Each call takes the next latency of ``latencies`` (then ``rest``); records starts,
    ends and cancellations; fails when the latency is negative."""

    def __init__(self, latencies: Sequence[float], rest: float = 0.01) -> None:
        self.latencies = list(latencies)
        self.rest = rest
        self.starts: list[float] = []
        self.cancelled: list[int] = []

    async def __call__(self) -> int:
        me = len(self.starts)
        self.starts.append(_clock.now())
        seconds = self.latencies[me] if me < len(self.latencies) else self.rest
        try:
            await asyncio.sleep(abs(seconds))
        except asyncio.CancelledError:
            self.cancelled.append(me)
            raise
        if seconds < 0:
            raise ConnectionError(f"call {me} failed")
        return me


async def test_the_first_success_wins_and_the_other_is_cancelled(
    virtual_clock: VirtualClock,
) -> None:
    """Primary takes 1 s; the hedge sent at 20 ms answers at 30 ms; the primary is cancelled."""
    replica = _Replica([1.0, 0.01])
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
    recorder = Recorder()
    assert await policy.execute(replica, observer=recorder) == 1
    assert _clock.now() == pytest.approx(0.03)
    assert replica.starts == [0.0, pytest.approx(0.02)] and replica.cancelled == [0]
    assert [e.name for e in recorder.events if e.name.startswith("hedge.")] == [
        "hedge.sent",
        "hedge.won",
    ]
    assert policy.hedge is not None and (policy.hedge.sent, policy.hedge.won) == (1, 1)


async def test_a_fast_answer_sends_no_hedge(virtual_clock: VirtualClock) -> None:
    """An attempt that answers before the delay is the whole call."""
    replica = _Replica([0.01])
    policy = Policy("Search", hedge="20ms")
    assert await policy.execute(replica) == 0
    assert len(replica.starts) == 1


async def test_the_primary_can_still_win(virtual_clock: VirtualClock) -> None:
    """Primary 50 ms, hedge 1 s: the primary's answer wins and the hedge is cancelled."""
    replica = _Replica([0.05, 1.0])
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
    assert await policy.execute(replica) == 0
    assert replica.cancelled == [1] and _clock.now() == pytest.approx(0.05)


async def test_a_learned_delay_is_a_percentile_of_recent_latencies(
    virtual_clock: VirtualClock,
) -> None:
    """After 20 answers of 10 ms, p95 is 10 ms: a slow call is hedged at 10 ms."""
    replica = _Replica([0.01] * 20 + [1.0, 0.01])
    policy = Policy("Search", hedge=Hedge("p95", max_extra_load=1))
    for _ in range(20):
        await policy.execute(replica)
    start = _clock.now()
    assert await policy.execute(replica) == 21
    assert replica.starts[21] - start == pytest.approx(0.01)


async def test_no_hedge_before_the_delay_is_learned(virtual_clock: VirtualClock) -> None:
    """With fewer than min_samples latencies a learned delay sends nothing."""
    replica = _Replica([1.0])
    policy = Policy("Search", hedge=Hedge("p90", max_extra_load=1))
    assert await policy.execute(replica) == 0
    assert len(replica.starts) == 1


async def test_no_hedge_starts_that_cannot_finish(virtual_clock: VirtualClock) -> None:
    """Median latency 100 ms, 50 ms left at the hedging delay: suppressed for the deadline."""
    replica = _Replica([0.1] * 20 + [1.0])
    policy = Policy("Search", hedge=Hedge("150ms", max_extra_load=1))
    for _ in range(20):
        await policy.execute(replica)
    recorder = Recorder()
    with pytest.raises(tb.DeadlineExceeded), tb.fail_after(0.2):
        await policy.execute(replica, observer=recorder)
    assert len(replica.starts) == 21
    assert [e.attrs["reason"] for e in recorder.of("hedge.suppressed")] == ["deadline"]
    assert policy.hedge is not None and policy.hedge.suppressed["deadline"] == 1


async def test_the_extra_load_stays_within_its_cap(virtual_clock: VirtualClock) -> None:
    """200 slow calls with max_extra_load 5 %: at most 10 hedges are sent."""
    replica = _Replica([], rest=0.05)
    hedge = Hedge("10ms", max_extra_load=0.05)
    policy = Policy("Search", hedge=hedge)
    for _ in range(200):
        await policy.execute(replica)
    assert hedge.sent == 10 and len(replica.starts) == 210
    assert hedge.suppressed["budget"] == 190


async def test_concurrent_hedges_are_capped(virtual_clock: VirtualClock) -> None:
    """Three slow calls at once, max_concurrent 1: one hedge, two suppressed."""
    replica = _Replica([1.0, 1.0, 1.0, 0.01])
    hedge = Hedge("20ms", max_extra_load=1, max_concurrent=1)
    policy = Policy("Search", hedge=hedge)
    await asyncio.gather(*(policy.execute(replica) for _ in range(3)))
    assert hedge.sent == 1 and hedge.suppressed["concurrency"] == 2
    assert hedge._in_flight == 0


async def test_hedges_draw_on_the_retry_budget(virtual_clock: VirtualClock) -> None:
    """A spent retry budget suppresses hedges too."""
    replica = _Replica([1.0])
    budget = RetryBudget(0.0, min_per_second=0)
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1), retry_budget=budget)
    await policy.execute(replica)
    assert len(replica.starts) == 1


async def test_a_cut_by_the_callers_deadline_is_not_the_dependencys_failure(
    virtual_clock: VirtualClock,
) -> None:
    """Primary and hedge cut by the caller's 100 ms: both cancelled, the breaker stays closed."""
    replica = _Replica([], rest=1.0)
    breaker = CircuitBreaker(min_calls=1)
    policy = Policy(
        "Search", timeout="500ms", breaker=breaker, hedge=Hedge("20ms", max_extra_load=1)
    )
    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.1):
        await policy.execute(replica)
    assert info.value.source == "scope" and _clock.now() == pytest.approx(0.1)
    assert sorted(replica.cancelled) == [0, 1] and breaker.state == "closed"
    assert policy.hedge is not None and policy.hedge._in_flight == 0


async def test_each_attempt_has_its_own_timeout_and_retry_follows(
    virtual_clock: VirtualClock,
) -> None:
    """timeout 50 ms: primary and hedge both time out; the retry loop starts attempt 2."""
    replica = _Replica([1.0, 1.0, 0.01])
    policy = Policy("Search", timeout="50ms", retry=1, hedge=Hedge("20ms", max_extra_load=1))
    assert await policy.execute(replica) == 2
    # The race ends when the hedge (sent at 20 ms) times out at 70 ms.
    assert replica.starts == [0.0, pytest.approx(0.02), pytest.approx(0.07)]


async def test_every_attempt_failing_fails_the_race_with_the_first_error(
    virtual_clock: VirtualClock,
) -> None:
    """Both attempts fail: the race fails with the primary's error."""
    replica = _Replica([-0.05, -0.03])
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
    with pytest.raises(ConnectionError, match="call 0"):
        await policy.execute(replica)


async def test_a_hedged_call_is_one_cached_call(virtual_clock: VirtualClock) -> None:
    """The winner is stored once; the next call is a cache hit that sends nothing."""
    replica = _Replica([1.0, 0.01])
    policy = Policy("Search", cache="1min", hedge=Hedge("20ms", max_extra_load=1))
    assert await policy.execute(replica) == 1
    assert await policy.execute(replica) == 1
    assert len(replica.starts) == 2


def test_trio_first_success_wins() -> None:
    """Under trio the hedge wins and the primary is cancelled."""
    trio = pytest.importorskip("trio")
    starts: list[float] = []
    cancelled: list[int] = []

    async def replica() -> int:
        me = len(starts)
        starts.append(_clock.now())
        try:
            await trio.sleep(1.0 if me == 0 else 0.01)
        except trio.Cancelled:
            cancelled.append(me)
            raise
        return me

    async def main() -> Any:
        policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
        return await policy.execute(replica)

    clock = VirtualClock()
    with clock:
        assert trio.run(main, clock=clock.trio_clock()) == 1
    assert cancelled == [0]


def test_trio_callers_deadline_cuts_the_race() -> None:
    """Under trio the caller's deadline cancels every attempt and surfaces as its own."""
    trio = pytest.importorskip("trio")

    async def replica() -> None:
        await trio.sleep(10)

    async def main() -> str:
        policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
        try:
            with tb.fail_after(0.1):
                await policy.execute(replica)
        except tb.DeadlineExceeded as exc:
            return exc.source
        return "no error"

    clock = VirtualClock()
    with clock:
        assert trio.run(main, clock=clock.trio_clock()) == "scope"


@pytest.mark.parametrize(
    ("value", "option"),
    [
        ("p100", "hedge"),
        ("p0", "hedge"),
        ("soon", "hedge"),
        (True, "hedge"),
        ([1], "hedge"),
    ],
)
def test_bad_hedges_name_the_option(value: object, option: str) -> None:
    """Each bad hedge= value is a ConfigurationError naming it."""
    with pytest.raises(tb.ConfigurationError) as info:
        Policy("Search", hedge=value)  # type: ignore[arg-type]
    assert info.value.option == option


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"max_hedges": 0}, "hedge.max_hedges"),
        ({"max_extra_load": 0}, "hedge.max_extra_load"),
        ({"max_concurrent": 1.5}, "hedge.max_concurrent"),
        ({"window": -1}, "retry_budget.window"),
    ],
)
def test_bad_hedge_knobs_name_the_field(kwargs: dict[str, object], option: str) -> None:
    """Each bad knob of Hedge is a ConfigurationError naming the field."""
    with pytest.raises(tb.ConfigurationError) as info:
        Hedge("20ms", **kwargs)  # type: ignore[arg-type]
    assert info.value.option == option


async def test_a_race_cut_as_the_hedge_starts_leaves_nothing_in_flight(
    virtual_clock: VirtualClock,
) -> None:
    """The caller's deadline at the very instant the hedge is sent: every place is returned."""
    replica = _Replica([], rest=1.0)
    hedge = Hedge("20ms", max_extra_load=1, max_concurrent=1)
    policy = Policy("Search", hedge=hedge)
    for _ in range(3):
        with pytest.raises(tb.DeadlineExceeded), tb.fail_after(0.02):
            await policy.execute(replica)
        virtual_clock.advance(0.001)
    assert hedge._in_flight == 0


def test_the_latency_window_keeps_the_last_samples() -> None:
    """A full window forgets its oldest sample; percentiles are nearest-rank."""
    from timebound.policies._hedge import LatencyWindow

    window = LatencyWindow(size=4, min_samples=2)
    assert window.percentile(0.5) is None
    for x in (5.0, 1.0, 3.0, 2.0, 4.0):  # 5.0 falls out
        window.record(x)
    assert len(window) == 4
    assert (window.percentile(0.5), window.percentile(0.99)) == (2.0, 4.0)
    assert window.share_above(3.0) == 0.25


async def test_a_winning_hedge_stops_a_primary_inside_its_own_timeout(
    virtual_clock: VirtualClock,
) -> None:
    """With an attempt timeout and a breaker, the primary is cancelled cleanly when a hedge wins:
    no timeout is reported, nothing is counted against the dependency, and the caller's later
    deadline still fires on the next call."""
    replica = _Replica([1.0, 0.01, 5.0, 5.0])
    breaker = CircuitBreaker(min_calls=1)
    policy = Policy(
        "Search", timeout="500ms", breaker=breaker, hedge=Hedge("20ms", max_extra_load=1)
    )
    recorder = Recorder()
    assert await policy.execute(replica, observer=recorder) == 1
    assert replica.cancelled == [0] and _clock.now() == pytest.approx(0.03)
    assert [e.attrs["outcome"] for e in recorder.of("attempt.end")] == ["ok"]
    assert breaker.state == "closed"
    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.1):
        await policy.execute(replica)
    assert info.value.source == "scope"
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
