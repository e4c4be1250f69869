"""One telemetry vocabulary: events to pluggable listeners, and counters with userver's names.

With no listener registered, emitting costs one truthiness check of a list (``if _listeners``),
so hot paths guard with :func:`enabled` before building an event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core import _clock, _preempt

__all__ = [
    "Counters",
    "Event",
    "Listener",
    "add_listener",
    "counters",
    "emit",
    "enabled",
    "remove_listener",
]


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened under a deadline.

    ``name`` is one of the stable event names (``attempt``, ``attempt.timeout``, ``retry``,
    ``fallback``, ``cache.hit``, ``deadline.exceeded``, …); ``at`` is the monotonic instant;
    ``attrs`` carries the details (``policy``, ``attempt``, ``delay``, ``source``, …).
    """

    name: str
    at: float
    attrs: Mapping[str, Any] = field(default_factory=dict)


Listener = Callable[[Event], None]

_listeners: list[Listener] = []
_lock = threading.Lock()


def add_listener(listener: Listener) -> Callable[[], None]:
    """Register ``listener`` for every event; returns a function that removes it."""
    global _listeners
    with _lock:
        _listeners = [*_listeners, listener]
    return lambda: remove_listener(listener)


def remove_listener(listener: Listener) -> None:
    """Unregister ``listener`` (no error if it is not registered)."""
    global _listeners
    with _lock:
        _listeners = [x for x in _listeners if x is not listener]


def enabled() -> bool:
    """True when at least one listener is registered."""
    return bool(_listeners)


def emit(name: str, **attrs: Any) -> None:
    """Send an event to every listener. A listener's exception never reaches the caller."""
    listeners = _listeners
    if not listeners:
        return
    event = Event(name, _clock.now(), attrs)
    for listener in listeners:
        try:
            listener(event)
        except Exception:
            import logging

            logging.getLogger("timebound.telemetry").exception("telemetry listener failed")


class Counters:
    """Monotonic counters keyed by name and labels (userver's metric names, D4.7).

    Thread-safe. Exporters (Prometheus, OpenTelemetry) read :meth:`snapshot`; tests read
    :meth:`get`.
    """

    def __init__(self) -> None:
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._lock = threading.Lock()

    def inc(self, name: str, amount: int = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0) + amount
        if _listeners:
            emit("metric", metric=name, amount=amount, **labels)

    def get(self, name: str, **labels: str) -> int:
        """The value for ``name`` with exactly these labels (0 if never incremented)."""
        return self._values.get((name, tuple(sorted(labels.items()))), 0)

    def total(self, name: str) -> int:
        """The sum over every label set of ``name``."""
        with self._lock:
            return sum(v for (n, _), v in self._values.items() if n == name)

    def snapshot(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
        with self._lock:
            return dict(self._values)

    def reset(self) -> None:
        with self._lock:
            self._values.clear()


#: The process-wide counters every adapter increments.
counters = Counters()


def _thread_abandoned(thread: str, what: str | None) -> None:
    counters.inc("abandoned-threads")
    emit("thread.abandoned", thread=thread, what=what)


# The core's signal/thread tiers report abandoned threads through this hook (core never
# imports telemetry).
_preempt.abandon_hooks.append(_thread_abandoned)
