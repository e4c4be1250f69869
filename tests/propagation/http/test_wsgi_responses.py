"""The WSGI middleware's handling of what an app hands back: status lines, write(), empty
chunks, a missing start_response, exc_info (PEP 3333; D4.4)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import pytest

from timebound.propagation.wsgi import DeadlineMiddleware
from timebound.testing import VirtualClock

from .test_wsgi import KEY, App, call


@pytest.mark.parametrize(
    ("status", "line"),
    [(504, "504 Gateway Timeout"), (408, "408 Request Timeout"), (599, "599 Deadline Expired")],
)
def test_configured_expired_status_has_its_reason_phrase(
    virtual_clock: VirtualClock, status: int, line: str
) -> None:
    """A configured expiry status is sent with its standard phrase, or "Deadline Expired"."""
    app = App()
    got, headers, body = call(DeadlineMiddleware(app, expired_status=status), {KEY: "0"})
    assert (got, body, app.calls) == (line, b"Deadline expired", 0)
    assert headers["x-yataxi-deadline-expired"] == "1"


def test_legacy_write_is_the_first_chunk(virtual_clock: VirtualClock) -> None:
    """Data given to start_response's write() is sent first, before the returned chunks."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        write = start_response("200 OK", [])
        write(b"written ")
        return [b"returned"]

    assert call(DeadlineMiddleware(app), {KEY: "300"})[::2] == ("200 OK", b"written returned")


def test_empty_chunks_before_the_body_are_skipped(virtual_clock: VirtualClock) -> None:
    """Empty chunks ahead of the first data do not count as the body's start."""
    closed: list[bool] = []

    def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        start_response("200 OK", [])
        try:
            yield b""
            yield b""
            yield b"body"
            yield b"-rest"
        finally:
            closed.append(True)

    assert call(DeadlineMiddleware(app), {KEY: "300"})[::2] == ("200 OK", b"body-rest")
    assert closed == [True]


def test_empty_body_in_time_is_sent_as_is(virtual_clock: VirtualClock) -> None:
    """A response with no body at all (e.g. 204) is passed through, not replaced."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("204 No Content", [])
        return [b""]

    assert call(DeadlineMiddleware(app), {KEY: "300"})[::2] == ("204 No Content", b"")


def test_app_without_start_response_in_time_is_an_error(virtual_clock: VirtualClock) -> None:
    """An app that returns without calling start_response is a server error, not a 498."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        return [b"no status"]

    with pytest.raises(RuntimeError, match="without calling start_response"):
        call(DeadlineMiddleware(app), {KEY: "300"})


def test_app_without_start_response_after_the_deadline_is_expired(
    virtual_clock: VirtualClock,
) -> None:
    """The same app finishing after the deadline is answered as expired."""

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        virtual_clock.advance(0.5)
        return [b"no status"]

    assert call(DeadlineMiddleware(app), {KEY: "300"})[::2] == (
        "498 Deadline Expired",
        b"Deadline expired",
    )


def test_exc_info_reaches_the_server(virtual_clock: VirtualClock) -> None:
    """An error response started with exc_info passes exc_info on to the server."""
    seen: list[Any] = []

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        try:
            raise ValueError("handled")
        except ValueError:
            start_response("500 Internal Server Error", [], sys.exc_info())
        return [b"error page"]

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        seen.append((status, exc_info))
        return lambda data: None

    body = DeadlineMiddleware(app)(
        {"REQUEST_METHOD": "GET", "PATH_INFO": "/", KEY: "300"}, start_response
    )
    assert b"".join(body) == b"error page"
    [(status, exc_info)] = seen
    assert status == "500 Internal Server Error"
    assert exc_info[0] is ValueError and str(exc_info[1]) == "handled"
