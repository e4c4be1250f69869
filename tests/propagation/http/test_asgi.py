"""The ASGI middleware on virtual time: arrival, replacement, cancellation, kill switches (D4)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import timebound as tb
from timebound.propagation import current_request, mark_cancelled_by_deadline, set_enabled
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.telemetry import Event, counters
from timebound.testing import VirtualClock

from .conftest import HOSTILE_HEADERS, Receive, Scope, Send, call_asgi, span_tags

H = "X-YaTaxi-Client-TimeoutMs"


class App:
    """An ASGI app that records what it saw, optionally sleeping before it answers."""

    def __init__(self, *, sleep: float = 0.0, body: bytes = b"hello", raise_: Any = None) -> None:
        self.sleep = sleep
        self.body = body
        self.raise_ = raise_
        self.calls = 0
        self.deadline: tb.Deadline | None = None
        self.source: str | None = None
        self.state: Any = None
        self.finished = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        self.deadline = tb.current_deadline()
        self.state = current_request()
        await receive()
        if self.sleep:
            await asyncio.sleep(self.sleep)
        if self.raise_ is not None:
            raise self.raise_
        self.finished = True
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": self.body})


async def test_request_deadline_is_inherited_from_arrival(virtual_clock: VirtualClock) -> None:
    """The handler sees deadline = arrival + header, and a RequestState with the received ms."""
    virtual_clock.advance(10)
    app = App()
    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert result.status == 200 and result.body == b"hello"
    assert app.deadline == tb.Deadline(10.3)
    assert app.state.deadline_received_ms == 300
    assert counters.get("deadline-received", component="http-server") == 1


async def test_inherited_deadline_reports_source_inherited(virtual_clock: VirtualClock) -> None:
    """A scope inside the handler that hits the request's deadline reports source=inherited,
    set by the middleware (D2.8), not by the scope that only met it."""
    seen: list[tuple[str, str | None]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            with tb.fail_after(10, what="lookup"):
                await asyncio.sleep(1)
        except tb.DeadlineExceeded as exc:
            seen.append((exc.source, exc.set_by))
            raise

    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert seen == [("inherited", "ASGI middleware")]
    assert result.status == 498
    assert virtual_clock.now() == 0.3


@pytest.mark.parametrize(
    "headers",
    [{H: "0"}, {H: "-0"}, {"grpc-timeout": "0m"}, {H: "500", "grpc-timeout": "0S"}],
)
async def test_expired_on_arrival_answers_498_without_calling_app(
    virtual_clock: VirtualClock, headers: dict[str, str], events: list[Event]
) -> None:
    """An already spent deadline gets 498 "Deadline expired" and the app is never called."""
    app = App()
    result = await call_asgi(DeadlineMiddleware(app), headers)
    assert app.calls == 0
    assert result.status == 498
    assert result.body == b"Deadline expired"
    assert result.headers["x-yataxi-deadline-expired"] == "1"
    assert counters.get("cancelled-by-deadline", component="http-server") == 1
    assert span_tags(events, "http-server") == {
        "deadline_received_ms": 0,
        "cancelled_by_deadline": 1,
    }


async def test_expired_status_is_configurable(virtual_clock: VirtualClock) -> None:
    """expired_status=504 replaces 498 for environments that reject unknown codes."""
    result = await call_asgi(DeadlineMiddleware(App(), expired_status=504), {H: "0"})
    assert result.status == 504 and result.headers["x-yataxi-deadline-expired"] == "1"


def test_invalid_expired_status_is_a_configuration_error() -> None:
    """A status outside 400..599 is rejected when the middleware is built."""
    with pytest.raises(tb.ConfigurationError) as info:
        DeadlineMiddleware(App(), expired_status=200)
    assert info.value.option == "expired_status"


async def test_body_read_time_counts(virtual_clock: VirtualClock) -> None:
    """The deadline starts when the scope arrives: a slow body alone can spend it (D4.2), and the
    code after reading it never runs (D4.11)."""
    app = App()
    result = await call_asgi(DeadlineMiddleware(app), {H: "300"}, body_delay=0.5)
    assert not app.finished
    assert (result.status, result.body) == (498, b"Deadline expired")
    assert counters.get("cancelled-by-deadline", component="http-server") == 1


async def test_late_handler_response_is_replaced(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """A handler finishing after the deadline has its response replaced; its size is tagged."""
    app = App(sleep=0.5, body=b"x" * 1234)
    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert app.finished
    assert virtual_clock.now() == 0.5  # not cancelled by default (D4.4)
    assert (result.status, result.body) == (498, b"Deadline expired")
    assert span_tags(events, "http-server") == {
        "deadline_received_ms": 300,
        "cancelled_by_deadline": 1,
        "dp_original_body_size": 1234,
    }
    assert counters.get("cancelled-by-deadline", component="http-server") == 1


async def test_handler_just_in_time_is_not_replaced(virtual_clock: VirtualClock) -> None:
    """A response ready a hair before the deadline goes out unchanged (never early, D1.3)."""
    result = await call_asgi(DeadlineMiddleware(App(sleep=0.299)), {H: "300"})
    assert result.status == 200


async def test_swallowed_downstream_deadline_answers_498(virtual_clock: VirtualClock) -> None:
    """A client that failed because of our deadline makes the server answer 498 (D4.5)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            raise tb.DeadlineExceeded(source="propagated")
        except tb.DeadlineExceeded:
            mark_cancelled_by_deadline()  # what every client adapter does before raising
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"fallback"})

    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert virtual_clock.now() == 0.0
    assert result.status == 498


async def test_deadline_exceeded_escaping_after_deadline_answers_498(
    virtual_clock: VirtualClock,
) -> None:
    """A DeadlineExceeded from the handler after the deadline becomes the 498 answer."""
    app = App(sleep=0.4, raise_=tb.DeadlineExceeded(source="inherited"))
    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert result.status == 498


async def test_other_error_before_deadline_propagates(virtual_clock: VirtualClock) -> None:
    """An ordinary handler error within the deadline is not ours to hide."""
    app = App(raise_=KeyError("boom"))
    with pytest.raises(KeyError):
        await call_asgi(DeadlineMiddleware(app), {H: "300"})


async def test_cancel_on_expiry_stops_handler_at_deadline(virtual_clock: VirtualClock) -> None:
    """With cancel_on_expiry the handler is cancelled exactly at the deadline and 498 is sent."""
    app = App(sleep=30)
    result = await call_asgi(DeadlineMiddleware(app, cancel_on_expiry=True), {H: "300"})
    assert virtual_clock.now() == 0.3
    assert not app.finished
    assert result.status == 498


async def test_cancel_on_expiry_leaves_fast_handler_alone(virtual_clock: VirtualClock) -> None:
    """cancel_on_expiry does not touch a handler that answers in time."""
    result = await call_asgi(DeadlineMiddleware(App(sleep=0.1), cancel_on_expiry=True), {H: "300"})
    assert result.status == 200


async def test_streaming_response_committed_before_deadline_is_kept(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """Once the first chunk is out nothing can be replaced; the late finish is only tagged."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await asyncio.sleep(1)
        await send({"type": "http.response.body", "body": b"b", "more_body": False})

    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert (result.status, result.body) == (200, b"ab")
    assert span_tags(events, "http-server").get("dp_response_already_started") == 1


async def test_start_is_held_until_first_chunk(virtual_clock: VirtualClock) -> None:
    """A handler that sends the start, then works past the deadline, is still replaced."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await asyncio.sleep(1)
        await send({"type": "http.response.body", "body": b"late", "more_body": True})
        await send({"type": "http.response.body", "body": b"r", "more_body": False})

    result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert [m["type"] for m in result.messages] == ["http.response.start", "http.response.body"]
    assert (result.status, result.body) == (498, b"Deadline expired")


async def test_no_header_means_no_deadline_and_no_state(virtual_clock: VirtualClock) -> None:
    """Without a deadline header the app runs untouched."""
    app = App(sleep=5)
    result = await call_asgi(DeadlineMiddleware(app), {})
    assert result.status == 200
    assert app.deadline == tb.Deadline.never() and app.state is None
    assert counters.total("deadline-received") == 0


@pytest.mark.parametrize("value", HOSTILE_HEADERS)
async def test_hostile_header_never_fails_the_request(
    virtual_clock: VirtualClock, value: str
) -> None:
    """An unreadable deadline header means no deadline: the handler runs and answers 200."""
    app = App(sleep=5)
    result = await call_asgi(DeadlineMiddleware(app), {H: value})
    assert result.status == 200 and app.deadline == tb.Deadline.never()


async def test_static_kill_switch(virtual_clock: VirtualClock) -> None:
    """enabled=False ignores deadline headers entirely."""
    app = App()
    result = await call_asgi(DeadlineMiddleware(app, enabled=False), {H: "0"})
    assert result.status == 200 and app.deadline == tb.Deadline.never()


async def test_runtime_kill_switch(virtual_clock: VirtualClock) -> None:
    """set_enabled(False) switches every middleware off at once, and back on."""
    app = App()
    mw = DeadlineMiddleware(app)
    set_enabled(False)
    assert (await call_asgi(mw, {H: "0"})).status == 200
    set_enabled(True)
    assert (await call_asgi(mw, {H: "0"})).status == 498


async def test_non_http_scopes_pass_through(virtual_clock: VirtualClock) -> None:
    """Lifespan and websocket scopes are not touched."""
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    await call_asgi(DeadlineMiddleware(app), {H: "0"}, scope_type="websocket")
    assert seen == ["websocket"]


async def test_request_state_does_not_leak_after_request(virtual_clock: VirtualClock) -> None:
    """After the middleware returns, neither the deadline nor the request state remain."""
    await call_asgi(DeadlineMiddleware(App()), {H: "300"})
    assert current_request() is None and tb.current_deadline() == tb.Deadline.never()


async def test_other_error_after_deadline_answers_498_and_is_logged(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler failing late with its own error is answered 498, and the failure is logged."""
    app = App(sleep=0.5, raise_=KeyError("boom"))
    with caplog.at_level(logging.WARNING, logger="timebound"):
        result = await call_asgi(DeadlineMiddleware(app), {H: "300"})
    assert (result.status, result.body) == (498, b"Deadline expired")
    [record] = [r for r in caplog.records if "after its request deadline" in r.getMessage()]
    assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)
    assert "answering 498" in record.getMessage()


class StartOnly:
    """An ASGI app that sends ``http.response.start`` (or nothing) and returns, after ``sleep``."""

    def __init__(self, *, sleep: float, start: bool) -> None:
        self.sleep = sleep
        self.start = start

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await asyncio.sleep(self.sleep)
        if self.start:
            await send({"type": "http.response.start", "status": 204, "headers": []})


async def test_start_without_body_in_time_gets_an_empty_body(virtual_clock: VirtualClock) -> None:
    """An app returning after the start alone, in time, gets its start and an empty last body."""
    result = await call_asgi(DeadlineMiddleware(StartOnly(sleep=0.2, start=True)), {H: "300"})
    assert result.status == 204
    assert [m["type"] for m in result.messages] == ["http.response.start", "http.response.body"]
    assert result.messages[1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_start_without_body_after_deadline_is_replaced(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """An app returning after the start alone, late, is answered 498 with no original body."""
    result = await call_asgi(DeadlineMiddleware(StartOnly(sleep=0.4, start=True)), {H: "300"})
    assert (result.status, result.body) == (498, b"Deadline expired")
    assert counters.get("cancelled-by-deadline", component="http-server") == 1
    assert span_tags(events, "http-server")["dp_original_body_size"] == 0


async def test_silent_app_after_deadline_gets_498(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """An app that sends nothing and returns after the deadline is answered 498 by us."""
    result = await call_asgi(DeadlineMiddleware(StartOnly(sleep=0.4, start=False)), {H: "300"})
    assert (result.status, result.body) == (498, b"Deadline expired")
    assert result.headers["x-yataxi-deadline-expired"] == "1"
    tags = span_tags(events, "http-server")
    assert tags["cancelled_by_deadline"] == 1 and "dp_original_body_size" not in tags


async def test_silent_app_in_time_is_left_to_the_server(virtual_clock: VirtualClock) -> None:
    """An app that sends nothing within the deadline: we add nothing (the server answers 500)."""
    result = await call_asgi(DeadlineMiddleware(StartOnly(sleep=0.2, start=False)), {H: "300"})
    assert result.messages == []
    assert counters.get("cancelled-by-deadline", component="http-server") == 0
