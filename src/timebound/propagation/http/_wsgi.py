"""Deadline propagation for WSGI servers (Flask, Django, any WSGI app; DECISIONS D4).

The same rules as :mod:`timebound.propagation.asgi`::

    from flask import Flask
    from timebound.propagation.wsgi import DeadlineMiddleware

    app = Flask(__name__)
    app.wsgi_app = DeadlineMiddleware(app.wsgi_app)

* The deadline counts from the moment the middleware is called (D4.2) and is the minimum of the
  deadline headers present (D4.1); a bad header means no deadline.
* An already expired request is answered ``498 Deadline expired`` and the app is never called.
* The app (and the iteration of its response) runs under ``timebound.inherit_deadline``, so
  ``timebound.checkpoint()`` and the clients (requests, httpx) see the request's deadline.
* ``start_response`` is held until the first non-empty body chunk (or the end of the body):
  a response finished after the deadline, or after a client call failed because of it, is
  replaced by the 498 answer. A streamed response is committed at its first chunk.

Sync code cannot be preempted, so there is no ``cancel_on_expiry`` here: a handler stops at the
deadline only where it calls ``timebound.checkpoint()`` or a clamped client.
"""

from __future__ import annotations

import contextvars
import http
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from ..._core._durations import Duration
from ..._core._errors import DeadlineExceeded
from ..._core._request import RequestState, _request, current_request
from ..._core._scopes import enter_reserve, inherit_deadline, reserve_seconds
from ...admission._controller import Admission, Ticket, Verdict
from ...admission._waiting import OVERLOADED_BODY, criticality, enter_blocking, route_key
from ...telemetry import correlation
from ...telemetry._tracing import active as tracing_active
from ...telemetry._tracing import wsgi_span
from .._codec import (
    ABSOLUTE_HEADER,
    ENVOY_TIMEOUT_HEADER,
    EXPIRED_BODY,
    EXPIRED_HEADER,
    GRPC_TIMEOUT_HEADER,
    TIMEOUT_HEADER,
)
from ._server import (
    DEFAULT_SKEW,
    Arrival,
    ExpiredAnswers,
    ServerConfig,
    arrive,
    expired_headers,
    log_late_failure,
    now,
    record_started_late,
    spent_reserve,
)

__all__ = ["AdmissionMiddleware", "DeadlineMiddleware"]

#: Where a request's inherited deadline was set, as its DeadlineExceeded says (D2.8).
SET_BY = "WSGI middleware"

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


def _environ_key(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


def _status_line(status: int) -> str:
    if status == 498:
        return "498 Deadline Expired"
    try:
        return f"{status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Deadline Expired"


class DeadlineMiddleware:
    """WSGI middleware that reads, enforces and exposes the caller's deadline (D4.1-D4.5).

    Options as for the ASGI middleware, except ``cancel_on_expiry`` (sync code is cooperative).
    ``reserve`` (a duration): the app sees the request's deadline less it (D1.18); a handler
    failing with that reserve's ``DeadlineExceeded`` is answered "Deadline expired".

    Wrapping a Flask app's ``wsgi_app`` also registers a Flask error handler for
    :class:`~timebound.DeadlineExceeded` (unless the app has its own): Flask would otherwise log
    an ERROR traceback for every request this middleware answers "Deadline expired" (see
    :func:`_quiet_flask`).
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        expired_status: int = 498,
        timeout_header: str = TIMEOUT_HEADER,
        expired_header: str = EXPIRED_HEADER,
        grpc_timeout_header: str | None = GRPC_TIMEOUT_HEADER,
        envoy_timeout_header: str | None = ENVOY_TIMEOUT_HEADER,
        absolute_header: str | None = ABSOLUTE_HEADER,
        clock_skew: Duration = DEFAULT_SKEW,
        enabled: bool = True,
        reserve: Duration | None = None,
    ) -> None:
        self.app = app
        self.reserve = reserve_seconds(reserve)
        self._config = ServerConfig.build(
            expired_status=expired_status,
            timeout_header=timeout_header,
            expired_header=expired_header,
            grpc_timeout_header=grpc_timeout_header,
            envoy_timeout_header=envoy_timeout_header,
            enabled=enabled,
            absolute_header=absolute_header,
            clock_skew=clock_skew,
        )
        _quiet_flask(app, self._config.expired_status)
        names = self._config.names
        self._keys = [
            (n.lower(), _environ_key(n))
            for n in (names.timeout, names.grpc_timeout, names.envoy_timeout, names.absolute)
            if n
        ]
        self._status = _status_line(self._config.expired_status)
        self._answers = ExpiredAnswers(self._config.expired_status)
        self._headers = expired_headers(names)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        if not self._config.active():
            return self.app(environ, start_response)
        # Every event of this request carries its id (the per-request context below copies it
        # for the response iterator).
        with correlation("request"):
            if not tracing_active():
                return self._serve(environ, start_response)
            # With spans exported, the request is a server span (D10.4).
            return wsgi_span(environ, start_response, lambda sr: self._serve(environ, sr))

    def _serve(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start = now()
        found: list[tuple[str, str | bytes]] = []
        for name, key in self._keys:
            value = environ.get(key)
            if isinstance(value, str):
                # WSGI servers join repeated lines with commas; the codec reads that form and
                # ASGI's separate lines alike (D4.1).
                found.append((name, value))
        arrival = arrive(found, self._config.names, start, self._config.skew) if found else None
        if arrival is None:
            return self.app(environ, start_response)
        if arrival.deadline.expired:
            self._expired_answer(environ, arrival.state, None)
            return self._expired(start_response)
        # A private context per request: the deadline and request state live in it, and the
        # response iterator re-enters it for every chunk (the server iterates after we return).
        ctx = contextvars.copy_context()
        return ctx.run(self._handle, ctx, arrival, environ, start_response)

    def _expired_answer(
        self, environ: dict[str, Any], state: RequestState, size: int | None
    ) -> None:
        path = f"{environ.get('SCRIPT_NAME', '')}{environ.get('PATH_INFO', '')}"
        self._answers.record(state, size, str(environ.get("REQUEST_METHOD", "")), path)

    def _expired(self, start_response: StartResponse) -> list[bytes]:
        start_response(self._status, list(self._headers))
        return [EXPIRED_BODY]

    def _handle(
        self,
        ctx: contextvars.Context,
        arrival: Arrival,
        environ: dict[str, Any],
        start_response: StartResponse,
    ) -> Iterable[bytes]:
        state = arrival.state
        _request.set(state)
        # Entered in ``ctx`` and never exited: the context is discarded with the request.
        inherit_deadline(arrival.deadline, set_by=SET_BY).__enter__()
        if self.reserve:
            try:
                enter_reserve(self.reserve, SET_BY)  # in ``ctx`` too, never exited (D1.18)
            except DeadlineExceeded:
                # No more than the reserve left: refused before the app runs (D1.20).
                self._expired_answer(environ, state, None)
                return self._expired(start_response)
        stream = environ.get("wsgi.input")
        if stream is not None:
            environ["wsgi.input"] = _BodyInput(stream, arrival, environ.get("CONTENT_LENGTH"))

        captured: list[Any] = []
        written: list[bytes] = []

        def capture(
            status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None
        ) -> Callable[[bytes], object]:
            captured[:] = [status, headers, exc_info]
            # PEP 3333's legacy write(): buffered and sent as the first chunk.
            return written.append

        result: Iterable[bytes] | None = None
        try:
            result = self.app(environ, capture)
            iterator = iter(result)
            first = b"".join(written)
            if not first:
                for chunk in iterator:
                    if chunk:
                        first = chunk
                        break
        except Exception as exc:
            _close(result)
            if not (arrival.late() or spent_reserve(exc, SET_BY)):
                raise
            log_late_failure(exc, self._config.expired_status)
            self._expired_answer(environ, state, None)
            return self._expired(start_response)
        if arrival.late() or not captured:
            _close(result)
            if not captured and not arrival.late():
                raise RuntimeError("WSGI app returned without calling start_response")
            self._expired_answer(environ, state, len(first))
            return self._expired(start_response)
        status, headers, exc_info = captured
        if exc_info is not None:
            start_response(status, headers, exc_info)
        else:
            start_response(status, headers)
        return _Body(ctx, arrival, first, iterator, result)


def _quiet_flask(app: WSGIApp, status: int) -> None:
    """Keep Flask from logging a traceback for a request that ran out of its deadline.

    Flask logs every exception that reaches it unhandled at ERROR, with its traceback, before
    this middleware replaces the 500 by the "Deadline expired" answer (the middleware logs that
    answer itself, one line). So when ``app`` is a Flask app's bound ``wsgi_app``, a handler
    for ``DeadlineExceeded`` is registered on it: when the request is late (its deadline passed
    or a call failed because of it, D4.5) it answers ``status`` quietly, which the middleware
    then replaces; otherwise the error is another bound's, the handler's own, and goes to the
    app's handler for a base class (``TimeoutError`` …) or is re-raised, so Flask treats it as
    usual. An app with its own ``DeadlineExceeded`` handler is left alone.
    """
    flask_app = getattr(app, "__self__", None)
    register = getattr(flask_app, "register_error_handler", None)
    spec = getattr(flask_app, "error_handler_spec", None)
    if getattr(app, "__name__", None) != "wsgi_app" or register is None or spec is None:
        return
    handlers: dict[type, Callable[[BaseException], Any]] = spec[None][None]
    if DeadlineExceeded in handlers:
        return

    def deadline_exceeded(err: BaseException) -> Any:
        state = current_request()
        late = state is not None and (
            state.cancelled_by_deadline or (state.deadline is not None and state.deadline.expired)
        )
        if state is not None and spent_reserve(err, SET_BY):
            # The middleware's reserve ran out (D1.18): the request is out of time as the
            # handler sees it, and the middleware answers it as such.
            state.cancelled_by_deadline = late = True
        if late:
            return EXPIRED_BODY, status
        for cls in type(err).__mro__:
            if issubclass(cls, DeadlineExceeded):
                continue  # this handler's own classes: only a base class's handler is wanted
            handler = handlers.get(cls)
            if handler is not None:
                return handler(err)
        raise err

    register(DeadlineExceeded, deadline_exceeded)


class _BodyInput:
    """``wsgi.input``, whose read that reaches the end of the body after the deadline raises.

    D4.4/D4.11: a request is read when its whole body has arrived; one whose deadline passed by
    then never reaches the code after the read. The end is the declared ``Content-Length``
    consumed, or an empty read (a chunked body). Everything else is the server's stream.
    """

    __slots__ = ("_arrival", "_ended", "_left", "_stream")

    def __init__(self, stream: Any, arrival: Arrival, length: object) -> None:
        self._stream = stream
        self._arrival = arrival
        self._ended = False  # the end was reached in time: later reads are the app's business
        try:
            self._left: int | None = int(str(length)) if length not in (None, "") else None
        except ValueError:
            self._left = None

    def _read(self, data: bytes, size: int | None, *, to_end: bool = False) -> bytes:
        """``data`` just read (``size`` asked for); ``to_end``: the read took all there was."""
        self._check(len(data), size, to_end)
        return data

    def _check(self, got: int, size: int | None, to_end: bool) -> None:
        if self._ended:
            return
        if self._left is not None:
            self._left -= got
        self._ended = (
            to_end or (not got and size != 0) or (self._left is not None and self._left <= 0)
        )
        if self._ended and self._arrival.deadline.expired:
            self._arrival.state.cut_by(self._arrival.deadline)
            raise DeadlineExceeded(
                source="inherited",
                timeout=self._arrival.seconds,
                deadline=self._arrival.deadline,
                what="request body",
                set_by=SET_BY,
            )

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self._read(self._stream.read(), size, to_end=True)
        return self._read(self._stream.read(size), size)

    def readinto(self, buffer: bytearray | memoryview) -> int:
        readinto = getattr(self._stream, "readinto", None)
        if readinto is None:  # PEP 3333 promises read() only (gunicorn's body has no readinto)
            data = self._stream.read(len(buffer))
            buffer[: len(data)] = data
            got = len(data)
        else:
            got = int(readinto(buffer) or 0)
        self._check(got, len(buffer), False)
        return got

    def readline(self, size: int | None = -1) -> bytes:
        data = self._stream.readline() if size is None or size < 0 else self._stream.readline(size)
        return self._read(data, size)

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines = []
        total = 0
        while hint is None or hint <= 0 or total < hint:
            line = self.readline()
            if not line:
                break
            lines.append(line)
            total += len(line)
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while True:
            line = self.readline()
            if not line:
                return
            yield line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _close(result: Iterable[bytes] | None) -> None:
    close = getattr(result, "close", None)
    if close is not None:
        close()


class _Body:
    """The committed response: the first chunk, then the rest, each read inside the request's
    context (so a streaming generator still sees the deadline)."""

    def __init__(
        self,
        ctx: contextvars.Context,
        arrival: Arrival,
        first: bytes,
        iterator: Iterator[bytes],
        result: Iterable[bytes],
    ) -> None:
        self._ctx = ctx
        self._arrival = arrival
        self._first: bytes | None = first or None
        self._iterator = iterator
        self._result = result

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return self._ctx.run(next, self._iterator)

    def close(self) -> None:
        record_started_late(self._arrival)
        self._ctx.run(_close, self._result)


class AdmissionMiddleware(DeadlineMiddleware):
    """:class:`DeadlineMiddleware` with deadline-aware admission control (D9), for threaded servers.

    As :class:`timebound.propagation.asgi.AdmissionMiddleware`: admitted under the concurrency
    limit, queued (the server's thread waits), or answered at once without running the app —
    498 + expired marker when hopeless, 503 + ``Retry-After`` when shedding (D9.1). The slot is
    held until the server closes the response iterable (PEP 3333 requires servers to call
    ``close()``), so a streamed body counts as running. Give the server more threads than the
    limit plus the queue, or the server's own backlog becomes the queue.
    """

    def __init__(
        self,
        app: WSGIApp,
        admission: Admission | None = None,
        *,
        critical_header: str | None = None,
        route: Callable[[dict[str, Any]], str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, **options)
        self.admission = Admission() if admission is None else admission
        self._critical_key = _environ_key(critical_header) if critical_header else None
        self._route = route
        self._overloaded_headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(OVERLOADED_BODY))),
            ("Retry-After", str(self.admission.config.retry_after)),
        ]

    def _serve(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start = now()  # D4.2: queueing spends the request's deadline.
        found: list[tuple[str, str | bytes]] = [
            (name, value) for name, key in self._keys if isinstance(value := environ.get(key), str)
        ]
        arrival = arrive(found, self._config.names, start, self._config.skew) if found else None
        if arrival is not None and arrival.deadline.expired:
            self._expired_answer(environ, arrival.state, None)
            return self._expired(start_response)
        route = (
            self._route(environ)
            if self._route is not None
            else route_key(
                str(environ.get("REQUEST_METHOD", "")), str(environ.get("PATH_INFO", ""))
            )
        )
        critical = self._critical_key is not None and criticality(environ.get(self._critical_key))
        ticket = Ticket(
            route, None if arrival is None else arrival.deadline.when, critical=critical
        )
        outcome = enter_blocking(self.admission, ticket)
        if outcome is Verdict.HOPELESS and arrival is not None:
            self._expired_answer(environ, arrival.state, None)
            return self._expired(start_response)
        if outcome is not Verdict.ADMIT:
            start_response("503 Service Unavailable", list(self._overloaded_headers))
            return [OVERLOADED_BODY]

        def release() -> None:
            self.admission.release(ticket, now(), late=arrival is not None and arrival.late())

        try:
            if arrival is None:
                result = self.app(environ, start_response)
            else:
                ctx = contextvars.copy_context()
                result = ctx.run(self._handle, ctx, arrival, environ, start_response)
        except BaseException:
            release()
            raise
        return _ReleasedOnClose(result, release)


class _ReleasedOnClose:
    """A response iterable that gives back its admission slot once, when the server closes it."""

    __slots__ = ("_release", "_result")

    def __init__(self, result: Iterable[bytes], release: Callable[[], None]) -> None:
        self._result = result
        self._release: Callable[[], None] | None = release

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._result)

    def close(self) -> None:
        try:
            _close(self._result)
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()
