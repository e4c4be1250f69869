"""Deferred operations on the host: operator list and detail, the mounted status surface, and a
canary secret that no response or page ever shows (D7, D8.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from timebound.deferred import CONTINUATION_SCHEMA, Registry
from timebound.deferred._registry import format_time, now_ms

from .conftest import Server, launch, stop

CANARY = "canary-5ecr3t-9d1e"
OP_ID = "deferred:report.render:op1"


def _doc(op_id: str) -> dict[str, object]:
    created = now_ms()
    return {
        "schema": "deferred-operation.v1",
        "schema/v": 1,
        "status": "deferred",
        "operation/id": op_id,
        "operation/kind": "report.render",
        "retry_after_seconds": 5,
        "created_at": format_time(created),
        "expires_at": format_time(created + 300_000),
        "status_href": f"/v1/deferred-operations/{op_id}/status",
        "cancel_href": f"/v1/deferred-operations/{op_id}/cancel",
    }


async def _plant(db: str) -> None:
    async with Registry(db) as registry:
        await registry.register(
            _doc(OP_ID),
            module="reports",
            request={"password": CANARY},
            continuation={"schema": CONTINUATION_SCHEMA, "resume_kind": "x", "secret": CANARY},
        )


@pytest.fixture(scope="module")
def with_ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("deferred")
    asyncio.run(_plant(f"sqlite:///{tmp}/host.db"))
    server = launch(tmp)
    yield server
    out = stop(server)
    assert CANARY not in out


def test_operator_list_shows_the_operation_with_its_digest(with_ops: Server) -> None:
    """GET /v1/deferred-operations lists the operation, its state and continuation digest."""
    (op,) = with_ops.client.get("/v1/deferred-operations").json()["operations"]
    assert op["operation/id"] == OP_ID
    assert op["status"] == "pending"
    assert op["module"] == "reports"
    assert op["continuation_digest"]


def test_operator_list_filters_by_status(with_ops: Server) -> None:
    """?status=completed finds nothing; an unknown status is a 400 problem."""
    assert with_ops.client.get("/v1/deferred-operations?status=completed").json() == {
        "operations": [],
        "next_cursor": None,
    }
    r = with_ops.client.get("/v1/deferred-operations?status=sleeping")
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json"


def test_detail_and_unknown_id(with_ops: Server) -> None:
    """The detail has the history; an unknown id is a 404 problem."""
    detail = with_ops.client.get(f"/v1/deferred-operations/{OP_ID}").json()
    assert detail["operation"]["operation/id"] == OP_ID
    assert [h["status"] for h in detail["history"]]
    assert with_ops.client.get("/v1/deferred-operations/nope").status_code == 404


def test_status_surface_is_mounted(with_ops: Server) -> None:
    """The registry's status document answers at /v1/deferred-operations/{id}/status."""
    r = with_ops.client.get(f"/v1/deferred-operations/{OP_ID}/status")
    assert r.status_code == 200
    assert r.json()["operation/id"] == OP_ID


def test_canary_secret_is_in_no_response_or_page(with_ops: Server) -> None:
    """The planted secret (request and continuation) appears in no API answer, page or metric."""
    paths = [
        "/v1/deferred-operations",
        f"/v1/deferred-operations/{OP_ID}",
        f"/v1/deferred-operations/{OP_ID}/status",
        "/ui/deferred",
        f"/ui/deferred/{OP_ID}",
        "/metrics",
    ]
    for path in paths:
        r = with_ops.client.get(path)
        assert r.status_code == 200, path
        assert CANARY not in r.text, path


def test_ui_lists_and_opens_the_operation(with_ops: Server) -> None:
    """/ui/deferred links to the operation's page, which shows its digest."""
    page = with_ops.client.get("/ui/deferred").text
    assert "/ui/deferred/deferred%3Areport.render%3Aop1" in page
    detail = with_ops.client.get("/ui/deferred/deferred%3Areport.render%3Aop1").text
    assert "continuation_digest" in detail


def test_deferred_routes_need_the_token(tmp_path: Path) -> None:
    """With a token, the operator routes refuse anonymous calls."""
    import httpx

    server = launch(tmp_path, token="tok-deferred-0123456789")
    try:
        with httpx.Client(base_url=server.url) as anonymous:
            assert anonymous.get("/v1/deferred-operations").status_code == 401
            assert anonymous.post(f"/v1/deferred-operations/{OP_ID}/cancel").status_code == 401
    finally:
        stop(server)


async def _plant_many(db: str) -> None:
    async with Registry(db) as registry:
        for i, module in enumerate(["a", "b", "a", "a"]):
            await registry.register(_doc(f"deferred:report.render:p{i}"), module=module)


def test_operator_list_pages_with_a_cursor_and_filters_by_module(tmp_path: Path) -> None:
    """Pages of two follow the cursor without repeats; ?module=a keeps only module a's."""
    asyncio.run(_plant_many(f"sqlite:///{tmp_path}/host.db"))
    server = launch(tmp_path, env={"TIMEBOUND_PAGE_SIZE": "2"})
    try:
        seen: list[str] = []
        cursor = None
        for _ in range(3):
            params = {"cursor": cursor} if cursor else {}
            page = server.client.get("/v1/deferred-operations", params=params).json()
            assert len(page["operations"]) <= 2
            seen += [op["operation/id"] for op in page["operations"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == [f"deferred:report.render:p{i}" for i in range(4)]
        only_a = server.client.get("/v1/deferred-operations?module=a").json()["operations"]
        assert {op["module"] for op in only_a} == {"a"} and len(only_a) == 2
        bad = server.client.get("/v1/deferred-operations?cursor=zzz")
        assert bad.status_code == 400 and "cursor" in bad.json()["detail"]
    finally:
        stop(server)


def test_poll_without_a_connector_is_a_conflict(with_ops: Server) -> None:
    """POST …/poll answers 409 naming the module this host has no connector for."""
    r = with_ops.client.post(f"/v1/deferred-operations/{OP_ID}/poll")
    assert r.status_code == 409
    assert "no connector for module 'reports'" in r.json()["detail"]


def test_poll_of_an_unknown_operation_is_not_found(with_ops: Server) -> None:
    """POST …/poll of an id the registry does not hold answers 404."""
    assert with_ops.client.post("/v1/deferred-operations/nope/poll").status_code == 404


def test_ui_detail_has_poll_and_cancel_forms_with_csrf(with_ops: Server) -> None:
    """A pending, cancelable operation's page has both forms, each carrying the CSRF token."""
    page = with_ops.client.get("/ui/deferred/deferred%3Areport.render%3Aop1").text
    assert 'action="/ui/deferred/deferred%3Areport.render%3Aop1/poll"' in page
    assert 'action="/ui/deferred/deferred%3Areport.render%3Aop1/cancel"' in page
    assert page.count('name="csrf"') >= 2


@pytest.mark.parametrize("action", ["poll", "cancel"])
def test_ui_forms_refuse_a_post_without_csrf(with_ops: Server, action: str) -> None:
    """Posting the poll or cancel form without its CSRF token is refused (403)."""
    r = with_ops.client.post(f"/ui/deferred/deferred%3Areport.render%3Aop1/{action}", data={})
    assert r.status_code == 403
