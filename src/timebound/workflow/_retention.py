"""Retention: the rows and events of runs that ended long ago are deleted (D8.13).

Runs are pruned in small batches, each in a transaction of its own: a run that ended (completed,
failed, timed out or cancelled) more than the retention period ago loses its events, tokens, join
rows and its own row together. A live run is never touched, nor a finished sub-workflow whose
parent run is still live. Tallies (D8.12) are kept: counters never go down. Each batch is bounded
(``batch`` runs), batches are separated by a turn of the event loop, and a round stops after
``max_batches``: pruning a large backlog never holds the loop or the store for long.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from .._store import Store
from ._rows import RUN_TERMINAL

__all__ = ["Retention", "prune_ended_runs"]

_log = logging.getLogger("timebound.workflow")

_TERMINAL_SQL = ", ".join(f"'{s}'" for s in RUN_TERMINAL)


async def prune_ended_runs(store: Store, before_ms: int, batch: int = 100) -> int:
    """Delete up to ``batch`` runs that ended before ``before_ms`` (epoch ms), with their events,
    tokens and joins, in one transaction; how many runs were deleted."""
    async with store.transaction() as tx:
        rows = await tx.fetch(
            "SELECT r.id FROM tb_wf_runs r "
            f"WHERE r.finished_at < ? AND r.status IN ({_TERMINAL_SQL}) "
            # A finished child whose parent run is still live: its parent may read it.
            "AND NOT EXISTS (SELECT 1 FROM tb_wf_tokens t JOIN tb_wf_runs p ON p.id = t.run_id "
            f"WHERE t.id = r.parent_token_id AND p.status NOT IN ({_TERMINAL_SQL})) "
            f"ORDER BY r.finished_at LIMIT ? {store.skip_locked()}",
            before_ms,
            batch,
        )
        ids = [r["id"] for r in rows]
        if not ids:
            return 0
        marks = ", ".join("?" * len(ids))
        await tx.execute(f"DELETE FROM tb_events WHERE stream IN ({marks})", *ids)
        await tx.execute(f"DELETE FROM tb_wf_joins WHERE run_id IN ({marks})", *ids)
        await tx.execute(f"DELETE FROM tb_wf_tokens WHERE run_id IN ({marks})", *ids)
        await tx.execute(f"DELETE FROM tb_wf_runs WHERE id IN ({marks})", *ids)
    return len(ids)


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
        max_batches: int = 50,
    ) -> None:
        seconds = to_seconds(retain, option="retain", allow_zero=False)
        if math.isinf(seconds):
            raise ConfigurationError("retain must be finite; None keeps every run", option="retain")
        self.retain_ms, self.every_s = math.ceil(seconds * 1000), every_s
        self._store, self._now_ms = store, now_ms
        self._batch, self._max_batches = batch, max_batches
        self.pruned = 0  # runs this engine deleted

    async def round(self) -> int:
        """One round: batches until none is full or ``max_batches`` ran; runs deleted."""
        before = self._now_ms() - self.retain_ms
        total = 0
        for _ in range(self._max_batches):
            n = await prune_ended_runs(self._store, before, self._batch)
            total += n
            if n < self._batch:
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
