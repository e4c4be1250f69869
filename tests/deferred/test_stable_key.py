"""A crash between a service's 202 and the operation's registration orphans nothing (D7.11):
the re-run sends the same Idempotency-Key, a service that honours it answers the same
operation, and the registry holds one operation for the token. A real uvicorn service on
loopback, the engine on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
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

    def __init__(self, tmp_path: Path, *, honour: bool = True) -> None:
        self.honour = honour
        self.registry = Registry(f"sqlite:///{tmp_path}/service.db")
        self.service = Service(self.registry)
        self.release = threading.Event()
        self.keys: list[str | None] = []
        # What the service answered and was asked, recorded here: the test never reads the
        # service's SQLite store from its own loop while the server thread writes it.
        self.started: list[str] = []
        self.cancels: list[str] = []

        @self.service.operation("report.render", retry_after=1, ttl=600)
        async def render(payload: Any) -> Any:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            return {"pages": payload["input"]["pages"]}

        self.inner = status_app(self.registry, self.service)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if scope["path"].endswith("/cancel"):
                self.cancels.append(scope["path"].split("/")[3])
            if scope["path"] == "/v1/operations/report.render":
                send = self._recording(send)
                self.keys.append(headers.get("idempotency-key"))
                if not self.honour:  # a service that ignores the key
                    scope = {
                        **scope,
                        "headers": [
                            (k, v) for k, v in scope["headers"] if k.lower() != b"idempotency-key"
                        ],
                    }
        await self.inner(scope, receive, send)

    def _recording(self, send: Any) -> Any:
        async def recording(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                op_id = json.loads(message["body"])["operation/id"]
                if op_id not in self.started:
                    self.started.append(op_id)
            await send(message)

        return recording


@pytest.fixture(params=[True], ids=["honours"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[KeyedService, str]]:
    s = KeyedService(tmp_path, honour=request.param)
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
    assert result == wf.RunResult("completed", {"A": {"pages": 3}}, None)
    assert len(s.keys) == 2 and s.keys[0] is not None and s.keys[0] == s.keys[1]
    assert s.keys[0] == f"{run_id}:{tok['id']}:A"
    assert len(s.started) == 1 and [op.id for op in ops] == s.started


@pytest.mark.parametrize("served", [False], ids=["ignores"], indirect=True)
async def test_a_second_operation_from_a_service_that_ignores_the_key_is_cancelled(
    served: tuple[KeyedService, str], store_url: str
) -> None:
    """The first process registers the operation and stops before suspending its node; the
    re-run's call starts a second operation at a service that ignores the key: the registry
    keeps the first (its key), asks the service to cancel the second, and the node completes."""
    s, url = served
    first = _engine(store_url, url)
    registered = asyncio.Event()
    async with first:
        real = first.deferred_registry.register

        async def registers_then_stops(*args: Any, **kwargs: Any) -> Any:
            await real(*args, **kwargs)
            registered.set()
            await asyncio.Event().wait()  # the process ends before the node suspends

        first.deferred_registry.register = registers_then_stops
        run_id = await first.start("report", {"pages": 2})
        await asyncio.wait_for(registered.wait(), 30)
    second = _engine(store_url, url)
    async with second:
        for _ in range(3000):  # the second operation is asked to cancel before any ends
            if s.cancels:
                break
            await asyncio.sleep(0.01)
        s.release.set()
        result = await second.wait(run_id, timeout=30)
        ops = await second.deferred_registry.operations()
    assert result == wf.RunResult("completed", {"A": {"pages": 2}}, None)
    assert len(s.started) == 2 and [op.id for op in ops] == s.started[:1]
    assert s.cancels == s.started[1:]


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
