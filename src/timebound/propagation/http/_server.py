"""What the ASGI and WSGI middlewares share: reading the deadline, the 498 answer, telemetry.

Observability names are userver's, verbatim (D4.7): counters ``deadline-received`` and
``cancelled-by-deadline`` (label ``component="http-server"``); span tags ``deadline_received_ms``,
``cancelled_by_deadline`` and ``dp_original_body_size``, sent as ``span.tags`` telemetry events
that an exporter attaches to the request's span.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from ..._core import _clock
from ..._core._deadline import Deadline
from ..._core._durations import Duration
from ..._core._errors import ConfigurationError, DeadlineExceeded
from ...telemetry._events import counters, emit, enabled
from .. import _config
from .._absolute import DEFAULT_SKEW, check_clock_skew, time_left
from .._codec import (
    ABSOLUTE_HEADER,
    EXPIRED_BODY,
    HeaderNames,
    ReceivedTimeout,
    read_absolute,
    read_timeout,
)
from .._state import RequestState

__all__ = [
    "COMPONENT",
    "DEFAULT_SKEW",
    "ExpiredAnswers",
    "Arrival",
    "ServerConfig",
    "arrive",
    "expired_headers",
    "log_late_failure",
    "now",
    "record_started_late",
]

COMPONENT = "http-server"

logger = logging.getLogger("timebound.propagation")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Options shared by the ASGI and WSGI middlewares (validated once, at construction)."""

    names: HeaderNames
    expired_status: int
    enabled: bool
    #: How far the absolute deadline may disagree with the relative one and still count (D9.3).
    skew: float = DEFAULT_SKEW

    @classmethod
    def build(
        cls,
        *,
        expired_status: int,
        timeout_header: str,
        expired_header: str,
        grpc_timeout_header: str | None,
        envoy_timeout_header: str | None,
        enabled: bool,
        absolute_header: str | None = ABSOLUTE_HEADER,
        clock_skew: Duration = DEFAULT_SKEW,
    ) -> ServerConfig:
        if not isinstance(expired_status, int) or not 400 <= expired_status <= 599:
            # userver: the marker "must follow an HTTP status code in the range 400-599".
            raise ConfigurationError(
                f"expired_status must be an HTTP status in 400..599, not {expired_status!r}",
                option="expired_status",
            )
        for option, value in (
            ("timeout_header", timeout_header),
            ("expired_header", expired_header),
        ):
            if not value or not isinstance(value, str):
                raise ConfigurationError(f"{option} must be a header name", option=option)
        skew = check_clock_skew(clock_skew)
        names = HeaderNames(
            timeout=timeout_header,
            expired=expired_header,
            grpc_timeout=grpc_timeout_header or None,
            envoy_timeout=envoy_timeout_header or None,
            absolute=absolute_header or None,
        )
        return cls(
            names=names,
            expired_status=expired_status,
            enabled=bool(enabled),
            skew=skew,
        )

    def active(self) -> bool:
        """Both the middleware's static switch and the process-wide runtime switch are on."""
        return self.enabled and _config.is_enabled()


@dataclass(slots=True)
class Arrival:
    """A request that arrived with a deadline."""

    deadline: Deadline
    state: RequestState
    seconds: float

    def late(self) -> bool:
        """The deadline passed, or a downstream call failed because of it (D4.5): the response
        must be replaced by the "Deadline expired" answer if it still can be."""
        return self.state.cancelled_by_deadline or self.deadline.expired


def arrive(
    headers: Iterable[tuple[str, str | bytes]],
    names: HeaderNames,
    start: float,
    skew: float = DEFAULT_SKEW,
) -> Arrival | None:
    """Read the deadline headers of a request first seen at ``start`` (D4.2); ``None`` if none.

    The absolute ``X-Request-Deadline`` counts beside the relative headers under the clock-skew
    rule of :func:`~timebound.propagation._absolute.time_left` (D9.3).
    """
    headers = list(headers)
    received = read_timeout(headers, names)
    left = time_left(
        None if received is None else received.seconds,
        read_absolute(headers, names),
        skew,
        component=COMPONENT,
    )
    if left is None:
        return None
    if received is None or left != received.seconds:
        received = ReceivedTimeout(left)
    ms = received.ms
    counters.inc("deadline-received", component=COMPONENT)
    if enabled():
        emit("span.tags", component=COMPONENT, deadline_received_ms=ms)
    deadline = Deadline(start + received.seconds)
    return Arrival(
        deadline=deadline,
        state=RequestState(deadline_received_ms=ms, deadline=deadline),
        seconds=received.seconds,
    )


def expired_headers(names: HeaderNames) -> list[tuple[str, str]]:
    """The headers of the "Deadline expired" answer (D4.4)."""
    return [
        ("content-type", "text/plain; charset=utf-8"),
        ("content-length", str(len(EXPIRED_BODY))),
        (names.expired, "1"),
    ]


class ExpiredAnswers:
    """Counts, tags and logs the requests one middleware answers "Deadline expired" (D4.4).

    Operators see every such answer in the log without a flood: the first one in each
    ``interval`` seconds is an INFO line (with how many were answered quietly since), the rest
    are DEBUG lines. Owned by its middleware, so two apps never share a rate limit.
    """

    __slots__ = ("_interval", "_lock", "_next_info", "_quiet", "_status")

    def __init__(self, status: int, interval: float = 10.0) -> None:
        self._status = status
        self._interval = interval
        self._next_info = -math.inf
        self._quiet = 0
        self._lock = threading.Lock()

    def record(
        self, state: RequestState, original_body_size: int | None, method: str, path: str
    ) -> None:
        """Count, tag and log one request answered "Deadline expired"."""
        state.cancelled_by_deadline = True
        counters.inc("cancelled-by-deadline", component=COMPONENT)
        if enabled():
            tags: dict[str, object] = {"cancelled_by_deadline": 1}
            if original_body_size is not None:
                tags["dp_original_body_size"] = original_body_size
            emit("span.tags", component=COMPONENT, **tags)
        with self._lock:
            t = _clock.now()
            if t >= self._next_info:
                self._next_info = t + self._interval
                level, quiet, self._quiet = logging.INFO, self._quiet, 0
            else:
                level, quiet = logging.DEBUG, 0
                self._quiet += 1
        if logger.isEnabledFor(level):
            # The path comes from the client: repr() keeps control characters out of the log.
            shown = path if len(path) <= 200 else path[:200] + "…"
            logger.log(
                level,
                "answered %d Deadline expired to %s %r (deadline received: %s ms)%s",
                self._status,
                method,
                shown,
                state.deadline_received_ms,
                f"; {quiet} more answered so since the last such line" if quiet else "",
            )


def log_late_failure(exc: BaseException, status: int) -> None:
    """A handler failed after its deadline: answered ``status`` anyway, the failure stays visible.

    A ``DeadlineExceeded`` is the expected way to fail late and is not logged.
    """
    if not isinstance(exc, DeadlineExceeded):
        logger.warning(
            "handler failed after its request deadline; answering %d", status, exc_info=exc
        )


def spent_reserve(exc: BaseException, set_by: str) -> bool:
    """``exc`` says the middleware's reserve ran out (D1.18): the handler had only the reserve
    left and failed, so the request is answered "Deadline expired" as if its deadline had
    passed. A reserve the handler's own code keeps has another ``set_by`` and is its business."""
    return isinstance(exc, DeadlineExceeded) and exc.set_by == f"reserve of {set_by}"


def record_started_late(arrival: Arrival) -> None:
    """A response committed (streaming) before the deadline ended after it: nothing could be
    replaced; the span tag ``dp_response_already_started`` records it."""
    if arrival.deadline.expired and enabled():
        emit("span.tags", component=COMPONENT, dp_response_already_started=1)


def now() -> float:
    """The scheduling clock (one import point for both middlewares)."""
    return _clock.now()
