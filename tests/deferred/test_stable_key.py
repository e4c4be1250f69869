"""A crash between a service's 202 and the operation's registration orphans nothing (D7.11):
the re-run sends the same Idempotency-Key, a service that honours it answers the same
operation, and the registry holds one operation for the token. A real uvicorn service on
loopback, the engine on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.propagation.http.conftest import ServerThread
from timebound import workflow as wf
from timebound.deferred import HostPolicy, Registry, Service, status_app

pytestmark = pytest.mark.asyncio_real


class KeyedService:
    """A timebound Service (it honours Idempotency-Key) recording each start's key."""

    def __init__(self, tmp_path: Path) -> None:
        self.registry = Registry(f"sqlite:///{tmp_path}/service.db")
        self.service = Service(self.registry)
        self.release = threading.Event()
        self.keys: list[str | None] = []

        @self.service.operation("report.render", retry_after_s=1, ttl_s=600)
        async def render(payload: Any) -> Any:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            return {"pages": payload["input"]["pages"]}

        self.inner = status_app(self.registry, self.service)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if scope["path"] == "/v1/operations/report.render":
                self.keys.append(headers.get("idempotency-key"))
        await self.inner(scope, receive, send)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[KeyedService, str]]:
    s = KeyedService(tmp_path)
    asyncio.run(s.registry.open())  # SQLite: the store is not bound to a loop
    with ServerThread(s) as srv:
        yield s, srv.url
    s.release.set()
    asyncio.run(s.registry.close())


def _engine(store_url: str, url: str) -> wf.Engine:
    engine = wf.Engine(db=store_url, deferred_policy=HostPolicy(jitter=False))
    engine.register({
        "id": "report",
        "initial_node": "A",
        "actions": [{"id": "render", "kind": "http_request", "execution_mode_support": "either",
                     "implementation": {"method": "POST",
                                        "url": f"{url}/v1/operations/report.render"}}],
        "nodes": [{"id": "A", "action_id": "render", "timeout_ms": 60_000}],
    })  # fmt: skip
    return engine


async def test_a_rerun_after_the_202_finds_the_same_operation(
    served: tuple[KeyedService, str], store_url: str
) -> None:
    """The first process stops after the 202 arrived but before it registered the operation;
    the next one re-runs the node with the same key: the service started one operation, the
    registry holds one, and the node completes with its result."""
    s, url = served
    first = _engine(store_url, url)
    answered = asyncio.Event()
    async with first:

        async def stops_here(*args: Any, **kwargs: Any) -> Any:
            answered.set()
            await asyncio.Event().wait()  # the process ends here, the operation unregistered

        first.deferred_registry.register = stops_here
        run_id = await first.start("report", {"pages": 3})
        await asyncio.wait_for(answered.wait(), 30)
    second = _engine(store_url, url)
    async with second:
        for _ in range(3000):
            if await second.deferred_registry.operations():
                break
            await asyncio.sleep(0.01)
        s.release.set()
        result = await second.wait(run_id, timeout=30)
        ops = await second.deferred_registry.operations()
        (tok,) = await second.tokens(run_id)
    started = await s.registry.operations()
    assert result == wf.RunResult("completed", {"A": {"pages": 3}}, None)
    assert len(s.keys) == 2 and s.keys[0] is not None and s.keys[0] == s.keys[1]
    assert s.keys[0] == f"{run_id}:{tok['id']}:A"
    assert len(started) == 1 and [op.id for op in ops] == [started[0].id]


async def test_a_deliberate_retry_is_a_new_call_with_a_new_key(tmp_path: Path) -> None:
    """An action error retried by the node's retry block sends a new key (':1'), while the
    first call's key is run, token and node."""
    from tests.workflow.test_http_action import App

    app = App()
    seen: list[str | None] = []

    async def record(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        seen.append(headers.get(b"idempotency-key", b"").decode() or None)
        await app(scope, receive, send)

    with ServerThread(record) as srv:
        engine = wf.Engine(db=f"sqlite:///{tmp_path}/runs.db")
        engine.register({
            "id": "r",
            "initial_node": "A",
            "actions": [{"id": "c", "kind": "http_request",
                         "implementation": {"method": "POST", "url": srv.url + "/fail"}}],
            "nodes": [{"id": "A", "action_id": "c", "retry": {"max_attempts": 2}}],
        })  # fmt: skip
        async with engine:
            run_id = await engine.start("r", {})
            await engine.wait(run_id, timeout=30)
            (tok,) = await engine.tokens(run_id)
    base = f"{run_id}:{tok['id']}:A"
    assert seen == [base, base + ":1"]
