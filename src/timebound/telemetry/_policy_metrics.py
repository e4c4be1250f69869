"""What both exporters count from policy events (one vocabulary, docs/telemetry.md).

Kept here, not in an exporter, so Prometheus and OpenTelemetry can never disagree on what an
"attempt" or a "timeout" is.
"""

from __future__ import annotations

import re
from typing import Any, Final

from ._events import Event

__all__ = ["POLICY_COUNTERS", "policy_counter_for", "sanitize_metric_name", "span_attributes"]

#: (short name, description) of each per-policy counter, labelled by ``policy``.
POLICY_COUNTERS: Final = (
    ("attempts", "Attempts started by resilience policies"),
    ("timeouts", "Attempts that ended by a deadline (any source)"),
    ("retries", "Retries scheduled after a failed attempt"),
    ("fallbacks", "Calls answered by their fallback"),
    ("cache_hits", "Calls answered from the cache"),
    ("retries_refused", "Retries left but not made: a server hint or a spent retry budget"),
    ("hedges_sent", "Hedged attempts started"),
    ("hedges_won", "Hedged attempts whose answer won the race"),
    ("hedges_suppressed", "Hedges due but not sent: deadline, concurrency or budget"),
)

_BY_EVENT: Final = {
    "retry.refused": "retries_refused",
    "hedge.sent": "hedges_sent",
    "hedge.won": "hedges_won",
    "hedge.suppressed": "hedges_suppressed",
}


def policy_counter_for(event: Event) -> str | None:
    """Which per-policy counter ``event`` increments, if any."""
    name = event.name
    if name == "attempt.start":
        return "attempts"
    if name == "attempt.end":
        return "timeouts" if event.attrs.get("outcome") == "timeout" else None
    if name == "retry.delay":
        return "retries"
    if name == "fallback":
        return "fallbacks"
    if name == "cache.hit":
        return "cache_hits"
    return _BY_EVENT.get(name)


_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_metric_name(name: str) -> str:
    """A userver metric name (``deadline-received``) as a Prometheus one (``deadline_received``)."""
    cleaned = _INVALID.sub("_", name)
    if cleaned and cleaned[0].isdigit():
        cleaned = "_" + cleaned
    return cleaned


def span_attributes(attrs: Any) -> dict[str, str | int | float | bool]:
    """Event attributes as OpenTelemetry span-event attributes (primitives only)."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, bool | int | float | str):
            out[key] = value
        elif isinstance(value, BaseException):
            out[key] = f"{type(value).__name__}: {value}"
        else:
            out[key] = str(value)
    return out
