"""One trace across processes, shared by the span tests (in-memory exporter, and OTLP over gRPC
to a receiver): a request served by uvicorn through timebound's ASGI middleware starts a workflow
run whose node defers to an operation of a deferred service running in another process."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from timebound import workflow as wf
from timebound.deferred import HostPolicy, HttpConnector
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["deferred_service", "free_port", "request_through_a_node_to_an_operation"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def deferred_service(folder: Path) -> Iterator[str]:
    """The deferred-operation service running in a uvicorn process of its own; its URL."""
    port = free_port()
    env = {**os.environ, "TB_SERVICE_DB": str(folder / "service.db")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.telemetry._deferred_service:app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # until it answers (a loaded machine starts it slowly)
            try:
                httpx.get(f"{url}/v1/operations/none", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    raise AssertionError("the service process exited") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


DEFINITION = {
    "id": "report",
    "initial_node": "A",
    "actions": [{"id": "render", "kind": "deferred",
                 "implementation": {"handler": "start_render", "module": "svc"}}],
    "nodes": [{"id": "A", "action_id": "render", "timeout_ms": 60_000}],
}  # fmt: skip


async def request_through_a_node_to_an_operation(folder: Path, service: str) -> str:
    """POST to a uvicorn server whose handler starts a run; its node A calls ``service`` (an
    outgoing request propagating its budget) and waits on the operation that call started.
    Returns the run's id once it completed (with whatever exporter the caller installed)."""

    async def start_render(ctx: Any) -> Any:
        transport = AsyncDeadlineTransport(timeout=30)
        async with httpx.AsyncClient(base_url=service, transport=transport) as client:
            r = await client.post("/v1/operations/report.render", json={"pages": 3})
            return r.json()

    engine = wf.Engine(
        db=f"sqlite:///{folder / 'runs.db'}",
        actions={"start_render": start_render},
        deferred_policy=HostPolicy(jitter=False),
        deferred_connectors={"svc": HttpConnector(service)},
    )
    engine.register(DEFINITION)

    async def front(scope: Any, receive: Any, send: Any) -> None:
        run_id = await engine.start("report", {})
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": run_id.encode()})

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(DeadlineMiddleware(front), port=port, log_level="warning", lifespan="off")
    )
    async with engine:
        serving = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient() as client:
                answer = await client.post(f"http://127.0.0.1:{port}/reports")
            run_id = answer.text
            result = await engine.wait(run_id, timeout=60)
        finally:
            server.should_exit = True
            await serving
    assert result.status == "completed", result
    return run_id
