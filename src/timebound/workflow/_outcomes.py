"""What an attempt's outcome does to its run: a completion follows the node's transitions, an
error its retry block, a timeout its ``on_timeout`` policy (a part of
:class:`~timebound.workflow._machine.Machine`)."""

from __future__ import annotations

from typing import Any

from .._store import Tx
from ..policies._retry import RetryAt, RetryPlan, RetryState
from ._bounds import NODE_TIMEOUT
from ._definition import RetryBlock, Transition
from ._joins import Joins
from ._limits import RunLimitExceeded, check_growth
from ._rows import PRIORITY_TOKEN, decode, encode, keep_decoded
from ._runs import RunMoves
from ._schedule import made_pending

__all__ = ["Outcomes", "retry_delay_ms", "retry_plan"]


def retry_plan(block: RetryBlock, what: str) -> RetryPlan:
    """The retry decision core's plan for a node's ``retry`` block (D3.1-D3.2): what the
    engine decides each retry with, and what the worst-case time check reads (D14.6)."""
    return RetryPlan(
        what,
        retry=block.max_attempts - 1,
        delay=block.delay_ms / 1000,
        backoff=block.backoff,
        max_delay=block.max_delay_ms / 1000,
    )


def retry_delay_ms(block: RetryBlock, attempts_done: int, error: str, what: str) -> int | None:
    """The delay before the next attempt after an action error, or ``None`` to stop.

    Decided by the policies' retry decision core (D3.1-D3.2), the one implementation of retry
    counting and backoff; the engine persists the delay as the token's ``not_before`` instead of
    sleeping.
    """
    plan = retry_plan(block, what)
    _, decision = plan.failed(RetryState(attempt=attempts_done - 1), RuntimeError(error))
    return round(decision.delay * 1000) if isinstance(decision, RetryAt) else None


class Outcomes(RunMoves):
    """Outcome transitions, on the token and run moves (the machine provides ``joins``)."""

    joins: Joins

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
        set_by_id: str | None = None,
        breakdown: dict[str, Any] | None = None,
    ) -> None:
        """The node's deadline was reached: its ``on_timeout`` policy (D6.1).

        ``duration``, ``cause`` and ``set_by`` (with ``set_by_id``) describe a bound enforced
        elsewhere (a child run's timeout, a deadline a called service reported spent); by
        default the bound is the node's ``timeout_ms``, else its action's (D6.17).
        """
        definition = await self.definition(tx, run)
        node = definition.nodes[tok["node_id"]]
        if duration is None:
            duration = definition.node_timeout_ms(node)
        if set_by is None:
            set_by = "node" if node.timeout_set else "action"
        if set_by_id is None:
            set_by_id = {"node": node.id, "action": node.action_id}.get(set_by)
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
                "node",
                duration,
                "retry",
                deadline_at,
                now,
                set_by=set_by,
                set_by_id=set_by_id,
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
            made_pending(tx, now)
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
        await self._set_token(tx, tok, "timed_out", now, reason="node_timeout")
        await self._timed_out_event(
            tx,
            tok,
            "node",
            duration,
            "fail",
            deadline_at,
            now,
            set_by=set_by,
            set_by_id=set_by_id,
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
            made_pending(tx, now + delay)
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
            keep_decoded(tx, encoded_state, state)  # the next attempt's ctx.state (D6.36)
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
