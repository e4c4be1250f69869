"""``timebound serve --connectors MODULE``: a served host polls and cancels deferred operations.

The render service is a real uvicorn server on loopback (a :class:`timebound.deferred.Service`
behind ``status_app``); the host is a real ``timebound serve`` process whose workflow node
defers to it, is polled by the host's poller, and resumes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deferred.test_http import Served
from tests.propagation.http.conftest import ServerThread

from .conftest import ROOT, Server, launch, stop

REPORT = {
    "id": "report",
    "timeout_ms": 60_000,
    "initial_node": "A",
    "actions": [
        {
            "id": "render",
            "kind": "deferred",
            "implementation": {"handler": "start_render", "module": "render"},
        }
    ],
    "nodes": [{"id": "A", "action_id": "render"}],
}


@pytest.fixture
def render(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    """The render service (its work waits for ``release``) and its URL."""
    served = Served(tmp_path)
    asyncio.run(served.registry.open())  # SQLite: the store is not bound to a loop
    with ServerThread(served.app) as srv:
        yield served, srv.url
    served.release.set()
    asyncio.run(served.registry.close())


@pytest.fixture
def host(tmp_path: Path, render: tuple[Served, str]) -> Iterator[Server]:
    _, url = render
    server = launch(
        tmp_path, "--connectors", "tests.host.host_connectors", env={"TB_TEST_RENDER_URL": url}
    )
    try:
        r = server.client.put("/v1/definitions/report", json=REPORT)
        assert r.status_code == 201, r.text
        yield server
    finally:
        stop(server)


def _suspended_on(server: Server, run_id: str) -> str:
    """The id of the deferred operation the run's node waits on, once it waits."""
    for _ in range(600):
        (token,) = server.client.get(f"/v1/runs/{run_id}").json()["tokens"]
        if (token["child_run_id"] or "").startswith("deferred:"):
            op_id: str = token["child_run_id"]
            return op_id
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} never deferred")


def test_a_deferred_node_is_polled_by_the_host_and_resumes(
    host: Server, render: tuple[Served, str]
) -> None:
    """The node defers; an operator poll applies the service's "running"; once the work ends
    the host's own polling resumes the node with the result and the run completes."""
    served, _ = render
    run_id = host.start("report", {"pages": 3})
    op_id = _suspended_on(host, run_id)
    polled = host.client.post(f"/v1/deferred-operations/{op_id}/poll")
    assert polled.status_code == 200, polled.text
    assert polled.json()["applied"] is True
    assert polled.json()["operation"]["status"] == "running"
    assert host.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "running"
    served.release.set()
    detail = host.wait_run(run_id)
    assert detail["run"]["status"] == "completed"
    assert detail["run"]["state"] == {"A": {"pages": 3, "title": "done"}}
    op = host.client.get(f"/v1/deferred-operations/{op_id}").json()["operation"]
    assert op["status"] == "completed" and op["module"] == "render"


def test_cancel_through_the_api_cancels_at_the_service_and_fails_the_node(
    host: Server, render: tuple[Served, str]
) -> None:
    """POST …/cancel asks the service (its own record says cancelled), answers the cancelled
    status document, and the suspended node fails with the operation's end."""
    served, _ = render
    run_id = host.start("report", {"pages": 1})
    op_id = _suspended_on(host, run_id)
    r = host.client.post(f"/v1/deferred-operations/{op_id}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["schema"] == "deferred-operation-status.v1"
    assert r.json()["status"] == "cancelled"
    at_service = asyncio.run(served.registry.get(op_id))
    assert at_service is not None and at_service.status == "cancelled"
    detail = host.wait_run(run_id)
    assert detail["run"]["status"] == "failed"
    assert f"deferred-operation: {op_id} ended cancelled" in detail["run"]["error"]
    again = host.client.post(f"/v1/deferred-operations/{op_id}/poll")
    assert again.status_code == 409 and "already ended (cancelled)" in again.json()["detail"]


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("no_such_connectors_xyz", "connectors: cannot import 'no_such_connectors_xyz'"),
        ("tests.host.host_actions", "defines no connectors() function"),
    ],
)
def test_a_bad_connectors_module_stops_the_start(
    tmp_path: Path, module: str, expected: str
) -> None:
    """--connectors naming a missing module, or one without connectors(), exits 2 naming it."""
    r = subprocess.run(
        [sys.executable, "-m", "timebound", "serve", "--check", "--connectors", module,
         "--db", f"sqlite:///{tmp_path}/h.db"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert expected in r.stderr


def test_the_node_and_its_deferred_operation_link_to_each_other(
    host: Server, render: tuple[Served, str]
) -> None:
    """The run page's attempt links to the operation its node waits on; the operation's page
    links back to the node of the run (D8.21)."""
    from urllib.parse import quote

    run_id = host.start("report", {"pages": 2})
    op_id = _suspended_on(host, run_id)
    run_page = host.client.get(f"/ui/runs/{run_id}").text
    assert f'href="/ui/deferred/{quote(op_id, safe="")}" class="waits"' in run_page
    op_page = host.client.get(f"/ui/deferred/{quote(op_id, safe='')}").text
    (token,) = host.client.get(f"/v1/runs/{run_id}").json()["tokens"]
    assert f'href="/ui/runs/{run_id}#token-{token["id"]}"' in op_page
    host.client.post(f"/v1/runs/{run_id}/cancel")
