"""The WSGI middleware, driven in-process on virtual time (D4.1-D4.5)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

import timebound as tb
from timebound.propagation import current_request, mark_cancelled_by_deadline, set_enabled
from timebound.propagation.wsgi import DeadlineMiddleware
from timebound.telemetry import Event, counters
from timebound.testing import VirtualClock

from .conftest import HOSTILE_HEADERS, span_tags

KEY = "HTTP_X_YATAXI_CLIENT_TIMEOUTMS"


def call(
    app: Callable[..., Iterable[bytes]], environ: dict[str, Any]
) -> tuple[str, dict[str, str], bytes]:
    """Run a WSGI app like a server: start_response, then iterate and close the body."""
    out: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        out["status"], out["headers"] = status, {k.lower(): v for k, v in headers}
        return lambda data: None

    result = app({"REQUEST_METHOD": "GET", "PATH_INFO": "/", **environ}, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return out["status"], out["headers"], body


class App:
    """A WSGI app that records what it saw and optionally works (virtual time) first."""

    def __init__(self, clock: VirtualClock | None = None, work: float = 0.0) -> None:
        self.clock = clock
        self.work = work
        self.calls = 0
        self.deadline: tb.Deadline | None = None
        self.state: Any = None

    def __call__(self, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        self.calls += 1
        self.deadline = tb.current_deadline()
        self.state = current_request()
        if self.clock is not None and self.work:
            self.clock.advance(self.work)
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"hello"]


def test_deadline_is_inherited(virtual_clock: VirtualClock) -> None:
    """The app sees deadline = arrival + header and the request state."""
    virtual_clock.advance(5)
    app = App()
    status, _, body = call(DeadlineMiddleware(app), {KEY: "300"})
    assert (status, body) == ("200 OK", b"hello")
    assert app.deadline == tb.Deadline(5.3) and app.state.deadline_received_ms == 300


@pytest.mark.parametrize("env", [{KEY: "0"}, {KEY: "-0"}, {"HTTP_GRPC_TIMEOUT": "0n"}])
def test_expired_on_arrival(virtual_clock: VirtualClock, env: dict[str, str]) -> None:
    """An already expired request gets 498 and the app is never called."""
    app = App()
    status, headers, body = call(DeadlineMiddleware(app), env)
    assert app.calls == 0
    assert status == "498 Deadline Expired" and body == b"Deadline expired"
    assert headers["x-yataxi-deadline-expired"] == "1"
    assert counters.get("cancelled-by-deadline", component="http-server") == 1


def test_late_response_is_replaced(virtual_clock: VirtualClock, events: list[Event]) -> None:
    """A response produced after the deadline is replaced and its size tagged."""
    status, _, body = call(DeadlineMiddleware(App(virtual_clock, work=0.5)), {KEY: "300"})
    assert status.startswith("498") and body == b"Deadline expired"
    assert span_tags(events, "http-server")["dp_original_body_size"] == 5


def test_swallowed_downstream_deadline(virtual_clock: VirtualClock) -> None:
    """A client failure caused by our deadline makes the answer 498 even if swallowed."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        mark_cancelled_by_deadline()
        start_response("200 OK", [])
        return [b"fallback"]

    status, _, _ = call(DeadlineMiddleware(app), {KEY: "300"})
    assert status.startswith("498")


def test_checkpoint_raises_with_inherited_source(virtual_clock: VirtualClock) -> None:
    """Sync handlers stop cooperatively: checkpoint() raises source=inherited, set by the
    middleware (D2.8), answered 498."""
    seen: list[tuple[str, str | None]] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        virtual_clock.advance(1)
        try:
            tb.checkpoint()
        except tb.DeadlineExceeded as exc:
            seen.append((exc.source, exc.set_by))
            raise
        return []

    status, _, _ = call(DeadlineMiddleware(app), {KEY: "300"})
    assert seen == [("inherited", "WSGI middleware")] and status.startswith("498")


def test_streaming_generator_sees_deadline_and_is_kept(virtual_clock: VirtualClock) -> None:
    """A streamed body keeps the request's deadline while the server iterates it."""
    seen: list[tb.Deadline] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [])

        def body() -> Iterator[bytes]:
            yield b"a"
            virtual_clock.advance(1)
            seen.append(tb.current_deadline())
            yield b"b"

        return body()

    status, _, body = call(DeadlineMiddleware(app), {KEY: "300"})
    assert (status, body) == ("200 OK", b"ab")
    assert seen == [tb.Deadline(0.3)]


@pytest.mark.parametrize("value", HOSTILE_HEADERS)
def test_hostile_header_never_fails(virtual_clock: VirtualClock, value: str) -> None:
    """An unreadable header means no deadline: the app runs and answers 200."""
    app = App()
    status, _, _ = call(DeadlineMiddleware(app), {KEY: value})
    assert status == "200 OK" and app.deadline == tb.Deadline.never()


def test_kill_switches(virtual_clock: VirtualClock) -> None:
    """enabled=False and set_enabled(False) both ignore the headers."""
    assert call(DeadlineMiddleware(App(), enabled=False), {KEY: "0"})[0] == "200 OK"
    set_enabled(False)
    assert call(DeadlineMiddleware(App()), {KEY: "0"})[0] == "200 OK"


def test_other_error_before_deadline_propagates(virtual_clock: VirtualClock) -> None:
    """An ordinary error within the deadline reaches the server unchanged."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        call(DeadlineMiddleware(app), {KEY: "300"})
