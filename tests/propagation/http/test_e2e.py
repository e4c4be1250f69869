"""End to end: a request entering a FastAPI service with 300 ms carries <= 300 ms downstream."""

from __future__ import annotations

import httpx

from .conftest import Downstream, ServerThread, build_propagating_service

H = "X-YaTaxi-Client-TimeoutMs"


def test_deadline_crosses_two_hops(svc: tuple[Downstream, str]) -> None:
    """A (FastAPI, 300 ms) -> B (FastAPI) -> C: each hop sees no more than the hop before."""
    recorder, c_url = svc
    with ServerThread(build_propagating_service(downstream_url=f"{c_url}/ok")) as b:
        with ServerThread(build_propagating_service(downstream_url=f"{b.url}/work")) as a:
            r = httpx.get(f"{a.url}/work", headers={H: "300"})
    assert r.status_code == 200
    body = r.json()
    assert body["deadline_received_ms"] == 300
    assert 0 < body["remaining_ms"] <= 300
    second = body["downstream"]
    assert 1 <= second["deadline_received_ms"] <= 300
    assert 0 < second["remaining_ms"] <= second["deadline_received_ms"]
    assert second["downstream_status"] == 200
    third = recorder.seen[-1].timeout_ms
    assert third is not None and 1 <= third <= second["deadline_received_ms"]


def test_expired_second_hop_makes_first_answer_498(svc: tuple[Downstream, str]) -> None:
    """B answers "deadline expired" for our deadline, so A answers 498 too (D4.5)."""
    _, c_url = svc
    with ServerThread(build_propagating_service(downstream_url=f"{c_url}/expired")) as a:
        r = httpx.get(f"{a.url}/work", headers={H: "2000"})
    assert (r.status_code, r.text) == (498, "Deadline expired")
    assert r.headers["x-yataxi-deadline-expired"] == "1"


def test_without_header_no_deadline_crosses(svc: tuple[Downstream, str]) -> None:
    """Without a deadline the only thing sent downstream is the client's static timeout."""
    recorder, c_url = svc
    with ServerThread(build_propagating_service(downstream_url=f"{c_url}/ok")) as a:
        r = httpx.get(f"{a.url}/work")
    assert r.json()["remaining_ms"] is None
    assert recorder.seen[-1].timeout_ms == 5000


def test_swallowed_propagated_expiry_still_answers_498(svc: tuple[Downstream, str]) -> None:
    """A handler that catches the downstream's propagated expiry and answers 200 is overruled."""
    from fastapi import FastAPI

    import timebound as tb
    from timebound.propagation.asgi import DeadlineMiddleware
    from timebound.propagation.httpx import AsyncDeadlineTransport

    _, c_url = svc
    app = FastAPI()
    app.add_middleware(DeadlineMiddleware)
    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5))

    @app.get("/swallow")
    async def swallow() -> dict[str, str]:
        try:
            await client.get(f"{c_url}/expired")
        except tb.DeadlineExceeded:
            return {"result": "fallback"}  # userver: the handler must answer "Deadline expired"
        return {"result": "downstream"}

    with ServerThread(app) as a:
        r = httpx.get(f"{a.url}/swallow", headers={H: "2000"})
    assert (r.status_code, r.text) == (498, "Deadline expired")


def test_flask_with_requests_forwards_the_deadline(svc: tuple[Downstream, str]) -> None:
    """A Flask app (WSGI) calling downstream with requests carries <= its received deadline."""
    import requests
    from flask import Flask

    from timebound.propagation.requests import DeadlineAdapter
    from timebound.propagation.wsgi import DeadlineMiddleware

    recorder, c_url = svc
    app = Flask(__name__)
    app.wsgi_app = DeadlineMiddleware(app.wsgi_app)  # type: ignore[method-assign]
    session = requests.Session()
    session.mount("http://", DeadlineAdapter(timeout=5))

    @app.get("/forward")
    def forward() -> str:
        return str(session.get(f"{c_url}/ok").status_code)

    with ServerThread(app, kind="wsgi") as a:
        r = httpx.get(f"{a.url}/forward", headers={H: "300"})
    assert r.text == "200"
    sent = recorder.seen[-1].timeout_ms
    assert sent is not None and 1 <= sent <= 300
