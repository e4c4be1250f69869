"""The HTTP surface against a real uvicorn server on loopback, and a host polling it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.propagation.http.conftest import ServerThread
from timebound.deferred import (
    CONTINUATION_SCHEMA,
    HostPolicy,
    HttpConnector,
    Poller,
    Registry,
    Resumption,
    Service,
    status_app,
    validate_operation,
    validate_status,
)

pytestmark = pytest.mark.asyncio_real

SECRET = "canary-http-91c2"


class Served:
    """A slow Python service offering deferred operations, in its own server thread."""

    def __init__(self, tmp_path: Path, *, retain_s: int = 86400) -> None:
        self.registry = Registry(
            f"sqlite:///{tmp_path}/service.db", policy=HostPolicy(retain=retain_s)
        )
        self.service = Service(self.registry, max_running=3)
        self.release = threading.Event()

        @self.service.operation("report.render", retry_after=1, ttl=120)
        async def render(payload: Any) -> Any:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            return {"pages": payload["pages"], "title": "done"}

        @self.service.operation("print.job", cancelable=False)
        async def print_job(payload: Any) -> Any:
            await asyncio.sleep(3600)

        @self.service.operation("broken.job")
        async def broken(payload: Any) -> Any:
            raise RuntimeError(SECRET)

        self.app = status_app(self.registry, self.service)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    s = Served(tmp_path)
    asyncio.run(s.registry.open())  # SQLite: the store is not bound to a loop
    with ServerThread(s.app) as srv:
        yield s, srv.url
    s.release.set()
    asyncio.run(s.registry.close())


async def _start(url: str, kind: str, body: Any, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url) as client:
        return await client.post(f"/v1/operations/{kind}", json=body, headers=headers)


async def test_start_answers_202_with_the_fixed_headers(served: tuple[Served, str]) -> None:
    """202 + Location = status_href, Retry-After, Preference-Applied; the body is valid."""
    _, url = served
    r = await _start(url, "report.render", {"pages": 3}, Prefer="respond-async")
    assert r.status_code == 202
    doc = validate_operation(r.json())
    assert r.headers["location"] == doc["status_href"]
    assert r.headers["retry-after"] == "1"
    assert r.headers["preference-applied"] == "respond-async"


async def test_without_prefer_no_preference_is_applied(served: tuple[Served, str]) -> None:
    """Without Prefer: respond-async there is no Preference-Applied header."""
    _, url = served
    r = await _start(url, "report.render", {"pages": 1})
    assert r.status_code == 202 and "preference-applied" not in r.headers


async def test_prefer_wait_only_narrows_the_lifetime(served: tuple[Served, str]) -> None:
    """Prefer: wait=30 gives a 30 s lifetime; wait=100000 cannot extend the 120 s one."""
    from timebound.deferred._contract import parse_time

    _, url = served
    short = (await _start(url, "report.render", {"pages": 1}, Prefer="wait=30")).json()
    long = (await _start(url, "report.render", {"pages": 1}, Prefer="wait=100000")).json()
    life = [parse_time(d["expires_at"]) - parse_time(d["created_at"]) for d in (short, long)]
    assert life == [30_000, 120_000]


async def test_status_route(served: tuple[Served, str]) -> None:
    """GET status answers 200 with a valid document and Retry-After while live."""
    s, url = served
    doc = (await _start(url, "report.render", {"pages": 2})).json()
    async with httpx.AsyncClient(base_url=url) as client:
        r = await client.get(doc["status_href"])
        assert r.status_code == 200 and r.headers["retry-after"] == "1"
        assert validate_status(r.json())["status"] in ("pending", "running")
        s.release.set()
        for _ in range(500):
            r = await client.get(doc["status_href"])
            if r.json()["status"] == "completed":
                break
            await asyncio.sleep(0.01)
    assert r.json()["result"] == {"pages": 2, "title": "done"}
    assert "retry-after" not in r.headers


async def test_never_issued_is_404(served: tuple[Served, str]) -> None:
    """An id never issued answers 404, never a synthesised pending."""
    _, url = served
    async with httpx.AsyncClient(base_url=url) as client:
        r = await client.get("/v1/deferred-operations/deferred:report.render:nope/status")
    assert r.status_code == 404


async def test_retention_ends_in_410(tmp_path: Path) -> None:
    """After retain_until a finished operation's id answers 410."""
    s = Served(tmp_path, retain_s=1)
    await s.registry.open()
    s.release.set()
    with ServerThread(s.app) as srv:
        doc = (await _start(srv.url, "report.render", {"pages": 1})).json()
        async with httpx.AsyncClient(base_url=srv.url) as client:
            for _ in range(500):
                if (await client.get(doc["status_href"])).json()["status"] == "completed":
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.1)  # past retain_until: no timing assertion rides on this
            r = await client.get(doc["status_href"])
    await s.registry.close()
    assert r.status_code == 410


async def test_overload_is_503_never_a_deferral(served: tuple[Served, str]) -> None:
    """Beyond max_running the start answers 503 with Retry-After, not 202."""
    _, url = served
    codes = [(await _start(url, "report.render", {"pages": 1})).status_code for _ in range(3)]
    r = await _start(url, "report.render", {"pages": 1})
    assert codes == [202, 202, 202]
    assert r.status_code == 503 and r.headers["retry-after"] == "1"


async def test_non_cancelable_cancel_returns_the_reason(served: tuple[Served, str]) -> None:
    """POST cancel on a non-cancelable operation answers 409 with its reason; nothing changes."""
    _, url = served
    doc = (await _start(url, "print.job", {})).json()
    assert "cancel_href" not in doc
    async with httpx.AsyncClient(base_url=url) as client:
        op_id = doc["operation/id"]
        r = await client.post(f"/v1/deferred-operations/{op_id}/cancel")
        status = (await client.get(doc["status_href"])).json()["status"]
    assert r.status_code == 409 and doc["cancel/unavailable-reason"] in r.json()["detail"]
    assert status in ("pending", "running")


async def test_a_failing_operation_does_not_leak_its_message(served: tuple[Served, str]) -> None:
    """A work function's exception becomes failed/operation-failed with its type only."""
    _, url = served
    doc = (await _start(url, "broken.job", {})).json()
    async with httpx.AsyncClient(base_url=url) as client:
        for _ in range(500):
            r = await client.get(doc["status_href"])
            if r.json()["status"] == "failed":
                break
            await asyncio.sleep(0.01)
    body = r.json()
    assert body["error"] == {
        "code": "operation-failed",
        "message": "RuntimeError",
        "retryable": False,
    }
    assert SECRET not in r.text


@pytest.mark.parametrize(
    ("method", "path", "body", "code"),
    [
        ("POST", "/v1/operations/report.render", b"{not json", 400),
        ("POST", "/v1/operations/no.such.kind", b"{}", 404),
        ("GET", "/v1/operations/report.render", b"", 405),
        ("DELETE", "/v1/deferred-operations/x/status", b"", 405),
        ("GET", "/v1/deferred-operations/" + "x" * 5000 + "/status", b"", 404),
        ("POST", "/v1/operations/report.render", b"[" * 2_000_000, 413),
    ],
)
async def test_hostile_requests_get_clear_errors(
    served: tuple[Served, str], method: str, path: str, body: bytes, code: int
) -> None:
    """Bad JSON, unknown kinds, wrong methods, huge ids and huge bodies: a problem document,
    ``application/problem+json`` with the path as its instance (D8.23)."""
    _, url = served
    async with httpx.AsyncClient(base_url=url) as client:
        r = await client.request(method, path, content=body)
    assert r.status_code == code
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert (problem["type"], problem["status"]) == ("about:blank", code)
    # A huge path is echoed capped, as every text the host quotes (D8.11).
    assert problem["instance"] == path if len(path) < 1000 else len(problem["instance"]) < 1000
    assert problem["title"] and problem["detail"]
    if code == 405:
        assert r.headers["allow"] in ("GET", "POST")


async def test_the_host_polls_to_completion_and_resumes_once(
    served: tuple[Served, str], store_url: str
) -> None:
    """A host registry polls the service over loopback, then resumes the continuation once."""
    s, url = served
    resumed: list[Resumption] = []

    async def resume(tx: Any, r: Resumption) -> None:
        resumed.append(r)

    doc = (await _start(url, "report.render", {"pages": 7})).json()
    connector = HttpConnector(url)
    async with Registry(store_url, policy=HostPolicy(jitter=False)) as host:
        host.on_resume("test", resume)
        cont = {"schema": CONTINUATION_SCHEMA, "resume_kind": "test", "node": "A"}
        await host.register(doc, module="svc", continuation=cont)
        async with Poller(host, {"svc": connector}):
            await asyncio.sleep(1.2)
            s.release.set()
            for _ in range(600):
                op = await host.get(doc["operation/id"])
                if op is not None and op.resumed_ms is not None:
                    break
                await asyncio.sleep(0.01)
        await connector.aclose()
    assert [r.result for r in resumed] == [{"pages": 7, "title": "done"}]
    assert op is not None and op.status == "completed" and op.attempts >= 2


async def test_the_host_cancels_through_the_connector(
    served: tuple[Served, str], store_url: str
) -> None:
    """Cancel from the host reaches the service: its task stops and both sides say cancelled."""
    s, url = served
    doc = (await _start(url, "report.render", {"pages": 1})).json()
    connector = HttpConnector(url)
    async with Registry(store_url) as host:
        await host.register(doc, module="svc")
        async with Poller(host, {"svc": connector}) as poller:
            view = await poller.cancel(doc["operation/id"])
        await connector.aclose()
    served_op = await s.registry.get(doc["operation/id"])
    assert view["status"] == "cancelled"
    assert served_op is not None and served_op.status == "cancelled"


async def test_a_5xx_status_is_a_transient_failure(store_url: str, tmp_path: Path) -> None:
    """A status endpoint answering 503 leaves the status alone and records poll-http-503."""

    async def overloaded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 503, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    from .conftest import operation_doc

    with ServerThread(overloaded) as srv:
        connector = HttpConnector(srv.url)
        async with Registry(store_url, policy=HostPolicy(jitter=False)) as host:
            await host.register(operation_doc(retry_after=1), module="svc")
            async with Poller(host, {"svc": connector}):
                for _ in range(300):
                    op = await host.get("deferred:report.render:op1")
                    if op is not None and op.attempts:
                        break
                    await asyncio.sleep(0.01)
        await connector.aclose()
    assert op is not None
    assert (op.status, op.last_error_code) == ("pending", "poll-http-503")
