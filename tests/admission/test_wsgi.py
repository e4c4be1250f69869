"""AdmissionMiddleware for WSGI (D9) under a real threaded werkzeug server."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import httpx

from timebound.admission import Admission, AdmissionConfig, FixedLimit
from timebound.propagation.wsgi import AdmissionMiddleware
from timebound.telemetry import counters

from ..propagation.http.conftest import ServerThread


class Blocking:
    """A WSGI app whose calls hold until ``release`` is set; counts calls and starts."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Semaphore(0)
        self.release = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        self.calls += 1
        self.started.release()
        self.release.wait(10)
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]


def make(limit: int, **config: Any) -> Admission:
    return Admission(FixedLimit(limit), AdmissionConfig(**config))


def test_werkzeug_answers_hopeless_request_498_without_running_it() -> None:
    """A budget below the route's estimate is answered 498 + marker at once (D9.1)."""
    app = Blocking()
    adm = make(2)
    adm.estimates.observe("GET /slow", 5.0)
    with ServerThread(AdmissionMiddleware(app, adm), kind="wsgi") as srv:
        r = httpx.get(srv.url + "/slow", headers={"X-YaTaxi-Client-TimeoutMs": "1000"}, timeout=10)
    assert (r.status_code, r.headers["x-yataxi-deadline-expired"], app.calls) == (498, "1", 0)


def test_werkzeug_sheds_overload_with_503_and_serves_the_rest() -> None:
    """A burst past limit + queue gets 503 + Retry-After; admitted and queued ones are served."""
    app = Blocking()
    adm = make(2, max_queue=2, interval=10.0, target=5.0)
    results: list[int] = []
    lock = threading.Lock()
    with ServerThread(AdmissionMiddleware(app, adm), kind="wsgi") as srv:

        def one() -> None:
            status = httpx.get(srv.url + "/", timeout=10).status_code
            with lock:
                results.append(status)

        threads = [threading.Thread(target=one) for _ in range(4)]
        for t in threads[:2]:
            t.start()
        assert app.started.acquire(timeout=5) and app.started.acquire(timeout=5)
        for t in threads[2:]:
            t.start()
        waited = threading.Event()
        while adm.queued() < 2 and not waited.wait(0.01):
            pass
        shed = httpx.get(srv.url + "/", timeout=10)
        app.release.set()
        for t in threads:
            t.join(10)
    assert (shed.status_code, shed.headers["retry-after"]) == (503, "1")
    assert sorted(results) == [200] * 4 and app.calls == 4
    assert counters.get("admission-shed", component="http-server", reason="queue-full") == 1


def test_werkzeug_gives_the_slot_back_when_the_response_is_closed() -> None:
    """Once every response is closed by the server, nothing is in flight."""
    app = Blocking()
    app.release.set()
    adm = make(1)
    with ServerThread(AdmissionMiddleware(app, adm), kind="wsgi") as srv:
        statuses = [httpx.get(srv.url + "/", timeout=10).status_code for _ in range(3)]
        # The server closes the iterable just after the client has the body: wait for it.
        waited = threading.Event()
        for _ in range(500):
            if adm.inflight == 0 or waited.wait(0.01):
                break
    assert statuses == [200] * 3 and adm.inflight == 0
