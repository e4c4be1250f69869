"""The run's trace: a span per node nested under its wrapper, one record per wrapper (RFC 0002
§5.8), the critical path, JSON export and OpenTelemetry spans."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Trace"]

# The wrapper fields RFC §5.8 lists, in the order they are reported.
WRAPPER_FIELDS = (
    "timeout_ms",
    "nrows",
    "success_elapsed_ms",
    "timed_out",
    "chosen_branch",
    "fail_elapsed_ms",
    "override_applied",
    "override_origin",
    "w_success",
)


class Trace:
    """``spans``: one dict per node (``node_id``, ``op``, ``name``, ``parent``, ``ready_ms``,
    ``start_ms``, ``end_ms``, ``outcome``, ``deps``), times in ms from the run's start;
    ``wrappers``: by wrapper node id, one dict per ``timeout_wrapper`` with exactly RFC §5.8's
    fields;
    ``late_discarded``: results that arrived after their region's deadline and were dropped."""

    __slots__ = ("late_discarded", "plan_digest", "spans", "started_epoch_ns", "wrappers")

    def __init__(self, plan_digest: str, started_epoch_ns: int) -> None:
        self.plan_digest = plan_digest
        self.started_epoch_ns = started_epoch_ns  # wall clock, for exporters only (D1.1)
        self.spans: list[dict[str, Any]] = []
        self.wrappers: dict[str, dict[str, Any]] = {}
        self.late_discarded = 0

    def span(self, node_id: str) -> dict[str, Any]:
        for s in self.spans:
            if s["node_id"] == node_id:
                return s
        raise KeyError(node_id)

    def critical_path(self) -> list[dict[str, Any]]:
        """The spans that decided when the run ended, in order: from the last top-level span,
        step back to the dependency that ended last; a wrapper is followed by the path through
        the branch that produced its result."""
        by_id = {s["node_id"]: s for s in self.spans if s["end_ms"] is not None}
        top = [s for s in by_id.values() if s["parent"] is None]
        if not top:
            return []
        return self._path(max(top, key=_last), by_id)

    def _path(self, span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        segments: list[list[dict[str, Any]]] = []
        current: dict[str, Any] | None = span
        while current is not None:
            segment = [current]
            if current["op"] == "timeout_wrapper":
                branch = f"{current['node_id']}/{self._branch_of(current['node_id'])}/"
                inner = [
                    s
                    for s in by_id.values()
                    if s["parent"] == current["node_id"] and s["node_id"].startswith(branch)
                ]
                if inner:
                    segment += self._path(max(inner, key=_last), by_id)
            segments.append(segment)
            deps = [by_id[d] for d in current["deps"] if d in by_id]
            current = max(deps, key=_last) if deps else None
        return [s for segment in reversed(segments) for s in segment]

    def _branch_of(self, node_id: str) -> str:
        w = self.wrappers.get(node_id)
        return "fail" if w is not None and w["chosen_branch"] == "fail" else "success"

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
        for s in sorted(self.spans, key=lambda s: (s["node_id"].count("/"), s["start_ms"] or 0)):
            if s["start_ms"] is None:
                continue
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
        for node_id, otel_span in made.items():
            end = self.span(node_id)["end_ms"]
            otel_span.end(end_time=base + int((end or 0) * 1_000_000))


def _last(span: dict[str, Any]) -> tuple[float, float]:
    return (span["end_ms"], span["start_ms"] or 0)
