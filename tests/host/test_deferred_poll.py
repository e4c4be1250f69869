"""An operator's poll and cancel through the host's app, on a host whose engine has a connector
(the served host takes no connectors from its configuration yet, so this one is built in
process), on virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from timebound import workflow as wf
from timebound.deferred import HostPolicy, Operation, Registry
from timebound.host import Config, Host, create_app
from timebound.testing import VirtualClock

from .conftest import csrf_of
from .test_deferred_ops import OP_ID, _doc

OTHER = "deferred:report.render:op2"


class Connector:
    """Answers every poll "running" and every cancel "cancelled"; records the instants."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.polls: list[float] = []
        self.cancels: list[str] = []

    def _status(self, op: Operation, status: str) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": "deferred-operation-status.v1",
            "schema/v": 1,
            "operation/id": op.id,
            "operation/kind": op.kind,
            "status": status,
        }
        if status == "cancelled":
            doc["error"] = {"code": "cancelled", "message": "cancelled", "retryable": False}
        return doc

    async def status(self, op: Operation) -> object:
        self.polls.append(self.clock.now())
        return self._status(op, "running")

    async def cancel(self, op: Operation) -> object:
        self.cancels.append(op.id)
        return self._status(op, "cancelled")


async def _host(tmp_path: Path, connector: Connector) -> tuple[wf.Engine, httpx.AsyncClient]:
    db = f"sqlite:///{tmp_path}/host.db"
    async with Registry(db) as registry:
        for op_id in (OP_ID, OTHER):
            await registry.register(_doc(op_id), module="reports")
    policy = HostPolicy(poll_rate_cap=1, jitter=False)
    engine = wf.Engine(db=db, deferred_connectors={"reports": connector}, deferred_policy=policy)
    app = create_app(Host(Config(db=db), engine, {}))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost")
    return engine, client


async def test_poll_now_applies_the_answer_within_the_rate_cap(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Two operator polls under a cap of one per second start exactly one second apart."""
    connector = Connector(virtual_clock)
    engine, client = await _host(tmp_path, connector)
    async with engine, client:
        first = await client.post(f"/v1/deferred-operations/{OP_ID}/poll")
        second = await client.post(f"/v1/deferred-operations/{OTHER}/poll")
    assert first.status_code == 200 and second.status_code == 200
    assert first.json()["operation"]["status"] == "running"
    assert first.json()["applied"] is True
    assert connector.polls == [connector.polls[0], connector.polls[0] + 1.0]


async def test_cancel_asks_the_connector(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """The cancel form's action asks the connector and stores the cancelled status."""
    connector = Connector(virtual_clock)
    engine, client = await _host(tmp_path, connector)
    async with engine, client:
        page = await client.get(f"/ui/deferred/{OP_ID}")
        csrf = csrf_of(page.text)
        r = await client.post(f"/ui/deferred/{OP_ID}/cancel", data={"csrf": csrf})
        assert r.status_code == 303
        detail = (await client.get(f"/v1/deferred-operations/{OP_ID}")).json()
    assert page.status_code == 200
    assert connector.cancels == [OP_ID]
    assert detail["operation"]["status"] == "cancelled"
