"""The operator's actions over HTTP (retry, terminate, extend) against a real host process on
SQLite and PostgreSQL: each records its reason and operator; refusals are problem documents."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Server, launch, stop


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A host on each store, with a 60 s extension cap."""
    args = ["--db", request.getfixturevalue("pg_url")] if request.param == "postgres" else []
    server = launch(tmp_path, *args, env={"TIMEBOUND_MAX_EXTENSION": "60"})
    yield server
    stop(server)


def _events(server: Server, run_id: str, kind: str) -> list[dict]:  # type: ignore[type-arg]
    events = server.client.get(f"/v1/runs/{run_id}/events").json()["events"]
    return [e for e in events if e["kind"] == kind]


def _until(check: Callable[[], bool]) -> None:
    for _ in range(400):
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("the condition never held")


def test_terminate_then_retry_completes_the_run(served: Server) -> None:
    """A terminated run is failed, names who and why, and a retry from its node completes it."""
    run_id = served.start("bounded", {"sleep_s": 30})
    r = served.client.post(
        f"/v1/runs/{run_id}/terminate", json={"reason": "stuck upstream", "operator": "ann"}
    )
    assert r.status_code == 200, r.text
    assert served.wait_run(run_id)["run"]["error"] == "terminated by api (ann): stuck upstream"
    again = served.client.post(f"/v1/runs/{run_id}/terminate", json={"reason": "x"})
    assert again.status_code == 409 and again.json()["code"] == "run-ended"
    # Two places to start from are refused before anything changes.
    both = {"reason": "fixed", "from_node": "a", "from_start": True}
    refused = served.client.post(f"/v1/runs/{run_id}/retry", json=both)
    assert refused.status_code == 422 and refused.json()["path"] == "from_start", refused.text
    assert served.client.get(f"/v1/runs/{run_id}").json()["run"]["status"] == "failed"
    # The retry runs node a again; it still sleeps 30 s past its 200 ms bound: it times out.
    r = served.client.post(f"/v1/runs/{run_id}/retry", json={"reason": "fixed"})
    assert r.status_code == 200 and r.json()["from_node"] == "a"
    detail = served.wait_run(run_id)
    assert detail["run"]["status"] == "failed" and detail["bound_fired"] is not None
    (retried,) = _events(served, run_id, "run_retried")
    assert retried["reason"] == "fixed" and retried["operator"] == "api"


def test_extend_a_run_within_the_cap_and_refuse_past_it(served: Server) -> None:
    """The run's deadline moves by by_ms; past max_extension the host answers 409 over-cap."""
    run_id = served.start("quick", {"sleep_s": 30})
    before = served.client.get(f"/v1/runs/{run_id}").json()["run"]["timeout_at"]
    r = served.client.post(f"/v1/runs/{run_id}/extend", json={"reason": "r", "by_ms": 50_000})
    assert r.status_code == 200, r.text
    after = served.client.get(f"/v1/runs/{run_id}").json()["run"]["timeout_at"]
    assert after == before + 50_000
    over = served.client.post(f"/v1/runs/{run_id}/extend", json={"reason": "r", "by_ms": 10_001})
    assert over.status_code == 409 and over.json()["code"] == "over-cap"
    assert over.headers["content-type"] == "application/problem+json"
    served.client.post(f"/v1/runs/{run_id}/cancel")


def test_extend_a_live_node_lets_it_finish(served: Server) -> None:
    """Node a (bounded at 200 ms) sleeping 1 s completes once its deadline is extended."""
    run_id = served.start("bounded", {"sleep_s": 1})
    _until(lambda: bool(_events(served, run_id, "token_executing")))
    r = served.client.post(
        f"/v1/runs/{run_id}/extend", json={"reason": "slow", "by_ms": 30_000, "node": "a"}
    )
    if r.status_code == 409:  # the 200 ms bound fired before the request arrived (busy machine)
        assert r.json()["code"] in ("node-not-live", "run-ended")
        return
    assert r.status_code == 200, r.text
    assert served.wait_run(run_id)["run"]["status"] == "completed"


@pytest.mark.parametrize(
    ("action", "body", "status", "code"),
    [
        ("extend", {"reason": "r"}, 422, None),
        ("extend", {"reason": "r", "by_ms": 0}, 422, None),
        ("extend", {"by_ms": 5}, 422, None),
        ("retry", {"reason": "r", "extra": 1}, 422, None),
        ("retry", {"reason": "r"}, 409, "run-not-failed"),
        ("extend", {"reason": "r", "by_ms": 5, "node": "zz"}, 409, "unknown-node"),
    ],
)
def test_bad_requests_are_problem_documents(
    host: Server,
    action: str,
    body: dict,
    status: int,
    code: str | None,  # type: ignore[type-arg]
) -> None:
    """Missing reason, bad by_ms, unknown fields and refusals answer a problem naming why."""
    run_id = host.start("quick", {"sleep_s": 30})
    r = host.client.post(f"/v1/runs/{run_id}/{action}", json=body)
    host.client.post(f"/v1/runs/{run_id}/cancel")
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    if code is not None:
        assert r.json()["code"] == code


def test_an_unknown_run_is_404(host: Server) -> None:
    """Each action on a run that does not exist answers 404."""
    for action, body in [("retry", {}), ("terminate", {}), ("extend", {"by_ms": 1})]:
        r = host.client.post(f"/v1/runs/nope/{action}", json={"reason": "r", **body})
        assert r.status_code == 404, (action, r.text)
