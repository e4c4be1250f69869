"""A peer answering 503 under ``policy=`` with an endless body (D4.14): every client reads at
most ``REFUSAL_BODY_MAX`` of each failed answer, closes the rest unread, and returns the last
answer holding those first bytes, marked truncated; a body of exactly the cap is read whole and
its connection kept for the retry.

The peer is a raw socket server counting the body bytes the kernel accepted from it: read
whole, an endless body would run until the test's deadline; read up to the cap and closed, the
server stops at the cap plus what the sockets' buffers hold.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests

import timebound as tb
from timebound.policies import Policy
from timebound.propagation._client import REFUSAL_BODY_MAX
from timebound.propagation._resilience import TRUNCATED
from timebound.propagation.aiohttp import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from timebound.propagation.requests import DeadlineAdapter

MiB = 1024 * 1024
CHUNK = 64 * 1024
#: The most the server may have sent when the client stops at the cap: the cap, plus what the
#: loopback sockets' send and receive buffers absorb (a few MiB on Linux), far below "endless".
BOUNDED = 32 * MiB


class Peer:
    """Answers every request 503 (``Retry-After: 0``): ``endless`` with a chunked body that
    never ends, else with exactly ``REFUSAL_BODY_MAX`` bytes, keeping the connection open."""

    def __init__(self, *, endless: bool, delay: float = 0.0) -> None:
        self.endless = endless
        self.delay = delay  # seconds before the answer's head is sent
        self.gone = threading.Event()  # a client closed a connection the body was sent on
        self.sent = 0  # body bytes the kernel accepted
        self.requests = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._conns: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}/items"

    def __enter__(self) -> Peer:
        self._threads[0].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with self._lock:
            conns = [self._listener, *self._conns]
        for conn in conns:  # shutting the listener down wakes its accept()
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        for thread in self._threads:
            thread.join(timeout=10)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._conns.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while self._read_request(conn):
                with self._lock:
                    self.requests += 1
                if self._stop.wait(self.delay):
                    return
                if self.endless:
                    self._send_endless(conn)
                    return
                head = f"Content-Length: {REFUSAL_BODY_MAX}\r\n"
                conn.sendall(self._head(head) + b"x" * REFUSAL_BODY_MAX)
        except OSError:
            self.gone.set()
            return  # the client closed the connection: what it is expected to do

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            got = conn.recv(65536)
            if not got:
                return False
            data += got
        return True

    @staticmethod
    def _head(extra: str) -> bytes:
        return (
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 0\r\n"
            f"Content-Type: text/plain\r\n{extra}\r\n"
        ).encode()

    def _send_endless(self, conn: socket.socket) -> None:
        conn.sendall(self._head("Transfer-Encoding: chunked\r\n"))
        chunk = f"{CHUNK:x}\r\n".encode() + b"x" * CHUNK + b"\r\n"
        while not self._stop.is_set():
            conn.sendall(chunk)
            with self._lock:
                self.sent += CHUNK


def _policy() -> Policy[Any]:
    return Policy("inventory", retry=1)


def _httpx(url: str) -> tuple[int, bytes, bool]:
    with httpx.Client(transport=DeadlineTransport(policy=_policy())) as client:
        r = client.get(url)
        return r.status_code, r.content, getattr(r, TRUNCATED, False)


def _requests(url: str) -> tuple[int, bytes, bool]:
    with requests.Session() as session:
        session.mount("http://", DeadlineAdapter(policy=_policy()))
        r = session.get(url, timeout=10)
        return r.status_code, r.content, getattr(r, TRUNCATED, False)


def _httpx_async(url: str) -> tuple[int, bytes, bool]:
    async def go() -> tuple[int, bytes, bool]:
        transport = AsyncDeadlineTransport(policy=_policy())
        async with httpx.AsyncClient(transport=transport) as client:
            r = await client.get(url)
            return r.status_code, r.content, getattr(r, TRUNCATED, False)

    return asyncio.run(go())


def _aiohttp(url: str) -> tuple[int, bytes, bool]:
    async def go() -> tuple[int, bytes, bool]:
        middleware = DeadlineMiddleware(policy=_policy())
        async with (
            aiohttp.ClientSession(middlewares=(middleware,)) as session,
            session.get(url) as r,
        ):
            return r.status, await r.read(), getattr(r, TRUNCATED, False)

    return asyncio.run(go())


CLIENTS: dict[str, Callable[[str], tuple[int, bytes, bool]]] = {
    "httpx": _httpx,
    "httpx-async": _httpx_async,
    "requests": _requests,
    "aiohttp": _aiohttp,
}


@pytest.fixture
def endless() -> Iterator[Peer]:
    with Peer(endless=True) as peer:
        yield peer


@pytest.fixture
def at_cap() -> Iterator[Peer]:
    with Peer(endless=False) as peer:
        yield peer


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_an_endless_failed_answer_is_read_up_to_the_cap_and_returned_truncated(
    client: str, endless: Peer
) -> None:
    """Both 503s are read up to the cap and closed; the last is returned with those bytes,
    marked truncated; the server could send no more than the cap and the sockets' buffers."""
    with tb.fail_after(20):  # read whole, the body would run until this deadline
        status, body, truncated = CLIENTS[client](endless.url)
    assert (status, body, truncated) == (503, b"x" * REFUSAL_BODY_MAX, True)
    assert endless.requests == 2
    assert endless.connections == 2  # a truncated answer's connection is not reused
    assert endless.sent < BOUNDED, endless.sent


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_failed_answer_of_exactly_the_cap_is_read_whole_and_its_connection_kept(
    client: str, at_cap: Peer
) -> None:
    """A body just at the cap is not truncated: read whole, the retry reuses its connection."""
    with tb.fail_after(20):
        status, body, truncated = CLIENTS[client](at_cap.url)
    assert (status, body, truncated) == (503, b"x" * REFUSAL_BODY_MAX, False)
    assert (at_cap.requests, at_cap.connections) == (2, 1)


@pytest.mark.asyncio_real
async def test_a_late_endless_answer_nobody_waits_for_costs_at_most_the_cap() -> None:
    """The caller left at its deadline; the exchange lives on to release the connection (D4.8)
    and gets an endless answer: it reads at most the cap, then closes the connection."""
    with Peer(endless=True, delay=0.3) as peer:
        async with httpx.AsyncClient(transport=AsyncDeadlineTransport()) as client:
            with tb.move_on_after(0.05) as scope:
                await client.get(peer.url, timeout=60)
            assert scope.expired
            for _ in range(2000):  # bounded: read whole, the body would never end
                if peer.gone.is_set():
                    break
                await asyncio.sleep(0.01)
            assert peer.gone.is_set(), f"still reading the late answer ({peer.sent} bytes)"
    assert peer.requests == 1
    assert peer.sent < BOUNDED
