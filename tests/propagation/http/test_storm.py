"""Storm tests: deadlines firing at random instants through the HTTP client adapters against a
real uvicorn server, bounded in count and time, with invariants checked afterwards.

The invariants: every reply that reaches a caller is that caller's own (the server echoes the
request's id); the client works afterwards (requests without a deadline succeed); and the storm
did cut exchanges short (otherwise it proved nothing). The pools are small so that requests
queue for a connection, where a cancelled request made httpcore leak connections until every
later request failed (encode/httpcore#1093).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import pytest
import requests

import timebound as tb
from timebound.propagation.aiohttp import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from timebound.propagation.requests import DeadlineAdapter

from .conftest import Receive, Scope, Send, ServerThread

SEED = 20261126


class Echo:
    """Answers ``/?id=N`` with ``N`` after a short random delay (seeded)."""

    def __init__(self) -> None:
        self._random = random.Random(SEED)
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        ident = scope["query_string"].decode().partition("=")[2].encode()
        with self._lock:
            delay = self._random.random() * 0.005
        await asyncio.sleep(delay)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(ident)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": ident})


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    """A module-wide echo server under uvicorn."""
    with ServerThread(Echo()) as srv:
        yield srv.url


@dataclass
class Tally:
    ok: int = 0
    cut: int = 0
    wrong: list[tuple[str, str]] | None = None

    def reply(self, ident: str, body: str) -> None:
        if body == ident:
            self.ok += 1
        else:
            self.wrong = [*(self.wrong or []), (ident, body)]


def _budgets(count: int, top: float) -> list[float]:
    rnd = random.Random(SEED)
    return [rnd.random() * top for _ in range(count)]


async def _async_storm(
    call: Callable[[str], Any], count: int, concurrency: int, top: float, *, cancels: bool = False
) -> Tally:
    """``cancels``: every other request is also cancelled from outside at a random instant."""
    tally = Tally()
    slots = asyncio.Semaphore(concurrency)
    outside = _budgets(count, top)[::-1]

    async def one(i: int, budget: float) -> None:
        async with slots:
            try:
                with tb.inherit_deadline(tb.Deadline.after(budget)):
                    if cancels and i % 2:
                        body = await asyncio.wait_for(call(str(i)), outside[i])
                    else:
                        body = await call(str(i))
            except (tb.DeadlineExceeded, TimeoutError):
                tally.cut += 1
                return
            tally.reply(str(i), body)

    await asyncio.gather(*(one(i, b) for i, b in enumerate(_budgets(count, top))))
    return tally


def _sync_storm(call: Callable[[str], str], count: int, threads: int, top: float) -> Tally:
    tally = Tally()
    lock = threading.Lock()

    def one(i: int, budget: float) -> None:
        try:
            with tb.inherit_deadline(tb.Deadline.after(budget)):
                body = call(str(i))
        except tb.DeadlineExceeded:
            with lock:
                tally.cut += 1
            return
        with lock:
            tally.reply(str(i), body)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count), _budgets(count, top)))
    return tally


@pytest.mark.asyncio_real
@pytest.mark.parametrize("cancels", [False, True], ids=["deadlines", "deadlines+cancels"])
@pytest.mark.parametrize("save_connections", [True, False])
async def test_httpx_async_client_works_after_a_deadline_storm(
    echo_url: str, save_connections: bool, cancels: bool
) -> None:
    """300 requests, 32 at a time over 8 connections, cut at random instants (and, with
    ``cancels``, half of them also cancelled from outside): the client works afterwards and no
    reply reaches the wrong caller."""
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=8))
    transport = AsyncDeadlineTransport(inner, timeout=5.0, save_connections=save_connections)
    async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:

        async def call(ident: str) -> str:
            return (await client.get(echo_url, params={"id": ident})).text

        tally = await _async_storm(call, count=300, concurrency=32, top=0.05, cancels=cancels)
        after = [await asyncio.wait_for(call(f"after{i}"), 10) for i in range(20)]
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(20)]


@pytest.mark.asyncio_real
@pytest.mark.parametrize("save_connections", [True, False])
async def test_httpx_async_client_survives_pool_waits_that_time_out(
    echo_url: str, save_connections: bool
) -> None:
    """300 requests, 64 at a time over 8 connections with a 60 ms pool timeout, so that pool
    waits end while connections are being handed over: no connection leaks
    (encode/httpcore#1093) and the client works afterwards."""
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=8))
    transport = AsyncDeadlineTransport(inner, save_connections=save_connections)
    async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:

        async def call(ident: str) -> str:
            return (await client.get(echo_url, params={"id": ident}, timeout=0.06)).text

        tally = await _async_storm(call, count=300, concurrency=64, top=0.05)
        after = [(await client.get(echo_url, params={"id": f"after{i}"})).text for i in range(20)]
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(20)]


def test_httpx_sync_client_works_after_a_deadline_storm(echo_url: str) -> None:
    """300 requests from 32 threads over 2 connections, cut at random instants: the client
    works afterwards and no reply reaches the wrong caller."""
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=2))
    with httpx.Client(transport=DeadlineTransport(inner, timeout=5.0), timeout=5.0) as client:

        def call(ident: str) -> str:
            return client.get(echo_url, params={"id": ident}).text

        tally = _sync_storm(call, count=300, threads=32, top=0.03)
        after = [call(f"after{i}") for i in range(10)]
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(10)]


def test_httpx_sync_client_survives_pool_waits_that_time_out(echo_url: str) -> None:
    """64 threads over 2 connections with a 40 ms pool timeout, so that pool waits end while
    connections are being handed over: no connection leaks (encode/httpcore#1093) and the
    client works afterwards."""
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=2))
    with httpx.Client(transport=DeadlineTransport(inner), timeout=5.0) as client:

        def call(ident: str) -> str:
            return client.get(echo_url, params={"id": ident}, timeout=0.04).text

        tally = _sync_storm(call, count=300, threads=64, top=0.03)
        after = [client.get(echo_url, params={"id": f"after{i}"}).text for i in range(10)]
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(10)]


def test_requests_session_works_after_a_deadline_storm(echo_url: str) -> None:
    """300 requests from 32 threads over a blocking pool of 2, cut at random instants: the
    session works afterwards and no reply reaches the wrong caller."""
    adapter = DeadlineAdapter(timeout=5.0, pool_maxsize=2, pool_block=True)
    with requests.Session() as session:
        session.mount("http://", adapter)

        def call(ident: str) -> str:
            return session.get(echo_url, params={"id": ident}, timeout=5.0).text

        tally = _sync_storm(call, count=300, threads=32, top=0.03)
        after = [call(f"after{i}") for i in range(10)]
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(10)]


@pytest.mark.asyncio_real
async def test_aiohttp_session_works_after_a_deadline_storm(echo_url: str) -> None:
    """150 requests, 32 at a time over 8 connections, cut at random instants: the session works
    afterwards and no reply reaches the wrong caller."""
    connector = aiohttp.TCPConnector(limit=8)
    async with aiohttp.ClientSession(
        connector=connector, middlewares=(DeadlineMiddleware(timeout=5.0),)
    ) as session:

        async def call(ident: str) -> str:
            async with session.get(echo_url, params={"id": ident}) as response:
                return await response.text()

        tally = await _async_storm(call, count=150, concurrency=32, top=0.05)
        after = [await asyncio.wait_for(call(f"after{i}"), 10) for i in range(10)]
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(10)]


def test_httpx_async_client_under_trio_works_after_a_deadline_storm(echo_url: str) -> None:
    """Under trio: 300 requests, 32 at a time over 8 connections, cut at random instants: the
    client works afterwards and no reply reaches the wrong caller."""
    import trio

    async def main() -> tuple[Tally, list[str]]:
        inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=8))
        transport = AsyncDeadlineTransport(inner, timeout=5.0)
        tally = Tally()
        slots = trio.CapacityLimiter(32)
        async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:

            async def call(ident: str) -> str:
                return (await client.get(echo_url, params={"id": ident})).text

            async def one(i: int, budget: float) -> None:
                async with slots:
                    try:
                        with tb.inherit_deadline(tb.Deadline.after(budget)):
                            body = await call(str(i))
                    except tb.DeadlineExceeded:
                        tally.cut += 1
                        return
                    tally.reply(str(i), body)

            async with trio.open_nursery() as nursery:
                for i, budget in enumerate(_budgets(300, 0.05)):
                    nursery.start_soon(one, i, budget)
            after = []
            for i in range(20):
                with trio.fail_after(10):
                    after.append(await call(f"after{i}"))
        return tally, after

    tally, after = trio.run(main)
    assert tally.wrong is None
    assert tally.cut > 0
    assert after == [f"after{i}" for i in range(20)]
