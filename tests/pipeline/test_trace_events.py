"""The trace is a view over telemetry events (D10.10): what a listener hears of a pipeline run is
what the trace, its viewer and the CLI's timeline show."""

from __future__ import annotations

import pickle

import pyarrow as pa

from timebound import pipeline as pl
from timebound.host._traces import read_trace, trace_view
from timebound.pipeline._trace import SPAN_FIELDS
from timebound.telemetry import Event, add_listener, correlation, describe
from timebound.testing import VirtualClock

from . import sample


def _cut_region() -> tuple[pl.Catalog, pl.Artifact]:
    """A region whose success branch (1 ms, then 1 s) is cut at 5 ms; the fallback runs."""
    reg = sample.make_registry(call_models=1.0)
    plan = pl.Plan("cut", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("fetch_features", stage="esr").task("call_models"),
        if_fail=lambda c: c.fill_defaults(["f_esr", "score_model"]),
        budget={"base_ms": 5, "per_row_us": 0, "min_ms": 5, "max_ms": 5},
        on_timeout="fallback",
    )
    return reg, pl.compile(plan)


def _run(
    reg: pl.Catalog, artifact: pl.Artifact, rows: pa.Table
) -> tuple[pl.RunOutput, list[Event]]:
    """The run and the end events its listener heard (the trace's events), in the trace's
    order; the listener hears them as each span ends, and starts too (D10.11)."""
    heard: list[Event] = []
    remove = add_listener(lambda e: heard.append(e) if e.kind == "pipeline" else None)
    try:
        with correlation("request", "req-7"):
            result = VirtualClock().run(pl.Engine(reg).run(artifact, rows))
    finally:
        remove()
    order = [e.attrs["node_id"] for e in result.trace.events()]
    ended = [e for e in heard if e.name in ("pipeline.task", "pipeline.region")]
    return result, sorted(ended, key=lambda e: order.index(e.attrs["node_id"]))


def test_a_listener_hears_the_trace_as_events() -> None:
    """One event per task and region that ran, the same records the trace is read from: names,
    attributes, correlation (the request it served, the task) and instants."""
    reg, artifact = _cut_region()
    result, heard = _run(reg, artifact, sample.rows(3))
    trace = result.trace
    assert heard, "no pipeline event reached the listener"
    assert [(e.name, dict(e.attrs), dict(e.correlation), e.epoch_ms) for e in heard] == [
        (e.name, dict(e.attrs), dict(e.correlation), e.epoch_ms) for e in trace.events()
    ]
    assert [{k: e.attrs[k] for k in SPAN_FIELDS} for e in heard] == trace.spans
    assert all(e.correlation["request"] == "req-7" for e in heard)
    assert {e.correlation["task"] for e in heard} == {s["node_id"] for s in trace.spans}
    names = {e.attrs["node_id"]: e.name for e in heard}
    assert names["timeout_wrapper"] == "pipeline.region"
    assert names["timeout_wrapper/success/task:call_models"] == "pipeline.task"
    # Each event sits at its span's end, on both clocks.
    started_ms = trace.started_epoch_ns // 1_000_000
    for e in heard:
        assert e.at == trace.base + e.attrs["end_ms"] / 1000.0
        assert e.epoch_ms is not None and e.epoch_ms - started_ms == int(e.attrs["end_ms"])


def test_a_cut_region_carries_its_bound_and_reads_as_one_line() -> None:
    """The region whose deadline fired carries the bound (region, its length, set by it); the one
    text timeline describes the region and its tasks from the events."""
    reg, artifact = _cut_region()
    result, heard = _run(reg, artifact, sample.rows(3))
    (region,) = [e for e in heard if e.name == "pipeline.region"]
    assert region.bound is not None
    assert (region.bound.source, region.bound.timeout, region.bound.set_by) == (
        "region",
        0.005,
        "region timeout_wrapper",
    )
    assert region.attrs["wrapper"] == result.trace.wrappers["timeout_wrapper"]
    assert all(e.bound is None for e in heard if e.name == "pipeline.task")
    assert describe(region) == (
        "region timeout_wrapper: timed out (region bound, 5ms, set by region timeout_wrapper) "
        "-> fail branch"
    )
    cut = next(e for e in heard if e.attrs["node_id"].endswith("call_models"))
    assert describe(cut) == "task timeout_wrapper/success/task:call_models: timed_out"


def test_the_trace_viewer_draws_what_the_listener_heard() -> None:
    """The exported trace, read back by the host's viewer, draws one bar per event heard, at the
    event's instants."""
    reg, artifact = _cut_region()
    result, heard = _run(reg, artifact, sample.rows(3))
    view = trace_view(read_trace(result.trace.to_json()))
    bars = {b["label"]: (b["start_ms"], b["end_ms"], b["css"]) for b in view["bars"]}
    assert set(bars) == {e.attrs["node_id"] for e in heard}
    for e in heard:
        start, end, _ = bars[e.attrs["node_id"]]
        assert (start, end) == (e.attrs["start_ms"], e.attrs["end_ms"])


def test_a_trace_pickles_with_the_ids_of_the_run_it_served() -> None:
    """A PlanTimeout carries its trace across processes: the trace, its correlation ids included,
    pickles and reads back the same events."""
    reg, artifact = _cut_region()
    result, heard = _run(reg, artifact, sample.rows(3))
    again = pickle.loads(pickle.dumps(result.trace))
    assert again.spans == result.trace.spans
    assert [dict(e.correlation) for e in again.events()] == [dict(e.correlation) for e in heard]
