"""Spans of timebound's own for outgoing gRPC calls and database queries (D10.8): real grpcio
servers, real PostgreSQL, the SDK's in-memory exporter. Each span is a CLIENT child of the caller's
span with OpenTelemetry's attribute names (``rpc.*``, ``db.*``) and the budget as
``timebound.deadline.*``; a gRPC call carries the span's ``traceparent`` to the server."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest
import redis.exceptions
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import timebound as tb
from timebound.propagation import asyncpg as tb_asyncpg
from timebound.propagation import psycopg as tb_psycopg
from timebound.propagation import redis as tb_redis
from timebound.propagation.grpc import (
    aio_client_interceptors,
    aio_server_interceptor,
    client_interceptor,
    server_interceptor,
)
from timebound.telemetry.otel import OpenTelemetryExporter

from ..propagation.grpc.conftest import start_sync_server

BUDGET_S = 30.0


@pytest.fixture
def traced() -> Iterator[tuple[InMemorySpanExporter, Any]]:
    """The span exporter, and a tracer for the caller's own span."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with OpenTelemetryExporter(tracer_provider=provider):
        yield memory, provider.get_tracer("test")
    provider.shutdown()


class Echo:
    """A handler that answers, or fails with INVALID_ARGUMENT, and keeps the traceparent."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []

    def seen(self, context: Any) -> None:
        metadata = dict(context.invocation_metadata())
        self.traceparents.append(metadata.get("traceparent"))

    def sync(self, request: bytes, context: Any) -> bytes:
        self.seen(context)
        if request == b"bad":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
        return request

    async def aio(self, request: bytes, context: Any) -> bytes:
        self.seen(context)
        if request == b"bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad request")
        return request


def _only(memory: InMemorySpanExporter, kind: SpanKind) -> list[ReadableSpan]:
    return [s for s in memory.get_finished_spans() if s.kind == kind]


def _check_rpc(span: ReadableSpan, parent: ReadableSpan, code: int) -> None:
    attrs = span.attributes or {}
    assert span.name == "test.Echo/Say"
    assert span.parent is not None and span.parent.span_id == parent.context.span_id
    assert (attrs["rpc.system"], attrs["rpc.service"], attrs["rpc.method"]) == (
        "grpc",
        "test.Echo",
        "Say",
    )
    assert attrs["rpc.grpc.status_code"] == code
    # The caller's budget, and what grpc-timeout carried (no more than the budget).
    assert 0 < attrs["timebound.deadline.remaining_ms"] <= BUDGET_S * 1000
    assert 0 < attrs["timebound.deadline.propagated_ms"] <= BUDGET_S * 1000
    if code:
        assert span.status.status_code == StatusCode.ERROR
        assert attrs["error.type"] == "INVALID_ARGUMENT"
    else:
        assert span.status.status_code != StatusCode.ERROR


def _traceparent_of(span: ReadableSpan) -> str:
    """The trace and span id a W3C traceparent names (flags left out)."""
    return f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}"


def test_a_sync_grpc_call_is_a_client_span_the_server_continues(
    traced: tuple[InMemorySpanExporter, Any],
) -> None:
    memory, tracer = traced
    echo = Echo()
    server, port = start_sync_server(
        {"Say": grpc.unary_unary_rpc_method_handler(echo.sync)},
        interceptors=[server_interceptor()],
        service="test.Echo",
    )
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port}"), client_interceptor()
    )
    try:
        with tracer.start_as_current_span("request") as _:
            with tb.fail_after(BUDGET_S):
                assert channel.unary_unary("/test.Echo/Say")(b"hi") == b"hi"
                with pytest.raises(grpc.RpcError):
                    channel.unary_unary("/test.Echo/Say")(b"bad")
    finally:
        channel.close()
        server.stop(None)
    (parent,) = _only(memory, SpanKind.INTERNAL)
    ok, bad = _only(memory, SpanKind.CLIENT)
    _check_rpc(ok, parent, 0)
    _check_rpc(bad, parent, grpc.StatusCode.INVALID_ARGUMENT.value[0])
    assert [t and t.rsplit("-", 1)[0] for t in echo.traceparents] == [
        _traceparent_of(ok),
        _traceparent_of(bad),
    ]


@pytest.mark.asyncio_real
async def test_an_aio_grpc_call_is_a_client_span_the_server_continues(
    traced: tuple[InMemorySpanExporter, Any],
) -> None:
    memory, tracer = traced
    echo = Echo()
    server = grpc.aio.server(interceptors=[aio_server_interceptor()])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(echo.aio)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=aio_client_interceptors())
    try:
        with tracer.start_as_current_span("request"):
            with tb.fail_after(BUDGET_S):
                assert await channel.unary_unary("/test.Echo/Say")(b"hi") == b"hi"
                with pytest.raises(grpc.aio.AioRpcError):
                    await channel.unary_unary("/test.Echo/Say")(b"bad")
    finally:
        await channel.close()
        await server.stop(None)
    (parent,) = _only(memory, SpanKind.INTERNAL)
    ok, bad = _only(memory, SpanKind.CLIENT)
    _check_rpc(ok, parent, 0)
    _check_rpc(bad, parent, grpc.StatusCode.INVALID_ARGUMENT.value[0])
    assert [t and t.rsplit("-", 1)[0] for t in echo.traceparents] == [
        _traceparent_of(ok),
        _traceparent_of(bad),
    ]


def _check_query(span: ReadableSpan, parent: ReadableSpan, operation: str) -> None:
    attrs = span.attributes or {}
    assert span.name == operation and span.kind == SpanKind.CLIENT
    assert span.parent is not None and span.parent.span_id == parent.context.span_id
    assert (attrs["db.system"], attrs["db.operation.name"]) == ("postgresql", operation)
    assert 0 < attrs["timebound.deadline.remaining_ms"] <= BUDGET_S * 1000
    # The statement_timeout the query ran under: the budget left when it was sent.
    assert 0 < attrs["timebound.deadline.propagated_ms"] <= BUDGET_S * 1000
    assert "db.query.text" not in attrs  # a statement may hold values: never exported


@pytest.mark.postgres
@pytest.mark.asyncio_real
async def test_an_asyncpg_query_is_a_client_span(
    traced: tuple[InMemorySpanExporter, Any], postgres_dsn: str
) -> None:
    memory, tracer = traced
    con = await tb_asyncpg.connect(postgres_dsn)
    try:
        with tracer.start_as_current_span("request"):
            with tb.fail_after(BUDGET_S):
                assert await con.fetchval("SELECT 41 + 1") == 42
                with pytest.raises(Exception, match="division by zero"):
                    await con.fetchval("select 1 / 0")
    finally:
        await con.close()
    (parent,) = _only(memory, SpanKind.INTERNAL)
    ok, bad = _only(memory, SpanKind.CLIENT)
    _check_query(ok, parent, "SELECT")
    _check_query(bad, parent, "SELECT")
    assert ok.status.status_code != StatusCode.ERROR
    assert bad.status.status_code == StatusCode.ERROR
    assert (bad.attributes or {})["error.type"] == "DivisionByZeroError"


@pytest.mark.postgres
def test_a_psycopg_query_is_a_client_span(
    traced: tuple[InMemorySpanExporter, Any], postgres_dsn: str
) -> None:
    memory, tracer = traced
    with tb_psycopg.connect(postgres_dsn, autocommit=True) as con:
        with tracer.start_as_current_span("request"):
            with tb.fail_after(BUDGET_S):
                assert con.execute("SELECT 41 + 1").fetchone() == (42,)
                with pytest.raises(Exception, match="division by zero"):
                    con.execute("SELECT 1 / 0")
    (parent,) = _only(memory, SpanKind.INTERNAL)
    ok, bad = _only(memory, SpanKind.CLIENT)
    _check_query(ok, parent, "SELECT")
    _check_query(bad, parent, "SELECT")
    assert (bad.attributes or {})["error.type"] == "DivisionByZero"


def test_a_response_stream_is_one_span_ended_with_the_stream(
    traced: tuple[InMemorySpanExporter, Any],
) -> None:
    memory, tracer = traced

    def twice(request: bytes, context: Any) -> Iterator[bytes]:
        yield request
        yield request

    server, port = start_sync_server(
        {"Say": grpc.unary_stream_rpc_method_handler(twice)},
        interceptors=[server_interceptor()],
        service="test.Echo",
    )
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port}"), client_interceptor()
    )
    try:
        with tracer.start_as_current_span("request"):
            with tb.fail_after(BUDGET_S):
                assert list(channel.unary_stream("/test.Echo/Say")(b"hi")) == [b"hi", b"hi"]
    finally:
        channel.close()
        server.stop(None)
    # grpc runs a stream's done-callback on its own thread, maybe just after the last message.
    for _ in range(1000):
        if _only(memory, SpanKind.CLIENT):
            break
        time.sleep(0.005)
    (parent,) = _only(memory, SpanKind.INTERNAL)
    (stream,) = _only(memory, SpanKind.CLIENT)
    _check_rpc(stream, parent, 0)


def _check_command(span: ReadableSpan, parent: ReadableSpan, operation: str) -> None:
    attrs = span.attributes or {}
    assert span.name == operation and span.kind == SpanKind.CLIENT
    assert span.parent is not None and span.parent.span_id == parent.context.span_id
    assert (attrs["db.system"], attrs["db.operation.name"]) == ("redis", operation)
    assert 0 < attrs["timebound.deadline.remaining_ms"] <= BUDGET_S * 1000


@pytest.mark.redis
def test_a_redis_command_is_a_client_span_until_its_reply(
    traced: tuple[InMemorySpanExporter, Any], redis_url: str
) -> None:
    memory, tracer = traced
    client = tb_redis.from_url(redis_url)
    key = f"tb_span_{uuid.uuid4().hex[:8]}"
    try:
        with tracer.start_as_current_span("request"):
            with tb.fail_after(BUDGET_S):
                client.set(key, "1")
                with pytest.raises(redis.exceptions.ResponseError):
                    client.lpush(key, "x")  # a string, not a list: the server says so
    finally:
        client.delete(key)
        client.close()
    (parent,) = _only(memory, SpanKind.INTERNAL)
    set_, lpush, delete = _only(memory, SpanKind.CLIENT)
    assert delete.name == "DEL" and delete.parent is None  # the clean-up, outside the request
    _check_command(set_, parent, "SET")
    _check_command(lpush, parent, "LPUSH")
    assert set_.status.status_code != StatusCode.ERROR
    assert (lpush.attributes or {})["error.type"] == "ResponseError"


@pytest.mark.redis
@pytest.mark.asyncio_real
async def test_an_async_redis_command_is_a_client_span_until_its_reply(
    traced: tuple[InMemorySpanExporter, Any], redis_url: str
) -> None:
    memory, tracer = traced
    client = tb_redis.afrom_url(redis_url)
    key = f"tb_span_{uuid.uuid4().hex[:8]}"
    try:
        with tracer.start_as_current_span("request"):
            with tb.fail_after(BUDGET_S):
                await client.set(key, "1")
                assert await client.get(key) == b"1"
    finally:
        await client.delete(key)
        await client.aclose()
    (parent,) = _only(memory, SpanKind.INTERNAL)
    set_, get, delete = _only(memory, SpanKind.CLIENT)
    assert delete.name == "DEL" and delete.parent is None  # the clean-up, outside the request
    _check_command(set_, parent, "SET")
    _check_command(get, parent, "GET")
