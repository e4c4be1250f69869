"""A pipeline run's events reach the listeners as they happen (D10.11): each task's and region's
start and end, and a region's timeout before its fallback runs, with the run's correlation ids."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from timebound import pipeline as pl
from timebound.telemetry import Event, add_listener, correlation
from timebound.testing import VirtualClock


def _catalog(heard: list[Event], seen: dict[str, list[str]]) -> pl.Catalog:
    """Tasks that note, when they run, the names and nodes of the events heard so far."""
    catalog = pl.Catalog()
    catalog.key("id", pa.int64())
    catalog.key("a", pa.float64(), nullable=True)
    catalog.key("b", pa.float64(), nullable=True)

    def note(who: str) -> None:
        seen[who] = [f"{e.name} {e.attrs['node_id']}" for e in heard]

    @catalog.task(reads=["id"], writes=["a"])
    def first(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
        return {"a": pa.array([1.0] * rows.num_rows)}

    @catalog.task(reads=["a"], writes=["b"])
    def second(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
        note("second")
        return {"b": pa.array([2.0] * rows.num_rows)}

    @catalog.task(reads=["id"], writes=["a"])
    async def slow(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
        await asyncio.sleep(1)
        return {"a": pa.array([3.0] * rows.num_rows)}

    @catalog.task(reads=["id"], writes=["a"])
    def fallback(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
        note("fallback")
        return {"a": pa.array([0.0] * rows.num_rows)}

    return catalog


_BUDGET = {"base_ms": 5, "per_row_us": 0, "min_ms": 5, "max_ms": 5}
_ROWS = pa.table({"id": pa.array([1, 2], type=pa.int64())})


def _run(plan: pl.Plan, catalog: pl.Catalog, heard: list[Event]) -> pl.RunOutput:
    remove = add_listener(lambda e: heard.append(e) if e.kind == "pipeline" else None)
    try:
        with correlation("request", "req-9"):
            return VirtualClock().run(pl.Engine(catalog).run(pl.compile(plan), _ROWS))
    finally:
        remove()


def test_a_later_task_finds_the_earlier_tasks_end_already_heard() -> None:
    """The listener hears a task's end as it ends: the next task, running, finds it delivered."""
    heard: list[Event] = []
    seen: dict[str, list[str]] = {}
    catalog = _catalog(heard, seen)
    plan = pl.Plan("two", catalog=catalog)
    plan.task("first").task("second")
    result = _run(plan, catalog, heard)
    assert seen["second"] == [
        "pipeline.task_started task:first",
        "pipeline.task task:first",
        "pipeline.task_started task:second",
    ]
    assert [f"{e.name} {e.attrs['node_id']}" for e in heard][3:] == ["pipeline.task task:second"]
    assert all(e.correlation == {"request": "req-9", "task": e.attrs["node_id"]} for e in heard)
    started = heard[2]
    span = result.trace.span("task:second")
    assert started.at == result.trace.base + span["start_ms"] / 1000.0
    assert {k: started.attrs[k] for k in ("ready_ms", "start_ms", "deps")} == {
        k: span[k] for k in ("ready_ms", "start_ms", "deps")
    }


def test_a_regions_timeout_is_heard_before_its_fallback_runs() -> None:
    """At the region's deadline the listener hears ``pipeline.region_timed_out`` with the bound,
    then the fail branch runs, then the region ends: in the order they happen."""
    heard: list[Event] = []
    seen: dict[str, list[str]] = {}
    catalog = _catalog(heard, seen)
    plan = pl.Plan("cut", catalog=catalog)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("slow"),
        if_fail=lambda c: c.task("fallback"),
        budget=_BUDGET,
        on_timeout="fallback",
    )
    result = _run(plan, catalog, heard)
    assert seen["fallback"] == [
        "pipeline.region_started timeout_wrapper",
        "pipeline.task_started timeout_wrapper/success/task:slow",
        "pipeline.task timeout_wrapper/success/task:slow",
        "pipeline.region_timed_out timeout_wrapper",
        "pipeline.task_started timeout_wrapper/fail/task:fallback",
    ]
    timed_out = heard[3]
    assert timed_out.bound is not None
    assert (timed_out.bound.source, timed_out.bound.timeout, timed_out.bound.set_by) == (
        "region",
        0.005,
        "region timeout_wrapper",
    )
    assert timed_out.at == pytest.approx(result.trace.base + 0.005)
    assert timed_out.attrs["wrapper"]["timed_out"] is True
    assert timed_out.attrs["wrapper"]["chosen_branch"] == "fail"
    assert timed_out.attrs["wrapper"]["fail_elapsed_ms"] is None  # the fallback had not run
    assert [e.name for e in heard[5:]] == ["pipeline.task", "pipeline.region"]
    assert heard[-1].attrs["wrapper"] == result.trace.wrappers["timeout_wrapper"]


def test_a_fail_plan_regions_timeout_is_heard_before_the_plan_fails() -> None:
    """``on_timeout="fail_plan"``: the timeout is heard before the PlanTimeout leaves the run."""
    heard: list[Event] = []
    catalog = _catalog(heard, {})
    plan = pl.Plan("cut", catalog=catalog)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("slow"),
        if_fail=lambda c: c.fill_defaults(["a"]),
        budget=_BUDGET,
        on_timeout="fail_plan",
    )
    with pytest.raises(pl.PlanTimeout):
        _run(plan, catalog, heard)
    names = [e.name for e in heard]
    assert names.index("pipeline.region_timed_out") < names.index("pipeline.region")
    (timed_out,) = [e for e in heard if e.name == "pipeline.region_timed_out"]
    assert timed_out.attrs["wrapper"]["chosen_branch"] == "fail_plan"


def test_with_no_listener_a_run_builds_no_sink() -> None:
    """Nobody listening as the run starts: the executor gets no sink, so no event is built."""
    trace = pl.Trace("sha256:x", 0, {})
    assert trace.recording()[1] is None
    remove = add_listener(lambda e: None)
    try:
        assert trace.recording()[1] is not None
    finally:
        remove()
