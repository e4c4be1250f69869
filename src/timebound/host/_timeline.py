"""A run's token timeline and the bound that fired, computed from its events; and the layout
both timelines of the UI share (a run's tokens, a pipeline trace's spans).

The events are the one record every engine emits (:class:`timebound.telemetry.Event`), read back
from the store by :func:`timebound.telemetry._durable.stored_run_events` (D10.9): the page draws
what a telemetry listener heard, not rows of its own reading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core._breakdown import as_breakdown
from ..telemetry import Event

__all__ = ["at_percent", "bound_fired", "budget_rows", "lay_out", "timeline", "timeouts"]

_TERMINAL = {"token_completed", "token_failed", "token_timed_out", "token_cancelled"}
_TIMEOUT_KINDS = ("token_timed_out", "join_timed_out")
_TIMEOUT_FIELDS = (
    "node_id",
    "transition_id",
    "timeout_type",
    "timeout_duration_ms",
    "bound_set_by",
    "bound_set_by_id",
    "policy_applied",
    "deadline_at",
    "detection_lag_ms",
)


def _kind(event: Event) -> str:
    """A workflow event's stored kind (``token_created``): its name without the engine."""
    return event.name.removeprefix("workflow.")


def _bound_fields(event: Event) -> dict[str, Any]:
    return {k: event.attrs[k] for k in _TIMEOUT_FIELDS if k in event.attrs}


def timeouts(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Every timeout of the run, with its layer (workflow, node, synchronization)."""
    return [
        {"kind": _kind(e), "at_epoch_ms": e.epoch_ms} | _bound_fields(e)
        for e in events
        if _kind(e) in _TIMEOUT_KINDS
    ]


def budget_rows(events: Sequence[Event]) -> list[dict[str, Any]] | None:
    """D13: where the budget of the bound that fired went, as rows of its tree (``depth``,
    ``label``, ``elapsed_ms``, ``budget_ms``, ``offset_ms``), or ``None`` when none was stored.

    The tree is the fired timeout's own, or the ``attempt_breakdown`` its cut attempt reported.
    """
    fired = [
        e for e in events if _kind(e) in _TIMEOUT_KINDS and e.attrs.get("policy_applied") != "retry"
    ]
    if not fired:
        return None
    last = fired[-1]
    tree = None if last.bound is None else last.bound.breakdown
    if tree is None:
        token = last.correlation.get("token")
        later = [
            e
            for e in events
            if _kind(e) == "attempt_breakdown" and e.correlation.get("token") == token
        ]
        tree = as_breakdown(later[-1].attrs.get("breakdown")) if later else None
    if tree is None:
        return None
    return [
        {
            "depth": depth,
            "label": p.label(),
            "elapsed_ms": p.elapsed_ms,
            "budget_ms": p.budget_ms,
            "offset_ms": p.offset_ms,
            "kind": p.kind,
        }
        for depth, p in tree.walk()
    ]


def bound_fired(events: Sequence[Event]) -> dict[str, Any] | None:
    """The bound that decided the run's course: its last timeout whose policy was applied for
    good (a node timeout that was retried decided nothing; a join that proceeded with what had
    arrived did, even if the run then completed)."""
    fired = [t for t in timeouts(events) if t.get("policy_applied") != "retry"]
    return fired[-1] if fired else None


def timeline(run: dict[str, Any], events: Sequence[Event], now_ms: int) -> dict[str, Any]:
    """Tokens as bars from creation to their end (``end_ms`` is ``None`` while live), and joins
    as markers; instants are epoch milliseconds as stored."""
    bars: dict[str, dict[str, Any]] = {}
    markers: list[dict[str, Any]] = []
    for e in events:
        kind, at, attrs = _kind(e), e.epoch_ms, e.attrs
        token_id = e.correlation.get("token")
        if kind == "token_created" and token_id is not None:
            bars[token_id] = {
                "token_id": token_id,
                "node_id": attrs.get("node_id"),
                "branch_index": attrs.get("branch_index"),
                "start_ms": at,
                "end_ms": None,
                "status": "pending",
                "timeout": None,
            }
        elif token_id in bars and kind.startswith("token_"):
            bar = bars[token_id]
            bar["status"] = kind.removeprefix("token_")
            if kind in _TERMINAL:
                bar["end_ms"] = at
            if kind == "token_timed_out":
                bar["timeout"] = _bound_fields(e)
        elif kind in ("join_decided", "join_timed_out"):
            markers.append(
                {
                    "kind": kind,
                    "at_ms": at,
                    "transition_id": attrs.get("transition_id"),
                    "timeout_type": attrs.get("timeout_type"),
                    "branches": attrs.get("branches"),
                }
            )
    start = run["started_at"]
    end = run["finished_at"] if run["finished_at"] is not None else max(now_ms, start)
    return {
        "start_ms": start,
        "end_ms": end,
        "deadline_ms": run["timeout_at"],
        "tokens": list(bars.values()),
        "markers": markers,
    }


def at_percent(at_ms: float, start_ms: float, end_ms: float) -> float:
    """Where the instant ``at_ms`` falls on a timeline from ``start_ms`` to ``end_ms``, in percent
    of its width (a timeline of no length is drawn as 1 ms long)."""
    return round((at_ms - start_ms) / max(end_ms - start_ms, 1) * 100, 2)


def lay_out(
    bars: list[dict[str, Any]], start_ms: float, end_ms: float, min_width: float = 0.5
) -> list[dict[str, Any]]:
    """Bars (each with ``start_ms`` and ``end_ms``; ``None`` while still running, drawn up to the
    timeline's end) placed as percentages of the timeline: ``left`` and ``width`` (at least
    ``min_width``, so an instant stays visible), with ``offset_ms`` and ``duration_ms``. A bar
    is drawn from the timeline's start at the earliest: one that claims to begin before it (a
    skipped pipeline span in a trace recorded before spans got sane starts) would otherwise be
    drawn over the label column."""
    span = max(end_ms - start_ms, 1)
    placed = []
    for bar in bars:
        end = bar["end_ms"] if bar["end_ms"] is not None else end_ms
        begin = max(bar["start_ms"], start_ms)
        end = max(end, begin)
        placed.append(
            {
                **bar,
                "left": at_percent(begin, start_ms, end_ms),
                "width": round(max((end - begin) / span * 100, min_width), 2),
                "offset_ms": begin - start_ms,
                "duration_ms": end - begin,
            }
        )
    return placed


# What ends an attempt (the token's executing stretch), and what its outcome is called.
_ATTEMPT_ENDS = {
    "token_completed": "completed",
    "token_failed": "failed",
    "token_timed_out": "timed_out",
    "token_cancelled": "cancelled",
    "token_retry_scheduled": "failed",  # failed, and retried after a delay
    "token_pending": "timed_out",  # a node timeout retried at once (on_timeout: retry)
    "token_redispatched": "interrupted",  # its worker stopped or its deadline was extended
    "token_waiting_for_siblings": "completed",  # done; waiting at the fan-in
}


def attempts(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Each token's stretches in order (D8.21): ``queued`` (created, not yet running),
    ``attempt`` (one per execution: start, end, outcome, error and the bound that cut it),
    ``delay`` (a retry's wait before the next attempt) and ``waiting`` (done, waiting for its
    siblings at a fan-in: drawn as waiting, not work). ``end_ms`` is ``None`` while open."""
    out: list[dict[str, Any]] = []
    open_: dict[str, dict[str, Any]] = {}  # token id -> its open stretch
    info: dict[str, dict[str, Any]] = {}

    def begin(token_id: str, kind: str, at: int | None, **more: Any) -> None:
        item = {**info[token_id], "kind": kind, "start_ms": at, "end_ms": None, **more}
        out.append(item)
        open_[token_id] = item

    def close(token_id: str, at: int | None, **more: Any) -> None:
        item = open_.pop(token_id, None)
        if item is not None:
            item.update(end_ms=at, **more)

    for e in events:
        kind, at, attrs, token_id = _kind(e), e.epoch_ms, e.attrs, e.correlation.get("token")
        if token_id is None:
            continue
        if kind == "token_created":
            info[token_id] = {
                "token_id": token_id,
                "node_id": attrs.get("node_id"),
                "branch_index": attrs.get("branch_index"),
            }
            begin(token_id, "queued", at)
            continue
        if token_id not in info or not kind.startswith("token_"):
            continue
        current = open_.get(token_id)
        if kind == "token_executing":
            close(token_id, at)
            begin(
                token_id,
                "attempt",
                at,
                attempt=attrs.get("attempt"),
                deadline_ms=attrs.get("timeout_at"),
                outcome=None,
                error=None,
                bound=None,
            )
        elif current is not None and current["kind"] == "attempt" and kind in _ATTEMPT_ENDS:
            bound = _bound_fields(e) if kind == "token_timed_out" else None
            close(token_id, at, outcome=_ATTEMPT_ENDS[kind], error=attrs.get("error"), bound=bound)
            if kind == "token_retry_scheduled":
                begin(token_id, "delay", at, until_ms=attrs.get("retry_at"))
            elif kind == "token_pending":
                begin(token_id, "delay", at, until_ms=at)
            elif kind == "token_waiting_for_siblings":
                begin(token_id, "waiting", at)
            elif kind == "token_redispatched":
                begin(token_id, "queued", at)
        elif kind in ("token_completed", "token_failed", "token_timed_out", "token_cancelled"):
            bound = _bound_fields(e) if kind == "token_timed_out" else None
            if current is not None:
                current.setdefault("outcome", None)
            close(token_id, at, ended=_ATTEMPT_ENDS[kind], bound=bound)
    return out
