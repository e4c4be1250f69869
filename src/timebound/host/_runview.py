"""What the run page shows besides the stored rows (D8.21, D8.22): durations and instants as a
person reads them, each token's stretches as bars on one lane, what a running run waits for
next, and which actions apply to the run as it is."""

from __future__ import annotations

from typing import Any

from .._core._clock import datetime_of_ms
from .._core._durations import format_duration
from ._timeline import lay_out

__all__ = ["human_ms", "iso", "lanes_of", "pending", "actions_for"]

_LIVE = ("pending", "dispatched", "executing")


def human_ms(ms: float | None) -> str:
    """A stored duration in ms as the page shows it: the one duration text of
    :func:`~timebound._core._durations.format_duration` (``850ms``, ``4.2s``, ``3min 4s``);
    nothing for ``None``."""
    if ms is None:
        return ""
    return format_duration(max(ms, 0) / 1000)


def iso(ms: int | None) -> str:
    """An epoch-ms instant in ISO 8601 UTC, to the millisecond (the page's script shows it in
    the reader's time zone, with how long ago)."""
    if ms is None:
        return ""
    return datetime_of_ms(ms).isoformat(timespec="milliseconds")


def lanes_of(stretches: list[dict[str, Any]], start_ms: int, end_ms: int) -> list[dict[str, Any]]:
    """One lane per token, its stretches as separate bars: attempts in their outcome's colour,
    retry delays and fan-in waits hatched (not work), each with its duration beside it."""
    placed = lay_out(stretches, start_ms, end_ms)
    lanes: dict[str, dict[str, Any]] = {}
    for s in placed:
        lane = lanes.get(s["token_id"])
        if lane is None:
            branch = f"[{s['branch_index']}]" if s["branch_index"] is not None else ""
            lane = lanes[s["token_id"]] = {
                "label": f"{s['node_id']}{branch}",
                "anchor": f"token-{s['token_id']}",
                "segments": [],
            }
        if s["kind"] == "attempt":
            state = s.get("outcome") or s.get("ended") or "executing"
            what = f"attempt {s.get('attempt')}: {state}"
        else:
            state = s["kind"]
            what = {"queued": "queued", "delay": "retry delay", "waiting": "waiting at fan-in"}[
                s["kind"]
            ]
        bound = s.get("bound")
        note = human_ms(s["duration_ms"])
        if bound:
            note += f" · {bound.get('timeout_type')} bound"
        title = (
            f"{lane['label']} {what}, {human_ms(s['duration_ms'])} "
            f"(epoch ms {s['start_ms']} to {s['end_ms'] if s['end_ms'] is not None else 'now'})"
        )
        if s.get("error"):
            title += f": {s['error']}"
        lane["segments"].append(
            {**s, "css": f"{s['kind']} {state}", "title": title, "note": note, "what": what}
        )
    return list(lanes.values())


def pending(
    run: dict[str, Any],
    tokens: list[dict[str, Any]],
    stretches: list[dict[str, Any]],
    timer: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """What a running run waits for: its deadline, each live token's deadline, the retry delays
    under way, and what comes next: the run's next stored durable ``timer`` (run, node or join
    deadline) or a retry delay's end, whichever is first (``None`` once the run has ended)."""
    if run["status"] != "running":
        return None
    live = [
        {
            "node_id": t["node_id"],
            "branch_index": t["branch_index"],
            "token_id": t["id"],
            "status": t["status"],
            "deadline_ms": t["timeout_at"],
        }
        for t in tokens
        if t["status"] in _LIVE
    ]
    delays = [
        {"node_id": s["node_id"], "branch_index": s["branch_index"], "until_ms": s["until_ms"]}
        for s in stretches
        if s["kind"] == "delay" and s["end_ms"] is None and s.get("until_ms")
    ]
    nodes = {t["token_id"]: t["node_id"] for t in live}
    timers = [(f"node {d['node_id']} retry", d["until_ms"]) for d in delays]
    if timer is not None:
        kind, key = timer["kind"], timer["key"]
        if kind == "token":
            what = f"node {nodes.get(key.split(':', 1)[-1], '?')} deadline"
        elif kind == "join":
            what = "join deadline"
        else:
            what = "run deadline"
        timers.append((what, timer["due_ms"]))
    due = [t for t in timers if t[1] is not None]
    following = min(due, key=lambda t: t[1]) if due else None
    return {
        "deadline_ms": run["timeout_at"],
        "live": live,
        "delays": delays,
        "next": None if following is None else {"what": following[0], "at_ms": following[1]},
    }


def actions_for(run: dict[str, Any], tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """Which of the operator's actions apply to the run now, and the nodes they may name."""
    running = run["status"] == "running"
    child = run.get("parent_token_id") is not None
    nodes_live = sorted(
        {t["node_id"] for t in tokens if t["status"] in _LIVE and t["timeout_at"] is not None}
    )
    reached = sorted({t["node_id"] for t in tokens if t["branch_index"] is None})
    return {
        "cancel": running,
        "terminate": running,
        "extend": running and not child,
        "extend_nodes": nodes_live,
        "retry": run["status"] in ("failed", "timed_out") and not child,
        "retry_nodes": reached,
    }
