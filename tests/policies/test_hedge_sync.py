"""Hedging sync calls (D3.14): the attempts race in threads, the caller returns the first success.

Who answers first is decided by events the test opens, never by how fast threads run: on virtual
time the caller's wait for the hedging delay jumps the clock as soon as no attempt has answered,
so instants are exact. Several cases follow peers' hedging tests (Polly v8's hedging strategy,
resilience4j's Hedge): the primary's or the hedge's result wins, the caller's context flows to
the hedges, a discarded result is never reported, every attempt failing fails the race.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.policies import CircuitBreaker, Hedge, Policy, RetryBudget
from timebound.policies._hedge import race_in_threads
from timebound.telemetry import Event
from timebound.testing import VirtualClock

from ._helpers import Recorder

Step = Callable[[], Any]


class _Script:
    """A sync replica whose call ``i`` runs ``steps[i]``; records who started, who was asked to
    stop (saw a ``DeadlineExceeded``) and who ended."""

    def __init__(self, *steps: Step) -> None:
        self.steps = steps
        self.lock = threading.Lock()
        self.started: list[float] = []
        self.deadlines: list[tb.Deadline] = []
        self.stopped: list[int] = []
        self.ended: list[int] = []

    def __call__(self) -> Any:
        with self.lock:
            me = len(self.started)
            self.started.append(_clock.now())
            self.deadlines.append(tb.current_deadline())
        try:
            return self.steps[me]()
        except tb.DeadlineExceeded:
            with self.lock:
                self.stopped.append(me)
            raise
        finally:
            with self.lock:
                self.ended.append(me)


def answer(value: Any) -> Step:
    return lambda: value


def fail(message: str, then: Callable[[], object] = lambda: None) -> Step:
    def step() -> Any:
        then()
        raise ConnectionError(message)

    return step


def blocked(gate: threading.Event, value: Any = "late", *, checks: bool = True) -> Step:
    """Wait for ``gate``; with ``checks``, call ``tb.checkpoint()`` meanwhile (sync code that
    cooperates), else never look at the deadline."""

    def step() -> Any:
        while not gate.wait(0.001 if checks else None):
            tb.checkpoint()
        return value

    return step


def opens(gate: threading.Event, then: Step) -> Step:
    def step() -> Any:
        gate.set()
        return then()

    return step


def _race_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("timebound hedge race")]


@pytest.fixture(autouse=True)
def _no_thread_left() -> Iterator[None]:
    """Every test ends with its losers ended (they are daemon threads of the race)."""
    yield
    for thread in _race_threads():
        thread.join(10)
    assert not _race_threads()


def _join() -> None:
    for thread in _race_threads():
        thread.join(10)


def test_a_hedge_wins_while_the_primary_is_stuck(virtual_clock: VirtualClock) -> None:
    """The caller returns the hedge's answer at the hedging delay without waiting for the
    primary, which is then asked to stop and stops at its next checkpoint."""
    gate = threading.Event()
    replica = _Script(blocked(gate), answer("hedge"))
    hedge = Hedge("20ms", max_extra_load=1)
    policy = Policy("Search", hedge=hedge)
    recorder = Recorder()
    assert policy.execute_sync(replica, observer=recorder) == "hedge"
    assert _clock.now() == pytest.approx(0.02)
    assert replica.started == [0.0, pytest.approx(0.02)]
    assert not gate.is_set()  # the primary had not answered
    _join()
    assert replica.stopped == [0] and hedge._in_flight == 0
    assert (hedge.sent, hedge.won) == (1, 1)
    assert [e.attrs["hedge"] for e in recorder.of("hedge.won")] == [1]


def test_the_primary_can_still_win(virtual_clock: VirtualClock) -> None:
    """A hedge is sent, then the primary answers first: its value is returned, no hedge won,
    and the hedge, still running, is asked to stop."""
    primary_may_answer = threading.Event()
    never = threading.Event()
    replica = _Script(
        blocked(primary_may_answer, "primary"), opens(primary_may_answer, blocked(never))
    )
    hedge = Hedge("20ms", max_extra_load=1)
    policy = Policy("Search", hedge=hedge)
    assert policy.execute_sync(replica) == "primary"
    _join()
    assert replica.stopped == [1] and hedge.won == 0 and hedge._in_flight == 0


def test_a_loser_counts_in_flight_until_it_ends_and_its_result_is_dropped(
    virtual_clock: VirtualClock,
) -> None:
    """A primary that never checks the deadline keeps the race's place among the hedges in
    flight after the call returned; when it answers, its value is dropped unreported."""
    gate = threading.Event()
    replica = _Script(blocked(gate, checks=False), answer("hedge"))
    hedge = Hedge("20ms", max_extra_load=1, max_concurrent=1)
    policy = Policy("Search", hedge=hedge)
    recorder = Recorder()
    assert policy.execute_sync(replica, observer=recorder) == "hedge"
    assert hedge._in_flight == 1 and replica.ended == [1]
    gate.set()
    _join()
    assert replica.ended == [1, 0] and hedge._in_flight == 0
    assert [e.attrs["outcome"] for e in recorder.of("attempt.end")] == ["ok"]
    assert len(recorder.of("hedge.won")) == 1 and len(recorder.of("attempt.start")) == 1


def test_a_running_loser_takes_a_place_from_the_next_call(virtual_clock: VirtualClock) -> None:
    """max_concurrent 1: while the loser of one call runs, the next call's hedge is suppressed
    for concurrency and that call waits for its own primary."""
    loser_gate = threading.Event()
    second_primary = threading.Event()
    replica = _Script(
        blocked(loser_gate, checks=False), answer("hedge"), blocked(second_primary, "second")
    )
    hedge = Hedge("20ms", max_extra_load=1, max_concurrent=1)
    policy = Policy("Search", hedge=hedge)
    assert policy.execute_sync(replica) == "hedge"

    def on_event(event: Event) -> None:
        if event.name == "hedge.suppressed":
            assert event.attrs["reason"] == "concurrency"
            second_primary.set()

    assert policy.execute_sync(replica, observer=on_event) == "second"
    assert hedge.suppressed["concurrency"] == 1 and len(replica.started) == 3
    loser_gate.set()
    _join()
    assert hedge._in_flight == 0


def test_every_attempt_failing_fails_with_the_primarys_error(virtual_clock: VirtualClock) -> None:
    """Both attempts fail: the race fails with the primary's error, and no retry is made."""
    hedge_failed = threading.Event()
    replica = _Script(
        lambda: fail("primary", then=lambda: hedge_failed.wait())(),
        fail("hedge", then=hedge_failed.set),
    )
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
    with pytest.raises(ConnectionError, match="primary"):
        policy.execute_sync(replica)
    assert len(replica.started) == 2


def test_the_callers_deadline_ends_the_wait_and_stops_every_attempt(
    virtual_clock: VirtualClock,
) -> None:
    """Neither attempt answers: the caller raises its own deadline's error at that deadline,
    both attempts stop at their checkpoints, and the breaker counts nothing."""
    never = threading.Event()
    breaker = CircuitBreaker(min_calls=1)
    hedge = Hedge("20ms", max_extra_load=1)
    policy = Policy("Search", timeout="500ms", breaker=breaker, hedge=hedge)
    replica = _Script(blocked(never), blocked(never))
    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.1):
        policy.execute_sync(replica)
    assert info.value.source == "scope" and _clock.now() == pytest.approx(0.1)
    _join()
    assert sorted(replica.stopped) == [0, 1] and hedge._in_flight == 0
    assert breaker.state == "closed"


def test_the_callers_context_flows_to_every_attempt(virtual_clock: VirtualClock) -> None:
    """Each attempt, in its thread, sees the caller's deadline (Polly: the primary context
    flows to the hedged actions)."""
    gate = threading.Event()
    replica = _Script(blocked(gate), answer("hedge"))
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
    with tb.fail_after(5):
        expected = tb.current_deadline()
        assert policy.execute_sync(replica) == "hedge"
    _join()
    assert replica.deadlines == [expected, expected]


def test_a_spent_retry_budget_suppresses_the_hedge(virtual_clock: VirtualClock) -> None:
    """The policy's retry budget is drawn on by sync hedges as by async ones."""
    gate = threading.Event()
    replica = _Script(blocked(gate, "primary"))
    budget = RetryBudget(0.0, min_per_second=0)
    hedge = Hedge("20ms", max_extra_load=1)
    policy = Policy("Search", hedge=hedge, retry_budget=budget)

    def on_event(event: Event) -> None:
        if event.name == "hedge.suppressed":
            assert event.attrs["reason"] == "budget"
            gate.set()

    assert policy.execute_sync(replica, observer=on_event) == "primary"
    assert len(replica.started) == 1 and hedge.sent == 0 and hedge._in_flight == 0


def test_no_hedge_before_a_learned_delay_runs_in_the_callers_thread() -> None:
    """A learned delay without enough samples races nothing: the attempt runs in the caller's
    own thread, as an unhedged one does."""
    threads: list[threading.Thread] = []
    policy = Policy("Search", hedge="p95")
    assert policy.execute_sync(lambda: threads.append(threading.current_thread()) or 1) == 1
    assert threads == [threading.current_thread()]


def test_resilient_hedges_a_def(virtual_clock: VirtualClock) -> None:
    """``@resilient(hedge=...)`` on a sync function hedges it (D3.14; it was refused before)."""
    gate = threading.Event()
    replica = _Script(blocked(gate), answer("hedge"))

    @tb.resilient(hedge=Hedge("20ms", max_extra_load=1))
    def search() -> str:
        return str(replica())

    assert search() == "hedge"
    _join()


def test_a_retry_follows_a_failed_race(virtual_clock: VirtualClock) -> None:
    """A race whose attempts all failed is one failed attempt: the retry loop starts the next
    race (hedges answer slowness, retries answer failures), which its hedge wins."""
    hedge_failed = threading.Event()
    never = threading.Event()
    replica = _Script(
        lambda: fail("primary", then=lambda: hedge_failed.wait())(),
        fail("hedge", then=hedge_failed.set),
        blocked(never),
        answer("second race"),
    )
    policy = Policy("Search", retry=1, hedge=Hedge("20ms", max_extra_load=1))
    assert policy.execute_sync(replica) == "second race"
    _join()
    assert len(replica.started) == 4 and replica.stopped == [2]


def test_the_total_budget_ends_the_wait_as_the_totals(virtual_clock: VirtualClock) -> None:
    """With total_timeout and no answer, the caller stops waiting at the total, reported as
    the total's (no retry follows), and both attempts stop."""
    never = threading.Event()
    replica = _Script(blocked(never), blocked(never))
    policy = Policy("Search", retry=3, total_timeout="100ms", hedge=Hedge("20ms", max_extra_load=1))
    with pytest.raises(tb.DeadlineExceeded) as info:
        policy.execute_sync(replica)
    assert info.value.source == "total" and _clock.now() == pytest.approx(0.1)
    _join()
    assert sorted(replica.stopped) == [0, 1] and len(replica.started) == 2


def test_up_to_max_hedges_are_sent_one_delay_apart(virtual_clock: VirtualClock) -> None:
    """max_hedges 2 (Polly's MaxHedgedAttempts): with the primary and the first hedge stuck,
    the second hedge starts one delay after the first and its answer wins; both stuck attempts
    are asked to stop."""
    never = threading.Event()
    replica = _Script(blocked(never), blocked(never), answer("second hedge"))
    hedge = Hedge("20ms", max_hedges=2, max_extra_load=2)
    policy = Policy("Search", hedge=hedge)
    assert policy.execute_sync(replica) == "second hedge"
    assert replica.started == [0.0, pytest.approx(0.02), pytest.approx(0.04)]
    _join()
    assert sorted(replica.stopped) == [0, 1] and (hedge.sent, hedge.won) == (2, 1)
    assert hedge._in_flight == 0


async def test_a_coroutine_awaits_a_race_in_threads(virtual_clock: VirtualClock) -> None:
    """A sync callable marked race_in_threads (how Constellation calls a hedged sync module)
    races in threads under ``await execute``: the hedge's answer at the delay, the stuck
    primary asked to stop, the event loop free meanwhile."""
    gate = threading.Event()
    replica = _Script(blocked(gate), answer("hedge"))
    policy = Policy("Search", hedge=Hedge("20ms", max_extra_load=1))
    ticks: list[float] = []

    async def ticker() -> None:  # ends by the delay: then no timer can move time on
        for _ in range(3):
            ticks.append(_clock.now())
            await asyncio.sleep(0.005)

    task = asyncio.ensure_future(ticker())
    assert await policy.execute(race_in_threads(replica)) == "hedge"
    await task
    assert _clock.now() == pytest.approx(0.02)
    assert ticks == [0.0, pytest.approx(0.005), pytest.approx(0.01)]
    _join()
    assert replica.stopped == [0] and not gate.is_set()


async def test_cancelling_the_awaiting_coroutine_stops_every_attempt(
    virtual_clock: VirtualClock,
) -> None:
    """The coroutine cancelled (its run failed elsewhere): the cancellation goes through and
    every attempt still running is asked to stop."""
    never = threading.Event()
    replica = _Script(blocked(never), blocked(never))
    hedge = Hedge("20ms", max_extra_load=1)
    policy = Policy("Search", hedge=hedge)
    call = asyncio.ensure_future(policy.execute(race_in_threads(replica)))
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    _join()
    assert sorted(replica.stopped) == [0, 1] and hedge._in_flight == 0
