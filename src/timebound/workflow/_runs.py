"""A run's moves: started, ended (its live tokens cancelled), timed out as a whole (D6.4),
completed when its last token ends (a part of :class:`~timebound.workflow._machine.Machine`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .._core._breakdown import build
from .._store import Tx
from ..telemetry._tracing import open_run
from ._bounds import WORKFLOW_TIMEOUT, WORKFLOW_TIMEOUT_ERROR, run_bound, stored_bound
from ._definition import Definition
from ._rows import LIVE_SQL, PRIORITY_RUN, TERMINAL, RunEnd, decode, encode, new_id
from ._tokens import TokenMoves

__all__ = ["BULK_CANCEL_AFTER", "RunMoves"]

#: Past this many idle live tokens, a run's end cancels them with one statement (D6.24a).
BULK_CANCEL_AFTER = 100


class RunMoves(TokenMoves):
    """Run transitions. The machine provides ``_on_run_finished(run_id, ended)``, called after
    the commit that ended a run (``ended``: how, when this transaction holds the run's row)."""

    _on_run_finished: Callable[[str, RunEnd | None], None]

    async def start_run(
        self,
        tx: Tx,
        definition: Definition,
        input: Any,
        now: int,
        *,
        timeout_ms: int | None,
        timeout_set_by: str = "definition",
        parent_token_id: str | None = None,
        inherited_deadline_at: int | None = None,
        inherited_set_by: str = "caller",
        run_id: str | None = None,
        idempotency_key: str | None = None,
        request_digest: str | None = None,
        traceparent: str | None = None,
    ) -> str:
        """Insert a running run and its first token; answers its id.

        The run's deadline is the earliest of its own timeout (``timeout_ms`` from now, set by
        ``timeout_set_by``: the definition, or a parent's node or action) and
        ``inherited_deadline_at`` (set by ``inherited_set_by``: the caller of ``start`` or the
        parent run). Which of them it is, is stored with the run (D6.17): a tie goes to the
        inherited one, the larger scope (as D6.4).
        """
        run_id = run_id or new_id()
        # The run's span, child of the caller's (D10.5); its context is stored with the run.
        traceparent = open_run(
            run_id, traceparent, definition_id=definition.id, definition_version=definition.version
        )
        bound = run_bound(now, timeout_ms, timeout_set_by, inherited_deadline_at, inherited_set_by)
        timeout_at = None if bound is None else bound["deadline_at"]
        await tx.execute(
            "INSERT INTO tb_wf_runs (id, definition_id, definition_version, status, input, state, "
            "started_at, timeout_at, parent_token_id, inherited_deadline_at, timeout_bound, "
            "idempotency_key, request_digest, traceparent) "
            "VALUES (?, ?, ?, 'running', ?, '{}', ?, ?, ?, ?, ?, ?, ?, ?)",
            run_id,
            definition.id,
            definition.version,
            encode(input),
            now,
            timeout_at,
            parent_token_id,
            inherited_deadline_at,
            None if bound is None else encode(bound),
            idempotency_key,
            request_digest,
            traceparent,
        )
        await tx.append_event(
            run_id,
            "run_started",
            now,
            workflow_run_id=run_id,
            definition_id=definition.id,
            definition_version=definition.version,
            timeout_at=timeout_at,
            timeout_bound=bound,
        )
        if timeout_at is not None:
            await tx.set_timer(f"run:{run_id}", "run", run_id, timeout_at, PRIORITY_RUN)
        await self._new_token(tx, run_id, definition, definition.initial_node, now, branch=None)
        return run_id

    async def _finish_run(
        self,
        tx: Tx,
        run: dict[str, Any],
        status: str,
        now: int,
        error: str | None = None,
        code: str | None = None,
    ) -> bool:
        """End a run: every live token becomes ``cancelled`` unless already ended by the caller.

        Only a run still ``running`` is ended, decided by the UPDATE itself (D6.13): a run read
        without its lock (an operator's cancel, a parent's cancel of its child) may have been
        ended by another worker meanwhile, and its end stands (on PostgreSQL the UPDATE waits for
        that worker's lock, then sees its commit). ``False`` when the run had ended already.

        ``code`` is how it ended, stored for code to read (D6.17): never its message.
        """
        run_id = run["id"]
        changed = await tx.execute(
            "UPDATE tb_wf_runs SET status = ?, finished_at = ?, error = ?, error_code = ? "
            "WHERE id = ? AND status = 'running'",
            status,
            now,
            error,
            code,
            run_id,
        )
        if not changed:
            return False
        self._run_changed(tx, run, status=status, finished_at=now, error=error, error_code=code)
        tx.wake_others = True  # waiters in other processes
        await self._cancel_live_tokens(tx, run_id, now, reason=f"run_{status}")
        await tx.clear_stream_timers(run_id)
        await tx.append_event(
            run_id, f"run_{status}", now, workflow_run_id=run_id, error=error, error_code=code
        )
        # After the commit: a waiter woken earlier reads the run still running (committed state)
        # and, on a shared store, would then wait for the sweep (its own NOTIFY is ignored).
        # The run's row as this transaction holds it is current (_run_changed keeps it so): a
        # waiter in this process takes how it ended from here, without reading it back.
        ended = None
        if tx.held.get(("run", run_id)) is run:
            ended = RunEnd(status, run["state"], error)
        tx.after_commit(functools.partial(self._on_run_finished, run_id, ended))
        if run["parent_token_id"] is not None and status != "cancelled":
            await self.children.child_finished(tx, run, status, now, error)
        return True

    async def _cancel_live_tokens(self, tx: Tx, run_id: str, now: int, reason: str) -> None:
        """Every live token of an ended run becomes ``cancelled``, in bulk past a few (D6.24a).

        A run stopped at the token limit holds ~20,000 live tokens: ending them one by one (a
        statement per token timer, a stop notice and an event per token) held the loop 1.5 s.
        A token that may have an attempt somewhere (``dispatched``, ``executing``) or a child run
        goes through :meth:`_set_token`, which stops the attempt (here or, at commit, in its
        process: D6.14) and cancels the children. The others (``pending``, or waiting at a
        join) have nothing running: up to :data:`BULK_CANCEL_AFTER` of them are ended one by
        one as well, each with its ``token_cancelled`` event; past that, all of them are ended by
        one UPDATE and one ``tokens_cancelled`` event counts them. Their timers go with the run's
        (the caller clears them in one statement). The caller holds the run's row (its UPDATE
        decided the end, D6.13) and a claim locks the run first, so no token read ``pending``
        here is claimed meanwhile; a late result of any of them is discarded (D6.10).
        """
        for tok in await tx.fetch(
            f"SELECT * FROM tb_wf_tokens WHERE run_id = ? AND status IN {LIVE_SQL} "
            "AND (status IN ('dispatched', 'executing') OR child_run_id IS NOT NULL) ORDER BY seq",
            run_id,
        ):
            await self._set_token(tx, tok, "cancelled", now, reason=reason)
        idle_sql = (
            "WHERE run_id = ? AND status IN ('pending', 'waiting_for_siblings') "
            "AND child_run_id IS NULL"
        )
        idle = await tx.fetch(
            f"SELECT * FROM tb_wf_tokens {idle_sql} ORDER BY seq LIMIT ?",
            run_id,
            BULK_CANCEL_AFTER + 1,
        )
        if len(idle) > BULK_CANCEL_AFTER:
            count = await tx.execute(
                "UPDATE tb_wf_tokens SET status = 'cancelled', updated_at = ?, lease_owner = NULL "
                + idle_sql,
                now,
                run_id,
            )
            await tx.append_event(run_id, "tokens_cancelled", now, count=count, reason=reason)
            return
        for tok in idle:
            data = decode(tok["state_data"]) or {}
            data["reason"] = reason
            tx.defer(
                ("tok", tok["id"]),
                "UPDATE tb_wf_tokens SET status = 'cancelled', state_data = ?, updated_at = ?, "
                "lease_owner = NULL WHERE id = ?",
                encode(data),
                now,
                tok["id"],
            )
            await tx.append_event(
                run_id,
                "token_cancelled",
                now,
                token_id=tok["id"],
                node_id=tok["node_id"],
                branch_index=tok["branch_index"],
                reason=reason,
            )

    async def cancel_run(self, tx: Tx, run_id: str, now: int) -> bool:
        run = await self.run(tx, run_id)
        if run is None or run["status"] != "running":
            return False
        return await self._finish_run(tx, run, "cancelled", now, "cancelled", "cancelled")

    async def fail_run(
        self, tx: Tx, run: dict[str, Any], error: str, now: int, code: str = "failed"
    ) -> None:
        await self._finish_run(tx, run, "failed", now, error, code)

    async def workflow_timeout(self, tx: Tx, run: dict[str, Any], now: int) -> None:
        """Every live token → ``timed_out`` (reason ``workflow_timeout``); then the run's policy.

        The bound reported is the one that set the run's deadline (D6.17): the definition's
        timeout, the caller's deadline or the parent's, stored with the run when it started.
        """
        definition = await self.definition(tx, run)
        policy = definition.on_timeout
        bound = stored_bound(run, definition)
        breakdown = await self._run_breakdown(tx, run, bound["duration_ms"], now)
        for tok in await tx.fetch(
            f"SELECT * FROM tb_wf_tokens WHERE run_id = ? AND status IN {LIVE_SQL} ORDER BY seq",
            run["id"],
        ):
            await self._set_token(tx, tok, "timed_out", now, reason="workflow_timeout")
            await self._timed_out_event(
                tx,
                tok,
                "workflow",
                bound["duration_ms"],
                policy,
                run["timeout_at"],
                now,
                set_by=bound["set_by"],
                set_by_id=run["definition_id"] if bound["set_by"] == "definition" else None,
                breakdown=breakdown,
            )
        status = "failed" if policy == "fail" else "timed_out"
        await self._finish_run(tx, run, status, now, WORKFLOW_TIMEOUT_ERROR, WORKFLOW_TIMEOUT)

    @staticmethod
    async def _run_breakdown(
        tx: Tx, run: dict[str, Any], duration_ms: int | None, now: int
    ) -> dict[str, Any]:
        """D13: where a timed-out run's budget went: each node's tokens from their creation to
        their end (the live ones to now), side by side where they overlapped."""
        marks: list[Any] = []
        for tok in await tx.fetch(
            "SELECT node_id, status, created_at, updated_at FROM tb_wf_tokens WHERE run_id = ? "
            "ORDER BY seq LIMIT 256",
            run["id"],
        ):
            live = tok["status"] not in TERMINAL
            end = now if live else tok["updated_at"]
            outcome = "cut" if live else tok["status"]
            t0 = tok["created_at"] / 1000.0
            marks.append(("node", str(tok["node_id"])[:120], t0, end / 1000.0, None, outcome, None))
        budget = None if duration_ms is None else duration_ms / 1000.0
        start = run["started_at"] / 1000.0
        bd = build("bound", "workflow", start, now / 1000.0, budget, "timeout", marks, len(marks))
        return bd.to_dict()

    @staticmethod
    def run_live(run: dict[str, Any], now: int) -> bool:
        """Whether the run is running and its timeout not due: what makes
        :meth:`check_run_deadline` answer ``False`` (and change nothing)."""
        return run["status"] == "running" and (run["timeout_at"] is None or now < run["timeout_at"])

    async def check_run_deadline(self, tx: Tx, run: dict[str, Any], now: int) -> bool:
        """Apply the workflow timeout if it is due; ``True`` when the run is (now) over."""
        if run["status"] != "running":
            return True
        if run["timeout_at"] is not None and now >= run["timeout_at"]:
            if run["parent_token_id"] is not None and await self._parent_over(tx, run, now):
                return True
            await self.workflow_timeout(tx, run, now)
            return True
        return False

    async def _parent_over(self, tx: Tx, run: dict[str, Any], now: int) -> bool:
        """A child run whose deadline is due: the parent's first, when due at the same instant
        (an inherited deadline, D6.4, D6.17): the larger scope is the one reported, and its end
        cancels the child. ``True`` if that ended the child."""
        tok = await self.token(tx, run["parent_token_id"])
        parent = None if tok is None else await self.run(tx, tok["run_id"])
        if (
            parent is None
            or parent["status"] != "running"
            or not await self.check_run_deadline(tx, parent, now)
        ):
            return False
        row = await tx.fetchone("SELECT status FROM tb_wf_runs WHERE id = ?", run["id"])
        if row is not None and row["status"] != "running":
            self._run_changed(tx, run, status=row["status"])
            return True
        return False

    async def _maybe_complete_run(self, tx: Tx, run_id: str, now: int) -> None:
        row = await tx.fetchone(
            f"SELECT COUNT(*) AS n FROM tb_wf_tokens WHERE run_id = ? AND status IN {LIVE_SQL}",
            run_id,
        )
        if row is not None and row["n"] == 0:
            run = await self.run(tx, run_id)
            if run is not None and run["status"] == "running":
                await self._finish_run(tx, run, "completed", now)
