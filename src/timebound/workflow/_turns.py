"""The worker loop: one transaction per turn (group commit) that fires due timers, starts
runs, stores outcomes and claims ready tokens, then sleeps until the next stored deadline (a
part of :class:`~timebound.workflow.Engine`).

One loop per engine. Each turn it fires the timers that are due (read from storage, so a restart
re-arms them, D6.6), claims ready tokens and starts their attempts, then sleeps until the next
stored deadline — never a polling interval: the wake-up is that deadline itself (plus a hair, so
the floored epoch-ms reading has reached it), and any local change wakes the loop at once. On a
shared store (PostgreSQL) a periodic sweep also catches other workers' changes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
from contextlib import AbstractAsyncContextManager
from typing import Any

from .._core import _clock
from .._core._clock import earliest
from .._store import Tx, run_rounds, wake_delay
from ._attempts import Attempts, Plan, Report
from ._faults import RunFault, attribute, isolate
from ._rows import RUN_TERMINAL
from ._schedule import Schedule, new_tokens, pending_floor
from ._starts import Start, StartConflict, start_keyed
from ._workers import Presence, housekeeping

__all__ = ["Turns"]

_log = logging.getLogger("timebound.workflow")
_RUN_ENDS = frozenset(f"run_{status}" for status in RUN_TERMINAL)
#: How long one turn may spend storing outcomes before it commits (D6.24).
_TURN_SLICE_S = 0.01
#: How many outcomes' rows a turn reads ahead at first, before it knows how many fit its slice.
_HOLD_FIRST = 100


def _fair(outcomes: list[Report]) -> list[Report]:
    """The order a turn stores outcomes in: every run's first outcome, then every run's second,
    and so on; runs in id order within each round, a run's own outcomes in the order they came.

    A turn stores what fits its slice (D6.24): in plain run-id order, a run with a backlog of
    thousands of outcomes (a fan-out) went first in every turn until it drained whenever its
    id sorted before another run's, and that run's steps waited minutes. Run locks are still
    taken in id order: a run first appears in the first round, which is sorted by id (D6.35).
    """
    rank: dict[str, int] = {}
    keyed = []
    for report in outcomes:
        n = rank.get(report.run_id, 0)
        rank[report.run_id] = n + 1
        keyed.append((n, report.run_id, report))
    keyed.sort(key=lambda k: (k[0], k[1]))  # stable: a run's own outcomes keep their order
    return [k[2] for k in keyed]


class Turns(Attempts):
    """The worker loop and its turns (a part of the engine, which provides the attributes
    below and ``_read()``, a read transaction of committed state)."""

    worker_id: str
    _concurrency: int
    _lease_ms: int
    _sweep_ms: int
    _presence: Presence
    _attempts: dict[str, asyncio.Task[None]]
    _reporting: set[str]
    _claiming: bool
    _poked: bool
    _starts: list[Start]
    _stored: set[tuple[str, int]]
    _schedule: Schedule

    def _read(self) -> AbstractAsyncContextManager[Tx]:
        raise NotImplementedError

    async def _hold(self, tx: Tx, ordered: list[Report], i: int, lock: str) -> int:
        """Read (and lock, in id order) the runs of the outcomes from ``ordered[i]`` on, and
        their tokens in one statement, for as many as this turn is likely to store: as many
        as it stored so far, at least ``_HOLD_FIRST``, at most 500. Where the next window
        starts. A turn stores what fits in its slice (D6.24); reading every pending outcome's
        rows each turn made a backlog of n outcomes cost n rows a turn, n²/2 in all
        (D6.35)."""
        end = min(len(ordered), i + min(500, max(_HOLD_FIRST, i)))
        window = ordered[i:end]
        await self._machine.hold_runs(tx, (r.run_id for r in window), lock=lock)
        if len(window) > 1:  # their tokens in one statement, not one each
            await self._machine.hold_tokens(tx, (r.token_id for r in window))
        return end

    # The loop -------------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Turns, asleep between them until the next timer, a sweep or a wake-up (the store's
        wake loop, D12.1)."""
        renew_at = house_at = 0

        async def turn() -> float | None:
            nonlocal renew_at, house_at
            self._poked = False
            outcomes, self._outcomes = self._outcomes, []
            self._inflight.reported(r.token_id for r in outcomes)
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
                self._schedule.forget()
                self._outcomes[:0] = outcomes
                self._starts[:0] = starts
                raise
            except RunFault as fault:
                # One run's work raised (D6.22): the turn was rolled back; that run alone fails
                # and the rest runs again at once.
                self._schedule.forget()
                self._outcomes[:0] = outcomes
                self._starts[:0] = [s for s in starts if s is not fault.start]
                self._stored.clear()
                await isolate(self, fault)
                return 0.0
            except Exception:
                # A failed turn is rolled back (on PostgreSQL, a deadlock between two workers'
                # batches, or the server restarting and dropping every connection): keep its
                # work and try again after a pause. The lease renewal is part of the turn, so
                # a renewal that meets a dropped connection is retried, not the loop's end.
                self._schedule.forget()
                self._outcomes[:0] = outcomes
                self._starts[:0] = starts
                self._stored.clear()
                _log.exception("workflow engine turn failed; retrying")
                await asyncio.sleep(self._sweep_ms / 1000)
                return 0.0
            # Our own transaction set the wake-up; news that came during the turn is in the
            # checks below, which the turn may not have seen.
            self._wake.clear()
            for plan in plans:
                task = asyncio.create_task(self._attempt(*plan), name=f"workflow-token-{plan[0]}")
                self._inflight.add(plan[0], task, plan[3].attempt, plan[3].run_id)
                task.add_done_callback(functools.partial(self._attempt_done, plan[0]))
            if self._outcomes or self._starts or self._poked or self._inflight.suspects:
                return 0.0
            delay = None if next_ms is None else wake_delay(next_ms)
            if self._store.shared:
                # The sweep catches other workers' changes; leases are renewed well before expiry.
                renew = max(min(renew_at, house_at) - self._now(), 0) / 1000
                delay = min(delay or math.inf, self._sweep_ms / 1000, renew)
            return delay

        await run_rounds(self._wake, turn)

    async def _turn(
        self, starts: list[Start], outcomes: list[Report]
    ) -> tuple[list[Plan], int | None]:
        """One transaction, one commit (group commit): fire the due timers, start new runs, store
        the attempts' outcomes, claim and begin ready tokens; return the attempts to run and the
        next wake-up.

        Timers go first, so a workflow timeout due now wins over a result reported at the same
        instant (D6.4).
        """
        now = self._now()
        started: list[tuple[Start, str]] = []
        later: list[Report] = []
        schedule = self._schedule
        token = schedule.begin(self._store.commits)
        known = schedule.known  # D6.29: no scheduling question whose answer the loop knows
        async with self._txn() as tx:
            timers_asked = schedule.timers_due(now)
            if timers_asked:
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
                    run_id = await start_keyed(self._machine, tx, start, now)
                except StartConflict as exc:  # found in this transaction: nothing written
                    start.settle(error=exc)
                    continue
                except Exception as exc:
                    raise attribute(exc, None, start) from exc
                started.append((start, run_id))
            lock = self._store.lock_clause()
            self._reporting = {r.token_id for r in outcomes}  # their attempts ran here
            # D6.24: a turn stores outcomes for at most _TURN_SLICE_S; the rest go to the next
            # turn, which fires the timers due by then first (one outcome may fan out 10,000).
            ordered = _fair(outcomes)
            slice_end = _clock.now() + _TURN_SLICE_S
            held = 0  # ordered[:held]: their runs read and locked, their tokens read ahead
            for i, report in enumerate(ordered):
                if i and _clock.now() >= slice_end:
                    later = ordered[i:]
                    break
                if i == held:
                    held = await self._hold(tx, ordered, i, lock)
                try:
                    await self._report(tx, report, now)
                except Exception as exc:
                    raise attribute(exc, report.run_id) from exc
            plans, pending_ms = await self._dispatch(tx, now, known)
            if timers_asked:
                next_ms = await tx.next_timer_ms()
            else:  # none was due: the earliest is the known one, or one this turn set
                next_ms = earliest(schedule.timer_ms, tx.timers_set_min)
            if pending_ms is _UNKNOWN:
                row = await tx.fetchone(
                    "SELECT MIN(not_before) AS t FROM tb_wf_tokens WHERE status = 'pending'"
                )
                pending_ms = None if row is None else row["t"]
            if pending_ms is None:
                # No token is left for others to claim (this turn claimed what it made): waking
                # every worker would only cost each an empty turn (D6.14a). A run that ended is
                # news for waiters only, not for the other workers' loops (D6.30).
                if tx.kinds & _RUN_ENDS:
                    tx.news_only = True
                else:
                    tx.wake_others = False
        assert not isinstance(pending_ms, _Unknown)
        schedule.learn(token, self._store.commits, next_ms, pending_ms)
        self._outcomes[:0] = later  # committed: what is left is stored by the next turn
        for start, run_id in started:  # committed: the runs exist
            start.settle(run_id)
        # Ready tokens wake the loop only while it may claim them (not while a stop drains).
        free = len(self._attempts) < self._concurrency and self._claiming
        if pending_ms is not None and free:
            next_ms = earliest(next_ms, pending_ms)
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

    async def _dispatch(
        self, tx: Tx, now: int, known: bool
    ) -> tuple[list[Plan], int | _Unknown | None]:
        """Claim ready tokens (a lease each) and begin their attempts; answers them, and the
        earliest ``not_before`` of the tokens left pending if the loop knows it (``known``: it
        knew it when the turn began, D6.29), else ``_UNKNOWN``."""
        schedule = self._schedule
        free = self._concurrency - len(self._attempts)
        made = new_tokens(tx)
        floor = pending_floor(tx)
        if known:
            if free <= 0 or not self._claiming:
                return [], earliest(schedule.pending_ms, floor, now if made else None)
            before = earliest(schedule.pending_ms, floor)
            if before is None or before > now:  # nothing was ready but what this turn made
                if not made:
                    return [], before
                plans = await self._hand_off(tx, made[:free], now)
                if plans is not None:
                    return plans, earliest(before, now if len(made) > free else None)
        if free <= 0 or not self._claiming:
            return [], _UNKNOWN
        if self._store.shared and not known:
            # Not this worker's own attempts in flight or just ended: it is late renewing them,
            # not gone (a stalled loop re-ran its own step beside the running one). Others may.
            # Looked for when the loop asks the store again (at least once a sweep, D6.29).
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
        return plans, _UNKNOWN

    async def _hand_off(self, tx: Tx, made: list[dict[str, Any]], now: int) -> list[Plan] | None:
        """Begin tokens this turn made, without looking for them (D6.29), when nothing else is
        ready: each is taken only if still pending. ``None`` (nothing done) unless every one is
        a plain case: its run live, its node one this worker runs, not a child run."""
        machine = self._machine
        checked = []
        for tok in made:
            # Held already (a report's run), or read and locked now (a run this turn started).
            run = await machine.run(tx, tok["run_id"], lock=self._store.lock_clause())
            due = tok["timeout_at"] is not None and now >= tok["timeout_at"]
            if run is None or due or not machine.run_live(run, now):
                return None
            definition = await machine.definition(tx, run)
            node = definition.nodes[tok["node_id"]]
            action = definition.actions[node.action_id]
            handler = action.implementation.get("handler")
            if action.kind == "workflow_call" or (
                self._presence.needs(definition).get(node.id) is not None
                and handler not in self._handlers
            ):
                return None
            checked.append((tok, run, definition))
        plans = []
        for tok, run, definition in checked:
            lease = now + self._lease_ms
            try:
                plan = await self._begin(
                    tx, tok, now, hand_off=(self.worker_id, lease, run, definition)
                )
            except Exception as exc:
                raise attribute(exc, tok["run_id"]) from exc
            if plan is not None:
                plans.append(plan)
        return plans


class _Unknown:
    """Not known without asking the store."""


_UNKNOWN = _Unknown()
