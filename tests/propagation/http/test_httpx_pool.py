"""A request that waits for a pooled connection past its deadline (real uvicorn): it is not
cut by httpcore's pool timeout (which leaks connections, encode/httpcore#1093) but stops at the
first step after the wait, sending nothing, and the pool stays usable."""

from __future__ import annotations

import threading
import time

import httpx

import timebound as tb
from timebound.propagation.httpx import DeadlineTransport

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
    """The waiting request raises its deadline's error once it gets the connection; the server
    never sees it, and the client works afterwards."""
    app, url = svc
    inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=1))
    errors: list[BaseException] = []
    with httpx.Client(transport=DeadlineTransport(inner, timeout=5.0), timeout=5.0) as client:
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
        _wait_for(lambda: deadline.expired, "the second request's deadline passed")
        app.held.set()
        holder.join(10)
        second.join(10)
        after = client.get(f"{url}/ok")
    assert len(errors) == 1 and isinstance(errors[0], tb.DeadlineExceeded)
    assert errors[0].source == "inherited"
    assert [s.path for s in app.seen] == ["/held", "/ok"]  # the /ok is the one made afterwards
    assert after.text == "ok"
