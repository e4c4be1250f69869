"""Where the budget went, across real sync grpc services A -> B -> C (D13.5): the sync client
interceptor folds a callee's trailing breakdown into the call's part like the aio one."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import timebound as tb
from timebound.policies import Policy
from timebound.propagation.grpc import (
    PropagatedDeadlineExceeded,
    client_interceptor,
    server_interceptor,
)

METHOD = "/test.Hop/Call"
KEY = "x-timebound-breakdown"


def _flaky_database() -> None:
    time.sleep(0.03)
    raise ConnectionError("database unreachable")


Stop = Callable[[], None]


def start_hop(next_port: int | None) -> tuple[Stop, int]:
    """A hop that works 50 ms and calls the next; the last retries a failing database until
    its deadline cannot fit another delay and attempt (D3.3), which answers DEADLINE_EXCEEDED
    before the deadline (D4.10)."""
    policy = Policy("database", retry=20, delay="200ms")
    channel = None if next_port is None else grpc.insecure_channel(f"127.0.0.1:{next_port}")
    nested = None if channel is None else grpc.intercept_channel(channel, client_interceptor())

    def call(request: bytes, context: Any) -> bytes:
        time.sleep(0.05)
        if nested is None:
            policy.execute_sync(_flaky_database)
        else:
            nested.unary_unary(METHOD)(request)
        return b"ok"

    return _serve(call, nested_channel=channel)


def _serve(fn: Any, *, nested_channel: grpc.Channel | None = None) -> tuple[Stop, int]:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        interceptors=[server_interceptor(expose_breakdown=True)],
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Hop", {"Call": grpc.unary_unary_rpc_method_handler(fn)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    def stop() -> None:
        server.stop(None).wait(10)
        if nested_channel is not None:
            nested_channel.close()

    return stop, port


@pytest.fixture
def chain() -> Iterator[int]:
    stops: list[Stop] = []
    try:
        port: int | None = None
        for _ in range(3):
            stop, port = start_hop(port)
            stops.append(stop)
        assert port is not None
        yield port
    finally:
        for stop in reversed(stops):
            stop()


def test_the_sync_caller_of_a_sees_a_b_and_c(chain: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{chain}") as raw:
        ch = grpc.intercept_channel(raw, client_interceptor())
        with pytest.raises(PropagatedDeadlineExceeded) as info:
            with tb.fail_after(1.5):
                ch.unary_unary(METHOD)(b"x")
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


def _answering(value: bytes | str) -> Any:
    """A callee (no timebound) that answers DEADLINE_EXCEEDED with a hostile breakdown."""

    def call(request: bytes, context: Any) -> bytes:
        context.set_trailing_metadata(((KEY, value),))
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline expired")
        raise AssertionError("unreachable")

    return call


@pytest.mark.parametrize(
    "value",
    ["{", "[]", '{"k":"bound","ms":-1}', '{"k":"bound","ms":1,"p":' + "[" * 500, "x" * 3000],
)
def test_a_malformed_trailer_is_ignored(value: str) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Hop", {"Call": grpc.unary_unary_rpc_method_handler(_answering(value))}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as raw:
            ch = grpc.intercept_channel(raw, client_interceptor())
            with pytest.raises(PropagatedDeadlineExceeded) as info:
                with tb.fail_after(5):
                    ch.unary_unary(METHOD)(b"x")
    finally:
        server.stop(None).wait(10)
    bd = info.value.breakdown
    assert bd is not None
    assert [p for _, p in bd.walk() if p.kind == "remote"] == []
    assert next(p.kind for p in bd.parts) == "call"
