"""Deadline propagation for aiohttp clients, as a client middleware (aiohttp >= 3.12).

::

    import aiohttp
    from timebound.propagation.aiohttp import DeadlineMiddleware

    async with aiohttp.ClientSession(middlewares=(DeadlineMiddleware(timeout=5.0),)) as session:
        async with session.get(url) as response:
            body = await response.read()

Every attempt's timeout is ``min(static, remaining)``. The static timeout is the middleware's
``timeout`` when given, else the session's ``ClientTimeout.total`` (a per-request ``timeout=``
override is not visible to middlewares: pass ``timeout=`` here to be exact). The exchange until
the headers arrive runs under a timebound scope, and the response's ``content`` stream is wrapped
so every read (``read()``, ``text()``, ``json()``, ``iter_chunked()`` …) ends at the attempt's
end. Errors are as for :mod:`timebound.propagation.httpx`; :class:`AttemptTimeout` is also an
``aiohttp.ServerTimeoutError``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterable
from typing import Any

try:
    import aiohttp
    from aiohttp.streams import AsyncStreamIterator, ChunkTupleAsyncStreamIterator
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.aiohttp needs aiohttp: pip install 'timebound[aiohttp]'"
    ) from exc

from ..._core._body import aread_prefix
from ..._core._durations import Duration
from ..._core._errors import DeadlineExceeded
from ...policies._policy import Policy
from ...telemetry._tracing import active as tracing_active
from ...telemetry._tracing import client_span
from .._breakdown_wire import BREAKDOWN_HEADER
from .._client import (
    REFUSAL_BODY_MAX,
    Attempt,
    AttemptTimeoutBase,
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

__all__ = ["AttemptTimeout", "DeadlineMiddleware"]

_TIMEOUTS: tuple[type[BaseException], ...] = (aiohttp.ServerTimeoutError,)
#: The errors of an attempt that say the dependency failed (D3.17): the connection broke or
#: timed out (``ServerTimeoutError`` is one).
_FAILURES: tuple[type[BaseException], ...] = (aiohttp.ClientConnectionError,)
#: What an attempt raises to the policy as it is (D3.17); any other error is handed back.
_RAISED: tuple[type[BaseException], ...] = (DeadlineExceeded, *_FAILURES)
#: Why the middleware refuses a hedged policy (D3.18).
_NO_HEDGING = (
    "an aiohttp middleware is handed one ClientRequest, which two attempts cannot send side by "
    "side (hedge through httpx's AsyncDeadlineTransport instead)"
)


class AttemptTimeout(AttemptTimeoutBase, aiohttp.ServerTimeoutError):
    """The attempt's own timeout ran out (retryable, D2.5).

    Both a :class:`timebound.DeadlineExceeded` with ``source="attempt"`` and an
    :class:`aiohttp.ServerTimeoutError`; ``remote`` is true for a server's "deadline expired"
    answer (D4.5 case 2).
    """


class DeadlineMiddleware:
    """An aiohttp client middleware that clamps, propagates and enforces the deadline.

    ``ask_breakdown``: ask every callee for its breakdown (``X-Timebound-Breakdown: 1``); one
    that a callee sends is folded into the call's part whether asked or not (D13.5).
    ``policy`` and ``retry_statuses``: as for httpx's
    :class:`~timebound.propagation.httpx.DeadlineTransport` (D3.17); a hedged policy is
    refused (D3.18).
    """

    def __init__(
        self,
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
    ) -> None:
        setup = http_client_setup(
            "DeadlineMiddleware",
            timeout=timeout,
            propagate_header=propagate_header,
            timeout_header=timeout_header,
            absolute_header=absolute_header,
            expired_header=expired_header,
            what=what,
            ask_breakdown=ask_breakdown,
            policy=policy,
            retry_statuses=retry_statuses,
            hedge_methods=DEFAULT_HEDGE_METHODS,
            hedging=_NO_HEDGING,
        )
        self._timeout = setup.timeout
        self._ask_breakdown = setup.ask_breakdown
        self._options = setup.options
        self._resilience = setup.resilience
        self._retry_statuses = setup.retry_statuses

    def _static(self, request: aiohttp.ClientRequest) -> float | None:
        if self._timeout is not None:
            return self._timeout
        # ``ClientSession.timeout`` is public; the request's link to its session is not.
        session = getattr(request, "_session", None)
        total = getattr(getattr(session, "timeout", None), "total", None)
        return float(total) if isinstance(total, int | float) else None

    def __call__(
        self, request: aiohttp.ClientRequest, handler: Any
    ) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
        if self._resilience is not None:
            return self._resilient(request, handler)
        return self._send(request, handler)

    def _send(
        self, request: aiohttp.ClientRequest, handler: Any
    ) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
        # Not a coroutine of its own: the untraced call costs no extra frame per request.
        if not tracing_active():
            return self._call(request, handler)
        return self._traced(request, handler)

    async def _resilient(
        self, request: aiohttp.ClientRequest, handler: Any
    ) -> aiohttp.ClientResponse:
        """The request under the policy (D3.17): aiohttp lets a middleware send its request
        again (its retry middleware does); each attempt rewrites the deadline headers."""
        assert self._resilience is not None
        response: aiohttp.ClientResponse = await self._resilience.run(
            request.method, self._attempt, request, handler
        )
        return response

    async def _attempt(
        self, request: aiohttp.ClientRequest, handler: Any
    ) -> aiohttp.ClientResponse | Passed:
        """One attempt under the policy (see ``propagation._resilience``)."""
        try:
            response = await self._send(request, handler)
        except _RAISED:
            raise
        except Exception as exc:
            return Passed(exc)
        if response.status not in self._retry_statuses:
            return response
        try:
            # At most REFUSAL_BODY_MAX of the body (D4.14); read to its end, aiohttp gives the
            # connection back to the pool itself.
            body, whole = await aread_prefix(response.content.iter_any(), REFUSAL_BODY_MAX)
        except BaseException:
            response.close()
            raise
        response._body = body  # where aiohttp keeps a read body (``read()``, ``text()``)
        if not whole:
            # The rest is never read: the connection goes with it. Closing the response
            # itself would make its ``read()`` refuse the bytes it holds.
            if response.connection is not None:
                response.connection.close()
            mark_truncated(response)
        raise FailedAnswer(
            response, self._options.what, status=response.status, headers=response.headers
        )

    async def _traced(self, request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        # With spans exported, a client span carrying the budget sent (D10.4).
        with client_span(request.method, str(request.url), request.headers) as answered:
            response = await self._call(request, handler)
            answered(response.status, request.headers.get(self._options.timeout_header))
            return response

    async def _call(self, request: aiohttp.ClientRequest, handler: Any) -> aiohttp.ClientResponse:
        attempt = begin(self._static(request), self._options, AttemptTimeout, _TIMEOUTS)
        attempt.name = call_name(request.method, request.url.host or "", request.url.path)  # D13
        for name, value in attempt.headers():
            request.headers[name] = value
        if self._ask_breakdown:
            request.headers[BREAKDOWN_HEADER] = "1"
        response: aiohttp.ClientResponse
        try:
            if attempt.end is None:
                response = await handler(request)
            else:
                response = await attempt.run(handler, request)
        except BaseException as exc:
            attempt.part(type(exc).__name__)  # D13: a call that got no answer
            raise
        # D13: the call is a part of our breakdown, the callee's own (if it sent one) inside it.
        attempt.answered(response.status, response.headers.get(BREAKDOWN_HEADER))
        if attempt.end is None:
            return response
        refusal = attempt.refusal(
            response.status, response.headers.get(self._options.expired_header)
        )
        if refusal is not None:
            # Read the short body so the connection returns to the pool intact (D4.8); a long
            # one is closed unread.
            try:
                await attempt.run(_read_short, response)
            finally:
                response.release()
            raise attempt.refused(refusal)
        response.content = _BoundedContent(response.content, attempt)  # type: ignore[assignment]
        return response


class _BoundedContent:
    """``ClientResponse.content`` with every read bounded by the attempt's end."""

    def __init__(self, inner: Any, attempt: Attempt) -> None:
        self._inner = inner
        self._attempt = attempt

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            return await fn(*args, **kwargs)

        return await self._attempt.run(call)

    async def read(self, n: int = -1) -> bytes:
        data: bytes = await self._call(self._inner.read, n)
        return data

    async def readany(self) -> bytes:
        data: bytes = await self._call(self._inner.readany)
        return data

    async def readline(self, **kwargs: Any) -> bytes:
        data: bytes = await self._call(self._inner.readline, **kwargs)
        return data

    async def readuntil(self, separator: bytes = b"\n", **kwargs: Any) -> bytes:
        data: bytes = await self._call(self._inner.readuntil, separator, **kwargs)
        return data

    async def readexactly(self, n: int) -> bytes:
        data: bytes = await self._call(self._inner.readexactly, n)
        return data

    async def readchunk(self) -> tuple[bytes, bool]:
        chunk: tuple[bytes, bool] = await self._call(self._inner.readchunk)
        return chunk

    def __aiter__(self) -> AsyncStreamIterator[bytes]:
        return AsyncStreamIterator(self.readline)

    def iter_chunked(self, n: int) -> AsyncStreamIterator[bytes]:
        if hasattr(self._inner, "set_read_chunk_size"):
            self._inner.set_read_chunk_size(n)
        return AsyncStreamIterator(lambda: self.read(n))

    def iter_any(self) -> AsyncStreamIterator[bytes]:
        return AsyncStreamIterator(self.readany)

    def iter_chunks(self) -> ChunkTupleAsyncStreamIterator:
        return ChunkTupleAsyncStreamIterator(self)  # type: ignore[arg-type]


async def _read_short(response: aiohttp.ClientResponse) -> None:
    """Read a refusal's body to its end if it is short; past ``REFUSAL_BODY_MAX`` the
    connection is closed unread."""
    _, whole = await aread_prefix(response.content.iter_any(), REFUSAL_BODY_MAX)
    if not whole:
        response.close()
