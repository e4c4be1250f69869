"""Implementation of :mod:`timebound.propagation.grpc` (DECISIONS D4.6, D4.7, D4.12).

gRPC carries the relative deadline itself (the ``grpc-timeout`` header); beside it the client
interceptors send the call's absolute deadline as ``x-request-deadline`` metadata (D4.12):

* **Server interceptors** read ``context.time_remaining()`` and the ``x-request-deadline``
  metadata (the earlier wins, unless the two disagree by more than the clock skew, D9.3) and make
  it the handler's inherited deadline (``timebound.inherit_deadline(..., source="inherited")``)
  together with a :class:`~timebound.propagation.RequestState`. A call whose deadline is already
  spent is answered ``DEADLINE_EXCEEDED`` / ``Deadline propagation: Not enough time to handle
  this call`` without running the handler (userver's wording, verbatim).
* **Client interceptors** lower the call's ``timeout`` to the remaining time
  (``min(timeout, remaining)``), fail locally with :class:`~timebound.DeadlineExceeded` when
  nothing is left (nothing is sent), and turn a ``DEADLINE_EXCEEDED`` that our deadline caused into
  :class:`PropagatedDeadlineExceeded` — which is *both* a ``DeadlineExceeded(source="propagated")``
  and a ``grpc.RpcError`` (``grpc.aio.AioRpcError`` for aio), so existing ``except grpc.RpcError``
  code keeps working while policies see a spent deadline they must not retry (D2.5).

Metrics use userver's names verbatim (D4.7) with the label ``grpc_destination=SERVICE/METHOD``.
"""

from __future__ import annotations

import contextvars
import inspect
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from typing import Any, Final, NamedTuple

from ..._core import _clock
from ..._core._classify import bound_origin
from ..._core._deadline import Deadline
from ..._core._durations import Duration, ceil_ms
from ..._core._errors import ConfigurationError, DeadlineExceeded
from ..._core._request import RequestState, _request
from ..._core._scopes import (
    _spawn_detached,
    current_breakdown,
    enter_reserve,
    exit_reserve,
    inherit_deadline,
    reserve_seconds,
)
from ...policies._policy import Policy
from ...telemetry._events import counters, emit, enabled
from ...telemetry._tracing import CallSpan, call_span
from .._absolute import DEFAULT_SKEW, check_clock_skew, time_left
from .._breakdown_wire import (
    BREAKDOWN_HEADER,
    MAX_HEADER_BYTES,
    asked,
    check_max_bytes,
    server_value,
)
from .._client import Attempt, AttemptTimeoutBase, ClientOptions, absolute_wire_value, begin
from .._codec import parse_absolute_us
from .._config import is_enabled
from .._resilience import (
    FailedAnswer,
    Passed,
    Resilience,
    check_grpc_methods,
    check_policy,
)

try:
    import grpc
    import grpc.aio
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.grpc needs grpcio: pip install 'timebound[grpc]'"
    ) from exc

__all__ = [
    "ABSOLUTE_METADATA",
    "AioPropagatedDeadlineExceeded",
    "DEFAULT_RETRY_CODES",
    "EXPIRED_DETAILS",
    "PropagatedDeadlineExceeded",
    "aio_client_interceptor",
    "aio_client_interceptors",
    "aio_server_interceptor",
    "client_interceptor",
    "server_interceptor",
]

#: The status details of a call rejected because its deadline was spent (userver, verbatim).
EXPIRED_DETAILS: Final = "Deadline propagation: Not enough time to handle this call"
#: The metadata key of the absolute deadline, whole microseconds of the Unix epoch (D4.12).
ABSOLUTE_METADATA: Final = "x-request-deadline"

#: A ``grpc-timeout`` of this much or more means "no deadline" (D4.6, grpc#26236).
_NO_DEADLINE_AT: Final = 365 * 24 * 3600.0
_HOUR: Final = 3600.0
#: grpc-core's upward rounding of a sent timeout: relative, plus whole milliseconds.
_GRPC_ROUNDING: Final = 0.01
_GRPC_ROUNDING_MS: Final = 0.002

SERVER_PROPAGATED: Final = "grpc.server.by-destination.deadline-propagated"
SERVER_CANCELLED: Final = "grpc.server.by-destination.cancelled-by-deadline-propagation"
CLIENT_PROPAGATED: Final = "grpc.client.by-destination.deadline-propagated"
CLIENT_CANCELLED: Final = "grpc.client.by-destination.cancelled-by-deadline-propagation"
SERVER_COMPONENT: Final = "grpc-server"
CLIENT_COMPONENT: Final = "grpc-client"

Destination = Callable[[str], str]


#: The trailing metadata key of a callee's breakdown (gRPC keys are lower case).
BREAKDOWN_KEY: Final = BREAKDOWN_HEADER.lower()


def _default_destination(method: str) -> str:
    """``/pkg.Service/Method`` → ``pkg.Service/Method`` (userver's ``SERVICE/METHOD``)."""
    return method[1:] if method.startswith("/") else method


def _method_name(method: str | bytes) -> str:
    return method.decode("utf-8", "replace") if isinstance(method, bytes) else method


def _received_deadline(time_remaining: float | None) -> float | None:
    """Seconds left from the client's deadline as grpc reports it, or ``None`` for no deadline.

    The 365-day rule (D4.6, grpc#26236) is about the value on the wire, and grpc-core sends a
    timeout that large in whole hours, rounded up; ``time_remaining()`` is that value minus the
    time since the call arrived. Anything above 8759 hours on arrival was 8760 hours (365 days)
    or more when sent, so the rule does not flip on transit time.
    """
    if time_remaining is None or time_remaining > _NO_DEADLINE_AT - _HOUR:
        return None
    return time_remaining


def _handler_budget(received: float) -> float:
    """The least time the caller can have had when it sent ``received`` (never more).

    grpc-core rounds the ``grpc-timeout`` it sends up, to at most three significant digits of
    its unit, after rounding the deadline to whole milliseconds: a 30 s timeout arrives as
    30.1 s, 1 s as 1.01 s. That overshoot is at most 1 % plus 2 ms (sub-second values are sent
    in whole ms), so the handler gets that much less than arrived: never more than its caller
    has, at the price of up to 1 % of the budget.
    """
    return max(0.0, received - (received * _GRPC_ROUNDING + _GRPC_ROUNDING_MS))


# Errors --------------------------------------------------------------------------------------


class _StatusCode(str):
    """``"deadline-exceeded"`` that can also be called like ``grpc.RpcError.code()``.

    :class:`~timebound.TimeboundError` exposes its stable error code as the attribute ``code``
    (a string, for storage and UIs, D2.4) while ``grpc.RpcError`` has a method ``code()``. The
    propagated error is both, so its ``code`` is a string that answers the call too:
    ``err.code == "deadline-exceeded"`` and ``err.code() is grpc.StatusCode.DEADLINE_EXCEEDED``.
    """

    __slots__ = ()

    def __call__(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED


class PropagatedDeadlineExceeded(DeadlineExceeded, grpc.RpcError):  # type: ignore[misc]
    """A gRPC call ended ``DEADLINE_EXCEEDED`` because our own deadline had lowered its timeout.

    It is a :class:`~timebound.DeadlineExceeded` with ``source="propagated"`` (policies do not
    retry it, D2.5) and a ``grpc.RpcError`` whose ``code()`` is ``DEADLINE_EXCEEDED`` and whose
    ``details()``/metadata are those of the failed call, which is also chained as ``__cause__``.
    ``err.code`` also compares equal to the stable string ``"deadline-exceeded"``.
    """

    code = _StatusCode("deadline-exceeded")
    # The live call's metadata objects may not pickle; the details always do.
    _live_attributes = frozenset({"_initial_metadata", "_trailing_metadata"})

    def __init__(
        self,
        message: str | None = None,
        *,
        details: str | None = None,
        initial_metadata: Any = None,
        trailing_metadata: Any = None,
        debug_error_string: str | None = None,
        timeout: float | None = None,
        deadline: Any = None,
        what: str | None = None,
        set_by: str | None = None,
    ) -> None:
        DeadlineExceeded.__init__(
            self,
            message,
            source="propagated",
            timeout=timeout,
            deadline=deadline,
            what=what,
            set_by=set_by,
        )
        self._details = details
        self._initial_metadata = initial_metadata
        self._trailing_metadata = trailing_metadata
        self._debug_error_string = debug_error_string

    def details(self) -> str | None:
        """The call's status details."""
        return self._details

    def initial_metadata(self) -> Any:
        """The call's initial metadata, when it had any."""
        return self._initial_metadata

    def trailing_metadata(self) -> Any:
        """The call's trailing metadata, when it had any."""
        return self._trailing_metadata

    def debug_error_string(self) -> str | None:
        """grpc's debug string for the failed call."""
        return self._debug_error_string


class AioPropagatedDeadlineExceeded(
    PropagatedDeadlineExceeded,
    grpc.aio.AioRpcError,  # type: ignore[misc]
):
    """:class:`PropagatedDeadlineExceeded` for ``grpc.aio``: also a ``grpc.aio.AioRpcError``."""


def _propagated_from(
    cls: type[PropagatedDeadlineExceeded], err: Any, attempt: Attempt, destination: str
) -> PropagatedDeadlineExceeded:
    """The call's ``DEADLINE_EXCEEDED`` as ours: the attempt's timeout and deadline, and where
    the bound that lowered it was set (a reserve names itself, as over HTTP)."""

    def _get(name: str) -> Any:
        fn = getattr(err, name, None)
        try:
            return fn() if callable(fn) else None
        except Exception:  # a half-built grpc error must not hide the deadline
            return None

    return cls(
        f"gRPC {destination} timed out: our deadline lowered its timeout "
        f"(propagated deadline exceeded)",
        details=_get("details"),
        initial_metadata=_get("initial_metadata"),
        trailing_metadata=_get("trailing_metadata"),
        debug_error_string=_get("debug_error_string"),
        timeout=attempt.clamped.seconds,
        deadline=None if attempt.end is None else Deadline(attempt.end),
        what=f"gRPC {destination}",
        set_by=attempt.set_by,
    )


# Server side ---------------------------------------------------------------------------------


#: Where a call's inherited deadline (and the interceptor's reserve) was set (D2.8).
SET_BY: Final = "gRPC interceptor"


class _CallBound:
    """The inherited deadline and request state of one server call, entered in one Context."""

    __slots__ = ("_bound", "_reserve", "_reserved", "budget", "state")

    def __init__(self, received: float | None, budget: float | None, reserve: float = 0.0) -> None:
        self._reserve = reserve
        self._reserved: Any = None
        if received is None or budget is None:
            self.state = RequestState()
            self._bound = None
            self.budget: float | None = None
            return
        self.budget = budget
        deadline = Deadline.after(budget)
        self.state = RequestState(deadline_received_ms=max(0, ceil_ms(received)), deadline=deadline)
        self._bound = inherit_deadline(
            deadline, source="inherited", timeout=self.budget, set_by=SET_BY
        )
        self._bound._t0 = deadline.when - budget  # D13: the budget started at the call's arrival

    def breakdown(self, outcome: str, max_bytes: int) -> tuple[tuple[str, str], ...]:
        """D13.5: trailing metadata with this call's breakdown (empty without a deadline)."""
        if self._bound is None:
            return ()
        value = server_value(self._bound, outcome, max_bytes)
        return () if value is None else ((BREAKDOWN_KEY, value),)

    def enter(self) -> contextvars.Token[RequestState | None]:
        token = _request.set(self.state)
        if self._bound is not None:
            self._bound.__enter__()
            # D1.18: the handler sees the call's deadline less the reserve. A call with no more
            # than the reserve left was refused in _start; one that crossed that line since
            # enters it spent, and its handler's first bounded wait ends at once.
            self._reserved = enter_reserve(self._reserve, SET_BY, refuse=False)
        return token

    def exit(self, token: contextvars.Token[RequestState | None]) -> None:
        if self._bound is not None:
            exit_reserve(self._reserved)
            self._reserved = None
            self._bound.__exit__(None, None, None)
        _request.reset(token)


class _ServerBase:
    def __init__(
        self,
        *,
        enabled: bool,
        destination: Destination | None,
        absolute_metadata: str | None = ABSOLUTE_METADATA,
        clock_skew: Duration = DEFAULT_SKEW,
        expose_breakdown: bool = False,
        breakdown_max_bytes: int = MAX_HEADER_BYTES,
        reserve: Duration | None = None,
    ) -> None:
        self._reserve = reserve_seconds(reserve)
        self._expose = bool(expose_breakdown)
        self._bd_max = check_max_bytes(breakdown_max_bytes)
        self._enabled = enabled
        self._destination = destination or _default_destination
        self._absolute = absolute_metadata.lower() if absolute_metadata else None
        self._skew = check_clock_skew(clock_skew)

    def _received_absolute(self, context: Any) -> float | None:
        """The absolute deadline in the call's metadata (epoch seconds), or ``None`` (D4.12)."""
        key = self._absolute
        if key is None:
            return None
        values = [v for k, v in context.invocation_metadata() or () if k == key]
        return parse_absolute_us(",".join(values), header=key) if values else None

    def _start(self, method: str, context: Any) -> tuple[_CallBound, bool]:
        """Open the call's bound; the flag says the deadline is already spent."""
        received = _received_deadline(context.time_remaining())
        budget = None if received is None else _handler_budget(received)
        absolute = self._received_absolute(context)
        if absolute is not None:
            # D4.12: the absolute deadline counts under the same clock-skew rule as over HTTP.
            budget = time_left(budget, absolute, self._skew, component=SERVER_COMPONENT)
            if received is None:
                received = budget
        dest = self._destination(method)
        call = _CallBound(received, budget, self._reserve)
        if received is not None:
            counters.inc(SERVER_PROPAGATED, grpc_destination=dest)
            if enabled():
                emit(
                    "span.tags",
                    component=SERVER_COMPONENT,
                    grpc_destination=dest,
                    deadline_received_ms=call.state.deadline_received_ms,
                )
        # D1.20: no more than the reserve left is refused as a spent deadline is.
        expired = call.budget is not None and call.budget <= self._reserve
        if expired:
            self._finished_cancelled(method)
        return call, expired

    def _trailer(self, call: _CallBound, outcome: str) -> tuple[tuple[str, str], ...]:
        """The breakdown as trailing metadata, when this interceptor exposes it (D13.5)."""
        return call.breakdown(outcome, self._bd_max) if self._expose else ()

    def _asked(self, context: Any) -> bool:
        return self._expose and asked(context.invocation_metadata() or ())

    def _finished_cancelled(self, method: str) -> None:
        dest = self._destination(method)
        counters.inc(SERVER_CANCELLED, grpc_destination=dest)
        if enabled():
            emit(
                "span.tags",
                component=SERVER_COMPONENT,
                grpc_destination=dest,
                cancelled_by_deadline=1,
            )


def _is_request_deadline(err: DeadlineExceeded) -> bool:
    """Our request's own deadline (inherited, or spent by a propagated call) is what fired."""
    return bound_origin(err.source) == "remote"


def _absorbed(call: _CallBound, err: DeadlineExceeded) -> bool:
    """A ``DeadlineExceeded`` left the handler: the request's own deadline marks the call (it is
    answered ``DEADLINE_EXCEEDED`` afterwards); any other bound's error is the handler's own."""
    if not _is_request_deadline(err):
        return False
    call.state.cancelled_by_deadline = True
    return True


# (attribute of grpc.RpcMethodHandler, its factory); a handler has exactly one behaviour set.
_KINDS: Final = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def _rewrap(handler: Any, wrap: Callable[[str, Any], Any]) -> Any:
    """``handler`` with its behaviour replaced by ``wrap(kind, behaviour)``; ``handler`` itself
    when ``wrap`` returns ``None`` (a behaviour the interceptor leaves alone)."""
    for kind, factory in _KINDS:
        behavior = getattr(handler, kind)
        if behavior is None:
            continue
        wrapped = wrap(kind, behavior)
        if wrapped is None:
            return handler
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


class _SyncServerInterceptor(_ServerBase, grpc.ServerInterceptor):  # type: ignore[misc]
    """See :func:`server_interceptor`."""

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or not self._enabled:
            return handler
        method = _method_name(details.method)
        return _rewrap(
            handler,
            lambda kind, behavior: (
                self._wrap_stream(behavior, method)
                if kind.endswith("_stream")
                else self._wrap_unary(behavior, method)
            ),
        )

    def _wrap_unary(self, behavior: Callable[[Any, Any], Any], method: str) -> Any:
        def wrapped(request: Any, context: Any) -> Any:
            # This runs in grpc's thread-pool thread: the context variables are set (and reset)
            # here, around the handler, so nothing leaks into the pooled thread.
            call, expired = self._start(method, context)
            if expired:
                _sync_abort(context, self._trailer(call, "timeout"))
            token = call.enter()
            try:
                try:
                    response = behavior(request, context)
                except DeadlineExceeded as err:
                    if not _absorbed(call, err):
                        raise
                    response = None
            finally:
                call.exit(token)
            if call.state.cancelled_by_deadline:
                # A nested call gave up because this request's deadline was spent (D4.5): the
                # answer is DEADLINE_EXCEEDED even if the handler swallowed the error.
                self._finished_cancelled(method)
                _sync_abort(context, self._trailer(call, "timeout"))
            if self._asked(context):
                context.set_trailing_metadata(self._trailer(call, "ok"))
            return response

        return wrapped

    def _wrap_stream(self, behavior: Callable[[Any, Any], Any], method: str) -> Any:
        def wrapped(request: Any, context: Any) -> Iterator[Any]:
            call, expired = self._start(method, context)
            if expired:
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)
            # The response iterator is advanced by grpc between our frames, so the bound lives
            # in a private Context that every step runs in; the pooled thread's own context
            # never sees it.
            ctx = contextvars.copy_context()
            token = ctx.run(call.enter)
            try:
                responses = ctx.run(behavior, request, context)
                while True:
                    try:
                        item = ctx.run(next, responses)
                    except StopIteration:
                        break
                    except DeadlineExceeded as err:
                        if not _absorbed(call, err):
                            raise
                        break
                    yield item
            finally:
                ctx.run(call.exit, token)
            if call.state.cancelled_by_deadline:
                self._finished_cancelled(method)
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)

        return wrapped


class _AioServerInterceptor(_ServerBase, grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See :func:`aio_server_interceptor`."""

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None or not self._enabled:
            return handler
        method = _method_name(details.method)

        def wrap(_kind: str, behavior: Any) -> Any:
            if inspect.isasyncgenfunction(behavior):
                return self._wrap_asyncgen(behavior, method)
            if inspect.iscoroutinefunction(behavior):
                return self._wrap_coroutine(behavior, method)
            # A sync handler under grpc.aio runs in grpc's executor, which does not copy
            # context variables: it is left as it is (documented).
            return None

        return _rewrap(handler, wrap)

    def _wrap_coroutine(
        self, behavior: Callable[[Any, Any], Awaitable[Any]], method: str
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def wrapped(request: Any, context: Any) -> Any:
            # grpc.aio runs each call in its own task: setting the variables here scopes them
            # to this call.
            call, expired = self._start(method, context)
            if expired:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    EXPIRED_DETAILS,
                    trailing_metadata=self._trailer(call, "timeout"),
                )
            token = call.enter()
            try:
                try:
                    response = await behavior(request, context)
                except DeadlineExceeded as err:
                    if not _absorbed(call, err):
                        raise
                    response = None
            finally:
                call.exit(token)
            if call.state.cancelled_by_deadline:
                self._finished_cancelled(method)
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    EXPIRED_DETAILS,
                    trailing_metadata=self._trailer(call, "timeout"),
                )
            if self._asked(context):
                context.set_trailing_metadata(self._trailer(call, "ok"))
            return response

        return wrapped

    def _wrap_asyncgen(
        self, behavior: Callable[[Any, Any], AsyncIterator[Any]], method: str
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def wrapped(request: Any, context: Any) -> AsyncIterator[Any]:
            call, expired = self._start(method, context)
            if expired:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)
            # The generator is driven by the call's own task, so the variables set here stay
            # with this call for every step.
            token = call.enter()
            try:
                try:
                    async for item in behavior(request, context):
                        yield item
                except DeadlineExceeded as err:
                    if not _absorbed(call, err):
                        raise
            finally:
                call.exit(token)
            if call.state.cancelled_by_deadline:
                self._finished_cancelled(method)
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)

        return wrapped


def server_interceptor(
    *,
    enabled: bool = True,
    destination: Destination | None = None,
    absolute_metadata: str | None = ABSOLUTE_METADATA,
    clock_skew: Duration = DEFAULT_SKEW,
    expose_breakdown: bool = False,
    breakdown_max_bytes: int = MAX_HEADER_BYTES,
    reserve: Duration | None = None,
) -> grpc.ServerInterceptor:
    """A ``grpc.ServerInterceptor`` that makes the client's deadline the handler's deadline.

    ``grpc.server(executor, interceptors=[server_interceptor()])``. Covers all four call kinds:
    the bound is set in the thread-pool thread around the handler (and, for response streams,
    around every step of the response iterator). ``enabled=False`` passes calls through
    untouched; ``destination`` maps the full method name (``/pkg.Service/Method``) to the
    metrics label (default ``pkg.Service/Method``). ``absolute_metadata`` (``None`` to ignore
    it) and ``clock_skew`` (seconds, default 1): the absolute deadline in the call's metadata
    counts beside ``grpc-timeout`` when the two agree within the skew, as over HTTP (D4.12,
    D9.3); a call whose deadline has passed is refused without running the handler.
    ``expose_breakdown``: a unary call answered ``DEADLINE_EXCEEDED`` (and any unary call whose
    metadata has ``x-timebound-breakdown: 1``) carries this service's breakdown in its trailing
    metadata ``x-timebound-breakdown``, at most ``breakdown_max_bytes`` (D13.5; off by default).
    ``reserve`` (a duration): the handler sees the call's deadline less it, keeping time to
    answer (D1.18); a call with no more than the reserve left is refused, and a handler that
    lets the reserve's ``DeadlineExceeded`` escape is answered ``DEADLINE_EXCEEDED``.
    """
    return _SyncServerInterceptor(
        enabled=enabled,
        destination=destination,
        absolute_metadata=absolute_metadata,
        clock_skew=clock_skew,
        expose_breakdown=expose_breakdown,
        breakdown_max_bytes=breakdown_max_bytes,
        reserve=reserve,
    )


def aio_server_interceptor(
    *,
    enabled: bool = True,
    destination: Destination | None = None,
    absolute_metadata: str | None = ABSOLUTE_METADATA,
    clock_skew: Duration = DEFAULT_SKEW,
    expose_breakdown: bool = False,
    breakdown_max_bytes: int = MAX_HEADER_BYTES,
    reserve: Duration | None = None,
) -> grpc.aio.ServerInterceptor:
    """The ``grpc.aio`` twin of :func:`server_interceptor`: the bound is set in the call's task.

    Covers coroutine handlers of every kind and async-generator response streams; a plain
    (sync) handler under ``grpc.aio`` is passed through untouched.
    """
    return _AioServerInterceptor(
        enabled=enabled,
        destination=destination,
        absolute_metadata=absolute_metadata,
        clock_skew=clock_skew,
        expose_breakdown=expose_breakdown,
        breakdown_max_bytes=breakdown_max_bytes,
        reserve=reserve,
    )


# Client side ---------------------------------------------------------------------------------


class _SyncDetails(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: Any
    wait_for_ready: Any
    compression: Any


class _ClientCallDetails(_SyncDetails, grpc.ClientCallDetails):  # type: ignore[misc]
    """A ``grpc.ClientCallDetails`` with our timeout."""


class _Clamp(NamedTuple):
    """One call's attempt (the clamp, the request it belongs to, how to count a cut)."""

    attempt: Attempt
    destination: str

    @property
    def timeout(self) -> float | None:
        return self.attempt.clamped.seconds

    @property
    def lowered(self) -> bool:
        return self.attempt.lowered

    @property
    def propagated(self) -> bool:
        """A ``DEADLINE_EXCEEDED`` means our deadline is spent: the timeout was lowered by a
        bound other than the attempt's own (a policy's per-attempt timeout is retryable, D2.5)."""
        return self.attempt.propagated


class _Report:
    """userver's gRPC client metrics and span tags, labelled with the destination (D4.7)."""

    __slots__ = ("_dest",)

    def __init__(self, dest: str) -> None:
        self._dest = dest

    def lowered(self, timeout_ms: int | None) -> None:
        counters.inc(CLIENT_PROPAGATED, grpc_destination=self._dest)
        if enabled():
            emit(
                "span.tags",
                component=CLIENT_COMPONENT,
                grpc_destination=self._dest,
                deadline_updated=1,
                timeout_ms=timeout_ms,
            )

    def cancelled(self) -> None:
        counters.inc(CLIENT_CANCELLED, grpc_destination=self._dest)
        if enabled():
            emit(
                "span.tags",
                component=CLIENT_COMPONENT,
                grpc_destination=self._dest,
                cancelled_by_deadline=1,
            )


#: The status codes that are the dependency's failure by default (D3.17): gRPC's retry policy
#: examples and Polly's gRPC guidance; a shedding timebound host answers UNAVAILABLE.
DEFAULT_RETRY_CODES: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}
)


def _check_codes(codes: Iterable[grpc.StatusCode]) -> frozenset[grpc.StatusCode]:
    if isinstance(codes, (str, bytes)) or not isinstance(codes, Iterable):
        raise ConfigurationError(
            f"retry_codes must be a collection of grpc.StatusCode, got {codes!r}",
            option="retry_codes",
        )
    out = frozenset(codes)
    for code in out:
        if not isinstance(code, grpc.StatusCode) or code is grpc.StatusCode.OK:
            raise ConfigurationError(
                f"retry_codes: a failure is a grpc.StatusCode other than OK, got {code!r}",
                option="retry_codes",
            )
    return out


class _ClientBase:
    def __init__(
        self,
        *,
        enabled: bool,
        destination: Destination | None,
        resilience: Resilience | None = None,
        retry_codes: frozenset[grpc.StatusCode] = DEFAULT_RETRY_CODES,
    ) -> None:
        self._enabled = enabled
        self._destination = destination or _default_destination
        self._resilience = resilience
        self._retry_codes = retry_codes

    def _what(self, method: str | bytes) -> str:
        return f"gRPC {self._destination(_method_name(method))}"

    def _clamp(self, method: str | bytes, timeout: float | None) -> _Clamp:
        """The call's attempt (shared with the HTTP clients); with no time left it raises and
        nothing is sent (D4.3). gRPC carries the timeout itself: no header of ours."""
        dest = self._destination(_method_name(method))
        options = ClientOptions(propagate_header=False, what=f"gRPC {dest}", report=_Report(dest))
        return _Clamp(begin(timeout, options, AttemptTimeoutBase), dest)

    @staticmethod
    def _with(details: Any, timeout: float | None, metadata: tuple[tuple[str, Any], ...]) -> Any:
        """``details`` with this timeout and metadata."""
        raise NotImplementedError

    def _details(self, details: Any) -> tuple[Any, _Clamp | None]:
        """The call's details with the clamped timeout and the absolute deadline beside
        ``grpc-timeout`` (D4.12), and the clamp (``None`` when off)."""
        if not self._enabled:
            return details, None
        clamp = self._clamp(details.method, details.timeout)
        end = clamp.attempt.end
        if end is None or not is_enabled():
            # No deadline and no timeout: grpc sends none, and neither do we.
            if not clamp.lowered:
                return details, clamp
            return self._with(details, clamp.timeout, _metadata(details.metadata)), clamp
        metadata = (
            *(m for m in _metadata(details.metadata) if m[0] != ABSOLUTE_METADATA),
            (ABSOLUTE_METADATA, absolute_wire_value(end)),
        )
        return self._with(details, clamp.timeout, metadata), clamp

    @staticmethod
    def _spent(clamp: _Clamp) -> None:
        """Our deadline cut a call short: count it and mark the request it belongs to (when
        the bound that cut it is the request's own deadline)."""
        clamp.attempt.spent()


def _sync_abort(context: Any, trailer: tuple[tuple[str, str], ...]) -> None:
    if trailer:
        context.set_trailing_metadata(trailer)
    context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)


def _trailer_value(metadata: Any) -> str | bytes | None:
    """The callee's breakdown in a call's trailing metadata (``None``: it sent none)."""
    try:
        for key, value in metadata or ():
            if key == BREAKDOWN_KEY:
                return value  # type: ignore[no-any-return]
    except Exception:  # metadata of a half-built error: no breakdown, never a failure
        return None
    return None


def _caller_breakdown(attempt: Attempt, status: str) -> Any:
    """The breakdown of the bound that ran out here, with this call in it (D13.5)."""
    name = attempt.name or attempt.options.what
    seconds = attempt.clamped.seconds
    mark = ("call", name, attempt.t0, _clock.now(), seconds, status, attempt.remote)
    return current_breakdown((mark,), name, attempt.t0, seconds)


def _sync_answered(outcome: Any, clamp: _Clamp) -> None:
    """D13: a finished unary call is a part of our breakdown, the callee's own inside it.

    A blocking call (``stub(request)``, ``with_call``) has finished when the interceptor gets
    its outcome back, in the caller's thread and scopes. A ``future()`` finishes later in
    grpc's own thread, outside the caller's scopes: it is not recorded.
    """
    try:
        if not outcome.done():
            return
        code = outcome.code()
        metadata = outcome.trailing_metadata()
    except Exception:  # an outcome that is not a finished call: nothing to record
        return
    status = code.name if isinstance(code, grpc.StatusCode) else str(code)
    clamp.attempt.answered(status, _trailer_value(metadata))


def _rpc_span(method: str | bytes, clamp: _Clamp | None) -> CallSpan | None:
    """The client span of one call (D10.8), with OpenTelemetry's RPC attributes and the budget
    grpc sends as ``grpc-timeout``; ``None`` when nothing is traced."""
    name = _method_name(method).lstrip("/")
    service, _, rpc = name.rpartition("/")
    span = call_span(name, **{"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc})
    if span is not None and clamp is not None and clamp.timeout is not None:
        span.set("timebound.deadline.propagated_ms", ceil_ms(clamp.timeout))
    return span


def _end_rpc_span(span: CallSpan, code: Any) -> None:
    """End a call's span with its status code (``rpc.grpc.status_code``; an error unless OK)."""
    if isinstance(code, grpc.StatusCode):
        span.set("rpc.grpc.status_code", code.value[0])
        span.end(None if code is grpc.StatusCode.OK else code.name)
    else:
        span.end()


def _sync_code(call: Any) -> Any:
    try:
        return call.code()
    except Exception:  # an outcome that is not a call has no code
        return None


def _metadata(metadata: Any) -> tuple[tuple[str, Any], ...]:
    """A call's metadata (``None``, a sequence of pairs or ``grpc.aio.Metadata``) as pairs."""
    return tuple((key, value) for key, value in metadata or ())


def _is_deadline_code(outcome: Any) -> bool:
    try:
        return bool(outcome.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
    except Exception:  # outcomes that are not calls have no code
        return False


class _PropagatingOutcome(grpc.Call, grpc.Future):  # type: ignore[misc]
    """A unary call's outcome whose ``DEADLINE_EXCEEDED`` surfaces as our propagated error."""

    def __init__(self, outcome: Any, clamp: _Clamp) -> None:
        self._outcome = outcome
        self._clamp = clamp
        self._converted: PropagatedDeadlineExceeded | None = None

    def _error(self, timeout: float | None) -> BaseException | None:
        err = self._outcome.exception(timeout)
        if err is None or not _is_deadline_code(self._outcome):
            return err  # type: ignore[no-any-return]
        if self._converted is None:
            conv = _propagated_from(
                PropagatedDeadlineExceeded, err, self._clamp.attempt, self._clamp.destination
            )
            conv.breakdown = _caller_breakdown(self._clamp.attempt, "DEADLINE_EXCEEDED")
            conv.__cause__ = err
            self._converted = conv
        return self._converted

    def result(self, timeout: float | None = None) -> Any:
        err = self._error(timeout)
        if isinstance(err, PropagatedDeadlineExceeded):
            raise err
        return self._outcome.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._error(timeout)

    def traceback(self, timeout: float | None = None) -> Any:
        return self._outcome.traceback(timeout)

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._outcome.add_done_callback(lambda _f: fn(self))

    def cancel(self) -> bool:
        return bool(self._outcome.cancel())

    def cancelled(self) -> bool:
        return bool(self._outcome.cancelled())

    def running(self) -> bool:
        return bool(self._outcome.running())

    def done(self) -> bool:
        return bool(self._outcome.done())

    def is_active(self) -> bool:
        return bool(self._outcome.is_active())

    def time_remaining(self) -> float | None:
        return self._outcome.time_remaining()  # type: ignore[no-any-return]

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return bool(self._outcome.add_callback(callback))

    def initial_metadata(self) -> Any:
        return self._outcome.initial_metadata()

    def trailing_metadata(self) -> Any:
        return self._outcome.trailing_metadata()

    def code(self) -> Any:
        return self._outcome.code()

    def details(self) -> Any:
        return self._outcome.details()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outcome, name)


class _SyncClientInterceptor(
    _ClientBase,
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    """See :func:`client_interceptor`."""

    @staticmethod
    def _with(details: Any, timeout: float | None, metadata: tuple[tuple[str, Any], ...]) -> Any:
        return _ClientCallDetails(
            details.method,
            timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def _watch(self, outcome: Any, clamp: _Clamp | None) -> None:
        if clamp is None or not clamp.lowered:
            return

        def done(call: Any) -> None:
            if _is_deadline_code(call):
                self._spent(clamp)

        try:
            outcome.add_done_callback(done)
        except AttributeError:  # a streaming call: ends through add_callback instead
            outcome.add_callback(lambda: done(outcome))

    def _start(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> tuple[Any, _Clamp | None]:
        """Send the call, inside its span when tracing (ended when the call ends, D10.8)."""
        new, clamp = self._details(details)
        span = _rpc_span(details.method, clamp)
        if span is None:
            outcome = continuation(new, request)
        else:
            new = self._with(new, new.timeout, (*_metadata(new.metadata), *span.carrier().items()))
            try:
                outcome = continuation(new, request)
            except BaseException as exc:
                span.end(type(exc).__name__)
                raise
            try:
                outcome.add_done_callback(lambda call: _end_rpc_span(span, _sync_code(call)))
            except AttributeError:  # a streaming call: ends through add_callback instead
                outcome.add_callback(lambda: _end_rpc_span(span, _sync_code(outcome)))
        self._watch(outcome, clamp)
        return outcome, clamp

    def _unary(self, continuation: Callable[[Any, Any], Any], details: Any, request: Any) -> Any:
        outcome, clamp = self._start(continuation, details, request)
        if clamp is not None:
            _sync_answered(outcome, clamp)
        if clamp is None or not clamp.propagated:
            return outcome
        return _PropagatingOutcome(outcome, clamp)

    def _stream(self, continuation: Callable[[Any, Any], Any], details: Any, request: Any) -> Any:
        return self._start(continuation, details, request)[0]

    def _unary_unary(
        self, continuation: Callable[[Any, Any], Any], details: Any, request: Any
    ) -> Any:
        resilience = self._resilience
        if resilience is None:
            return self._unary(continuation, details, request)
        # D3.17: the call's attempts under the policy, each blocking until its outcome is
        # known (a ``future()`` call too); the outcome the call ended on is returned.
        return resilience.run_sync(
            _method_name(details.method), self._attempt, continuation, details, request
        )

    def _attempt(self, continuation: Callable[[Any, Any], Any], details: Any, request: Any) -> Any:
        """One attempt under the policy (see ``propagation._resilience``)."""
        outcome = self._unary(continuation, details, request)
        err = outcome.exception()
        if err is None:
            return outcome
        if isinstance(err, DeadlineExceeded):
            raise err
        if _sync_code(outcome) in self._retry_codes:
            trailing = getattr(err, "trailing_metadata", None)
            raise FailedAnswer(
                outcome,
                self._what(details.method),
                trailing=trailing() if callable(trailing) else None,
            )
        return outcome  # another error: the outcome raises it, as without a policy

    # grpc calls these positionally (continuation, details, request or request iterator); a
    # unary-response call can be re-typed on failure, a response stream only watched. Only a
    # unary call is sent again under a policy: a request stream cannot be replayed.
    intercept_unary_unary = _unary_unary
    intercept_stream_unary = _unary
    intercept_unary_stream = _stream
    intercept_stream_stream = _stream


class _AioClientBase(_ClientBase):
    @staticmethod
    def _with(details: Any, timeout: float | None, metadata: tuple[tuple[str, Any], ...]) -> Any:
        # grpc.aio's ClientCallDetails is a namedtuple, and its metadata a Metadata object.
        return details._replace(timeout=timeout, metadata=grpc.aio.Metadata.from_tuple(metadata))

    def _traced(self, new: Any, span: CallSpan | None) -> Any:
        if span is None:
            return new
        return self._with(new, new.timeout, (*_metadata(new.metadata), *span.carrier().items()))

    async def _unary(
        self, continuation: Callable[[Any, Any], Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        new, clamp = self._details(details)
        span = _rpc_span(details.method, clamp)
        try:
            call = await continuation(self._traced(new, span), request)
            if span is None and (clamp is None or not clamp.lowered):
                return call
            await call
        except grpc.aio.AioRpcError as err:
            if span is not None:
                _end_rpc_span(span, err.code())
            if clamp is not None and clamp.lowered:
                # D13: the call is a part of our breakdown, the callee's own inside it.
                clamp.attempt.answered(err.code().name, _trailer_value(err.trailing_metadata()))
            if (
                clamp is None
                or not clamp.lowered
                or err.code() != grpc.StatusCode.DEADLINE_EXCEEDED
            ):
                raise
            self._spent(clamp)
            if not clamp.propagated:
                raise
            conv = _propagated_from(
                AioPropagatedDeadlineExceeded, err, clamp.attempt, clamp.destination
            )
            conv.breakdown = _caller_breakdown(clamp.attempt, err.code().name)
            raise conv from err
        except BaseException as exc:
            if span is not None:
                span.end(type(exc).__name__)
            raise
        if span is not None:
            _end_rpc_span(span, grpc.StatusCode.OK)
        if clamp is not None and clamp.lowered:
            clamp.attempt.answered("OK", _trailer_value(await call.trailing_metadata()))
        # The call is finished; returning it keeps code(), details() and metadata available.
        return call

    async def _stream(
        self, continuation: Callable[[Any, Any], Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        new, clamp = self._details(details)
        span = _rpc_span(details.method, clamp)
        try:
            call = await continuation(self._traced(new, span), request)
        except BaseException as exc:
            if span is not None:
                span.end(type(exc).__name__)
            raise
        if span is not None or (clamp is not None and clamp.lowered):
            call.add_done_callback(lambda finished: _aio_stream_done(self, finished, clamp, span))
        return call


def _aio_stream_done(
    client: _ClientBase, call: Any, clamp: _Clamp | None, span: CallSpan | None
) -> None:
    """Count and mark a response stream that ended ``DEADLINE_EXCEEDED`` under our deadline;
    end its span with its status."""

    async def check() -> None:
        # The call is done, so code() answers at once; it is a coroutine in grpc.aio.
        code = await call.code()
        if span is not None:
            _end_rpc_span(span, code)
        if clamp is not None and clamp.lowered and code == grpc.StatusCode.DEADLINE_EXCEEDED:
            client._spent(clamp)

    _spawn_detached(check())


# grpc.aio dispatches on the interceptor's type, so each call kind needs its own class; grpc calls
# the method positionally (continuation, details, request or request iterator).
class _AioUnaryUnary(_AioClientBase, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Unary calls, under the policy when given one (D3.17): a request stream cannot be
    replayed, so only this kind is sent again."""

    async def intercept_unary_unary(
        self, continuation: Callable[[Any, Any], Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        resilience = self._resilience
        if resilience is None:
            return await self._unary(continuation, details, request)
        answer = await resilience.run(
            _method_name(details.method), self._attempt, continuation, details, request
        )
        if isinstance(answer, BaseException):
            raise answer  # the failure the call ended on, as grpc raises it without a policy
        return answer

    async def _attempt(
        self, continuation: Callable[[Any, Any], Awaitable[Any]], details: Any, request: Any
    ) -> Any:
        """One attempt under the policy (see ``propagation._resilience``); a hedge that loses
        is cancelled where it awaits its call, which cancels the RPC (the server sees it)."""
        try:
            call = await self._unary(continuation, details, request)
            await call
        except DeadlineExceeded:
            raise
        except grpc.aio.AioRpcError as err:
            if err.code() not in self._retry_codes:
                return Passed(err)
            raise FailedAnswer(
                err, self._what(details.method), trailing=err.trailing_metadata()
            ) from None
        except Exception as exc:
            return Passed(exc)
        return call


class _AioStreamUnary(_AioClientBase, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    intercept_stream_unary = _AioClientBase._unary


class _AioUnaryStream(_AioClientBase, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    intercept_unary_stream = _AioClientBase._stream


class _AioStreamStream(_AioClientBase, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    intercept_stream_stream = _AioClientBase._stream


def client_interceptor(
    *,
    enabled: bool = True,
    destination: Destination | None = None,
    policy: Policy[Any] | None = None,
    retry_codes: Iterable[grpc.StatusCode] = DEFAULT_RETRY_CODES,
    hedge_methods: Iterable[str] = (),
) -> Any:
    """A client interceptor (all four kinds) that bounds every call by the current deadline.

    ``policy``: a :class:`~timebound.policies.Policy` each unary call runs under — attempts,
    breaker, retry budget, learned timeout (D3.17); a call that ends ``retry_codes``
    (UNAVAILABLE, RESOURCE_EXHAUSTED) is the dependency's failure, and its
    ``grpc-retry-pushback-ms`` is honoured. A hedged policy hedges only the methods in
    ``hedge_methods`` (``/package.Service/Method``), which the caller says are idempotent: the
    attempts race in threads, and a losing attempt runs on to its end, bounded by the timeout
    it was sent with (a blocking grpc call cannot be cancelled; D3.18).

    ``grpc.intercept_channel(channel, client_interceptor())``. The call's ``timeout`` becomes
    ``min(timeout, remaining)``; with no time left the call raises
    :class:`~timebound.DeadlineExceeded` (the binding bound's ``source``) and nothing is sent.
    A unary-response call that ends ``DEADLINE_EXCEEDED`` after our deadline lowered its
    timeout raises :class:`PropagatedDeadlineExceeded` and marks the request; response streams
    keep grpc's own ``RpcError`` on iteration but are counted and mark the request too.
    """
    resilience = check_policy(
        policy,
        adapter="client_interceptor",
        hedged=check_grpc_methods(hedge_methods),
        hedging=None,
    )
    return _SyncClientInterceptor(
        enabled=enabled,
        destination=destination,
        resilience=resilience,
        retry_codes=_check_codes(retry_codes),
    )


def aio_client_interceptors(
    *,
    enabled: bool = True,
    destination: Destination | None = None,
    policy: Policy[Any] | None = None,
    retry_codes: Iterable[grpc.StatusCode] = DEFAULT_RETRY_CODES,
    hedge_methods: Iterable[str] = (),
) -> list[grpc.aio.ClientInterceptor]:
    """The ``grpc.aio`` client interceptors: a list, one per call kind.

    ``grpc.aio.insecure_channel(target, interceptors=aio_client_interceptors())`` — or
    ``interceptors=[*aio_client_interceptors(), other]``. grpc.aio files each interceptor under
    the first call kind its type matches, so one object cannot serve all four. Same rules as
    :func:`client_interceptor`; the unary-response error is :class:`AioPropagatedDeadlineExceeded`.

    ``policy`` as for :func:`client_interceptor`; a hedged policy hedges only the methods in
    ``hedge_methods`` (``/package.Service/Method``), which the caller says are idempotent
    (D3.18); every other call runs unhedged.
    """
    resilience = check_policy(
        policy,
        adapter="aio_client_interceptors",
        hedged=check_grpc_methods(hedge_methods),
        hedging=None,
    )
    return [
        _AioUnaryUnary(
            enabled=enabled,
            destination=destination,
            resilience=resilience,
            retry_codes=_check_codes(retry_codes),
        ),
        _AioStreamUnary(enabled=enabled, destination=destination),
        _AioUnaryStream(enabled=enabled, destination=destination),
        _AioStreamStream(enabled=enabled, destination=destination),
    ]


def aio_client_interceptor(
    *, enabled: bool = True, destination: Destination | None = None
) -> list[grpc.aio.ClientInterceptor]:
    """Deprecated name of :func:`aio_client_interceptors` (it returns a list, not one
    interceptor); warns and returns the same list."""
    warnings.warn(
        "timebound.propagation.grpc.aio_client_interceptor() returns a list of interceptors;"
        " it is now aio_client_interceptors(): pass interceptors=aio_client_interceptors()",
        DeprecationWarning,
        stacklevel=2,
    )
    return aio_client_interceptors(enabled=enabled, destination=destination)
