"""grpc.aio: handler errors from other bounds, async-generator streams spending the deadline,
and client errors the interceptor must leave alone, over real servers on 127.0.0.1."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation import RequestState, _state
from timebound.propagation.grpc import (
    EXPIRED_DETAILS,
    AioPropagatedDeadlineExceeded,
    aio_server_interceptor,
)
from timebound.telemetry import counters

from .conftest import wait_until_spent
from .test_aio import CLI_CANCELLED, LEAF, SRV_CANCELLED, channel, in_request, start, start_leaf

pytestmark = pytest.mark.asyncio_real


async def test_coroutine_handler_error_from_another_bound_is_its_own() -> None:
    """A DeadlineExceeded from a bound other than the request's leaves the handler as an error."""

    async def handler(request: bytes, context: Any) -> bytes:
        raise tb.DeadlineExceeded(source="attempt", what="database query")

    server, port = await start({"Call": grpc.unary_unary_rpc_method_handler(handler)})
    try:
        async with channel(port, intercepted=False) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary("/test.Svc/Call")(b"", timeout=5)
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Call") == 0


async def _stream_items(port: int, timeout: float) -> tuple[list[bytes], grpc.aio.AioRpcError]:
    items: list[bytes] = []
    async with channel(port, intercepted=False) as ch:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for item in ch.unary_stream("/test.Svc/Stream")(b"", timeout=timeout):
                items.append(item)
    return items, info.value


async def test_async_generator_spending_the_request_deadline_ends_deadline_exceeded() -> None:
    """An async-generator stream that runs past the request's deadline is answered expired."""

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"first"
        wait_until_spent(context)  # blocks the loop, so grpc.aio cannot cancel us first
        await tb.acheckpoint()  # raises the request's own deadline (source "inherited")
        yield b"never"

    server, port = await start({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    try:
        # The client shares the blocked loop, so whether "first" reaches it is not the point.
        _, err = await _stream_items(port, 0.3)
    finally:
        await server.stop(None)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Stream") == 1


async def test_async_generator_error_from_another_bound_is_its_own() -> None:
    """An async-generator stream failing with another bound's DeadlineExceeded is an error."""

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"first"
        raise tb.DeadlineExceeded(source="scope", what="render")

    server, port = await start({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    try:
        items, err = await _stream_items(port, 5)
    finally:
        await server.stop(None)
    assert (items, err.code()) == ([b"first"], grpc.StatusCode.UNKNOWN)
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Stream") == 0


async def test_lowered_call_failing_otherwise_keeps_grpcs_error() -> None:
    """A lowered call that fails with another status raises grpc's error, uncounted."""

    async def handler(request: bytes, context: Any) -> bytes:
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        return b""

    server, port = await start({"Call": grpc.unary_unary_rpc_method_handler(handler)})
    state, done = in_request()
    try:
        async with channel(port) as ch:
            with tb.inherit_deadline(tb.Deadline.after(5)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await ch.unary_unary("/test.Svc/Call")(b"", timeout=60)
    finally:
        done()
        await server.stop(None)
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert (info.value.code(), info.value.details()) == (grpc.StatusCode.NOT_FOUND, "no such thing")
    assert state.cancelled_by_deadline is False
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Svc/Call") == 0


async def test_attempt_timeout_expiry_stays_a_plain_aio_rpc_error() -> None:
    """A timeout lowered by the attempt's own bound is the attempt's time, not our deadline:
    grpc.aio's own (retryable) error, and the request with time left is not marked (D2.5)."""
    _, server, port = await start_leaf("block")
    deadline = tb.Deadline.after(30)
    state = RequestState(deadline_received_ms=30_000, deadline=deadline)
    token = _state._request.set(state)
    try:
        async with channel(port) as ch:
            # A visible, non-cancelling attempt bound (a cancelling one would race grpc's own
            # expiry to the punch): grpc.aio's DEADLINE_EXCEEDED reaches the interceptor.
            with tb.inherit_deadline(deadline):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    with tb.inherit_deadline(tb.Deadline.after(0.2), source="attempt"):
                        await ch.unary_unary(LEAF)(b"", timeout=30.0)
    finally:
        _state._request.reset(token)
        await server.stop(None)
    assert not isinstance(info.value, AioPropagatedDeadlineExceeded)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert state.cancelled_by_deadline is False
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1


async def test_expired_stream_call_is_rejected_without_running_the_generator() -> None:
    """An async-generator stream already past its deadline is answered expired, never run."""
    ran: list[bool] = []
    status: list[Any] = []

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        ran.append(True)
        yield b"late"

    class DelayUntilSpent(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            inner = (await continuation(details)).unary_stream

            async def behavior(request: bytes, context: Any) -> AsyncIterator[bytes]:
                wait_until_spent(context)  # blocks the loop: grpc.aio cannot cancel us first
                try:
                    async for item in inner(request, context):
                        yield item
                finally:
                    status.append((context.code(), context.details()))

            return grpc.unary_stream_rpc_method_handler(behavior)

    server, port = await start(
        {"Stream": grpc.unary_stream_rpc_method_handler(stream)},
        interceptors=[DelayUntilSpent(), aio_server_interceptor()],
    )
    try:
        items, err = await _stream_items(port, 0.05)
    finally:
        await server.stop(None)
    assert (items, ran, err.code()) == ([], [], grpc.StatusCode.DEADLINE_EXCEEDED)
    assert status == [(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS)]
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Stream") == 1
