"""An action attempt: begun with its token's claim, run outside any transaction, its outcome
stored by the worker loop's next turn (a part of :class:`~timebound.workflow.Engine`)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, NamedTuple

from .._core._breakdown import BREAKDOWN_MAX_NODES, summarised
from .._core._deadline import Deadline
from .._store import Detached, Store, Tx, Wake
from ..telemetry._events import correlated
from ..telemetry._tracing import attempt_span
from ._actions import CUT_BREAKDOWN, ActionContext, Outcome, freeze, run_python
from ._bounds import call_key
from ._deferral import Deferrals, plan_attempt
from ._definition import Definition
from ._machine import Machine
from ._rows import decode_once
from ._workers import InFlight

__all__ = ["Attempts", "Plan", "Report"]


class Report(NamedTuple):
    """An attempt's outcome, waiting for the loop's next transaction."""

    run_id: str
    token_id: str
    attempt: int
    outcome: Outcome
    deadline_ms: int | None = None  # the deadline the attempt began with


#: An attempt to start: token id, action kind, implementation, context.
Plan = tuple[str, str, Mapping[str, Any], ActionContext]


class Attempts:
    """Beginning, running and reporting action attempts (a part of the engine).

    The engine provides the attributes below, ``_txn()`` (a write transaction behind its
    lock), ``_now()``, ``_requeue()`` and ``_store_definition()``.
    """

    _machine: Machine
    _store: Store
    _handlers: dict[str, Callable[..., Any]]
    _deferrals: Deferrals
    _definitions: dict[tuple[str, int], Definition]
    _latest: dict[str, int]
    _inflight: InFlight
    _wake: Wake
    _background: Detached
    _outcomes: list[Report]

    def _txn(self) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    @staticmethod
    def _now() -> int:
        raise NotImplementedError

    async def _requeue(self, tx: Tx, where: str, *args: Any, **kw: Any) -> None:
        raise NotImplementedError

    async def _store_definition(self, tx: Tx, definition: Definition) -> str | None:
        raise NotImplementedError

    def _attempt_done(self, token_id: str, task: asyncio.Task[None]) -> None:
        if self._inflight.done(token_id, task):  # a place is free: the loop may claim more
            self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]  # a bug: surface it in the loop's log

    async def _begin(
        self,
        tx: Tx,
        tok: dict[str, Any],
        now: int,
        *,
        hand_off: tuple[str, int, dict[str, Any], Definition] | None = None,
    ) -> Plan | None:
        """``dispatched`` → ``executing``; the attempt to run, or ``None`` if there is none. The
        claim, not yet written, goes with begin_attempt's UPDATE; any other way out writes it.

        ``hand_off`` (owner, lease, run, definition): a token this transaction made, claimed
        here too and only while still pending (D6.29); the caller has checked that its run is
        live and held, and gives it with its definition."""
        machine = self._machine
        if hand_off is not None:
            owner, lease, run, definition = hand_off
            taken, timeout_at = await machine.hand_off(tx, tok, owner, lease, definition, now)
            if not taken:
                return None
        else:
            found = await machine.run(tx, tok["run_id"], lock=self._store.lock_clause())
            token_due = tok["timeout_at"] is not None and now >= tok["timeout_at"]
            if found is None or token_due or not machine.run_live(found, now):
                await machine.write_claim(tx, tok, now)
                if found is None or await machine.check_run_deadline(tx, found, now):
                    return None
                await machine.token_timeout(tx, found, tok, now)
                return None
            run = found
            definition = await machine.definition(tx, run)
            timeout_at = await machine.begin_attempt(tx, tok, definition, now)
        node = definition.nodes[tok["node_id"]]
        action = definition.actions[node.action_id]
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
            reserve=node.reserve_ms / 1000 if node.reserve_ms else None,
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
        ids = {"run": ctx.run_id, "token": token_id, "node": ctx.node_id}
        with correlated(ids), span as ended:
            try:
                outcome = await self._run_action(kind, implementation, ctx, what, ctx.attempt)
            except Exception as exc:  # a failing action runner fails the node, never strands it
                outcome = Outcome("error", error=f"{type(exc).__name__}: {exc}")
            except asyncio.CancelledError as exc:
                bd = exc.__dict__.get(CUT_BREAKDOWN)
                if bd is not None:
                    # D13: stopped at the node's deadline by the engine's timer: the report
                    # only stores where the attempt's budget went (see _report).
                    tree = summarised(bd, BREAKDOWN_MAX_NODES).to_dict()
                    cut = Outcome("timeout", breakdown=tree)
                    began = ctx.deadline.to_epoch_ms()
                    self._outcomes.append(Report(ctx.run_id, token_id, ctx.attempt, cut, began))
                    self._wake.set()
                raise
            ended(outcome.kind, outcome.error)
        began = ctx.deadline.to_epoch_ms()
        self._outcomes.append(Report(ctx.run_id, token_id, ctx.attempt, outcome, began))
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
            self._background.spawn(self._late(ctx.run_id, ctx.token_id, attempt))

        return await run_python(handler, ctx, what=what, on_late=late)

    async def _late(self, run_id: str, token_id: str, attempt: int) -> None:
        async with self._txn() as tx:
            await self._machine.late_result(tx, run_id, token_id, attempt, self._now())

    async def _report(self, tx: Tx, report: Report, now: int) -> None:
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
                    "attempt_breakdown",
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
        if outcome.kind == "timeout" and not deadline_reached and _extended(report, tok, run, now):
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


def _extended(report: Report, tok: dict[str, Any], run: dict[str, Any], now: int) -> bool:
    """Whether the token's (and run's) deadline now lies later than the one the reported
    attempt began with (D6.28)."""
    bounds = [b for b in (tok["timeout_at"], run["timeout_at"]) if b is not None]
    return report.deadline_ms is not None and min(bounds, default=math.inf) > max(
        report.deadline_ms, now
    )


def _frozen(tx: Tx, text: str) -> Any:
    """The read-only value of a stored JSON text, made once per transaction: the tokens of one
    fan-out share their run's input (256 claims froze the same 1,000 items 256 times, D6.24)."""
    key = ("frozen", text)
    if key not in tx.held:
        tx.held[key] = freeze(decode_once(tx, text))
    return tx.held[key]
