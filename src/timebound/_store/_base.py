"""The store interface shared by durable engines: transactions, durable timers, events, leases.

Engines write SQL with ``?`` placeholders once; each backend adapts it. Everything an engine
needs beyond plain rows is here and engine-neutral: a timer is a row keyed by what it guards
(re-armed from storage at start-up, D6.6), an event is appended to a stream in the same
transaction as the change it records, and a lease is an owner and an expiry on a work row.

The workflow engine's timers are rows of ``tb_timers``. A deferred operation's next poll and
expiry are columns of its own row instead, written by the statement that stores its status
(D7.14); both engines sleep until their next stored instant through the same loop (``_wake.py``,
D12.1).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

from .._core._deadline import Deadline
from .._core._errors import TimeboundError
from .._json import dumps
from ..telemetry import _durable
from ..telemetry._events import Event, enabled
from ._tally import flush_tallies

__all__ = ["Store", "StoreBusy", "StoreError", "Tx", "wake_delay"]

# The table a write statement changes (a statement it does not match counts as any table).
_WRITTEN_TABLE = re.compile(r"\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+(\w+)", re.IGNORECASE)


@functools.lru_cache(maxsize=1024)
def _written_table(sql: str) -> str:
    """The table a statement writes, ``*`` if not known (a statement's text is made once and
    sent many times: matched once)."""
    found = _WRITTEN_TABLE.match(sql)
    return found.group(1) if found else "*"


# Waking a hair after a stored instant makes the floored epoch-ms reading reach it, so a timer is
# seen due at its own millisecond, never one empty loop turn early (D7.6).
_WAKE_MARGIN_S = 1e-6


def wake_delay(epoch_ms: int) -> float:
    """Seconds an engine's loop sleeps so that it wakes at or just after ``epoch_ms``."""
    return max(0.0, Deadline.from_epoch_ms(epoch_ms).remaining() + _WAKE_MARGIN_S)


class StoreError(TimeboundError, RuntimeError):
    """The store cannot be opened or used as asked. ``unreachable`` is true when the server
    could not be reached or could not take a connection yet (refused, timed out, starting or
    shutting down): trying again later may succeed, unlike a refusal of who is asking."""

    code = "store-error"

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class StoreBusy(StoreError):
    """Another process already writes this store (SQLite allows one writer process)."""

    code = "store-busy"


class Tx:
    """One transaction. Backends implement :meth:`execute` and :meth:`fetch`.

    An engine sets :attr:`wake_others` when the transaction makes work or news for other
    processes (a new token, a finished run); a shared store then wakes them at commit.

    :attr:`exclusive` is true when no other writer can change a row until this transaction ends
    (SQLite's ``BEGIN IMMEDIATE``); :attr:`held` is where an engine keeps the rows it holds in
    this transaction (read under a row lock, or in an exclusive transaction), so it need not read
    them again: it is the engine's job to keep them current with its own writes. Both die with
    the transaction, so a rollback forgets them.
    """

    wake_others = False
    #: With :attr:`wake_others`: the news is for waiters only (a run ended), no work for other
    #: processes' loops; :meth:`Store.listen`'s ``on_news`` hears it instead of ``callback``.
    news_only = False
    exclusive = False

    def __init__(self) -> None:
        #: Work rows (token ids) this transaction stopped: a shared store tells the processes
        #: that may be running them at commit (:meth:`Store.listen`'s ``on_stop``, D6.14).
        self.stopped: list[str] = []
        #: The instant (epoch ms) the engine flipped them, sent along to measure the time to
        #: stop the work.
        self.stopped_at = 0
        #: The kinds of the events recorded in this transaction (flushed or not).
        self.kinds: set[str] = set()
        self._events: list[tuple[str, str, int, str]] = []
        self._announced: list[Event] = []  # telemetry events, emitted after the commit (D10.3)
        self._after_commit: list[Callable[[], None]] = []
        self._writes: list[tuple[Hashable, str, tuple[Any, ...]]] = []
        # The rows the deferred writes touch: where in _writes each one's last write is.
        self._written: dict[Hashable, int] = {}
        self._tallies: dict[tuple[str, str, str], int] = {}
        self.held: dict[Any, Any] = {}
        #: The earliest due instant of the timers this transaction set (``None``: it set none).
        self.timers_set_min: int | None = None
        # Write marks (see rows_unchanged): a serial per write, the last one per deferred row
        # and per table written by a statement.
        self._serial = 0
        self._row_marks: dict[Hashable, int] = {}
        self._table_marks: dict[str, int] = {}

    async def execute(self, sql: str, *args: Any) -> int:
        await self.flush_writes()
        self._mark_table(sql)
        return await self._execute(sql, *args)

    def _mark_table(self, sql: str) -> None:
        self._serial += 1
        self._table_marks[_written_table(sql)] = self._serial

    def write_mark(self) -> int:
        """A mark of this transaction's writes so far, for :meth:`rows_unchanged`."""
        return self._serial

    def rows_unchanged(self, mark: int, key: Hashable, table: str) -> bool:
        """Whether nothing written since ``mark`` may have changed the row ``key`` of ``table``:
        no deferred write of that row, no statement writing that table (or one whose table is
        not known): a row read at ``mark`` still holds."""
        return (
            self._row_marks.get(key, -1) <= mark
            and self._table_marks.get(table, -1) <= mark
            and self._table_marks.get("*", -1) <= mark
        )

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        await self.flush_writes()
        return await self._fetch(sql, *args)

    async def fetchone(self, sql: str, *args: Any) -> dict[str, Any] | None:
        rows = await self.fetch(sql, *args)
        return rows[0] if rows else None

    async def _execute(self, sql: str, *args: Any) -> int:
        raise NotImplementedError

    async def _fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    # Deferred writes -----------------------------------------------------------------------
    #
    # A turn of an engine writes the same few statements for each of many rows (one UPDATE per
    # token, one INSERT per new token...). Sent one by one, each is a round trip to PostgreSQL;
    # deferred, the writes of one statement go together as one ``executemany`` (pipelined by
    # asyncpg, one call into SQLite). What keeps this exact: a deferred write names the one row
    # it touches (``key``); every other statement sends the deferred writes first, in order;
    # only a read of one row by its key (:meth:`fetch_row`) may pass writes of other rows; and
    # writes are regrouped by statement only when no row's writes would change order.

    def defer(self, key: Hashable, sql: str, *args: Any) -> None:
        """Write later (before the next statement that may see it, and before the commit):
        ``sql`` changes only the row ``key`` names, and nobody reads its row count."""
        self._written[key] = len(self._writes)
        self._writes.append((key, sql, args))
        self._serial += 1
        self._row_marks[key] = self._serial

    def rewrite(self, key: Hashable, mark: int, sql: str, *args: Any) -> bool:
        """Replace the deferred write of the row ``key`` made just before ``mark`` (its
        :meth:`write_mark`) by ``sql`` with ``args``, which stands for that write and a change
        of the same row after it: one write instead of two, the same row at the commit. Done
        only while that write is not sent yet and nothing written since may have changed the
        row (:meth:`rows_unchanged`); ``False`` (nothing done) otherwise."""
        at = self._written.get(key)
        if at is None or self._row_marks.get(key) != mark:
            return False
        if not self.rows_unchanged(mark, key, _written_table(sql)):
            return False
        self._writes[at] = (key, sql, args)
        self._serial += 1
        self._row_marks[key] = self._serial
        return True

    async def fetch_row(self, key: Hashable, sql: str, *args: Any) -> dict[str, Any] | None:
        """Read the one row ``key`` names (``sql`` reads nothing else), sending first only the
        deferred writes if one of them touches that row."""
        if key in self._written:
            await self.flush_writes()
        rows = await self._fetch(sql, *args)
        return rows[0] if rows else None

    async def fetch_rows(
        self, keys: Iterable[Hashable], sql: str, *args: Any
    ) -> list[dict[str, Any]]:
        """Read the rows ``keys`` name (``sql`` reads nothing else), sending first the deferred
        writes only if one of them touches one of those rows: a turn reading the rows of its
        next outcomes leaves the INSERTs of the tokens it made unsent (D6.36)."""
        written = self._written
        if any(key in written for key in keys):
            await self.flush_writes()
        return await self._fetch(sql, *args)

    async def flush_writes(self) -> None:
        """Send the deferred writes: grouped by statement when that keeps every row's writes
        in their order, else in runs of one statement as they came."""
        if not self._writes:
            return
        writes, self._writes = self._writes, []
        self._written.clear()
        groups: dict[str, list[tuple[Any, ...]]] = {}
        order: dict[str, int] = {}
        last: dict[Hashable, int] = {}  # a row's latest group: its writes must not go back
        regroup = True
        for key, sql, args in writes:
            g = order.setdefault(sql, len(order))
            if last.get(key, g) > g:
                regroup = False
                break
            last[key] = g
            groups.setdefault(sql, []).append(args)
        if not regroup:
            groups = {}
            runs: list[tuple[str, list[tuple[Any, ...]]]] = []
            for _, sql, args in writes:
                if runs and runs[-1][0] == sql:
                    runs[-1][1].append(args)
                else:
                    runs.append((sql, [args]))
            for sql, rows in runs:
                await self._write_rows(sql, rows)
            return
        for sql, rows in groups.items():
            await self._write_rows(sql, rows)

    async def _write_rows(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if len(rows) == 1:
            await self._execute(sql, *rows[0])
        else:
            await self._execute_many(sql, rows)

    # Durable timers -----------------------------------------------------------------------

    async def set_timer(
        self, key: str, kind: str, stream: str, due_ms: int, priority: int = 0
    ) -> None:
        if self.timers_set_min is None or due_ms < self.timers_set_min:
            self.timers_set_min = due_ms
        # Deferred (a timer's row is its key's alone): a turn's timers go as one batch.
        self.defer(
            ("timer", key),
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
        self.defer(("timer", key), "DELETE FROM tb_timers WHERE key = ?", key)

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
        """Record an event; written with the transaction's other events at commit, in order,
        and then (only if the commit succeeded) emitted to the telemetry listeners."""
        self._events.append((stream, kind, at_ms, dumps(data)))
        self.kinds.add(kind)
        if enabled():
            self._announced.append(_durable.workflow_event(stream, kind, at_ms, data))

    def announce(self, event: Event) -> None:
        """Emit ``event`` to the telemetry listeners once this transaction has committed."""
        self._announced.append(event)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once this transaction has committed (never if it rolls back): for
        news that a reader of committed state must be able to see when it hears it."""
        self._after_commit.append(callback)

    def committed(self) -> None:
        """Called by the backend after the commit returned: emit what was announced, then run
        the after-commit callbacks. A rolled-back transaction never calls it, so its events are
        heard by nobody (D10.3)."""
        if self._announced:
            events, self._announced = self._announced, []
            _durable.emit_committed(events)
        callbacks, self._after_commit = self._after_commit, []
        for callback in callbacks:
            callback()

    def tally(self, name: str, a: str, b: str = "", n: int = 1) -> None:
        """Add ``n`` to the stored tally ``(name, a, b)`` when this transaction commits (D8.12:
        ``_store/_tally.py``)."""
        key = (name, a, b)
        self._tallies[key] = self._tallies.get(key, 0) + n

    async def flush_events(self) -> None:
        """Write the deferred writes, the recorded events and the tallies (backends call this
        just before committing)."""
        await self.flush_writes()
        if self._events:
            events, self._events = self._events, []
            await self._execute_many(
                "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)", events
            )
        if self._tallies:
            tallies, self._tallies = self._tallies, {}
            await flush_tallies(self, tallies)

    async def execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        await self.flush_writes()
        self._mark_table(sql)
        await self._execute_many(sql, rows)

    async def _execute_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        for row in rows:
            await self._execute(sql, *row)

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
    #: How many write transactions this store object has committed (an engine's loop tells
    #: from it whether anything but its own turn wrote since its last turn).
    commits = 0

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

    async def listen(
        self,
        callback: Callable[[], None],
        *,
        on_stop: Callable[[int, list[str]], None] | None = None,
        session_key: int | None = None,
        on_news: Callable[[], None] | None = None,
    ) -> None:
        """Call ``callback`` when another process commits a ``wake_others`` transaction (or
        ``on_news``, if given, when that transaction is :attr:`Tx.news_only`), and
        ``on_stop(stopped_at_ms, ids)`` when one commits a transaction that stopped work rows
        (:attr:`Tx.stopped`). ``session_key``: hold a session lock under that key while this
        process is connected (see :meth:`session_alive`), taken again after a reconnect."""

    async def session_alive(self, tx: Tx, key: int) -> bool:
        """Whether some process holds the session lock ``key`` (its connection is alive)."""
        return True

    def session_since(self) -> int | None:
        """Since when (epoch ms) this process holds its session lock; ``None`` if it does not."""
        return None

    async def unlisten(self) -> None:
        """Stop calling the :meth:`listen` callback."""

    def lock_clause(self) -> str:
        """The row-lock clause that serialises changes of one row across processes."""
        return ""

    def skip_locked(self, of: str | None = None) -> str:
        """The row-lock clause for claiming work (PostgreSQL: ``FOR UPDATE SKIP LOCKED``);
        ``of`` names the table alias to lock in a join."""
        return ""


def apply_migrations_sql(dialect: str, current: int) -> Sequence[tuple[int, list[str]]]:
    """The statements still to run above ``current``, by version."""
    from ._migrations import MIGRATIONS, render

    return [(v, [render(s, dialect) for s in stmts]) for v, stmts in MIGRATIONS if v > current]
