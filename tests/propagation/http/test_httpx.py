"""The httpx transports: clamp, outgoing header, fail-fast, cuts, remote expiry (D4.3-D4.8)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

import timebound as tb
from timebound._core._request import _request
from timebound.propagation import RequestState, set_enabled
from timebound.propagation.httpx import AsyncDeadlineTransport, AttemptTimeout, DeadlineTransport
from timebound.telemetry import Event, counters
from timebound.testing import VirtualClock

from .conftest import TIMEOUT_HEADER, Downstream, span_tags


class Recorder:
    """An in-process inner transport (httpx.MockTransport) that records each request."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.status = status
        self.headers = headers or {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, headers=self.headers, content=b"body")

    @property
    def header(self) -> str | None:
        return self.requests[-1].headers.get(TIMEOUT_HEADER)

    @property
    def phases(self) -> dict[str, float | None]:
        return dict(self.requests[-1].extensions["timeout"])


def client(rec: Recorder, **kw: object) -> httpx.Client:
    transport_kw = {k: v for k, v in kw.items() if k != "client_timeout"}
    return httpx.Client(
        transport=DeadlineTransport(httpx.MockTransport(rec), **transport_kw),  # type: ignore[arg-type]
        timeout=kw.get("client_timeout"),  # type: ignore[arg-type]
    )


@pytest.fixture
def request_state() -> Iterator[RequestState]:
    """A server request in progress (what the ASGI/WSGI middleware sets up)."""
    state = RequestState(deadline_received_ms=1000)
    token = _request.set(state)
    yield state
    _request.reset(token)


# --- the outgoing header and the clamp (virtual time, in-process inner transport) -------------


def test_header_is_remaining_ms_rounded_up(virtual_clock: VirtualClock) -> None:
    """The header carries ceil(remaining ms) of the effective deadline; the I/O phases get the
    time left, the pool wait keeps the static timeout (a pool timeout leaks, httpcore#1093)."""
    rec = Recorder()
    with tb.fail_after(0.3):
        virtual_clock.advance(0.1000004)
        client(rec, timeout=5).get("http://svc/")
    assert rec.header == "200"
    assert rec.phases == {
        "connect": 0.1999996,
        "read": 0.1999996,
        "write": 0.1999996,
        "pool": 5.0,
    }


def test_header_is_never_zero(virtual_clock: VirtualClock) -> None:
    """With a sliver of time left the header says 1, not 0."""
    rec = Recorder()
    with tb.fail_after(1):
        virtual_clock.advance(0.9999999)
        client(rec).get("http://svc/")
    assert rec.header == "1"


def test_static_timeout_alone_is_sent(virtual_clock: VirtualClock, events: list[Event]) -> None:
    """Without a deadline the transport's total is sent, and no "updated" metric is counted."""
    rec = Recorder()
    client(rec, timeout=2.5).get("http://svc/")
    assert rec.header == "2500"
    assert counters.total("timeout-updated-by-deadline") == 0
    assert "propagated_timeout_ms" not in span_tags(events, "http-client")


def test_static_timeout_is_largest_phase_without_transport_total(
    virtual_clock: VirtualClock,
) -> None:
    """D4.3: with no transport total, the largest configured phase timeout is the static one."""
    rec = Recorder()
    client(rec, client_timeout=httpx.Timeout(1.0, read=7.0)).get("http://svc/")
    assert rec.header == "7000"


def test_transport_total_wins_over_phases(virtual_clock: VirtualClock) -> None:
    """D4.3: the transport's own total is the static timeout and caps every phase."""
    rec = Recorder()
    client(rec, timeout=2.0, client_timeout=httpx.Timeout(1.0, read=7.0)).get("http://svc/")
    assert rec.header == "2000"
    assert rec.phases == {"connect": 1.0, "read": 2.0, "write": 1.0, "pool": 1.0}


def test_no_deadline_no_static_timeout_sends_no_header(virtual_clock: VirtualClock) -> None:
    """With neither a deadline nor a static timeout no header is sent."""
    rec = Recorder()
    client(rec).get("http://svc/")
    assert rec.header is None


def test_lowered_timeout_is_counted_and_tagged(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """A deadline that lowers the timeout counts timeout-updated-by-deadline and tags it."""
    rec = Recorder()
    with tb.fail_after(0.25):
        client(rec, timeout=5).get("http://svc/")
    assert counters.get("timeout-updated-by-deadline", component="http-client") == 1
    assert span_tags(events, "http-client") == {"propagated_timeout_ms": 250}


def test_expired_deadline_fails_fast_and_sends_nothing(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """No time left: DeadlineExceeded with the binding source, nothing sent, request marked."""
    rec = Recorder()
    with tb.inherit_deadline(tb.Deadline.after(0.1)):
        virtual_clock.advance(0.1)
        with pytest.raises(tb.DeadlineExceeded) as info:
            client(rec, timeout=5).get("http://svc/")
    assert info.value.source == "inherited"
    assert rec.requests == []
    assert request_state.cancelled_by_deadline
    assert counters.get("cancelled-by-deadline", component="http-client") == 1


def test_header_switch_off_keeps_clamping(virtual_clock: VirtualClock) -> None:
    """propagate_header=False sends no header but still clamps the timeouts."""
    rec = Recorder()
    with tb.fail_after(0.3):
        client(rec, timeout=5, propagate_header=False).get("http://svc/")
    assert rec.header is None
    assert rec.phases["read"] == 0.3


def test_runtime_kill_switch_stops_the_header(virtual_clock: VirtualClock) -> None:
    """set_enabled(False) stops the header on every client at once."""
    rec = Recorder()
    set_enabled(False)
    with tb.fail_after(0.3):
        client(rec, timeout=5).get("http://svc/")
    assert rec.header is None


def test_configured_header_name(virtual_clock: VirtualClock) -> None:
    """The outgoing header name is configurable."""
    rec = Recorder()
    client(rec, timeout=1, timeout_header="X-Deadline-Ms").get("http://svc/")
    assert rec.requests[-1].headers["x-deadline-ms"] == "1000"


# --- D4.5: the remote expiry marker ------------------------------------------------------------


def test_remote_expired_with_lowered_timeout_is_propagated(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """Case 1: our deadline set the timeout, so the remote expiry is ours: source=propagated."""
    rec = Recorder(498, {"X-YaTaxi-Deadline-Expired": "1"})
    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded) as info:
        client(rec, timeout=5).get("http://svc/")
    assert info.value.source == "propagated"
    assert not isinstance(info.value, httpx.TimeoutException)
    assert request_state.cancelled_by_deadline
    assert counters.get("cancelled-by-deadline", component="http-client") == 1


class _UnreadableBody(httpx.SyncByteStream):
    """A body whose read fails as a read past the attempt's end does (a timeout)."""

    def __iter__(self) -> Iterator[bytes]:
        raise httpx.ReadTimeout("the body came after the deadline")


def test_a_refusal_whose_body_cannot_be_read_is_still_the_refusal(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """A 498 answer whose short body cannot be read any more (the attempt's end has passed) is
    reported as the propagated deadline, not as the read's own error (it leaked out as the step
    gate's private _Spent through the host's client)."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            498, headers={"X-YaTaxi-Deadline-Expired": "1"}, stream=_UnreadableBody()
        )

    transport = DeadlineTransport(httpx.MockTransport(answer), timeout=5)
    with (
        httpx.Client(transport=transport) as c,
        tb.inherit_deadline(tb.Deadline.after(0.3)),
        pytest.raises(tb.DeadlineExceeded) as info,
    ):
        c.get("http://svc/")
    assert info.value.source == "propagated"


def test_remote_expired_with_static_timeout_is_an_attempt_timeout(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """Case 2: the static timeout was used, so it is an ordinary (retryable) attempt timeout."""
    rec = Recorder(504, {"X-YaTaxi-Deadline-Expired": "yes"})
    with tb.inherit_deadline(tb.Deadline.after(30)), pytest.raises(AttemptTimeout) as info:
        client(rec, timeout=5).get("http://svc/")
    assert info.value.source == "attempt" and info.value.remote
    assert isinstance(info.value, httpx.TimeoutException)
    assert info.value.request.url == "http://svc/"
    assert not request_state.cancelled_by_deadline


def test_marker_on_success_status_is_ignored(virtual_clock: VirtualClock) -> None:
    """The marker only counts on a status >= 400."""
    rec = Recorder(200, {"X-YaTaxi-Deadline-Expired": "1"})
    with tb.fail_after(1):
        assert client(rec).get("http://svc/").status_code == 200


# --- async: cuts at exact virtual instants -------------------------------------------------------


class _Stall(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.sleep(10)
        yield b"rest"


def async_client(handler: object, **kw: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=AsyncDeadlineTransport(httpx.MockTransport(handler), **kw)  # type: ignore[arg-type]
    )


async def test_async_exchange_cut_at_deadline(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """A stalled exchange ends exactly at the inherited deadline, reported as inherited."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded) as info:
        await async_client(handler, timeout=5).get("http://svc/")
    assert virtual_clock.now() == 0.3
    assert info.value.source == "inherited"
    assert request_state.cancelled_by_deadline
    assert counters.get("cancelled-by-deadline", component="http-client") == 1


async def test_async_exchange_cut_by_enclosing_scope(virtual_clock: VirtualClock) -> None:
    """Inside the caller's own fail_after, that scope fires and reports source=scope."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200)

    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.3):
        await async_client(handler, timeout=5).get("http://svc/")
    assert (virtual_clock.now(), info.value.source) == (0.3, "scope")


async def test_async_static_total_is_an_attempt_timeout(virtual_clock: VirtualClock) -> None:
    """The transport's own total bounds the exchange and raises AttemptTimeout at its end."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200)

    with pytest.raises(AttemptTimeout) as info:
        await async_client(handler, timeout=0.2).get("http://svc/")
    assert virtual_clock.now() == 0.2
    assert not info.value.remote and info.value.source == "attempt"


async def test_async_body_stream_is_bounded(virtual_clock: VirtualClock) -> None:
    """The total includes the body: a stall after the first chunk ends at the deadline."""

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Stall())

    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.3):
        await async_client(handler, timeout=5).get("http://svc/")
    assert (virtual_clock.now(), info.value.source) == (0.3, "scope")


async def test_async_body_read_after_scope_uses_attempt_end(virtual_clock: VirtualClock) -> None:
    """A streamed body read outside the caller's scope still ends at the attempt's end."""

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Stall())

    ac = async_client(handler, timeout=0.5)
    async with ac.stream("GET", "http://svc/") as response:
        with pytest.raises(AttemptTimeout):
            await response.aread()
    assert virtual_clock.now() == 0.5


async def test_async_expired_sends_nothing(virtual_clock: VirtualClock) -> None:
    """An async call with no time left raises at once and never reaches the transport."""
    calls: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    with tb.move_on_after(0.1):
        await asyncio.sleep(1)
    with tb.inherit_deadline(tb.Deadline(0.05)), pytest.raises(tb.DeadlineExceeded) as info:
        await async_client(handler).get("http://svc/")
    assert calls == [] and info.value.source == "inherited"


async def test_abandoned_exchange_is_bounded_by_static_timeout(virtual_clock: VirtualClock) -> None:
    """A cut exchange goes on in the background, but only until its static timeout ends."""
    ended: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.sleep(100)
        finally:
            ended.append(virtual_clock.now())
        return httpx.Response(200)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded):
        await async_client(handler, timeout=5).get("http://svc/")
    assert (virtual_clock.now(), ended) == (0.3, [])
    await asyncio.sleep(10)
    assert ended == [5.0]


class _Closing(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"body"

    async def aclose(self) -> None:
        self.closed = True


async def test_response_arriving_at_the_cut_is_released(virtual_clock: VirtualClock) -> None:
    """A response handed over in the loop iteration that cuts the caller is still closed."""
    stream = _Closing()

    async def handler(request: httpx.Request) -> httpx.Response:
        # In one callback: time reaches the deadline and the response becomes ready, so the
        # exchange hands it over just before the caller's deadline timer runs.
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def deadline_and_response() -> None:
            virtual_clock.jump_to(0.3)
            ready.set_result(None)

        asyncio.get_running_loop().call_soon(deadline_and_response)
        await ready
        return httpx.Response(200, stream=stream)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded):
        await async_client(handler, timeout=5).get("http://svc/")
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert (virtual_clock.now(), stream.closed) == (0.3, True)


# --- real server (uvicorn) --------------------------------------------------------------------


def test_server_sees_at_most_what_we_had(svc: tuple[Downstream, str]) -> None:
    """The downstream server receives a header <= our remaining time, and > 0."""
    app, url = svc
    with httpx.Client(transport=DeadlineTransport(timeout=5)) as c, tb.fail_after(0.5):
        assert c.get(f"{url}/ok").status_code == 200
    ms = app.seen[-1].timeout_ms
    assert ms is not None and 1 <= ms <= 500


def test_expired_call_never_reaches_server(svc: tuple[Downstream, str]) -> None:
    """A call with a spent deadline sends nothing: the server sees only the next request."""
    app, url = svc
    with httpx.Client(transport=DeadlineTransport()) as c:
        with tb.inherit_deadline(tb.Deadline.after(0)), pytest.raises(tb.DeadlineExceeded):
            c.get(f"{url}/ok?first")
        c.get(f"{url}/ok")
    assert [s.path for s in app.seen] == ["/ok"]
    assert app.seen[0].timeout_ms == 5000  # httpx's default 5 s phase timeouts (D4.3)


def test_sync_slow_server_cut_and_client_reusable(svc: tuple[Downstream, str]) -> None:
    """A sync call to a stalled server is cut by our deadline; the same client works after."""
    app, url = svc
    with httpx.Client(transport=DeadlineTransport(timeout=5)) as c:
        with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(0.2):
            c.get(f"{url}/slow")
        assert info.value.source == "scope"
        assert c.get(f"{url}/ok").status_code == 200
    assert app.seen[0].timeout_ms is not None and app.seen[0].timeout_ms <= 200


def test_sync_stream_body_is_bounded(svc: tuple[Downstream, str]) -> None:
    """A sync body that stalls after its first chunk is cut at the deadline."""
    _, url = svc
    with httpx.Client(transport=DeadlineTransport(timeout=0.3)) as c:
        with pytest.raises(AttemptTimeout) as info:
            c.get(f"{url}/stream")
        assert not info.value.remote
        assert c.get(f"{url}/ok").status_code == 200


@pytest.mark.asyncio_real
async def test_async_slow_server_cut_and_pool_reused(svc: tuple[Downstream, str]) -> None:
    """An async cut by the request's deadline releases the caller; the pool still works."""
    _, url = svc
    state = RequestState()
    token = _request.set(state)
    try:
        async with httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5)) as c:
            with tb.inherit_deadline(tb.Deadline.after(0.2)):
                with pytest.raises(tb.DeadlineExceeded) as info:
                    await c.get(f"{url}/slow")
            assert info.value.source == "inherited" and state.cancelled_by_deadline
            assert (await c.get(f"{url}/ok")).status_code == 200
    finally:
        _request.reset(token)


@pytest.mark.asyncio_real
async def test_async_stream_body_is_bounded(svc: tuple[Downstream, str]) -> None:
    """An async body that stalls after its first chunk is cut by the caller's deadline."""
    _, url = svc
    async with httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5)) as c:
        with pytest.raises(tb.DeadlineExceeded) as info:
            with tb.fail_after(0.3):
                await c.get(f"{url}/stream")
        assert info.value.source == "scope"
        assert (await c.get(f"{url}/ok")).status_code == 200


@pytest.mark.asyncio_real
async def test_propagated_cut_keeps_the_connection(svc: tuple[Downstream, str]) -> None:
    """D4.5 case 1 over a real server: source=propagated, and the connection is reused (D4.8)."""
    app, url = svc
    async with httpx.AsyncClient(transport=AsyncDeadlineTransport(timeout=5)) as c:
        assert (await c.get(f"{url}/ok")).status_code == 200
        with tb.inherit_deadline(tb.Deadline.after(2)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                await c.get(f"{url}/expired")
        assert info.value.source == "propagated"
        assert (await c.get(f"{url}/ok")).status_code == 200
    ports = {s.client_port for s in app.seen}
    assert len(app.seen) == 3 and len(ports) == 1


def test_remote_expiry_case_2_over_real_server(svc: tuple[Downstream, str]) -> None:
    """D4.5 case 2 over a real server: AttemptTimeout(remote=True), connection reused."""
    app, url = svc
    with httpx.Client(transport=DeadlineTransport(timeout=5)) as c:
        with pytest.raises(AttemptTimeout) as info:
            c.get(f"{url}/expired")
        assert info.value.remote
        assert c.get(f"{url}/ok").status_code == 200
    assert len({s.client_port for s in app.seen}) == 1


def test_header_sent_on_every_attempt(svc: tuple[Downstream, str]) -> None:
    """Each attempt recomputes and sends the header, shrinking with the deadline."""
    app, url = svc
    with httpx.Client(transport=DeadlineTransport(timeout=5)) as c, tb.fail_after(3):
        for _ in range(3):
            c.get(f"{url}/ok")
    values = [s.timeout_ms for s in app.seen]
    assert all(v is not None and 1 <= v <= 3000 for v in values)
    assert values == sorted(values, reverse=True)  # type: ignore[type-var]


async def _wait_idle(inner: httpx.AsyncHTTPTransport) -> None:
    """Until the pool holds only idle connections (the background exchange has finished)."""
    for _ in range(500):
        conns = inner._pool.connections
        if conns and all(c.is_idle() for c in conns):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the cut exchange never returned its connection")


async def _cut_once_received(
    app: Downstream, clock: VirtualClock, client: httpx.AsyncClient, url: str
) -> tb.DeadlineExceeded:
    """GET ``url`` under a 60 s deadline reached (on virtual time) once the server has it.

    The tests below are about a cut *exchange*: with a real budget, a connect slowed by load
    could spend it before the request was sent. Time stands still until the test moves it (no
    autojump while real I/O is pending for under an hour), so every other bound (the client's
    phase timeouts, the transport's static timeout) must lie beyond the 60 s.
    """
    clock.autojump_threshold = 3600
    with tb.inherit_deadline(tb.Deadline.after(60)):
        call = asyncio.ensure_future(client.get(url))
    for _ in range(1000):
        if app.seen:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the request never reached the server")
    clock.advance(60)
    with pytest.raises(tb.DeadlineExceeded) as info:
        await call
    return info.value


async def test_cut_exchange_finishes_in_background_keeping_connection(
    svc: tuple[Downstream, str], virtual_clock: VirtualClock
) -> None:
    """D4.8: a propagated cut releases the caller; the exchange ends later on the same conn."""
    app, url = svc
    inner = httpx.AsyncHTTPTransport()
    transport = AsyncDeadlineTransport(inner, timeout=7200)
    async with httpx.AsyncClient(transport=transport, timeout=7200) as c:
        error = await _cut_once_received(app, virtual_clock, c, f"{url}/held")
        assert error.source == "inherited"
        assert [s.path for s in app.seen] == ["/held"]  # the caller is free; the server still works
        app.held.set()
        await _wait_idle(inner)
        assert (await c.get(f"{url}/ok")).status_code == 200
    assert app.seen[0].client_port == app.seen[1].client_port


async def test_cut_without_saving_closes_the_connection(
    svc: tuple[Downstream, str], virtual_clock: VirtualClock
) -> None:
    """save_connections=False cancels the exchange: the next request needs a new connection."""
    app, url = svc
    inner = httpx.AsyncHTTPTransport()
    transport = AsyncDeadlineTransport(inner, timeout=7200, save_connections=False)
    async with httpx.AsyncClient(transport=transport, timeout=7200) as c:
        await _cut_once_received(app, virtual_clock, c, f"{url}/held")
        assert (await c.get(f"{url}/ok")).status_code == 200
    assert app.seen[0].client_port != app.seen[1].client_port


def test_async_transport_under_trio(virtual_clock: VirtualClock) -> None:
    """Under trio the transport clamps, sends the header and cuts at the deadline too."""
    import trio

    seen: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(TIMEOUT_HEADER))
        await trio.sleep(10)
        return httpx.Response(200)

    async def main() -> str:
        async with async_client(handler, timeout=5) as c:
            with tb.inherit_deadline(tb.Deadline.after(0.05)):
                try:
                    await c.get("http://svc/")
                except tb.DeadlineExceeded as exc:
                    return exc.source
        return "no error"

    assert trio.run(main, clock=virtual_clock.trio_clock()) == "inherited"
    assert (seen, virtual_clock.now()) == (["50"], 0.05)


# --- span tags, pass-through of the client's own phase timeouts, late body reads -----------------


def test_fail_fast_is_tagged_cancelled_by_deadline(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """A call that fails fast on a spent deadline carries the span tag cancelled_by_deadline=1."""
    with tb.inherit_deadline(tb.Deadline.after(0.1)):
        virtual_clock.advance(0.1)
        with pytest.raises(tb.DeadlineExceeded):
            client(Recorder(), timeout=5).get("http://svc/")
    assert span_tags(events, "http-client") == {"cancelled_by_deadline": 1}


async def test_async_cut_is_tagged_with_both_span_tags(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """An exchange cut by our deadline is tagged propagated_timeout_ms and cancelled_by_deadline."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded):
        await async_client(handler, timeout=5).get("http://svc/")
    assert span_tags(events, "http-client") == {
        "propagated_timeout_ms": 300,
        "cancelled_by_deadline": 1,
    }


async def test_async_no_deadline_no_static_timeout_sends_no_header(
    virtual_clock: VirtualClock,
) -> None:
    """Async: with neither a deadline nor a static timeout the request goes out untouched."""
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b"ok")

    async with httpx.AsyncClient(
        transport=AsyncDeadlineTransport(httpx.MockTransport(handler)), timeout=None
    ) as c:
        assert (await c.get("http://svc/")).content == b"ok"
    assert TIMEOUT_HEADER not in seen[0].headers
    assert dict(seen[0].extensions["timeout"]) == dict.fromkeys(
        ("connect", "read", "write", "pool")
    )


def test_sync_own_read_timeout_inside_the_budget_stays_httpx_own(
    svc: tuple[Downstream, str], request_state: RequestState
) -> None:
    """The client's own read timeout firing before the attempt's end is httpx's ReadTimeout."""
    _, url = svc
    with httpx.Client(
        transport=DeadlineTransport(timeout=5), timeout=httpx.Timeout(5, read=0.1)
    ) as c:
        with pytest.raises(httpx.ReadTimeout) as info:
            c.get(f"{url}/slow")
        assert not isinstance(info.value, tb.DeadlineExceeded)
        with pytest.raises(httpx.ReadTimeout) as info2:
            c.get(f"{url}/stream")
        assert not isinstance(info2.value, tb.DeadlineExceeded)
    assert not request_state.cancelled_by_deadline


def test_sync_body_chunk_read_after_the_end_is_cut(
    svc: tuple[Downstream, str], virtual_clock: VirtualClock
) -> None:
    """A streamed body chunk that is read after the attempt's end raises AttemptTimeout."""
    _, url = svc
    with httpx.Client(transport=DeadlineTransport(timeout=5)) as c:
        with c.stream("GET", f"{url}/stream") as response:
            virtual_clock.advance(5)
            with pytest.raises(AttemptTimeout) as info:
                response.read()
        assert info.value.timeout == 5.0
        assert c.get(f"{url}/ok").status_code == 200
