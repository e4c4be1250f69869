"""One telemetry vocabulary: events to pluggable listeners, and counters with userver's names.

With no listener registered, emitting costs one truthiness check of a list (``if _listeners``),
so hot paths guard with :func:`enabled` before building an event.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .._core import _clock, _preempt
from .._core._errors import ConfigurationError, DeadlineExceeded

__all__ = [
    "Counters",
    "Event",
    "Listener",
    "add_listener",
    "correlation",
    "counters",
    "current_correlation",
    "emit",
    "emit_event",
    "enabled",
    "remove_listener",
]


@dataclass(frozen=True, slots=True)
class Event:
    """Something that happened under a deadline: the one event record every engine emits (D10.1).

    ``name`` is one of the stable event names, its first dotted part naming the engine for the
    durable ones (``attempt.start``, ``retry.delay``, ``call.end``, ``workflow.token_executing``,
    ``deferred.completed``, …, docs/telemetry.md); ``at`` is the monotonic instant; ``attrs``
    carries the details (``policy``, ``attempt``, ``delay``, ``node_id``, …); ``correlation``
    names the units of work the event belongs to, by kind (``{"request": …, "run": …, "token": …,
    "operation": …}``, see :func:`correlation`). ``epoch_ms`` is the same instant in epoch
    milliseconds (for a durable engine's event, the instant its row stores); ``bound`` is the
    bound that fired, when one did, in the shape errors carry it: a
    :class:`~timebound.DeadlineExceeded` with its ``source``, ``timeout`` and ``deadline``
    (D2.1, D10.2).
    """

    name: str
    at: float
    attrs: Mapping[str, Any] = field(default_factory=dict)
    correlation: Mapping[str, str] = field(default_factory=dict)
    epoch_ms: int | None = None
    bound: DeadlineExceeded | None = None

    @property
    def kind(self) -> str:
        """The event's family: the first dotted part of its name (``workflow``, ``deferred``,
        ``attempt``, ``call``, …)."""
        return self.name.split(".", 1)[0]


_NO_CORRELATION: Mapping[str, str] = MappingProxyType({})
# The units of work the running code belongs to. Context-carried, so tasks started inside a
# unit inherit it and concurrent units never see each other's ids.
_correlation: ContextVar[Mapping[str, str]] = ContextVar(
    "timebound_correlation", default=_NO_CORRELATION
)


def current_correlation() -> Mapping[str, str]:
    """The correlation ids in effect here, by kind (empty outside any unit of work)."""
    return _correlation.get()


@contextmanager
def correlation(kind: str, id: str | None = None) -> Iterator[str]:
    """Mark the code inside as one unit of work of ``kind`` (``"request"``, ``"run"``, …).

    Every event emitted inside, also from tasks started inside, carries ``{kind: id}`` in
    :attr:`Event.correlation`, beside the ids of enclosing units of other kinds (a run inside a
    request carries both). ``id`` defaults to a fresh random one; the context manager yields it.
    Whoever starts a unit of work sets it: the ASGI/WSGI middleware per request, a Constellation
    program per run.
    """
    if not isinstance(kind, str) or not kind.isidentifier():
        raise ConfigurationError(
            f"correlation kind must be an identifier such as 'run', got {kind!r}", option="kind"
        )
    if id is None:
        id = os.urandom(8).hex()  # unique across processes, and cheap enough per request
    elif not isinstance(id, str) or not id or len(id) > 128:
        raise ConfigurationError(
            f"correlation id must be a non-empty str of at most 128 characters, got {id!r}",
            option="id",
        )
    token = _correlation.set(MappingProxyType({**_correlation.get(), kind: id}))
    try:
        yield id
    finally:
        _correlation.reset(token)


class correlated:
    """Mark the code inside as belonging to the units of work ``ids`` (kind → id) at once, with
    one change of the context: what nested :func:`correlation` blocks would do, for an engine
    whose kinds are fixed and whose ids it made or validated itself (a workflow attempt's run,
    token and node). One instance per ``with`` block."""

    __slots__ = ("_ids", "_token")

    def __init__(self, ids: Mapping[str, str]) -> None:
        self._ids = ids

    def __enter__(self) -> None:
        self._token = _correlation.set(MappingProxyType({**_correlation.get(), **self._ids}))

    def __exit__(self, *exc: object) -> None:
        _correlation.reset(self._token)


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
    """Send an event to every listener. A listener's exception never reaches the caller.

    A :class:`~timebound.DeadlineExceeded` among the attributes (``error=``) is the event's
    :attr:`Event.bound`.
    """
    listeners = _listeners
    if not listeners:
        return
    bound = next((v for v in attrs.values() if isinstance(v, DeadlineExceeded)), None)
    event = Event(name, _clock.now(), attrs, _correlation.get(), _clock.wall_ms(), bound)
    _deliver(listeners, event)


def emit_event(event: Event) -> None:
    """Send an event built elsewhere (a durable engine's, after its commit) to every listener."""
    listeners = _listeners
    if listeners:
        _deliver(listeners, event)


def _deliver(listeners: list[Listener], event: Event) -> None:
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
# imports telemetry). `import timebound` does not load telemetry, so threads may have been
# abandoned before this module loaded: the counter starts from the core's own count. (An
# abandonment in the few instructions between the two lines below is the only one missed.)
if _preempt.abandoned_threads():
    counters.inc("abandoned-threads", _preempt.abandoned_threads())
_preempt.abandon_hooks.append(_thread_abandoned)
