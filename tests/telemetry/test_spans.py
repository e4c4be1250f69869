"""timebound's own OpenTelemetry spans, checked with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from timebound.policies import Policy
from timebound.telemetry import _tracing
from timebound.telemetry.otel import OpenTelemetryExporter
from timebound.testing import VirtualClock

from ._trace_scenario import deferred_service as serve_deferred
from ._trace_scenario import request_through_a_node_to_an_operation


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An exporter installed with an in-memory span exporter; removed after the test."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    with OpenTelemetryExporter(meters, tracer_provider=provider):
        yield memory
    provider.shutdown()


def _flaky(failures: int) -> Any:
    calls = 0

    def fn() -> str:
        nonlocal calls
        calls += 1
        if calls <= failures:
            raise ConnectionError("down")
        return "ok"

    return fn


def _child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return (
        span.parent is not None
        and span.parent.span_id == parent.context.span_id
        and span.context.trace_id == parent.context.trace_id
    )


def test_nothing_is_traced_unless_asked(virtual_clock: VirtualClock) -> None:
    """An exporter without a tracer provider installs no span maker and makes no span."""
    with OpenTelemetryExporter(MeterProvider(metric_readers=[InMemoryMetricReader()])):
        assert _tracing._tracer is None
        Policy("NoSpans", retry=1).execute_sync(_flaky(1))
    assert _tracing._tracer is None


def test_a_policy_call_and_its_attempts_are_spans(
    virtual_clock: VirtualClock, spans: InMemorySpanExporter
) -> None:
    """One policy.call span, one policy.attempt child per attempt; the failed one is an error."""
    assert Policy("Spanned", retry=2).execute_sync(_flaky(1)) == "ok"
    done = spans.get_finished_spans()
    (call,) = [s for s in done if s.name == "policy.call"]
    attempts = [s for s in done if s.name == "policy.attempt"]
    assert [s.attributes["timebound.attempt"] for s in attempts] == [1, 2]
    assert all(_child_of(a, call) for a in attempts)
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert attempts[0].attributes["error.type"] == "ConnectionError"
    assert attempts[1].attributes["timebound.outcome"] == "ok"
    assert call.attributes["timebound.policy"] == "Spanned"
    assert call.attributes["timebound.outcome"] == "ok"


def test_a_timed_out_attempt_names_its_bound(
    virtual_clock: VirtualClock, spans: InMemorySpanExporter
) -> None:
    """An attempt ended by its timeout carries timebound.bound.source, its length and where it
    was set (D2.8)."""

    def late() -> str:
        virtual_clock.advance(5)
        return "late"

    Policy("SpanTimeout", timeout=1, on_error="skip").execute_sync(late)
    (attempt,) = [s for s in spans.get_finished_spans() if s.name == "policy.attempt"]
    assert attempt.attributes["timebound.outcome"] == "timeout"
    assert attempt.attributes["timebound.bound.source"] == "attempt"
    assert attempt.attributes["timebound.bound.timeout_ms"] == 1000
    assert attempt.attributes["timebound.bound.set_by"] == "policy SpanTimeout"


async def test_a_constellation_run_is_a_span_over_its_module_calls(
    virtual_clock: VirtualClock, spans: InMemorySpanExporter
) -> None:
    """A program run is a constellation.run span, each module call a constellation.call child
    (a call made under options has its policy.call span inside)."""
    from tests.dsl._modules import build

    program = build("in x: Int\na = Inc(x)\nb = Inc(x) with retry: 1\nout a\nout b")
    assert await program.run({"x": 1}) == {"a": 2, "b": 2}
    done = spans.get_finished_spans()
    (run,) = [s for s in done if s.name == "constellation.run"]
    calls = [s for s in done if s.name == "constellation.call"]
    assert len(calls) == 2 and all(_child_of(c, run) for c in calls)
    assert {c.attributes["timebound.module"] for c in calls} == {"Inc"}
    (policy_call,) = [s for s in done if s.name == "policy.call"]
    assert any(_child_of(policy_call, c) for c in calls)
    assert run.attributes["timebound.run_id"]


def test_a_pipeline_run_is_a_span_over_its_regions_and_tasks(
    spans: InMemorySpanExporter,
) -> None:
    """A pipeline run is a pipeline.run span; its top-level tasks and regions are its children,
    a region's tasks the region's."""
    from tests.pipeline import sample
    from timebound import pipeline as pl

    reg = sample.make_registry(fetch_features=1.0)
    VirtualClock().run(pl.Engine(reg).run(pl.compile(sample.make_plan(reg)), sample.rows(4)))
    done = spans.get_finished_spans()
    (run,) = [s for s in done if s.name == "pipeline.run"]
    tasks = {
        s.attributes["timebound.node_id"]: s for s in done if "timebound.node_id" in s.attributes
    }
    region = tasks["timeout_wrapper"]
    assert _child_of(region, run)
    assert _child_of(tasks["timeout_wrapper/fail/fill_defaults"], region)
    assert run.attributes["timebound.plan_digest"]


@pytest.fixture
def deferred_service(tmp_path: Path) -> Iterator[str]:
    """The deferred-operation service running in a uvicorn process of its own."""
    with serve_deferred(tmp_path) as url:
        yield url


@pytest.mark.asyncio_real
async def test_one_trace_from_a_request_through_a_node_to_its_deferred_operation(
    tmp_path: Path, deferred_service: str, spans: InMemorySpanExporter
) -> None:
    """A request served by uvicorn starts a run; its node defers to another process's operation:
    the request, the run, the node attempt, its outgoing call (with the budget it propagated),
    the operation and its polls are one trace."""
    run_id = await request_through_a_node_to_an_operation(tmp_path, deferred_service)

    done = spans.get_finished_spans()
    by_name: dict[str, list[ReadableSpan]] = {}
    for s in done:
        by_name.setdefault(s.name, []).append(s)
    (request,) = [s for s in by_name["POST"] if s.kind is SpanKind.SERVER]
    (run,) = by_name["workflow.run"]
    (node,) = by_name["workflow.node"]
    (operation,) = by_name["deferred.operation"]
    polls = by_name["deferred.poll"]
    assert request.kind is SpanKind.SERVER
    assert request.attributes["http.request.method"] == "POST"
    assert request.attributes["http.response.status_code"] == 202
    assert _child_of(run, request) and run.attributes["timebound.workflow.run_id"] == run_id
    assert _child_of(node, run) and node.attributes["timebound.workflow.node_id"] == "A"
    assert node.attributes["timebound.outcome"] == "deferred"
    (call,) = [s for s in by_name["POST"] if s.kind is SpanKind.CLIENT]
    assert _child_of(call, node) and call.attributes["http.response.status_code"] == 202
    assert 0 < call.attributes["timebound.deadline.propagated_ms"] <= 60_000
    assert _child_of(operation, node)
    assert operation.attributes["timebound.deferred.status"] == "completed"
    assert polls and all(_child_of(p, operation) for p in polls)
    assert run.attributes["timebound.workflow.status"] == "completed"
