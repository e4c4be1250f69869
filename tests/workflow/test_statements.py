"""What a step costs the store: statements and commits per step of a run waited for one at a
time (D6.29), counted on both stores.

The marginal cost is measured (the difference between a 15-step and a 5-step run, divided by
the 10 steps between them), so what a run costs once (its start, its end, the wait's read) does
not blur what each step costs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from timebound import workflow as wf
from timebound._store import Tx, _postgres, _sqlite

#: The questions a turn used to ask the store each time, whatever it knew (D6.29).
SCHEDULING = (
    "FROM tb_timers WHERE due_ms <=",  # due timers
    "SELECT MIN(due_ms)",  # the next timer
    "SELECT t.* FROM tb_wf_tokens t JOIN",  # ready tokens
    "SELECT MIN(not_before)",  # the next ready token
)


def chain(steps: int) -> dict[str, Any]:
    return {
        "id": f"chain{steps}",
        "initial_node": "s0",
        "actions": [{"id": "step", "kind": "python", "implementation": {"handler": "step"}}],
        "nodes": [{"id": f"s{i}", "action_id": "step"} for i in range(steps)],
        "transitions": [
            {"id": f"t{i}", "from": f"s{i}", "to": f"s{i + 1}"} for i in range(steps - 1)
        ],
    }


async def step(ctx: wf.ActionContext) -> int:
    return ctx.attempt


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement sent to either store (one per ``executemany``), in order, and
    ``COMMIT`` for each write transaction committed."""
    sent: list[str] = []
    committed = Tx.committed

    def commit(self: Tx) -> None:
        sent.append("COMMIT")
        committed(self)

    monkeypatch.setattr(Tx, "committed", commit)
    for cls in (_sqlite._SqliteTx, _postgres._PgTx):
        execute, fetch, many = cls._execute, cls._fetch, cls._execute_many

        async def _execute(self: Any, sql: str, *args: Any, _f: Any = execute) -> Any:
            sent.append(sql)
            return await _f(self, sql, *args)

        async def _fetch(self: Any, sql: str, *args: Any, _f: Any = fetch) -> Any:
            sent.append(sql)
            return await _f(self, sql, *args)

        async def _execute_many(self: Any, sql: str, rows: Any, _f: Any = many) -> Any:
            sent.append(sql)
            return await _f(self, sql, rows)

        monkeypatch.setattr(cls, "_execute", _execute)
        monkeypatch.setattr(cls, "_fetch", _fetch)
        monkeypatch.setattr(cls, "_execute_many", _execute_many)
    yield sent


async def _cost(engine: wf.Engine, sent: list[str], steps: int) -> tuple[int, int, int]:
    """Statements, commits and scheduling questions of one run started and waited for."""
    sent.clear()
    result = await engine.wait(await engine.start(f"chain{steps}"), timeout=60)
    assert result.status == "completed", result
    asked = sum(1 for sql in sent if any(q in sql for q in SCHEDULING))
    commits = sent.count("COMMIT")
    return len(sent) - commits, commits, asked


async def test_a_step_costs_one_commit_and_no_scheduling_question(
    virtual_clock, make_engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One run at a time, each further step costs one commit and six statements (the run's
    and the token's reads, three writes, the events): none of the four scheduling questions a
    turn used to ask every time (eleven statements per step before D6.29), and the next token
    is inserted begun, not inserted and then begun (seven before D6.36)."""
    # No housekeeping sweep during the measure: it is a transaction of its own (D6.29).
    engine = make_engine({"step": step}, chain(5), chain(15), sweep="10min")
    with counting(monkeypatch) as sent:
        async with engine:
            await _cost(engine, sent, 15)  # warm: definitions stored, the schedule learned
            await _cost(engine, sent, 5)
            short = await _cost(engine, sent, 5)
            long = await _cost(engine, sent, 15)
    statements, commits, asked = (b - a for a, b in zip(short, long, strict=True))
    assert commits == 10  # one per step
    assert asked == 0
    assert statements == 6 * 10
    assert short[1] == 5 + 1  # the start's commit, then one per step: no extra turn
