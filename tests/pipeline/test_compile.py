"""pl.compile: lowering to fragments, determinism, the artifact format, every validation rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from timebound import pipeline as pl

from . import sample

ROOT = Path(__file__).resolve().parents[2]
BUDGET = {"base_ms": 2, "per_row_us": 20, "min_ms": 1, "max_ms": 15}


def wrapper(
    reg: pl.Catalog,
    success: Any,
    fail: Any,
    *,
    params: dict[str, Any] | None = None,
    before: Any = None,
    after: Any = None,
    **kw: Any,
) -> pl.Plan:
    plan = pl.Plan("p", catalog=reg, params=params)
    if before is not None:
        before(plan)
    plan.timeout_wrapper(if_success=success, if_fail=fail, budget=kw.pop("budget", BUDGET), **kw)
    if after is not None:
        after(plan)
    return plan


def rule_of(plan: pl.Plan) -> pl.ValidationError:
    with pytest.raises(pl.ValidationError) as info:
        pl.compile(plan)
    return info.value


def test_the_wrapper_node_has_the_rfc_shape() -> None:
    """A wrapper node carries success/fail fragment digests, budget, override,
    on_timeout and rowset_contract; both fragments are embedded."""
    artifact = pl.compile(sample.make_plan(sample.make_registry()))
    doc = json.loads(artifact.to_json())
    node = doc["nodes"][1]
    assert (node["node_id"], node["op"]) == ("timeout_wrapper", "timeout_wrapper")
    assert set(node["params"]) == {
        "success",
        "fail",
        "budget",
        "override",
        "on_timeout",
        "rowset_contract",
    }
    assert node["params"]["override"] == {
        "param_id": "param.override_budget_ms",
        "allow_sources": ["plan", "fragment"],
        "min_ms": 1,
        "max_ms": 20,
        "combine": "min",
    }
    for which in ("success", "fail"):
        digest = node["params"][which]["fragment_digest"]
        assert digest.startswith("sha256:") and digest in doc["fragments"]
    assert doc["capabilities_required"] == [pl.CAPABILITY]
    assert list(doc["extensions"]) == [pl.CAPABILITY]
    assert node["source_span"] == {"file": "tests/pipeline/sample.py", "line": 43}


def test_a_plan_without_wrappers_requires_no_capability() -> None:
    """capabilities_required lists only what the plan uses."""
    reg = sample.make_registry()
    artifact = pl.compile(pl.Plan("plain", catalog=reg).task("call_models"))  # type: ignore[arg-type]
    assert artifact.capabilities_required == []


def test_compiling_twice_gives_the_same_bytes() -> None:
    """The same plan compiles to byte-identical artifacts with the same digest."""
    a = pl.compile(sample.make_plan(sample.make_registry()))
    b = pl.compile(sample.make_plan(sample.make_registry()))
    assert a.to_json() == b.to_json()
    assert a.digest == b.digest


def test_another_process_compiles_the_same_bytes() -> None:
    """Determinism across processes (hash seeds differ): the artifact bytes are identical."""
    outputs = []
    for seed in ("1", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.pipeline.sample"],
            cwd=ROOT,
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            check=True,
            timeout=60,
        )
        outputs.append(proc.stdout)
    here = pl.compile(sample.make_plan(sample.make_registry())).to_json()
    assert outputs[0] == outputs[1] == here


def test_an_artifact_round_trips_on_its_own() -> None:
    """from_json(to_json()) loads the plan and its fragments; the digest is preserved."""
    artifact = pl.compile(sample.make_plan(sample.make_registry()))
    loaded = pl.Artifact.from_json(artifact.to_json())
    assert loaded.digest == artifact.digest
    assert loaded.fragments == artifact.fragments


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(extra=1), "Additional properties"),
        (lambda d: d["nodes"][0].update(surprise=True), "Additional properties"),
        (lambda d: d["nodes"][1]["params"].update(rowset_contract="mutate"), "preserve"),
        (lambda d: d.update(schema="timebound.pipeline.plan/v9"), "schema"),
        (lambda d: d["nodes"][0].update(op="exec"), "op"),
    ],
)
def test_unknown_or_wrong_fields_are_rejected(mutate: Any, message: str) -> None:
    """Fail-closed: anything the schema does not know is refused, naming where."""
    doc = json.loads(pl.compile(sample.make_plan(sample.make_registry())).to_json())
    mutate(doc)
    with pytest.raises(pl.ValidationError, match=message) as info:
        pl.Artifact.from_json(json.dumps(doc))
    assert info.value.rule == "schema"


@pytest.mark.parametrize(
    "data",
    [b"", b"{", b"[]", b'{"a": NaN}', b"\xff\xfe", b"[" * 100_000, b"x" * (17 * 1024 * 1024)],
)
def test_hostile_bytes_are_a_schema_error(data: bytes) -> None:
    """Garbage, NaN, deep nesting and oversized input give a ValidationError, never a crash."""
    with pytest.raises(pl.ValidationError) as info:
        pl.Artifact.from_json(data)
    assert info.value.rule == "schema"


def test_a_tampered_fragment_is_detected() -> None:
    """A fragment whose content does not match its digest is refused."""
    doc = json.loads(pl.compile(sample.make_plan(sample.make_registry())).to_json())
    fragment = next(iter(doc["fragments"].values()))
    fragment["nodes"][0]["source_span"]["line"] += 1
    with pytest.raises(pl.ValidationError, match="does not match its content"):
        pl.Artifact.from_json(json.dumps(doc))


def test_rule_closure_for_a_key_written_after_the_wrapper() -> None:
    """closure: a branch may read only keys available at the wrapper's input."""
    reg = sample.make_registry()

    @reg.task(reads=["score_final"], writes=["f_lsr"])
    def uses_final(ctx: pl.TaskContext, rows: pa.Table) -> dict[str, Any]:
        return {}

    plan = wrapper(
        reg,
        lambda c: c.task("uses_final"),
        lambda c: c.fill_defaults(["f_lsr"]),
        after=lambda p: p.vm("score_final", pl.col("id") * 1.0),
    )
    err = rule_of(plan)
    assert (err.rule, err.node_id) == ("closure", "timeout_wrapper/success/task:uses_final")
    assert err.source_span is not None and err.source_span["file"].endswith("test_compile.py")


def test_rule_closure_for_a_branch_that_extends_the_outer_chain() -> None:
    """closure: a branch function must return the chain it was given, not an outer one."""
    reg = sample.make_registry()
    outer = pl.Plan("outer", catalog=reg)
    outer.timeout_wrapper(
        if_success=lambda c: outer.task("call_models"),
        if_fail=lambda c: c.fill_defaults(["score_model"]),
        budget=BUDGET,
    )
    assert rule_of(outer).rule == "closure"


@pytest.mark.parametrize(
    "op",
    [
        lambda c: c.filter(pl.col("id") > 1),
        lambda c: c.sort("id"),
        lambda c: c.take(1),
        lambda c: c.dedupe("id"),
    ],
)
def test_rule_preserve_for_rowset_ops(op: Any) -> None:
    """preserve: filter, sort, take and dedupe are not allowed inside a branch."""
    reg = sample.make_registry()
    plan = wrapper(
        reg, lambda c: op(c).task("call_models"), lambda c: c.fill_defaults(["score_model"])
    )
    assert rule_of(plan).rule == "preserve"


@pytest.mark.parametrize("rowset", ["mutate", "unknown"])
def test_rule_preserve_for_tasks(rowset: Any) -> None:
    """preserve: a task declared rowset-mutating or unknown is refused in a branch."""
    reg = sample.make_registry()
    reg.task(reads=["id"], writes=["f_lsr"], rowset=rowset, name="shaky")(lambda ctx, rows: {})
    plan = wrapper(reg, lambda c: c.task("shaky"), lambda c: c.fill_defaults(["f_lsr"]))
    err = rule_of(plan)
    assert (err.rule, err.node_id) == ("preserve", "timeout_wrapper/success/task:shaky")


def test_rule_writes_exact_fails_on_runtime_params() -> None:
    """writes_exact: a Switch on a request-bound param (P or unbound) is not exact."""
    reg = sample.make_registry()
    for success in (
        lambda c: c.task("fetch_features", stage=pl.P("stage")),
        lambda c: c.task("fetch_features"),
    ):
        plan = wrapper(reg, success, lambda c: c.fill_defaults(["f_esr"]))
        err = rule_of(plan)
        assert (err.rule, err.details["kind"]) == ("writes_exact", "may")


def test_a_plan_param_makes_a_switch_exact() -> None:
    """A plan param is a link-time constant: the Switch it drives is exact."""
    reg = sample.make_registry()
    plan = wrapper(
        reg,
        lambda c: c.task("fetch_features", stage=pl.P("stage")),
        lambda c: c.fill_defaults(["f_lsr"]),
        params={"stage": "lsr"},
    )
    pl.compile(plan)


def test_rule_writes_exact_for_unknown_effects() -> None:
    """writes_exact: an Unknown write effect can never be inside a wrapper."""
    reg = sample.make_registry()
    reg.task(reads=["id"], writes=pl.Unknown(), name="opaque")(lambda ctx, rows: {})
    plan = wrapper(reg, lambda c: c.task("opaque"), lambda c: c.fill_defaults(["f_lsr"]))
    assert rule_of(plan).details["kind"] == "unknown"


def test_rule_shape_equality_lists_the_diff() -> None:
    """shape_equality: the details list missing and extra keys per branch."""
    reg = sample.make_registry()
    plan = wrapper(
        reg,
        lambda c: c.task("fetch_features", stage="esr").task("call_models"),
        lambda c: c.fill_defaults(["score_model", "f_lsr"]),
    )
    err = rule_of(plan)
    assert err.rule == "shape_equality"
    assert err.details == {
        "success": {"missing": ["f_lsr"], "extra": ["f_esr"]},
        "fail": {"missing": ["f_esr"], "extra": ["f_lsr"]},
    }


def test_rule_override_clamp() -> None:
    """override_clamp: an override without min_ms and max_ms is refused."""
    reg = sample.make_registry()
    plan = wrapper(
        reg,
        lambda c: c.task("call_models"),
        lambda c: c.fill_defaults(["score_model"]),
        override={"param": "override_budget_ms", "allow_sources": ["plan"], "max_ms": 20},
    )
    assert rule_of(plan).rule == "override_clamp"


def test_rule_override_origin_at_compile_time() -> None:
    """override_origin: a plan-origin override that allow_sources does not list."""
    reg = sample.make_registry()
    plan = wrapper(
        reg,
        lambda c: c.task("call_models"),
        lambda c: c.fill_defaults(["score_model"]),
        params={"override_budget_ms": 5},
        override={
            "param": "override_budget_ms",
            "allow_sources": ["request"],
            "min_ms": 1,
            "max_ms": 20,
        },
    )
    err = rule_of(plan)
    assert (err.rule, err.details["origin"]) == ("override_origin", "plan")


def test_rule_capability_when_the_artifact_omits_it() -> None:
    """capability: an artifact using timeout_wrapper must list the capability."""
    doc = json.loads(pl.compile(sample.make_plan(sample.make_registry())).to_json())
    doc["capabilities_required"] = []
    doc["extensions"] = {}
    artifact = pl.Artifact.from_json(json.dumps(doc))
    with pytest.raises(pl.ValidationError, match="does not list capability") as info:
        pl.Engine(sample.make_registry()).prepare(artifact)
    assert info.value.rule == "capability"


def test_fill_defaults_needs_a_default_or_null() -> None:
    """fill_defaults on a non-nullable key without default is a validation error."""
    reg = sample.make_registry()
    err = rule_of(pl.Plan("f", catalog=reg).fill_defaults(["id"]))  # type: ignore[arg-type]
    assert (err.rule, err.details["key"]) == ("fill_defaults", "id")


def test_expressions_are_type_checked() -> None:
    """A vm whose expression cannot produce the key's type, or a non-boolean filter, fails."""
    reg = sample.make_registry()
    reg.key("label", pa.string(), nullable=True)
    assert rule_of(pl.Plan("e", catalog=reg).vm("label", pl.col("id") + 1)).rule == "type"  # type: ignore[arg-type]
    assert rule_of(pl.Plan("e", catalog=reg).filter(pl.col("id") + 1)).rule == "type"  # type: ignore[arg-type]
    assert rule_of(pl.Plan("e", catalog=reg).vm("nope", pl.col("id"))).rule == "reference"  # type: ignore[arg-type]


def test_unknown_references_are_named() -> None:
    """Unknown tasks and params are reference errors naming the node."""
    reg = sample.make_registry()
    err = rule_of(pl.Plan("r", catalog=reg).task("missing"))  # type: ignore[arg-type]
    assert (err.rule, err.node_id) == ("reference", "task:missing")
    err = rule_of(pl.Plan("r", catalog=reg, params={"ghost": 1}))
    assert err.rule == "reference"


def test_node_ids_come_from_the_definition() -> None:
    """Node ids name the op (and task or key); inserting a node elsewhere renames nothing."""
    reg = sample.make_registry()
    a = pl.compile(pl.Plan("ids", catalog=reg).task("call_models").sort("id"))  # type: ignore[arg-type]
    b = pl.compile(pl.Plan("ids", catalog=reg).take(5).task("call_models").sort("id"))  # type: ignore[arg-type]
    ids = [n["node_id"] for n in b.plan["nodes"]]
    assert [n["node_id"] for n in a.plan["nodes"]] == ["task:call_models", "sort"]
    assert ids == ["take", "task:call_models", "sort"]


@pytest.mark.parametrize("depth", [65, 800, 5000])
def test_deeply_nested_expressions_are_refused(depth: int) -> None:
    """A hostile artifact with an absurdly deep expression is a ValidationError, never a
    RecursionError."""
    reg = sample.make_registry()
    plan = pl.Plan("deep", catalog=reg).vm("score_final", pl.col("score_model").fill_null(0.0))
    doc = json.loads(pl.compile(plan).to_json())  # type: ignore[arg-type]
    doc["nodes"][0]["params"]["expr"] = {"col": "HOLE"}
    deep = '{"fn":"negate","args":[' * depth + '{"col":"id"}' + "]}" * depth
    data = json.dumps(doc, separators=(",", ":")).replace('{"col":"HOLE"}', deep)
    with pytest.raises(pl.ValidationError) as info:
        pl.Engine(reg).prepare(pl.Artifact.from_json(data))
    assert info.value.rule == "schema"
