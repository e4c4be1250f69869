"""Per-request deadline state shared by servers and clients (DECISIONS D4).

A server adapter (ASGI, WSGI, gRPC) opens a :class:`RequestState` for each request; every
client adapter (httpx, requests, aiohttp, gRPC, databases) reads the effective deadline from the
core and, when a call failed *because of our own deadline*, marks the request so the server
answers "Deadline expired" even if user code swallowed the exception (D4.5). The state and the
marking live in the core (``_core/_request.py``), where the retry policies mark it too (D4.10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .._core._errors import DeadlineExceeded
from .._core._request import RequestState, _request, current_request, mark_spent
from .._core._scopes import current_bound_error, remaining
from ._codec import ceil_ms

__all__ = [
    "ClampedTimeout",
    "RequestState",
    "clamp_timeout",
    "current_request",
    "mark_cancelled_by_deadline",
]


def mark_cancelled_by_deadline() -> None:
    """Record that the current request's deadline cut an operation short (no-op outside one).

    Unconditional: the server answers "Deadline expired" (adapters call :func:`mark_spent`,
    which checks that the spent bound is the request's own).
    """
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
        return max(1, ceil_ms(self.seconds))


def clamp_timeout(static: float | None, *, what: str = "request") -> ClampedTimeout:
    """Clamp a client's static timeout by the effective deadline, failing fast when it is spent.

    When no time is left it raises :class:`DeadlineExceeded` (with the binding bound's
    ``source``), marking the request when that bound is the request's own deadline: such a call
    must send nothing (D4.3).
    """
    err: DeadlineExceeded | None = current_bound_error(what)
    if err is not None:
        mark_spent()
        raise err
    left = remaining()
    if left <= 0:
        # The deadline passed between the check above and this reading (two clock reads): it is
        # spent, and a timeout of 0 must never reach a client library (urllib3 rejects it).
        err = current_bound_error(what)
        if err is not None:
            mark_spent()
            raise err
    if left == math.inf:
        return ClampedTimeout(static, False)
    if static is None or left < static:
        return ClampedTimeout(left, True)
    return ClampedTimeout(static, False)
