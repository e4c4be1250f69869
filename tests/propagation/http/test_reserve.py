"""The server middleware's reserve (D1.18): the handler sees the request's deadline less the
reserve, so it has time to answer its fallback, or the middleware to answer 498, before the
caller gives up."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport
from timebound.propagation.wsgi import DeadlineMiddleware as WsgiDeadline
from timebound.testing import VirtualClock

from .conftest import Downstream, Receive, Scope, Send, ServerThread, call_asgi

H = "X-YaTaxi-Client-TimeoutMs"


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def test_the_handler_sees_the_request_deadline_less_the_reserve(
    virtual_clock: VirtualClock,
) -> None:
    seen: list[float] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(tb.remaining())
        await _answer(send, 200, b"ok")

    result = await call_asgi(DeadlineMiddleware(app, reserve="100ms"), {H: "1000"})
    assert result.status == 200
    assert seen == [pytest.approx(0.9)]


async def test_the_handler_answers_its_fallback_in_the_reserve(
    virtual_clock: VirtualClock,
) -> None:
    """Without the reserve the downstream wait would end at the request's deadline, and the
    answer would be replaced by 498; with it the fallback is answered at 0.9 s."""
    errors: list[tb.DeadlineExceeded] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with tb.fail_after(30, what="downstream"):
                await asyncio.sleep(60)
            body = b"fresh"
        except tb.DeadlineExceeded as exc:
            errors.append(exc)
            body = b"fallback"
        await _answer(send, 200, body)

    start = virtual_clock.now()
    result = await call_asgi(DeadlineMiddleware(app, reserve="100ms"), {H: "1000"})
    assert (result.status, result.body) == (200, b"fallback")
    assert virtual_clock.now() - start == pytest.approx(0.9)
    assert [(e.source, e.set_by) for e in errors] == [("inherited", "reserve of ASGI middleware")]


async def test_a_handler_that_lets_the_reserve_error_escape_is_answered_498(
    virtual_clock: VirtualClock,
) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        async with tb.fail_after(30):
            await asyncio.sleep(60)

    start = virtual_clock.now()
    result = await call_asgi(DeadlineMiddleware(app, reserve="100ms"), {H: "1000"})
    assert result.status == 498
    assert virtual_clock.now() - start == pytest.approx(0.9)


async def test_a_request_with_no_more_than_the_reserve_left_is_refused(
    virtual_clock: VirtualClock,
) -> None:
    calls = 0

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        nonlocal calls
        calls += 1
        await _answer(send, 200, b"ok")

    result = await call_asgi(DeadlineMiddleware(app, reserve="200ms"), {H: "150"})
    assert result.status == 498
    assert calls == 0


async def test_cancel_on_expiry_still_ends_the_handler_at_the_request_deadline(
    virtual_clock: VirtualClock,
) -> None:
    """The reserve is inside the cancel scope: code awaiting directly in the handler keeps the
    reserve and is cancelled at the request's own deadline."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await asyncio.sleep(60)

    start = virtual_clock.now()
    mw = DeadlineMiddleware(app, reserve="100ms", cancel_on_expiry=True)
    result = await call_asgi(mw, {H: "1000"})
    assert result.status == 498
    assert virtual_clock.now() - start == pytest.approx(1.0)


@pytest.mark.parametrize("bad", [-1, "-5ms", "soon"])
def test_an_invalid_middleware_reserve_is_a_configuration_error(bad: Any) -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError

    for make in (DeadlineMiddleware, WsgiDeadline):
        with pytest.raises(tb.ConfigurationError) as info:
            make(app, reserve=bad)
        assert info.value.option == "reserve"


def test_wsgi_handler_sees_the_reserve_and_answers_its_fallback(
    virtual_clock: VirtualClock,
) -> None:
    seen: list[float] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.append(tb.remaining())
        try:
            with tb.fail_after(30):
                virtual_clock.advance(0.95)
                tb.checkpoint()
            body = b"fresh"
        except tb.DeadlineExceeded as exc:
            assert exc.set_by == "reserve of WSGI middleware"
            body = b"fallback"
        start_response("200 OK", [])
        return [body]

    status: list[str] = []
    mw = WsgiDeadline(app, reserve="100ms")
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "HTTP_X_YATAXI_CLIENT_TIMEOUTMS": "1000"}
    body = b"".join(mw(environ, lambda s, h, e=None: status.append(s)))
    assert (status, body) == (["200 OK"], b"fallback")
    assert seen == [pytest.approx(0.9)]


def test_wsgi_reserve_error_escaping_is_answered_498(virtual_clock: VirtualClock) -> None:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        virtual_clock.advance(0.95)
        tb.checkpoint()
        raise AssertionError("unreachable")

    status: list[str] = []
    mw = WsgiDeadline(app, reserve="100ms")
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "HTTP_X_YATAXI_CLIENT_TIMEOUTMS": "1000"}
    b"".join(mw(environ, lambda s, h, e=None: status.append(s)))
    assert status[0].startswith("498")


# A real uvicorn server and a real downstream ------------------------------------------------


def test_uvicorn_handler_answers_its_fallback_before_the_caller_deadline() -> None:
    """The caller gives 2 s; the handler calls a downstream that never answers in time. With a
    500 ms reserve the propagated call is cut at 1.5 s and the handler's fallback reaches the
    caller, whose own 2 s timeout never fires; the downstream was told 1.5 s at most."""
    down = Downstream()
    with ServerThread(down) as down_srv:
        client = httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=30.0))

        async def app(scope: Scope, receive: Receive, send: Send) -> None:
            await receive()
            try:
                response = await client.get(f"{down_srv.url}/slow")
                body = f"fresh {response.status_code}".encode()
            except tb.DeadlineExceeded as exc:
                body = f"fallback: {exc.set_by}".encode()
            await _answer(send, 200, body)

        try:
            with ServerThread(DeadlineMiddleware(app, reserve="500ms")) as srv:
                response = httpx.get(f"{srv.url}/", headers={H: "2000"}, timeout=2.0)
        finally:
            down.release.set()
            asyncio.run(client.aclose())
    assert (response.status_code, response.text) == (200, "fallback: reserve of ASGI middleware")
    sent = [s.timeout_ms for s in down.seen]
    assert len(sent) == 1 and sent[0] is not None and sent[0] <= 1500


async def test_a_downstream_498_escaping_under_the_reserve_is_answered_498(
    virtual_clock: VirtualClock,
) -> None:
    """The downstream was sent the reserved deadline and answered 498: the handler's budget,
    the request's deadline less the reserve, is spent. The error it lets escape says so
    (``set_by``), and the middleware answers 498 in time, with its breakdown, instead of
    failing the request with a 500."""
    seen: list[tuple[str, str | None]] = []

    def expired(request: httpx.Request) -> httpx.Response:
        return httpx.Response(498, headers={"X-YaTaxi-Deadline-Expired": "1"}, content=b"late")

    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(httpx.MockTransport(expired)))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await client.get("http://downstream/x")
        except tb.DeadlineExceeded as exc:
            seen.append((exc.source, exc.set_by))
            raise
        await _answer(send, 200, b"fresh")

    mw = DeadlineMiddleware(app, reserve="100ms", expose_breakdown=True)
    result = await call_asgi(mw, {H: "1000"})
    assert seen == [("propagated", "reserve of ASGI middleware")]
    assert result.status == 498
    tree = tb.Breakdown.from_json(result.headers["x-timebound-breakdown"])
    assert [p.kind for p in tree.parts] == ["call", "self"]


async def test_a_retry_stopped_early_under_the_reserve_is_answered_498(
    virtual_clock: VirtualClock,
) -> None:
    """A policy in the handler stops retrying because the handler's budget (the request's
    deadline less the reserve) cannot fit another delay and attempt (D3.3). That bound is the
    middleware's reserve: the error names it (``set_by``), and the middleware answers 498 early
    with its breakdown (D4.10), not a 500."""
    from timebound.policies import Policy

    policy = Policy("database", retry=5, delay="300ms")
    seen: list[tuple[str, str | None]] = []

    async def down() -> None:
        await asyncio.sleep(0.05)
        raise ConnectionError("database unreachable")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await policy.execute(down)
        except tb.DeadlineExceeded as exc:
            seen.append((exc.source, exc.set_by))
            raise
        await _answer(send, 200, b"fresh")

    mw = DeadlineMiddleware(app, reserve="100ms", expose_breakdown=True)
    result = await call_asgi(mw, {H: "1000"})
    assert seen and seen[0][1] == "reserve of ASGI middleware"
    assert result.status == 498
    assert "x-timebound-breakdown" in result.headers
