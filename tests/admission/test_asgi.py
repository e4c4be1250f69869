"""AdmissionMiddleware for ASGI (D9): in process on virtual time, and under real uvicorn."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

from timebound.admission import Admission, AdmissionConfig, FixedLimit, Ticket, Verdict
from timebound.admission._waiting import enter_async
from timebound.propagation.asgi import AdmissionMiddleware
from timebound.telemetry import counters
from timebound.testing import VirtualClock

from ..propagation.http.conftest import ServerThread, call_asgi


def make(limit: int = 1, **config: Any) -> Admission:
    return Admission(FixedLimit(limit), AdmissionConfig(**config))


class Handler:
    """An ASGI app that counts its calls and holds each one for ``hold`` seconds."""

    def __init__(self, hold: float = 0.0) -> None:
        self.calls = 0
        self.hold = hold

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.calls += 1
        if self.hold:
            await asyncio.sleep(self.hold)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


async def test_queued_waiter_is_shed_exactly_at_interval(virtual_clock: VirtualClock) -> None:
    """A waiter nobody admits gets OVERLOADED at arrival + interval, not a moment earlier."""
    adm = make(limit=1, interval=0.125, target=0.0625)
    assert await enter_async(adm, Ticket("r", None)) is Verdict.ADMIT
    assert await enter_async(adm, Ticket("r", None)) is Verdict.OVERLOADED
    assert virtual_clock.now() == 0.125


async def test_queued_waiter_is_admitted_when_a_slot_frees(virtual_clock: VirtualClock) -> None:
    """A release wakes the waiter at that very instant."""
    adm = make(limit=1, interval=1.0)
    first = Ticket("r", None)
    await enter_async(adm, first)
    asyncio.get_running_loop().call_later(0.25, lambda: adm.release(first, 0.25, late=False))
    assert await enter_async(adm, Ticket("r", None)) is Verdict.ADMIT
    assert virtual_clock.now() == 0.25


async def test_cancelled_waiter_leaves_the_queue(virtual_clock: VirtualClock) -> None:
    """Cancelling a waiting task removes its ticket."""
    adm = make(limit=1, interval=1.0)
    await enter_async(adm, Ticket("r", None))
    task = asyncio.create_task(enter_async(adm, Ticket("r", None)))
    await asyncio.sleep(0.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert adm.queued() == 0 and adm.inflight == 1


async def test_hopeless_request_gets_498_and_the_app_never_runs(
    virtual_clock: VirtualClock,
) -> None:
    """A budget below the route's estimate is answered 498 with the expired marker (D9.1)."""
    app = Handler()
    adm = make(limit=4)
    adm.estimates.observe("GET /", 0.5)
    result = await call_asgi(AdmissionMiddleware(app, adm), {"X-YaTaxi-Client-TimeoutMs": "100"})
    assert (result.status, result.headers.get("x-yataxi-deadline-expired")) == (498, "1")
    assert app.calls == 0


async def test_shed_request_gets_503_with_retry_after(virtual_clock: VirtualClock) -> None:
    """A request meeting a full queue is answered 503 + Retry-After without running (D9.1)."""
    app = Handler(hold=1.0)
    mw = AdmissionMiddleware(
        app, make(limit=1, max_queue=1, retry_after=2, interval=10.0, target=5.0)
    )
    busy = [asyncio.create_task(call_asgi(mw)) for _ in range(2)]
    await asyncio.sleep(0)
    result = await call_asgi(mw)
    assert (result.status, result.headers.get("retry-after")) == (503, "2")
    await asyncio.gather(*busy)
    assert app.calls == 2


async def test_queue_wait_spends_the_request_deadline(virtual_clock: VirtualClock) -> None:
    """The deadline counts from arrival: a request queued past it is answered 498 (D4.2)."""
    app = Handler(hold=1.0)
    mw = AdmissionMiddleware(app, make(limit=1, interval=10.0, target=5.0))
    first = asyncio.create_task(call_asgi(mw))
    await asyncio.sleep(0)
    result = await call_asgi(mw, {"X-YaTaxi-Client-TimeoutMs": "500"})
    assert result.status == 498 and virtual_clock.now() == 0.5
    await first


async def test_request_without_deadline_is_served_under_the_limit(
    virtual_clock: VirtualClock,
) -> None:
    """A request with no deadline header is admitted and served (D9.2)."""
    app = Handler()
    result = await call_asgi(AdmissionMiddleware(app, make(limit=1)))
    assert result.status == 200 and app.calls == 1


async def test_critical_header_lets_a_request_in_first(virtual_clock: VirtualClock) -> None:
    """With ``critical_header`` set, a critical waiter overtakes an older normal one."""
    served: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        served.append(scope["path"])
        await asyncio.sleep(0.01)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    mw = AdmissionMiddleware(app, make(limit=1, interval=1.0), critical_header="X-Criticality")
    mw_path = _with_path(mw)
    tasks = [asyncio.create_task(mw_path("/first", {}))]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(mw_path("/normal", {})))
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(mw_path("/critical", {"X-Criticality": "Critical"})))
    await asyncio.gather(*tasks)
    assert served == ["/first", "/critical", "/normal"]


def _with_path(mw: AdmissionMiddleware) -> Any:
    async def call(path: str, headers: dict[str, str]) -> None:
        scope = {
            "type": "http",
            "method": "GET",
            "path": path,
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Any) -> None:
            return None

        await mw(scope, receive, send)

    return call


def test_uvicorn_sheds_hopeless_and_overload_without_running_the_handler() -> None:
    """Under real uvicorn, a burst over limit+queue gets 503s, hopeless ones 498, the rest 200."""
    started = threading.Semaphore(0)
    release = threading.Event()
    calls = 0

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal calls
        calls += 1
        started.release()
        while not release.is_set():
            await asyncio.sleep(0.005)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    adm = make(limit=2, max_queue=2, interval=10.0, target=5.0)
    adm.estimates.observe("GET /hopeless", 5.0)
    with ServerThread(AdmissionMiddleware(app, adm)) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as client:
            hopeless = client.get("/hopeless", headers={"X-YaTaxi-Client-TimeoutMs": "1000"})
            results: list[int] = []
            lock = threading.Lock()

            def one() -> None:
                with httpx.Client(base_url=srv.url, timeout=10) as c:
                    status = c.get("/").status_code
                with lock:
                    results.append(status)

            threads = [threading.Thread(target=one) for _ in range(4)]
            for t in threads[:2]:
                t.start()
            assert started.acquire(timeout=5) and started.acquire(timeout=5)
            for t in threads[2:]:
                t.start()
            deadline_wait = threading.Event()
            while adm.queued() < 2 and not deadline_wait.wait(0.01):
                pass
            overloaded = client.get("/")
            release.set()
            for t in threads:
                t.join(10)
    assert (hopeless.status_code, hopeless.headers["x-yataxi-deadline-expired"]) == (498, "1")
    assert (overloaded.status_code, overloaded.headers["retry-after"]) == (503, "1")
    assert sorted(results) == [200, 200, 200, 200] and calls == 4
    assert counters.get("admission-shed", component="http-server", reason="queue-full") == 1


async def test_hostile_long_path_keeps_a_bounded_route_key(virtual_clock: VirtualClock) -> None:
    """A 100 000-character path is learned under a key cut to 200 characters."""
    adm = make(limit=1)
    mw = _with_path(AdmissionMiddleware(Handler(), adm))
    await mw("/" + "x" * 100_000, {})
    (key,) = adm.estimates._table
    assert key == "GET /" + "x" * 199
