"""Telemetry: events to pluggable listeners, counters with userver's metric names.

Exporters live behind extras: :mod:`timebound.telemetry.otel` (``timebound[otel]``) and
:mod:`timebound.telemetry.prometheus` (``timebound[prometheus]``).
"""

from ._durable import stored_operation_events, stored_run_events
from ._events import (
    Counters,
    Event,
    Listener,
    add_listener,
    correlation,
    counters,
    current_correlation,
    emit,
    enabled,
    remove_listener,
)
from ._render import Timeline, describe

__all__ = [
    "Counters",
    "Event",
    "Listener",
    "Timeline",
    "add_listener",
    "correlation",
    "counters",
    "current_correlation",
    "describe",
    "emit",
    "enabled",
    "remove_listener",
    "stored_operation_events",
    "stored_run_events",
]
