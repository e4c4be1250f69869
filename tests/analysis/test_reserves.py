"""The check's reserve findings (D14.7): a reserve that can never fit, with where it is
written, its numbers and a fix, in text and in ``--json``."""

from __future__ import annotations

import copy
import json
import pathlib
from typing import Any

import pytest

pytest.importorskip("jsonschema")

from timebound.analysis import check_constellation, check_policy, check_workflow
from timebound.policies import Policy

from .test_cli import report, run

FLOW: dict[str, Any] = {
    "id": "w",
    "timeout_ms": 5_000,
    "initial_node": "a",
    "actions": [
        {
            "id": "x",
            "kind": "python",
            "implementation": {"handler": "x"},
            "execution": {"timeout_ms": 10_000},
        }
    ],
    "nodes": [{"id": "a", "action_id": "x", "reserve_ms": 6_000}],
    "transitions": [],
}


def test_t032_a_node_reserve_at_or_above_the_workflow_timeout() -> None:
    """Shorter than the node's 10 s (so the definition takes it), not than the run's 5 s."""
    report_ = check_workflow(FLOW, file="flow.json")
    (f,) = [f for f in report_.findings if f.code == "TB-T032"]
    assert f.severity == "error" and not report_.ok
    assert str(f.where) == "flow.json: $.nodes[0].reserve_ms"
    assert f.numbers == {"reserve": 6.0, "budget": 5.0}
    assert "refused at once" in f.message and f.fix is not None


def test_t032_names_the_actions_reserve_and_the_callers_budget() -> None:
    flow = copy.deepcopy(FLOW)
    del flow["nodes"][0]["reserve_ms"]
    flow["actions"][0]["execution"]["reserve_ms"] = 2_000
    assert "TB-T032" not in check_workflow(flow).codes()
    (f,) = [f for f in check_workflow(flow, budget="2s").findings if f.code == "TB-T032"]
    assert f.where.path == "$.actions[0].execution.reserve_ms"
    assert "the caller's budget" in f.message


def test_t033_a_region_reserve_at_or_above_the_callers_budget() -> None:
    pa = pytest.importorskip("pyarrow")
    from timebound import pipeline as pl
    from timebound.analysis import check_pipeline

    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("b", pa.float64(), nullable=True)
    reg.task(reads=["id"], writes=["b"], name="t")(lambda ctx, rows: {})
    plan = pl.Plan("p", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("t"),
        if_fail=lambda c: c.fill_defaults(["b"]),
        budget={"base_ms": 40, "per_row_us": 0, "min_ms": 1, "max_ms": 40},
        on_timeout="fallback",
        reserve="20ms",
    )
    assert "TB-T033" not in check_pipeline(plan, budget="30ms").codes()
    report_ = check_pipeline(plan, budget="20ms", file="rank.json")
    (f,) = [f for f in report_.findings if f.code == "TB-T033"]
    assert str(f.where) == "rank.json: $.nodes[0].params.reserve_ms"
    assert f.numbers == {"reserve": 0.02, "budget": 0.02}
    assert "the caller's budget" in f.message


def test_t033_a_hand_written_reserve_at_or_above_max_ms() -> None:
    """A document the compiler would refuse (rule ``reserve``) is still read by the check."""
    pa = pytest.importorskip("pyarrow")
    from timebound import pipeline as pl
    from timebound.analysis import check_pipeline

    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("b", pa.float64(), nullable=True)
    reg.task(reads=["id"], writes=["b"], name="t")(lambda ctx, rows: {})
    plan = pl.Plan("p", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("t"),
        if_fail=lambda c: c.fill_defaults(["b"]),
        budget={"base_ms": 40, "per_row_us": 0, "min_ms": 1, "max_ms": 40},
        reserve="10ms",
    )
    doc = json.loads(pl.compile(plan).to_json())
    doc["nodes"][0]["params"]["reserve_ms"] = 40
    (f,) = [f for f in check_pipeline(json.dumps(doc)).findings if f.code == "TB-T033"]
    assert "longest budget (budget.max_ms)" in f.message
    assert f.numbers == {"reserve": 0.04, "budget": 0.04}


def test_t034_a_policy_reserve_that_takes_the_whole_budget() -> None:
    policy = Policy("fetch", timeout="100ms", retry=2, reserve="500ms", fallback=None)
    assert "TB-T034" not in check_policy(policy, budget=1.0).codes()
    report_ = check_policy(policy, budget=0.5)
    (f,) = [f for f in report_.findings if f.code == "TB-T034"]
    assert f.where.parameter == "reserve" and not report_.ok
    assert f.numbers == {"reserve": 0.5, "budget": 0.5}


def test_the_loop_is_checked_under_the_budget_less_the_reserve() -> None:
    """Three attempts of 100 ms fit a 400 ms budget, not the 200 ms its reserve leaves; and
    the fallback, run in the reserve, is not reported as starved (TB-T005)."""
    plain = Policy("fetch", timeout="100ms", retry=2, fallback=None)
    kept = Policy("fetch", timeout="100ms", retry=2, fallback=None, reserve="200ms")
    assert "TB-T002" not in check_policy(plain, budget=0.4).codes()
    assert "TB-T002" in check_policy(kept, budget=0.4).codes()
    assert "TB-T005" in check_policy(plain, budget=0.25).codes()
    assert "TB-T005" not in check_policy(kept, budget=0.4).codes()


def test_t034_on_a_constellation_call() -> None:
    program = 'in k: String\nv = Lookup(k) with reserve: 2s, fallback: "x"\nout v\n'
    assert "TB-T034" not in check_constellation(program, budget="3s").codes()
    (f,) = [f for f in check_constellation(program, budget="2s").findings if f.code == "TB-T034"]
    assert (f.where.line, f.where.parameter) == (2, "reserve")


def test_json_output_of_a_reserve_finding(tmp_path: pathlib.Path) -> None:
    (tmp_path / "flow.json").write_text(json.dumps(FLOW))
    result = run("flow.json", "--json", cwd=tmp_path)
    assert result.returncode == 1
    (f,) = [f for f in report(result)["findings"] if f["code"] == "TB-T032"]
    assert f["severity"] == "error"
    assert f["where"]["path"] == "$.nodes[0].reserve_ms"
    assert f["numbers"] == {"reserve_ms": 6000.0, "budget_ms": 5000.0}
    assert f["fix"]


def test_a_finding_under_a_reserve_names_the_budget_less_the_reserve() -> None:
    kept = Policy("fetch", timeout="100ms", retry=2, fallback=None, reserve="200ms")
    (f,) = [f for f in check_policy(kept, budget=0.4).findings if f.code == "TB-T002"]
    assert "the caller's budget less the reserve" in f.message
    assert f.numbers["budget"] == pytest.approx(0.2)
