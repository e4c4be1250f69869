"""Serving a host with uvicorn on a socket we bind ourselves (so port 0 reports its real port)."""

from __future__ import annotations

import asyncio
import math
import socket
import sys
from types import FrameType
from typing import TextIO

import uvicorn

from .._store import StoreError, open_store
from ..workflow import Definition
from ..workflow._engine import store_definition
from ._app import create_app
from ._config import Config, ConfigError
from ._host import Host

__all__ = ["listening_socket", "publish", "serve"]


class _Server(uvicorn.Server):
    """uvicorn's server, telling the engine to claim no more work as soon as a stop is asked."""

    def __init__(self, config: uvicorn.Config, host: Host) -> None:
        super().__init__(config)
        self._host = host
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        # uvicorn re-raises the stop signal once shut down (the process then dies of it, and
        # SIGINT prints a KeyboardInterrupt traceback); a drained host exits 0 instead, as
        # `timebound serve` documents. The list is uvicorn's own, hence the guard.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the signal handler: hand the engine's call to its loop.
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._host.engine.stop_claiming)
        super().handle_exit(sig, frame)


async def _publish(config: Config, definitions: list[Definition]) -> None:
    """Store the definition files before serving, so a file that conflicts with the store is
    refused with a clear message (exit 2) rather than failing the app's start-up."""
    store = open_store(config.db)
    await store.open()
    try:
        async with store.transaction() as tx:
            for definition in definitions:
                conflict = await store_definition(tx, definition)
                if conflict is not None:
                    raise ConfigError(f"workflows: {definition.id!r}: version: {conflict}")
    finally:
        await store.close()


def publish(config: Config, host: Host) -> None:
    """Store ``host``'s definition files in ``config.db`` (ConfigError on a conflict)."""
    try:
        asyncio.run(_publish(config, list(host.definitions.values())))
    except StoreError as exc:
        raise ConfigError(f"db: {exc}") from None


def serve(config: Config, host: Host | None = None, out: TextIO = sys.stdout) -> None:
    """Serve until SIGINT/SIGTERM; then stop claiming work and accepting connections, let
    in-flight requests finish for up to ``config.drain_s`` seconds, then in-flight actions for up
    to as long again, and close the engine (what is left is cancelled: its tokens go back to
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
    server = _Server(
        uvicorn.Config(
            create_app(host),
            lifespan="on",
            log_level="info",
            timeout_graceful_shutdown=math.ceil(config.drain_s),
            # Our own problem documents answer errors; uvicorn's server header says nothing useful.
            server_header=False,
            # D8.9: X-Forwarded-For/-Proto are believed from the configured proxies only (uvicorn
            # would otherwise believe any process on 127.0.0.1).
            proxy_headers=bool(config.forwarded_allow_ips),
            forwarded_allow_ips=list(config.forwarded_allow_ips),
        ),
        host,
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
