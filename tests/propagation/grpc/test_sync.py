"""Sync grpcio: the server and client interceptors over real servers on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

import timebound as tb
from timebound.propagation import RequestState, _state
from timebound.propagation.grpc import (
    EXPIRED_DETAILS,
    PropagatedDeadlineExceeded,
    client_interceptor,
    server_interceptor,
)
from timebound.telemetry import counters

from .conftest import (
    DelayUntilSpent,
    Recorder,
    decode,
    encode,
    observe,
    settled,
    start_sync_server,
    within,
)

LEAF = "/test.Leaf/Echo"
MID = "/test.Mid/Call"
SRV_PROPAGATED = "grpc.server.by-destination.deadline-propagated"
SRV_CANCELLED = "grpc.server.by-destination.cancelled-by-deadline-propagation"
CLI_PROPAGATED = "grpc.client.by-destination.deadline-propagated"
CLI_CANCELLED = "grpc.client.by-destination.cancelled-by-deadline-propagation"


class Leaf:
    """The second server: echoes what it sees, or gives up, or blocks until released."""

    def __init__(self, mode: str = "echo") -> None:
        self.mode = mode
        self.recorder = Recorder()
        self.release = threading.Event()

    def echo(self, request: bytes, context: Any) -> bytes:
        self.recorder.handler_ran = True
        if self.mode == "abort":
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "leaf gave up")
        if self.mode == "block":
            self.release.wait(10)
        return encode(observe(context))


@pytest.fixture
def leaf() -> Iterator[tuple[Leaf, int]]:
    impl = Leaf()
    server, port = start_sync_server(
        {"Echo": grpc.unary_unary_rpc_method_handler(impl.echo)},
        interceptors=[server_interceptor()],
        service="test.Leaf",
    )
    yield impl, port
    impl.release.set()
    server.stop(None)


def leaf_channel(port: int) -> grpc.Channel:
    return grpc.intercept_channel(grpc.insecure_channel(f"127.0.0.1:{port}"), client_interceptor())


@pytest.fixture
def mid(leaf: tuple[Leaf, int]) -> Iterator[tuple[Leaf, grpc.Channel]]:
    """The first server: calls the leaf (through the client interceptor) from its handler.

    The request says the nested call's static timeout and whether to swallow its error.
    """
    impl, leaf_port = leaf
    channel = leaf_channel(leaf_port)
    call_leaf = channel.unary_unary(LEAF)

    def call(request: bytes, context: Any) -> bytes:
        opts = decode(request)
        seen = observe(context)
        try:
            leaf_seen = decode(call_leaf(b"", timeout=opts.get("timeout")))
        except PropagatedDeadlineExceeded:
            if not opts.get("swallow"):
                raise
            leaf_seen = None  # the handler swallows it; the interceptor still answers expiry
        return encode({"mid": seen, "leaf": leaf_seen})

    server, port = start_sync_server(
        {"Call": grpc.unary_unary_rpc_method_handler(call)},
        interceptors=[server_interceptor()],
        service="test.Mid",
    )
    client = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield impl, client
    client.close()
    server.stop(None)
    channel.close()


@pytest.fixture
def request_state() -> Iterator[RequestState]:
    """A request being handled, as a server adapter would set it."""
    state = RequestState()
    token = _state._request.set(state)
    yield state
    _state._request.reset(token)


def test_deadline_reaches_the_nested_server(mid: tuple[Leaf, grpc.Channel]) -> None:
    """A client's 2 s deadline becomes the first handler's and bounds its nested call."""
    _, client = mid
    resp = decode(client.unary_unary(MID)(encode({"timeout": 30.0}), timeout=2.0))
    assert within(resp["mid"]["received_ms"], 2)
    assert resp["mid"]["source"] == "inherited"
    assert within(resp["leaf"]["received_ms"], 2)
    assert counters.get(CLI_PROPAGATED, grpc_destination="test.Leaf/Echo") == 1
    assert counters.get(SRV_PROPAGATED, grpc_destination="test.Mid/Call") == 1
    assert counters.get(SRV_PROPAGATED, grpc_destination="test.Leaf/Echo") == 1


def test_nested_call_without_static_timeout_gets_the_deadline(
    mid: tuple[Leaf, grpc.Channel],
) -> None:
    """A nested call with no timeout of its own still carries the request's deadline."""
    _, client = mid
    resp = decode(client.unary_unary(MID)(encode({"timeout": None}), timeout=2.0))
    assert within(resp["leaf"]["received_ms"], 2)


def test_client_without_deadline_gives_no_deadline(mid: tuple[Leaf, grpc.Channel]) -> None:
    """No client deadline: grpc reports a huge time_remaining, which means none (D4.6)."""
    _, client = mid
    resp = decode(client.unary_unary(MID)(encode({"timeout": None})))
    assert resp["mid"] == {
        "received_ms": None,
        "has_state": True,
        "remaining": None,
        "source": None,
    }
    assert resp["leaf"]["received_ms"] is None
    assert counters.total(CLI_PROPAGATED) == 0
    assert counters.total(SRV_PROPAGATED) == 0


def test_deadline_of_a_year_or_more_is_no_deadline(leaf: tuple[Leaf, int]) -> None:
    """A 400-day client timeout is treated as no deadline, as grpc#26236 requires (D4.6)."""
    _, port = leaf
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        seen = decode(channel.unary_unary(LEAF)(b"", timeout=400 * 86400.0))
    assert seen["received_ms"] is None
    assert seen["remaining"] is None


def test_expired_call_is_rejected_without_running_the_handler() -> None:
    """A call whose deadline passed before the handler starts gets the exact userver status."""
    recorder = Recorder()
    finished = threading.Event()

    def handler(request: bytes, context: Any) -> bytes:
        recorder.handler_ran = True
        return b"late"

    class Finish(DelayUntilSpent):
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            inner = super().intercept_service(continuation, details).unary_unary

            def behavior(request: bytes, context: Any) -> Any:
                try:
                    return inner(request, context)
                finally:
                    finished.set()

            return grpc.unary_unary_rpc_method_handler(behavior)

    server, port = start_sync_server(
        {"Echo": grpc.unary_unary_rpc_method_handler(handler)},
        interceptors=[Finish(recorder), server_interceptor()],
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            # Connected first, and a budget a loaded machine still delivers within.
            grpc.channel_ready_future(channel).result(timeout=10)
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary("/test.Svc/Echo")(b"", timeout=0.5)
        assert finished.wait(5)
    finally:
        server.stop(None)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert recorder.handler_ran is False
    assert recorder.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert recorder.details == EXPIRED_DETAILS.encode()
    assert settled(lambda: counters.get(SRV_CANCELLED, grpc_destination="test.Svc/Echo"), 1) == 1


def test_nested_expiry_answers_deadline_exceeded(mid: tuple[Leaf, grpc.Channel]) -> None:
    """A nested call cut short by our deadline makes the first server answer expiry."""
    impl, client = mid
    impl.mode = "abort"
    with pytest.raises(grpc.RpcError) as info:
        client.unary_unary(MID)(encode({"timeout": 30.0}), timeout=5.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == EXPIRED_DETAILS
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1
    assert settled(lambda: counters.get(SRV_CANCELLED, grpc_destination="test.Mid/Call"), 1) == 1


def test_swallowed_nested_expiry_still_answers_deadline_exceeded(
    mid: tuple[Leaf, grpc.Channel],
) -> None:
    """A handler that swallows the propagated error still answers expiry (D4.5)."""
    impl, client = mid
    impl.mode = "abort"
    with pytest.raises(grpc.RpcError) as info:
        client.unary_unary(MID)(encode({"timeout": 30.0, "swallow": True}), timeout=5.0)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert info.value.details() == EXPIRED_DETAILS


def test_client_fails_locally_when_deadline_is_spent(
    leaf: tuple[Leaf, int], request_state: RequestState
) -> None:
    """With no time left the call raises the binding bound's error and sends nothing."""
    impl, port = leaf
    channel = leaf_channel(port)
    with tb.inherit_deadline(tb.Deadline.after(0)):
        with pytest.raises(tb.DeadlineExceeded) as info:
            channel.unary_unary(LEAF)(b"", timeout=30.0)
    channel.close()
    assert info.value.source == "inherited"
    assert not isinstance(info.value, grpc.RpcError)
    assert impl.recorder.handler_ran is False
    assert request_state.cancelled_by_deadline is True
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1


def test_lowered_timeout_expiry_raises_propagated(
    leaf: tuple[Leaf, int], request_state: RequestState
) -> None:
    """DEADLINE_EXCEEDED after our deadline lowered the timeout is a propagated expiry."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    with tb.inherit_deadline(tb.Deadline.after(0.2), set_by="the test's caller"):
        with pytest.raises(PropagatedDeadlineExceeded) as info:
            channel.unary_unary(LEAF)(b"", timeout=30.0)
    channel.close()
    err = info.value
    assert err.source == "propagated"
    # Where the bound that lowered the call was set, and its instant, as over HTTP.
    assert err.set_by == "the test's caller" and err.deadline is not None
    assert isinstance(err, grpc.RpcError) and isinstance(err, TimeoutError)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert isinstance(err.__cause__, grpc.RpcError)
    assert request_state.cancelled_by_deadline is True
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1


def test_static_timeout_expiry_stays_a_plain_rpc_error(
    leaf: tuple[Leaf, int], request_state: RequestState
) -> None:
    """When the call's own timeout was the tighter one, grpc's error is left as it is."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    with tb.inherit_deadline(tb.Deadline.after(30)):
        with pytest.raises(grpc.RpcError) as info:
            channel.unary_unary(LEAF)(b"", timeout=0.1)
    channel.close()
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert request_state.cancelled_by_deadline is False
    assert counters.total(CLI_CANCELLED) == 0


def test_future_call_raises_propagated(leaf: tuple[Leaf, int], request_state: RequestState) -> None:
    """``.future()`` calls convert a propagated expiry in ``result()`` too."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    with tb.inherit_deadline(tb.Deadline.after(0.2)):
        fut = channel.unary_unary(LEAF).future(b"", timeout=30.0)
    with pytest.raises(PropagatedDeadlineExceeded):
        fut.result()
    assert isinstance(fut.exception(), PropagatedDeadlineExceeded)
    channel.close()
    assert request_state.cancelled_by_deadline is True


def test_response_stream_sees_the_deadline_at_every_item() -> None:
    """A server-streaming handler runs every step under the inherited deadline."""

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        for _ in range(3):
            yield encode(observe(context))

    server, port = start_sync_server(
        {"Stream": grpc.unary_stream_rpc_method_handler(stream)},
        interceptors=[server_interceptor()],
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            items = [decode(m) for m in channel.unary_stream("/test.Svc/Stream")(b"", timeout=2)]
    finally:
        server.stop(None)
    assert len(items) == 3
    assert all(within(item["received_ms"], 2) for item in items)
    assert all(item["source"] == "inherited" for item in items)


def test_request_stream_handler_sees_the_deadline() -> None:
    """A client-streaming handler runs under the inherited deadline."""

    def collect(requests: Iterator[bytes], context: Any) -> bytes:
        return encode({"count": len(list(requests)), **observe(context)})

    server, port = start_sync_server(
        {"Collect": grpc.stream_unary_rpc_method_handler(collect)},
        interceptors=[server_interceptor()],
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            resp = decode(channel.stream_unary("/test.Svc/Collect")(iter([b"a", b"b"]), timeout=2))
    finally:
        server.stop(None)
    assert resp["count"] == 2
    assert within(resp["received_ms"], 2)


def test_bidi_stream_handler_sees_the_deadline() -> None:
    """A bidirectional-streaming handler runs every step under the inherited deadline."""

    def bidi(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        for _ in requests:
            yield encode(observe(context))

    server, port = start_sync_server(
        {"Bidi": grpc.stream_stream_rpc_method_handler(bidi)},
        interceptors=[server_interceptor()],
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_stream("/test.Svc/Bidi")
            items = [decode(m) for m in call(iter([b"a", b"b"]), timeout=2)]
    finally:
        server.stop(None)
    assert len(items) == 2 and all(within(item["received_ms"], 2) for item in items)


def test_pooled_thread_keeps_no_deadline_between_calls() -> None:
    """The one worker thread that served a call with a deadline serves the next without one."""

    def unary(request: bytes, context: Any) -> bytes:
        return encode(observe(context))

    def stream(request: bytes, context: Any) -> Iterator[bytes]:
        yield encode(observe(context))

    server, port = start_sync_server(
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
        },
        interceptors=[server_interceptor()],
        workers=1,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            list(channel.unary_stream("/test.Svc/Stream")(b"", timeout=2))
            channel.unary_unary("/test.Svc/Unary")(b"", timeout=2)
            after = decode(channel.unary_unary("/test.Svc/Unary")(b""))
    finally:
        server.stop(None)
    assert after["received_ms"] is None
    assert after["remaining"] is None


def test_disabled_server_interceptor_passes_calls_through() -> None:
    """``enabled=False`` leaves the handler without a deadline or request state."""

    def unary(request: bytes, context: Any) -> bytes:
        return encode(observe(context))

    server, port = start_sync_server(
        {"Unary": grpc.unary_unary_rpc_method_handler(unary)},
        interceptors=[server_interceptor(enabled=False)],
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            seen = decode(channel.unary_unary("/test.Svc/Unary")(b"", timeout=2))
    finally:
        server.stop(None)
    assert seen == {"received_ms": None, "has_state": False, "remaining": None, "source": None}


def test_disabled_client_interceptor_keeps_the_static_timeout(leaf: tuple[Leaf, int]) -> None:
    """``enabled=False`` sends the call's own timeout even under a shorter deadline."""
    _, port = leaf
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port}"), client_interceptor(enabled=False)
    )
    with tb.inherit_deadline(tb.Deadline.after(1.0)):
        seen = decode(channel.unary_unary(LEAF)(b"", timeout=30.0))
    channel.close()
    assert seen["received_ms"] > 1000


def test_destination_label_is_configurable(leaf: tuple[Leaf, int]) -> None:
    """``destination=`` maps the method name to the metrics label."""
    _, port = leaf
    channel = grpc.intercept_channel(
        grpc.insecure_channel(f"127.0.0.1:{port}"),
        client_interceptor(destination=lambda method: method.rsplit("/", 1)[-1]),
    )
    with tb.inherit_deadline(tb.Deadline.after(2.0)):
        channel.unary_unary(LEAF)(b"", timeout=30.0)
    channel.close()
    assert counters.get(CLI_PROPAGATED, grpc_destination="Echo") == 1


def test_span_tags_use_userver_names(leaf: tuple[Leaf, int]) -> None:
    """Client and server report userver's span tags as ``span.tags`` telemetry events."""
    from timebound.telemetry import Event, add_listener

    seen: list[Event] = []
    remove = add_listener(seen.append)
    _, port = leaf
    channel = leaf_channel(port)
    try:
        with tb.inherit_deadline(tb.Deadline.after(2.0)):
            channel.unary_unary(LEAF)(b"", timeout=30.0)
    finally:
        remove()
        channel.close()
    tags = {
        (e.attrs["component"], key)
        for e in seen
        if e.name == "span.tags"
        for key in e.attrs
        if key not in ("component", "grpc_destination")
    }
    assert {
        ("grpc-client", "deadline_updated"),
        ("grpc-client", "timeout_ms"),
        ("grpc-server", "deadline_received_ms"),
    } <= tags


@pytest.fixture
def request_with_time() -> Iterator[RequestState]:
    """A request with 30 s left, entered as the server interceptor enters it."""
    deadline = tb.Deadline.after(30)
    state = RequestState(deadline_received_ms=30_000, deadline=deadline)
    token = _state._request.set(state)
    with tb.inherit_deadline(deadline):
        yield state
    _state._request.reset(token)


def test_attempt_timeout_expiry_stays_a_plain_rpc_error(
    leaf: tuple[Leaf, int], request_with_time: RequestState
) -> None:
    """A timeout lowered by the attempt's own bound is the attempt's time, not our deadline:
    grpc's own (retryable) error, and the request with 30 s left is not marked (D2.5, D4.5)."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    with pytest.raises(grpc.RpcError) as info:
        with tb.fail_after(0.2, source="attempt"):
            channel.unary_unary(LEAF)(b"", timeout=30.0)
    channel.close()
    assert not isinstance(info.value, PropagatedDeadlineExceeded)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert request_with_time.cancelled_by_deadline is False
    assert counters.get(CLI_CANCELLED, grpc_destination="test.Leaf/Echo") == 1


def test_local_scope_expiry_is_propagated_but_not_the_requests(
    leaf: tuple[Leaf, int], request_with_time: RequestState
) -> None:
    """A local scope that lowered the timeout is spent (propagated), but the request with 30 s
    left is not marked."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    with pytest.raises(PropagatedDeadlineExceeded):
        with tb.fail_after(0.2):
            channel.unary_unary(LEAF)(b"", timeout=30.0)
    channel.close()
    assert request_with_time.cancelled_by_deadline is False


def test_future_done_callback_sees_the_propagated_error(
    leaf: tuple[Leaf, int], request_state: RequestState
) -> None:
    """A ``.future()`` done-callback gets the wrapping future, whose error is the propagated one."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    seen: list[Any] = []
    finished = threading.Event()

    def on_done(f: Any) -> None:
        seen.append(f)
        finished.set()

    with tb.inherit_deadline(tb.Deadline.after(0.2)):
        fut = channel.unary_unary(LEAF).future(b"", timeout=30.0)
    fut.add_done_callback(on_done)
    assert finished.wait(10)
    channel.close()
    assert seen == [fut]
    assert isinstance(seen[0].exception(), PropagatedDeadlineExceeded)
    assert fut.done() and not fut.running() and not fut.cancelled() and not fut.is_active()
    assert fut.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert fut.traceback() is not None


def test_future_success_exposes_grpc_call_interface(leaf: tuple[Leaf, int]) -> None:
    """A propagated ``.future()`` that succeeds answers as grpc's own future and call do."""
    _, port = leaf
    channel = leaf_channel(port)
    with tb.inherit_deadline(tb.Deadline.after(5)):
        fut = channel.unary_unary(LEAF).future(b"", timeout=30.0)
    assert within(decode(fut.result())["received_ms"], 5)
    assert fut.exception() is None and fut.traceback() is None
    assert fut.code() == grpc.StatusCode.OK and fut.details() in ("", None)
    assert fut.initial_metadata() is not None and fut.trailing_metadata() is not None
    assert fut.done() and not fut.cancelled() and not fut.is_active()
    assert fut.add_callback(lambda: None) is False  # the call is over: grpc refuses new ones
    channel.close()


def test_cancelled_future_is_not_a_deadline_expiry(
    leaf: tuple[Leaf, int], request_state: RequestState
) -> None:
    """Cancelling a propagated ``.future()`` cancels the RPC; the request is not marked."""
    impl, port = leaf
    impl.mode = "block"
    channel = leaf_channel(port)
    with tb.inherit_deadline(tb.Deadline.after(5)):
        fut = channel.unary_unary(LEAF).future(b"", timeout=30.0)
    assert fut.running() and fut.is_active() and not fut.done()
    assert fut.time_remaining() is not None and fut.time_remaining() <= 5
    assert fut.cancel() is True
    assert fut.cancelled()
    with pytest.raises(grpc.FutureCancelledError):
        fut.result()
    channel.close()
    assert request_state.cancelled_by_deadline is False
    assert counters.total(CLI_CANCELLED) == 0
