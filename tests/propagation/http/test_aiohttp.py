"""The aiohttp client middleware against a real uvicorn server (D4.3, D4.5, D4.8)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from yarl import URL

import timebound as tb
from timebound._core._request import _request
from timebound.propagation import RequestState
from timebound.propagation.aiohttp import AttemptTimeout, DeadlineMiddleware
from timebound.testing import VirtualClock

from .conftest import TIMEOUT_HEADER, Downstream


def session(**kw: object) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(middlewares=(DeadlineMiddleware(**kw),))  # type: ignore[arg-type]


async def test_header_and_static_timeout(
    svc: tuple[Downstream, str], virtual_clock: VirtualClock
) -> None:
    """The header is our remaining time; without a deadline, the session's total."""
    # Virtual time that stands still during the real exchange (no autojump while real I/O is
    # pending for under an hour): a slow connect cannot spend the budget, and the header is exact.
    virtual_clock.autojump_threshold = 3600
    app, url = svc
    async with aiohttp.ClientSession(
        middlewares=(DeadlineMiddleware(),), timeout=aiohttp.ClientTimeout(total=7200)
    ) as s:
        with tb.fail_after(60):
            async with s.get(f"{url}/ok") as r:
                assert await r.text() == "ok"
        async with s.get(f"{url}/ok") as r:
            await r.read()
    assert [x.timeout_ms for x in app.seen] == [60_000, 7_200_000]


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


async def test_body_read_is_bounded(
    svc: tuple[Downstream, str], virtual_clock: VirtualClock
) -> None:
    """Reading a body that stalls after its first chunk ends at the attempt's total."""
    # As in the stream-reader test below: the total must cut the *read*, not a slow connect.
    virtual_clock.autojump_threshold = 3600
    _, url = svc
    async with session(timeout=60) as s:
        async with s.get(f"{url}/stream") as r:
            read = asyncio.ensure_future(r.read())
            await asyncio.sleep(0)  # the read runs until it waits for the body
            virtual_clock.advance(60)
            with pytest.raises(AttemptTimeout) as info:
                await read
    assert isinstance(info.value, aiohttp.ServerTimeoutError) and not info.value.remote
    assert virtual_clock.now() == 60.0


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


@pytest.mark.asyncio_real
async def test_no_deadline_and_no_timeout_sends_no_header(svc: tuple[Downstream, str]) -> None:
    """With neither a deadline nor any static timeout, no header is sent (D4.3)."""
    app, url = svc
    async with aiohttp.ClientSession(
        middlewares=(DeadlineMiddleware(),), timeout=aiohttp.ClientTimeout(total=None)
    ) as s:
        async with s.get(f"{url}/ok") as r:
            assert await r.text() == "ok"
    assert [x.timeout_ms for x in app.seen] == [None]
    assert TIMEOUT_HEADER not in app.seen[0].headers


async def _drain(content: Any, reader: str) -> list[bytes]:
    """Read ``content`` with one of aiohttp's stream APIs until it ends or raises."""
    got: list[bytes] = []
    if reader.startswith("iter") or reader == "aiter":
        iterators: dict[str, Callable[[], Any]] = {
            "iter_chunked": lambda: content.iter_chunked(5),
            "iter_any": lambda: content.iter_any(),
            "iter_chunks": lambda: content.iter_chunks(),
            "aiter": lambda: content,
        }
        iterator = iterators[reader]()
        async for item in iterator:
            got.append(item[0] if isinstance(item, tuple) else item)
        return got
    steps: dict[str, Callable[[], Any]] = {
        "readany": lambda: content.readany(),
        "readline": lambda: content.readline(),
        "readuntil": lambda: content.readuntil(b"\n"),
        "readexactly": lambda: content.readexactly(9),
        "readchunk": lambda: content.readchunk(),
    }
    while True:
        item = await steps[reader]()
        data = item[0] if isinstance(item, tuple) else item
        if not data:
            return got
        got.append(data)


@pytest.mark.parametrize(
    "reader",
    [
        "readany",
        "readline",
        "readuntil",
        "readexactly",
        "readchunk",
        "iter_chunked",
        "iter_any",
        "iter_chunks",
        "aiter",
    ],
)
async def test_every_stream_reader_is_cut_by_the_deadline(
    svc: tuple[Downstream, str], reader: str, virtual_clock: VirtualClock
) -> None:
    """Each ``response.content`` reader of a stalled body ends at our deadline (inherited)."""
    # The budget must cut the *read*, not the connect: on virtual time that only the test moves
    # (no autojump while real I/O is pending for under an hour), a slow connect or slow headers
    # under load spend none of it; the test reaches the deadline once the reader is waiting.
    virtual_clock.autojump_threshold = 3600
    _, url = svc
    state = RequestState()
    token = _request.set(state)
    try:
        async with session(timeout=7200) as s:
            with tb.inherit_deadline(tb.Deadline.after(60)):
                async with s.get(f"{url}/stream") as r:
                    drain = asyncio.ensure_future(_drain(r.content, reader))
                    await asyncio.sleep(0)  # the reader runs until it waits for the body
                    virtual_clock.advance(60)
                    with pytest.raises(tb.DeadlineExceeded) as info:
                        await drain
        assert info.value.source == "inherited" and state.cancelled_by_deadline
        assert virtual_clock.now() == 60.0
    finally:
        _request.reset(token)


@pytest.mark.asyncio_real
async def test_stream_readers_return_the_whole_body_in_time(svc: tuple[Downstream, str]) -> None:
    """Within the deadline the bounded readers return exactly the body, chunk by chunk."""
    _, url = svc
    async with session(timeout=5) as s:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            for reader in ("iter_chunked", "readchunk", "readline", "readuntil", "aiter"):
                async with s.get(f"{url}/ok") as r:
                    assert b"".join(await _drain(r.content, reader)) == b"ok", reader
            async with s.get(f"{url}/ok") as r:
                assert await r.content.readexactly(2) == b"ok"


@pytest.mark.asyncio_real
async def test_own_read_timeout_inside_the_budget_stays_aiohttp_own(
    svc: tuple[Downstream, str],
) -> None:
    """aiohttp's own socket-read timeout firing before our deadline is aiohttp's, unmarked."""
    _, url = svc
    state = RequestState()
    token = _request.set(state)
    try:
        async with aiohttp.ClientSession(
            middlewares=(DeadlineMiddleware(timeout=5),),
            timeout=aiohttp.ClientTimeout(sock_read=0.05),
        ) as s:
            with tb.inherit_deadline(tb.Deadline.after(5)):
                with pytest.raises(aiohttp.ServerTimeoutError) as info:
                    await s.get(f"{url}/slow")
            async with s.get(f"{url}/ok") as r:
                assert r.status == 200
        assert not isinstance(info.value, tb.DeadlineExceeded)
        assert not state.cancelled_by_deadline
    finally:
        _request.reset(token)


async def test_own_read_timeout_at_the_attempt_end_is_the_attempt_timeout(
    virtual_clock: VirtualClock,
) -> None:
    """aiohttp's read timeout raised once the attempt's end is reached is our AttemptTimeout."""

    async def handler(request: Any) -> Any:
        await asyncio.sleep(0.1)
        virtual_clock.jump_to(5.0)  # aiohttp's socket timer and ours are due at the same instant
        raise aiohttp.ServerTimeoutError("Timeout on reading data from socket")

    request = SimpleNamespace(
        method="GET", url=URL("http://127.0.0.1/slow"), headers=CIMultiDict[str]()
    )
    with pytest.raises(AttemptTimeout) as info:
        await DeadlineMiddleware(timeout=5)(request, handler)  # type: ignore[arg-type]
    assert (virtual_clock.now(), info.value.timeout, info.value.remote) == (5.0, 5.0, False)
    assert isinstance(info.value.__cause__, aiohttp.ServerTimeoutError)
    assert request.headers[TIMEOUT_HEADER] == "5000"
