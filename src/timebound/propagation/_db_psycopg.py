"""Implementation of :mod:`timebound.propagation.psycopg` (DECISIONS D4.8)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeVar

from .._core._errors import DeadlineExceeded
from ._db_common import Guard, budget, run_guarded, spent, updated
from ._db_postgres import NARROW_PSYCOPG, RESTORE_PSYCOPG, begin_narrowed

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
_CLIENT: Final = "psycopg"
_QUERY: Final = "postgres query"
_ACQUIRE: Final = "postgres connection"
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


def _plan(query: Any, conn: Any) -> tuple[int, bool] | None:
    """``(ms, own_transaction)`` when the statement must be narrowed, else ``None``.

    Raises :class:`~timebound.DeadlineExceeded` (counted, request marked) when the deadline has
    passed: nothing is sent.
    """
    if _passes_through(query):
        return None
    clamped = budget(None, what=_QUERY, client=_CLIENT)
    if not clamped.lowered or clamped.ms is None:
        return None
    status = conn.info.transaction_status
    if status == pq.TransactionStatus.INERROR:
        return None  # the statement fails on its own: the transaction is already aborted
    updated(_CLIENT, clamped.ms)
    # In autocommit mode an idle connection gets a transaction of ours (SET LOCAL needs one);
    # otherwise psycopg's implicit transaction, or the caller's, holds the narrowed value and
    # it is put back after the statement.
    return clamped.ms, bool(conn.autocommit) and status == pq.TransactionStatus.IDLE


def _converted(exc: psycopg.errors.QueryCanceled, narrowed: bool) -> DeadlineExceeded | None:
    """The deadline error for a 57014 our narrowed timeout caused, or ``None``."""
    if narrowed:
        return spent(what=_QUERY, client=_CLIENT)
    return None


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
        plan = _plan(query, self.connection)
        if plan is None:
            return run()
        ms, own = plan
        conn = self.connection
        helper: psycopg.Cursor[Any] = psycopg.Cursor(conn)
        if own:
            try:
                narrowed = _begin(helper, ms)
                result = self._statement(run, narrowed)
                self._statement(lambda: helper.execute("COMMIT"), narrowed)
            except BaseException:
                _rollback(conn, helper)
                raise
            return result
        helper.execute(NARROW_PSYCOPG, {"ms": ms})
        prev, narrowed = helper.fetchone() or ("0", False)
        result = self._statement(run, narrowed)
        if narrowed:
            # Only on success: a failed statement aborts the transaction, whose rollback drops
            # the narrowed value with everything else. The restore runs under the narrowed
            # value: if that cancels it, the transaction is aborted and says so.
            self._statement(lambda: helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms}), True)
        return result

    @staticmethod
    def _statement(run: Callable[[], _T], narrowed: bool) -> _T:
        try:
            return run()
        except psycopg.errors.QueryCanceled as exc:
            if (err := _converted(exc, narrowed)) is not None:
                raise err from exc
            raise

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
        plan = _plan(query, self.connection)
        if plan is None:
            return await run()
        ms, own = plan
        conn = self.connection

        async def guarded(guard: Guard) -> _T:
            helper: psycopg.AsyncCursor[Any] = psycopg.AsyncCursor(conn)
            if own:
                return await self._in_own_transaction(guard, helper, run, ms)
            return await self._in_transaction(guard, helper, run, ms)

        # Only the statement may be interrupted: the bookkeeping around it always finishes.
        return await run_guarded(guarded, what=_QUERY, client=_CLIENT, grace=DEFAULT_GRACE)

    async def _in_own_transaction(
        self,
        guard: Guard,
        helper: psycopg.AsyncCursor[Any],
        run: Callable[[], Awaitable[_T]],
        ms: int,
    ) -> _T:
        """``BEGIN``+narrowing, the statement, ``COMMIT``; any failure rolls back. The result
        is returned only once ``COMMIT`` has answered."""
        conn = self.connection
        try:
            narrowed = await _abegin(helper, ms)
            result = await guard.statement(lambda: self._statement(run, narrowed))
            await self._statement(lambda: helper.execute("COMMIT"), narrowed)
        except BaseException:
            await _arollback(conn, helper)
            raise
        return result

    async def _in_transaction(
        self,
        guard: Guard,
        helper: psycopg.AsyncCursor[Any],
        run: Callable[[], Awaitable[_T]],
        ms: int,
    ) -> _T:
        """Narrowing, the statement, then the previous value put back."""
        conn = self.connection
        await helper.execute(NARROW_PSYCOPG, {"ms": ms})
        prev, narrowed = await helper.fetchone() or ("0", False)
        try:
            result = await guard.statement(lambda: self._statement(run, narrowed))
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
            await self._statement(
                lambda: helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms}), True
            )
        return result

    @staticmethod
    async def _statement(run: Callable[[], Awaitable[_T]], narrowed: bool) -> _T:
        try:
            return await run()
        except psycopg.errors.QueryCanceled as exc:
            if (err := _converted(exc, narrowed)) is not None:
                raise err from exc
            raise

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


def _rollback(conn: psycopg.Connection[Any], helper: psycopg.Cursor[Any]) -> None:
    """End the transaction of ours, whatever state the failure left it in."""
    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        helper.execute("ROLLBACK")
    except Exception:
        # Its state unknown, the connection must serve nobody: closing it makes the server
        # roll back, and a pool replaces it.
        conn.close()


async def _arollback(conn: psycopg.AsyncConnection[Any], helper: psycopg.AsyncCursor[Any]) -> None:
    """The async twin of :func:`_rollback`."""
    if conn.info.transaction_status == pq.TransactionStatus.IDLE:
        return
    try:
        await helper.execute("ROLLBACK")
    except Exception:
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
        clamped = budget(timeout, what=_ACQUIRE, client=_CLIENT)
        try:
            conn = pool.getconn(clamped.seconds)
            break
        except pool_timeout:
            if not clamped.lowered:
                raise
            # Loop: budget() raises the binding bound's error now, or waits out the rest if
            # the wait ended a hair early (never early, D1.3).
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
        clamped = budget(timeout, what=_ACQUIRE, client=_CLIENT)
        try:
            conn = await pool.getconn(clamped.seconds)
            break
        except pool_timeout:
            if not clamped.lowered:
                raise
    try:
        async with conn:
            yield conn
    finally:
        # Cancelled part-way, putconn would lose the connection (the pool runs dry); it is
        # bookkeeping, so it runs to its end first, as in run_guarded, then the cancel goes on.
        async def give_back(guard: Guard) -> None:
            await pool.putconn(conn)

        await run_guarded(give_back, what=_ACQUIRE, client=_CLIENT, grace=DEFAULT_GRACE)
