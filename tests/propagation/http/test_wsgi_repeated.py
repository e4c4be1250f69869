"""Repeated and comma-joined deadline headers read the same under WSGI and ASGI (D4.1): the
members' minimum wins, and one malformed member makes the whole header invalid."""

from __future__ import annotations

import pytest

import timebound as tb
from timebound.propagation.asgi import DeadlineMiddleware as AsgiMiddleware
from timebound.propagation.wsgi import DeadlineMiddleware
from timebound.testing import VirtualClock

from .conftest import call_asgi
from .test_asgi import App as AsgiApp
from .test_wsgi import KEY, App, call

H = "X-YaTaxi-Client-TimeoutMs"

#: (what the server hands over as one comma-joined value, the deadline the app must see).
CASES = [
    ("100, 60000", tb.Deadline(0.1)),
    ("300,120", tb.Deadline(0.12)),
    ("60000 ,\t100", tb.Deadline(0.1)),
    ("abc,250", tb.Deadline.never()),
    ("100, 1.5", tb.Deadline.never()),
    ("100,", tb.Deadline.never()),
    ("100, -5", tb.Deadline.never()),
    ("315360000000, 200", tb.Deadline(0.2)),
]


@pytest.mark.parametrize(("value", "expected"), CASES)
def test_wsgi_comma_joined_value(
    virtual_clock: VirtualClock, value: str, expected: tb.Deadline
) -> None:
    """A comma-joined value under WSGI gives the members' minimum, or no deadline if one is bad."""
    app = App()
    status, _, _ = call(DeadlineMiddleware(app), {KEY: value})
    assert status.startswith("200")
    assert app.deadline == expected


@pytest.mark.parametrize(("value", "expected"), CASES)
async def test_asgi_comma_joined_value(
    virtual_clock: VirtualClock, value: str, expected: tb.Deadline
) -> None:
    """The same comma-joined value under ASGI gives the app the same deadline as under WSGI."""
    app = AsgiApp()
    result = await call_asgi(AsgiMiddleware(app), {H: value})
    assert result.status == 200
    assert app.deadline == expected


@pytest.mark.parametrize(("value", "expected"), CASES)
async def test_asgi_repeated_lines_read_as_the_joined_value(
    virtual_clock: VirtualClock, value: str, expected: tb.Deadline
) -> None:
    """The members sent as separate header lines under ASGI read as their comma-joined form."""
    app = AsgiApp()
    lines = [(H, part) for part in value.split(",")]
    result = await call_asgi(AsgiMiddleware(app), lines)
    assert result.status == 200
    assert app.deadline == expected


def test_expired_repeat_answers_expired(virtual_clock: VirtualClock) -> None:
    """A repeated value of 0 means already expired: 498 and the app is not called."""
    app = App()
    status, headers, body = call(DeadlineMiddleware(app), {KEY: "500,0"})
    assert status.startswith("498")
    assert body == b"Deadline expired"
    assert headers["x-yataxi-deadline-expired"] == "1"
    assert app.calls == 0


async def test_asgi_expired_repeat_answers_expired(virtual_clock: VirtualClock) -> None:
    """Under ASGI a repeated value of 0 also means already expired: 498, the app not called."""
    app = AsgiApp()
    result = await call_asgi(AsgiMiddleware(app), [(H, "500"), (H, "0")])
    assert result.status == 498
    assert app.calls == 0


def test_malformed_member_warns_once_with_the_whole_value(
    virtual_clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning for a malformed member shows the whole header value, so operators see why."""
    app = App()
    with caplog.at_level("WARNING", logger="timebound.propagation"):
        call(DeadlineMiddleware(app), {KEY: "100, 5ms"})
    messages = [r.getMessage() for r in caplog.records if "invalid" in r.getMessage()]
    assert len(messages) == 1 and "'100, 5ms'" in messages[0]


def test_long_member_list_is_read_in_one_pass(virtual_clock: VirtualClock) -> None:
    """A hostile header of 100,000 members is read (its minimum), and one bad member among them
    still invalidates it."""
    from timebound.propagation import parse_timeout_ms

    members = [str(1000 + i % 7) for i in range(100_000)]
    assert parse_timeout_ms(", ".join(members)) == 1.0
    assert parse_timeout_ms(", ".join([*members, "1e3"])) is None
