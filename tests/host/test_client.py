"""timebound.host.Client and AsyncClient against a real host (D8.15), on SQLite and PostgreSQL:
calls checked against the served OpenAPI document, idempotent starts, waiting and streaming,
the deadline sent to the host, and problem documents as typed errors."""

from __future__ import annotations

import asyncio
import math
import pickle
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, get_type_hints

import httpx
import pytest

import timebound
from timebound.host import (
    AsyncClient,
    Client,
    HostConflict,
    HostNotFound,
    HostRejected,
    HostUnauthorized,
)
from timebound.host._wire import Operation, Run, RunDetail, calls

from .conftest import Server
from .test_deferred_ops import OP_ID, _plant


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def host(
    request: pytest.FixtureRequest,
    host_factory: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """One open host on the parametrized store, shared by this module's tests."""
    if request.param == "sqlite":
        return host_factory("--db", f"sqlite:///{tmp_path_factory.mktemp('db')}/host.db")
    return host_factory("--db", request.getfixturevalue("pg_schemas").url())


@pytest.fixture
def client(host: Server) -> Iterator[Client]:
    with Client(host.url) as c:
        yield c


def _every_call() -> list[Any]:
    return [
        calls.start("quick", {}, deadline=1.5, idempotency_key="k", run_id="r"),
        calls.list_runs("running", "quick", "c"),
        calls.get_run("r"),
        calls.events("r"),
        calls.follow("r", 3),
        calls.cancel_run("r"),
        calls.retry_run("r", "why", "a", False, "ann"),
        calls.retry_run("r", "why", None, True, None),
        calls.terminate_run("r", "why", "ann"),
        calls.extend_run("r", "5min", "why", "a", "ann"),
        calls.definitions(),
        calls.put_definition({"id": "quick"}),
        calls.operations("pending", "reports", "c"),
        calls.operation("o"),
        calls.poll("o"),
        calls.cancel_operation("o"),
    ]


def test_every_call_is_one_the_served_openapi_document_describes(host: Server) -> None:
    """Each call's route and method, query parameters, body fields and headers are in the
    host's /openapi.json (the client cannot drift from the API)."""
    document = host.client.get("/openapi.json").json()
    for call in _every_call():
        operation = document["paths"][call.route][call.method.lower()]
        params = operation.get("parameters", [])
        query = {p["name"] for p in params if p["in"] == "query"}
        headers = {p["name"].lower() for p in params if p["in"] == "header"}
        assert set(call.query) <= query, (call.route, call.query)
        for name in call.headers:
            # Accept and Last-Event-ID are the event stream's, which the summary describes.
            described = name.lower() in headers or name in operation["summary"]
            assert described or name == "Accept", (call.route, name)
        if call.body is not None:
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            if "properties" in schema:
                assert set(call.body) <= set(schema["properties"]), (call.route, call.body)


def test_the_typed_shapes_match_real_answers(host: Server, client: Client) -> None:
    """Run and RunDetail name exactly the keys a real host answers."""
    run_id = client.start("quick", {})
    detail = client.wait(run_id)
    assert set(detail) == set(get_type_hints(RunDetail))
    listed = client.runs()["runs"][0]
    required = {k for k in Run.__required_keys__}
    assert set(listed) == required
    assert required <= set(detail["run"])


def test_start_and_wait(client: Client) -> None:
    """A start answers its run id; wait returns the ended run's detail."""
    run_id = client.start("quick", {"sleep_s": 0})
    detail = client.wait(run_id)
    assert detail["run"]["id"] == run_id
    assert detail["run"]["status"] == "completed"


def test_a_repeated_idempotency_key_returns_the_same_run(client: Client) -> None:
    """The same key and body answer one run; another body under it is a HostConflict with the
    problem's code and the run that holds the key."""
    a = client.start("quick", {"n": 1}, idempotency_key="client-key-1")
    b = client.start("quick", {"n": 1}, idempotency_key="client-key-1")
    assert a == b
    with pytest.raises(HostConflict) as caught:
        client.start("quick", {"n": 2}, idempotency_key="client-key-1")
    assert caught.value.code == "workflow-start-conflict"
    assert caught.value.run_id == a
    assert isinstance(caught.value, timebound.TimeboundError)


def test_a_client_chosen_run_id(client: Client) -> None:
    """start(run_id=) makes the run under that id, once."""
    run_id = f"mine-{id(client)}"
    assert client.start("quick", {}, run_id=run_id) == run_id
    assert client.start("quick", {}, run_id=run_id) == run_id
    assert client.wait(run_id)["run"]["id"] == run_id


class _LoseFirstAnswer(httpx.BaseTransport):
    """Sends every request to the host, but loses the first start's answer (a ReadError)."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.starts = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/runs") and request.method == "POST":
            self.starts += 1
            if self.starts == 1:
                response.read()
                response.close()
                raise httpx.ReadError("connection reset", request=request)
        return response


def test_a_start_whose_answer_was_lost_starts_one_run(host: Server) -> None:
    """The first answer is lost after the host started the run: the client asks again under
    the same idempotency key and gets the same run; the store holds one run with that input."""
    transport = _LoseFirstAnswer()
    marker = {"lost-answer": id(transport)}
    with Client(host.url, transport=transport) as c:
        run_id = c.start("quick", marker)
        assert transport.starts == 2
        c.wait(run_id)
        runs = [r for r in c.runs(definition="quick")["runs"] if c.get(r["id"])["run"]["input"]]
    assert [r["id"] for r in runs if c_input(host, r["id"]) == marker] == [run_id]


def c_input(host: Server, run_id: str) -> Any:
    return host.client.get(f"/v1/runs/{run_id}").json()["run"]["input"]


def test_the_callers_deadline_goes_to_the_host() -> None:
    """Every call carries its budget in X-YaTaxi-Client-TimeoutMs: the client's own timeout
    (30 s), or less under the caller's fail_after."""
    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("x-yataxi-client-timeoutms"))
        return httpx.Response(200, json={"runs": [], "next_cursor": None})

    with Client("http://host.invalid", transport=httpx.MockTransport(answer)) as c:
        c.runs()
        with timebound.fail_after(20):
            c.runs()
    assert seen[0] == "30000"
    assert seen[1] is not None and 0 < int(seen[1]) <= 20_000


def test_wait_past_the_deadline_raises_deadline_exceeded(client: Client) -> None:
    """Waiting for a 30 s run under a short deadline raises DeadlineExceeded; the run goes on."""
    run_id = client.start("quick", {"sleep_s": 30})
    with pytest.raises(timebound.DeadlineExceeded), timebound.fail_after(2):
        client.wait(run_id)
    assert client.get(run_id)["run"]["status"] == "running"
    client.cancel(run_id)


def test_follow_streams_events_until_the_run_ends(client: Client) -> None:
    """follow yields numbered events from the first to the run's end."""
    run_id = client.start("quick", {"sleep_s": 0.2})
    followed = list(client.follow(run_id))
    assert [e["seq"] for e in followed] == list(range(1, len(followed) + 1))
    assert followed[-1]["kind"] == "run_completed"
    assert [(e["seq"], e["kind"]) for e in client.events(run_id)] == [
        (e["seq"], e["kind"]) for e in followed
    ]
    # Resumed after an event: only the later ones.
    assert [e["seq"] for e in client.follow(run_id, after=2)] == [e["seq"] for e in followed[2:]]


def test_cancel_and_cancel_again(client: Client) -> None:
    """A running run is cancelled; cancelling it again is a HostConflict (409)."""
    run_id = client.start("quick", {"sleep_s": 30})
    assert client.cancel(run_id)["status"] == "cancelled"
    with pytest.raises(HostConflict) as caught:
        client.cancel(run_id)
    assert caught.value.status == 409 and caught.value.code == "conflict"
    assert client.wait(run_id)["run"]["status"] == "cancelled"


def test_problem_documents_become_typed_errors(client: Client) -> None:
    """404 is HostNotFound (a LookupError), an invalid start HostRejected naming the field;
    both keep the problem's status and detail, and pickle as themselves."""
    with pytest.raises(HostNotFound) as missing:
        client.get("no-such-run")
    assert missing.value.code == "not-found" and "no-such-run" in missing.value.detail
    assert isinstance(missing.value, LookupError)
    with pytest.raises(HostRejected) as rejected:
        client.start("quick", {}, run_id="has spaces")
    assert rejected.value.status == 422 and "run_id" in rejected.value.detail
    assert isinstance(rejected.value, timebound.InvalidInput)
    copy = pickle.loads(pickle.dumps(rejected.value))
    assert type(copy) is HostRejected and copy.problem == rejected.value.problem


def test_a_wrong_token_is_host_unauthorized(host_factory: Callable[..., Server]) -> None:
    """A secured host refuses a missing or wrong token with HostUnauthorized; the right one
    works."""
    secured = host_factory(token="right-token-of-16-chars")
    with Client(secured.url, token="wrong") as c, pytest.raises(HostUnauthorized) as caught:
        c.runs()
    assert caught.value.status == 401
    with Client(secured.url, token="right-token-of-16-chars") as c:
        assert c.runs()["runs"] == []


def test_the_async_client(host: Server) -> None:
    """AsyncClient starts, follows, waits and raises the same typed errors."""

    async def main() -> None:
        async with AsyncClient(host.url) as c:
            run_id = await c.start("quick", {"sleep_s": 0.1}, idempotency_key="async-1")
            assert await c.start("quick", {"sleep_s": 0.1}, idempotency_key="async-1") == run_id
            kinds = [e["kind"] async for e in c.follow(run_id)]
            assert kinds[-1] == "run_completed"
            assert (await c.wait(run_id))["run"]["status"] == "completed"
            with pytest.raises(HostNotFound):
                await c.operation("no-such-op")
            slow = await c.start("quick", {"sleep_s": 30})
            with pytest.raises(timebound.DeadlineExceeded):
                async with asyncio.timeout(20):
                    with timebound.fail_after(2):
                        await c.wait(slow)
            await c.cancel(slow)

    asyncio.run(main())


@pytest.fixture(scope="module")
def with_ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from .conftest import launch, stop

    tmp = tmp_path_factory.mktemp("ops")
    asyncio.run(_plant(f"sqlite:///{tmp}/host.db"))
    server = launch(tmp)
    yield server
    stop(server)


def test_deferred_operations(with_ops: Server) -> None:
    """operations/operation list and show the planted operation with the typed keys; poll and
    cancel: poll without a connector for its module is a HostConflict saying so; cancel is
    answered by the status surface; unknown ids are HostNotFound."""
    with Client(with_ops.url) as c:
        (op,) = c.operations()["operations"]
        assert set(op) == set(get_type_hints(Operation))
        assert op["operation/id"] == OP_ID
        assert c.operations(status="completed")["operations"] == []
        assert c.operation(OP_ID)["operation"]["status"] == "pending"
        with pytest.raises(HostConflict) as caught:
            c.poll(OP_ID)
        assert "no connector" in caught.value.detail
        with pytest.raises(HostRejected):
            c.operations(status="sleeping")
        document = c.cancel_operation(OP_ID)
        assert document["operation/id"] == OP_ID, document
        with pytest.raises(HostNotFound):
            c.cancel_operation("no-such-op")


def test_a_null_run_id_and_two_different_keys_are_refused(host: Server) -> None:
    """run_id null is a 422 naming run_id (it was taken as absent: schemathesis ST201); a body
    key that differs from the header is a 409 with its code (a schema-valid body: ST202)."""
    path = "/v1/workflows/quick/runs"
    null = host.client.post(path, json={"input": None, "run_id": None})
    assert null.status_code == 422 and null.json()["detail"].startswith("run_id:")
    two = host.client.post(
        path, json={"input": None, "idempotency_key": "a"}, headers={"Idempotency-Key": "b"}
    )
    assert two.status_code == 409 and two.json()["code"] == "idempotency-key-mismatch"


def test_a_stream_the_host_ends_at_the_deadline_raises_only_once_it_has_passed() -> None:
    """The host ends the stream at the deadline by its clock ('event: deadline'), which may be a
    moment before ours: DeadlineExceeded is raised only once our deadline has passed, never
    early (it was raised at once)."""

    def answer(request: httpx.Request) -> httpx.Response:
        body = b"id: 1\nevent: run_started\ndata: {}\n\nevent: deadline\ndata: {}\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    left: list[float | None] = []
    with Client("http://host.invalid", transport=httpx.MockTransport(answer)) as c:
        with timebound.move_on_after(0.3):
            try:
                for _ in c.follow("r"):
                    pass
            except timebound.DeadlineExceeded:
                left.append(timebound.remaining())
                raise
    assert left == [0.0]


def test_terminate_then_retry(client: Client) -> None:
    """terminate fails a running run (again: HostConflict run-ended); retry runs it again from
    the failed node (a running run: run-not-failed); the store says so after each call."""
    run_id = client.start("quick", {"sleep_s": 30})
    ended = client.terminate(run_id, reason="stuck upstream", operator="ann")
    assert ended["status"] == "failed"
    run = client.wait(run_id)["run"]
    assert run["status"] == "failed" and run["error"] == "terminated by api (ann): stuck upstream"
    with pytest.raises(HostConflict) as again:
        client.terminate(run_id, reason="twice")
    assert again.value.code == "run-ended" and again.value.status == 409
    assert client.retry(run_id, reason="fixed")["from_node"] == "a"
    assert client.get(run_id)["run"]["status"] == "running"
    (retried,) = [e for e in client.events(run_id) if e["kind"] == "run_retried"]
    assert retried["data"]["reason"] == "fixed" and retried["data"]["operator"] == "api"
    with pytest.raises(HostConflict) as running:
        client.retry(run_id, reason="not failed", from_start=True)
    assert running.value.code == "run-not-failed"
    client.cancel(run_id)
    with pytest.raises(HostNotFound) as missing:
        client.retry("no-such-run", reason="r")
    assert missing.value.code == "run-not-found"


def test_extend_by_a_duration(client: Client) -> None:
    """extend(by=) takes "50s", seconds or a timedelta and moves the deadline by exactly that;
    an unknown node and an extension past the host's cap are HostConflicts with their codes."""
    run_id = client.start("quick", {"sleep_s": 30})
    before = client.get(run_id)["run"]["timeout_at"]
    answer = client.extend(run_id, by="50s", reason="slow upstream")
    assert answer["extension_used_ms"] == 50_000
    client.extend(run_id, by=1.5, reason="a bit more")
    client.extend(run_id, by=timedelta(milliseconds=1), reason="and a moment")
    assert client.get(run_id)["run"]["timeout_at"] == before + 51_501
    with pytest.raises(HostConflict) as unknown:
        client.extend(run_id, by="1s", reason="r", node="zz")
    assert unknown.value.code == "unknown-node" and unknown.value.problem["path"] == "node"
    with pytest.raises(HostConflict) as over:
        client.extend(run_id, by="2d", reason="r")  # the host's cap is one day
    assert over.value.code == "over-cap"
    assert client.get(run_id)["run"]["timeout_at"] == before + 51_501
    client.cancel(run_id)
    with pytest.raises(HostConflict) as ended:
        client.extend(run_id, by="1s", reason="r")
    assert ended.value.code == "run-ended"


@pytest.mark.parametrize("by", ["5m", "5 s", 0, -1, math.inf, math.nan, True, "1.5s"])
def test_an_invalid_extension_is_refused_before_sending(by: Any) -> None:
    """by= that is not a positive finite duration in timebound's grammar is an InvalidInput
    naming 'by', and nothing is sent; so is an empty reason or both from_node and from_start."""
    sent: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: sent.append(r) or httpx.Response(500))
    with Client("http://host.invalid", transport=transport) as c:
        with pytest.raises(timebound.InvalidInput, match="by"):
            c.extend("r", by=by, reason="r")
        with pytest.raises(timebound.InvalidInput, match="reason"):
            c.terminate("r", reason=" ")
        with pytest.raises(timebound.InvalidInput, match="from_node"):
            c.retry("r", reason="r", from_node="a", from_start=True)
    assert sent == []


def test_an_extension_is_whole_milliseconds_rounded_up() -> None:
    """A fraction of a millisecond is sent as the next whole one (never shorter than asked)."""
    assert calls.extend_run("r", 0.0001, "r", None, None).body == {"reason": "r", "by_ms": 1}
    assert calls.extend_run("r", "2min", "r", None, None).body == {"reason": "r", "by_ms": 120_000}


def test_the_async_operator_actions(host: Server) -> None:
    """AsyncClient terminates, retries and extends, with the same codes on refusal."""

    async def main() -> None:
        async with AsyncClient(host.url) as c:
            run_id = await c.start("quick", {"sleep_s": 30})
            before = (await c.get(run_id))["run"]["timeout_at"]
            await c.extend(run_id, by="10s", reason="r", operator="bo")
            assert (await c.get(run_id))["run"]["timeout_at"] == before + 10_000
            with pytest.raises(HostConflict) as running:
                await c.retry(run_id, reason="r")
            assert running.value.code == "run-not-failed"
            assert (await c.terminate(run_id, reason="r"))["status"] == "failed"
            assert (await c.get(run_id))["run"]["status"] == "failed"
            with pytest.raises(HostConflict) as ended:
                await c.extend(run_id, by="10s", reason="r")
            assert ended.value.code == "run-ended"
            assert (await c.retry(run_id, reason="r", from_start=True))["status"] == "running"
            assert (await c.get(run_id))["run"]["status"] == "running"
            await c.cancel(run_id)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("deadline", "ms"),
    [("250ms", 250), (1.5, 1500), (timedelta(seconds=2), 2000), (0.0001, 1), (None, None)],
)
def test_a_start_deadline_is_any_duration(deadline: Any, ms: int | None) -> None:
    """deadline= takes every duration form (D1.11), sent as whole ms rounded up (D1.13)."""
    body = calls.start("quick", {}, deadline=deadline, idempotency_key="k", run_id=None).body
    assert body.get("deadline_ms") == ms


def test_a_start_deadline_may_be_a_deadline(virtual_clock: Any) -> None:
    """A Deadline sends its time left; never() sends none; a spent one is refused by name."""
    body = calls.start(
        "quick", {}, deadline=timebound.Deadline.after(3), idempotency_key="k", run_id=None
    ).body
    assert body["deadline_ms"] == 3000
    never = timebound.Deadline.never()
    assert (
        "deadline_ms"
        not in calls.start("q", {}, deadline=never, idempotency_key="k", run_id=None).body
    )
    spent = timebound.Deadline.after(0)
    with pytest.raises(timebound.InvalidInput, match="deadline"):
        calls.start("q", {}, deadline=spent, idempotency_key="k", run_id=None)
    with pytest.raises(timebound.InvalidInput, match="deadline"):
        calls.start("q", {}, deadline="2 s", idempotency_key="k", run_id=None)


def test_the_client_timeout_is_a_duration() -> None:
    for client in (Client("http://host.invalid", timeout="1500ms"),):
        with client:
            assert client._http.timeout.read == 1.5
    with pytest.raises(timebound.ConfigurationError, match="timeout"):
        Client("http://host.invalid", timeout="soon")
