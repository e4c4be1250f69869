"""Constellation runtime overhead: a program's module calls vs the same functions called directly
under the same policies.

Run: ``python bench/dsl.py --out bench/results/dsl.json`` (about 10-20 seconds a repeat). Prints
a table; writes the results only with ``--out``. Each scenario runs one program whose calls all carry the same options
and a baseline that awaits ``Policy.execute`` for the same functions with equal policies (one per
call site, as the runtime builds them), in the same process, interleaved; the ratio of per-call
times is judged against the target (<= 1.5x).

Scenarios:
- ``chain``: 50 dependent calls (``y2 = F(y1) with ...``), the sequential path;
- ``fanout``: 50 independent calls plus one consumer, run concurrently; the baseline gathers the
  same 50 policy executions as tasks;
- ``plain``: 50 dependent calls without options (no policy on either side) - reported for
  reference: there the "call" is a bare ``await fn(x)`` and any runtime is a large multiple of it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from _common import US, Row, interleave, pick, run_bench

from timebound.dsl import ModuleRegistry, Program, compile
from timebound.policies import Policy

ROUNDS = 9
RUNS = 200  # program runs per timed batch (both set per tier)
CALLS = 50  # module calls per program run
TARGET = 1.5

OPTIONS = "timeout: 1s, retry: 2, delay: 10ms"


async def work(x: int) -> int:
    """The module: as cheap as possible, so the measured cost is the machinery's."""
    return x + 1


def _registry() -> ModuleRegistry:
    r = ModuleRegistry()
    r.register("Work", work)
    return r


def _chain(options: str) -> str:
    with_clause = f" with {options}" if options else ""
    lines = ["in x: Int", f"y0 = Work(x){with_clause}"]
    lines += [f"y{i} = Work(y{i - 1}){with_clause}" for i in range(1, CALLS)]
    lines.append(f"out y{CALLS - 1}")
    return "\n".join(lines)


def _fanout(options: str) -> str:
    lines = ["in x: Int"]
    lines += [f"y{i} = Work(x + {i}) with {options}" for i in range(CALLS)]
    lines.append("total = " + " + ".join(f"y{i}" for i in range(CALLS)))
    lines.append("out total")
    return "\n".join(lines)


def _policies() -> list[Policy]:
    return [Policy("Work", timeout=1.0, retry=2, delay=0.01) for _ in range(CALLS)]


def _timed(
    loop: asyncio.AbstractEventLoop, body: Callable[[], Awaitable[Any]]
) -> Callable[[], float]:
    async def batch() -> float:
        # CPU time of this process: the work is CPU-bound and single-threaded, and on a shared
        # machine other processes' load would otherwise land in one variant's wall time.
        t = time.process_time()
        for _ in range(RUNS):
            await body()
        return time.process_time() - t

    return lambda: loop.run_until_complete(batch())


def _compare(
    loop: asyncio.AbstractEventLoop,
    rows: list[Row],
    metric: str,
    baseline: str,
    runtime: Callable[[], Awaitable[Any]],
    direct: Callable[[], Awaitable[Any]],
) -> None:
    """Check both variants agree, time them interleaved, and add the per-call row."""
    assert loop.run_until_complete(runtime()) == loop.run_until_complete(direct())
    times = interleave(
        {"direct": _timed(loop, direct), "runtime": _timed(loop, runtime)},
        rounds=ROUNDS,
        n=RUNS * CALLS,
    )
    rows.append(
        Row(
            metric,
            times["runtime"] * US,
            "us",
            baseline,
            times["direct"] * US,
            f"<= {TARGET}x",
            times["runtime"] <= TARGET * times["direct"],
        )
    )


def bench_chain(loop: asyncio.AbstractEventLoop, rows: list[Row]) -> None:
    program: Program = compile(_chain(OPTIONS), modules=_registry())
    policies = _policies()

    async def runtime() -> Any:
        return await program.run({"x": 0})

    async def direct() -> Any:
        v = 0
        for p in policies:
            v = await p.execute(work, (v,))
        return {f"y{CALLS - 1}": v}

    _compare(
        loop, rows, "dsl.chain.per_call", "Policy.execute awaited in sequence", runtime, direct
    )


def bench_fanout(loop: asyncio.AbstractEventLoop, rows: list[Row]) -> None:
    program = compile(_fanout(OPTIONS), modules=_registry())
    policies = _policies()

    async def runtime() -> Any:
        return await program.run({"x": 0})

    async def direct() -> Any:
        values = await asyncio.gather(*(p.execute(work, (i,)) for i, p in enumerate(policies)))
        return {"total": sum(values)}

    _compare(loop, rows, "dsl.fanout.per_call", "asyncio.gather of Policy.execute", runtime, direct)


def bench_plain(loop: asyncio.AbstractEventLoop, rows: list[Row]) -> None:
    program = compile(_chain(""), modules=_registry())

    async def runtime() -> Any:
        return await program.run({"x": 0})

    async def direct() -> Any:
        v = 0
        for _ in range(CALLS):
            v = await work(v)
        return {f"y{CALLS - 1}": v}

    assert loop.run_until_complete(runtime()) == loop.run_until_complete(direct())
    times = interleave(
        {"direct": _timed(loop, direct), "runtime": _timed(loop, runtime)},
        rounds=ROUNDS,
        n=RUNS * CALLS,
    )
    rows.append(
        Row(
            "dsl.plain.per_call",
            times["runtime"] * US,
            "us",
            "await fn(x) (no policy)",
            times["direct"] * US,
        )
    )
    rows.append(
        Row(
            "dsl.plain.overhead_per_call",
            (times["runtime"] - times["direct"]) * US,
            "us",
        )
    )


def measure(args: argparse.Namespace) -> list[Row]:
    global ROUNDS, RUNS
    ROUNDS, RUNS = pick(args, (9, 200), (3, 40), (1, 4))
    rows: list[Row] = []
    loop = asyncio.new_event_loop()
    try:
        bench_chain(loop, rows)
        bench_fanout(loop, rows)
        bench_plain(loop, rows)
    finally:
        loop.close()
    return rows


if __name__ == "__main__":
    title = f"Constellation runtime, {CALLS} calls per run, options: {OPTIONS}"
    sys.exit(run_bench("dsl", __doc__, measure, title=title))
