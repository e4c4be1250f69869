"""Where the budget went, across real grpc.aio services A -> B -> C (D13.5)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound import Breakdown
from timebound.policies import Policy
from timebound.propagation.grpc import (
    AioPropagatedDeadlineExceeded,
    aio_client_interceptors,
    aio_server_interceptor,
)

pytestmark = pytest.mark.asyncio_real

METHOD = "/test.Hop/Call"
KEY = "x-timebound-breakdown"


async def _flaky_database() -> None:
    await asyncio.sleep(0.03)
    raise ConnectionError("database unreachable")


async def start_hop(next_port: int | None, *, expose: bool = True) -> tuple[grpc.aio.Server, int]:
    """A hop that works 50 ms and calls the next; the last retries a failing database until
    its deadline cannot fit another delay and attempt (D3.3), which answers DEADLINE_EXCEEDED
    before the deadline (D4.10)."""
    policy = Policy("database", retry=20, delay="200ms")
    nested = (
        None
        if next_port is None
        else grpc.aio.insecure_channel(
            f"127.0.0.1:{next_port}", interceptors=aio_client_interceptors()
        )
    )

    async def call(request: bytes, context: Any) -> bytes:
        await asyncio.sleep(0.05)
        if nested is None:
            await policy.execute(_flaky_database)
        else:
            await nested.unary_unary(METHOD)(request)
        return b"ok"

    server = grpc.aio.server(interceptors=[aio_server_interceptor(expose_breakdown=expose)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Hop", {"Call": _handler(call)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


def _handler(fn: Any) -> Any:
    return grpc.unary_unary_rpc_method_handler(fn)


async def test_the_caller_of_a_sees_a_b_and_c() -> None:
    c, c_port = await start_hop(None)
    b, b_port = await start_hop(c_port)
    a, a_port = await start_hop(b_port)
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{a_port}", interceptors=aio_client_interceptors()
        ) as ch:
            with pytest.raises(AioPropagatedDeadlineExceeded) as info:
                with tb.fail_after(1.5):
                    await ch.unary_unary(METHOD)(b"x")
    finally:
        for s in (a, b, c):
            await s.stop(None)
    bd = info.value.breakdown
    assert bd is not None
    for _, p in bd.walk():
        if p.parts:
            assert sum(x.elapsed_ms for x in p.parts) == pytest.approx(p.elapsed_ms, abs=0.01)
    remotes = [p for _, p in bd.walk() if p.kind == "remote"]
    assert len(remotes) == 3, bd.render()
    in_c = [p for _, p in remotes[2].walk()]
    assert "attempt" in {p.kind for p in in_c}, bd.render()
    calls = [p for _, p in bd.walk() if p.kind == "call"]
    assert [p.outcome for p in calls] == ["DEADLINE_EXCEEDED"] * 3
    assert calls[0].name == "gRPC test.Hop/Call"
    assert "went to:" in str(info.value)


async def test_off_unless_enabled_and_asked_on_success() -> None:
    quiet, q_port = await start_hop(None, expose=False)

    async def ok(request: bytes, context: Any) -> bytes:
        return b"ok"

    server = grpc.aio.server(interceptors=[aio_server_interceptor(expose_breakdown=True)])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Hop", {"Call": _handler(ok)}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{q_port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await ch.unary_unary(METHOD)(b"x", timeout=0.3, metadata=((KEY, "1"),))
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert KEY not in dict(info.value.trailing_metadata() or ())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.unary_unary(METHOD)(b"x", timeout=1)
            await call
            assert KEY not in dict(await call.trailing_metadata() or ())
            call = ch.unary_unary(METHOD)(b"x", timeout=1, metadata=((KEY, "1"),))
            await call
            tree = Breakdown.from_json(dict(await call.trailing_metadata())[KEY])
            assert tree.outcome == "ok"
    finally:
        await quiet.stop(None)
        await server.stop(None)
