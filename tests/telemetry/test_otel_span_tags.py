"""userver span tags (D4.7) become attributes of the current OpenTelemetry span, verbatim.

The adapters are real (the ASGI middleware, the httpx transport over httpx's ASGI transport,
redis-py against the real Redis); spans are read back from the SDK's in-memory span exporter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

import timebound as tb
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport
from timebound.propagation.redis import from_url
from timebound.telemetry import emit
from timebound.telemetry.otel import OpenTelemetryExporter
from timebound.testing import VirtualClock

H = "X-YaTaxi-Client-TimeoutMs"


class Spans:
    """A tracer whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = provider.get_tracer("test")

    def only(self) -> ReadableSpan:
        (span,) = self.exporter.get_finished_spans()
        return span


@pytest.fixture
def spans() -> Iterator[Spans]:
    """An installed OpenTelemetryExporter and an in-memory tracer."""
    exporter = OpenTelemetryExporter(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    with exporter:
        yield Spans()


def _attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


class App:
    """An ASGI app that answers ``body`` after ``sleep`` seconds."""

    def __init__(self, *, sleep: float = 0.0, body: bytes = b"hello") -> None:
        self.sleep = sleep
        self.body = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        if self.sleep:
            await asyncio.sleep(self.sleep)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": self.body})


def test_span_tags_event_sets_attributes_verbatim(spans: Spans) -> None:
    """Every tag of a span.tags event is set under its own name; component is not a tag."""
    with spans.tracer.start_as_current_span("request"):
        emit("span.tags", component="http-server", deadline_received_ms=250)
        emit("span.tags", component="http-server", cancelled_by_deadline=1, dp_original_body_size=5)
    assert _attrs(spans.only()) == {
        "deadline_received_ms": 250,
        "cancelled_by_deadline": 1,
        "dp_original_body_size": 5,
    }


def test_span_tag_without_a_value_is_left_out(spans: Spans) -> None:
    """A tag whose value is None is not set (OpenTelemetry has no null attribute)."""
    with spans.tracer.start_as_current_span("query"):
        emit("span.tags", component="redis", timeout_ms=None, cancelled_by_deadline=1)
    assert _attrs(spans.only()) == {"cancelled_by_deadline": 1}


def test_span_tags_without_a_recording_span_are_ignored(spans: Spans) -> None:
    """Outside any span the event is dropped without an error and no span is made."""
    emit("span.tags", component="http-client", propagated_timeout_ms=100)
    assert spans.exporter.get_finished_spans() == ()


def test_span_tags_can_be_switched_off() -> None:
    """span_tags=False leaves the span untouched."""
    spans = Spans()
    provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    with OpenTelemetryExporter(provider, span_tags=False):
        with spans.tracer.start_as_current_span("request"):
            emit("span.tags", component="http-server", deadline_received_ms=250)
    assert _attrs(spans.only()) == {}


async def test_asgi_late_response_tags_the_request_span(
    virtual_clock: VirtualClock, spans: Spans
) -> None:
    """A handler that answers after its 300 ms deadline: the span carries the received deadline,
    the cancellation and the size of the replaced body."""
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=DeadlineMiddleware(App(sleep=1.0, body=b"too late"))),
        base_url="http://test",
    )
    async with client:
        with spans.tracer.start_as_current_span("request"):
            response = await client.get("/", headers={H: "300"})
    assert response.status_code == 498
    assert _attrs(spans.only()) == {
        "deadline_received_ms": 300,
        "cancelled_by_deadline": 1,
        "dp_original_body_size": 8,
    }


async def test_httpx_lowered_timeout_tags_the_client_span(
    virtual_clock: VirtualClock, spans: Spans
) -> None:
    """An attempt whose 5 s timeout a 250 ms deadline lowered tags propagated_timeout_ms=250."""
    transport = AsyncDeadlineTransport(inner=httpx.ASGITransport(app=App()), timeout=5.0)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        with spans.tracer.start_as_current_span("call"):
            with tb.fail_after(0.25):
                response = await client.get("/")
    assert response.status_code == 200
    assert _attrs(spans.only()) == {"propagated_timeout_ms": 250}


def test_redis_tags_the_span_with_the_timeout_sent(
    virtual_clock: VirtualClock, spans: Spans, redis_url: str
) -> None:
    """A Redis command under a 2 s deadline tags timeout_ms=2000, the reply wait it used."""
    client = from_url(redis_url)
    try:
        with spans.tracer.start_as_current_span("cache"):
            with tb.fail_after(2):
                client.ping()
    finally:
        client.close()
    assert _attrs(spans.only()) == {"timeout_ms": 2000}
