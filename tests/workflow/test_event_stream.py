"""One event stream: the durable engines emit their events to the listeners after commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import timebound as tb
from tests.deferred.conftest import operation_doc, status_doc
from timebound import workflow as wf
from timebound._store import open_store
from timebound.deferred import HostPolicy, Registry
from timebound.policies import Policy
from timebound.telemetry import (
    Event,
    add_listener,
    correlation,
    emit,
    stored_operation_events,
    stored_run_events,
)

from .test_engine import HANDLERS, definition


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Every event emitted during the test."""
    seen: list[Event] = []
    remove = add_listener(seen.append)
    try:
        yield seen
    finally:
        remove()


async def slow(ctx: wf.ActionContext) -> Any:
    await asyncio.sleep(10)
    return {"done": True}


async def quick(ctx: wf.ActionContext) -> Any:
    return {"node": ctx.node_id}


def _definition(timeout_ms: int | None = None) -> dict[str, Any]:
    node: dict[str, Any] = {"id": "A", "action_id": "act"}
    if timeout_ms is not None:
        node["timeout_ms"] = timeout_ms
    return {
        "id": "wf",
        "initial_node": "A",
        "actions": [{"id": "act", "kind": "python", "implementation": {"handler": "act"}}],
        "nodes": [node],
    }


async def _heard(events: list[Event], name: str) -> None:
    """Wait until a listener heard ``name``: the engine emits right after its commit returns, and
    on PostgreSQL wait() (reading on another connection) may return a moment before that."""
    for _ in range(1000):
        if any(e.name == name for e in events):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{name} never emitted: {[e.name for e in events]}")


def test_a_policy_event_carries_both_instants_and_its_bound(events: list[Event]) -> None:
    """An emitted event has the monotonic and the epoch instant; a DeadlineExceeded is its bound."""
    error = tb.DeadlineExceeded(source="attempt", timeout=0.25)
    emit("attempt.end", attempt=1, outcome="timeout", error=error)
    emit("call.start")
    assert events[0].bound is error and events[0].bound.source == "attempt"
    assert events[0].epoch_ms is not None and isinstance(events[0].at, float)
    assert events[1].bound is None and events[1].kind == "call"


async def test_a_workflow_run_emits_its_events_with_run_token_and_node(
    virtual_clock: Any, make_engine: Any, events: list[Event]
) -> None:
    """Each stored event of a run reaches the listeners, named workflow.<kind>, with its ids."""
    async with make_engine({"act": quick}, _definition()) as engine:
        with correlation("request", "req-1"):
            run_id = await engine.start("wf", {})
        await engine.wait(run_id)
        await _heard(events, "workflow.run_completed")
        stored = await engine.events(run_id)
    mine = [e for e in events if e.kind == "workflow"]
    assert [e.name for e in mine] == [f"workflow.{e['kind']}" for e in stored]
    assert all(e.correlation["run"] == run_id for e in mine)
    assert [e.epoch_ms for e in mine] == [e["at_epoch_ms"] for e in stored]
    executing = next(e for e in mine if e.name == "workflow.token_executing")
    assert executing.correlation["node"] == "A" and executing.correlation["token"]
    assert mine[-1].name == "workflow.run_completed"


async def test_an_event_inside_a_handler_names_its_run_token_and_node(
    virtual_clock: Any, make_engine: Any, events: list[Event]
) -> None:
    """What a handler emits belongs to its run, token and node (and not to the request that
    started the run: the attempt runs in the worker loop's task); a node id as long as a
    definition allows (200 characters, past what correlation() takes from callers) runs like
    any other (it once failed the attempt's task and stranded the run)."""
    node_id = "n" * 200

    async def act(ctx: wf.ActionContext) -> Any:
        emit("call.start")
        return None

    d = {**_definition(), "initial_node": node_id, "nodes": [{"id": node_id, "action_id": "act"}]}
    async with make_engine({"act": act}, d) as engine:
        with correlation("request", "req-1"):
            run_id = await engine.start("wf", {})
            result = await engine.wait(run_id, timeout=60)
        stored = await engine.events(run_id)
    assert result.status == "completed"
    (call,) = [e for e in events if e.name == "call.start"]
    token_id = next(e["token_id"] for e in stored if e["kind"] == "token_executing")
    assert dict(call.correlation) == {
        "run": run_id,
        "token": token_id,
        "node": node_id,
    }


async def test_a_node_timeout_event_carries_the_node_bound(
    virtual_clock: Any, make_engine: Any, events: list[Event]
) -> None:
    """token_timed_out carries the bound as a DeadlineExceeded: source node, length, instant."""
    async with make_engine({"act": slow}, _definition(timeout_ms=2000)) as engine:
        run_id = await engine.start("wf", {})
        result = await engine.wait(run_id)
        await _heard(events, "workflow.run_failed")
    assert result.status == "failed"
    timed_outs = [e for e in events if e.name == "workflow.token_timed_out"]
    assert len(timed_outs) == 1, [e.name for e in events]
    timed_out = timed_outs[0]
    assert timed_out.bound is not None
    assert timed_out.bound.source == "node" and timed_out.bound.timeout == 2.0
    assert timed_out.bound.deadline is not None
    assert timed_out.bound.set_by == "node A"  # D2.8
    assert timed_out.correlation["node"] == "A"


@pytest.mark.parametrize(
    ("where", "source", "set_by"),
    [("action", "node", "action act"), ("definition", "workflow", "definition wf")],
)
async def test_a_stored_bound_says_where_it_was_set(
    virtual_clock: Any, make_engine: Any, events: list[Event], where: str, source: str, set_by: str
) -> None:
    """The action's timeout and the definition's: the event stores the kind and the id of what
    set the bound (bound_set_by, bound_set_by_id) and its DeadlineExceeded says both (D2.8)."""
    d = _definition()
    if where == "action":
        d["actions"][0]["execution"] = {"timeout_ms": 1500}
    else:
        d["timeout_ms"] = 1500
    async with make_engine({"act": slow}, d) as engine:
        run_id = await engine.start("wf", {})
        await engine.wait(run_id)
        await _heard(events, "workflow.token_timed_out")
        (stored,) = [e for e in await engine.events(run_id) if e["kind"] == "token_timed_out"]
    (timed_out,) = [e for e in events if e.name == "workflow.token_timed_out"]
    assert (stored["bound_set_by"], stored["bound_set_by_id"]) == tuple(set_by.split())
    assert timed_out.bound is not None
    assert (timed_out.bound.source, timed_out.bound.set_by) == (source, set_by)
    assert timed_out.bound.timeout == 1.5


async def test_a_rolled_back_transaction_emits_nothing(
    tmp_path: Path, virtual_clock: Any, events: list[Event]
) -> None:
    """An event appended in a transaction that rolls back never reaches a listener."""
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    await store.open()
    try:
        with pytest.raises(RuntimeError, match="undo"):
            async with store.transaction() as tx:
                await tx.append_event("r1", "run_started", 1000, workflow_run_id="r1")
                raise RuntimeError("undo")
        assert events == []
        async with store.transaction() as tx:
            await tx.append_event("r2", "run_started", 2000, workflow_run_id="r2")
            assert events == []  # not before the commit
        assert [(e.name, e.correlation["run"], e.epoch_ms) for e in events] == [
            ("workflow.run_started", "r2", 2000)
        ]
    finally:
        await store.close()


async def test_deferred_history_reaches_the_listeners(
    tmp_path: Path, virtual_clock: Any, events: list[Event]
) -> None:
    """Registering and completing an operation emits deferred.<status> with its operation id."""
    registry = Registry(f"sqlite:///{tmp_path / 'd.db'}", policy=HostPolicy(jitter=False))
    await registry.open()
    try:
        op = await registry.register(operation_doc(), module="svc")
        await registry.apply_status(op.id, status_doc(status="completed"))
    finally:
        await registry.close()
    mine = [e for e in events if e.kind == "deferred"]
    assert [e.name for e in mine] == ["deferred.pending", "deferred.completed"]
    assert {e.correlation["operation"] for e in mine} == {op.id}


async def test_an_expired_operation_names_who_set_its_lifetime(
    tmp_path: Path, virtual_clock: Any, events: list[Event]
) -> None:
    """The lifetime's origin is stored with the operation (expires_set_by) and its expiry's
    bound carries it with the lifetime's length and instant (D2.8)."""
    registry = Registry(
        f"sqlite:///{tmp_path / 'd.db'}", policy=HostPolicy(jitter=False, max_ttl=600)
    )
    await registry.open()
    try:
        by_connector = await registry.register(operation_doc("deferred:a.b:c", ttl_s=30))
        by_action = await registry.register(
            operation_doc("deferred:a.b:d", ttl_s=30), action_max_ttl=20
        )
        virtual_clock.advance(31)
        assert await registry.expire_due() == 2
    finally:
        await registry.close()
    assert (by_connector.expires_set_by, by_action.expires_set_by) == ("connector", "action")
    assert by_connector.describe()["expires_set_by"] == "connector"
    expired = {e.correlation["operation"]: e.bound for e in events if e.name == "deferred.expired"}
    connector, action = expired["deferred:a.b:c"], expired["deferred:a.b:d"]
    assert connector is not None and action is not None
    assert (connector.source, connector.set_by, connector.timeout) == (
        "deferred",
        "connector",
        30.0,
    )
    assert (action.set_by, action.timeout) == ("action", 20.0)
    assert action.deadline == tb.Deadline.from_epoch_ms(by_action.expires_ms)


async def test_events_inside_a_node_attempt_name_its_run_token_and_node(
    virtual_clock: Any, make_engine: Any, events: list[Event]
) -> None:
    """What a node's action emits (its policies' events) carries the run, token and node ids."""

    async def probing(ctx: wf.ActionContext) -> Any:
        emit("probe")
        return {}

    async with make_engine({"act": probing}, _definition()) as engine:
        run_id = await engine.start("wf", {})
        await engine.wait(run_id)
        (token,) = await engine.tokens(run_id)
    (probe,) = [e for e in events if e.name == "probe"]
    assert probe.correlation["run"] == run_id
    assert probe.correlation["token"] == token["id"] and probe.correlation["node"] == "A"


def test_a_policy_observer_gets_the_same_record(virtual_clock: Any) -> None:
    """An observer= receives events with both instants and the bound, as listeners do."""
    seen: list[Event] = []

    def late() -> str:
        virtual_clock.advance(5)
        return "late"

    Policy("Observed", timeout=1, on_error="skip").execute_sync(late, observer=seen.append)
    (end,) = [e for e in seen if e.name == "attempt.end"]
    assert end.bound is not None and end.bound.source == "attempt" and end.epoch_ms is not None


# The stored read-back (D10.9): what a page draws from the store is what a listener heard. -----


def _record(event: Event) -> tuple[Any, ...]:
    """Everything an event says but its monotonic instant (a read-back places it by its stored
    epoch instant); attributes as stored, JSON, which is what the live ones are written as."""
    bound = event.bound
    said = None
    if bound is not None:
        deadline = None if bound.deadline is None else bound.deadline.to_epoch_ms()
        tree = None if bound.breakdown is None else bound.breakdown.to_dict()
        said = (bound.source, bound.timeout, deadline, bound.set_by, str(bound), tree)
    attrs = json.loads(json.dumps(dict(event.attrs)))
    return (event.name, attrs, dict(event.correlation), event.epoch_ms, said)


async def test_a_runs_stored_events_read_back_as_the_events_its_listeners_heard(
    virtual_clock: Any, make_engine: Any, events: list[Event]
) -> None:
    """A run with a completed node, a node timeout retried, another cut by the run's timeout
    (each with its bound and breakdown): its stored rows, read back as events, are the live
    stream, field by field."""
    d = definition(
        [{"id": "A"}, {"id": "B", "timeout_ms": 1000, "on_timeout": "retry"}],
        [{"id": "t", "from": "A", "to": "B"}],
        timeout_ms=3500,
    )
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 0.1, "B": 60})
        result = await engine.wait(run_id)
        await _heard(events, "workflow.run_timed_out")
        stored = await engine.events(run_id)
    assert result.status == "timed_out"
    live = [e for e in events if e.kind == "workflow" and e.correlation.get("run") == run_id]
    read_back = stored_run_events(run_id, stored)
    assert len(read_back) == len(stored)
    assert [_record(e) for e in read_back] == [_record(e) for e in live]
    sources = [e.bound.source for e in read_back if e.bound is not None]
    assert sources.count("node") >= 2 and sources[-1] == "workflow", sources


async def test_an_operations_stored_history_reads_back_as_its_events(
    tmp_path: Path, virtual_clock: Any, events: list[Event]
) -> None:
    """Registered, a status applied, expired: the history rows with the operation's stored
    lifetime read back as the live events, the expiry's bound and breakdown included."""
    registry = Registry(
        f"sqlite:///{tmp_path / 'd.db'}", policy=HostPolicy(jitter=False, max_ttl=600)
    )
    await registry.open()
    try:
        op = await registry.register(operation_doc("deferred:a.b:c", ttl_s=30), action_max_ttl=20)
        virtual_clock.advance(5)
        await registry.apply_status(op.id, status_doc(status="running"))
        virtual_clock.advance(16)
        assert await registry.expire_due() == 1
        history = await registry.history(op.id)
        row = await registry.get(op.id)
    finally:
        await registry.close()
    assert row is not None
    lifetime = {
        "created_ms": row.created_ms,
        "expires_ms": row.expires_ms,
        "expires_set_by": row.expires_set_by,
    }
    live = [e for e in events if e.kind == "deferred"]
    read_back = stored_operation_events(op.id, history, lifetime)
    names = [e.name for e in read_back]
    assert names[0] == "deferred.pending" and names[-1] == "deferred.expired", names
    assert len(names) == 3, names  # registered, the status applied, expired
    assert [_record(e) for e in read_back] == [_record(e) for e in live]
    expired = read_back[-1].bound
    assert expired is not None and (expired.source, expired.timeout, expired.set_by) == (
        "deferred",
        20.0,
        "action",
    )
