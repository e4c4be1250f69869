"""Sync grpcio: handler errors from other bounds, streaming expiry, streaming client clamp and
the propagated error's accessors, over real servers on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import timebound as tb
from timebound.propagation.grpc import (
    EXPIRED_DETAILS,
    PropagatedDeadlineExceeded,
    client_interceptor,
    server_interceptor,
)
from timebound.telemetry import counters

from .conftest import decode, encode, observe, settled, start_sync_server, wait_until_spent, within

SRV_CANCELLED = "grpc.server.by-destination.cancelled-by-deadline-propagation"
CLI_PROPAGATED = "grpc.client.by-destination.deadline-propagated"


def serve(handlers: dict[str, Any]) -> tuple[grpc.Server, grpc.Channel]:
    server, port = start_sync_server(handlers, interceptors=[server_interceptor()])
    return server, grpc.insecure_channel(f"127.0.0.1:{port}")


def test_handler_error_from_another_bound_is_the_handlers_own() -> None:
    """A DeadlineExceeded from a bound other than the request's leaves the handler as an error."""

    def handler(request: bytes, context: Any) -> bytes:
        raise tb.DeadlineExceeded(source="attempt", what="database query")

    server, channel = serve({"Call": grpc.unary_unary_rpc_method_handler(handler)})
    try:
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary("/test.Svc/Call")(b"", timeout=5)
    finally:
        channel.close()
        server.stop(None)
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Call") == 0


def test_response_stream_spending_the_request_deadline_ends_deadline_exceeded() -> None:
    """A response stream whose handler runs past the request's deadline is answered expired."""

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        yield b"first"
        wait_until_spent(context)
        tb.checkpoint()  # raises the request's own deadline (source "inherited")
        yield b"never"

    server, channel = serve({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    items: list[bytes] = []
    try:
        with pytest.raises(grpc.RpcError) as info:
            for item in channel.unary_stream("/test.Svc/Stream")(b"", timeout=0.3):
                items.append(item)
    finally:
        channel.close()
        server.stop(None)
    assert items == [b"first"]
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert settled(lambda: counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Stream"), 1) == 1


def test_response_stream_error_from_another_bound_is_the_handlers_own() -> None:
    """A response stream failing with another bound's DeadlineExceeded is an ordinary error."""

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        yield b"first"
        raise tb.DeadlineExceeded(source="scope", what="render")

    server, channel = serve({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    items: list[bytes] = []
    try:
        with pytest.raises(grpc.RpcError) as info:
            for item in channel.unary_stream("/test.Svc/Stream")(b"", timeout=5):
                items.append(item)
    finally:
        channel.close()
        server.stop(None)
    assert items == [b"first"]
    assert info.value.code() == grpc.StatusCode.UNKNOWN
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Stream") == 0


def test_response_stream_call_is_clamped_by_the_deadline() -> None:
    """A response-stream call made under a deadline sends that deadline, not its static one."""

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        yield encode(observe(context))

    server, port = start_sync_server(
        {"Stream": grpc.unary_stream_rpc_method_handler(stream)},
        interceptors=[server_interceptor()],
    )
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port}"), client_interceptor()
    )
    try:
        with tb.inherit_deadline(tb.Deadline.after(2)):
            [seen] = [decode(m) for m in channel.unary_stream("/test.Svc/Stream")(b"", timeout=60)]
    finally:
        channel.close()
        server.stop(None)
    assert within(seen["received_ms"], 2)
    assert counters.get(CLI_PROPAGATED, grpc_destination="test.Svc/Stream") == 1


def test_propagated_error_keeps_the_calls_status_and_metadata() -> None:
    """The propagated error still answers grpc's accessors from the failed call."""

    def handler(request: bytes, context: Any) -> bytes:
        context.set_trailing_metadata((("retry-hint", "later"),))
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "leaf gave up")

    server, port = start_sync_server(
        {"Call": grpc.unary_unary_rpc_method_handler(handler)}, interceptors=[]
    )
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port}"), client_interceptor()
    )
    try:
        with tb.inherit_deadline(tb.Deadline.after(5)):
            with pytest.raises(PropagatedDeadlineExceeded) as info:
                channel.unary_unary("/test.Svc/Call")(b"", timeout=60)
    finally:
        channel.close()
        server.stop(None)
    err = info.value
    assert (err.code(), err.details()) == (grpc.StatusCode.DEADLINE_EXCEEDED, "leaf gave up")
    assert ("retry-hint", "later") in tuple(err.trailing_metadata())
    assert err.initial_metadata() is not None
    assert "leaf gave up" in (err.debug_error_string() or "")


def test_expired_stream_call_is_rejected_without_running_the_handler() -> None:
    """A response-stream call already past its deadline is answered expired, never run."""
    ran: list[bool] = []
    status: list[Any] = []
    finished = threading.Event()

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        ran.append(True)
        yield b"late"

    class DelayUntilSpent(grpc.ServerInterceptor):  # type: ignore[misc]
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            inner = continuation(details).unary_stream

            def behavior(request: bytes, context: Any) -> Iterator[bytes]:
                wait_until_spent(context)
                try:
                    yield from inner(request, context)
                finally:
                    status.append((context.code(), context.details()))
                    finished.set()

            return grpc.unary_stream_rpc_method_handler(behavior)

    server, port = start_sync_server(
        {"Stream": grpc.unary_stream_rpc_method_handler(stream)},
        interceptors=[DelayUntilSpent(), server_interceptor()],
    )
    items: list[bytes] = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            # Connected first, and a budget a loaded machine still delivers within.
            grpc.channel_ready_future(channel).result(timeout=10)
            with pytest.raises(grpc.RpcError) as info:
                for item in channel.unary_stream("/test.Svc/Stream")(b"", timeout=0.5):
                    items.append(item)
        # The client's own deadline can end the call before the server thread reaches the
        # generator's finally; stopping the server then would abandon the generator unrecorded.
        assert finished.wait(10)
    finally:
        server.stop(None)
    assert (items, ran, info.value.code()) == ([], [], grpc.StatusCode.DEADLINE_EXCEEDED)
    assert status == [(grpc.StatusCode.DEADLINE_EXCEEDED, EXPIRED_DETAILS.encode())]
    assert settled(lambda: counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Stream"), 1) == 1
