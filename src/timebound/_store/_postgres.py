"""The shared store: PostgreSQL through asyncpg, for many workers on many machines.

Every transaction holds one pooled connection. Claims use ``FOR UPDATE SKIP LOCKED`` so workers
never take the same row; changes of one run are serialised with ``FOR UPDATE`` on its row; a
commit that made work for others sends ``NOTIFY`` (one channel per schema) so idle workers wake
at once instead of at the next sweep.
``?schema=NAME`` keeps a store in its own schema (created if absent).
"""

from __future__ import annotations

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


def _numbered(sql: str) -> str:
    counter = iter(range(1, 10_000))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)


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
        self._channel = f"tb_store_{self.schema}"

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
            )
        except (OSError, asyncpg.PostgresError) as exc:
            raise StoreError(f"cannot open PostgreSQL store {self.url!r}: {exc}") from exc
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            await conn.execute("CREATE TABLE IF NOT EXISTS tb_schema (version INTEGER NOT NULL)")
            current = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM tb_schema")
            for version, statements in apply_migrations_sql(self.dialect, current):
                for statement in statements:
                    await conn.execute(statement)
                await conn.execute("INSERT INTO tb_schema (version) VALUES ($1)", version)

    async def listen(self, callback: Callable[[], None]) -> None:
        import asyncpg

        if self._listener is not None:
            return
        self._listener = await asyncpg.connect(self._dsn)
        await self._listener.add_listener(self._channel, lambda *_: callback())

    async def unlisten(self) -> None:
        conn, self._listener = self._listener, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        await self.unlisten()
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    def lock_clause(self) -> str:
        return " FOR UPDATE"

    def skip_locked(self) -> str:
        return " FOR UPDATE SKIP LOCKED"

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
                    if tx.wake_others:  # delivered at commit, never for a rolled-back change
                        await conn.execute(f'NOTIFY "{self._channel}"')
                # At once after the commit returned, before the connection goes back to the
                # pool (an await a cancellation could interrupt); never after a rollback (D10.3).
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
