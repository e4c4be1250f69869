"""The bound that fired is the bound reported (D6.17), for every layer and every way a deadline is
set: the definition, the node, the action, the caller of ``start`` and an inherited parent."""

from __future__ import annotations

import asyncio
import tempfile
import warnings
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import timebound as tb
from timebound import workflow as wf
from timebound.testing import VirtualClock

from .test_engine import HANDLERS, by_kind, definition, fan, join
from .test_subworkflows import child, parent

FOREVER = {"A": 3600, "X": 3600}


def _fired(events: list[dict[str, Any]]) -> tuple[str, str, int]:
    first = by_kind(events, "token_timed_out")[0]
    assert first["at_epoch_ms"] >= first["deadline_at"]  # never early
    return first["timeout_type"], first["bound_set_by"], first["timeout_duration_ms"]


async def test_a_caller_deadline_is_reported_not_the_definition_default(
    virtual_clock, make_engine
) -> None:
    """A run started with deadline='200ms' under the 1 h default reports 200 ms, by the caller."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        run_id = await engine.start("wf", FOREVER, deadline="200ms")
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        events = await engine.events(run_id)
    assert result.status == "timed_out"
    assert row["timeout_bound"] == {
        "set_by": "caller",
        "duration_ms": 200,
        "deadline_at": row["started_at"] + 200,
    }
    assert row["error_code"] == "workflow_timeout"
    assert _fired(events) == ("workflow", "caller", 200)


async def test_deadline_ms_still_works_with_a_deprecation_warning(
    virtual_clock, make_engine
) -> None:
    """The old deadline_ms=200 warns (naming deadline=) and reports the 200 ms it set."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with pytest.warns(DeprecationWarning, match="deadline="):
            run_id = await engine.start("wf", FOREVER, deadline_ms=200)
        await engine.wait(run_id)
        events = await engine.events(run_id)
    (event,) = by_kind(events, "token_timed_out")
    assert event["timeout_duration_ms"] == 200


async def test_inherit_deadline_takes_the_callers_current_deadline(
    virtual_clock, make_engine
) -> None:
    """start(inherit_deadline=True) inside a 10 s scope bounds the run by that scope's deadline."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with tb.move_on_after(10):
            run_id = await engine.start("wf", FOREVER, inherit_deadline=True)
        plain = await engine.start("wf", {"A": 0})
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
        plain_row = await engine.get_run(plain)
    assert result.status == "timed_out"
    assert row["timeout_bound"]["set_by"] == "caller"
    assert row["timeout_bound"]["duration_ms"] == 10_000
    assert plain_row["timeout_bound"]["set_by"] == "definition"


@pytest.mark.parametrize("value", ["a Deadline", "250ms", 0.25, timedelta(milliseconds=250)])
async def test_deadline_accepts_a_deadline_or_a_duration(virtual_clock, make_engine, value) -> None:
    """deadline= takes a Deadline, '250ms', seconds or a timedelta, all meaning 250 ms here."""
    if value == "a Deadline":
        value = tb.Deadline.after(0.25)
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        run_id = await engine.start("wf", FOREVER, deadline=value)
        row = await engine.get_run(run_id)
        await engine.cancel(run_id)
    assert row["timeout_at"] - row["started_at"] == 250


@pytest.mark.parametrize("value", ["0ms", -1, "soon", 0])
async def test_a_bad_deadline_names_the_option(virtual_clock, make_engine, value) -> None:
    """A zero, negative or unreadable deadline is a ConfigurationError naming 'deadline'."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with pytest.raises(tb.ConfigurationError) as err:
            await engine.start("wf", FOREVER, deadline=value)
    assert err.value.option == "deadline"


async def test_an_inherited_parent_deadline_is_reported_by_the_parent(
    virtual_clock, make_engine
) -> None:
    """A child inheriting its parent's 1 s deadline stores that bound (set by the parent); when
    it fires, the parent's timeout is the one recorded (the larger scope) and ends the child."""
    p = parent({"inherit_deadline": True}, timeout_ms=1000)
    async with make_engine(HANDLERS, child(None), p) as engine:
        run_id = await engine.start("wf", FOREVER)
        await engine.wait(run_id)
        (tok,) = await engine.tokens(run_id)
        child_row = await engine.get_run(tok["child_run_id"])
        child_events = await engine.events(tok["child_run_id"])
        events = await engine.events(run_id)
    assert child_row["timeout_bound"]["set_by"] == "parent"
    assert child_row["timeout_bound"]["duration_ms"] == 1000
    assert (child_row["status"], child_row["error_code"]) == ("cancelled", "parent_ended")
    assert by_kind(child_events, "token_timed_out") == []
    assert _fired(events) == ("workflow", "definition", 1000)


async def test_proceed_with_available_records_the_siblings_it_timed_out(
    virtual_clock, make_engine
) -> None:
    """A join that proceeds on its timeout records token_timed_out (synchronization layer, set
    by the join) for the sibling it stopped waiting for, as 'fail' does, then its own event."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [fan(foreach="input.items"), join(timeout_ms=1500, on_timeout="proceed_with_available")],
    )
    del d["transitions"][0]["spawn_count"]
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"items": [10, 1, 2]})
        result = await engine.wait(run_id)
        events = await engine.events(run_id)
        tokens = await engine.tokens(run_id)
    assert result.status == "completed"
    (event,) = by_kind(events, "token_timed_out")
    slow = next(t for t in tokens if t["branch_index"] == 0)
    assert event["token_id"] == slow["id"] and slow["status"] == "cancelled"
    assert (event["timeout_type"], event["bound_set_by"]) == ("synchronization", "join")
    assert (event["timeout_duration_ms"], event["policy_applied"]) == (
        1500,
        "proceed_with_available",
    )
    assert event["at_epoch_ms"] == event["deadline_at"]
    kinds = [e["kind"] for e in events]
    assert kinds.index("token_timed_out") < kinds.index("join_timed_out")


# The property: random combinations on virtual time --------------------------------------------

_ms = st.one_of(st.none(), st.integers(1, 6).map(lambda n: n * 100))


def _on_virtual_time(main: Any) -> Any:
    with tempfile.TemporaryDirectory() as tmp, VirtualClock(0.0) as clock:
        return clock.run(main(f"sqlite:///{tmp}/runs.db"))


def _single(def_ms: int | None, node_ms: int | None, action_ms: int | None) -> dict[str, Any]:
    node: dict[str, Any] = {"id": "A"}
    if node_ms is not None:
        node["timeout_ms"] = node_ms
    top: dict[str, Any] = {} if def_ms is None else {"timeout_ms": def_ms}
    d = definition([node], **top)
    if action_ms is not None:
        d["actions"][0]["execution"] = {"timeout_ms": action_ms}
    return d


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(def_ms=_ms, node_ms=_ms, action_ms=_ms, caller_ms=_ms)
def test_the_reported_bound_is_the_smallest_one(
    def_ms: int | None, node_ms: int | None, action_ms: int | None, caller_ms: int | None
) -> None:
    """Definition, node, action and caller bounds at random: the first reported is the smallest,
    a tie going to the larger scope (caller over definition, the run over the node, D6.4)."""
    default = 3_600_000
    run_ms, run_by = def_ms or default, "definition"
    if caller_ms is not None and caller_ms <= run_ms:
        run_ms, run_by = caller_ms, "caller"
    node_bound = (node_ms, "node") if node_ms is not None else (action_ms, "action")
    if node_bound[0] is not None and node_bound[0] < run_ms:
        expected = ("node", node_bound[1], node_bound[0])
    else:
        expected = ("workflow", run_by, run_ms)

    async def main(url: str) -> tuple[Any, ...]:
        engine = wf.Engine(db=url, actions=HANDLERS)
        engine.register(_single(def_ms, node_ms, action_ms))
        async with engine:
            deadline = None if caller_ms is None else f"{caller_ms}ms"
            run_id = await engine.start("wf", FOREVER, deadline=deadline)
            await engine.wait(run_id)
            return _fired(await engine.events(run_id))

    assert _on_virtual_time(main) == expected


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parent_ms=_ms,
    call_node_ms=_ms,
    call_action_ms=_ms,
    child_ms=_ms,
    child_node_ms=_ms,
    inherit=st.booleans(),
)
def test_the_reported_bound_is_the_smallest_one_across_a_subworkflow(
    parent_ms: int | None,
    call_node_ms: int | None,
    call_action_ms: int | None,
    child_ms: int | None,
    child_node_ms: int | None,
    inherit: bool,
) -> None:
    """Parent, calling node, its action, child definition, child node and inheritance at random:
    the bound reported is the smallest, ties going to the larger scope (D6.4, D6.17)."""
    default = 3_600_000
    parent_at = parent_ms or default
    own = next(
        (ms, by)
        for ms, by in ((call_node_ms, "node"), (call_action_ms, "action"), (child_ms, "definition"))
        if ms is not None or by == "definition"
    )
    own_ms = own[0] or default
    child_at, child_by = (
        (parent_at, "parent") if inherit and parent_at <= own_ms else (own_ms, own[1])
    )
    candidates = [(parent_at, 0), (child_at, 1)]
    if child_node_ms is not None:
        candidates.append((child_node_ms, 2))
    _, which = min(candidates)

    node: dict[str, Any] = {"inherit_deadline": inherit}
    if call_node_ms is not None:
        node["timeout_ms"] = call_node_ms
    p = parent(node, call_action_ms, **({} if parent_ms is None else {"timeout_ms": parent_ms}))
    c = definition(
        [{"id": "X", **({} if child_node_ms is None else {"timeout_ms": child_node_ms})}],
        id="child",
        **({} if child_ms is None else {"timeout_ms": child_ms}),
    )

    async def main(url: str) -> tuple[Any, Any]:
        engine = wf.Engine(db=url, actions=HANDLERS)
        engine.register(c)
        engine.register(p)
        async with engine:
            run_id = await engine.start("wf", FOREVER)
            await engine.wait(run_id)
            (tok,) = await engine.tokens(run_id)
            return await engine.events(run_id), await engine.events(tok["child_run_id"])

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        events, child_events = _on_virtual_time(main)
    if which == 0:
        assert _fired(events) == ("workflow", "definition", parent_at)
    elif which == 1:
        assert _fired(child_events) == ("workflow", child_by, child_at)
        assert _fired(events) == ("node", child_by, child_at)
    else:
        assert _fired(child_events) == ("node", "node", child_node_ms)


async def test_an_expired_caller_deadline_times_the_run_out_at_once(
    virtual_clock, make_engine
) -> None:
    """A Deadline already passed when start is called: the run times out at once, reporting a
    bound of 0 ms set by the caller (never a negative length)."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        deadline = tb.Deadline.after(0.1)
        await asyncio.sleep(0.5)
        run_id = await engine.start("wf", FOREVER, deadline=deadline)
        result = await engine.wait(run_id)
        row = await engine.get_run(run_id)
    assert result.status == "timed_out"
    assert row["timeout_bound"]["set_by"] == "caller"
    assert row["timeout_bound"]["duration_ms"] == 0
