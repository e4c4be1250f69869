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

from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from .._core._scopes import current_bound_error, current_deadline, remaining
from ._codec import ceil_ms

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
    #: The request's own deadline, or ``None`` when unknown (then every cut counts as its own).
    deadline: Deadline | None = None

    def cut_by(self, bound: Deadline) -> None:
        """An operation that ran under the effective deadline ``bound`` was cut short by it.

        The request is marked only when ``bound`` is the request's own deadline. A bound that
        ends earlier — an attempt timeout, a policy's total budget, a local ``fail_after`` — is
        the caller's business: its error reaches the caller, who may retry or recover, and the
        request still has time, so it must not be answered "Deadline expired" (D4.4, D4.5).
        """
        if self.deadline is None or bound >= self.deadline:
            self.cancelled_by_deadline = True


_request: contextvars.ContextVar[RequestState | None] = contextvars.ContextVar(
    "timebound.request", default=None
)


def current_request() -> RequestState | None:
    """The state of the request being handled here, or ``None`` outside a server adapter."""
    return _request.get()


def mark_cancelled_by_deadline() -> None:
    """Record that the current request's deadline cut an operation short (no-op outside one).

    Unconditional: the server answers "Deadline expired" (adapters call :func:`mark_spent`,
    which checks that the spent bound is the request's own).
    """
    state = _request.get()
    if state is not None:
        state.cancelled_by_deadline = True


def mark_spent(bound: Deadline | None = None) -> None:
    """:meth:`RequestState.cut_by` for the current request (no-op outside one).

    ``bound`` is the effective deadline the cut operation ran under; by default the current one
    (right for a check made in the operation's own context).
    """
    state = _request.get()
    if state is not None:
        state.cut_by(current_deadline() if bound is None else bound)


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
