"""The engine's behaviour on virtual time, on SQLite and PostgreSQL: exact instants throughout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf


async def sleeper(ctx: wf.ActionContext) -> Any:
    """Sleep the branch item's (or input's) seconds, then return what it saw."""
    item = ctx.branch["item"] if ctx.branch and ctx.branch["item"] is not None else None
    if item == "fail":
        raise RuntimeError("this branch fails")
    seconds = item if isinstance(item, (int, float)) else ctx.input.get(ctx.node_id, 0)
    await asyncio.sleep(seconds)
    return {"node": ctx.node_id, "branch": ctx.branch["index"] if ctx.branch else None}


async def boom(ctx: wf.ActionContext) -> Any:
    raise RuntimeError(f"boom at attempt {ctx.attempt}")


HANDLERS = {"sleep": sleeper, "boom": boom}


def definition(
    nodes: list[dict[str, Any]], transitions: list[dict[str, Any]] = (), **top: Any
) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "id": top.pop("id", "wf"),
        "initial_node": nodes[0]["id"],
        "actions": [
            {"id": "sleep", "kind": "python", "implementation": {"handler": "sleep"}},
            {"id": "boom", "kind": "python", "implementation": {"handler": "boom"}},
        ],
        "nodes": [{"action_id": "sleep", **n} for n in nodes],
        "transitions": list(transitions),
        **top,
    }


def fan(spawn: int = 3, **kw: Any) -> dict[str, Any]:
    return {"id": "fan", "from": "A", "to": "B", "spawn_count": spawn, **kw}


def join(strategy: Any = "all", merge: str = "append", **sync: Any) -> dict[str, Any]:
    return {
        "id": "join",
        "from": "B",
        "to": "C",
        "synchronization": {
            "strategy": strategy,
            "sibling_group": "fan",
            "merge": {"source": "_branch.output", "target": "state.results", "strategy": merge},
            **sync,
        },
    }


def by_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind]


async def run(engine: wf.Engine, input: Any = None) -> tuple[str, wf.RunResult, dict[str, Any]]:
    run_id = await engine.start("wf", input or {})
    result = await engine.wait(run_id)
    return run_id, result, await engine.get_run(run_id)


async def test_linear_run_completes_with_state_as_output(virtual_clock, make_engine) -> None:
    """A → B completes and its output is the context's state."""
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    async with make_engine(HANDLERS, d) as engine:
        _, result, run_row = await run(engine, {"A": 1, "B": 2})
    assert result == wf.RunResult(
        "completed", {"A": {"node": "A", "branch": None}, "B": {"node": "B", "branch": None}}, None
    )
    assert run_row["finished_at"] - run_row["started_at"] == 3000


async def test_workflow_timeout_cancel_all_times_out_at_exact_instant(
    virtual_clock, make_engine
) -> None:
    """At timeout_at every live token is timed_out (workflow_timeout) and the run is timed_out."""
    d = definition([{"id": "A"}], timeout_ms=5000)
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine, {"A": 60})
        tokens = await engine.tokens(run_id)
        events = await engine.events(run_id)
    assert result.status == "timed_out" and result.error == "Workflow exceeded timeout"
    assert row["finished_at"] == row["timeout_at"] == row["started_at"] + 5000
    assert [t["status"] for t in tokens] == ["timed_out"]
    assert tokens[0]["state_data"]["reason"] == "workflow_timeout"
    (event,) = by_kind(events, "token_timed_out")
    assert event["timeout_type"] == "workflow" and event["policy_applied"] == "cancel_all"
    assert event["timeout_duration_ms"] == 5000 and event["detection_lag_ms"] == 0
    assert event["deadline_at"] == row["timeout_at"] and event["workflow_run_id"] == run_id


async def test_workflow_timeout_fail_policy_fails_the_run(virtual_clock, make_engine) -> None:
    """on_timeout: fail makes the run failed with 'Workflow exceeded timeout'."""
    d = definition([{"id": "A"}], timeout_ms=5000, on_timeout="fail")
    async with make_engine(HANDLERS, d) as engine:
        _, result, _ = await run(engine, {"A": 60})
    assert (result.status, result.error) == ("failed", "Workflow exceeded timeout")


async def test_workflow_timeout_catches_a_cycle(virtual_clock, make_engine) -> None:
    """A → B → A loops until the workflow timeout ends it."""
    d = definition(
        [{"id": "A"}, {"id": "B"}],
        [{"id": "ab", "from": "A", "to": "B"}, {"id": "ba", "from": "B", "to": "A"}],
        timeout_ms=10_000,
    )
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine, {"A": 1, "B": 1})
        tokens = await engine.tokens(run_id)
    assert result.status == "timed_out" and row["finished_at"] - row["started_at"] == 10_000
    assert len(tokens) == 10 and tokens[-1]["status"] == "timed_out"


async def test_workflow_timeout_catches_runaway_fan_out(virtual_clock, make_engine) -> None:
    """A fan-out feeding itself doubles tokens until the workflow timeout stops it."""
    d = definition(
        [{"id": "A"}], [{"id": "fan", "from": "A", "to": "A", "spawn_count": 2}], timeout_ms=3500
    )
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, _ = await run(engine, {"A": 1})
        tokens = await engine.tokens(run_id)
    assert result.status == "timed_out"
    assert len(tokens) == 1 + 2 + 4 + 8
    assert sum(t["status"] == "timed_out" for t in tokens) == 8


async def test_workflow_timeout_wins_a_tie_with_a_node_timeout(virtual_clock, make_engine) -> None:
    """D6.4: at the same instant the workflow timeout, not the node's, ends the token."""
    d = definition([{"id": "A", "timeout_ms": 5000, "on_timeout": "retry"}], timeout_ms=5000)
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, _ = await run(engine, {"A": 60})
        events = by_kind(await engine.events(run_id), "token_timed_out")
    assert result.status == "timed_out"
    assert [e["timeout_type"] for e in events] == ["workflow"]


async def test_node_timeout_fail_fails_the_run_at_the_deadline(virtual_clock, make_engine) -> None:
    """A node timeout with fail: token timed_out at start + timeout_ms, run failed naming it."""
    d = definition([{"id": "A", "timeout_ms": 2000}])
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine, {"A": 60})
        (event,) = by_kind(await engine.events(run_id), "token_timed_out")
    assert result == wf.RunResult("failed", None, "node 'A' timed out after 2000ms")
    assert event["deadline_at"] == row["started_at"] + 2000 == event["at_epoch_ms"]
    assert (event["timeout_type"], event["policy_applied"]) == ("node", "fail")


async def test_node_timeout_retry_retries_up_to_max_retries(virtual_clock, make_engine) -> None:
    """retry: back to pending with a fresh timeout, max_retries times, then timed_out."""
    d = definition([{"id": "A", "timeout_ms": 1000, "on_timeout": "retry", "max_retries": 2}])
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine, {"A": 60})
        events = by_kind(await engine.events(run_id), "token_timed_out")
        (tok,) = await engine.tokens(run_id)
    assert result.status == "failed"
    assert [e["policy_applied"] for e in events] == ["retry", "retry", "fail"]
    assert [e["at_epoch_ms"] - row["started_at"] for e in events] == [1000, 2000, 3000]
    assert (tok["status"], tok["retry_count"], tok["attempt"]) == ("timed_out", 2, 3)


async def test_retry_on_timeout_can_succeed(virtual_clock, make_engine) -> None:
    """A retried attempt that finishes in time completes the node."""

    async def slow_first(ctx: wf.ActionContext) -> Any:
        await asyncio.sleep(5 if ctx.attempt == 1 else 0.5)
        return ctx.attempt

    d = definition([{"id": "A", "timeout_ms": 1000, "on_timeout": "retry", "action_id": "f"}])
    d["actions"].append({"id": "f", "kind": "python", "implementation": {"handler": "f"}})
    async with make_engine({**HANDLERS, "f": slow_first}, d) as engine:
        _, result, row = await run(engine)
    assert result.output == {"A": 2} and row["finished_at"] - row["started_at"] == 1500


async def test_token_stuck_in_pending_times_out_with_fail(virtual_clock, make_engine) -> None:
    """A token pending longer than its node timeout times out with fail, even under retry."""
    d = definition(
        [{"id": "S"}, {"id": "B"}, {"id": "C", "timeout_ms": 1000, "on_timeout": "retry"}],
        [{"id": "sb", "from": "S", "to": "B"}, {"id": "sc", "from": "S", "to": "C"}],
    )
    async with make_engine(HANDLERS, d, concurrency=1) as engine:
        run_id, result, _ = await run(engine, {"B": 3})
        (event,) = by_kind(await engine.events(run_id), "token_timed_out")
    assert result.status == "failed"
    assert (event["node_id"], event["policy_applied"]) == ("C", "fail")


async def test_action_error_retry_block_uses_durable_delays(virtual_clock, make_engine) -> None:
    """An error is retried after exponential delays (100, 200 ms), then the node fails."""
    d = definition(
        [
            {
                "id": "A",
                "action_id": "boom",
                "retry": {"max_attempts": 3, "delay_ms": 100, "backoff": "exponential"},
            }
        ]
    )
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine)
        events = by_kind(await engine.events(run_id), "token_executing")
    assert [e["at_epoch_ms"] - row["started_at"] for e in events] == [0, 100, 300]
    assert result.error == "node 'A' failed: RuntimeError: boom at attempt 3"


async def test_retry_block_linear_backoff_is_capped(virtual_clock, make_engine) -> None:
    """linear backoff waits n x delay_ms, never more than max_delay_ms (the retry core's D3.2)."""
    retry = {"max_attempts": 4, "delay_ms": 100, "backoff": "linear", "max_delay_ms": 250}
    d = definition([{"id": "A", "action_id": "boom", "retry": retry}])
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine)
        events = by_kind(await engine.events(run_id), "token_executing")
    assert [e["at_epoch_ms"] - row["started_at"] for e in events] == [0, 100, 300, 550]
    assert result.status == "failed"


async def test_action_error_without_retry_fails_the_run(virtual_clock, make_engine) -> None:
    """An action error with no retry block fails the run, naming the node and cause."""
    async with make_engine(HANDLERS, definition([{"id": "A", "action_id": "boom"}])) as engine:
        _, result, _ = await run(engine)
    assert result == wf.RunResult(
        "failed", None, "node 'A' failed: RuntimeError: boom at attempt 1"
    )


async def test_fan_in_all_appends_by_branch_index(virtual_clock, make_engine) -> None:
    """append lists outputs by branch index whatever the completion order."""
    d = definition([{"id": "A"}, {"id": "B"}, {"id": "C"}], [fan(foreach="input.items"), join()])
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, _ = await run(engine, {"items": [3, 1, 2]})
    assert [r["branch"] for r in result.output["results"]] == [0, 1, 2]


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("merge_object", {"node": "B", "branch": 2}),
        ("keyed_by_branch", {"0": 0, "1": 1, "2": 2}),
        ("last_wins", {"node": "B", "branch": 2}),
    ],
)
async def test_merge_strategies_are_deterministic(
    virtual_clock, make_engine, strategy, expected
) -> None:
    """D6.9: merge_object (higher index wins), keyed_by_branch, last_wins."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}], [fan(foreach="input.items"), join(merge=strategy)]
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, _ = await run(engine, {"items": [3, 1, 2]})
    out = result.output["results"]
    if strategy == "keyed_by_branch":
        out = {k: v["branch"] for k, v in out.items()}
    assert out == expected


async def test_any_proceeds_on_first_completion_and_cancels_the_rest(
    virtual_clock, make_engine
) -> None:
    """any: the first completed arrival decides; running siblings are cancelled (D6.10)."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}], [fan(foreach="input.items"), join("any")]
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine, {"items": [3, 1, 2]})
        tokens = await engine.tokens(run_id)
    assert [r["branch"] for r in result.output["results"]] == [1]
    assert row["finished_at"] - row["started_at"] == 1000
    assert sorted(t["status"] for t in tokens if t["node_id"] == "B") == [
        "cancelled",
        "cancelled",
        "completed",
    ]


async def test_m_of_n_proceeds_on_the_mth_completion(virtual_clock, make_engine) -> None:
    """m_of_n 2: the join proceeds when the second sibling completes."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}], [fan(foreach="input.items"), join({"m_of_n": 2})]
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, row = await run(engine, {"items": [3, 1, 2]})
    assert [r["branch"] for r in result.output["results"]] == [1, 2]
    assert row["finished_at"] - row["started_at"] == 2000


async def test_sync_timeout_counts_from_the_first_arrival(virtual_clock, make_engine) -> None:
    """The fan-in clock starts at the first arrival; proceed_with_available merges what came."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [fan(foreach="input.items"), join(timeout_ms=1500, on_timeout="proceed_with_available")],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, row = await run(engine, {"items": [10, 1, 2]})
        events = await engine.events(run_id)
    (timed_out,) = by_kind(events, "join_timed_out")
    assert timed_out["sync_started_at"] - row["started_at"] == 1000
    assert (
        timed_out["at_epoch_ms"] - row["started_at"] == 2500 and timed_out["detection_lag_ms"] == 0
    )
    assert [r["branch"] for r in result.output["results"]] == [1, 2]


async def test_proceed_with_available_and_nothing_completed_fails(
    virtual_clock, make_engine
) -> None:
    """D6.3: zero completed siblings at the timeout fails with the document's message."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [
            fan(foreach="input.items"),
            join("any", timeout_ms=1000, on_timeout="proceed_with_available"),
        ],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, row = await run(engine, {"items": ["fail", 60]})
    assert (result.status, result.error) == ("failed", "No siblings completed before timeout")
    assert row["finished_at"] - row["started_at"] == 1000


async def test_unsatisfiable_join_fails_at_once(virtual_clock, make_engine) -> None:
    """D6.8: when too many siblings failed for the join, the run fails without waiting."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [fan(foreach="input.items"), join({"m_of_n": 2}, timeout_ms=100_000)],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, row = await run(engine, {"items": ["fail", 1, "fail"]})
    assert result.status == "failed" and "2 of 3 siblings failed" in (result.error or "")
    assert row["finished_at"] == row["started_at"]


async def test_sync_timeout_fail_times_out_the_waiting_siblings(virtual_clock, make_engine) -> None:
    """on_timeout: fail → waiting siblings timed_out and 'Synchronization timeout exceeded'."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [fan(foreach="input.items"), join(timeout_ms=1000, on_timeout="fail")],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, _ = await run(engine, {"items": [1, 10]})
        events = by_kind(await engine.events(run_id), "token_timed_out")
    assert (result.status, result.error) == ("failed", "Synchronization timeout exceeded")
    assert [(e["timeout_type"], e["policy_applied"]) for e in events] == [
        ("synchronization", "fail")
    ]


async def test_all_fails_at_once_when_a_sibling_fails(virtual_clock, make_engine) -> None:
    """all needs every sibling: one failure fails the join without waiting."""
    d = definition(
        [{"id": "A"}, {"id": "B", "timeout_ms": 1500}, {"id": "C"}],
        [fan(foreach="input.items"), join()],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, row = await run(engine, {"items": [1, 5, 10]})
    assert result.status == "failed" and "1 of 3 siblings failed" in (result.error or "")
    assert row["finished_at"] - row["started_at"] == 1500


async def test_any_survives_a_failed_sibling(virtual_clock, make_engine) -> None:
    """D6.8: a failed sibling whose join can still be satisfied does not fail the run."""
    d = definition(
        [{"id": "A"}, {"id": "B", "timeout_ms": 1500}, {"id": "C"}],
        [fan(foreach="input.items"), join({"m_of_n": 1})],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, _ = await run(engine, {"items": [5, 1.4]})
    assert result.status == "completed" and [r["branch"] for r in result.output["results"]] == [1]


async def test_cancel_ends_run_and_tokens(virtual_clock, make_engine) -> None:
    """cancel() makes the run and its live tokens cancelled and stops the handler."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await asyncio.sleep(1)
        assert await engine.cancel(run_id) is True
        result = await engine.wait(run_id)
        tokens = await engine.tokens(run_id)
        assert await engine.cancel(run_id) is False
    assert result.status == "cancelled" and [t["status"] for t in tokens] == ["cancelled"]


async def test_action_runs_inside_the_node_deadline(virtual_clock, make_engine) -> None:
    """D6.11: timebound.remaining() inside the action is the node's remaining budget."""
    seen: list[float] = []

    async def probe(ctx: wf.ActionContext) -> Any:
        seen.append(tb.remaining())
        return ctx.deadline.remaining()

    d = definition([{"id": "A", "timeout_ms": 2500, "action_id": "p"}], timeout_ms=10_000)
    d["actions"].append({"id": "p", "kind": "python", "implementation": {"handler": "p"}})
    async with make_engine({**HANDLERS, "p": probe}, d) as engine:
        _, result, _ = await run(engine)
    assert seen == [2.5] and result.output == {"A": 2.5}


async def test_action_deadline_is_the_run_deadline_when_smaller(virtual_clock, make_engine) -> None:
    """The effective deadline is min(node, run)."""

    async def probe(ctx: wf.ActionContext) -> Any:
        return tb.remaining()

    d = definition([{"id": "A", "timeout_ms": 60_000, "action_id": "p"}], timeout_ms=4000)
    d["actions"].append({"id": "p", "kind": "python", "implementation": {"handler": "p"}})
    async with make_engine({**HANDLERS, "p": probe}, d) as engine:
        _, result, _ = await run(engine)
    assert result.output == {"A": 4.0}


def test_register_same_definition_is_a_no_op(make_engine) -> None:
    """Registering the same definition twice is fine; a changed body needs a new version."""
    d = definition([{"id": "A"}])
    engine = make_engine(HANDLERS, d)
    engine.register(d)
    changed = definition([{"id": "A", "timeout_ms": 5}])
    with pytest.raises(wf.DefinitionError, match="different body"):
        engine.register(changed)
    engine.register({**changed, "version": 2})


def test_register_checks_python_handlers(make_engine) -> None:
    """A python action whose handler the engine lacks is a DefinitionError naming it."""
    d = definition([{"id": "A"}])
    with pytest.raises(wf.DefinitionError) as info:
        make_engine({}, d)
    assert info.value.path == "actions[0].implementation.handler"


async def test_start_rejects_unknown_definition_and_bad_input(virtual_clock, make_engine) -> None:
    """Starting an unknown definition, or with non-JSON input, is a clear error."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with pytest.raises(wf.DefinitionError, match="no definition 'nope'"):
            await engine.start("nope")
        with pytest.raises(tb.ConfigurationError, match="must be JSON"):
            await engine.start("wf", {"x": object()})


async def test_handler_returning_non_json_fails_the_node(virtual_clock, make_engine) -> None:
    """A handler's output must be JSON; otherwise the node fails saying so."""

    async def bad(ctx: wf.ActionContext) -> Any:
        return {1, 2}

    d = definition([{"id": "A", "action_id": "b"}])
    d["actions"].append({"id": "b", "kind": "python", "implementation": {"handler": "b"}})
    async with make_engine({**HANDLERS, "b": bad}, d) as engine:
        _, result, _ = await run(engine)
    assert result.status == "failed" and "not JSON" in (result.error or "")


async def test_foreach_on_a_non_list_fails_the_run_with_the_path(
    virtual_clock, make_engine
) -> None:
    """foreach must resolve to a list; otherwise the run fails naming the path."""
    d = definition([{"id": "A"}, {"id": "B"}], [fan(foreach="input.items")])
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, _ = await run(engine, {"items": "abc"})
    assert result.status == "failed" and "input.items" in (result.error or "")


async def test_nested_fan_ins_time_out_independently(virtual_clock, make_engine) -> None:
    """An inner fan-in's timeout does not inherit the outer one's clock."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "I"}, {"id": "J"}, {"id": "C"}],
        [
            {"id": "fan", "from": "A", "to": "B", "spawn_count": 2},
            {"id": "inner", "from": "B", "to": "I", "spawn_count": 2},
            {
                "id": "ij",
                "from": "I",
                "to": "J",
                "synchronization": {
                    "strategy": "all",
                    "sibling_group": "inner",
                    "timeout_ms": 100000,
                    "merge": {
                        "source": "_branch.output",
                        "target": "state.inner",
                        "strategy": "append",
                    },
                },
            },
            {
                "id": "join",
                "from": "J",
                "to": "C",
                "synchronization": {
                    "strategy": "all",
                    "sibling_group": "fan",
                    "timeout_ms": 500,
                    "on_timeout": "proceed_with_available",
                    "merge": {
                        "source": "_branch.output",
                        "target": "state.results",
                        "strategy": "append",
                    },
                },
            },
        ],
    )
    async with make_engine(HANDLERS, d) as engine:
        run_id, result, _ = await run(engine, {"I": 1, "J": 1})
        tokens = await engine.tokens(run_id)
    assert result.status == "completed"
    assert len(result.output["results"]) == 2
    assert sum(t["node_id"] == "J" for t in tokens) == 2


async def test_sync_handler_late_result_is_discarded_and_counted(
    virtual_clock, make_engine
) -> None:
    """A sync handler cannot be interrupted: its late result is discarded and counted (D6.6)."""
    import threading

    release = threading.Event()

    def blocking(ctx: wf.ActionContext) -> Any:
        release.wait(10)
        return "late"

    # A real thread is involved: jump only after real idleness (PostgreSQL asks for more).
    virtual_clock.autojump_threshold = max(virtual_clock.autojump_threshold, 0.05)
    d = definition([{"id": "A", "timeout_ms": 100, "action_id": "b"}])
    d["actions"].append({"id": "b", "kind": "python", "implementation": {"handler": "b"}})
    async with make_engine({**HANDLERS, "b": blocking}, d) as engine:
        run_id, result, _ = await run(engine)
        release.set()
        while engine.late_results_discarded == 0:
            await asyncio.sleep(0.01)
        events = await engine.events(run_id)
    assert result.status == "failed" and engine.late_results_discarded == 1
    assert [e["kind"] for e in events][-1] == "late_result_discarded"


async def test_a_late_async_result_after_a_decided_join_is_discarded(
    virtual_clock, make_engine
) -> None:
    """D6.10: a sibling running when the join decides is cancelled; if it answers anyway, its
    result is discarded and counted."""

    async def stubborn(ctx: wf.ActionContext) -> Any:
        try:
            await asyncio.sleep(ctx.branch["item"])
        except asyncio.CancelledError:
            return "answered anyway"  # swallows the cancellation (a badly behaved handler)
        return ctx.branch["index"]

    d = definition(
        [{"id": "A"}, {"id": "B", "action_id": "s"}, {"id": "C"}],
        [fan(foreach="input.items"), join("any")],
    )
    d["actions"].append({"id": "s", "kind": "python", "implementation": {"handler": "s"}})
    del d["transitions"][0]["spawn_count"]
    async with make_engine({**HANDLERS, "s": stubborn}, d) as engine:
        run_id, result, _ = await run(engine, {"items": [1, 5]})
        await asyncio.sleep(10)
        tokens = await engine.tokens(run_id)
        events = await engine.events(run_id)
    b = [t for t in tokens if t["node_id"] == "B"]
    assert [t["status"] for t in b] == ["completed", "cancelled"]
    assert b[1]["state_data"]["reason"] == "join_decided"
    assert result.output["results"] == [0] and engine.late_results_discarded == 1
    assert [e["token_id"] for e in events if e["kind"] == "late_result_discarded"] == [b[1]["id"]]


async def test_an_async_handler_cut_by_its_deadline_is_no_late_result(
    virtual_clock, make_engine
) -> None:
    """An async handler cancelled at its node's deadline produced nothing: no
    late_result_discarded event, and the counter stays 0 (D6.10)."""

    async def slow(ctx: wf.ActionContext) -> Any:
        await asyncio.sleep(10)
        return "never"

    d = definition([{"id": "A", "timeout_ms": 100, "action_id": "s"}])
    d["actions"].append({"id": "s", "kind": "python", "implementation": {"handler": "s"}})
    async with make_engine({**HANDLERS, "s": slow}, d) as engine:
        run_id, result, _ = await run(engine)
        await asyncio.sleep(10)
        events = await engine.events(run_id)
    assert result.status == "failed"
    assert "late_result_discarded" not in [e["kind"] for e in events]
    assert engine.late_results_discarded == 0


async def test_a_handler_may_return_part_of_its_state(virtual_clock, make_engine) -> None:
    """A handler returning a piece of ctx.state (a read-only view) as it is completes the node
    with that value, not an error "not JSON"."""

    async def produce(ctx: wf.ActionContext) -> Any:
        return {"user": {"name": "Ada", "tags": ["x", "y"]}}

    async def pass_on(ctx: wf.ActionContext) -> Any:
        return ctx.state["A"]["user"]

    d = definition([{"id": "A", "action_id": "p"}, {"id": "B", "action_id": "q"}])
    d["transitions"] = [{"id": "t", "from": "A", "to": "B"}]
    d["actions"] += [
        {"id": "p", "kind": "python", "implementation": {"handler": "p"}},
        {"id": "q", "kind": "python", "implementation": {"handler": "q"}},
    ]
    async with make_engine({**HANDLERS, "p": produce, "q": pass_on}, d) as engine:
        _, result, _ = await run(engine)
    assert result.status == "completed", result
    assert result.output["B"] == {"name": "Ada", "tags": ["x", "y"]}


async def test_concurrent_starts_each_get_their_own_run(virtual_clock, make_engine) -> None:
    """Starts issued together (one commit for all) give distinct runs that all complete."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        ids = await asyncio.gather(*(engine.start("wf", {"A": i}) for i in range(20)))
        results = [await engine.wait(run_id) for run_id in ids]
        inputs = [(await engine.get_run(run_id))["input"]["A"] for run_id in ids]
    assert len(set(ids)) == 20 and inputs == list(range(20))
    assert {r.status for r in results} == {"completed"}


async def test_start_needs_an_open_engine(virtual_clock, make_engine) -> None:
    """start() before the engine is open says how to open it."""
    engine = make_engine(HANDLERS, definition([{"id": "A"}]))
    with pytest.raises(RuntimeError, match="async with engine"):
        await engine.start("wf")


async def test_foreach_over_too_many_items_fails_the_run(virtual_clock, make_engine) -> None:
    """A foreach list beyond the fan-out bound fails the run instead of spawning it."""
    d = definition([{"id": "A"}, {"id": "B"}], [fan(foreach="input.items")])
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        _, result, _ = await run(engine, {"items": [0] * 10_001})
    assert result.status == "failed" and "more than the 10000" in (result.error or "")


async def test_deeply_nested_input_is_a_clear_error(virtual_clock, make_engine) -> None:
    """Input nested beyond the recursion limit is refused as too deep (D6.20)."""
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with pytest.raises(tb.TooDeep, match="nested deeper than the limit of 64 levels") as err:
            await engine.start("wf", deep)
    assert err.value.code == "too-deep"


async def test_one_stored_version_never_names_two_bodies(virtual_clock, make_engine) -> None:
    """A changed definition under a stored (id, version) is refused at start, naming version."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        await engine.wait(await engine.start("wf"))
    changed = definition([{"id": "A", "timeout_ms": 5}])
    async with make_engine(HANDLERS, changed) as engine:
        with pytest.raises(wf.DefinitionError, match="already stored with a different body"):
            await engine.start("wf")


async def test_snapshot_reads_run_tokens_and_events_together(virtual_clock, make_engine) -> None:
    """snapshot() answers what get_run, tokens and events answer, and KeyError for no run."""
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 1, "B": 0})
        await engine.wait(run_id)
        run, tokens, events = await engine.snapshot(run_id)
        separate = (
            await engine.get_run(run_id),
            await engine.tokens(run_id),
            await engine.events(run_id),
        )
        with pytest.raises(KeyError, match="no-such-run"):
            await engine.snapshot("no-such-run")
    assert (run, tokens, events) == separate
    assert run["status"] == "completed"
    assert [t["node_id"] for t in tokens] == ["A", "B"]
    assert events[0]["kind"] == "run_started" and events[-1]["kind"] == "run_completed", events
