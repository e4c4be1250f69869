"""One outgoing attempt and its exception-mapping boundary, shared by every client adapter
(httpx, requests, aiohttp, gRPC, and the database adapters asyncpg, psycopg and redis;
DECISIONS D4.3, D4.5, D4.7, D4.8).

An adapter goes through three steps, each written once here:

1. :func:`begin` — clamp the static timeout by the effective deadline (``_state.clamp_timeout``);
   when no time is left raise at once with the binding bound's ``source`` and send nothing.
   The header value is the attempt's timeout in whole ms, rounded up, never ``0``.
2. :meth:`Attempt.boundary` (sync) or :meth:`Attempt.run` (async) around every call into the
   client library — the one place that maps the library's exceptions, as httpx's own
   ``map_httpcore_exceptions`` does for httpcore's. The exchange ran out of time: if our
   deadline set the timeout (``lowered``) it is *our* deadline that is spent: the caller gets
   ``DeadlineExceeded`` with the binding bound's source and the request is marked (D4.5);
   otherwise the attempt's own static timeout fired: the adapter's ``AttemptTimeout``.
3. :meth:`Attempt.refusal` — a response ``>= 400`` carrying ``X-YaTaxi-Deadline-Expired``: if
   our deadline lowered the timeout, ``DeadlineExceeded(source="propagated")`` and the request
   is marked (never retried); otherwise an ordinary, retryable attempt timeout. A timeout
   lowered by the attempt's own bound (a policy's per-attempt timeout, source ``attempt``) is
   the attempt's time, not our deadline: ordinary and retryable (D2.5).

The request is marked only when the spent bound is the request's own deadline
(:meth:`RequestState.cut_by`): an attempt timeout or a local scope that ends earlier leaves the
request with time, so it is not answered "Deadline expired".

The "ordinary timeout" type is each adapter's ``AttemptTimeout``: a ``DeadlineExceeded`` with
``source="attempt"`` (retryable by timebound's policies, D2.5) that is *also* the client
library's own timeout exception (``httpx.TimeoutException``, ``requests.Timeout``,
``aiohttp.ServerTimeoutError``), so existing ``except`` clauses and retry predicates keep working.

A component that sends no header of its own (gRPC carries its timeout itself; a database
query carries it as ``statement_timeout``, a Redis command as the reply's read timeout) sets
``propagate_header=False``; the database adapters then map their drivers' own signal of the
end (see :class:`Attempt`) to the same :meth:`Attempt.cut`.

The HTTP adapters are built from :func:`http_client_setup` (their one constructor block: the
static timeout, the options, and a ``policy=`` checked by ``_resilience``, D3.17).

Telemetry goes through the options' :class:`Report`. :class:`CounterReport` is userver's
(``timeout-updated-by-deadline``, ``cancelled-by-deadline`` and the matching ``span.tags``
events) for any component label: ``http-client`` for the HTTP clients, the driver's name for
a database adapter (whose own bookkeeping commands are not counted as lowered, D4.7).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from .._core import _clock
from .._core._breakdown import Breakdown
from .._core._classify import bound_origin
from .._core._deadline import Deadline
from .._core._durations import Duration, to_seconds
from .._core._errors import DeadlineExceeded
from .._core._request import RequestState, _request
from .._core._scopes import (
    current_bound_error,
    current_bound_set_by,
    current_bound_source,
    current_breakdown,
    current_deadline,
    move_on_at,
    record,
)
from ..policies._policy import Policy
from ..telemetry._events import counters, emit, enabled
from . import _config
from ._breakdown_wire import parse as parse_breakdown
from ._codec import ABSOLUTE_HEADER, EXPIRED_HEADER, TIMEOUT_HEADER, format_absolute_us
from ._resilience import Resilience, check_http_methods, check_policy, check_statuses
from ._state import ClampedTimeout, clamp_timeout

__all__ = [
    "COMPONENT",
    "Attempt",
    "AttemptTimeoutBase",
    "ClientOptions",
    "CounterReport",
    "HttpClientSetup",
    "Report",
    "absolute_wire_value",
    "begin",
    "call_name",
    "http_client_setup",
]

COMPONENT = "http-client"

_T = TypeVar("_T")


class Report(Protocol):
    """How a client adapter counts what the deadline did to its calls (D4.7)."""

    def lowered(self, timeout_ms: int | None) -> None:
        """The deadline lowered a call's timeout to ``timeout_ms``."""

    def cancelled(self) -> None:
        """A call was not sent, or was cut short, because the deadline was spent."""


@dataclass(frozen=True, slots=True)
class CounterReport:
    """userver's client counters and span tags, labelled ``component=<component>`` (D4.7).

    ``timeout_tag`` names the span tag that carries a lowered timeout in ms. With
    ``count_lowered=False`` a lowered timeout is not counted: a component's own bookkeeping
    (a pool's wait, a connection handshake) is bounded like the user's calls but is not one.
    A call cut short is always counted.
    """

    component: str
    timeout_tag: str = "propagated_timeout_ms"
    count_lowered: bool = True

    def lowered(self, timeout_ms: int | None) -> None:
        if not self.count_lowered:
            return
        counters.inc("timeout-updated-by-deadline", component=self.component)
        if enabled():
            emit("span.tags", component=self.component, **{self.timeout_tag: timeout_ms})

    def cancelled(self) -> None:
        counters.inc("cancelled-by-deadline", component=self.component)
        if enabled():
            emit("span.tags", component=self.component, cancelled_by_deadline=1)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Per-adapter propagation options."""

    propagate_header: bool = True
    timeout_header: str = TIMEOUT_HEADER
    #: The absolute deadline header sent beside the relative one (D9.3); ``None``: not sent.
    absolute_header: str | None = ABSOLUTE_HEADER
    expired_header: str = EXPIRED_HEADER
    what: str = "http request"
    report: Report = field(default_factory=lambda: CounterReport(COMPONENT))


@dataclass(frozen=True, slots=True)
class HttpClientSetup:
    """What every HTTP client adapter is built from: its static ``timeout`` (seconds),
    whether it asks callees for their breakdown, its :class:`ClientOptions`, and its policy
    (``None``: one attempt per request, as without one; D3.17)."""

    timeout: float | None
    ask_breakdown: bool
    options: ClientOptions
    resilience: Resilience | None
    #: The HTTP statuses that are the dependency's failure (D3.17).
    retry_statuses: frozenset[int]


def http_client_setup(
    adapter: str,
    *,
    timeout: Duration | None,
    propagate_header: bool,
    timeout_header: str,
    absolute_header: str | None,
    expired_header: str,
    what: str,
    ask_breakdown: bool,
    policy: Policy[Any] | None,
    retry_statuses: Iterable[int],
    hedge_methods: Iterable[str],
    hedging: str | None = None,
) -> HttpClientSetup:
    """The constructor block of the HTTP client adapters (httpx, requests, aiohttp), once.

    ``hedging``: why this adapter cannot hedge (a hedged policy is then refused), or ``None``.
    """
    return HttpClientSetup(
        None if timeout is None else to_seconds(timeout, option="timeout"),
        bool(ask_breakdown),
        ClientOptions(
            propagate_header=propagate_header,
            timeout_header=timeout_header,
            absolute_header=absolute_header,
            expired_header=expired_header,
            what=what,
        ),
        check_policy(
            policy, adapter=adapter, hedged=check_http_methods(hedge_methods), hedging=hedging
        ),
        check_statuses(retry_statuses),
    )


#: The most of a peer's refusal ("deadline expired", D4.5, D4.8) or failed answer (a 503 under
#: ``policy=``, D4.14) a client reads: a body this short is read whole and the connection kept
#: for the next request; a longer one is closed after this many bytes, so a peer answering with
#: gigabytes (or an endless stream) costs this much memory at most.
REFUSAL_BODY_MAX = 64 * 1024


class AttemptTimeoutBase(DeadlineExceeded):
    """What every adapter's ``AttemptTimeout`` is besides the client library's own timeout:
    a :class:`~timebound.DeadlineExceeded` with ``source="attempt"`` (retryable, D2.5).

    ``remote`` is true when the server answered "deadline expired" (D4.5 case 2) rather than
    the clock running out here. Pickles as its own subclass, without the live request or
    response the client library attached.
    """

    _live_attributes = frozenset({"request", "response", "_request"})

    def __init__(self, message: str, *, remote: bool = False, timeout: float | None = None) -> None:
        DeadlineExceeded.__init__(self, message, source="attempt", timeout=timeout)
        self.remote = remote


@dataclass(slots=True)
class Attempt:
    """One clamped outgoing attempt and its exception-mapping boundary.

    Built by :func:`begin`; an adapter then uses four members and nothing else:

    * ``header_value`` — the timeout header to send (``None``: send none); ``clamped`` and
      ``end`` for the client library's own timeouts;
    * :meth:`boundary` — a context manager around every call into the client library: the
      library's own timeout error (one of ``timeouts``) at or after :attr:`end` becomes
      :meth:`cut` (``raise ... from`` the original); a ``DeadlineExceeded`` or a cancellation
      passes unchanged (never converted, D2.3), the cut only recorded;
    * :meth:`run` — the async form: awaits under a timebound scope ending at :attr:`end`,
      inside the boundary; :meth:`check` — the sync form's clock check between reads, and
      :meth:`abandoned` its check for a deadline cut short (a sync hedge that lost, D3.18);
    * :meth:`refusal` — the error for a response marked "deadline expired" (D4.5), or ``None``.

    A database adapter puts :attr:`clamped` into the query or the read timeout itself, so the
    driver, not :meth:`boundary`, reports the end; where it does (a 57014, a read timeout) the
    adapter asks :meth:`expired` and raises :meth:`cut`, the same error and the same count.

    The request being handled when the attempt began is captured, so a cut observed later (a
    body read outside the caller's context, a gRPC completion callback) still marks it.
    """

    clamped: ClampedTimeout
    #: Absolute end on the scheduling clock (``None``: neither deadline nor static timeout).
    end: float | None
    #: Source to report when the cut is ours: the binding bound's, or ``attempt``.
    source: str
    #: The header value to send, or ``None`` to send none.
    header_value: str | None
    options: ClientOptions
    #: Builds the adapter's ``AttemptTimeout``: ``make(message, remote=..., timeout=...)``.
    make: Callable[..., BaseException]
    #: The client library's own timeout exceptions (mapped by :meth:`boundary`).
    timeouts: tuple[type[BaseException], ...]
    #: The request being handled when the attempt began (``None`` outside a server adapter).
    state: RequestState | None
    #: The absolute deadline header's value (``None``: send none), beside ``header_value``.
    absolute_value: str | None = None
    #: When the attempt began (D13: its part of the breakdown starts here).
    t0: float = 0.0
    #: The attempt's part was recorded (once: an answer, a cut or a cancellation).
    parted: bool = False
    #: What the part is called (``GET host/path``); ``None``: ``options.what``.
    name: str | None = None
    #: The callee's own breakdown, when it sent one (D13.5).
    remote: Breakdown | None = None
    #: The part recorded for this call (D13), once it is.
    mark: tuple[Any, ...] | None = None
    #: Where the bound that lowered the timeout was set (D2.8): a callee answering "deadline
    #: expired" reports that bound spent (a middleware's reserve, D1.18, answers 498 for it).
    set_by: str | None = None

    def part(self, outcome: str, remote: Breakdown | None = None) -> None:
        """D13: record this call as a part of the caller's breakdown: the budget it was sent,
        what it used, how it ended and the callee's own breakdown when it sent one."""
        if self.parted:
            return
        self.parted = True
        self.mark = mark = (
            "call",
            self.name or self.options.what,
            self.t0,
            _clock.now(),
            self.clamped.seconds,
            outcome,
            self.remote if remote is None else remote,
        )
        record(*mark)

    def headers(self) -> list[tuple[str, str]]:
        """The deadline headers to send with this attempt (none when propagation is off)."""
        out: list[tuple[str, str]] = []
        if self.header_value is not None:
            out.append((self.options.timeout_header, self.header_value))
            if self.absolute_value is not None and self.options.absolute_header:
                out.append((self.options.absolute_header, self.absolute_value))
        return out

    @property
    def lowered(self) -> bool:
        """Our deadline, not the static timeout, set the attempt's timeout."""
        return self.clamped.lowered

    @property
    def propagated(self) -> bool:
        """A bound other than the attempt's own lowered the timeout: running out means our
        deadline is spent (a policy's per-attempt timeout is retryable, D2.5)."""
        return self.lowered and bound_origin(self.source) != "own"

    def expired(self) -> bool:
        """True once the attempt's end has passed (never early, D1.3)."""
        return self.end is not None and _clock.now() >= self.end

    def spent(self) -> None:
        """Record a cut by our own deadline: counters, span tag, and the request's mark when
        the spent bound is the request's own deadline (D4.5)."""
        if not self.lowered:
            return
        if self.state is not None and self.end is not None:
            self.state.cut_by(Deadline(self.end))
        self.options.report.cancelled()

    def cut(self) -> BaseException:
        """The error for an exchange that ran past :attr:`end`."""
        what = self.options.what
        seconds = self.clamped.seconds
        self.part("cut" if self.lowered else "timeout")
        if self.lowered:
            self.spent()
            err = current_bound_error(what)
            if err is not None:
                return err
            # Outside the caller's context (a body read later) or a socket timer a hair early:
            # report the same bound from what we recorded.
            return DeadlineExceeded(
                source=self.source,
                timeout=seconds,
                deadline=None if self.end is None else Deadline(self.end),
                what=what,
            )
        return self.make(
            f"{what} timed out after {seconds:g}s (attempt deadline)"
            if seconds is not None
            else f"{what} timed out (attempt deadline)",
            remote=False,
            timeout=seconds,
        )

    def abandoned(self) -> BaseException | None:
        """The error to stop with when the deadline this attempt runs under was cut short
        before the attempt's own end — a sync hedge that lost the race (``cut_short``, D3.18):
        its next step must not start. ``None`` otherwise."""
        if self.expired():
            return None
        return current_bound_error(self.options.what)

    def check(self) -> None:
        """Raise :meth:`cut` once the end has passed (a sync read cannot be interrupted)."""
        if self.expired():
            raise self.cut()

    @contextmanager
    def boundary(self) -> Iterator[None]:
        """Map the client library's errors raised inside (see the class docstring)."""
        try:
            yield
        except (DeadlineExceeded, asyncio.CancelledError):
            self.part("cut")
            if self.expired():
                self.spent()
            raise
        except self.timeouts as exc:
            if self.expired():
                raise self.cut() from exc
            raise

    async def run(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Await ``fn(*args)`` until :attr:`end`, inside :meth:`boundary`.

        A timebound scope does the bounding, so it composes with every enclosing scope: when
        our timeout was lowered, the enclosing bound shares our end and reports itself (its
        ``DeadlineExceeded``, or the ``CancelledError`` its own scope catches).
        """
        assert self.end is not None
        with self.boundary(), move_on_at(Deadline(self.end)):
            return await fn(*args)
        # Reached only when our own scope moved on: the attempt's end passed.
        raise self.cut()

    def arrived(self, breakdown: str | bytes | None) -> None:
        """D13: an answer reached the exchange; its callee's breakdown (if any) is kept for this
        call's part. An answer that arrives in the very step our deadline cuts the call (the
        exchange had it, the caller had not yet run) is still the callee's side of the call: the
        call ends ``cut``, with that side in it. Once the part is recorded, nothing changes."""
        if not self.parted and self.remote is None and breakdown is not None:
            self.remote = parse_breakdown(breakdown)

    def answered(self, status: int | str, breakdown: str | bytes | None) -> None:
        """D13: the callee answered; its ``X-Timebound-Breakdown`` (if any) joins our part."""
        if not self.parted:
            self.arrived(breakdown)
            self.part(str(status))

    def refusal(self, status: int, header: str | None) -> BaseException | None:
        """The error for a response ``>= 400`` marked "deadline expired" (D4.5), else ``None``."""
        if status < 400 or not header or not _config.is_enabled():
            return None
        what = self.options.what
        err: DeadlineExceeded
        if self.propagated:
            self.spent()
            err = DeadlineExceeded(
                f"{what} answered {status} deadline expired: our deadline is spent"
                " (propagated deadline)",
                source="propagated",
                timeout=self.clamped.seconds,
                deadline=None if self.end is None else Deadline(self.end),
                set_by=self.set_by,
            )
        else:
            made = self.make(
                f"{what} answered {status} deadline expired within the attempt's own timeout"
                " (attempt deadline)",
                remote=True,
                timeout=self.clamped.seconds,
            )
            if not isinstance(made, DeadlineExceeded):
                return made
            err = made
        return err

    def refused(self, err: BaseException) -> BaseException:
        """The :meth:`refusal` error as the caller gets it, once the answer's body was read.

        D13.9: its breakdown is the bound's up to this moment, this call (with the callee's own
        breakdown) among the parts: the time spent reading the refusal's body, and any wait for
        the event loop on the way, is in the tree (the bound's own ``self``), so the parts add up
        to the time the caller observed."""
        if isinstance(err, DeadlineExceeded):
            name = self.name or self.options.what
            seconds = self.clamped.seconds
            parts = () if self.mark is None else (self.mark,)
            err.breakdown = current_breakdown(parts, name, self.t0, seconds)
        return err


def call_name(method: str, host: str, path: str) -> str:
    """D13: what an HTTP call's part is called (``GET host/path``, at most 120 characters)."""
    return f"{method} {host}{path}"[:120]


def absolute_wire_value(end: float) -> str:
    """The absolute deadline to send for an attempt ending at ``end`` (the scheduling clock):
    that instant on the system clock, in whole microseconds, rounded up (D9.3, D4.12). It
    counts the transit that a relative timeout cannot."""
    return format_absolute_us(_clock.wall() + (end - _clock.now()))


def begin(
    static: float | None,
    options: ClientOptions,
    make: Callable[..., BaseException],
    timeouts: tuple[type[BaseException], ...] = (),
) -> Attempt:
    """Start one attempt: clamp, fail fast when spent (sending nothing), choose the header.

    ``make(message, remote=..., timeout=...)`` builds the adapter's ``AttemptTimeout``;
    ``timeouts`` are the client library's own timeout exceptions.
    """
    try:
        clamped = clamp_timeout(static, what=options.what)
    except DeadlineExceeded:
        options.report.cancelled()
        raise
    seconds = clamped.seconds
    if seconds is None:
        end = None
    elif clamped.lowered:
        # Exactly the effective deadline, not "now + remaining" read a moment later.
        end = current_deadline().when
    else:
        end = _clock.now() + seconds
    header_value: str | None = None
    absolute_value: str | None = None
    if seconds is not None and options.propagate_header and _config.is_enabled():
        header_value = str(clamped.ms)
        if options.absolute_header and end is not None:
            absolute_value = absolute_wire_value(end)
    set_by = None
    if clamped.lowered:
        source = current_bound_source() or "scope"
        set_by = current_bound_set_by()
        options.report.lowered(clamped.ms)
    else:
        source = "attempt"
    return Attempt(
        clamped,
        end,
        source,
        header_value,
        options,
        make,
        timeouts,
        _request.get(),
        absolute_value,
        _clock.now(),
        set_by=set_by,
    )
