"""``timebound check`` in a subprocess: text, --json against its schema, exit codes 0/1/2."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from timebound._json import SchemaValidator
from timebound.analysis import report_schema

VALIDATOR = SchemaValidator(report_schema())


def run(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "timebound", "check", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def report(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout)
    problem = VALIDATOR.first_problem(doc)
    assert problem is None, problem
    return doc


PROGRAM = "in x: Int\ny = Fetch(x) with timeout: 1s, retry: 3, delay: 500ms\nout y\n"

WORKFLOW = {
    "id": "w",
    "timeout_ms": 60_000,
    "initial_node": "a",
    "actions": [
        {
            "id": "x",
            "kind": "python",
            "implementation": {"handler": "x"},
            "execution": {"timeout_ms": 10_000},
        }
    ],
    "nodes": [
        {"id": "a", "action_id": "x"},
        {"id": "b", "action_id": "x"},
        {"id": "c", "action_id": "x", "timeout_ms": 90_000},
    ],
    "transitions": [
        {"id": "fan", "from": "a", "to": "b", "spawn_count": 3},
        {
            "id": "join",
            "from": "b",
            "to": "c",
            "synchronization": {"strategy": "all", "sibling_group": "fan"},
        },
    ],
}


def test_a_program_with_a_contradiction_exits_1(tmp_path: pathlib.Path) -> None:
    """Text output: the finding at file:line:col, its fix, the summary; exit 1."""
    (tmp_path / "p.cst").write_text(PROGRAM)
    result = run("p.cst", "--budget", "2s", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("p.cst:2:32 (retry): error TB-T002: attempt 3 of 4 never starts")
    assert lines[1].startswith("    fix: ")
    assert lines[-1] == "p.cst: worst-case time: 1 error, 0 warnings, 1 note"


def test_a_program_without_a_budget_exits_0(tmp_path: pathlib.Path) -> None:
    """Without a budget the same program has only its worst case: exit 0, ok summary last."""
    (tmp_path / "p.cst").write_text(PROGRAM)
    result = run("p.cst", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("p.cst: ok without modules")


def test_program_json_validates_against_the_schema(tmp_path: pathlib.Path) -> None:
    """--json: the report with the program's diagnostics, valid against report.schema.json."""
    (tmp_path / "p.cst").write_text(PROGRAM)
    result = run("p.cst", "--budget", "2s", "--json", cwd=tmp_path)
    assert result.returncode == 1
    doc = report(result)
    assert doc["kind"] == "constellation" and doc["ok"] is False
    assert doc["counts"] == {"error": 1, "warning": 0, "info": 1}
    first = doc["findings"][0]
    assert first["code"] == "TB-T002"
    assert first["where"] == {
        "file": "p.cst",
        "line": 2,
        "column": 32,
        "path": None,
        "parameter": "retry",
    }
    assert first["numbers"]["budget_ms"] == 2000.0 and first["numbers"]["attempt"] == 3
    assert doc["compile_errors"] == 0 and doc["budget_ms"] == 2000.0


def test_a_program_that_does_not_compile_exits_1(tmp_path: pathlib.Path) -> None:
    """Compile errors are printed as before; --json lists them as diagnostics."""
    (tmp_path / "p.cst").write_text("y = F(1) with timeout: 0s\nout y\n")
    assert run("p.cst", cwd=tmp_path).returncode == 1
    result = run("p.cst", "--json", cwd=tmp_path)
    assert result.returncode == 1
    doc = report(result)
    assert doc["diagnostics"][0]["code"] == "E016" and doc["ok"] is False


def test_a_workflow_json(tmp_path: pathlib.Path) -> None:
    """A workflow definition: JSON paths, the computed default with its inputs."""
    (tmp_path / "flow.json").write_text(json.dumps(WORKFLOW))
    result = run("flow.json", "--json", cwd=tmp_path)
    assert result.returncode == 1
    doc = report(result)
    assert [(f["code"], f["where"]["path"]) for f in doc["findings"]] == [
        ("TB-T010", "$.nodes[2].timeout_ms"),
        ("TB-T013", "$.transitions[1].synchronization.timeout_ms"),
    ]
    assert doc["findings"][1]["numbers"] == {
        "max_action_timeout_ms": 10_000.0,
        "spawn_count": 3,
        "default_ms": 45_000.0,
    }


def test_a_workflow_yaml_with_kind(tmp_path: pathlib.Path) -> None:
    """--kind names the input; a clean definition exits 0 with an ok summary."""
    pytest.importorskip("yaml")
    clean = {**WORKFLOW, "nodes": [*WORKFLOW["nodes"][:2], {"id": "c", "action_id": "x"}]}
    (tmp_path / "flow.conf").write_text(json.dumps(clean))
    result = run("flow.conf", "--kind", "workflow", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "flow.conf: ok (worst-case time: 0 errors, 0 warnings, 1 note)"
    )


def test_a_module_of_policies(tmp_path: pathlib.Path) -> None:
    """A .py file's resilient policies, with the function's file and line."""
    (tmp_path / "tbcli_policies.py").write_text(
        textwrap.dedent(
            """
        import timebound as tb

        @tb.resilient(timeout="5s", retry=3, total_timeout="4s")
        def charge() -> None: ...
        """
        )
    )
    result = run("tbcli_policies.py", cwd=tmp_path)
    assert result.returncode == 1
    assert f"{tmp_path / 'tbcli_policies.py'}:4 (timeout): error TB-T004" in result.stdout
    by_name = run("tbcli_policies", "--kind", "policy", "--json", cwd=tmp_path)
    assert by_name.returncode == 1
    assert report(by_name)["kind"] == "policy"


def test_a_pipeline_artifact(tmp_path: pathlib.Path) -> None:
    """A compiled plan's JSON: the region's min_ms at the caller's budget."""
    pa = pytest.importorskip("pyarrow")
    from timebound import pipeline as pl

    reg = pl.Catalog()
    reg.key("id", pa.int64())
    reg.key("b", pa.float64(), nullable=True)
    reg.task(reads=["id"], writes=["b"], name="t")(lambda ctx, rows: {})
    plan = pl.Plan("p", catalog=reg)
    plan.timeout_wrapper(
        if_success=lambda c: c.task("t"),
        if_fail=lambda c: c.fill_defaults(["b"]),
        budget={"base_ms": 40, "per_row_us": 0, "min_ms": 40, "max_ms": 40},
    )
    (tmp_path / "rank.json").write_bytes(pl.compile(plan).to_json())
    result = run("rank.json", "--budget", "30ms", "--json", cwd=tmp_path)
    assert result.returncode == 1
    assert report(result)["findings"][0]["code"] == "TB-T020"


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        ({}, ["missing.json"], "cannot read missing.json"),
        ({"notes.txt": "hello"}, ["notes.txt"], "--kind"),
        ({"x.cst": "y = 1\nout y\n"}, ["x.cst", "--budget", "-1s"], "a positive duration"),
        ({"bad.json": '{"initial_node": 1'}, ["bad.json", "--kind", "workflow"], "not valid JSON"),
        (
            {"deep.json": '{"initial_node": "a", "x": ' + "[" * 5000 + "]" * 5000 + "}"},
            ["deep.json"],
            "nested",
        ),
        (
            {"huge.json": json.dumps({**WORKFLOW, "timeout_ms": 10**400})},
            ["huge.json"],
            "timeout_ms",
        ),
        ({"bad.py": "raise RuntimeError('no')\n"}, ["bad.py"], "RuntimeError: no"),
        ({"f.json": "{}"}, ["f.json", "--kind", "workflow", "--modules", "m"], "--modules"),
        ({"p.json": '{"schema": "timebound.pipeline.plan/v1", "x": 1e999}'}, ["p.json"], ""),
    ],
)
def test_unreadable_or_hostile_input_exits_2(
    tmp_path: pathlib.Path, files: dict[str, str], args: list[str], message: str
) -> None:
    """Input that cannot be read: one line on stderr, exit 2, never a traceback."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    result = run(*args, cwd=tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("timebound check: ")
    assert message in result.stderr
    assert "Traceback" not in result.stderr
