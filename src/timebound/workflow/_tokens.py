"""A token's moves: created, claimed, begun, and moved to a new status, each with its event in
the same transaction (a part of :class:`~timebound.workflow._machine.Machine`)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from .._store import Tx
from ._children import Children
from ._definition import Definition
from ._held import HeldRows
from ._metrics import tally_timeout
from ._rows import PRIORITY_TOKEN, TERMINAL, decode, encode, new_id
from ._schedule import made_pending

__all__ = ["TokenMoves"]

#: The columns a new token is inserted with, in the order :meth:`TokenMoves._new_token` gives.
_COLUMNS = (
    "id, run_id, node_id, status, seq, branch_index, branch_total, branch_item, branch_output, "
    "fan_out_transition_id, group_key, outer_branch, lineage, timeout_at, not_before, "
    "state_data, created_at, updated_at"
)
_BEGIN = (
    "UPDATE tb_wf_tokens SET status = 'executing', attempt = ?, timeout_at = ?, "
    "state_data = ?, updated_at = ?, lease_owner = ?, lease_until = ? WHERE id = ?"
)
_INSERT = (
    f"INSERT INTO tb_wf_tokens ({_COLUMNS}) VALUES ({', '.join('?' * (_COLUMNS.count(',') + 1))})"
)
#: A token inserted already begun (D6.36): the columns of :data:`_INSERT` and the claim's.
_BEGUN_COLUMNS = (*_COLUMNS.split(", "), "attempt", "lease_owner", "lease_until")
_INSERT_BEGUN = (
    f"INSERT INTO tb_wf_tokens ({', '.join(_BEGUN_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_BEGUN_COLUMNS))})"
)
_begun_values = operator.itemgetter(*_BEGUN_COLUMNS)
#: tx.held: the write mark of a token's deferred INSERT (D6.36).
_MADE = "tokens.made"


class TokenMoves(HeldRows):
    """Token transitions. The machine provides ``children``, ``late_results``, ``_seq`` and
    ``_cancel_attempt(token_id)`` (stops local in-flight work)."""

    children: Children
    late_results: int
    _seq: int
    _cancel_attempt: Callable[[str], None]

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
        token_id = new_id()
        tx.wake_others = True
        # Creation order without a query: increasing in this process, and across processes
        # ordered by the creation millisecond.
        self._seq = seq = max(self._seq + 1, now * 1000)
        b = branch or {}
        # A token stuck in pending/dispatched longer than its node timeout times out (fail).
        timeout_ms = definition.node_timeout_ms(definition.nodes[node_id])
        timeout_at = None if timeout_ms is None else now + timeout_ms
        row = {
            "id": token_id,
            "run_id": run_id,
            "node_id": node_id,
            "status": "pending",
            "seq": seq,
            "branch_index": b.get("branch_index"),
            "branch_total": b.get("branch_total"),
            "branch_item": None if branch is None else encode(b.get("branch_item")),
            "branch_output": None if branch is None else encode(b.get("branch_output")),
            "fan_out_transition_id": b.get("fan_out_transition_id"),
            "group_key": b.get("group_key"),
            "outer_branch": b.get("outer_branch"),
            "lineage": b.get("lineage", ""),
            "timeout_at": timeout_at,
            "not_before": now,
            "state_data": "{}",
            "created_at": now,
            "updated_at": now,
        }
        tx.defer(("tok", token_id), _INSERT, *row.values())
        tx.held.setdefault(_MADE, {})[token_id] = tx.write_mark()
        # The loop may begin it in this transaction without looking for it (D6.29).
        row.update(
            child_run_id=None,
            retry_count=0,
            attempt=0,
            output=None,
            error=None,
            lease_owner=None,
            lease_until=None,
        )
        made_pending(tx, now, row)
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
        if status != "timed_out":  # token_timed_out is written with the bound that fired
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
        set_by_id: str | None = None,
        breakdown: dict[str, Any] | None = None,
    ) -> None:
        """Record the bound that fired: its layer, length, policy, deadline and (D6.17) where
        it was set: ``definition``, ``caller``, ``parent``, ``node``, ``action``, ``join`` or
        ``propagated``, with the id of that definition, node, action or join transition
        (``bound_set_by_id``, D2.8); and (D13) where its budget went, when known."""
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
            bound_set_by_id=set_by_id,
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
        attempt, timeout_at, state_data = self._next_attempt(tok, definition, now)
        tx.defer(
            ("tok", tok["id"]),
            _BEGIN,
            attempt,
            timeout_at,
            state_data,
            now,
            tok["lease_owner"],
            tok["lease_until"],
            tok["id"],
        )
        await self._began(tx, tok, attempt, timeout_at, state_data, now)
        return timeout_at

    async def hand_off(
        self,
        tx: Tx,
        tok: dict[str, Any],
        owner: str,
        lease_until: int,
        definition: Definition,
        now: int,
    ) -> tuple[bool, int | None]:
        """Claim and begin a token this transaction made, without looking for it (D6.29): what
        :meth:`claim` (``write=False``) and :meth:`begin_attempt` write, in one statement that
        takes it only while it is still ``pending`` (a join decided in this transaction may
        have cancelled it). ``(False, None)`` and nothing written or recorded when it was not;
        else ``(True, deadline)``."""
        attempt, timeout_at, state_data = self._next_attempt(tok, definition, now)
        key = ("tok", tok["id"])
        mark = tx.held.get(_MADE, {}).get(tok["id"])
        if mark is not None and tx.rows_unchanged(mark, key, "tb_wf_tokens"):
            # Nothing in this transaction touched the row since its INSERT: it is pending as
            # inserted (D6.36). Stored begun by its INSERT if that is not sent yet, else by
            # the same UPDATE as begin_attempt's, deferred (batched with the others).
            tok.update(
                status="executing",
                attempt=attempt,
                timeout_at=timeout_at,
                state_data=state_data,
                updated_at=now,
                lease_owner=owner,
                lease_until=lease_until,
            )
            if not tx.rewrite(key, mark, _INSERT_BEGUN, *_begun_values(tok)):
                tx.defer(
                    key, _BEGIN, attempt, timeout_at, state_data, now, owner, lease_until, tok["id"]
                )
        elif not await tx.execute(
            _BEGIN + " AND status = 'pending'",
            attempt,
            timeout_at,
            state_data,
            now,
            owner,
            lease_until,
            tok["id"],
        ):
            return False, None
        await self.claim(tx, tok, owner, lease_until, now, write=False)
        await self._began(tx, tok, attempt, timeout_at, state_data, now)
        return True, timeout_at

    @staticmethod
    def _next_attempt(
        tok: dict[str, Any], definition: Definition, now: int
    ) -> tuple[int, int | None, str]:
        """The attempt a token begins: its number, its deadline and its ``state_data``."""
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
        return tok["attempt"] + 1, timeout_at, state_data

    @staticmethod
    async def _began(
        tx: Tx,
        tok: dict[str, Any],
        attempt: int,
        timeout_at: int | None,
        state_data: str,
        now: int,
    ) -> None:
        """What beginning an attempt records besides the token's row: its timer and event."""
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

    async def late_result(self, tx: Tx, run_id: str, token_id: str, attempt: int, now: int) -> None:
        """A result nobody will read (D6.10): discarded, counted and recorded."""
        self.late_results += 1
        await tx.append_event(
            run_id, "late_result_discarded", now, token_id=token_id, attempt=attempt
        )
