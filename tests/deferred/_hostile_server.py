"""A hostile peer in a process of its own: answers 2 GiB, never answers, or counts the hits.

Run as ``python _hostile_server.py``: it prints its port, then serves until killed.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

CHUNK = b"x" * 65536
HUGE = 2 * 1024**3  # 2 GiB, streamed: never held in memory here either
hits: list[str] = []


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/hits":
        body = str(len(hits)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    hits.append(path)
    if path.startswith("/silent"):
        await asyncio.sleep(3600)
        return
    if path.startswith("/huge"):
        head = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": b'{"a": "', "more_body": True})
        sent = 0
        while sent < HUGE:
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            sent += len(CHUNK)
        await send({"type": "http.response.body", "body": b'"}'})
        return
    if path.startswith("/gone"):
        # What a timebound host answers for an operation past its retention (D7.5).
        head = [(b"content-type", b"application/problem+json")]
        body = b'{"status": 410, "title": "Gone", "detail": "operation op-1 is no longer retained"}'
        await send({"type": "http.response.start", "status": 410, "headers": head})
        await send({"type": "http.response.body", "body": body})
        return
    if path.startswith("/redirect"):
        # Location: the query string as given (/redirect?http://elsewhere/steal).
        head = [(b"location", scope["query_string"])]
        await send({"type": "http.response.start", "status": 302, "headers": head})
        await send({"type": "http.response.body", "body": b""})
        return
    if path.startswith("/forbidden"):
        await send({"type": "http.response.start", "status": 403, "headers": []})
        await send({"type": "http.response.body", "body": b"no"})
        return
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


@contextmanager
def hostile_server() -> Iterator[str]:
    """Run this server in a process of its own; its base URL (killed afterwards)."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__))], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        proc.kill()
        proc.wait()


def main() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # before the port is told: a client connecting at once is queued
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="error", lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
