"""The shared executor on asyncio and trio: dependencies, failures, groups that own a deadline,
failure policies, events and the critical path (virtual time, exact instants)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import timebound as tb
from timebound._core import _clock
from timebound._engine import DagPlan, Event, Group, Node

from .conftest import Runner


def sleeper(log: list[tuple[str, float]], name: str, seconds: float, value: Any = None) -> Any:
    async def action(ctx: object) -> Any:
        log.append((name, _clock.now()))
        await anyio.sleep(seconds)
        return value

    return action


def hang(cancelled: list[tuple[str, float]], name: str) -> Any:
    async def action(ctx: object) -> None:
        try:
            await anyio.sleep(1000)
        except anyio.get_cancelled_exc_class():
            cancelled.append((name, _clock.now()))
            raise

    return action


def test_dependencies_and_concurrency(run: Runner) -> None:
    """b and c start together once a is done; d starts when both are."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("a", sleeper(log, "a", 1)),
            Node("b", sleeper(log, "b", 2), ("a",)),
            Node("c", sleeper(log, "c", 3), ("a",)),
            Node("d", sleeper(log, "d", 1), ("b", "c")),
        ]
    )

    async def main() -> float:
        await plan.execute(None)
        return _clock.now()

    assert run(main) == 5.0
    assert sorted(log) == [("a", 0.0), ("b", 1.0), ("c", 1.0), ("d", 4.0)]


def test_first_failure_cancels_and_awaits_the_rest(run: Runner) -> None:
    """The failing node's own error is raised after every running node was cancelled."""
    cancelled: list[tuple[str, float]] = []

    async def boom(ctx: object) -> None:
        await anyio.sleep(2)
        raise KeyError("boom")

    plan: DagPlan[None] = DagPlan(
        [Node("x", hang(cancelled, "x")), Node("y", hang(cancelled, "y")), Node("boom", boom)]
    )

    async def main() -> None:
        with pytest.raises(KeyError) as info:
            await plan.execute(None)
        assert info.value.__timebound_node__ == "boom"  # type: ignore[attr-defined]
        assert sorted(cancelled) == [("x", 2.0), ("y", 2.0)]

    run(main)


def test_group_deadline_fires_while_members_run(run: Runner) -> None:
    """A group's own deadline interrupts its running members and fails the run as ``region``."""
    cancelled: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("a", hang(cancelled, "a"), group="r"),
            Node("b", hang(cancelled, "b"), group="r"),
        ],
        [Group("r", timeout=3)],
    )

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            await plan.execute(None)
        assert info.value.source == "region"
        assert info.value.__timebound_node__ == "r"  # type: ignore[attr-defined]
        assert _clock.now() == 3.0
        assert sorted(cancelled) == [("a", 3.0), ("b", 3.0)]

    run(main)


def test_group_fallback_replaces_the_region_and_unblocks_dependents(run: Runner) -> None:
    """On its own timeout the group's fallback runs once; dependents outside see its value."""
    log: list[tuple[str, float]] = []
    seen: dict[str, Any] = {}

    async def fallback(ctx: object) -> str:
        log.append(("fallback", _clock.now()))
        await anyio.sleep(1)
        return "defaults"

    def after(ctx: dict[str, Any]) -> None:
        seen.update(ctx)
        log.append(("after", _clock.now()))

    results: dict[Any, Any] = {}
    plan: DagPlan[dict[str, Any]] = DagPlan(
        [
            Node("slow", sleeper(log, "slow", 10, "late"), group="r"),
            Node("quick", sleeper(log, "quick", 1, "q"), group="r"),
            Node("after", after, ("quick",), is_async=False),
        ],
        [Group("r", timeout=4, on_timeout=fallback)],
    )

    async def main() -> None:
        spans = await plan.execute(results, results=results, record=True)
        assert spans is not None
        outcomes = {s.key: s.outcome for s in spans}
        assert outcomes == {"slow": "timed_out", "quick": "ok", "after": "ok", "r": "timed_out"}

    run(main)
    assert sorted(log, key=lambda e: e[1])[2:] == [("fallback", 4.0), ("after", 5.0)]
    assert sorted(log[:2]) == [("quick", 0.0), ("slow", 0.0)]
    assert results["r"] == "defaults"
    assert "slow" not in results
    assert seen["r"] == "defaults"


def test_group_deadline_starts_when_the_group_is_entered(run: Runner) -> None:
    """The region's budget counts from the moment its external dependencies are done (D5.4)."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("before", sleeper(log, "before", 5)),
            Node("inside", sleeper(log, "inside", 10), ("before",), group="r"),
        ],
        [Group("r", timeout=lambda ctx: 2.5)],
    )

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded):
            await plan.execute(None)
        assert _clock.now() == 7.5

    run(main)


def test_member_sees_the_smallest_of_its_bounds(run: Runner) -> None:
    """Inside a member the effective deadline is min(own scope, group, enclosing) (D1.5)."""
    seen: list[float] = []

    async def probe(ctx: object) -> None:
        seen.append(tb.current_deadline().when)
        with tb.move_on_after(1):
            seen.append(tb.current_deadline().when)

    plan: DagPlan[None] = DagPlan(
        [Node("p", probe, group="inner")],
        [Group("outer", timeout=5), Group("inner", timeout=8, parent="outer")],
    )

    async def main() -> None:
        with tb.fail_after(20):
            await plan.execute(None)
        with tb.fail_after(3):
            await plan.execute(None)

    run(main)
    assert seen == [5.0, 1.0, 3.0, 1.0]


def test_a_members_own_shorter_deadline_is_an_error_not_the_regions(run: Runner) -> None:
    """A member's own scope firing first fails the run; the fallback does not run (D5.5)."""
    ran: list[str] = []

    async def own_timeout(ctx: object) -> None:
        with tb.fail_after(1):
            await anyio.sleep(10)

    plan: DagPlan[None] = DagPlan(
        [Node("m", own_timeout, group="r")],
        [Group("r", timeout=5, on_timeout=lambda ctx: ran.append("fallback"))],
    )

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            await plan.execute(None)
        assert info.value.source == "scope"
        assert _clock.now() == 1.0

    run(main)
    assert ran == []


def test_an_enclosing_deadline_is_not_the_groups_timeout(run: Runner) -> None:
    """An outer deadline earlier than the region's propagates as itself; no fallback (D5.3)."""
    ran: list[str] = []
    cancelled: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [Node("m", hang(cancelled, "m"), group="r")],
        [Group("r", timeout=5, on_timeout=lambda ctx: ran.append("fallback"))],
    )

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(2, what="request"):
                await plan.execute(None)
        assert info.value.source == "scope"
        assert "request" in str(info.value)

    run(main)
    assert ran == []
    assert cancelled == [("m", 2.0)]


def test_the_same_instant_for_region_and_enclosing_reports_the_enclosing(run: Runner) -> None:
    """When the outer deadline and the region's coincide, the outer one is reported."""
    ran: list[str] = []
    cancelled: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [Node("m", hang(cancelled, "m"), group="r")],
        [Group("r", timeout=2, on_timeout=lambda ctx: ran.append("fallback"))],
    )

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(2, what="request"):
                await plan.execute(None)
        assert "request" in str(info.value)

    run(main)
    assert ran == []


def test_outer_cancellation_is_never_a_timeout(run: Runner) -> None:
    """Cancelling the caller cancels the members and propagates; the fallback never runs."""
    ran: list[str] = []
    cancelled: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [Node("a", hang(cancelled, "a"), group="r"), Node("b", hang(cancelled, "b"), group="r")],
        [Group("r", timeout=5, on_timeout=lambda ctx: ran.append("fallback"))],
    )

    async def main() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(plan.execute, None)
            await anyio.sleep(1)
            tg.cancel_scope.cancel()
        assert _clock.now() == 1.0

    run(main)
    assert ran == []
    assert sorted(cancelled) == [("a", 1.0), ("b", 1.0)]


def test_collect_records_the_error_and_skips_dependents(run: Runner) -> None:
    """A collected failure lands in ``errors``; its dependents are skipped, the rest runs."""
    log: list[tuple[str, float]] = []

    async def bad(ctx: object) -> None:
        await anyio.sleep(1)
        raise ValueError("bad")

    plan: DagPlan[None] = DagPlan(
        [
            Node("bad", bad, on_error="collect"),
            Node("child", sleeper(log, "child", 1), ("bad",)),
            Node("other", sleeper(log, "other", 3)),
        ]
    )
    errors: dict[Any, BaseException] = {}

    async def main() -> None:
        spans = await plan.execute(None, errors=errors, record=True)
        assert spans is not None
        assert {s.key: s.outcome for s in spans} == {
            "bad": "error",
            "child": "skipped",
            "other": "ok",
        }

    run(main)
    assert list(errors) == ["bad"]
    assert isinstance(errors["bad"], ValueError)
    assert log == [("other", 0.0)]


def test_a_group_that_collects_its_timeout(run: Runner) -> None:
    """``on_timeout="collect"`` stores the region's error and skips what depends on the group."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("m", sleeper(log, "m", 10), group="r"),
            Node("next", sleeper(log, "next", 1), ("m",)),
        ],
        [Group("r", timeout=2, on_timeout="collect")],
    )
    errors: dict[Any, BaseException] = {}

    async def main() -> None:
        await plan.execute(None, errors=errors)
        assert _clock.now() == 2.0

    run(main)
    assert log == [("m", 0.0)]
    assert isinstance(errors["r"], tb.DeadlineExceeded)
    assert errors["r"].source == "region"


def test_a_late_sync_result_is_discarded(run: Runner) -> None:
    """A sync member that overruns the region cannot be interrupted: its value is never kept."""

    def cpu_bound(ctx: object) -> str:
        _clock.sleep(3)  # virtual: the clock moves, nothing can interrupt this
        return "late"

    results: dict[Any, Any] = {}
    plan: DagPlan[None] = DagPlan(
        [Node("cpu", cpu_bound, group="r", is_async=False)],
        [Group("r", timeout=2, on_timeout=lambda ctx: "fallback")],
    )

    async def main() -> None:
        spans = await plan.execute(None, results=results, record=True)
        assert spans is not None
        assert [s.outcome for s in spans] == ["late", "timed_out"]

    run(main)
    assert results == {"r": "fallback"}


def test_events_and_critical_path(run: Runner) -> None:
    """The sink sees ready/start/end per node and group; the critical path is the longest
    chain."""
    events: list[Event] = []
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("a", sleeper(log, "a", 1)),
            Node("b", sleeper(log, "b", 5), ("a",), group="g"),
            Node("c", sleeper(log, "c", 2), ("a",), group="g"),
            Node("d", sleeper(log, "d", 1), ("b", "c")),
        ],
        [Group("g", timeout=100)],
    )

    async def main() -> None:
        spans = await plan.execute(None, sink=events.append, record=True)
        assert spans is not None
        assert [s.key for s in plan.critical_path(spans)] == ["a", "b", "d"]
        g = spans[-1]
        assert (g.key, g.is_group, g.ready, g.start, g.end) == ("g", True, 1.0, 1.0, 6.0)

    run(main)
    got = [(e.kind, e.key, e.at) for e in events if e.key in ("b", "g", "d")]
    assert got == [
        ("ready", "g", 1.0),
        ("start", "g", 1.0),
        ("ready", "b", 1.0),
        ("start", "b", 1.0),
        ("end", "b", 6.0),
        ("end", "g", 6.0),
        ("ready", "d", 6.0),
        ("start", "d", 6.0),
        ("end", "d", 7.0),
    ]


def test_a_dependency_on_a_member_waits_for_the_whole_group(run: Runner) -> None:
    """A node outside a group that uses one member starts only when the group settled."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("fast", sleeper(log, "fast", 1), group="g"),
            Node("slow", sleeper(log, "slow", 4), group="g"),
            Node("user", sleeper(log, "user", 1), ("fast",)),
        ],
        [Group("g")],
    )

    async def main() -> None:
        await plan.execute(None)

    run(main)
    assert ("user", 4.0) in log


def test_bad_definitions_are_rejected() -> None:
    """Unknown or duplicate groups, nesting cycles and bad policies are named."""

    def noop(ctx: object) -> None:
        return None

    with pytest.raises(ValueError, match="unknown group"):
        DagPlan([Node("a", noop, group="zz")])
    with pytest.raises(ValueError, match="duplicate group"):
        DagPlan([], [Group("g"), Group("g")])
    with pytest.raises(ValueError, match="unknown parent"):
        DagPlan([], [Group("g", parent="nope")])
    with pytest.raises(ValueError, match="cycle"):
        DagPlan([], [Group("g", parent="h"), Group("h", parent="g")])
    with pytest.raises(ValueError, match="on_timeout"):
        DagPlan([], [Group("g", on_timeout="retry")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cycle"):
        DagPlan([Node("a", noop, ("b",)), Node("b", noop, ("a",))])


def test_group_hooks_and_dependencies_on_groups(run: Runner) -> None:
    """A group waits for its ``deps``; ``on_enter``/``on_success`` bracket it; a node may
    depend on the group itself."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("first", sleeper(log, "first", 2)),
            Node("member", sleeper(log, "member", 1), group="g"),
            Node("last", sleeper(log, "last", 1), ("g",)),
        ],
        [
            Group(
                "g",
                timeout=5,
                deps=("first",),
                on_enter=lambda ctx: log.append(("enter", _clock.now())),
                on_success=lambda ctx: log.append(("success", _clock.now())),
            )
        ],
    )

    async def main() -> None:
        await plan.execute(None)

    run(main)
    assert log == [
        ("first", 0.0),
        ("enter", 2.0),
        ("member", 2.0),
        ("success", 3.0),
        ("last", 3.0),
    ]


def test_on_success_is_not_called_when_the_group_times_out(run: Runner) -> None:
    """A group that timed out never reports success; its fallback runs instead."""
    log: list[str] = []
    plan: DagPlan[None] = DagPlan(
        [Node("m", sleeper([], "m", 10), group="g")],
        [
            Group(
                "g",
                timeout=1,
                on_success=lambda ctx: log.append("success"),
                on_timeout=lambda ctx: log.append("fallback"),
            )
        ],
    )

    async def main() -> None:
        await plan.execute(None)

    run(main)
    assert log == ["fallback"]


def test_a_member_cannot_depend_on_its_own_group() -> None:
    """Depending on the group one is in (or a group on its member) is a definition error."""

    def noop(ctx: object) -> None:
        return None

    with pytest.raises(ValueError, match="its own group"):
        DagPlan([Node("a", noop, ("g",), group="g")], [Group("g")])
    with pytest.raises(ValueError, match="its own member"):
        DagPlan([Node("a", noop, group="g")], [Group("g", deps=("a",))])


def test_recorded_spans_survive_a_failed_run(run: Runner) -> None:
    """With ``record=`` a list, the caller keeps the spans of a run that failed: the failing
    node is an error, the node torn down with it is cancelled."""
    cancelled: list[tuple[str, float]] = []

    async def boom(ctx: object) -> None:
        await anyio.sleep(1)
        raise ValueError("boom")

    plan: DagPlan[None] = DagPlan([Node("hang", hang(cancelled, "hang")), Node("boom", boom)])
    spans: list[Any] = []

    async def main() -> None:
        with pytest.raises(ValueError):
            await plan.execute(None, record=spans)

    run(main)
    assert [(s.key, s.outcome, s.end) for s in spans] == [
        ("hang", "cancelled", 1.0),
        ("boom", "error", 1.0),
    ]


def test_an_inner_fallback_is_bounded_by_the_outer_region(run: Runner) -> None:
    """A nested group's fallback runs outside its own expired region but inside the enclosing
    one: when the outer region runs out, the outer fallback wins."""
    log: list[tuple[str, float]] = []

    async def inner_fallback(ctx: object) -> str:
        log.append(("inner fallback", _clock.now()))
        await anyio.sleep(10)
        return "inner"

    def outer_fallback(ctx: object) -> str:
        log.append(("outer fallback", _clock.now()))
        return "outer"

    results: dict[Any, Any] = {}
    plan: DagPlan[None] = DagPlan(
        [Node("m", sleeper([], "m", 100), group="inner")],
        [
            Group("outer", timeout=5, on_timeout=outer_fallback),
            Group("inner", timeout=1, parent="outer", on_timeout=inner_fallback),
        ],
    )

    async def main() -> None:
        spans = await plan.execute(None, results=results, record=True)
        assert spans is not None
        assert {s.key: s.outcome for s in spans} == {
            "m": "timed_out",
            "outer": "timed_out",
            "inner": "timed_out",
        }

    run(main)
    assert log == [("inner fallback", 1.0), ("outer fallback", 5.0)]
    assert results == {"outer": "outer"}


def test_a_group_is_never_entered_after_its_enclosing_region_ran_out(run: Runner) -> None:
    """A nested group whose turn comes after the outer deadline is skipped: no on_enter, no
    on_success, no fallback."""
    log: list[str] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("slow", sleeper([], "slow", 3), group="outer"),
            Node("inside", sleeper([], "inside", 1), group="inner"),
        ],
        [
            Group("outer", timeout=2, on_timeout="collect"),
            Group(
                "inner",
                parent="outer",
                deps=("slow",),
                on_enter=lambda ctx: log.append("enter"),
                on_success=lambda ctx: log.append("success"),
                on_timeout=lambda ctx: log.append("fallback"),
            ),
        ],
    )
    errors: dict[Any, BaseException] = {}

    async def main() -> None:
        spans = await plan.execute(None, errors=errors, record=True)
        assert spans is not None
        assert {s.key: s.outcome for s in spans} == {
            "slow": "timed_out",
            "inside": "skipped",
            "outer": "timed_out",
            "inner": "skipped",
        }

    run(main)
    assert log == []
    assert list(errors) == ["outer"]


def test_a_group_reserve_stops_its_members_early_and_keeps_time_for_the_fallback(
    run: Runner,
) -> None:
    """D1.18 on a group (D5.9): members see the deadline less the reserve; the fallback runs
    with the reserve left."""
    log: list[tuple[str, float]] = []
    cancelled: list[tuple[str, float]] = []

    async def fallback(ctx: Any) -> str:
        log.append(("fallback", _clock.now()))
        log.append(("left", tb.current_deadline().when - _clock.now()))
        return "defaults"

    def visible(ctx: Any) -> None:
        log.append(("visible", tb.current_deadline().when))

    results: dict[Any, Any] = {}
    plan: DagPlan[dict[str, Any]] = DagPlan(
        [
            Node("see", visible, group="r", is_async=False),
            Node("slow", hang(cancelled, "slow"), ("see",), group="r"),
        ],
        [Group("r", timeout=4, reserve=1, on_timeout=fallback)],
    )

    async def main() -> None:
        with tb.move_on_after(100):
            await plan.execute(results, results=results)

    run(main)
    assert log == [("visible", 3.0), ("fallback", 3.0), ("left", pytest.approx(97.0))]
    assert cancelled == [("slow", 3.0)]
    assert results["r"] == "defaults"


def test_a_member_refused_by_the_reserve_counts_as_the_groups_timeout(
    run: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member that starts at or after the reserved instant (its check passed a moment
    before, here forced) is refused by the reserve: the group times out, the run does not fail."""
    from timebound._engine._run import _Execution

    monkeypatch.setattr(_Execution, "_blocked", lambda self, i: None)
    log: list[str] = []

    def advance(ctx: Any) -> None:
        log.append("advance")

    async def late(ctx: Any) -> None:
        log.append("late ran")

    async def fallback(ctx: Any) -> str:
        return "defaults"

    async def first(ctx: Any) -> None:
        await anyio.sleep(3.5)  # past the reserved instant (3); the next member starts after it

    results: dict[Any, Any] = {}
    plan: DagPlan[dict[str, Any]] = DagPlan(
        [
            Node("first", first, group="r"),
            Node("late", late, ("first",), group="r"),
            Node("sync", advance, ("first",), group="r", is_async=False),
        ],
        [Group("r", timeout=4, reserve=1, on_timeout=fallback)],
    )

    async def main() -> None:
        await plan.execute(results, results=results)

    run(main)
    assert results["r"] == "defaults"
    assert "late ran" not in log and "advance" not in log
