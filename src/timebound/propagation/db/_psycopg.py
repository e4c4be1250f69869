"""Implementation of :mod:`timebound.propagation.psycopg` (DECISIONS D4.8)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeVar

from ..._core._scopes import bounded
from ...telemetry._tracing import CallSpan
from .._client import Attempt, AttemptTimeoutBase, begin
from ._common import Guard, options, query_span, run_guarded, traced
from ._postgres import NARROW_PSYCOPG, RESTORE_PSYCOPG, begin_narrowed

try:
    import psycopg
    import psycopg.errors
    from psycopg import pq
    from psycopg.rows import Row
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.psycopg needs psycopg 3: pip install 'timebound[postgres]'"
    ) from exc

__all__ = [
    "AsyncDeadlineCursor",
    "DeadlineCursor",
    "aconnect",
    "aconnection",
    "connect",
    "connection",
]

_T = TypeVar("_T")
_log = logging.getLogger("timebound.propagation")
_QUERY: Final = options("psycopg", "postgres query")
# A statement in an aborted transaction fails on its own: bounded, not counted as narrowed.
_QUERY_ABORTED: Final = options("psycopg", "postgres query", user=False)
_ACQUIRE: Final = options("psycopg", "postgres connection", user=False)
#: How long past the deadline a cancelled caller waits for PostgreSQL's own cancel (57014)
#: before the statement is cancelled from the client side (a server that stopped answering).
DEFAULT_GRACE: Final = 1.0

# Transaction control and empty statements (a pool's health check) are never bounded: a COMMIT
# or ROLLBACK must be able to finish after the deadline (never leave half-written state).
_PASS_THROUGH: Final = re.compile(
    r"\s*(?:$|(?:BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|"
    r"PREPARE\s+TRANSACTION)\b)",
    re.IGNORECASE,
)


def _passes_through(query: Any) -> bool:
    if isinstance(query, bytes):
        query = query.decode("utf-8", "replace")
    return isinstance(query, str) and _PASS_THROUGH.match(query) is not None


def _plan(query: Any, conn: Any) -> tuple[Attempt, int, bool] | None:
    """``(attempt, ms, own_transaction)`` when the statement must be narrowed, else ``None``.

    Raises :class:`~timebound.DeadlineExceeded` (counted, request marked) when the deadline has
    passed: nothing is sent.
    """
    if _passes_through(query):
        return None
    status = conn.info.transaction_status
    aborted = status == pq.TransactionStatus.INERROR
    attempt = begin(None, _QUERY_ABORTED if aborted else _QUERY, AttemptTimeoutBase)
    ms = attempt.clamped.ms
    if not attempt.lowered or ms is None or aborted:
        # No deadline, or the transaction is already aborted (the statement fails on its own).
        return None
    # In autocommit mode an idle connection gets a transaction of ours (SET LOCAL needs one);
    # otherwise psycopg's implicit transaction, or the caller's, holds the narrowed value and
    # it is put back after the statement.
    return attempt, ms, bool(conn.autocommit) and status == pq.TransactionStatus.IDLE


def _in_pipeline(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    return conn.pgconn.pipeline_status != pq.PipelineStatus.OFF


def _begin(helper: psycopg.Cursor[Any], ms: int) -> bool:
    """Open our transaction narrowed to ``ms``; whether our value rules."""
    if not _in_pipeline(helper.connection):
        helper.execute(begin_narrowed(ms))
        helper.nextset()
        return helper.statusmessage == "SELECT 1"
    # Pipeline mode takes one statement per query; it sends the two together anyway.
    helper.execute("BEGIN")
    helper.execute(NARROW_PSYCOPG, {"ms": ms})
    row = helper.fetchone()
    return bool(row and row[1])


async def _abegin(helper: psycopg.AsyncCursor[Any], ms: int) -> bool:
    """The async twin of :func:`_begin`."""
    if not _in_pipeline(helper.connection):
        await helper.execute(begin_narrowed(ms))
        helper.nextset()
        return helper.statusmessage == "SELECT 1"
    await helper.execute("BEGIN")
    await helper.execute(NARROW_PSYCOPG, {"ms": ms})
    row = await helper.fetchone()
    return bool(row and row[1])


class DeadlineCursor(psycopg.Cursor[Row]):
    """A psycopg ``Cursor`` whose ``execute``/``executemany`` obey the current deadline.

    ``psycopg.connect(dsn, cursor_factory=DeadlineCursor)`` (or :func:`connect`); for a pool,
    ``ConnectionPool(dsn, kwargs={"cursor_factory": DeadlineCursor})``. ``conn.execute`` goes
    through it too. Under a deadline a statement runs with ``statement_timeout`` narrowed to the
    time left (``SET LOCAL``), so PostgreSQL — not the client — stops it at the deadline; that
    cancel (57014) raises :class:`~timebound.DeadlineExceeded` chained to psycopg's
    ``QueryCanceled`` and marks the request. A spent deadline fails fast; no deadline, no change.
    """

    def _bounded(self, query: Any, run: Callable[[], _T]) -> _T:
        span = query_span("postgresql", query)
        if span is None:
            if not bounded():
                return run()  # no deadline, nothing traced: psycopg as it is (D4.13)
            return self._run_bounded(query, run, None)
        try:
            result = self._run_bounded(query, run, span)
        except BaseException as exc:
            span.end(type(exc).__name__)
            raise
        span.end()
        return result

    def _run_bounded(self, query: Any, run: Callable[[], _T], span: CallSpan | None) -> _T:
        plan = _plan(query, self.connection)
        if plan is None:
            return run()
        attempt, ms, own = plan
        if span is not None:  # the budget the statement_timeout carries to the server
            span.set("timebound.deadline.propagated_ms", ms)
        conn = self.connection
        helper: psycopg.Cursor[Any] = psycopg.Cursor(conn)
        if own:
            try:
                narrowed = _begin(helper, ms)
                result = _statement(attempt, run, narrowed)
                _statement(attempt, lambda: helper.execute("COMMIT"), narrowed)
            except BaseException:
                _rollback(conn, helper)
                raise
            return result
        helper.execute(NARROW_PSYCOPG, {"ms": ms})
        prev, narrowed = helper.fetchone() or ("0", False)
        result = _statement(attempt, run, narrowed)
        if narrowed:
            # Only on success: a failed statement aborts the transaction, whose rollback drops
            # the narrowed value with everything else. The restore runs under the narrowed
            # value: if that cancels it, the transaction is aborted and says so.
            _statement(
                attempt, lambda: helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms}), True
            )
        return result

    def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> DeadlineCursor[Row]:
        """psycopg's ``execute``, bounded by the current deadline."""
        self._bounded(
            query,
            lambda: psycopg.Cursor.execute(self, query, params, prepare=prepare, binary=binary),
        )
        return self

    def executemany(
        self, query: Any, params_seq: Iterable[Any], *, returning: bool = False
    ) -> None:
        """psycopg's ``executemany``, bounded by the current deadline (one timeout for all)."""
        self._bounded(
            query,
            lambda: psycopg.Cursor.executemany(self, query, params_seq, returning=returning),
        )


class AsyncDeadlineCursor(psycopg.AsyncCursor[Row]):
    """The ``psycopg.AsyncCursor`` twin of :class:`DeadlineCursor`.

    ``await psycopg.AsyncConnection.connect(dsn, cursor_factory=AsyncDeadlineCursor)`` (or
    :func:`aconnect`). A cancellation can only ever interrupt the statement itself: the
    bookkeeping around it (``BEGIN`` and narrowing, ``COMMIT``/``ROLLBACK``, restoring) always
    finishes first, and a result is returned only once ``COMMIT`` has answered.
    """

    async def _bounded(self, query: Any, run: Callable[[], Awaitable[_T]]) -> _T:
        span = query_span("postgresql", query)
        if span is None and not bounded():
            return await run()  # no deadline, nothing traced: psycopg as it is (D4.13)
        return await traced(span, self._run_bounded(query, run, span))

    async def _run_bounded(
        self, query: Any, run: Callable[[], Awaitable[_T]], span: CallSpan | None
    ) -> _T:
        plan = _plan(query, self.connection)
        if plan is None:
            return await run()
        attempt, ms, own = plan
        if span is not None:  # the budget the statement_timeout carries to the server
            span.set("timebound.deadline.propagated_ms", ms)
        conn = self.connection

        async def guarded(guard: Guard) -> _T:
            helper: psycopg.AsyncCursor[Any] = psycopg.AsyncCursor(conn)
            if own:
                return await self._in_own_transaction(guard, attempt, helper, run, ms)
            return await self._in_transaction(guard, attempt, helper, run, ms)

        # Only the statement may be interrupted: the bookkeeping around it always finishes.
        return await run_guarded(guarded, attempt, grace=DEFAULT_GRACE)

    async def _in_own_transaction(
        self,
        guard: Guard,
        attempt: Attempt,
        helper: psycopg.AsyncCursor[Any],
        run: Callable[[], Awaitable[_T]],
        ms: int,
    ) -> _T:
        """``BEGIN``+narrowing, the statement, ``COMMIT``; any failure rolls back. The result
        is returned only once ``COMMIT`` has answered."""
        conn = self.connection
        try:
            narrowed = await _abegin(helper, ms)
            result = await guard.statement(lambda: _astatement(attempt, run, narrowed))
            await _astatement(attempt, lambda: helper.execute("COMMIT"), narrowed)
        except BaseException:
            await _arollback(conn, helper)
            raise
        return result

    async def _in_transaction(
        self,
        guard: Guard,
        attempt: Attempt,
        helper: psycopg.AsyncCursor[Any],
        run: Callable[[], Awaitable[_T]],
        ms: int,
    ) -> _T:
        """Narrowing, the statement, then the previous value put back."""
        conn = self.connection
        await helper.execute(NARROW_PSYCOPG, {"ms": ms})
        prev, narrowed = await helper.fetchone() or ("0", False)
        try:
            result = await guard.statement(lambda: _astatement(attempt, run, narrowed))
        except BaseException:
            # Interrupted after the statement ended, the transaction is good and needs its
            # value back; after a failed statement it is aborted, and its rollback drops ours.
            if narrowed and conn.info.transaction_status == pq.TransactionStatus.INTRANS:
                try:
                    await helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms})
                except Exception:
                    pass  # the caller's transaction failed with it; its rollback drops ours
            raise
        if narrowed:
            await _astatement(
                attempt, lambda: helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms}), True
            )
        return result

    async def execute(
        self,
        query: Any,
        params: Any = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> AsyncDeadlineCursor[Row]:
        """psycopg's async ``execute``, bounded by the current deadline."""
        await self._bounded(
            query,
            lambda: psycopg.AsyncCursor.execute(
                self, query, params, prepare=prepare, binary=binary
            ),
        )
        return self

    async def executemany(
        self, query: Any, params_seq: Iterable[Any], *, returning: bool = False
    ) -> None:
        """psycopg's async ``executemany``, bounded by the current deadline."""
        await self._bounded(
            query,
            lambda: psycopg.AsyncCursor.executemany(self, query, params_seq, returning=returning),
        )


def _statement(attempt: Attempt, run: Callable[[], _T], narrowed: bool) -> _T:
    """Run a statement; a cancel (57014) our narrowed timeout caused becomes the deadline's
    error (counted, the request marked)."""
    try:
        return run()
    except psycopg.errors.QueryCanceled as exc:
        if narrowed and attempt.expired():
            raise attempt.cut() from exc
        raise


async def _astatement(attempt: Attempt, run: Callable[[], Awaitable[_T]], narrowed: bool) -> _T:
    """The async twin of :func:`_statement`."""
    try:
        return await run()
    except psycopg.errors.QueryCanceled as exc:
        if narrowed and attempt.expired():
            raise attempt.cut() from exc
        raise


def _rollback(conn: psycopg.Connection[Any], helper: psycopg.Cursor[Any]) -> None:
    """End the transaction of ours, whatever state the failure left it in."""
    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        helper.execute("ROLLBACK")
    except Exception as exc:
        # Its state unknown, the connection must serve nobody: closing it makes the server
        # roll back, and a pool replaces it.
        _log.warning("psycopg: ROLLBACK after a cut failed (%r): closing the connection", exc)
        conn.close()


async def _arollback(conn: psycopg.AsyncConnection[Any], helper: psycopg.AsyncCursor[Any]) -> None:
    """The async twin of :func:`_rollback`."""
    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        await helper.execute("ROLLBACK")
    except Exception as exc:
        _log.warning("psycopg: ROLLBACK after a cut failed (%r): closing the connection", exc)
        await conn.close()


def connect(conninfo: str = "", **kwargs: Any) -> psycopg.Connection[Any]:
    """``psycopg.connect`` with :class:`DeadlineCursor` as the cursor factory."""
    kwargs.setdefault("cursor_factory", DeadlineCursor)
    return psycopg.Connection.connect(conninfo, **kwargs)


async def aconnect(conninfo: str = "", **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    """``psycopg.AsyncConnection.connect`` with :class:`AsyncDeadlineCursor`."""
    kwargs.setdefault("cursor_factory", AsyncDeadlineCursor)
    return await psycopg.AsyncConnection.connect(conninfo, **kwargs)


def _pool_timeout() -> type[Exception]:
    try:
        from psycopg_pool import PoolTimeout
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "pooled connections need psycopg-pool: pip install 'timebound[postgres]'"
        ) from exc
    return PoolTimeout


@contextmanager
def connection(pool: Any, *, timeout: float | None = None) -> Iterator[Any]:
    """``pool.connection()`` for a ``psycopg_pool.ConnectionPool``, its wait capped by the deadline.

    Fails fast when the deadline has passed and stops waiting for a free connection at the
    deadline (:class:`~timebound.DeadlineExceeded`, the binding bound's ``source``). On exit the
    connection commits or rolls back and goes back to the pool, as with ``pool.connection()``.
    """
    pool_timeout = _pool_timeout()
    while True:
        attempt = begin(timeout, _ACQUIRE, AttemptTimeoutBase)
        try:
            conn = pool.getconn(attempt.clamped.seconds)
            break
        except pool_timeout as exc:
            if not attempt.lowered:
                raise
            if attempt.expired():
                raise attempt.cut() from exc
            # The wait ended a hair early (never early, D1.3): wait out the rest.
    try:
        with conn:
            yield conn
    finally:
        pool.putconn(conn)


@asynccontextmanager
async def aconnection(pool: Any, *, timeout: float | None = None) -> AsyncIterator[Any]:
    """The ``psycopg_pool.AsyncConnectionPool`` twin of :func:`connection`."""
    pool_timeout = _pool_timeout()
    while True:
        attempt = begin(timeout, _ACQUIRE, AttemptTimeoutBase)
        try:
            conn = await pool.getconn(attempt.clamped.seconds)
            break
        except pool_timeout as exc:
            if not attempt.lowered:
                raise
            if attempt.expired():
                raise attempt.cut() from exc
    try:
        async with conn:
            yield conn
    finally:
        # Cancelled part-way, putconn would lose the connection (the pool runs dry); it is
        # bookkeeping, so it runs to its end first, as in run_guarded, then the cancel goes on.
        async def give_back(guard: Guard) -> None:
            await pool.putconn(conn)

        await run_guarded(give_back, None, grace=DEFAULT_GRACE)
