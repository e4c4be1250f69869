"""A durable engine's stored events as telemetry events, emitted once their commit succeeded.

The workflow engine appends its events to ``tb_events`` in the transaction that makes the change
they record, and the deferred registry writes its history rows the same way. The store's
transaction collects them and hands them here only after its commit returned (D10.3): a listener
never hears of a change that was rolled back, and hears each committed one once, in commit order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._core import _clock
from .._core._breakdown import as_breakdown
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from ._events import Event, emit_event

__all__ = ["deferred_event", "emit_committed", "workflow_event"]

# A stored event's timeout_type, as the bound's source (D2.1): the same name (D2.7); an event
# written before migration 8 renamed the node layer may still say ``execution``.
_SOURCES = {
    "workflow": "workflow",
    "execution": "node",
    "node": "node",
    "synchronization": "synchronization",
}

# Stored fields that name a unit of work, by correlation kind (D10.1).
_IDS = (("workflow_run_id", "run"), ("token_id", "token"), ("node_id", "node"))


def _at(epoch_ms: int) -> float:
    # The monotonic instant of a stored epoch instant: the same distance before now.
    return _clock.now() - max(0.0, _clock.wall_ms() - epoch_ms) / 1000.0


def workflow_event(stream: str, kind: str, at_ms: int, data: Mapping[str, Any]) -> Event:
    """The telemetry event of one ``tb_events`` row (``stream`` is the run's id)."""
    # The row's ids only, never the committing task's: the engine's loop commits for every run,
    # in whatever context it was opened, and a listener must see the same ids a reader of the
    # stored event would (D10.3).
    ids = {"run": stream}
    for key, kind_of_id in _IDS:
        value = data.get(key)
        if isinstance(value, str):
            ids[kind_of_id] = value
    bound = None
    source = _SOURCES.get(str(data.get("timeout_type")))
    if source is not None:
        duration = data.get("timeout_duration_ms")
        deadline_at = data.get("deadline_at")
        bound = DeadlineExceeded(
            source=source,
            timeout=None if duration is None else duration / 1000.0,
            deadline=None if deadline_at is None else Deadline.from_epoch_ms(deadline_at),
            what=_what(source, data),
            set_by=_set_by(data),
        )
        # D13: the stored breakdown of the timed-out node or run, as the error's.
        bound.breakdown = as_breakdown(data.get("breakdown"))
    return Event(f"workflow.{kind}", _at(at_ms), dict(data), ids, at_ms, bound)


def _set_by(data: Mapping[str, Any]) -> str | None:
    """Where a stored bound was set (D2.8): its kind, then the id of what set it
    (``node A``, ``action render``, ``definition report``, ``join t1``, ``caller``)."""
    kind = data.get("bound_set_by")
    if not isinstance(kind, str):
        return None
    name = data.get("bound_set_by_id")
    if name is None:  # stored before the id was: the ids the event itself carries
        name = {"node": data.get("node_id"), "join": data.get("transition_id")}.get(kind)
    return kind if name is None else f"{kind} {name}"


def _what(source: str, data: Mapping[str, Any]) -> str | None:
    if source == "node":
        return f"workflow node {data.get('node_id')!r}"
    if source == "synchronization":
        return f"workflow join {data.get('transition_id')!r}"
    return None


def deferred_event(
    op_id: str,
    at_ms: int,
    status: str,
    code: str | None,
    *,
    lifetime: Mapping[str, Any] | None = None,
) -> Event:
    """The telemetry event of one deferred-history row: ``deferred.<status>`` (an operation
    that expired carries the ``deferred`` bound; with the operation's stored ``lifetime``
    (``created_ms``, ``expires_ms``, ``expires_set_by``), its length, instant and origin)."""
    ids = {"operation": op_id}
    bound = None
    if status == "expired":
        timeout = deadline = set_by = None
        if lifetime is not None:
            created, expires = lifetime.get("created_ms"), lifetime.get("expires_ms")
            if isinstance(created, int) and isinstance(expires, int):
                timeout = (expires - created) / 1000.0
                deadline = Deadline.from_epoch_ms(expires)
            set_by = lifetime.get("expires_set_by")
        bound = DeadlineExceeded(
            source="deferred",
            timeout=timeout,
            deadline=deadline,
            what=f"deferred operation {op_id!r}",
            set_by=set_by,
        )
    attrs = {"operation_id": op_id, "status": status, "code": code}
    return Event(f"deferred.{status}", _at(at_ms), attrs, ids, at_ms, bound)


def emit_committed(events: list[Event]) -> None:
    """Hand events collected by a transaction to the listeners (called after its commit)."""
    for event in events:
        emit_event(event)
