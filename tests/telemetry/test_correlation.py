"""Correlation ids: every event names the units of work (request, run) it belongs to."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import timebound as tb
from timebound.dsl import ModuleRegistry, compile
from timebound.policies import Policy
from timebound.propagation.asgi import DeadlineMiddleware as AsgiMiddleware
from timebound.propagation.wsgi import DeadlineMiddleware as WsgiMiddleware
from timebound.telemetry import Event, add_listener, correlation, current_correlation, emit
from timebound.telemetry.otel import OpenTelemetryExporter
from timebound.testing import VirtualClock


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Every event emitted during the test."""
    seen: list[Event] = []
    remove = add_listener(seen.append)
    try:
        yield seen
    finally:
        remove()


def test_no_unit_of_work_no_correlation(events: list[Event]) -> None:
    """An event emitted outside any unit of work carries an empty correlation."""
    emit("probe")
    assert dict(events[0].correlation) == {}


def test_events_inside_a_unit_carry_its_id(events: list[Event]) -> None:
    """Inside correlation('run', id) every event carries that id, and not after."""
    with correlation("run", "r-1") as run_id:
        emit("inside")
    emit("after")
    assert run_id == "r-1"
    assert [dict(e.correlation) for e in events] == [{"run": "r-1"}, {}]


def test_units_of_different_kinds_nest(events: list[Event]) -> None:
    """A run inside a request carries both ids; the same kind nested replaces, then restores."""
    with correlation("request", "q"):
        with correlation("run", "r1"):
            emit("a")
            with correlation("run", "r2"):
                emit("b")
            emit("c")
    assert [dict(e.correlation) for e in events] == [
        {"request": "q", "run": "r1"},
        {"request": "q", "run": "r2"},
        {"request": "q", "run": "r1"},
    ]


def test_fresh_ids_are_random_hex() -> None:
    """Without an id, each unit gets a fresh 16-hex-digit id."""
    with correlation("run") as first, correlation("run") as second:
        assert current_correlation() == {"run": second}
    assert re.fullmatch(r"[0-9a-f]{16}", first) and first != second


async def test_tasks_inherit_and_concurrent_units_stay_apart(
    events: list[Event], virtual_clock: VirtualClock
) -> None:
    """Tasks started inside a unit inherit its id; concurrent units never see each other's."""

    async def unit(name: str) -> None:
        with correlation("run", name):
            await asyncio.sleep(0)
            await asyncio.create_task(_emit_later(name))

    await asyncio.gather(unit("one"), unit("two"))
    assert sorted((e.name, dict(e.correlation)["run"]) for e in events) == [
        ("one", "one"),
        ("two", "two"),
    ]


async def _emit_later(name: str) -> None:
    await asyncio.sleep(0)
    emit(name)


@pytest.mark.parametrize(
    ("kind", "id", "option"),
    [("", None, "kind"), ("a b", None, "kind"), ("run", "", "id"), ("run", "x" * 129, "id")],
)
def test_bad_kind_or_id_is_a_configuration_error(kind: str, id: str | None, option: str) -> None:
    """A kind that is not an identifier, or an empty or huge id, is refused, naming which."""
    with pytest.raises(tb.ConfigurationError) as info, correlation(kind, id):
        pass  # pragma: no cover
    assert info.value.option == option


def _handler_app() -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        emit("handler")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


@pytest.mark.parametrize("headers", [{}, {"X-YaTaxi-Client-TimeoutMs": "5000"}])
async def test_asgi_requests_get_their_own_id(
    events: list[Event], headers: dict[str, str], virtual_clock: VirtualClock
) -> None:
    """Each request through the ASGI middleware is one unit, with or without a deadline."""
    app = AsgiMiddleware(_handler_app())
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://test"
    ) as client:
        await client.get("/", headers=headers)
        await client.get("/", headers=headers)
    ids = [e.correlation.get("request") for e in events if e.name == "handler"]
    assert len(ids) == 2 and None not in ids and ids[0] != ids[1]


def test_wsgi_request_gets_an_id_also_while_streaming(events: list[Event]) -> None:
    """A WSGI request with a deadline is one unit, also while its body is iterated."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        emit("handler")
        start_response("200 OK", [("Content-Type", "text/plain")])
        yield b"a"
        emit("streaming")
        yield b"b"

    environ = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": "/",
        "HTTP_X_YATAXI_CLIENT_TIMEOUTMS": "5000",
        "wsgi.input": io.BytesIO(),
    }
    body = b"".join(WsgiMiddleware(app)(environ, lambda status, headers, exc=None: None))
    assert body == b"ab"
    (handler,) = [e for e in events if e.name == "handler"]
    (streaming,) = [e for e in events if e.name == "streaming"]
    assert handler.correlation["request"] == streaming.correlation["request"]


def test_constellation_runs_get_their_own_id(events: list[Event]) -> None:
    """Each run of a Constellation program is one unit: its call events carry the run's id."""
    registry = ModuleRegistry()

    @registry.module
    def Echo(x: int) -> int:
        return x

    program = compile("in x: Int\ny = Echo(x) with retry: 1\nout y", modules=registry)
    with correlation("request", "q-1"):
        assert program.run_sync({"x": 1}) == {"y": 1}
    assert program.run_sync({"x": 2}) == {"y": 2}
    calls = [dict(e.correlation) for e in events if e.name == "call.start"]
    assert calls[0]["request"] == "q-1" and "request" not in calls[1]
    assert calls[0]["run"] != calls[1]["run"]


def test_otel_span_events_carry_the_correlation() -> None:
    """The OpenTelemetry exporter adds correlation.<kind> attributes to each span event."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    exporter = OpenTelemetryExporter(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    with provider.get_tracer("test").start_as_current_span("request"):
        with correlation("request", "q-7"):
            Policy("Correlated").execute_sync(lambda: 1, observer=exporter)
    (span,) = spans.get_finished_spans()
    assert {dict(e.attributes or {}).get("correlation.request") for e in span.events} == {"q-7"}
