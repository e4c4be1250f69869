"""The aiohttp client middleware against a real uvicorn server (D4.3, D4.5, D4.8)."""

from __future__ import annotations

import aiohttp
import pytest

import timebound as tb
from timebound.propagation import RequestState
from timebound.propagation._state import _request
from timebound.propagation.aiohttp import AttemptTimeout, DeadlineMiddleware

from .conftest import Downstream


def session(**kw: object) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(DeadlineMiddleware(**kw),))  # type: ignore[arg-type]


@pytest.mark.asyncio_real
async def test_header_and_static_timeout(svc: tuple[Downstream, str]) -> None:
    """The header is <= our remaining time; without a deadline, the session's total."""
    app, url = svc
    async with aiohttp.ClientSession(
        middlewares=(DeadlineMiddleware(),), timeout=aiohttp.ClientTimeout(total=7)
    ) as s:
        with tb.fail_after(0.4):
            async with s.get(f"{url}/ok") as r:
                assert await r.text() == "ok"
        async with s.get(f"{url}/ok") as r:
            await r.read()
    first, second = (x.timeout_ms for x in app.seen)
    assert first is not None and 1 <= first <= 400
    assert second == 7000


@pytest.mark.asyncio_real
async def test_expired_sends_nothing(svc: tuple[Downstream, str]) -> None:
    """No time left: DeadlineExceeded at once and nothing reaches the server."""
    app, url = svc
    async with session(timeout=5) as s:
        with tb.inherit_deadline(tb.Deadline.after(0)), pytest.raises(tb.DeadlineExceeded):
            await s.get(f"{url}/ok")
    assert app.seen == []


@pytest.mark.asyncio_real
async def test_slow_server_cut_and_session_reusable(svc: tuple[Downstream, str]) -> None:
    """A stalled exchange is cut by the request's deadline; the session keeps working."""
    _, url = svc
    state = RequestState()
    token = _request.set(state)
    try:
        async with session(timeout=5) as s:
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    await s.get(f"{url}/slow")
            assert info.value.source == "inherited" and state.cancelled_by_deadline
            async with s.get(f"{url}/ok") as r:
                assert r.status == 200
    finally:
        _request.reset(token)


@pytest.mark.asyncio_real
async def test_body_read_is_bounded(svc: tuple[Downstream, str]) -> None:
    """Reading a body that stalls after its first chunk ends at the attempt's total."""
    _, url = svc
    async with session(timeout=0.3) as s:
        async with s.get(f"{url}/stream") as r:
            with pytest.raises(AttemptTimeout) as info:
                await r.read()
    assert isinstance(info.value, aiohttp.ServerTimeoutError) and not info.value.remote


@pytest.mark.asyncio_real
async def test_remote_expiry_cases(svc: tuple[Downstream, str]) -> None:
    """D4.5: propagated when our deadline set the timeout, AttemptTimeout otherwise; one conn."""
    app, url = svc
    async with session(timeout=5) as s:
        with tb.inherit_deadline(tb.Deadline.after(2)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                await s.get(f"{url}/expired")
        assert info.value.source == "propagated"
        with pytest.raises(AttemptTimeout) as info2:
            await s.get(f"{url}/expired")
        assert info2.value.remote
    assert len({x.client_port for x in app.seen}) == 1
