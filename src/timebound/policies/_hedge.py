"""Hedged attempts (DECISIONS D3.14): a backup attempt for a slow one; the first success wins.

``resilient(hedge=...)`` runs each attempt of a retry loop as a small race. The primary starts;
if it has not answered after the hedging delay — fixed, or a percentile of this policy's recent
latencies (:class:`LatencyWindow`) — a hedge (another attempt of the same call) starts, up to
``max_hedges``. The first success wins and the others are cancelled; over HTTP and gRPC each
attempt already carries the caller's deadline, and cancelling it closes the exchange, so the peer
stops too. If every attempt fails the race fails with the first error, and the retry loop decides
what follows, as for any failed attempt.

A hedge is sent only when everything allows it, checked in this order, each refusal being a
``hedge.suppressed`` event with its ``reason``:

- ``deadline``: the effective deadline (and the policy's total budget) leaves less than the
  expected latency (the median of the window): a hedge that cannot finish is load for nothing;
- ``concurrency``: ``max_concurrent`` hedges of this :class:`Hedge` object are in flight;
- ``budget``: extra load over ``max_extra_load`` * calls in the last ``window`` (Finagle's
  ``maxExtraLoad``), or the policy's ``retry_budget`` when it has one (D3.12).

Under asyncio the primary runs in the caller's task and a timer starts the hedges (see
:class:`_InlineRace`); under trio every attempt runs in a nursery; a sync call races its attempts
in threads while the caller waits, and asks the losers to stop through their deadline (see
:class:`_ThreadRace`). Each attempt, hedges included,
has its own attempt timeout, admission (throttle token,
concurrency slot) and breaker guard (D3.13): a hedge cut by the caller's deadline or cancelled
because another attempt won is not counted against the dependency. Hedging happens below the
cache and the coalescing of calls in flight: a hedged call is one cached call. Hedging is opt-in:
only a call the user says is safe to send twice (idempotent) should be given ``hedge=``.
"""

from __future__ import annotations

import bisect
import contextvars
import functools
import math
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Final

from .._core import _clock
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from .._core._scopes import (
    CancelScope,
    current_bound_error,
    cut_short,
    fail_at,
    remaining,
    running_loop,
)
from ._budget import RetryBudget

# asyncio is imported where an asyncio race runs (its loop has imported it), never at module
# level: every `resilient` imports this module, and sync callers need no asyncio (D15.5).
if TYPE_CHECKING:
    import asyncio

    from ._policy import Observer, Policy
    from ._retry import RetryState

__all__ = [
    "Hedge",
    "LatencyWindow",
    "hedged_async",
    "hedged_sync",
    "hedged_threads_async",
    "parse_percentile",
    "race_in_threads",
]


def parse_percentile(value: str, option: str) -> float | None:
    """``"p95"`` → 0.95, ``"p99.9"`` → 0.999; ``None`` when ``value`` is not of that form;
    a ConfigurationError for ``p0``, ``p100`` and beyond."""
    text = value.strip().lower()
    if not text.startswith("p"):
        return None
    try:
        q = float(text[1:])
    except ValueError:
        return None
    if not 0 < q < 100 or math.isnan(q):
        raise ConfigurationError(
            f"{option}: percentile must be above p0 and below p100, got {value!r}", option=option
        )
    return q / 100.0


class LatencyWindow:
    """The latencies of a policy's last ``size`` successful attempts, and their percentiles.

    A sorted copy is kept beside the arrival order (``bisect``: a record moves at most ``size``
    floats in memory), so a percentile is read in O(1). ``None`` until ``min_samples`` were
    recorded.
    """

    __slots__ = ("_lock", "_size", "_sorted", "_values", "min_samples")

    def __init__(self, size: int = 1000, min_samples: int = 20) -> None:
        self._values: deque[float] = deque()
        self._sorted: list[float] = []
        self._size = size
        self._lock = threading.Lock()
        self.min_samples = min_samples

    def record(self, seconds: float) -> None:
        with self._lock:
            values = self._values
            ordered = self._sorted
            if len(values) >= self._size:
                del ordered[bisect.bisect_left(ordered, values.popleft())]
            values.append(seconds)
            bisect.insort(ordered, seconds)

    def __len__(self) -> int:
        return len(self._values)

    def percentile(self, q: float) -> float | None:
        with self._lock:
            values = self._sorted
            n = len(values)
            if n < self.min_samples:
                return None
            # Nearest rank: the smallest value with at least q of the samples at or below it.
            return values[min(n - 1, max(0, math.ceil(q * n) - 1))]

    def share_above(self, seconds: float) -> float:
        """The share of recorded latencies above ``seconds`` (for tests and metrics)."""
        with self._lock:
            values = self._sorted
            if not values:
                return 0.0
            return 1.0 - bisect.bisect_right(values, seconds) / len(values)


class Hedge:
    """How a policy hedges: ``delay`` (a duration, or ``"p95"``-style: that percentile of the
    policy's recent latencies), ``max_hedges`` per attempt (1), ``max_extra_load`` (0.05: hedges
    at most 5 % of calls over ``window``, 10 s), ``max_concurrent`` hedges in flight (10),
    ``min_samples`` (20) latencies before a learned delay applies (no hedge before).

    The object holds the extra-load budget and the count in flight: policies given the same
    object share them (D3.7). ``sent``, ``won`` and ``suppressed`` (by reason) count what it did.
    """

    __slots__ = (
        "_budget",
        "_in_flight",
        "_lock",
        "delay",
        "max_concurrent",
        "max_extra_load",
        "max_hedges",
        "min_samples",
        "percentile",
        "sent",
        "suppressed",
        "window",
        "won",
    )

    def __init__(
        self,
        delay: Duration | str = "p95",
        *,
        max_hedges: int = 1,
        max_extra_load: float = 0.05,
        max_concurrent: int = 10,
        window: Duration = 10.0,
        min_samples: int = 20,
    ) -> None:
        self.percentile: float | None = None
        self.delay: float | None = None
        if isinstance(delay, str):
            self.percentile = parse_percentile(delay, "hedge.delay")
        if self.percentile is None:
            seconds = to_seconds(delay, option="hedge.delay", allow_zero=True)
            if math.isinf(seconds):
                raise ConfigurationError("hedge delay must be finite", option="hedge.delay")
            self.delay = seconds
        for field, value in (
            ("max_hedges", max_hedges),
            ("max_concurrent", max_concurrent),
            ("min_samples", min_samples),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"hedge {field} must be an integer >= 1, got {value!r}",
                    option=f"hedge.{field}",
                )
        if (
            isinstance(max_extra_load, bool)
            or not isinstance(max_extra_load, (int, float))
            or not 0 < max_extra_load <= 10
        ):
            raise ConfigurationError(
                f"hedge max_extra_load must be a number in (0, 10], got {max_extra_load!r}",
                option="hedge.max_extra_load",
            )
        self.max_hedges = max_hedges
        self.max_extra_load = float(max_extra_load)
        self.max_concurrent = max_concurrent
        self.min_samples = min_samples
        self._budget = RetryBudget(self.max_extra_load, min_per_second=0.0, window=window)
        self.window = self._budget.window
        self._lock = threading.Lock()
        self._in_flight = 0
        self.sent = 0
        self.won = 0
        self.suppressed: dict[str, int] = {"deadline": 0, "concurrency": 0, "budget": 0}

    def __repr__(self) -> str:
        delay = f"p{self.percentile * 100:g}" if self.percentile is not None else self.delay
        return (
            f"Hedge(delay={delay!r}, max_hedges={self.max_hedges}, "
            f"max_extra_load={self.max_extra_load:g}, max_concurrent={self.max_concurrent})"
        )

    # Decisions -----------------------------------------------------------------------------

    def call_started(self) -> None:
        """A call of a policy with this hedge began: it earns its share of extra load."""
        self._budget.deposit()

    def delay_for(self, latencies: LatencyWindow) -> float | None:
        """The hedging delay now, or ``None`` (a learned delay without enough samples yet)."""
        if self.percentile is None:
            return self.delay
        return latencies.percentile(self.percentile)

    def try_send(
        self, latencies: LatencyWindow, retry_budget: RetryBudget | None, left: float
    ) -> str | None:
        """Take a place for one hedge; ``None`` when granted, else the reason it is not."""
        expected = latencies.percentile(0.5)
        if expected is not None and left < expected:
            return self._refuse("deadline")
        with self._lock:
            if self._in_flight >= self.max_concurrent:
                self.suppressed["concurrency"] += 1
                return "concurrency"
            self._in_flight += 1
        if not self._budget.try_withdraw() or (
            retry_budget is not None and not retry_budget.try_withdraw()
        ):
            self.done()
            return self._refuse("budget")
        with self._lock:
            self.sent += 1
        return None

    def done(self) -> None:
        """A hedge granted by :meth:`try_send` ended."""
        with self._lock:
            self._in_flight -= 1

    def _refuse(self, reason: str) -> str:
        with self._lock:
            self.suppressed[reason] += 1
        return reason

    def _won(self) -> None:
        with self._lock:
            self.won += 1


def check_hedge(value: Any) -> Hedge | None:
    """``hedge=``: ``None``, a :class:`Hedge`, or its delay alone (``"20ms"``, ``0.02``,
    ``"p95"``) for a :class:`Hedge` of the policy's own with the default caps."""
    if value is None or isinstance(value, Hedge):
        return value
    if isinstance(value, bool):
        raise ConfigurationError(
            "hedge must be a delay ('20ms', 'p95') or a Hedge object, got a bool", option="hedge"
        )
    if isinstance(value, (str, int, float)) or hasattr(value, "total_seconds"):
        try:
            return Hedge(value)
        except ConfigurationError as exc:
            raise ConfigurationError(str(exc), option="hedge") from None
    raise ConfigurationError(
        f"hedge must be a delay ('20ms', 'p95') or a Hedge object, got {type(value).__name__}",
        option="hedge",
    )


# The race ----------------------------------------------------------------------------------------

Attempt = Callable[[], Awaitable[Any]]


async def hedged_async(
    policy: Policy[Any],
    state: RetryState,
    attempt: Attempt,
    number: int,
    tele: bool,
    observer: Observer | None,
) -> Any:
    """Attempt ``number`` of the retry loop, hedged (see the module documentation)."""
    hedge = policy._hedge
    latencies = policy._latencies
    assert hedge is not None and latencies is not None
    hedge.call_started()
    delay = hedge.delay_for(latencies)
    if delay is None:
        return await attempt()
    if running_loop() is not None:
        return await _InlineRace(policy, state, attempt, number, delay, tele, observer).run()
    race: _Race = _TrioRace()
    sent = [0]
    try:
        async with race:
            # Nothing but a cancellation leaves the race's body: trio would wrap an error
            # raised inside the nursery in an ExceptionGroup.
            ok, value = await _run(
                policy, state, race, attempt, number, delay, sent, tele, observer
            )
    finally:
        # Every attempt of the race has ended (the race waits for the cancelled ones): the
        # hedges it sent are no longer in flight, even those cancelled before they started.
        for _ in range(sent[0]):
            hedge.done()
    if not ok:
        raise value
    return value


async def _run(
    policy: Policy[Any],
    state: RetryState,
    race: _Race,
    attempt: Attempt,
    number: int,
    delay: float,
    sent: list[int],
    tele: bool,
    observer: Observer | None,
) -> tuple[bool, Any]:
    hedge = policy._hedge
    latencies = policy._latencies
    assert hedge is not None and latencies is not None
    race.start(attempt, 0)
    running = 1
    first_error: Exception | None = None
    may_hedge = True
    while True:
        outcome = await race.next(delay if may_hedge and sent[0] < hedge.max_hedges else None)
        if outcome is None:  # the delay passed without an answer
            reason = hedge.try_send(latencies, policy.plan.budget, _left(state))
            if reason is not None:
                may_hedge = False  # D3.14: one refusal ends this attempt's hedging
                if tele:
                    policy.emit(observer, "hedge.suppressed", attempt=number, reason=reason)
                continue
            sent[0] += 1
            running += 1
            if tele:
                policy.emit(observer, "hedge.sent", attempt=number, hedge=sent[0])
            race.start(attempt, sent[0])
            continue
        index, ok, value = outcome
        running -= 1
        if ok:
            if index:
                hedge._won()
                if tele:
                    policy.emit(observer, "hedge.won", attempt=number, hedge=index)
            return True, value  # leaving the race cancels the others
        if first_error is None:
            first_error = value
        if running == 0:
            # Every attempt started failed: a hedge is for slowness, failures are retry's.
            return False, first_error


def _left(state: RetryState) -> float:
    left = remaining()
    total = state.total_at
    if total is not None:
        left = min(left, total.when - _clock.now())
    return left


class _Race:
    """Attempts run as children; their outcomes arrive in order of completion."""

    async def __aenter__(self) -> _Race:
        raise NotImplementedError

    async def __aexit__(self, *exc: object) -> None:
        raise NotImplementedError

    def start(self, attempt: Attempt, index: int) -> None:
        raise NotImplementedError

    async def next(self, timeout: float | None) -> tuple[int, bool, Any] | None:
        raise NotImplementedError


async def _outcome(attempt: Attempt, index: int) -> tuple[int, bool, Any]:
    # The attempt's coroutine is made here, in the child: one cancelled before it ran is never
    # made (no "never awaited" coroutine).
    try:
        return index, True, await attempt()
    except Exception as exc:
        return index, False, exc


class _RaceBase:
    """What the asyncio and the thread race share: the attempt of the retry loop being raced,
    the policy's hedge and latency window, and the caps' bookkeeping — a hedge sent only when
    :meth:`Hedge.try_send` grants it, its events, and the places it took among the hedges in
    flight, given back once (:meth:`_give_back`) when the race's attempts have ended."""

    __slots__ = (
        "attempt",
        "delay",
        "hedge",
        "latencies",
        "number",
        "observer",
        "policy",
        "sent",
        "state",
        "tele",
    )

    def __init__(
        self,
        policy: Policy[Any],
        state: RetryState,
        attempt: Any,
        number: int,
        delay: float,
        tele: bool,
        observer: Observer | None,
    ) -> None:
        hedge = policy._hedge
        latencies = policy._latencies
        assert hedge is not None and latencies is not None
        self.policy = policy
        self.state = state
        self.attempt = attempt
        self.number = number
        self.delay = delay
        self.tele = tele
        self.observer = observer
        self.hedge = hedge
        self.latencies = latencies
        self.sent = 0

    def _send(self, left: float) -> bool:
        """Take a place for the next hedge (``left``: the time the call has); on a refusal,
        ``hedge.suppressed`` and ``False`` — D3.14: one refusal ends this attempt's hedging."""
        reason = self.hedge.try_send(self.latencies, self.policy.plan.budget, left)
        if reason is not None:
            if self.tele:
                self.policy.emit(
                    self.observer, "hedge.suppressed", attempt=self.number, reason=reason
                )
            return False
        self.sent += 1
        if self.tele:
            self.policy.emit(self.observer, "hedge.sent", attempt=self.number, hedge=self.sent)
        return True

    def _won(self, index: int) -> None:
        """Hedge ``index`` (not the primary) won the race."""
        self.hedge._won()
        if self.tele:
            self.policy.emit(self.observer, "hedge.won", attempt=self.number, hedge=index)

    def _give_back(self) -> None:
        for _ in range(self.sent):
            self.hedge.done()


class _InlineRace(_RaceBase):
    """asyncio: the primary runs in the caller's own task (a call that needs no hedge costs a
    timer, not a task); a hedge is a task started by that timer. A hedge that succeeds while
    the primary still runs cancels the caller's task and the race takes the cancellation back
    (``uncancel``, as ``asyncio.timeout`` does), so any other cancellation — the caller's
    deadline — still goes through."""

    __slots__ = ("hedges", "primary_running", "self_cancelled", "task", "timer", "winner")

    attempt: Attempt

    def __init__(
        self,
        policy: Policy[Any],
        state: RetryState,
        attempt: Attempt,
        number: int,
        delay: float,
        tele: bool,
        observer: Observer | None,
    ) -> None:
        super().__init__(policy, state, attempt, number, delay, tele, observer)
        import asyncio

        self.task = asyncio.current_task()
        self.hedges: list[asyncio.Task[tuple[int, bool, Any]]] = []
        self.winner: tuple[int, Any] | None = None
        self.primary_running = True
        self.self_cancelled = False
        self.timer: asyncio.TimerHandle | None = None

    async def run(self) -> Any:
        import asyncio

        loop = asyncio.get_running_loop()
        # The timer's callback runs in a copy of this context: the hedge sees every deadline.
        self.timer = loop.call_later(self.delay, self._fire)
        try:
            try:
                value = await self.attempt()
            except asyncio.CancelledError:
                self.primary_running = False
                if self.self_cancelled:
                    self.self_cancelled = False
                    assert self.task is not None
                    if self.task.uncancel() == 0 and self.winner is not None:
                        return self._value(self.winner)
                raise
            except Exception as exc:
                self.primary_running = False
                self._take_back()
                if self.winner is not None:
                    return self._value(self.winner)
                return await self._after_primary_failed(exc)
            self.primary_running = False
            self._take_back()
            return value
        finally:
            await self._end()

    def _take_back(self) -> None:
        # A hedge won and cancelled this task, but the primary ended without seeing it (its
        # code swallowed the cancellation): the request is taken back.
        if self.self_cancelled:
            self.self_cancelled = False
            assert self.task is not None
            self.task.uncancel()

    async def _after_primary_failed(self, exc: Exception) -> Any:
        """The primary failed: the hedges in flight may still answer; else its error."""
        import asyncio

        pending = {t for t in self.hedges if not t.done()}
        done = [t for t in self.hedges if t.done()]
        while True:
            for task in done:
                if not task.cancelled():
                    index, ok, value = task.result()
                    if ok:
                        return self._value((index, value))
            if not pending:
                raise exc
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done = sorted(finished, key=lambda t: self.hedges.index(t))

    def _value(self, winner: tuple[int, Any]) -> Any:
        index, value = winner
        self._won(index)
        return value

    async def _end(self) -> None:
        import asyncio

        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        pending = [t for t in self.hedges if not t.done()]
        for task in pending:
            task.cancel()
        try:
            if pending:
                # The losers end before the call returns: no attempt outlives its call.
                await asyncio.wait(pending)
        finally:
            self._give_back()

    def _fire(self) -> None:
        """The hedging delay passed with the primary still running: send a hedge, if allowed."""
        import asyncio

        self.timer = None
        if not self.primary_running or self.winner is not None:
            return
        if not self._send(_left(self.state)):
            return  # no timer set again: the refusal ends this attempt's hedging
        task = asyncio.get_running_loop().create_task(_outcome(self.attempt, self.sent))
        task.add_done_callback(self._hedge_done)
        self.hedges.append(task)
        if self.sent < self.hedge.max_hedges:
            self.timer = asyncio.get_running_loop().call_later(self.delay, self._fire)

    def _hedge_done(self, task: asyncio.Task[tuple[int, bool, Any]]) -> None:
        if task.cancelled() or self.winner is not None:
            return
        index, ok, value = task.result()
        if not ok:
            return
        self.winner = (index, value)
        if self.primary_running and self.task is not None:
            # First success wins: stop the primary (this very task) where it waits.
            self.self_cancelled = True
            self.task.cancel()


class _TrioRace(_Race):
    def __init__(self) -> None:
        trio = sys.modules["trio"]
        self._trio = trio
        self._send, self._receive = trio.open_memory_channel(math.inf)
        self._nursery_manager = trio.open_nursery()
        self._nursery: Any = None

    async def __aenter__(self) -> _Race:
        self._nursery = await self._nursery_manager.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._nursery.cancel_scope.cancel()
        await self._nursery_manager.__aexit__(*exc)

    def start(self, attempt: Attempt, index: int) -> None:
        self._nursery.start_soon(self._report, attempt, index)

    async def _report(self, attempt: Attempt, index: int) -> None:
        self._send.send_nowait(await _outcome(attempt, index))

    async def next(self, timeout: float | None) -> tuple[int, bool, Any] | None:
        if timeout is None:
            outcome: tuple[int, bool, Any] = await self._receive.receive()
            return outcome
        with self._trio.move_on_after(timeout):
            outcome = await self._receive.receive()
            return outcome
        return None


# The sync race ------------------------------------------------------------------------------------

SyncAttempt = Callable[[], Any]


def hedged_sync(
    policy: Policy[Any],
    state: RetryState,
    attempt: SyncAttempt,
    number: int,
    tele: bool,
    observer: Observer | None,
) -> Any:
    """Attempt ``number`` of the sync retry loop, hedged (see :class:`_ThreadRace`)."""
    hedge = policy._hedge
    latencies = policy._latencies
    assert hedge is not None and latencies is not None
    hedge.call_started()
    delay = hedge.delay_for(latencies)
    if delay is None:
        return attempt()  # no delay learned yet: nothing to race, the caller runs it
    return _ThreadRace(policy, state, attempt, number, delay, tele, observer).run()


async def hedged_threads_async(
    policy: Policy[Any],
    state: RetryState,
    attempt: SyncAttempt,
    number: int,
    tele: bool,
    observer: Observer | None,
) -> Any:
    """Attempt ``number`` of a coroutine's retry loop over a sync callable marked with
    :func:`race_in_threads`: its attempts race in threads while the coroutine awaits."""
    hedge = policy._hedge
    latencies = policy._latencies
    assert hedge is not None and latencies is not None
    hedge.call_started()
    delay = hedge.delay_for(latencies)
    race = _ThreadRace(
        policy, state, attempt, number, 0.0 if delay is None else delay, tele, observer
    )
    if delay is None:
        race.may_hedge = False  # no delay learned yet: one attempt, still off the event loop
    return await race.arun()


_IN_THREADS: Final = "_timebound_race_in_threads"


def race_in_threads(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (sync), marked so that a hedged policy's ``execute`` races its attempts in threads
    while the coroutine awaits (the event loop goes on); a Constellation sync module with
    ``hedge`` is called this way (D3.16). Its name and signature stay ``fn``'s (cache keys)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    setattr(call, _IN_THREADS, True)
    return call


def races_in_threads(fn: Callable[..., Any]) -> bool:
    return getattr(fn, _IN_THREADS, False) is True


class _ThreadRace(_RaceBase):
    """sync: every attempt of the race — the primary too — runs in a thread the race starts and
    owns, while the caller's thread waits for the first success.

    The primary cannot run in the caller's thread: a sync call cannot be interrupted, so a
    caller running a slow primary could return a hedge's answer only once the primary ended,
    and the hedge would win nothing. Waiting instead, the caller returns the first success as
    it arrives, stops waiting at its own deadline (and the policy's total budget), and sends
    hedges when the delay passes. A thread per attempt, not a pool: the race is the only owner,
    a call that no hedge follows costs one thread start, and no thread is kept for later.

    When the caller leaves (a winner, its deadline, an error), every attempt still running is
    a loser: it is asked to stop the way sync code is (:func:`cut_short`: its deadline becomes
    now, so its checkpoints raise and its clamped clients send nothing more) and it stays bound
    by its own attempt timeout and the caller's deadline. Its outcome is dropped unread; its
    place among the hedges in flight (``max_concurrent``) is given back only when the last
    attempt of the race has ended.
    """

    __slots__ = (
        "changed",
        "decided",
        "errors",
        "lock",
        "loop",
        "may_hedge",
        "next_at",
        "released",
        "running",
        "scopes",
        "wake",
        "winner",
    )

    attempt: SyncAttempt

    def __init__(
        self,
        policy: Policy[Any],
        state: RetryState,
        attempt: SyncAttempt,
        number: int,
        delay: float,
        tele: bool,
        observer: Observer | None,
    ) -> None:
        super().__init__(policy, state, attempt, number, delay, tele, observer)
        self.lock = threading.Lock()
        self.changed = threading.Event()  # an attempt ended (set under the lock)
        self.running = 0
        self.decided = False  # the caller left: outcomes arriving now are dropped
        self.released = False
        self.winner: tuple[int, Any] | None = None
        self.errors: dict[int, BaseException] = {}
        self.scopes: dict[int, tuple[CancelScope, contextvars.Context]] = {}
        self.next_at = _clock.now() + delay  # when the next hedge is due
        self.may_hedge = True
        self.loop: asyncio.AbstractEventLoop | None = None  # a coroutine's race: its loop
        self.wake: asyncio.Event | None = None

    def run(self) -> Any:
        """The race for a sync caller: its thread waits (``_clock.wait``)."""
        try:
            with self._total():
                self._start(0)
                while True:
                    done, value = self._step()
                    if done:
                        return value
                    _clock.wait(self.changed, value)
        finally:
            self._leave()

    async def arun(self) -> Any:
        """The race for a coroutine (asyncio): the event loop goes on while it waits, and a
        cancellation of the caller (its deadline, its run failing) ends the race at once."""
        import asyncio

        loop = asyncio.get_running_loop()
        self.loop = loop
        self.wake = asyncio.Event()
        try:
            with self._total():
                self._start(0)
                while True:
                    self.wake.clear()
                    done, value = self._step()
                    if done:
                        return value
                    # asyncio.timeout, not wait_for (D12.1: no cancellation swallowed).
                    waiting = asyncio.timeout(value)
                    try:
                        async with waiting:
                            await self.wake.wait()
                    except TimeoutError:
                        if not waiting.expired():
                            raise
        finally:
            self._leave()

    def _total(self) -> AbstractContextManager[Any]:
        # The caller stops waiting at the total budget too, reported as the total's.
        total_at = self.state.total_at
        if total_at is None:
            return nullcontext()
        return fail_at(total_at, source="total", what=self.policy.name)

    def _step(self) -> tuple[bool, Any]:
        """Look at the race: ``(True, the winner's value)``, or ``(False, how long to wait)``
        (``None``: until an attempt ends); raises the race's error. Sends a hedge when due."""
        while True:
            with self.lock:
                self.changed.clear()
                winner = self.winner
                running = self.running
            if winner is not None:
                index, value = winner
                if index:
                    self._won(index)
                return True, value
            late = current_bound_error(self.policy.name)
            if late is not None:
                raise late  # the caller's own bound, even when it is what made them all fail
            if running == 0:
                # Every attempt started failed: the primary's error (D3.14), as under asyncio.
                raise self.errors[min(self.errors)]
            now = _clock.now()
            hedging = self.may_hedge and self.sent < self.hedge.max_hedges
            if hedging and now >= self.next_at:
                if not self._send(remaining()):
                    self.may_hedge = False
                    continue
                self._start(self.sent)
                self.next_at = now + self.delay
                continue
            until = remaining()
            if hedging:
                until = min(until, self.next_at - now)
            return False, None if until == math.inf else until

    def _start(self, index: int) -> None:
        with self.lock:
            self.running += 1
        # The attempt sees the caller's deadlines (a copy of its context, as asyncio tasks do).
        ctx = contextvars.copy_context()
        thread = threading.Thread(
            target=ctx.run,
            args=(self._attempt_thread, index, ctx),
            name=f"timebound hedge race {self.policy.name} #{index}",
            daemon=True,  # a loser that never checks must not keep the process alive
        )
        try:
            thread.start()
        except BaseException:
            with self.lock:
                self.running -= 1
            raise

    def _attempt_thread(self, index: int, ctx: contextvars.Context) -> None:
        # The frame the race cuts short when this attempt loses; no deadline of its own.
        scope = CancelScope(raise_on_expiry=False, what=f"{self.policy.name} (lost the race)")
        ok = False
        value: Any = None
        try:
            with scope:
                with self.lock:
                    self.scopes[index] = (scope, ctx)
                    if self.decided:
                        cut_short(scope, ctx)  # lost before it began
                try:
                    value = self.attempt()
                    ok = True
                except BaseException as exc:  # reported to the caller, never lost in a thread
                    value = exc
        finally:
            with self.lock:
                self.running -= 1
                self.scopes.pop(index, None)
                if not self.decided:
                    if ok:
                        if self.winner is None:
                            self.winner = (index, value)
                    else:
                        self.errors[index] = value
                    self.changed.set()
                    if self.loop is not None and self.wake is not None:
                        try:
                            self.loop.call_soon_threadsafe(self.wake.set)
                        except RuntimeError:  # the loop is closed: nobody waits any more
                            pass
                elif self.running == 0:
                    self._release()

    def _leave(self) -> None:
        """The caller leaves: the attempts still running lost; they are asked to stop."""
        with self.lock:
            self.decided = True
            for scope, ctx in self.scopes.values():
                cut_short(scope, ctx)
            if self.running == 0:
                self._release()

    def _release(self) -> None:
        # Under the lock, once: the race's last attempt has ended and the caller has left.
        if self.released:
            return
        self.released = True
        self._give_back()
