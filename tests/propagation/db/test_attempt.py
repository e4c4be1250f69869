"""A database call's attempt: begun by the one client boundary, counted under its driver."""

from __future__ import annotations

import pytest

import timebound as tb
from timebound.propagation._client import AttemptTimeoutBase, begin
from timebound.propagation.db._common import options
from timebound.telemetry import Event, add_listener, counters


def test_lowered_timeout_is_counted_under_the_drivers_label() -> None:
    """A user's call whose timeout the deadline lowered counts ``timeout-updated-by-deadline``
    with ``component=<driver>`` and emits the span tag ``timeout_ms`` (no header of ours)."""
    seen: list[Event] = []
    remove = add_listener(seen.append)
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            attempt = begin(None, options("drv", "drv query"), AttemptTimeoutBase)
    finally:
        remove()
    assert attempt.lowered and attempt.header_value is None
    assert counters.get("timeout-updated-by-deadline", component="drv") == 1
    tags = [e.attrs for e in seen if e.name == "span.tags"]
    assert tags == [{"component": "drv", "timeout_ms": attempt.clamped.ms}]


def test_bookkeeping_attempt_counts_only_a_cut() -> None:
    """An attempt for the adapter's own bookkeeping (``user=False``) is not counted as lowered,
    but failing fast on a spent deadline is counted as a cut."""
    quiet = options("drv", "drv connection", user=False)
    with tb.inherit_deadline(tb.Deadline.after(5)):
        begin(None, quiet, AttemptTimeoutBase)
    with tb.inherit_deadline(tb.Deadline.after(0)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            begin(None, quiet, AttemptTimeoutBase)
    assert info.value.source == "inherited"
    assert counters.get("timeout-updated-by-deadline", component="drv") == 0
    assert counters.get("cancelled-by-deadline", component="drv") == 1
