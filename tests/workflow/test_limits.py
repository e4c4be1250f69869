"""Sizes someone else chooses are bounded: nesting (D6.20), one run's fault (D6.22), definition
size (D6.23), tokens and events per run (D6.24) — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf
from timebound.workflow import _limits

from .test_engine import HANDLERS, definition


def nested(depth: int) -> Any:
    """An array nested ``depth`` deep (``[[...]]``), built without recursion."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


async def echo(ctx: wf.ActionContext) -> Any:
    return ctx.input


async def deep_output(ctx: wf.ActionContext) -> Any:
    return nested(ctx.input["depth"])


ACTIONS = {**HANDLERS, "echo": echo, "deep": deep_output}


def echo_definition(**top: Any) -> dict[str, Any]:
    d = definition([{"id": "A", "action_id": "echo"}], **top)
    d["actions"] += [
        {"id": "echo", "kind": "python", "implementation": {"handler": "echo"}},
        {"id": "deep", "kind": "python", "implementation": {"handler": "deep"}},
    ]
    return d


@pytest.mark.parametrize("depth", [1, 63, 64])
async def test_input_nested_up_to_the_limit_runs(virtual_clock, make_engine, depth: int) -> None:
    """Input nested at most 64 deep is accepted and reaches the handler whole."""
    async with make_engine(ACTIONS, echo_definition()) as engine:
        result = await engine.wait(await engine.start("wf", nested(depth)), timeout=60)
    assert result.status == "completed"
    assert result.output["A"] == nested(depth)


@pytest.mark.parametrize("depth", [65, 600, 900, 5_000, 100_000])
async def test_input_nested_past_the_limit_is_refused_and_others_run(
    virtual_clock, make_engine, depth: int
) -> None:
    """Input nested past 64 is refused at start (too-deep, with its path); a run alongside
    still completes (at ~600 deep the engine's turn once failed for every run, forever)."""
    async with make_engine(ACTIONS, echo_definition()) as engine:
        other = await engine.start("wf", [1])
        with pytest.raises(tb.TooDeep) as err:
            await engine.start("wf", nested(depth))
        result = await engine.wait(other, timeout=60)
    assert err.value.code == "too-deep"
    assert err.value.path == "$.input" + "[0]" * 64
    assert result.status == "completed"


async def test_a_handler_output_nested_too_deep_fails_its_node(virtual_clock, make_engine) -> None:
    """A handler returning a value nested past the limit fails its node with too-deep."""
    d = definition([{"id": "A", "action_id": "deep"}])
    d["actions"].append({"id": "deep", "kind": "python", "implementation": {"handler": "deep"}})
    d["nodes"][0]["max_retries"] = 0
    async with make_engine(ACTIONS, d) as engine:
        ok = await engine.wait(await engine.start("wf", {"depth": 64}), timeout=60)
        bad = await engine.wait(await engine.start("wf", {"depth": 600}), timeout=60)
    assert ok.status == "completed"
    assert bad.status == "failed" and "too-deep" in (bad.error or "")


async def test_a_run_that_breaks_the_turn_fails_alone(virtual_clock, make_engine) -> None:
    """A stored token whose row breaks the engine's turn (a branch item nested 5,000 deep,
    written before the limit existed) fails its run alone with engine-error; a run started
    after it completes (before, every turn failed, forever)."""
    # The row breaks the turn by Python's default recursion limit: pinned here, since an earlier
    # test in the same process may have raised it (then the row parsed and the run completed).
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        await _poisoned_run_fails_alone(make_engine)
    finally:
        sys.setrecursionlimit(limit)


async def _poisoned_run_fails_alone(make_engine: Any) -> None:
    d = definition([{"id": "A"}])
    async with make_engine(HANDLERS, d) as engine:
        poisoned = await engine.start("wf", {"A": 30})
        await asyncio.sleep(1)  # its first attempt is running: close() puts it back
    async with make_engine(HANDLERS, d) as engine:
        async with engine._store.transaction() as tx:
            text = "[" * 5_000 + "]" * 5_000
            await tx.execute(
                "UPDATE tb_wf_tokens SET branch_index = 0, branch_total = 1, branch_item = ? "
                "WHERE run_id = ?",
                text,
                poisoned,
            )
        other = await engine.start("wf", {"A": 1})
        other_result = await engine.wait(other, timeout=120)
        poisoned_result = await engine.wait(poisoned, timeout=120)
    assert other_result.status == "completed"
    assert poisoned_result.status == "failed"
    assert (poisoned_result.error or "").startswith("engine-error: ")


async def test_a_run_the_machine_cannot_end_is_ended_by_plain_writes(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If ending the poisoned run through the state machine raises too, the run is ended by
    plain writes (failed, its tokens cancelled) and the other run still completes."""
    from timebound.workflow._machine import Machine

    d = definition([{"id": "A"}])
    async with make_engine(HANDLERS, d) as engine:
        poisoned = await engine.start("wf", {"A": 30})
        await asyncio.sleep(1)
    real = Machine.fail_run

    async def fail_run(self: Machine, tx: Any, run: Any, error: str, now: int) -> None:
        if run["id"] == poisoned:
            raise RuntimeError("the machine breaks on this run too")
        await real(self, tx, run, error, now)

    monkeypatch.setattr(Machine, "fail_run", fail_run)
    async with make_engine(HANDLERS, d) as engine:
        async with engine._store.transaction() as tx:
            await tx.execute(
                "UPDATE tb_wf_tokens SET branch_index = 0, branch_total = 1, branch_item = '[' "
                "WHERE run_id = ?",
                poisoned,
            )
        other = await engine.start("wf", {"A": 1})
        other_result = await engine.wait(other, timeout=120)
        poisoned_result = await engine.wait(poisoned, timeout=120)
        _, tokens, _ = await engine.snapshot(poisoned)
    assert other_result.status == "completed"
    assert poisoned_result.status == "failed"
    assert (poisoned_result.error or "").startswith("engine-error: JSONDecodeError")
    assert {t["status"] for t in tokens} == {"cancelled"}


def _foreach_definition(width: int) -> dict[str, Any]:
    return definition(
        [{"id": "A"}, {"id": "B"}],
        [{"id": "fan", "from": "A", "to": "B", "foreach": "input.items"}],
    )


@pytest.mark.parametrize(("width", "status"), [(9, "completed"), (10, "failed")])
async def test_tokens_per_run_are_bounded(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch, width: int, status: str
) -> None:
    """A fan-out that would take the run past its token limit fails the run (too-many-tokens)
    and spawns nothing; just below the limit it runs (here 10: the first token plus 9)."""
    monkeypatch.setattr(_limits, "MAX_TOKENS_PER_RUN", 10)
    async with make_engine(HANDLERS, _foreach_definition(width)) as engine:
        run_id = await engine.start("wf", {"items": list(range(width))})
        result = await engine.wait(run_id, timeout=60)
        tokens = len((await engine.snapshot(run_id))[1])
    assert result.status == status
    if status == "failed":
        assert "too-many-tokens" in (result.error or "")
        assert tokens == 1


async def test_events_per_run_are_bounded(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fan-out that would take the run past its event limit fails the run (too-many-events);
    the same fan-out under a limit it fits runs."""
    async with make_engine(HANDLERS, _foreach_definition(5)) as engine:
        monkeypatch.setattr(_limits, "MAX_EVENTS_PER_RUN", 1_000)
        fits = await engine.wait(await engine.start("wf", {"items": [0] * 5}), timeout=60)
        monkeypatch.setattr(_limits, "MAX_EVENTS_PER_RUN", 6)
        past = await engine.wait(await engine.start("wf", {"items": [0] * 5}), timeout=60)
    assert fits.status == "completed"
    assert past.status == "failed" and "too-many-events" in (past.error or "")


async def test_a_nested_fan_out_bomb_fails_its_run_and_others_complete(
    virtual_clock, make_engine
) -> None:
    """foreach in foreach, 1,000 by 1,000 from a small request: the run fails at the token
    limit (too-many-tokens) instead of writing a million tokens; another run completes."""
    bomb = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [
            {"id": "outer", "from": "A", "to": "B", "foreach": "input.items"},
            {"id": "inner", "from": "B", "to": "C", "foreach": "input.items"},
        ],
    )
    async with make_engine(HANDLERS, bomb, definition([{"id": "A"}], id="calm")) as engine:
        run_id = await engine.start("wf", {"items": [0] * 1_000})
        calm = await engine.start("calm", {"A": 1})
        result = await engine.wait(run_id, timeout=600)
        calm_result = await engine.wait(calm, timeout=600)
        tokens = len((await engine.snapshot(run_id))[1])
    assert result.status == "failed" and "too-many-tokens" in (result.error or "")
    assert tokens <= _limits.MAX_TOKENS_PER_RUN
    assert calm_result.status == "completed"


def _big_definition(nodes: int) -> dict[str, Any]:
    return definition([{"id": f"n{i}"} for i in range(nodes)])


def test_a_definition_at_the_node_limit_is_accepted() -> None:
    """1,000 nodes are accepted."""
    assert len(wf.parse_definition(_big_definition(1_000)).nodes) == 1_000


def test_a_definition_past_the_node_limit_is_refused_with_a_short_message() -> None:
    """1,001 nodes are refused as definition-too-large, naming the field, before validation."""
    with pytest.raises(wf.DefinitionTooLarge) as err:
        wf.parse_definition(_big_definition(10_001))
    assert err.value.code == "definition-too-large" and err.value.path == "nodes"
    assert len(str(err.value)) < 200
    with pytest.raises(wf.DefinitionTooLarge):
        wf.parse_definition(_big_definition(1_001))


def test_a_definition_nested_too_deep_is_refused() -> None:
    """A definition nesting past 64 levels (in an implementation) is refused as too-deep."""
    d = _big_definition(1)
    d["actions"][0]["implementation"]["handler"] = nested(100)
    with pytest.raises(wf.DefinitionTooDeep) as err:
        wf.parse_definition(json.dumps(d))
    assert err.value.code == "too-deep"
    assert err.value.path.startswith("actions[0].implementation.handler[0]")


async def test_publish_checks_a_definition_off_the_event_loop(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engine.publish (the host's PUT) validates in a worker thread, not on the loop that fires
    other runs' timers (a 10,000-node check once held it ~2 s)."""
    import threading

    from timebound.workflow import _engine

    seen: list[threading.Thread] = []
    real = _engine.parse_definition

    def spy(source: Any) -> Any:
        seen.append(threading.current_thread())
        return real(source)

    monkeypatch.setattr(_engine, "parse_definition", spy)
    async with make_engine(HANDLERS) as engine:
        await engine.publish(_big_definition(1_000))
    assert seen and seen[0] is not threading.main_thread()


async def test_turns_sliced_to_one_outcome_each_still_run_everything_right(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every turn cut after its first outcome (D6.24), a fan-out and its join complete with
    every branch merged in order: the outcomes left over are stored by the next turns."""
    from timebound.workflow import _turns

    monkeypatch.setattr(_turns, "_TURN_SLICE_S", 0.0)
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [
            {"id": "fan", "from": "A", "to": "B", "spawn_count": 20},
            {
                "id": "join",
                "from": "B",
                "to": "C",
                "synchronization": {
                    "strategy": "all",
                    "sibling_group": "fan",
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
        result = await engine.wait(await engine.start("wf", {}), timeout=60)
    assert result.status == "completed"
    assert [r["branch"] for r in result.output["results"]] == list(range(20))


async def test_a_turn_reads_the_rows_of_what_it_stores_not_of_the_whole_backlog(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every turn cut after its first outcome (D6.24) and a backlog of 200 outcomes, the
    turns read the tokens of the outcomes they store, a small window each (D6.35): reading the
    whole backlog each turn cost n²/2 rows (~20,000 here)."""
    from timebound._store import _postgres, _sqlite
    from timebound.workflow import _turns

    monkeypatch.setattr(_turns, "_TURN_SLICE_S", 0.0)
    monkeypatch.setattr(_turns, "_HOLD_FIRST", 4)
    read = [0]
    for cls in (_sqlite._SqliteTx, _postgres._PgTx):

        async def _fetch(self: Any, sql: str, *args: Any, _f: Any = cls._fetch) -> Any:
            rows = await _f(self, sql, *args)
            if "FROM tb_wf_tokens WHERE id IN" in sql:
                read[0] += len(rows)
            return rows

        monkeypatch.setattr(cls, "_fetch", _fetch)
    n = 200
    d = definition(
        [{"id": "A"}, {"id": "B"}], [{"id": "fan", "from": "A", "to": "B", "spawn_count": n}]
    )
    async with make_engine(HANDLERS, d, concurrency=n) as engine:
        result = await engine.wait(await engine.start("wf", {}), timeout=60)
    assert result.status == "completed"
    assert 0 < read[0] <= 10 * n, read[0]


def test_a_turn_stores_every_runs_first_outcome_before_any_runs_second() -> None:
    """The order a turn stores outcomes in (D6.35): one run with a backlog of 60 outcomes and
    ten runs with one each, whose ids sort before and after it: every run's first outcome comes
    before any run's second, runs in id order within a round (the order their locks are taken
    in), and a run's own outcomes keep the order they came in. In plain run-id order, a turn that
    stores a few outcomes kept storing the backlog's while the runs sorting after it waited."""
    from timebound.workflow._attempts import Report
    from timebound.workflow._turns import _fair

    def report(run_id: str, n: int) -> Report:
        return Report(run_id, f"{run_id}-t{n}", 1, None)  # type: ignore[arg-type]

    backlog = [report("r5", n) for n in range(60)]
    others = [report(f"r{k}", 0) for k in (9, 0, 7, 2, 8, 1, 6, 3, 4, 10)]
    ordered = _fair(backlog[:30] + others + backlog[30:])
    assert [r.run_id for r in ordered[:11]] == sorted({"r5", *(r.run_id for r in others)})
    assert [r for r in ordered if r.run_id == "r5"] == backlog
    assert ordered[11:] == backlog[1:]


def test_freeze_and_thaw_never_recurse_without_bound() -> None:
    """freeze and thaw take a value nested 100,000 deep (objects and arrays) and give it back
    whole, in order (they raised RecursionError at ~500 levels, inside the engine's turn)."""
    from timebound.workflow._actions import freeze, thaw

    deep: Any = {"z": 1, "a": []}
    inner = deep["a"]
    for _ in range(100_000):
        node = {"z": 1, "a": []}
        inner.append(node)
        inner = node["a"]
    frozen = freeze(deep)
    assert list(frozen) == ["z", "a"]
    back = thaw(frozen)
    for _ in range(100_001):  # walk both down to the bottom, level by level
        assert list(back) == ["z", "a"] and back["z"] == 1
        back = back["a"][0] if back["a"] else None
        frozen = frozen["a"][0] if frozen["a"] else None
    assert back is None and frozen is None


def test_the_nodes_on_a_loop_are_known() -> None:
    """A definition knows which nodes a run can reach again from themselves."""
    d = definition(
        [{"id": n} for n in "ABCDE"],
        [
            {"id": "ab", "from": "A", "to": "B"},
            {"id": "bc", "from": "B", "to": "C"},
            {"id": "cb", "from": "C", "to": "B"},
            {"id": "cd", "from": "C", "to": "D"},
            {"id": "ee", "from": "E", "to": "E"},
        ],
    )
    assert wf.parse_definition(d).cyclic == {"B", "C", "E"}
    assert wf.parse_definition(_big_definition(3)).cyclic == frozenset()


async def test_a_loop_is_bounded_by_the_token_limit(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that leads back to itself grows the run one token at a time: past the token limit
    the run fails (too-many-tokens) instead of looping until its timeout."""
    monkeypatch.setattr(_limits, "MAX_TOKENS_PER_RUN", 10)
    d = definition([{"id": "A"}], [{"id": "again", "from": "A", "to": "A"}])
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {})
        result = await engine.wait(run_id, timeout=60)
        tokens = len((await engine.snapshot(run_id))[1])
    assert result.status == "failed" and "too-many-tokens" in (result.error or "")
    assert tokens == 10
