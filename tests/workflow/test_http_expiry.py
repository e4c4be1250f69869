"""An http_request node whose service answers 498 with X-YaTaxi-Deadline-Expired, against a real
uvicorn server: the node times out with the propagated bound, and nothing retries it (D4.5,
D6.17)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.propagation.http.conftest import ServerThread
from timebound import workflow as wf

from .test_http_action import App

pytestmark = pytest.mark.asyncio_real


@pytest.fixture
def server() -> Iterator[tuple[App, str]]:
    app = App()
    with ServerThread(app) as srv:
        yield app, srv.url


def _definition(url: str, **node: Any) -> dict[str, Any]:
    return {
        "id": "http",
        "initial_node": "A",
        "actions": [{"id": "call", "kind": "http_request",
                     "implementation": {"method": "POST", "url": url}}],
        "nodes": [{"id": "A", "action_id": "call", "timeout_ms": 20_000, **node}],
    }  # fmt: skip


async def _run(tmp_path: Path, d: dict[str, Any]) -> tuple[wf.RunResult, list[Any], Any]:
    engine = wf.Engine(db=f"sqlite:///{tmp_path}/runs.db")
    engine.register(d)
    async with engine:
        run_id = await engine.start("http", {"q": 1})
        result = await asyncio.wait_for(engine.wait(run_id), 30)
        return result, await engine.events(run_id), await engine.tokens(run_id)


async def test_an_expired_answer_times_the_node_out_with_the_propagated_bound(
    server, tmp_path
) -> None:
    """498 + the expiry marker to a request that carried the node's whole budget: the token
    ends timed_out, its event names the propagated bound and the budget sent."""
    app, url = server
    result, events, tokens = await _run(tmp_path, _definition(url + "/marked"))
    (event,) = [e for e in events if e["kind"] == "token_timed_out"]
    assert [t["status"] for t in tokens] == ["timed_out"]
    assert (event["timeout_type"], event["bound_set_by"]) == ("node", "propagated")
    (sent,) = app.headers
    assert event["timeout_duration_ms"] == int(sent)
    assert event["policy_applied"] == "fail"
    assert result.status == "failed" and "timed out" in (result.error or "")


async def test_an_expired_answer_is_not_retried_by_the_retry_block(server, tmp_path) -> None:
    """The node's retry block (3 attempts) does not send the request again: one call only."""
    app, url = server
    d = _definition(url + "/marked", retry={"max_attempts": 3, "delay_ms": 10})
    result, events, _ = await _run(tmp_path, d)
    assert len(app.bodies) == 1
    assert not [e for e in events if e["kind"] == "token_retry_scheduled"]
    assert result.status == "failed"


async def test_an_expired_answer_is_not_retried_by_on_timeout_retry(server, tmp_path) -> None:
    """on_timeout: retry does not resend either: the whole chain is out of time."""
    app, url = server
    result, _, _ = await _run(tmp_path, _definition(url + "/marked", on_timeout="retry"))
    assert len(app.bodies) == 1 and result.status == "failed"
