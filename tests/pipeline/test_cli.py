"""``timebound pipeline compile|validate|run`` end to end, in a subprocess (real time: only
outcomes that do not depend on timing are asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[2]

PLAN_MODULE = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from tests.pipeline import sample
from timebound import pipeline as pl

# fetch_features sleeps 10 s: the 2 ms region always times out and the fallback runs.
reg = sample.make_registry(fetch_features=10.0)
plan = sample.make_plan(reg)

def broken():
    bad = pl.Plan("broken", catalog=reg)
    bad.timeout_wrapper(
        if_success=lambda c: c.task("call_models"),
        if_fail=lambda c: c.fill_defaults(["f_esr"]),
        budget={{"base_ms": 1, "per_row_us": 0, "min_ms": 1, "max_ms": 1}},
    )
    return bad
"""


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "timebound", "pipeline", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "rank.py").write_text(PLAN_MODULE)
    (tmp_path / "rows.csv").write_text("id\n1\n2\n3\n")
    pq.write_table(pa.table({"id": pa.array([7, 8], pa.int64())}), tmp_path / "rows.parquet")
    return tmp_path


def test_compile_then_validate_an_artifact(workdir: Path) -> None:
    """compile writes the artifact; validate checks it against a registry."""
    done = cli(workdir, "compile", "rank:plan", "-o", "a.json")
    assert done.returncode == 0, done.stderr
    assert json.loads((workdir / "a.json").read_bytes())["name"] == "rank_v1"
    done = cli(workdir, "validate", "a.json", "--catalog", "rank:reg")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok rank_v1 sha256:")


def test_run_prints_rows_wrappers_and_the_critical_path(workdir: Path) -> None:
    """run reads CSV rows (cast to the keys' types) and prints rows, trace and critical path."""
    done = cli(workdir, "run", "rank:plan", "--rows", "rows.csv")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["id", "score_model", "score_final", "f_esr"]
    assert lines[1].split() == ["1", "null", "1.0", "null"]
    assert "chosen_branch=fail" in lines[4]
    assert lines[5].startswith("critical path: task:call_models")
    # Then a lane per span, drawn as the Constellation call timeline is (D10.7).
    assert lines[7].startswith("span") and "timeline (0 .. " in lines[7]
    assert any(line.startswith("timeout_wrapper ") and "timed_out" in line for line in lines[8:])


def test_run_json_from_parquet(workdir: Path) -> None:
    """--json prints the rows and the whole trace as one JSON object."""
    done = cli(workdir, "run", "rank:plan", "--rows", "rows.parquet", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r["id"] for r in out["rows"]] == [7, 8]
    assert out["trace"]["wrappers"]["timeout_wrapper"]["chosen_branch"] == "fail"
    assert out["trace"]["critical_path"][-1] == "vm:score_final"


def test_a_validation_error_names_rule_and_place(workdir: Path) -> None:
    """A broken plan exits 1 with FILE:LINE, the rule, the node and the diff."""
    done = cli(workdir, "validate", "rank:broken")
    assert done.returncode == 1
    assert "rank.py:" in done.stderr
    assert "[shape_equality] node timeout_wrapper" in done.stderr
    assert '"extra": ["score_model"]' in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["validate", "a.json"], "needs --catalog"),
        (["run", "rank:plan", "--rows", "rows.txt"], "give a .parquet, .csv or .json"),
        (["run", "rank:plan", "--rows", "missing.csv"], "cannot read rows"),
        (["compile", "rank"], "write MODULE:NAME"),
        (["compile", "rank:nothing"], "has no 'nothing'"),
        (["run", "rank:plan", "--rows", "rows.csv", "--param", "=x"], "NAME=VALUE"),
    ],
)
def test_usage_mistakes_say_what_to_write(workdir: Path, args: list[str], message: str) -> None:
    """Command-line mistakes exit 2 with one line that says what to write."""
    (workdir / "rows.txt").write_text("")
    done = cli(workdir, *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
