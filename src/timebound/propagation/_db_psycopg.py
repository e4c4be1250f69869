"""Implementation of :mod:`timebound.propagation.psycopg` (DECISIONS D4.8)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, TypeVar

from .._core._errors import DeadlineExceeded
from ._db_common import budget, spent, updated
from ._db_postgres import NARROW_PSYCOPG, RESTORE_PSYCOPG

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
        helper: psycopg.Cursor[Any] = psycopg.Cursor(self.connection)
        if own:
            with self.connection.transaction():
                helper.execute(NARROW_PSYCOPG, {"ms": ms})
                _prev, narrowed = helper.fetchone() or ("0", False)
                return self._statement(run, narrowed)
        helper.execute(NARROW_PSYCOPG, {"ms": ms})
        prev, narrowed = helper.fetchone() or ("0", False)
        result = self._statement(run, narrowed)
        if narrowed:
            # Only on success: a failed statement aborts the transaction, whose rollback drops
            # the narrowed value with everything else.
            helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms})
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
    :func:`aconnect`).
    """

    async def _bounded(self, query: Any, run: Callable[[], Any]) -> Any:
        plan = _plan(query, self.connection)
        if plan is None:
            return await run()
        ms, own = plan
        helper: psycopg.AsyncCursor[Any] = psycopg.AsyncCursor(self.connection)
        if own:
            async with self.connection.transaction():
                await helper.execute(NARROW_PSYCOPG, {"ms": ms})
                _prev, narrowed = await helper.fetchone() or ("0", False)
                return await self._statement(run, narrowed)
        await helper.execute(NARROW_PSYCOPG, {"ms": ms})
        prev, narrowed = await helper.fetchone() or ("0", False)
        result = await self._statement(run, narrowed)
        if narrowed:
            await helper.execute(RESTORE_PSYCOPG, {"prev": prev, "ms": ms})
        return result

    @staticmethod
    async def _statement(run: Callable[[], Any], narrowed: bool) -> Any:
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
        await pool.putconn(conn)
