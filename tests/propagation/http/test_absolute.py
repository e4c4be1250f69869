"""The absolute deadline header ``X-Request-Deadline`` (D9.3) on a virtual, skewable wall clock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import timebound as tb
from timebound import ConfigurationError
from timebound._core import _clock
from timebound.propagation import current_request
from timebound.propagation._codec import format_absolute_us, parse_absolute_us
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import DeadlineTransport
from timebound.telemetry import counters
from timebound.testing import VirtualClock

from .conftest import ServerThread, call_asgi

#: The virtual wall clock's start (2026-01-01T00:00:00Z) in microseconds.
WALL_US = 1_767_225_600_000_000


def absolute(offset: float) -> str:
    """The header value for ``offset`` seconds from the (virtual) wall clock's start."""
    return str(WALL_US + round(offset * 1e6))


class Seen:
    """An ASGI app recording the deadline it runs under."""

    def __init__(self) -> None:
        self.remaining: float | None = None
        self.received_ms: int | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.remaining = tb.remaining()
        state = current_request()
        self.received_ms = None if state is None else state.deadline_received_ms
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_format_rounds_up_to_whole_microseconds() -> None:
    """The sent value never names an earlier instant than ours."""
    assert format_absolute_us(1.0000001) == "1000001"


#: Absolute values that are not whole microseconds of the epoch.
HOSTILE_ABSOLUTE = ["", "+", "+5", "-1", "1 0", "1e6", "0x10", "1.5", "5us", "inf", "9" * 4000]


@pytest.mark.parametrize("value", [*HOSTILE_ABSOLUTE, "12345678901234567890", "\xd9\xa3"])
def test_hostile_absolute_value_means_no_deadline(value: str) -> None:
    """A malformed absolute deadline is ignored, never an error."""
    assert parse_absolute_us(value) is None


async def test_absolute_ten_years_ahead_is_no_deadline(virtual_clock: VirtualClock) -> None:
    """As for the relative header, a deadline 10 years away or more is no deadline."""
    app = Seen()
    result = await call_asgi(DeadlineMiddleware(app), {"X-Request-Deadline": "9223372036854775807"})
    assert result.status == 200 and app.remaining == float("inf")


async def test_absolute_earlier_than_relative_wins(virtual_clock: VirtualClock) -> None:
    """Within the skew, the effective deadline is the earlier of the two (transit counted)."""
    app = Seen()
    headers = {"X-YaTaxi-Client-TimeoutMs": "1000", "X-Request-Deadline": absolute(0.75)}
    await call_asgi(DeadlineMiddleware(app), headers)
    assert app.remaining == 0.75 and app.received_ms == 750


async def test_relative_earlier_than_absolute_wins(virtual_clock: VirtualClock) -> None:
    """An absolute deadline later than the relative one does not extend it."""
    app = Seen()
    headers = {"X-YaTaxi-Client-TimeoutMs": "500", "X-Request-Deadline": absolute(1.25)}
    await call_asgi(DeadlineMiddleware(app), headers)
    assert app.remaining == 0.5


async def test_caller_clock_ahead_is_ignored_and_counted(virtual_clock: VirtualClock) -> None:
    """A caller whose clock runs 4 s ahead sends a deadline the relative header contradicts."""
    app = Seen()
    headers = {"X-YaTaxi-Client-TimeoutMs": "1000", "X-Request-Deadline": absolute(5.0)}
    await call_asgi(DeadlineMiddleware(app), headers)
    assert app.remaining == 1.0
    assert counters.get("absolute-deadline-ignored", component="http-server") == 1


async def test_caller_clock_behind_never_causes_an_early_498(virtual_clock: VirtualClock) -> None:
    """An absolute deadline already past by our clock, but 3 s off the relative one, is ignored."""
    app = Seen()
    headers = {"X-YaTaxi-Client-TimeoutMs": "1000", "X-Request-Deadline": absolute(-2.0)}
    result = await call_asgi(DeadlineMiddleware(app), headers)
    assert result.status == 200 and app.remaining == 1.0


async def test_absolute_alone_sets_the_deadline(virtual_clock: VirtualClock) -> None:
    """Without a relative header, the absolute deadline is the request's deadline."""
    app = Seen()
    await call_asgi(DeadlineMiddleware(app), {"X-Request-Deadline": absolute(0.5)})
    assert app.remaining == 0.5


async def test_absolute_header_can_be_switched_off(virtual_clock: VirtualClock) -> None:
    """``absolute_header=None`` makes the server ignore it."""
    app = Seen()
    headers = {"X-YaTaxi-Client-TimeoutMs": "1000", "X-Request-Deadline": absolute(0.25)}
    await call_asgi(DeadlineMiddleware(app, absolute_header=None), headers)
    assert app.remaining == 1.0


async def test_wider_skew_accepts_a_farther_absolute(virtual_clock: VirtualClock) -> None:
    """``clock_skew`` sets how far the two may disagree."""
    app = Seen()
    headers = {"X-YaTaxi-Client-TimeoutMs": "5000", "X-Request-Deadline": absolute(2.0)}
    await call_asgi(DeadlineMiddleware(app, clock_skew=3.5), headers)
    assert app.remaining == 2.0


def test_clock_skew_is_a_duration() -> None:
    """clock_skew takes any duration form (D1.11)."""
    from datetime import timedelta

    from timebound.propagation._absolute import check_clock_skew

    assert check_clock_skew("500ms") == 0.5
    assert check_clock_skew(timedelta(seconds=2)) == 2.0
    assert check_clock_skew(0) == 0.0


@pytest.mark.parametrize("skew", [-1, float("nan"), float("inf"), True, "1"])
def test_bad_clock_skew_is_refused(skew: Any) -> None:
    """A negative, non-finite or non-numeric skew raises ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match="clock_skew"):
        DeadlineMiddleware(Seen(), clock_skew=skew)


def _record(seen: list[dict[str, str]]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


@pytest.mark.parametrize("absolute_header", ["X-Request-Deadline", None])
def test_httpx_sends_the_absolute_deadline_beside_the_relative_one(
    absolute_header: str | None,
) -> None:
    """A propagating client sends our end as epoch µs (or not, when switched off)."""
    seen: list[dict[str, str]] = []
    with ServerThread(_record(seen)) as srv:
        transport = DeadlineTransport(absolute_header=absolute_header)
        with httpx.Client(transport=transport) as client:
            with tb.fail_after(5):
                before = _clock.wall()
                client.get(srv.url)
                after = _clock.wall()
    headers = seen[0]
    assert "x-yataxi-client-timeoutms" in headers
    if absolute_header is None:
        assert "x-request-deadline" not in headers
    else:
        sent = int(headers["x-request-deadline"]) / 1e6
        assert before + 4 <= sent <= after + 5
