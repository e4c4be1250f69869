"""The engine's reads: runs, tokens, events and counts from committed state.

Reads go through :meth:`Store.read` (a WAL reader on SQLite, a read-only snapshot on
PostgreSQL), never behind the engine's lock and waking nothing, so the host's pages and event
streams neither queue behind the worker loop's turns nor cause extra turns.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any, TypeVar

from .._core import _clock
from .._core._renamed import Renamed, renamed
from .._store import Store, Tx
from .._store._tally import read_off_loop, read_tallies
from ._machine import Machine
from ._metrics import TimeoutTallies, read_timeout_tallies
from ._workers import unrunnable_tokens

__all__ = ["RunReads"]


_F = TypeVar("_F", bound=Callable[..., Any])


def _as_engine(func: _F) -> _F:
    """Name ``func`` as users call it (``Engine.list_runs``), so that the warnings for its old
    keywords (D1.12) name the public class, not this part of it."""
    func.__qualname__ = f"Engine.{func.__name__}"
    return func


class RunReads:
    """What :class:`~timebound.workflow.Engine` answers about runs (a part of it).

    The engine provides ``_machine``, ``_store`` and ``_read()``, a read transaction of
    committed state.
    """

    _machine: Machine
    _store: Store

    def _read(self) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def get_run(self, run_id: str) -> dict[str, Any]:
        """The run's row, its input and state decoded; ``KeyError`` if there is no such run."""
        async with self._read() as tx:
            return await _run_row(self._machine, tx, run_id)

    async def tokens(self, run_id: str) -> list[dict[str, Any]]:
        """The run's tokens in creation order, their state and output decoded."""
        async with self._read() as tx:
            return await _token_rows(tx, run_id)

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's events in order."""
        async with self._read() as tx:
            return await tx.events(run_id)

    async def snapshot(
        self, run_id: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """The run, its tokens and its events, read from one snapshot (one transaction instead
        of three, and never a token newer than its run); ``KeyError`` if there is no such run."""
        async with self._read() as tx:
            run = await _run_row(self._machine, tx, run_id)
            return run, await _token_rows(tx, run_id), await tx.events(run_id)

    @renamed(
        since_ms=Renamed("since", _clock.datetime_of_ms, "an aware datetime"),
        until_ms=Renamed("until", _clock.datetime_of_ms, "an aware datetime"),
    )
    @_as_engine
    async def list_runs(
        self,
        *,
        status: str | None = None,
        definition_id: str | None = None,
        after: tuple[int, str] | None = None,
        limit: int = 50,
        bound: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        id_prefix: str | None = None,
        input_field: tuple[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Runs newest first (without input and state); ``after`` is the ``(started_at, id)`` of
        the last run of the previous page, so pages stay stable while runs are added.

        ``bound``: runs where a bound of that layer (``workflow``, ``node``,
        ``synchronization``, or ``any``; ``execution`` is the deprecated name of ``node``,
        D2.7) fired for good, whatever the run's status (a node timeout ends the run
        ``failed``); ``since``/``until`` (aware ``datetime``; naive is UTC): started in
        ``[since, until)``; ``id_prefix``: the run id starts so; ``input_field``: the input has
        the top-level field with that JSON value."""
        where: list[str] = ["1 = 1"]
        args: list[Any] = []
        if bound == "execution":
            warnings.warn(
                "list_runs(bound='execution') is deprecated; the node layer is named 'node'",
                DeprecationWarning,
                stacklevel=2,
            )
            bound = "node"
        if bound is not None:
            layer = "" if bound == "any" else f'%"timeout_type": {json.dumps(bound)}%'
            where.append(
                "EXISTS (SELECT 1 FROM tb_events e WHERE e.stream = tb_wf_runs.id "
                "AND e.kind IN ('token_timed_out', 'join_timed_out') "
                'AND e.data NOT LIKE \'%"policy_applied": "retry"%\''
                + (" AND e.data LIKE ?)" if layer else ")")
            )
            if layer:
                args.append(layer)
        if since is not None:
            where.append("started_at >= ?")
            args.append(_clock.ms_of(since))
        if until is not None:
            where.append("started_at < ?")
            args.append(_clock.ms_of(until))
        if id_prefix:
            where.append("id LIKE ? ESCAPE '!'")
            args.append(_like(id_prefix) + "%")
        if input_field is not None:
            key, value = input_field
            where.append("input LIKE ? ESCAPE '!'")
            args.append("%" + _like(f"{json.dumps(key)}: {json.dumps(value)}") + "%")
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if definition_id is not None:
            where.append("definition_id = ?")
            args.append(definition_id)
        if after is not None:
            where.append("(started_at < ? OR (started_at = ? AND id < ?))")
            args += [after[0], after[0], after[1]]
        async with self._read() as tx:
            return await tx.fetch(
                "SELECT id, definition_id, definition_version, status, started_at, timeout_at, "
                f"finished_at, error FROM tb_wf_runs WHERE {' AND '.join(where)} "
                "ORDER BY started_at DESC, id DESC LIMIT ?",
                *args,
                limit,
            )

    async def waits(self, run_id: str) -> dict[str, str]:
        """What the run's tokens wait on, by token id: a child run's id or a deferred
        operation's (``child_run_id``); child runs are those whose parent is the token."""
        async with self._read() as tx:
            rows = await tx.fetch(
                "SELECT id, child_run_id FROM tb_wf_tokens WHERE run_id = ? "
                "AND child_run_id IS NOT NULL",
                run_id,
            )
        return {r["id"]: r["child_run_id"] for r in rows}

    async def next_timer(self, run_id: str) -> dict[str, Any] | None:
        """The run's next durable timer (``key``, ``kind``: run, token or join, ``due_ms``), as
        stored: what will fire next unless something else happens first."""
        async with self._read() as tx:
            return await tx.fetchone(
                "SELECT key, kind, due_ms FROM tb_timers WHERE stream = ? "
                "ORDER BY due_ms, priority LIMIT 1",
                run_id,
            )

    async def waiting_on(self, ref: str) -> list[dict[str, Any]]:
        """The tokens waiting on ``ref`` (a deferred operation's id or a child run's): their
        run, token and node, for the link back from the operation to the node."""
        async with self._read() as tx:
            return await tx.fetch(
                "SELECT run_id, id AS token_id, node_id, status FROM tb_wf_tokens "
                "WHERE child_run_id = ? ORDER BY seq",
                ref,
            )

    async def counts(self) -> dict[str, dict[str, int]]:
        """How many runs and tokens are in each state (for metrics), counted off the event
        loop (D8.12)."""
        runs, tokens = await read_off_loop(
            self._store,
            (
                "SELECT status, COUNT(*) AS n FROM tb_wf_runs GROUP BY status",
                "SELECT status, COUNT(*) AS n FROM tb_wf_tokens GROUP BY status",
            ),
        )
        return {
            "runs": {r["status"]: int(r["n"]) for r in runs},
            "tokens": {r["status"]: int(r["n"]) for r in tokens},
        }

    async def timeout_tallies(self) -> TimeoutTallies:
        """Every timeout the store recorded (workflow, node and synchronization layers): counts
        by layer and policy, and detection lag by layer, from the store's tallies (D8.12)."""
        return await read_timeout_tallies(self._store)

    async def stop_tallies(self) -> dict[str, dict[tuple[str, str], int]]:
        """How stopped attempts stopped (D6.14), counted as each is recorded (D8.12): by how the
        worker learnt of the stop (``via``), the stop lag's bucket and its sum in ms."""
        return await read_tallies(self._store, "wf_stops", "wf_stop_ms_sum")

    async def unrunnable(self) -> list[dict[str, Any]]:
        """Ready tokens that no live worker can run (their handler is nobody's, D6.15): token
        and run ids, node and handler. Always empty on a one-process store."""
        if not self._store.shared:
            return []
        async with self._read() as tx:
            return await unrunnable_tokens(tx, _clock.wall_ms())


def _like(text: str) -> str:
    """``text`` matched literally by LIKE ... ESCAPE '!'."""
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


async def _run_row(machine: Machine, tx: Tx, run_id: str) -> dict[str, Any]:
    run = await machine.run(tx, run_id)
    if run is None:
        raise KeyError(f"no workflow run {run_id!r}")
    for key in ("input", "state"):
        run[key] = json.loads(run[key])
    # The bound that sets the run's deadline (D6.17): {set_by, duration_ms, deadline_at}.
    bound = run.get("timeout_bound")
    run["timeout_bound"] = None if bound is None else json.loads(bound)
    return run


_TOKEN_FIELDS = (
    "id",
    "node_id",
    "status",
    "branch_index",
    "retry_count",
    "attempt",
    "timeout_at",
    "error",
    "child_run_id",
)


async def _token_rows(tx: Tx, run_id: str) -> list[dict[str, Any]]:
    rows = await tx.fetch("SELECT * FROM tb_wf_tokens WHERE run_id = ? ORDER BY seq", run_id)
    out = []
    for row in rows:
        item = {k: row[k] for k in _TOKEN_FIELDS}
        item["state_data"] = json.loads(row["state_data"])
        item["output"] = None if row["output"] is None else json.loads(row["output"])
        out.append(item)
    return out
