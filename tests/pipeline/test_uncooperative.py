"""Tasks that cannot be stopped do not hold their region or the request (D5.7, D5.8): the wait
ends at the deadline, the fallback runs, and what such a task returns later is never committed."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pyarrow as pa
import pytest

import timebound as tb
from timebound import pipeline as pl
from timebound._core import _preempt
from timebound.testing import VirtualClock


def _registry() -> tuple[pl.Catalog, dict[str, Any]]:
    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("boost", pa.float64(), nullable=True)
    seen: dict[str, Any] = {}

    @reg.task(reads=["id"], writes=["boost"])
    async def stubborn(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        """Swallows its cancellation, then returns a (late) write half a second later."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.5)
        seen["returned"] = True
        return {"boost": pa.array([9.0] * rows.num_rows)}

    return reg, seen


def _region(reg: pl.Catalog, task: str) -> pl.Artifact:
    plan = pl.Plan("p", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task(task),
        if_fail=lambda c: c.fill_defaults(["boost"]),
        budget={"base_ms": 20, "per_row_us": 0, "min_ms": 20, "max_ms": 20},
        on_timeout="fallback",
    )
    return pl.compile(plan)


def test_a_task_that_swallows_cancellation_is_abandoned_at_the_region_deadline() -> None:
    """The 20 ms region returns at 20 ms with the fallback (it took 520 ms when the engine
    awaited the task); the task's late write is never committed, and it is counted."""
    reg, seen = _registry()
    engine = pl.Engine(reg)
    clock = VirtualClock()
    out: dict[str, Any] = {}

    async def main() -> None:
        started = clock.now()
        out["result"] = await engine.run(_region(reg, "stubborn"), pa.table({"id": [1, 2]}))
        out["returned_after"] = clock.now() - started
        await asyncio.sleep(1)  # the abandoned task ends meanwhile
        out["rows_then"] = out["result"].rows.column("boost").to_pylist()

    clock.run(main())
    result = out["result"]
    wrapper = result.trace.wrappers["timeout_wrapper"]
    assert out["returned_after"] == pytest.approx(0.02)
    assert (wrapper["chosen_branch"], wrapper["success_elapsed_ms"]) == ("fail", 20.0)
    assert result.rows.column("boost").to_pylist() == [None, None] == out["rows_then"]
    assert seen.get("returned") is True  # it did finish later; its write went nowhere
    assert engine.abandoned == 1


def test_a_request_deadline_is_kept_against_a_task_that_swallows_cancellation() -> None:
    """A 200 ms request over a plan whose task swallows its cancellation ends at 200 ms with
    DeadlineExceeded naming the request (it took the task's whole run before)."""
    reg, _ = _registry()
    plan = pl.Plan("q", catalog=reg).task("stubborn")
    engine = pl.Engine(reg)
    clock = VirtualClock()
    out: dict[str, Any] = {}

    async def main() -> None:
        started = clock.now()
        try:
            async with tb.fail_after(0.2, what="request"):
                await engine.run(pl.compile(plan), pa.table({"id": [1]}))
        except tb.DeadlineExceeded as exc:
            out["error"] = exc
        out["after"] = clock.now() - started
        await asyncio.sleep(1)

    clock.run(main())
    assert out["after"] == pytest.approx(0.2)
    assert "request" in str(out["error"])
    assert engine.abandoned == 1


def test_a_blocked_sync_task_is_left_in_its_thread_and_the_fallback_runs() -> None:
    """A sync task blocked past its 20 ms region (a real thread, real time): the run returns
    with the fallback while the task is still blocked, the thread is counted as abandoned, and
    its write, made after the run returned, is never committed."""
    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("boost", pa.float64(), nullable=True)
    release, finished = threading.Event(), threading.Event()

    @reg.task(reads=["id"], writes=["boost"])
    def blocked(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        release.wait(10)  # only the test releases it, after the run returned
        finished.set()
        return {"boost": pa.array([9.0] * rows.num_rows)}

    engine = pl.Engine(reg)
    abandoned_before = _preempt.abandoned_threads()

    async def main() -> pl.RunOutput:
        async with tb.fail_after(60):  # a deadline bounds it: the task runs in a thread
            return await engine.run(_region(reg, "blocked"), pa.table({"id": [1, 2]}))

    with pytest.warns(_preempt.AbandonedThreadWarning, match="task blocked"):
        result = asyncio.run(main())
    still_blocked = not finished.is_set()
    release.set()
    assert finished.wait(30)
    assert still_blocked  # the run returned before the task did
    assert result.trace.wrappers["timeout_wrapper"]["chosen_branch"] == "fail"
    assert result.rows.column("boost").to_pylist() == [None, None]
    assert engine.abandoned == 1 and _preempt.abandoned_threads() == abandoned_before + 1


def test_a_sync_task_runs_in_a_thread_only_when_a_deadline_bounds_it() -> None:
    """Under a request deadline a sync task runs in a worker thread, sees its deadline there and
    commits its write in time; with no deadline anywhere it runs on the loop's thread."""
    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("boost", pa.float64(), nullable=True)
    seen: list[tuple[bool, float]] = []

    @reg.task(reads=["id"], writes=["boost"])
    def quick(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        on_main = threading.current_thread() is threading.main_thread()
        seen.append((on_main, tb.current_deadline().remaining()))
        ctx.check()
        return {"boost": pa.array([1.5] * rows.num_rows)}

    engine = pl.Engine(reg)
    artifact = pl.compile(pl.Plan("r", catalog=reg).task("quick"))

    async def bounded() -> pl.RunOutput:
        async with tb.fail_after(60):
            return await engine.run(artifact, pa.table({"id": [1]}))

    result = asyncio.run(bounded())
    unbounded = engine.run_sync(artifact, pa.table({"id": [1]}))
    assert result.rows.column("boost").to_pylist() == [1.5] == unbounded.rows["boost"].to_pylist()
    (threaded, remaining), (inline, never) = seen
    assert not threaded and 0 < remaining <= 60
    assert inline and never == float("inf")
    assert engine.abandoned == 0


def test_on_trio_a_blocked_sync_task_is_left_in_its_thread_too() -> None:
    """trio: the region stops waiting for a blocked sync task (trio's thread runner abandons it
    on cancellation), the fallback runs, the thread is counted."""
    import trio

    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("boost", pa.float64(), nullable=True)
    release, finished = threading.Event(), threading.Event()

    @reg.task(reads=["id"], writes=["boost"])
    def blocked(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        release.wait(10)
        finished.set()
        return {"boost": pa.array([9.0] * rows.num_rows)}

    engine = pl.Engine(reg)
    out: list[pl.RunOutput] = []

    async def main() -> None:
        async with tb.fail_after(60):
            out.append(await engine.run(_region(reg, "blocked"), pa.table({"id": [1, 2]})))

    with pytest.warns(_preempt.AbandonedThreadWarning, match="task blocked"):
        trio.run(main)
    still_blocked = not finished.is_set()
    release.set()
    assert finished.wait(30)
    assert still_blocked
    assert out[0].trace.wrappers["timeout_wrapper"]["chosen_branch"] == "fail"
    assert out[0].rows.column("boost").to_pylist() == [None, None]
    assert engine.abandoned == 1
