"""The CLI's text timelines, in one place (D10.7): a lane per unit of work drawn with one bar
painter, for a Constellation run's calls (``timebound run --trace``) and a pipeline run's regions
and tasks (``timebound pipeline run``). Events themselves print through
:class:`timebound.telemetry.Timeline` (``timebound demo``, ``timebound workflow run``), and so do
a stored run's events read back from a host (``timebound runs events --timeline``, D10.9).

Everything drawn here is the one event record every engine emits: a call's record
(:class:`timebound.dsl.CallTrace`) is built from its policy's events, a pipeline's spans are its
trace's events (D10.10), a stored run's rows are read back as the events its listeners heard.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

from .. import format_duration
from ..dsl import CallTrace
from ..telemetry import Event, Timeline, describe

__all__ = ["BAR_WIDTH", "bar", "call_json", "call_timeline", "span_timeline", "stored_line"]

BAR_WIDTH = 40

#: A segment of a lane: start and end (seconds from the lane's origin), its mark, and whether
#: the cell of its end is painted too.
Segment = tuple[float, float, str, bool]


def bar(segments: Iterable[Segment], total: float, width: int = BAR_WIDTH) -> str:
    """``|...|``: ``width`` cells over ``[0, total]``; later segments paint over earlier ones."""
    cells = [" "] * width
    if total <= 0:
        total = 1e-9

    def col(at: float) -> int:
        return min(width - 1, max(0, int(at / total * width)))

    for start, end, mark, inclusive in segments:
        for i in range(col(start), col(end) + 1 if inclusive else col(end)):
            cells[i] = mark
    return "|" + "".join(cells) + "|"


# A Constellation run's calls -------------------------------------------------------------

_MARKS = {"ok": "#", "timeout": "T", "deadline": "D", "cancelled": "-"}
_LEGEND = (
    "legend: # attempt succeeded, x attempt failed, T attempt timed out, D stopped by the "
    "run's deadline, - cancelled (another call failed), w waiting for throttle/concurrency, "
    ". waiting (delay, fallback), C cache hit"
)


def call_json(t: CallTrace) -> dict[str, Any]:
    """One call's record as JSON (``--json --trace``), times in ms since the run started."""
    return {
        "module": t.module,
        "line": t.line,
        "column": t.column,
        "start_ms": round(t.start * 1000, 3),
        "end_ms": None if math.isnan(t.end) else round(t.end * 1000, 3),
        "attempts": t.attempts,
        "timeouts": t.timeouts,
        "delays_ms": [round(d * 1000, 3) for d in t.delays],
        "fallback": t.fallback,
        "cache_hit": t.cache_hit,
        "outcome": t.outcome,
        "error": t.error,
        "lazy": t.lazy,
        "priority": t.priority,
        "node": t.node,
    }


def _call_segments(t: CallTrace) -> list[Segment]:
    """# attempt that succeeded, x failed, T timed out, D stopped by the run's deadline, -
    cancelled because another call failed, w waiting for a throttle token or concurrency slot,
    . waiting (delays, fallback); C a cache hit."""
    end = t.start if math.isnan(t.end) else t.end
    segments: list[Segment] = [(t.start, end, ".", True)]
    for a in t.attempt_log:
        a_end = end if a.end is None else a.end
        segments.append((a.start, a_end, _MARKS.get(a.outcome, "x"), True))
        if a.entered is not None and a.entered > a.start:
            # Admission (throttle, concurrency) is a wait, not the module failing or working.
            segments.append((a.start, a.entered, "w", False))
    if t.cache_hit:
        segments.append((t.start, t.start, "C", True))
    return segments


def _call_notes(t: CallTrace) -> list[str]:
    notes = []
    if t.timeouts:
        notes.append(f"{t.timeouts} timed out")
    failed = sum(1 for a in t.attempt_log if a.outcome == "error")
    if failed:
        notes.append(f"{failed} failed")
    if t.delays:
        notes.append("waited " + ", ".join(format_duration(d) for d in t.delays))
    if t.fallback:
        notes.append("fallback used")
    if t.cache_hit:
        notes.append("cache hit")
    if t.lazy:
        notes.append("lazy")
    if t.error:
        notes.append(t.error)
    return notes


def call_timeline(trace: Sequence[CallTrace], duration: float | None, out: TextIO) -> None:
    """The calls of a run, in start order: where, when, tries, outcome, a lane, then notes."""
    rows = sorted(trace, key=lambda t: (t.start, t.line, t.column))
    ends = [t.end for t in rows if not math.isnan(t.end)]
    total = duration if duration is not None else (max(ends) if ends else 0.0)
    width = max([len("call"), *(len(t.module) for t in rows)])
    print(
        f"{'call':<{width}}  {'at':>7}  {'start ms':>9}  {'end ms':>9}  {'tries':>5}  "
        f"{'outcome':<9}  timeline (0 .. {total * 1000:.0f} ms)",
        file=out,
    )
    for t in rows:
        end = "-" if math.isnan(t.end) else f"{t.end * 1000:.1f}"
        at = f"{t.line}:{t.column}"
        print(
            f"{t.module:<{width}}  {at:>7}  {t.start * 1000:>9.1f}  {end:>9}  {t.attempts:>5}  "
            f"{t.outcome:<9}  {bar(_call_segments(t), total)}",
            file=out,
        )
        notes = _call_notes(t)
        if notes:
            print(f"{'':<{width}}  {'':>7}  -> " + "; ".join(notes), file=out)
    print(_LEGEND, file=out)


# A pipeline run's regions and tasks --------------------------------------------------------

_SPAN_MARKS = {"ok": "#", "timed_out": "T", "late": "L", "error": "x", "cancelled": "-"}


def span_timeline(spans: Sequence[Mapping[str, Any]], out: TextIO) -> None:
    """A pipeline trace's spans in start order, indented under their region: when each was
    ready, started and ended, its outcome, and a lane (. ready and waiting, # ran and succeeded,
    T timed out, L finished after its region's deadline, x failed, - cancelled)."""
    if not spans:
        return
    rows = sorted(spans, key=lambda s: (s["start_ms"], s["node_id"]))
    total = max(s["end_ms"] for s in rows) / 1000.0
    parents = {s["node_id"]: s.get("parent") for s in rows}

    def depth(node_id: str) -> int:
        n, parent = 0, parents.get(node_id)
        while parent is not None and n < len(parents):
            n, parent = n + 1, parents.get(parent)
        return n

    names = {s["node_id"]: "  " * depth(s["node_id"]) + s["node_id"] for s in rows}
    width = max([len("span"), *(len(n) for n in names.values())])
    print(
        f"{'span':<{width}}  {'ready ms':>9}  {'start ms':>9}  {'end ms':>9}  {'outcome':<9}  "
        f"timeline (0 .. {total * 1000:.0f} ms)",
        file=out,
    )
    for s in rows:
        ready, start, end = s["ready_ms"] / 1000, max(0.0, s["start_ms"] / 1000), s["end_ms"] / 1000
        lane = bar(
            [
                (max(0.0, ready), start, ".", False),
                (start, end, _SPAN_MARKS.get(str(s["outcome"]), "x"), True),
            ],
            total,
        )
        print(
            f"{names[s['node_id']]:<{width}}  {s['ready_ms']:>9.3f}  {s['start_ms']:>9.3f}  "
            f"{s['end_ms']:>9.3f}  {s['outcome']!s:<9}  {lane}",
            file=out,
        )


# A stored run's events ----------------------------------------------------------------------


def stored_line(timeline: Timeline, event: Event) -> None:
    """An event read back from a store on ``timeline``, the one text line every timeline prints
    (:func:`timebound.telemetry.describe`), offset on its stored epoch instant: a read-back has
    no monotonic instant of its own."""
    text = describe(event)
    if text is not None and event.epoch_ms is not None:
        timeline.line(event.epoch_ms / 1000.0, text)
