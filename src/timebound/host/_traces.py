"""Pipeline traces for the UI's trace viewer: a file an operator uploads, checked field by field
and laid out like a run's timeline.

A trace is what :meth:`timebound.pipeline.Trace.to_json` writes, or the object
``timebound pipeline run --json`` prints (rows and trace; the trace is taken from it). The file
comes from outside, so every field is checked before anything is drawn, and a mistake is reported
with the field's place in the file (``spans[3].end_ms``). The critical path is recomputed from the
spans by the pipeline's own code, not taken from the file.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .._core._errors import InvalidInput
from .._json import JSONError, TooDeep
from .._json import loads as loads_json
from ..pipeline._trace import critical_path
from ._timeline import lay_out

__all__ = ["MAX_SPANS", "TraceError", "read_trace", "trace_view"]

# More spans than a page can show usefully; a plan this large is read with export_otel instead.
MAX_SPANS = 2_000
# Span outcomes (the executor's) and the bar colour each is drawn in; anything else is "other".
_BAR = {
    "ok": "completed",
    "error": "failed",
    "timed_out": "timed_out",
    "late": "timed_out",
    "cancelled": "cancelled",
    "skipped": "cancelled",
}
_NUMBER_OR_NULL = ("success_elapsed_ms", "fail_elapsed_ms", "reserve_ms")


class TraceError(InvalidInput):
    """The file is not a trace; the message names the field and what was wrong with it (an
    :class:`~timebound.InvalidInput`, D2.6)."""

    code = "trace-invalid"


def _show(value: Any) -> str:
    """A value for an error message, cut short: it comes from the file."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise TraceError(f"{where}: expected a number of milliseconds, got {_show(value)}")
    return float(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TraceError(f"{where}: expected a string, got {_show(value)}")
    return value


def _text_or_null(value: Any, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceError(f"{where}: expected a JSON object, got {_show(value)}")
    return value


def _span(raw: Any, where: str) -> dict[str, Any]:
    raw = _object(raw, where)
    missing = [
        k for k in ("node_id", "op", "start_ms", "end_ms", "outcome", "parent") if k not in raw
    ]
    if missing:
        raise TraceError(f"{where}: missing field(s) {missing}")
    deps = raw.get("deps", [])
    if not isinstance(deps, list):
        raise TraceError(f"{where}.deps: expected a list of node ids, got {_show(deps)}")
    span: dict[str, Any] = {
        "node_id": _text(raw["node_id"], f"{where}.node_id"),
        "op": _text(raw["op"], f"{where}.op"),
        "name": _text(raw.get("name", raw["op"]), f"{where}.name"),
        "parent": _text_or_null(raw["parent"], f"{where}.parent"),
        "deps": [_text(d, f"{where}.deps[{i}]") for i, d in enumerate(deps)],
        "start_ms": _number(raw["start_ms"], f"{where}.start_ms"),
        "end_ms": _number(raw["end_ms"], f"{where}.end_ms"),
        "outcome": _text(raw["outcome"], f"{where}.outcome"),
    }
    if span["end_ms"] < span["start_ms"]:
        raise TraceError(
            f"{where}: end_ms ({span['end_ms']}) is before start_ms ({span['start_ms']})"
        )
    return span


def _wrapper(raw: Any, where: str) -> dict[str, Any]:
    raw = _object(raw, where)
    missing = [k for k in ("timeout_ms", "timed_out", "chosen_branch") if k not in raw]
    if missing:
        raise TraceError(f"{where}: missing field(s) {missing}")
    fired = raw["timed_out"]
    if not isinstance(fired, bool):
        raise TraceError(f"{where}.timed_out: expected true or false, got {_show(fired)}")
    nrows = raw.get("nrows")
    if nrows is not None and (isinstance(nrows, bool) or not isinstance(nrows, int)):
        raise TraceError(f"{where}.nrows: expected a number of rows, got {_show(nrows)}")
    override = raw.get("override_applied")
    if override is not None and not isinstance(override, bool):
        raise TraceError(f"{where}.override_applied: expected true or false, got {_show(override)}")
    record: dict[str, Any] = {
        "timeout_ms": _number(raw["timeout_ms"], f"{where}.timeout_ms"),
        "nrows": nrows,
        "timed_out": raw["timed_out"],
        "chosen_branch": _text_or_null(raw["chosen_branch"], f"{where}.chosen_branch"),
        "override_applied": override,
        "override_origin": _text_or_null(raw.get("override_origin"), f"{where}.override_origin"),
    }
    written = raw.get("w_success")
    if written is not None and not isinstance(written, list):
        raise TraceError(f"{where}.w_success: expected a list of keys, got {_show(written)}")
    record["w_success"] = (
        None
        if written is None
        else [_text(k, f"{where}.w_success[{i}]") for i, k in enumerate(written)]
    )
    for key in _NUMBER_OR_NULL:
        value = raw.get(key)
        record[key] = None if value is None else _number(value, f"{where}.{key}")
    return record


def read_trace(data: bytes) -> dict[str, Any]:
    """The trace in ``data`` (checked), as ``{spans, wrappers, plan_digest, late_discarded}``;
    :class:`TraceError` names what was wrong."""
    try:
        doc = loads_json(data, what="the file")
    except TooDeep:
        raise TraceError("the file is not a trace: its JSON is nested too deeply") from None
    except JSONError as exc:
        raise TraceError(str(exc)) from None
    where = ""
    doc = _object(doc, "the file")
    if "spans" not in doc and "trace" in doc:  # the output of `timebound pipeline run --json`
        doc, where = _object(doc["trace"], "trace"), "trace."
    if "spans" not in doc:
        raise TraceError(
            f"{where.rstrip('.') or 'the file'}: no 'spans'; expected a pipeline trace "
            "(Trace.to_json, or the output of 'timebound pipeline run --json')"
        )
    raw_spans = doc["spans"]
    if not isinstance(raw_spans, list):
        raise TraceError(f"{where}spans: expected a list, got {_show(raw_spans)}")
    if len(raw_spans) > MAX_SPANS:
        raise TraceError(f"{where}spans: {len(raw_spans)} spans, more than the {MAX_SPANS} shown")
    spans = [_span(s, f"{where}spans[{i}]") for i, s in enumerate(raw_spans)]
    seen: set[str] = set()
    for i, s in enumerate(spans):
        if s["node_id"] in seen:
            raise TraceError(f"{where}spans[{i}].node_id: {_show(s['node_id'])} appears twice")
        seen.add(s["node_id"])
    raw_wrappers = _object(doc.get("wrappers", {}), f"{where}wrappers")
    wrappers = {
        node_id: _wrapper(w, f"{where}wrappers[{_show(node_id)}]")
        for node_id, w in raw_wrappers.items()
    }
    late = doc.get("late_discarded", 0)
    if isinstance(late, bool) or not isinstance(late, int):
        raise TraceError(f"{where}late_discarded: expected a count, got {_show(late)}")
    digest = _text_or_null(doc.get("plan_digest"), f"{where}plan_digest")
    return {"spans": spans, "wrappers": wrappers, "plan_digest": digest, "late_discarded": late}


def trace_view(trace: dict[str, Any]) -> dict[str, Any]:
    """What the trace page draws: the spans as timeline bars in start order (critical ones
    marked), the critical path, the wrappers with the span each belongs to."""
    spans = sorted(trace["spans"], key=lambda s: (s["start_ms"], s["end_ms"], s["node_id"]))
    path = critical_path(spans, trace["wrappers"])
    on_path = {s["node_id"] for s in path}
    end_ms = max((s["end_ms"] for s in spans), default=0.0)
    anchors = {s["node_id"]: f"span-{i}" for i, s in enumerate(spans, 1)}
    bars = []
    for s in spans:
        w = trace["wrappers"].get(s["node_id"])
        note = ""
        if w is not None and w["timed_out"]:
            note = f"fired: {w['chosen_branch'] or 'no'} branch"
        elif s["outcome"] != "ok":
            note = s["outcome"]
        bars.append(
            {
                "label": s["node_id"],
                "anchor": anchors[s["node_id"]],
                "css": _BAR.get(s["outcome"], "other"),
                "critical": s["node_id"] in on_path,
                "note": note,
                "title": f"{s['node_id']} ({s['op']}): {s['outcome']}, "
                f"{s['start_ms']:.3f} to {s['end_ms']:.3f} ms",
                "start_ms": s["start_ms"],
                "end_ms": s["end_ms"],
            }
        )
    wrappers = [
        {"node_id": node_id, "anchor": anchors.get(node_id), **w}
        for node_id, w in trace["wrappers"].items()
    ]
    return {
        "bars": lay_out(bars, 0.0, end_ms, min_width=0.3),
        "span_ms": end_ms,
        "critical_path": [
            {
                "node_id": s["node_id"],
                "anchor": anchors[s["node_id"]],
                "ms": s["end_ms"] - s["start_ms"],
            }
            for s in path
        ],
        "wrappers": wrappers,
        "fired": sum(w["timed_out"] for w in trace["wrappers"].values()),
        "plan_digest": trace["plan_digest"],
        "late_discarded": trace["late_discarded"],
        "count": len(spans),
    }
