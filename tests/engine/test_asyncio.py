"""What the executor promises asyncio code specifically: the in-place path, one-shot cancellation
and no task left behind."""

from __future__ import annotations

import asyncio

import pytest

from timebound._core import _clock
from timebound._engine import DagPlan, Group, Node
from timebound.testing import VirtualClock


async def test_a_chain_runs_in_the_callers_task(virtual_clock: VirtualClock) -> None:
    """A single ready async node is awaited in place: a chain creates no task."""
    tasks: list[asyncio.Task[object] | None] = []

    async def step(ctx: object) -> None:
        tasks.append(asyncio.current_task())
        await asyncio.sleep(1)

    plan: DagPlan[None] = DagPlan(
        [Node("a", step), Node("b", step, ("a",)), Node("c", step, ("b",))]
    )
    await plan.execute(None)
    assert tasks == [asyncio.current_task()] * 3


async def test_cancelled_nodes_may_await_their_cleanup(virtual_clock: VirtualClock) -> None:
    """On asyncio a failing run cancels the others once: their ``finally`` may still await."""
    cleaned: list[float] = []

    async def holds_a_resource(ctx: object) -> None:
        try:
            await asyncio.sleep(100)
        finally:
            await asyncio.sleep(0.5)  # e.g. closing a connection
            cleaned.append(_clock.now())

    async def boom(ctx: object) -> None:
        await asyncio.sleep(1)
        raise RuntimeError("boom")

    plan: DagPlan[None] = DagPlan([Node("r", holds_a_resource), Node("boom", boom)])
    with pytest.raises(RuntimeError):
        await plan.execute(None)
    assert cleaned == [1.5]
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_nothing_is_left_running_after_a_region_times_out(
    virtual_clock: VirtualClock,
) -> None:
    """After a group's deadline fails the run, no node task survives."""

    async def hang(ctx: object) -> None:
        await asyncio.sleep(100)

    plan: DagPlan[None] = DagPlan(
        [Node("a", hang, group="g"), Node("b", hang, group="g"), Node("c", hang)],
        [Group("g", timeout=1)],
    )
    with pytest.raises(TimeoutError):
        await plan.execute(None)
    assert virtual_clock.now() == 1.0
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


async def test_a_node_cancelled_by_someone_else_fails_the_run(virtual_clock: VirtualClock) -> None:
    """A node task cancelled from outside the run is a failure, reported as a cancellation."""
    victims: list[asyncio.Task[object] | None] = []

    async def victim(ctx: object) -> None:
        victims.append(asyncio.current_task())
        await asyncio.sleep(100)

    async def killer(ctx: object) -> None:
        await asyncio.sleep(1)
        task = victims[0]
        assert task is not None
        task.cancel()
        await asyncio.sleep(100)

    plan: DagPlan[None] = DagPlan([Node("victim", victim), Node("killer", killer)])
    with pytest.raises(asyncio.CancelledError):
        await plan.execute(None)
    assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []
