"""The workflow engine: its public API, definitions and lifecycle. Its worker loop is in
:mod:`._turns`, its action attempts in :mod:`._attempts`, its reads of runs, tokens and events in
:mod:`._reads`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import socket
import types
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

from .._core import _clock
from .._core._deadline import Deadline
from .._core._durations import Duration, to_ms, to_seconds
from .._core._errors import ConfigurationError
from .._core._renamed import Renamed, from_ms, renamed
from .._core._scopes import fail_after, spawn_background
from .._json import TooDeep
from .._json import check as check_json
from .._store import Detached, Store, Tx, Wake, open_store
from ..telemetry._tracing import caller_traceparent
from ._actions import handlers
from ._attempts import Report
from ._deferral import Deferrals
from ._definition import Definition, DefinitionConflict, DefinitionError, parse_definition
from ._machine import Machine
from ._operator import Operator, OperatorActions, ms_of
from ._published import store_definition
from ._reads import RunReads
from ._retention import Retention
from ._rows import RUN_TERMINAL, RunEnd, RunResult, new_id
from ._schedule import Schedule
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
from ._turns import Turns
from ._workers import (
    InFlight,
    Presence,
    backfill_needs,
    requeue,
)

__all__ = ["Engine", "RunResult", "store_definition"]


class Engine(Turns, RunReads, OperatorActions):
    """A durable workflow engine on one store (``sqlite:///FILE`` or ``postgresql://…``)."""

    @renamed(lease_ms=Renamed("lease", from_ms), sweep_ms=Renamed("sweep", from_ms))
    def __init__(
        self,
        db: str = "sqlite:///timebound-workflows.db",
        actions: Mapping[str, Callable[..., Any]] | types.ModuleType | None = None,
        *,
        concurrency: int = 64,
        lease: Duration = 30.0,
        sweep: Duration = 1.0,
        worker_id: str | None = None,
        deferred_policy: Any = None,
        deferred_connectors: Mapping[str, Any] | None = None,
        worker: bool = True,
        retain: Duration | None = None,
        max_extension: Duration = 86_400.0,
    ) -> None:
        if concurrency < 1:
            raise ConfigurationError("concurrency must be >= 1", option="concurrency")
        # D6.16: the lease is the fallback for a worker that is slow, not dead; the sweep is
        # how often a shared store is looked at for work another process left (whole ms, >= 1).
        lease_ms = to_ms(lease, option="lease", allow_zero=False)
        sweep_ms = to_ms(sweep, option="sweep", allow_zero=False)
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
        self._wake = Wake()
        self._loop_task: asyncio.Task[None] | None = None
        self._inflight = InFlight(self._now, self._wake.set, record=self._store.shared)
        self._attempts = self._inflight.tasks
        self._tx: Tx | None = None  # the transaction in progress (one at a time: _lock)
        self._reporting: set[str] = set()  # tokens whose own outcome this turn stores
        self._poked = False  # another process committed news since the loop's turn began
        self._presence = Presence(self._store, self.worker_id, self._handlers, sweep_ms)
        self._schedule = Schedule()  # what the loop knows between its turns (D6.29)
        self._drain_waiter: asyncio.Future[None] | None = None
        self._drain_ended = False
        self._background = Detached()  # the retention loop, late results' writes
        self._finished: dict[str, asyncio.Event] = {}
        # How a waited-for run ended, handed over by the commit that ended it (no read back).
        self._ended: dict[str, RunEnd] = {}
        self._outcomes: list[Report] = []
        self._starts: list[Start] = []
        # worker=False: the task committing the waiting starts together (D6.33).
        self._batching: asyncio.Task[None] | None = None
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
            self._background.spawn(self._retention.run(), name="timebound-retention")
        if not self._worker:
            return
        shared = self._store.shared
        key = self._presence.lock_key if shared else None
        await self._store.listen(
            self._wake_all,
            on_stop=self._inflight.on_stop,
            session_key=key,
            on_news=self._wake_waiters,
        )
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

    @renamed(drain_s=Renamed("drain"))
    async def close(self, *, drain: Duration = 0.0) -> None:
        """Stop: claim no more tokens, let the attempts in flight finish for up to ``drain`` (a
        duration; their outcomes are stored, so a node that finished is not run again), then
        cancel the rest and put their tokens back to ``pending`` with their deadlines kept,
        released at once so the next start (or another worker) takes them."""
        drain_s = to_seconds(drain, option="drain")
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
        pending = [t for t in (task, *self._attempts.values()) if t is not None]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, self._background.cancel(), return_exceptions=True)
        if self._batching is not None:  # one transaction: the starts it took are answered
            await asyncio.wait([self._batching])
            self._batching = None
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

    @renamed(deadline_ms=Renamed("deadline", from_ms))
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
    ) -> str:
        """Start a run of a registered definition (its latest version unless ``version``).

        ``deadline`` bounds the run further, as a parent's deadline would (D1.5): a
        :class:`~timebound.Deadline`, or a duration from now (``"250ms"``, seconds, a
        ``timedelta``); ``inherit_deadline=True`` takes the caller's current deadline too
        (D6.11). The run's deadline is the earliest of these and the definition's timeout, and
        the run records which one it was (D6.17).

        ``idempotency_key`` (or a client-chosen ``run_id``) makes the start idempotent
        (D6.18): the same key with the same definition, version and input returns the run it
        started, once and for all; with anything else it raises :class:`StartConflict`.

        Cancelled (a deadline) before its run reached a transaction, ``start`` raises with
        nothing stored; cancelled while its run was being committed, it waits for that one
        commit and raises a ``CancelledError`` carrying the stored run's id, which a scope turns
        into its ``DeadlineExceeded`` (chained); ``workflow.started_run_id(error)`` reads it
        (D6.18).
        """
        deadline_at = start_deadline(self._now(), deadline, inherit_deadline)
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
            chosen or new_id(),
            key,
            digest,
            loop.create_future(),
            caller_traceparent(),  # the caller's span, parent of the run's (D10.5)
        )
        assert start.settled is not None
        # Started by the next transaction: concurrent starts share one commit, the loop's turn
        # or, with no loop here (``worker=False``), a batch of their own; its commit wakes the
        # workers. Awaited directly: no extra loop turn before we return.
        self._starts.append(start)
        if self._worker:
            self._wake.set()
        elif self._batching is None or self._batching.done():
            self._batching = spawn_background(self._start_batches(), name="timebound-starts")
        return await await_start(start, start.future, lambda: self._starts)

    async def _start_batches(self) -> None:
        """The starts of an engine without a worker loop, committed together: those that
        arrive while one batch commits share the next (group commit, as the loop's turn does)."""
        while self._starts:
            starts, self._starts = self._starts, []
            started: list[tuple[Start, str]] = []
            try:
                async with self._txn() as tx:
                    now = self._now()
                    for start in starts:
                        try:
                            run_id = await start_keyed(self._machine, tx, start, now)
                        except StartConflict as exc:  # found in this transaction: nothing written
                            start.settle(error=exc)
                            continue
                        started.append((start, run_id))
            except Exception:
                # The batch was rolled back (a keyed start that lost its key to another
                # process, a store error): each start runs alone, which answers a lost race by
                # a second look and fails only the start at fault.
                for start in starts:
                    if not start.future.done():
                        task = asyncio.ensure_future(self._start_alone(start))
                        task.add_done_callback(functools.partial(settle_from, start=start))
                        await asyncio.wait([task])
                continue
            for start, run_id in started:
                start.settle(run_id)

    async def _start_alone(self, start: Start) -> str:
        """A start in a transaction of its own (an engine without a worker loop). A keyed start
        that lost a race for its key to another process is answered by a second look."""
        for again in (True, False):
            try:
                async with self._txn() as tx:
                    run_id = await start_keyed(self._machine, tx, start, self._now())
                return run_id
            except StartConflict:
                raise
            except Exception:
                if start.digest is None or not again:
                    raise
        raise AssertionError("unreachable")

    async def wait(self, run_id: str, timeout: Duration | None = None) -> RunResult:
        """Wait until the run ends; ``timeout`` (a duration) bounds the wait
        (``DeadlineExceeded``)."""
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
                ended = self._ended.pop(run_id, None)
                if ended is not None:  # this process ended it: its commit told how
                    return ended.result()
        finally:
            self._finished.pop(run_id, None)
            self._ended.pop(run_id, None)

    async def cancel(self, run_id: str) -> bool:
        """Cancel a running run, its live tokens and child runs; ``False`` if it had ended."""
        async with self._txn() as tx:
            return await self._machine.cancel_run(tx, run_id, self._now())

    # Internals ------------------------------------------------------------------------------

    @staticmethod
    def _now() -> int:
        """Now in epoch ms, floored: a stored deadline is never seen reached early (D1.3)."""
        return _clock.wall_ms()

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
        self._schedule.forget()
        self._wake.set()
        for event in self._finished.values():
            event.set()

    def _wake_waiters(self) -> None:
        """Another process ended a run: the waiters look (the loop has nothing new to do)."""
        for event in self._finished.values():
            event.set()

    def _run_finished(self, run_id: str, ended: RunEnd | None = None) -> None:
        event = self._finished.get(run_id)
        if event is not None:
            if ended is not None:
                self._ended[run_id] = ended
            event.set()

    def _cancel_attempt(self, token_id: str) -> None:
        """A token stopped (ended, or re-queued by its timeout): cancel its attempt here, or
        tell the process that may run it when the transaction commits (D6.14)."""
        if token_id in self._attempts:
            self._inflight.stop(token_id, self._now(), "local")
        elif self._tx is not None and token_id not in self._reporting:
            self._tx.stopped.append(token_id)
            self._tx.stopped_at = self._tx.stopped_at or self._now()
