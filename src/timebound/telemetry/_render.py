"""The one text rendering of events: a line per event, the same in every timeline (D10.6a).

``timebound demo`` and ``timebound workflow run`` print what happens as
``  +  123.4 ms  what happened`` lines: both read the one event stream and describe each event
with :func:`describe`, so a retry, a fallback, a node's timeout and a run's end read the same
wherever they are shown.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .._core import _clock
from .._core._durations import format_duration
from ._events import Event

__all__ = ["Timeline", "describe"]


def _policy(event: Event) -> str | None:
    attrs = event.attrs
    policy = attrs.get("policy", "?")
    name = event.name
    if name == "attempt.start":
        return f"{policy}: attempt {attrs.get('attempt')} starts"
    if name == "attempt.end":
        outcome = attrs.get("outcome")
        error = attrs.get("error")
        detail = f" ({error})" if outcome != "ok" and error else ""
        return f"{policy}: attempt {attrs.get('attempt')} -> {outcome}{detail}"
    if name == "retry.delay" and attrs.get("delay", 0) > 0:
        return f"{policy}: waiting {format_duration(attrs['delay'])} before retrying"
    if name == "fallback":
        return f"{policy}: fallback used ({attrs.get('reason')})"
    return None


def _length(event: Event) -> str:
    """The bound's length and where it was set (D2.8), each followed by ", " when known."""
    bound = event.bound
    if bound is None:
        return ""
    length = "" if bound.timeout is None else f"{format_duration(bound.timeout)}, "
    return length + ("" if bound.set_by is None else f"set by {bound.set_by}, ")


def _workflow(event: Event) -> str | None:
    attrs = event.attrs
    kind = event.name.removeprefix("workflow.")
    node = attrs.get("node_id")
    policy = f"policy {attrs.get('policy_applied')}"
    if kind == "token_timed_out":
        source = "a" if event.bound is None else event.bound.source
        return f"token {node}: timed out ({source} bound, {_length(event)}{policy})"
    if kind == "join_timed_out":
        transition = attrs.get("transition_id")
        return f"join {transition}: synchronization bound fired ({_length(event)}{policy})"
    if kind == "join_decided":
        return f"join {attrs.get('transition_id')}: proceeds with branches {attrs.get('branches')}"
    if kind.startswith("token_") and kind != "token_dispatched":
        branch = attrs.get("branch_index")
        where = f"{node}[{branch}]" if branch is not None else str(node)
        extra = f": {attrs['error']}" if attrs.get("error") else ""
        return f"token {where}: {kind.removeprefix('token_')}{extra}"
    if kind.startswith("run_"):
        error = attrs.get("error")
        return f"run: {kind.removeprefix('run_')}" + (f" ({error})" if error else "")
    return None


def _deferred(event: Event) -> str | None:
    code = event.attrs.get("code")
    status = event.name.removeprefix("deferred.")
    return f"operation {event.attrs.get('operation_id')}: {status}" + (f" ({code})" if code else "")


def _pipeline(event: Event) -> str:
    attrs = event.attrs
    node = attrs.get("node_id")
    name = event.name.removeprefix("pipeline.")
    what = "region" if name.startswith("region") else "task"
    if name.endswith("_started"):
        return f"{what} {node}: started"
    if what == "region" and event.bound is not None:
        chosen = (attrs.get("wrapper") or {}).get("chosen_branch")
        then = f" -> {chosen} branch" if chosen else ""
        # The moment the deadline fired (D10.11), then the region's end after its fallback.
        how = "deadline reached" if name == "region_timed_out" else "timed out"
        return f"region {node}: {how} (region bound, {_length(event).rstrip(', ')}){then}"
    return f"{what} {node}: {attrs.get('outcome')}"


def describe(event: Event) -> str | None:
    """One line saying what ``event`` means, or None for an event a timeline does not show
    (a metric, span tags, a token's dispatch)."""
    kind = event.kind
    if kind == "workflow":
        return _workflow(event)
    if kind == "deferred":
        return _deferred(event)
    if kind == "pipeline":
        return _pipeline(event)
    return _policy(event)


class Timeline:
    """A listener that prints each event it describes as ``  +  12.3 ms  text``, the offset on
    the monotonic clock from :meth:`restart` (or, until then, from the first line). :meth:`say`
    prints a line of the caller's own at the current instant. ``accept`` filters the events."""

    def __init__(self, out: TextIO | None = None, accept: Any = None) -> None:
        self.out = sys.stdout if out is None else out
        self.accept = accept
        self.origin: float | None = None

    def restart(self) -> None:
        """Count offsets from now on."""
        self.origin = _clock.now()

    def line(self, at: float, text: str) -> None:
        if self.origin is None:
            self.origin = at
        print(f"  +{(at - self.origin) * 1000:7.1f} ms  {text}", file=self.out)

    def say(self, text: str) -> None:
        self.line(_clock.now(), text)

    def __call__(self, event: Event) -> None:
        if self.accept is not None and not self.accept(event):
            return
        text = describe(event)
        if text is not None:
            self.line(event.at, text)
