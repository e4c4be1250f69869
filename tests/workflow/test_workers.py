"""Many workers on one PostgreSQL store: leases, no double execution, a dead worker's deadlines."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from timebound import workflow as wf

from .test_engine import definition

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio_real]


def _fan(n: int, **node: Any) -> dict[str, Any]:
    d = definition(
        [{"id": "A"}, {"id": "B", **node}, {"id": "C"}],
        [
            {"id": "fan", "from": "A", "to": "B", "spawn_count": n},
            {"id": "join", "from": "B", "to": "C", "synchronization": {
                "strategy": "all", "sibling_group": "fan", "timeout_ms": 60_000,
                "merge": {"source": "_branch.output", "target": "state.r", "strategy": "append"}}},
        ],
    )  # fmt: skip
    return d


async def test_two_workers_never_run_one_attempt_twice(pg_url: str) -> None:
    """Tokens claimed with SKIP LOCKED run once each, whichever worker claims them."""
    ran: collections.Counter[tuple[str, int]] = collections.Counter()
    by_worker: collections.Counter[str] = collections.Counter()

    def handler(name: str) -> Any:
        async def work(ctx: wf.ActionContext) -> Any:
            ran[(ctx.token_id, ctx.attempt)] += 1
            by_worker[name] += 1
            await asyncio.sleep(0.01)
            return ctx.branch["index"] if ctx.branch else None

        return work

    d = _fan(30)
    one = wf.Engine(db=pg_url, actions={"sleep": handler("one"), "boom": handler("one")})
    two = wf.Engine(db=pg_url, actions={"sleep": handler("two"), "boom": handler("two")})
    one.register(d)
    two.register(d)
    async with one, two:
        run_id = await one.start("wf")
        result = await asyncio.wait_for(two.wait(run_id), 30)
    assert result.status == "completed" and result.output["r"] == list(range(30))
    assert len(ran) == 32 and set(ran.values()) == {1}


async def test_a_live_worker_enforces_a_dead_workers_deadline(pg_url: str) -> None:
    """A worker that stops mid-attempt leaves its token's deadline to a surviving worker."""
    started = asyncio.Event()

    async def hang(ctx: wf.ActionContext) -> Any:
        started.set()
        await asyncio.sleep(3600)

    d = definition([{"id": "A", "timeout_ms": 500}])
    dying = wf.Engine(db=pg_url, actions={"sleep": hang, "boom": hang})
    dying.register(d)
    survivor = wf.Engine(db=pg_url, actions={"sleep": hang, "boom": hang})
    survivor.register(d)
    await dying.open()
    run_id = await dying.start("wf")
    await asyncio.wait_for(started.wait(), 10)
    await dying.close()  # its token stays 'executing' in the store, as after a crash
    async with survivor:
        result = await asyncio.wait_for(survivor.wait(run_id), 30)
        events = await survivor.events(run_id)
    assert result == wf.RunResult("failed", None, "node 'A' timed out after 500ms")
    (timed_out,) = [e for e in events if e["kind"] == "token_timed_out"]
    assert timed_out["detection_lag_ms"] >= 0


async def test_an_expired_lease_is_redispatched_to_another_worker(pg_url: str) -> None:
    """After a dead worker's lease expires, another worker runs the token again and finishes."""
    runs: list[str] = []
    started = asyncio.Event()

    async def first(ctx: wf.ActionContext) -> Any:
        runs.append("first")
        started.set()
        await asyncio.sleep(3600)

    async def second(ctx: wf.ActionContext) -> Any:
        runs.append("second")
        return "done"

    d = definition([{"id": "A"}])
    dying = wf.Engine(db=pg_url, actions={"sleep": first, "boom": first}, lease="300ms")
    survivor = wf.Engine(db=pg_url, actions={"sleep": second, "boom": second}, lease="300ms")
    dying.register(d)
    survivor.register(d)
    await dying.open()
    run_id = await dying.start("wf")
    await asyncio.wait_for(started.wait(), 10)
    await dying.close()
    async with survivor:
        result = await asyncio.wait_for(survivor.wait(run_id), 30)
        events = await survivor.events(run_id)
    assert result.output == {"A": "done"} and runs == ["first", "second"]
    assert [e["kind"] for e in events].count("token_redispatched") == 1
