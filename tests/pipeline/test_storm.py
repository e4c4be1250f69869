"""Deadlines at random instants (virtual time): the region's, the tasks' and the request's race,
and afterwards no partial write is visible, the branch chosen matches who fired first, and
nothing is left running."""

from __future__ import annotations

import asyncio

from hypothesis import assume, given, settings
from hypothesis import strategies as st

import timebound as tb
from timebound import pipeline as pl
from timebound.testing import VirtualClock

from . import sample

ms = st.integers(min_value=1, max_value=40)


@settings(max_examples=150, deadline=None)
@given(fetch=ms, models=ms, budget=ms, request=st.one_of(st.none(), ms), n=st.integers(0, 30))
def test_racing_deadlines_never_leak_a_partial_write(
    fetch: int, models: int, budget: int, request: int | None, n: int
) -> None:
    """Whoever fires first, the wrapper's keys come all from the success branch or all from
    the fallback, and a request deadline that fires first fails the run without a fallback."""
    slowest = fetch + models  # a branch runs its steps in order
    assume(slowest != budget)  # the same instant for both is an ordering question, not ours
    assume(request is None or request not in (budget, slowest))
    reg = sample.make_registry(fetch_features=fetch / 1000, call_models=models / 1000)
    plan = pl.Plan("storm", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("fetch_features", stage="esr").task("call_models"),
        if_fail=lambda c: c.fill_defaults(["f_esr", "score_model"]),
        budget={"base_ms": budget, "per_row_us": 0, "min_ms": 1, "max_ms": 100},
        on_timeout="fallback",
    )
    artifact = pl.compile(plan)
    clock = VirtualClock()

    async def main() -> pl.RunOutput | tb.DeadlineExceeded:
        try:
            if request is None:
                return await pl.Engine(reg).run(artifact, sample.rows(n))
            async with tb.fail_after(request / 1000, what="request"):
                return await pl.Engine(reg).run(artifact, sample.rows(n))
        except tb.DeadlineExceeded as exc:
            return exc
        finally:
            assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    outcome = clock.run(main())
    first = min(x for x in (slowest, budget, request) if x is not None)
    if request is not None and request == first:
        assert isinstance(outcome, tb.DeadlineExceeded)
        assert "request" in str(outcome)
        return
    assert isinstance(outcome, pl.RunOutput)
    f_esr = outcome.rows.column("f_esr").to_pylist()
    score = outcome.rows.column("score_model").to_pylist()
    chosen = outcome.trace.wrappers["timeout_wrapper"]["chosen_branch"]
    if slowest < budget:
        assert chosen == "success"
        assert f_esr == [i + 0.25 for i in range(n)]
        assert score == [i * 0.5 for i in range(n)]
    else:
        assert chosen == "fail"
        assert f_esr == [None] * n
        assert score == [None] * n
