"""The workflow state machine: every durable change of runs, tokens and joins, one transaction each.

All functions take an open transaction and the current instant ``now`` (epoch ms, floored so a
deadline is never reached early). Each change writes its event in the same transaction, so a
crash leaves either both or neither. The three timeout layers live here:

* workflow: :meth:`Machine.workflow_timeout`, checked first by every entry point (D6.4);
* node: :meth:`Machine.token_timeout` (``fail`` or ``retry``; pending/dispatched → ``fail``);
* synchronization: :meth:`Machine.join_timeout`, from the first arrival (D6.2, D6.3).
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from .._core._breakdown import build
from .._store import Tx
from ..policies._retry import RetryAt, RetryPlan, RetryState
from ..telemetry._tracing import open_run
from ._bounds import NODE_TIMEOUT, WORKFLOW_TIMEOUT, WORKFLOW_TIMEOUT_ERROR, run_bound, stored_bound
from ._children import Children
from ._definition import Definition, RetryBlock, Transition, parse_definition
from ._joins import Joins
from ._limits import RunLimitExceeded, check_growth
from ._metrics import tally_timeout
from ._rows import (
    LIVE_SQL,
    PRIORITY_RUN,
    PRIORITY_TOKEN,
    TERMINAL,
    decode,
    encode,
)

__all__ = ["Machine", "retry_delay_ms"]


def retry_delay_ms(block: RetryBlock, attempts_done: int, error: str, what: str) -> int | None:
    """The delay before the next attempt after an action error, or ``None`` to stop.

    Decided by the policies' retry decision core (D3.1-D3.2), the one implementation of retry
    counting and backoff; the engine persists the delay as the token's ``not_before`` instead of
    sleeping.
    """
    plan = RetryPlan(
        what,
        retry=block.max_attempts - 1,
        delay=block.delay_ms / 1000,
        backoff=block.backoff,
        max_delay=block.max_delay_ms / 1000,
    )
    _, decision = plan.failed(RetryState(attempt=attempts_done - 1), RuntimeError(error))
    return round(decision.delay * 1000) if isinstance(decision, RetryAt) else None


#: Past this many idle live tokens, a run's end cancels them with one statement (D6.24a).
BULK_CANCEL_AFTER = 100


class Machine:
    """State transitions for one engine. ``cancel_attempt(token_id)`` stops local in-flight work."""

    def __init__(
        self,
        definitions: dict[tuple[str, int], Definition],
        cancel_attempt: Callable[[str], None],
        on_run_finished: Callable[[str], None],
    ) -> None:
        self.definitions = definitions
        self._cancel_attempt = cancel_attempt
        self._on_run_finished = on_run_finished
        self.late_results = 0
        self._seq = 0
        self.joins = Joins(self)
        self.children = Children(self)

    # Loading --------------------------------------------------------------------------------

    async def run(self, tx: Tx, run_id: str, *, lock: str = "") -> dict[str, Any] | None:
        """The run's row, read once per transaction when the transaction holds it.

        A row read under its lock (``lock``, PostgreSQL's ``FOR UPDATE``) or in an exclusive
        transaction (SQLite) cannot change behind us until the commit, so it is kept in
        ``tx.held`` and answered from there: a turn reads and locks a run once, however many of
        its tokens it handles. Every change of a run goes through :meth:`_run_changed`, which
        keeps the held row current. An unlocked read on a shared store is never kept (another
        worker may change the row), but a held row answers it: we hold its lock.
        """
        held = tx.held.get(("run", run_id))
        if held is not None:
            return held  # type: ignore[no-any-return]
        row = await tx.fetch_row(
            ("run", run_id), f"SELECT * FROM tb_wf_runs WHERE id = ?{lock}", run_id
        )
        if row is not None and (lock or tx.exclusive):
            tx.held[("run", run_id)] = row
        return row

    async def hold_runs(self, tx: Tx, run_ids: Iterable[str], *, lock: str = "") -> None:
        """Read (and lock, in id order) the runs not yet held, one statement per 500: what
        :meth:`run` would read one by one for each token of a turn."""
        if not (lock or tx.exclusive):
            return
        wanted = sorted({r for r in run_ids if ("run", r) not in tx.held})
        for i in range(0, len(wanted), 500):
            chunk = wanted[i : i + 500]
            marks = ", ".join("?" * len(chunk))
            for row in await tx.fetch(
                f"SELECT * FROM tb_wf_runs WHERE id IN ({marks}) ORDER BY id{lock}", *chunk
            ):
                tx.held[("run", row["id"])] = row

    @staticmethod
    def _run_changed(tx: Tx, run: dict[str, Any], **fields: Any) -> None:
        """Record in ``run`` (and in the held row, if it is another dict) what was just written."""
        run.update(fields)
        held = tx.held.get(("run", run["id"]))
        if held is not None and held is not run:
            held.update(fields)

    async def token(self, tx: Tx, token_id: str) -> dict[str, Any] | None:
        return await tx.fetch_row(
            ("tok", token_id), "SELECT * FROM tb_wf_tokens WHERE id = ?", token_id
        )

    async def definition(self, tx: Tx, run: dict[str, Any]) -> Definition:
        """The definition a run started with (runs keep their version), cached by the engine."""
        key = (run["definition_id"], int(run["definition_version"]))
        found = self.definitions.get(key)
        if found is None:
            row = await tx.fetchone(
                "SELECT body FROM tb_wf_definitions WHERE id = ? AND version = ?", *key
            )
            if row is None:
                raise LookupError(f"definition {key[0]!r} version {key[1]} is not stored")
            found = self.definitions[key] = parse_definition(json.loads(row["body"]))
        return found

    # Runs -----------------------------------------------------------------------------------

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
        run_id = run_id or uuid.uuid4().hex
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
        tx.after_commit(functools.partial(self._on_run_finished, run_id))
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

    # Tokens ---------------------------------------------------------------------------------

    async def _new_token(
        self,
        tx: Tx,
        run_id: str,
        definition: Definition,
        node_id: str,
        now: int,
        *,
        branch: dict[str, Any] | None,
    ) -> str:
        token_id = uuid.uuid4().hex
        tx.wake_others = True
        # Creation order without a query: increasing in this process, and across processes
        # ordered by the creation millisecond.
        self._seq = seq = max(self._seq + 1, now * 1000)
        b = branch or {}
        # A token stuck in pending/dispatched longer than its node timeout times out (fail).
        timeout_ms = definition.node_timeout_ms(definition.nodes[node_id])
        timeout_at = None if timeout_ms is None else now + timeout_ms
        tx.defer(
            ("tok", token_id),
            "INSERT INTO tb_wf_tokens (id, run_id, node_id, status, seq, branch_index, "
            "branch_total, branch_item, branch_output, fan_out_transition_id, group_key, "
            "outer_branch, lineage, timeout_at, not_before, state_data, created_at, updated_at) "
            "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '{}', ?, ?)",
            token_id,
            run_id,
            node_id,
            seq,
            b.get("branch_index"),
            b.get("branch_total"),
            None if branch is None else encode(b.get("branch_item")),
            None if branch is None else encode(b.get("branch_output")),
            b.get("fan_out_transition_id"),
            b.get("group_key"),
            b.get("outer_branch"),
            b.get("lineage", ""),
            timeout_at,
            now,
            now,
            now,
        )
        if timeout_at is not None:
            await tx.set_timer(f"tok:{token_id}", "token", run_id, timeout_at, PRIORITY_TOKEN)
        await tx.append_event(
            run_id,
            "token_created",
            now,
            token_id=token_id,
            node_id=node_id,
            branch_index=b.get("branch_index"),
        )
        return token_id

    async def _set_token(
        self,
        tx: Tx,
        tok: dict[str, Any],
        status: str,
        now: int,
        *,
        output: str | None = None,
        **fields: Any,
    ) -> None:
        """Move a token to ``status``; ``fields`` go into ``state_data`` and the event.
        ``output`` (encoded) is stored with it, as :meth:`_write_output` would."""
        state_data = tok["state_data"]
        if fields:
            data = decode(state_data) or {}
            data.update(fields)
            state_data = encode(data)
        # Deferred (Tx.defer): the same UPDATE of many tokens in a turn goes as one batch.
        if output is None:
            tx.defer(
                ("tok", tok["id"]),
                "UPDATE tb_wf_tokens SET status = ?, state_data = ?, updated_at = ?, "
                "lease_owner = CASE WHEN ? THEN NULL ELSE lease_owner END WHERE id = ?",
                status,
                state_data,
                now,
                status in TERMINAL,
                tok["id"],
            )
        else:
            tx.defer(
                ("tok", tok["id"]),
                "UPDATE tb_wf_tokens SET status = ?, state_data = ?, updated_at = ?, "
                "lease_owner = CASE WHEN ? THEN NULL ELSE lease_owner END, output = ?, "
                "branch_output = CASE WHEN ? THEN ? ELSE branch_output END WHERE id = ?",
                status,
                state_data,
                now,
                status in TERMINAL,
                output,
                tok["branch_index"] is not None,
                output,
                tok["id"],
            )
        tok["status"], tok["state_data"] = status, state_data
        if tok["timeout_at"] is not None and (
            status in TERMINAL or status == "waiting_for_siblings"
        ):
            await tx.clear_timer(f"tok:{tok['id']}")
        if status in TERMINAL:
            self._cancel_attempt(tok["id"])
            if tok["child_run_id"] is not None:
                await self.children.cancel_children(tx, tok["id"], now)
        if status != "timed_out":  # token_timed_out carries the seed's richer shape
            await tx.append_event(
                tok["run_id"],
                f"token_{status}",
                now,
                token_id=tok["id"],
                node_id=tok["node_id"],
                branch_index=tok["branch_index"],
                **fields,
            )

    async def _timed_out_event(
        self,
        tx: Tx,
        tok: dict[str, Any],
        timeout_type: str,
        duration_ms: int | None,
        policy: str,
        deadline_at: int | None,
        now: int,
        *,
        set_by: str | None = None,
        breakdown: dict[str, Any] | None = None,
    ) -> None:
        """Record the bound that fired: its layer, length, policy, deadline and (D6.17) where
        it was set: ``definition``, ``caller``, ``parent``, ``node``, ``action``, ``join`` or
        ``propagated``; and (D13) where its budget went, when known."""
        lag = None if deadline_at is None else now - deadline_at
        extra = {} if breakdown is None else {"breakdown": breakdown}
        await tx.append_event(
            tok["run_id"],
            "token_timed_out",
            now,
            token_id=tok["id"],
            workflow_run_id=tok["run_id"],
            node_id=tok["node_id"],
            timeout_type=timeout_type,
            timeout_duration_ms=duration_ms,
            bound_set_by=set_by,
            policy_applied=policy,
            deadline_at=deadline_at,
            detection_lag_ms=lag,
            **extra,
        )
        if timeout_type != "synchronization":  # a fan-in counts once, as its join (D6.17)
            tally_timeout(
                tx, timeout_type, policy, None if deadline_at is None else now - deadline_at
            )

    async def claim(
        self,
        tx: Tx,
        tok: dict[str, Any],
        owner: str,
        lease_until: int,
        now: int,
        *,
        write: bool = True,
    ) -> None:
        """Take a ready token under a lease (``dispatched``).

        ``write=False`` leaves the row's change to :meth:`begin_attempt`, which the caller
        promises to call next in this transaction (one statement instead of two for the same
        row, the same committed result), or else :meth:`write_claim`.
        """
        tok.update(status="dispatched", lease_owner=owner, lease_until=lease_until)
        if write:
            await self.write_claim(tx, tok, now)
        await tx.append_event(
            tok["run_id"],
            "token_dispatched",
            now,
            token_id=tok["id"],
            node_id=tok["node_id"],
            worker=owner,
        )

    async def write_claim(self, tx: Tx, tok: dict[str, Any], now: int) -> None:
        """Store a claim made with ``claim(write=False)`` (its event is already recorded).

        Only a token still ``pending`` is claimed: a token ended in this transaction after it
        was selected (its run timed out or failed while a sibling was handled) stays ended."""
        await tx.execute(
            "UPDATE tb_wf_tokens SET status = 'dispatched', lease_owner = ?, lease_until = ?, "
            "updated_at = ? WHERE id = ? AND status = 'pending'",
            tok["lease_owner"],
            tok["lease_until"],
            now,
            tok["id"],
        )

    async def begin_attempt(
        self, tx: Tx, tok: dict[str, Any], definition: Definition, now: int
    ) -> int | None:
        """``dispatched`` → ``executing``: a fresh node timeout (kept when resuming after a
        crash, so a restart never grants extra time). Returns the token's deadline.

        The token's lease (its claim, ``tok["lease_owner"]`` and ``tok["lease_until"]``) is
        written with it, so a claim made without its own write is stored here."""
        state_data = tok["state_data"]
        timeout_ms = definition.node_timeout_ms(definition.nodes[tok["node_id"]])
        timeout_at = tok["timeout_at"]
        resume = False
        if '"resume"' in state_data:  # set only by a re-dispatch after a crash
            data = decode(state_data)
            resume = data.pop("resume", False)
            if resume:  # counted, so a re-run keeps its call's idempotency key (D7.11)
                data["reruns"] = data.get("reruns", 0) + 1
            state_data = encode(data)
        if not resume:
            timeout_at = None if timeout_ms is None else now + timeout_ms
        attempt = tok["attempt"] + 1
        tx.defer(
            ("tok", tok["id"]),
            "UPDATE tb_wf_tokens SET status = 'executing', attempt = ?, timeout_at = ?, "
            "state_data = ?, updated_at = ?, lease_owner = ?, lease_until = ? WHERE id = ?",
            attempt,
            timeout_at,
            state_data,
            now,
            tok["lease_owner"],
            tok["lease_until"],
            tok["id"],
        )
        if timeout_at is not None:
            await tx.set_timer(
                f"tok:{tok['id']}", "token", tok["run_id"], timeout_at, PRIORITY_TOKEN
            )
        await tx.append_event(
            tok["run_id"],
            "token_executing",
            now,
            token_id=tok["id"],
            node_id=tok["node_id"],
            branch_index=tok["branch_index"],
            attempt=attempt,
            timeout_at=timeout_at,
        )
        tok.update(
            status="executing", attempt=attempt, timeout_at=timeout_at, state_data=state_data
        )
        return timeout_at  # type: ignore[no-any-return]

    async def late_result(self, tx: Tx, run_id: str, token_id: str, attempt: int, now: int) -> None:
        """A result nobody will read (D6.10): discarded, counted and recorded."""
        self.late_results += 1
        await tx.append_event(
            run_id, "late_result_discarded", now, token_id=token_id, attempt=attempt
        )

    async def token_timeout(
        self,
        tx: Tx,
        run: dict[str, Any],
        tok: dict[str, Any],
        now: int,
        *,
        duration: int | None = None,
        cause: str | None = None,
        set_by: str | None = None,
        breakdown: dict[str, Any] | None = None,
    ) -> None:
        """The node's deadline was reached: its ``on_timeout`` policy (D6.1).

        ``duration``, ``cause`` and ``set_by`` describe a bound enforced elsewhere (a child
        run's timeout, a deadline a called service reported spent); by default the bound is
        the node's ``timeout_ms``, else its action's (D6.17).
        """
        definition = await self.definition(tx, run)
        node = definition.nodes[tok["node_id"]]
        if duration is None:
            duration = definition.node_timeout_ms(node)
        if set_by is None:
            set_by = "node" if node.timeout_set else "action"
        deadline_at = tok["timeout_at"]
        policy = definition.node_on_timeout(node)
        if tok["status"] in ("pending", "dispatched"):
            policy = "fail"  # stuck before executing (D6.1)
        if set_by == "propagated":
            # A called service spent the whole budget we sent (D4.5): the chain is out of
            # time, nothing is retried, and the bound ended when we learned it (D6.17).
            policy, deadline_at = "fail", now
            cause = cause or f"a called service spent the {duration}ms budget sent with it"
        if policy == "retry" and tok["retry_count"] < node.max_retries:
            await self._timed_out_event(
                tx,
                tok,
                "execution",
                duration,
                "retry",
                deadline_at,
                now,
                set_by=set_by,
                breakdown=breakdown,
            )
            self._cancel_attempt(tok["id"])
            await self.children.cancel_children(tx, tok["id"], now)
            await tx.execute(
                "UPDATE tb_wf_tokens SET status = 'pending', retry_count = retry_count + 1, "
                "not_before = ?, timeout_at = ?, lease_owner = NULL, updated_at = ? WHERE id = ?",
                now,
                None if duration is None else now + duration,
                now,
                tok["id"],
            )
            if duration is not None:
                await tx.set_timer(
                    f"tok:{tok['id']}", "token", run["id"], now + duration, PRIORITY_TOKEN
                )
            await tx.append_event(
                run["id"],
                "token_pending",
                now,
                token_id=tok["id"],
                node_id=tok["node_id"],
                retry_count=tok["retry_count"] + 1,
            )
            return
        await self._set_token(tx, tok, "timed_out", now, reason="execution_timeout")
        await self._timed_out_event(
            tx,
            tok,
            "execution",
            duration,
            "fail",
            deadline_at,
            now,
            set_by=set_by,
            breakdown=breakdown,
        )
        error = f"timed out: {cause}" if cause else f"timed out after {duration}ms"
        await self._token_ended_badly(
            tx, run, tok, f"node '{tok['node_id']}' {error}", now, code=NODE_TIMEOUT
        )

    async def action_error(
        self, tx: Tx, run: dict[str, Any], tok: dict[str, Any], error: str, now: int
    ) -> None:
        """An action error that is not a timeout: the node's ``retry`` block, else failure."""
        node = (await self.definition(tx, run)).nodes[tok["node_id"]]
        # Attempts a crash or a stop cut short are re-runs, not failures: no retry spent (D6.16).
        reruns = (decode(tok["state_data"]) or {}).get("reruns", 0)
        done = tok["attempt"] - reruns
        delay = (
            None
            if node.retry is None
            else retry_delay_ms(node.retry, done, error, f"workflow node '{node.id}'")
        )
        if delay is not None:
            # The delay is durable: not_before is stored, and the loop's timer is armed from it.
            await tx.execute(
                "UPDATE tb_wf_tokens SET status = 'pending', not_before = ?, lease_owner = NULL, "
                "timeout_at = NULL, error = ?, updated_at = ? WHERE id = ?",
                now + delay,
                error,
                now,
                tok["id"],
            )
            await tx.clear_timer(f"tok:{tok['id']}")
            await tx.append_event(
                run["id"],
                "token_retry_scheduled",
                now,
                token_id=tok["id"],
                node_id=tok["node_id"],
                attempt=tok["attempt"],
                retry_at=now + delay,
                error=error,
            )
            return
        await tx.execute("UPDATE tb_wf_tokens SET error = ? WHERE id = ?", error, tok["id"])
        await self._set_token(tx, tok, "failed", now, error=error)
        await self._token_ended_badly(tx, run, tok, f"node '{tok['node_id']}' failed: {error}", now)

    async def _token_ended_badly(
        self,
        tx: Tx,
        run: dict[str, Any],
        tok: dict[str, Any],
        error: str,
        now: int,
        *,
        code: str = "failed",
    ) -> None:
        """D6.8: the run fails, unless the token is a sibling its join can still do without."""
        definition = await self.definition(tx, run)
        group = tok["fan_out_transition_id"]
        join = None if group is None else definition.join_for_group(group)
        if join is None:
            await self.fail_run(tx, run, error, now, code)
            return
        await self.joins.mark_arrival(tx, tok, "failed", now)
        await self.joins.evaluate_join(tx, run, definition, join, tok["group_key"], now, error)

    async def complete(
        self, tx: Tx, run: dict[str, Any], tok: dict[str, Any], output: Any, now: int
    ) -> None:
        """The attempt succeeded: store the output and follow the node's transitions."""
        definition = await self.definition(tx, run)
        in_branch = tok["branch_index"] is not None
        encoded = encode(output)
        outgoing = definition.outgoing(tok["node_id"])
        # On a plain path (no fan-out, no join) nothing reads the token's output before it is
        # completed, so the output goes with the status, one statement: same transaction, same
        # committed row. A fan-out or a join reads branch outputs back: written first.
        plain = all(t.synchronization is None and not t.fans_out for t in outgoing)
        if not plain:
            await self._write_output(tx, tok, encoded)
        if not in_branch:
            state = decode(run["state"])
            state[tok["node_id"]] = output
            encoded_state = encode(state)
            tx.defer(
                ("run", run["id"]),
                "UPDATE tb_wf_runs SET state = ? WHERE id = ?",
                encoded_state,
                run["id"],
            )
            self._run_changed(tx, run, state=encoded_state)
        branch = self._branch_of(tok, output)
        joins: list[Transition] = []
        try:
            for transition in outgoing:
                if transition.synchronization is not None:
                    joins.append(transition)
                elif transition.fans_out:
                    await self.joins.fan_out(tx, run, definition, transition, tok, branch, now)
                else:
                    if transition.target in definition.cyclic:  # a loop grows the run (D6.24)
                        await check_growth(tx, run["id"], 1)
                    await self._new_token(
                        tx, run["id"], definition, transition.target, now, branch=branch
                    )
        except (KeyError, TypeError, RunLimitExceeded) as exc:
            if plain:
                await self._write_output(tx, tok, encoded)
            await self._set_token(tx, tok, "failed", now, error=str(exc))
            await self.fail_run(tx, run, f"node '{tok['node_id']}': {exc}", now)
            return
        if not joins:
            await self._set_token(tx, tok, "completed", now, output=encoded if plain else None)
            if not outgoing:  # only a token that ends its path can end the run
                await self._maybe_complete_run(tx, run["id"], now)
            return
        for join in joins:
            sync = join.synchronization
            assert sync is not None
            if tok["fan_out_transition_id"] != sync.sibling_group:
                await self._set_token(tx, tok, "failed", now, error="outside its sibling group")
                await self.fail_run(
                    tx,
                    run,
                    f"node '{tok['node_id']}' reached join '{join.id}' outside the "
                    f"sibling group '{sync.sibling_group}'",
                    now,
                )
                return
            await self._set_token(tx, tok, "waiting_for_siblings", now, arrived_at=now)
            await self.joins.mark_arrival(tx, tok, "completed", now)
            await self.joins.evaluate_join(tx, run, definition, join, tok["group_key"], now, None)

    @staticmethod
    async def _write_output(tx: Tx, tok: dict[str, Any], encoded: str) -> None:
        await tx.execute(
            "UPDATE tb_wf_tokens SET output = ?, branch_output = CASE WHEN ? THEN ? "
            "ELSE branch_output END WHERE id = ?",
            encoded,
            tok["branch_index"] is not None,
            encoded,
            tok["id"],
        )

    @staticmethod
    def _branch_of(tok: dict[str, Any], output: Any) -> dict[str, Any] | None:
        if tok["branch_index"] is None:
            return None
        return {
            "branch_index": tok["branch_index"],
            "branch_total": tok["branch_total"],
            "branch_item": decode(tok["branch_item"]),
            "branch_output": output,
            "fan_out_transition_id": tok["fan_out_transition_id"],
            "group_key": tok["group_key"],
            "outer_branch": tok["outer_branch"],
            "lineage": tok["lineage"],
        }
