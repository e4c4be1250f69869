"""Worker processes on one shared store: what each can run, which are alive, and which of this
worker's attempts were stopped by another process (D6.14, D6.15, D6.16).

A worker registers a row (its handlers, its version, a heartbeat) and, on its store's listening
connection, holds a session lock under a key of its own for as long as the process lives. A
survivor that finds a worker's lock free *and* its heartbeat stale knows the process is gone
(killed, crashed, its machine lost) and re-dispatches its tokens at once instead of waiting for
their leases. Both conditions, so that neither a slow process (its lock is held) nor a dropped
connection that is being re-opened (it still heartbeats) is taken for dead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from .._store import Store, Tx
from .._version import __version__
from ._definition import Definition, parse_definition
from ._metrics import tally_stop
from ._schedule import made_pending

__all__ = [
    "InFlight",
    "Presence",
    "backfill_needs",
    "housekeeping",
    "node_needs",
    "requeue",
    "store_node_needs",
    "unrunnable_tokens",
]

_log = logging.getLogger("timebound.workflow")
#: How often a worker looks for ready tokens no live worker can run.
UNRUNNABLE_EVERY_MS = 2_000
#: A worker that beat this recently counts as live for what it can run.
LIVE_MS = 10_000

# The kinds whose implementation names a handler of the worker's process.
_HANDLER_KINDS = ("python", "deferred", "http_request")


def node_needs(definition: Definition) -> dict[str, str | None]:
    """The handler each node needs from the worker that runs it (``None``: any worker)."""
    needs: dict[str, str | None] = {}
    for node_id, node in definition.nodes.items():
        action = definition.actions[node.action_id]
        handler = action.implementation.get("handler")
        ok = action.kind in _HANDLER_KINDS and isinstance(handler, str)
        needs[node_id] = handler if ok else None
    return needs


async def store_node_needs(tx: Tx, definition: Definition) -> None:
    """Record what the nodes of a stored definition need (once per (id, version))."""
    for node_id, handler in sorted(node_needs(definition).items()):
        await tx.execute(
            "INSERT INTO tb_wf_node_needs (definition_id, version, node_id, handler) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (definition_id, version, node_id) DO NOTHING",
            definition.id,
            definition.version,
            node_id,
            handler,
        )


class Presence:
    """This worker's row in ``tb_wf_workers`` and what it learns from the others'."""

    def __init__(self, store: Store, worker_id: str, handlers: Iterable[str], sweep_ms: int):
        self._store = store
        self.worker_id = worker_id
        self.actions = sorted(handlers)
        # A worker whose session lock is free is dead once its heartbeat is this old: long
        # enough for a live one to re-open a dropped connection and beat again.
        self.dead_after_ms = max(2 * sweep_ms, 1_000)
        self.lock_key = random.SystemRandom().randrange(1, 2**31)
        self._flagged: set[str] = set()  # tokens reported as runnable by no live worker
        self._unrunnable_at = 0  # the next look for them (every few seconds: a scan)
        self._needs: dict[tuple[str, int], dict[str, str | None]] = {}

    def needs(self, definition: Definition) -> dict[str, str | None]:
        """:func:`node_needs` of a definition, worked out once per (id, version)."""
        key = (definition.id, definition.version)
        found = self._needs.get(key)
        if found is None:
            found = self._needs[key] = node_needs(definition)
        return found

    def claim_filter(self) -> tuple[str, list[Any]]:
        """The claim's condition on a node's need (alias ``n``): only what this worker runs."""
        if not self.actions:
            return "n.handler IS NULL", []
        marks = ", ".join("?" for _ in self.actions)
        return f"(n.handler IS NULL OR n.handler IN ({marks}))", list(self.actions)

    async def register(self, tx: Tx, now: int) -> None:
        await tx.execute(
            "INSERT INTO tb_wf_workers (id, actions, version, started_ms, heartbeat_ms, lock_key) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "heartbeat_ms = excluded.heartbeat_ms, lock_key = excluded.lock_key",
            self.worker_id,
            json.dumps(self.actions),
            __version__,
            now,
            now,
            self.lock_key,
        )

    async def unregister(self, tx: Tx) -> None:
        await tx.execute("DELETE FROM tb_wf_workers WHERE id = ?", self.worker_id)

    async def heartbeat(self, tx: Tx, now: int) -> None:
        changed = await tx.execute(
            "UPDATE tb_wf_workers SET heartbeat_ms = ? WHERE id = ?", now, self.worker_id
        )
        if not changed:  # taken for dead while cut off (and its tokens re-dispatched): back
            await self.register(tx, now)

    async def dead_workers(self, tx: Tx, now: int) -> list[str]:
        """Workers whose process is gone (their rows are removed); only judged once this
        worker has held its own session lock long enough for the others to have re-taken
        theirs after the server restarted."""
        since = self._store.session_since()
        if since is None or now - since < self.dead_after_ms:
            return []
        dead = []
        for row in await tx.fetch(
            "SELECT id, lock_key FROM tb_wf_workers WHERE id <> ? AND heartbeat_ms < ?",
            self.worker_id,
            now - self.dead_after_ms,
        ):
            if row["lock_key"] is not None and await self._store.session_alive(tx, row["lock_key"]):
                continue
            await tx.execute(
                "DELETE FROM tb_wf_workers WHERE id = ? AND heartbeat_ms < ?",
                row["id"],
                now - self.dead_after_ms,
            )
            dead.append(row["id"])
        return dead

    async def lost(self, tx: Tx, attempts: Mapping[str, int]) -> dict[str, int]:
        """This worker's attempts (token id → attempt) that are no longer its own: ended,
        re-dispatched or taken over elsewhere; each with the instant its row last changed."""
        if not attempts:
            return {}
        ids = sorted(attempts)
        marks = ", ".join("?" for _ in ids)
        rows = {
            r["id"]: r
            for r in await tx.fetch(
                "SELECT id, status, lease_owner, attempt, updated_at FROM tb_wf_tokens "
                f"WHERE id IN ({marks})",
                *ids,
            )
        }
        out = {}
        for token_id, attempt in attempts.items():
            row = rows.get(token_id)
            mine = (
                row is not None
                and row["status"] in ("dispatched", "executing")
                and row["lease_owner"] == self.worker_id
                and row["attempt"] == attempt
            )
            if not mine:
                out[token_id] = 0 if row is None else int(row["updated_at"])
        return out

    async def unrunnable(self, tx: Tx, now: int) -> list[dict[str, Any]]:
        """Ready tokens that no live worker can run (their handler is nobody's), each reported
        once by a ``token_unrunnable`` event; they stay pending, and still time out."""
        if now < self._unrunnable_at:
            return []
        self._unrunnable_at = now + UNRUNNABLE_EVERY_MS
        rows = await unrunnable_tokens(tx, now)
        new = [r for r in rows if r["id"] not in self._flagged]
        for r in new:
            seen = await tx.fetchone(
                "SELECT 1 AS seen FROM tb_events WHERE stream = ? AND kind = 'token_unrunnable' "
                "AND data LIKE ?",
                r["run_id"],
                f'%"token_id": "{r["id"]}"%',
            )
            self._flagged.add(r["id"])
            if seen is None:
                await tx.append_event(
                    r["run_id"],
                    "token_unrunnable",
                    now,
                    token_id=r["id"],
                    node_id=r["node_id"],
                    handler=r["handler"],
                )
        if len(self._flagged) > 10_000:
            self._flagged.clear()
        return rows


async def unrunnable_tokens(tx: Tx, now: int) -> list[dict[str, Any]]:
    """Ready tokens whose handler no live worker (one that beat in the last
    :data:`LIVE_MS`) has: token id, run id, node id, handler (at most 1000)."""
    live: set[str] = set()
    for row in await tx.fetch(
        "SELECT actions FROM tb_wf_workers WHERE heartbeat_ms >= ?", now - LIVE_MS
    ):
        live.update(json.loads(row["actions"]))
    filter_sql, args = "n.handler IS NOT NULL", []
    if live:
        filter_sql += f" AND n.handler NOT IN ({', '.join('?' for _ in live)})"
        args = sorted(live)
    return await tx.fetch(
        "SELECT t.id, t.run_id, t.node_id, n.handler FROM tb_wf_tokens t "
        "JOIN tb_wf_runs r ON r.id = t.run_id JOIN tb_wf_node_needs n ON "
        "n.definition_id = r.definition_id AND n.version = r.definition_version "
        f"AND n.node_id = t.node_id WHERE t.status = 'pending' AND t.not_before <= ? "
        f"AND {filter_sql} ORDER BY t.not_before, t.seq LIMIT 1000",
        now,
        *args,
    )


class InFlight:
    """This worker's attempts in flight (token id → task), and how each stopped one was
    stopped: here (``local``), by another process's NOTIFY (``notify``) or found by the sweep
    (``sweep``), with the time from the state's flip to the handler's end (D6.14)."""

    def __init__(self, now: Callable[[], int], wake: Callable[[], None], *, record: bool) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._now, self._wake, self._record = now, wake, record
        #: Tokens another process says it stopped (token id → the instant it flipped them),
        #: to check against the store before cancelling: the NOTIFY names the token, not the
        #: attempt, and this worker may have claimed the token again since.
        self.suspects: dict[str, int] = {}
        self._running: dict[str, tuple[int, int, str]] = {}  # attempt, began at, run id
        self._stopping: dict[str, tuple[int, str]] = {}  # flipped at, how
        #: Stopped attempts not yet recorded (``record``: a shared store's sweep records them):
        #: run id, token id, time to stop (ms), how.
        self.stops: list[tuple[str, str, int, str]] = []

    def add(self, token_id: str, task: asyncio.Task[None], attempt: int, run_id: str) -> None:
        self.tasks[token_id] = task
        self._running[token_id] = (attempt, self._now(), run_id)

    def attempts(self) -> dict[str, int]:
        """Token id → attempt number of each attempt in flight."""
        return {t: r[0] for t, r in self._running.items() if t in self.tasks}

    def stop(self, token_id: str, flipped_at: int, how: str) -> None:
        """Cancel the attempt of a token stopped at ``flipped_at``, if it runs here."""
        task = self.tasks.get(token_id)
        if task is None or task is asyncio.current_task():
            return
        self._stopping.setdefault(token_id, (flipped_at, how))
        task.cancel()

    def on_stop(self, flipped_at: int, token_ids: list[str]) -> None:
        """Another process stopped these tokens (its NOTIFY): the loop checks those that run
        here (:meth:`check_suspects`) at once."""
        found = False
        for token_id in token_ids:
            if token_id in self.tasks:
                self.suspects.setdefault(token_id, flipped_at)
                found = True
        if found:
            self._wake()

    async def check_suspects(self, tx: Tx, presence: Presence) -> None:
        """Cancel the suspects' attempts that are no longer this worker's in the store."""
        suspects, self.suspects = self.suspects, {}
        attempts = {t: a for t, a in self.attempts().items() if t in suspects}
        for token_id in await presence.lost(tx, attempts):
            self.stop(token_id, suspects[token_id], "notify")

    def reported(self, token_ids: Iterable[str]) -> None:
        """These tokens' attempts reported their outcomes: those whose task has ended free
        their place now, before their tasks' done callbacks run (a turn that stores the
        outcomes of every attempt in flight may then begin the tokens they made at once)."""
        for token_id in token_ids:
            task = self.tasks.get(token_id)
            if task is not None and task.done():
                self.done(token_id, task)

    def done(self, token_id: str, task: asyncio.Task[None]) -> bool:
        """The attempt's task ended: forget it; whether it was still held (not yet freed by
        :meth:`reported`)."""
        if self.tasks.get(token_id) is not task:
            return False
        del self.tasks[token_id]
        running = self._running.pop(token_id, None)
        stopped = self._stopping.pop(token_id, None)
        if self._record and stopped is not None and running is not None and task.cancelled():
            self.stops.append((running[2], token_id, self._now() - stopped[0], stopped[1]))
        return True

    def clear(self) -> None:
        self.tasks.clear()
        self._running.clear()
        self._stopping.clear()


async def housekeeping(
    tx: Tx,
    now: int,
    presence: Presence,
    inflight: InFlight,
    requeue: Callable[..., Awaitable[None]],
    skip_locked: str,
) -> None:
    """A shared store's sweep: heartbeat, re-dispatch dead workers' tokens, cancel the attempts
    that are no longer this worker's (the NOTIFY's fallback), report the tokens no live worker
    can run, record the time each stopped attempt took to stop."""
    await presence.heartbeat(tx, now)
    for dead in await presence.dead_workers(tx, now):
        _log.warning("workflow worker %s is gone: re-dispatching its tokens", dead)
        where = "lease_owner = ? AND status IN ('dispatched', 'executing')"
        await requeue(tx, where, dead, lock=skip_locked, reason="worker_died")
    for token_id, changed_at in (await presence.lost(tx, inflight.attempts())).items():
        inflight.stop(token_id, changed_at or now, "sweep")
    await presence.unrunnable(tx, now)
    stops, inflight.stops = inflight.stops, []
    for run_id, token_id, lag, how in stops:
        await tx.append_event(
            run_id, "attempt_stopped", now, token_id=token_id, via=how, stop_lag_ms=lag
        )
        tally_stop(tx, how, lag)


async def requeue(
    tx: Tx, now: int, where: str, *args: Any, lock: str = "", reason: str = "released"
) -> None:
    """Put in-flight tokens back to ``pending``, keeping their deadline (``resume``); the
    attempt that resumes counts in the token's ``reruns`` (Machine.begin_attempt), so a re-run of
    an attempt cut short spends no retry (D6.16). ``reason``: released, lease_expired or
    worker_died.

    ``lock`` (PostgreSQL's ``FOR UPDATE SKIP LOCKED``) for tokens of other workers (D6.13): a
    lease renewed after the read would otherwise be overwritten, and the token run twice.
    """
    for tok in await tx.fetch(
        f"SELECT * FROM tb_wf_tokens WHERE child_run_id IS NULL AND {where}{lock}", *args
    ):
        data = json.loads(tok["state_data"])
        data["resume"] = tok["status"] == "executing"  # counted in ``reruns`` when it begins
        await tx.execute(
            "UPDATE tb_wf_tokens SET status = 'pending', lease_owner = NULL, not_before = ?, "
            "state_data = ?, updated_at = ? WHERE id = ?",
            now,
            json.dumps(data),
            now,
            tok["id"],
        )
        made_pending(tx, now)
        await tx.append_event(
            tok["run_id"],
            "token_redispatched",
            now,
            token_id=tok["id"],
            node_id=tok["node_id"],
            previous_owner=tok["lease_owner"],
            reason=reason,
        )


async def backfill_needs(tx: Tx) -> None:
    """Record the node needs of definitions stored before they were recorded."""
    for row in await tx.fetch(
        "SELECT id, version, body FROM tb_wf_definitions d WHERE NOT EXISTS (SELECT 1 FROM "
        "tb_wf_node_needs n WHERE n.definition_id = d.id AND n.version = d.version)"
    ):
        await store_node_needs(tx, parse_definition(json.loads(row["body"])))
