"""What the database adapters share besides the one client attempt (D4.8).

userver's rules for database clients: stop waiting for a free connection and fail at once when
the deadline has passed; use the deadline to update the timeout; include the deadline in the
query. Every call obtains its :class:`~timebound.propagation._client.Attempt` from
:func:`~timebound.propagation._client.begin` — the one place that clamps, fails fast, counts
and reports a cut (userver's metric names, D4.7, labelled ``component=<driver>``). What is
particular to a database lives here: the options an adapter passes to ``begin``, and
:func:`run_guarded`, which lets a cancellation interrupt only the statement itself.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ...telemetry._tracing import CallSpan, active, call_span
from .._client import Attempt, ClientOptions, CounterReport

_T = TypeVar("_T")


_OPERATION = re.compile(r"\s*([A-Za-z]+)")


def query_span(system: str, query: Any) -> CallSpan | None:
    """The client span of one query (D10.8): ``db.system`` and, from the statement's first
    word, ``db.operation.name`` (``SELECT``, ``INSERT``…; never the statement's text, which may
    hold values), named after it; ``None`` when nothing is traced."""
    if not active():
        return None
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    match = _OPERATION.match(query) if isinstance(query, str) else None
    if match is None:
        return call_span(system, **{"db.system": system})
    operation = match.group(1).upper()
    return call_span(operation, **{"db.system": system, "db.operation.name": operation})


async def traced(span: CallSpan | None, run: Awaitable[_T]) -> _T:
    """Await ``run``, ending ``span`` (when there is one) with how it ended."""
    if span is None:
        return await run
    try:
        result = await run
    except BaseException as exc:
        span.end(type(exc).__name__)
        raise
    span.end()
    return result


def options(client: str, what: str, *, user: bool = True) -> ClientOptions:
    """The attempt options of a database call: no header (the deadline travels in the query or
    the read timeout), counters labelled ``component=<client>``, span tag ``timeout_ms``.

    ``user=False`` for the adapter's own bookkeeping (a pool's wait, a connection handshake, a
    send whose wait is counted at its read): bounded and failing fast like a user's call, but
    a lowered timeout is not counted as one.
    """
    return ClientOptions(
        propagate_header=False,
        what=what,
        report=CounterReport(client, timeout_tag="timeout_ms", count_lowered=user),
    )


class Guard:
    """The one part of a guarded database call that may be interrupted: its statement.

    A call under a deadline wraps its statement in bookkeeping — ``BEGIN`` and narrowing the
    timeout before it, ``COMMIT``/``ROLLBACK`` or restoring the timeout after it. A cancellation
    landing inside that bookkeeping left a transaction nobody would end, or a narrowed timeout in
    force in the caller's transaction. So :func:`run_guarded` lets a cancellation reach the
    statement only; arriving anywhere else it waits for the statement's turn (or is never
    delivered, when the statement is over).
    """

    __slots__ = ("_attempt", "_in_statement", "_interrupted", "_task")

    def __init__(self, attempt: Attempt | None) -> None:
        self._attempt = attempt
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
        if self._attempt is not None:
            self._attempt.check()
        self._in_statement = True
        try:
            return await run()
        finally:
            self._in_statement = False

    def interrupt(self) -> None:
        """Cancel the statement if it is running; skip it if it has not started.

        Once only (D4.9). A driver handles a cancellation by ending the statement on the server
        (psycopg sends a cancel request and waits for the statement to end, within a bound of
        its own); a second cancellation during that makes psycopg close the connection, its
        state unknown. So a caller cancelled again while it waits changes nothing.
        """
        if self._interrupted:
            return
        self._interrupted = True
        if self._in_statement and self._task is not None:
            self._task.cancel()


async def run_guarded(
    body: Callable[[Guard], Coroutine[Any, Any, _T]], attempt: Attempt | None, *, grace: float
) -> _T:
    """Run ``body`` to its end whatever cancels the caller, then re-raise the cancellation.

    The caller's cancellation is handled in one of two ways:

    * the deadline's own (a cancelling scope firing at the end of ``attempt``, which the
      statement is already bounded by): the statement is left to end by itself — the server
      cancels it at the same deadline — and is interrupted only if it has not ended ``grace``
      seconds later (a server that stopped answering);
    * any other (``task.cancel()`` with time left): the statement is interrupted at once.

    Either way the bookkeeping around the statement runs to completion before the caller's
    ``CancelledError`` goes on, so the connection is never left inside a transaction of ours
    or with a narrowed timeout. A result that arrives after the caller was cancelled is
    discarded: the caller sees the cancellation (a committed write can be reported as failed,
    never the reverse). With no ``attempt`` (pure bookkeeping, nothing bounded) every
    cancellation waits for ``body`` to end.
    """
    guard = Guard(attempt)
    task = asyncio.ensure_future(body(guard))
    guard._task = task
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        if attempt is None or not attempt.expired():
            guard.interrupt()
        await _settle(task, guard, grace)
        raise


async def _settle(task: asyncio.Future[Any], guard: Guard, grace: float) -> None:
    """Wait for a guarded call to end; interrupt its statement after ``grace`` seconds, or at
    once on a further cancellation of the waiting caller (never twice: see
    :meth:`Guard.interrupt`)."""
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
