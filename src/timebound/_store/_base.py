"""The store interface shared by durable engines: transactions, durable timers, events, leases.

Engines write SQL with ``?`` placeholders once; each backend adapts it. Everything an engine
needs beyond plain rows is here and engine-neutral: a timer is a row keyed by what it guards
(re-armed from storage at start-up, D6.6), an event is appended to a stream in the same
transaction as the change it records, and a lease is an owner and an expiry on a work row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from .._core._deadline import Deadline

__all__ = ["Store", "StoreBusy", "StoreError", "Tx", "wake_delay"]

# Waking a hair after a stored instant makes the floored epoch-ms reading reach it, so a timer is
# seen due at its own millisecond, never one empty loop turn early (D7.6).
_WAKE_MARGIN_S = 1e-6


def wake_delay(epoch_ms: int) -> float:
    """Seconds an engine's loop sleeps so that it wakes at or just after ``epoch_ms``."""
    return max(0.0, Deadline.from_epoch_ms(epoch_ms).remaining() + _WAKE_MARGIN_S)


class StoreError(RuntimeError):
    """The store cannot be opened or used as asked."""


class StoreBusy(StoreError):
    """Another process already writes this store (SQLite allows one writer process)."""


class Tx:
    """One transaction. Backends implement :meth:`execute` and :meth:`fetch`.

    An engine sets :attr:`wake_others` when the transaction makes work or news for other
    processes (a new token, a finished run); a shared store then wakes them at commit.
    """

    wake_others = False

    def __init__(self) -> None:
        self._events: list[tuple[str, str, int, str]] = []

    async def execute(self, sql: str, *args: Any) -> int:
        raise NotImplementedError

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def fetchone(self, sql: str, *args: Any) -> dict[str, Any] | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    # Durable timers -----------------------------------------------------------------------

    async def set_timer(
        self, key: str, kind: str, stream: str, due_ms: int, priority: int = 0
    ) -> None:
        await self.execute(
            "INSERT INTO tb_timers (key, kind, stream, due_ms, priority) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET due_ms = excluded.due_ms, "
            "priority = excluded.priority",
            key,
            kind,
            stream,
            due_ms,
            priority,
        )

    async def clear_timer(self, key: str) -> None:
        await self.execute("DELETE FROM tb_timers WHERE key = ?", key)

    async def clear_stream_timers(self, stream: str) -> None:
        await self.execute("DELETE FROM tb_timers WHERE stream = ?", stream)

    async def due_timers(self, now_ms: int, limit: int = 100) -> list[dict[str, Any]]:
        """Timers due at ``now_ms``: earliest first, lower ``priority`` first at one instant."""
        return await self.fetch(
            "SELECT key, kind, stream, due_ms FROM tb_timers WHERE due_ms <= ? "
            "ORDER BY due_ms, priority, key LIMIT ?",
            now_ms,
            limit,
        )

    async def next_timer_ms(self) -> int | None:
        row = await self.fetchone("SELECT MIN(due_ms) AS due FROM tb_timers")
        return None if row is None or row["due"] is None else int(row["due"])

    # Events ------------------------------------------------------------------------------

    async def append_event(self, stream: str, kind: str, at_ms: int, **data: Any) -> None:
        """Record an event; written with the transaction's other events at commit, in order."""
        self._events.append((stream, kind, at_ms, json.dumps(data)))

    async def flush_events(self) -> None:
        """Write the recorded events (backends call this just before committing)."""
        if self._events:
            events, self._events = self._events, []
            await self.execute_many(
                "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)", events
            )

    async def execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            await self.execute(sql, *row)

    async def events(self, stream: str) -> list[dict[str, Any]]:
        await self.flush_events()
        rows = await self.fetch(
            "SELECT kind, at_ms, data FROM tb_events WHERE stream = ? ORDER BY seq", stream
        )
        return [
            {"kind": r["kind"], "at_epoch_ms": r["at_ms"], **json.loads(r["data"])} for r in rows
        ]


class Store:
    """A durable store. ``dialect`` is ``"sqlite"`` or ``"postgres"``."""

    dialect: str
    url: str
    #: Whether several processes may work on this store at once (PostgreSQL: yes).
    shared: bool

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def transaction(self) -> Any:
        """``async with store.transaction() as tx``: commit on success, roll back on error."""
        raise NotImplementedError

    def read(self) -> Any:
        """``async with store.read() as tx``: a read-only snapshot of what is committed.

        Reads never wait for writers (SQLite: a WAL reader connection; PostgreSQL: a pooled
        connection of its own), so an API answering reads does not queue behind an engine's
        writes. Writing through it is an error.
        """
        raise NotImplementedError

    async def listen(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when another process commits a ``wake_others`` transaction."""

    async def unlisten(self) -> None:
        """Stop calling the :meth:`listen` callback."""

    def lock_clause(self) -> str:
        """The row-lock clause that serialises changes of one row across processes."""
        return ""

    def skip_locked(self) -> str:
        """The row-lock clause for claiming work (PostgreSQL: ``FOR UPDATE SKIP LOCKED``)."""
        return ""


def apply_migrations_sql(dialect: str, current: int) -> Sequence[tuple[int, list[str]]]:
    """The statements still to run above ``current``, by version."""
    from ._migrations import MIGRATIONS, render

    return [(v, [render(s, dialect) for s in stmts]) for v, stmts in MIGRATIONS if v > current]
