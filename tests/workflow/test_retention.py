"""Retention (D8.13): runs that ended longer ago than ``retain`` are deleted with their events,
in bounded batches; live runs, and ended children of live parents, are never touched."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf
from timebound.host._config import ConfigError, load_config
from timebound.workflow._retention import prune_ended_runs

from .test_engine import HANDLERS, definition

HOUR = 3600


def _family() -> list[dict[str, Any]]:
    """``wf``: P calls ``child`` (which ends at once), then Q sleeps ``input.Q`` seconds."""
    parent = definition(
        [{"id": "P", "action_id": "call"}, {"id": "Q"}],
        [{"id": "pq", "from": "P", "to": "Q"}],
        timeout_ms=100 * HOUR * 1000,
    )
    parent["actions"].append(
        {"id": "call", "kind": "workflow_call", "implementation": {"workflow_def_id": "child"}}
    )
    return [definition([{"id": "X"}], id="child"), parent]


async def _exists(engine: wf.Engine, run_id: str) -> bool:
    try:
        await engine.get_run(run_id)
    except KeyError:
        return False
    return True


async def test_ended_runs_are_pruned_after_the_period_and_live_ones_never(
    virtual_clock: Any, make_engine: Any
) -> None:
    """After 10 min an ended run is gone (row, tokens, events) while a live run, and the ended
    child it called, stay; once the parent ends and 10 min pass, both go. Tallies stay."""
    timed_out = definition([{"id": "A", "timeout_ms": 1000}], id="slow")
    # Long sweeps and leases: on PostgreSQL (autojump waits 0.25 s of real quiet before each
    # leap) the virtual half hour is a few dozen leaps, one per pruning round.
    quiet = {"sweep": 600, "lease": 30 * HOUR}
    async with make_engine(HANDLERS, *_family(), timed_out, retain="10min", **quiet) as engine:
        ended = await engine.start("slow", {"A": 60})
        assert (await engine.wait(ended)).status == "failed"
        tallies = await engine.timeout_tallies()
        live = await engine.start("wf", {"X": 0, "Q": 1800})
        await asyncio.sleep(10)
        (call, _) = await engine.tokens(live)
        child = call["child_run_id"]
        assert (await engine.get_run(child))["status"] == "completed"

        await asyncio.sleep(600 + 120)  # the pruning loop ran meanwhile (every minute)
        assert not await _exists(engine, ended)
        assert await engine.events(ended) == [] and await engine.tokens(ended) == []
        assert await _exists(engine, live) and await _exists(engine, child)
        assert await engine.timeout_tallies() == tallies

        assert (await engine.wait(live)).status == "completed"
        await asyncio.sleep(600 + 120)
        assert not await _exists(engine, live) and not await _exists(engine, child)


async def test_pruning_goes_in_bounded_batches_and_keeps_the_boundary(
    virtual_clock: Any, make_engine: Any
) -> None:
    """Five runs ended before the cut go two at a time (2, 2, 1, 0); a run that ended exactly
    at the cut is kept (older than the period means strictly before)."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        ids = [await engine.start("wf", {"A": 1}) for _ in range(6)]
        for run_id in ids:
            await engine.wait(run_id)
        finished = [(await engine.get_run(r))["finished_at"] for r in ids]
        await asyncio.sleep(5)
        last = await engine.start("wf", {"A": 1})
        await engine.wait(last)
        cut = (await engine.get_run(last))["finished_at"]
        store = engine._store
        runs = [(await prune_ended_runs(store, cut, batch=2)).runs for _ in range(5)]
        assert runs == [2, 2, 2, 0, 0]
        assert all(f < cut for f in finished)
        assert await _exists(engine, last)
        assert (await prune_ended_runs(store, cut + 1, batch=2)).runs == 1


async def test_a_run_with_a_huge_history_goes_in_bounded_transactions(
    virtual_clock: Any, make_engine: Any
) -> None:
    """A fan-out run's events and tokens are deleted at most ``max_rows`` per transaction,
    events first, and its row only once nothing of it is left."""
    fan = definition(
        [{"id": "A"}, {"id": "B"}],
        [{"id": "f", "from": "A", "to": "B", "foreach": "input.items"}],
    )
    async with make_engine(HANDLERS, fan) as engine:
        run_id = await engine.start("wf", {"items": [0] * 12})
        await engine.wait(run_id)
        events, tokens = len(await engine.events(run_id)), len(await engine.tokens(run_id))
        cut = (await engine.get_run(run_id))["finished_at"] + 1
        steps = []
        while not steps or steps[-1].runs == 0:
            steps.append(await prune_ended_runs(engine._store, cut, max_rows=10))
            assert await _exists(engine, run_id) == (steps[-1].runs == 0)
    assert events + tokens > 30
    assert all(s.rows == 10 for s in steps[:-1]) and steps[-1].rows <= 10 + 1
    assert sum(s.rows for s in steps) == events + tokens + 1  # and the run's own row


async def test_prune_now_needs_a_retention_period(virtual_clock: Any, make_engine: Any) -> None:
    """engine.prune() runs a round on demand, and says so clearly when retain is not set."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with pytest.raises(tb.ConfigurationError, match="retain"):
            await engine.prune()
    quiet = {"sweep": 600, "lease": 30 * HOUR}
    async with make_engine(HANDLERS, definition([{"id": "A"}]), retain="1min", **quiet) as engine:
        run_id = await engine.start("wf", {"A": 1})
        await engine.wait(run_id)  # ended at t = 1 s; the loop's rounds run at 0 s, 60 s, 120 s
        assert await engine.prune() == 0
        await asyncio.sleep(61)  # t = 62 s: it ended 61 s ago
        assert await engine.prune() == 1 and not await _exists(engine, run_id)


@pytest.mark.parametrize("bad", ["0s", "5s", "soon", "-1d", "inf"])
def test_the_host_refuses_a_bad_retention_period(bad: str) -> None:
    """--retain takes a duration of at least a minute, or never; anything else names retain."""
    with pytest.raises(ConfigError, match=r"retain \(command line\)"):
        load_config({"retain": bad})


def test_the_host_keeps_a_week_by_default() -> None:
    """7 days unless told otherwise; 'never' keeps every run."""
    assert load_config({}).retain == 7 * 86_400
    assert load_config({"retain": "30d"}).retain == 30 * 86_400
    assert load_config({"retain": "never"}).retain == float("inf")
    with pytest.raises(tb.ConfigurationError, match="retain"):
        wf.Engine(db="sqlite:///unused.db", retain=float("inf"))


def test_serve_takes_retain_on_the_command_line(tmp_path: Any) -> None:
    """`timebound serve --retain` is checked like the other options: a bad one exits 2 naming it."""
    import subprocess
    import sys

    def check(value: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "timebound", "serve", "--db", f"sqlite:///{tmp_path}/h.db",
             "--retain", value, "--check"],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip

    bad, good = check("5s"), check("30d")
    assert bad.returncode == 2 and "retain (command line)" in bad.stderr
    assert good.returncode == 0, good.stderr
