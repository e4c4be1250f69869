"""The run's trace: a span per node nested under its wrapper, one record per wrapper (its fields
listed in docs/pipeline.md), the critical path, JSON export and OpenTelemetry spans.

The trace is a view over telemetry events (D10.10): :meth:`Trace.events` turns what the executor
recorded into one :class:`timebound.telemetry.Event` per task and region that ran, the record every
engine emits, and :attr:`Trace.spans` reads its spans from those events. The listeners hear the
same events as they happen (D10.11): the executor hands each task's and region's start and end to
the sink :meth:`Trace.recording` gives it, which builds them with the same function, and a region
announces its timeout before its fallback runs (:meth:`Trace.timed_out`). A listener, the trace
viewer and the CLI's timeline see one account of the run.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from .._core import _clock
from .._core._errors import DeadlineExceeded
from .._engine import Event as Lifecycle
from .._engine import Span
from ..telemetry import Event, current_correlation
from ..telemetry._events import emit_event, enabled

__all__ = ["SPAN_FIELDS", "Trace", "critical_path"]

# A wrapper record's fields, in the order they are reported.
WRAPPER_FIELDS = (
    "timeout_ms",
    "nrows",
    "success_elapsed_ms",
    "timed_out",
    "chosen_branch",
    "fail_elapsed_ms",
    "override_applied",
    "override_origin",
    "reserve_ms",
    "w_success",
)

#: A span's fields, as :attr:`Trace.spans` and the JSON export carry them; a ``pipeline.*``
#: event's attributes hold them all.
SPAN_FIELDS = (
    "node_id",
    "op",
    "name",
    "parent",
    "deps",
    "ready_ms",
    "start_ms",
    "end_ms",
    "outcome",
)


class Trace:
    """``spans``: one dict per node (``node_id``, ``op``, ``name``, ``parent``, ``ready_ms``,
    ``start_ms``, ``end_ms``, ``outcome``, ``deps``), times in ms from the run's start;
    ``wrappers``: by wrapper node id, one dict per ``timeout_wrapper`` with exactly these
    fields;
    ``late_discarded``: results that arrived after their region's deadline and were dropped."""

    __slots__ = (
        "_correlation",
        "_meta",
        "_recorded",
        "base",
        "plan_digest",
        "started_epoch_ns",
        "wrappers",
    )

    def __init__(
        self, plan_digest: str, started_epoch_ns: int, meta: Mapping[str, Mapping[str, Any]]
    ) -> None:
        self.plan_digest = plan_digest
        self.started_epoch_ns = started_epoch_ns  # wall clock, for exporters only (D1.1)
        self.base = 0.0  # the run's start on timebound's monotonic clock
        self.wrappers: dict[str, dict[str, Any]] = {}
        self._meta = meta
        # The executor's spans, one list per plan it ran (the main plan, each fail branch):
        # turned into dicts only when someone reads them, not on the run's path.
        self._recorded: list[list[Span]] = []
        # The units of work the run belongs to (a request, a Constellation run), for its events;
        # a plain dict, so a trace pickles (a PlanTimeout carries it out of a worker process).
        self._correlation = dict(current_correlation())

    def recording(self) -> tuple[list[Span], Callable[[Lifecycle], None] | None]:
        """A list for the executor to record one plan's spans in, and the sink that hands each
        task's and region's start and end to the telemetry listeners as they happen, or
        ``None`` when nobody listens as the plan starts: the run's path then pays nothing more
        (engine use, D10.11)."""
        spans: list[Span] = []
        self._recorded.append(spans)
        return spans, (self._live(spans) if enabled() else None)

    def _live(self, spans: list[Span]) -> Callable[[Lifecycle], None]:
        by_key: dict[Hashable, Span] = {}

        def sink(change: Lifecycle) -> None:
            if change.kind == "ready":
                return  # a node's readiness is not an event of its own: its start carries it
            if not by_key:  # the executor has filled the list by its first change
                by_key.update((s.key, s) for s in spans)
            emit_event(self._event(by_key[change.key], ended=change.kind == "end"))

        return sink

    def events(self) -> list[Event]:
        """The run as telemetry events (D10.10): one per task or region that ran, in the order
        they were recorded, named ``pipeline.task`` or ``pipeline.region`` (a ``timeout_wrapper``).

        Each is placed at the span's end (``at`` on the monotonic clock, ``epoch_ms`` on the
        wall clock the run started at); its attributes are the span's fields (``node_id``, ``op``,
        ``name``, ``parent``, ``deps``, ``ready_ms``, ``start_ms``, ``end_ms``, ``outcome``) and
        the ``plan_digest``, a region's also its wrapper record (``wrapper``); its correlation is
        the run's (the request or program run it served) with ``task``: the node id. A region
        whose deadline fired carries that bound (source ``region``, its length, set by the
        region). The listeners heard these same events as each span ended (D10.11)."""
        return [
            self._event(span, ended=True)
            for recorded in self._recorded
            for span in recorded
            if span.outcome != "pending"  # never ran
        ]

    def _event(self, span: Span, *, ended: bool) -> Event:
        """The event of ``span``'s end (``pipeline.task``, ``pipeline.region``), or of its start
        (``pipeline.task_started``, ``pipeline.region_started``: the fields known by then)."""
        base = self.base
        node_id = str(span.key)
        m = self._meta[node_id]
        region = m["op"] == "timeout_wrapper"
        attrs: dict[str, Any] = {
            "node_id": node_id,
            "op": m["op"],
            "name": m["name"],
            "parent": m["parent"],
            "deps": m["deps"],
            "ready_ms": (span.ready - base) * 1000.0,
            "start_ms": (span.start - base) * 1000.0,
        }
        name = "pipeline.region" if region else "pipeline.task"
        if not ended:
            attrs["plan_digest"] = self.plan_digest
            return self._at(f"{name}_started", span.start, attrs, node_id, None)
        attrs["end_ms"] = (span.end - base) * 1000.0
        attrs["outcome"] = span.outcome
        attrs["plan_digest"] = self.plan_digest
        bound = None
        record = self.wrappers.get(node_id) if region else None
        if record is not None:
            attrs["wrapper"] = dict(record)
            bound = _region_bound(node_id, record)
        return self._at(name, span.end, attrs, node_id, bound)

    def timed_out(self, node_id: str) -> None:
        """Tell the listeners now that region ``node_id``'s deadline fired
        (``pipeline.region_timed_out``, with its wrapper record so far and its bound), before
        its fallback runs (engine use, D10.11)."""
        if not enabled():
            return
        m = self._meta[node_id]
        record = self.wrappers[node_id]
        attrs = {
            "node_id": node_id,
            "op": m["op"],
            "name": m["name"],
            "parent": m["parent"],
            "deps": m["deps"],
            "plan_digest": self.plan_digest,
            "wrapper": dict(record),
        }
        bound = _region_bound(node_id, record)
        emit_event(self._at("pipeline.region_timed_out", _clock.now(), attrs, node_id, bound))

    def _at(
        self,
        name: str,
        at: float,
        attrs: dict[str, Any],
        node_id: str,
        bound: DeadlineExceeded | None,
    ) -> Event:
        # The epoch instant: the run's start on the wall clock plus the monotonic offset, in
        # whole ms (so the trace's exporters and the listeners agree on one wall clock, D1.1).
        epoch_ms = self.started_epoch_ns // 1_000_000 + math.floor((at - self.base) * 1000.0)
        return Event(name, at, attrs, {**self._correlation, "task": node_id}, epoch_ms, bound)

    @property
    def spans(self) -> list[dict[str, Any]]:
        """One dict per task and region that ran (:data:`SPAN_FIELDS`), read from
        :meth:`events`."""
        return [{k: e.attrs[k] for k in SPAN_FIELDS} for e in self.events()]

    @property
    def late_discarded(self) -> int:
        """Results that arrived after their region's deadline and were dropped."""
        return sum(s.outcome == "late" for r in self._recorded for s in r)

    def span(self, node_id: str) -> dict[str, Any]:
        """The span of ``node_id``."""
        for s in self.spans:
            if s["node_id"] == node_id:
                return s
        raise KeyError(node_id)

    def critical_path(self) -> list[dict[str, Any]]:
        """The spans that decided when the run ended, in order (see :func:`critical_path`)."""
        return critical_path(self.spans, self.wrappers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_digest": self.plan_digest,
            "spans": self.spans,
            "wrappers": self.wrappers,
            "late_discarded": self.late_discarded,
            "critical_path": [s["node_id"] for s in self.critical_path()],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode("utf-8")

    def export_otel(self, tracer: Any) -> None:
        """Emit the spans through an OpenTelemetry ``tracer``: wrappers as parents of their
        branch nodes, wrapper fields as ``timebound.wrapper.*`` attributes."""
        from opentelemetry import trace as otel_trace

        base = self.started_epoch_ns
        wrappers = self.wrappers
        made: dict[str, Any] = {}
        spans = self.spans
        for s in sorted(spans, key=lambda s: (s["node_id"].count("/"), s["start_ms"])):
            parent = made.get(s["parent"]) if s["parent"] else None
            context = otel_trace.set_span_in_context(parent) if parent is not None else None
            attributes: dict[str, Any] = {
                "timebound.node_id": s["node_id"],
                "timebound.op": s["op"],
                "timebound.outcome": s["outcome"],
            }
            for k, v in wrappers.get(s["node_id"], {}).items():
                if v is not None:
                    attributes[f"timebound.wrapper.{k}"] = v
            otel_span = tracer.start_span(
                s["name"],
                context=context,
                start_time=base + int(s["start_ms"] * 1_000_000),
                attributes=attributes,
            )
            made[s["node_id"]] = otel_span
        ends = {s["node_id"]: s["end_ms"] for s in spans}
        for node_id, otel_span in made.items():
            otel_span.end(end_time=base + int(ends[node_id] * 1_000_000))


def _region_bound(node_id: str, record: Mapping[str, Any]) -> DeadlineExceeded | None:
    """The bound of a region whose deadline fired (source ``region``, its length, set by the
    region), else ``None``."""
    if not record.get("timed_out"):
        return None
    return DeadlineExceeded(
        f"timeout_wrapper {node_id} timed out after {record['timeout_ms']:g} ms",
        source="region",
        timeout=record["timeout_ms"] / 1000.0,
        set_by=f"region {node_id}",
    )


def critical_path(
    spans: list[dict[str, Any]], wrappers: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The spans that decided when a run ended, in order: from the last top-level span, step
    back to the dependency that ended last; a wrapper is followed by the path through the branch
    that produced its result (``fail`` when its record says so, else ``success``).

    Works on a trace's exported dicts too (the host's trace viewer reads them from a file), so a
    span already on the path is never visited twice: a hand-made file whose ``deps`` loop still
    gets an answer."""
    by_id = {s["node_id"]: s for s in spans}
    top = [s for s in by_id.values() if s["parent"] is None]
    if not top:
        return []
    return _path(max(top, key=_last), by_id, wrappers, set())


def _path(
    span: dict[str, Any],
    by_id: dict[str, dict[str, Any]],
    wrappers: Mapping[str, Mapping[str, Any]],
    seen: set[str],
) -> list[dict[str, Any]]:
    segments: list[list[dict[str, Any]]] = []
    current: dict[str, Any] | None = span
    while current is not None and current["node_id"] not in seen:
        seen.add(current["node_id"])
        segment = [current]
        if current["op"] == "timeout_wrapper":
            w = wrappers.get(current["node_id"])
            chosen = "fail" if w is not None and w.get("chosen_branch") == "fail" else "success"
            branch = f"{current['node_id']}/{chosen}/"
            inner = [
                s
                for s in by_id.values()
                if s["parent"] == current["node_id"] and s["node_id"].startswith(branch)
            ]
            if inner:
                segment += _path(max(inner, key=_last), by_id, wrappers, seen)
        segments.append(segment)
        deps = [by_id[d] for d in current["deps"] if d in by_id]
        current = max(deps, key=_last) if deps else None
    return [s for segment in reversed(segments) for s in segment]


def _last(span: dict[str, Any]) -> tuple[float, float]:
    return (span["end_ms"], span["start_ms"])
