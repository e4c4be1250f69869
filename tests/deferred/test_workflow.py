"""A workflow node of kind ``deferred``: it suspends on the operation and resumes exactly once.

A real uvicorn server runs the slow service; the engine's own registry (on the engine's store,
SQLite or PostgreSQL) polls it through an HttpConnector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.propagation.http.conftest import ServerThread
from timebound import workflow as wf
from timebound.deferred import HostPolicy, HttpConnector

from .test_http import Served

pytestmark = pytest.mark.asyncio_real


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    s = Served(tmp_path)
    asyncio.run(s.registry.open())  # SQLite: the store is not bound to a loop
    with ServerThread(s.app) as srv:
        yield s, srv.url
    s.release.set()
    asyncio.run(s.registry.close())


def _definition(timeout_ms: int = 60_000) -> dict[str, Any]:
    return {
        "id": "report",
        "initial_node": "A",
        "actions": [{"id": "render", "kind": "deferred",
                     "implementation": {"handler": "start_render", "module": "svc"}}],
        "nodes": [{"id": "A", "action_id": "render", "timeout_ms": timeout_ms}],
    }  # fmt: skip


async def _suspended(engine: wf.Engine, run_id: str) -> tuple[dict[str, Any], Any]:
    """The run's token once it is suspended on its operation, and that operation (waited
    for, not guessed: a loaded machine takes longer than any fixed pause)."""
    for _ in range(3000):
        (token,) = await engine.tokens(run_id)
        ops = await engine.deferred_registry.operations()
        if token["child_run_id"] is not None and ops:
            (op,) = ops
            return token, op
        await asyncio.sleep(0.01)
    raise AssertionError(f"the node never suspended: {token!r}")


def _engine(store_url: str, url: str, kind: str, body: Any) -> wf.Engine:
    async def start_render(ctx: Any) -> Any:
        async with httpx.AsyncClient(base_url=url) as client:
            r = await client.post(f"/v1/operations/{kind}", json=body)
            return r.json()

    return wf.Engine(
        db=store_url,
        actions={"start_render": start_render},
        deferred_policy=HostPolicy(jitter=False),
        deferred_connectors={"svc": HttpConnector(url)},
    )


async def test_a_deferred_node_resumes_once_with_the_result(
    served: tuple[Served, str], store_url: str
) -> None:
    """The node suspends, the operation completes, the node's output is the result."""
    s, url = served
    engine = _engine(store_url, url, "report.render", {"pages": 4})
    engine.register(_definition())
    async with engine:
        run_id = await engine.start("report", {})
        token, _ = await _suspended(engine, run_id)
        s.release.set()
        result = await engine.wait(run_id, timeout=30)
        ops = await engine.deferred_registry.operations()
    assert token["status"] == "executing" and token["child_run_id"].startswith("deferred:")
    assert result == wf.RunResult("completed", {"A": {"pages": 4, "title": "done"}}, None)
    assert len(ops) == 1 and ops[0].resumed_ms is not None


async def test_a_failed_operation_fails_the_node(
    served: tuple[Served, str], store_url: str
) -> None:
    """A terminal failure fails the token with a deferred-operation diagnostic."""
    _, url = served
    engine = _engine(store_url, url, "broken.job", {})
    engine.register(_definition())
    async with engine:
        run_id = await engine.start("report", {})
        result = await engine.wait(run_id, timeout=30)
    assert result.status == "failed"
    assert result.error is not None and "deferred-operation" in result.error


async def test_the_node_deadline_bounds_the_lifetime(
    served: tuple[Served, str], store_url: str
) -> None:
    """A 5 s node timeout bounds the operation's 120 s lifetime (D7.7)."""
    _, url = served
    engine = _engine(store_url, url, "report.render", {"pages": 1})
    engine.register(_definition(timeout_ms=5_000))
    async with engine:
        run_id = await engine.start("report", {})
        _, op = await _suspended(engine, run_id)
        await engine.cancel(run_id)
    assert op.expires_ms - op.created_ms <= 5_000


async def test_a_broken_acceptance_is_a_contract_violation(
    served: tuple[Served, str], store_url: str
) -> None:
    """A handler answering something that is not deferred-operation.v1 fails the node."""
    _, url = served
    engine = wf.Engine(
        db=store_url,
        actions={"start_render": lambda ctx: {"status": "deferred"}},
        deferred_connectors={"svc": HttpConnector(url)},
    )
    engine.register(_definition())
    async with engine:
        run_id = await engine.start("report", {})
        result = await engine.wait(run_id, timeout=30)
    assert result.status == "failed"
    assert result.error is not None and "contract-violation" in result.error


async def test_reject_as_failure_fails_the_run_and_polls_nothing(
    served: tuple[Served, str], store_url: str
) -> None:
    """deferred_response_mode reject-as-failure: the run fails, no operation is registered."""
    _, url = served
    engine = _engine(store_url, url, "report.render", {"pages": 1})
    engine.register({**_definition(), "deferred_response_mode": "reject-as-failure"})
    async with engine:
        run_id = await engine.start("report", {})
        result = await engine.wait(run_id, timeout=30)
        ops = await engine.deferred_registry.operations()
    assert result == wf.RunResult("failed", None, "deferred-not-accepted")
    assert ops == []


def test_an_unknown_response_mode_is_refused() -> None:
    """deferred_response_mode takes one of its two values."""
    with pytest.raises(wf.DefinitionError, match="deferred_response_mode"):
        wf.Engine(db="sqlite:///unused.db").register(
            {**_definition(), "deferred_response_mode": "maybe"}
        )
