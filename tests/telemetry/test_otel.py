"""OpenTelemetry exporter with the real SDK: InMemoryMetricReader and an in-memory span exporter."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from timebound.policies import Policy
from timebound.telemetry import counters
from timebound.telemetry.otel import OpenTelemetryExporter
from timebound.testing import VirtualClock


def _points(reader: InMemoryMetricReader) -> dict[tuple[str, tuple[tuple[str, Any], ...]], Any]:
    data = reader.get_metrics_data()
    out: dict[tuple[str, tuple[tuple[str, Any], ...]], Any] = {}
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    out[(metric.name, tuple(sorted(point.attributes.items())))] = point.value
    return out


def _flaky(failures: int) -> Any:
    calls = 0

    def fn() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ConnectionError("down")
        return "ok"

    return fn


def test_policy_counters(virtual_clock: VirtualClock) -> None:
    """Attempts, retries, fallbacks and cache hits are recorded with a policy attribute."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with OpenTelemetryExporter(provider):
        Policy("OtelRetry", retry=2).execute_sync(_flaky(2))
        Policy("OtelFb", fallback="x").execute_sync(_flaky(1))
        cached = Policy("OtelCache", cache="1min")
        cached.execute_sync(_flaky(0))
        cached.execute_sync(_flaky(0))

        def late() -> None:
            virtual_clock.advance(2)

        Policy("OtelTimeout", timeout=1, on_error="skip").execute_sync(late)
    points = _points(reader)
    assert points[("timebound.attempts", (("policy", "OtelRetry"),))] == 3
    assert points[("timebound.retries", (("policy", "OtelRetry"),))] == 2
    assert points[("timebound.fallbacks", (("policy", "OtelFb"),))] == 1
    assert points[("timebound.cache_hits", (("policy", "OtelCache"),))] == 1
    assert points[("timebound.timeouts", (("policy", "OtelTimeout"),))] == 1


def test_userver_counters_are_observed() -> None:
    """timebound.telemetry.counters are read at collection time under userver's names."""
    reader = InMemoryMetricReader()
    exporter = OpenTelemetryExporter(MeterProvider(metric_readers=[reader])).install()
    try:
        counters.inc("deadline-propagated", 3, test="otel")
        counters.inc("otel-test-custom-metric", 1, test="otel")
        points = _points(reader)
    finally:
        exporter.close()
    assert points[("deadline-propagated", (("test", "otel"),))] == 3
    assert points[("otel-test-custom-metric", (("test", "otel"),))] == 1


def test_span_events_on_the_current_span(virtual_clock: VirtualClock) -> None:
    """Each policy event becomes a span event on the recording span, errors as text."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    tracer = tracer_provider.get_tracer("test")
    exporter = OpenTelemetryExporter(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    with tracer.start_as_current_span("request"):
        Policy("OtelSpan", retry=1).execute_sync(_flaky(1), observer=exporter)
    (span,) = spans.get_finished_spans()
    names = [e.name for e in span.events]
    assert names == [
        "timebound.call.start",
        "timebound.attempt.start",
        "timebound.attempt.end",
        "timebound.retry.delay",
        "timebound.attempt.start",
        "timebound.attempt.end",
        "timebound.call.end",
    ]
    first_end = span.events[2].attributes
    assert first_end is not None
    assert first_end["policy"] == "OtelSpan"
    assert first_end["outcome"] == "error"
    assert first_end["error"] == "ConnectionError: down"


def test_no_span_no_error(virtual_clock: VirtualClock) -> None:
    """Without a recording span the exporter only counts."""
    reader = InMemoryMetricReader()
    exporter = OpenTelemetryExporter(MeterProvider(metric_readers=[reader]))
    assert Policy("OtelNoSpan").execute_sync(_flaky(0), observer=exporter) == "ok"
    assert _points(reader)[("timebound.attempts", (("policy", "OtelNoSpan"),))] == 1
