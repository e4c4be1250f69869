"""Subworkflows (D6.7): a ``workflow_call`` token's child run, its timeouts and its end.

Part of the state machine (:mod:`._machine`), kept apart as :mod:`._joins` is; it changes
storage only through the same transaction and helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._store import Tx
from ._bounds import WORKFLOW_TIMEOUT, stored_bound
from ._definition import Definition, Node
from ._rows import decode

if TYPE_CHECKING:
    from ._machine import Machine

__all__ = ["Children"]


class Children:
    """Child runs of one engine's state machine."""

    def __init__(self, machine: Machine) -> None:
        self._m = machine

    async def cancel_children(self, tx: Tx, token_id: str, now: int) -> None:
        """A parent token that ends or retries cancels its running child run (D6.7)."""
        for child in await tx.fetch(
            "SELECT * FROM tb_wf_runs WHERE parent_token_id = ? AND status = 'running'", token_id
        ):
            await self._m._finish_run(
                tx, child, "cancelled", now, "parent token ended", "parent_ended"
            )

    async def start_child(
        self,
        tx: Tx,
        run: dict[str, Any],
        tok: dict[str, Any],
        node: Node,
        child: Definition,
        now: int,
    ) -> str:
        """Start a child run for a ``workflow_call`` token (D6.7: node > action > child)."""
        definition = await self._m.definition(tx, run)
        timeout_ms = definition.node_timeout_ms(node)
        set_by = "node" if node.timeout_set else "action"
        if timeout_ms is None:
            timeout_ms, set_by = child.timeout_ms, "definition"
        inherited = None
        if node.inherit_deadline:
            bounds = [b for b in (run["timeout_at"], run["inherited_deadline_at"]) if b is not None]
            inherited = min(bounds) if bounds else None
        child_id = await self._m.start_run(
            tx,
            child,
            decode(run["input"])
            if tok["branch_index"] is None
            else {"input": decode(run["input"]), "item": decode(tok["branch_item"])},
            now,
            timeout_ms=timeout_ms,
            timeout_set_by=set_by,
            parent_token_id=tok["id"],
            inherited_deadline_at=inherited,
            inherited_set_by="parent",
            traceparent=run.get("traceparent"),  # the child's span under its parent run's
        )
        # The child's own timer enforces the node's bound; the parent token waits on it.
        await tx.execute(
            "UPDATE tb_wf_tokens SET child_run_id = ?, timeout_at = NULL WHERE id = ?",
            child_id,
            tok["id"],
        )
        tok.update(child_run_id=child_id, timeout_at=None)
        await tx.clear_timer(f"tok:{tok['id']}")
        return child_id

    async def child_finished(
        self, tx: Tx, child: dict[str, Any], status: str, now: int, error: str | None
    ) -> None:
        tok = await self._m.token(tx, child["parent_token_id"])
        if tok is None or tok["status"] != "executing":
            return
        run = await self._m.run(tx, tok["run_id"])
        if run is None or await self._m.check_run_deadline(tx, run, now):
            return
        if status == "completed":
            await self._m.complete(tx, run, tok, decode(child["state"]), now)
        elif child.get("error_code") == WORKFLOW_TIMEOUT:
            # The child's own bound fired (D6.17): the node's, its action's, the child
            # definition's or the parent's inherited deadline, as stored with the child.
            bound = stored_bound(child, await self._m.definition(tx, child))
            ms = bound["duration_ms"]
            message = f"Subworkflow '{child['definition_id']}' timed out after {ms}ms"
            await tx.execute("UPDATE tb_wf_tokens SET error = ? WHERE id = ?", message, tok["id"])
            tok["timeout_at"] = child["timeout_at"]
            await self._m.token_timeout(
                tx,
                run,
                tok,
                now,
                duration=ms,
                cause=message,
                set_by=bound["set_by"],
                # The child definition's own timeout names the child's definition (D2.8).
                set_by_id=child["definition_id"] if bound["set_by"] == "definition" else None,
            )
        else:
            await self._m.action_error(
                tx, run, tok, f"Subworkflow '{child['definition_id']}' {status}: {error}", now
            )
