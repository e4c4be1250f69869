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
from collections.abc import AsyncIterator, Coroutine, Iterator
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
from .._core._errors import DeadlineExceeded
from .._core._scopes import _spawn_detached, move_on_at, spawn_background
from ._client import Attempt, AttemptTimeoutBase, ClientOptions, begin, bounded
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


def _prepare(request: httpx.Request, attempt: Attempt, phases_to: float | None = None) -> None:
    """Write the header and clamp every phase timeout to ``phases_to`` (default: the attempt's)."""
    if attempt.header_value is not None:
        request.headers[attempt.options.timeout_header] = attempt.header_value
    seconds = attempt.clamped.seconds if phases_to is None else phases_to
    if seconds is None:
        return
    phases = dict(request.extensions.get("timeout") or {})
    for phase in _PHASES:
        value = phases.get(phase)
        phases[phase] = seconds if value is None else min(value, seconds)
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

    def _attempt(self, request: httpx.Request) -> Attempt:
        attempt = begin(_static_timeout(self._timeout, request), self._options)
        _prepare(request, attempt)
        return attempt

    def _static(self, request: httpx.Request) -> float | None:
        return _static_timeout(self._timeout, request)

    def _factory(self, request: httpx.Request, attempt: Attempt, *, remote: bool = False) -> Any:
        def make(message: str) -> AttemptTimeout:
            return AttemptTimeout(
                message, request=request, remote=remote, timeout=attempt.clamped.seconds
            )

        return make

    def _remote_expired(self, response: httpx.Response, attempt: Attempt) -> bool:
        header = response.headers.get(self._options.expired_header)
        return attempt.is_remote_expired(response.status_code, header)


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
        attempt = self._attempt(request)
        try:
            response = self._inner.handle_request(request)
        except httpx.TimeoutException as exc:
            if attempt.expired():
                raise attempt.cut(self._factory(request, attempt)) from exc
            raise
        if self._remote_expired(response, attempt):
            # Read the short body so the connection goes back to the pool intact (D4.8).
            try:
                response.read()
            finally:
                response.close()
            raise attempt.remote_expired(
                response.status_code, self._factory(request, attempt, remote=True)
            )
        if attempt.end is not None:
            response.stream = _SyncStream(response.stream, attempt, self._factory(request, attempt))
        return response

    def close(self) -> None:
        self._inner.close()


class _SyncStream(httpx.SyncByteStream):
    def __init__(self, inner: Any, attempt: Attempt, make: Any) -> None:
        self._inner = inner
        self._attempt = attempt
        self._make = make

    def __iter__(self) -> Iterator[bytes]:
        attempt = self._attempt
        try:
            for chunk in self._inner:
                if attempt.expired():
                    raise attempt.cut(self._make)
                yield chunk
        except httpx.TimeoutException as exc:
            if attempt.expired():
                raise attempt.cut(self._make) from exc
            raise

    def close(self) -> None:
        self._inner.close()


class AsyncDeadlineTransport(_Base, httpx.AsyncBaseTransport):
    """An async httpx transport that clamps, propagates and enforces the deadline.

    ``inner`` defaults to ``httpx.AsyncHTTPTransport()``; options as :class:`DeadlineTransport`.

    ``save_connections`` (default on, D4.8): when our deadline lowered the timeout, the exchange
    runs in a background task so that a cut releases the caller at once without closing the
    pooled connection. The price is paid on every such call, cut or not: one task and, before
    Python 3.12, two more loop iterations (one on 3.12+). Measured on Python 3.11: ~14 us per
    call in-process over the inline path, ~100 us of latency per forwarding hop in
    ``bench/propagation.py`` (docs/propagation.md, "Benchmark: the work saved").
    ``save_connections=False`` awaits the exchange inline and cancels it at the cut (the
    connection mid-response is then closed): cheaper per call, costlier when deadlines fire.
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

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        static = self._static(request)
        attempt = begin(static, self._options)
        make = self._factory(request, attempt)
        response: httpx.Response
        if attempt.end is None:
            _prepare(request, attempt)
            return await self._inner.handle_async_request(request)
        if (
            attempt.lowered
            and static is not None
            and self._save_connections
            and asyncio._get_running_loop() is not None  # background tasks need asyncio, not trio
        ):
            # Phases get the static timeout: the exchange may outlive our deadline (below).
            _prepare(request, attempt, phases_to=static)
            response = await self._exchange_saving_connection(request, attempt, static, make)
        else:
            _prepare(request, attempt)
            response = await bounded(
                attempt, make, _TIMEOUTS, self._inner.handle_async_request, request
            )
        if self._remote_expired(response, attempt):
            try:
                await bounded(attempt, make, _TIMEOUTS, response.aread)
            finally:
                await response.aclose()
            raise attempt.remote_expired(
                response.status_code, self._factory(request, attempt, remote=True)
            )
        response.stream = _AsyncStream(response.stream, attempt, make)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def _exchange_saving_connection(
        self, request: httpx.Request, attempt: Attempt, static: float, make: Any
    ) -> httpx.Response:
        """Run the exchange in a background task; at our deadline release the caller only.

        userver's rule (D4.8, FIELD-NOTES): when a *propagated* deadline cuts a call short, the
        caller gets its error at once, but the physical request goes on in the background, up
        to the static timeout, so its pooled connection is not closed. Cancelling the exchange
        mid-response would force httpcore to close the connection, and under overload — exactly
        when deadlines fire — reconnecting is the expensive part. The server got our header, so
        it usually answers "deadline expired" right after our deadline anyway.

        The exchange cannot start in the caller's task and be handed over at the cut: httpcore's
        anyio cancel scopes belong to the task that entered them. So it has its own task, kept
        as cheap as a task can be, since every loop iteration it adds is paid again per hop
        under load: the task hands the response straight to a future the caller awaits (one
        wake-up; ``asyncio.shield`` over the task needs two), and it carries no scope of its
        own — the caller's scope always ends first, since our deadline lowered the timeout.
        Only an abandoned exchange gets its static bound (a timer) and drains its response.
        """
        loop = asyncio.get_running_loop()
        until = _clock.now() + static  # the exchange's own bound, if it is ever abandoned
        handoff: asyncio.Future[httpx.Response] = loop.create_future()
        task = _start(_exchange(self._inner, request, handoff), loop)
        assert attempt.end is not None
        scope = move_on_at(Deadline(attempt.end))
        try:
            with scope:
                return await handoff
        except (DeadlineExceeded, asyncio.CancelledError):
            if attempt.expired():
                attempt.note_cut()
                _abandon(handoff, task, loop, until)
            else:
                task.cancel()
                _release_unclaimed(handoff, until)
            raise
        except httpx.TimeoutException as exc:
            if attempt.expired():
                raise attempt.cut(make) from exc
            raise
        _abandon(handoff, task, loop, until)
        raise attempt.cut(make)


_EXCHANGE = "timebound-httpx-exchange"


def _start(coro: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop) -> asyncio.Task[None]:
    """Start an exchange task that does not inherit the caller's deadline (``spawn_background``).

    From Python 3.12 the task starts eagerly: the request is written within the caller's own
    step instead of one loop iteration later, and an exchange that completes without waiting
    (an in-process transport) is handed over with no iteration at all.
    """
    return _spawn_detached(coro, loop=loop, name=_EXCHANGE, eager=True)


async def _exchange(
    inner: httpx.AsyncBaseTransport,
    request: httpx.Request,
    handoff: asyncio.Future[httpx.Response],
) -> None:
    """The background half of a connection-saving exchange.

    Hands the response (or the error) to ``handoff``. Once the caller has left (``handoff``
    cancelled) it reads and releases the response, so the connection goes back to the pool;
    :func:`_abandon` bounds it by then.
    """
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


def _abandon(
    handoff: asyncio.Future[httpx.Response],
    task: asyncio.Task[None],
    loop: asyncio.AbstractEventLoop,
    until: float,
) -> None:
    """The caller leaves at the cut; the exchange goes on, bounded by its static timeout."""
    if _release_unclaimed(handoff, until):
        return
    handoff.cancel()  # already cancelled with the caller's wait; this makes it explicit
    if not task.done():
        timer = loop.call_at(until, task.cancel)
        task.add_done_callback(lambda _task: timer.cancel())


def _release_unclaimed(handoff: asyncio.Future[httpx.Response], until: float) -> bool:
    """Release a response handed over in the very iteration the caller left; True if one was."""
    if handoff.done() and not handoff.cancelled() and handoff.exception() is None:
        spawn_background(_release_by(handoff.result(), until), name="timebound-httpx-drain")
        return True
    return False


class _AsyncStream(httpx.AsyncByteStream):
    def __init__(self, inner: Any, attempt: Attempt, make: Any) -> None:
        self._inner = inner
        self._attempt = attempt
        self._make = make

    async def __aiter__(self) -> AsyncIterator[bytes]:
        iterator = self._inner.__aiter__()
        while True:
            try:
                chunk = await bounded(self._attempt, self._make, _TIMEOUTS, iterator.__anext__)
            except StopAsyncIteration:
                return
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()
