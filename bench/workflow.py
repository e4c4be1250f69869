"""Durable workflows: steps per second, timeout detection lag, dead-worker takeover, restart.

Run: ``python bench/workflow.py --out bench/results/workflow.json`` (about a minute a repeat;
``--quick`` for a smaller run; ``--smoke`` leaves out DBOS and the multi-process rows). Prints
a table; writes the results only with ``--out``. Needs PostgreSQL at 127.0.0.1:5432 for the PostgreSQL
rows and ``dbos`` (the ``bench`` extra) for the baseline; rows that cannot run are reported
missing, never invented.

Rows:
- ``steps_per_s.*``: the same 10-step workflow (each step a trivial python action), on SQLite
  with ``synchronous=FULL`` and ``NORMAL`` and on PostgreSQL (one worker), two ways: many runs
  started at once (``RUNS`` in flight), and ``*_one_run``: one run at a time, each started and
  waited for before the next (a request that starts a run and waits for it: every step waits
  for its own commit). Baseline: DBOS (the ``dbos`` package) running the same 10-step workflow
  on the same PostgreSQL server, in a child process, the same two ways (``dbos.*`` rows; all at
  once with as many executor threads as runs in flight), measured in every repeat.
- ``timeout_lag.*``: 1,000 node timeouts at instants spread over two seconds (SQLite, FULL); lag
  from each deadline to its stored ``timed_out`` and event (the engine records it in the event),
  p50 and p99; ``early`` counts detections before the deadline (must be 0).
- ``dead_worker_lag.p99``: PostgreSQL, a worker stops with 100 tokens in flight; a second worker
  enforces their node deadlines; lag from deadline to detection.
- ``restart_to_redispatch``: SQLite, a process restarts with a node in flight; time from opening
  the engine to the node's handler running again.
- Multi-process rows (real ``timebound worker`` processes on PostgreSQL, see
  ``_workflow_workers.py``): cancel and join decision to the handler stopped on another worker,
  the time to flip the state apart from the time to stop the work, a killed worker's step re-run
  by a survivor, and steps/s with 1, 2 and 4 worker processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _workflow_workers
from _common import Row, percentile, pick, run_bench

from timebound import workflow as wf

# Set per tier by measure(): runs in flight for the throughput rows, node timeouts measured.
QUICK = False
RUNS = 200
TIMEOUTS = 1000
SEQUENTIAL = 20  # runs one at a time
DEAD = 100  # tokens in flight when a worker stops
PG_DSN = "postgresql://postgres@127.0.0.1:5432/test"

TEN_STEPS: dict[str, Any] = {
    "id": "ten",
    "initial_node": "s0",
    "actions": [{"id": "step", "kind": "python", "implementation": {"handler": "step"}}],
    "nodes": [{"id": f"s{i}", "action_id": "step"} for i in range(10)],
    "transitions": [{"id": f"t{i}", "from": f"s{i}", "to": f"s{i + 1}"} for i in range(9)],
}


async def step(ctx: wf.ActionContext) -> int:
    return ctx.attempt


async def hang(ctx: wf.ActionContext) -> None:
    await asyncio.sleep(3600)


async def _throughput(url: str, runs: int) -> float:
    engine = wf.Engine(db=url, actions={"step": step}, concurrency=max(runs, 1))
    engine.register(TEN_STEPS)
    async with engine:
        await engine.wait(await engine.start("ten"))  # warm up
        started = time.perf_counter()
        ids = await asyncio.gather(*(engine.start("ten") for _ in range(runs)))
        for run_id in ids:
            result = await engine.wait(run_id)
            assert result.status == "completed", result
        elapsed = time.perf_counter() - started
    return runs * 10 / elapsed


async def _sequential(url: str, runs: int) -> float:
    engine = wf.Engine(db=url, actions={"step": step})
    engine.register(TEN_STEPS)
    async with engine:
        started = time.perf_counter()
        for _ in range(runs):
            await engine.wait(await engine.start("ten"))
        elapsed = time.perf_counter() - started
    return runs * 10 / elapsed


def _dbos_child(db_url: str, runs: int) -> None:
    """In a child process (DBOS is a process-wide singleton): steps/s of the same workflow,
    ``SEQUENTIAL`` runs one at a time, then ``runs`` at once."""
    from dbos import DBOS

    @DBOS.step()
    def dbos_step(x: int) -> int:
        return x + 1

    @DBOS.workflow()
    def ten() -> int:
        x = 0
        for _ in range(10):
            x = dbos_step(x)
        return x

    DBOS(config={"name": "bench", "system_database_url": db_url,
                 "run_admin_server": False, "max_executor_threads": runs})  # fmt: skip
    DBOS.launch()
    ten()  # warm up
    started = time.perf_counter()
    for _ in range(SEQUENTIAL):
        ten()
    one = SEQUENTIAL * 10 / (time.perf_counter() - started)
    started = time.perf_counter()
    handles = [DBOS.start_workflow(ten) for _ in range(runs)]
    for h in handles:
        h.get_result()
    many = runs * 10 / (time.perf_counter() - started)
    DBOS.destroy()
    print(json.dumps({"one_run": one, "all_at_once": many}))


def _dbos(runs: int) -> dict[str, float] | None:
    """DBOS's steps/s on the PostgreSQL server the PostgreSQL rows use, in a database of its
    own (one run at a time and ``runs`` at once)."""
    try:
        import dbos  # noqa: F401
    except ImportError:
        print(
            "dbos is not installed (pip install 'timebound[bench]'): no baseline", file=sys.stderr
        )
        return None
    if _pg_url() is None:
        return None
    import asyncpg

    name = f"tbbench_dbos_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        proc = subprocess.run(
            [sys.executable, __file__, "--dbos-child", f"{PG_DSN.rsplit('/', 1)[0]}/{name}",
             str(runs), str(SEQUENTIAL)],
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            return {k: float(v) for k, v in json.loads(line).items()}
    print(proc.stderr[-2000:], file=sys.stderr)
    return None


def _rate(name: str, rate: float, dbos: float | None, ratio: float, floor: float | None) -> Row:
    """A steps/s row against DBOS on the same PostgreSQL, with its targets."""
    checks, targets = [], []
    if floor is not None:
        checks.append(rate >= floor)
        targets.append(f">= {floor:g}")
    if dbos is not None:
        checks.append(rate >= ratio * dbos)
        targets.append(f">= {ratio:g}x DBOS")
    base = None if dbos is None else "DBOS, same PostgreSQL, same workflow"
    return Row(f"steps_per_s.{name}", rate, "steps/s", base, dbos,
               "; ".join(targets) or None, all(checks) if checks else None)  # fmt: skip


async def _timeout_lags(url: str, n: int) -> list[int]:
    """Node timeouts at staggered instants; the engine's recorded lag for each (ms)."""
    d = {"id": "t", "initial_node": "A",
         "actions": [{"id": "h", "kind": "python", "implementation": {"handler": "hang"}}],
         "nodes": [{"id": "A", "action_id": "h"}]}  # fmt: skip
    rng = random.Random(7)
    engine = wf.Engine(db=url, actions={"hang": hang}, concurrency=n + 1)
    for i in range(n):
        # One definition version per timeout so deadlines spread over two seconds, after every
        # run has started (starting them is measured elsewhere).
        d = {**d, "version": i + 1, "nodes": [{"id": "A", "action_id": "h",
                                                "timeout_ms": 6000 + rng.randrange(2000)}]}  # fmt: skip
        engine.register(d)
    async with engine:
        ids = await asyncio.gather(*(engine.start("t", version=i + 1) for i in range(n)))
        lags = []
        for run_id in ids:
            await engine.wait(run_id)
            for e in await engine.events(run_id):
                if e["kind"] == "token_timed_out":
                    lags.append(e["detection_lag_ms"])
    return lags


async def _dead_worker_lags(url: str, n: int) -> list[int]:
    d = {"id": "dw", "initial_node": "A",
         "actions": [{"id": "h", "kind": "python", "implementation": {"handler": "hang"}}],
         "nodes": [{"id": "A", "action_id": "h", "timeout_ms": 1500}]}  # fmt: skip
    dying = wf.Engine(db=url, actions={"hang": hang}, concurrency=n + 1)
    dying.register(d)
    await dying.open()
    ids = await asyncio.gather(*(dying.start("dw") for _ in range(n)))
    await asyncio.sleep(0.5)  # every token executing
    await dying.close()  # as after a crash: tokens 'executing', nobody enforcing their timers
    survivor = wf.Engine(db=url, actions={"hang": hang})
    lags = []
    async with survivor:
        for run_id in ids:
            await survivor.wait(run_id)
            for e in await survivor.events(run_id):
                if e["kind"] == "token_timed_out":
                    lags.append(e["detection_lag_ms"])
    return lags


async def _restart(url: str) -> float:
    entered = asyncio.Event()

    async def slow(ctx: wf.ActionContext) -> None:
        entered.set()
        await asyncio.sleep(3600)

    d = {"id": "r", "initial_node": "A",
         "actions": [{"id": "h", "kind": "python", "implementation": {"handler": "slow"}}],
         "nodes": [{"id": "A", "action_id": "h"}]}  # fmt: skip
    first = wf.Engine(db=url, actions={"slow": slow})
    first.register(d)
    async with first:
        await first.start("r")
        await entered.wait()
    entered.clear()
    second = wf.Engine(db=url, actions={"slow": slow})
    started = time.perf_counter()
    await second.open()
    await entered.wait()
    elapsed = time.perf_counter() - started
    await second.close()
    return elapsed


def _pg_url() -> str | None:
    import socket

    try:
        socket.create_connection(("127.0.0.1", 5432), timeout=1).close()
    except OSError:
        print("PostgreSQL is not reachable: its rows are missing", file=sys.stderr)
        return None
    return f"{PG_DSN}?schema=tbbench_{uuid.uuid4().hex[:10]}"


def _drop(url: str) -> None:
    import asyncpg

    schema = url.rsplit("schema=", 1)[1]

    async def drop() -> None:
        conn = await asyncpg.connect(PG_DSN)
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()

    asyncio.run(drop())


def measure(args: argparse.Namespace) -> list[Row]:
    global QUICK, RUNS, TIMEOUTS, SEQUENTIAL, DEAD
    QUICK = not pick(args, True, False, False)
    RUNS, TIMEOUTS, SEQUENTIAL, DEAD = pick(
        args, (200, 1000, 20, 100), (50, 200, 20, 100), (5, 10, 2, 5)
    )
    rows: list[Row] = []
    dbos = None if args.smoke else _dbos(RUNS)
    many = None if dbos is None else dbos["all_at_once"]
    one = None if dbos is None else dbos["one_run"]
    if dbos is not None:
        rows.append(Row("dbos.steps_per_s.all_at_once", many or 0.0, "steps/s"))
        rows.append(Row("dbos.steps_per_s.one_run", one or 0.0, "steps/s"))
    with tempfile.TemporaryDirectory() as tmp:
        for sync, floor in (("FULL", 1000.0), ("NORMAL", 5000.0)):
            mode = sync.lower()
            rate = asyncio.run(_throughput(f"sqlite:///{tmp}/{mode}.db?synchronous={sync}", RUNS))
            rows.append(_rate(f"sqlite_{mode}", rate, many, 20.0, floor))
            rate = asyncio.run(
                _sequential(f"sqlite:///{tmp}/one{mode}.db?synchronous={sync}", SEQUENTIAL)
            )
            rows.append(_rate(f"sqlite_{mode}_one_run", rate, one, 10.0, None))
        lags = asyncio.run(_timeout_lags(f"sqlite:///{tmp}/lag.db", TIMEOUTS))
        rows.append(Row("timeout_lag.p50", percentile(lags, 50), "ms", target="<= 20",
                        passed=percentile(lags, 50) <= 20))  # fmt: skip
        rows.append(Row("timeout_lag.p99", percentile(lags, 99), "ms", target="<= 100",
                        passed=percentile(lags, 99) <= 100))  # fmt: skip
        early = sum(1 for lag in lags if lag < 0)
        rows.append(Row("timeout_lag.early", early, "count", target="== 0", passed=early == 0))
        restart = asyncio.run(_restart(f"sqlite:///{tmp}/restart.db"))
        rows.append(Row("restart_to_redispatch", restart * 1000, "ms", target="<= 500",
                        passed=restart <= 0.5))  # fmt: skip
    pg = _pg_url()
    if pg is not None:
        try:
            rate = asyncio.run(_throughput(pg, RUNS))
            rows.append(_rate("postgres_one_worker", rate, many, 20.0, 1000.0))
        finally:
            _drop(pg)
        pg = _pg_url()
        assert pg is not None
        try:
            rate = asyncio.run(_sequential(pg, SEQUENTIAL))
            rows.append(_rate("postgres_one_run", rate, one, 10.0, None))
        finally:
            _drop(pg)
        pg = _pg_url()
        assert pg is not None
        try:
            lags = asyncio.run(_dead_worker_lags(pg, DEAD))
            rows.append(Row("dead_worker_lag.p99", percentile(lags, 99), "ms",
                            target="<= 1500", passed=percentile(lags, 99) <= 1500))  # fmt: skip
        finally:
            _drop(pg)
        if args.smoke:
            print("--smoke: DBOS and the multi-process rows are left out")
        else:
            with tempfile.TemporaryDirectory() as tmp:
                rows += _workflow_workers.rows(_pg_url, _drop, tmp, QUICK)
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--dbos-child"]:
        SEQUENTIAL = int(sys.argv[4])
        _dbos_child(sys.argv[2], int(sys.argv[3]))
    else:
        os.chdir(Path(__file__).resolve().parent)
        sys.exit(run_bench("workflow", __doc__, measure, title="durable workflows"))
