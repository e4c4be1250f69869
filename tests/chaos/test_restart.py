"""One engine across a server restart: connections dropped mid-work, the engine carries on."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest

from timebound import workflow as wf

from .conftest import Cluster

pytestmark = pytest.mark.asyncio_real

DEFINITION: dict[str, Any] = {
    "id": "held",
    "timeout_ms": 60_000,
    "initial_node": "A",
    "actions": [{"id": "hold", "kind": "python", "implementation": {"handler": "hold"}}],
    "nodes": [{"id": "A", "action_id": "hold"}, {"id": "B", "action_id": "hold"}],
    "transitions": [{"id": "ab", "from": "A", "to": "B"}],
}


async def test_engine_in_flight_work_survives_a_server_restart(chaos_cluster: Cluster) -> None:
    """A restart while an attempt runs (and its lease is being renewed) does not stop the loop:
    the attempt's result is stored and the run completes once the server is back."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def hold(ctx: wf.ActionContext) -> str:
        entered.set()
        await release.wait()
        return ctx.node_id

    url = f"{chaos_cluster.dsn}?schema=tbchaos_{uuid.uuid4().hex[:12]}"
    # A short lease: the loop renews it every 100 ms, so renewals meet the dead connections.
    engine = wf.Engine(db=url, actions={"hold": hold}, lease="300ms", sweep="50ms")
    engine.register(DEFINITION)
    async with engine:
        run_id = await engine.start("held")
        await asyncio.wait_for(entered.wait(), 30)
        restarted = threading.Event()
        thread = threading.Thread(target=lambda: (chaos_cluster.restart(), restarted.set()))
        thread.start()
        while not restarted.is_set():  # the loop keeps turning (and failing) meanwhile
            await asyncio.sleep(0.05)
        thread.join()
        release.set()
        result = await engine.wait(run_id, timeout=30)
    assert result.status == "completed", result
