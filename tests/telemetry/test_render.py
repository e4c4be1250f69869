"""The one text rendering of events: describe() and the Timeline listener."""

from __future__ import annotations

import io

import timebound as tb
from timebound.telemetry import Event, Timeline, describe


def _event(name: str, bound: tb.DeadlineExceeded | None = None, **attrs: object) -> Event:
    return Event(name, 0.0, attrs, {}, 0, bound)


def test_a_timeout_reads_as_its_bound() -> None:
    """A node's and a join's timeout name the bound's source, length and (when known) where it
    was set, from Event.bound (D2.8)."""
    node = tb.DeadlineExceeded(source="node", timeout=0.2, set_by="action fetch")
    join = tb.DeadlineExceeded(source="synchronization", timeout=1.5)
    assert (
        describe(_event("workflow.token_timed_out", node, node_id="A", policy_applied="fail"))
        == "token A: timed out (node bound, 200ms, set by action fetch, policy fail)"
    )
    assert (
        describe(_event("workflow.join_timed_out", join, transition_id="j", policy_applied="fail"))
        == "join j: synchronization bound fired (1.5s, policy fail)"
    )


def test_deferred_and_silent_events() -> None:
    """A deferred status reads with its code; metrics and dispatches are not shown."""
    assert (
        describe(_event("deferred.expired", operation_id="op", code="ttl", status="expired"))
        == "operation op: expired (ttl)"
    )
    assert describe(_event("metric", metric="x")) is None
    assert describe(_event("workflow.token_dispatched", node_id="A")) is None


def test_timeline_offsets_from_its_first_line_and_filters() -> None:
    """Offsets count from the first shown event; accept= drops the others."""
    out = io.StringIO()
    timeline = Timeline(out, accept=lambda e: e.attrs.get("policy") == "P")
    timeline(Event("attempt.start", 10.0, {"policy": "Q", "attempt": 1}))
    timeline(Event("attempt.start", 10.5, {"policy": "P", "attempt": 1}))
    timeline(Event("attempt.end", 10.75, {"policy": "P", "attempt": 1, "outcome": "ok"}))
    assert out.getvalue().splitlines() == [
        "  +    0.0 ms  P: attempt 1 starts",
        "  +  250.0 ms  P: attempt 1 -> ok",
    ]
