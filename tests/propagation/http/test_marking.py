"""Which spent bound marks the request "cancelled by deadline" (D4.4, D4.5, D2.5).

Only the request's own deadline does. An attempt timeout or a local scope that ends earlier is
the caller's business: its error reaches the caller, the request still has time, and it must not
be answered "Deadline expired" because of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound._core._request import _request
from timebound.propagation import RequestState, clamp_timeout
from timebound.propagation.asgi import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, AttemptTimeout
from timebound.testing import VirtualClock

from .conftest import Receive, Scope, Send, call_asgi

H = "X-YaTaxi-Client-TimeoutMs"
EXPIRED = {"X-YaTaxi-Deadline-Expired": "1"}


@pytest.fixture
def request_state() -> Iterator[RequestState]:
    """A request with 30 s left, entered as a server adapter enters it."""
    state = RequestState(deadline_received_ms=30_000, deadline=tb.Deadline.after(30))
    token = _request.set(state)
    with tb.inherit_deadline(state.deadline):  # type: ignore[arg-type]
        yield state
    _request.reset(token)


class Slow:
    """A downstream ASGI app that answers after ``sleep`` seconds."""

    def __init__(self, sleep: float) -> None:
        self.sleep = sleep

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await asyncio.sleep(self.sleep)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"slow"})


def _client(inner: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=AsyncDeadlineTransport(inner=inner, timeout=5.0), base_url="http://down"
    )


def _handler(client: httpx.AsyncClient, attempt_timeout: float | None) -> Any:
    """An ASGI handler that calls downstream, swallows a deadline error and answers 200."""

    async def handler(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        try:
            if attempt_timeout is None:
                await client.get("/")
            else:
                with tb.fail_after(attempt_timeout, source="attempt"):
                    await client.get("/")
        except tb.DeadlineExceeded:
            pass
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"recovered"})

    return handler


async def test_swallowed_attempt_timeout_leaves_the_response_alone(
    virtual_clock: VirtualClock,
) -> None:
    """A call cut by its 100 ms attempt timeout in a request with 30 s left: the handler's own
    answer goes out, not 498."""
    async with _client(httpx.ASGITransport(app=Slow(1.0))) as client:
        result = await call_asgi(DeadlineMiddleware(_handler(client, 0.1)), {H: "30000"})
    assert (result.status, result.body) == (200, b"recovered")
    assert virtual_clock.now() == 0.1


async def test_swallowed_cut_by_the_request_deadline_still_answers_498(
    virtual_clock: VirtualClock,
) -> None:
    """The same call cut by the request's own 100 ms deadline: 498, as D4.5 requires."""
    async with _client(httpx.ASGITransport(app=Slow(1.0))) as client:
        result = await call_asgi(DeadlineMiddleware(_handler(client, None)), {H: "100"})
    assert result.status == 498


async def test_remote_expiry_under_an_attempt_timeout_is_retryable(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """A remote 498 for a timeout lowered by the attempt's own bound is an ordinary, retryable
    AttemptTimeout (source attempt), and the request is not marked."""
    inner = httpx.MockTransport(lambda request: httpx.Response(498, headers=EXPIRED))
    async with _client(inner) as client:
        with pytest.raises(AttemptTimeout) as info:
            with tb.fail_after(0.5, source="attempt"):
                await client.get("/")
    assert info.value.source == "attempt"
    assert request_state.cancelled_by_deadline is False


async def test_remote_expiry_under_a_local_scope_is_propagated_but_not_the_requests(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """A local 500 ms scope lowered the timeout: the remote 498 means that scope is spent
    (propagated, never retried), but the request with 30 s left is not marked."""
    inner = httpx.MockTransport(lambda request: httpx.Response(498, headers=EXPIRED))
    async with _client(inner) as client:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(0.5):
                await client.get("/")
    assert info.value.source == "propagated"
    assert request_state.cancelled_by_deadline is False


def test_fail_fast_under_a_spent_local_scope_leaves_the_request_unmarked(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """No time left in an attempt scope, 30 s left in the request: raise, but do not mark."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1, source="attempt"):
            virtual_clock.advance(1)
            clamp_timeout(5.0)
    assert info.value.source == "attempt"
    assert request_state.cancelled_by_deadline is False


def test_fail_fast_under_the_spent_request_deadline_marks_it(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """No time left in the request itself: raise and mark."""
    virtual_clock.advance(30)
    with pytest.raises(tb.DeadlineExceeded) as info:
        clamp_timeout(5.0)
    assert info.value.source == "inherited"
    assert request_state.cancelled_by_deadline is True
