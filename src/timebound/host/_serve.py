"""Serving a host with uvicorn on a socket we bind ourselves (so port 0 reports its real port)."""

from __future__ import annotations

import asyncio
import math
import os
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

    def __init__(self, config: uvicorn.Config, host: Host, out: TextIO) -> None:
        super().__init__(config)
        self._host = host
        self._out = out
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        # uvicorn re-raises the stop signal once shut down (the process then dies of it, and
        # SIGINT prints a KeyboardInterrupt traceback); a drained host exits 0 instead, as
        # `timebound serve` documents. The list is uvicorn's own, hence the guard.
        done = getattr(self.lifespan, "shutdown_event", None)
        if self.force_exit and isinstance(done, asyncio.Event) and not done.is_set():
            # A second Ctrl-C before the app's shutdown began: uvicorn skips it, but the engine
            # still closes (at once, its drain ended) so its tokens go back to pending now, not
            # when their leases expire.
            await self.lifespan.shutdown()
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Runs in the signal handler: hand the engine's calls to its loop.
        loop = self._loop if self._loop is not None and not self._loop.is_closed() else None
        again = self.should_exit
        super().handle_exit(sig, frame)
        if loop is None:
            return
        if not again:
            loop.call_soon_threadsafe(self._draining)
        elif self.force_exit:
            loop.call_soon_threadsafe(self._stop_now)

    def _draining(self) -> None:
        """D8.17: the first stop says what the drain waits for, and how to cut it short."""
        engine = self._host.engine
        engine.stop_claiming()
        drain = self.config.timeout_graceful_shutdown
        requests = len(self.server_state.connections)
        actions = engine.attempts_in_flight
        self._say(
            f"stopping: waiting up to {drain}s for {requests} open connection(s), then up to "
            f"{drain}s for {actions} running action(s); Ctrl-C again to stop now"
        )

    def _stop_now(self) -> None:
        self._host.engine.end_drain()
        self._say(
            "stopping now: running actions are cancelled, their runs resume at the next start"
        )

    def _say(self, line: str) -> None:
        try:
            print(f"timebound serve: {line}", file=self._out, flush=True)
        except (OSError, ValueError):  # the output is gone: stopping matters more
            pass


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
    """Store ``host``'s definition files in ``config.db`` (ConfigError on a conflict, or a
    store that cannot be opened: D8.17, one line instead of a traceback)."""
    check_sqlite_directory(config.db)
    try:
        asyncio.run(_publish(config, list(host.definitions.values())))
    except StoreError as exc:
        raise ConfigError(f"db: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"db: cannot open {_safe_db(config.db)}: {exc.strerror or exc}") from None


def check_sqlite_directory(db: str) -> None:
    """A SQLite store's directory must exist (the store makes the file, never directories)."""
    scheme, sep, path = db.partition(":///")
    if sep and scheme == "sqlite":
        folder = os.path.dirname(path.split("?", 1)[0]) or "."
        if not os.path.isdir(folder):
            raise ConfigError(
                f"db: the directory {folder!r} of {db!r} does not exist "
                "(sqlite:///relative/path or sqlite:////absolute/path)"
            )


def serve(config: Config, host: Host | None = None, out: TextIO = sys.stdout) -> None:
    """Serve until SIGINT/SIGTERM; then stop claiming work and accepting connections, let
    in-flight requests finish for up to ``config.drain``, then in-flight actions for up
    to as long again, and close the engine (what is left is cancelled: its tokens go back to
    ``pending`` with their deadlines kept, so the next start resumes them)."""
    host = host or Host.build(config)
    try:
        sock = listening_socket(config)
    except OSError as exc:
        # D8.17: a busy port or an address not on this machine is one line, exit 2.
        raise ConfigError(
            f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}"
        ) from None
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
            timeout_graceful_shutdown=math.ceil(config.drain),
            # Our own problem documents answer errors; uvicorn's server header says nothing useful.
            server_header=False,
            # D8.9: X-Forwarded-For/-Proto are believed from the configured proxies only (uvicorn
            # would otherwise believe any process on 127.0.0.1).
            proxy_headers=bool(config.forwarded_allow_ips),
            forwarded_allow_ips=list(config.forwarded_allow_ips),
        ),
        host,
        out,
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
    # Listening before "listening on" is printed: a client that connects at once is queued
    # until the server accepts, not refused (uvicorn calls listen() again, which is harmless).
    sock.listen(2048)
    return sock


def _safe_db(url: str) -> str:
    """The store URL without a password (never printed)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, where = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{where}"
