"""Starting a run over the HTTP API of a real host: idempotency keys and the caller's bound
(D6.17, D6.18), on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from .conftest import Server


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def host(
    request: pytest.FixtureRequest,
    host_factory: Callable[..., Server],
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """One open host (no token) on the parametrized store, shared by this module's tests."""
    if request.param == "sqlite":
        return host_factory("--db", f"sqlite:///{tmp_path_factory.mktemp('db')}/host.db")
    return host_factory("--db", request.getfixturevalue("pg_schemas").url())


def test_the_caller_deadline_is_the_bound_that_fired(host: Server) -> None:
    """deadline_ms 150 under a 60 s definition: 'Bound that fired' names at most 150 ms set by
    the caller, not the definition's 60,000 ms."""
    detail = host.wait_run(host.start("quick", {"sleep_s": 30}, deadline_ms=150))
    fired = detail["bound_fired"]
    assert fired["timeout_type"] == "workflow"
    assert fired["timeout_duration_ms"] <= 150
    assert fired["bound_set_by"] == "caller"
    assert detail["run"]["timeout_bound"]["set_by"] == "caller"


def test_an_idempotency_key_header_returns_the_same_run(host: Server) -> None:
    """Two POSTs with one Idempotency-Key and one body answer one run id; the body's field
    works the same."""
    headers = {"Idempotency-Key": "req-42"}
    body = {"input": {"sleep_s": 0}}
    a = host.client.post("/v1/workflows/quick/runs", json=body, headers=headers)
    b = host.client.post("/v1/workflows/quick/runs", json=body, headers=headers)
    c = host.client.post("/v1/workflows/quick/runs", json={**body, "idempotency_key": "req-42"})
    assert a.status_code == b.status_code == c.status_code == 201, (a.text, b.text, c.text)
    assert a.json()["run_id"] == b.json()["run_id"] == c.json()["run_id"]


def test_another_body_under_the_same_key_is_a_409_problem(host: Server) -> None:
    """The same key with another input is a 409 problem naming the run that holds the key."""
    headers = {"Idempotency-Key": "req-43"}
    first = host.client.post("/v1/workflows/quick/runs", json={"input": {}}, headers=headers)
    other = host.client.post(
        "/v1/workflows/quick/runs", json={"input": {"sleep_s": 1}}, headers=headers
    )
    assert first.status_code == 201
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"
    problem = other.json()
    assert problem["code"] == "workflow-start-conflict"
    assert problem["run_id"] == first.json()["run_id"]


@pytest.mark.parametrize("key", ["", "two words", "x" * 201])
def test_a_bad_idempotency_key_is_a_422_problem(host: Server, key: str) -> None:
    """An empty, spaced or overlong key is a 422 problem naming idempotency_key."""
    r = host.client.post("/v1/workflows/quick/runs", json={"input": {}, "idempotency_key": key})
    assert r.status_code == 422
    assert "idempotency_key" in r.json()["detail"]
