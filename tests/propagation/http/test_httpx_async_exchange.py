"""The async connection-saving exchange: explicit cancels, httpx timeouts, late failures."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

import timebound as tb
from timebound._core._request import _request
from timebound.propagation import RequestState
from timebound.propagation.httpx import AsyncDeadlineTransport
from timebound.telemetry import counters
from timebound.testing import VirtualClock


@pytest.fixture
def request_state() -> Iterator[RequestState]:
    """A server request in progress (what the ASGI/WSGI middleware sets up)."""
    state = RequestState(deadline_received_ms=1000)
    token = _request.set(state)
    yield state
    _request.reset(token)


def loop_errors() -> list[dict[str, Any]]:
    """Collect whatever reaches the running loop's exception handler (unretrieved errors)."""
    seen: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _loop, context: seen.append(context))
    return seen


def async_client(handler: object, **kw: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=AsyncDeadlineTransport(httpx.MockTransport(handler), **kw)  # type: ignore[arg-type]
    )


async def test_explicit_cancel_before_the_cut_cancels_the_exchange(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """A caller cancelled before our deadline gets CancelledError and its exchange stops too."""
    ended: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.sleep(100)
        finally:
            ended.append(virtual_clock.now())
        return httpx.Response(200)

    async def call() -> None:
        with tb.inherit_deadline(tb.Deadline.after(0.3)):
            await async_client(handler, timeout=5).get("http://svc/")

    task = asyncio.ensure_future(call())
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    assert (virtual_clock.now(), ended) == (0.1, [0.1])
    assert not request_state.cancelled_by_deadline
    assert counters.get("cancelled-by-deadline", component="http-client") == 0


async def test_own_read_timeout_inside_the_budget_stays_httpx_own(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """httpx's own timeout raised before our deadline reaches the caller unchanged."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.1)
        raise httpx.ReadTimeout("read timed out", request=request)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(httpx.ReadTimeout) as info:
        await async_client(handler, timeout=5).get("http://svc/")
    assert not isinstance(info.value, tb.DeadlineExceeded)
    assert virtual_clock.now() == 0.1
    assert not request_state.cancelled_by_deadline


async def test_read_timeout_at_our_deadline_is_our_cut(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """httpx's timeout that surfaces once our deadline is reached is reported as that deadline."""

    async def handler(request: httpx.Request) -> httpx.Response:
        # In one callback time reaches the deadline and the socket timer fires, so the error
        # is handed over just before the caller's deadline timer runs.
        failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def deadline_and_timeout() -> None:
            virtual_clock.jump_to(0.3)
            failed.set_exception(httpx.ReadTimeout("read timed out", request=request))

        asyncio.get_running_loop().call_soon(deadline_and_timeout)
        await failed
        return httpx.Response(200)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded) as info:
        await async_client(handler, timeout=5).get("http://svc/")
    assert (virtual_clock.now(), info.value.source) == (0.3, "inherited")
    assert request_state.cancelled_by_deadline


async def test_transport_error_reaches_the_caller(virtual_clock: VirtualClock) -> None:
    """A connection error inside the budget is handed over from the exchange as it is."""

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.1)
        raise httpx.ConnectError("refused", request=request)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(httpx.ConnectError):
        await async_client(handler, timeout=5).get("http://svc/")
    assert virtual_clock.now() == 0.1


async def test_abandoned_exchange_failure_is_dropped_quietly(
    virtual_clock: VirtualClock,
) -> None:
    """An exchange that fails after the caller was cut reports to nobody, not even the loop."""
    errors = loop_errors()
    failed_at: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(1)
        failed_at.append(virtual_clock.now())
        raise httpx.ConnectError("reset", request=request)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded):
        await async_client(handler, timeout=5).get("http://svc/")
    await asyncio.sleep(2)
    gc.collect()  # an unretrieved task or future error is reported when it is collected
    assert (failed_at, errors) == ([1.0], [])


class _BrokenBody(httpx.AsyncByteStream):
    def __init__(self) -> None:
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"first"
        raise httpx.ReadError("connection reset")

    async def aclose(self) -> None:
        self.closed = True


async def test_late_response_with_broken_body_is_still_closed(
    virtual_clock: VirtualClock,
) -> None:
    """A response arriving after the cut whose body fails while drained is closed, silently."""
    errors = loop_errors()
    body = _BrokenBody()

    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(1)
        return httpx.Response(200, stream=body)

    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded):
        await async_client(handler, timeout=5).get("http://svc/")
    await asyncio.sleep(2)
    gc.collect()
    assert (body.closed, errors) == (True, [])


async def test_body_read_outside_the_inherited_deadline_reports_it(
    virtual_clock: VirtualClock,
) -> None:
    """A streamed body read after leaving the caller's context still ends at its deadline."""

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=_Stall())

    ac = async_client(handler, timeout=5)
    with tb.inherit_deadline(tb.Deadline.after(0.3)):
        response = await ac.send(ac.build_request("GET", "http://svc/"), stream=True)
    with pytest.raises(tb.DeadlineExceeded) as info:
        await response.aread()
    assert (virtual_clock.now(), info.value.source) == (0.3, "inherited")
    assert not isinstance(info.value, httpx.TimeoutException)


class _Stall(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.sleep(10)
        yield b"rest"


@pytest.mark.parametrize(
    ("save", "deadline", "inline"),
    [
        (False, 0.3, True),  # nothing to keep: no task of its own
        (True, 100.0, True),  # our deadline does not lower the 5 s timeout: nothing to keep
        (True, 0.3, False),  # lowered and kept past a cut: its own task
    ],
)
async def test_unpooled_exchange_runs_in_the_callers_task_when_nothing_is_kept(
    virtual_clock: VirtualClock, save: bool, deadline: float, inline: bool
) -> None:
    """Without httpcore's pool there is no pool wait to protect, so an exchange that would not be
    kept after a cut runs inline: no task to start, no hand-over (two loop iterations per call
    on Python 3.11). One that may be kept still gets its task."""
    tasks: list[asyncio.Task[Any] | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        tasks.append(asyncio.current_task())
        return httpx.Response(200, text="ok")

    with tb.inherit_deadline(tb.Deadline.after(deadline)):
        r = await async_client(handler, timeout=5, save_connections=save).get("http://svc/")
    assert r.text == "ok"
    assert (tasks == [asyncio.current_task()]) is inline


async def test_inline_exchange_is_cut_at_the_deadline(
    virtual_clock: VirtualClock, request_state: RequestState
) -> None:
    """The inline path still leaves exactly at our deadline, as the deadline's error, and the
    exchange (in the caller's task) is cancelled there."""
    ended: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        try:
            await asyncio.sleep(100)
        finally:
            ended.append(virtual_clock.now())
        return httpx.Response(200)

    client = async_client(handler, timeout=5, save_connections=False)
    with tb.inherit_deadline(tb.Deadline.after(0.3)), pytest.raises(tb.DeadlineExceeded) as info:
        await client.get("http://svc/")
    assert info.value.source == "inherited"
    assert (virtual_clock.now(), ended) == (0.3, [0.3])
    assert request_state.cancelled_by_deadline
