"""Timers under hostile load: node-timeout lateness of canary runs while the engine takes large
definitions and a nested fan-out bomb (D6.23, D6.24).

Run: ``python bench/hostile.py --out bench/results/hostile.json`` (about a minute a repeat;
``--quick`` for a smaller run). Prints a table; writes the results only with ``--out``. In process, on SQLite: what is measured is the one
event loop that fires the timers, with the load in the same loop.

Each window starts canary runs at a steady pace; a canary's node hangs past its 300 ms timeout,
and the engine records, with the ``token_timed_out`` event, how late it noticed the deadline
(``detection_lag_ms``). Rows (p99 of that lag over the window's canaries):
- ``lateness.p99.idle``: the canaries alone: the baseline of the other rows.
- ``lateness.p99.large_definitions``: meanwhile, definitions of 1,000 nodes (the limit) are
  published one after another (each is checked in a worker thread; one of 10,000 nodes is
  refused before any check).
- ``lateness.p99.fanout_bomb``: meanwhile, runs of a ``foreach`` in a ``foreach`` over 1,000
  items start one after another; each fails at the token limit (20,000) instead of spawning a
  million tokens.
Target: at most 100 ms p99 under each load. The load average is recorded: the machine may be
shared, and the rows are only comparable with the idle row measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import Row, percentile, pick, run_bench

from timebound import workflow as wf

NOOP = {"id": "noop", "kind": "python", "implementation": {"handler": "noop"}}
CANARY = {
    "id": "canary",
    "initial_node": "a",
    "actions": [{"id": "hang", "kind": "python", "implementation": {"handler": "hang"}}],
    "nodes": [{"id": "a", "action_id": "hang", "timeout_ms": 300, "max_retries": 0}],
}
BOMB = {
    "id": "bomb",
    "initial_node": "a",
    "actions": [NOOP],
    "nodes": [{"id": n, "action_id": "noop"} for n in ("a", "b", "c")],
    "transitions": [
        {"id": "outer", "from": "a", "to": "b", "foreach": "input.items"},
        {"id": "inner", "from": "b", "to": "c", "foreach": "input.items"},
    ],
}


def noop(ctx: wf.ActionContext) -> None:
    return None


async def hang(ctx: wf.ActionContext) -> None:
    await asyncio.sleep(60)


def big_definition(version: int) -> dict[str, Any]:
    return {
        "id": "big",
        "version": version,
        "initial_node": "n0",
        "actions": [NOOP],
        "nodes": [{"id": f"n{i}", "action_id": "noop", "timeout_ms": 1000} for i in range(1000)],
    }


async def _canaries(engine: wf.Engine, count: int, gap_s: float) -> list[float]:
    ids = []
    for _ in range(count):
        ids.append(await engine.start("canary"))
        await asyncio.sleep(gap_s)
    lags = []
    for run_id in ids:
        await engine.wait(run_id)
        for event in await engine.events(run_id):
            if event["kind"] == "token_timed_out":
                lags.append(float(event["detection_lag_ms"]))
    return lags


async def _large_definitions(engine: wf.Engine, stop: asyncio.Event) -> int:
    version = 0
    while not stop.is_set():
        version += 1
        await engine.publish(big_definition(version))
    return version


async def _bombs(engine: wf.Engine, stop: asyncio.Event) -> int:
    started = 0
    while not stop.is_set():
        run_id = await engine.start("bomb", {"items": list(range(1000))})
        started += 1
        result = await engine.wait(run_id)
        assert result.status == "failed" and "too-many-tokens" in (result.error or ""), result
    return started


async def _window(db: str, load: Any, count: int) -> tuple[list[float], int]:
    engine = wf.Engine(db=db, actions={"noop": noop, "hang": hang}, concurrency=256)
    engine.register(CANARY)
    engine.register(BOMB)
    async with engine:
        stop = asyncio.Event()
        task = asyncio.create_task(load(engine, stop)) if load is not None else None
        await asyncio.sleep(0.5 if task is not None else 0)  # the load is under way
        lags = await _canaries(engine, count, 0.04)
        stop.set()
        done = 0 if task is None else await task
    return lags, done


def measure(args: argparse.Namespace) -> list[Row]:
    count = pick(args, 100, 30, 3)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        idle, _ = asyncio.run(_window(f"sqlite:///{Path(tmp)}/idle.db", None, count))
        base = percentile(idle, 99)
        rows.append(Row("lateness.p99.idle", base, "ms"))
        for name, load in (("large_definitions", _large_definitions), ("fanout_bomb", _bombs)):
            lags, done = asyncio.run(_window(f"sqlite:///{Path(tmp)}/{name}.db", load, count))
            p99 = percentile(lags, 99)
            rows.append(
                Row(
                    f"lateness.p99.{name}",
                    p99,
                    "ms",
                    baseline="lateness.p99.idle",
                    baseline_value=base,
                    target="<= 100 ms",
                    passed=p99 <= 100,
                )
            )
            rows.append(Row(f"load_units.{name}", float(done), "definitions or bomb runs"))
    return rows


if __name__ == "__main__":
    sys.exit(run_bench("hostile", __doc__, measure))
