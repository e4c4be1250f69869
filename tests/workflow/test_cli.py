"""``timebound workflow schema|validate|run``: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timebound.cli import main
from timebound.workflow import schema

ACTIONS = """
import asyncio

async def work(ctx):
    await asyncio.sleep((ctx.input or {}).get("sleep", 0))
    return {"ok": True}
"""

DEFINITION = """
id: demo
timeout_ms: 60000
initial_node: A
actions:
  - {id: act, kind: python, implementation: {handler: work}}
nodes:
  - {id: A, action_id: act, timeout_ms: 200}
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "acts.py").write_text(ACTIONS)
    (tmp_path / "wf.yaml").write_text(DEFINITION)
    return tmp_path / "wf.yaml", tmp_path / "acts.py"


def test_schema_prints_the_shipped_schema(capsys) -> None:
    """workflow schema prints the package's JSON Schema."""
    assert main(["workflow", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == schema()


def test_validate_accepts_a_valid_file(files, capsys) -> None:
    """A valid definition exits 0 and says so."""
    assert main(["workflow", "validate", str(files[0])]) == 0
    assert "valid (workflow 'demo'" in capsys.readouterr().out


def test_validate_names_the_broken_field(tmp_path, capsys) -> None:
    """An invalid definition exits 1 naming the path of the field."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(DEFINITION.replace("timeout_ms: 200", "timeout_ms: -1"))
    assert main(["workflow", "validate", str(bad)]) == 1
    assert "nodes[0].timeout_ms" in capsys.readouterr().err


def test_run_completes_and_prints_the_output(files, capsys) -> None:
    """run exits 0 on completion, showing tokens as they move and the output."""
    assert main(["workflow", "run", str(files[0]), "--actions", str(files[1])]) == 0
    out = capsys.readouterr().out
    assert "token A: executing" in out and "status: completed" in out
    assert '"ok": true' in out


def test_run_reports_which_bound_fired(files, capsys) -> None:
    """A node timeout shows the bound and the policy, and the exit code says failed."""
    args = ["workflow", "run", str(files[0]), "--actions", str(files[1]), "--input", '{"sleep": 5}']
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "timed out (node bound, 200ms, set by node A, policy fail)" in out
    assert "error: node 'A' timed out after 200ms" in out


def test_run_rejects_bad_input_json(files, capsys) -> None:
    """--input that is not JSON is a usage error (exit 2)."""
    args = ["workflow", "run", str(files[0]), "--actions", str(files[1]), "--input", "{"]
    assert main(args) == 2
    assert "--input is not JSON" in capsys.readouterr().err


def test_run_rejects_an_unimportable_actions_module(files, capsys) -> None:
    """--actions naming nothing importable is a usage error (exit 2)."""
    assert main(["workflow", "run", str(files[0]), "--actions", "no_such_module_xyz"]) == 2
    assert "cannot import" in capsys.readouterr().err
