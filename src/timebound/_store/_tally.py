"""Tallies: counters kept in the store, bumped in the transaction whose change they count.

A metric that summarises history (how many timeouts, by layer and policy) is read at every
scrape; recomputing it from the event log costs a scrape O(history) and a pruned log would make
it go down. A tally is instead one row per (name, a, b) holding a running total, added to in the
same transaction as the change it counts, so it is exact across every process sharing the store,
never counts a rolled-back change, survives restarts and event pruning, and costs a reader one
small table (D8.12). Engines bump tallies with :meth:`Tx.tally`; this module writes and reads
them.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base import Store, Tx

__all__ = ["flush_tallies", "read_off_loop", "read_tallies"]

_UPSERT = (
    "INSERT INTO tb_tallies (name, a, b, n) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (name, a, b) DO UPDATE SET n = tb_tallies.n + excluded.n"
)


async def flush_tallies(tx: Tx, tallies: dict[tuple[str, str, str], int]) -> None:
    """Add a transaction's tallies to the stored totals, in key order: two transactions adding
    to the same rows on PostgreSQL lock them in one order, so they cannot deadlock on them."""
    rows = [(*key, n) for key, n in sorted(tallies.items()) if n]
    if rows:
        await tx._execute_many(_UPSERT, rows)


async def read_tallies(store: Store, *names: str) -> dict[str, dict[tuple[str, str], int]]:
    """The totals of each tally of ``names``, by ``(a, b)``: one small read whatever the
    history."""
    out: dict[str, dict[tuple[str, str], int]] = {name: {} for name in names}
    async with store.read() as tx:
        rows = await tx.fetch(
            f"SELECT name, a, b, n FROM tb_tallies WHERE name IN ({', '.join('?' * len(names))})",
            *names,
        )
    for r in rows:
        out[r["name"]][(r["a"], r["b"])] = int(r["n"])
    return out


async def read_off_loop(store: Store, statements: Sequence[str]) -> list[list[dict[str, Any]]]:
    """The rows of each read-only ``statements`` (no parameters), from one snapshot.

    Meant for summaries whose cost grows with the stored rows (counts by state): PostgreSQL
    computes them on the server while the loop awaits; an embedded SQLite store runs them on a
    connection of their own in a worker thread (SQLite releases the GIL while it steps), so the
    loop that fires timers never waits for them (D8.12). An in-memory SQLite store has no
    second connection and is read on the loop.
    """
    path = getattr(store, "path", None)
    if store.dialect != "sqlite" or not isinstance(path, str) or path == ":memory:":
        async with store.read() as tx:
            return [await tx.fetch(sql) for sql in statements]
    return await asyncio.to_thread(_sqlite_read, path, statements)


def _sqlite_read(path: str, statements: Sequence[str]) -> list[list[dict[str, Any]]]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA query_only=ON")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.execute("BEGIN")  # one snapshot for every statement
        out = []
        for sql in statements:
            cur = conn.execute(sql)
            names = [d[0] for d in cur.description or ()]
            out.append([dict(zip(names, row, strict=True)) for row in cur.fetchall()])
        conn.execute("COMMIT")
        return out
    finally:
        conn.close()
