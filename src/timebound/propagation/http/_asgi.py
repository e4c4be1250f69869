"""Deadline propagation for ASGI servers (Starlette, FastAPI, any ASGI app; DECISIONS D4).

A pure ASGI middleware — never Starlette's ``BaseHTTPMiddleware``, which breaks
``request.is_disconnected()`` and streaming (starlette discussion 2094)::

    from fastapi import FastAPI
    from timebound.propagation.asgi import DeadlineMiddleware

    app = FastAPI()
    app.add_middleware(DeadlineMiddleware)          # or: app = DeadlineMiddleware(app)

Rules, in the order a request meets them:

1. The deadline counts from the moment the ``http`` scope arrives, so reading the body counts
   (D4.2). It is the minimum of ``X-YaTaxi-Client-TimeoutMs``, ``grpc-timeout`` and
   ``x-envoy-expected-rq-timeout-ms`` (D4.1); a bad header means no deadline, never an error.
2. A request whose deadline is already spent is answered ``498 Deadline expired`` with
   ``X-YaTaxi-Deadline-Expired: 1`` and the app is never called (D4.4).
3. Otherwise the app runs inside ``timebound.inherit_deadline(deadline)``: every client call and
   scope inside sees the request's deadline. The handler is *not* cancelled at the deadline
   unless ``cancel_on_expiry=True`` (as in userver).
4. ``http.response.start`` is held back until the first body message. If by then the deadline
   has passed — or a client call failed because of it (``RequestState.cancelled_by_deadline``) —
   the response is replaced by the 498 answer. For a normal response the first body message is the
   whole body, so "by the end of handling" (userver's rule) is exactly when we check. A streaming
   response is committed at its first chunk: after that nothing can be replaced, and a deadline
   that passes mid-stream is only recorded (span tag ``dp_response_already_started``).
5. ``reserve=`` (D1.18) keeps time for the answer: the app sees the request's deadline less the
   reserve, so a downstream call ends early enough for the handler to answer its fallback, or,
   when the handler lets that ``DeadlineExceeded`` escape, for the middleware to answer 498 before
   the caller gives up. A request with no more than the reserve left is answered 498 at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..._core._breakdown import add_mark, build
from ..._core._durations import Duration
from ..._core._errors import DeadlineExceeded
from ..._core._request import RequestState, _request
from ..._core._scopes import (
    _Frame,
    enter_reserve,
    exit_reserve,
    inherit_deadline,
    move_on_at,
    reserve_seconds,
)
from ...admission._controller import Admission, Ticket, Verdict
from ...admission._waiting import (
    OVERLOADED_BODY,
    OVERLOADED_STATUS,
    criticality,
    enter_async,
    route_key,
)
from ...telemetry import correlation
from ...telemetry._tracing import active as tracing_active
from ...telemetry._tracing import server_span
from .._breakdown_wire import (
    BREAKDOWN_HEADER,
    MAX_HEADER_BYTES,
    asked,
    check_max_bytes,
    encode,
    server_value,
)
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
SET_BY = "ASGI middleware"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class DeadlineMiddleware:
    """ASGI middleware that reads, enforces and exposes the caller's deadline (D4.1-D4.5).

    ``expired_status``: status of the "Deadline expired" answer (498, or e.g. 504 for
    environments that reject unknown codes). Header names are configurable; pass ``None`` for
    ``grpc_timeout_header``/``envoy_timeout_header`` to ignore those headers.
    ``absolute_header`` (``X-Request-Deadline``, ``None`` to ignore it) and ``clock_skew``
    (seconds, default 1): the absolute deadline counts when it agrees with the relative one
    within the skew (D9.3).
    ``cancel_on_expiry``: cancel the handler at the deadline and answer 498 (off by default, as in
    userver). ``enabled=False`` is the static kill switch;
    :func:`timebound.propagation.set_enabled` is the runtime one.
    ``expose_breakdown``: attach this service's breakdown (where the request's budget went) to
    a "Deadline expired" answer, and to any answer whose request carries
    ``X-Timebound-Breakdown: 1``, in the ``X-Timebound-Breakdown`` header of at most
    ``breakdown_max_bytes`` (D13.5). Off by default: it tells the caller what this service calls.
    ``reserve`` (a duration): the app sees the request's deadline less it, keeping time to answer
    (D1.18); a handler failing with that reserve's ``DeadlineExceeded`` is answered 498.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        expired_status: int = 498,
        timeout_header: str = TIMEOUT_HEADER,
        expired_header: str = EXPIRED_HEADER,
        grpc_timeout_header: str | None = GRPC_TIMEOUT_HEADER,
        envoy_timeout_header: str | None = ENVOY_TIMEOUT_HEADER,
        absolute_header: str | None = ABSOLUTE_HEADER,
        clock_skew: Duration = DEFAULT_SKEW,
        cancel_on_expiry: bool = False,
        enabled: bool = True,
        expose_breakdown: bool = False,
        breakdown_max_bytes: int = MAX_HEADER_BYTES,
        reserve: Duration | None = None,
    ) -> None:
        self.app = app
        self.reserve = reserve_seconds(reserve)
        self.expose_breakdown = bool(expose_breakdown)
        self._bd_max = check_max_bytes(breakdown_max_bytes)
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
        self.cancel_on_expiry = bool(cancel_on_expiry)
        self._answers = ExpiredAnswers(self._config.expired_status)
        names = self._config.names
        self._wanted = frozenset(
            n.lower().encode("latin-1")
            for n in (names.timeout, names.grpc_timeout, names.envoy_timeout, names.absolute)
            if n
        )
        self._expired_start: Message = {
            "type": "http.response.start",
            "status": self._config.expired_status,
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1"))
                for k, v in expired_headers(names)
            ],
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._config.active():
            await self.app(scope, receive, send)
            return
        # Every event of this request, whatever engine emits it, carries its id; with spans
        # exported, the request is a server span the engines' spans descend from (D10.4).
        with correlation("request"):
            if not tracing_active():
                await self._serve(scope, receive, send)
                return
            with server_span(scope) as traced:
                await self._serve(scope, receive, traced(send))

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        # D4.2: the deadline counts from here, before the app reads the body.
        start = now()
        wanted = self._wanted
        found = [
            (k.decode("latin-1").lower(), v)
            for k, v in scope.get("headers", ())
            if k.lower() in wanted
        ]
        arrival = arrive(found, self._config.names, start, self._config.skew) if found else None
        if arrival is None:
            await self.app(scope, receive, send)
            return
        if arrival.deadline.expired:
            # Already spent when read: answer without calling the app (D4.4).
            self._expired_answer(scope, arrival.state, None)
            await self._send_expired(send, self._spent_breakdown(arrival, start))
            return
        await self._handle(arrival, scope, receive, send, start)

    def _spent_breakdown(
        self, arrival: Arrival, start: float, *, queued: bool = False
    ) -> str | None:
        """D13.5: the breakdown of a request spent before the app ran (its queue, if any)."""
        if not self.expose_breakdown:
            return None
        t = now()
        marks: list[Any] | None = (
            [("queue", None, start, t, None, "hopeless", None)] if queued else None
        )
        bd = build("bound", "inherited", start, t, arrival.seconds, "timeout", marks, 1)
        return encode(bd, self._bd_max)

    def _expired_answer(self, scope: Scope, state: RequestState, size: int | None) -> None:
        self._answers.record(state, size, str(scope.get("method", "")), str(scope.get("path", "")))

    async def _send_expired(self, send: Send, breakdown: str | None = None) -> None:
        start = dict(self._expired_start)
        if breakdown is not None:
            start["headers"] = [*start["headers"], (_BD_KEY, breakdown.encode("ascii"))]
        await send(start)
        await send({"type": "http.response.body", "body": EXPIRED_BODY, "more_body": False})

    async def _handle(
        self,
        arrival: Arrival,
        scope: Scope,
        receive: Receive,
        send: Send,
        start: float,
        queued: float | None = None,
    ) -> None:
        response = _HeldResponse(send, arrival, self, scope)
        receive = _body_receiver(receive, arrival)
        token = _request.set(arrival.state)
        bound = inherit_deadline(arrival.deadline, set_by=SET_BY)
        bound._t0 = start  # D13.1: the request's budget started when it arrived (D4.2)
        if queued is not None and queued > start:
            # D13: the admission queue is the first part of the request's budget.
            add_mark(bound, ("queue", None, start, queued, None, "admitted", None))
        if self.expose_breakdown:
            response.bound = bound
            response.asked = asked(scope.get("headers", ()))
        try:
            with bound:
                try:
                    if self.cancel_on_expiry:
                        # The inherited bound is the binding one, so a firing scope reports
                        # source="inherited" (DeadlineExceeded), handled just below.
                        with move_on_at(arrival.deadline, what="handler"):
                            await self._app(scope, receive, response.send)
                    else:
                        await self._app(scope, receive, response.send)
                except Exception as exc:
                    if response.started or not (arrival.late() or spent_reserve(exc, SET_BY)):
                        raise
                    log_late_failure(exc, self._config.expired_status)
                    response.replace_pending()
        finally:
            _request.reset(token)
        await response.finish()

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, under the reserve when there is one (entered inside the cancel scope of
        ``cancel_on_expiry``, which keeps ending the handler at the request's own deadline)."""
        if not self.reserve:
            await self.app(scope, receive, send)
            return
        frame = enter_reserve(self.reserve, SET_BY)  # D1.20: refused here, answered 498
        try:
            await self.app(scope, receive, send)
        finally:
            exit_reserve(frame)


def _body_receiver(receive: Receive, arrival: Arrival) -> Receive:
    """The app's ``receive``: the last body message arriving after the deadline raises.

    D4.4 (amended): a request whose deadline passed by the time it was read *to the end* never
    reaches user code; the code after ``await request.body()`` would only run with no time
    left. The error escapes the app and the middleware answers "Deadline expired" (D4.11).
    Earlier chunks and ``http.disconnect`` pass through: only the end of the body is the
    moment the request has been read.
    """

    async def body_receive() -> Message:
        message = await receive()
        if (
            message.get("type") == "http.request"
            and not message.get("more_body", False)
            and arrival.deadline.expired
        ):
            arrival.state.cut_by(arrival.deadline)
            raise DeadlineExceeded(
                source="inherited",
                timeout=arrival.seconds,
                deadline=arrival.deadline,
                what="request body",
                set_by=SET_BY,
            )
        return message

    return body_receive


class _HeldResponse:
    """The app's ``send``, holding ``http.response.start`` until the first body message."""

    __slots__ = (
        "_arrival",
        "_mw",
        "_scope",
        "_send",
        "asked",
        "bound",
        "dropped",
        "expired_sent",
        "pending",
        "replaced",
        "started",
    )

    def __init__(self, send: Send, arrival: Arrival, mw: DeadlineMiddleware, scope: Scope) -> None:
        self._scope = scope
        self._send = send
        self._arrival = arrival
        self._mw = mw
        self.pending: Message | None = None
        self.started = False
        self.replaced = False
        self.expired_sent = False
        self.dropped = 0
        self.bound: _Frame | None = None  # set when the middleware exposes breakdowns
        self.asked = False

    def _breakdown(self, outcome: str) -> str | None:
        bound = self.bound
        if bound is None:
            return None
        return server_value(bound, outcome, self._mw._bd_max)

    async def _expired(self) -> None:
        await self._mw._send_expired(self._send, self._breakdown("timeout"))

    def replace_pending(self) -> None:
        """Mark the response for replacement (sent by :meth:`finish`)."""
        self.replaced = True
        self.pending = None

    async def send(self, message: Message) -> None:
        if self.replaced:
            # Swallow the rest of a replaced response, counting what the app wanted to send.
            if message.get("type") == "http.response.body":
                self.dropped += len(message.get("body", b""))
            return
        if self.started:
            await self._send(message)
            return
        if message["type"] == "http.response.start":
            self.pending = message
            return
        # The first message after the start: the last moment the response can be replaced.
        if self._arrival.late():
            self.replaced = True
            self.pending = None
            if message.get("type") == "http.response.body":
                self.dropped += len(message.get("body", b""))
            self.expired_sent = True
            await self._expired()
            return
        self.started = True
        if self.pending is not None:
            pending, self.pending = self.pending, None
            await self._send(self._with_breakdown(pending))
        await self._send(message)

    async def finish(self) -> None:
        """After the app returned: send or record whatever is still owed."""
        state = self._arrival.state
        if self.replaced:
            if not self.expired_sent:
                await self._expired()
            self._mw._expired_answer(self._scope, state, self.dropped)
            return
        if self.started:
            record_started_late(self._arrival)
            return
        if self.pending is not None:
            # The app returned after the start without any body message.
            if self._arrival.late():
                self.pending = None
                await self._expired()
                self._mw._expired_answer(self._scope, state, 0)
                return
            self.started = True
            pending, self.pending = self.pending, None
            await self._send(self._with_breakdown(pending))
            await self._send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if self._arrival.late():
            # The app sent nothing and the deadline passed (e.g. it swallowed a cancellation).
            await self._expired()
            self._mw._expired_answer(self._scope, state, None)

    def _with_breakdown(self, start: Message) -> Message:
        """A normal answer to a request that asked for the breakdown carries it (D13.5)."""
        if not self.asked:
            return start
        value = self._breakdown("ok")
        if value is None:
            return start
        return {**start, "headers": [*start.get("headers", ()), (_BD_KEY, value.encode("ascii"))]}


_BD_KEY = BREAKDOWN_HEADER.lower().encode("latin-1")


class AdmissionMiddleware(DeadlineMiddleware):
    """:class:`DeadlineMiddleware` with deadline-aware admission control in front of the app (D9).

    A request is admitted under the concurrency limit, waits in a bounded queue, or is answered
    at once without running the app: ``498`` + ``X-YaTaxi-Deadline-Expired: 1`` when its own
    deadline makes it hopeless, ``503`` + ``Retry-After`` when the server sheds load (D9.1). The
    deadline still counts from the moment the request arrived, so queueing spends it (D4.2).

    ``admission``: the :class:`~timebound.admission.Admission` this app owns (a new
    one with safe defaults if omitted). ``critical_header``: a request header whose value
    ``critical`` lets a request in before the others (off by default: set it only where a trusted
    proxy sets or strips it). ``route``: the key of the per-route service-time estimate (method
    and path by default; give a function returning the route *template* when paths carry ids).
    Every other option is :class:`DeadlineMiddleware`'s.
    """

    def __init__(
        self,
        app: ASGIApp,
        admission: Admission | None = None,
        *,
        critical_header: str | None = None,
        route: Callable[[Scope], str] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(app, **options)
        self.admission = Admission() if admission is None else admission
        self._critical = critical_header.lower().encode("latin-1") if critical_header else None
        self._route = route
        body = OVERLOADED_BODY
        self._overloaded_start: Message = {
            "type": "http.response.start",
            "status": OVERLOADED_STATUS,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode("latin-1")),
                (b"retry-after", str(self.admission.config.retry_after).encode("latin-1")),
            ],
        }

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = now()  # D4.2: queueing spends the request's deadline.
        wanted = self._wanted
        found: list[tuple[str, bytes]] = []
        critical = False
        for k, v in scope.get("headers", ()):
            key = k.lower()
            if key in wanted:
                found.append((key.decode("latin-1"), v))
            elif key == self._critical:
                critical = criticality(v)
        arrival = arrive(found, self._config.names, start, self._config.skew) if found else None
        if arrival is not None and arrival.deadline.expired:
            self._expired_answer(scope, arrival.state, None)
            await self._send_expired(send, self._spent_breakdown(arrival, start))
            return
        route = (
            self._route(scope)
            if self._route is not None
            else route_key(str(scope.get("method", "")), str(scope.get("path", "")))
        )
        ticket = Ticket(
            route, None if arrival is None else arrival.deadline.when, critical=critical
        )
        outcome = await enter_async(self.admission, ticket)
        if outcome is Verdict.HOPELESS and arrival is not None:
            self._expired_answer(scope, arrival.state, None)
            await self._send_expired(send, self._spent_breakdown(arrival, start, queued=True))
            return
        if outcome is not Verdict.ADMIT:
            await send(dict(self._overloaded_start))
            await send({"type": "http.response.body", "body": OVERLOADED_BODY, "more_body": False})
            return
        try:
            if arrival is None:
                await self.app(scope, receive, send)
            else:
                await self._handle(arrival, scope, receive, send, start, queued=now())
        finally:
            late = arrival is not None and arrival.late()
            self.admission.release(ticket, now(), late=late)
