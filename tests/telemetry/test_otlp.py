"""timebound's spans over the OTLP wire: the SDK's real ``OTLPSpanExporter`` sends them over real
gRPC to a receiver that implements the OTLP ``TraceService/Export`` RPC with the servicer
generated from the OTLP protos (the interface a collector's OTLP receiver implements). No
collector binary can be installed here (docs/telemetry.md says what was checked), so this
receiver stands in for one: what it receives is what a collector would."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from timebound.telemetry.otel import OpenTelemetryExporter

from ._trace_scenario import deferred_service, request_through_a_node_to_an_operation


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: keeps every ``ExportTraceServiceRequest`` it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._lock = threading.Lock()

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, Any], Span]]:
        """Every span received, with its resource's attributes."""
        with self._lock:
            requests = list(self.requests)
        return [
            (_attributes(rs.resource.attributes), span)
            for request in requests
            for rs in request.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value"))


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    """The receiver served by a grpcio server on a free local port; stopped after the test."""
    servicer = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, port
    finally:
        server.stop(grace=None).wait()


@pytest.mark.asyncio_real
async def test_one_trace_reaches_an_otlp_receiver_over_grpc(
    tmp_path: Path, receiver: tuple[Receiver, int]
) -> None:
    """The request served by uvicorn, the run it started, the node attempt, its outgoing call,
    the deferred operation (in another process) and its polls arrive at the receiver as one
    trace: parent and child linked by id, span kinds and timebound's attributes as sent."""
    servicer, port = receiver
    provider = TracerProvider(resource=Resource.create({"service.name": "reports"}))
    exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=30)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    try:
        with (
            deferred_service(tmp_path) as service,
            OpenTelemetryExporter(tracer_provider=provider),
        ):
            run_id = await request_through_a_node_to_an_operation(tmp_path, service)
        assert provider.force_flush(timeout_millis=30_000)
    finally:
        provider.shutdown()

    received = servicer.spans()
    assert received and all(r.get("service.name") == "reports" for r, _ in received)
    spans = [span for _, span in received]
    by_name: dict[str, list[Span]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (request,) = [s for s in by_name["POST"] if s.kind == Span.SPAN_KIND_SERVER]
    (call,) = [s for s in by_name["POST"] if s.kind == Span.SPAN_KIND_CLIENT]
    (run,) = by_name["workflow.run"]
    (node,) = by_name["workflow.node"]
    (operation,) = by_name["deferred.operation"]
    polls = by_name["deferred.poll"]
    assert polls

    # One trace: every span of the scenario carries the request's trace id.
    trace_id = request.trace_id
    assert len(trace_id) == 16 and trace_id != bytes(16)
    assert {s.trace_id for s in [run, node, call, operation, *polls]} == {trace_id}

    def child_of(span: Span, parent: Span) -> bool:
        return span.parent_span_id == parent.span_id and span.trace_id == parent.trace_id

    assert request.parent_span_id == b""  # the root: the caller sent no traceparent
    assert child_of(run, request) and child_of(node, run) and child_of(call, node)
    assert child_of(operation, node) and all(child_of(p, operation) for p in polls)

    request_attrs = _attributes(request.attributes)
    assert request_attrs["http.request.method"] == "POST"
    assert request_attrs["http.response.status_code"] == 202
    run_attrs = _attributes(run.attributes)
    assert run_attrs["timebound.workflow.run_id"] == run_id
    assert run_attrs["timebound.workflow.definition_id"] == "report"
    assert run_attrs["timebound.workflow.status"] == "completed"
    node_attrs = _attributes(node.attributes)
    assert node_attrs["timebound.workflow.node_id"] == "A"
    assert node_attrs["timebound.outcome"] == "deferred"
    call_attrs = _attributes(call.attributes)
    assert call_attrs["http.response.status_code"] == 202
    assert 0 < call_attrs["timebound.deadline.propagated_ms"] <= 60_000
    operation_attrs = _attributes(operation.attributes)
    assert operation_attrs["timebound.deferred.status"] == "completed"
    operation_id = operation_attrs["timebound.deferred.operation_id"]
    assert all(
        _attributes(p.attributes)["timebound.deferred.operation_id"] == operation_id for p in polls
    )
    # Kinds as a collector reads them: the served request SERVER, the outgoing call CLIENT,
    # timebound's own units of work INTERNAL.
    assert {run.kind, node.kind, operation.kind} == {Span.SPAN_KIND_INTERNAL}
    # Instants survive the wire: each child starts within its parent.
    for child, parent in ((run, request), (node, run), (operation, node)):
        assert parent.start_time_unix_nano <= child.start_time_unix_nano
    assert operation.end_time_unix_nano >= max(p.end_time_unix_nano for p in polls)
