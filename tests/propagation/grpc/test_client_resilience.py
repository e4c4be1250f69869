"""A policy in the gRPC client interceptors (D3.17, D3.18), against real grpcio servers.

The aio server's handlers record each call; ``Flaky`` fails with its configured codes and
pushback before answering, ``FirstHangs`` keeps its first call until the client cancels it
(recorded), ``Spent`` answers DEADLINE_EXCEEDED; the sync server's ``FirstWaits`` keeps its
first call until the test lets it answer. Assertions are on events, counts and ordering.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import grpc
import grpc.aio
import pytest

import timebound as tb
from timebound import ConfigurationError
from timebound.policies import CircuitBreaker, Hedge, Policy, RetryBudget
from timebound.propagation.grpc import (
    AioPropagatedDeadlineExceeded,
    aio_client_interceptors,
    aio_server_interceptor,
    client_interceptor,
)
from timebound.telemetry import Event, add_listener

from .conftest import start_sync_server

FLAKY = "/test.Svc/Flaky"
HANGS = "/test.Svc/FirstHangs"
SPENT = "/test.Svc/Spent"


class Service:
    def __init__(self, failures: list[tuple[grpc.StatusCode, str | None]] | None = None) -> None:
        self.failures = list(failures or [])
        self.calls: dict[str, int] = {}
        self.cancelled = threading.Event()
        self.lock = threading.Lock()

    def _count(self, name: str) -> int:
        with self.lock:
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            return n

    async def flaky(self, request: bytes, context: Any) -> bytes:
        n = self._count("Flaky")
        if n < len(self.failures):
            code, pushback = self.failures[n]
            if pushback is not None:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", pushback),))
            await context.abort(code, f"failure {n + 1}")
        return f"answer {n + 1}".encode()

    async def first_hangs(self, request: bytes, context: Any) -> bytes:
        if self._count("FirstHangs") == 0:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        return b"hedge"

    async def spent(self, request: bytes, context: Any) -> bytes:
        self._count("Spent")
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "peer says: deadline spent")
        return b""

    def sync_flaky(self, request: bytes, context: Any) -> bytes:
        n = self._count("Flaky")
        if n < len(self.failures):
            code, pushback = self.failures[n]
            if pushback is not None:
                context.set_trailing_metadata((("grpc-retry-pushback-ms", pushback),))
            context.abort(code, f"failure {n + 1}")
        return f"answer {n + 1}".encode()

    def handlers(self) -> dict[str, Any]:
        return {
            "Flaky": grpc.unary_unary_rpc_method_handler(self.flaky),
            "FirstHangs": grpc.unary_unary_rpc_method_handler(self.first_hangs),
            "Spent": grpc.unary_unary_rpc_method_handler(self.spent),
        }


class Events:
    def __init__(self) -> None:
        self.seen: list[Event] = []

    def names(self, prefix: str) -> list[str]:
        return [e.name for e in self.seen if e.name.startswith(prefix)]

    def reasons(self) -> list[str]:
        return [e.attrs["reason"] for e in self.seen if e.name == "retry.refused"]


@pytest.fixture
def events() -> Any:
    ev = Events()
    remove = add_listener(ev.seen.append)
    yield ev
    remove()


async def serve(svc: Service) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=[aio_server_interceptor()])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Svc", svc.handlers()),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


class Running:
    def __init__(self, svc: Service) -> None:
        self.svc = svc

    async def __aenter__(self) -> int:
        self.server, port = await serve(self.svc)
        return port

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(None)


async def call(port: int, method: str, **kw: Any) -> bytes:
    async with grpc.aio.insecure_channel(
        f"127.0.0.1:{port}", interceptors=aio_client_interceptors(**kw)
    ) as channel:
        answer: bytes = await channel.unary_unary(method)(b"")
        return answer


pytestmark = pytest.mark.asyncio_real


async def test_unavailable_is_retried_and_the_pushback_waited_for(events: Events) -> None:
    svc = Service([(grpc.StatusCode.UNAVAILABLE, "0"), (grpc.StatusCode.RESOURCE_EXHAUSTED, None)])
    async with Running(svc) as port:
        with tb.fail_after(30):
            answer = await call(port, FLAKY, policy=Policy("inventory", retry=2))
    assert answer == b"answer 3"
    assert events.names("attempt.start") == ["attempt.start"] * 3


async def test_the_last_failure_is_raised_as_grpc_raises_it(events: Events) -> None:
    svc = Service([(grpc.StatusCode.UNAVAILABLE, None)] * 5)
    async with Running(svc) as port:
        with pytest.raises(grpc.aio.AioRpcError) as info, tb.fail_after(30):
            await call(port, FLAKY, policy=Policy("inventory", retry=1))
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert info.value.details() == "failure 2"
    assert svc.calls["Flaky"] == 2


async def test_a_code_outside_the_set_is_not_retried_nor_counted(events: Events) -> None:
    svc = Service([(grpc.StatusCode.INVALID_ARGUMENT, None)])
    breaker = CircuitBreaker(min_calls=1)
    async with Running(svc) as port:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(port, FLAKY, policy=Policy("inventory", retry=3, breaker=breaker))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert svc.calls["Flaky"] == 1 and breaker.state == "closed"
        # Made a failure by the caller: retried.
        svc.failures = [(grpc.StatusCode.INVALID_ARGUMENT, None)]
        svc.calls.clear()
        answer = await call(
            port,
            FLAKY,
            policy=Policy("inventory", retry=1),
            retry_codes={grpc.StatusCode.INVALID_ARGUMENT},
        )
    assert answer == b"answer 2"


async def test_a_pushback_past_the_deadline_stops_with_the_existing_reason(events: Events) -> None:
    svc = Service([(grpc.StatusCode.UNAVAILABLE, "30000")])
    async with Running(svc) as port:
        with pytest.raises(grpc.aio.AioRpcError), tb.fail_after(5):
            await call(port, FLAKY, policy=Policy("inventory", retry=3, delay="10ms"))
    assert svc.calls["Flaky"] == 1
    assert events.reasons() == ["retry_after_past_deadline"]


async def test_a_spent_deadline_from_the_peer_is_not_retried_nor_counted(events: Events) -> None:
    svc = Service()
    breaker = CircuitBreaker(min_calls=1, break_for="60s")
    async with Running(svc) as port:
        with pytest.raises(AioPropagatedDeadlineExceeded) as info, tb.fail_after(30):
            await call(
                port,
                SPENT,
                policy=Policy("inventory", retry=3, breaker=breaker),
                retry_codes={grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED},
            )
    assert info.value.source == "propagated"
    assert svc.calls["Spent"] == 1
    assert breaker.state == "closed"


async def test_the_breaker_opens_and_fails_fast_without_touching_the_server(
    events: Events,
) -> None:
    svc = Service([(grpc.StatusCode.UNAVAILABLE, None)] * 5)
    breaker = CircuitBreaker(min_calls=2, break_for="60s")
    policy = Policy("inventory", breaker=breaker)
    async with Running(svc) as port:
        for _ in range(2):
            with pytest.raises(grpc.aio.AioRpcError):
                await call(port, FLAKY, policy=policy)
        assert breaker.state == "open"
        with pytest.raises(tb.CircuitOpen):
            await call(port, FLAKY, policy=policy)
    assert svc.calls["Flaky"] == 2


async def test_the_budget_caps_retries(events: Events) -> None:
    svc = Service([(grpc.StatusCode.UNAVAILABLE, None)] * 100)
    policy = Policy("inventory", retry=3, retry_budget=RetryBudget(0.2, min_per_second=0))
    async with Running(svc) as port:
        for _ in range(10):
            with pytest.raises(grpc.aio.AioRpcError):
                await call(port, FLAKY, policy=policy)
    retries = events.names("retry.delay")
    assert svc.calls["Flaky"] == 10 + len(retries) and 1 <= len(retries) <= 2
    assert events.reasons() == ["retry_budget_exhausted"] * 10


async def test_a_marked_method_is_hedged_and_the_loser_cancelled(events: Events) -> None:
    svc = Service()
    policy = Policy("inventory", hedge=Hedge("20ms", max_extra_load=1.0))
    async with Running(svc) as port:
        with tb.fail_after(30):
            answer = await call(port, HANGS, policy=policy, hedge_methods=["test.Svc/FirstHangs"])
        assert answer == b"hedge"
        assert events.names("hedge.") == ["hedge.sent", "hedge.won"]
        # The loser's RPC was cancelled: its handler saw it (hang guard only).
        assert await asyncio.to_thread(svc.cancelled.wait, 10)


async def test_an_unmarked_method_is_never_hedged(events: Events) -> None:
    svc = Service()
    policy = Policy("inventory", hedge=Hedge("1ms", max_extra_load=1.0))
    async with Running(svc) as port:
        svc.calls["FirstHangs"] = 1  # every call answers at once
        with tb.fail_after(30):
            await call(port, HANGS, policy=policy, hedge_methods=["/test.Svc/Other"])
    assert events.names("hedge.") == []
    assert svc.calls["FirstHangs"] == 2


def test_the_sync_channel_retries_and_returns_the_last_outcome(events: Events) -> None:
    svc = Service([(grpc.StatusCode.UNAVAILABLE, "0")] * 3)
    server, port = start_sync_server(
        {"Flaky": grpc.unary_unary_rpc_method_handler(svc.sync_flaky)}, interceptors=[]
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as raw:
            channel = grpc.intercept_channel(
                raw, client_interceptor(policy=Policy("inventory", retry=1))
            )
            with pytest.raises(grpc.RpcError) as info, tb.fail_after(30):
                channel.unary_unary(FLAKY)(b"")
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
            assert svc.calls["Flaky"] == 2
            with tb.fail_after(30):
                assert channel.unary_unary(FLAKY)(b"") == b"answer 4"
    finally:
        server.stop(None)


class FirstWaits:
    """A sync handler that keeps its first call until ``go`` is set and records whether that
    call was still live when it answered; every other call answers at once."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.first_done = threading.Event()
        self.first_live: list[bool] = []
        self.calls = 0
        self.lock = threading.Lock()

    def handle(self, request: bytes, context: Any) -> bytes:
        with self.lock:
            n = self.calls
            self.calls += 1
        if n:
            return b"hedge"
        self.go.wait(30)
        self.first_live.append(bool(context.is_active()))
        self.first_done.set()
        return b"first"


WAITS = "/test.Svc/Waits"


def _race_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("timebound hedge race")]


def test_a_sync_hedge_wins_and_the_losing_call_runs_on_to_its_answer(events: Events) -> None:
    """The sync interceptor hedges the methods marked idempotent: the caller returns the
    hedge's answer while the first call is unanswered. The losing call is a blocking grpc call
    that cannot be cancelled: it stays live until its server answers (or the deadline it was
    sent with), and its answer is dropped."""
    svc = FirstWaits()
    server, port = start_sync_server(
        {"Waits": grpc.unary_unary_rpc_method_handler(svc.handle)}, interceptors=[]
    )
    policy = Policy("inventory", hedge=Hedge("50ms", max_extra_load=1.0))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as raw:
            channel = grpc.intercept_channel(
                raw, client_interceptor(policy=policy, hedge_methods=[WAITS])
            )
            with tb.fail_after(30):
                assert channel.unary_unary(WAITS)(b"") == b"hedge"
            assert not svc.go.is_set()  # answered with the first call unanswered
            hedging = events.names("hedge.")
            assert hedging[0] == "hedge.sent"  # won by whichever call the server saw second
            svc.go.set()
            assert svc.first_done.wait(10)  # hang guard only
            assert svc.first_live == [True]  # pinned: the loser was not cancelled
            for thread in _race_threads():
                thread.join(10)
            assert not _race_threads()
            # An unmarked method is never hedged.
            svc.calls, svc.first_done = 0, threading.Event()
            with tb.fail_after(30):
                unmarked = grpc.intercept_channel(
                    raw, client_interceptor(policy=policy, hedge_methods=["/test.Svc/Other"])
                )
                assert unmarked.unary_unary(WAITS)(b"") == b"first"
            assert svc.calls == 1
            assert events.names("hedge.") == hedging
    finally:
        svc.go.set()
        server.stop(None)


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"retry_codes": {grpc.StatusCode.OK}}, "retry_codes"),
        ({"retry_codes": {14}}, "retry_codes"),
        ({"hedge_methods": ["Flaky"]}, "hedge_methods"),
        ({"policy": Policy("p", fallback=b"")}, "policy"),
    ],
)
def test_bad_options_are_refused_naming_them(kwargs: Any, option: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        aio_client_interceptors(**kwargs)
    assert info.value.option == option
