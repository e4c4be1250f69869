"""Server retry hints (D3.11) read from real clients' errors against real loopback servers."""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Any

import grpc
import httpx
import pytest
import requests

import timebound as tb
from timebound.admission import Admission, AdmissionConfig, FixedLimit
from timebound.lowlevel import RetryAt, RetryPlan
from timebound.policies import Policy
from timebound.propagation.grpc import admission_interceptor

from .http.conftest import ServerThread

METHOD = "/test.Svc/Work"


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: Any) -> None:
        self.events.append((event.name, dict(event.attrs)))

    def of(self, name: str) -> list[dict[str, Any]]:
        return [attrs for n, attrs in self.events if n == name]


async def _shedding(scope: Any, receive: Any, send: Any) -> None:
    """Answers every request 503 with Retry-After: 30, as a shedding host does."""
    await send({"type": "http.response.start", "status": 503, "headers": [(b"retry-after", b"30")]})
    await send({"type": "http.response.body", "body": b"overloaded", "more_body": False})


@pytest.fixture(scope="module")
def shedding_url() -> Any:
    with ServerThread(_shedding) as srv:
        yield srv.url


def test_httpx_retry_after_past_the_deadline_is_not_retried(shedding_url: str) -> None:
    """httpx: the 503's Retry-After of 30 s under a 5 s deadline ends the call after one try."""
    policy = Policy("Inventory", retry=3, delay="10ms")
    recorder = _Recorder()

    def get() -> None:
        with httpx.Client(base_url=shedding_url, timeout=5) as client:
            client.get("/").raise_for_status()

    with pytest.raises(httpx.HTTPStatusError), tb.fail_after(5):
        policy.execute_sync(get, observer=recorder)
    assert len(recorder.of("attempt.start")) == 1
    assert [a["reason"] for a in recorder.of("retry.refused")] == ["retry_after_past_deadline"]


@pytest.mark.asyncio_real
async def test_httpx_async_error_schedules_the_retry_at_the_hint(shedding_url: str) -> None:
    """httpx async: with time left the next attempt is due at the server's 30 s, not 10 ms."""
    async with httpx.AsyncClient(base_url=shedding_url, timeout=5) as client:
        with pytest.raises(httpx.HTTPStatusError) as info:
            (await client.get("/")).raise_for_status()
    plan = RetryPlan("Inventory", retry=1, delay=0.01, max_delay=60.0)
    _, decision = plan.failed(plan.start(), info.value)
    assert isinstance(decision, RetryAt) and decision.delay == 30.0


def test_requests_retry_after_is_read(shedding_url: str) -> None:
    """requests: HTTPError carries the response; its hint is read the same way."""
    policy = Policy("Inventory", retry=3)
    recorder = _Recorder()

    def get() -> None:
        requests.get(shedding_url, timeout=5).raise_for_status()

    with pytest.raises(requests.HTTPError), tb.fail_after(5):
        policy.execute_sync(get, observer=recorder)
    assert [a["reason"] for a in recorder.of("retry.refused")] == ["retry_after_past_deadline"]


def test_grpc_pushback_from_admission_is_read() -> None:
    """gRPC admission sheds with grpc-retry-pushback-ms 1000; under 500 ms left: no retry."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def work(request: bytes, context: Any) -> bytes:
        started.release()
        release.wait(10)
        return b"ok"

    adm = Admission(
        FixedLimit(1),
        AdmissionConfig(max_queue=1, interval=10.0, target=5.0),
        component="grpc-server",
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4), interceptors=[admission_interceptor(adm)]
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "test.Svc", {"Work": grpc.unary_unary_rpc_method_handler(work)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    recorder = _Recorder()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(METHOD)
            running = call.future(b"", timeout=10)
            assert started.acquire(timeout=5)
            queued = call.future(b"", timeout=10)
            waited = threading.Event()
            while adm.queued() < 1 and not waited.wait(0.01):
                pass
            policy = Policy("Work", retry=3)
            with pytest.raises(grpc.RpcError) as info, tb.fail_after(0.5):
                policy.execute_sync(call, (b"",), {"timeout": 5}, observer=recorder)
            release.set()
            assert (running.result(), queued.result()) == (b"ok", b"ok")
    finally:
        release.set()
        server.stop(None)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert len(recorder.of("attempt.start")) == 1
    assert [a["reason"] for a in recorder.of("retry.refused")] == ["retry_after_past_deadline"]
