"""A policy in the HTTP clients (D3.17, D3.18): attempts, hedges, breaker, budget, hints.

Real parts: a uvicorn server recording every request it gets; httpx (sync and async), requests
and aiohttp clients built with ``policy=``. Assertions are on events, counts and ordering; the
only waits on real time are hang guards. Timing logic (a hint's wait, an attempt timeout) runs
on virtual time through an in-process transport at the end.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import pytest
import requests

import timebound as tb
from timebound import ConfigurationError
from timebound.policies import CircuitBreaker, Hedge, Policy, RetryBudget
from timebound.propagation.aiohttp import DeadlineMiddleware
from timebound.propagation.httpx import AsyncDeadlineTransport, DeadlineTransport
from timebound.propagation.requests import DeadlineAdapter
from timebound.telemetry import Event
from timebound.testing import VirtualClock

from .conftest import ServerThread

ABSOLUTE = "x-request-deadline"
TIMEOUT = "x-yataxi-client-timeoutms"


class Service:
    """An ASGI app recording each request; ``/answers/A,B,...`` answers the n-th request with
    status A, B, … (the last one repeats); ``/first-hangs`` keeps the first request until its
    client goes away (recorded) and answers the others at once; ``/first-waits`` keeps the
    first request until ``go`` is set, then sends its headers and waits for its client to go
    (recorded); ``/alternate`` answers even-numbered requests after ``slow`` seconds, the others
    at once (``active``: those being answered); ``/first-slow`` answers the first request after
    ``slow`` seconds, the others at once; ``/expired`` answers 498 "deadline expired";
    ``/slow-post`` answers after a short sleep."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hits: list[tuple[str, str, dict[str, str]]] = []
        self.disconnected = threading.Event()
        self.go = threading.Event()
        self.slow = 0.5
        self.active = 0

    def count(self, path: str) -> int:
        with self.lock:
            return sum(1 for _, p, _ in self.hits if p == path)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        with self.lock:
            n = sum(1 for _, p, _ in self.hits if p == path)
            self.hits.append((scope["method"], path, headers))
        await receive()  # the request body
        status, extra, body = 200, [], b"ok"
        if path.startswith("/answers/"):
            statuses = path.removeprefix("/answers/").split(",")
            status = int(statuses[min(n, len(statuses) - 1)])
            body = f"answer {n + 1}".encode()
            if status in (429, 503):
                extra = [(b"retry-after", headers.get("x-test-retry-after", "0").encode())]
        elif path == "/first-hangs":
            if n == 0:
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.disconnected.set()
                return
            body = b"hedge"
        elif path == "/first-waits":
            if n == 0:
                await asyncio.to_thread(self.go.wait, 30)
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"slow", "more_body": True})
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.disconnected.set()
                return
            body = b"hedge"
        elif path == "/first-slow":
            if n == 0:
                await asyncio.sleep(self.slow)
            body = b"first" if n == 0 else b"hedge"
        elif path == "/alternate":
            with self.lock:
                self.active += 1
            try:
                if n % 2 == 0:
                    await asyncio.sleep(self.slow)
                    body = b"slow"
                else:
                    body = b"fast"
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": body})
            finally:
                with self.lock:
                    self.active -= 1
            return
        elif path == "/expired":
            status, extra = 498, [(b"x-yataxi-deadline-expired", b"1")]
            body = b"Deadline expired"
        elif path == "/slow-post":
            await asyncio.sleep(0.2)
        await send({"type": "http.response.start", "status": status, "headers": extra})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def service() -> Iterator[tuple[Service, str]]:
    svc = Service()
    with ServerThread(svc) as srv:
        yield svc, srv.url


def names(events: list[Event], prefix: str) -> list[str]:
    return [e.name for e in events if e.name.startswith(prefix)]


def reasons(events: list[Event]) -> list[str]:
    return [e.attrs["reason"] for e in events if e.name == "retry.refused"]


# One request through each client kind, returning (status, body).


def _httpx_sync(url: str, policy: Policy[Any], **kw: Any) -> tuple[int, str]:
    with httpx.Client(transport=DeadlineTransport(policy=policy, **kw)) as client:
        r = client.get(url, headers=kw.pop("headers", None))
        return r.status_code, r.text


def _requests(url: str, policy: Policy[Any], **kw: Any) -> tuple[int, str]:
    with requests.Session() as session:
        session.mount("http://", DeadlineAdapter(policy=policy, **kw))
        r = session.get(url, timeout=10)
        return r.status_code, r.text


def _httpx_async(url: str, policy: Policy[Any], **kw: Any) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        async with httpx.AsyncClient(transport=AsyncDeadlineTransport(policy=policy, **kw)) as c:
            r = await c.get(url)
            return r.status_code, r.text

    return asyncio.run(go())


def _aiohttp(url: str, policy: Policy[Any], **kw: Any) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        middleware = DeadlineMiddleware(policy=policy, **kw)
        async with (
            aiohttp.ClientSession(middlewares=(middleware,)) as session,
            session.get(url) as r,
        ):
            return r.status, await r.text()

    return asyncio.run(go())


CLIENTS = {
    "httpx": _httpx_sync,
    "httpx-async": _httpx_async,
    "requests": _requests,
    "aiohttp": _aiohttp,
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_failed_answer_is_retried_and_the_next_answer_returned(
    client: str, service: tuple[Service, str], events: list[Event]
) -> None:
    svc, url = service
    policy = Policy("inventory", retry=2)
    with tb.fail_after(30):
        status, body = CLIENTS[client](f"{url}/answers/503,502,200", policy)
    assert (status, body) == (200, "answer 3")
    assert svc.count("/answers/503,502,200") == 3
    assert names(events, "attempt.start") == ["attempt.start"] * 3


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_the_last_failed_answer_is_returned_as_it_is(
    client: str, service: tuple[Service, str]
) -> None:
    """Retries exhausted on 503: the client returns the last 503, body readable."""
    svc, url = service
    with tb.fail_after(30):
        status, body = CLIENTS[client](f"{url}/answers/503", Policy("inventory", retry=1))
    assert (status, body) == (503, "answer 2")
    assert svc.count("/answers/503") == 2


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_status_outside_the_set_is_an_answer(client: str, service: tuple[Service, str]) -> None:
    svc, url = service
    policy = Policy("inventory", retry=3)
    status, _ = CLIENTS[client](f"{url}/answers/500", policy)
    assert status == 500 and svc.count("/answers/500") == 1
    status, _ = CLIENTS[client](f"{url}/answers/500,200", policy, retry_statuses={500})
    assert status == 200 and svc.count("/answers/500,200") == 2


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_retry_after_past_the_deadline_stops_with_the_existing_reason(
    client: str, service: tuple[Service, str], events: list[Event]
) -> None:
    """The 503's Retry-After of 30 s under a 5 s deadline: one attempt, the 503 returned, the
    retry refused with D3.11's reason."""
    svc, url = service
    policy = Policy("inventory", retry=3, delay="10ms")
    path = "/answers/503"

    def call() -> tuple[int, str]:
        if client == "httpx":
            with httpx.Client(transport=DeadlineTransport(policy=policy)) as c:
                r = c.get(url + path, headers={"x-test-retry-after": "30"})
                return r.status_code, r.text
        if client == "requests":
            with requests.Session() as s:
                s.mount("http://", DeadlineAdapter(policy=policy))
                r = s.get(url + path, headers={"x-test-retry-after": "30"})
                return r.status_code, r.text

        async def go() -> tuple[int, str]:
            with tb.fail_after(5):
                if client == "httpx-async":
                    async with httpx.AsyncClient(
                        transport=AsyncDeadlineTransport(policy=policy)
                    ) as c:
                        r = await c.get(url + path, headers={"x-test-retry-after": "30"})
                        return r.status_code, r.text
                async with (
                    aiohttp.ClientSession(middlewares=(DeadlineMiddleware(policy=policy),)) as s,
                    s.get(url + path, headers={"x-test-retry-after": "30"}) as r,
                ):
                    return r.status, await r.text()

        return asyncio.run(go())

    with tb.fail_after(5):
        assert call() == (503, "answer 1")
    assert svc.count(path) == 1
    assert reasons(events) == ["retry_after_past_deadline"]


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_498_caused_by_our_deadline_is_not_retried_nor_counted(
    client: str, service: tuple[Service, str], events: list[Event]
) -> None:
    """The peer answers "deadline expired" under our lowered deadline: DeadlineExceeded
    (propagated), one attempt, and a breaker that opens on one failure stays closed."""
    svc, url = service
    breaker = CircuitBreaker(min_calls=1, failure_ratio=0.5, break_for="60s")
    policy = Policy("inventory", retry=3, breaker=breaker)
    # Shorter than every client's own timeout (httpx's default is 5 s), so ours is the
    # deadline the peer saw spent.
    with pytest.raises(tb.DeadlineExceeded) as info, tb.fail_after(4):
        CLIENTS[client](f"{url}/expired", policy)
    assert info.value.source == "propagated"
    assert svc.count("/expired") == 1
    assert breaker.state == "closed"
    # The same breaker opens on one real failure: it was able to count.
    CLIENTS[client](f"{url}/answers/503", Policy("inventory", breaker=breaker))
    assert breaker.state == "open"


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_the_breaker_opens_and_fails_fast_without_touching_the_server(
    client: str, service: tuple[Service, str], events: list[Event]
) -> None:
    svc, url = service
    breaker = CircuitBreaker(min_calls=2, failure_ratio=0.5, break_for="60s")
    policy = Policy("inventory", breaker=breaker)
    for _ in range(2):
        assert CLIENTS[client](f"{url}/answers/502", policy)[0] == 502
    assert breaker.state == "open"
    assert [e.attrs["state"] for e in events if e.name == "breaker.state"] == ["open"]
    with pytest.raises(tb.CircuitOpen):
        CLIENTS[client](f"{url}/answers/502", policy)
    assert svc.count("/answers/502") == 2


def test_the_budget_caps_retries_against_a_failing_server(
    service: tuple[Service, str], events: list[Event]
) -> None:
    """retry=3 against a server that always fails: 10 calls would be 40 attempts; a budget of
    0.2 retries per call allows at most 2 retries in all."""
    svc, url = service
    policy = Policy("inventory", retry=3, retry_budget=RetryBudget(0.2, min_per_second=0))
    for _ in range(10):
        assert _httpx_async(f"{url}/answers/503", policy)[0] == 503
    retries = names(events, "retry.delay")
    assert svc.count("/answers/503") == 10 + len(retries)
    assert 1 <= len(retries) <= 2
    # Every call still had retries left when the budget stopped it.
    assert reasons(events) == ["retry_budget_exhausted"] * 10


def test_a_connection_error_is_retried(events: list[Event]) -> None:
    """Nothing listens on the port: each attempt fails to connect; the last error is raised."""
    svc = Service()
    with ServerThread(svc) as srv:
        url = srv.url
    policy = Policy("inventory", retry=2)
    with pytest.raises(httpx.ConnectError), tb.fail_after(30):
        _httpx_sync(url + "/", policy)
    assert names(events, "attempt.start") == ["attempt.start"] * 3


def test_a_callers_error_passes_through_unretried(events: list[Event]) -> None:
    """An error that says nothing about the dependency (an unsupported scheme) is raised as it
    is, after one attempt, and not counted by the breaker."""
    breaker = CircuitBreaker(min_calls=1)
    with pytest.raises(httpx.UnsupportedProtocol):
        _httpx_sync("ftp://127.0.0.1/", Policy("inventory", retry=3, breaker=breaker))
    assert names(events, "attempt.start") == ["attempt.start"]
    assert breaker.state == "closed"


# Hedging over the wire (D3.18) ---------------------------------------------------------------


@pytest.mark.asyncio_real
async def test_a_hedge_wins_on_a_slow_first_answer_and_the_loser_is_cancelled(
    service: tuple[Service, str], events: list[Event]
) -> None:
    svc, url = service
    policy = Policy("inventory", hedge=Hedge("20ms", max_extra_load=1.0))
    async with httpx.AsyncClient(transport=AsyncDeadlineTransport(policy=policy)) as client:
        with tb.fail_after(30):
            response = await client.get(f"{url}/first-hangs")
    assert (response.status_code, response.text) == (200, "hedge")
    assert names(events, "hedge.") == ["hedge.sent", "hedge.won"]
    # The loser's connection was closed: its handler saw the client go (hang guard only).
    assert await asyncio.to_thread(svc.disconnected.wait, 10)
    first, second = (h for _, p, h in svc.hits if p == "/first-hangs")
    # Both carried the caller's deadline; the hedge, sent later, has less of it left.
    assert ABSOLUTE in first and ABSOLUTE in second
    assert int(second[TIMEOUT]) <= int(first[TIMEOUT])


@pytest.mark.asyncio_real
async def test_a_post_is_never_hedged(service: tuple[Service, str], events: list[Event]) -> None:
    svc, url = service
    policy = Policy("inventory", hedge=Hedge("1ms", max_extra_load=1.0))
    transport = AsyncDeadlineTransport(policy=policy, hedge_methods={"GET", "PUT"})
    async with httpx.AsyncClient(transport=transport) as client:
        with tb.fail_after(30):
            response = await client.post(f"{url}/slow-post", content=b"order")
    assert response.status_code == 200
    assert names(events, "hedge.") == []
    assert svc.count("/slow-post") == 1


def test_hedging_follows_the_methods_marked_idempotent() -> None:
    policy = Policy("inventory", hedge="10ms")
    default = AsyncDeadlineTransport(policy=policy)._resilience
    marked = AsyncDeadlineTransport(policy=policy, hedge_methods={"get", "PUT"})._resilience
    assert default is not None and marked is not None
    assert default.policy_for("GET").hedge is not None
    for method in ("POST", "PATCH", "PUT", "DELETE"):
        assert default.policy_for(method).hedge is None
    assert marked.policy_for("PUT").hedge is not None
    assert marked.policy_for("HEAD").hedge is None
    # The unhedged twin shares the breaker, the budget and the latency window.
    budget = RetryBudget()
    both = Policy("x", hedge="10ms", retry=1, retry_budget=budget, breaker=CircuitBreaker())
    twin = both.unhedged()
    assert twin.retry_budget is budget and twin.breaker is both.breaker
    assert twin._latencies is both._latencies


# Hedging the sync clients (D3.18): the attempts race in threads ---------------------------------


def _race_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("timebound hedge race")]


@pytest.fixture
def race_threads_end() -> Iterator[None]:
    """Every sync hedging test ends with its losers ended (daemon threads of the race)."""
    yield
    for thread in _race_threads():
        thread.join(10)
    assert not _race_threads()


def _open_sockets_to(port: int) -> int:
    """This process's TCP connections to ``port`` not yet closed on our side (ESTABLISHED or
    CLOSE_WAIT), from the kernel's table: what a leaked pooled connection would hold."""
    count = 0
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if remote_port == port and fields[3] in ("01", "08"):
                count += 1
    return count


def _wait_until(check: Any, seconds: float = 10.0) -> bool:
    """Hang guard only: poll ``check`` until it holds or ``seconds`` passed."""
    gate = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if check():
            return True
        gate.wait(0.02)
    return bool(check())


class SyncHedging:
    """One sync client kind with a hedged policy: ``get``/``post`` return (status, body)."""

    def __init__(self, kind: str, policy: Policy[Any], *, connections: int = 4) -> None:
        self.kind = kind
        self.connections = connections
        if kind == "httpx":
            inner = httpx.HTTPTransport(limits=httpx.Limits(max_connections=connections))
            self.client: Any = httpx.Client(transport=DeadlineTransport(inner, policy=policy))
        else:
            self.client = requests.Session()
            adapter = DeadlineAdapter(policy=policy, pool_maxsize=connections)
            self.client.mount("http://", adapter)

    def get(self, url: str) -> tuple[int, str]:
        r = self.client.get(url, timeout=10)
        return r.status_code, r.text

    def post(self, url: str) -> tuple[int, str]:
        if self.kind == "httpx":
            r = self.client.post(url, content=b"order", timeout=10)
        else:
            r = self.client.post(url, data=b"order", timeout=10)
        return r.status_code, r.text

    def close(self) -> None:
        self.client.close()


@pytest.mark.usefixtures("race_threads_end")
@pytest.mark.parametrize("kind", ["httpx", "requests"])
def test_a_sync_hedge_wins_on_a_slow_first_answer_and_the_losers_answer_is_closed(
    kind: str, service: tuple[Service, str], events: list[Event]
) -> None:
    """The caller returns the hedge's answer while the first request is still unanswered; the
    loser, blocked reading its answer, cannot be interrupted: once the server answers, the
    answer is closed unread, so its connection goes (the server sees it) and is not pooled."""
    svc, url = service
    client = SyncHedging(kind, Policy("inventory", hedge=Hedge("50ms", max_extra_load=1.0)))
    try:
        with tb.fail_after(30):
            assert client.get(f"{url}/first-waits") == (200, "hedge")
        assert names(events, "hedge.")[0] == "hedge.sent"
        assert not svc.go.is_set()  # the caller had its answer with the first one unanswered
        svc.go.set()
        assert svc.disconnected.wait(10)  # hang guard only
        first, second = (h for _, p, h in svc.hits if p == "/first-waits")
        assert ABSOLUTE in first and ABSOLUTE in second
        with tb.fail_after(30):  # the pool still serves
            assert client.get(f"{url}/answers/200")[0] == 200
    finally:
        svc.go.set()
        client.close()


@pytest.mark.usefixtures("race_threads_end")
def test_an_httpx_hedge_that_lost_before_sending_sends_nothing(
    service: tuple[Service, str], events: list[Event]
) -> None:
    """One pooled connection: the hedge waits for it while the first request holds it, so the
    first answer wins; the hedge, cut short by the race, then gets the connection and stops at
    its first step without sending anything."""
    svc, url = service
    client = SyncHedging(
        "httpx", Policy("inventory", hedge=Hedge("20ms", max_extra_load=1.0)), connections=1
    )
    try:
        with tb.fail_after(30):
            assert client.get(f"{url}/first-slow") == (200, "first")
        assert names(events, "hedge.") == ["hedge.sent"]
        for thread in _race_threads():
            thread.join(10)  # the loser ended (hang guard only)
        assert svc.count("/first-slow") == 1
        with tb.fail_after(30):  # its slot came back: the one connection still serves
            assert client.get(f"{url}/answers/200")[0] == 200
    finally:
        client.close()


@pytest.mark.usefixtures("race_threads_end")
@pytest.mark.parametrize("kind", ["httpx", "requests"])
def test_a_sync_post_is_never_hedged(
    kind: str, service: tuple[Service, str], events: list[Event]
) -> None:
    svc, url = service
    client = SyncHedging(kind, Policy("inventory", hedge=Hedge("1ms", max_extra_load=1.0)))
    try:
        with tb.fail_after(30):
            assert client.post(f"{url}/slow-post")[0] == 200
    finally:
        client.close()
    assert names(events, "hedge.") == []
    assert svc.count("/slow-post") == 1


@pytest.mark.usefixtures("race_threads_end")
@pytest.mark.parametrize("kind", ["httpx", "requests"])
def test_fifty_sync_hedged_calls_leak_no_connection(
    kind: str, service: tuple[Service, str], events: list[Event]
) -> None:
    """Every other request is slow, so a call is won by whichever of its two attempts is fast
    and leaves a loser running; with 4 pooled connections, 50 calls leave the pool serving and
    at most 4 connections open once the losers ended."""
    svc, url = service
    port = int(url.rsplit(":", 1)[1])
    hedge = Hedge("20ms", max_extra_load=1.0, max_concurrent=100)
    client = SyncHedging(kind, Policy("inventory", hedge=hedge))
    try:
        with tb.fail_after(120):
            answers = [client.get(f"{url}/alternate") for _ in range(50)]
        # No call waited for a slow answer: each one's fast attempt found a connection (a
        # leaked loser would keep its connection, and the calls behind it would wait).
        assert answers == [(200, "fast")] * 50
        assert _wait_until(lambda: svc.active == 0)  # every loser's server side ended
        assert _wait_until(lambda: _open_sockets_to(port) <= client.connections)
        with tb.fail_after(30):  # the pool still serves
            assert client.get(f"{url}/answers/200")[0] == 200
        assert _open_sockets_to(port) <= client.connections
    finally:
        client.close()


# Refusals at construction ----------------------------------------------------------------------


def test_aiohttp_refuses_a_hedged_policy() -> None:
    """aiohttp's middleware is handed one ClientRequest, which cannot be sent twice at once."""
    with pytest.raises(ConfigurationError, match="cannot hedge") as info:
        DeadlineMiddleware(policy=Policy("inventory", hedge="10ms"))
    assert info.value.option == "policy"


@pytest.mark.parametrize(
    "build",
    [
        lambda p: DeadlineTransport(policy=p),
        lambda p: DeadlineAdapter(policy=p),
    ],
    ids=["httpx-sync", "requests"],
)
def test_a_sync_client_hedges_only_the_methods_marked_idempotent(build: Any) -> None:
    resilience = build(Policy("inventory", hedge="10ms"))._resilience
    assert resilience.policy_for("GET").hedge is not None
    for method in ("POST", "PATCH", "PUT", "DELETE"):
        assert resilience.policy_for(method).hedge is None


@pytest.mark.parametrize(
    ("kwargs", "option", "match"),
    [
        ({"policy": "retry=3"}, "policy", "must be a timebound.policies.Policy"),
        ({"policy": Policy("p", fallback=None)}, "policy", "has fallback"),
        ({"policy": Policy("p", cache=1.0)}, "policy", "has cache"),
        ({"policy": Policy("p", on_error="skip")}, "policy", "has on_error"),
        ({"hedge_methods": {"GET", "POST"}}, "hedge_methods", "only idempotent"),
        ({"hedge_methods": "GET"}, "hedge_methods", "must be a collection"),
        ({"retry_statuses": {503, 700}}, "retry_statuses", "integer 100-599"),
        ({"retry_statuses": {True}}, "retry_statuses", "integer 100-599"),
    ],
)
def test_bad_options_are_refused_naming_them(kwargs: Any, option: str, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match) as info:
        AsyncDeadlineTransport(**kwargs)
    assert info.value.option == option


# On virtual time, in-process ------------------------------------------------------------------


async def test_the_retry_waits_for_the_servers_hint(virtual_clock: VirtualClock) -> None:
    answers = iter([httpx.Response(503, headers={"Retry-After": "2"}), httpx.Response(200)])
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(virtual_clock.now())
        return next(answers)

    transport = AsyncDeadlineTransport(
        httpx.MockTransport(handler), policy=Policy("inventory", retry=1, delay="10ms")
    )
    async with httpx.AsyncClient(transport=transport) as client:
        with tb.fail_after(10):
            response = await client.get("http://inventory/")
    assert response.status_code == 200
    assert sent[1] - sent[0] >= 2.0


async def test_the_policys_attempt_timeout_cuts_a_slow_attempt_and_retries(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """An attempt timeout of the policy is the attempt's own: retryable (D2.5), and the header
    sent is that timeout, not the caller's deadline."""
    sent: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers[TIMEOUT])
        if len(sent) == 1:
            await asyncio.sleep(5)
        return httpx.Response(200)

    policy = Policy("inventory", retry=1, timeout="100ms")
    transport = AsyncDeadlineTransport(httpx.MockTransport(handler), policy=policy)
    async with httpx.AsyncClient(transport=transport) as client:
        with tb.fail_after(10):
            response = await client.get("http://inventory/")
    assert response.status_code == 200
    assert sent == ["100", "100"]
    outcomes = [e.attrs["outcome"] for e in events if e.name == "attempt.end"]
    assert outcomes == ["timeout", "ok"]


async def test_a_learned_attempt_timeout_cuts_a_stuck_attempt(
    virtual_clock: VirtualClock, events: list[Event]
) -> None:
    """timeout="p99" (D3.15) over the client: once 20 answers of 10 ms are known, an attempt
    gets the floor (50 ms, above the learned p99), is sent that budget, and a stuck one is cut
    there and retried."""
    sent: list[str | None] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get(TIMEOUT))
        await asyncio.sleep(60 if len(sent) == 21 else 0.01)
        return httpx.Response(200)

    policy = Policy("inventory", retry=1, timeout="p99", timeout_floor="50ms")
    transport = AsyncDeadlineTransport(httpx.MockTransport(handler), policy=policy)
    async with httpx.AsyncClient(transport=transport) as client:
        for _ in range(20):
            assert (await client.get("http://inventory/")).status_code == 200
        assert sent[:20] == ["5000"] * 20  # nothing learned yet: httpx's own 5 s
        t0 = virtual_clock.now()
        with tb.fail_after(10):
            response = await client.get("http://inventory/")
    assert response.status_code == 200
    assert sent[20:] == ["50", "50"]
    assert virtual_clock.now() - t0 == pytest.approx(0.06)
    outcomes = [e.attrs["outcome"] for e in events if e.name == "attempt.end"]
    assert outcomes[-2:] == ["timeout", "ok"]
