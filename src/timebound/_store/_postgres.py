"""The shared store: PostgreSQL through asyncpg, for many workers on many machines.

Every transaction holds one pooled connection. Claims use ``FOR UPDATE SKIP LOCKED`` so workers
never take the same row; changes of one run are serialised with ``FOR UPDATE`` on its row; a
commit that made work for others sends ``NOTIFY`` (one channel per schema) so idle workers wake
at once instead of at the next sweep.
``?schema=NAME`` keeps a store in its own schema (created if absent).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

from .._core import _clock
from ._base import Store, StoreError, Tx, apply_migrations_sql

__all__ = ["PostgresStore"]

_PLACEHOLDER = re.compile(r"\?")
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Serialises migrations of concurrent first starts (any constant; "tbst" in ASCII).
_MIGRATION_LOCK = 0x74627374
# The class of the workers' session locks (two-key advisory locks: class, worker key; "tbwk").
_SESSION_LOCK_CLASS = 0x7462776B
# The payload of a wake-up that is news for waiters only (Tx.news_only).
_NEWS = "news"
# A NOTIFY payload must stay under 8000 bytes: stopped ids go in chunks.
_PAYLOAD_BYTES = 7000


def _numbered(sql: str) -> str:
    counter = iter(range(1, 10_000))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)


def _chunks(ids: list[str]) -> list[str]:
    """Comma-joined ids in payloads that fit a NOTIFY."""
    out: list[str] = []
    for token_id in dict.fromkeys(ids):
        if out and len(out[-1]) + len(token_id) + 1 <= _PAYLOAD_BYTES:
            out[-1] += "," + token_id
        else:
            out.append(token_id)
    return out


class _PgTx(Tx):
    def __init__(self, conn: Any) -> None:
        super().__init__()
        self._conn = conn

    async def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        await self._conn.executemany(_numbered(sql), rows)

    async def _execute(self, sql: str, *args: Any) -> int:
        status: str = await self._conn.execute(_numbered(sql), *args)
        tail = status.rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def _fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return [dict(r) for r in await self._conn.fetch(_numbered(sql), *args)]


async def _keep_session(conn: Any) -> None:
    """Return a connection to the pool as it is. asyncpg's default reset sends ``RESET ALL``,
    ``UNLISTEN *``… each time, one more round trip per transaction; our pooled connections
    change no session state (the search path is a startup setting, the migration's lock is
    transaction-scoped, LISTEN has its own connection), and asyncpg still ends any transaction
    left open before calling this."""


class PostgresStore(Store):
    dialect = "postgres"
    shared = True

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.schema = query.pop("schema", "public")
        if not _SCHEMA.match(self.schema):
            raise StoreError(f"{url!r}: schema must match {_SCHEMA.pattern}")
        self.url = url
        self._dsn = urlunsplit(parts._replace(query=urlencode(query)))
        self._pool: Any = None
        self._listener: Any = None
        self._listening: asyncio.Task[None] | None = None
        self._session_since: int | None = None
        # The server pids of this store's pooled connections: their notifications are this
        # process's own commits, news to nobody here.
        self._own: set[int] = set()
        self._channel = f"tb_store_{self.schema}"
        self._stop_channel = f"tb_stop_{self.schema}"

    async def open(self) -> None:
        if self._pool is not None:
            return
        # Every wait for the server is real I/O (see _clock.real_io): on virtual time it takes
        # no time, so a test never sees time leap past a slow answer.
        with _clock.real_io():
            await self._open()

    async def _open(self) -> None:
        import asyncpg

        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=1,
                max_size=8,
                server_settings={"search_path": self.schema},
                reset=_keep_session,
                init=self._own_connection,
            )
        except (OSError, asyncpg.PostgresError) as exc:
            raise StoreError(
                f"cannot open PostgreSQL store {self.url!r}: {exc}", unreachable=_unreachable(exc)
            ) from exc
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            await conn.execute("CREATE TABLE IF NOT EXISTS tb_schema (version INTEGER NOT NULL)")
            current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM tb_schema")
            for version, statements in apply_migrations_sql(self.dialect, current):
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO tb_schema (version) VALUES ($1)", version)

    async def _own_connection(self, conn: Any) -> None:
        """Know a pooled connection's server pid while it is open (see ``_own``)."""
        pid = conn.get_server_pid()
        self._own.add(pid)
        conn.add_termination_listener(lambda _c: self._own.discard(pid))

    async def listen(
        self,
        callback: Callable[[], None],
        *,
        on_stop: Callable[[int, list[str]], None] | None = None,
        session_key: int | None = None,
        on_news: Callable[[], None] | None = None,
    ) -> None:
        """One connection of its own, kept open: LISTEN on the wake-up (and stop) channels,
        and the session lock held on it. A dropped connection (the server restarted) is opened
        again, and the callback called then, since notifications sent meanwhile are lost."""
        if self._listening is not None:
            return
        connected = asyncio.get_running_loop().create_future()
        self._listening = asyncio.create_task(
            self._listen(callback, on_stop, session_key, connected, on_news),
            name="timebound-store-listen",
        )
        await connected

    async def _listen(
        self,
        callback: Callable[[], None],
        on_stop: Callable[[int, list[str]], None] | None,
        session_key: int | None,
        connected: asyncio.Future[None],
        on_news: Callable[[], None] | None = None,
    ) -> None:
        import asyncpg

        def stop(_conn: Any, pid: int, _channel: str, payload: str) -> None:
            at, _, ids = payload.partition(" ")
            if on_stop is not None and ids and pid not in self._own:
                on_stop(int(at), ids.split(","))

        def wake(_conn: Any, pid: int, _channel: str, payload: str) -> None:
            if pid in self._own:
                return
            if payload == _NEWS and on_news is not None:
                on_news()
            else:
                callback()

        while True:
            lost = asyncio.Event()
            try:
                with _clock.real_io():
                    conn = await asyncpg.connect(self._dsn)
                    conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                    await conn.add_listener(self._channel, wake)
                    if on_stop is not None:
                        await conn.add_listener(self._stop_channel, stop)
                    if session_key is not None:
                        await conn.execute(
                            "SELECT pg_advisory_lock($1, $2)", _SESSION_LOCK_CLASS, session_key
                        )
                        self._session_since = _clock.wall_ms()
            except Exception as exc:  # whatever the server or the network did: again soon
                if not connected.done():
                    connected.set_exception(StoreError(f"cannot listen on {self.url!r}: {exc}"))
                    return
                await asyncio.sleep(0.2)  # the server is restarting: try again soon
                continue
            self._listener = conn
            if connected.done():
                callback()  # what was notified while the connection was down is lost
            else:
                connected.set_result(None)
            try:
                await lost.wait()
            finally:
                self._listener = None
                self._session_since = None
                if not conn.is_closed():
                    conn.terminate()

    async def unlisten(self) -> None:
        task, self._listening = self._listening, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, StoreError):
                await task

    async def session_alive(self, tx: Tx, key: int) -> bool:
        row = await tx.fetchone(
            "SELECT 1 AS held FROM pg_locks WHERE locktype = 'advisory' AND classid = ? "
            "AND objid = ? AND objsubid = 2 AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            _SESSION_LOCK_CLASS,
            key,
        )
        return row is not None

    def session_since(self) -> int | None:
        return self._session_since

    async def close(self) -> None:
        await self.unlisten()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def lock_clause(self) -> str:
        return " FOR UPDATE"

    def skip_locked(self, of: str | None = None) -> str:
        return " FOR UPDATE SKIP LOCKED" if of is None else f" FOR UPDATE OF {of} SKIP LOCKED"

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        if self._pool is None:
            raise StoreError("the store is not open")
        with _clock.real_io():
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    tx = _PgTx(conn)
                    yield tx
                    await tx.flush_events()
                    # Delivered at commit, never for a rolled-back change; the stops first, so a
                    # worker cancels a stopped attempt before its loop turns on the wake-up.
                    for chunk in _chunks(tx.stopped):
                        await conn.execute(
                            "SELECT pg_notify($1, $2)",
                            self._stop_channel,
                            f"{tx.stopped_at} {chunk}",
                        )
                    if tx.wake_others:
                        news = f", '{_NEWS}'" if tx.news_only else ""
                        await conn.execute(f'NOTIFY "{self._channel}"{news}')
                # At once after the commit returned, before the connection goes back to the
                # pool (an await a cancellation could interrupt); never after a rollback (D10.3).
                self.commits += 1
                tx.committed()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        if self._pool is None:
            raise StoreError("the store is not open")
        # One snapshot for every statement of the read (REPEATABLE READ), and the server refuses
        # a write through it.
        with _clock.real_io():
            async with (
                self._pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                yield _PgTx(conn)


def _unreachable(exc: BaseException) -> bool:
    """A connection that failed for now, not for good: the network or the server's state
    (SQLSTATE class 08, connection exceptions; 57P, a server shutting down or starting)."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    return isinstance(state, str) and state.startswith(("08", "57P"))
