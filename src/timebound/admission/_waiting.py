"""Waiting at the admission layer, for asyncio servers and for threaded ones (DECISIONS D9).

The decisions are :class:`~._controller.Admission`'s; this module only waits for them: on a future
for ASGI and gRPC aio, on a thread event for WSGI and sync gRPC. Either way a waiter that is
cancelled (client gone, server shutting down) leaves no ticket behind and no slot taken.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Final

from .._core import _clock
from ._controller import Admission, Ticket, Verdict

__all__ = [
    "OVERLOADED_BODY",
    "OVERLOADED_STATUS",
    "criticality",
    "enter_async",
    "enter_blocking",
    "route_key",
]

OVERLOADED_STATUS: Final = 503
OVERLOADED_BODY: Final = b"Service overloaded"


#: Longest path kept in a route key: paths come from clients, and the estimate table holds keys.
MAX_ROUTE_PATH: Final = 200


def route_key(method: str, path: str) -> str:
    """The default route key, ``"GET /path"``, with the path cut to :data:`MAX_ROUTE_PATH`."""
    return f"{method} {path[:MAX_ROUTE_PATH]}"


def criticality(value: str | bytes | None) -> bool:
    """Whether a criticality header value marks the request critical (``critical``, any case)."""
    if value is None:
        return False
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.strip(" \t").lower() == "critical"


async def enter_async(admission: Admission, ticket: Ticket) -> Verdict:
    """Admit, queue or shed ``ticket``; if queued, wait for the final outcome on this loop.

    Returns :attr:`Verdict.ADMIT` (the slot is the caller's until :meth:`Admission.release`),
    :attr:`Verdict.HOPELESS` or :attr:`Verdict.OVERLOADED`.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Verdict] = loop.create_future()

    def wake(outcome: Verdict) -> None:
        # Releases happen on this loop (the handlers run here), but a thread may release too.
        if threading.get_ident() == owner:
            if not future.done():
                future.set_result(outcome)
        else:
            loop.call_soon_threadsafe(_resolve, future, outcome)

    owner = threading.get_ident()
    ticket.wake = wake
    outcome = admission.arrive(ticket, _clock.now())
    try:
        while outcome is Verdict.QUEUED:
            at = admission.wait_until(ticket, _clock.now())
            await asyncio.wait((future,), timeout=max(0.0, at - _clock.now()))
            outcome = future.result() if future.done() else admission.give_up(ticket, _clock.now())
    except BaseException:
        # Cancelled while waiting: never leave a ticket queued or a slot taken.
        admission.cancel(ticket, _clock.now())
        raise
    return outcome


def _resolve(future: asyncio.Future[Verdict], outcome: Verdict) -> None:
    if not future.done():
        future.set_result(outcome)


def enter_blocking(admission: Admission, ticket: Ticket) -> Verdict:
    """:func:`enter_async` for a thread: waits on an event, on the scheduling clock."""
    event = threading.Event()
    ticket.wake = lambda _outcome: event.set()
    outcome = admission.arrive(ticket, _clock.now())
    try:
        while outcome is Verdict.QUEUED:
            at = admission.wait_until(ticket, _clock.now())
            if event.wait(max(0.0, at - _clock.now())):
                outcome = ticket.outcome
            else:
                outcome = admission.give_up(ticket, _clock.now())
    except BaseException:
        admission.cancel(ticket, _clock.now())
        raise
    return outcome
