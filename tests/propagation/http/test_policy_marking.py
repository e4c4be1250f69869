"""A retry policy stopped by the request's own deadline marks the request (D4.10, D3.3, D4.5).

Real parts: a Starlette service behind ``DeadlineMiddleware`` under uvicorn, whose handler calls a
downstream under uvicorn through ``AsyncDeadlineTransport`` inside ``tb.resilient``. The downstream
answers 503; the policy's next delay cannot fit the request's deadline, so it stops long before the
deadline passes (D3.3). The caller must see the "Deadline expired" answer, never a retryable 500
or the handler's own 200, and the server counts it as cancelled by deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport
from timebound.telemetry import counters
from timebound.testing import VirtualClock

from .conftest import Downstream, ServerThread, call_asgi

H = "X-YaTaxi-Client-TimeoutMs"
# Far more than the test needs, so the deadline never passes while the request is handled: the
# answer can only come from the policy's early stop.
BUDGET_MS = "20000"


class UnavailableError(Exception):
    """The downstream answered 503."""


def _calls(downstream_url: str) -> Callable[[], Any]:
    """A call to the downstream's ``/unavailable`` under a policy whose delay cannot fit."""
    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5.0))

    @tb.resilient(retry=3, delay=60.0)
    async def call() -> str:
        response = await client.get(f"{downstream_url}/unavailable")
        if response.status_code == 503:
            raise UnavailableError(response.text)
        return response.text

    return call


def _raw_app(call: Callable[[], Any], swallow: bool) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        try:
            body = (await call()).encode()
        except tb.DeadlineExceeded:
            if not swallow:
                raise
            body = b"recovered"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})

    return DeadlineMiddleware(app)


def _starlette_app(call: Callable[[], Any], swallow: bool, *, add: bool) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def endpoint(request: Request) -> PlainTextResponse:
        try:
            return PlainTextResponse(await call())
        except tb.DeadlineExceeded:
            if not swallow:
                raise
            return PlainTextResponse("recovered")

    app = Starlette(routes=[Route("/", endpoint)])
    if add:
        app.add_middleware(DeadlineMiddleware)
        return app
    return DeadlineMiddleware(app)


KINDS = ["raw", "wrapped", "add_middleware"]


def _build(kind: str, call: Callable[[], Any], swallow: bool) -> Any:
    if kind == "raw":
        return _raw_app(call, swallow)
    return _starlette_app(call, swallow, add=kind == "add_middleware")


@pytest.fixture(scope="module")
def unavailable() -> Iterator[str]:
    """A downstream service under uvicorn (``/unavailable`` answers 503)."""
    with ServerThread(Downstream()) as srv:
        yield srv.url


@pytest.mark.parametrize("swallow", [False, True], ids=["escapes", "swallowed"])
@pytest.mark.parametrize("kind", KINDS)
def test_policy_stopped_by_request_deadline_answers_expired(
    unavailable: str, kind: str, swallow: bool
) -> None:
    """uvicorn: a policy stopped early by the request deadline gets the expired answer, counted."""
    with ServerThread(_build(kind, _calls(unavailable), swallow)) as srv:
        r = httpx.get(f"{srv.url}/", headers={H: BUDGET_MS}, timeout=30)
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert r.headers["X-YaTaxi-Deadline-Expired"] == "1"
    assert counters.get("cancelled-by-deadline", component="http-server") == 1


async def test_policy_stopped_by_its_own_total_does_not_mark(virtual_clock: VirtualClock) -> None:
    """A policy stopped by its own total budget leaves the request unmarked: the handler answers."""
    attempts = 0

    @tb.resilient(retry=3, delay=2.0, total_timeout=3.0)
    async def call() -> str:
        nonlocal attempts
        attempts += 1
        raise UnavailableError("503")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        try:
            await call()
        except tb.DeadlineExceeded as exc:
            assert exc.source == "total"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"recovered"})

    result = await call_asgi(DeadlineMiddleware(app), {H: "30000"})
    assert (result.status, result.body, attempts) == (200, b"recovered", 2)
    assert counters.get("cancelled-by-deadline", component="http-server") == 0


async def test_policy_stopped_by_a_local_scope_does_not_mark(
    virtual_clock: VirtualClock,
) -> None:
    """A policy stopped by a local scope shorter than the request's deadline leaves it unmarked."""

    @tb.resilient(retry=3, delay=2.0)
    async def call() -> str:
        raise UnavailableError("503")

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        try:
            with tb.fail_after(1.0):
                await call()
        except tb.DeadlineExceeded as exc:
            assert exc.source == "scope"
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"recovered"})

    result = await call_asgi(DeadlineMiddleware(app), {H: "30000"})
    assert (result.status, result.body) == (200, b"recovered")


def _flask_app(downstream_url: str) -> Any:
    """Flask behind the WSGI middleware: a sync policy over requests with DeadlineAdapter."""
    import requests
    from flask import Flask

    from timebound.propagation.requests import DeadlineAdapter
    from timebound.propagation.wsgi import DeadlineMiddleware as WsgiDeadline

    session = requests.Session()
    session.mount("http://", DeadlineAdapter(timeout=5.0))

    @tb.resilient(retry=3, delay=60.0)
    def call() -> str:
        response = session.get(f"{downstream_url}/unavailable")
        if response.status_code == 503:
            raise UnavailableError(response.text)
        return response.text

    app = Flask(__name__)

    @app.get("/")
    def index() -> str:
        try:
            return call()
        except tb.DeadlineExceeded:
            return "recovered"

    app.wsgi_app = WsgiDeadline(app.wsgi_app)  # type: ignore[method-assign]
    return app


def test_sync_policy_under_wsgi_marks_the_request(unavailable: str) -> None:
    """werkzeug + Flask: the sync driver's early stop marks the request too (498, counted)."""
    with ServerThread(_flask_app(unavailable), kind="wsgi") as srv:
        r = httpx.get(f"{srv.url}/", headers={H: BUDGET_MS}, timeout=30)
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert r.headers["X-YaTaxi-Deadline-Expired"] == "1"
    assert counters.get("cancelled-by-deadline", component="http-server") == 1
