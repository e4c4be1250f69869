"""Real grpcio servers on 127.0.0.1:0 with generic bytes handlers (no generated code)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

import timebound as tb
from timebound._core._scopes import current_bound_source
from timebound.propagation import current_request
from timebound.telemetry import counters


@pytest.fixture(autouse=True)
def _clean_counters() -> Iterator[None]:
    counters.reset()
    yield
    counters.reset()


def observe(context: Any) -> dict[str, Any]:
    """What a handler sees of the deadline, as JSON-able data."""
    state = current_request()
    left = tb.remaining()
    return {
        "received_ms": None if state is None else state.deadline_received_ms,
        "has_state": state is not None,
        "remaining": None if left == math.inf else left,
        "source": current_bound_source(),
    }


#: grpcio may hand the server a ``time_remaining()`` a few ms *above* the client's timeout (its
#: deadline crosses clocks and cached "now" readings; 2008 ms was seen for a 2 s streaming
#: call). Asserts on received deadlines allow this much transport slack — far below the gap
#: between a propagated deadline and a static timeout that the tests tell apart.
GRPC_SLACK_MS = 50


def within(received_ms: int | None, timeout_s: float) -> bool:
    """The deadline a server received came from a client timeout of ``timeout_s``."""
    return received_ms is not None and 0 < received_ms <= timeout_s * 1000 + GRPC_SLACK_MS


def settled(read: Callable[[], int], expected: int) -> int:
    """``read()`` once it equals ``expected``, or its last value after 5 s.

    A sync server counts a call in the handler's thread, which may finish after the client has
    already seen the call end (its own deadline answers it); asserting at once would race it.
    """
    for _ in range(1000):
        value = read()
        if value == expected:
            return value
        time.sleep(0.005)
    return read()


def encode(data: Any) -> bytes:
    return json.dumps(data).encode()


def decode(raw: bytes) -> Any:
    return json.loads(raw)


def wait_until_spent(context: Any) -> None:
    """Block (really) until the call's gRPC deadline has passed on the server.

    Test-only: it lets a request reach the interceptor *after* its deadline, the case a busy
    server meets when a call waited in its queue. It blocks on purpose (also on an aio loop, so
    grpc.aio cannot deliver its own cancellation before our interceptor looks).
    """
    for _ in range(2000):
        if context.time_remaining() <= 0:
            return
        time.sleep(0.002)
    raise AssertionError("the call's deadline never passed")


class Recorder:
    """A server-side record of what happened to a call (test-only)."""

    def __init__(self) -> None:
        self.handler_ran = False
        self.code: Any = None
        self.details: Any = None
        self.seen: list[dict[str, Any]] = []


class DelayUntilSpent(grpc.ServerInterceptor):
    """Outermost test interceptor: hold each call until its deadline passed, record its status."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        inner = handler.unary_unary

        def behavior(request: bytes, context: Any) -> Any:
            wait_until_spent(context)
            try:
                return inner(request, context)
            finally:
                self.recorder.code = context.code()
                self.recorder.details = context.details()

        return grpc.unary_unary_rpc_method_handler(behavior)


def start_sync_server(
    handlers: dict[str, Any],
    *,
    interceptors: list[Any],
    service: str = "test.Svc",
    workers: int = 4,
) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), interceptors=interceptors)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port
