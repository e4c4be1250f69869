"""A light load generator for a real host: many HTTP/1.1 keep-alive connections in one asyncio
process, each starting a run and reading it back in a loop.

Used by the load test (tests/chaos/test_load.py) and the benchmark (bench/host.py). It speaks
just enough HTTP/1.1 for the host's JSON answers (a status line, headers, a ``Content-Length``
body) over raw asyncio streams: with 500 connections on the host's own cores, a full client
library would spend more CPU than the server it measures. Anything else it meets (a chunked or
unparseable answer, a reset, a timeout) is counted as an error, never skipped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Load", "run_load", "start_and_read"]


@dataclass
class Load:
    """What the clients saw: per-request seconds, errors (as text), answers by status, and the
    seconds the whole load took."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    requests: int = 0
    elapsed: float = 0.0


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str):
        self.reader, self.writer, self.host = reader, writer, host

    async def call(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        payload = b"" if body is None and method == "GET" else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n"
        if method != "GET":
            head += f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + payload)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                raise ValueError(f"unexpected Transfer-Encoding {value.strip()!r}")
        if length is None:
            raise ValueError("an answer without Content-Length")
        return status, await self.reader.readexactly(length)


async def _client(
    url: str,
    until: float,
    script: Callable[[Callable[[str, str, Any], Any]], Any],
    load: Load,
    timeout: float,
) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    conn: _Conn | None = None
    while time.monotonic() < until:
        try:
            if conn is None:
                async with asyncio.timeout(timeout):
                    reader, writer = await asyncio.open_connection(host, port)
                conn = _Conn(reader, writer, parts.netloc)

            async def call(method: str, path: str, body: Any = None, c: _Conn = conn) -> Any:
                t = time.perf_counter()
                async with asyncio.timeout(timeout):
                    status, data = await c.call(method, path, body)
                load.latencies.append(time.perf_counter() - t)
                load.requests += 1
                load.statuses[status] = load.statuses.get(status, 0) + 1
                return status, json.loads(data) if data else None

            await script(call)
        except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            load.errors.append(f"{type(exc).__name__}: {exc}")
            if conn is not None:
                conn.writer.close()
                conn = None
    if conn is not None:
        conn.writer.close()
        try:
            await conn.writer.wait_closed()
        except OSError:
            pass


async def run_load(
    url: str,
    clients: int,
    seconds: float,
    script: Callable[[Callable[[str, str, Any], Any]], Any],
    *,
    timeout: float = 60.0,
) -> Load:
    """``clients`` connections each running ``script(call)`` until ``seconds`` have passed.

    ``call(method, path, body)`` answers ``(status, json)``; a script raises ``ValueError`` for
    an answer it did not expect (counted as an error). A request in flight when the time is up is
    finished (within ``timeout``), so the run ends at most ``timeout`` after ``seconds``.
    """
    load = Load()
    began = time.monotonic()
    until = began + seconds
    await asyncio.gather(*(_client(url, until, script, load, timeout) for _ in range(clients)))
    load.elapsed = time.monotonic() - began
    return load


async def start_and_read(call: Callable[[str, str, Any], Any], definition: str) -> None:
    """Start a run of ``definition`` and read it back; anything but 201 then 200 is an error."""
    status, body = await call("POST", f"/v1/workflows/{definition}/runs", {"input": None})
    if status != 201:
        raise ValueError(f"start answered {status}: {body}")
    run_id = body["run_id"]
    status, body = await call("GET", f"/v1/runs/{run_id}")
    if status != 200 or body["run"]["id"] != run_id:
        raise ValueError(f"read answered {status}: {str(body)[:200]}")
