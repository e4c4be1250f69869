"""The trace context stored with a run and with a deferred operation: whoever works on it later,
in another process, continues the trace. "Another process" is an exporter that holds none of the
spans the first one opened, exactly what a second process has."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.deferred.conftest import operation_doc, status_doc
from timebound import workflow as wf
from timebound.deferred import HostPolicy, Poller, Registry
from timebound.telemetry.otel import OpenTelemetryExporter


@pytest.fixture
def memory() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    yield spans, provider
    provider.shutdown()


def _ids(span: ReadableSpan) -> tuple[int, int]:
    return span.context.trace_id, span.context.span_id


def _parent(span: ReadableSpan) -> tuple[int, int] | None:
    return None if span.parent is None else (span.parent.trace_id, span.parent.span_id)


async def quick(ctx: wf.ActionContext) -> Any:
    return {"traceparent": ctx.traceparent}


_DEFINITION = {
    "id": "wf",
    "initial_node": "A",
    "actions": [{"id": "act", "kind": "python", "implementation": {"handler": "act"}}],
    "nodes": [{"id": "A", "action_id": "act"}],
}


@pytest.mark.postgres
@pytest.mark.asyncio_real
async def test_a_worker_elsewhere_runs_the_node_inside_the_runs_trace(
    pg_url: str, memory: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    """A run started by a non-worker engine (its span there) has its node attempt run by a
    worker engine with another exporter: the attempt's span is a child of the stored run span."""
    spans, provider = memory
    starter = wf.Engine(db=pg_url, actions={"act": quick}, worker=False)
    starter.register(_DEFINITION)
    with OpenTelemetryExporter(tracer_provider=provider):
        with provider.get_tracer("test").start_as_current_span("caller"):
            async with starter:
                run_id = await starter.start("wf", {})
    worker = wf.Engine(db=pg_url, actions={"act": quick})
    worker.register(_DEFINITION)
    with OpenTelemetryExporter(tracer_provider=provider):  # "another process"
        async with worker:
            result = await worker.wait(run_id, timeout=60)
    assert result.status == "completed"
    done = spans.get_finished_spans()
    (caller,) = [s for s in done if s.name == "caller"]
    (run,) = [s for s in done if s.name == "workflow.run"]
    (node,) = [s for s in done if s.name == "workflow.node"]
    assert _parent(run) == _ids(caller)
    assert _parent(node) == _ids(run)  # from the row's traceparent, not from a held span
    assert run.attributes["timebound.abandoned"] is True  # its end was committed elsewhere
    assert result.output["A"]["traceparent"].split("-")[2] == f"{run.context.span_id:016x}"


class _Connector:
    async def status(self, op: Any) -> object:
        return status_doc(op.id, status="completed")

    async def cancel(self, op: Any) -> object:
        raise NotImplementedError


@pytest.mark.asyncio_real
async def test_a_poller_elsewhere_polls_inside_the_registering_trace(
    tmp_path: Path, memory: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    """An operation registered under a span is polled by a poller with another exporter: the poll
    span is a child of the registering span, taken from the operation's row."""
    spans, provider = memory
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    async with Registry(url, policy=HostPolicy(jitter=False)) as registry:
        with OpenTelemetryExporter(tracer_provider=provider):
            with provider.get_tracer("test").start_as_current_span("registering"):
                op = await registry.register(operation_doc(), module="svc")
        assert op.traceparent is not None
        with OpenTelemetryExporter(tracer_provider=provider):  # "another process"
            await registry.apply_status(op.id, status_doc(op.id, status="running"))
            poller = Poller(registry, {"svc": _Connector()})
            await poller.poll_now(op.id)
    done = spans.get_finished_spans()
    (registering,) = [s for s in done if s.name == "registering"]
    (poll,) = [s for s in done if s.name == "deferred.poll"]
    assert _parent(poll) == _ids(registering)
    # Only the registering process made the operation's span (ended there as abandoned): the
    # other one's status changes open none of their own.
    (operation,) = [s for s in done if s.name == "deferred.operation"]
    assert operation.attributes["timebound.abandoned"] is True


async def test_a_child_runs_span_is_under_its_parent_run(
    virtual_clock: Any, make_engine: Any, memory: tuple[InMemorySpanExporter, TracerProvider]
) -> None:
    """A workflow_call node starts a child run whose workflow.run span is a child of the
    parent run's span (from the parent row's stored trace context)."""
    from .test_engine import HANDLERS
    from .test_subworkflows import child, parent

    spans, provider = memory
    with OpenTelemetryExporter(tracer_provider=provider):
        async with make_engine(HANDLERS, child(), parent({})) as engine:
            run_id = await engine.start("wf", {"X": 0})
            result = await engine.wait(run_id)
    assert result.status == "completed"
    runs = {s.attributes["timebound.workflow.definition_id"]: s
            for s in spans.get_finished_spans() if s.name == "workflow.run"}  # fmt: skip
    assert _parent(runs["child"]) == _ids(runs["wf"])
