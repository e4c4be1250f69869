"""The worst-case time check of pipeline plans' regions (D14.5)."""

from __future__ import annotations

import json
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")

from timebound import pipeline as pl  # noqa: E402
from timebound.analysis import check_pipeline  # noqa: E402
from timebound.pipeline._region import region_budget as _budget  # noqa: E402


def _plan(
    budget: dict[str, Any],
    *,
    task_timeout: float | None = None,
    override: dict[str, Any] | None = None,
    nested: dict[str, Any] | None = None,
) -> pl.Plan:
    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("boost", pa.float64(), nullable=True)
    reg.param("cap", pa.int64())
    reg.task(reads=["id"], writes=["boost"], name="boost", timeout=task_timeout)(
        lambda ctx, rows: {}
    )
    plan = pl.Plan("p", catalog=reg)

    def success(c: Any) -> Any:
        if nested is None:
            return c.task("boost")
        return c.timeout_wrapper(
            if_success=lambda c2: c2.task("boost"),
            if_fail=lambda c2: c2.fill_defaults(["boost"]),
            budget=nested,
        )

    plan.timeout_wrapper(
        if_success=success,
        if_fail=lambda c: c.fill_defaults(["boost"]),
        budget=budget,
        override=override,
        on_timeout="fallback",
    )
    return plan


BUDGET = {"base_ms": 2, "per_row_us": 20, "min_ms": 2, "max_ms": 50}


def test_t020_a_region_that_never_fires_before_the_caller() -> None:
    """min_ms at the caller's budget: the region's fallback never applies."""
    report = check_pipeline(_plan({**BUDGET, "min_ms": 30}), budget="30ms", file="rank.json")
    (f,) = [f for f in report.findings if f.code == "TB-T020"]
    assert f.where.path == "$.nodes[0].params.budget.min_ms"
    assert str(f.where) == "rank.json: $.nodes[0].params.budget.min_ms"
    assert not report.ok


def test_t020_not_below_the_caller() -> None:
    """min_ms below the caller's budget: no TB-T020."""
    assert "TB-T020" not in check_pipeline(_plan(BUDGET), budget="30ms").codes()


def test_t021_max_ms_above_the_caller_from_a_row_count() -> None:
    """max_ms 50 above 30 ms: from 1,400 rows on (2 + 0.02 n >= 30), the engine's function."""
    plan = _plan(BUDGET)
    report = check_pipeline(plan, budget="30ms")
    (f,) = [f for f in report.findings if f.code == "TB-T021"]
    assert f.severity == "warning" and f.numbers["rows"] == 1400
    assert "from 1,400 rows on" in f.message
    node = pl.compile(plan).plan["nodes"][0]
    assert _budget(node["params"]["budget"], None, 1400, {}, "dev", node, "")[0] >= 30
    assert _budget(node["params"]["budget"], None, 1399, {}, "dev", node, "")[0] < 30


def test_t021_not_without_a_budget() -> None:
    """Without a caller's budget only the region's range is stated."""
    assert check_pipeline(_plan(BUDGET)).codes() == ["TB-T030"]


def test_t021_a_replace_override_widens_the_range() -> None:
    """An override with combine: replace can lift the region to its own max_ms."""
    override = {
        "param": "cap",
        "allow_sources": ["plan"],
        "min_ms": 1,
        "max_ms": 80,
        "combine": "replace",
    }
    report = check_pipeline(_plan({**BUDGET, "max_ms": 20}, override=override), budget="60ms")
    (f,) = [f for f in report.findings if f.code == "TB-T021"]
    assert f.where.path == "$.nodes[0].params.override.max_ms"


def test_a_min_override_cannot_lift_the_region() -> None:
    """combine: min only lowers the model's budget."""
    override = {
        "param": "cap",
        "allow_sources": ["plan"],
        "min_ms": 1,
        "max_ms": 80,
        "combine": "min",
    }
    report = check_pipeline(_plan({**BUDGET, "max_ms": 20}, override=override), budget="60ms")
    assert "TB-T021" not in report.codes()


def test_t022_a_task_timeout_its_region_always_cuts() -> None:
    """A task's own 60 ms timeout inside a 50 ms region never fires."""
    report = check_pipeline(_plan(BUDGET, task_timeout=0.06))
    (f,) = [f for f in report.findings if f.code == "TB-T022"]
    assert f.where.parameter == "timeout" and f.where.path is not None
    assert f.where.path.startswith("$.fragments['sha256:")


def test_t022_not_below_the_region() -> None:
    """A task timeout below the region's max fires first."""
    assert "TB-T022" not in check_pipeline(_plan(BUDGET, task_timeout=0.04)).codes()


def test_a_nested_region_at_its_outer_regions_deadline() -> None:
    """A nested region whose least budget reaches the outer region's max never fires first."""
    inner = {"base_ms": 60, "per_row_us": 0, "min_ms": 60, "max_ms": 60}
    report = check_pipeline(_plan(BUDGET, nested=inner))
    (f,) = [f for f in report.findings if f.code == "TB-T020"]
    assert "the deadline of region timeout_wrapper" in f.message


def test_an_artifact_from_json() -> None:
    """The JSON artifact is read by the pipeline's loader, the catalog is optional."""
    data = pl.compile(_plan({**BUDGET, "min_ms": 40})).to_json()
    assert "TB-T020" in check_pipeline(data, budget="30ms").codes()


def test_a_refused_artifact_is_a_validation_error() -> None:
    """A document the loader refuses raises its ValidationError (an InvalidInput)."""
    with pytest.raises(pl.ValidationError):
        check_pipeline(b'{"schema": "timebound.pipeline.plan/v1"}')


def test_hostile_numbers() -> None:
    """Budgets near the float limit are compared without an overflow; an integer past what
    canonical JSON can write is the loader's ValidationError, not the encoder's exception."""
    doc = json.loads(pl.compile(_plan(BUDGET)).to_json())
    doc["nodes"][0]["params"]["budget"]["max_ms"] = 1e300
    doc["nodes"][0]["params"]["budget"]["per_row_us"] = 1e300
    report = check_pipeline(json.dumps(doc), budget="1s")
    (f,) = [f for f in report.findings if f.code == "TB-T021"]
    assert f.numbers["rows"] == 1
    json.dumps(report.to_json(), allow_nan=False)
    doc["nodes"][0]["params"]["budget"]["max_ms"] = 10**400
    with pytest.raises(pl.ValidationError) as info:
        check_pipeline(json.dumps(doc))
    assert info.value.rule == "schema" and len(str(info.value)) < 400


@pytest.mark.parametrize("budget_ms", [40, 41])
def test_t020_matches_the_engine(budget_ms: int) -> None:
    """On virtual time a region whose 40 ms budget the check says never fires first is cut by
    the caller's deadline (no fallback); with time after it, its fallback runs."""
    import asyncio

    import timebound as tb
    from timebound.testing import VirtualClock

    cat = pl.Catalog()
    cat.key("id", pa.int64())
    cat.key("boost", pa.float64(), nullable=True)

    @cat.task(reads=["id"], writes=["boost"])
    async def boost(ctx: pl.TaskContext, rows: Any) -> dict[str, Any]:
        await asyncio.sleep(1)
        return {"boost": pa.array([1.0] * rows.num_rows)}

    plan = pl.Plan("p", catalog=cat)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("boost"),
        if_fail=lambda c: c.fill_defaults(["boost"]),
        budget={"base_ms": 40, "per_row_us": 0, "min_ms": 40, "max_ms": 40},
        on_timeout="fallback",
    )
    reported = "TB-T020" in check_pipeline(plan, budget=budget_ms / 1000).codes()
    artifact, engine = pl.compile(plan), pl.Engine(cat)

    async def request() -> str:
        try:
            async with tb.fail_after(budget_ms / 1000):
                out = await engine.run(artifact, pa.table({"id": [1, 2]}))
        except tb.DeadlineExceeded:
            return "deadline"
        return str(out.trace.wrappers["timeout_wrapper"]["chosen_branch"])

    assert VirtualClock().run(request()) == ("deadline" if reported else "fail")
