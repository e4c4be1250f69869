"""gRPC admission interceptors (D9) against real grpcio servers, sync and aio."""

from __future__ import annotations

import asyncio
import threading
from concurrent import futures
from typing import Any

import grpc
import grpc.aio
import pytest

from timebound.admission import Admission, AdmissionConfig, FixedLimit
from timebound.propagation.grpc import (
    EXPIRED_DETAILS,
    OVERLOADED_DETAILS,
    admission_interceptor,
    aio_admission_interceptor,
    server_interceptor,
)
from timebound.telemetry import counters

METHOD = "/test.Svc/Work"


def make(limit: int, **config: Any) -> Admission:
    return Admission(FixedLimit(limit), AdmissionConfig(**config), component="grpc-server")


class Gate:
    """A sync handler that holds every call until ``release`` is set."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Semaphore(0)
        self.release = threading.Event()

    def work(self, request: bytes, context: Any) -> bytes:
        self.calls += 1
        self.started.release()
        self.release.wait(10)
        return b"ok"


def serve_sync(gate: Gate, adm: Admission) -> tuple[grpc.Server, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        interceptors=[admission_interceptor(adm), server_interceptor()],
    )
    handler = grpc.unary_unary_rpc_method_handler(gate.work)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Svc", {"Work": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def test_sync_hopeless_call_ends_deadline_exceeded_without_running() -> None:
    """A call whose deadline is below the method's estimate is refused before the handler."""
    gate = Gate()
    adm = make(2)
    adm.estimates.observe(METHOD, 5.0)
    server, port = serve_sync(gate, adm)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.RpcError) as info:
                ch.unary_unary(METHOD)(b"", timeout=2.0)
    finally:
        server.stop(None)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == EXPIRED_DETAILS and gate.calls == 0


def test_sync_overload_ends_unavailable_with_pushback() -> None:
    """A call meeting a full queue ends UNAVAILABLE with ``grpc-retry-pushback-ms``."""
    gate = Gate()
    adm = make(1, max_queue=1, interval=10.0, target=5.0)
    server, port = serve_sync(gate, adm)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(METHOD)
            running = call.future(b"", timeout=10)
            assert gate.started.acquire(timeout=5)
            queued = call.future(b"", timeout=10)
            waited = threading.Event()
            while adm.queued() < 1 and not waited.wait(0.01):
                pass
            with pytest.raises(grpc.RpcError) as info:
                call(b"", timeout=10)
            gate.release.set()
            answers = (running.result(), queued.result())
    finally:
        server.stop(None)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == OVERLOADED_DETAILS
    assert ("grpc-retry-pushback-ms", "1000") in tuple(info.value.trailing_metadata())
    assert answers == (b"ok", b"ok") and gate.calls == 2
    assert counters.get("admission-shed", component="grpc-server", reason="queue-full") == 1


@pytest.mark.asyncio_real
async def test_aio_overload_and_admission() -> None:
    """Under grpc.aio a call past limit + queue ends UNAVAILABLE; the others are served."""
    release = asyncio.Event()
    calls = 0

    async def work(request: bytes, context: Any) -> bytes:
        nonlocal calls
        calls += 1
        await release.wait()
        return b"ok"

    adm = make(1, max_queue=1, interval=10.0, target=5.0)
    server = grpc.aio.server(interceptors=[aio_admission_interceptor(adm)])
    handler = grpc.unary_unary_rpc_method_handler(work)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Svc", {"Work": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(METHOD)
            first = asyncio.ensure_future(call(b"", timeout=10))
            second = asyncio.ensure_future(call(b"", timeout=10))
            for _ in range(500):
                if adm.queued() == 1:
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(b"", timeout=10)
            release.set()
            answers = (await first, await second)
    finally:
        await server.stop(None)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert answers == (b"ok", b"ok") and calls == 2
