"""The workflow of the showcase (docs/workflows.md, docs/deferred.md).

``report`` has two nodes: ``render`` is a ``deferred`` action whose handler calls the render
service, which answers ``202`` with a deferred operation; the token is suspended (it holds no
worker) until the engine's poller sees the operation complete, and then resumed with the result as
the node's output; ``notify`` runs after the resume.
"""

from __future__ import annotations

from typing import Any

import httpx
from timeline import Timeline

import timebound as tb
from timebound import workflow as wf
from timebound.deferred import HostPolicy, HttpConnector

DEFINITION: dict[str, Any] = {
    "id": "report",
    "timeout_ms": 20_000,
    "initial_node": "render",
    "actions": [
        {
            "id": "render",
            "kind": "deferred",
            "implementation": {"handler": "start_render", "module": "render-service"},
        },
        {"id": "notify", "kind": "python", "implementation": {"handler": "notify"}},
    ],
    "nodes": [
        {"id": "render", "action_id": "render", "timeout_ms": 10_000},
        {"id": "notify", "action_id": "notify", "timeout_ms": 1_000},
    ],
    "transitions": [{"id": "done", "from": "render", "to": "notify"}],
}


def engine(tl: Timeline, db: str, render_url: str) -> tuple[wf.Engine, httpx.AsyncClient]:
    """A workflow engine on SQLite whose ``render`` node reaches the render service."""
    from timebound.propagation.httpx import AsyncDeadlineTransport

    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(), base_url=render_url, timeout=5)

    async def start_render(ctx: Any) -> Any:
        tl.say(
            "workflow", f"node render starts, node deadline leaves {tb.remaining() * 1000:.0f} ms"
        )
        answer = await client.post("/v1/operations/report.render", json={"pages": 2})
        tl.say(
            "workflow",
            f"render service answered {answer.status_code} (deferred, retry after "
            f"{answer.headers.get('retry-after')} s): token suspended",
        )
        return answer.json()

    async def notify(ctx: Any) -> str:
        tl.say("workflow", f"token resumed: node notify sees render={ctx.state['render']}")
        return "sent"

    eng = wf.Engine(
        db=db,
        actions={"start_render": start_render, "notify": notify},
        deferred_policy=HostPolicy(jitter=False),
        deferred_connectors={"render-service": HttpConnector(render_url, client)},
    )
    eng.register(DEFINITION)
    return eng, client
