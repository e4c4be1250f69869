"""Implementation of :mod:`timebound.propagation.asyncpg` (DECISIONS D4.8)."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, Final, TypeVar

from ..._core._errors import ConfigurationError, DeadlineExceeded
from ..._core._scopes import bounded
from ...telemetry._tracing import CallSpan
from .._client import Attempt, AttemptTimeoutBase, begin
from ._common import Guard, options, query_span, run_guarded, traced
from ._postgres import NARROW_ASYNCPG, RESTORE_ASYNCPG, begin_narrowed

try:
    import asyncpg
    import asyncpg.pool
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.propagation.asyncpg needs asyncpg: pip install 'timebound[postgres]'"
    ) from exc

__all__ = ["DeadlineConnection", "DeadlinePool", "connect", "create_pool"]

_T = TypeVar("_T")
_log = logging.getLogger("timebound.propagation")
_QUERY: Final = options("asyncpg", "postgres query")
_ACQUIRE: Final = options("asyncpg", "postgres connection", user=False)
_Conn = asyncpg.Connection

# Transaction control is never bounded: asyncpg's own Transaction objects send it through
# ``execute``, a BEGIN must not be wrapped in a transaction of ours, and a COMMIT or ROLLBACK
# must be able to finish after the deadline (never leave half-written state).
_TX_CONTROL: Final = re.compile(
    r"\s*(BEGIN|START\s+TRANSACTION|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|PREPARE\s+TRANSACTION)\b",
    re.IGNORECASE,
)

#: How long past the deadline the client still waits for PostgreSQL's own cancel (57014) before
#: asyncpg cancels from its side. The server normally answers at the deadline; this only
#: bounds a server that does not answer at all (a lost network, a stuck backend).
DEFAULT_GRACE: Final = 1.0


class DeadlineConnection(asyncpg.Connection):  # type: ignore[misc]
    """An ``asyncpg.Connection`` whose queries obey the current deadline.

    Pass it as ``connection_class=`` to ``asyncpg.connect``/``asyncpg.create_pool`` (or use
    :func:`connect`/:func:`create_pool`). ``execute``, ``executemany``, ``fetch``, ``fetchrow``,
    ``fetchval`` and ``fetchmany``:

    * fail fast with :class:`~timebound.DeadlineExceeded` (the binding bound's ``source``)
      when the deadline has passed, sending nothing;
    * under a deadline, run with ``statement_timeout`` narrowed to the time left (``SET LOCAL``,
      in a transaction of their own unless one is open), so PostgreSQL cancels the statement at
      the deadline; that cancel (SQLSTATE 57014) surfaces as ``DeadlineExceeded`` chained to
      asyncpg's ``QueryCanceledError`` and marks the request;
    * with no deadline, run exactly as asyncpg does (no extra round trip).

    A cancellation (a cancelling scope, a policy's attempt timeout, ``task.cancel()``) can only
    ever interrupt the statement itself: ``BEGIN``, narrowing, ``COMMIT``/``ROLLBACK`` and the
    restore always finish first, so no transaction of ours and no narrowed timeout outlives the
    call, and a result is returned only once ``COMMIT`` has answered (see
    :func:`~timebound.propagation.db._common.run_guarded`).

    A statement that cannot run inside a transaction block (``VACUUM``, ``CREATE INDEX
    CONCURRENTLY``) must run under :func:`timebound.no_deadline` or in an open transaction.
    Other methods (``copy_*``, cursors, prepared statements) are asyncpg's own, not bounded.
    """

    _timebound_grace: float = DEFAULT_GRACE
    _timebound_bypass: bool = False

    async def reset(self, *, timeout: float | None = None) -> None:
        """asyncpg's reset (run by the pool at release), never bounded by the deadline.

        Releasing after the deadline must not fail the reset, which would make the pool close a
        healthy connection (D4.8).
        """
        self._timebound_bypass = True
        try:
            await super().reset(timeout=timeout)
        finally:
            self._timebound_bypass = False

    async def _timebound_run(
        self, query: str, call: Callable[[float | None], Awaitable[_T]], timeout: float | None
    ) -> _T:
        if self._timebound_bypass or _TX_CONTROL.match(query):
            return await call(timeout)
        span = query_span("postgresql", query)
        if span is None and not bounded():
            return await call(timeout)  # no deadline, nothing traced: asyncpg as it is (D4.13)
        return await traced(span, self._timebound_bounded(query, call, timeout, span))

    async def _timebound_bounded(
        self,
        query: str,
        call: Callable[[float | None], Awaitable[_T]],
        timeout: float | None,
        span: CallSpan | None,
    ) -> _T:
        attempt = begin(timeout, _QUERY, AttemptTimeoutBase)
        clamped = attempt.clamped
        if not clamped.lowered or clamped.seconds is None:
            # No deadline, or the caller's own timeout is the tighter one: asyncpg as it is.
            return await call(timeout)
        ms = clamped.ms
        assert ms is not None
        if span is not None:  # the budget the statement_timeout carries to the server
            span.set("timebound.deadline.propagated_ms", ms)
        backstop = clamped.seconds + self._timebound_grace

        def run() -> Awaitable[_T]:
            return call(backstop)

        in_callers = self.is_in_transaction()

        async def guarded(guard: Guard) -> _T:
            if in_callers:
                return await self._in_callers_transaction(guard, attempt, run, ms)
            return await self._in_own_transaction(guard, attempt, run, ms)

        return await run_guarded(guarded, attempt, grace=self._timebound_grace)

    async def _in_own_transaction(
        self, guard: Guard, attempt: Attempt, run: Callable[[], Awaitable[_T]], ms: int
    ) -> _T:
        """``BEGIN``+narrowing, the statement, ``COMMIT``; any failure rolls back.

        The result is returned only once ``COMMIT`` has answered: a write reported as done is
        committed.
        """
        try:
            tag = await _Conn.execute(self, begin_narrowed(ms))
        except asyncpg.InterfaceError:
            # Refused before anything was sent (another operation in progress, a closed
            # connection): there is no transaction of ours to end, nor one to disturb.
            raise
        except BaseException:
            await self._timebound_rollback()
            raise
        try:
            narrowed = tag == "SELECT 1"
            result = await guard.statement(lambda: _statement(attempt, run, narrowed=narrowed))
            await _statement(attempt, lambda: _Conn.execute(self, "COMMIT"), narrowed=narrowed)
        except BaseException:
            await self._timebound_rollback()
            raise
        return result

    async def _in_callers_transaction(
        self, guard: Guard, attempt: Attempt, run: Callable[[], Awaitable[_T]], ms: int
    ) -> _T:
        """Narrowing, the statement, then the previous value put back for the caller."""
        prev, narrowed = await _Conn.fetchrow(self, NARROW_ASYNCPG, ms)
        if not narrowed:
            # A tighter setting rules: nothing of ours to undo.
            return await guard.statement(lambda: _statement(attempt, run, narrowed=False))
        try:
            result = await guard.statement(lambda: _statement(attempt, run, narrowed=True))
        except BaseException:
            # Interrupted after the statement ended, the transaction is still good and needs
            # its value back; after a failed statement it is aborted (the restore fails with
            # it, and the caller's rollback drops our value with everything else).
            try:
                await _Conn.fetchval(self, RESTORE_ASYNCPG, prev, ms)
            except Exception:
                pass
            raise
        # Runs under the narrowed value itself: if that cancels it, the caller's transaction
        # is aborted, and says so (never a narrowed value left behind in it).
        await _statement(
            attempt, lambda: _Conn.fetchval(self, RESTORE_ASYNCPG, prev, ms), narrowed=True
        )
        return result

    async def _timebound_rollback(self) -> None:
        """End the transaction of ours, whatever state the failure left it in."""
        try:
            await _Conn.execute(self, "ROLLBACK", timeout=self._timebound_grace)
        except Exception as exc:
            # Its state unknown, the connection must serve nobody: closing it makes the server
            # roll back, and a pool replaces it.
            _log.warning("asyncpg: ROLLBACK after a cut failed (%r): closing the connection", exc)
            self.terminate()

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        """asyncpg's ``execute``, bounded by the current deadline."""
        return await self._timebound_run(
            query, lambda t: _Conn.execute(self, query, *args, timeout=t), timeout
        )

    async def executemany(
        self, command: str, args: Iterable[Any], *, timeout: float | None = None
    ) -> None:
        """asyncpg's ``executemany``, bounded by the current deadline (one timeout for all)."""
        await self._timebound_run(
            command, lambda t: _Conn.executemany(self, command, args, timeout=t), timeout
        )

    async def fetch(
        self, query: str, *args: Any, timeout: float | None = None, record_class: Any = None
    ) -> list[Any]:
        """asyncpg's ``fetch``, bounded by the current deadline."""
        return await self._timebound_run(
            query,
            lambda t: _Conn.fetch(self, query, *args, timeout=t, record_class=record_class),
            timeout,
        )

    async def fetchrow(
        self, query: str, *args: Any, timeout: float | None = None, record_class: Any = None
    ) -> Any:
        """asyncpg's ``fetchrow``, bounded by the current deadline."""
        return await self._timebound_run(
            query,
            lambda t: _Conn.fetchrow(self, query, *args, timeout=t, record_class=record_class),
            timeout,
        )

    async def fetchval(
        self, query: str, *args: Any, column: int = 0, timeout: float | None = None
    ) -> Any:
        """asyncpg's ``fetchval``, bounded by the current deadline."""
        return await self._timebound_run(
            query, lambda t: _Conn.fetchval(self, query, *args, column=column, timeout=t), timeout
        )

    async def fetchmany(
        self,
        query: str,
        args: Iterable[Any],
        *,
        timeout: float | None = None,
        record_class: Any = None,
    ) -> list[Any]:
        """asyncpg's ``fetchmany``, bounded by the current deadline."""
        return await self._timebound_run(
            query,
            lambda t: _Conn.fetchmany(self, query, args, timeout=t, record_class=record_class),
            timeout,
        )


async def _statement(attempt: Attempt, run: Callable[[], Awaitable[_T]], *, narrowed: bool) -> _T:
    """Run a statement; a cancel caused by our deadline becomes ``DeadlineExceeded``."""
    try:
        return await run()
    except asyncpg.QueryCanceledError as exc:
        # 57014 is ours only when our value was in force and our deadline has really passed
        # (the server's timer starts after we computed it, so by then it has).
        if narrowed and attempt.expired():
            raise attempt.cut() from exc
        raise
    except TimeoutError as exc:
        if isinstance(exc, DeadlineExceeded):
            raise
        # asyncpg's own timeout: the backstop fired because the server did not answer.
        if attempt.expired():
            raise attempt.cut() from exc
        raise


async def _acquire(pool: Any, timeout: float | None) -> Any:
    """Take a connection, waiting no longer than the deadline allows."""
    attempt = begin(timeout, _ACQUIRE, AttemptTimeoutBase)
    if not attempt.lowered:
        return await pool.acquire(timeout=timeout)
    # Without a timeout asyncpg releases with none either: the deadline bounds the wait, never
    # the later reset of a healthy connection (D4.8).
    return await attempt.run(pool.acquire)


class _Acquire:
    """``async with pool.acquire() as con`` / ``con = await pool.acquire()``."""

    __slots__ = ("_con", "_pool", "_timeout")

    def __init__(self, pool: Any, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._con: Any = None

    def __await__(self) -> Generator[Any, None, Any]:
        return _acquire(self._pool, self._timeout).__await__()

    async def __aenter__(self) -> Any:
        self._con = await _acquire(self._pool, self._timeout)
        return self._con

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        con, self._con = self._con, None
        await self._pool.release(con)


class DeadlinePool:
    """An ``asyncpg.Pool`` whose connection wait is capped by the current deadline.

    ``DeadlinePool(await asyncpg.create_pool(dsn, connection_class=DeadlineConnection))``, or
    :func:`create_pool`. ``acquire()`` fails fast when the deadline has passed and stops waiting
    for a free connection at the deadline (:class:`~timebound.DeadlineExceeded`, the binding
    bound's ``source``); the shortcut query methods acquire, run on a
    :class:`DeadlineConnection` and release. ``.pool`` is the asyncpg pool.
    """

    __slots__ = ("_pool",)

    def __init__(self, pool: asyncpg.pool.Pool) -> None:
        cls = getattr(pool, "_connection_class", DeadlineConnection)
        if not (isinstance(cls, type) and issubclass(cls, DeadlineConnection)):
            raise ConfigurationError(
                "DeadlinePool needs a pool created with connection_class=DeadlineConnection "
                "(or use timebound.propagation.asyncpg.create_pool)",
                option="pool",
            )
        self._pool = pool

    @property
    def pool(self) -> asyncpg.pool.Pool:
        """The wrapped asyncpg pool."""
        return self._pool

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        """A connection from the pool; the wait ends at ``timeout`` or the deadline."""
        return _Acquire(self._pool, timeout)

    async def release(self, connection: Any, *, timeout: float | None = None) -> None:
        """Give a connection from :meth:`acquire` back."""
        await self._pool.release(connection, timeout=timeout)

    async def close(self) -> None:
        """Close the pool (asyncpg's graceful close)."""
        await self._pool.close()

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        """Acquire, ``execute``, release — every step bounded by the deadline."""
        async with self.acquire() as con:
            return await con.execute(query, *args, timeout=timeout)  # type: ignore[no-any-return]

    async def executemany(
        self, command: str, args: Iterable[Any], *, timeout: float | None = None
    ) -> None:
        """Acquire, ``executemany``, release — every step bounded by the deadline."""
        async with self.acquire() as con:
            await con.executemany(command, args, timeout=timeout)

    async def fetch(self, query: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Acquire, ``fetch``, release — every step bounded by the deadline."""
        async with self.acquire() as con:
            return await con.fetch(query, *args, timeout=timeout)  # type: ignore[no-any-return]

    async def fetchrow(self, query: str, *args: Any, timeout: float | None = None) -> Any:
        """Acquire, ``fetchrow``, release — every step bounded by the deadline."""
        async with self.acquire() as con:
            return await con.fetchrow(query, *args, timeout=timeout)

    async def fetchval(
        self, query: str, *args: Any, column: int = 0, timeout: float | None = None
    ) -> Any:
        """Acquire, ``fetchval``, release — every step bounded by the deadline."""
        async with self.acquire() as con:
            return await con.fetchval(query, *args, column=column, timeout=timeout)

    async def __aenter__(self) -> DeadlinePool:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _connection_class(kwargs: dict[str, Any]) -> None:
    cls = kwargs.setdefault("connection_class", DeadlineConnection)
    if not (isinstance(cls, type) and issubclass(cls, DeadlineConnection)):
        raise ConfigurationError(
            "connection_class must be a subclass of DeadlineConnection", option="connection_class"
        )


async def connect(dsn: str | None = None, **kwargs: Any) -> DeadlineConnection:
    """``asyncpg.connect`` with :class:`DeadlineConnection` as the connection class."""
    _connection_class(kwargs)
    return await asyncpg.connect(dsn, **kwargs)  # type: ignore[no-any-return]


async def create_pool(dsn: str | None = None, **kwargs: Any) -> DeadlinePool:
    """``asyncpg.create_pool`` with :class:`DeadlineConnection`, wrapped in a DeadlinePool."""
    _connection_class(kwargs)
    pool = await asyncpg.create_pool(dsn, **kwargs)
    return DeadlinePool(pool)
