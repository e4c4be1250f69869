"""Where the budget went (D13): the breakdown a firing bound carries, on virtual time."""

from __future__ import annotations

import asyncio
import json
import pickle
from typing import Any

import pytest

import timebound as tb
from timebound import Breakdown
from timebound._core import _clock, _scopes
from timebound._core._breakdown import BREAKDOWN_MAX_NODES, MARKS_MAX
from timebound.policies import Policy
from timebound.testing import VirtualClock


def adds_up(bd: Breakdown, tol: float = 1e-6) -> None:
    """Every part with parts is exactly covered by them (D13.2); no part is negative."""
    for _, p in bd.walk():
        assert p.elapsed_ms >= 0
        if p.parts and "parallel" not in (p.outcome or ""):
            total = sum(c.elapsed_ms for c in p.parts)
            assert abs(total - p.elapsed_ms) <= tol, (p, [c.elapsed_ms for c in p.parts])


def kinds(bd: Breakdown) -> list[str]:
    return [p.kind for p in bd.parts]


async def test_attempts_and_backoffs_of_a_policy_under_a_scope(virtual_clock: VirtualClock) -> None:
    """Each attempt (with its outcome and budget) and each delay is a part; the parts add up
    to the 500 ms between the scope's entry and its firing."""
    calls = 0

    async def slow() -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(10)
        return "never"

    policy = Policy("fetch", timeout="100ms", retry=5, delay="50ms")
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(0.5):
            await _clock_sleep(0.02)
            await policy.execute(slow)
    bd = info.value.breakdown
    assert bd is not None
    assert bd.kind == "bound" and bd.elapsed_ms == pytest.approx(500)
    assert bd.budget_ms == pytest.approx(500)
    adds_up(bd)
    assert kinds(bd) == [
        "attempt",
        "backoff",
        "attempt",
        "backoff",
        "attempt",
        "backoff",
        "attempt",
        "self",
    ]
    attempts = [p for p in bd.parts if p.kind == "attempt"]
    assert [p.outcome for p in attempts] == ["timeout", "timeout", "timeout", "cancelled"]
    assert attempts[0].budget_ms == pytest.approx(100)
    assert attempts[0].elapsed_ms == pytest.approx(100)
    assert attempts[-1].elapsed_ms == pytest.approx(30)  # cut by the scope at 500 ms
    assert bd.parts[-1].elapsed_ms == pytest.approx(20)  # the scope's own code: the first sleep
    assert calls == 4


async def _clock_sleep(s: float) -> None:
    await asyncio.sleep(s)


def test_sync_checkpoint_shows_the_frames_still_open(virtual_clock: VirtualClock) -> None:
    """A sync bound reported from inside nested scopes shows them as parts cut at its deadline;
    the 100 ms the body overran it are the bound's lateness (D13.9)."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            virtual_clock.advance(0.25)
            with tb.fail_after(5, what="inner"):
                t0 = _clock.now()
                virtual_clock.advance(0.25)
                _scopes.record("call", "GET /b", t0, _clock.now(), 0.75, "ok")
                virtual_clock.advance(0.6)
                tb.checkpoint()
    bd = info.value.breakdown
    assert bd is not None
    assert bd.elapsed_ms == pytest.approx(1100)
    adds_up(bd)
    assert kinds(bd) == ["scope", "self", "late"]
    assert bd.parts[2].elapsed_ms == pytest.approx(100)
    inner = bd.parts[0]
    assert inner.name == "inner" and inner.outcome == "cut"
    assert inner.elapsed_ms == pytest.approx(750)
    assert [p.kind for p in inner.parts] == ["call", "self"]
    assert inner.parts[0].budget_ms == pytest.approx(750)


def test_a_finished_nested_scope_is_one_part(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            with tb.move_on_after(0.3, what="lookup"):
                t0 = _clock.now()
                virtual_clock.advance(0.5)
                _scopes.record("call", "db", t0, _clock.now())
            virtual_clock.advance(0.7)
    bd = info.value.breakdown
    assert bd is not None
    adds_up(bd)
    assert kinds(bd) == ["scope", "self", "late"]
    assert bd.parts[0].outcome == "timeout" and bd.parts[0].elapsed_ms == pytest.approx(500)
    assert bd.parts[2].elapsed_ms == pytest.approx(200)


def test_a_total_budget_error_covers_the_whole_call(virtual_clock: VirtualClock) -> None:
    """The total budget is no frame of its own: the call keeps its parts for that error."""

    def failing() -> str:
        virtual_clock.advance(0.2)
        raise ConnectionError("down")

    policy = Policy("fetch", retry=10, delay="100ms", total_timeout="1s")
    with pytest.raises(tb.DeadlineExceeded) as info:
        policy.execute_sync(failing)
    err = info.value
    assert err.source == "total"
    bd = err.breakdown
    assert bd is not None
    adds_up(bd)
    assert bd.name == "total fetch"
    assert {p.kind for p in bd.parts} == {"attempt", "backoff", "self"}
    assert next(p.outcome for p in bd.parts if p.kind == "attempt") == "ConnectionError"


def test_fallback_is_a_part(virtual_clock: VirtualClock) -> None:
    def failing() -> str:
        raise ConnectionError("down")

    def fallback() -> str:
        virtual_clock.advance(0.4)
        return "cached"

    policy = Policy("fetch", fallback=fallback)
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            assert policy.execute_sync(failing) == "cached"
            virtual_clock.advance(0.7)
    bd = info.value.breakdown
    assert bd is not None
    adds_up(bd)
    assert kinds(bd) == ["attempt", "fallback", "self", "late"]
    assert bd.parts[1].elapsed_ms == pytest.approx(400)
    assert bd.parts[3].elapsed_ms == pytest.approx(100)


def test_bounded_in_size(virtual_clock: VirtualClock) -> None:
    """Thousands of parts: the frame keeps MARKS_MAX marks, the tree BREAKDOWN_MAX_NODES nodes,
    and it still adds up."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(10) as scope:
            for i in range(5000):
                t0 = _clock.now()
                virtual_clock.advance(0.001)
                _scopes.record("call", f"c{i}", t0, _clock.now())
            assert scope._marks is not None and len(scope._marks) == MARKS_MAX
            virtual_clock.advance(6)
    bd = info.value.breakdown
    assert bd is not None
    assert len(bd) <= BREAKDOWN_MAX_NODES
    adds_up(bd, tol=1e-3)
    assert any(p.kind == "more" for p in bd.parts)
    assert bd.elapsed_ms == pytest.approx(11000)


def test_nothing_is_recorded_outside_every_frame() -> None:
    _scopes.record("call", "x", 0.0, 1.0)
    assert _scopes._ROOT._marks is None

    def ok() -> int:
        return 1

    assert Policy("p", retry=2).execute_sync(ok) == 1
    assert _scopes._ROOT._marks is None


def test_str_is_one_line_with_the_biggest_parts(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            t0 = _clock.now()
            virtual_clock.advance(0.6)
            _scopes.record("call", "GET /slow", t0, _clock.now(), 1.0, "ok")
            virtual_clock.advance(0.5)
    text = str(info.value)
    assert "\n" not in text
    assert text == (
        "scope deadline of 1s exceeded [1.1s went to: call GET /slow 600ms, self 400ms, late 100ms]"
    )
    # A bound whose only parts are its own code (and its lateness) keeps its plain message.
    with pytest.raises(tb.DeadlineExceeded) as plain:
        with tb.fail_after(1):
            virtual_clock.advance(2)
    assert str(plain.value) == "scope deadline of 1s exceeded"


def test_pickles_with_its_breakdown(virtual_clock: VirtualClock) -> None:
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            t0 = _clock.now()
            virtual_clock.advance(0.6)
            _scopes.record("call", "GET /slow", t0, _clock.now(), 1.0, "ok")
            virtual_clock.advance(0.5)
    again = pickle.loads(pickle.dumps(info.value))
    assert again.breakdown == info.value.breakdown
    assert str(again) == str(info.value)
    assert Breakdown.from_json(info.value.breakdown.to_json()) == info.value.breakdown


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([], "expected an object"),
        ({"k": "bound"}, "no 'ms'"),
        ({"k": "nope", "ms": 1}, "unknown kind"),
        ({"k": "bound", "ms": -1}, "non-negative"),
        ({"k": "bound", "ms": float("nan")}, "finite"),
        ({"k": "bound", "ms": True}, "number"),
        ({"k": "bound", "ms": 1, "x": 1}, "unknown key"),
        ({"k": "bound", "ms": 1, "n": "a\nb"}, "printable"),
        ({"k": "bound", "ms": 1, "n": "a" * 121}, "120"),
        ({"k": "bound", "ms": 1, "p": {}}, "expected a list"),
    ],
)
def test_parsing_is_strict(data: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Breakdown.from_dict(data)


def test_parsing_limits_nodes_depth_and_bytes() -> None:
    wide = {"k": "bound", "ms": 1, "p": [{"k": "call", "ms": 0} for _ in range(300)]}
    with pytest.raises(ValueError, match="more than 256 parts"):
        Breakdown.from_dict(wide)
    deep: dict[str, Any] = {"k": "call", "ms": 1}
    for _ in range(12):
        deep = {"k": "call", "ms": 1, "p": [deep]}
    with pytest.raises(ValueError, match="deeper"):
        Breakdown.from_dict(deep)
    with pytest.raises(ValueError, match="over the 4096-byte limit"):
        Breakdown.from_json(json.dumps(wide))
    with pytest.raises(ValueError, match="not JSON"):
        Breakdown.from_json("{")


def test_a_part_built_by_hand_takes_durations() -> None:
    part = Breakdown("call", "250ms", name="GET /x", budget=1, offset=0.5)
    assert (part.elapsed_ms, part.budget_ms, part.offset_ms) == (250.0, 1000.0, 500.0)
    with pytest.raises(tb.ConfigurationError, match="kind"):
        Breakdown("nope", 1)


async def test_a_bound_reported_late_says_how_late(virtual_clock: VirtualClock) -> None:
    """D13.9: the loop was busy past the deadline (sync code ran 30 ms over it): the parts end at
    the deadline, the 20 ms after it until the bound was reported is a ``late`` part, and the
    whole still adds up to the time the caller observed."""
    start = virtual_clock.now()
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(0.1):
            await asyncio.sleep(0.09)
            virtual_clock.advance(0.03)  # a CPU-bound stretch the deadline cannot interrupt
            await asyncio.sleep(1)
    observed_ms = (virtual_clock.now() - start) * 1000
    bd = info.value.breakdown
    assert bd is not None
    assert observed_ms == pytest.approx(120)
    assert bd.elapsed_ms == pytest.approx(observed_ms)
    assert [(p.kind, p.elapsed_ms) for p in bd.parts] == [
        ("self", pytest.approx(100)),
        ("late", pytest.approx(20)),
    ]
    adds_up(bd)
    assert str(info.value) == "scope deadline of 100ms exceeded"  # nothing new to show


async def test_a_cut_part_ends_at_the_deadline_when_the_bound_fired_late(
    virtual_clock: VirtualClock,
) -> None:
    """A policy attempt still running when the bound fired 10 ms late ran until the deadline;
    the 10 ms after it are the bound's lateness, not the attempt's."""

    async def stall() -> None:
        await asyncio.sleep(0.05)
        virtual_clock.advance(0.06)  # busy past the deadline
        await asyncio.sleep(10)

    policy = Policy("fetch", timeout="1s")
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(0.1):
            await policy.execute(stall)
    bd = info.value.breakdown
    assert bd is not None
    assert [(p.kind, p.elapsed_ms) for p in bd.parts] == [
        ("attempt", pytest.approx(100)),
        ("self", pytest.approx(0)),
        ("late", pytest.approx(10)),
    ]
    adds_up(bd)
