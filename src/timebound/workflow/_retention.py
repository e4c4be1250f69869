"""Retention: the rows and events of runs that ended long ago are deleted (D8.13).

Runs are pruned in small batches, each in a transaction of its own: a run that ended (completed,
failed, timed out or cancelled) more than the retention period ago loses its events, tokens, join
rows and its own row, in that order (a run with a huge history over several transactions). A
live run is never touched, nor a finished sub-workflow whose parent run is still live. Tallies
(D8.12) are kept: counters never go down. Each batch is bounded (``batch`` runs, ``max_rows``
deleted rows), batches are separated by a turn of the event loop, and a round stops after
``max_batches``: pruning a large backlog never holds the loop or the store for long.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import NamedTuple

from .._core._durations import Duration, ceil_ms, to_seconds
from .._core._errors import ConfigurationError
from .._store import Store
from ._rows import RUN_TERMINAL

__all__ = ["Pruned", "Retention", "prune_ended_runs"]

_log = logging.getLogger("timebound.workflow")

_TERMINAL_SQL = ", ".join(f"'{s}'" for s in RUN_TERMINAL)


class Pruned(NamedTuple):
    """What one batch deleted: whole runs, and rows of any kind (events, tokens, joins, runs)."""

    runs: int
    rows: int


async def prune_ended_runs(
    store: Store, before_ms: int, batch: int = 100, max_rows: int = 5_000
) -> Pruned:
    """One transaction: take up to ``batch`` runs that ended before ``before_ms`` (epoch ms) and
    delete their events and tokens, at most ``max_rows`` of them, then, if that was all of them,
    their joins and the runs themselves. A run with a huge history (a big fan-out) thus goes over
    several transactions, its events first and its row last, none of them long."""
    async with store.transaction() as tx:
        found = await tx.fetch(
            "SELECT r.id FROM tb_wf_runs r "
            f"WHERE r.finished_at < ? AND r.status IN ({_TERMINAL_SQL}) "
            # A finished child whose parent run is still live: its parent may read it.
            "AND NOT EXISTS (SELECT 1 FROM tb_wf_tokens t JOIN tb_wf_runs p ON p.id = t.run_id "
            f"WHERE t.id = r.parent_token_id AND p.status NOT IN ({_TERMINAL_SQL})) "
            f"ORDER BY r.finished_at LIMIT ? {store.skip_locked()}",
            before_ms,
            batch,
        )
        ids = [r["id"] for r in found]
        if not ids:
            return Pruned(0, 0)
        marks = ", ".join("?" * len(ids))
        budget = max_rows
        for table, key, owner in (("tb_events", "seq", "stream"), ("tb_wf_tokens", "id", "run_id")):
            budget -= await tx.execute(
                f"DELETE FROM {table} WHERE {key} IN (SELECT {key} FROM {table} "
                f"WHERE {owner} IN ({marks}) LIMIT ?)",
                *ids,
                budget,
            )
            if budget <= 0:  # more may be left: the next batch goes on from here
                return Pruned(0, max_rows)
        rows = await tx.execute(f"DELETE FROM tb_wf_joins WHERE run_id IN ({marks})", *ids)
        rows += await tx.execute(f"DELETE FROM tb_wf_runs WHERE id IN ({marks})", *ids)
    return Pruned(len(ids), max_rows - budget + rows)


class Retention:
    """Prunes a store's ended runs every ``every_s`` seconds (engine use)."""

    def __init__(
        self,
        store: Store,
        retain: Duration,
        now_ms: Callable[[], int],
        *,
        every_s: float = 60.0,
        batch: int = 100,
        max_rows: int = 5_000,
        max_batches: int = 50,
    ) -> None:
        seconds = to_seconds(retain, option="retain", allow_zero=False)
        if math.isinf(seconds):
            raise ConfigurationError("retain must be finite; None keeps every run", option="retain")
        self.retain_ms, self.every_s = ceil_ms(seconds), every_s
        self._store, self._now_ms = store, now_ms
        self._batch, self._max_rows, self._max_batches = batch, max_rows, max_batches
        self.pruned = 0  # runs this engine deleted

    async def round(self) -> int:
        """One round: batches until one finds nothing more to do or ``max_batches`` ran; how
        many runs were deleted."""
        before = self._now_ms() - self.retain_ms
        total = 0
        for _ in range(self._max_batches):
            pruned = await prune_ended_runs(self._store, before, self._batch, self._max_rows)
            total += pruned.runs
            if pruned.runs < self._batch and pruned.rows < self._max_rows:
                break
            await asyncio.sleep(0)  # other work (timers first) between batches
        self.pruned += total
        return total

    async def run(self) -> None:
        """Rounds forever, the first at once; a failed round is logged and retried later."""
        while True:
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("pruning ended runs failed; trying again in %.0f s", self.every_s)
            await asyncio.sleep(self.every_s)
