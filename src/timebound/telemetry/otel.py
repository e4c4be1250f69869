"""OpenTelemetry exporter (``pip install 'timebound[otel]'``).

:class:`OpenTelemetryExporter` listens to policy events and records, with a ``policy`` attribute,
the counters ``timebound.attempts``, ``timebound.timeouts``, ``timebound.retries``,
``timebound.fallbacks`` and ``timebound.cache_hits`` on a meter; every
:data:`timebound.telemetry.counters` value (userver's metric names verbatim, D4.7, e.g.
``deadline-received``) as an observable counter read at collection time; and each policy event as
a span event (``timebound.attempt.start``, …) on the current span when it is recording.

With ``tracer_provider=`` (or ``spans=True`` for the global provider) it also makes timebound's
own spans (D10.4): a policy call and its attempts, an HTTP request served through the ASGI
middleware, a workflow run, its node attempts, a deferred operation and its polls, linked into one
trace (docs/telemetry.md). Nothing is traced unless asked.

The propagation adapters' ``span.tags`` events (userver's span tags, D4.7:
``deadline_received_ms``, ``cancelled_by_deadline``, ``propagated_timeout_ms``, ``timeout_ms``,
``dp_original_body_size``, …) become attributes of the current span under their names verbatim,
so userver dashboards and queries carry over. ``component`` names the adapter that emitted the
event, not a tag, and is not set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

try:
    from opentelemetry import metrics, trace
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "timebound.telemetry.otel needs opentelemetry-api and opentelemetry-sdk: "
        "pip install 'timebound[otel]'"
    ) from exc

from .._version import __version__
from . import _tracing
from ._events import Counters, Event, add_listener, counters
from ._otel_spans import SpanMaker
from ._policy_metrics import POLICY_COUNTERS, policy_counter_for, span_attributes

__all__ = ["USERVER_METRICS", "OpenTelemetryExporter"]

#: userver's metric names (D4.7), observed from the start so dashboards see them at zero.
USERVER_METRICS = (
    "deadline-received",
    "cancelled-by-deadline",
    "timeout-updated-by-deadline",
    "deadline-propagated",
    "cancelled-by-deadline-propagation",
)

# Events that belong to a policy execution and are worth a span event.
_SPAN_EVENTS = frozenset(
    {
        "call.start",
        "cache.hit",
        "attempt.start",
        "attempt.end",
        "retry.delay",
        "fallback",
        "on_error",
        "cache.store",
        "call.end",
    }
)


class OpenTelemetryExporter:
    """A telemetry listener that records timebound's metrics and span events in OpenTelemetry.

    ``meter_provider`` defaults to the global one. ``span_events=False`` stops the policy span
    events, ``span_tags=False`` the userver span tags. ``tracer_provider`` (or ``spans=True``,
    the global tracer provider) turns on timebound's own spans. :meth:`install` registers it as
    a global telemetry listener; :meth:`close` removes it. It is also usable directly as a policy
    ``observer``.
    """

    def __init__(
        self,
        meter_provider: MeterProvider | None = None,
        *,
        span_events: bool = True,
        span_tags: bool = True,
        source: Counters = counters,
        tracer_provider: Any = None,
        spans: bool | None = None,
    ) -> None:
        self._meter = metrics.get_meter("timebound", __version__, meter_provider=meter_provider)
        self._counters = {
            short: self._meter.create_counter(f"timebound.{short}", unit="1", description=doc)
            for short, doc in POLICY_COUNTERS
        }
        self._span_events = span_events
        self._span_tags = span_tags
        self._source = source
        self._observed: set[str] = set()
        self._lock = threading.Lock()
        for name in USERVER_METRICS:
            self._observe(name)
        for name, _labels in source.snapshot():
            self._observe(name)
        self._remove: Callable[[], None] | None = None
        if spans is None:
            spans = tracer_provider is not None
        self._spans = SpanMaker(tracer_provider) if spans else None
        self._replaced: _tracing.Tracer | None = None

    def _observe(self, name: str) -> None:
        with self._lock:
            if name in self._observed:
                return
            self._observed.add(name)
        self._meter.create_observable_counter(
            name,
            callbacks=[self._callback_for(name)],
            unit="1",
            description=f"timebound counter {name!r}",
        )

    def _callback_for(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        source = self._source

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [
                Observation(value, dict(labels))
                for (n, labels), value in source.snapshot().items()
                if n == name
            ]

        return observe

    def __call__(self, event: Event) -> None:
        name = event.name
        if self._spans is not None:
            self._spans.on_event(event)
        if name == "span.tags":
            if self._span_tags:
                _set_span_tags(event)
            return
        if name == "metric":
            metric = event.attrs.get("metric")
            if isinstance(metric, str):
                self._observe(metric)
            return
        short = policy_counter_for(event)
        if short is not None:
            self._counters[short].add(1, {"policy": str(event.attrs.get("policy", ""))})
        if self._span_events and name in _SPAN_EVENTS:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(f"timebound.{name}", _attributes(event))

    def install(self) -> OpenTelemetryExporter:
        """Listen to every telemetry event from now on; returns ``self``."""
        if self._remove is None:
            self._remove = add_listener(self)
            if self._spans is not None:
                self._replaced = _tracing.install(self._spans)
        return self

    def close(self) -> None:
        """Stop listening (instruments stay with their meter, as OpenTelemetry requires); spans
        of runs and operations whose end this process did not see end as abandoned."""
        if self._remove is not None:
            self._remove()
            self._remove = None
            if self._spans is not None:
                if _tracing._tracer is self._spans:
                    _tracing.install(self._replaced)
                self._replaced = None
                self._spans.close()

    def __enter__(self) -> OpenTelemetryExporter:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _attributes(event: Event) -> Any:
    attributes = span_attributes(event.attrs)
    # The unit of work the event belongs to, as `correlation.request`, `correlation.run`, …
    attributes.update({f"correlation.{kind}": id for kind, id in event.correlation.items()})
    return attributes


def _set_span_tags(event: Event) -> None:
    span = trace.get_current_span()
    if not span.is_recording():
        return
    # ``component`` says which adapter spoke (a server and its clients share one span); a tag
    # that is None (nothing to report) is not an attribute value OpenTelemetry accepts.
    tags = {k: v for k, v in span_attributes(event.attrs).items() if k != "component"}
    if tags:
        span.set_attributes(tags)
