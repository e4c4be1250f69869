"""Where the budget went, across real uvicorn services A -> B -> C (D13.5)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests

import timebound as tb
from timebound import Breakdown
from timebound.policies import Policy
from timebound.propagation.aiohttp import DeadlineMiddleware as AiohttpMiddleware
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from timebound.propagation.requests import DeadlineAdapter as RequestsAdapter

from .conftest import ASGIApp, Receive, Scope, Send, ServerThread

HEADER = "x-timebound-breakdown"


async def _flaky_database() -> None:
    await asyncio.sleep(0.03)
    raise ConnectionError("database unreachable")


def service(next_url: str | None, work: float, *, expose: bool = True) -> ASGIApp:
    """Works ``work`` seconds, then calls ``next_url``; the last hop retries a failing database
    until its deadline cannot fit another delay and attempt (D3.3), which answers 498 early
    (D4.10). Each hop keeps a reserve for its answer (D1.18), as docs/breakdown.md recommends:
    the whole chain answers before the caller's own deadline even on a busy machine."""
    policy = Policy("database", retry=20, delay="200ms")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(work)
        if next_url is None:
            await policy.execute(_flaky_database)
        else:
            async with httpx.AsyncClient(transport=AsyncDeadlineTransport()) as client:
                r = await client.get(next_url)
                r.raise_for_status()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return DeadlineMiddleware(app, expose_breakdown=expose, cancel_on_expiry=True, reserve="150ms")


@pytest.fixture
def chain() -> Iterator[str]:
    with ServerThread(service(None, 0.05)) as c:
        with ServerThread(service(f"{c.url}/c", 0.05)) as b:
            with ServerThread(service(f"{b.url}/b", 0.05)) as a:
                yield f"{a.url}/a"


def adds_up(bd: Breakdown) -> None:
    for _, p in bd.walk():
        if p.parts:
            assert sum(c.elapsed_ms for c in p.parts) == pytest.approx(p.elapsed_ms, abs=0.01)


def hops(bd: Breakdown) -> list[Breakdown]:
    """The remote parts, outermost first."""
    return [p for _, p in bd.walk() if p.kind == "remote"]


def test_the_caller_of_a_sees_a_b_and_c(chain: str) -> None:
    with httpx.Client(transport=DeadlineTransport()) as client:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(1.5):
                client.get(chain)
    err = info.value
    assert err.source == "propagated"
    bd = err.breakdown
    assert bd is not None
    adds_up(bd)
    remotes = hops(bd)
    assert len(remotes) == 3, bd.render()
    a, b, c = remotes
    # Each service reports its own bound, its call to the next one and its own code's time.
    for r in (a, b):
        calls = [p for p in r.parts if p.kind in ("call", "scope")]
        assert calls, bd.render()
    # C's time went to its attempts at the database and the delays between them.
    in_c = [p for _, p in c.walk()]
    # (how many attempts fit depends on what the hops before C left it)
    assert {p.kind for p in in_c} >= {"attempt", "self"}, bd.render()
    assert next(p.outcome for p in in_c if p.kind == "attempt") == "ConnectionError"
    # Each call carries the budget it was sent, no more than its caller had.
    calls = [p for _, p in bd.walk() if p.kind == "call"]
    assert len(calls) == 3
    assert all(p.budget_ms is not None for p in calls)
    assert calls[0].budget_ms >= calls[1].budget_ms >= calls[2].budget_ms  # type: ignore[operator]
    # The nested times shrink hop by hop and never exceed the caller's 600 ms.
    assert bd.elapsed_ms >= a.elapsed_ms >= b.elapsed_ms >= c.elapsed_ms > 0
    assert bd.elapsed_ms < 1500 + 200
    assert "went to:" in str(err) and "\n" not in str(err)


def test_a_normal_answer_carries_it_only_when_asked() -> None:
    with ServerThread(service(None, 0.0, expose=True)) as c:
        # The last hop answers 498 once its deadline cannot fit another attempt.
        with httpx.Client() as plain:
            r = plain.get(f"{c.url}/x", headers={"X-YaTaxi-Client-TimeoutMs": "400"})
            assert r.status_code == 498
            bd = Breakdown.from_json(r.headers[HEADER])
            assert bd.kind == "bound" and 0 < bd.elapsed_ms < 400
    with ServerThread(_quick(expose=True)) as s:
        with httpx.Client() as plain:
            r = plain.get(s.url, headers={"X-YaTaxi-Client-TimeoutMs": "1000"})
            assert r.status_code == 200 and HEADER not in r.headers
            r = plain.get(
                s.url,
                headers={"X-YaTaxi-Client-TimeoutMs": "1000", "X-Timebound-Breakdown": "1"},
            )
            assert r.status_code == 200
            assert Breakdown.from_json(r.headers[HEADER]).outcome == "ok"


def test_off_unless_enabled() -> None:
    with ServerThread(service(None, 0.0, expose=False)) as c:
        with httpx.Client() as plain:
            r = plain.get(
                f"{c.url}/x",
                headers={"X-YaTaxi-Client-TimeoutMs": "50", "X-Timebound-Breakdown": "1"},
            )
            assert r.status_code == 498 and HEADER not in r.headers


def _quick(*, expose: bool) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return DeadlineMiddleware(app, expose_breakdown=expose)


def _answering(header: Any) -> ASGIApp:
    """A callee (no timebound) that answers 498 with a hostile breakdown header."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 498,
                "headers": [(b"x-yataxi-deadline-expired", b"1"), (HEADER.encode(), header)],
            }
        )
        await send({"type": "http.response.body", "body": b"Deadline expired"})

    return app


@pytest.mark.parametrize(
    "value",
    [b"{", b"[]", b'{"k":"bound","ms":-1}', b'{"k":"bound","ms":1,"p":' + b"[" * 500, b"x" * 3000],
)
def test_a_malformed_header_is_ignored(value: bytes, caplog: pytest.LogCaptureFixture) -> None:
    with ServerThread(_answering(value)) as s:
        with httpx.Client(transport=DeadlineTransport()) as client:
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.fail_after(5):
                    client.get(s.url)
    bd = info.value.breakdown
    assert bd is not None
    assert hops(bd) == []  # the call is there, the callee's tree is not
    assert next(p.kind for p in bd.parts) == "call"


def test_a_requests_caller_sees_a_b_and_c(chain: str) -> None:
    """The requests adapter folds a callee's breakdown into the call's part like httpx."""
    with requests.Session() as session:
        session.mount("http://", RequestsAdapter())
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(1.5):
                session.get(chain)
    err = info.value
    assert err.source == "propagated"
    bd = err.breakdown
    assert bd is not None
    adds_up(bd)
    assert len(hops(bd)) == 3, bd.render()
    calls = [p for _, p in bd.walk() if p.kind == "call"]
    assert len(calls) == 3 and calls[0].name is not None
    assert calls[0].name.startswith("GET 127.0.0.1/a"), bd.render()
    assert calls[0].outcome == "498"


def test_requests_asks_for_the_breakdown_when_told() -> None:
    seen: list[str | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        seen.append(headers.get(HEADER.encode(), b"").decode() or None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with ServerThread(app) as s:
        for ask in (False, True):
            with requests.Session() as session:
                session.mount("http://", RequestsAdapter(ask_breakdown=ask))
                with tb.fail_after(5):
                    assert session.get(s.url).status_code == 200
    assert seen == [None, "1"]


@pytest.mark.parametrize(
    "value",
    [b"{", b"[]", b'{"k":"bound","ms":-1}', b'{"k":"bound","ms":1,"p":' + b"[" * 500, b"x" * 3000],
)
def test_requests_ignores_a_malformed_header(value: bytes) -> None:
    with ServerThread(_answering(value)) as s:
        with requests.Session() as session:
            session.mount("http://", RequestsAdapter())
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.fail_after(5):
                    session.get(s.url)
    bd = info.value.breakdown
    assert bd is not None
    assert hops(bd) == []  # the call is there, the callee's tree is not
    assert next(p.kind for p in bd.parts) == "call"


def _aiohttp_session(**kw: Any) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(AiohttpMiddleware(**kw),))


@pytest.mark.asyncio_real
async def test_an_aiohttp_caller_sees_a_b_and_c(chain: str) -> None:
    """The aiohttp middleware folds a callee's breakdown into the call's part like httpx."""
    async with _aiohttp_session() as session:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(1.5):
                async with session.get(chain) as r:
                    await r.read()
    err = info.value
    assert err.source == "propagated"
    bd = err.breakdown
    assert bd is not None
    adds_up(bd)
    assert len(hops(bd)) == 3, bd.render()
    calls = [p for _, p in bd.walk() if p.kind == "call"]
    assert len(calls) == 3 and calls[0].name is not None
    assert calls[0].name.startswith("GET 127.0.0.1/a"), bd.render()
    assert calls[0].outcome == "498"


@pytest.mark.asyncio_real
async def test_aiohttp_asks_for_the_breakdown_when_told() -> None:
    seen: list[str | None] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        seen.append(headers.get(HEADER.encode(), b"").decode() or None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    with ServerThread(app) as s:
        for ask in (False, True):
            async with _aiohttp_session(ask_breakdown=ask) as session:
                with tb.fail_after(5):
                    async with session.get(s.url) as r:
                        assert r.status == 200
    assert seen == [None, "1"]


@pytest.mark.asyncio_real
@pytest.mark.parametrize(
    "value",
    [b"{", b"[]", b'{"k":"bound","ms":-1}', b'{"k":"bound","ms":1,"p":' + b"[" * 500, b"x" * 3000],
)
async def test_aiohttp_ignores_a_malformed_header(value: bytes) -> None:
    with ServerThread(_answering(value)) as s:
        async with _aiohttp_session() as session:
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.fail_after(5):
                    async with session.get(s.url) as r:
                        await r.read()
    bd = info.value.breakdown
    assert bd is not None
    assert hops(bd) == []  # the call is there, the callee's tree is not
    assert next(p.kind for p in bd.parts) == "call"
