"""A deadline that passes while the request body is uploading: user code never runs (D4.11).

Real parts: a Starlette app behind ``DeadlineMiddleware`` under uvicorn (and Flask under
werkzeug), and a client that uploads its body in two chunks, the second one only once the
server has seen the request and its deadline has passed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from timebound.propagation.asgi import DeadlineMiddleware
from timebound.telemetry import counters
from timebound.testing import VirtualClock

from .conftest import ServerThread

H = "X-YaTaxi-Client-TimeoutMs"


def _slow_upload(pause: float, arrived: threading.Event | None = None) -> Iterator[bytes]:
    """Two chunks; the second ``pause`` seconds after the server saw the request (``arrived``),
    so the request's 100 ms have surely passed on the server however busy the machine is."""
    yield b"first part, "
    if arrived is not None:
        assert arrived.wait(30), "the server never saw the request"
    time.sleep(pause)
    yield b"last part"


def _arrival(app: Any, arrived: threading.Event) -> Any:
    """``app`` behind an outermost ASGI layer that says when the request reached the server."""

    async def outer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            arrived.set()  # no await until the middleware reads the clock (D4.2)
        await app(scope, receive, send)

    return outer


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
    arrived = threading.Event()
    with ServerThread(_arrival(_app(ran, add=add), arrived)) as srv:
        r = httpx.post(
            f"{srv.url}/upload",
            content=_slow_upload(0.3, arrived),
            headers={H: "100"},
            timeout=30,
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


def _flask_app(ran: list[bytes]) -> Any:
    from flask import Flask, request

    from timebound.propagation.wsgi import DeadlineMiddleware as WsgiDeadline

    app = Flask(__name__)

    @app.post("/upload")
    def upload() -> str:
        body = request.get_data()
        ran.append(body)  # must never run: the body was read after the deadline
        return "stored"

    app.wsgi_app = WsgiDeadline(app.wsgi_app)  # type: ignore[method-assign]
    return app


def _wsgi_arrival(app: Any, arrived: threading.Event) -> Any:
    """``app`` behind an outermost WSGI layer that says when the request reached the server."""

    def outer(environ: dict[str, Any], start_response: Any) -> Any:
        arrived.set()
        return app(environ, start_response)

    return outer


@pytest.mark.parametrize(
    ("pause", "budget"), [(0.3, "100"), (0.0, "20000")], ids=["late", "in-time"]
)
def test_wsgi_body_finished_after_the_deadline_never_reaches_user_code(
    pause: float, budget: str
) -> None:
    """werkzeug + Flask: a body that ends after the deadline stops the handler at its read (498);
    one that ends in time is handled."""
    ran: list[bytes] = []
    arrived = threading.Event()
    with ServerThread(_wsgi_arrival(_flask_app(ran), arrived), kind="wsgi") as srv:
        r = httpx.post(
            f"{srv.url}/upload",
            content=_slow_upload(pause, arrived),
            headers={H: budget},
            timeout=30,
        )
    if pause:
        assert (r.status_code, r.text) == (498, "Deadline expired")
        assert ran == []
        assert counters.get("cancelled-by-deadline", component="http-server") == 1
    else:
        assert (r.status_code, r.text, ran) == (200, "stored", [b"first part, last part"])


def test_wsgi_body_read_in_time_is_not_refused_later(virtual_clock: VirtualClock) -> None:
    """A body read to its end before the deadline: reading again after it passed raises nothing."""
    import io

    from timebound.propagation.wsgi import DeadlineMiddleware as WsgiDeadline

    reads: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        stream = environ["wsgi.input"]
        reads.append(stream.read())
        virtual_clock.advance(1.0)  # the deadline passes while the handler works
        reads.append(stream.read())
        start_response("200 OK", [])
        return [b"ok"]

    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/",
        "CONTENT_LENGTH": "4",
        "HTTP_X_YATAXI_CLIENT_TIMEOUTMS": "100",
        "wsgi.input": io.BytesIO(b"data"),
    }
    list(WsgiDeadline(app)(environ, lambda status, headers, exc_info=None: None))
    assert reads == [b"data", b""]


class _ReadOnly:
    """A PEP 3333 input with read() only (as gunicorn's), whose last bytes arrive 1 s late."""

    def __init__(self, clock: VirtualClock, data: bytes) -> None:
        self.clock, self.data = clock, data

    def read(self, size: int = -1) -> bytes:
        chunk, self.data = (self.data, b"") if size < 0 else (self.data[:size], self.data[size:])
        if not self.data:
            self.clock.advance(1.0)
        return chunk


def test_wsgi_readinto_over_a_read_only_input(virtual_clock: VirtualClock) -> None:
    """readinto() works over an input without one, and its last read after the deadline raises
    (a 498 answer, the app stopped at its read)."""
    from timebound.propagation.wsgi import DeadlineMiddleware as WsgiDeadline

    got: list[bytes] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        buffer = bytearray(3)
        n = environ["wsgi.input"].readinto(buffer)
        got.append(bytes(buffer[:n]))
        environ["wsgi.input"].readinto(buffer)  # the last 3 bytes: after the deadline
        got.append(b"never")
        start_response("200 OK", [])
        return [b"ok"]

    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/",
        "CONTENT_LENGTH": "6",
        "HTTP_X_YATAXI_CLIENT_TIMEOUTMS": "100",
        "wsgi.input": _ReadOnly(virtual_clock, b"abcdef"),
    }
    statuses: list[str] = []
    body = b"".join(WsgiDeadline(app)(environ, lambda s, h, e=None: statuses.append(s)))
    assert (statuses, body, got) == (["498 Deadline Expired"], b"Deadline expired", [b"abc"])
