"""timebound's own OpenTelemetry spans (D10.4, D10.5); used by :mod:`timebound.telemetry.otel`.

Two sources make them. Events a unit of work emits in its own task (a policy's ``call.start`` …
``call.end``, its attempts) open and close a span that is *current* in between, so what the
call does (an outgoing request, a nested policy) is its child. Units that outlive a task (a
workflow run, a deferred operation) are opened at a hook (:mod:`._tracing`) or by their first
committed event, kept here by id, and ended by the committed event that ends them. A node
attempt, a poll and an HTTP request are spans around code the engine runs (the hooks).

Attribute names follow OpenTelemetry's semantic conventions where one exists
(``http.request.method``, ``url.path``, ``http.response.status_code``, ``error.type``);
timebound's own are under ``timebound.*``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._core._scopes import current_deadline
from .._version import __version__
from ._events import Event
from ._policy_metrics import span_attributes

__all__ = ["SpanMaker"]

_W3C = TraceContextTextMapPropagator()
# Runs and operations whose end this process may never see (another process ends them) are
# dropped, oldest first, past this many; a dropped span is ended as "abandoned" (D10.5).
_OPEN_LIMIT = 10_000
_RUN_ENDS = frozenset(
    {"workflow.run_completed", "workflow.run_failed", "workflow.run_cancelled",
     "workflow.run_timed_out"}
)  # fmt: skip
# The history codes of an operation's registration (its first row).
_REGISTERED = (None, "invalid-hint")
_OP_ENDS = frozenset(
    {"deferred.completed", "deferred.failed", "deferred.timed-out", "deferred.cancelled",
     "deferred.expired", "deferred.unknown"}
)  # fmt: skip


def traceparent_of(span: Span) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def context_of(traceparent: str | None) -> otel_context.Context | None:
    """The context whose current span is ``traceparent`` (None: the current context)."""
    if not traceparent:
        return None
    return _W3C.extract({"traceparent": traceparent})


def _bound_attributes(event: Event) -> dict[str, Any]:
    bound = event.bound
    if bound is None:
        return {}
    out: dict[str, Any] = {"timebound.bound.source": bound.source}
    if bound.timeout is not None:
        out["timebound.bound.timeout_ms"] = round(bound.timeout * 1000)
    # D13.7: where the budget went, as the one-line summary and the capped JSON tree.
    bd = getattr(bound, "breakdown", None)
    if bd is not None:
        out["timebound.bound.breakdown"] = bd.summary()
        tree = bd.capped(4096)
        if tree is not None:
            out["timebound.bound.breakdown_json"] = tree
    if bound.set_by is not None:
        out["timebound.bound.set_by"] = bound.set_by
    return out


class _CallSpan:
    """An outgoing gRPC call's or database query's span (see ``_tracing.call_span``)."""

    __slots__ = ("_ended", "_lock", "_span")

    def __init__(self, span: Span) -> None:
        self._span = span
        self._ended = False
        self._lock = threading.Lock()  # a gRPC done-callback may run on grpc's thread

    def set(self, key: str, value: Any) -> None:
        self._span.set_attribute(key, value)

    def carrier(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier

    def end(self, error_type: str | None = None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        if error_type is not None:
            self._span.set_attribute("error.type", error_type)
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


class SpanMaker:
    """Makes timebound's spans on ``tracer_provider`` (the global one when None)."""

    def __init__(self, tracer_provider: Any = None) -> None:
        self._tracer = trace.get_tracer("timebound", __version__, tracer_provider=tracer_provider)
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, Span] = OrderedDict()
        self._ops: OrderedDict[str, Span] = OrderedDict()
        # The policy spans open in this context, innermost last: (kind, span, context token).
        self._stack: ContextVar[tuple[tuple[str, Span, object], ...]] = ContextVar(
            "timebound_policy_spans", default=()
        )

    # Hooks (._tracing.Tracer) ------------------------------------------------------------

    def current_traceparent(self) -> str | None:
        return traceparent_of(trace.get_current_span())

    def open_run(
        self, run_id: str, parent: str | None, attributes: Mapping[str, Any]
    ) -> str | None:
        attrs = {"timebound.workflow.run_id": run_id}
        attrs.update({f"timebound.workflow.{k}": v for k, v in attributes.items()})
        span = self._tracer.start_span(
            "workflow.run", context=context_of(parent) or otel_context.Context(), attributes=attrs
        )
        self._keep(self._runs, run_id, span)
        return traceparent_of(span)

    @contextlib.contextmanager
    def attempt(
        self, parent: str | None, attributes: Mapping[str, Any]
    ) -> Iterator[Callable[[str, str | None], None]]:
        attrs = {f"timebound.workflow.{k}": v for k, v in attributes.items()}
        # Under the run's stored context; a run started untraced makes a trace of its own, never
        # a child of whatever span the engine's loop was started under.
        span = self._tracer.start_span(
            "workflow.node", context=context_of(parent) or otel_context.Context(), attributes=attrs
        )

        def ended(outcome: str, error: str | None) -> None:
            span.set_attribute("timebound.outcome", outcome)
            if outcome not in ("ok", "deferred"):
                span.set_status(Status(StatusCode.ERROR, error))
                span.set_attribute("error.type", outcome)

        with trace.use_span(span, end_on_exit=True):
            yield ended

    @contextlib.contextmanager
    def poll(self, op_id: str, parent: str | None) -> Iterator[None]:
        with self._lock:
            op = self._ops.get(op_id)
        if op is not None:
            context = trace.set_span_in_context(op)
        else:  # registered elsewhere: under its stored context, else a trace of its own
            context = context_of(parent) or otel_context.Context()
        with self._tracer.start_as_current_span(
            "deferred.poll", context=context, attributes={"timebound.deferred.operation_id": op_id}
        ):
            yield

    @contextlib.contextmanager
    def server(self, scope: Mapping[str, Any]) -> Iterator[Callable[[Any], Any]]:
        headers = {
            k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in scope.get("headers", ())
            if k.lower() in (b"traceparent", b"tracestate")
        }
        method = str(scope.get("method", "GET"))
        attrs = {
            "http.request.method": method,
            "url.path": str(scope.get("path", "")),
            "url.scheme": str(scope.get("scheme", "http")),
        }
        with self._tracer.start_as_current_span(
            method, context=_W3C.extract(headers), kind=SpanKind.SERVER, attributes=attrs
        ) as span:

            def wrap(send: Any) -> Any:
                async def traced_send(message: Any) -> None:
                    if message.get("type") == "http.response.start":
                        status = int(message.get("status", 0))
                        span.set_attribute("http.response.status_code", status)
                        if status >= 500:
                            span.set_status(Status(StatusCode.ERROR))
                            span.set_attribute("error.type", str(status))
                    await send(message)

                return traced_send

            yield wrap

    @contextlib.contextmanager
    def run(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Callable[[Any], None]]:
        attrs = {f"timebound.{k}": v for k, v in attributes.items()}
        with self._tracer.start_as_current_span(name, attributes=attrs) as span:

            def export(pipeline_trace: Any) -> None:
                # Inside the run's span: the trace's top-level spans become its children. A
                # trace that cannot be exported never hides the run's own outcome.
                try:
                    pipeline_trace.export_otel(self._tracer)
                except Exception:
                    logging.getLogger("timebound.telemetry").exception("pipeline trace export")

            try:
                yield export
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                raise

    @contextlib.contextmanager
    def client(
        self, method: str, url: str, headers: Any
    ) -> Iterator[Callable[[int | None, str | None], None]]:
        parts = urlsplit(url)
        attrs: dict[str, Any] = {
            "http.request.method": method,
            "url.full": url,
            "server.address": parts.hostname or "",
        }
        if parts.port is not None:
            attrs["server.port"] = parts.port
        remaining = current_deadline().remaining()
        if math.isfinite(remaining):
            attrs["timebound.deadline.remaining_ms"] = max(0, round(remaining * 1000))
        with self._tracer.start_as_current_span(
            method, kind=SpanKind.CLIENT, attributes=attrs
        ) as span:
            _W3C.inject(headers)

            def answered(status: int | None, propagated_ms: str | None) -> None:
                if propagated_ms is not None and propagated_ms.isdigit():
                    span.set_attribute("timebound.deadline.propagated_ms", int(propagated_ms))
                if status is not None:
                    span.set_attribute("http.response.status_code", status)
                    if status >= 400:
                        span.set_status(Status(StatusCode.ERROR))
                        span.set_attribute("error.type", str(status))

            try:
                yield answered
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__name__)
                raise

    def call(self, name: str, attributes: Mapping[str, Any]) -> _CallSpan:
        attrs = dict(attributes)
        remaining = current_deadline().remaining()
        if math.isfinite(remaining):
            attrs["timebound.deadline.remaining_ms"] = max(0, round(remaining * 1000))
        return _CallSpan(self._tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attrs))

    def wsgi(
        self,
        environ: Mapping[str, Any],
        start_response: Any,
        serve: Callable[[Any], Iterable[bytes]],
    ) -> Iterable[bytes]:
        carrier = {
            name: environ[key]
            for name, key in (
                ("traceparent", "HTTP_TRACEPARENT"),
                ("tracestate", "HTTP_TRACESTATE"),
            )
            if isinstance(environ.get(key), str)
        }
        method = str(environ.get("REQUEST_METHOD", "GET"))
        attrs = {
            "http.request.method": method,
            "url.path": f"{environ.get('SCRIPT_NAME', '')}{environ.get('PATH_INFO', '')}",
            "url.scheme": str(environ.get("wsgi.url_scheme", "http")),
        }
        span = self._tracer.start_span(
            method, context=_W3C.extract(carrier), kind=SpanKind.SERVER, attributes=attrs
        )

        def traced_start_response(status: str, headers: Any, exc_info: Any = None) -> Any:
            code = status.split(" ", 1)[0]
            if code.isdigit():
                span.set_attribute("http.response.status_code", int(code))
                if int(code) >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                    span.set_attribute("error.type", code)
            if exc_info is None:
                return start_response(status, headers)
            return start_response(status, headers, exc_info)

        try:
            with trace.use_span(span, end_on_exit=False):
                result = serve(traced_start_response)
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR))
            span.end()
            raise
        return _EndOnClose(result, span)

    # Events ---------------------------------------------------------------------------------

    def on_event(self, event: Event) -> None:
        name = event.name
        if name in ("call.start", "attempt.start"):
            self._push(name.split(".")[0], event)
        elif name in ("call.end", "attempt.end"):
            self._pop(name.split(".")[0], event)
        elif name.startswith("workflow."):
            self._workflow(event)
        elif name.startswith("deferred."):
            self._deferred(event)

    def _push(self, kind: str, event: Event) -> None:
        attrs = {"timebound.policy": str(event.attrs.get("policy", ""))}
        if kind == "attempt":
            attrs["timebound.attempt"] = event.attrs.get("attempt", 0)
        span = self._tracer.start_span(f"policy.{kind}", attributes=attrs)
        token = otel_context.attach(trace.set_span_in_context(span))
        self._stack.set((*self._stack.get(), (kind, span, token)))

    def _pop(self, kind: str, event: Event) -> None:
        stack = self._stack.get()
        if not any(k == kind for k, _, _ in stack):
            return  # its start was emitted before the exporter listened
        while stack:  # a call's end also ends an attempt left open by a path without its end
            k, span, token = stack[-1]
            stack = stack[:-1]
            self._stack.set(stack)
            with contextlib.suppress(Exception):
                otel_context.detach(token)  # type: ignore[arg-type]
            if k == kind:
                self._end_policy_span(span, event)
                return
            span.end()

    @staticmethod
    def _end_policy_span(span: Span, event: Event) -> None:
        outcome = str(event.attrs.get("outcome", ""))
        span.set_attribute("timebound.outcome", outcome)
        span.set_attributes(_bound_attributes(event))
        error = event.attrs.get("error")
        if isinstance(error, BaseException) and outcome not in ("ok", "fallback", "cached"):
            span.set_status(Status(StatusCode.ERROR, str(error)))
            span.set_attribute("error.type", type(error).__name__)
        span.end()

    def _workflow(self, event: Event) -> None:
        run_id = event.correlation.get("run")
        if run_id is None:
            return
        with self._lock:
            span = self._runs.get(run_id)
            if span is not None and event.name in _RUN_ENDS:
                del self._runs[run_id]
        if span is None:
            return
        if event.name == "workflow.token_timed_out" or event.name == "workflow.join_timed_out":
            span.add_event(f"timebound.{event.name}", _event_attributes(event))
        elif event.name in _RUN_ENDS:
            status = event.name.removeprefix("workflow.run_")
            span.set_attribute("timebound.workflow.status", status)
            if status != "completed":
                span.set_status(Status(StatusCode.ERROR, str(event.attrs.get("error") or status)))
                span.set_attribute("error.type", status)
            span.end()

    def _deferred(self, event: Event) -> None:
        op_id = event.correlation.get("operation")
        if op_id is None:
            return
        ends = event.name in _OP_ENDS
        with self._lock:
            span = self._ops.get(op_id)
            if span is not None and ends:
                del self._ops[op_id]
        if span is None:
            if event.name != "deferred.pending" or event.attrs.get("code") not in _REGISTERED:
                return  # registered elsewhere (or before the exporter listened): no span here
            # Opened by its first committed event, in the task that registered it: a node
            # attempt's span (current here) is its parent.
            span = self._tracer.start_span(
                "deferred.operation",
                attributes={"timebound.deferred.operation_id": op_id},
            )
            self._keep(self._ops, op_id, span)
        status = str(event.attrs.get("status"))
        span.add_event(f"timebound.{event.name}", _event_attributes(event))
        if ends:
            span.set_attribute("timebound.deferred.status", status)
            if status != "completed":
                span.set_status(Status(StatusCode.ERROR, status))
                span.set_attribute("error.type", status)
            span.set_attributes(_bound_attributes(event))
            span.end()

    def _keep(self, where: OrderedDict[str, Span], key: str, span: Span) -> None:
        with self._lock:
            where[key] = span
            dropped = where.popitem(last=False)[1] if len(where) > _OPEN_LIMIT else None
        if dropped is not None:
            dropped.set_attribute("timebound.abandoned", True)
            dropped.end()

    def close(self) -> None:
        """End the spans still open (their end was never seen here) as abandoned."""
        with self._lock:
            spans = [*self._runs.values(), *self._ops.values()]
            self._runs.clear()
            self._ops.clear()
        for span in spans:
            span.set_attribute("timebound.abandoned", True)
            span.end()


class _EndOnClose:
    """A WSGI response that ends its request's span when the server closes it (PEP 3333)."""

    def __init__(self, result: Iterable[bytes], span: Span) -> None:
        self._result = result
        self._span = span

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._result)

    def close(self) -> None:
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            self._span.end()


def _event_attributes(event: Event) -> Any:
    attrs = span_attributes(event.attrs)
    attrs.update(_bound_attributes(event))
    return attrs
