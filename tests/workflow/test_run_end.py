"""A run's end cancels its live tokens in bulk past a few (D6.24a), on SQLite and PostgreSQL:
every live token ends cancelled, the running attempts stop, a late answer is discarded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from timebound import workflow as wf
from timebound.workflow._machine import BULK_CANCEL_AFTER

from .test_engine import definition


def _wide(fid: str = "wf") -> dict[str, Any]:
    d = definition(
        [{"id": "A", "action_id": "quick"}, {"id": "B", "action_id": "stubborn"}],
        [{"id": "fan", "from": "A", "to": "B", "foreach": "input.items"}],
        id=fid,
    )
    d["actions"] = [
        {"id": "quick", "kind": "python", "implementation": {"handler": "quick"}},
        {"id": "stubborn", "kind": "python", "implementation": {"handler": "stubborn"}},
    ]
    return d


@pytest.mark.parametrize("width", [BULK_CANCEL_AFTER + 3, 150])  # 2 running, the rest idle
async def test_cancelling_a_wide_run_ends_every_live_token(
    virtual_clock, make_engine, width: int
) -> None:
    """A cancelled run with more idle tokens than the bulk threshold: every token ends
    cancelled, the two running attempts are stopped, their late answers are discarded, and
    one ``tokens_cancelled`` event counts the idle ones."""
    started: list[str] = []
    stopped: list[str] = []

    def quick(ctx: wf.ActionContext) -> None:
        return None

    async def stubborn(ctx: wf.ActionContext) -> str:
        started.append(ctx.token_id)
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            stopped.append(ctx.token_id)
            return "late"  # swallows the cancellation: its answer comes after the end
        return "on time"

    actions = {"quick": quick, "stubborn": stubborn}
    async with make_engine(actions, _wide(), concurrency=2) as engine:
        run_id = await engine.start("wf", {"items": list(range(width))})
        while len(started) < 2:
            await asyncio.sleep(0.01)
        assert await engine.cancel(run_id)
        result = await engine.wait(run_id, timeout=60)
        await asyncio.sleep(1)  # the late answers reach the engine and are discarded
        _, tokens, events = await engine.snapshot(run_id)
    assert result.status == "cancelled"
    assert sorted(stopped) == sorted(started)
    fanned = [t for t in tokens if t["node_id"] == "B"]
    assert len(fanned) == width
    assert {t["status"] for t in fanned} == {"cancelled"}
    assert not [e for e in events if e["kind"] == "token_completed" and e["node_id"] == "B"]
    bulk = [e for e in events if e["kind"] == "tokens_cancelled"]
    assert [(e["count"], e["reason"]) for e in bulk] == [(width - 2, "run_cancelled")]
    one_by_one = {e["token_id"] for e in events if e["kind"] == "token_cancelled"}
    assert one_by_one == set(started)


async def test_cancelling_a_narrow_run_records_each_token(virtual_clock, make_engine) -> None:
    """At most the threshold of idle tokens: each ends with its own ``token_cancelled``."""
    started: list[str] = []

    def quick(ctx: wf.ActionContext) -> None:
        return None

    async def stubborn(ctx: wf.ActionContext) -> None:
        started.append(ctx.token_id)
        await asyncio.sleep(60)

    width = 12
    async with make_engine({"quick": quick, "stubborn": stubborn}, _wide(), concurrency=2) as e:
        run_id = await e.start("wf", {"items": list(range(width))})
        while len(started) < 2:
            await asyncio.sleep(0.01)
        await e.cancel(run_id)
        await e.wait(run_id, timeout=60)
        _, tokens, events = await e.snapshot(run_id)
    assert {t["status"] for t in tokens if t["node_id"] == "B"} == {"cancelled"}
    cancelled = [e for e in events if e["kind"] == "token_cancelled"]
    assert len(cancelled) == width
    assert not [e for e in events if e["kind"] == "tokens_cancelled"]
