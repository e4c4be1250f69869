"""Deadline-aware admission control: the queue discipline and limiters (DECISIONS D9).

Framework-free and clock-injected: every method takes ``now`` (seconds on the scheduling clock),
so the whole discipline is unit-tested on virtual time. The ASGI, WSGI and gRPC adapters own the
waiting (a future, a thread event) and call in here to decide.

The rules, in the order a request meets them:

1. **Hopeless requests are answered at once.** A request whose remaining budget is below its
   route's baseline service time (:class:`RouteEstimates`: its handler time when nothing queues
   inside the handler) gets the "Deadline expired" answer (498, D9.1); the handler never runs.
   Except as a probe: when nothing has refreshed the route's estimate for an interval, one such
   request with budget left runs in a free slot, and its time replaces the estimate (D9.5).
   userver allows this early answer: the server "estimates that it is unable to respond in time".
2. **Under the concurrency limit, a request runs.** The limit is fixed (:class:`FixedLimit`) or
   adaptive (:class:`AIMDLimit`, additive increase while the limit is in use, multiplicative
   decrease on congestion — the AIMD limiter of Netflix's concurrency-limits). Congestion is a
   request that ended late or slower than its threshold, or a route whose recent handler time
   exceeds ``tolerance`` times its baseline (requests queue inside the handler, D9.4); the limit
   comes down at most once per window.
3. **Otherwise it waits in a bounded queue.** Critical requests are served before the others. The
   queue is controlled by queue delay, not length (CoDel as in Facebook's "Fail at Scale"): while
   the queue has emptied within the last interval (``interval``, at least ``services`` handler
   times) it is FIFO and a request may wait up to the interval; once it has stayed non-empty for
   longer (a *standing* queue) the server is overloaded, a request without a deadline may wait
   only ``target``, and service becomes newest-first (adaptive LIFO), because the newest request
   is the one whose caller is most likely still waiting. A request that waits too long, or meets
   a full queue, is shed with 503 + ``Retry-After``.
4. While waiting, a request that becomes hopeless (rule 1) is answered 498 at that instant.

Requests without a deadline are ordered exactly like the others — a deadline never buys priority,
it only makes a request sheddable as hopeless — so they are never starved by requests with one
(D9.2); they obey the same concurrency limit and queue-delay bounds.
"""

from __future__ import annotations

import bisect
import enum
import math
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from .._core._errors import ConfigurationError
from ..telemetry._events import counters, emit, enabled

__all__ = [
    "AIMDLimit",
    "Admission",
    "AdmissionConfig",
    "FixedLimit",
    "Limit",
    "Verdict",
    "RouteEstimates",
    "Ticket",
]

#: Upper bounds (seconds) of the queue-delay histogram buckets; the last bucket is +inf.
QUEUE_DELAY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Verdict(enum.Enum):
    """What becomes of a request at the admission layer."""

    ADMIT = "admit"  #: run the handler now; the caller must :meth:`Admission.release` afterwards
    QUEUED = "queued"  #: wait for a later outcome (the ticket's ``wake`` is called with it)
    HOPELESS = "deadline"  #: answer 498 + the expired marker (D9.1)
    OVERLOADED = "overload"  #: answer 503 + ``Retry-After`` (D9.1)


class Limit(Protocol):
    """A concurrency limit: read :attr:`value`, fed one sample per finished request.

    ``dropped``: the request ended after its deadline, or its route shows queueing inside the
    handler (both are congestion); ``inflight``: requests in flight when it finished, itself
    included."""

    @property
    def value(self) -> int: ...

    def sample(self, service_time: float, dropped: bool, inflight: int) -> None: ...


def _positive(option: str, value: float, *, integer: bool = False) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int | float) or not value > 0
    if not bad and integer and not isinstance(value, int):
        bad = True
    if bad or (isinstance(value, float) and not math.isfinite(value)):
        kind = "a positive int" if integer else "a positive finite number"
        raise ConfigurationError(f"{option} must be {kind}, not {value!r}", option=option)


class FixedLimit:
    """A concurrency limit users choose: ``FixedLimit(32)``."""

    __slots__ = ("_value",)

    def __init__(self, value: int) -> None:
        _positive("limit", value, integer=True)
        self._value = value

    @property
    def value(self) -> int:
        return self._value

    def sample(self, service_time: float, dropped: bool, inflight: int) -> None:
        """A fixed limit ignores samples."""


class AIMDLimit:
    """Additive increase, multiplicative decrease (Netflix concurrency-limits' AIMD limiter).

    A request that ends well while at least half the limit was in use raises the limit by one (an
    idle server learns nothing about its capacity); a dropped one — :class:`Admission` reports a
    request as dropped when it ended late or its route shows queueing inside the handler
    (``AdmissionConfig.tolerance``) — or one that took longer than ``slow`` seconds multiplies
    the limit by ``backoff``. The limit
    stays within ``[minimum, maximum]``.
    """

    __slots__ = ("_value", "backoff", "maximum", "minimum", "slow")

    def __init__(
        self,
        initial: int = 16,
        *,
        minimum: int = 1,
        maximum: int = 1000,
        backoff: float = 0.9,
        slow: float | None = None,
    ) -> None:
        for option, value in (("initial", initial), ("minimum", minimum), ("maximum", maximum)):
            _positive(option, value, integer=True)
        if not minimum <= initial <= maximum:
            raise ConfigurationError(
                f"need minimum <= initial <= maximum, got {minimum}, {initial}, {maximum}",
                option="initial",
            )
        if isinstance(backoff, bool) or not isinstance(backoff, float | int) or not 0 < backoff < 1:
            raise ConfigurationError(
                f"backoff must be a number in (0, 1), not {backoff!r}", option="backoff"
            )
        if slow is not None:
            _positive("slow", slow)
        self._value = float(initial)
        self.minimum = minimum
        self.maximum = maximum
        self.backoff = float(backoff)
        self.slow = slow

    @property
    def value(self) -> int:
        return int(self._value)

    def sample(self, service_time: float, dropped: bool, inflight: int) -> None:
        if dropped or (self.slow is not None and service_time > self.slow):
            self._value = max(float(self.minimum), math.floor(self._value * self.backoff))
        elif inflight * 2 >= self._value:
            self._value = min(float(self.maximum), self._value + 1.0)


class RouteEstimates:
    """Expected service time per route: an EWMA of recent handler times, and its baseline.

    The *baseline* is the route's service time when nothing queues inside the handler. It
    follows the EWMA down at once, and up only with requests that started alone (no other
    request in flight: nothing inside the server can have made them wait), by ``alpha`` of the
    gap. So a run of slow requests caused by the server's own concurrency (handlers waiting for
    a lock, a core, a connection) shows as the EWMA rising well above the baseline, while a real
    change of the route's cost is learnt as soon as requests run alone again — which a
    shrinking concurrency limit ensures.

    Route keys come from requests, so the table is bounded: past ``max_routes`` the least
    recently seen route is forgotten (a hostile client inventing paths costs memory, never
    unbounded memory). A route never seen has no estimate and is never shed as hopeless.
    """

    __slots__ = ("_alpha", "_max", "_table")

    def __init__(self, *, alpha: float = 0.2, max_routes: int = 1024) -> None:
        if isinstance(alpha, bool) or not isinstance(alpha, float | int) or not 0 < alpha <= 1:
            raise ConfigurationError(f"alpha must be in (0, 1], not {alpha!r}", option="alpha")
        _positive("max_routes", max_routes, integer=True)
        self._alpha = float(alpha)
        self._max = max_routes
        # route -> [EWMA, baseline, when it was last learnt or probed (-inf: given by hand)]
        self._table: OrderedDict[str, list[float]] = OrderedDict()

    def get(self, route: str) -> float:
        """The recent service time of ``route`` in seconds, queueing included (0.0: unknown)."""
        entry = self._table.get(route)
        return 0.0 if entry is None else entry[0]

    def baseline(self, route: str) -> float:
        """The route's service time without queueing inside the handler (0.0 when unknown)."""
        entry = self._table.get(route)
        return 0.0 if entry is None else entry[1]

    def observe(
        self,
        route: str,
        seconds: float,
        *,
        alone: bool = True,
        now: float | None = None,
        fresh: bool = False,
    ) -> None:
        """Learn one handler time; ``alone``: the request started with no other in flight;
        ``now``: when it finished (an estimate learnt without it never goes stale); ``fresh``:
        it replaces the estimate (a probe of a stale one, :meth:`stale`)."""
        seen = -math.inf if now is None else now
        entry = self._table.get(route)
        if entry is None or fresh:
            self._table[route] = [seconds, seconds, seen]
            self._table.move_to_end(route)
            if len(self._table) > self._max:
                self._table.popitem(last=False)
            return
        ewma = entry[0] + self._alpha * (seconds - entry[0])
        base = entry[1]
        if alone and seconds > base:
            # Only a request that ran alone shows the route's own cost. Letting the others move
            # it too, even by a hundredth, let the baseline creep up with the queueing it is
            # there to detect (goodput at 2x load fell from 0.98 to 0.8 of capacity, simulated).
            base += self._alpha * (seconds - base)
        entry[0] = ewma
        entry[1] = min(base, ewma)
        entry[2] = max(entry[2], seen)
        self._table.move_to_end(route)

    def stale(self, route: str, now: float, age: float) -> bool:
        """The route's estimate was learnt (or last probed) more than ``age`` seconds ago.

        An estimate nothing refreshes can shut a route for good: once every request is judged
        hopeless by it, none runs, and none can show that the route got faster again.
        """
        entry = self._table.get(route)
        return entry is not None and entry[2] > -math.inf and now - entry[2] > age

    def probed(self, route: str, now: float) -> None:
        """A request was let in to refresh the estimate: the next probe waits ``age`` again."""
        entry = self._table.get(route)
        if entry is not None:
            entry[2] = now

    def queueing(self, route: str, tolerance: float) -> bool:
        """The route's recent service time exceeds ``tolerance`` times its baseline."""
        entry = self._table.get(route)
        return entry is not None and entry[0] > tolerance * entry[1]


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """The knobs of :class:`Admission`, validated once. Defaults are safe for most services.

    ``max_queue``: waiting requests beyond the running ones (a full queue sheds with 503).
    ``target`` / ``interval``: CoDel's queue-delay bounds (seconds) for a standing / a normal queue.
    ``services``: the interval is at least this many of a route's service times (``interval``
    suits millisecond handlers; a 40 ms one would see a standing queue in any burst of three).
    ``retry_after``: the ``Retry-After`` seconds of a 503 answer (whole seconds on the wire).
    ``tolerance``: a route whose recent service time exceeds ``tolerance`` times its baseline
    (:class:`RouteEstimates`) is queueing inside the handler — admitted requests wait for
    something the server has too little of — and each request that ends so is reported to the
    limit as a drop, so an adaptive limit shrinks to the concurrency the server really has.
    ``None`` reports only requests that ended after their deadline.
    """

    max_queue: int = 128
    target: float = 0.005
    interval: float = 0.1
    retry_after: int = 1
    tolerance: float | None = 2.0
    services: float = 5.0

    def __post_init__(self) -> None:
        _positive("max_queue", self.max_queue, integer=True)
        _positive("target", self.target)
        _positive("interval", self.interval)
        _positive("retry_after", self.retry_after, integer=True)
        _positive("services", self.services)
        if self.tolerance is not None:
            _positive("tolerance", self.tolerance)
            if not self.tolerance > 1:
                raise ConfigurationError(
                    f"tolerance must exceed 1, not {self.tolerance!r}", option="tolerance"
                )
        if self.target > self.interval:
            raise ConfigurationError(
                f"target ({self.target}) must not exceed interval ({self.interval})",
                option="target",
            )


@dataclass(eq=False, slots=True)
class Ticket:
    """One request at the admission layer.

    ``deadline`` is the absolute instant on the scheduling clock (``None``: no deadline).
    ``wake`` is called (outside the admission lock) with the request's final outcome when a
    queued request is admitted or shed; adapters point it at a future or a thread event.
    """

    route: str
    deadline: float | None
    critical: bool = False
    wake: Callable[[Verdict], None] | None = None
    arrived: float = 0.0
    outcome: Verdict = Verdict.QUEUED
    admitted_at: float = field(default=0.0)
    #: Admitted with no other request in flight (its time is the handler's own).
    alone: bool = False
    #: Admitted although judged hopeless, to refresh a stale estimate (D9.5).
    probe: bool = False

    def hopeless(self, now: float, expected: float) -> bool:
        """Its remaining budget is below the expected service time (or nothing is left).

        Written as ``now >= deadline - expected``, the very instant :meth:`Admission.wait_until`
        returns, so a waiter woken at that instant always finds it hopeless.
        """
        return self.deadline is not None and now >= self.deadline - expected


class _Histogram:
    """Counts of queue delays per bucket of :data:`QUEUE_DELAY_BUCKETS` (last: +inf)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(QUEUE_DELAY_BUCKETS) + 1)
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(QUEUE_DELAY_BUCKETS, seconds)] += 1
        self.total += seconds


@dataclass(frozen=True, slots=True)
class AdmissionStats:
    """A snapshot for dashboards and tests."""

    limit: int
    inflight: int
    queued: int
    queue_delay_counts: tuple[int, ...]
    queue_delay_sum: float


class Admission:
    """The admission state of one server (owned by its middleware or interceptor; thread-safe).

    Adapters call :meth:`arrive` for each request; on :attr:`Verdict.ADMIT` they run the handler
    and then call :meth:`release`; on :attr:`Verdict.QUEUED` they wait for ``ticket.wake`` (or
    until :meth:`wait_until`, then call :meth:`give_up`).

    Metrics (userver-style names, label ``component``): counters ``admission-admitted``,
    ``admission-queued``, ``admission-shed`` (label ``reason``: ``deadline``, ``queue-full``,
    ``queue-delay``), ``admission-probes`` (D9.5); telemetry events ``admission.queue_delay``
    (``seconds``) and ``admission.limit`` (``limit``, when it changes); :meth:`stats` for the
    queue-delay histogram and the current limit.
    """

    def __init__(
        self,
        limit: Limit | None = None,
        config: AdmissionConfig | None = None,
        *,
        estimates: RouteEstimates | None = None,
        component: str = "http-server",
    ) -> None:
        self.limit: Limit = AIMDLimit() if limit is None else limit
        self.config = AdmissionConfig() if config is None else config
        self.estimates = RouteEstimates() if estimates is None else estimates
        self.component = component
        self._lock = threading.Lock()
        self._inflight = 0
        # Two classes: critical first. Each deque holds tickets oldest-first.
        self._critical: deque[Ticket] = deque()
        self._normal: deque[Ticket] = deque()
        self._last_empty = -math.inf
        self._histogram = _Histogram()
        # When the limit last came down: requests admitted before then ran under the old
        # limit, so their congestion is already answered (one decrease per window, as TCP).
        self._decreased = -math.inf

    # -- state ------------------------------------------------------------------------------

    @property
    def inflight(self) -> int:
        return self._inflight

    def queued(self) -> int:
        return len(self._critical) + len(self._normal)

    def interval(self, route: str) -> float:
        """CoDel's interval for ``route``: ``interval``, but at least ``services`` of its
        service times (a queue of a few slow requests is not yet a standing one)."""
        return max(self.config.interval, self.config.services * self.estimates.baseline(route))

    def standing(self, now: float) -> bool:
        """The queue has not emptied for longer than the interval (of its oldest waiter's
        route): the server is overloaded."""
        head = self._critical or self._normal
        return bool(head) and now - self._last_empty > self.interval(head[0].route)

    def _waited_too_long(self, ticket: Ticket, now: float) -> bool:
        """Past its queue-delay bound. A request with a deadline may wait the whole interval
        even in a standing queue: its deadline already sheds it once it cannot finish (rule 4),
        and until then newest-first service leaves it only the slots nobody newer wants, so
        shedding it earlier only turns away work the server could still have done."""
        if ticket.deadline is not None:
            return now >= ticket.arrived + self.interval(ticket.route)
        return now >= ticket.arrived + self.max_wait(ticket.route, now)

    def max_wait(self, route: str, now: float) -> float:
        """How long a request for ``route`` may wait now.

        The interval while the queue is not standing. Once it is, CoDel's ``target`` — but never
        less than the route's service time: a slot frees about once per service time, so a
        shorter bound would shed the very waiters that newest-first service is about to reach,
        and leave slots idle while requests with budget are turned away (seen with 40 ms
        handlers and the 5 ms target of "Fail at Scale", which assumes far faster ones).
        """
        interval = self.interval(route)
        if not self.standing(now):
            return interval
        return min(interval, max(self.config.target, self.estimates.baseline(route)))

    def stats(self) -> AdmissionStats:
        with self._lock:
            return AdmissionStats(
                limit=self.limit.value,
                inflight=self._inflight,
                queued=self.queued(),
                queue_delay_counts=tuple(self._histogram.counts),
                queue_delay_sum=self._histogram.total,
            )

    # -- decisions --------------------------------------------------------------------------

    def arrive(self, ticket: Ticket, now: float) -> Verdict:
        """Decide for a request arriving at ``now``: admit, queue, or shed (never runs it)."""
        ticket.arrived = now
        shed: list[Ticket] = []
        with self._lock:
            free = self._inflight < self.limit.value and not self.queued()
            if ticket.hopeless(now, self.estimates.baseline(ticket.route)):
                if free and self._probe(ticket, now):
                    outcome = self._admit(ticket, now)
                else:
                    outcome = self._shed(ticket, Verdict.HOPELESS, "deadline")
            elif free:
                outcome = self._admit(ticket, now)
            else:
                outcome = self._enqueue(ticket, now, shed)
        self._wake_all(shed)
        return outcome

    def wait_until(self, ticket: Ticket, now: float) -> float:
        """The instant a queued ``ticket`` should stop waiting and call :meth:`give_up`."""
        with self._lock:
            if ticket.deadline is None:
                return ticket.arrived + self.max_wait(ticket.route, now)
            bound = ticket.arrived + self.interval(ticket.route)
            return min(bound, ticket.deadline - self.estimates.baseline(ticket.route))

    def give_up(self, ticket: Ticket, now: float) -> Verdict:
        """A queued request's wait timed out (or its waiter was cancelled): its final outcome.

        If it was admitted meanwhile, returns :attr:`Verdict.ADMIT` and the slot is the caller's
        (run the handler, or :meth:`release` it). If its wait is still within bounds (the queue
        stopped standing), it stays queued and :attr:`Verdict.QUEUED` is returned.
        """
        with self._lock:
            if ticket.outcome is not Verdict.QUEUED:
                return ticket.outcome
            if ticket.hopeless(now, self.estimates.baseline(ticket.route)):
                self._remove(ticket)
                return self._shed(ticket, Verdict.HOPELESS, "deadline")
            if self._waited_too_long(ticket, now):
                self._remove(ticket)
                return self._shed(ticket, Verdict.OVERLOADED, "queue-delay")
            return Verdict.QUEUED

    def cancel(self, ticket: Ticket, now: float) -> None:
        """The waiter of a queued request went away (client gone, task cancelled): forget it,
        or give back the slot if it had been admitted meanwhile."""
        with self._lock:
            if ticket.outcome is Verdict.QUEUED:
                self._remove(ticket)
                ticket.outcome = Verdict.OVERLOADED
                return
        if ticket.outcome is Verdict.ADMIT:
            self.release(ticket, now, late=False, measure=False)

    def release(self, ticket: Ticket, now: float, *, late: bool, measure: bool = True) -> None:
        """An admitted request finished at ``now`` (``late``: after its deadline): free its slot,
        learn from it, and admit or shed waiting requests."""
        woken: list[Ticket] = []
        with self._lock:
            self._inflight -= 1
            if measure:
                service = now - ticket.admitted_at
                self.estimates.observe(
                    ticket.route, service, alone=ticket.alone, now=now, fresh=ticket.probe
                )
                tolerance = self.config.tolerance
                # Queueing inside the handler is congestion just as a late answer is: without
                # it an adaptive limit grows until admitted requests miss their deadlines
                # waiting for a worker, and only then backs off (half the goodput, measured).
                dropped = late or (
                    tolerance is not None and self.estimates.queueing(ticket.route, tolerance)
                )
                if dropped and ticket.admitted_at < self._decreased:
                    # Admitted under the limit before the last decrease: that decrease already
                    # answered its congestion. Counting it again would cut the limit once per
                    # request finishing from the old backlog — to the minimum on a server with
                    # many workers (a quarter of its goodput lost at 2x load, simulated).
                    pass
                else:
                    before = self.limit.value
                    self.limit.sample(service, dropped, self._inflight + 1)
                    after = self.limit.value
                    if after < before:
                        self._decreased = now
                    if after != before and enabled():
                        emit("admission.limit", component=self.component, limit=after)
            self._drain(now, woken)
        self._wake_all(woken)

    # -- internals (called with the lock held) ----------------------------------------------

    def _probe(self, ticket: Ticket, now: float) -> bool:
        """Let a request judged hopeless run anyway, to refresh a stale estimate (D9.5).

        Only with budget left, a free slot and an empty queue, and once per interval of the
        route: if the estimate is still right, one request an interval is the price.
        """
        route = ticket.route
        if ticket.deadline is None or ticket.deadline <= now:
            return False
        if not self.estimates.stale(route, now, self.interval(route)):
            return False
        self.estimates.probed(route, now)
        ticket.probe = True
        counters.inc("admission-probes", component=self.component)
        return True

    def _admit(self, ticket: Ticket, now: float) -> Verdict:
        self._inflight += 1
        ticket.alone = self._inflight == 1
        ticket.outcome = Verdict.ADMIT
        ticket.admitted_at = now
        counters.inc("admission-admitted", component=self.component)
        return Verdict.ADMIT

    def _shed(self, ticket: Ticket, outcome: Verdict, reason: str) -> Verdict:
        ticket.outcome = outcome
        counters.inc("admission-shed", component=self.component, reason=reason)
        return outcome

    def _enqueue(self, ticket: Ticket, now: float, shed: list[Ticket]) -> Verdict:
        if self.queued() >= self.config.max_queue:
            # A critical request takes the place of the oldest normal one; otherwise it is shed.
            if ticket.critical and self._normal:
                victim = self._normal.popleft()
                self._shed(victim, Verdict.OVERLOADED, "queue-full")
                shed.append(victim)
            else:
                return self._shed(ticket, Verdict.OVERLOADED, "queue-full")
        if not self.queued():
            self._last_empty = now
        (self._critical if ticket.critical else self._normal).append(ticket)
        counters.inc("admission-queued", component=self.component)
        return Verdict.QUEUED

    def _remove(self, ticket: Ticket) -> None:
        queue = self._critical if ticket.critical else self._normal
        try:
            queue.remove(ticket)
        except ValueError:
            return

    def _drain(self, now: float, woken: list[Ticket]) -> None:
        """Fill free slots from the queue; shed the waiters that are hopeless or waited too long."""
        while self.queued() and self._inflight < self.limit.value:
            lifo = self.standing(now)
            queue = self._critical if self._critical else self._normal
            # Under LIFO the oldest waiters would only time out later: shed them now, so a
            # standing queue holds requests that can still be served.
            while lifo and len(queue) > 1 and self._waited_too_long(queue[0], now):
                stale = queue.popleft()
                self._shed(stale, Verdict.OVERLOADED, "queue-delay")
                woken.append(stale)
            ticket = queue.pop() if lifo else queue.popleft()
            if ticket.hopeless(now, self.estimates.baseline(ticket.route)):
                self._shed(ticket, Verdict.HOPELESS, "deadline")
            elif self._waited_too_long(ticket, now):
                self._shed(ticket, Verdict.OVERLOADED, "queue-delay")
            else:
                delay = now - ticket.arrived
                self._histogram.add(delay)
                if enabled():
                    emit("admission.queue_delay", component=self.component, seconds=delay)
                self._admit(ticket, now)
            woken.append(ticket)

    @staticmethod
    def _wake_all(tickets: list[Ticket]) -> None:
        for ticket in tickets:
            if ticket.wake is not None:
                ticket.wake(ticket.outcome)
