"""The durable registry of deferred operations (D7.2-D7.5): the facade.

One row per operation in the shared store (SQLite or PostgreSQL), keyed by the connector's
``operation/id``. :class:`Registry` is made of parts, each in a file of its own, the way
:class:`timebound.workflow.Engine` is:

- ``_rows.py``: the stored operation, its operator view, its history and the continuation format;
- ``_transitions.py``: registration, the host-enforced state machine, expiry and the poller's
  bookkeeping, each one write transaction that locks its row;
- ``_reads.py``: what the registry answers, read from committed state (:meth:`Store.read`);
- ``_continuations.py``: resuming continuations exactly once.
"""

from __future__ import annotations

from collections.abc import Callable

from .._store import Store, open_store
from ._continuations import (
    ContinuationRefused,
    Continuations,
    RefusalHook,
    Resumer,
    Resumption,
)
from ._contract import format_time
from ._policy import HostPolicy
from ._reads import OperationReads
from ._rows import (
    CONTINUATION_SCHEMA,
    MAX_CONTINUATION_BYTES,
    Gone,
    IdempotencyConflict,
    Operation,
    StatusOutcome,
    check_continuation,
    now_ms,
)
from ._transitions import Transitions

__all__ = [
    "CONTINUATION_SCHEMA",
    "MAX_CONTINUATION_BYTES",
    "ContinuationRefused",
    "Gone",
    "IdempotencyConflict",
    "Operation",
    "Registry",
    "Resumption",
    "StatusOutcome",
    "check_continuation",
    "format_time",
    "now_ms",
]


class Registry(Transitions, OperationReads, Continuations):
    """Deferred operations on a durable store (``sqlite:///FILE`` or ``postgresql://…``).

    ``async with Registry(url) as reg`` opens the store (creating its tables) and closes it.
    ``policy`` clamps every connector hint (:class:`HostPolicy`).
    """

    def __init__(self, store: str | Store, *, policy: HostPolicy | None = None) -> None:
        self._store = open_store(store) if isinstance(store, str) else store
        self._owns_store = isinstance(store, str)
        self.policy = policy if policy is not None else HostPolicy()
        self._resumers: dict[str, Resumer] = {}
        self._on_refused: RefusalHook | None = None
        #: Called when a change may make new work for a poller, with the earliest epoch-ms
        #: instant that work can be due at (``None``: it may be due now).
        self.on_change: Callable[[int | None], None] | None = None

    @property
    def store(self) -> Store:
        return self._store

    async def open(self) -> None:
        await self._store.open()

    async def close(self) -> None:
        if self._owns_store:
            await self._store.close()

    async def __aenter__(self) -> Registry:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _changed(self, at_ms: int | None = None) -> None:
        if self.on_change is not None:
            self.on_change(at_ms)
