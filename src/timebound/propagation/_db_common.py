"""What the database adapters share: fail fast, count, and report a spent deadline (D4.8).

userver's rules for database clients: stop waiting for a free connection and fail at once when
the deadline has passed; use the deadline to update the timeout; include the deadline in the
query. Every adapter reports with userver's metric names (D4.7), labelled ``client=<driver>``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Final, TypeVar

from .._core._errors import DeadlineExceeded
from .._core._scopes import current_bound_error
from ..telemetry._events import counters, emit, enabled
from ._state import ClampedTimeout, clamp_timeout, mark_spent

_T = TypeVar("_T")

#: A database call whose timeout the deadline lowered (userver's name, D4.7).
TIMEOUT_UPDATED: Final = "timeout-updated-by-deadline"
#: A database call given up because the deadline was spent (userver's name, D4.7).
CANCELLED: Final = "cancelled-by-deadline"


def budget(static: float | None, *, what: str, client: str) -> ClampedTimeout:
    """``min(static, remaining)``; raises (and counts, and marks) when nothing is left."""
    try:
        return clamp_timeout(static, what=what)
    except DeadlineExceeded:
        _cancelled(client)
        raise


def spent(*, what: str, client: str) -> DeadlineExceeded | None:
    """The binding bound's error when the deadline has passed (counted; the request marked when
    that bound is its own deadline)."""
    err = current_bound_error(what)
    if err is None:
        return None
    mark_spent()
    _cancelled(client)
    return err


def _cancelled(client: str) -> None:
    counters.inc(CANCELLED, component=client)
    if enabled():
        emit("span.tags", component=client, cancelled_by_deadline=1)


def updated(client: str, timeout_ms: int | None = None) -> None:
    """Count a call whose timeout the deadline lowered (span tag ``timeout_ms``)."""
    counters.inc(TIMEOUT_UPDATED, component=client)
    if enabled():
        emit("span.tags", component=client, timeout_ms=timeout_ms)


class Guard:
    """The one part of a guarded database call that may be interrupted: its statement.

    A call under a deadline wraps its statement in bookkeeping — ``BEGIN`` and narrowing the
    timeout before it, ``COMMIT``/``ROLLBACK`` or restoring the timeout after it. A cancellation
    landing inside that bookkeeping left a transaction nobody would end, or a narrowed timeout in
    force in the caller's transaction. So :func:`run_guarded` lets a cancellation reach the
    statement only; arriving anywhere else it waits for the statement's turn (or is never
    delivered, when the statement is over).
    """

    __slots__ = ("_client", "_in_statement", "_interrupted", "_task", "_what")

    def __init__(self, what: str, client: str) -> None:
        self._what = what
        self._client = client
        self._in_statement = False
        self._interrupted = False
        self._task: asyncio.Future[Any] | None = None

    async def statement(self, run: Callable[[], Awaitable[_T]]) -> _T:
        """Run the statement, the only step :meth:`interrupt` cancels.

        Not sent at all when the caller was cancelled during the bookkeeping before it, or when
        the deadline passed meanwhile (fail fast, counted).
        """
        if self._interrupted:
            raise asyncio.CancelledError
        if (err := spent(what=self._what, client=self._client)) is not None:
            raise err
        self._in_statement = True
        try:
            return await run()
        finally:
            self._in_statement = False

    def interrupt(self) -> None:
        """Cancel the statement if it is running; skip it if it has not started."""
        self._interrupted = True
        if self._in_statement and self._task is not None:
            self._task.cancel()


async def run_guarded(
    body: Callable[[Guard], Coroutine[Any, Any, _T]], *, what: str, client: str, grace: float
) -> _T:
    """Run ``body`` to its end whatever cancels the caller, then re-raise the cancellation.

    The caller's cancellation is handled in one of two ways:

    * the deadline's own (a cancelling scope firing at the deadline the statement is already
      bounded by): the statement is left to end by itself — the server cancels it at the same
      deadline — and is interrupted only if it has not ended ``grace`` seconds later (a server
      that stopped answering);
    * any other (``task.cancel()`` with time left): the statement is interrupted at once.

    Either way the bookkeeping around the statement runs to completion before the caller's
    ``CancelledError`` goes on, so the connection is never left inside a transaction of ours
    or with a narrowed timeout. A result that arrives after the caller was cancelled is
    discarded: the caller sees the cancellation (a committed write can be reported as failed,
    never the reverse).
    """
    guard = Guard(what, client)
    task = asyncio.ensure_future(body(guard))
    guard._task = task
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if current_bound_error(what) is None:
            guard.interrupt()
        await _settle(task, guard, grace)
        raise


async def _settle(task: asyncio.Future[Any], guard: Guard, grace: float) -> None:
    """Wait for a guarded call to end; interrupt its statement after ``grace`` seconds, or at
    once on a further cancellation of the waiting caller."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + grace
    while not task.done():
        wait = None if guard._interrupted else max(0.0, give_up - loop.time())
        try:
            await asyncio.wait([task], timeout=wait)
        except asyncio.CancelledError:
            guard.interrupt()
            continue
        if not task.done():
            guard.interrupt()
    if not task.cancelled():
        task.exception()  # retrieved: its outcome no longer has a caller
