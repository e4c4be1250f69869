"""What a registry answers about its operations, read from committed state.

Reads go through :meth:`Store.read` (a WAL reader on SQLite, a read-only snapshot on
PostgreSQL): they take no write lock, so the host's pages and the poller's rounds neither queue
behind the registry's transitions nor hold up a writer.
"""

from __future__ import annotations

import json
from typing import Any

from .._store import Store
from .._store._tally import read_off_loop
from ._contract import STATUS_SCHEMA, format_time
from ._rows import COLUMNS, Gone, Operation, fetch_row, now_ms, row_op

__all__ = ["OperationReads"]


class OperationReads:
    """The reads of :class:`~timebound.deferred.Registry` (a part of it, which provides
    ``_store``)."""

    _store: Store

    async def get(self, op_id: str) -> Operation | None:
        """The operation, ``None`` if never issued; :class:`Gone` once its retention ended."""
        async with self._store.read() as tx:
            row = await tx.fetchone(f"SELECT {COLUMNS} FROM tb_deferred_ops WHERE id = ?", op_id)
        if row is None:
            return None
        op = row_op(row)
        if op.retain_until_ms is not None and now_ms() >= op.retain_until_ms:
            raise Gone(f"deferred operation {op_id!r} is no longer retained")
        return op

    async def operations(
        self,
        *,
        status: str | None = None,
        module: str | None = None,
        after: tuple[int, str] | None = None,
        limit: int = 100,
    ) -> list[Operation]:
        """Operations for an operator view, newest first; ``after`` is the (created_ms, id) of
        the last operation of the previous page."""
        conditions: list[str] = []
        args: list[Any] = []
        if status is not None:
            conditions.append("status = ?")
            args.append(status)
        if module is not None:
            conditions.append("module = ?")
            args.append(module)
        if after is not None:
            conditions.append("(created_ms < ? OR (created_ms = ? AND id > ?))")
            args += [after[0], after[0], after[1]]
        where = f"WHERE {' AND '.join(conditions)}" if conditions else ""
        async with self._store.read() as tx:
            rows = await tx.fetch(
                f"SELECT {COLUMNS} FROM tb_deferred_ops {where} ORDER BY created_ms DESC, id "
                "LIMIT ?",
                *args,
                limit,
            )
        return [row_op(r) for r in rows]

    async def stats(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """For metrics: operations by (status, module), and polls made (attempts) by module
        (``""`` for operations without a module). Counted off the event loop (D8.12)."""
        (rows,) = await read_off_loop(
            self._store,
            (
                "SELECT status, module, COUNT(*) AS n, SUM(attempts) AS polls "
                "FROM tb_deferred_ops GROUP BY status, module",
            ),
        )
        ops: dict[tuple[str, str], int] = {}
        polls: dict[str, int] = {}
        for r in rows:
            module = r["module"] or ""
            ops[(r["status"], module)] = int(r["n"])
            polls[module] = polls.get(module, 0) + int(r["polls"] or 0)
        return ops, polls

    async def history(self, op_id: str) -> list[dict[str, Any]]:
        """The status history: instant, status, digest and code, never a document."""
        async with self._store.read() as tx:
            rows = await tx.fetch(
                "SELECT at_ms, status, digest, code FROM tb_deferred_history WHERE op_id = ? "
                "ORDER BY seq",
                op_id,
            )
        return list(rows)

    async def status_document(self, op_id: str) -> dict[str, Any] | None:
        """The ``deferred-operation-status.v1`` document of an operation this host serves."""
        async with self._store.read() as tx:
            row = await fetch_row(tx, self._store, op_id)
        if row is None:
            return None
        op = row_op(row)
        if op.retain_until_ms is not None and now_ms() >= op.retain_until_ms:
            raise Gone(f"deferred operation {op_id!r} is no longer retained")
        doc: dict[str, Any] = {
            "schema": STATUS_SCHEMA,
            "schema/v": 1,
            "operation/id": op.id,
            "operation/kind": op.kind,
            "status": op.status,
            "expires_at": format_time(op.expires_ms),
            "updated_at": format_time(op.updated_ms),
            "attempt_no": op.attempts,
        }
        if not op.terminal:
            doc["retry_after_seconds"] = op.retry_after_s
        if op.status == "completed":
            doc["result"] = json.loads(row["result"])
        elif op.terminal:
            doc["error"] = json.loads(row["error"])
        return doc

    # What the poller reads -------------------------------------------------------------------

    async def next_instant(self, after_ms: int) -> int | None:
        """The earliest instant after ``after_ms`` at which a poll or an expiry is due."""
        async with self._store.read() as tx:
            poll = await tx.fetchone(
                "SELECT MIN(next_poll_ms) AS t FROM tb_deferred_ops WHERE next_poll_ms > ?",
                after_ms,
            )
            exp = await tx.fetchone(
                "SELECT MIN(expires_ms) AS t FROM tb_deferred_ops "
                "WHERE status IN ('pending', 'running') AND expires_ms > ?",
                after_ms,
            )
        times = [r["t"] for r in (poll, exp) if r is not None and r["t"] is not None]
        return min(int(t) for t in times) if times else None

    async def live_modules(self) -> list[str]:
        """The modules of the operations still pending or running: the connectors a poller
        needs, whoever registered them (a previous process, another host on the store)."""
        async with self._store.read() as tx:
            rows = await tx.fetch(
                "SELECT DISTINCT module FROM tb_deferred_ops "
                "WHERE status IN ('pending', 'running') AND module IS NOT NULL ORDER BY module"
            )
        return [r["module"] for r in rows]

    async def due_polls(self, modules: list[str], limit: int) -> list[Operation]:
        """Live operations of ``modules`` whose next poll is due (never before it, D7.6)."""
        if not modules:
            return []
        marks = ", ".join("?" for _ in modules)
        # Without statistics SQLite's planner prefers the (status, expires_ms) index here, which
        # reads and sorts every live row on every round (2.8 ms at 10,000 pending, the loop's
        # largest cost); walking the next-poll index stops after ``limit`` rows (0.3-0.5 ms).
        # PostgreSQL plans from its own statistics.
        hint = " INDEXED BY tb_deferred_ops_poll" if self._store.dialect == "sqlite" else ""
        async with self._store.read() as tx:
            rows = await tx.fetch(
                f"SELECT {COLUMNS} FROM tb_deferred_ops{hint} WHERE next_poll_ms <= ? "
                f"AND module IN ({marks}) AND status IN ('pending', 'running') "
                "ORDER BY next_poll_ms, id LIMIT ?",
                now_ms(),
                *modules,
                limit,
            )
        return [row_op(r) for r in rows]
