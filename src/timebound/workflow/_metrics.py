"""The workflow engine's timeout tallies: counted as each timeout commits, read in O(1).

Every timeout (workflow, node or synchronization layer) bumps, in the transaction that records
it, a count by (layer, policy applied) and its detection lag's histogram bucket and sum (D8.12).
A fan-in timeout counts once, as its join's event, not again for each sibling it timed out
(D6.17).
The store migration that created the tallies backfilled the timeouts stored before, with the
same layers and buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._store import Store, Tx
from .._store._tally import read_tallies

__all__ = [
    "LAG_BUCKETS_MS",
    "TimeoutTallies",
    "lag_bucket",
    "read_timeout_tallies",
    "tally_stop",
    "tally_timeout",
]

# Detection lag buckets' upper bounds, in ms: a healthy engine notices a timeout within
# milliseconds; the upper buckets show a store or worker that fell behind (or a restart that
# found it overdue). Changing them needs a store migration (the stored buckets are these).
LAG_BUCKETS_MS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 60000)
# The stored timeout_type of each layer (D2.7); rows written before migration 8 said
# "execution" for the node layer, and a tally of one is still a node timeout.
LAYERS = {
    "workflow": "workflow",
    "node": "node",
    "execution": "node",
    "synchronization": "synchronization",
}


def lag_bucket(lag_ms: int) -> str:
    """The stored histogram bucket of a lag: the first upper bound it fits, or ``"inf"``."""
    return next((str(ms) for ms in LAG_BUCKETS_MS if lag_ms <= ms), "inf")


def tally_timeout(tx: Tx, timeout_type: str, policy: str, lag_ms: int | None) -> None:
    """Count one timeout in ``tx`` (committed with it, or not at all)."""
    layer = LAYERS.get(timeout_type, "other")
    tx.tally("wf_timeouts", layer, str(policy))
    if lag_ms is not None:
        tx.tally("wf_timeout_lag", layer, lag_bucket(lag_ms))
        tx.tally("wf_timeout_lag_ms_sum", layer, "", lag_ms)


def tally_stop(tx: Tx, via: str, lag_ms: int) -> None:
    """Count one stopped attempt (D6.14) by how its worker learnt of the stop, with its lag."""
    tx.tally("wf_stops", via, lag_bucket(lag_ms))
    tx.tally("wf_stop_ms_sum", via, "", lag_ms)


@dataclass
class TimeoutTallies:
    """Timeouts by (layer, policy); per layer, lag counts by bucket (``"inf"`` past the last)
    and the lag sum in ms."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    lag_buckets: dict[str, dict[str, int]] = field(default_factory=dict)
    lag_sum_ms: dict[str, int] = field(default_factory=dict)


async def read_timeout_tallies(store: Store) -> TimeoutTallies:
    """The stored timeout tallies (one read of a few rows)."""
    tallies = await read_tallies(store, "wf_timeouts", "wf_timeout_lag", "wf_timeout_lag_ms_sum")
    out = TimeoutTallies(counts=tallies["wf_timeouts"])
    for (layer, bucket), n in tallies["wf_timeout_lag"].items():
        out.lag_buckets.setdefault(layer, {})[bucket] = n
    for (layer, _), n in tallies["wf_timeout_lag_ms_sum"].items():
        out.lag_sum_ms[layer] = n
    return out
