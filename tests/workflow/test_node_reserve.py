"""A node's reserve (D6.32): the handler sees its node deadline less ``reserve_ms`` and can still
answer after the reserve fires; the attempt itself is cut only at the node's deadline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf
from timebound.cli import main
from timebound.testing import VirtualClock

from .test_engine import by_kind


def _definition(**node: Any) -> dict[str, Any]:
    return {
        "id": "wf",
        "initial_node": "A",
        "actions": [{"id": "act", "kind": "python", "implementation": {"handler": "h"}}],
        "nodes": [{"id": "A", "action_id": "act", "timeout_ms": 1000, **node}],
        "transitions": [],
    }


async def test_the_handler_sees_the_node_deadline_less_the_reserve(
    virtual_clock: VirtualClock, make_engine: Any
) -> None:
    """Under a 1 s node with a 200 ms reserve the handler's deadline is 800 ms away."""
    seen: dict[str, Any] = {}

    async def h(ctx: wf.ActionContext) -> Any:
        seen["remaining"] = tb.remaining()
        seen["deadline"] = tb.current_deadline()
        seen["node"] = ctx.deadline
        return {"ok": True}

    async with make_engine({"h": h}, _definition(reserve_ms=200)) as engine:
        run_id = await engine.start("wf", {})
        result = await engine.wait(run_id)
    assert result.status == "completed"
    assert seen["remaining"] == pytest.approx(0.8)
    assert seen["node"].to_epoch_ms() - seen["deadline"].to_epoch_ms() == 200


async def test_a_sync_handler_sees_the_reserve_too(
    virtual_clock: VirtualClock, make_engine: Any
) -> None:
    """A sync handler (run in a worker thread) sees the same reserved deadline."""
    seen: list[float] = []

    def h(ctx: wf.ActionContext) -> Any:
        seen.append(tb.remaining())
        return None

    async with make_engine({"h": h}, _definition(reserve_ms=300)) as engine:
        result = await engine.wait(await engine.start("wf", {}))
    assert result.status == "completed"
    assert seen == [pytest.approx(0.7)]


async def test_a_handler_that_catches_the_reserve_answers_with_its_fallback(
    virtual_clock: VirtualClock, make_engine: Any
) -> None:
    """The reserve stops the handler's wait at 800 ms; its fallback is the node's output."""
    caught: list[tb.DeadlineExceeded] = []

    async def h(ctx: wf.ActionContext) -> Any:
        try:
            with tb.fail_after(None):  # any scope under the reserve catches the reserved instant
                await asyncio.sleep(10)
        except tb.DeadlineExceeded as exc:
            caught.append(exc)
            await asyncio.sleep(0.1)  # the answer takes some of the reserve
            return {"fallback": True}
        return {"fallback": False}

    async with make_engine({"h": h}, _definition(reserve_ms=200)) as engine:
        run_id = await engine.start("wf", {})
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        events = await engine.events(run_id)
    assert result.status == "completed"
    assert result.output == {"A": {"fallback": True}}
    assert not by_kind(events, "token_timed_out")
    (exc,) = caught
    assert exc.set_by == "reserve of workflow node 'A'"
    assert row["finished_at"] - row["started_at"] == 900


async def test_a_handler_that_ignores_the_reserve_is_cut_at_the_node_deadline(
    virtual_clock: VirtualClock, make_engine: Any
) -> None:
    """A handler that sleeps past its reserve is cut at 1 s, reported with the node's bound."""

    async def h(ctx: wf.ActionContext) -> Any:
        await asyncio.sleep(10)
        return {"late": True}

    async with make_engine({"h": h}, _definition(reserve_ms=200, on_timeout="fail")) as engine:
        run_id = await engine.start("wf", {})
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        events = await engine.events(run_id)
    assert result.status == "failed"
    assert row["error_code"] == "node_timeout"
    (event,) = by_kind(events, "token_timed_out")
    assert event["at_epoch_ms"] == event["deadline_at"]  # at the node's deadline, not the reserve
    assert (event["timeout_type"], event["bound_set_by"], event["timeout_duration_ms"]) == (
        "node",
        "node",
        1000,
    )


@pytest.mark.parametrize(
    ("node", "action_timeout"),
    [({"timeout_ms": 200, "reserve_ms": 200}, None), ({"reserve_ms": 500}, 300)],
)
def test_a_reserve_no_shorter_than_the_timeout_is_a_definition_error(
    node: dict[str, Any], action_timeout: int | None
) -> None:
    """The node's own timeout, or its action's, must be longer than the reserve."""
    data = _definition()
    data["nodes"][0] = {"id": "A", "action_id": "act", **node}
    if action_timeout is not None:
        data["actions"][0]["execution"] = {"timeout_ms": action_timeout}
    with pytest.raises(wf.DefinitionError) as info:
        wf.parse_definition(data)
    assert info.value.path == "nodes[0].reserve_ms"
    assert "reserve" in str(info.value) and "timeout" in str(info.value)


def test_a_reserve_on_a_non_python_action_is_a_definition_error() -> None:
    """Only a python handler can answer after its reserve fires."""
    data = _definition(reserve_ms=100)
    data["actions"][0] = {
        "id": "act",
        "kind": "http_request",
        "implementation": {"method": "GET", "url": "http://127.0.0.1:1/"},
    }
    with pytest.raises(wf.DefinitionError) as info:
        wf.parse_definition(data)
    assert info.value.path == "nodes[0].reserve_ms"
    assert "python" in str(info.value)


def test_a_negative_reserve_is_rejected_by_the_schema() -> None:
    """reserve_ms is a non-negative integer of milliseconds, like the other timeouts."""
    with pytest.raises(wf.DefinitionError) as info:
        wf.parse_definition(_definition(reserve_ms=-1))
    assert info.value.path == "nodes[0].reserve_ms"


def test_workflow_validate_names_the_reserve(tmp_path: Path, capsys: Any) -> None:
    """`timebound workflow validate` exits 1 naming the reserve's path and the two numbers."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_definition(reserve_ms=1000)))
    assert main(["workflow", "validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "nodes[0].reserve_ms" in err and "1000 ms" in err


async def test_an_actions_reserve_applies_to_its_nodes_unless_a_node_sets_its_own(
    virtual_clock: VirtualClock, make_engine: Any
) -> None:
    """execution.reserve_ms is the default of every node running the action; a node's own wins."""
    seen: dict[str, float] = {}

    async def h(ctx: wf.ActionContext) -> Any:
        seen[ctx.node_id] = tb.remaining()
        return None

    d = _definition()
    d["actions"][0]["execution"] = {"reserve_ms": 250}
    d["nodes"].append({"id": "B", "action_id": "act", "timeout_ms": 1000, "reserve_ms": 0})
    d["transitions"] = [{"id": "t", "from": "A", "to": "B"}]
    async with make_engine({"h": h}, d) as engine:
        result = await engine.wait(await engine.start("wf", {}))
    assert result.status == "completed"
    assert seen == {"A": pytest.approx(0.75), "B": pytest.approx(1.0)}


def test_an_actions_reserve_too_long_for_a_node_names_the_actions_field() -> None:
    """A reserve a node takes from its action, no shorter than its timeout, names the action's."""
    data = _definition(timeout_ms=100)
    data["actions"].insert(0, {"id": "other", "kind": "python", "implementation": {"handler": "x"}})
    data["actions"][1]["execution"] = {"reserve_ms": 100}
    with pytest.raises(wf.DefinitionError) as info:
        wf.parse_definition(data)
    assert info.value.path == "actions[1].execution.reserve_ms"
