"""An operator's actions on a run (retry, terminate, extend) on SQLite and PostgreSQL, on virtual
time: exact instants, the row deciding, the reason and operator recorded."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf

from .test_engine import HANDLERS, by_kind, definition

FLAKY: dict[str, int] = {}


async def flaky(ctx: wf.ActionContext) -> Any:
    """Fail until ``FLAKY[run_id]`` attempts have been made across retries of the run."""
    FLAKY[ctx.run_id] = FLAKY.get(ctx.run_id, 0) + 1
    if FLAKY[ctx.run_id] == 1:
        raise RuntimeError("first time fails")
    return {"ok": True}


def two_step(**node_b: Any) -> dict[str, Any]:
    d = definition(
        [{"id": "A"}, {"id": "B", "action_id": "flaky", **node_b}],
        [{"id": "t", "from": "A", "to": "B"}],
    )
    d["actions"].append({"id": "flaky", "kind": "python", "implementation": {"handler": "flaky"}})
    return d


async def test_retry_from_the_failed_node_keeps_state_and_records_who(
    virtual_clock, make_engine
) -> None:
    """A run failed at B is retried from B (A not run again), with reason and operator recorded."""
    async with make_engine({**HANDLERS, "flaky": flaky}, two_step()) as engine:
        run_id = await engine.start("wf", {"A": 1})
        assert (await engine.wait(run_id)).status == "failed"
        answer = await engine.retry(run_id, reason="upstream fixed", operator="alice")
        result = await engine.wait(run_id)
        tokens = await engine.tokens(run_id)
        events = await engine.events(run_id)
    assert answer["from_node"] == "B" and result.status == "completed"
    assert [t["node_id"] for t in tokens] == ["A", "B", "B"]
    (retried,) = by_kind(events, "run_retried")
    assert retried["reason"] == "upstream fixed" and retried["operator"] == "alice"
    assert retried["previous_status"] == "failed" and retried["from_node"] == "B"


async def test_retry_from_the_start_clears_state(virtual_clock, make_engine) -> None:
    """from_start runs the initial node again with an empty state."""
    async with make_engine({**HANDLERS, "flaky": flaky}, two_step()) as engine:
        run_id = await engine.start("wf", {"A": 1})
        await engine.wait(run_id)
        await engine.retry(run_id, from_start=True, reason="again")
        result = await engine.wait(run_id)
        tokens = await engine.tokens(run_id)
    assert result.status == "completed"
    assert [t["node_id"] for t in tokens] == ["A", "B", "A", "B"]


async def test_retry_refuses_from_node_and_from_start_together(virtual_clock, make_engine) -> None:
    """Two places to start from are a mistake, refused before the run is touched."""
    async with make_engine({**HANDLERS, "flaky": flaky}, two_step()) as engine:
        run_id = await engine.start("wf", {"A": 1})
        await engine.wait(run_id)
        before = await engine.tokens(run_id)
        with pytest.raises(tb.ConfigurationError) as info:
            await engine.retry(run_id, from_node="A", from_start=True, reason="again")
        assert info.value.option == "from_start"
        assert await engine.tokens(run_id) == before


async def test_retry_refuses_a_running_or_completed_run(virtual_clock, make_engine) -> None:
    """Only a failed or timed-out run is retried: others are refused with a stable code."""
    d = definition([{"id": "A"}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 5})
        with pytest.raises(wf.OperatorRefused) as running:
            await engine.retry(run_id, reason="x")
        await engine.wait(run_id)
        with pytest.raises(wf.OperatorRefused) as done:
            await engine.retry(run_id, reason="x")
        with pytest.raises(wf.OperatorRefused) as missing:
            await engine.retry("nope", reason="x")
    assert running.value.code == done.value.code == "run-not-failed"
    assert missing.value.code == "run-not-found"


async def test_retry_of_a_timed_out_run_gets_a_fresh_workflow_timeout(
    virtual_clock, make_engine
) -> None:
    """A run timed out at 5 s and retried times out again exactly 5 s after the retry."""
    d = definition([{"id": "A"}], timeout_ms=5000)
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await engine.wait(run_id)
        await engine.retry(run_id, reason="try again")
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        (retried,) = by_kind(await engine.events(run_id), "run_retried")
    assert result.status == "timed_out"
    assert row["timeout_at"] == retried["at_epoch_ms"] + 5000 == row["finished_at"]
    assert retried["timeout_at"] == row["timeout_at"]


async def test_terminate_ends_the_run_failed_with_who_and_why(virtual_clock, make_engine) -> None:
    """Terminate stops the live node at once and fails the run, naming the operator."""
    d = definition([{"id": "A"}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await asyncio.sleep(1)
        await engine.terminate(run_id, reason="stuck", operator="bob")
        result = await engine.wait(run_id)
        with pytest.raises(wf.OperatorRefused) as again:
            await engine.terminate(run_id, reason="stuck", operator="bob")
        row = await engine.get_run(run_id)
        tokens = await engine.tokens(run_id)
        events = await engine.events(run_id)
    assert result == wf.RunResult("failed", None, "terminated by bob: stuck")
    assert row["error_code"] == "terminated"
    assert [t["status"] for t in tokens] == ["cancelled"]
    assert by_kind(events, "run_terminated")[0]["reason"] == "stuck"
    assert again.value.code == "run-ended"


async def test_extend_the_run_deadline_moves_the_timeout_exactly(
    virtual_clock, make_engine
) -> None:
    """A 5 s run extended by 10 s at 2 s times out at 15 s, not 5 s: the timer is re-armed."""
    d = definition([{"id": "A"}], timeout_ms=5000)
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await asyncio.sleep(2)
        answer = await engine.extend(run_id, by=10, reason="needs time", operator="carol")
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        events = await engine.events(run_id)
    assert result.status == "timed_out"
    assert row["finished_at"] == row["timeout_at"] == row["started_at"] + 15_000
    (ext,) = by_kind(events, "deadline_extended")
    assert ext["target"] == "run" and ext["by_ms"] == 10_000 and ext["operator"] == "carol"
    # The timeout reports the bound in force: 15 s, its deadline, no lag (D6.17).
    (cut,) = by_kind(events, "token_timed_out")
    assert cut["timeout_duration_ms"] == 15_000 and cut["deadline_at"] == row["timeout_at"]
    assert cut["detection_lag_ms"] == 0
    assert answer["extension_used_ms"] == 10_000
    # The attempt, cut at the 5 s it began with, ran again under the new deadline (D6.28).
    assert by_kind(events, "token_redispatched")


async def test_extend_a_node_deadline_lets_the_attempt_finish(virtual_clock, make_engine) -> None:
    """A node bounded at 3 s needing 5 s completes when extended by 10 s: no retry is spent."""
    d = definition([{"id": "A", "timeout_ms": 3000}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 5})
        await asyncio.sleep(1)
        await engine.extend(run_id, "A", by="10s", reason="slow upstream")
        result = await engine.wait(run_id)
        tokens = await engine.tokens(run_id)
        events = await engine.events(run_id)
        row = await engine.get_run(run_id)
    # The attempt began with 3 s: it was cut there and ran again within the new 13 s.
    assert result.status == "completed"
    assert tokens[0]["timeout_at"] == row["started_at"] + 13_000
    assert row["finished_at"] == row["started_at"] + 8000  # re-run from 3 s, 5 s of work
    assert not by_kind(events, "token_timed_out")
    (ext,) = by_kind(events, "deadline_extended")
    assert ext["node_id"] == "A" and ext["to_ms"] - ext["from_ms"] == 10_000


async def test_extend_is_capped_by_the_policy(virtual_clock, make_engine) -> None:
    """Extensions of one run together stay within max_extension; past it is refused."""
    d = definition([{"id": "A"}], timeout_ms=5000)
    async with make_engine(HANDLERS, d, max_extension=15) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await engine.extend(run_id, by=10, reason="a")
        with pytest.raises(wf.OperatorRefused) as over:
            await engine.extend(run_id, by=6, reason="b")
        await engine.extend(run_id, by=5, reason="c")
        row = await engine.get_run(run_id)
        await engine.cancel(run_id)
    assert over.value.code == "over-cap" and "max_extension" in str(over.value)
    assert row["timeout_at"] == row["started_at"] + 20_000


async def test_extend_refuses_what_has_nothing_to_extend(virtual_clock, make_engine) -> None:
    """An unknown node, a node without a deadline, an ended run: each refused with its code."""
    d = definition([{"id": "A"}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 1})
        with pytest.raises(wf.OperatorRefused) as unknown:
            await engine.extend(run_id, "Z", by=1, reason="x")
        with pytest.raises(wf.OperatorRefused) as no_bound:
            await engine.extend(run_id, "A", by=1, reason="x")
        await engine.wait(run_id)
        with pytest.raises(wf.OperatorRefused) as ended:
            await engine.extend(run_id, by=1, reason="x")
        with pytest.raises(tb.ConfigurationError):
            await engine.extend(run_id, by=-1, reason="x")
    assert unknown.value.code == "unknown-node"
    assert no_bound.value.code == "node-not-live" and ended.value.code == "run-ended"


async def test_extend_at_the_instant_the_timer_fires_never_revives_the_run(
    virtual_clock, make_engine
) -> None:
    """An extend that arrives at the deadline is refused and the run stays timed out at 5 s."""
    d = definition([{"id": "A"}], timeout_ms=5000)
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"A": 60})
        await asyncio.sleep(5)
        with pytest.raises(wf.OperatorRefused) as late:
            await engine.extend(run_id, by=10, reason="too late")
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
    assert late.value.code == "run-ended" and result.status == "timed_out"
    assert row["finished_at"] == row["started_at"] + 5000
