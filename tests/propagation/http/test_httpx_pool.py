"""A request that waits for a pooled connection past its deadline (real uvicorn): it does not
wait inside httpcore's pool (whose timeout leaks connections, encode/httpcore#1093) but in the
transport, which it leaves at its deadline, sending nothing, and the pool stays usable."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

import timebound as tb
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport

from .conftest import Downstream


def _wait_for(predicate: object, what: str) -> None:
    for _ in range(2000):
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.005)
    raise AssertionError(f"never happened: {what}")


def test_sync_pool_wait_past_the_deadline_stops_before_sending(
    svc: tuple[Downstream, str],
) -> None:
    """The waiting request raises its deadline's error while the connection is still held; the
    server never sees it, and the client works afterwards."""
    app, url = svc
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    errors: list[BaseException] = []
    # A pool timeout beyond the server's own 10 s stall: only the deadline ends the wait early.
    with httpx.Client(transport=DeadlineTransport(inner, timeout=30.0), timeout=30.0) as client:
        holder = threading.Thread(target=lambda: client.get(f"{url}/held"))
        holder.start()
        _wait_for(lambda: any(s.path == "/held" for s in app.seen), "the first request arrived")
        deadline = tb.Deadline.after(0.05)

        def waiter() -> None:
            try:
                with tb.inherit_deadline(deadline):
                    client.get(f"{url}/ok")
            except BaseException as exc:
                errors.append(exc)

        second = threading.Thread(target=waiter)
        second.start()
        _wait_for(lambda: errors, "the second request left at its deadline")
        left_while_held = holder.is_alive()
        app.held.set()
        holder.join(10)
        second.join(10)
        after = client.get(f"{url}/ok")
    assert len(errors) == 1 and isinstance(errors[0], tb.DeadlineExceeded)
    assert errors[0].source == "inherited"
    assert left_while_held
    assert [s.path for s in app.seen] == ["/held", "/ok"]  # the /ok is the one made afterwards
    assert after.text == "ok"


def test_sync_pool_wait_ends_at_the_pool_timeout_with_httpx_error(
    svc: tuple[Downstream, str],
) -> None:
    """Without a deadline, a wait for the held connection ends at httpx's ``pool`` timeout with
    ``httpx.PoolTimeout``; the server never sees the request and the client works afterwards."""
    app, url = svc
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    timeout = httpx.Timeout(5.0, pool=0.05)
    with httpx.Client(transport=DeadlineTransport(inner), timeout=timeout) as client:
        holder = threading.Thread(target=lambda: client.get(f"{url}/held"))
        holder.start()
        _wait_for(lambda: any(s.path == "/held" for s in app.seen), "the first request arrived")
        try:
            client.get(f"{url}/ok")
        except BaseException as exc:
            error: BaseException | None = exc
        else:
            error = None
        app.held.set()
        holder.join(10)
        after = client.get(f"{url}/ok")
    assert type(error) is httpx.PoolTimeout
    assert [s.path for s in app.seen] == ["/held", "/ok"]
    assert after.text == "ok"


@pytest.mark.asyncio_real
async def test_async_kept_exchange_whose_caller_left_during_the_slot_wait_sends_nothing(
    svc: tuple[Downstream, str],
) -> None:
    """A kept exchange (``save_connections``, our deadline lowered the timeout) whose caller left
    at its deadline while all connections were busy does not send its request once a connection
    frees: nothing was sent, so there is no connection to save, and the call would be late (the
    benchmark's metric L). The slot goes back and the client works afterwards."""
    app, url = svc
    inner = httpx.AsyncHTTPTransport(limits=httpx.Limits(max_connections=1))
    transport = AsyncDeadlineTransport(inner, timeout=30.0)
    async with httpx.AsyncClient(transport=transport, timeout=30.0) as client:
        holder = asyncio.ensure_future(client.get(f"{url}/held"))
        for _ in range(2000):
            if any(s.path == "/held" for s in app.seen):
                break
            await asyncio.sleep(0.005)
        with pytest.raises(tb.DeadlineExceeded), tb.inherit_deadline(tb.Deadline.after(0.05)):
            await client.get(f"{url}/slow")
        app.held.set()
        assert (await holder).text == "held"
        # Whatever the kept exchange would do, it has had the free connection for a while.
        await asyncio.sleep(0.2)
        after = await client.get(f"{url}/ok")
    assert [s.path for s in app.seen] == ["/held", "/ok"]
    assert after.text == "ok"
