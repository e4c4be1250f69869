"""grpc.aio: the server and client interceptors over real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation import RequestState, _state
from timebound.propagation.grpc import (
    EXPIRED_DETAILS,
    AioPropagatedDeadlineExceeded,
    PropagatedDeadlineExceeded,
    aio_client_interceptors,
    aio_server_interceptor,
)
from timebound.telemetry import counters

from .conftest import Recorder, decode, encode, observe, wait_until_spent, within

pytestmark = pytest.mark.asyncio_real

LEAF = "/test.Leaf/Echo"
MID = "/test.Mid/Call"
SRV_PROPAGATED = "grpc.server.by-destination.deadline-propagated"
SRV_CANCELLED = "grpc.server.by-destination.cancelled-by-deadline-propagation"
CLI_PROPAGATED = "grpc.client.by-destination.deadline-propagated"
CLI_CANCELLED = "grpc.client.by-destination.cancelled-by-deadline-propagation"


async def start(
    handlers: dict[str, Any], *, service: str = "test.Svc", interceptors: list[Any] | None = None
) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(
        interceptors=[aio_server_interceptor()] if interceptors is None else interceptors
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def channel(port: int, *, intercepted: bool = True) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", interceptors=aio_client_interceptors() if intercepted else None
    )


class Leaf:
    """The second server: echoes what it sees, gives up, or never answers."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.recorder = Recorder()

    async def echo(self, request: bytes, context: Any) -> bytes:
        self.recorder.handler_ran = True
        if self.mode == "abort":
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "leaf gave up")
        if self.mode == "block":
            await asyncio.sleep(10)
        return encode(observe(context))


async def start_leaf(mode: str = "echo") -> tuple[Leaf, grpc.aio.Server, int]:
    impl = Leaf(mode)
    server, port = await start(
        {"Echo": grpc.unary_unary_rpc_method_handler(impl.echo)}, service="test.Leaf"
    )
    return impl, server, port


async def start_mid(leaf_port: int) -> tuple[grpc.aio.Server, int, grpc.aio.Channel]:
    nested = channel(leaf_port)
    call_leaf = nested.unary_unary(LEAF)

    async def call(request: bytes, context: Any) -> bytes:
        opts = decode(request)
        seen = observe(context)
        try:
            leaf_seen = decode(await call_leaf(b"", timeout=opts.get("timeout")))
        except PropagatedDeadlineExceeded:
            if not opts.get("swallow"):
                raise
            leaf_seen = None
        return encode({"mid": seen, "leaf": leaf_seen})

    server, port = await start(
        {"Call": grpc.unary_unary_rpc_method_handler(call)}, service="test.Mid"
    )
    return server, port, nested


async def through_mid(leaf_mode: str, request: dict[str, Any], **kw: Any) -> Any:
    """Client → mid → leaf; returns mid's decoded answer (or raises the client's error)."""
    _, leaf, leaf_port = await start_leaf(leaf_mode)
    mid, mid_port, nested = await start_mid(leaf_port)
    try:
        async with channel(mid_port, intercepted=False) as client:
            return decode(await client.unary_unary(MID)(encode(request), **kw))
    finally:
        await nested.close()
        await mid.stop(None)
        await leaf.stop(None)


def in_request() -> tuple[RequestState, Callable[[], None]]:
    state = RequestState()
    token = _state._request.set(state)
    return state, lambda: _state._request.reset(token)


async def test_deadline_reaches_the_nested_server() -> None:
    """A client's 2 s deadline becomes the aio handler's and bounds its nested aio call."""
    resp = await through_mid("echo", {"timeout": 30.0}, timeout=2.0)
    assert within(resp["mid"]["received_ms"], 2)
    assert resp["mid"]["source"] == "inherited"
    assert within(resp["leaf"]["received_ms"], 2)
    assert counters.get(CLI_PROPAGATED, grpc_destination="test.Leaf/Echo") == 1
    assert counters.get(SRV_PROPAGATED, grpc_destination="test.Mid/Call") == 1
    assert counters.get(SRV_PROPAGATED, grpc_destination="test.Leaf/Echo") == 1


async def test_client_without_deadline_gives_no_deadline() -> None:
    """No client deadline (a huge time_remaining) means no deadline in the handler (D4.6)."""
    resp = await through_mid("echo", {"timeout": None})
    assert resp["mid"] == {
        "received_ms": None,
        "has_state": True,
        "remaining": None,
        "source": None,
    }
    assert resp["leaf"]["received_ms"] is None
    assert counters.total(SRV_PROPAGATED) == 0


async def test_expired_call_is_rejected_without_running_the_handler() -> None:
    """A call already past its deadline gets the exact userver status; the handler never runs."""
    recorder = Recorder()
    finished = asyncio.Event()

    async def handler(request: bytes, context: Any) -> bytes:
        recorder.handler_ran = True
        return b"late"

    class DelayUntilSpent(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation: Any, details: Any) -> Any:
            inner = (await continuation(details)).unary_unary

            async def behavior(request: bytes, context: Any) -> Any:
                wait_until_spent(context)  # blocks the loop: grpc.aio cannot cancel us first
                try:
                    return await inner(request, context)
                finally:
                    recorder.code = context.code()
                    recorder.details = context.details()
                    finished.set()

            return grpc.unary_unary_rpc_method_handler(behavior)

    server, port = await start(
        {"Echo": grpc.unary_unary_rpc_method_handler(handler)},
        interceptors=[DelayUntilSpent(), aio_server_interceptor()],
    )
    try:
        async with channel(port, intercepted=False) as client:
            # Connected first, and a budget that a loaded machine still delivers within: a call
            # whose deadline ran out on the way never reached the interceptor (failed once).
            await client.channel_ready()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await client.unary_unary("/test.Svc/Echo")(b"", timeout=0.5)
        # The client's own deadline may answer it first; stopping the server before the
        # handler's finally ran would cancel it there and record nothing (or a cancellation).
        await asyncio.wait_for(finished.wait(), 10)
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert recorder.handler_ran is False
    assert recorder.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert recorder.details == EXPIRED_DETAILS
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Echo") == 1


async def test_nested_expiry_answers_deadline_exceeded() -> None:
    """A nested aio call cut short by our deadline makes the first server answer expiry."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await through_mid("abort", {"timeout": 30.0}, timeout=5.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == EXPIRED_DETAILS
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Mid/Call") == 1


async def test_swallowed_nested_expiry_still_answers_deadline_exceeded() -> None:
    """An aio handler that swallows the propagated error still answers expiry (D4.5)."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await through_mid("abort", {"timeout": 30.0, "swallow": True}, timeout=5.0)
    assert info.value.details() == EXPIRED_DETAILS


async def test_client_fails_locally_when_deadline_is_spent() -> None:
    """With no time left the aio call raises the binding bound's error and sends nothing."""
    impl, server, port = await start_leaf()
    state, done = in_request()
    try:
        async with channel(port) as ch:
            with tb.inherit_deadline(tb.Deadline.after(0)):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    await ch.unary_unary(LEAF)(b"", timeout=30.0)
    finally:
        done()
        await server.stop(None)
    assert info.value.source == "inherited"
    assert not isinstance(info.value, grpc.RpcError)
    assert impl.recorder.handler_ran is False
    assert state.cancelled_by_deadline is True
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1


async def test_lowered_timeout_expiry_raises_propagated() -> None:
    """DEADLINE_EXCEEDED after our deadline lowered the timeout raises the aio propagated error."""
    _, server, port = await start_leaf("block")
    state, done = in_request()
    try:
        async with channel(port) as ch:
            with tb.inherit_deadline(tb.Deadline.after(0.2), set_by="the test's caller"):
                with pytest.raises(AioPropagatedDeadlineExceeded) as info:
                    await ch.unary_unary(LEAF)(b"", timeout=30.0)
    finally:
        done()
        await server.stop(None)
    err = info.value
    assert err.source == "propagated"
    # Where the bound that lowered the call was set, and its instant, as over HTTP.
    assert err.set_by == "the test's caller" and err.deadline is not None
    assert isinstance(err, grpc.aio.AioRpcError)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(err.__cause__, grpc.aio.AioRpcError)
    assert state.cancelled_by_deadline is True


async def test_static_timeout_expiry_stays_a_plain_aio_rpc_error() -> None:
    """When the call's own timeout was the tighter one, grpc.aio's error is left as it is."""
    _, server, port = await start_leaf("block")
    state, done = in_request()
    try:
        async with channel(port) as ch:
            with tb.inherit_deadline(tb.Deadline.after(30)):
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await ch.unary_unary(LEAF)(b"", timeout=0.1)
    finally:
        done()
        await server.stop(None)
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert state.cancelled_by_deadline is False


async def test_successful_call_keeps_its_status_and_metadata() -> None:
    """A lowered call that succeeds is returned as grpc's own call object (code, metadata)."""
    _, server, port = await start_leaf()
    try:
        async with channel(port) as ch:
            with tb.inherit_deadline(tb.Deadline.after(2)):
                call = ch.unary_unary(LEAF)(b"", timeout=30.0)
                seen = decode(await call)
                code = await call.code()
    finally:
        await server.stop(None)
    assert within(seen["received_ms"], 2)
    assert code == grpc.StatusCode.OK


async def test_async_generator_stream_sees_the_deadline_at_every_item() -> None:
    """An async-generator response stream runs every step under the inherited deadline."""

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        for _ in range(3):
            await asyncio.sleep(0)
            yield encode(observe(context))

    server, port = await start({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    try:
        async with channel(port, intercepted=False) as ch:
            items = [decode(m) async for m in ch.unary_stream("/test.Svc/Stream")(b"", timeout=2)]
    finally:
        await server.stop(None)
    assert len(items) == 3
    assert all(within(item["received_ms"], 2) for item in items)


async def test_writing_stream_handler_sees_the_deadline() -> None:
    """A coroutine handler that writes its responses with ``context.write`` sees the deadline."""

    async def stream(request: bytes, context: Any) -> None:
        await context.write(encode(observe(context)))

    server, port = await start({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    try:
        async with channel(port, intercepted=False) as ch:
            items = [decode(m) async for m in ch.unary_stream("/test.Svc/Stream")(b"", timeout=2)]
    finally:
        await server.stop(None)
    assert len(items) == 1 and within(items[0]["received_ms"], 2)


async def test_bidi_stream_handler_sees_the_deadline() -> None:
    """A bidirectional async-generator handler runs under the inherited deadline."""

    async def bidi(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for _ in requests:
            yield encode(observe(context))

    server, port = await start({"Bidi": grpc.stream_stream_rpc_method_handler(bidi)})
    try:
        async with channel(port) as ch:
            call = ch.stream_stream("/test.Svc/Bidi")(iter([b"a", b"b"]), timeout=2)
            items = [decode(m) async for m in call]
    finally:
        await server.stop(None)
    assert len(items) == 2 and all(within(item["received_ms"], 2) for item in items)


async def test_response_stream_expiry_marks_the_request() -> None:
    """A response stream ended by our lowered deadline is counted and marks the request."""

    async def stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.sleep(10)

    server, port = await start({"Stream": grpc.unary_stream_rpc_method_handler(stream)})
    state, done = in_request()
    try:
        async with channel(port) as ch:
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                call = ch.unary_stream("/test.Svc/Stream")(b"", timeout=30.0)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    async for _ in call:
                        pass
            for _ in range(100):  # the done-callback's check runs on a later loop iteration
                if state.cancelled_by_deadline:
                    break
                await asyncio.sleep(0)
    finally:
        done()
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert state.cancelled_by_deadline is True
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Svc/Stream") == 1


async def test_sync_handler_under_aio_is_passed_through() -> None:
    """A plain function handler under grpc.aio runs untouched (grpc's executor drops context)."""

    def unary(request: bytes, context: Any) -> bytes:
        return encode(observe(context))

    server, port = await start({"Unary": grpc.unary_unary_rpc_method_handler(unary)})
    try:
        async with channel(port, intercepted=False) as ch:
            seen = decode(await ch.unary_unary("/test.Svc/Unary")(b"", timeout=2))
    finally:
        await server.stop(None)
    assert seen["has_state"] is False
