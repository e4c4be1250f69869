"""Serving a host with uvicorn on a socket we bind ourselves (so port 0 reports its real port)."""

from __future__ import annotations

import math
import socket
import sys
from typing import TextIO

import uvicorn

from ._app import create_app
from ._config import Config
from ._host import Host

__all__ = ["listening_socket", "serve"]


def serve(config: Config, host: Host | None = None, out: TextIO = sys.stdout) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, let in-flight requests finish for up to
    ``config.drain_s`` seconds, and close the engine (its in-flight tokens go back to
    ``pending`` with their deadlines kept, so the next start resumes them)."""
    host = host or Host.build(config)
    sock = listening_socket(config)
    port = sock.getsockname()[1]
    shown = f"[{config.host}]" if sock.family == socket.AF_INET6 else config.host
    print(
        f"timebound host listening on http://{shown}:{port}/ (store {_safe_db(config.db)})",
        file=out,
    )
    if config.token is None:
        print(
            "no token configured: bound to loopback only, API and UI open to local users", file=out
        )
    out.flush()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(host),
            lifespan="on",
            log_level="info",
            timeout_graceful_shutdown=math.ceil(config.drain_s),
            # Our own problem documents answer errors; uvicorn's server header says nothing useful.
            server_header=False,
        )
    )
    server.run(sockets=[sock])


def listening_socket(config: Config) -> socket.socket:
    """The socket the host serves on, bound to ``config.host`` and ``config.port``."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets whose protocol
    # says TCP, and without it a small answer's body waits behind its headers for the
    # client's delayed ACK (some 40 ms on Linux).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config.host, config.port))
    return sock


def _safe_db(url: str) -> str:
    """The store URL without a password (never printed)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, where = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{where}"
