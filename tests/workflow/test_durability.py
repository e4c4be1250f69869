"""Timers re-armed from storage at start-up (D6.6), in-flight work re-dispatched, one writer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from timebound import workflow as wf
from timebound._store import StoreBusy

from .test_engine import HANDLERS, by_kind, definition, fan, join


def _fan_in(timeout_ms: int) -> dict:
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [
            fan(foreach="input.items"),
            join(timeout_ms=timeout_ms, on_timeout="proceed_with_available"),
        ],
    )
    del d["transitions"][0]["spawn_count"]
    return d


async def test_fan_in_timer_is_rearmed_from_storage(virtual_clock, make_engine) -> None:
    """A fan-in that waited 0.5 s of its 2 s before a restart waits 1.5 s more, not 2 s."""
    d = _fan_in(2000)
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"items": [0.5, 60]})
        await asyncio.sleep(1.0)  # first arrival at 0.5 s; stop half-way through the wait
    await asyncio.sleep(5.0)  # the engine is down; its timer must not be lost or restarted
    async with make_engine(HANDLERS, d) as engine:
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        events = await engine.events(run_id)
    (timed_out,) = by_kind(events, "join_timed_out")
    assert timed_out["deadline_at"] - row["started_at"] == 2500
    # Detected as soon as the engine is back (it was down at the deadline), lag recorded.
    assert timed_out["at_epoch_ms"] - row["started_at"] == 6000
    assert timed_out["detection_lag_ms"] == 3500
    assert [r["branch"] for r in result.output["results"]] == [0]


async def test_node_timer_is_rearmed_and_never_extended(virtual_clock, make_engine) -> None:
    """A node in flight at a restart is re-dispatched with its stored deadline, not a fresh one."""
    d = definition([{"id": "A", "timeout_ms": 3000}])
    async with make_engine(HANDLERS, d, lease="500ms") as engine:
        run_id = await engine.start("wf", {"A": 60})
        await asyncio.sleep(1.0)
    async with make_engine(HANDLERS, d, lease="500ms") as engine:
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        events = await engine.events(run_id)
    assert result.status == "failed"
    assert [e["kind"] for e in events].count("token_redispatched") == 1
    (timed_out,) = by_kind(events, "token_timed_out")
    assert timed_out["at_epoch_ms"] - row["started_at"] == 3000


async def test_workflow_timer_is_rearmed_from_storage(virtual_clock, make_engine) -> None:
    """The run's timeout survives a restart at its original instant."""
    d = definition([{"id": "A"}], timeout_ms=4000)
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await asyncio.sleep(1.0)
    async with make_engine(HANDLERS, d) as engine:
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
    assert result.status == "timed_out" and row["finished_at"] - row["started_at"] == 4000


async def test_a_second_sqlite_writer_is_refused(virtual_clock, tmp_path: Path) -> None:
    """SQLite has one writer process: a second engine on the file gets StoreBusy at once."""
    url = f"sqlite:///{tmp_path}/runs.db"
    async with wf.Engine(db=url):
        with pytest.raises(StoreBusy, match="use PostgreSQL"):
            async with wf.Engine(db=url):
                pass
