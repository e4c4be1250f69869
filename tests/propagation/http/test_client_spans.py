"""With spans exported, every HTTP client adapter makes a client span that carries the budget it
propagated, and sends its W3C traceparent so the server continues the trace (D10.4)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
import requests
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import timebound as tb
from timebound.policies import Policy
from timebound.propagation.aiohttp import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from timebound.propagation.requests import DeadlineAdapter
from timebound.telemetry.otel import OpenTelemetryExporter

from .conftest import TIMEOUT_HEADER, Downstream

pytestmark = pytest.mark.asyncio_real


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with OpenTelemetryExporter(tracer_provider=provider):
        yield memory
    provider.shutdown()


def _checked(spans: InMemorySpanExporter, app: Downstream, url: str) -> None:
    (call,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CLIENT]
    assert isinstance(call, ReadableSpan)
    assert call.name == "GET" and call.attributes["http.request.method"] == "GET"
    assert call.attributes["url.full"] == f"{url}/ok"
    assert call.attributes["server.address"] == "127.0.0.1"
    assert call.attributes["http.response.status_code"] == 200
    (seen,) = app.seen
    assert call.attributes["timebound.deadline.propagated_ms"] == int(seen.headers[TIMEOUT_HEADER])
    assert 0 < call.attributes["timebound.deadline.remaining_ms"] <= 60_000
    # The server received the client span's own context: it continues the trace.
    _, trace_id, span_id, _ = seen.headers["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (call.context.trace_id, call.context.span_id)


def test_requests(svc: tuple[Downstream, str], spans: InMemorySpanExporter) -> None:
    """requests through DeadlineAdapter."""
    app, url = svc
    with requests.Session() as session:
        session.mount("http://", DeadlineAdapter())
        with tb.fail_after(60):
            assert session.get(f"{url}/ok").text == "ok"
    _checked(spans, app, url)


def test_httpx_sync(svc: tuple[Downstream, str], spans: InMemorySpanExporter) -> None:
    """httpx through DeadlineTransport."""
    app, url = svc
    with httpx.Client(transport=DeadlineTransport()) as client, tb.fail_after(60):
        assert client.get(f"{url}/ok").text == "ok"
    _checked(spans, app, url)


async def test_httpx_async(svc: tuple[Downstream, str], spans: InMemorySpanExporter) -> None:
    """httpx through AsyncDeadlineTransport."""
    app, url = svc
    async with httpx.AsyncClient(transport=AsyncDeadlineTransport()) as client:
        with tb.fail_after(60):
            assert (await client.get(f"{url}/ok")).text == "ok"
    _checked(spans, app, url)


async def test_aiohttp(svc: tuple[Downstream, str], spans: InMemorySpanExporter) -> None:
    """aiohttp through DeadlineMiddleware."""
    app, url = svc
    async with aiohttp.ClientSession(middlewares=(DeadlineMiddleware(),)) as session:  # type: ignore[arg-type]
        with tb.fail_after(60):
            async with session.get(f"{url}/ok") as r:
                assert await r.text() == "ok"
    _checked(spans, app, url)


def test_a_wsgi_server_continues_the_callers_trace(spans: InMemorySpanExporter) -> None:
    """A WSGI app behind the middleware (werkzeug) gets a server span, child of the requests
    client span that called it, with its status; the app's own work is inside it."""
    from timebound.propagation.wsgi import DeadlineMiddleware as WsgiMiddleware

    from .conftest import ServerThread

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        Policy("Inside").execute_sync(lambda: None)
        start_response("201 Created", [("Content-Type", "text/plain")])  # type: ignore[operator]
        return [b"made"]

    with ServerThread(WsgiMiddleware(app), kind="wsgi") as server, requests.Session() as session:
        session.mount("http://", DeadlineAdapter())
        with tb.fail_after(60):
            assert session.post(f"{server.url}/things").status_code == 201
        for _ in range(500):  # the server ends its span when it closes the response
            if any(s.kind is SpanKind.SERVER for s in spans.get_finished_spans()):
                break
            threading.Event().wait(0.01)
    done = spans.get_finished_spans()
    (client,) = [s for s in done if s.kind is SpanKind.CLIENT]
    (served,) = [s for s in done if s.kind is SpanKind.SERVER]
    (inside,) = [s for s in done if s.name == "policy.call"]
    assert served.name == "POST" and served.attributes["url.path"] == "/things"
    assert served.attributes["http.response.status_code"] == 201
    assert served.parent is not None and served.parent.span_id == client.context.span_id
    assert inside.parent is not None and inside.parent.span_id == served.context.span_id
