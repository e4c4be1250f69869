"""The CLI's one text-timeline module (D10.7): the Constellation call timeline prints exactly
what it printed before it moved (the golden text below was produced by the renderer in
cli/_dsl.py before the move, on these records), and a pipeline run gains a lane per span."""

from __future__ import annotations

import io
import math

import pytest

from timebound import pipeline as pl
from timebound.cli._render import bar, call_timeline, span_timeline
from timebound.dsl import AttemptTrace, CallTrace
from timebound.testing import VirtualClock

from ..pipeline import sample


def _calls() -> list[CallTrace]:
    a = CallTrace(
        "Quote",
        6,
        5,
        0.0,
        0.35,
        attempts=3,
        timeouts=1,
        delays=[0.1, 0.2],
        outcome="ok",
        attempt_log=[
            AttemptTrace(0.0, 0.05, "error"),
            AttemptTrace(0.15, 0.2, "timeout"),
            AttemptTrace(0.30, 0.35, "ok", entered=0.32),
        ],
    )
    b = CallTrace("Recommendations", 7, 5, 0.01, 0.02, attempts=1, cache_hit=True, outcome="cache")
    c = CallTrace(
        "Stock",
        8,
        9,
        0.05,
        math.nan,
        attempts=1,
        outcome="running",
        lazy=True,
        attempt_log=[AttemptTrace(0.05)],
    )
    d = CallTrace(
        "Price",
        9,
        3,
        0.1,
        0.4,
        attempts=1,
        fallback=True,
        outcome="fallback",
        error="ValueError: down",
        attempt_log=[AttemptTrace(0.1, 0.4, "deadline")],
    )
    return [d, a, c, b]


# The text printed before the move, line by line.
GOLDEN = {
    None: [
        (
            "call                  at   start ms     end ms  tries  outcome    timeline (0 .."
            " 400 ms)"
        ),
        (
            "Quote                6:5        0.0      350.0      3  ok         |xxxxxx......."
            ".TTTTTTT........ww####     |"
        ),
        "                          -> 1 timed out; 1 failed; waited 100ms, 200ms",
        (
            "Recommendations      7:5       10.0       20.0      1  cache      |C.           "
            "                           |"
        ),
        "                          -> cache hit",
        (
            "Stock                8:9       50.0          -      1  running    |     x       "
            "                           |"
        ),
        "                          -> lazy",
        (
            "Price                9:3      100.0      400.0      1  fallback   |          DDD"
            "DDDDDDDDDDDDDDDDDDDDDDDDDDD|"
        ),
        "                          -> fallback used; ValueError: down",
        (
            "legend: # attempt succeeded, x attempt failed, T attempt timed out, D stopped by"
            " the run's deadline, - cancelled (another call failed), w waiting for throttle/c"
            "oncurrency, . waiting (delay, fallback), C cache hit"
        ),
    ],
    0.5: [
        (
            "call                  at   start ms     end ms  tries  outcome    timeline (0 .."
            " 500 ms)"
        ),
        (
            "Quote                6:5        0.0      350.0      3  ok         |xxxxx.......T"
            "TTTT.......w####           |"
        ),
        "                          -> 1 timed out; 1 failed; waited 100ms, 200ms",
        (
            "Recommendations      7:5       10.0       20.0      1  cache      |C.           "
            "                           |"
        ),
        "                          -> cache hit",
        (
            "Stock                8:9       50.0          -      1  running    |    x        "
            "                           |"
        ),
        "                          -> lazy",
        (
            "Price                9:3      100.0      400.0      1  fallback   |        DDDDD"
            "DDDDDDDDDDDDDDDDDDDD       |"
        ),
        "                          -> fallback used; ValueError: down",
        (
            "legend: # attempt succeeded, x attempt failed, T attempt timed out, D stopped by"
            " the run's deadline, - cancelled (another call failed), w waiting for throttle/c"
            "oncurrency, . waiting (delay, fallback), C cache hit"
        ),
    ],
}


@pytest.mark.parametrize("duration", [None, 0.5])
def test_the_call_timeline_is_unchanged_by_the_move(duration: float | None) -> None:
    out = io.StringIO()
    call_timeline(_calls(), duration, out)
    assert out.getvalue() == "\n".join(GOLDEN[duration]) + "\n"


def test_a_bar_paints_later_segments_over_earlier_ones() -> None:
    assert bar([(0.0, 1.0, ".", True), (0.25, 0.5, "#", True)], 1.0, width=8) == "|..###...|"
    assert bar([(0.0, 0.5, "w", False)], 1.0, width=4) == "|ww  |"
    assert bar([], 0.0, width=3) == "|   |"


def test_a_pipeline_run_draws_a_lane_per_span_under_its_region() -> None:
    """Each region and task in start order, a region's tasks indented under it, the timed-out
    ones marked T at the instant the region's budget ran out (virtual time: exact)."""
    reg = sample.make_registry(call_models=1.0)
    artifact = pl.compile(sample.make_plan(reg))
    result = VirtualClock().run(pl.Engine(reg).run(artifact, sample.rows(4)))
    out = io.StringIO()
    span_timeline(result.trace.spans, out)
    lines = out.getvalue().splitlines()
    assert lines[0].split()[:2] == ["span", "ready"] and lines[0].endswith("(0 .. 1002 ms)")
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["task:call_models"].endswith("|" + "#" * 40 + "|")
    assert "timed_out" in rows["timeout_wrapper"] and rows["timeout_wrapper"].endswith("T|")
    inner = next(line for line in lines if "success/task:call_models" in line)
    assert inner.startswith("  timeout_wrapper/") and "timed_out" in inner
    assert len(lines) == 1 + len(result.trace.spans)
