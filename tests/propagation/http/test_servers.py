"""The middlewares under real servers: uvicorn + FastAPI, hypercorn + Starlette, werkzeug + Flask.

Timing here is real, so handlers sleep far longer than the deadline and tests assert outcomes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound.propagation.asgi import DeadlineMiddleware as AsgiDeadline
from timebound.propagation.wsgi import DeadlineMiddleware as WsgiDeadline

from .conftest import HOSTILE_HEADERS, ServerThread

H = "X-YaTaxi-Client-TimeoutMs"


class Calls:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.finished: list[str] = []


def fastapi_app(calls: Calls, *, cancel_on_expiry: bool = False) -> Any:
    from fastapi import FastAPI

    app = FastAPI()
    app.add_middleware(AsgiDeadline, cancel_on_expiry=cancel_on_expiry)

    @app.get("/sleep/{seconds}")
    async def sleep(seconds: float) -> dict[str, Any]:
        calls.started.append("sleep")
        left = tb.remaining()
        await asyncio.sleep(seconds)
        calls.finished.append("sleep")
        return {"remaining_ms": None if left == float("inf") else left * 1000}

    return app


@pytest.fixture(scope="module")
def fastapi_server() -> Iterator[tuple[Calls, str]]:
    calls = Calls()
    with ServerThread(fastapi_app(calls)) as srv:
        yield calls, srv.url


@pytest.fixture
def fa(fastapi_server: tuple[Calls, str]) -> tuple[Calls, str]:
    calls, url = fastapi_server
    calls.started.clear()
    calls.finished.clear()
    return calls, url


def test_fastapi_expired_on_arrival(fa: tuple[Calls, str]) -> None:
    """uvicorn + FastAPI: an expired request gets 498 and the handler is never called."""
    calls, url = fa
    r = httpx.get(f"{url}/sleep/0", headers={H: "0"})
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert r.headers["X-YaTaxi-Deadline-Expired"] == "1"
    assert calls.started == []


def test_fastapi_handler_sees_the_deadline(fa: tuple[Calls, str]) -> None:
    """uvicorn + FastAPI: the handler's remaining budget is at most the header's."""
    _, url = fa
    r = httpx.get(f"{url}/sleep/0", headers={H: "300"})
    assert r.status_code == 200
    assert 0 < r.json()["remaining_ms"] <= 300


def test_fastapi_late_handler_replaced(fa: tuple[Calls, str]) -> None:
    """uvicorn + FastAPI: a handler answering after the deadline has its response replaced."""
    calls, url = fa
    r = httpx.get(f"{url}/sleep/0.4", headers={H: "50"})
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert calls.finished == ["sleep"]


@pytest.mark.parametrize("value", HOSTILE_HEADERS)
def test_fastapi_hostile_header_is_no_deadline(fa: tuple[Calls, str], value: str) -> None:
    """uvicorn + FastAPI: an unreadable header never fails the request."""
    _, url = fa
    r = httpx.get(f"{url}/sleep/0", headers={H: value.encode("latin-1")})
    assert r.status_code == 200 and r.json()["remaining_ms"] is None


def test_fastapi_cancel_on_expiry() -> None:
    """uvicorn + FastAPI: cancel_on_expiry stops the handler at the deadline and answers 498."""
    calls = Calls()
    with ServerThread(fastapi_app(calls, cancel_on_expiry=True)) as srv:
        r = httpx.get(f"{srv.url}/sleep/30", headers={H: "100"}, timeout=10)
    assert r.status_code == 498
    assert calls.started == ["sleep"] and calls.finished == []


def starlette_app(calls: Calls) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def sleep(request: Request) -> PlainTextResponse:
        calls.started.append("sleep")
        await asyncio.sleep(float(request.path_params["seconds"]))
        calls.finished.append("sleep")
        return PlainTextResponse("done")

    app = Starlette(routes=[Route("/sleep/{seconds}", sleep)])
    return AsgiDeadline(app)


def test_hypercorn_starlette_expired_and_late() -> None:
    """hypercorn + Starlette: expired on arrival and late answers both become 498."""
    calls = Calls()
    with ServerThread(starlette_app(calls), kind="hypercorn") as srv:
        expired = httpx.get(f"{srv.url}/sleep/0", headers={H: "-0"})
        late = httpx.get(f"{srv.url}/sleep/0.4", headers={H: "50"})
        fine = httpx.get(f"{srv.url}/sleep/0", headers={H: "5000"})
    assert expired.status_code == 498 and late.status_code == 498
    assert late.headers["x-yataxi-deadline-expired"] == "1"
    assert fine.text == "done"
    assert calls.started == ["sleep", "sleep"]


def flask_app(calls: Calls) -> Any:
    from flask import Flask, jsonify

    app = Flask(__name__)

    @app.get("/sleep/<float:seconds>")
    def sleep(seconds: float) -> Any:
        calls.started.append("sleep")
        left = tb.remaining()
        time.sleep(seconds)  # real blocking work in the handler thread
        calls.finished.append("sleep")
        return jsonify(remaining_ms=None if left == float("inf") else left * 1000)

    app.wsgi_app = WsgiDeadline(app.wsgi_app)  # type: ignore[method-assign]
    return app


@pytest.fixture(scope="module")
def flask_server() -> Iterator[tuple[Calls, str]]:
    calls = Calls()
    with ServerThread(flask_app(calls), kind="wsgi") as srv:
        yield calls, srv.url


def test_flask_expired_on_arrival(flask_server: tuple[Calls, str]) -> None:
    """werkzeug + Flask: an expired request gets 498 and the view is never called."""
    calls, url = flask_server
    calls.started.clear()
    r = httpx.get(f"{url}/sleep/0.0", headers={H: "0"})
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert calls.started == []


def test_flask_deadline_and_late_answer(flask_server: tuple[Calls, str]) -> None:
    """werkzeug + Flask: the view sees the deadline, and a late view is replaced."""
    _, url = flask_server
    fine = httpx.get(f"{url}/sleep/0.0", headers={H: "300"})
    assert fine.status_code == 200 and 0 < fine.json()["remaining_ms"] <= 300
    late = httpx.get(f"{url}/sleep/0.3", headers={H: "50"})
    assert (late.status_code, late.text) == (498, "Deadline expired")
