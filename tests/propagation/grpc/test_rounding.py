"""grpc-core rounds the ``grpc-timeout`` it sends up (30 s arrives as 30.1 s): the server
interceptor never gives a handler more than its caller's budget, and the 365-day rule is
decided on the value sent, not on what is left of it after transit. Real grpcio on 127.0.0.1.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation.grpc import aio_server_interceptor, server_interceptor
from timebound.propagation.grpc._interceptors import _handler_budget, _received_deadline

from .conftest import start_sync_server

YEAR = 365 * 24 * 3600.0
HOUR = 3600.0

#: Client timeouts (seconds) that grpc-core rounds up on the wire, and two it does not.
TIMEOUTS = [0.3, 1.0, 1.234, 2.0, 30.0, 100.0, 1000.0, 5000.0, 86400.0]


def _budgets_seen_by_a_sync_handler(timeouts: list[float]) -> list[tuple[float, float, float]]:
    """(client timeout, grpc's time_remaining(), tb.remaining()) at the handler's entry."""
    seen: list[tuple[float, float, float]] = []
    current: list[float] = []

    def handler(request: bytes, context: Any) -> bytes:
        seen.append((current[0], context.time_remaining(), tb.remaining()))
        return b""

    server, port = start_sync_server(
        {"Call": grpc.unary_unary_rpc_method_handler(handler)}, interceptors=[server_interceptor()]
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/test.Svc/Call")
            for timeout in timeouts:
                current[:] = [timeout]
                call(b"", timeout=timeout)
    finally:
        server.stop(None)
    return seen


def test_sync_handler_never_gets_more_than_the_callers_timeout() -> None:
    """For every rounded-up grpc-timeout, the handler's budget is at most the client's timeout."""
    seen = _budgets_seen_by_a_sync_handler(TIMEOUTS)
    assert len(seen) == len(TIMEOUTS)
    # The premise: grpc itself hands the server more than the caller has for some of them.
    assert any(grpc_left > timeout for timeout, grpc_left, _ in seen)
    for timeout, _, ours in seen:
        assert 0 < ours <= timeout, (timeout, ours)


@pytest.mark.asyncio_real
async def test_aio_handler_never_gets_more_than_the_callers_timeout() -> None:
    """Under grpc.aio too, the handler's budget is at most the client's timeout."""
    seen: list[tuple[float, float]] = []
    current: list[float] = []

    async def handler(request: bytes, context: Any) -> bytes:
        seen.append((current[0], tb.remaining()))
        return b""

    server = grpc.aio.server(interceptors=[aio_server_interceptor()])
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Svc", {"Call": grpc.unary_unary_rpc_method_handler(handler)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/test.Svc/Call")
            for timeout in TIMEOUTS:
                current[:] = [timeout]
                await call(b"", timeout=timeout)
    finally:
        await server.stop(None)
    assert [t for t, _ in seen] == TIMEOUTS
    for timeout, ours in seen:
        assert 0 < ours <= timeout, (timeout, ours)


def test_a_year_sent_is_no_deadline_whatever_the_transit_time() -> None:
    """A timeout grpc sends as 8760 h (365 days) arrives a hair under 365 days and still means
    no deadline (D4.6)."""
    seen = _budgets_seen_by_a_sync_handler([YEAR - HOUR / 2])  # rounded up to 8760 h
    (_, grpc_left, ours) = seen[0]
    assert grpc_left < YEAR  # what arrived is already below the rule's threshold
    assert ours == math.inf


def test_a_day_under_a_year_is_a_deadline() -> None:
    """364 days sent is a deadline of (at most) 364 days."""
    seen = _budgets_seen_by_a_sync_handler([YEAR - 24 * HOUR])
    (timeout, _, ours) = seen[0]
    assert 0 < ours <= timeout


@pytest.mark.parametrize(
    ("time_remaining", "expected"),
    [
        (None, None),
        (YEAR, None),
        (10 * YEAR, None),
        (YEAR - 1, None),
        (YEAR - HOUR + 0.5, None),
        (YEAR - HOUR, YEAR - HOUR),
        (0.0, 0.0),
        (2.5, 2.5),
    ],
)
def test_year_rule_reads_the_hour_grpc_sent(
    time_remaining: float | None, expected: float | None
) -> None:
    """Above 8759 h on arrival the wire said 8760 h (365 days) or more: no deadline."""
    assert _received_deadline(time_remaining) == expected


@pytest.mark.parametrize(
    ("arrived", "sent_at_most"),
    [(30.1, 30.0), (1.01, 1.0), (101.0, 100.0), (1010.0, 1000.0), (0.301, 0.3), (0.002, 0.001)],
)
def test_budget_is_below_what_grpc_rounded_up(arrived: float, sent_at_most: float) -> None:
    """The handler budget for a value grpc rounded up is at most the timeout that was sent."""
    assert _handler_budget(arrived) <= sent_at_most


def test_budget_is_never_negative() -> None:
    """A value below grpc's rounding leaves a budget of zero, not a negative one."""
    assert _handler_budget(0.001) == 0.0
