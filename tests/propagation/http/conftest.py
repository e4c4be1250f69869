"""Real HTTP servers in background threads, a recording downstream service, and app factories.

* :class:`ServerThread` runs an ASGI app under uvicorn or hypercorn, or a WSGI app under
  werkzeug, on ``127.0.0.1:0`` in a daemon thread (``with ServerThread(app) as srv: srv.url``).
* :class:`Downstream` is a bare ASGI app that records what it received (the deadline header, the
  client's port) and answers per path: ``/ok``, ``/slow``, ``/expired``, ``/stream``.
* :func:`build_propagating_service` is the app factory for end-to-end scenarios (also used by the
  database propagation tests): a FastAPI service behind ``DeadlineMiddleware`` whose ``/work``
  endpoint runs optional work and then calls a downstream service over httpx.
* :func:`call_asgi` drives an ASGI app in-process (for virtual-time tests of the middleware).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from timebound.propagation import _codec, set_enabled
from timebound.telemetry import Event, add_listener, counters

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TIMEOUT_HEADER = "x-yataxi-client-timeoutms"

#: Header values that must mean "no deadline" at every server (sendable over HTTP/1.1).
HOSTILE_HEADERS = [
    "",
    "+",
    "-",
    "-5",
    "1 0",
    "1e3",
    "0x10",
    "1.5",
    "5ms",
    "inf",
    "9" * 4000,
    "9223372036854775808",
    "315360000000",
    "\xd9\xa3",  # a UTF-8 encoded Arabic-Indic digit, seen as latin-1
]


@pytest.fixture(autouse=True)
def _clean_propagation_state() -> Iterator[None]:
    """Every test starts with propagation on, counters at zero and no warning suppressed."""
    set_enabled(True)
    counters.reset()
    _codec._last_warning.clear()
    yield
    set_enabled(True)


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Telemetry events emitted during the test."""
    seen: list[Event] = []
    remove = add_listener(seen.append)
    yield seen
    remove()


def span_tags(events: list[Event], component: str) -> dict[str, Any]:
    """All ``span.tags`` attributes emitted by ``component``, merged."""
    tags: dict[str, Any] = {}
    for e in events:
        if e.name == "span.tags" and e.attrs.get("component") == component:
            tags.update({k: v for k, v in e.attrs.items() if k != "component"})
    return tags


# --- real servers ----------------------------------------------------------------------------


def _bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by accepted sockets: uvicorn serves a socket it re-creates with fromfd(), whose
    # protocol number asyncio does not recognise as TCP, so it never sets TCP_NODELAY itself
    # and every response waits ~40 ms for a delayed ACK (Nagle).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


class ServerThread:
    """An HTTP server on 127.0.0.1:0 in a daemon thread: ``kind`` is uvicorn, hypercorn or wsgi."""

    def __init__(self, app: Any, *, kind: str = "uvicorn") -> None:
        self.app = app
        self.kind = kind
        self.port = 0
        self._thread: threading.Thread | None = None
        self._stop: Callable[[], None] = lambda: None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        start = {"uvicorn": self._uvicorn, "hypercorn": self._hypercorn, "wsgi": self._wsgi}
        start[self.kind]()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _uvicorn(self) -> None:
        import uvicorn

        sock = _bound_socket()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        server = uvicorn.Server(config)
        self._thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        started = threading.Event()

        def wait() -> None:
            while not server.started and self._thread is not None and self._thread.is_alive():
                started.wait(0.01)

        wait()
        assert server.started, "uvicorn did not start"

        def stop() -> None:
            server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            sock.close()

        self._stop = stop

    def _hypercorn(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        sock = _bound_socket()
        self.port = sock.getsockname()[1]
        config = Config()
        config.bind = [f"fd://{sock.fileno()}"]
        config.graceful_timeout = 1
        loop = asyncio.new_event_loop()
        stop_event = asyncio.Event()
        ready = threading.Event()

        async def main() -> None:
            ready.set()
            await serve(self.app, config, shutdown_trigger=stop_event.wait)  # type: ignore[arg-type]

        def run() -> None:
            loop.run_until_complete(main())
            loop.close()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        ready.wait(5)
        _wait_until_accepting(self.port)

        def stop() -> None:
            loop.call_soon_threadsafe(stop_event.set)
            if self._thread is not None:
                self._thread.join(timeout=10)
            # Held until here (hypercorn serves on this descriptor and closes it itself).
            sock.detach()

        self._stop = stop

    def _wsgi(self) -> None:
        from werkzeug.serving import make_server

        server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.port = server.server_port
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        self._stop = server.shutdown


def _wait_until_accepting(port: int) -> None:
    for _ in range(500):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            threading.Event().wait(0.01)
    raise RuntimeError(f"server on port {port} did not start")


# --- a recording downstream service ----------------------------------------------------------


@dataclass
class Seen:
    """One request the downstream service received."""

    path: str
    headers: dict[str, str]
    client_port: int

    @property
    def timeout_ms(self) -> int | None:
        value = self.headers.get(TIMEOUT_HEADER)
        return None if value is None else int(value)


@dataclass
class Downstream:
    """A bare ASGI app that records requests and answers per path.

    ``/ok`` 200 ``ok``; ``/slow`` waits until the client goes away (or 10 s) then 200;
    ``/held`` waits until the test sets ``held`` (or the client goes away) then 200;
    ``/expired`` 498 with ``X-YaTaxi-Deadline-Expired: 1``; ``/unavailable`` 503 at once;
    ``/stream`` sends one chunk, then stalls like ``/slow`` before the rest.
    """

    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client") or ("", 0)
        self.seen.append(Seen(scope["path"], headers, int(client[1])))
        path = scope["path"]
        if path == "/expired":
            await send(
                {
                    "type": "http.response.start",
                    "status": 498,
                    "headers": [(b"x-yataxi-deadline-expired", b"1"), (b"content-length", b"16")],
                }
            )
            await send({"type": "http.response.body", "body": b"Deadline expired"})
            return
        if path == "/unavailable":
            await _plain(send, 503, b"unavailable")
            return
        if path == "/slow":
            await self._stall(receive, self.release)
            await _plain(send, 200, b"late")
            return
        if path == "/held":
            await self._stall(receive, self.held)
            await _plain(send, 200, b"held")
            return
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            await self._stall(receive, self.release)
            await send({"type": "http.response.body", "body": b"rest", "more_body": False})
            return
        await _plain(send, 200, b"ok")

    async def _stall(self, receive: Receive, event: threading.Event) -> None:
        # Until the client disconnects (a cut closes the connection) or ``event`` is set.
        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        async def released() -> None:
            while not event.is_set():
                await asyncio.sleep(0.02)

        tasks = [asyncio.ensure_future(disconnected()), asyncio.ensure_future(released())]
        try:
            await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()


async def _plain(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def downstream() -> Iterator[tuple[Downstream, str]]:
    """A recording downstream service under uvicorn, shared by a module; cleared per test."""
    app = Downstream()
    with ServerThread(app) as srv:
        yield app, srv.url
        app.release.set()
        app.held.set()


@pytest.fixture
def svc(downstream: tuple[Downstream, str]) -> Iterator[tuple[Downstream, str]]:
    """The module's downstream service with an empty record."""
    app, url = downstream
    app.seen.clear()
    app.held.clear()
    yield app, url
    app.held.set()


# --- the app factory for end-to-end scenarios ------------------------------------------------


def build_propagating_service(
    *,
    downstream_url: str | None = None,
    work: Callable[[], Awaitable[Any]] | None = None,
    cancel_on_expiry: bool = False,
) -> Any:
    """A FastAPI service that takes part in deadline propagation (reusable by other suites).

    ``GET /work`` runs ``work()`` (e.g. a database query) under the request's deadline, then,
    when ``downstream_url`` is set, calls ``GET {downstream_url}`` through
    ``AsyncDeadlineTransport``. It answers JSON: ``deadline_received_ms`` (from the wire),
    ``remaining_ms`` (the budget seen on entry), ``work`` (repr of what ``work()`` returned),
    ``downstream_status`` and ``downstream`` (the downstream's JSON body, when it is JSON).
    """
    from fastapi import FastAPI

    import timebound as tb
    from timebound.propagation import current_request
    from timebound.propagation.asgi import DeadlineMiddleware
    from timebound.propagation.httpx import AsyncDeadlineTransport

    app = FastAPI()
    app.add_middleware(DeadlineMiddleware, cancel_on_expiry=cancel_on_expiry)
    client = httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5.0))

    @app.get("/work")
    async def do_work() -> dict[str, Any]:
        left = tb.remaining()
        state = current_request()
        result: dict[str, Any] = {
            "deadline_received_ms": None if state is None else state.deadline_received_ms,
            "remaining_ms": None if left == float("inf") else left * 1000,
        }
        if work is not None:
            result["work"] = repr(await work())
        if downstream_url is not None:
            response = await client.get(downstream_url)
            result["downstream_status"] = response.status_code
            if response.headers.get("content-type", "").startswith("application/json"):
                result["downstream"] = response.json()
        return result

    return app


# --- in-process ASGI driver ------------------------------------------------------------------


@dataclass
class AsgiResult:
    status: int | None
    headers: dict[str, str]
    body: bytes
    messages: list[dict[str, Any]]


async def call_asgi(
    app: ASGIApp,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    *,
    body_delay: float = 0.0,
    scope_type: str = "http",
) -> AsgiResult:
    """Call ``app`` with one GET request; ``body_delay`` seconds pass before the body arrives.

    ``headers`` as a list of pairs sends a name once per pair (repeated header lines).
    """
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    scope: Scope = {
        "type": scope_type,
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent_body = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            if body_delay:
                await asyncio.sleep(body_delay)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await app(scope, receive, send)
    status = None
    out_headers: dict[str, str] = {}
    body = b""
    for m in messages:
        if m["type"] == "http.response.start":
            status = m["status"]
            out_headers = {
                k.decode("latin-1").lower(): v.decode("latin-1") for k, v in m.get("headers", [])
            }
        elif m["type"] == "http.response.body":
            body += m.get("body", b"")
    return AsgiResult(status, out_headers, body, messages)
