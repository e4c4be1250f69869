"""A turn's writes are batched (deferred writes, runs held once per turn): what is stored is what
one statement at a time stored. On both stores, on virtual time."""

from __future__ import annotations

import asyncio
from typing import Any

from .test_engine import HANDLERS, definition


async def test_two_tokens_of_one_run_finishing_in_one_turn_both_reach_its_state(
    virtual_clock, make_engine
) -> None:
    """Two tokens of one run reported in the same turn both write the run's state (the run row
    the turn holds is kept current between them)."""
    d = definition(
        [{"id": "A"}, {"id": "B"}, {"id": "C"}],
        [{"id": "ab", "from": "A", "to": "B"}, {"id": "ac", "from": "A", "to": "C"}],
    )
    async with make_engine(HANDLERS, d) as engine:
        run_id = await engine.start("wf", {"B": 1, "C": 1})
        result = await engine.wait(run_id)
        tokens = await engine.tokens(run_id)
    assert result.status == "completed"
    assert sorted(result.output) == ["A", "B", "C"]
    assert [t["status"] for t in tokens] == ["completed"] * 3
    assert {t["node_id"]: t["output"] for t in tokens} == {
        n: {"node": n, "branch": None} for n in "ABC"
    }


async def test_runs_started_together_store_every_claim_attempt_and_output(
    virtual_clock, make_engine
) -> None:
    """Runs moving in the same turns store, for every token, its output, its one attempt and its
    events in order (dispatched, executing, completed)."""
    d = definition([{"id": "A"}, {"id": "B"}], [{"id": "t", "from": "A", "to": "B"}])
    async with make_engine(HANDLERS, d) as engine:
        ids = await asyncio.gather(*(engine.start("wf", {}) for _ in range(12)))
        results = [await engine.wait(run_id) for run_id in ids]
        stored: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
            (await engine.tokens(run_id), await engine.events(run_id)) for run_id in ids
        ]
    assert {r.status for r in results} == {"completed"}
    for tokens, events in stored:
        assert [(t["node_id"], t["status"], t["attempt"]) for t in tokens] == [
            ("A", "completed", 1),
            ("B", "completed", 1),
        ]
        assert all(t["output"] == {"node": t["node_id"], "branch": None} for t in tokens)
        for tok in tokens:
            kinds = [e["kind"] for e in events if e.get("token_id") == tok["id"]]
            assert kinds == ["token_created", "token_dispatched", "token_executing",
                             "token_completed"]  # fmt: skip
