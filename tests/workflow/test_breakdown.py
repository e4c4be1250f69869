"""A timed-out workflow node or run stores where its budget went with its event (D13)."""

from __future__ import annotations

import asyncio
from typing import Any

import timebound as tb
from timebound import workflow as wf
from timebound.policies import Policy

from .test_engine import HANDLERS, by_kind, definition

flaky = Policy("database", timeout="300ms", retry=9, delay="100ms")


async def _dependency() -> None:
    await asyncio.sleep(3600)


async def retrying(ctx: wf.ActionContext) -> Any:
    await asyncio.sleep(0.05)
    return await flaky.execute(_dependency)


def _adds_up(bd: tb.Breakdown) -> None:
    for _, p in bd.walk():
        if p.parts and "parallel" not in (p.outcome or ""):
            assert abs(sum(c.elapsed_ms for c in p.parts) - p.elapsed_ms) < 1e-3


async def test_a_node_timeout_stores_its_attempts(virtual_clock, make_engine) -> None:
    d = definition([{"id": "A", "timeout_ms": 1000}])
    d["actions"].append({"id": "retry", "kind": "python", "implementation": {"handler": "r"}})
    d["nodes"][0]["action_id"] = "retry"
    async with make_engine({**HANDLERS, "r": retrying}, d) as engine:
        run_id = await engine.start("wf", {})
        await engine.wait(run_id)
        for _ in range(100):
            # The attempt's report may be stored a turn after the run ended (D10.3).
            events = await engine.events(run_id)
            if any("breakdown" in e for e in events):
                break
            await asyncio.sleep(0.01)
    (timed_out,) = by_kind(events, "token_timed_out")
    # The node's timer records the timeout; the attempt it cut says where its budget went, in
    # the timed-out event when it reported first, else in the attempt_breakdown that follows.
    (event,) = [timed_out] if "breakdown" in timed_out else by_kind(events, "attempt_breakdown")
    assert event["token_id"] == timed_out["token_id"]
    bd = tb.Breakdown.from_dict(event["breakdown"])
    assert bd.elapsed_ms == 1000
    _adds_up(bd)
    kinds = [p.kind for p in bd.parts]
    assert kinds.count("attempt") == 3 and kinds.count("backoff") == 2, bd.render()
    assert bd.parts[0].offset_ms == 50  # after the handler's own 50 ms


async def test_a_run_timeout_stores_its_nodes(virtual_clock, make_engine) -> None:
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 0.3, "B": 3600}, deadline="1s")
        await engine.wait(run_id)
        events = await engine.events(run_id)
    (event,) = by_kind(events, "token_timed_out")
    assert event["timeout_type"] == "workflow"
    bd = tb.Breakdown.from_dict(event["breakdown"])
    assert bd.name == "workflow" and bd.elapsed_ms == 1000
    _adds_up(bd)
    nodes = [(p.name, p.outcome) for p in bd.parts if p.kind == "node"]
    assert nodes == [("A", "completed"), ("B", "cut")], bd.render()
    assert next(p for p in bd.parts if p.name == "A").elapsed_ms >= 300
