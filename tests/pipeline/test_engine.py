"""The engine: D5's budget and fallback rules, transactional overlays, task contracts, params
and origins, the trace (virtual time, exact instants)."""

from __future__ import annotations

import re
import warnings
from datetime import timedelta
from typing import Any

import anyio
import pyarrow as pa
import pytest
import trio

import timebound as tb
from timebound import pipeline as pl
from timebound._core import _clock
from timebound.testing import VirtualClock

from . import sample


def run(engine: pl.Engine, artifact: pl.Artifact, rows: pa.Table, **kw: Any) -> pl.RunOutput:
    return VirtualClock().run(engine.run(artifact, rows, **kw))


def wrapper_plan(
    reg: pl.Catalog,
    budget: dict[str, Any],
    override: dict[str, Any] | None = None,
    plan_params: dict[str, Any] | None = None,
    on_timeout: str = "fallback",
) -> pl.Artifact:
    plan = pl.Plan("budget", catalog=reg, params=plan_params)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("call_models"),
        if_fail=lambda c: c.fill_defaults(["score_model"]),
        budget=budget,
        override=override,
        on_timeout=on_timeout,
    )
    return pl.compile(plan)


BUDGET = {"base_ms": 2, "per_row_us": 20, "min_ms": 1, "max_ms": 15}
OVERRIDE = {
    "param": "override_budget_ms",
    "allow_sources": ["plan", "fragment", "request"],
    "min_ms": 1,
    "max_ms": 20,
}


@pytest.mark.parametrize(("n", "expected"), [(0, 2.0), (100, 4.0), (500, 12.0), (1000, 15.0)])
def test_d5_1_model_budget(n: int, expected: float) -> None:
    """D5.1: clamp(min, base + per_row_us * n / 1000, max) with budget (2, 20, 1, 15)."""
    reg = sample.make_registry()
    result = run(pl.Engine(reg), wrapper_plan(reg, BUDGET), sample.rows(n))
    w = result.trace.wrappers["timeout_wrapper"]
    assert (w["timeout_ms"], w["nrows"], w["override_applied"]) == (expected, n, False)


@pytest.mark.parametrize(
    ("value", "combine", "expected"), [(10, "min", 10.0), (30, "min", 12.0), (30, "replace", 20.0)]
)
def test_d5_1_override_examples(value: int, combine: str, expected: float) -> None:
    """D5.1 at n = 500: override 10 with min gives 10; 30 clamps to 20 so min gives 12;
    replace gives 20."""
    reg = sample.make_registry()
    override = {**OVERRIDE, "combine": combine}
    artifact = wrapper_plan(reg, BUDGET, override, {"override_budget_ms": value})
    w = run(pl.Engine(reg), artifact, sample.rows(500)).trace.wrappers["timeout_wrapper"]
    assert (w["timeout_ms"], w["override_applied"], w["override_origin"]) == (
        expected,
        True,
        "plan",
    )


def test_budget_keeps_fractions() -> None:
    """The budget is real arithmetic: 5 rows at 20 us each add 0.1 ms (2.1, not 2)."""
    reg = sample.make_registry()
    w = run(pl.Engine(reg), wrapper_plan(reg, BUDGET), sample.rows(5)).trace.wrappers
    assert w["timeout_wrapper"]["timeout_ms"] == pytest.approx(2.1)
    assert isinstance(w["timeout_wrapper"]["timeout_ms"], float)


def test_an_override_without_a_value_is_not_applied() -> None:
    """An override whose param resolves to nothing leaves the model budget (origin null)."""
    reg = sample.make_registry()
    artifact = wrapper_plan(reg, BUDGET, {**OVERRIDE, "combine": "min"})
    w = run(pl.Engine(reg), artifact, sample.rows(500)).trace.wrappers["timeout_wrapper"]
    assert (w["timeout_ms"], w["override_applied"], w["override_origin"]) == (12.0, False, None)


def test_prod_refuses_a_request_override_even_when_listed() -> None:
    """D5.6: in prod a request-origin override fails the plan, whatever allow_sources says."""
    reg = sample.make_registry()
    artifact = wrapper_plan(reg, BUDGET, {**OVERRIDE, "combine": "min"})
    with pytest.raises(pl.ValidationError) as info:
        run(pl.Engine(reg), artifact, sample.rows(10), request_params={"override_budget_ms": 5})
    assert (info.value.rule, info.value.node_id) == ("override_origin", "timeout_wrapper")
    assert info.value.details["origin"] == "request"


def test_dev_takes_a_listed_request_override() -> None:
    """D5.6: in dev the listed origins are taken as written."""
    reg = sample.make_registry()
    artifact = wrapper_plan(reg, BUDGET, {**OVERRIDE, "combine": "min"})
    result = run(
        pl.Engine(reg, env="dev"),
        artifact,
        sample.rows(500),
        request_params={"override_budget_ms": 5},
    )
    w = result.trace.wrappers["timeout_wrapper"]
    assert (w["timeout_ms"], w["override_origin"]) == (5.0, "request")


def test_an_unlisted_origin_is_refused() -> None:
    """A resolved origin outside allow_sources fails closed (override_origin)."""
    reg = sample.make_registry()
    override = {**OVERRIDE, "allow_sources": ["plan"], "combine": "min"}
    artifact = wrapper_plan(reg, BUDGET, override)
    with pytest.raises(pl.ValidationError, match="origin 'source'") as info:
        run(
            pl.Engine(reg, env="dev"),
            artifact,
            sample.rows(5),
            source_params={"override_budget_ms": 5},
        )
    assert info.value.rule == "override_origin"


def test_the_sample_plan_succeeds_in_time() -> None:
    """With fast tasks the success branch commits: its keys hold the tasks' values."""
    reg = sample.make_registry()
    result = run(pl.Engine(reg), pl.compile(sample.make_plan(reg)), sample.rows(4))
    assert result.rows.to_pydict() == {
        "id": [0, 1, 2, 3],
        "score_model": [0.0, 0.5, 1.0, 1.5],
        "score_final": [1.0, 1.5, 2.0, 2.5],
        "f_esr": [0.25, 1.25, 2.25, 3.25],
    }
    w = result.trace.wrappers["timeout_wrapper"]
    assert (w["timed_out"], w["chosen_branch"], w["fail_elapsed_ms"]) == (False, "success", None)
    assert w["success_elapsed_ms"] == pytest.approx(2.0)  # two 1 ms steps, one after the other


def test_the_sample_plan_times_out_and_falls_back() -> None:
    """The success branch times out; the fallback writes the same keys and the trace
    says so. score_model was computed before the wrapper: the fallback's null replaces it."""
    reg = sample.make_registry(fetch_features=1.0)
    result = run(pl.Engine(reg), pl.compile(sample.make_plan(reg)), sample.rows(4))
    assert result.rows.to_pydict() == {
        "id": [0, 1, 2, 3],
        "score_model": [None] * 4,
        "score_final": [1.0] * 4,
        "f_esr": [None] * 4,
    }
    w = result.trace.wrappers["timeout_wrapper"]
    assert w == {
        "timeout_ms": pytest.approx(2.08),
        "nrows": 4,
        "success_elapsed_ms": pytest.approx(2.08),
        "timed_out": True,
        "chosen_branch": "fail",
        "fail_elapsed_ms": 0.0,
        "override_applied": True,
        "override_origin": "plan",
        "reserve_ms": None,
        "w_success": ["f_esr", "score_model"],
    }


def test_fail_plan_raises_plan_timeout_with_the_wrapper() -> None:
    """on_timeout="fail_plan": PlanTimeout names the wrapper, its op and budget, and carries
    the trace (chosen_branch "fail_plan")."""
    reg = sample.make_registry(fetch_features=1.0)
    artifact = pl.compile(sample.make_plan(reg, on_timeout="fail_plan"))
    clock = VirtualClock()
    with pytest.raises(pl.PlanTimeout) as info:
        clock.run(pl.Engine(reg).run(artifact, sample.rows(4)))
    err = info.value
    assert isinstance(err, tb.DeadlineExceeded)
    assert (err.node_id, err.op, err.source) == ("timeout_wrapper", "timeout_wrapper", "region")
    assert err.set_by == "region timeout_wrapper"  # D2.8
    assert err.timeout_ms == pytest.approx(2.08)
    assert err.trace.wrappers["timeout_wrapper"]["chosen_branch"] == "fail_plan"
    assert clock.now() == pytest.approx(0.001 + 0.00208)


def test_rollback_leaves_no_partial_write() -> None:
    """A success branch whose first task wrote before the region ran out leaks nothing: the
    fallback's values (not the first task's) are what the plan sees."""
    reg = sample.make_registry(call_models=1.0)
    plan = pl.Plan("partial", catalog=reg)
    plan.timeout_wrapper(
        # fetch_features (1 ms) commits to the overlay; call_models (1 s) is cut.
        if_success=lambda c: c.task("fetch_features", stage="esr").task("call_models"),
        if_fail=lambda c: c.fill_defaults(["f_esr", "score_model"]),
        budget={"base_ms": 5, "per_row_us": 0, "min_ms": 5, "max_ms": 5},
        on_timeout="fallback",
    )
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(3))
    assert result.rows.column("f_esr").to_pylist() == [None] * 3
    spans = {s["node_id"]: s["outcome"] for s in result.trace.spans}
    assert spans["timeout_wrapper/success/task:fetch_features"] == "ok"
    assert spans["timeout_wrapper/success/task:call_models"] == "timed_out"


def test_a_task_error_fails_the_plan_without_fallback() -> None:
    """D5.3: an error other than the region's timeout never runs the fail branch."""
    reg = sample.make_registry()

    @reg.task(reads=["id"], writes=["f_lsr"])
    def broken(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        raise LookupError("feature store down")

    plan = pl.Plan("err", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("broken"),
        if_fail=lambda c: c.fill_defaults(["f_lsr"]),
        budget=BUDGET,
        on_timeout="fallback",
    )
    with pytest.raises(LookupError) as info:
        run(pl.Engine(reg), pl.compile(plan), sample.rows(3))
    assert info.value.__notes__[0].startswith(
        "in pipeline node timeout_wrapper/success/task:broken (tests/pipeline/test_engine.py:"
    )


def test_an_outer_deadline_fails_the_plan_without_fallback() -> None:
    """D5.3: the request's deadline firing inside the region is not the region's timeout."""
    reg = sample.make_registry(fetch_features=1.0)
    artifact = pl.compile(sample.make_plan(reg))

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(0.002, what="request"):
                await pl.Engine(reg).run(artifact, sample.rows(4))
        assert "request" in str(info.value)
        assert not isinstance(info.value, pl.PlanTimeout)
        assert _clock.now() == pytest.approx(0.002)

    VirtualClock().run(main())


def test_a_tasks_own_shorter_timeout_is_a_task_error() -> None:
    """D5.5: a per-task timeout that fires before the region's fails the plan (source node)."""
    reg = sample.make_registry()

    @reg.task(reads=["id"], writes=["f_lsr"], timeout=0.001)
    async def slow(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        await anyio.sleep(1)
        return {}

    plan = pl.Plan("own", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("slow"),
        if_fail=lambda c: c.fill_defaults(["f_lsr"]),
        budget={"base_ms": 10, "per_row_us": 0, "min_ms": 1, "max_ms": 10},
        on_timeout="fallback",
    )
    with pytest.raises(tb.DeadlineExceeded) as info:
        run(pl.Engine(reg), pl.compile(plan), sample.rows(3))
    assert info.value.source == "node"


def test_a_task_sees_the_smallest_deadline() -> None:
    """A task's ctx.deadline is min(task budget, region, enclosing) (D1.5)."""
    reg = sample.make_registry()
    seen: list[tuple[float, float]] = []

    @reg.task(reads=["id"], writes=["f_lsr"], timeout="500ms")
    def probe(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        seen.append((ctx.deadline.when, ctx.remaining()))
        return {"f_lsr": pa.nulls(rows.num_rows, type=pa.float64())}

    plan = pl.Plan("probe", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("probe"),
        if_fail=lambda c: c.fill_defaults(["f_lsr"]),
        budget={"base_ms": 10, "per_row_us": 0, "min_ms": 10, "max_ms": 10},
        on_timeout="fallback",
    )
    artifact = pl.compile(plan)

    async def main() -> None:
        engine = pl.Engine(reg)
        await engine.run(artifact, sample.rows(1))  # region (10 ms) < task (500 ms)
        async with tb.fail_after(0.004):
            await engine.run(artifact, sample.rows(1))  # enclosing (4 ms) first

    VirtualClock().run(main())
    assert seen == [(pytest.approx(0.010), pytest.approx(0.010)), (0.004, pytest.approx(0.004))]
    assert reg.tasks["probe"].timeout == 0.5


def test_time_remaining_ms_warns_and_still_counts_milliseconds() -> None:
    """The old spelling works for one release (D1.12), naming remaining()."""
    reg = sample.make_registry()
    seen: list[float] = []

    @reg.task(reads=["id"], writes=["f_lsr"], timeout=timedelta(milliseconds=20))
    def probe(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        with pytest.warns(DeprecationWarning, match=r"use TaskContext.remaining\(\)"):
            seen.append(ctx.time_remaining_ms())
        return {"f_lsr": pa.nulls(rows.num_rows, type=pa.float64())}

    plan = pl.Plan("probe", catalog=reg)
    plan.task("probe")
    VirtualClock().run(pl.Engine(reg).run(pl.compile(plan), sample.rows(1)))
    assert seen == [pytest.approx(20.0)]


def test_the_fail_branch_runs_under_normal_budgets() -> None:
    """D5.2: the fail branch does not inherit the expired region deadline (it may take longer
    than the region), while an enclosing deadline still bounds it."""
    reg = sample.make_registry(fetch_features=1.0, call_models=0.05)
    plan = pl.Plan("slow_fallback", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("fetch_features", stage="esr"),
        # The fallback itself takes 50 ms, ten times the region's budget.
        if_fail=lambda c: c.fill_defaults(["f_esr"]),
        budget={"base_ms": 5, "per_row_us": 0, "min_ms": 5, "max_ms": 5},
        on_timeout="fallback",
    )
    plan.task("call_models")
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(2))
    w = result.trace.wrappers["timeout_wrapper"]
    assert (w["chosen_branch"], w["success_elapsed_ms"]) == ("fail", 5.0)
    assert result.trace.span("task:call_models")["end_ms"] == pytest.approx(55.0)


def test_a_cpu_bound_task_that_overruns_the_region_is_not_waited_for() -> None:
    """A sync task that overruns the region cannot be interrupted: it runs in a worker thread,
    the region stops at its deadline (D5.7), its result is dropped and the fallback's values
    are committed instead."""
    reg = sample.make_registry()

    @reg.task(reads=["id"], writes=["f_lsr"])
    def cpu(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        _clock.sleep(0.02)  # virtual CPU time: nothing can interrupt it
        return {"f_lsr": pa.array([9.0] * rows.num_rows)}

    plan = pl.Plan("cpu", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("cpu"),
        if_fail=lambda c: c.fill_defaults(["f_lsr"]),
        budget={"base_ms": 10, "per_row_us": 0, "min_ms": 10, "max_ms": 10},
        on_timeout="fallback",
    )
    with warnings.catch_warnings():
        # The thread's virtual sleep may wake the region's timer before the thread returned:
        # then it is abandoned (and warned about) for the instant it still runs.
        warnings.simplefilter("ignore", tb.AbandonedThreadWarning)
        result = run(pl.Engine(reg), pl.compile(plan), sample.rows(2))
    assert result.rows.column("f_lsr").to_pylist() == [None, None]
    assert result.trace.span("timeout_wrapper/success/task:cpu")["outcome"] == "timed_out"
    assert result.trace.wrappers["timeout_wrapper"]["timed_out"] is True


def test_the_rowset_shape_is_unchanged_across_the_wrapper() -> None:
    """After sort and take, the wrapper keeps the active rows and their order."""
    reg = sample.make_registry()
    plan = pl.Plan("shape", catalog=reg)
    plan.sort("id", descending=True).take(3).timeout_wrapper(
        if_success=lambda c: c.task("call_models"),
        if_fail=lambda c: c.fill_defaults(["score_model"]),
        budget=BUDGET,
        on_timeout="fallback",
    )
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(6))
    assert result.rows.column("id").to_pylist() == [5, 4, 3]
    assert result.rows.column("score_model").to_pylist() == [2.5, 2.0, 1.5]
    assert result.trace.wrappers["timeout_wrapper"]["nrows"] == 3


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (pa.array([1.0, 2.0]), "2 values for 3 rows"),
        (pa.array([1, 2, 3]), "column is int64, the key holds double"),
        ([1.0, 2.0, 3.0], "must be a pyarrow Array"),
    ],
)
def test_a_bad_column_is_a_task_error_naming_task_and_key(column: Any, message: str) -> None:
    """A column of the wrong length or type fails the plan with the task and key named."""
    reg = sample.make_registry()

    @reg.task(reads=["id"], writes=["f_lsr"])
    def bad(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        return {"f_lsr": column}

    plan = pl.Plan("bad", catalog=reg).task("bad")
    assert isinstance(plan, pl.Plan)
    with pytest.raises(pl.TaskError, match=message) as info:
        run(pl.Engine(reg), pl.compile(plan), sample.rows(3))
    assert (info.value.task, info.value.key, info.value.node_id) == ("bad", "f_lsr", "task:bad")
    assert info.value.source_span is not None
    assert info.value.source_span["file"] == "tests/pipeline/test_engine.py"


def test_a_task_must_return_exactly_its_writes() -> None:
    """A missing declared key is a task error naming it."""
    reg = sample.make_registry()

    @reg.task(reads=["id"], writes=["f_lsr", "f_esr"])
    def half(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        return {"f_lsr": pa.nulls(rows.num_rows, type=pa.float64())}

    with pytest.raises(pl.TaskError, match="did not return key 'f_esr'"):
        run(pl.Engine(reg), pl.compile(pl.Plan("h", catalog=reg).task("half")), sample.rows(2))  # type: ignore[arg-type]


def test_params_and_origins_reach_the_task() -> None:
    """ctx.params holds the task's arguments and the resolved params; a P() argument reads a
    request param at run time; a plan param cannot be changed by the request."""
    reg = sample.make_registry()
    reg.param("tenant", pa.string())
    seen: list[dict[str, Any]] = []

    @reg.task(reads=["id"], writes=[])
    def look(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        seen.append(dict(ctx.params))
        return {}

    plan = pl.Plan("params", catalog=reg, params={"override_budget_ms": 3})
    plan.task("look", who=pl.P("tenant"), limit=7)
    run(
        pl.Engine(reg),
        pl.compile(plan),
        sample.rows(1),
        request_params={"tenant": "acme", "override_budget_ms": 99},
    )
    assert seen == [
        {"stage": "esr", "override_budget_ms": 3, "tenant": "acme", "who": "acme", "limit": 7}
    ]


def test_a_switch_on_a_request_param_is_resolved_at_run_time_outside_wrappers() -> None:
    """Outside a wrapper a may-write is allowed: the request's value picks the keys."""
    reg = sample.make_registry()
    plan = pl.Plan("switch", catalog=reg).task("fetch_features")
    result = run(
        pl.Engine(reg),
        pl.compile(plan),
        sample.rows(2),
        request_params={"stage": "lsr"},  # type: ignore[arg-type]
    )
    assert result.rows.column_names == ["id", "f_lsr"]


def test_hostile_run_inputs_are_named() -> None:
    """Unknown columns or params, wrong types and nulls in a non-nullable key are refused."""
    reg = sample.make_registry()
    artifact = pl.compile(sample.make_plan(reg))
    engine = pl.Engine(reg)
    cases: list[tuple[pa.Table, dict[str, Any], str]] = [
        (pa.table({"id": [1], "evil": [1]}), {}, "input column 'evil' is not a registered key"),
        (pa.table({"id": pa.array([1], pa.int32())}), {}, "input column 'id' is int32"),
        (pa.table({"id": pa.array([1, None], pa.int64())}), {}, "has nulls"),
        (pa.table({"score_model": pa.array([1.0])}), {}, "reads key 'id'"),
        (sample.rows(1), {"nope": 1}, "request param 'nope' is not registered"),
        (sample.rows(1), {"stage": 5}, "is not a valid string"),
    ]
    for rows, params, message in cases:
        with pytest.raises(pl.ValidationError, match=message):
            run(engine, artifact, rows, request_params=params)


def test_the_engine_revalidates_against_its_own_registry() -> None:
    """An artifact compiled against one registry is checked against the engine's tasks: there
    fetch_features writes keys only a request can pick."""
    reg = sample.make_registry()
    artifact = pl.compile(sample.make_plan(reg))
    other = sample.make_registry()
    other.tasks.pop("fetch_features")

    @other.task(reads=["id"], writes=pl.FromParam("stage"), name="fetch_features")
    def fetch_features(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        return {}

    # stage is bound by a constant in the plan, so FromParam is exact; an Unknown is not.
    other.tasks.pop("fetch_features")
    other.task(reads=["id"], writes=pl.Unknown(), name="fetch_features")(fetch_features)
    with pytest.raises(pl.ValidationError) as info:
        pl.Engine(other).prepare(artifact)
    assert info.value.rule == "writes_exact"


def test_an_engine_without_the_capability_refuses_the_artifact() -> None:
    """Capability gating: the message names the missing capability."""
    reg = sample.make_registry()
    artifact = pl.compile(sample.make_plan(reg))
    with pytest.raises(pl.ValidationError, match=re.escape(pl.CAPABILITY)) as info:
        pl.Engine(reg, capabilities=[]).prepare(artifact)
    assert info.value.rule == "capability"


def test_validated_plans_are_cached_per_capabilities() -> None:
    """The plan cache is keyed by plan digest and capabilities digest."""
    reg = sample.make_registry()
    artifact = pl.compile(sample.make_plan(reg))
    engine = pl.Engine(reg)
    engine.prepare(artifact)
    engine.prepare(pl.Artifact.from_json(artifact.to_json()))
    assert list(engine._cache) == [(artifact.digest, engine.capabilities_digest)]
    assert pl.Engine(reg, capabilities=[pl.CAPABILITY]).capabilities_digest == (
        engine.capabilities_digest
    )
    assert pl.Engine(reg, capabilities=["x"]).capabilities_digest != engine.capabilities_digest


def test_the_trace_nests_spans_and_finds_the_critical_path() -> None:
    """Spans nest under their wrapper with times relative to the run's start; the critical
    path goes through the branch that produced the result."""
    reg = sample.make_registry(fetch_features=1.0)
    result = run(pl.Engine(reg), pl.compile(sample.make_plan(reg)), sample.rows(4))
    spans = {s["node_id"]: s for s in result.trace.spans}
    fetch = spans["timeout_wrapper/success/task:fetch_features"]
    assert (fetch["parent"], fetch["op"], fetch["name"], fetch["start_ms"]) == (
        "timeout_wrapper",
        "task",
        "fetch_features",
        1.0,
    )
    assert fetch["outcome"] == "timed_out"
    assert [s["node_id"] for s in result.trace.critical_path()] == [
        "task:call_models",
        "timeout_wrapper",
        "timeout_wrapper/fail/fill_defaults",
        "vm:score_final",
    ]
    exported = result.trace.to_dict()
    assert exported["critical_path"] == [s["node_id"] for s in result.trace.critical_path()]


def test_opentelemetry_spans() -> None:
    """export_otel emits one span per node, branch nodes under their wrapper, wrapper fields
    as attributes."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    reg = sample.make_registry(fetch_features=1.0)
    result = run(pl.Engine(reg), pl.compile(sample.make_plan(reg)), sample.rows(4))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    result.trace.export_otel(provider.get_tracer("test"))
    spans = {s.attributes["timebound.node_id"]: s for s in exporter.get_finished_spans()}
    wrapper = spans["timeout_wrapper"]
    assert wrapper.attributes["timebound.wrapper.chosen_branch"] == "fail"
    child = spans["timeout_wrapper/fail/fill_defaults"]
    assert child.parent is not None and child.parent.span_id == wrapper.context.span_id
    provider.shutdown()


def test_the_same_plan_runs_on_trio() -> None:
    """The engine runs on trio too: the region times out and the fallback runs."""
    reg = sample.make_registry(fetch_features=1.0)
    artifact = pl.compile(sample.make_plan(reg))
    clock = VirtualClock()
    out: list[pl.RunOutput] = []

    async def main() -> None:
        out.append(await pl.Engine(reg).run(artifact, sample.rows(4)))

    with clock:
        trio.run(main, clock=clock.trio_clock())
    assert out[0].trace.wrappers["timeout_wrapper"]["chosen_branch"] == "fail"
    assert out[0].rows.column("f_esr").to_pylist() == [None] * 4


def test_run_sync() -> None:
    """run_sync runs a plan from synchronous code."""
    reg = pl.Catalog()
    reg.key("x", pa.int64())
    reg.key("y", pa.int64())
    plan = pl.Plan("sync", catalog=reg).vm("y", pl.col("x") * 2)
    result = pl.Engine(reg).run_sync(pl.compile(plan), pa.table({"x": [1, 2]}))  # type: ignore[arg-type]
    assert result.rows.to_pydict() == {"x": [1, 2], "y": [2, 4]}


def test_the_plan_cache_is_bounded() -> None:
    """The engine keeps the most recently used plans, up to plan_cache_size."""
    reg = sample.make_registry()
    engine = pl.Engine(reg, plan_cache_size=2)
    artifacts = [pl.compile(pl.Plan(f"p{i}", catalog=reg).take(i)) for i in range(3)]  # type: ignore[arg-type]
    for a in (artifacts[0], artifacts[1], artifacts[0], artifacts[2]):
        engine.prepare(a)
    assert [k[0] for k in engine._cache] == [artifacts[0].digest, artifacts[2].digest]


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"env": "staging"}, "env"),
        ({"capabilities": pl.CAPABILITY}, "capabilities"),
        ({"plan_cache_size": 0}, "plan_cache_size"),
    ],
)
def test_engine_options_are_checked(kwargs: dict[str, Any], option: str) -> None:
    """A bad engine option is a ConfigurationError naming it."""
    with pytest.raises(tb.ConfigurationError) as info:
        pl.Engine(sample.make_registry(), **kwargs)
    assert info.value.option == option


def test_a_malformed_budget_names_the_field() -> None:
    """Authoring mistakes in a wrapper's budget are schema errors that name the field."""
    reg = sample.make_registry()
    plan = pl.Plan("bad_budget", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("call_models"),
        if_fail=lambda c: c.fill_defaults(["score_model"]),
        budget={"base_ms": -1, "per_row_us": 0, "min_ms": 1, "max_ms": 5},
    )
    with pytest.raises(pl.ValidationError, match="base_ms") as info:
        pl.compile(plan)
    assert info.value.rule == "schema"


def test_nested_wrappers_roll_back_in_order() -> None:
    """An inner wrapper falls back inside an outer one that then runs out: the outer
    fallback's values are what remains, nothing from either success branch."""
    reg = sample.make_registry(fetch_features=1.0, call_models=0.0005)

    @reg.task(reads=["id"], writes=["f_lsr"])
    async def slow_lsr(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        await anyio.sleep(1)
        return {"f_lsr": pa.array([7.0] * rows.num_rows)}

    plan = pl.Plan("nested", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: (
            c.task("call_models")
            .timeout_wrapper(
                if_success=lambda i: i.task("fetch_features", stage="esr"),
                if_fail=lambda i: i.fill_defaults(["f_esr"]),
                budget={"base_ms": 1, "per_row_us": 0, "min_ms": 1, "max_ms": 1},
                on_timeout="fallback",
            )
            .task("slow_lsr")
        ),
        if_fail=lambda c: c.fill_defaults(["score_model", "f_esr", "f_lsr"]),
        budget={"base_ms": 3, "per_row_us": 0, "min_ms": 1, "max_ms": 3},
        on_timeout="fallback",
    )
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(2))
    assert result.rows.column("score_model").to_pylist() == [None, None]
    assert result.rows.column("f_esr").to_pylist() == [None, None]
    assert result.rows.column("f_lsr").to_pylist() == [None, None]
    w = result.trace.wrappers
    assert w["timeout_wrapper"]["chosen_branch"] == "fail"
    assert w["timeout_wrapper/success/timeout_wrapper"]["chosen_branch"] == "fail"


def test_an_outer_region_cuts_an_inner_wrapper_unsettled() -> None:
    """The outer region runs out while an inner wrapper is still running: the inner one never
    settles (no branch chosen) and both overlays are dropped."""
    reg = sample.make_registry(fetch_features=1.0)
    plan = pl.Plan("cut", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("call_models").timeout_wrapper(
            if_success=lambda i: i.task("fetch_features", stage="esr"),
            if_fail=lambda i: i.fill_defaults(["f_esr"]),
            budget={"base_ms": 50, "per_row_us": 0, "min_ms": 1, "max_ms": 50},
            on_timeout="fallback",
        ),
        if_fail=lambda c: c.fill_defaults(["score_model", "f_esr"]),
        budget={"base_ms": 3, "per_row_us": 0, "min_ms": 1, "max_ms": 3},
        on_timeout="fallback",
    ).vm("score_final", pl.col("score_model").fill_null(0.0) + 1.0)
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(2))
    assert result.rows.column("score_final").to_pylist() == [1.0, 1.0]
    inner = result.trace.wrappers["timeout_wrapper/success/timeout_wrapper"]
    assert (inner["chosen_branch"], inner["timed_out"]) == (None, False)


def test_an_inner_wrapper_commits_into_the_outer_one() -> None:
    """Both in time: the inner commit lands in the outer overlay, the outer commit keeps it."""
    reg = sample.make_registry()
    plan = pl.Plan("nested_ok", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("call_models").timeout_wrapper(
            if_success=lambda i: i.task("fetch_features", stage="esr"),
            if_fail=lambda i: i.fill_defaults(["f_esr"]),
            budget={"base_ms": 5, "per_row_us": 0, "min_ms": 1, "max_ms": 5},
            on_timeout="fallback",
        ),
        if_fail=lambda c: c.fill_defaults(["score_model", "f_esr"]),
        budget={"base_ms": 10, "per_row_us": 0, "min_ms": 1, "max_ms": 10},
        on_timeout="fallback",
    )
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(2))
    assert result.rows.column("f_esr").to_pylist() == [0.25, 1.25]
    assert result.rows.column("score_model").to_pylist() == [0.0, 0.5]


def test_branch_steps_run_in_order_and_plan_steps_by_their_data() -> None:
    """Inside a wrapper branch the steps run one after the other (RFC 0002 v1); in the plan,
    steps that touch different keys run together."""
    reg = sample.make_registry(fetch_features=0.003, call_models=0.002)
    plan = pl.Plan("order", catalog=reg)
    plan.task("fetch_features", stage="lsr").task("call_models")
    plan.timeout_wrapper(
        if_success=lambda c: c.task("fetch_features", stage="esr").task("call_models"),
        if_fail=lambda c: c.fill_defaults(["f_esr", "score_model"]),
        budget={"base_ms": 50, "per_row_us": 0, "min_ms": 1, "max_ms": 50},
        on_timeout="fallback",
    )
    result = run(pl.Engine(reg), pl.compile(plan), sample.rows(2))
    starts = {s["node_id"]: s["start_ms"] for s in result.trace.spans}
    assert starts["task:fetch_features"] == starts["task:call_models"] == 0.0
    assert starts["timeout_wrapper/success/task:fetch_features"] == pytest.approx(3.0)
    assert starts["timeout_wrapper/success/task:call_models"] == pytest.approx(6.0)


def test_trace_start_reads_the_clock_module() -> None:
    """The trace's wall-clock start comes from timebound's clock, so virtual time sets it."""
    reg = sample.make_registry()
    clock = VirtualClock(wall_start=1_767_225_600.0)
    result = clock.run(pl.Engine(reg).run(pl.compile(sample.make_plan(reg)), sample.rows(4)))
    assert result.trace.started_epoch_ns == 1_767_225_600_000_000_000


def test_a_task_skipped_after_its_region_timed_out_has_a_sane_span() -> None:
    """A task that never ran because its region had already timed out is a zero-length span at
    the moment it was skipped, not one starting ~10 minutes before the run (the monotonic
    clock's zero) that the trace viewer drew over its label column."""
    reg = sample.make_registry(call_models=1.0)
    plan = pl.Plan("skip", catalog=reg)
    plan.timeout_wrapper(
        # call_models (1 s) is cut at 5 ms; fetch_features after it never starts.
        if_success=lambda c: c.task("call_models").task("fetch_features", stage="esr"),
        if_fail=lambda c: c.fill_defaults(["f_esr", "score_model"]),
        budget={"base_ms": 5, "per_row_us": 0, "min_ms": 5, "max_ms": 5},
        on_timeout="fallback",
    )
    clock = VirtualClock(start=589.839)  # a monotonic clock far from zero, as on a real host
    result = clock.run(pl.Engine(reg).run(pl.compile(plan), sample.rows(3)))
    spans = {s["node_id"]: s for s in result.trace.spans}
    skipped = spans["timeout_wrapper/success/task:fetch_features"]
    assert skipped["outcome"] in {"skipped", "timed_out"}
    assert 0 <= skipped["ready_ms"] <= skipped["start_ms"] == skipped["end_ms"]
    assert skipped["start_ms"] == pytest.approx(5.0)
    assert all(s["start_ms"] >= 0 for s in result.trace.spans)
