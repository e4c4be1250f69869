"""The worst-case time check of workflow definitions (D14.6)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

pytest.importorskip("jsonschema")

from timebound.analysis import check_workflow
from timebound.workflow import DefinitionError, parse_definition

BASE: dict[str, Any] = {
    "id": "crawl",
    "timeout_ms": 60_000,
    "initial_node": "start",
    "actions": [
        {
            "id": "fetch",
            "kind": "python",
            "implementation": {"handler": "fetch"},
            "execution": {"timeout_ms": 10_000},
        },
        {"id": "noop", "kind": "python", "implementation": {"handler": "noop"}},
    ],
    "nodes": [
        {"id": "start", "action_id": "noop"},
        {"id": "page", "action_id": "fetch"},
        {"id": "report", "action_id": "noop"},
    ],
    "transitions": [
        {"id": "fan", "from": "start", "to": "page", "spawn_count": 3},
        {
            "id": "join",
            "from": "page",
            "to": "report",
            "synchronization": {"strategy": "all", "sibling_group": "fan"},
        },
    ],
}


def definition(**changes: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    for path, value in changes.items():
        target: Any = d
        *parts, last = path.split("__")
        for part in parts:
            target = target[int(part)] if part.isdigit() else target[part]
        target[int(last) if last.isdigit() else last] = value
    return d


def findings(d: dict[str, Any], code: str, budget: Any = None) -> list[Any]:
    return [f for f in check_workflow(d, budget=budget, file="wf.json").findings if f.code == code]


def test_t010_a_node_timeout_above_the_workflow_timeout() -> None:
    """A 90 s node in a 60 s workflow never times out itself: at the node's timeout_ms."""
    (f,) = findings(definition(nodes__0__timeout_ms=90_000), "TB-T010")
    assert str(f.where) == "wf.json: $.nodes[0].timeout_ms"
    assert (f.numbers["timeout"], f.numbers["budget"]) == (90.0, 60.0)


def test_t010_a_tie_goes_to_the_workflow() -> None:
    """A node timeout equal to the workflow timeout never fires (D6.4)."""
    assert findings(definition(nodes__0__timeout_ms=60_000), "TB-T010")


def test_t010_points_at_the_action_when_the_node_inherits_its_timeout() -> None:
    """The page node's timeout is its action's: the finding points there."""
    (f,) = findings(definition(timeout_ms=5_000), "TB-T010")
    assert f.where.path == "$.actions[0].execution.timeout_ms"


def test_t010_under_the_default_and_the_callers_budget() -> None:
    """Without timeout_ms the one-hour default bounds the run; a caller's budget may be shorter."""
    d = definition(nodes__0__timeout_ms=4_000_000)
    del d["timeout_ms"]
    (f,) = findings(d, "TB-T010")
    assert "the default workflow timeout" in f.message
    (g,) = findings(definition(), "TB-T010", budget="5s")
    assert "the caller's budget" in g.message and g.subject == "node page"


def test_t010_not_below_the_workflow_timeout() -> None:
    """Node timeouts below the run's bound fire."""
    assert findings(definition(), "TB-T010") == []


def test_t011_an_explicit_join_timeout_the_workflow_always_cuts() -> None:
    """A 60 s join timeout in a 60 s workflow never fires."""
    d = definition(transitions__1__synchronization__timeout_ms=60_000)
    (f,) = findings(d, "TB-T011")
    assert f.where.path == "$.transitions[1].synchronization.timeout_ms"
    assert findings(definition(transitions__1__synchronization__timeout_ms=59_999), "TB-T011") == []


def test_t011_a_computed_default_the_workflow_always_cuts() -> None:
    """10 s x 5 x 1.5 = 75 s, above the 60 s workflow: the default never fires."""
    (f,) = findings(definition(transitions__0__spawn_count=5), "TB-T011")
    assert "maxActionTimeout 10s (node page) x spawnCount 5 x 1.5" in f.message


def test_t013_the_default_with_its_inputs_from_the_engines_function() -> None:
    """The default join timeout is shown with maxActionTimeout and spawnCount, as the engine
    computes it."""
    d = definition()
    (f,) = findings(d, "TB-T013")
    parsed = parse_definition(d)
    join = parsed.transitions["join"]
    assert f.numbers["default"] == parsed.sync_timeout_ms(join, 3) / 1000 == 45.0
    assert (f.numbers["max_action_timeout"], f.numbers["spawn_count"]) == (10.0, 3)
    assert f.to_json()["numbers"] == {
        "max_action_timeout_ms": 10_000.0,
        "spawn_count": 3,
        "default_ms": 45_000.0,
    }
    assert "TB-T011" not in check_workflow(d).codes()


def test_t013_the_cap_with_nothing_to_compute_from() -> None:
    """A branch without timeouts gets the 30 min cap."""
    d = definition()
    del d["actions"][0]["execution"]
    (f,) = findings(d, "TB-T013")
    assert f.numbers["default"] == 1800.0 and "the cap" in f.message


def test_t012_a_foreach_default_that_large_fan_outs_push_past_the_workflow() -> None:
    """For a foreach the fan-out size is unknown: 10 s x n x 1.5 reaches 60 s from n = 4."""
    d = definition(
        transitions__0={"id": "fan", "from": "start", "to": "page", "foreach": "input.items"}
    )
    (f,) = findings(d, "TB-T012")
    assert f.numbers["spawn_count"] == 4 and f.severity == "warning"
    parsed = parse_definition(d)
    join = parsed.transitions["join"]
    assert parsed.sync_timeout_ms(join, 4) >= 60_000 > parsed.sync_timeout_ms(join, 3)


def test_t012_not_when_even_the_cap_fits() -> None:
    """Under a 2 h workflow even the 30 min cap fires first."""
    d = definition(
        timeout_ms=7_200_000,
        transitions__0={"id": "fan", "from": "start", "to": "page", "foreach": "input.items"},
    )
    assert findings(d, "TB-T012") == []


def test_t002_on_timeout_retries_past_the_workflow_timeout() -> None:
    """on_timeout: retry with 8 retries of 10 s: attempt 7 would start at 60 s."""
    d = definition(
        nodes__1={"id": "page", "action_id": "fetch", "on_timeout": "retry", "max_retries": 8}
    )
    (f,) = findings(d, "TB-T002")
    assert (f.numbers["attempt"], f.numbers["attempts"]) == (7, 9)
    assert f.where.path == "$.nodes[1].max_retries"
    d["nodes"][1]["max_retries"] = 5
    assert findings(d, "TB-T002") == []


def test_t001_a_retry_block_whose_waits_pass_the_workflow_timeout() -> None:
    """Exponential waits from 20 s capped at max_delay_ms (30 s): 20 + 30 s leave 10 s of the
    60 s workflow, too little for the next 30 s wait: attempt 4 never starts."""
    block = {"max_attempts": 5, "delay_ms": 20_000, "backoff": "exponential"}
    (f,) = findings(definition(nodes__1__retry=block), "TB-T001")
    assert f.numbers["attempt"] == 4 and f.where.path == "$.nodes[1].retry"
    assert f.numbers["delays"] == 80.0
    assert f.fix is not None and "max_attempts to 3" in f.fix
    block["max_attempts"] = 3
    assert findings(definition(nodes__1__retry=block), "TB-T001") == []


def test_a_refused_definition_is_the_engines_error() -> None:
    """A definition the engine refuses raises its DefinitionError, with the path."""
    with pytest.raises(DefinitionError) as info:
        check_workflow(definition(nodes__1__action_id="nope"))
    assert info.value.path == "nodes[1].action_id"


def test_hostile_nesting_and_numbers() -> None:
    """Deep nesting and out-of-range numbers are the engine's clear errors."""
    deep = json.dumps(definition(nodes__0__x=json.loads("[" * 100 + "]" * 100)))
    with pytest.raises(DefinitionError):
        check_workflow(deep + "\n")
    with pytest.raises(DefinitionError):
        check_workflow(definition(timeout_ms=10**400))


@pytest.mark.parametrize("workflow_ms", [3_500, 4_000, 4_001])
async def test_t002_matches_the_engine(virtual_clock: Any, tmp_path: Any, workflow_ms: int) -> None:
    """The engine on virtual time begins exactly the attempts the check says can start: attempt
    k at (k - 1) x 1 s, none at or after the workflow timeout (a tie goes to the workflow)."""
    import asyncio

    from timebound import workflow as wf

    async def hang(ctx: wf.ActionContext) -> None:
        await asyncio.sleep(3600)

    d = {
        "id": "w",
        "timeout_ms": workflow_ms,
        "initial_node": "A",
        "actions": [{"id": "h", "kind": "python", "implementation": {"handler": "hang"}}],
        "nodes": [
            {
                "id": "A",
                "action_id": "h",
                "timeout_ms": 1_000,
                "on_timeout": "retry",
                "max_retries": 8,
            }
        ],
    }
    (f,) = findings(d, "TB-T002")
    engine = wf.Engine(db=f"sqlite:///{tmp_path}/runs.db", actions={"hang": hang})
    engine.register(d)
    async with engine:
        run_id = await engine.start("w")
        result = await engine.wait(run_id)
        (token,) = await engine.tokens(run_id)
    assert result.status == "timed_out"
    assert token["attempt"] == f.numbers["attempt"] - 1


def test_t030_a_node_retried_on_timeout() -> None:
    """A node retried on timeout: attempts x timeout, bounded by the run."""
    d = definition(
        nodes__1={"id": "page", "action_id": "fetch", "on_timeout": "retry", "max_retries": 2}
    )
    (f,) = findings(d, "TB-T030")
    assert (f.numbers["worst_case"], f.numbers["attempts"]) == (30.0, 3)
    assert f.where.path == "$.nodes[1]"


def test_t013_not_for_a_join_with_its_own_timeout() -> None:
    """A join that sets timeout_ms has no computed default to show."""
    d = definition(transitions__1__synchronization__timeout_ms=30_000)
    assert findings(d, "TB-T013") == []


def test_a_yaml_file_by_its_suffix_and_content(tmp_path: Any) -> None:
    """A .yaml definition is told by its initial_node and read by the engine's YAML reader."""
    pytest.importorskip("yaml")
    from timebound.analysis import check_time

    path = tmp_path / "flow.yaml"
    path.write_text(
        "id: w\ntimeout_ms: 1000\ninitial_node: a\n"
        "actions:\n  - {id: x, kind: python, implementation: {handler: x}}\n"
        "nodes:\n  - {id: a, action_id: x, timeout_ms: 5000}\n"
    )
    report = check_time(path)
    assert report.kind == "workflow" and report.codes() == ["TB-T010"]
    assert str(report.findings[0].where) == f"{path}: $.nodes[0].timeout_ms"
