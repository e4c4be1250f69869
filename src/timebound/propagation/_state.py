"""Per-request deadline state shared by servers and clients (DECISIONS D4).

A server adapter (ASGI, WSGI, gRPC) opens a :class:`RequestState` for each request; every
client adapter (httpx, requests, aiohttp, gRPC, databases) reads the effective deadline from the
core and, when a call failed *because of our own deadline*, marks the request so the server
answers "Deadline expired" even if user code swallowed the exception (D4.5). The state object is
shared by reference, so child tasks and ``to_thread`` workers mark the same request.
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass

from .._core._errors import DeadlineExceeded
from .._core._scopes import current_bound_error, remaining

__all__ = [
    "ClampedTimeout",
    "RequestState",
    "clamp_timeout",
    "current_request",
    "mark_cancelled_by_deadline",
]


@dataclass(slots=True)
class RequestState:
    """What a server knows about the request it is handling."""

    #: The deadline received on the wire, in whole ms, or ``None`` when none was received.
    deadline_received_ms: int | None = None
    #: Set when an operation gave up because this request's deadline was spent (D4.5).
    cancelled_by_deadline: bool = False


_request: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar(
    "timebound.request", default=None
)


def current_request() -> RequestState | None:
    """The state of the request being handled here, or ``None`` outside a server adapter."""
    return _request.get()


def mark_cancelled_by_deadline() -> None:
    """Record that the current request's deadline cut an operation short (no-op outside one)."""
    state = _request.get()
    if state is not None:
        state.cancelled_by_deadline = True


@dataclass(frozen=True, slots=True)
class ClampedTimeout:
    """The timeout an outgoing call must use: ``min(static, remaining)`` (D4.3).

    ``lowered`` is true when the effective deadline, not the static timeout, set it — the case
    in which a remote "deadline expired" answer means *our* deadline is spent (D4.5).
    """

    seconds: float | None
    lowered: bool

    @property
    def ms(self) -> int | None:
        """Whole milliseconds, rounded up, never 0 (the wire form); ``None`` for no timeout."""
        if self.seconds is None:
            return None
        return max(1, math.ceil(round(self.seconds * 1000, 6)))


def clamp_timeout(static: float | None, *, what: str = "request") -> ClampedTimeout:
    """Clamp a client's static timeout by the effective deadline, failing fast when it is spent.

    Raises :class:`DeadlineExceeded` (with the binding bound's ``source``) and marks the request
    when no time is left: such a call must send nothing (D4.3).
    """
    err: DeadlineExceeded | None = current_bound_error(what)
    if err is not None:
        mark_cancelled_by_deadline()
        raise err
    left = remaining()
    if left == math.inf:
        return ClampedTimeout(static, False)
    if static is None or left < static:
        return ClampedTimeout(left, True)
    return ClampedTimeout(static, False)
