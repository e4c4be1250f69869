"""Deadline propagation for httpx clients (DECISIONS D4.3, D4.5, D4.8).

Wrap any transport::

    import httpx
    from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport

    client = httpx.Client(transport=DeadlineTransport(timeout=5.0))
    aclient = httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5.0))

Every attempt's timeout is ``min(static, remaining)``; the static timeout is the transport's own
``timeout`` (a total for the whole exchange) when given, else the largest phase timeout of the
request (httpx's ``timeout=``; D4.3). httpx has no total timeout of its own — its read timeout
restarts with every chunk (httpx#776, #1450) — so the transport bounds the whole exchange,
body included:

* async: the caller waits for the exchange (run in a task of its own, see
  :class:`_Exchange`) under a timebound scope, and reads every chunk of the body under one, so a
  stalled read is interrupted exactly at the end of the attempt;
* sync: a request waits for a pooled connection in the transport (see :func:`_pool_size`),
  until the pool timeout or the attempt's end; the connect, read and write timeouts are set to
  at most the time left, again at the start of every step after that wait, and the body stream
  checks the clock after every chunk (a sync read cannot be interrupted: a server trickling
  bytes can overrun by at most one read timeout).

Neither ever cuts a request while it waits inside httpcore's pool, nor lets httpcore's pool
timeout fire (both wait for a pooled connection in the transport, :func:`_pool_size`): either
leaks a connection (encode/httpcore#1093) and, repeated, wedges the client.

Errors: no time left before sending → ``DeadlineExceeded`` with the binding bound's source and
nothing is sent; our deadline cut the exchange → ``DeadlineExceeded`` with that source and the
request is marked; the attempt's own static timeout or a remote "deadline expired" answer that
our deadline did not cause → :class:`AttemptTimeout` (both a ``DeadlineExceeded`` with
``source="attempt"`` and an ``httpx.TimeoutException``); a remote "deadline expired" answer our
deadline did cause → ``DeadlineExceeded(source="propagated")``. A phase timeout that fires before
the attempt's end is httpx's own error, unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any

try:
    import anyio
    import httpx
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.httpx needs httpx: pip install 'timebound[httpx]'"
    ) from exc

from ..._core import _clock
from ..._core._body import aread_prefix, read_prefix
from ..._core._deadline import Deadline
from ..._core._durations import Duration
from ..._core._errors import DeadlineExceeded
from ..._core._scopes import _clean_context, _spawn_detached, move_on_at, spawn_background
from ...policies._policy import Policy
from ...telemetry._tracing import active as tracing_active
from ...telemetry._tracing import client_span
from .._breakdown_wire import BREAKDOWN_HEADER
from .._client import (
    REFUSAL_BODY_MAX,
    Attempt,
    AttemptTimeoutBase,
    HttpClientSetup,
    begin,
    call_name,
    http_client_setup,
)
from .._codec import ABSOLUTE_HEADER, EXPIRED_HEADER, TIMEOUT_HEADER
from .._resilience import (
    DEFAULT_HEDGE_METHODS,
    DEFAULT_RETRY_STATUSES,
    FailedAnswer,
    Passed,
    mark_truncated,
)

__all__ = ["AsyncDeadlineTransport", "AttemptTimeout", "DeadlineTransport"]

_PHASES = ("connect", "read", "write", "pool")


class _Spent(Exception):
    """Raised from httpcore's trace hook at a step begun after the attempt's end (sync)."""


_TIMEOUTS: tuple[type[BaseException], ...] = (httpx.TimeoutException, _Spent)
# The steps httpcore traces after the pool wait, at whose start a sync attempt may stop.
_STEPS = frozenset(
    {
        "connect_tcp.started",
        "connect_unix_socket.started",
        "start_tls.started",
        "send_request_headers.started",
        "send_request_body.started",
        "receive_response_headers.started",
        "receive_response_body.started",
    }
)


class AttemptTimeout(AttemptTimeoutBase, httpx.TimeoutException):
    """The attempt's own timeout ran out (retryable, D2.5).

    Both a :class:`timebound.DeadlineExceeded` with ``source="attempt"`` and an
    :class:`httpx.TimeoutException`. ``remote`` is true when the server answered "deadline
    expired" (D4.5 case 2) rather than the clock running out here.
    """

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        remote: bool = False,
        timeout: float | None = None,
    ) -> None:
        AttemptTimeoutBase.__init__(self, message, remote=remote, timeout=timeout)
        self._request = request


def _static_timeout(own: float | None, request: httpx.Request) -> float | None:
    """D4.3: the transport's total when configured, else the largest configured phase timeout."""
    if own is not None:
        return own
    phases = request.extensions.get("timeout") or {}
    configured = [v for v in phases.values() if v is not None]
    return max(configured) if configured else None


def _prepare(
    request: httpx.Request, attempt: Attempt, *, phases_to: float | None, pool_to: float | None
) -> None:
    """Write the header and lower the phase timeouts: connect, read and write to at most
    ``phases_to``, the pool wait to at most ``pool_to`` (``None``: leave it)."""
    for name, header in attempt.headers():
        request.headers[name] = header
    phases = dict(request.extensions.get("timeout") or {})
    for phase in _PHASES:
        limit = pool_to if phase == "pool" else phases_to
        if limit is not None:
            value = phases.get(phase)
            phases[phase] = limit if value is None else min(value, limit)
    request.extensions = {**request.extensions, "timeout": phases}


#: The errors of an attempt that say the dependency failed (D3.17): the connection broke or
#: timed out. Any other error of httpx (a bad URL, a consumed stream) is the caller's.
_FAILURES: tuple[type[BaseException], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
#: What an attempt raises to the policy as it is (D3.17); any other error is handed back.
_RAISED: tuple[type[BaseException], ...] = (DeadlineExceeded, *_FAILURES)


def _copy(request: httpx.Request) -> httpx.Request:
    """A request to send as one attempt: the same body, its own headers and extensions (an
    attempt writes its deadline headers and phase timeouts into them; hedges run side by
    side). A streamed body that cannot be read twice fails the second attempt with httpx's
    ``StreamConsumed``."""
    return httpx.Request(
        request.method,
        request.url,
        headers=httpx.Headers(request.headers),
        stream=request.stream,
        extensions={**request.extensions},
    )


def _failed(response: httpx.Response, body: bytes, whole: bool, what: str) -> FailedAnswer:
    """A failed answer whose body was read up to ``REFUSAL_BODY_MAX`` (D4.14): the answer
    holds those bytes (raw, decoded when read as httpx decodes any body), marked when they are
    not all of it; its original stream is closed."""
    response.stream = httpx.ByteStream(body)
    if not whole:
        mark_truncated(response)
    return FailedAnswer(response, what, status=response.status_code, headers=response.headers)


class _Base:
    def __init__(self, setup: HttpClientSetup) -> None:
        self._timeout = setup.timeout
        self._ask_breakdown = setup.ask_breakdown
        self._options = setup.options
        self._resilience = setup.resilience
        self._retry_statuses = setup.retry_statuses

    def _begin(self, request: httpx.Request, static: float | None) -> Attempt:
        attempt = begin(
            static, self._options, functools.partial(AttemptTimeout, request=request), _TIMEOUTS
        )
        attempt.name = call_name(request.method, request.url.host, request.url.path)  # D13
        if self._ask_breakdown:
            request.headers[BREAKDOWN_HEADER] = "1"
        return attempt

    def _static(self, request: httpx.Request) -> float | None:
        return _static_timeout(self._timeout, request)


class DeadlineTransport(_Base, httpx.BaseTransport):
    """A sync httpx transport that clamps, propagates and enforces the deadline.

    ``inner`` defaults to ``httpx.HTTPTransport()``. ``timeout``: a total for each attempt
    (seconds, timedelta or ``"5s"``). ``propagate_header=False`` keeps clamping but sends no
    ``X-YaTaxi-Client-TimeoutMs`` (userver's ``set-deadline-propagation-header: false``).
    ``absolute_header``: the absolute deadline header sent beside it (``X-Request-Deadline``,
    epoch microseconds, D9.3); ``None`` for peers that do not know it.
    ``ask_breakdown``: ask every callee for its breakdown (``X-Timebound-Breakdown: 1``); one
    that a callee sends is folded into the call's part whether asked or not (D13.5).
    ``policy``: a :class:`~timebound.policies.Policy` each request runs under — attempts,
    breaker, retry budget, server hints (D3.17); a response whose status is in
    ``retry_statuses`` (429, 502, 503, 504) is a failure, and the last one is returned as it
    is. A hedged policy hedges the ``hedge_methods`` (GET, HEAD, OPTIONS; PUT and DELETE when
    named): the attempts race in threads, a loser stops at its next step (it sends nothing
    more, reads no body) and its answer is closed, its connection back to the pool (D3.18).
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        timeout: Duration | None = None,
        propagate_header: bool = True,
        timeout_header: str = TIMEOUT_HEADER,
        absolute_header: str | None = ABSOLUTE_HEADER,
        expired_header: str = EXPIRED_HEADER,
        what: str = "http request",
        ask_breakdown: bool = False,
        policy: Policy[Any] | None = None,
        retry_statuses: Iterable[int] = DEFAULT_RETRY_STATUSES,
        hedge_methods: Iterable[str] = DEFAULT_HEDGE_METHODS,
    ) -> None:
        super().__init__(
            http_client_setup(
                "DeadlineTransport",
                timeout=timeout,
                propagate_header=propagate_header,
                timeout_header=timeout_header,
                absolute_header=absolute_header,
                expired_header=expired_header,
                what=what,
                ask_breakdown=ask_breakdown,
                policy=policy,
                retry_statuses=retry_statuses,
                hedge_methods=hedge_methods,
            )
        )
        self._hedging = self._resilience is not None and self._resilience.policy.hedge is not None
        self._inner = inner if inner is not None else httpx.HTTPTransport()
        size = _pool_size(self._inner)
        self._slots = None if size is None else threading.BoundedSemaphore(size)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resilience = self._resilience
        if resilience is None:
            return self._send(request)
        # D3.17: each attempt sends a copy (its own deadline headers and phase timeouts).
        response: httpx.Response = resilience.run_sync(
            request.method, self._attempt, request, release=_close
        )
        return response

    def _attempt(self, request: httpx.Request) -> httpx.Response | Passed:
        """One attempt of a request under the policy (see ``propagation._resilience``)."""
        try:
            response = self._send(_copy(request))
        except _RAISED:
            raise
        except Exception as exc:
            return Passed(exc)
        if response.status_code not in self._retry_statuses:
            return response
        stream = response.stream
        assert isinstance(stream, httpx.SyncByteStream)  # as httpx's own sync reads require
        try:
            body, whole = read_prefix(stream, REFUSAL_BODY_MAX)
        finally:
            stream.close()  # read to its end: the connection goes back to the pool
        raise _failed(response, body, whole, self._options.what)

    def _send(self, request: httpx.Request) -> httpx.Response:
        if not tracing_active():
            return self._handle_request(request)
        # With spans exported, a client span carrying the budget sent (D10.4).
        with client_span(request.method, str(request.url), request.headers) as answered:
            response = self._handle_request(request)
            answered(response.status_code, request.headers.get(self._options.timeout_header))
            return response

    def _handle_request(self, request: httpx.Request) -> httpx.Response:
        static = self._static(request)
        attempt = self._begin(request, static)
        # httpcore's pool timeout is not shortened to our deadline: it leaks the connection it
        # has just assigned (encode/httpcore#1093); our own slot wait ends at the deadline.
        _prepare(request, attempt, phases_to=attempt.clamped.seconds, pool_to=static)
        if attempt.end is not None or self._hedging:
            _gate_steps(request, attempt, hedged=self._hedging)
        release = _RELEASED
        try:
            with attempt.boundary():
                if self._slots is not None:
                    release = _admit(self._slots, request, attempt.end)
                response = self._inner.handle_request(request)
            attempt.answered(response.status_code, response.headers.get(BREAKDOWN_HEADER))
            refusal = attempt.refusal(
                response.status_code, response.headers.get(self._options.expired_header)
            )
            if refusal is not None:
                # Read the short body so the connection goes back to the pool intact (D4.8);
                # past the attempt's end the step gate refuses the read: close it unread (the
                # refusal is the error, never the gate's own _Spent).
                try:
                    _read_short(response)
                except _TIMEOUTS:
                    pass
                finally:
                    response.close()
                raise attempt.refused(refusal)
        except BaseException as exc:
            attempt.part(type(exc).__name__)
            release()
            raise
        if attempt.end is not None or release is not _RELEASED:
            response.stream = _SyncStream(response.stream, attempt, release)
        return response

    def close(self) -> None:
        self._inner.close()


def _close(response: httpx.Response) -> None:
    """Release the answer of a hedge that lost (D3.18): closed unread, its connection is
    dropped and its pool slot given back."""
    try:
        response.close()
    except Exception:  # nobody to tell: the caller has its answer already
        pass


def _gate_steps(request: httpx.Request, attempt: Attempt, *, hedged: bool) -> None:
    """Sync: bound every step after the pool wait by the time left.

    A sync pool wait cannot be interrupted, and its timeout must not be our deadline (see
    :meth:`DeadlineTransport.handle_request`), so the wait may end after the attempt's end. At
    the start of each later step httpcore traces (connect, send, receive), the step's phase
    timeouts — read by httpcore from the request's own ``timeout`` mapping at every I/O — are
    lowered to the time left, and a step that would start after the end raises :class:`_Spent`
    (mapped to the cut by the boundary); httpcore closes a connection that stops there.

    ``hedged``: the transport hedges (D3.18); a hedge that lost the race has its deadline cut
    short by the race while it runs, and the next step it would start raises that cut instead
    (nothing more is sent, no body read).
    """
    phases: dict[str, float | None] = request.extensions["timeout"]
    theirs = request.extensions.get("trace")
    end = attempt.end

    def trace(name: str, info: dict[str, Any]) -> None:
        if name.partition(".")[2] in _STEPS:
            lost = attempt.abandoned() if hedged else None
            if lost is not None:
                raise lost  # a hedge that lost the race
            if end is not None:
                left = end - _clock.now()
                if left <= 0:
                    raise _Spent(name)
                for phase in ("connect", "read", "write"):
                    value = phases.get(phase)
                    phases[phase] = left if value is None else min(value, left)
        if theirs is not None:
            theirs(name, info)

    request.extensions = {**request.extensions, "trace": trace}


def _pool_size(inner: object) -> int | None:
    """The number of connections of httpx's own HTTP/1.1 pool (``None``: no wait to take over).

    httpcore's pool leaks a connection when a request's pool timeout fires while the pool is
    handing that request a new connection (encode/httpcore#1093): the connection stays
    "CONNECTING", owned by nobody, and once ``max_connections`` have leaked every later request
    fails with ``PoolTimeout``. A deadline storm provokes it: reproduced with 64 threads over 2
    connections and a 40 ms pool timeout, the sync client was wedged after 31 of 40 storms (the
    async one, 64 tasks over 8 connections and 60 ms, after 23 of 25). So both
    transports keep one slot per connection and a request waits for a slot, where a wait that
    ends leaves nothing behind; httpcore then never queues one (each admitted request finds a
    connection free, or room for one). The size is read from httpx's transport, the only place
    it is kept; an HTTP/2 pool multiplexes many requests over one connection, so it is left to
    wait itself.
    """
    if not isinstance(inner, (httpx.HTTPTransport, httpx.AsyncHTTPTransport)):
        return None
    pool = getattr(inner, "_pool", None)
    size = getattr(pool, "_max_connections", None)
    if not isinstance(size, int) or getattr(pool, "_http2", True):
        return None
    return size


def _admit(
    slots: threading.BoundedSemaphore, request: httpx.Request, end: float | None
) -> Callable[[], None]:
    """Wait for a slot until the pool timeout or the attempt's end, whichever comes first;
    return the slot's release (idempotent). A wait that ends raises ``httpx.PoolTimeout``,
    which the attempt's boundary turns into the cut when the attempt's end has passed."""
    pool = request.extensions["timeout"].get("pool")
    ends = [e for e in (end, None if pool is None else _clock.now() + pool) if e is not None]
    # An unbounded wait blocks until a slot is free; a bounded one may wake a hair before its
    # end (never report a timeout early, D1.3), so it waits again for what is left.
    while not slots.acquire(timeout=max(0.0, min(ends) - _clock.now()) if ends else -1):
        if _clock.now() >= min(ends):
            raise httpx.PoolTimeout("timed out waiting for a pooled connection")
    return _once(slots.release)


def _released() -> None:
    """The release of a request that holds no slot."""


_RELEASED: Callable[[], None] = _released


async def _admit_async(slots: anyio.Semaphore, request: httpx.Request) -> Callable[[], None]:
    """The async :func:`_admit`: wait for a slot until the pool timeout (the caller leaves at
    its own end anyway); return the slot's release (idempotent)."""
    pool = request.extensions["timeout"].get("pool")
    if pool is None:
        await slots.acquire()
    else:
        acquired = False
        with move_on_at(Deadline(_clock.now() + pool)):
            await slots.acquire()
            acquired = True
        if not acquired:
            raise httpx.PoolTimeout("timed out waiting for a pooled connection")
    return _once(slots.release)


def _once(release: Callable[[], None]) -> Callable[[], None]:
    """``release``, run at most once however often the result is called."""
    released = False

    def once() -> None:
        nonlocal released
        if not released:
            released = True
            release()

    return once


class _SyncStream(httpx.SyncByteStream):
    """The body: the clock checked after every chunk, the pool slot released on close."""

    def __init__(self, inner: Any, attempt: Attempt, release: Callable[[], None]) -> None:
        self._inner = inner
        self._attempt = attempt
        self._release = release

    def __iter__(self) -> Iterator[bytes]:
        with self._attempt.boundary():
            for chunk in self._inner:
                self._attempt.check()
                yield chunk

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._release()


class AsyncDeadlineTransport(_Base, httpx.AsyncBaseTransport):
    """An async httpx transport that clamps, propagates and enforces the deadline.

    ``inner`` defaults to ``httpx.AsyncHTTPTransport()``; options as :class:`DeadlineTransport`.

    Every exchange that can be cut runs in a task of its own (a system task under trio), and
    a cut never cancels it while its request still waits for a pooled connection (see
    :class:`_Exchange`): cancelling there leaks the connection httpcore has just created for
    it (encode/httpcore#1093, #830), and once ``max_connections`` have leaked every later
    request on the client fails. The caller still leaves at its deadline.

    ``save_connections`` (default on, D4.8; asyncio only): when our deadline lowered the
    timeout, a cut releases the caller only; the exchange goes on in its task up to the static
    timeout so that its pooled connection is not closed. ``save_connections=False`` (and trio)
    cancels the exchange at the cut, once it has its connection (a connection mid-response is
    then closed). The task was measured at ~14 us per call in-process on Python 3.11 and ~100 us
    of latency per forwarding hop in ``bench/propagation.py`` (docs/propagation.md, "Benchmark:
    the work saved"), when only lowered calls paid it.
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport | None = None,
        *,
        timeout: Duration | None = None,
        propagate_header: bool = True,
        timeout_header: str = TIMEOUT_HEADER,
        absolute_header: str | None = ABSOLUTE_HEADER,
        expired_header: str = EXPIRED_HEADER,
        what: str = "http request",
        save_connections: bool = True,
        ask_breakdown: bool = False,
        policy: Policy[Any] | None = None,
        retry_statuses: Iterable[int] = DEFAULT_RETRY_STATUSES,
        hedge_methods: Iterable[str] = DEFAULT_HEDGE_METHODS,
    ) -> None:
        super().__init__(
            http_client_setup(
                "AsyncDeadlineTransport",
                timeout=timeout,
                propagate_header=propagate_header,
                timeout_header=timeout_header,
                absolute_header=absolute_header,
                expired_header=expired_header,
                what=what,
                ask_breakdown=ask_breakdown,
                policy=policy,
                retry_statuses=retry_statuses,
                hedge_methods=hedge_methods,
            )
        )
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self._save_connections = bool(save_connections)
        # Only httpcore's pool (behind httpx's own transport) has the pool-wait hazard; any
        # other transport's exchange may be cancelled at once.
        self._pooled = isinstance(self._inner, httpx.AsyncHTTPTransport)
        size = _pool_size(self._inner)
        self._slots = None if size is None else anyio.Semaphore(size)

    def handle_async_request(self, request: httpx.Request) -> Coroutine[Any, Any, httpx.Response]:
        if self._resilience is not None:
            return self._resilient(request)
        return self._send(request)

    async def _resilient(self, request: httpx.Request) -> httpx.Response:
        assert self._resilience is not None
        # D3.17: each attempt (hedges too) sends a copy: its own deadline headers and phase
        # timeouts, the same deadline.
        response: httpx.Response = await self._resilience.run(
            request.method, self._attempt, request
        )
        return response

    async def _attempt(self, request: httpx.Request) -> httpx.Response | Passed:
        """One attempt of a request under the policy (see ``propagation._resilience``)."""
        try:
            response = await self._send(_copy(request))
        except _RAISED:
            raise
        except Exception as exc:
            return Passed(exc)
        if response.status_code not in self._retry_statuses:
            return response
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)  # as httpx's own async reads require
        try:
            body, whole = await aread_prefix(stream, REFUSAL_BODY_MAX)
        finally:
            await stream.aclose()  # read to its end: the connection goes back to the pool
        raise _failed(response, body, whole, self._options.what)

    def _send(self, request: httpx.Request) -> Coroutine[Any, Any, httpx.Response]:
        # Not a coroutine of its own: the untraced call costs no extra frame per request.
        if not tracing_active():
            return self._handle_async_request(request)
        return self._traced_async_request(request)

    async def _traced_async_request(self, request: httpx.Request) -> httpx.Response:
        # With spans exported, a client span carrying the budget sent (D10.4).
        with client_span(request.method, str(request.url), request.headers) as answered:
            response = await self._handle_async_request(request)
            answered(response.status_code, request.headers.get(self._options.timeout_header))
            return response

    async def _handle_async_request(self, request: httpx.Request) -> httpx.Response:
        static = self._static(request)
        attempt = self._begin(request, static)
        seconds = attempt.clamped.seconds
        if attempt.end is None:
            _prepare(request, attempt, phases_to=None, pool_to=None)
            try:
                response = await self._inner.handle_async_request(request)
            except BaseException as exc:
                attempt.part(type(exc).__name__)
                raise
            attempt.answered(response.status_code, response.headers.get(BREAKDOWN_HEADER))
            return response
        # The pool wait is never shortened to our deadline: httpcore's pool timeout leaks a
        # connection just as a cancel does (encode/httpcore#1093); the caller leaves at the
        # cut anyway.
        loop = asyncio._get_running_loop()
        keep = (
            loop is not None and self._save_connections and attempt.lowered and static is not None
        )
        try:
            response = await self._exchange(request, attempt, static, seconds, loop, keep)
        except BaseException as exc:
            attempt.part(type(exc).__name__)
            raise
        attempt.answered(response.status_code, response.headers.get(BREAKDOWN_HEADER))
        refusal = attempt.refusal(
            response.status_code, response.headers.get(self._options.expired_header)
        )
        if refusal is not None:
            try:
                await attempt.run(_aread_short, response)
            finally:
                await response.aclose()
            raise attempt.refused(refusal)
        response.stream = _AsyncStream(response.stream, attempt)
        return response

    async def _exchange(
        self,
        request: httpx.Request,
        attempt: Attempt,
        static: float | None,
        seconds: float | None,
        loop: asyncio.AbstractEventLoop | None,
        keep: bool,
    ) -> httpx.Response:
        exchange: _Exchange
        if not self._pooled and not keep:
            # Nothing to save and no pool to wedge: the exchange may be cancelled at any await,
            # so it runs in the caller's task (a task of its own costs a loop iteration to
            # start and another to hand the response back, per call).
            _prepare(request, attempt, phases_to=seconds, pool_to=static)
            response = await attempt.run(self._inner.handle_async_request, request)
        elif loop is None:
            _prepare(request, attempt, phases_to=seconds, pool_to=static)
            exchange = _TrioExchange(self._inner, request, self._slots, gated=self._pooled)
            response = await exchange.wait(attempt, None)
        else:
            # A kept exchange may outlive our deadline, up to the static timeout (its phases
            # too).
            _prepare(request, attempt, phases_to=static if keep else seconds, pool_to=static)
            keep_until = _clock.now() + static if keep and static is not None else None
            exchange = _AsyncioExchange(self._inner, request, self._slots, loop, gated=self._pooled)
            response = await exchange.wait(attempt, keep_until)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


_EXCHANGE = "timebound-httpx-exchange"


class _Exchange:
    """One exchange in a task of its own, cancelled only where httpcore can take it.

    httpcore's pool hands a queued request a *new* connection by setting an event the request's
    task waits on; a cancellation delivered before that task wakes up leaves the connection in
    the pool, never connected and owned by nobody (encode/httpcore#1093). Once
    ``max_connections`` have leaked, every request on the client fails. So the caller never
    waits inside httpcore: it waits for this task's result, under its own deadline, and leaves
    at the cut whatever the task is doing. The task is cancelled only once its request holds a
    connection — the first ``trace`` event httpcore emits comes from the connection, after the
    pool wait — and a cancel asked for earlier is deferred to that event. A request that never
    gets a connection ends by itself at the pool timeout (at most the static timeout).
    Detecting the leak afterwards would mean reading httpcore's private pool state; not
    causing it needs only its public trace hook.

    The exchange cannot start in the caller's task and be handed over at the cut: httpcore's
    anyio cancel scopes belong to the task that entered them. The task carries no scope of its
    own: the caller's scope always ends first. Subclasses supply the task (asyncio, trio).
    """

    __slots__ = ("_attempt", "_cancel_asked", "_connected", "_error", "_left", "_response")

    def __init__(self, request: httpx.Request, *, gated: bool) -> None:
        self._attempt: Attempt | None = None
        self._connected = not gated
        self._cancel_asked = False
        self._left = False
        self._response: httpx.Response | None = None
        self._error: Exception | None = None
        if gated:
            request.extensions = {**request.extensions, "trace": self._tracer(request)}

    def _tracer(self, request: httpx.Request) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
        theirs = request.extensions.get("trace")

        async def trace(name: str, info: dict[str, Any]) -> None:
            if not self._connected:
                self._connected = True
                if self._cancel_asked:
                    self._cancel_now()  # lands at the connection's next await: safe there
            if theirs is not None:
                await theirs(name, info)

        return trace

    def cancel(self) -> None:
        """Cancel the exchange now if httpcore can take it, else when its connection is had."""
        if self._connected:
            self._cancel_now()
        else:
            self._cancel_asked = True

    async def _run(
        self,
        inner: httpx.AsyncBaseTransport,
        request: httpx.Request,
        slots: anyio.Semaphore | None,
    ) -> None:
        """The task: hand the response (or the error) over; once the caller left, release it.

        With ``slots`` (see :func:`_pool_size`) it first waits for a slot, held until the
        response is closed, so that httpcore never queues the request.
        """
        release = _RELEASED
        try:
            if slots is not None:
                release = await _admit_async(slots, request)
                if self._left:
                    # The caller left while we waited for a slot: nothing is sent yet, so
                    # there is no connection to save — and sending now would be a late call.
                    release()
                    self._wake()
                    return
            response = await inner.handle_async_request(request)
        except Exception as exc:
            release()
            self._error = exc  # an abandoned exchange's failure has nobody to tell
            self._wake()
            return
        except BaseException:
            release()
            self._wake()
            raise
        if release is not _RELEASED:
            response.stream = _AsyncReleasing(response.stream, release)
        if self._attempt is not None:
            # D13: the callee's side reaches the call's part even when the caller's deadline
            # cuts it in this very step (the answer is here; the caller has not run yet).
            self._attempt.arrived(response.headers.get(BREAKDOWN_HEADER))
        if self._left:
            self._wake()
            await _release(response)
            return
        self._response = response
        self._wake()

    async def wait(self, attempt: Attempt, keep_until: float | None) -> httpx.Response:
        """The response, or the attempt's error at its end (the caller never waits longer).

        ``keep_until``: at a cut by our deadline, leave the exchange running until then (D4.8)
        and release its response; ``None``: cancel it at the cut.
        """
        self._attempt = attempt
        try:
            return await attempt.run(self._result)
        except BaseException:
            self._leave(keep_until if attempt.expired() else None)
            raise

    async def _result(self) -> httpx.Response:
        await self._arrival()
        if self._error is not None:
            raise self._error
        if self._response is None:
            raise RuntimeError("the httpx exchange task was cancelled")
        return self._response

    def _leave(self, keep_until: float | None) -> None:
        """The caller leaves without the response: end or bound the exchange, free its reply."""
        self._left = True
        response, self._response = self._response, None
        if response is not None:
            # Handed over in the very step the caller left: nobody will read it.
            self._release_later(response, keep_until)
        elif keep_until is None:
            self.cancel()
        else:
            self._cancel_at(keep_until)  # also bounds the release of a late response

    # The task, per event loop.

    def _wake(self) -> None:
        raise NotImplementedError

    async def _arrival(self) -> None:
        raise NotImplementedError

    def _cancel_now(self) -> None:
        raise NotImplementedError

    def _cancel_at(self, when: float) -> None:
        raise NotImplementedError

    def _release_later(self, response: httpx.Response, until: float | None) -> None:
        raise NotImplementedError


class _AsyncioExchange(_Exchange):
    """The exchange in an asyncio task; the caller awaits a future it completes (one wake-up;
    ``asyncio.shield`` over the task needs two, paid again per hop under load)."""

    __slots__ = ("_done", "_loop", "_task")

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        request: httpx.Request,
        slots: anyio.Semaphore | None,
        loop: asyncio.AbstractEventLoop,
        *,
        gated: bool,
    ) -> None:
        super().__init__(request, gated=gated)
        self._loop = loop
        self._done: asyncio.Future[None] = loop.create_future()
        self._task = _start(self._run(inner, request, slots), loop)

    def _wake(self) -> None:
        if not self._done.done():
            self._done.set_result(None)

    async def _arrival(self) -> None:
        await self._done

    def _cancel_now(self) -> None:
        self._task.cancel()

    def _cancel_at(self, when: float) -> None:
        if not self._task.done():
            timer = self._loop.call_at(when, self.cancel)
            self._task.add_done_callback(lambda _task: timer.cancel())

    def _release_later(self, response: httpx.Response, until: float | None) -> None:
        release = response.aclose() if until is None else _release_by(response, until)
        spawn_background(release, name="timebound-httpx-drain")


class _TrioExchange(_Exchange):
    """The exchange in a trio system task (trio has no detached tasks otherwise); it is never
    kept past the cut (``save_connections`` needs asyncio)."""

    __slots__ = ("_event", "_scope", "_trio")

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        request: httpx.Request,
        slots: anyio.Semaphore | None,
        *,
        gated: bool,
    ) -> None:
        import trio

        super().__init__(request, gated=gated)
        self._trio = trio
        self._event = trio.Event()
        self._scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(
            self._run_scoped, inner, request, slots, name=_EXCHANGE, context=_clean_context()
        )

    async def _run_scoped(
        self,
        inner: httpx.AsyncBaseTransport,
        request: httpx.Request,
        slots: anyio.Semaphore | None,
    ) -> None:
        with self._scope:  # absorbs our own cancel; a system task must not raise
            await self._run(inner, request, slots)

    def _wake(self) -> None:
        self._event.set()

    async def _arrival(self) -> None:
        await self._event.wait()

    def _cancel_now(self) -> None:
        self._scope.cancel()

    def _cancel_at(self, when: float) -> None:  # pragma: no cover - trio never keeps
        self.cancel()

    def _release_later(self, response: httpx.Response, until: float | None) -> None:
        self._trio.lowlevel.spawn_system_task(
            response.aclose, name="timebound-httpx-drain", context=_clean_context()
        )


def _start(coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
    """Start an exchange task that does not inherit the caller's deadline (``spawn_background``).

    From Python 3.12 the task starts eagerly: the request is written within the caller's own
    step instead of one loop iteration later, and an exchange that completes without waiting
    (an in-process transport) is handed over with no iteration at all.
    """
    # The one registry of detached tasks holds it until it ends (the loop keeps only weak
    # references to tasks).
    return _spawn_detached(coro, loop=loop, name=_EXCHANGE, eager=True)


def _read_short(response: httpx.Response) -> None:
    """Read a refusal's body to its end if it is short; stop past ``REFUSAL_BODY_MAX`` (the
    response is then closed unread, and its connection with it)."""
    if not response.is_stream_consumed:  # else read already (a transport answering in memory)
        read_prefix(response.iter_raw(), REFUSAL_BODY_MAX)


async def _aread_short(response: httpx.Response) -> None:
    """:func:`_read_short` for an async response."""
    if not response.is_stream_consumed:
        await aread_prefix(response.aiter_raw(), REFUSAL_BODY_MAX)


async def _release(response: httpx.Response) -> None:
    """Read a response nobody waits for to its end if it is short and close it (the
    connection is reused); a body past ``REFUSAL_BODY_MAX`` is closed unread, its connection
    with it: a late answer costs at most that much memory, whatever its peer sends (D4.8)."""
    try:
        await _aread_short(response)
    except Exception:  # nobody to tell; httpcore has dropped a broken connection already
        pass
    finally:
        await response.aclose()


async def _release_by(response: httpx.Response, until: float) -> None:
    with move_on_at(Deadline(until)):
        await _release(response)


class _AsyncReleasing(httpx.AsyncByteStream):
    """httpcore's body, releasing the request's pool slot once closed."""

    def __init__(self, inner: Any, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        # httpcore's own iterator: no generator of ours left unfinished when a read is cut.
        iterator: AsyncIterator[bytes] = self._inner.__aiter__()
        return iterator

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._release()


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, attempt: Attempt) -> None:
        self._inner = inner
        self._attempt = attempt

    async def __aiter__(self) -> AsyncIterator[bytes]:
        iterator = self._inner.__aiter__()
        while True:
            try:
                chunk = await self._attempt.run(iterator.__anext__)
            except StopAsyncIteration:
                return
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
