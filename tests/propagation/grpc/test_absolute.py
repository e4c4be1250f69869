"""The absolute deadline over gRPC: ``x-request-deadline`` metadata (D4.12, D9.3).

Real grpcio servers (sync and ``grpc.aio``) on 127.0.0.1 with timebound's interceptors. The
server reads the absolute deadline beside ``grpc-timeout`` under the clock-skew rule HTTP uses,
refuses a call whose absolute deadline has passed, and the client interceptors send it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound.propagation.grpc import (
    ABSOLUTE_METADATA,
    EXPIRED_DETAILS,
    aio_client_interceptors,
    aio_server_interceptor,
    client_interceptor,
    server_interceptor,
)
from timebound.telemetry import counters

from .conftest import Recorder, decode, encode, observe, start_sync_server

ECHO = "/test.Svc/Echo"
SRV_CANCELLED = "grpc.server.by-destination.cancelled-by-deadline-propagation"


def _us(epoch_seconds: float) -> str:
    return str(int(epoch_seconds * 1e6))


class Echo:
    """Records whether it ran, what deadline it saw and the absolute deadline it was sent."""

    def __init__(self) -> None:
        self.recorder = Recorder()
        self.absolute: list[str] = []

    def _see(self, context: Any) -> bytes:
        self.recorder.handler_ran = True
        self.absolute += [v for k, v in context.invocation_metadata() if k == ABSOLUTE_METADATA]
        return encode(observe(context))

    def sync(self, request: bytes, context: Any) -> bytes:
        return self._see(context)

    async def aio(self, request: bytes, context: Any) -> bytes:
        return self._see(context)


@pytest.fixture
def sync_echo() -> Iterator[tuple[Echo, int]]:
    """A sync grpcio server with the server interceptor, answering ``/test.Svc/Echo``."""
    impl = Echo()
    server, port = start_sync_server(
        {"Echo": grpc.unary_unary_rpc_method_handler(impl.sync)},
        interceptors=[server_interceptor()],
    )
    yield impl, port
    server.stop(None)


def _call_sync(port: int, *, intercepted: bool = False, **kw: Any) -> Any:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        if intercepted:
            ch = grpc.intercept_channel(ch, client_interceptor())
        return decode(ch.unary_unary(ECHO)(b"", **kw))


def test_passed_absolute_deadline_is_refused(sync_echo: tuple[Echo, int]) -> None:
    """sync: a call whose absolute deadline passed is refused; the handler never runs."""
    impl, port = sync_echo
    passed = _us(time.time() - 5)
    with pytest.raises(grpc.RpcError) as info:
        _call_sync(port, metadata=[(ABSOLUTE_METADATA, passed)])
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == EXPIRED_DETAILS
    assert impl.recorder.handler_ran is False
    assert counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Echo") == 1


def test_absolute_deadline_alone_is_the_handlers_deadline(sync_echo: tuple[Echo, int]) -> None:
    """sync: an absolute deadline without ``grpc-timeout`` bounds the handler (inherited)."""
    _, port = sync_echo
    seen = _call_sync(port, metadata=[(ABSOLUTE_METADATA, _us(time.time() + 30))])
    assert seen["source"] == "inherited"
    assert 0 < seen["remaining"] <= 30
    assert 0 < seen["received_ms"] <= 30_000


def test_earlier_absolute_deadline_wins(sync_echo: tuple[Echo, int]) -> None:
    """sync: within the clock skew, an absolute deadline earlier than grpc-timeout wins."""
    _, port = sync_echo
    seen = _call_sync(port, timeout=30, metadata=[(ABSOLUTE_METADATA, _us(time.time() + 29.5))])
    assert seen["remaining"] <= 29.5


def test_absolute_deadline_beyond_the_skew_is_ignored(sync_echo: tuple[Echo, int]) -> None:
    """sync: an absolute deadline 5 s from grpc-timeout's is a clock disagreement: ignored,
    counted, and the handler runs under grpc-timeout."""
    impl, port = sync_echo
    seen = _call_sync(port, timeout=30, metadata=[(ABSOLUTE_METADATA, _us(time.time() - 5))])
    assert impl.recorder.handler_ran is True
    assert 25 < seen["remaining"] <= 30
    assert counters.get("absolute-deadline-ignored", component="grpc-server") == 1


def test_unreadable_absolute_deadline_is_no_deadline(sync_echo: tuple[Echo, int]) -> None:
    """sync: a malformed absolute deadline means no deadline, never an error."""
    _, port = sync_echo
    seen = _call_sync(port, metadata=[(ABSOLUTE_METADATA, "soon")])
    assert seen["remaining"] is None


def test_sync_client_sends_the_absolute_deadline(sync_echo: tuple[Echo, int]) -> None:
    """sync: the client interceptor sends the call's end as ``x-request-deadline`` beside
    grpc-timeout; the server reads it."""
    impl, port = sync_echo
    before = time.time()
    with tb.fail_after(20):
        _call_sync(port, intercepted=True, timeout=30)
    after = time.time()
    [value] = impl.absolute
    assert before < int(value) / 1e6 <= after + 20 + 1e-6


def test_sync_client_without_deadline_sends_none(sync_echo: tuple[Echo, int]) -> None:
    """sync: a call with neither a deadline nor a timeout sends no absolute deadline."""
    impl, port = sync_echo
    seen = _call_sync(port, intercepted=True)
    assert impl.absolute == [] and seen["remaining"] is None


# grpc.aio -------------------------------------------------------------------------------------


async def _aio_server(impl: Echo) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=[aio_server_interceptor()])
    handlers = {"Echo": grpc.unary_unary_rpc_method_handler(impl.aio)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Svc", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


@pytest.mark.asyncio_real
async def test_aio_passed_absolute_deadline_is_refused() -> None:
    """aio: a call whose absolute deadline passed is refused; the handler never runs."""
    impl = Echo()
    server, port = await _aio_server(impl)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary(ECHO)(
                    b"", metadata=((ABSOLUTE_METADATA, _us(time.time() - 5)),)
                )
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == EXPIRED_DETAILS
    assert impl.recorder.handler_ran is False


@pytest.mark.asyncio_real
async def test_aio_client_sends_and_server_reads_the_absolute_deadline() -> None:
    """aio: the client interceptors send ``x-request-deadline``; the aio server bounds the
    handler by it."""
    impl = Echo()
    server, port = await _aio_server(impl)
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=aio_client_interceptors()
        ) as ch:
            before = time.time()
            with tb.fail_after(20):
                seen = decode(await ch.unary_unary(ECHO)(b"", timeout=30))
            after = time.time()
    finally:
        await server.stop(None)
    [value] = impl.absolute
    assert before < int(value) / 1e6 <= after + 20 + 1e-6
    assert seen["source"] == "inherited" and 0 < seen["remaining"] <= 20
