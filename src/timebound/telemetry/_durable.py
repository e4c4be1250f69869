"""A durable engine's stored events as telemetry events: emitted once their commit succeeded,
and read back from the store as the same records.

The workflow engine appends its events to ``tb_events`` in the transaction that makes the change
they record, and the deferred registry writes its history rows the same way. The store's
transaction collects them and hands them here only after its commit returned (D10.3): a listener
never hears of a change that was rolled back, and hears each committed one once, in commit order.

A reader of the stored rows (the host's run and operation pages) turns them into events with
:func:`stored_run_events` and :func:`stored_operation_events`: the same functions build the live
events from the same fields, so what a page draws from the store is what a listener heard (D10.9).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .._core import _clock
from .._core._breakdown import Breakdown, as_breakdown, build
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from ._events import Event, emit_event

__all__ = [
    "at_of",
    "deferred_event",
    "emit_committed",
    "lifetime_breakdown",
    "stored_operation_events",
    "stored_run_events",
    "workflow_event",
]

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


def at_of(epoch_ms: int | None) -> float:
    """The monotonic instant of a stored epoch instant: the same distance before now (now when
    none is known)."""
    if epoch_ms is None:
        return _clock.now()
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
    return Event(f"workflow.{kind}", at_of(at_ms), dict(data), ids, at_ms, bound)


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
    digest: str | None = None,
    lifetime: Mapping[str, Any] | None = None,
) -> Event:
    """The telemetry event of one deferred-history row: ``deferred.<status>`` with the row's
    ``code`` and document ``digest`` (an operation that expired carries the ``deferred`` bound;
    with the operation's stored ``lifetime`` (``created_ms``, ``expires_ms``,
    ``expires_set_by``), its length, instant and origin)."""
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
    attrs = {"operation_id": op_id, "status": status, "code": code, "digest": digest}
    return Event(f"deferred.{status}", at_of(at_ms), attrs, ids, at_ms, bound)


#: The most history rows an expiry's breakdown reads (the states an operation went through).
MAX_STATES = 64


def lifetime_breakdown(history: Iterable[Mapping[str, Any]], end_ms: int) -> Breakdown:
    """Where an operation's lifetime went, ending at ``end_ms``: each stored status (history
    rows with ``at_ms`` and ``status``, in order) until the next one (D13)."""
    rows = list(history)[:MAX_STATES]
    marks: list[Any] = []
    for i, r in enumerate(rows[:-1]):
        t0, t1 = r["at_ms"] / 1e3, rows[i + 1]["at_ms"] / 1e3
        marks.append(("state", str(r["status"])[:120], t0, t1, None, None, None))
    start = (rows[0]["at_ms"] if rows else end_ms) / 1e3
    return build("bound", "deferred", start, end_ms / 1e3, None, "timeout", marks, len(marks))


# The fields of a row as the workflow store reads it back that are not the event's own data.
_ROW_FIELDS = ("kind", "at_epoch_ms")


def stored_run_events(run_id: str, rows: Iterable[Mapping[str, Any]]) -> list[Event]:
    """A run's stored events (the rows ``Engine.events`` reads: ``kind``, ``at_epoch_ms`` and
    the event's data) as the telemetry events its listeners heard when they committed: same
    names, correlation ids, epoch instants, attributes and bounds (D10.9)."""
    return [
        workflow_event(
            run_id,
            row["kind"],
            row["at_epoch_ms"],
            {k: v for k, v in row.items() if k not in _ROW_FIELDS},
        )
        for row in rows
    ]


def stored_operation_events(
    op_id: str,
    history: Iterable[Mapping[str, Any]],
    lifetime: Mapping[str, Any] | None = None,
) -> list[Event]:
    """An operation's stored history (rows with ``at_ms``, ``status``, ``code`` and ``digest``, in
    order) as
    the telemetry events its listeners heard; ``lifetime`` is the operation's stored
    ``created_ms``, ``expires_ms`` and ``expires_set_by``, which an expiry's bound reports, with
    the breakdown of the history before it (D10.9, D13)."""
    rows = list(history)
    events = []
    for i, row in enumerate(rows):
        event = deferred_event(
            op_id,
            row["at_ms"],
            row["status"],
            row.get("code"),
            digest=row.get("digest"),
            lifetime=lifetime,
        )
        if event.bound is not None:
            event.bound.breakdown = lifetime_breakdown(rows[: i + 1], row["at_ms"])
        events.append(event)
    return events


def emit_committed(events: list[Event]) -> None:
    """Hand events collected by a transaction to the listeners (called after its commit)."""
    for event in events:
        emit_event(event)
