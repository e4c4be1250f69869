"""Fan-out and fan-in: spawning siblings, counting arrivals, deciding joins (D6.2, D6.3, D6.8-10).

Part of the state machine (:mod:`._machine`), kept apart so each stays readable; it changes
storage only through the same transaction and helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._store import Tx
from ._definition import Definition, Transition
from ._limits import check_growth
from ._merge import get_path, merge_outputs, set_path
from ._metrics import tally_timeout
from ._rows import LIVE_SQL, PRIORITY_TOKEN, decode, encode

if TYPE_CHECKING:
    from ._machine import Machine

__all__ = ["MAX_FAN_OUT", "Joins"]

#: The most siblings one fan-out spawns (the schema's bound on spawn_count, applied to foreach).
MAX_FAN_OUT = 10_000


class Joins:
    """Fan-outs and fan-ins of one engine's state machine."""

    def __init__(self, machine: Machine) -> None:
        self._m = machine

    async def fan_out(
        self,
        tx: Tx,
        run: dict[str, Any],
        definition: Definition,
        transition: Transition,
        tok: dict[str, Any],
        branch: dict[str, Any] | None,
        now: int,
    ) -> None:
        if transition.foreach is not None:
            context = {"input": decode(run["input"]), "state": decode(run["state"])}
            try:
                items = get_path(context, transition.foreach)
            except KeyError:
                raise KeyError(f"foreach path {transition.foreach!r} is absent") from None
            if not isinstance(items, list):
                raise TypeError(
                    f"foreach path {transition.foreach!r} holds a {type(items).__name__}, "
                    "not a list"
                )
            if len(items) > MAX_FAN_OUT:
                # The same bound as spawn_count's: one fan-out is written in one transaction.
                raise TypeError(
                    f"foreach path {transition.foreach!r} holds {len(items)} items, more than "
                    f"the {MAX_FAN_OUT} one fan-out may spawn"
                )
        else:
            assert transition.spawn_count is not None
            items = [None] * transition.spawn_count
        await check_growth(tx, run["id"], len(items))  # D6.24: fails the run, spawns nothing
        group_key = tok["id"]
        join = definition.join_for_group(transition.id)
        if join is not None:
            await tx.execute(
                "INSERT INTO tb_wf_joins (run_id, transition_id, group_key, spawned) "
                "VALUES (?, ?, ?, ?)",
                run["id"],
                join.id,
                group_key,
                len(items),
            )
        lineage = ((branch or {}).get("lineage", "") + " " + group_key).strip()
        for index, item in enumerate(items):
            await self._m._new_token(
                tx,
                run["id"],
                definition,
                transition.target,
                now,
                branch={
                    "branch_index": index,
                    "branch_total": len(items),
                    "branch_item": item,
                    "branch_output": None,
                    "fan_out_transition_id": transition.id,
                    "group_key": group_key,
                    "outer_branch": None if branch is None else encode(branch),
                    "lineage": lineage,
                },
            )
        if join is not None and not items:
            await self.evaluate_join(tx, run, definition, join, group_key, now, None)

    async def mark_arrival(self, tx: Tx, tok: dict[str, Any], kind: str, now: int) -> None:
        data = decode(tok["state_data"]) or {}
        data["arrival"] = kind
        await tx.execute(
            "UPDATE tb_wf_tokens SET state_data = ? WHERE id = ?", encode(data), tok["id"]
        )
        tok["state_data"] = encode(data)

    async def evaluate_join(
        self,
        tx: Tx,
        run: dict[str, Any],
        definition: Definition,
        join: Transition,
        group_key: str,
        now: int,
        failure: str | None,
    ) -> None:
        sync = join.synchronization
        assert sync is not None
        row = await tx.fetchone(
            "SELECT * FROM tb_wf_joins WHERE run_id = ? AND transition_id = ? AND group_key = ?",
            run["id"],
            join.id,
            group_key,
        )
        if row is None or row["decided"]:
            return
        spawned = int(row["spawned"])
        completed, failed = await self._arrivals(tx, run["id"], group_key)
        if row["sync_started_at"] is None and (completed or failed):
            timeout_ms = definition.sync_timeout_ms(join, spawned)
            await tx.execute(
                "UPDATE tb_wf_joins SET sync_started_at = ?, timeout_at = ? "
                "WHERE run_id = ? AND transition_id = ? AND group_key = ?",
                now,
                now + timeout_ms,
                run["id"],
                join.id,
                group_key,
            )
            await tx.set_timer(
                f"join:{run['id']}:{join.id}:{group_key}",
                "join",
                run["id"],
                now + timeout_ms,
                PRIORITY_TOKEN,
            )
            for tok in completed + failed:
                data = decode(tok["state_data"]) or {}
                data["sync_started_at"] = now
                await tx.execute(
                    "UPDATE tb_wf_tokens SET state_data = ? WHERE id = ?", encode(data), tok["id"]
                )
        needed = {"all": spawned, "any": 1}.get(sync.strategy, sync.required or spawned)
        if len(completed) >= needed:
            await self._decide(tx, run, definition, join, group_key, completed, now, "satisfied")
        elif spawned - len(failed) < needed:
            await self._m.fail_run(
                tx,
                run,
                f"join '{join.id}' can no longer be satisfied: {len(failed)} of {spawned} "
                f"siblings failed" + (f" ({failure})" if failure else ""),
                now,
            )

    async def _arrivals(
        self, tx: Tx, run_id: str, group_key: str
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        completed, failed = [], []
        for tok in await tx.fetch(
            "SELECT * FROM tb_wf_tokens WHERE run_id = ? AND group_key = ? ORDER BY branch_index",
            run_id,
            group_key,
        ):
            arrival = (decode(tok["state_data"]) or {}).get("arrival")
            if arrival == "completed" and tok["status"] == "waiting_for_siblings":
                completed.append(tok)
            elif arrival == "failed":
                failed.append(tok)
        return completed, failed

    async def _decide(
        self,
        tx: Tx,
        run: dict[str, Any],
        definition: Definition,
        join: Transition,
        group_key: str,
        completed: list[dict[str, Any]],
        now: int,
        how: str,
    ) -> None:
        """The join proceeds with ``completed``; siblings still running are cancelled (D6.10)."""
        sync = join.synchronization
        assert sync is not None
        await tx.execute(
            "UPDATE tb_wf_joins SET decided = 1 WHERE run_id = ? AND transition_id = ? "
            "AND group_key = ?",
            run["id"],
            join.id,
            group_key,
        )
        await tx.clear_timer(f"join:{run['id']}:{join.id}:{group_key}")
        if sync.merge is not None:
            source = sync.merge.source.split(".", 1)[1]
            outputs = []
            for tok in completed:
                branch = {
                    "output": decode(tok["branch_output"]),
                    "index": tok["branch_index"],
                    "item": decode(tok["branch_item"]),
                }
                try:
                    outputs.append((int(tok["branch_index"]), get_path(branch, source)))
                except KeyError:
                    continue  # a branch without the source path contributes nothing
            try:
                merged = merge_outputs(sync.merge.strategy, outputs)
                state = decode(run["state"])
                set_path(state, sync.merge.target.split(".", 1)[1], merged)
            except TypeError as exc:
                await self._m.fail_run(tx, run, f"join '{join.id}': {exc}", now)
                return
            encoded = encode(state)
            await tx.execute("UPDATE tb_wf_runs SET state = ? WHERE id = ?", encoded, run["id"])
            self._m._run_changed(tx, run, state=encoded)
        await tx.append_event(
            run["id"],
            "join_decided",
            now,
            transition_id=join.id,
            group_key=group_key,
            how=how,
            branches=[tok["branch_index"] for tok in completed],
        )
        for tok in completed:
            await self._m._set_token(tx, tok, "completed", now)
        # Everything still running in this group (and fan-outs nested in it) is cancelled.
        for tok in await tx.fetch(
            f"SELECT * FROM tb_wf_tokens WHERE run_id = ? AND status IN {LIVE_SQL} "
            "AND (group_key = ? OR (' ' || lineage || ' ') LIKE ?) ORDER BY seq",
            run["id"],
            group_key,
            f"% {group_key} %",
        ):
            await self._m._set_token(tx, tok, "cancelled", now, reason="join_decided")
        spawner = await self._m.token(tx, group_key)
        outer = (
            None
            if spawner is None or spawner["branch_index"] is None
            else self._m._branch_of(spawner, decode(spawner["branch_output"]))
        )
        await self._m._new_token(tx, run["id"], definition, join.target, now, branch=outer)

    async def join_timeout(self, tx: Tx, run: dict[str, Any], key: str, now: int) -> None:
        """The synchronization timeout (D6.2, D6.3): proceed with what arrived, or fail."""
        _, _, transition_id, group_key = key.split(":", 3)
        definition = await self._m.definition(tx, run)
        join = definition.transitions[transition_id]
        sync = join.synchronization
        assert sync is not None
        row = await tx.fetchone(
            "SELECT * FROM tb_wf_joins WHERE run_id = ? AND transition_id = ? AND group_key = ?",
            run["id"],
            transition_id,
            group_key,
        )
        if row is None or row["decided"]:
            return
        completed, _ = await self._arrivals(tx, run["id"], group_key)
        timeout_ms = row["timeout_at"] - row["sync_started_at"]
        if sync.on_timeout == "proceed_with_available":
            # The siblings the join stops waiting for are timed out at this layer, recorded as
            # `fail` records its own (D6.17), before the join's event: that one stays the
            # bound that decided the run's course.
            for tok in await tx.fetch(
                f"SELECT * FROM tb_wf_tokens WHERE run_id = ? AND group_key = ? "
                f"AND status IN {LIVE_SQL} AND status != 'waiting_for_siblings' ORDER BY seq",
                run["id"],
                group_key,
            ):
                await self._m._timed_out_event(
                    tx,
                    tok,
                    "synchronization",
                    timeout_ms,
                    "proceed_with_available",
                    row["timeout_at"],
                    now,
                    set_by="join",
                    set_by_id=transition_id,
                )
        await tx.append_event(
            run["id"],
            "join_timed_out",
            now,
            transition_id=transition_id,
            group_key=group_key,
            timeout_type="synchronization",
            timeout_duration_ms=timeout_ms,
            bound_set_by="join",
            bound_set_by_id=transition_id,
            policy_applied=sync.on_timeout,
            deadline_at=row["timeout_at"],
            detection_lag_ms=now - row["timeout_at"],
            sync_started_at=row["sync_started_at"],
        )
        tally_timeout(tx, "synchronization", sync.on_timeout, now - row["timeout_at"])
        if sync.on_timeout == "proceed_with_available":
            if completed:
                await self._decide(tx, run, definition, join, group_key, completed, now, "timeout")
                return
            await self._m.fail_run(tx, run, "No siblings completed before timeout", now)
            return
        for tok in completed:
            await self._m._set_token(tx, tok, "timed_out", now, reason="synchronization_timeout")
            await self._m._timed_out_event(
                tx,
                tok,
                "synchronization",
                timeout_ms,
                "fail",
                row["timeout_at"],
                now,
                set_by="join",
                set_by_id=transition_id,
            )
        await self._m.fail_run(tx, run, "Synchronization timeout exceeded", now)
