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
from collections.abc import AsyncIterator, Iterator
from typing import Any

try:
    import httpx
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.httpx needs httpx: pip install 'timebound[httpx]'"
    ) from exc

from .._core._deadline import Deadline
from .._core._durations import Duration, to_seconds
from .._core._errors import DeadlineExceeded
from .._core._scopes import fail_after, move_on_after, move_on_at, spawn_background
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
        """
        inner = self._inner

        async def exchange() -> httpx.Response:
            with fail_after(static, source="attempt"):
                response = await inner.handle_async_request(request)
            return response

        task = spawn_background(exchange(), name="timebound-httpx-exchange")
        assert attempt.end is not None
        scope = move_on_at(Deadline(attempt.end))
        try:
            with scope:
                response: httpx.Response = await asyncio.shield(task)
                return response
        except (DeadlineExceeded, asyncio.CancelledError):
            if attempt.expired():
                attempt.note_cut()
                _finish_in_background(task, static)
            else:
                task.cancel()
            raise
        except httpx.TimeoutException as exc:
            if attempt.expired():
                raise attempt.cut(make) from exc
            raise
        _finish_in_background(task, static)
        raise attempt.cut(make)


def _finish_in_background(task: asyncio.Task[httpx.Response], budget: float) -> None:
    """Let a cut exchange finish, read and release its response, within ``budget`` seconds."""

    async def finish() -> None:
        try:
            response = await task
        except BaseException:  # nobody waits for this exchange any more
            return
        try:
            with move_on_after(budget):
                await response.aread()
        finally:
            await response.aclose()

    spawn_background(finish(), name="timebound-httpx-drain")


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
