"""``Engine.close(drain=...)``: attempts in flight may finish up to the bound, the rest are
cancelled and their tokens freed at once; on virtual time, on both stores."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from timebound import workflow as wf
from timebound.testing import VirtualClock

FLOW = {
    "id": "flow",
    "initial_node": "a",
    "actions": [{"id": "nap", "kind": "python", "implementation": {"handler": "nap"}}],
    "nodes": [{"id": "a", "action_id": "nap"}, {"id": "b", "action_id": "nap"}],
    "transitions": [{"id": "ab", "from": "a", "to": "b"}],
}


async def test_close_lets_short_attempts_finish_and_frees_the_rest(
    virtual_clock: VirtualClock, make_engine: Callable[..., wf.Engine]
) -> None:
    """With a 2 s drain, a 1 s attempt completes (its node stays done, the next one is not
    claimed), a 10 s attempt is cancelled at the bound and its token is pending with no
    lease; the close takes the bound, not the long attempt's 10 s."""
    finished: list[tuple[str, str]] = []

    async def nap(ctx: Any) -> str:
        await asyncio.sleep(ctx.input[ctx.node_id])
        finished.append((ctx.run_id, ctx.node_id))
        return "ok"

    engine = make_engine({"nap": nap}, FLOW)
    await engine.open()
    short = await engine.start("flow", {"a": 1, "b": 0})
    long = await engine.start("flow", {"a": 10, "b": 0})
    for run in (short, long):
        while [t["status"] for t in await engine.tokens(run)] != ["executing"]:
            await asyncio.sleep(0.01)
    began = virtual_clock.now()
    await engine.close(drain=2)
    took = virtual_clock.now() - began
    assert finished == [(short, "a")]
    assert 1 <= took < 2 + 0.5

    again = make_engine({"nap": nap}, FLOW)
    async with again:
        stopped = {run: await again.tokens(run) for run in (short, long)}
        for run in (short, long):
            assert (await again.wait(run, timeout=60)).status == "completed"
        events = await again.events(long)
    assert [(t["node_id"], t["status"]) for t in stopped[short]][:1] == [("a", "completed")]
    assert sorted(finished) == sorted([(short, "a"), (short, "b"), (long, "a"), (long, "b")])
    assert [e["kind"] for e in events].count("token_redispatched") == 1
