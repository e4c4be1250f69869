"""What an operator does to a run besides cancelling it: retry it, terminate it, give it more time
(D6.25-D6.28).

Each operation is one transaction that reads the run under its lock and is decided by the row
itself (D6.13): the UPDATE names the state it was decided on, so a run that a worker ended, or
whose timer fired, in the meantime is refused, never overwritten. Each records an event naming
the operator and the reason. Other processes learn of it as they learn of a cancel (the commit
wakes them; a stopped token's attempt is stopped wherever it runs).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._core._durations import Duration, ceil_ms, format_duration, to_seconds
from .._core._errors import ConfigurationError, TimeboundError
from .._store import Tx
from ._bounds import run_bound, stored_bound
from ._machine import Machine
from ._rows import PRIORITY_RUN, PRIORITY_TOKEN, encode

__all__ = ["Operator", "OperatorActions", "OperatorRefused", "ms_of"]

#: How a terminated run ended (``tb_wf_runs.error_code``, D6.17), read instead of its message.
TERMINATED = "terminated"
#: The statuses a node's deadline can be extended in: a token not yet ended nor parked at a join.
_EXTENDABLE = ("pending", "dispatched", "executing")


def ms_of(seconds: float) -> int:
    """Seconds as whole milliseconds, rounded up (an extension is never shorter than asked)."""
    return min(ceil_ms(seconds), 2**62)


class OperatorRefused(TimeboundError):
    """An operator's action that does not apply to the run as it is now.

    ``code`` says why, stable for the API and CLI: ``run-not-found``, ``run-ended`` (extend or
    terminate a run that has ended), ``run-not-failed`` (retry a run that did not fail or time
    out), ``no-deadline`` (nothing to extend), ``over-cap`` (the extension passes the policy's
    ``max_extension``), ``node-not-live`` / ``unknown-node`` / ``no-failed-node`` (what to
    extend or retry from), ``child-run`` (a child run is driven through its parent).
    """

    code = "operator-refused"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Operator:
    """The operator's actions on one engine's store (the engine delegates to it)."""

    def __init__(self, machine: Machine, lock: Callable[[], str], max_extension_ms: int) -> None:
        self._machine = machine
        self._lock = lock
        self.max_extension_ms = max_extension_ms

    async def _run(self, tx: Tx, run_id: str) -> dict[str, Any]:
        run = await self._machine.run(tx, run_id, lock=self._lock())
        if run is None:
            raise OperatorRefused("run-not-found", f"no run {run_id!r}")
        return run

    @staticmethod
    def _not_child(run: dict[str, Any], what: str) -> None:
        if run["parent_token_id"] is not None:
            raise OperatorRefused(
                "child-run",
                f"run {run['id']!r} is a child run: {what} its parent run, whose node waits on it",
            )

    # Extend -----------------------------------------------------------------------------------

    async def extend(
        self,
        tx: Tx,
        run_id: str,
        node: str | None,
        by_ms: int,
        reason: str,
        operator: str,
        now: int,
    ) -> dict[str, Any]:
        """Move the run's deadline (``node=None``) or every live token of ``node`` later by
        ``by_ms`` (D6.27); the run's extensions together stay within ``max_extension_ms``.

        Never early: the old deadline stands if it was reached before this transaction (the
        run is then over, or the token timed out or is retrying). The durable timer is re-armed
        in the same transaction, so a timer read before the commit finds the row's new deadline
        when it takes the lock and does nothing.
        """
        run = await self._run(tx, run_id)
        if run["status"] != "running":
            raise OperatorRefused("run-ended", f"run {run_id!r} has ended ({run['status']})")
        if run["timeout_at"] is not None and now >= run["timeout_at"]:
            raise OperatorRefused("run-ended", f"run {run_id!r} has reached its deadline")
        self._not_child(run, "extend")
        used = 0
        for row in await tx.fetch(
            "SELECT data FROM tb_events WHERE stream = ? AND kind = 'deadline_extended'", run_id
        ):
            used += int(json.loads(row["data"]).get("by_ms", 0))
        if used + by_ms > self.max_extension_ms:
            raise OperatorRefused(
                "over-cap",
                f"run {run_id!r} has been extended by {format_duration(used / 1000)}; another "
                f"{format_duration(by_ms / 1000)} passes the cap of "
                f"{format_duration(self.max_extension_ms / 1000)} (max_extension)",
            )
        changed: list[dict[str, Any]] = []
        if node is None:
            old = run["timeout_at"]
            if old is None:
                raise OperatorRefused("no-deadline", f"run {run_id!r} has no deadline to extend")
            new = old + by_ms
            # The run's bound (D6.17) grows with it: a timeout reports the deadline and length
            # in force, and how much of it operators added.
            bound = dict(stored_bound(run, await self._machine.definition(tx, run)))
            if bound.get("duration_ms") is not None:
                bound["duration_ms"] += by_ms
            bound["deadline_at"] = new
            bound["extended_ms"] = bound.get("extended_ms", 0) + by_ms
            await tx.execute(
                "UPDATE tb_wf_runs SET timeout_at = ?, timeout_bound = ? WHERE id = ? "
                "AND status = 'running' AND timeout_at = ?",
                new,
                encode(bound),
                run_id,
                old,
            )
            self._machine._run_changed(tx, run, timeout_at=new, timeout_bound=encode(bound))
            await tx.set_timer(f"run:{run_id}", "run", run_id, new, PRIORITY_RUN)
            changed.append({"target": "run", "from_ms": old, "to_ms": new})
        else:
            definition = await self._machine.definition(tx, run)
            if node not in definition.nodes:
                raise OperatorRefused("unknown-node", f"node: {node!r} is not a node of the run")
            marks = ", ".join("?" * len(_EXTENDABLE))
            tokens = await tx.fetch(
                f"SELECT * FROM tb_wf_tokens WHERE run_id = ? AND node_id = ? "
                f"AND status IN ({marks}) AND timeout_at IS NOT NULL ORDER BY seq",
                run_id,
                node,
                *_EXTENDABLE,
            )
            live = [t for t in tokens if now < t["timeout_at"]]
            if not live:
                raise OperatorRefused(
                    "node-not-live", f"node {node!r} has no live token with a deadline to extend"
                )
            for tok in live:
                action = definition.actions[definition.nodes[node].action_id]
                if action.kind == "workflow_call":
                    raise OperatorRefused(
                        "child-run",
                        f"node {node!r} waits on a child run, whose own timer bounds it",
                    )
                new = tok["timeout_at"] + by_ms
                done = await tx.execute(
                    "UPDATE tb_wf_tokens SET timeout_at = ?, updated_at = ? WHERE id = ? "
                    "AND status = ? AND timeout_at = ?",
                    new,
                    now,
                    tok["id"],
                    tok["status"],
                    tok["timeout_at"],
                )
                if not done:
                    continue  # changed since the read (D6.13): its own state stands
                await tx.set_timer(f"tok:{tok['id']}", "token", run_id, new, PRIORITY_TOKEN)
                changed.append(
                    {
                        "target": "node",
                        "node_id": node,
                        "token_id": tok["id"],
                        "branch_index": tok["branch_index"],
                        "from_ms": tok["timeout_at"],
                        "to_ms": new,
                    }
                )
        for change in changed:
            await tx.append_event(
                run_id,
                "deadline_extended",
                now,
                by_ms=by_ms if change is changed[0] else 0,  # counted once towards the cap
                reason=reason,
                operator=operator,
                **change,
            )
        tx.wake_others = True
        return {"run_id": run_id, "extended": changed, "extension_used_ms": used + by_ms}

    # Terminate --------------------------------------------------------------------------------

    async def terminate(
        self, tx: Tx, run_id: str, reason: str, operator: str, now: int
    ) -> dict[str, Any]:
        """End a running run ``failed`` at once (D6.26): every live token is cancelled, its
        attempt stopped wherever it runs, its child runs cancelled. Unlike a cancel (a request
        to stop that ends the run ``cancelled``), a terminated run counts as failed and can be
        retried."""
        run = await self._run(tx, run_id)
        if run["status"] != "running":
            raise OperatorRefused("run-ended", f"run {run_id!r} has ended ({run['status']})")
        await tx.append_event(
            run_id, "run_terminated", now, reason=reason, operator=operator, workflow_run_id=run_id
        )
        error = f"terminated by {operator}: {reason}"
        if not await self._machine._finish_run(tx, run, "failed", now, error, TERMINATED):
            raise OperatorRefused("run-ended", f"run {run_id!r} has ended")
        return {"run_id": run_id, "status": "failed", "error": error}

    # Retry ------------------------------------------------------------------------------------

    async def retry(
        self,
        tx: Tx,
        run_id: str,
        from_node: str | None,
        from_start: bool,
        reason: str,
        operator: str,
        now: int,
    ) -> dict[str, Any]:
        """Run a failed or timed-out run again (D6.25): from the node that failed (its state
        kept), from ``from_node`` (a node the run reached outside any fan-out), or from the start
        (state cleared). The run gets its definition's timeout afresh from now."""
        run = await self._run(tx, run_id)
        if run["status"] not in ("failed", "timed_out"):
            raise OperatorRefused(
                "run-not-failed",
                f"run {run_id!r} is {run['status']}: only a failed or timed-out run is retried",
            )
        self._not_child(run, "retry")
        definition = await self._machine.definition(tx, run)
        if from_start:
            node = definition.initial_node
        else:
            node = from_node or await self._failed_node(tx, run_id)
            if node not in definition.nodes:
                raise OperatorRefused("unknown-node", f"from_node: {node!r} is not a node")
            reached = await tx.fetchone(
                "SELECT id FROM tb_wf_tokens WHERE run_id = ? AND node_id = ? "
                "AND branch_index IS NULL LIMIT 1",
                run_id,
                node,
            )
            if reached is None and node != definition.initial_node:
                raise OperatorRefused(
                    "unknown-node",
                    f"from_node: the run never reached {node!r} outside a fan-out; "
                    "retry from the start",
                )
        bound = run_bound(now, definition.timeout_ms, "definition", None, "caller")
        timeout_at = None if bound is None else bound["deadline_at"]
        encoded_bound = None if bound is None else encode(bound)
        previous = run["status"]
        changed = await tx.execute(
            "UPDATE tb_wf_runs SET status = 'running', finished_at = NULL, error = NULL, "
            "error_code = NULL, timeout_at = ?, timeout_bound = ?, "
            "state = CASE WHEN ? THEN '{}' ELSE state END WHERE id = ? AND status = ?",
            timeout_at,
            encoded_bound,
            from_start,
            run_id,
            previous,
        )
        if not changed:
            raise OperatorRefused("run-not-failed", f"run {run_id!r} changed; look again")
        fields: dict[str, Any] = {
            "status": "running",
            "finished_at": None,
            "error": None,
            "error_code": None,
            "timeout_at": timeout_at,
            "timeout_bound": encoded_bound,
        }
        if from_start:
            fields["state"] = encode({})
        self._machine._run_changed(tx, run, **fields)
        await tx.append_event(
            run_id,
            "run_retried",
            now,
            workflow_run_id=run_id,
            previous_status=previous,
            from_node=node,
            from_start=from_start,
            reason=reason,
            operator=operator,
            timeout_at=timeout_at,
        )
        if timeout_at is not None:
            await tx.set_timer(f"run:{run_id}", "run", run_id, timeout_at, PRIORITY_RUN)
        await self._machine._new_token(tx, run_id, definition, node, now, branch=None)
        tx.wake_others = True
        return {"run_id": run_id, "status": "running", "from_node": node}

    async def _failed_node(self, tx: Tx, run_id: str) -> str:
        """The node whose failure or timeout ended the run: its last token that failed or timed
        out, else (a terminated run) the last one its end cancelled."""
        row = await tx.fetchone(
            "SELECT node_id, branch_index FROM tb_wf_tokens WHERE run_id = ? "
            "AND status IN ('failed', 'timed_out', 'cancelled') "
            "ORDER BY CASE WHEN status = 'cancelled' THEN 1 ELSE 0 END, seq DESC LIMIT 1",
            run_id,
        )
        if row is None:
            raise OperatorRefused(
                "no-failed-node", f"no node of run {run_id!r} failed; retry from the start"
            )
        if row["branch_index"] is not None:
            raise OperatorRefused(
                "no-failed-node",
                f"node {row['node_id']!r} failed inside a fan-out branch; retry from the start "
                "or from the node before the fan-out",
            )
        return str(row["node_id"])


class OperatorActions:
    """The operator's actions as :class:`~timebound.workflow.Engine` methods (a part of it).

    The engine provides ``_operator``, ``_txn()`` (a write transaction behind its lock) and
    ``_now()`` (epoch ms, floored).
    """

    _operator: Operator

    def _txn(self) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    @staticmethod
    def _now() -> int:
        raise NotImplementedError

    async def retry(
        self,
        run_id: str,
        *,
        from_node: str | None = None,
        from_start: bool = False,
        reason: str,
        operator: str = "operator",
    ) -> dict[str, Any]:
        """Run a failed or timed-out run again from the node that failed (or ``from_node``, or
        the start), with a fresh workflow timeout (D6.25); :class:`OperatorRefused` otherwise.
        ``from_node`` and ``from_start`` together are refused: they name two different places."""
        if from_node is not None and from_start:
            raise ConfigurationError(
                "from_node and from_start: give one, not both", option="from_start"
            )
        async with self._txn() as tx:
            return await self._operator.retry(
                tx, run_id, from_node, from_start, reason, operator, self._now()
            )

    async def terminate(
        self, run_id: str, *, reason: str, operator: str = "operator"
    ) -> dict[str, Any]:
        """End a running run ``failed`` now, recording who and why (D6.26)."""
        async with self._txn() as tx:
            return await self._operator.terminate(tx, run_id, reason, operator, self._now())

    async def extend(
        self,
        run_id: str,
        node: str | None = None,
        *,
        by: Duration,
        reason: str,
        operator: str = "operator",
    ) -> dict[str, Any]:
        """Give the run (or ``node``'s live tokens) ``by`` more time, within the engine's
        ``max_extension`` for the run (D6.27)."""
        by_ms = ms_of(to_seconds(by, option="by", allow_zero=False))
        async with self._txn() as tx:
            return await self._operator.extend(
                tx, run_id, node, by_ms, reason, operator, self._now()
            )
