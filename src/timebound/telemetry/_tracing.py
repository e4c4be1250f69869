"""Where the engines start timebound's own spans: a hook that costs one ``None`` check when off.

The engines never import OpenTelemetry. At the few places where a unit of work starts and the
engine's code runs *inside* it (an HTTP request, a workflow run being started, a node attempt, a
deferred operation's poll) they call these functions; with no span exporter installed each is a
single check of :data:`_tracer`. :class:`~timebound.telemetry.otel.OpenTelemetryExporter` with a
``tracer_provider`` installs an implementation on :meth:`install` (D10.4). The spans that can be
built from events alone (a policy call and its attempts, a run's end, a deferred operation's
statuses) are built by the exporter's listener, not here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

__all__ = [
    "CallSpan",
    "Tracer",
    "active",
    "attempt_span",
    "call_span",
    "caller_traceparent",
    "client_span",
    "open_run",
    "poll_span",
    "run_span",
    "server_span",
    "wsgi_span",
]


class CallSpan(Protocol):
    """The client span of one outgoing call that is not HTTP (a gRPC call, a database query):
    started by :func:`call_span`, ended once by whoever sees the call end (D10.8)."""

    def set(self, key: str, value: Any) -> None:
        """Add an attribute (the budget propagated, the answer's status)."""

    def carrier(self) -> dict[str, str]:
        """This span's W3C trace context (``traceparent``), to send with the call."""

    def end(self, error_type: str | None = None) -> None:
        """End the span (once; later calls do nothing); ``error_type`` marks it failed."""


class Tracer(Protocol):
    """What an exporter implements to make spans at the engines' hook points."""

    def call(self, name: str, attributes: Mapping[str, Any]) -> CallSpan: ...

    def current_traceparent(self) -> str | None: ...

    def open_run(
        self, run_id: str, parent: str | None, attributes: Mapping[str, Any]
    ) -> str | None: ...

    def attempt(
        self, parent: str | None, attributes: Mapping[str, Any]
    ) -> contextlib.AbstractContextManager[Callable[[str, str | None], None]]: ...

    def poll(self, op_id: str, parent: str | None) -> contextlib.AbstractContextManager[None]: ...

    def server(
        self, scope: Mapping[str, Any]
    ) -> contextlib.AbstractContextManager[Callable[[Any], Any]]: ...

    def run(
        self, name: str, attributes: Mapping[str, Any]
    ) -> contextlib.AbstractContextManager[Callable[[Any], None]]: ...

    def client(
        self, method: str, url: str, headers: Any
    ) -> contextlib.AbstractContextManager[Callable[[int | None, str | None], None]]: ...

    def wsgi(
        self,
        environ: Mapping[str, Any],
        start_response: Any,
        serve: Callable[[Any], Iterable[bytes]],
    ) -> Iterable[bytes]: ...


#: The installed span maker, or None (the default: nothing is traced unless asked, D10.4).
_tracer: Tracer | None = None


def install(tracer: Tracer | None) -> Tracer | None:
    """Install ``tracer`` (None: none); returns the one it replaces."""
    global _tracer
    previous, _tracer = _tracer, tracer
    return previous


def active() -> bool:
    """Whether spans are being made (an engine may then record what it otherwise skips)."""
    return _tracer is not None


def caller_traceparent() -> str | None:
    """The W3C ``traceparent`` of the caller's current span, or None (no tracer, no span)."""
    tracer = _tracer
    return None if tracer is None else tracer.current_traceparent()


def open_run(run_id: str, parent: str | None, **attributes: Any) -> str | None:
    """Open the span of a workflow run being started (ended when its end is committed);
    its ``traceparent``, which the run's row stores so any worker continues the trace (D10.5)."""
    tracer = _tracer
    return None if tracer is None else tracer.open_run(run_id, parent, attributes)


def _ignore(_outcome: str, _error: str | None) -> None:
    return None


def _same(send: Any) -> Any:
    return send


# With no tracer the hooks hand out these reusable do-nothing context managers: no allocation.
_NO_ATTEMPT: contextlib.AbstractContextManager[Callable[[str, str | None], None]] = (
    contextlib.nullcontext(_ignore)
)
_NO_CLIENT: contextlib.AbstractContextManager[Callable[[int | None, str | None], None]] = (
    contextlib.nullcontext(_ignore)  # type: ignore[arg-type]
)
_NO_POLL: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
_NO_SERVER: contextlib.AbstractContextManager[Callable[[Any], Any]] = contextlib.nullcontext(_same)


def _no_export(_trace: Any) -> None:
    return None


_NO_RUN: contextlib.AbstractContextManager[Callable[[Any], None]] = contextlib.nullcontext(
    _no_export
)


def attempt_span(
    parent: str | None, **attributes: Any
) -> contextlib.AbstractContextManager[Callable[[str, str | None], None]]:
    """The current span while a workflow node's attempt runs, child of its run's span
    (``parent``, the stored ``traceparent``); yields ``ended(outcome, error)`` to record how."""
    tracer = _tracer
    return _NO_ATTEMPT if tracer is None else tracer.attempt(parent, attributes)


def poll_span(op_id: str, parent: str | None) -> contextlib.AbstractContextManager[None]:
    """The current span while a deferred operation is polled: child of the operation's span
    when this process holds it, else of ``parent`` (the stored context of its registration)."""
    tracer = _tracer
    return _NO_POLL if tracer is None else tracer.poll(op_id, parent)


def server_span(
    scope: Mapping[str, Any],
) -> contextlib.AbstractContextManager[Callable[[Any], Any]]:
    """The server span of an incoming ASGI request (continuing the caller's W3C trace context);
    yields a function that wraps the ASGI ``send`` to record the response status."""
    tracer = _tracer
    return _NO_SERVER if tracer is None else tracer.server(scope)


def run_span(
    name: str, **attributes: Any
) -> contextlib.AbstractContextManager[Callable[[Any], None]]:
    """The current span around an in-memory engine's run (a Constellation program, a pipeline
    plan); an exception leaving it marks it failed. Yields ``export(trace)``, which adds the
    spans of a pipeline ``Trace`` (its regions and tasks) as its children."""
    tracer = _tracer
    return _NO_RUN if tracer is None else tracer.run(name, attributes)


def client_span(
    method: str, url: str, headers: Any
) -> contextlib.AbstractContextManager[Callable[[int | None, str | None], None]]:
    """The client span of an outgoing HTTP request; injects its W3C ``traceparent`` into
    ``headers`` (a mutable mapping) so the server continues the trace. Yields
    ``answered(status, propagated_timeout_ms)`` to record the answer and the budget sent."""
    tracer = _tracer
    return _NO_CLIENT if tracer is None else tracer.client(method, url, headers)


def call_span(name: str, **attributes: Any) -> CallSpan | None:
    """Start the client span of an outgoing gRPC call or database query, a child of the current
    span, with the caller's budget (``timebound.deadline.remaining_ms``); ``None`` when nothing
    is traced. It is not made current: a gRPC call may end after the code that started it
    returned (a future, a stream), so the adapter ends it where it sees the call end."""
    tracer = _tracer
    return None if tracer is None else tracer.call(name, attributes)


def wsgi_span(
    environ: Mapping[str, Any], start_response: Any, serve: Callable[[Any], Iterable[bytes]]
) -> Iterable[bytes]:
    """``serve(start_response)`` inside the server span of a WSGI request (continuing the
    caller's W3C trace context); the span ends when the server closes the response."""
    tracer = _tracer
    return serve(start_response) if tracer is None else tracer.wsgi(environ, start_response, serve)
