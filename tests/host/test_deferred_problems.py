"""The deferred status routes a host mounts answer every error as the host does (D8.2, D8.23): an
RFC 9457 problem document, ``application/problem+json``, with the path as ``instance`` and a
stable ``code`` — against a real ``timebound serve`` process (uvicorn) and its SQLite store."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from timebound.deferred import Registry
from timebound.deferred._contract import format_time
from timebound.deferred._registry import now_ms

from .conftest import Server, launch, stop

PRINTING = "deferred:print.job:p1"  # registered without a cancel_href: not cancelable
RETIRED = "deferred:report.render:r1"  # registered, then past its retention


def _doc(op_id: str, **extra: Any) -> dict[str, Any]:
    created = now_ms()
    doc: dict[str, Any] = {
        "schema": "deferred-operation.v1",
        "schema/v": 1,
        "status": "deferred",
        "operation/id": op_id,
        "operation/kind": op_id.split(":")[1],
        "retry_after_seconds": 5,
        "created_at": format_time(created),
        "expires_at": format_time(created + 300_000),
        "status_href": f"/v1/deferred-operations/{op_id}/status",
    }
    doc.update(extra)
    return doc


async def _plant(db: str) -> None:
    """Two operations in the host's store: one its connector (on no host here) cannot cancel,
    one whose retention has ended."""
    async with Registry(db) as registry:
        await registry.register(
            _doc(PRINTING, **{"cancel/unavailable-reason": "the printer has started"}),
            module="printer",
        )
        await registry.register(
            _doc(RETIRED, cancel_href=f"/v1/deferred-operations/{RETIRED}/cancel"),
            module="render",
        )
        async with registry._store.transaction() as tx:
            await tx.execute(
                "UPDATE tb_deferred_ops SET status = 'completed', retain_until_ms = 1 WHERE id = ?",
                RETIRED,
            )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("deferred-problems")
    asyncio.run(_plant(f"sqlite:///{tmp}/host.db"))  # before the host holds the store
    server = launch(tmp)
    try:
        yield server
    finally:
        stop(server)


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/deferred-operations/deferred:x:never/status", 404, "unknown-operation"),
        ("POST", "/v1/deferred-operations/deferred:x:never/cancel", 404, "unknown-operation"),
        ("GET", f"/v1/deferred-operations/{RETIRED}/status", 410, "gone"),
        ("POST", f"/v1/deferred-operations/{RETIRED}/cancel", 410, "gone"),
        ("POST", f"/v1/deferred-operations/{PRINTING}/cancel", 409, "not-cancelable"),
        ("DELETE", f"/v1/deferred-operations/{PRINTING}/status", 405, None),
        ("GET", f"/v1/deferred-operations/{PRINTING}/cancel", 405, None),
    ],
)
def test_each_error_of_the_status_routes_is_a_problem_document(
    served: Server, method: str, path: str, status: int, code: str | None
) -> None:
    r = served.client.request(method, path)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["type"] == "about:blank" and body["status"] == status
    assert body["instance"] == path
    assert isinstance(body["title"], str) and body["detail"]
    assert body.get("code") == code
    if status == 409:
        assert "the printer has started" in body["detail"]
    if status == 405:
        assert r.headers["allow"]


def test_a_good_answer_of_the_status_route_stays_json(served: Server) -> None:
    """Only errors changed shape: a status document is still ``application/json``."""
    r = served.client.get(f"/v1/deferred-operations/{PRINTING}/status")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json()["status"] == "pending"
