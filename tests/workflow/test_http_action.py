"""http_request actions against a real uvicorn server: the node's budget travels on the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.propagation.http.conftest import ServerThread
from timebound import workflow as wf

pytestmark = pytest.mark.asyncio_real

TIMEOUT_HEADER = b"x-yataxi-client-timeoutms"


class App:
    """Records the deadline header; /ok echoes, /slow hangs, /fail answers 500, /bare 498 alone,
    /marked 498 with the remote expiry marker (a downstream that says its budget ran out)."""

    def __init__(self) -> None:
        self.headers: list[str | None] = []
        self.bodies: list[Any] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.headers.append(dict(scope["headers"]).get(TIMEOUT_HEADER, b"").decode() or None)
        self.bodies.append(json.loads(body or b"null"))
        path = scope["path"]
        if path == "/slow":
            await asyncio.sleep(30)
        status = {"/bare": 498, "/marked": 498, "/fail": 500}.get(path, 200)
        headers = [(b"content-type", b"application/json")]
        if path == "/marked":
            headers.append((b"x-yataxi-deadline-expired", b"1"))
        payload = json.dumps({"seen": self.bodies[-1]["input"]}).encode()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture
def server() -> Iterator[tuple[App, str]]:
    app = App()
    with ServerThread(app) as srv:
        yield app, srv.url


def _definition(url: str, timeout_ms: int) -> dict[str, Any]:
    return {
        "id": "http",
        "initial_node": "A",
        "actions": [{"id": "call", "kind": "http_request",
                     "implementation": {"method": "POST", "url": url}}],
        "nodes": [{"id": "A", "action_id": "call", "timeout_ms": timeout_ms}],
    }  # fmt: skip


async def _run(tmp_path: Path, url: str, timeout_ms: int) -> tuple[wf.RunResult, list[Any]]:
    engine = wf.Engine(db=f"sqlite:///{tmp_path}/runs.db")
    engine.register(_definition(url, timeout_ms))
    async with engine:
        run_id = await engine.start("http", {"q": 1})
        result = await asyncio.wait_for(engine.wait(run_id), 30)
        return result, await engine.events(run_id)


async def test_request_carries_the_nodes_remaining_budget(server, tmp_path) -> None:
    """The request goes out with the node's remaining time as X-YaTaxi-Client-TimeoutMs."""
    app, url = server
    result, _ = await _run(tmp_path, url + "/ok", 20_000)
    assert result == wf.RunResult("completed", {"A": {"seen": {"q": 1}}}, None)
    (header,) = app.headers
    assert header is not None and 10_000 < int(header) <= 20_000


async def test_bare_498_is_an_action_error(server, tmp_path) -> None:
    """A 498 without the expiry marker is an HTTP error status, not the node timing out."""
    _, url = server
    result, events = await _run(tmp_path, url + "/bare", 20_000)
    assert not [e for e in events if e["kind"] == "token_timed_out"]
    assert result.status == "failed" and "HTTP 498" in (result.error or "")


async def test_slow_server_is_cut_at_the_node_deadline(server, tmp_path) -> None:
    """A server slower than the node's budget ends the attempt as a node timeout."""
    _, url = server
    result, _ = await _run(tmp_path, url + "/slow", 300)
    assert result == wf.RunResult("failed", None, "node 'A' timed out after 300ms")


async def test_http_error_status_is_an_action_error(server, tmp_path) -> None:
    """A 500 answer fails the node as an error naming the status."""
    _, url = server
    result, _ = await _run(tmp_path, url + "/fail", 20_000)
    assert result.status == "failed" and "HTTP 500" in (result.error or "")
