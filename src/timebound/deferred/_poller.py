"""The poller: the host's cadence for deferred operations (D7.3, D7.6).

Poll times live in the registry's rows, so a restart re-arms every pending operation from
storage. The loop never polls before a row's ``next_poll_ms``; it starts at most
``poll_rate_cap`` polls in any one-second window and at most ``per_module_inflight`` at once per
connector module, and an operator's :meth:`Poller.poll_now` goes through the same gates.
Transient failures (a timeout, a refused connection, a 5xx) leave the status alone, spend an
attempt and back off with the retry decision core's exponential delay.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
from collections.abc import Mapping
from typing import Any, Protocol

from .._core import _clock
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError, DeadlineExceeded, TimeboundError
from .._core._renamed import Renamed, renamed
from .._core._scopes import fail_after
from .._store import Detached, Wake, run_rounds, sleep_until_set, wake_delay
from ..telemetry._tracing import poll_span
from ._contract import TERMINAL
from ._registry import Operation, Registry, StatusOutcome, now_ms

__all__ = ["Connector", "PollRefused", "Poller", "TransientPollError"]

_log = logging.getLogger("timebound.deferred")

#: The shortest time between two rounds of the loop (see Poller.run): at thousands of polls a
#: second, a round per finished poll cost as much CPU as the polls; a poll may start up to the
#: gap late, never early.
_ROUND_GAP_S = 0.005


class TransientPollError(TimeboundError):
    """A poll that failed for a reason that may pass (overload, a 5xx, a refused connection).

    ``code`` is the stable code recorded in the history (``poll-timeout``, ``poll-5xx``, ...).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.code, str(self)))


class PollRefused(Exception):
    """An answer the host will not take from a connector, whatever a later poll says: an href
    to another origin (``foreign-href``, D7.12), an answer past the byte cap (``too-large``,
    D6.21). The operation fails with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Connector(Protocol):
    """How the host reaches the owner of an operation (see :class:`HttpConnector`)."""

    async def status(self, op: Operation) -> object:
        """The operation's ``deferred-operation-status.v1`` document (any JSON value: the
        registry checks it); raise :class:`TransientPollError` for a failure that may pass."""
        ...

    async def cancel(self, op: Operation) -> object:
        """Ask the owner to cancel; return the status document it answers with."""
        ...


class _RateWindow:
    """At most ``cap`` starts in any window of one second (a sliding log of start instants).

    Written by hand: the limiters in :mod:`timebound.policies` bound concurrency, not a rate
    over a sliding window, and this one must be exact so a test can assert it is never exceeded.
    A poll is admitted with :meth:`reserve` when its task is created and logged with :meth:`take`
    at the instant its connector is called, one loop turn or more later: logging the admission
    instant instead let a stalled loop bunch more than ``cap`` calls into one second. Admission
    counts the reservations, so every take finds room: at any time, the starts of the last
    second plus the reservations are at most ``cap``.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._starts: collections.deque[float] = collections.deque()
        self._reserved = 0

    def wait_s(self) -> float:
        """0 when a start may be admitted now, else how long until one may (at most)."""
        now = _clock.now()
        starts = self._starts
        while starts and now - starts[0] >= 1.0:
            starts.popleft()
        over = len(starts) + self._reserved - self.cap
        if over < 0:
            return 0.0
        # Room opens when the (over+1)-th oldest start leaves; reservations not yet taken are
        # taken within a loop turn or two, and leave a second after that.
        return starts[over] + 1.0 - now if over < len(starts) else 1.0

    def room(self) -> int:
        """How many starts the window admits now."""
        return self.cap - len(self._starts) - self._reserved if self.wait_s() == 0 else 0

    def reserve(self) -> None:
        self._reserved += 1

    def take(self) -> None:
        """A reserved start happens now."""
        self._reserved -= 1
        self._starts.append(_clock.now())

    def release(self) -> None:
        """A reserved start that will not happen."""
        self._reserved -= 1


class Poller:
    """Polls the registry's operations through their modules' connectors.

    ``async with Poller(registry, {"module": connector}):`` runs the loop in a task; it marks
    operations expired at start-up without polling them when their lifetime ended while the
    host was down, then keeps every poll on time. ``poll_timeout`` (a duration) bounds one
    status call.
    """

    @renamed(poll_timeout_s=Renamed("poll_timeout"))
    def __init__(
        self,
        registry: Registry,
        connectors: Mapping[str, Connector],
        *,
        poll_timeout: Duration = 10.0,
    ) -> None:
        seconds = to_seconds(poll_timeout, option="poll_timeout", allow_zero=False)
        if math.isinf(seconds):
            raise ConfigurationError(
                "poll_timeout must be a finite duration: a status call that never ends would "
                "hold its operation's slot for ever",
                option="poll_timeout",
            )
        #: How long one status call may take (seconds).
        self.poll_timeout = seconds
        self.registry = registry
        self.connectors = dict(connectors)
        policy = registry.policy
        self._window = _RateWindow(policy.poll_rate_cap)
        self._inflight: collections.Counter[str] = collections.Counter()
        self._polling: set[str] = set()
        self._wake = Wake()  # the loop's alone: only the loop clears it
        # Set when a poll ends (a slot frees): what an operator's "poll now" waits for. Its own
        # event, because clearing the loop's while waiting could swallow a wake-up the loop needs
        # (the lost-resume bug of clearing after a round, by another path).
        self._slot_freed = asyncio.Event()
        # The loop, the polls in flight and the answers' writer, cancelled together by stop().
        self._tasks = Detached()
        # Answers waiting to be written, and the task writing them (see _record).
        self._answers: list[tuple[str, object, asyncio.Future[StatusOutcome]]] = []
        self._writer: asyncio.Task[None] | None = None
        #: How many polls started (for tests and metrics).
        self.polls_started = 0

    # Lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Poller:
        self.registry.on_change = self._changed
        await self.registry.expire_due(startup=True)
        self._tasks.spawn(self.run(), name="timebound-deferred-poller")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop the loop and every poll in flight (their rows stay due: nothing is lost)."""
        await self._tasks.cancel()
        self.registry.on_change = None

    async def run(self) -> None:
        """The loop (``__aenter__`` runs it in a task): rounds of :meth:`step`, asleep between
        them until the next stored instant or a wake-up (the store's wake loop, D12.1). The wake
        is cleared before a round, never after it: a poll that ends while the round still runs
        (its own last query) sets it again, and the resume it calls for is not lost (cleared
        after, the loop slept forever with a completed operation unresumed: found by 200 kill -9
        runs on PostgreSQL)."""
        await run_rounds(self._wake, self._round, min_gap=_ROUND_GAP_S)

    async def _round(self) -> float | None:
        try:
            return await self.step()
        except Exception as exc:  # a failed round (a lost connection): log, pause, retry
            _log.warning("deferred poller round failed (%s); retrying", type(exc).__name__)
            return 1.0

    def _changed(self, at_ms: int | None) -> None:
        # The registry's callback: wake the loop unless it already sleeps until before ``at_ms``
        # (its round then finds the change through next_instant).
        self._wake.news_at(at_ms)

    async def step(self) -> float | None:
        """One round: expire, resume, start due polls. Returns how long to wait at most."""
        reg = self.registry
        await reg.expire_due()
        await reg.resume_due()
        # Fetch no more rows than could start now (plus the ones in flight, still due).
        policy = reg.policy
        slots = sum(max(0, policy.per_module_inflight - self._inflight[m]) for m in self.connectors)
        room = min(slots, self._window.room())
        if room == 0:
            wait = self._window.wait_s()
            return wait if wait > 0 else None  # a poll that ends wakes the loop
        batch = room + len(self._polling)
        at = now_ms()
        due = await reg.due_polls(list(self.connectors), batch)
        started = 0
        for op in due:
            if op.id in self._polling:
                continue
            assert op.module is not None
            if self._inflight[op.module] >= reg.policy.per_module_inflight:
                continue  # a poll that ends wakes the loop
            wait = self._window.wait_s()
            if wait > 0:
                return wait
            self._start(op)
            started += 1
        if started and len(due) == batch:
            return 0.0  # more may be due than one batch holds
        nxt = await reg.next_instant(at)
        return None if nxt is None else wake_delay(nxt)

    # Polls -------------------------------------------------------------------------------

    def _start(self, op: Operation) -> None:
        assert op.module is not None
        self._window.reserve()
        self.polls_started += 1
        self._inflight[op.module] += 1
        self._polling.add(op.id)
        self._tasks.spawn(self._poll(op), name=f"timebound-deferred-poll-{op.id}")

    async def _poll(self, op: Operation) -> StatusOutcome:
        assert op.module is not None
        taken = False
        try:
            connector = self.connectors[op.module]
            try:
                with fail_after(self.poll_timeout):
                    self._window.take()  # the start the cap counts: the connector's call
                    taken = True
                    with poll_span(op.id, op.traceparent):  # D10.6
                        doc = await connector.status(op)
            except TransientPollError as exc:  # the connector maps its transport's failures
                return await self._failed(op, exc.code)
            except PollRefused as exc:
                return await self.registry.refuse(op.id, exc.code, str(exc))
            except DeadlineExceeded:  # the poll's own bound above
                return await self._failed(op, "poll-timeout")
            except Exception:  # a broken connector backs off like a failing one, never spins
                return await self._failed(op, "poll-error")
            return await self._record(op.id, doc)
        finally:
            if not taken:
                self._window.release()
            self._inflight[op.module] -= 1
            self._polling.discard(op.id)
            self._wake.set()
            self._slot_freed.set()

    async def _record(self, op_id: str, doc: object) -> StatusOutcome:
        # Answers that arrive in the same loop turn are written by one task in one transaction
        # (Registry.polled_many): at 10,000 pending, a commit per poll was most of a poll's cost
        # once validation got cheap. The row's next poll is written before this poll leaves
        # ``_polling``, so the loop cannot start a second poll of it meanwhile.
        future: asyncio.Future[StatusOutcome] = asyncio.get_running_loop().create_future()
        self._answers.append((op_id, doc, future))
        if self._writer is None:
            self._writer = self._tasks.spawn(self._write_answers())
        return await future

    async def _write_answers(self) -> None:
        batch: list[tuple[str, object, asyncio.Future[StatusOutcome]]] = []
        try:
            while self._answers:
                batch, self._answers = self._answers, []
                try:
                    outcomes = await self.registry.polled_many([(i, d) for i, d, _ in batch])
                except Exception:
                    # The round was rolled back: write each answer alone, so one that cannot
                    # be written fails its own poll only.
                    for op_id, doc, future in batch:
                        try:
                            # Stored without resuming: a resumer that failed the round
                            # must not keep the answer out; resume_due retries it (D7.10).
                            outcome = await self.registry.polled(op_id, doc, resume=False)
                            _settle(future, outcome)
                        except Exception as exc:
                            if not future.done():
                                future.set_exception(exc)
                else:
                    for (_, _, future), outcome in zip(batch, outcomes, strict=True):
                        _settle(future, outcome)
                batch = []
        finally:
            self._writer = None
            for _, _, future in (*batch, *self._answers):
                future.cancel()  # stopped mid-write: the polls are cancelled with it
            self._answers = []

    async def _failed(self, op: Operation, code: str) -> StatusOutcome:
        # The same stretching cadence as a successful poll: a failing connector is not asked
        # more often than a slow one.
        delay = self.registry.policy.poll_delay_s(op.retry_after_s, op.attempts + 1)
        return await self.registry.poll_failed(op.id, delay, code)

    async def poll_now(self, op_id: str) -> StatusOutcome:
        """An operator's "poll now": under the same rate cap and module limit as the loop."""
        op = await self.registry.get(op_id)
        if op is None:
            return StatusOutcome(False, "not-found")
        if op.terminal:
            return StatusOutcome(False, "terminal")
        if op.module not in self.connectors:
            return StatusOutcome(False, "no-connector")
        while (
            op.id in self._polling
            or self._inflight[op.module] >= self.registry.policy.per_module_inflight
            or self._window.wait_s() > 0
        ):
            wait = self._window.wait_s()
            self._slot_freed.clear()
            await sleep_until_set(self._slot_freed, wait if wait > 0 else None)
        self._window.reserve()
        self.polls_started += 1
        self._inflight[op.module] += 1
        self._polling.add(op.id)
        return await self._poll(op)

    async def cancel(self, op_id: str) -> dict[str, Any]:
        """Cancel an operation: ask its connector when it offers ``cancel_href`` (D7).

        Returns the operator view after the attempt. A terminal operation is returned
        unchanged; one without ``cancel_href`` keeps its state and shows its stored reason.
        """
        op = await self.registry.get(op_id)
        if op is None:
            raise LookupError(f"no deferred operation {op_id!r}")
        if op.status in TERMINAL or op.cancel_href is None or op.module not in self.connectors:
            return op.describe()
        await self.registry.mark_cancel_requested(op_id)
        try:
            with fail_after(self.poll_timeout):
                doc = await self.connectors[op.module].cancel(op)
        except PollRefused as exc:
            await self.registry.refuse(op_id, exc.code, str(exc))
        else:
            await self.registry.apply_status(op_id, doc)
        fresh = await self.registry.get(op_id)
        assert fresh is not None
        return fresh.describe()


def _settle(future: asyncio.Future[StatusOutcome], outcome: StatusOutcome) -> None:
    if not future.done():  # its poll may have been cancelled meanwhile
        future.set_result(outcome)
