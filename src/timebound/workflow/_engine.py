"""The workflow engine: public API, the worker loop, durable timers and action attempts (its
reads of runs, tokens and events are in :mod:`._reads`).

One loop per engine. Each turn it fires the timers that are due (read from storage, so a restart
re-arms them, D6.6), claims ready tokens and starts their attempts, then sleeps until the next
stored deadline — never a polling interval: the wake-up is that deadline itself (plus a hair, so
the floored epoch-ms reading has reached it), and any local change wakes the loop at once. On a
shared store (PostgreSQL) a periodic sweep also catches other workers' changes.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import socket
import types
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

from .._core import _clock
from .._core._breakdown import BREAKDOWN_MAX_NODES, summarised
from .._core._deadline import Deadline
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from .._core._scopes import fail_after
from .._json import TooDeep
from .._json import check as check_json
from .._store import Store, Tx, open_store, wake_delay
from ..telemetry import correlation
from ..telemetry._tracing import attempt_span, caller_traceparent
from ._actions import CUT_BREAKDOWN, ActionContext, Outcome, freeze, handlers, run_python
from ._bounds import call_key
from ._deferral import Deferrals, plan_attempt
from ._definition import Definition, DefinitionConflict, DefinitionError, parse_definition
from ._faults import RunFault, attribute, isolate
from ._machine import Machine
from ._operator import Operator, OperatorActions, ms_of
from ._reads import RunReads
from ._retention import Retention
from ._rows import RUN_TERMINAL, RunResult
from ._starts import (
    Start,
    StartConflict,
    await_start,
    check_run_id,
    keyed_run,
    request_digest,
    settle_from,
    start_deadline,
    start_keyed,
)
from ._workers import (
    InFlight,
    Presence,
    backfill_needs,
    housekeeping,
    requeue,
    store_node_needs,
)

__all__ = ["Engine", "RunResult", "store_definition"]


class _Report(NamedTuple):
    """An attempt's outcome, waiting for the loop's next transaction."""

    run_id: str
    token_id: str
    attempt: int
    outcome: Outcome
    deadline_ms: int | None = None  # the deadline the attempt began with


#: An attempt to start: token id, action kind, implementation, context.
_Plan = tuple[str, str, Mapping[str, Any], ActionContext]

_log = logging.getLogger("timebound.workflow")
_RUN_ENDS = frozenset(f"run_{status}" for status in RUN_TERMINAL)
#: How long one turn may spend storing outcomes before it commits (D6.24).
_TURN_SLICE_S = 0.01


async def store_definition(tx: Tx, definition: Definition) -> str | None:
    """Store a definition's body under its (id, version) unless stored; an error message if the
    store holds another body there.

    Runs keep the version they started with, read back from the store after a restart or on
    another worker, so one (id, version) must never name two bodies.
    """
    body = json.dumps(definition.raw, sort_keys=True)
    await tx.execute(
        "INSERT INTO tb_wf_definitions (id, version, body) VALUES (?, ?, ?) "
        "ON CONFLICT (id, version) DO NOTHING",
        definition.id,
        definition.version,
        body,
    )
    row = await tx.fetchone(
        "SELECT body FROM tb_wf_definitions WHERE id = ? AND version = ?",
        definition.id,
        definition.version,
    )
    if row is not None and json.loads(row["body"]) == definition.raw:
        await store_node_needs(tx, definition)  # which workers can run its nodes (D6.15)
    if row is not None and json.loads(row["body"]) != definition.raw:
        return (
            f"definition {definition.id!r} version {definition.version} is already stored "
            "with a different body; give the new one a higher version"
        )
    return None


class Engine(RunReads, OperatorActions):
    """A durable workflow engine on one store (``sqlite:///FILE`` or ``postgresql://…``)."""

    def __init__(
        self,
        db: str = "sqlite:///timebound-workflows.db",
        actions: Mapping[str, Callable[..., Any]] | types.ModuleType | None = None,
        *,
        concurrency: int = 64,
        lease_ms: int = 30_000,
        sweep_ms: int = 1_000,
        lease: Duration | None = None,
        worker_id: str | None = None,
        deferred_policy: Any = None,
        deferred_connectors: Mapping[str, Any] | None = None,
        worker: bool = True,
        retain: Duration | None = None,
        max_extension: Duration = 86_400.0,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1", option="concurrency")
        if lease is not None:  # D6.16: the fallback for a worker that is slow, not dead
            seconds = to_seconds(lease, option="lease", allow_zero=False)
            if not math.isfinite(seconds):
                raise ConfigurationError("lease must be a finite duration", option="lease")
            lease_ms = math.ceil(seconds * 1000)
        if lease_ms < 1 or sweep_ms < 1:
            raise ConfigurationError("lease_ms and sweep_ms must be >= 1", option="lease_ms")
        self._store: Store = open_store(db)
        if not worker and not self._store.shared:
            # Nothing else may write a one-process store (D6): without our loop, no one would.
            raise ConfigurationError(
                "worker=False needs a shared store (postgresql://…) that worker processes serve",
                option="worker",
            )
        # D8.13: runs that ended more than ``retain`` ago are pruned (None: kept for ever).
        self._retention = None if retain is None else Retention(self._store, retain, self._now)
        # Without the worker loop the engine starts, reads and cancels runs; other processes
        # (``timebound worker``) dispatch them.
        self._worker = worker
        self._handlers = handlers(actions)
        self._concurrency = concurrency
        self._lease_ms = lease_ms
        self._sweep_ms = sweep_ms
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._definitions: dict[tuple[str, int], Definition] = {}
        self._latest: dict[str, int] = {}
        self._machine = Machine(self._definitions, self._cancel_attempt, self._run_finished)
        cap = to_seconds(max_extension, option="max_extension")
        # The operator's actions (D6.25-D6.28); max_extension caps a run's extensions together.
        self._operator = Operator(self._machine, self._store.lock_clause, ms_of(cap))
        self._open = False
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._inflight = InFlight(self._now, self._wake.set, record=self._store.shared)
        self._attempts = self._inflight.tasks
        self._tx: Tx | None = None  # the transaction in progress (one at a time: _lock)
        self._reporting: set[str] = set()  # tokens whose own outcome this turn stores
        self._poked = False  # another process committed news since the loop's turn began
        self._presence = Presence(self._store, self.worker_id, self._handlers, sweep_ms)
        self._drain_waiter: asyncio.Future[None] | None = None
        self._drain_ended = False
        self._background: set[asyncio.Task[None]] = set()
        self._finished: dict[str, asyncio.Event] = {}
        self._outcomes: list[_Report] = []
        self._starts: list[Start] = []
        self._stored: set[tuple[str, int]] = set()  # definitions this engine has written
        self._claiming = True  # False once a stop is coming (stop_claiming)
        # Deferred operations (docs/deferred.md): the registry is made on first use (a worker
        # engine's open asks it which operations are still live).
        self._deferrals = Deferrals(
            self._store,
            self._machine,
            policy=deferred_policy,
            connectors=deferred_connectors or {},
            now=self._now,
            wake=self._wake.set,
        )

    @property
    def deferred_registry(self) -> Any:
        """The :class:`timebound.deferred.Registry` of this engine's deferred operations, on its
        store; a completed operation resumes its token in the registry's transaction (once)."""
        return self._deferrals.registry

    @property
    def deferred_poller(self) -> Any:
        """The :class:`timebound.deferred.Poller` of this engine's connectors while the engine
        is open (``None`` without any): operators poll and cancel through it. Besides
        ``deferred_connectors`` it polls the deferrable ``http_request`` actions' origins."""
        return self._deferrals.poller

    # Definitions ----------------------------------------------------------------------------

    def register(self, definition: dict[str, Any] | str | Path) -> Definition:
        """Add a definition (dict, JSON/YAML text or path); the same one again is a no-op."""
        parsed = self._checked(definition)
        self._remember(parsed)
        return parsed

    async def publish(
        self, definition: dict[str, Any] | str | Path | Definition
    ) -> tuple[Definition, bool]:
        """Register a definition and store it now (not at its first run), so every process on
        the store sees it and it outlives a restart; answers it, and whether its id was new to
        the store.

        :class:`DefinitionConflict` if this (id, version) already names another body, here or
        in the store: a run keeps its version's body, so a new body needs a higher version.
        """
        if not isinstance(definition, Definition):
            # Off the loop (D6.23): checking a large definition takes long enough to make
            # other runs' timers late.
            definition = await asyncio.to_thread(self._checked, definition)
        parsed = definition
        async with self._txn() as tx:
            known = await tx.fetchone(
                "SELECT version FROM tb_wf_definitions WHERE id = ? LIMIT 1", parsed.id
            )
            conflict = await self._store_definition(tx, parsed)
        if conflict is not None:
            raise DefinitionConflict(conflict, path="version")
        self._remember(parsed)
        return parsed, known is None

    def _remember(self, parsed: Definition) -> None:
        """Keep a registered or published definition (and poll its deferrable origins)."""
        self._definitions[(parsed.id, parsed.version)] = parsed
        self._latest[parsed.id] = max(self._latest.get(parsed.id, 0), parsed.version)
        if self._worker:
            self._deferrals.add(parsed)

    async def stored_definitions(self, definition_id: str | None = None) -> list[Definition]:
        """The latest stored version of each definition (or of ``definition_id`` only), by id:
        what any process on the store published or ran, whatever this process registered."""
        where, args = ("WHERE id = ?", [definition_id]) if definition_id is not None else ("", [])
        async with self._txn() as tx:
            rows = await tx.fetch(
                f"SELECT id, MAX(version) AS version FROM tb_wf_definitions {where} GROUP BY id "
                "ORDER BY id",
                *args,
            )
            found = []
            for row in rows:
                key = (row["id"], int(row["version"]))
                cached = self._definitions.get(key)
                if cached is None:
                    body = await tx.fetchone(
                        "SELECT body FROM tb_wf_definitions WHERE id = ? AND version = ?", *key
                    )
                    assert body is not None
                    # Cached like the definitions runs read back (Machine.definition).
                    cached = self._definitions[key] = parse_definition(json.loads(body["body"]))
                    self._stored.add(key)
                found.append(cached)
        return found

    def _checked(self, definition: dict[str, Any] | str | Path) -> Definition:
        """Parse a definition and check it against this engine's handlers and definitions."""
        parsed = parse_definition(definition)
        for i, action in enumerate(parsed.raw.get("actions", [])):
            handler = action["implementation"].get("handler")
            if action["kind"] in ("python", "deferred") and handler not in self._handlers:
                raise DefinitionError(
                    f"no python handler named {handler!r} was given to the engine",
                    path=f"actions[{i}].implementation.handler",
                )
        known = self._definitions.get((parsed.id, parsed.version))
        if known is not None and known.raw != parsed.raw:
            raise DefinitionConflict(
                f"definition {parsed.id!r} version {parsed.version} is already registered with "
                "a different body; give the new one a higher version",
                path="version",
            )
        return parsed

    # Lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open the store, re-arm from storage and start this process's worker loop (unless
        ``worker=False``)."""
        if self._open:
            return
        await self._store.open()
        self._open = True
        if self._retention is not None:  # only ended runs: safe from any process (D8.13)
            pruning = asyncio.create_task(self._retention.run(), name="timebound-retention")
            self._background.add(pruning)
            pruning.add_done_callback(self._background.discard)
        if not self._worker:
            return
        shared = self._store.shared
        key = self._presence.lock_key if shared else None
        await self._store.listen(self._wake_all, on_stop=self._inflight.on_stop, session_key=key)
        if shared:
            async with self._txn() as tx:
                await self._presence.register(tx, self._now())
                await backfill_needs(tx)
        if not self._store.shared:
            # One writer process: whatever a previous process left in flight died with it.
            async with self._txn() as tx:
                await self._requeue(tx, "status IN ('dispatched', 'executing')")
        # Stored ends of deferred operations resume before any timer fires (D7.10).
        await self._deferrals.resume_stored()
        self._loop_task = asyncio.create_task(self._loop(), name="timebound-workflow-loop")
        await self._deferrals.open(self._definitions.values())

    @property
    def attempts_in_flight(self) -> int:
        """How many actions this engine is running now (what a drain waits for)."""
        return len(self._attempts)

    def end_drain(self) -> None:
        """End a drain of :meth:`close` at once, or skip the next one: the actions still
        running are cancelled and their tokens go back to ``pending`` (D8.17: a second Ctrl-C).
        Call it on the engine's loop."""
        self._drain_ended = True
        if self._drain_waiter is not None:
            self._drain_waiter.cancel()

    async def _attempts_done(self) -> None:
        while self._attempts:
            await asyncio.wait(list(self._attempts.values()))

    def stop_claiming(self) -> None:
        """Claim no more tokens (a stop is coming): the loop still fires timers and stores the
        outcomes of the attempts in flight. Safe to call from a signal handler's callback."""
        self._claiming = False
        self._wake.set()

    async def close(self, *, drain_s: float = 0.0) -> None:
        """Stop: claim no more tokens, let the attempts in flight finish for up to ``drain_s``
        seconds (their outcomes are stored, so a node that finished is not run again), then
        cancel the rest and put their tokens back to ``pending`` with their deadlines kept,
        released at once so the next start (or another worker) takes them."""
        if drain_s > 0 and self._attempts and self._loop_task is not None and not self._drain_ended:
            self.stop_claiming()
            # A task of its own, so end_drain() can end the wait at once (a second Ctrl-C).
            waiter = asyncio.ensure_future(self._attempts_done())
            self._drain_waiter = waiter
            try:
                await asyncio.wait([waiter], timeout=drain_s)
            finally:
                self._drain_waiter = None
                waiter.cancel()
        await self._deferrals.close()
        task, self._loop_task = self._loop_task, None
        pending = [t for t in (task, *self._attempts.values(), *self._background) if t is not None]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._inflight.clear()
        starts, self._starts = self._starts, []
        for start in starts:
            start.settle(error=RuntimeError("the engine closed before the run started"))
        outcomes, self._outcomes = self._outcomes, []
        try:
            if self._worker:
                async with self._txn() as tx:
                    for report in outcomes:  # results that arrived before the stop are kept
                        await self._report(tx, report, self._now())
                    # Cancelled attempts: their tokens are free now, not when the lease expires.
                    await self._requeue(
                        tx,
                        "lease_owner = ? AND status IN ('dispatched', 'executing')",
                        self.worker_id,
                    )
                    if self._store.shared:
                        await self._presence.unregister(tx)
        finally:
            await self._store.close()
            self._open = False
            self._claiming = True
            self._drain_ended = False

    async def prune(self) -> int:
        """Delete, now, the runs that ended more than ``retain`` ago (in bounded batches, D8.13;
        the worker loop does it every minute); how many were deleted. Live runs are kept."""
        if self._retention is None:
            raise ConfigurationError("this engine has no retention period (retain=None)")
        return await self._retention.round()

    @property
    def late_results_discarded(self) -> int:
        """Results that arrived after their token had ended and were discarded (D6.10)."""
        return self._machine.late_results

    # Runs -----------------------------------------------------------------------------------

    async def start(
        self,
        definition_id: str,
        input: Any = None,
        *,
        version: int | None = None,
        deadline: Deadline | float | timedelta | str | None = None,
        inherit_deadline: bool = False,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        deadline_ms: int | None = None,
    ) -> str:
        """Start a run of a registered definition (its latest version unless ``version``).

        ``deadline`` bounds the run further, as a parent's deadline would (D1.5): a
        :class:`~timebound.Deadline`, or a duration from now (``"250ms"``, seconds, a
        ``timedelta``); ``inherit_deadline=True`` takes the caller's current deadline too
        (D6.11). The run's deadline is the earliest of these and the definition's timeout, and
        the run records which one it was (D6.17). ``deadline_ms`` is the deprecated spelling.

        ``idempotency_key`` (or a client-chosen ``run_id``) makes the start idempotent
        (D6.18): the same key with the same definition, version and input returns the run it
        started, once and for all; with anything else it raises :class:`StartConflict`.

        Cancelled (a deadline) before its run reached a transaction, ``start`` raises with
        nothing stored; cancelled while its run was being committed, it waits for that one
        commit and raises a ``CancelledError`` carrying the stored run's id, which a scope turns
        into its ``DeadlineExceeded`` (chained); ``workflow.started_run_id(error)`` reads it
        (D6.18).
        """
        deadline_at = start_deadline(self._now(), deadline, inherit_deadline, deadline_ms)
        key = check_run_id(idempotency_key, "idempotency_key")
        chosen = check_run_id(run_id, "run_id")
        version = version or self._latest.get(definition_id)
        definition = None if version is None else self._definitions.get((definition_id, version))
        if definition is None:
            raise DefinitionError(f"no definition {definition_id!r} is registered", path="id")
        try:  # TooDeep past D6.20's limit, before anything walks it recursively
            check_json(input, what="a run's input", root="$.input", arrays=(list, tuple))
            input = json.loads(json.dumps(input, allow_nan=False))
        except TooDeep:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"a run's input must be JSON: {exc}", option="input")
        if not self._open:
            raise RuntimeError("the engine is not open: use 'async with engine:' first")
        digest = None
        if key is not None or chosen is not None:
            digest = request_digest(definition.id, definition.version, input)
            async with self._read() as tx:  # a repeat: answered without a write
                found = await keyed_run(tx, key, chosen, digest)
            if found is not None:
                return found
        if (definition.id, definition.version) not in self._stored:
            async with self._txn() as tx:
                conflict = await self._store_definition(tx, definition)
            if conflict is not None:
                raise DefinitionConflict(conflict, path="version")
        loop = asyncio.get_running_loop()
        start = Start(
            definition,
            input,
            loop.create_future(),
            deadline_at,
            chosen or uuid.uuid4().hex,
            key,
            digest,
            loop.create_future(),
            caller_traceparent(),  # the caller's span, parent of the run's (D10.5)
        )
        assert start.settled is not None
        if not self._worker:  # no loop to batch with: one transaction; its commit wakes workers
            task: asyncio.Future[str] = asyncio.ensure_future(self._start_alone(start))
            task.add_done_callback(lambda t: settle_from(t, start))
            awaited: asyncio.Future[str] = asyncio.shield(task)
        else:
            # Started by the loop's next transaction: concurrent starts share one commit.
            self._starts.append(start)
            self._wake.set()
            awaited = start.future  # awaited directly: no extra loop turn before we return
        return await await_start(start, awaited, lambda: self._starts)

    async def _start_alone(self, start: Start) -> str:
        """A start in a transaction of its own (an engine without a worker loop). A keyed start
        that lost a race for its key to another process is answered by a second look."""
        for again in (True, False):
            try:
                async with self._txn() as tx:
                    run_id = await start_keyed(
                        self._machine,
                        tx,
                        start.definition,
                        start.input,
                        self._now(),
                        deadline_at=start.deadline_at,
                        run_id=start.run_id,
                        idempotency_key=start.idempotency_key,
                        digest=start.digest,
                        traceparent=start.traceparent,
                    )
                return run_id
            except StartConflict:
                raise
            except Exception:
                if start.digest is None or not again:
                    raise
        raise AssertionError("unreachable")

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """Wait until the run ends; ``timeout`` seconds bound the wait (``DeadlineExceeded``)."""
        if timeout is None:
            return await self._wait(run_id)
        async with fail_after(timeout, what=f"waiting for workflow run {run_id}"):
            result = await self._wait(run_id)
        return result

    async def _wait(self, run_id: str) -> RunResult:
        event = self._finished.setdefault(run_id, asyncio.Event())
        try:
            while True:
                run = await self.get_run(run_id)
                if run["status"] in RUN_TERMINAL:
                    output = run["state"] if run["status"] == "completed" else None
                    return RunResult(run["status"], output, run["error"])
                if self._store.shared:
                    try:
                        async with asyncio.timeout(self._sweep_ms / 1000):
                            await event.wait()
                    except TimeoutError:
                        pass
                else:
                    await event.wait()
                event.clear()
        finally:
            self._finished.pop(run_id, None)

    async def cancel(self, run_id: str) -> bool:
        """Cancel a running run, its live tokens and child runs; ``False`` if it had ended."""
        async with self._txn() as tx:
            return await self._machine.cancel_run(tx, run_id, self._now())

    # Internals ------------------------------------------------------------------------------

    @staticmethod
    def _now() -> int:
        """Now in epoch ms, floored: a stored deadline is never seen reached early (D1.3)."""
        return math.floor(_clock.wall() * 1000)

    @asynccontextmanager
    async def _txn(self) -> AsyncIterator[Tx]:
        if not self._open:
            raise RuntimeError("the engine is not open: use 'async with engine:' first")
        async with self._lock, self._store.transaction() as tx:
            self._tx = tx
            try:
                yield tx
            finally:
                self._tx = None
                self._reporting = set()
        self._wake.set()

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[Tx]:
        """A read of committed state: not behind the engine's lock and waking nothing, so the
        host's reads neither queue behind the loop's turns nor cause extra turns."""
        if not self._open:
            raise RuntimeError("the engine is not open: use 'async with engine:' first")
        async with self._store.read() as tx:
            yield tx

    async def _store_definition(self, tx: Tx, definition: Definition) -> str | None:
        """Store a definition once; an error message if the store holds another body for it."""
        key = (definition.id, definition.version)
        if key in self._stored:
            return None
        conflict = await store_definition(tx, definition)
        if conflict is None:
            self._stored.add(key)  # forgotten if the transaction fails (see _loop)
        return conflict

    async def _requeue(self, tx: Tx, where: str, *args: Any, **kw: Any) -> None:
        await requeue(tx, self._now(), where, *args, **kw)

    def _wake_all(self) -> None:
        """Another process changed the store: re-read it (the loop, and every waiter)."""
        self._poked = True
        self._wake.set()
        for event in self._finished.values():
            event.set()

    def _run_finished(self, run_id: str) -> None:
        event = self._finished.get(run_id)
        if event is not None:
            event.set()

    def _cancel_attempt(self, token_id: str) -> None:
        """A token stopped (ended, or re-queued by its timeout): cancel its attempt here, or
        tell the process that may run it when the transaction commits (D6.14)."""
        if token_id in self._attempts:
            self._inflight.stop(token_id, self._now(), "local")
        elif self._tx is not None and token_id not in self._reporting:
            self._tx.stopped.append(token_id)
            self._tx.stopped_at = self._tx.stopped_at or self._now()

    # The loop -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        renew_at = house_at = 0
        while True:
            self._wake.clear()
            self._poked = False
            outcomes, self._outcomes = self._outcomes, []
            starts, self._starts = self._starts, []
            try:
                if self._store.shared and self._now() >= renew_at:
                    await self._renew_leases()
                    renew_at = self._now() + self._lease_ms // 3
                if self._inflight.suspects:  # another process stopped tokens we may run
                    async with self._read() as tx:
                        await self._inflight.check_suspects(tx, self._presence)
                if self._store.shared and self._now() >= house_at:
                    async with self._txn() as tx:
                        await housekeeping(
                            tx,
                            self._now(),
                            self._presence,
                            self._inflight,
                            self._requeue,
                            self._store.skip_locked(),
                        )
                    house_at = self._now() + self._sweep_ms
                plans, next_ms = await self._turn(starts, outcomes)
            except asyncio.CancelledError:
                # close() stopped the loop mid-turn (rolled back): close() stores these itself.
                self._outcomes[:0] = outcomes
                self._starts[:0] = starts
                raise
            except RunFault as fault:
                # One run's work raised (D6.22): the turn was rolled back; that run alone fails
                # and the rest runs again at once.
                self._outcomes[:0] = outcomes
                self._starts[:0] = [s for s in starts if s is not fault.start]
                self._stored.clear()
                await isolate(self, fault)
                continue
            except Exception:
                # A failed turn is rolled back (on PostgreSQL, a deadlock between two workers'
                # batches, or the server restarting and dropping every connection): keep its
                # work and try again after a pause. The lease renewal is part of the turn, so
                # a renewal that meets a dropped connection is retried, not the loop's end.
                self._outcomes[:0] = outcomes
                self._starts[:0] = starts
                self._stored.clear()
                _log.exception("workflow engine turn failed; retrying")
                await asyncio.sleep(self._sweep_ms / 1000)
                continue
            self._wake.clear()  # our own transaction set it
            for plan in plans:
                task = asyncio.create_task(self._attempt(*plan), name=f"workflow-token-{plan[0]}")
                self._inflight.add(plan[0], task, plan[3].attempt, plan[3].run_id)
                task.add_done_callback(functools.partial(self._attempt_done, plan[0]))
            if self._outcomes or self._starts or self._poked or self._inflight.suspects:
                continue  # news that came during the turn: the turn may not have seen it
            delay = None
            if next_ms is not None:
                delay = wake_delay(next_ms)
            if self._store.shared:
                # The sweep catches other workers' changes; leases are renewed well before expiry.
                renew = max(min(renew_at, house_at) - self._now(), 0) / 1000
                delay = min(delay or math.inf, self._sweep_ms / 1000, renew)
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation that
            # races with the event being set (cpython#86296), and close() would hang.
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _turn(
        self, starts: list[Start], outcomes: list[_Report]
    ) -> tuple[list[_Plan], int | None]:
        """One transaction, one commit (group commit): fire the due timers, start new runs, store
        the attempts' outcomes, claim and begin ready tokens; return the attempts to run and the
        next wake-up.

        Timers go first, so a workflow timeout due now wins over a result reported at the same
        instant (D6.4).
        """
        now = self._now()
        started: list[tuple[Start, str]] = []
        later: list[_Report] = []
        async with self._txn() as tx:
            for timer in await tx.due_timers(now, limit=1000):
                try:
                    await self._fire(tx, timer, now)
                except Exception as exc:
                    raise attribute(exc, timer["stream"]) from exc
                await tx.execute(
                    "DELETE FROM tb_timers WHERE key = ? AND due_ms <= ?", timer["key"], now
                )
            for start in starts:
                try:
                    run_id = await start_keyed(
                        self._machine,
                        tx,
                        start.definition,
                        start.input,
                        now,
                        deadline_at=start.deadline_at,
                        run_id=start.run_id,
                        idempotency_key=start.idempotency_key,
                        digest=start.digest,
                        traceparent=start.traceparent,
                    )
                except StartConflict as exc:  # found in this transaction: nothing written
                    start.settle(error=exc)
                    continue
                except Exception as exc:
                    raise attribute(exc, None, start) from exc
                started.append((start, run_id))
            lock = self._store.lock_clause()  # the reports' runs: read and locked at once, by id
            await self._machine.hold_runs(tx, (r.run_id for r in outcomes), lock=lock)
            self._reporting = {r.token_id for r in outcomes}  # their attempts ran here
            # D6.24: a turn stores outcomes for at most _TURN_SLICE_S; the rest go to the next
            # turn, which fires the timers due by then first (one outcome may fan out 10,000).
            ordered = sorted(outcomes, key=lambda r: r.run_id)
            slice_end = _clock.now() + _TURN_SLICE_S
            for i, report in enumerate(ordered):
                if i and _clock.now() >= slice_end:
                    later = ordered[i:]
                    break
                try:
                    await self._report(tx, report, now)
                except Exception as exc:
                    raise attribute(exc, report.run_id) from exc
            plans = await self._dispatch(tx, now)
            next_ms = await tx.next_timer_ms()
            row = await tx.fetchone(
                "SELECT MIN(not_before) AS t FROM tb_wf_tokens WHERE status = 'pending'"
            )
            if row is not None and row["t"] is None and not tx.kinds & _RUN_ENDS:
                # No token is left for others to claim (this turn claimed what it made) and no
                # run ended: waking every worker would only cost each an empty turn (D6.14a).
                tx.wake_others = False
        self._outcomes[:0] = later  # committed: what is left is stored by the next turn
        for start, run_id in started:  # committed: the runs exist
            start.settle(run_id)
        # Ready tokens wake the loop only while it may claim them (not while a stop drains).
        free = len(self._attempts) < self._concurrency and self._claiming
        if row is not None and row["t"] is not None and free:
            next_ms = row["t"] if next_ms is None else min(next_ms, row["t"])
        return plans, next_ms

    async def _renew_leases(self) -> None:
        """Extend the leases of this worker's in-flight tokens, so no other worker takes them."""
        if not self._attempts:
            return
        async with self._txn() as tx:
            await tx.execute(
                "UPDATE tb_wf_tokens SET lease_until = ? WHERE lease_owner = ? "
                "AND status IN ('dispatched', 'executing')",
                self._now() + self._lease_ms,
                self.worker_id,
            )

    async def _fire(self, tx: Tx, timer: dict[str, Any], now: int) -> None:
        run = await self._machine.run(tx, timer["stream"], lock=self._store.lock_clause())
        if run is None or await self._machine.check_run_deadline(tx, run, now):
            return  # the workflow timeout wins at the same instant (D6.4)
        if timer["kind"] == "token":
            tok = await self._machine.token(tx, timer["key"].split(":", 1)[1])
            if (
                tok is not None
                and tok["status"] in ("pending", "dispatched", "executing")
                and tok["timeout_at"] is not None
                and now >= tok["timeout_at"]
            ):
                await self._machine.token_timeout(tx, run, tok, now)
        elif timer["kind"] == "join":
            await self._machine.joins.join_timeout(tx, run, timer["key"], now)

    async def _dispatch(self, tx: Tx, now: int) -> list[_Plan]:
        """Claim ready tokens (a lease each) and begin their attempts."""
        free = self._concurrency - len(self._attempts)
        if free <= 0 or not self._claiming:
            return []
        if self._store.shared:
            # Not this worker's own attempts in flight or just ended: it is late renewing them,
            # not gone (a stalled loop re-ran its own step beside the running one). Others may.
            mine = sorted(
                {*self._attempts, *self._reporting, *(r.token_id for r in self._outcomes)}
            )
            own = f" AND NOT (lease_owner = ? AND id IN ({', '.join('?' for _ in mine)}))"
            await self._requeue(
                tx,
                "status IN ('dispatched', 'executing') AND lease_until < ?" + (own if mine else ""),
                now,
                *([self.worker_id, *mine] if mine else []),
                lock=self._store.skip_locked(),
                reason="lease_expired",
            )
        # Only the tokens whose handler this worker has (D6.15): another worker runs the rest.
        can_run, handlers = self._presence.claim_filter()
        rows = await tx.fetch(
            "SELECT t.* FROM tb_wf_tokens t JOIN tb_wf_runs r ON r.id = t.run_id "
            "LEFT JOIN tb_wf_node_needs n ON n.definition_id = r.definition_id AND "
            "n.version = r.definition_version AND n.node_id = t.node_id "
            f"WHERE t.status = 'pending' AND t.not_before <= ? AND {can_run} "
            f"ORDER BY t.not_before, t.seq LIMIT ?{self._store.skip_locked(of='t')}",
            now,
            *handlers,
            free,
        )
        lock = self._store.lock_clause()  # their runs: read and locked at once, by id
        await self._machine.hold_runs(tx, (t["run_id"] for t in rows), lock=lock)
        plans = []
        for tok in rows:
            lease = now + self._lease_ms  # the claim is written by _begin with the attempt
            try:
                await self._machine.claim(tx, tok, self.worker_id, lease, now, write=False)
                plan = await self._begin(tx, tok, now)
            except Exception as exc:
                raise attribute(exc, tok["run_id"]) from exc
            if plan is not None:
                plans.append(plan)
        return plans

    def _attempt_done(self, token_id: str, task: asyncio.Task[None]) -> None:
        self._inflight.done(token_id, task)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # a bug: surface it in the loop's log

    async def _begin(self, tx: Tx, tok: dict[str, Any], now: int) -> _Plan | None:
        """``dispatched`` → ``executing``; the attempt to run, or ``None`` if there is none. The
        claim, not yet written, goes with begin_attempt's UPDATE; any other way out writes it."""
        machine = self._machine
        run = await machine.run(tx, tok["run_id"], lock=self._store.lock_clause())
        token_due = tok["timeout_at"] is not None and now >= tok["timeout_at"]
        if run is None or token_due or not machine.run_live(run, now):
            await machine.write_claim(tx, tok, now)
            if run is None or await machine.check_run_deadline(tx, run, now):
                return None
            await machine.token_timeout(tx, run, tok, now)
            return None
        definition = await machine.definition(tx, run)
        node = definition.nodes[tok["node_id"]]
        action = definition.actions[node.action_id]
        timeout_at = await machine.begin_attempt(tx, tok, definition, now)
        if action.kind == "workflow_call":
            await self._start_child(tx, run, tok, definition, now)
            return None
        bounds = [b for b in (timeout_at, run["timeout_at"]) if b is not None]
        deadline_ms = min(bounds) if bounds else None
        implementation, timing = plan_attempt(definition, node, action, deadline_ms)
        branch = None
        if tok["branch_index"] is not None:
            branch = {
                "index": tok["branch_index"],
                "total": tok["branch_total"],
                "item": json.loads(tok["branch_item"] or "null"),
            }
        ctx = ActionContext(
            input=_frozen(tx, run["input"]),
            state=_frozen(tx, run["state"]),
            branch=None if branch is None else freeze(branch),
            run_id=run["id"],
            token_id=tok["id"],
            node_id=node.id,
            attempt=tok["attempt"],
            deadline=Deadline.from_epoch_ms(deadline_ms),
            timing=timing,
            idempotency_key=call_key(tok),
            traceparent=run.get("traceparent"),
        )
        return (tok["id"], action.kind, implementation, ctx)

    async def _attempt(
        self, token_id: str, kind: str, implementation: Mapping[str, Any], ctx: ActionContext
    ) -> None:
        """Run one attempt; its outcome is stored by the loop's next turn (group commit)."""
        what = f"workflow node '{ctx.node_id}'"
        # The attempt's span (D10.4): current while the action runs, so what it calls is its child.
        span = attempt_span(
            ctx.traceparent,
            run_id=ctx.run_id,
            token_id=token_id,
            node_id=ctx.node_id,
            attempt=ctx.attempt,
        )
        # Events emitted inside (the action's policies, a deferred registration) name the run,
        # the token and the node they belong to (D10.1).
        with (
            correlation("run", ctx.run_id),
            correlation("token", token_id),
            correlation("node", ctx.node_id),
            span as ended,
        ):
            try:
                outcome = await self._run_action(kind, implementation, ctx, what, ctx.attempt)
            except Exception as exc:  # a failing action runner fails the node, never strands it
                outcome = Outcome("error", error=f"{type(exc).__name__}: {exc}")
            except asyncio.CancelledError as exc:
                bd = exc.__dict__.get(CUT_BREAKDOWN)
                if bd is not None:
                    # D13: stopped at the node's deadline by the engine's timer: the report
                    # only stores where the attempt's budget went (see _report).
                    cut = Outcome(
                        "timeout", breakdown=summarised(bd, BREAKDOWN_MAX_NODES).to_dict()
                    )
                    began = ctx.deadline.to_epoch_ms()
                    self._outcomes.append(_Report(ctx.run_id, token_id, ctx.attempt, cut, began))
                    self._wake.set()
                raise
            ended(outcome.kind, outcome.error)
        began = ctx.deadline.to_epoch_ms()
        self._outcomes.append(_Report(ctx.run_id, token_id, ctx.attempt, outcome, began))
        self._wake.set()

    async def _run_action(
        self,
        kind: str,
        implementation: Mapping[str, Any],
        ctx: ActionContext,
        what: str,
        attempt: int,
    ) -> Outcome:
        if kind in ("http_request", "deferred"):
            handler = self._handlers.get(implementation.get("handler", ""))
            return await self._deferrals.call(kind, implementation, ctx, what, handler)
        handler = self._handlers.get(implementation["handler"])
        if handler is None:
            return Outcome("error", error=f"no python handler named {implementation['handler']!r}")

        def late() -> None:
            task = asyncio.ensure_future(self._late(ctx.run_id, ctx.token_id, attempt))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

        return await run_python(handler, ctx, what=what, on_late=late)

    async def _late(self, run_id: str, token_id: str, attempt: int) -> None:
        async with self._txn() as tx:
            await self._machine.late_result(tx, run_id, token_id, attempt, self._now())

    async def _report(self, tx: Tx, report: _Report, now: int) -> None:
        machine = self._machine
        token_id, attempt, outcome = report.token_id, report.attempt, report.outcome
        tok = await machine.token(tx, token_id)
        if tok is None:
            return
        # A handler cut by its bound ("timeout") produced nothing: there is no result to
        # discard, so nothing is counted or recorded as one (D6.10).
        produced = outcome.kind != "timeout"
        if tok["status"] != "executing" or tok["attempt"] != attempt:
            if produced:
                await machine.late_result(tx, tok["run_id"], token_id, attempt, now)
            elif outcome.breakdown is not None and tok["attempt"] == attempt:
                # D13: the node's timer recorded the timeout first; the attempt cut by it
                # reports where its budget went, stored beside that event.
                await tx.append_event(
                    tok["run_id"],
                    "token_breakdown",
                    now,
                    token_id=token_id,
                    node_id=tok["node_id"],
                    attempt=attempt,
                    breakdown=outcome.breakdown,
                )
            return
        run = await machine.run(tx, tok["run_id"], lock=self._store.lock_clause())
        assert run is not None
        if await machine.check_run_deadline(tx, run, now):
            if produced:
                await machine.late_result(tx, run["id"], token_id, attempt, now)
            return
        deadline_reached = tok["timeout_at"] is not None and now >= tok["timeout_at"]
        bounds = [b for b in (tok["timeout_at"], run["timeout_at"]) if b is not None]
        extended = report.deadline_ms is not None and min(bounds, default=math.inf) > max(
            report.deadline_ms, now
        )
        if outcome.kind == "timeout" and not deadline_reached and extended:
            # D6.28: the attempt was cut at the deadline it began with, which an operator has
            # since extended: it runs again under the new one (no retry spent, nothing early).
            await self._requeue(tx, "id = ?", token_id, reason="deadline_extended")
        elif outcome.kind == "timeout" or deadline_reached:
            if outcome.kind == "ok":
                await machine.late_result(tx, run["id"], token_id, attempt, now)
            if outcome.propagated_ms is not None and not deadline_reached:
                await machine.token_timeout(
                    tx,
                    run,
                    tok,
                    now,
                    duration=outcome.propagated_ms,
                    set_by="propagated",
                    breakdown=outcome.breakdown,
                )
            else:
                await machine.token_timeout(tx, run, tok, now, breakdown=outcome.breakdown)
        elif outcome.kind == "reject":
            await machine.fail_run(tx, run, outcome.error or "deferred-not-accepted", now)
        elif outcome.kind == "deferred":
            # Suspended on a deferred operation: no worker is held; the registry's resume
            # completes or fails the token. child_run_id names what it waits on, so a restart
            # does not re-dispatch it.
            await tx.execute(
                "UPDATE tb_wf_tokens SET child_run_id = ? WHERE id = ?", outcome.value, token_id
            )
        elif outcome.kind == "ok":
            await machine.complete(tx, run, tok, outcome.value, now)
        else:
            await machine.action_error(tx, run, tok, outcome.error or "error", now)

    async def _start_child(
        self, tx: Tx, run: dict[str, Any], tok: dict[str, Any], definition: Definition, now: int
    ) -> None:
        node = definition.nodes[tok["node_id"]]
        child_id = definition.actions[node.action_id].implementation["workflow_def_id"]
        version = definition.actions[node.action_id].implementation.get("version")
        version = version or self._latest.get(child_id)
        child = None if version is None else self._definitions.get((child_id, version))
        if child is None:
            await self._machine.action_error(
                tx, run, tok, f"subworkflow definition {child_id!r} is not registered", now
            )
            return
        conflict = await self._store_definition(tx, child)
        if conflict is not None:
            await self._machine.action_error(tx, run, tok, conflict, now)
            return
        await self._machine.children.start_child(tx, run, tok, node, child, now)


def _frozen(tx: Tx, text: str) -> Any:
    """The read-only value of a stored JSON text, made once per transaction: the tokens of one
    fan-out share their run's input (256 claims froze the same 1,000 items 256 times, D6.24)."""
    key = ("frozen", text)
    if key not in tx.held:
        tx.held[key] = freeze(json.loads(text))
    return tx.held[key]
