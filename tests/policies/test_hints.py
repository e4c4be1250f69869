"""Server retry hints (D3.11): Retry-After and grpc-retry-pushback-ms set the next retry's time."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound._core import _clock
from timebound.lowlevel import RetryAt, RetryPlan, Stop
from timebound.policies import Policy
from timebound.policies._hints import parse_pushback, parse_retry_after, retry_hint
from timebound.testing import VirtualClock

from ._helpers import Recorder


def _http_error(status: int, retry_after: str | None) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1/x")
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    response = httpx.Response(status, headers=headers, request=request)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)


class _RpcError(Exception):
    """What grpc.RpcError offers a retry loop: its trailing metadata."""

    def __init__(self, pushback: str | None) -> None:
        super().__init__("UNAVAILABLE")
        self._pushback = pushback

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        if self._pushback is None:
            return ()
        return (("grpc-retry-pushback-ms", self._pushback),)


class _Answers:
    """Raises the given errors in turn, then returns "ok"; records when each call began."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls: list[float] = []

    def __call__(self) -> Any:
        self.calls.append(_clock.now())
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_retry_after_on_503_sets_the_next_attempt(virtual_clock: VirtualClock) -> None:
    """A 503 with Retry-After: 2 makes the next attempt wait 2 s, not the policy's 100 ms."""
    call = _Answers(_http_error(503, "2"))
    policy = Policy("Get", retry=2, delay="100ms")
    assert policy.execute_sync(call) == "ok"
    assert call.calls == [0.0, 2.0]


def test_a_shorter_hint_never_shortens_the_backoff(virtual_clock: VirtualClock) -> None:
    """The wait is the later of the backoff and the hint (the hint is an earliest time)."""
    call = _Answers(_http_error(429, "1"))
    policy = Policy("Get", retry=2, delay="3s")
    assert policy.execute_sync(call) == "ok"
    assert call.calls == [0.0, 3.0]


def test_retry_after_past_the_deadline_stops_at_once(virtual_clock: VirtualClock) -> None:
    """A hint later than the effective deadline: no retry, no wait, the reason said."""
    err = _http_error(503, "5")
    call = _Answers(err)
    policy = Policy("Get", retry=3, delay="100ms")
    recorder = Recorder()
    with tb.fail_after(3), pytest.raises(httpx.HTTPStatusError) as info:
        policy.execute_sync(call, observer=recorder)
    assert info.value is err and call.calls == [0.0] and _clock.now() == 0.0
    assert any("past the deadline" in note for note in info.value.__notes__)
    refused = recorder.of("retry.refused")
    assert [e.attrs["reason"] for e in refused] == ["retry_after_past_deadline"]


def test_the_plan_says_why_it_stopped(virtual_clock: VirtualClock) -> None:
    """RetryPlan.failed returns Stop with the reason, absorbable (the dependency's failure)."""
    plan = RetryPlan("Get", retry=3)
    with tb.fail_after(1):
        _, decision = plan.failed(plan.start(), _http_error(503, "2"))
    assert isinstance(decision, Stop)
    assert decision.reason == "retry_after_past_deadline" and decision.absorbable


def test_a_hint_past_the_deadline_still_reaches_the_fallback(virtual_clock: VirtualClock) -> None:
    """The call ends with the dependency's failure, so the fallback applies."""
    policy = Policy("Get", retry=3, fallback="cached")
    with tb.fail_after(1):
        assert policy.execute_sync(_Answers(_http_error(503, "2"))) == "cached"


def test_a_hint_over_max_delay_stops(virtual_clock: VirtualClock) -> None:
    """max_delay caps every wait, a server's included: a longer hint means no retry."""
    plan = RetryPlan("Get", retry=3, max_delay=10.0)
    _, decision = plan.failed(plan.start(), _http_error(503, "60"))
    assert isinstance(decision, Stop) and decision.reason == "retry_after_over_max_delay"


def test_other_statuses_carry_no_hint(virtual_clock: VirtualClock) -> None:
    """Retry-After on a 500 is not a retry hint; the policy's delay stands."""
    plan = RetryPlan("Get", retry=3, delay=0.5)
    _, decision = plan.failed(plan.start(), _http_error(500, "9"))
    assert isinstance(decision, RetryAt) and decision.delay == 0.5


def test_grpc_pushback_sets_the_next_attempt(virtual_clock: VirtualClock) -> None:
    """grpc-retry-pushback-ms: 1500 waits 1.5 s."""
    call = _Answers(_RpcError("1500"))
    assert Policy("Rpc", retry=1).execute_sync(call) == "ok"
    assert call.calls == [0.0, 1.5]


def test_negative_grpc_pushback_refuses_a_retry(virtual_clock: VirtualClock) -> None:
    """gRFC A6: a negative or malformed pushback means "do not retry"."""
    plan = RetryPlan("Rpc", retry=3)
    for value in ("-1", "soon"):
        _, decision = plan.failed(plan.start(), _RpcError(value))
        assert isinstance(decision, Stop) and decision.reason == "retry_refused_by_server"


def test_retry_after_as_an_http_date(virtual_clock: VirtualClock) -> None:
    """An HTTP date is read against the wall clock."""
    when = datetime.fromtimestamp(_clock.wall() + 30, tz=UTC)
    seconds = parse_retry_after(format_datetime(when, usegmt=True))
    assert seconds is not None and 28 <= seconds <= 30


def test_parsing_edges() -> None:
    """Malformed Retry-After is no hint; pushback absent is no hint, malformed is a refusal."""
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None
    assert parse_retry_after(b"7") == 7.0
    assert parse_pushback(None) is None and parse_pushback("250") == 0.25
    assert parse_pushback("-5") == math.inf
    assert retry_hint(ValueError("x")) is None


def test_aiohttp_style_errors_carry_their_headers() -> None:
    """aiohttp's ClientResponseError has status and headers on the error itself."""

    class ClientResponseError(Exception):
        status = 429
        headers = {"Retry-After": "3"}

    assert retry_hint(ClientResponseError()) == 3.0
