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

* async: a timebound scope around the exchange, and one around every chunk read of the response
  body, so a stalled read is interrupted exactly at the end of the attempt;
* sync: every phase timeout is set to at most the time left, and the body stream checks the
  clock after every chunk (a sync read cannot be interrupted: a server trickling bytes can
  overrun by at most one read timeout).

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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.httpx needs httpx: pip install 'timebound[httpx]'"
    ) from exc

from .._core import _clock
from .._core._deadline import Deadline
from .._core._durations import Duration, to_seconds
from .._core._scopes import _spawn_detached, move_on_at, spawn_background
from ._client import Attempt, AttemptTimeoutBase, ClientOptions, begin
from ._codec import EXPIRED_HEADER, TIMEOUT_HEADER

__all__ = ["AsyncDeadlineTransport", "AttemptTimeout", "DeadlineTransport"]

_PHASES = ("connect", "read", "write", "pool")
_TIMEOUTS: tuple[type[BaseException], ...] = (httpx.TimeoutException,)


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
    if attempt.header_value is not None:
        request.headers[attempt.options.timeout_header] = attempt.header_value
    phases = dict(request.extensions.get("timeout") or {})
    for phase in _PHASES:
        limit = pool_to if phase == "pool" else phases_to
        if limit is not None:
            value = phases.get(phase)
            phases[phase] = limit if value is None else min(value, limit)
    request.extensions = {**request.extensions, "timeout": phases}


class _Base:
    def __init__(
        self,
        *,
        timeout: Duration | None,
        propagate_header: bool,
        timeout_header: str,
        expired_header: str,
        what: str,
    ) -> None:
        self._timeout = None if timeout is None else to_seconds(timeout, option="timeout")
        self._options = ClientOptions(
            propagate_header=propagate_header,
            timeout_header=timeout_header,
            expired_header=expired_header,
            what=what,
        )

    def _begin(self, request: httpx.Request, static: float | None) -> Attempt:
        return begin(
            static, self._options, functools.partial(AttemptTimeout, request=request), _TIMEOUTS
        )

    def _static(self, request: httpx.Request) -> float | None:
        return _static_timeout(self._timeout, request)


class DeadlineTransport(_Base, httpx.BaseTransport):
    """A sync httpx transport that clamps, propagates and enforces the deadline.

    ``inner`` defaults to ``httpx.HTTPTransport()``. ``timeout``: a total for each attempt
    (seconds, timedelta or ``"5s"``). ``propagate_header=False`` keeps clamping but sends no
    ``X-YaTaxi-Client-TimeoutMs`` (userver's ``set-deadline-propagation-header: false``).
    """

    def __init__(
        self,
        inner: httpx.BaseTransport | None = None,
        *,
        timeout: Duration | None = None,
        propagate_header: bool = True,
        timeout_header: str = TIMEOUT_HEADER,
        expired_header: str = EXPIRED_HEADER,
        what: str = "http request",
    ) -> None:
        super().__init__(
            timeout=timeout,
            propagate_header=propagate_header,
            timeout_header=timeout_header,
            expired_header=expired_header,
            what=what,
        )
        self._inner = inner if inner is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempt = self._begin(request, self._static(request))
        seconds = attempt.clamped.seconds
        _prepare(request, attempt, phases_to=seconds, pool_to=seconds)
        with attempt.boundary():
            response = self._inner.handle_request(request)
        refusal = attempt.refusal(
            response.status_code, response.headers.get(self._options.expired_header)
        )
        if refusal is not None:
            # Read the short body so the connection goes back to the pool intact (D4.8).
            try:
                response.read()
            finally:
                response.close()
            raise refusal
        if attempt.end is not None:
            response.stream = _SyncStream(response.stream, attempt)
        return response

    def close(self) -> None:
        self._inner.close()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, attempt: Attempt) -> None:
        self._inner = inner
        self._attempt = attempt

    def __iter__(self) -> Iterator[bytes]:
        with self._attempt.boundary():
            for chunk in self._inner:
                self._attempt.check()
                yield chunk

    def close(self) -> None:
        self._inner.close()


class AsyncDeadlineTransport(_Base, httpx.AsyncBaseTransport):
    """An async httpx transport that clamps, propagates and enforces the deadline.

    ``inner`` defaults to ``httpx.AsyncHTTPTransport()``; options as :class:`DeadlineTransport`.

    On asyncio, every exchange that can be cut runs in a task of its own, and a cut never
    cancels it while its request still waits for a pooled connection (see
    :class:`_Exchange`): cancelling there leaks the connection httpcore has just created for
    it (encode/httpcore#1093, #830), and once ``max_connections`` have leaked every later
    request on the client fails. The caller still leaves at its deadline.

    ``save_connections`` (default on, D4.8): when our deadline lowered the timeout, a cut
    releases the caller only; the exchange goes on in the background up to the static timeout
    so that its pooled connection is not closed. ``save_connections=False`` cancels the
    exchange at the cut (once it has its connection; a connection mid-response is then
    closed). The task costs ~14 us per call in-process on Python 3.11 and ~100 us of latency
    per forwarding hop in ``bench/propagation.py`` (docs/propagation.md, "Benchmark: the work
    saved").
    """

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport | None = None,
        *,
        timeout: Duration | None = None,
        propagate_header: bool = True,
        timeout_header: str = TIMEOUT_HEADER,
        expired_header: str = EXPIRED_HEADER,
        what: str = "http request",
        save_connections: bool = True,
    ) -> None:
        super().__init__(
            timeout=timeout,
            propagate_header=propagate_header,
            timeout_header=timeout_header,
            expired_header=expired_header,
            what=what,
        )
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self._save_connections = bool(save_connections)
        # Only httpcore's pool (behind httpx's own transport) has the pool-wait hazard; any
        # other transport's exchange may be cancelled at once.
        self._pooled = isinstance(self._inner, httpx.AsyncHTTPTransport)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        static = self._static(request)
        attempt = self._begin(request, static)
        seconds = attempt.clamped.seconds
        if attempt.end is None:
            _prepare(request, attempt, phases_to=None, pool_to=None)
            return await self._inner.handle_async_request(request)
        loop = asyncio._get_running_loop()
        if loop is None:
            # trio: no task to hand the exchange to (see docs/propagation.md, "httpx").
            _prepare(request, attempt, phases_to=seconds, pool_to=seconds)
            response = await attempt.run(self._inner.handle_async_request, request)
        else:
            # A kept exchange may outlive our deadline, up to the static timeout (its phases
            # too). The pool wait is never shortened to our deadline: httpcore's pool timeout
            # leaks a connection just as a cancel does (encode/httpcore#1093), and the caller
            # leaves at the cut anyway.
            keep = self._save_connections and attempt.lowered and static is not None
            _prepare(request, attempt, phases_to=static if keep else seconds, pool_to=static)
            keep_until = _clock.now() + static if keep and static is not None else None
            exchange = _Exchange(self._inner, request, loop, gated=self._pooled)
            response = await exchange.wait(attempt, keep_until)
        refusal = attempt.refusal(
            response.status_code, response.headers.get(self._options.expired_header)
        )
        if refusal is not None:
            try:
                await attempt.run(response.aread)
            finally:
                await response.aclose()
            raise refusal
        response.stream = _AsyncStream(response.stream, attempt)
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
    waits inside httpcore: it waits for a hand-off from this task, under its own deadline, and
    leaves at the cut whatever the task is doing. The task is cancelled only once its request
    holds a connection — the first ``trace`` event httpcore emits comes from the connection,
    after the pool wait — and a cancel asked for earlier is deferred to that event. A request
    that never gets a connection ends by itself at the pool timeout (set to at most the
    attempt's timeout, or the static one for a kept exchange). Detecting the leak afterwards
    would mean reading httpcore's private pool state; not causing it needs only its public
    trace hook.

    The exchange cannot start in the caller's task and be handed over at the cut: httpcore's
    anyio cancel scopes belong to the task that entered them. The task hands the response
    straight to a future the caller awaits (one wake-up; ``asyncio.shield`` over the task needs
    two), and it carries no scope of its own: the caller's scope always ends first.
    """

    __slots__ = ("_cancel_asked", "_connected", "_handoff", "_loop", "_task")

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        request: httpx.Request,
        loop: asyncio.AbstractEventLoop,
        *,
        gated: bool,
    ) -> None:
        self._loop = loop
        self._connected = not gated
        self._cancel_asked = False
        self._handoff: asyncio.Future[httpx.Response] = loop.create_future()
        if gated:
            request.extensions = {**request.extensions, "trace": self._tracer(request)}
        self._task = _start(self._run(inner, request), loop)

    def _tracer(self, request: httpx.Request) -> Callable[[str, dict[str, Any]], Awaitable[None]]:
        theirs = request.extensions.get("trace")

        async def trace(name: str, info: dict[str, Any]) -> None:
            if not self._connected:
                self._connected = True
                if self._cancel_asked:
                    self._task.cancel()  # lands at the connection's next await: safe there
            if theirs is not None:
                await theirs(name, info)

        return trace

    def cancel(self) -> None:
        """Cancel the exchange now if httpcore can take it, else when its connection is had."""
        if self._connected:
            self._task.cancel()
        else:
            self._cancel_asked = True

    async def wait(self, attempt: Attempt, keep_until: float | None) -> httpx.Response:
        """The response, or the attempt's error at its end (the caller never waits longer).

        ``keep_until``: at a cut by our deadline, leave the exchange running until then (D4.8)
        and release its response; ``None``: cancel it at the cut.
        """
        assert attempt.end is not None
        try:
            with attempt.boundary(), move_on_at(Deadline(attempt.end)):
                return await self._handoff
        except BaseException:
            self._leave(keep_until if attempt.expired() else None)
            raise
        self._leave(keep_until)
        raise attempt.cut()

    def _leave(self, keep_until: float | None) -> None:
        """The caller leaves without the response: end or bound the exchange, free its reply."""
        handoff = self._handoff
        if handoff.done() and not handoff.cancelled() and handoff.exception() is None:
            # Handed over in the very iteration the caller left: nobody will read it.
            response = handoff.result()
            release = response.aclose() if keep_until is None else _release_by(response, keep_until)
            spawn_background(release, name="timebound-httpx-drain")
            return
        handoff.cancel()  # tells the task nobody waits for its response
        if self._task.done():
            return
        if keep_until is None:
            self.cancel()
        else:
            timer = self._loop.call_at(keep_until, self.cancel)
            self._task.add_done_callback(lambda _task: timer.cancel())

    async def _run(self, inner: httpx.AsyncBaseTransport, request: httpx.Request) -> None:
        """Hand the response (or the error) over; once the caller has left, release it."""
        handoff = self._handoff
        try:
            response = await inner.handle_async_request(request)
        except asyncio.CancelledError:
            handoff.cancel()
            raise
        except Exception as exc:
            if not handoff.done():
                handoff.set_exception(exc)
            return  # an abandoned exchange's failure has nobody to tell
        if not handoff.done():
            handoff.set_result(response)
            return
        await _release(response)


def _start(coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
    """Start an exchange task that does not inherit the caller's deadline (``spawn_background``).

    From Python 3.12 the task starts eagerly: the request is written within the caller's own
    step instead of one loop iteration later, and an exchange that completes without waiting
    (an in-process transport) is handed over with no iteration at all.
    """
    # The one registry of detached tasks holds it until it ends (the loop keeps only weak
    # references to tasks).
    return _spawn_detached(coro, loop=loop, name=_EXCHANGE, eager=True)


async def _release(response: httpx.Response) -> None:
    """Read a response nobody waits for to its end and close it (the connection is reused)."""
    try:
        await response.aread()
    except Exception:  # nobody to tell; httpcore has dropped a broken connection already
        pass
    finally:
        await response.aclose()


async def _release_by(response: httpx.Response, until: float) -> None:
    with move_on_at(Deadline(until)):
        await _release(response)


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
