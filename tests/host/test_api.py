"""The HTTP API against a real host process (uvicorn on 127.0.0.1, a random port), on a SQLite
store and on a PostgreSQL one (a fresh schema per host, dropped at the session's end)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from .conftest import QUICK, Server


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def new_db(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[], str]:
    """Makes the URL of an empty store of the parametrized kind."""
    if request.param == "sqlite":
        return lambda: f"sqlite:///{tmp_path_factory.mktemp('db')}/host.db"
    schemas = request.getfixturevalue("pg_schemas")
    url: Callable[[], str] = schemas.url
    return url


@pytest.fixture(scope="module")
def host(host_factory: Callable[..., Server], new_db: Callable[[], str]) -> Server:
    """One open host (no token) on the parametrized store, shared by this module's tests."""
    return host_factory("--db", new_db())


def test_start_run_answers_201_with_run_id_and_the_run_completes(host: Server) -> None:
    """POST /v1/workflows/{id}/runs starts a run that completes with both nodes' outputs."""
    r = host.client.post("/v1/workflows/quick/runs", json={"input": {}})
    assert r.status_code == 201
    run_id = r.json()["run_id"]
    assert r.headers["location"] == f"/v1/runs/{run_id}"
    detail = host.wait_run(run_id)
    assert detail["run"]["status"] == "completed"
    assert detail["run"]["state"] == {"a": "ok", "b": "ok"}
    assert detail["bound_fired"] is None


def test_a_join_that_proceeded_on_its_timeout_is_the_bound_that_fired(host: Server) -> None:
    """A completed run whose join gave up waiting names the synchronization bound."""
    detail = host.wait_run(host.start("fanout", {"delays": [0, 30]}))
    assert detail["run"]["status"] == "completed"
    assert detail["run"]["state"]["naps"] == [0]
    fired = detail["bound_fired"]
    assert (fired["kind"], fired["timeout_type"]) == ("join_timed_out", "synchronization")
    assert fired["at_epoch_ms"] >= fired["deadline_at"]


def test_node_timeout_is_reported_as_the_bound_that_fired_never_early(host: Server) -> None:
    """A node that outlives its 200 ms bound fails the run; the detail names the node
    bound (one name per layer, D2.7) and its detection is not before the stored deadline."""
    detail = host.wait_run(host.start("bounded", {"sleep_s": 30}))
    assert detail["run"]["status"] == "failed"
    fired = detail["bound_fired"]
    assert fired["timeout_type"] == "node"
    assert fired["node_id"] == "a"
    assert fired["timeout_duration_ms"] == 200
    assert fired["at_epoch_ms"] >= fired["deadline_at"]
    (bar,) = detail["timeline"]["tokens"]
    assert bar["status"] == "timed_out"
    assert bar["timeout"]["timeout_type"] == "node"


def test_deadline_ms_bounds_the_run_as_a_workflow_timeout(host: Server) -> None:
    """A run started with deadline_ms 150 times out at that bound, before the node's own."""
    detail = host.wait_run(host.start("quick", {"sleep_s": 30}, deadline_ms=150))
    run = detail["run"]
    assert run["status"] == "timed_out"
    # The 150 ms count from the request, so the run (started a moment later) has at most that.
    assert run["timeout_at"] == run["inherited_deadline_at"]
    assert run["timeout_at"] - run["started_at"] <= 150
    assert detail["bound_fired"]["timeout_type"] == "workflow"
    assert detail["bound_fired"]["at_epoch_ms"] >= run["timeout_at"]


def test_cancel_ends_a_running_run_and_a_second_cancel_is_409(host: Server) -> None:
    """POST /v1/runs/{id}/cancel cancels; cancelling an ended run is a 409 problem."""
    run_id = host.start("quick", {"sleep_s": 30})
    r = host.client.post(f"/v1/runs/{run_id}/cancel")
    assert r.status_code == 200
    assert host.wait_run(run_id)["run"]["status"] == "cancelled"
    again = host.client.post(f"/v1/runs/{run_id}/cancel")
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    assert "already ended (cancelled)" in again.json()["detail"]


def test_runs_are_paged_with_a_cursor_newest_first(
    host_factory: Callable[..., Server], new_db: Callable[[], str]
) -> None:
    """Sixty runs come back as pages of fifty then ten, with no run twice or missing."""
    server = host_factory("--db", new_db())
    started = {server.start("quick", {}) for _ in range(60)}
    first = server.client.get("/v1/runs").json()
    assert len(first["runs"]) == 50
    second = server.client.get("/v1/runs", params={"cursor": first["next_cursor"]}).json()
    assert len(second["runs"]) == 10
    assert second["next_cursor"] is None
    seen = [r["id"] for r in first["runs"] + second["runs"]]
    assert set(seen) == started and len(seen) == 60
    keys = [(r["started_at"], r["id"]) for r in first["runs"] + second["runs"]]
    assert keys == sorted(keys, reverse=True)


def test_runs_filter_by_status_and_definition(host: Server) -> None:
    """?status= and ?definition= keep only the matching runs."""
    host.wait_run(host.start("bounded", {"sleep_s": 30}))
    failed = host.client.get("/v1/runs", params={"status": "failed"}).json()["runs"]
    assert failed and all(r["status"] == "failed" for r in failed)
    quick = host.client.get("/v1/runs", params={"definition": "quick"}).json()["runs"]
    assert all(r["definition_id"] == "quick" for r in quick)


def test_events_as_json_list_the_runs_history_in_order(host: Server) -> None:
    """GET /v1/runs/{id}/events lists run_started first and run_completed last."""
    run_id = host.start("quick", {})
    host.wait_run(run_id)
    kinds = [e["kind"] for e in host.client.get(f"/v1/runs/{run_id}/events").json()["events"]]
    assert kinds[0] == "run_started" and kinds[-1] == "run_completed"


def test_events_as_server_sent_events_end_with_the_run(host: Server) -> None:
    """With Accept: text/event-stream the events arrive as SSE, numbered, then an end event."""
    run_id = host.start("quick", {"sleep_s": 0.3})
    headers = {"Accept": "text/event-stream"}
    with host.client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    blocks = [b for b in text.split("\n\n") if b]
    assert blocks[0].startswith("id: 1\nevent: run_started\n")
    assert blocks[-1] == "event: end\ndata: {}"
    assert "event: run_completed" in blocks[-2]


def test_sse_resumes_after_last_event_id(host: Server) -> None:
    """Last-Event-ID: N skips the first N events."""
    run_id = host.start("quick", {})
    host.wait_run(run_id)
    headers = {"Accept": "text/event-stream", "Last-Event-ID": "2"}
    text = host.client.get(f"/v1/runs/{run_id}/events", headers=headers).text
    assert text.startswith("id: 3\n")


def test_definitions_list_and_put_register_a_new_definition(host: Server) -> None:
    """PUT /v1/definitions/{id} registers a valid definition that runs can then start."""
    listed = host.client.get("/v1/definitions").json()["definitions"]
    assert {d["id"] for d in listed} >= {"quick", "bounded"}
    body = {**QUICK, "id": "copy"}
    r = host.client.put("/v1/definitions/copy", json=body)
    assert r.status_code == 201
    assert host.wait_run(host.start("copy", {}))["run"]["status"] == "completed"


def test_put_invalid_definition_names_the_path(host: Server) -> None:
    """A definition with a bad node timeout is a 422 problem whose detail names the field."""
    body = json.loads(json.dumps({**QUICK, "id": "bad"}))
    body["nodes"][1]["timeout_ms"] = -5
    r = host.client.put("/v1/definitions/bad", json=body)
    assert r.status_code == 422
    problem = r.json()
    assert problem["path"] == "nodes[1].timeout_ms"
    assert "nodes[1].timeout_ms" in problem["detail"]


def test_put_definition_whose_id_differs_from_the_path_is_refused(host: Server) -> None:
    """The body's id must be the path's id."""
    r = host.client.put("/v1/definitions/other", json=QUICK)
    assert r.status_code == 422
    assert "'quick' is not the path's 'other'" in r.json()["detail"]


def test_openapi_lists_every_route(host: Server) -> None:
    """/openapi.json documents the fixed routes."""
    doc = host.client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    assert set(doc["paths"]) >= {
        "/v1/workflows/{definition_id}/runs",
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/cancel",
        "/v1/definitions",
        "/v1/definitions/{definition_id}",
    }


def test_health_and_readiness(host: Server) -> None:
    """/healthz and /readyz answer 200 while the store is reachable."""
    assert host.client.get("/healthz").json() == {"status": "ok"}
    assert host.client.get("/readyz").json() == {"status": "ready"}


def test_metrics_expose_runs_by_state_and_request_counts(host: Server) -> None:
    """/metrics is Prometheus text with runs by state and the host's request counter."""
    host.wait_run(host.start("quick", {}))
    text = host.client.get("/metrics").text
    assert 'timebound_workflow_runs{state="completed"}' in text
    assert "timebound_host_requests_total{" in text
    assert 'route="/v1/workflows/{definition_id}/runs",status="201"' in text


def test_an_expired_caller_deadline_is_answered_498_without_running(host: Server) -> None:
    """X-YaTaxi-Client-TimeoutMs: 0 bounds the call: 498 and no run is started (D8.3)."""
    before = len(host.client.get("/v1/runs", params={"definition": "bounded"}).json()["runs"])
    r = host.client.post(
        "/v1/workflows/bounded/runs",
        json={"input": {}},
        headers={"X-YaTaxi-Client-TimeoutMs": "0"},
    )
    assert r.status_code == 498
    assert r.headers["x-yataxi-deadline-expired"] == "1"
    after = len(host.client.get("/v1/runs", params={"definition": "bounded"}).json()["runs"])
    assert after == before


def test_an_sse_stream_ends_at_the_callers_deadline(host: Server) -> None:
    """A follower that gives the call 1.5 s gets the stream cut at its deadline, not hung.

    (300 ms was spent before the first event on a loaded machine: the host answered 498.)
    """
    run_id = host.start("quick", {"sleep_s": 30})
    headers = {"Accept": "text/event-stream", "X-YaTaxi-Client-TimeoutMs": "1500"}
    with host.client.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as r:
        text = "".join(r.iter_text())
    assert "event: run_started" in text
    assert "event: end" not in text
    assert text.endswith("event: deadline\ndata: {}\n\n")
    host.client.post(f"/v1/runs/{run_id}/cancel")
