"""The gRPC server interceptor's reserve (D1.18), over real grpc.aio servers on 127.0.0.1: the
handler sees the call's deadline less the reserve and answers its fallback in time; a call with
no more than the reserve left is refused without running the handler."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation.grpc import aio_server_interceptor, server_interceptor

from .test_aio import channel, start

pytestmark = pytest.mark.asyncio_real


async def test_the_handler_answers_its_fallback_before_the_caller_deadline() -> None:
    seen: list[tuple[float, str | None]] = []

    async def handler(request: bytes, context: Any) -> bytes:
        left = tb.remaining()
        try:
            async with tb.fail_after(30, what="downstream"):
                await asyncio.sleep(30)
        except tb.DeadlineExceeded as exc:
            seen.append((left, exc.set_by))
            return b"fallback"
        return b"fresh"

    server, port = await start(
        {"Call": grpc.unary_unary_rpc_method_handler(handler)},
        interceptors=[aio_server_interceptor(reserve="500ms")],
    )
    try:
        async with channel(port, intercepted=False) as ch:
            answer = await ch.unary_unary("/test.Svc/Call")(b"", timeout=2.0)
    finally:
        await server.stop(None)
    assert answer == b"fallback"
    [(left, set_by)] = seen
    assert left <= 1.5 and set_by == "reserve of gRPC interceptor"


async def test_a_handler_letting_the_reserve_error_escape_answers_deadline_exceeded() -> None:
    async def handler(request: bytes, context: Any) -> bytes:
        async with tb.fail_after(30):
            await asyncio.sleep(30)
        return b"fresh"

    server, port = await start(
        {"Call": grpc.unary_unary_rpc_method_handler(handler)},
        interceptors=[aio_server_interceptor(reserve="500ms")],
    )
    try:
        async with channel(port, intercepted=False) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary("/test.Svc/Call")(b"", timeout=2.0)
    finally:
        await server.stop(None)
    # The interceptor's answer, not the client's own deadline: it came with the server's details.
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "Deadline propagation" in (info.value.details() or "")


async def test_a_call_with_no_more_than_the_reserve_left_is_refused() -> None:
    ran = False

    async def handler(request: bytes, context: Any) -> bytes:
        nonlocal ran
        ran = True
        return b"ran"

    server, port = await start(
        {"Call": grpc.unary_unary_rpc_method_handler(handler)},
        interceptors=[aio_server_interceptor(reserve="10s")],
    )
    try:
        async with channel(port, intercepted=False) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary("/test.Svc/Call")(b"", timeout=5.0)
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert not ran


@pytest.mark.parametrize("make", [server_interceptor, aio_server_interceptor])
def test_an_invalid_interceptor_reserve_is_a_configuration_error(make: Any) -> None:
    with pytest.raises(tb.ConfigurationError) as info:
        make(reserve="-1s")
    assert info.value.option == "reserve"


def test_sync_server_handler_answers_its_fallback_in_the_reserve() -> None:
    from concurrent import futures

    seen: list[str | None] = []

    def handler(request: bytes, context: Any) -> bytes:
        try:
            with tb.fail_after(30):
                while True:  # cooperative sync work, checking its deadline
                    tb.checkpoint()
                    time.sleep(0.01)
        except tb.DeadlineExceeded as exc:
            seen.append(exc.set_by)
            return b"fallback"

    server = grpc.server(
        futures.ThreadPoolExecutor(2), interceptors=[server_interceptor(reserve="500ms")]
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Svc", {"Call": grpc.unary_unary_rpc_method_handler(handler)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            answer = ch.unary_unary("/test.Svc/Call")(b"", timeout=2.0)
    finally:
        server.stop(None)
    assert answer == b"fallback"
    assert seen == ["reserve of gRPC interceptor"]
