"""The generic DAG executor: dependencies, priority, concurrency, failures, spans."""

from __future__ import annotations

import asyncio

import pytest

from timebound._core import _clock
from timebound._engine import DagPlan, Node
from timebound.testing import VirtualClock


def _sleeper(log: list[tuple[str, float]], name: str, seconds: float):  # type: ignore[no-untyped-def]
    async def action(ctx: object) -> None:
        log.append((name, _clock.now()))
        await asyncio.sleep(seconds)

    return action


async def test_dependencies_and_concurrency(virtual_clock: VirtualClock) -> None:
    """b and c run together after a; d after both."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("a", _sleeper(log, "a", 1)),
            Node("b", _sleeper(log, "b", 1), ("a",)),
            Node("c", _sleeper(log, "c", 2), ("a",)),
            Node("d", _sleeper(log, "d", 1), ("b", "c")),
        ]
    )
    spans = await plan.execute(None, record=True)
    assert sorted(log) == [("a", 0.0), ("b", 1.0), ("c", 1.0), ("d", 3.0)]
    assert spans is not None
    assert [(s.key, s.ready, s.start, s.end, s.outcome) for s in spans] == [
        ("a", 0.0, 0.0, 1.0, "ok"),
        ("b", 1.0, 1.0, 2.0, "ok"),
        ("c", 1.0, 1.0, 3.0, "ok"),
        ("d", 3.0, 3.0, 4.0, "ok"),
    ]


async def test_priority_under_a_concurrency_limit(virtual_clock: VirtualClock) -> None:
    """With one slot, higher priority first, then declaration order."""
    log: list[tuple[str, float]] = []
    plan: DagPlan[None] = DagPlan(
        [
            Node("low", _sleeper(log, "low", 1), priority=0),
            Node("mid1", _sleeper(log, "mid1", 1), priority=50),
            Node("high", _sleeper(log, "high", 1), priority=100),
            Node("mid2", _sleeper(log, "mid2", 1), priority=50),
        ]
    )
    await plan.execute(None, concurrency=1)
    assert log == [("high", 0.0), ("mid1", 1.0), ("mid2", 2.0), ("low", 3.0)]


async def test_sync_nodes_run_inline_without_a_slot(virtual_clock: VirtualClock) -> None:
    """A sync node runs as soon as it is ready, even while the only slot is taken."""
    log: list[tuple[str, float]] = []

    def sync(ctx: object) -> None:
        log.append(("sync", _clock.now()))

    plan: DagPlan[None] = DagPlan(
        [
            Node("a", _sleeper(log, "a", 1)),
            Node("s", sync, ("a",), is_async=False),
            Node("long", _sleeper(log, "long", 5)),
        ]
    )
    await plan.execute(None, concurrency=1)
    assert log == [("a", 0.0), ("sync", 1.0), ("long", 1.0)]


async def test_first_failure_cancels_the_rest(virtual_clock: VirtualClock) -> None:
    """The failing node's own exception is raised; running nodes are cancelled and awaited."""
    cancelled: list[float] = []

    async def hang(ctx: object) -> None:
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            cancelled.append(_clock.now())
            raise

    async def boom(ctx: object) -> None:
        await asyncio.sleep(2)
        raise KeyError("boom")

    plan: DagPlan[None] = DagPlan(
        [Node("hang", hang), Node("boom", boom), Node("after", hang, ("boom",))]
    )
    with pytest.raises(KeyError) as info:
        await plan.execute(None)
    assert info.value.__timebound_node__ == "boom"  # type: ignore[attr-defined]
    assert cancelled == [2.0]


def test_cycles_and_unknown_dependencies_are_rejected() -> None:
    """A plan must be a DAG over known keys."""

    def noop(ctx: object) -> None:
        return None

    with pytest.raises(ValueError, match="cycle"):
        DagPlan([Node("a", noop, ("b",)), Node("b", noop, ("a",))])
    with pytest.raises(ValueError, match="unknown node"):
        DagPlan([Node("a", noop, ("zz",))])
    with pytest.raises(ValueError, match="duplicate"):
        DagPlan([Node("a", noop), Node("a", noop)])


async def test_bad_concurrency(virtual_clock: VirtualClock) -> None:
    """concurrency must be at least 1."""
    with pytest.raises(ValueError):
        await DagPlan([]).execute(None, concurrency=0)


async def test_outer_cancellation_cancels_running_nodes(virtual_clock: VirtualClock) -> None:
    """Cancelling the executor cancels every node it started."""
    cancelled: list[str] = []

    def hanger(name: str):  # type: ignore[no-untyped-def]
        async def hang(ctx: object) -> None:
            try:
                await asyncio.sleep(100)
            except asyncio.CancelledError:
                cancelled.append(name)
                raise

        return hang

    plan: DagPlan[None] = DagPlan([Node("a", hanger("a")), Node("b", hanger("b"))])
    task = asyncio.ensure_future(plan.execute(None))
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(cancelled) == ["a", "b"]


async def test_results_are_stored_by_key(virtual_clock: VirtualClock) -> None:
    """With results=, each node's value (sync or async) lands under its key."""

    async def two(ctx: object) -> int:
        await asyncio.sleep(1)
        return 2

    plan: DagPlan[None] = DagPlan(
        [Node("a", two), Node("b", lambda ctx: 3, ("a",), is_async=False), Node("c", two)]
    )
    results: dict[str, int] = {}
    await plan.execute(None, results=results)
    assert results == {"a": 2, "b": 3, "c": 2}
