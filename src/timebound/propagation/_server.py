"""What the ASGI and WSGI middlewares share: reading the deadline, the 498 answer, telemetry.

Observability names are userver's, verbatim (D4.7): counters ``deadline-received`` and
``cancelled-by-deadline`` (label ``component="http-server"``); span tags ``deadline_received_ms``,
``cancelled_by_deadline`` and ``dp_original_body_size``, sent as ``span.tags`` telemetry events
that an exporter attaches to the request's span.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .._core import _clock
from .._core._deadline import Deadline
from .._core._errors import ConfigurationError
from ..telemetry._events import counters, emit, enabled
from ._codec import EXPIRED_BODY, HeaderNames, read_timeout
from ._state import RequestState

__all__ = [
    "COMPONENT",
    "Arrival",
    "ServerConfig",
    "arrive",
    "expired_headers",
    "now",
    "record_cancelled",
]

COMPONENT = "http-server"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Options shared by the ASGI and WSGI middlewares (validated once, at construction)."""

    names: HeaderNames
    expired_status: int
    enabled: bool

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
        names = HeaderNames(
            timeout=timeout_header,
            expired=expired_header,
            grpc_timeout=grpc_timeout_header or None,
            envoy_timeout=envoy_timeout_header or None,
        )
        return cls(names=names, expired_status=expired_status, enabled=bool(enabled))


@dataclass(slots=True)
class Arrival:
    """A request that arrived with a deadline."""

    deadline: Deadline
    state: RequestState
    seconds: float


def arrive(
    headers: Iterable[tuple[str, str | bytes]], names: HeaderNames, start: float
) -> Arrival | None:
    """Read the deadline headers of a request first seen at ``start`` (D4.2); ``None`` if none."""
    received = read_timeout(headers, names)
    if received is None:
        return None
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


def record_cancelled(state: RequestState, original_body_size: int | None) -> None:
    """Count and tag a request answered "Deadline expired"."""
    state.cancelled_by_deadline = True
    counters.inc("cancelled-by-deadline", component=COMPONENT)
    if enabled():
        tags: dict[str, object] = {"cancelled_by_deadline": 1}
        if original_body_size is not None:
            tags["dp_original_body_size"] = original_body_size
        emit("span.tags", component=COMPONENT, **tags)


def now() -> float:
    """The scheduling clock (one import point for both middlewares)."""
    return _clock.now()
