"""workflow_call: node > action > child timeouts, opt-in inheritance, cancellation (D6.7)."""

from __future__ import annotations

import asyncio
from typing import Any

from timebound import workflow as wf

from .test_engine import HANDLERS, by_kind, definition


def child(timeout_ms: int | None = 600_000) -> dict[str, Any]:
    return definition([{"id": "X"}], id="child", timeout_ms=timeout_ms)


def parent(node: dict[str, Any], action_timeout: int | None = None, **top: Any) -> dict[str, Any]:
    d = definition([{"id": "P", "action_id": "call", **node}], **top)
    action: dict[str, Any] = {
        "id": "call", "kind": "workflow_call", "implementation": {"workflow_def_id": "child"}
    }  # fmt: skip
    if action_timeout is not None:
        action["execution"] = {"timeout_ms": action_timeout}
    d["actions"].append(action)
    return d


async def _run(engine: wf.Engine, input: Any) -> tuple[wf.RunResult, dict[str, Any], list[Any]]:
    run_id = await engine.start("wf", input)
    result = await engine.wait(run_id)
    (tok,) = await engine.tokens(run_id)
    child_row = await engine.get_run(tok["child_run_id"])
    return result, child_row, await engine.events(run_id)


async def test_child_output_is_the_parent_node_output(virtual_clock, make_engine) -> None:
    """A completed child run's state becomes the parent node's output."""
    async with make_engine(HANDLERS, child(), parent({})) as engine:
        result, child_row, _ = await _run(engine, {"X": 2})
    assert result.output == {"P": {"X": {"node": "X", "branch": None}}}
    assert child_row["status"] == "completed" and child_row["input"] == {"X": 2}


async def test_node_timeout_bounds_the_child(virtual_clock, make_engine) -> None:
    """Node timeout > child definition: the child times out and the parent token is timed_out."""
    async with make_engine(HANDLERS, child(), parent({"timeout_ms": 1000})) as engine:
        result, child_row, events = await _run(engine, {"X": 60})
    assert child_row["timeout_at"] - child_row["started_at"] == 1000
    assert child_row["status"] == "timed_out"
    assert result.status == "failed" and "timed out after 1000ms" in (result.error or "")
    (event,) = by_kind(events, "token_timed_out")
    assert event["timeout_type"] == "node"


async def test_subworkflow_timeout_message_names_the_child(virtual_clock, make_engine) -> None:
    """The parent token's error says which subworkflow timed out and after how long."""
    async with make_engine(HANDLERS, child(), parent({"timeout_ms": 1000})) as engine:
        run_id = await engine.start("wf", {"X": 60})
        await engine.wait(run_id)
        (tok,) = await engine.tokens(run_id)
    assert tok["error"] == "Subworkflow 'child' timed out after 1000ms"


async def test_action_timeout_applies_when_the_node_has_none(virtual_clock, make_engine) -> None:
    """Action timeout > child definition."""
    async with make_engine(HANDLERS, child(), parent({}, action_timeout=2000)) as engine:
        _, child_row, _ = await _run(engine, {"X": 60})
    assert child_row["timeout_at"] - child_row["started_at"] == 2000


async def test_child_definition_timeout_applies_last(virtual_clock, make_engine) -> None:
    """Without node or action timeouts the child's own definition timeout applies."""
    async with make_engine(HANDLERS, child(3000), parent({})) as engine:
        _, child_row, _ = await _run(engine, {"X": 60})
    assert child_row["timeout_at"] - child_row["started_at"] == 3000


async def test_child_does_not_inherit_parent_time_by_default(virtual_clock, make_engine) -> None:
    """The child keeps its own timeout even when the parent run has less time left."""
    async with make_engine(HANDLERS, child(600_000), parent({}, timeout_ms=5000)) as engine:
        result, child_row, _ = await _run(engine, {"X": 60})
    assert child_row["timeout_at"] - child_row["started_at"] == 600_000
    assert result.status == "timed_out" and child_row["status"] == "cancelled"


async def test_inherit_deadline_opts_in(virtual_clock, make_engine) -> None:
    """inherit_deadline: true bounds the child by the parent run's deadline."""
    d = parent({"inherit_deadline": True}, timeout_ms=5000)
    async with make_engine(HANDLERS, child(600_000), d) as engine:
        run_id = await engine.start("wf", {"X": 60})
        await asyncio.sleep(1)
        (tok,) = await engine.tokens(run_id)
        child_row = await engine.get_run(tok["child_run_id"])
        parent_row = await engine.get_run(run_id)
        result = await engine.wait(run_id)
    assert child_row["timeout_at"] == parent_row["timeout_at"]
    assert result.status == "timed_out"  # the parent's own timeout wins the tie (D6.4)


async def test_cancelling_the_parent_cancels_the_child(virtual_clock, make_engine) -> None:
    """A cancelled parent run cancels its running child run."""
    async with make_engine(HANDLERS, child(), parent({})) as engine:
        run_id = await engine.start("wf", {"X": 60})
        await asyncio.sleep(1)
        await engine.cancel(run_id)
        (tok,) = await engine.tokens(run_id)
        child_row = await engine.get_run(tok["child_run_id"])
    assert child_row["status"] == "cancelled"


async def test_child_workflow_timeout_fail_propagates(virtual_clock, make_engine) -> None:
    """A child whose on_timeout is fail reports 'Workflow exceeded timeout' to the parent token."""
    c = definition([{"id": "X"}], id="child", timeout_ms=1000, on_timeout="fail")
    async with make_engine(HANDLERS, c, parent({})) as engine:
        result, child_row, _ = await _run(engine, {"X": 60})
    assert child_row["status"] == "failed" and child_row["error"] == "Workflow exceeded timeout"
    assert result.status == "failed" and "Subworkflow 'child'" in (result.error or "")


async def test_retry_on_subworkflow_timeout_starts_a_new_child(virtual_clock, make_engine) -> None:
    """on_timeout: retry on a workflow_call node runs the child again."""
    d = parent({"timeout_ms": 1000, "on_timeout": "retry", "max_retries": 1})
    async with make_engine(HANDLERS, child(), d) as engine:
        run_id = await engine.start("wf", {"X": 60})
        result = await engine.wait(run_id)
        events = by_kind(await engine.events(run_id), "token_timed_out")
    assert result.status == "failed"
    assert [e["policy_applied"] for e in events] == ["retry", "fail"]


async def test_unregistered_child_fails_the_node(virtual_clock, make_engine) -> None:
    """A workflow_call to a definition the engine lacks fails the node, naming it."""
    async with make_engine(HANDLERS, parent({})) as engine:
        run_id = await engine.start("wf", {})
        result = await engine.wait(run_id)
    assert result.status == "failed" and "'child' is not registered" in (result.error or "")
