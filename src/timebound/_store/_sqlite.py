"""The embedded store: SQLite in WAL mode, one writer process.

SQLite calls are made on the event loop's thread: a WAL commit costs tens of microseconds with
``synchronous=NORMAL`` and one fsync with ``FULL`` (the default, for kill -9 and power-loss
durability), and no ``await`` happens inside a transaction, so transactions never interleave.
Reads (:meth:`SqliteStore.read`) use a second, query-only connection: in WAL mode a reader sees
the last commit and never takes the write lock, so serving reads costs no ``BEGIN IMMEDIATE``.

One process writes a database: the first store to open it takes an exclusive ``flock`` on a
``<db>.lock`` file next to it (released by the kernel when the process dies, even by kill -9), and
a second process gets :class:`StoreBusy` at once instead of fighting over the write lock. Many
workers on many machines use PostgreSQL.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ._base import Store, StoreBusy, StoreError, Tx, apply_migrations_sql

__all__ = ["SqliteStore"]

_SYNC_MODES = ("FULL", "NORMAL", "OFF", "EXTRA")


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection, *, exclusive: bool = False) -> None:
        super().__init__()
        self._conn = conn
        self.exclusive = exclusive

    async def _execute(self, sql: str, *args: Any) -> int:
        return self._conn.execute(sql, args).rowcount

    async def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self._conn.executemany(sql, rows)

    async def _fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        cur = self._conn.execute(sql, args)
        names = [d[0] for d in cur.description or ()]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


class SqliteStore(Store):
    dialect = "sqlite"
    shared = False

    def __init__(self, path: str, *, synchronous: str = "FULL", url: str = "") -> None:
        if synchronous.upper() not in _SYNC_MODES:
            raise StoreError(f"synchronous must be one of {', '.join(_SYNC_MODES)}")
        self.path = path
        self.url = url or f"sqlite:///{path}"
        self._synchronous = synchronous.upper()
        self._conn: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._lock_fd: int | None = None

    async def open(self) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:":
            self._take_writer_lock()
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA busy_timeout=5000")
        except sqlite3.Error as exc:
            self._release_writer_lock()
            raise StoreError(f"cannot open SQLite store {self.path!r}: {exc}") from exc
        self._conn = conn
        self._migrate(conn)
        if self.path != ":memory:":  # another connection to ":memory:" is another database
            reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            reader.execute("PRAGMA query_only=ON")
            reader.execute("PRAGMA busy_timeout=5000")
            self._reader = reader

    def _take_writer_lock(self) -> None:
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreBusy(
                f"another process is already running the SQLite store {self.path!r}: SQLite "
                "allows one writer process; use PostgreSQL for many workers"
            ) from None
        self._lock_fd = fd

    def _release_writer_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _migrate(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS tb_schema (version INTEGER NOT NULL)")
            row = conn.execute("SELECT MAX(version) FROM tb_schema").fetchone()
            current = row[0] or 0
            for version, statements in apply_migrations_sql(self.dialect, current):
                for statement in statements:
                    conn.execute(statement)
                conn.execute("INSERT INTO tb_schema (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._release_writer_lock()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Tx]:
        conn = self._conn
        if conn is None:
            raise StoreError("the store is not open")
        conn.execute("BEGIN IMMEDIATE")
        try:
            tx = _SqliteTx(conn, exclusive=True)  # BEGIN IMMEDIATE: the one writer
            yield tx
            await tx.flush_events()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        self.commits += 1
        tx.committed()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        conn = self._reader or self._conn
        if conn is None:
            raise StoreError("the store is not open")
        if conn is self._conn:  # ":memory:": the writer's connection, between its transactions
            yield _SqliteTx(conn)
            return
        conn.execute("BEGIN")  # deferred: the snapshot is taken at the first read
        try:
            yield _SqliteTx(conn)
        finally:
            conn.execute("COMMIT")
