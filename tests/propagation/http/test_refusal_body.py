"""A peer answering "deadline expired" (498) with a huge body: the client reads at most a short
body to keep the connection (D4.8) and closes a longer one unread, so the refusal costs no more
memory than the cap, whatever the peer sends."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
import httpx
import pytest
import requests

import timebound as tb
from timebound.propagation.aiohttp import DeadlineMiddleware as AiohttpMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from timebound.propagation.requests import DeadlineAdapter

from .conftest import Receive, Scope, Send, ServerThread

MiB = 1024 * 1024
HUGE = 512 * MiB  # streamed by the server in chunks; read whole, the client would hold it all
CHUNK = b"x" * MiB


async def _huge_refusal(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"x-yataxi-deadline-expired", b"1"), (b"content-type", b"text/plain")]
    await send({"type": "http.response.start", "status": 498, "headers": headers})
    sent = 0
    while sent < HUGE:
        await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
        sent += len(CHUNK)
    await send({"type": "http.response.body", "body": b""})


@pytest.fixture(scope="module")
def peer() -> Iterator[str]:
    with ServerThread(_huge_refusal) as s:
        yield s.url


@contextmanager
def _peak() -> Iterator[list[float]]:
    """The most Python memory held at once inside the block, in MiB (the body's bytes count)."""
    out: list[float] = []
    tracemalloc.start()
    try:
        yield out
        out.append(tracemalloc.get_traced_memory()[1] / MiB)
    finally:
        tracemalloc.stop()


def test_httpx_sync(peer: str) -> None:
    with _peak() as peak, httpx.Client(transport=DeadlineTransport()) as client:
        with pytest.raises(tb.DeadlineExceeded), tb.fail_after(30):
            client.get(peer)
    assert peak[0] < 16, peak  # the whole body would be 512 MiB


def test_requests(peer: str) -> None:
    with _peak() as peak, requests.Session() as session:
        session.mount("http://", DeadlineAdapter())
        with pytest.raises(tb.DeadlineExceeded), tb.fail_after(30):
            session.get(peer)
    assert peak[0] < 16, peak


@pytest.mark.asyncio_real
async def test_httpx_async(peer: str) -> None:
    with _peak() as peak:
        async with httpx.AsyncClient(transport=AsyncDeadlineTransport()) as client:
            with pytest.raises(tb.DeadlineExceeded), tb.fail_after(30):
                await client.get(peer)
    assert peak[0] < 16, peak


@pytest.mark.asyncio_real
async def test_aiohttp(peer: str) -> None:
    with _peak() as peak:
        async with aiohttp.ClientSession(middlewares=(AiohttpMiddleware(),)) as session:
            with pytest.raises(tb.DeadlineExceeded), tb.fail_after(30):
                async with session.get(peer) as r:
                    await r.read()
    assert peak[0] < 16, peak
