"""How large one run may grow: tokens and events per run (D6.24).

A definition of a few kilobytes can ask for a nested fan-out (``foreach`` in ``foreach``,
1,000 by 1,000) that writes a million tokens and several million events, and the turns that write
them hold the loop that fires every other run's timers. A fan-out therefore first counts what its
run already has: past either limit the run fails (``too-many-tokens``, ``too-many-events``) in
the same transaction, before anything is spawned, and the other runs never notice.
"""

from __future__ import annotations

from typing import Any

from .._core._errors import TimeboundError
from .._store import Tx

__all__ = ["MAX_EVENTS_PER_RUN", "MAX_TOKENS_PER_RUN", "RunLimitExceeded", "check_growth"]

#: The most tokens one run may create (a fan-out of the largest size, 10,000, fits twice).
MAX_TOKENS_PER_RUN = 20_000
#: The most events one run may record (about five per token).
MAX_EVENTS_PER_RUN = 100_000


class RunLimitExceeded(TimeboundError, ValueError):
    """A run would grow past one of its limits; ``code`` says which (D6.24)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (RunLimitExceeded, (self.code, str(self).split(": ", 1)[1]))


async def check_growth(tx: Tx, run_id: str, spawning: int) -> None:
    """Raise :class:`RunLimitExceeded` if spawning ``spawning`` more tokens takes the run past
    :data:`MAX_TOKENS_PER_RUN`, or its events (one more per token at least) past
    :data:`MAX_EVENTS_PER_RUN`."""
    row = await tx.fetchone("SELECT COUNT(*) AS n FROM tb_wf_tokens WHERE run_id = ?", run_id)
    tokens = 0 if row is None else int(row["n"])
    if tokens + spawning > MAX_TOKENS_PER_RUN:
        raise RunLimitExceeded(
            "too-many-tokens",
            f"spawning {spawning} more would give the run {tokens + spawning} tokens, more than "
            f"the limit of {MAX_TOKENS_PER_RUN}",
        )
    row = await tx.fetchone("SELECT COUNT(*) AS n FROM tb_events WHERE stream = ?", run_id)
    events = 0 if row is None else int(row["n"])
    if events + spawning > MAX_EVENTS_PER_RUN:
        raise RunLimitExceeded(
            "too-many-events",
            f"the run has {events} events; spawning {spawning} more tokens would take it past "
            f"the limit of {MAX_EVENTS_PER_RUN}",
        )
