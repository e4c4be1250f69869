"""A deadline that passes while the request body is uploading: user code never runs (D4.11).

Real parts: a Starlette app behind ``DeadlineMiddleware`` under uvicorn, and a client that
uploads its body in two chunks with a pause longer than the request's deadline between them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from timebound.propagation.asgi import DeadlineMiddleware
from timebound.telemetry import counters

from .conftest import ServerThread

H = "X-YaTaxi-Client-TimeoutMs"


def _slow_upload(pause: float) -> Iterator[bytes]:
    yield b"first part, "
    time.sleep(pause)  # the client is slow: the request's 100 ms pass while it uploads
    yield b"last part"


def _app(ran: list[bytes], *, add: bool) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def upload(request: Request) -> PlainTextResponse:
        body = await request.body()
        ran.append(body)  # must never run: the body was read after the deadline
        return PlainTextResponse("stored")

    app = Starlette(routes=[Route("/upload", upload, methods=["POST"])])
    if add:
        app.add_middleware(DeadlineMiddleware)
        return app
    return DeadlineMiddleware(app)


@pytest.mark.parametrize("add", [False, True], ids=["wrapped", "add_middleware"])
def test_body_finished_after_the_deadline_never_reaches_user_code(add: bool) -> None:
    """uvicorn + Starlette: the body ends after the deadline; 498, and the handler stops at
    ``await request.body()``."""
    ran: list[bytes] = []
    with ServerThread(_app(ran, add=add)) as srv:
        r = httpx.post(
            f"{srv.url}/upload", content=_slow_upload(0.5), headers={H: "100"}, timeout=30
        )
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert r.headers["X-YaTaxi-Deadline-Expired"] == "1"
    assert ran == []
    assert counters.get("cancelled-by-deadline", component="http-server") == 1


def test_body_finished_in_time_reaches_user_code() -> None:
    """uvicorn + Starlette: the same upload with time to spare is handled normally."""
    ran: list[bytes] = []
    with ServerThread(_app(ran, add=False)) as srv:
        r = httpx.post(
            f"{srv.url}/upload", content=_slow_upload(0.0), headers={H: "20000"}, timeout=30
        )
    assert (r.status_code, r.text) == (200, "stored")
    assert ran == [b"first part, last part"]
