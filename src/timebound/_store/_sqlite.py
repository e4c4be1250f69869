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
import functools
import itertools
import os
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ._base import Store, StoreBusy, StoreError, Tx, apply_migrations_sql

__all__ = ["SqliteStore"]

_SYNC_MODES = ("FULL", "NORMAL", "OFF", "EXTRA")

# An INSERT of one row of parameters and nothing else (no ON CONFLICT, no RETURNING).
_PLAIN_INSERT = re.compile(r"(INSERT INTO \w+ \([\w, ]+\) VALUES )(\((?:\?, )*\?\))")
#: How many rows one multi-row INSERT takes (D6.37): fixed sizes, so each is prepared once.
_ROWS_AT_ONCE = (64, 16, 4)


#: The parameters one statement may have on any SQLite (999 before 3.32).
_MAX_PARAMETERS = 999


@functools.lru_cache(maxsize=256)
def _multi_row(sql: str, rows: int) -> str | None:
    """``sql`` inserting ``rows`` rows in one statement, or ``None`` if it is not a plain
    one-row INSERT or would have too many parameters."""
    found = _PLAIN_INSERT.fullmatch(sql)
    if found is None or found.group(2).count("?") * rows > _MAX_PARAMETERS:
        return None
    return found.group(1) + ", ".join([found.group(2)] * rows)


class _SqliteTx(Tx):
    def __init__(self, conn: sqlite3.Connection, *, exclusive: bool = False) -> None:
        super().__init__()
        self._conn = conn
        self.exclusive = exclusive

    async def _execute(self, sql: str, *args: Any) -> int:
        return self._conn.execute(sql, args).rowcount

    async def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """The rows of a plain INSERT go by fixed-size multi-row statements, the rest (and any
        other statement) by ``executemany`` (D6.37): one statement step per row cost SQLite
        ~8,000 instructions more per row (its statement's end, an AUTOINCREMENT table's
        sequence written again) than a row among many in one statement."""
        at, n = 0, len(rows)
        if n >= _ROWS_AT_ONCE[-1] and _multi_row(sql, 1) is not None:
            chain = itertools.chain.from_iterable
            for size in _ROWS_AT_ONCE:
                many = _multi_row(sql, size) if n - at >= size else None
                if many is not None:
                    while n - at >= size:
                        self._conn.execute(many, tuple(chain(rows[at : at + size])))
                        at += size
        if at < n:
            self._conn.executemany(sql, rows[at:] if at else rows)

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
