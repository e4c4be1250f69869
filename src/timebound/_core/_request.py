"""The request being served, and the one way an operation marks it cut by its deadline (D4.5).

A server adapter (ASGI, WSGI, gRPC) opens a :class:`RequestState` for each request; anything
that gives up *because of the request's own deadline* — a client adapter failing fast, a retry
policy stopping before a delay it cannot fit (D3.3, D4.10) — marks it with :func:`mark_spent`,
so the server answers "Deadline expired" even if user code swallowed the exception. It lives in
the core because layers below propagation (the policies) mark too. The state object is shared by
reference, so child tasks and ``to_thread`` workers mark the same request.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

from ._deadline import Deadline
from ._scopes import current_deadline

__all__ = ["RequestState", "current_request", "mark_spent"]


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


def mark_spent(bound: Deadline | None = None) -> None:
    """:meth:`RequestState.cut_by` for the current request (no-op outside one).

    ``bound`` is the effective deadline the cut operation ran under; by default the current one
    (right for a check made in the operation's own context).
    """
    state = _request.get()
    if state is not None:
        state.cut_by(current_deadline() if bound is None else bound)
