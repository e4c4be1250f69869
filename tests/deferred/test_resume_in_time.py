"""An operation's end stored before its node's deadline resumes the node, whatever happens
between storing and resuming (D7.10), on SQLite and PostgreSQL, on virtual time."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from timebound import workflow as wf
from timebound.deferred import HostPolicy, Operation, Registry

from .conftest import operation_doc, status_doc

_ids = itertools.count()

DEFINITION = {
    "id": "report",
    "initial_node": "A",
    "actions": [{"id": "render", "kind": "deferred",
                 "implementation": {"handler": "start", "module": "svc"}}],
    "nodes": [{"id": "A", "action_id": "render", "timeout_ms": 10_000}],
}  # fmt: skip


class Completes:
    """A connector whose operations have completed by their first poll."""

    async def status(self, op: Operation) -> object:
        return status_doc(op.id, status="completed", result={"pages": 4})

    async def cancel(self, op: Operation) -> object:
        return status_doc(op.id, status="cancelled")


async def start(ctx: Any) -> Any:
    return operation_doc(f"deferred:report.render:op{next(_ids)}", retry_after=1)


def _engine(store_url: str) -> wf.Engine:
    engine = wf.Engine(
        db=store_url,
        actions={"start": start},
        deferred_policy=HostPolicy(jitter=False),
        deferred_connectors={"svc": Completes()},
    )
    engine.register(DEFINITION)
    return engine


async def _stored_end(engine: wf.Engine) -> Any:
    for _ in range(600):
        ops = await engine.deferred_registry.operations()
        if ops and ops[0].status == "completed":
            return ops[0]
        await asyncio.sleep(0.05)
    raise AssertionError("the operation never completed")


async def test_the_poller_resumes_in_the_transaction_that_stores_the_end(
    store_url: str, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nothing run after the poll's own transaction (resume_due disabled: the window a
    crash would cut), the completed operation has already resumed its node."""

    async def nothing(self: Registry, limit: int = 100) -> int:
        return 0

    monkeypatch.setattr(Registry, "resume_due", nothing)
    async with _engine(store_url) as engine:
        run_id = await engine.start("report", {})
        result = await engine.wait(run_id, timeout=60)
        (op,) = await engine.deferred_registry.operations()
    assert result == wf.RunResult("completed", {"A": {"pages": 4}}, None)
    assert op.resumed_ms is not None and op.resumed_ms == op.updated_ms


async def test_an_end_stored_in_time_survives_a_restart_past_the_deadline(
    store_url: str, clock: Any
) -> None:
    """The end is stored at 1 s but its resumption fails (the host dies before it); the next
    engine opens at 22 s, after the node's 10 s deadline: the node completes, its timer does
    not fire first."""
    first = _engine(store_url)
    async with first:

        async def dies(tx: Any, resumption: Any) -> None:
            raise RuntimeError("the host stops here")

        first.deferred_registry._resumers["timebound.workflow"] = dies
        run_id = await first.start("report", {})
        op = await _stored_end(first)
        assert op.resumed_ms is None
    await asyncio.sleep(20)  # down past the node's deadline
    async with _engine(store_url) as second:
        result = await second.wait(run_id, timeout=60)
        events = await second.events(run_id)
    assert result == wf.RunResult("completed", {"A": {"pages": 4}}, None)
    assert not [e for e in events if e["kind"] == "token_timed_out"]


async def test_a_deferred_handler_gets_the_calls_stable_key(store_url: str, clock: Any) -> None:
    """A deferred handler's ctx.idempotency_key is run, token and node (D7.11), the key its
    operation is registered under and the continuation holds."""
    seen: list[str | None] = []

    async def keyed(ctx: Any) -> Any:
        seen.append(ctx.idempotency_key)
        return await start(ctx)

    engine = wf.Engine(
        db=store_url,
        actions={"start": keyed},
        deferred_policy=HostPolicy(jitter=False),
        deferred_connectors={"svc": Completes()},
    )
    engine.register(DEFINITION)
    async with engine:
        run_id = await engine.start("report", {})
        await engine.wait(run_id, timeout=60)
        (tok,) = await engine.tokens(run_id)
        (op,) = await engine.deferred_registry.operations()
        async with engine.deferred_registry.store.transaction() as tx:
            row = await tx.fetchone("SELECT continuation FROM tb_deferred_ops WHERE id = ?", op.id)
    assert seen == [f"{run_id}:{tok['id']}:A"]
    assert json.loads(row["continuation"])["idempotency_key"] == seen[0]
