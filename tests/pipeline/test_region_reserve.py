"""A region's reserve (D5.9): the success branch sees the region's deadline less the reserve,
and the rollback and the fallback run in the reserve, bounded by the region's own deadline."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pyarrow as pa
import pytest

import timebound as tb
from timebound import pipeline as pl
from timebound.testing import VirtualClock

BUDGET = {"base_ms": 100, "per_row_us": 0, "min_ms": 100, "max_ms": 100}


def _catalog(success_s: float, fallback_s: float = 0.0, seen: list[Any] | None = None) -> Any:
    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("boost", pa.float64(), nullable=True)

    @reg.task(reads=["id"], writes=["boost"])
    async def boost(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
        if seen is not None:
            seen.append(ctx.remaining())
        await asyncio.sleep(success_s)
        return {"boost": pa.array([1.0] * rows.num_rows)}

    @reg.task(reads=["id"], writes=["boost"])
    async def cached(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, pa.Array]:
        await asyncio.sleep(fallback_s)
        return {"boost": pa.array([0.5] * rows.num_rows)}

    return reg


def _plan(reg: Any, on_timeout: str = "fallback", **kw: Any) -> pl.Artifact:
    plan = pl.Plan("p", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("boost"),
        if_fail=lambda c: c.task("cached"),
        budget=kw.pop("budget", BUDGET),
        on_timeout=on_timeout,
        **kw,
    )
    return pl.compile(plan)


ROWS = pa.table({"id": pa.array([1, 2], type=pa.int64())})


def test_the_success_branch_sees_the_region_deadline_less_the_reserve() -> None:
    seen: list[Any] = []
    reg = _catalog(0.001, seen=seen)
    clock = VirtualClock()
    out = clock.run(pl.Engine(reg).run(_plan(reg, reserve="30ms"), ROWS))
    assert seen == [pytest.approx(0.07)]
    w = out.trace.wrappers["timeout_wrapper"]
    assert w["chosen_branch"] == "success"
    assert w["reserve_ms"] == 30.0
    assert w["timeout_ms"] == 100.0


def test_the_fallback_runs_in_the_reserve_and_the_region_ends_by_its_deadline() -> None:
    reg = _catalog(10.0, fallback_s=0.02)
    clock = VirtualClock()

    async def main() -> tuple[Any, float]:
        t0 = clock.now()
        out = await pl.Engine(reg).run(_plan(reg, reserve="30ms"), ROWS)
        return out, clock.now() - t0

    out, took = clock.run(main())
    assert out.rows.column("boost").to_pylist() == [0.5, 0.5]
    w = out.trace.wrappers["timeout_wrapper"]
    assert w["timed_out"] and w["chosen_branch"] == "fail"
    assert w["success_elapsed_ms"] == pytest.approx(70.0)  # stopped at the reserve, not at 100
    assert w["fail_elapsed_ms"] == pytest.approx(20.0)
    assert took == pytest.approx(0.09)  # the whole region, fallback included, within its 100 ms


def test_without_a_reserve_the_fallback_starts_after_the_deadline() -> None:
    """The contrast: the plain region runs its success branch to the end of its budget."""
    reg = _catalog(10.0, fallback_s=0.02)
    out = VirtualClock().run(pl.Engine(reg).run(_plan(reg), ROWS))
    w = out.trace.wrappers["timeout_wrapper"]
    assert w["success_elapsed_ms"] == pytest.approx(100.0)
    assert w["reserve_ms"] is None


def test_a_fallback_longer_than_the_reserve_fails_the_plan_at_the_region_deadline() -> None:
    reg = _catalog(10.0, fallback_s=1.0)
    clock = VirtualClock()
    with pytest.raises(pl.PlanTimeout) as info:
        clock.run(pl.Engine(reg).run(_plan(reg, reserve="30ms"), ROWS))
    err = info.value
    assert clock.now() == pytest.approx(0.1)
    assert err.set_by == "region timeout_wrapper"
    assert "fallback did not end" in str(err)
    bd = err.breakdown
    assert bd is not None
    reserve = [p for p in bd.parts if p.kind == "fallback"]
    assert [(p.name, p.elapsed_ms, p.budget_ms) for p in reserve] == [
        ("reserve of region timeout_wrapper", pytest.approx(30.0), pytest.approx(30.0))
    ], bd.render()
    assert sum(p.elapsed_ms for p in bd.parts) == pytest.approx(bd.elapsed_ms)


def test_fail_plan_reports_the_reserve_that_fired() -> None:
    reg = _catalog(10.0)
    clock = VirtualClock()
    with pytest.raises(pl.PlanTimeout) as info:
        clock.run(pl.Engine(reg).run(_plan(reg, "fail_plan", reserve="30ms"), ROWS))
    err = info.value
    assert clock.now() == pytest.approx(0.07)  # 30 ms left for the caller
    assert err.set_by == "reserve of region timeout_wrapper"
    assert err.reserve_ms == 30.0
    assert "reserve of 30 ms" in str(err)
    assert err.breakdown is not None
    assert err.breakdown.name == "reserve of region timeout_wrapper"
    assert err.breakdown.budget_ms == pytest.approx(70.0)
    again = pickle.loads(pickle.dumps(err))
    assert again.set_by == err.set_by and again.reserve_ms == 30.0


def test_a_budget_no_longer_than_the_reserve_goes_straight_to_the_fallback() -> None:
    """D1.20: with 100 rows the budget is 40 ms, no more than the 50 ms reserve: the success
    branch is refused at once, and the fallback answers in what is left."""
    calls: list[Any] = []
    reg = _catalog(0.001, seen=calls)
    budget = {"base_ms": 0, "per_row_us": 400, "min_ms": 1, "max_ms": 200}
    rows = pa.table({"id": pa.array(range(100), type=pa.int64())})
    clock = VirtualClock()
    out = clock.run(pl.Engine(reg).run(_plan(reg, reserve="50ms", budget=budget), rows))
    w = out.trace.wrappers["timeout_wrapper"]
    assert calls == []  # the success branch never ran
    assert (w["timeout_ms"], w["timed_out"], w["chosen_branch"]) == (40.0, True, "fail")
    assert w["success_elapsed_ms"] == 0.0
    # With 300 rows (120 ms) the same plan runs its success branch.
    big = pa.table({"id": pa.array(range(300), type=pa.int64())})
    again = clock.run(pl.Engine(reg).run(_plan(reg, reserve="50ms", budget=budget), big))
    assert again.trace.wrappers["timeout_wrapper"]["chosen_branch"] == "success"
    assert calls == [pytest.approx(0.07)]


def test_the_reserve_is_kept_from_the_request_deadline_too() -> None:
    """The region's reserve is kept from its effective deadline: under a 60 ms request the
    success branch stops at 30 ms and the fallback answers before the request's end."""
    reg = _catalog(10.0, fallback_s=0.02)
    clock = VirtualClock()

    async def request() -> Any:
        async with tb.fail_after(0.06, what="request"):
            return await pl.Engine(reg).run(_plan(reg, reserve="30ms"), ROWS)

    out = clock.run(request())
    w = out.trace.wrappers["timeout_wrapper"]
    assert w["chosen_branch"] == "fail"
    assert w["success_elapsed_ms"] == pytest.approx(30.0)
    assert clock.now() == pytest.approx(0.05)


def test_a_reserve_no_shorter_than_the_longest_budget_is_refused_at_compile_time() -> None:
    reg = _catalog(0.0)
    with pytest.raises(pl.ValidationError) as info:
        _plan(reg, reserve="100ms")
    assert info.value.rule == "reserve"
    assert info.value.details == {"reserve_ms": 100.0, "max_ms": 100.0}
    # An override that can replace the budget with a longer one leaves room.
    reg.param("longer", pa.int64())
    override = {
        "param": "longer",
        "allow_sources": ["plan"],
        "min_ms": 1,
        "max_ms": 500,
        "combine": "replace",
    }
    assert _plan(reg, reserve="100ms", override=override).plan["nodes"][0]["params"][
        "reserve_ms"
    ] == pytest.approx(100.0)


@pytest.mark.parametrize("bad", ["-1ms", "soon", float("nan"), float("inf")])
def test_an_invalid_reserve_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(tb.ConfigurationError, match="reserve"):
        _plan(_catalog(0.0), reserve=bad)


def test_no_reserve_keeps_the_artifact_unchanged() -> None:
    reg = _catalog(0.0)
    assert "reserve_ms" not in _plan(reg).plan["nodes"][0]["params"]
    assert _plan(reg).digest == _plan(reg, reserve=0).digest


def test_a_refused_region_with_fail_plan_raises_at_once() -> None:
    reg = _catalog(0.001)
    budget = {"base_ms": 0, "per_row_us": 400, "min_ms": 1, "max_ms": 200}
    clock = VirtualClock()
    with pytest.raises(pl.PlanTimeout) as info:
        clock.run(pl.Engine(reg).run(_plan(reg, "fail_plan", reserve="50ms", budget=budget), ROWS))
    err = info.value
    assert clock.now() == 0.0
    assert err.set_by == "reserve of region timeout_wrapper"
    assert err.breakdown is not None and err.breakdown.budget_ms == 0.0
    assert err.trace.wrappers["timeout_wrapper"]["chosen_branch"] == "fail_plan"
