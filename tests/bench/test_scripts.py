"""Every benchmark script's command line: ``--help`` prints and runs nothing, ``--smoke`` runs the
whole script in seconds, and nothing is written unless ``--out`` asks for it.

The figures are judged in ``bench/results/*.json``, never here: a smoke run's numbers mean nothing
(one repeat of tiny samples on a busy machine). These tests prove each harness works end to end
and keeps its hands off the results.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"

#: Every runnable script (modules starting with ``_`` and data modules are helpers).
SCRIPTS = sorted(
    p.stem
    for p in BENCH.glob("*.py")
    if not p.name.startswith("_") and 'if __name__ == "__main__":' in p.read_text()
)
#: Scripts that need input from outside the repository to run at all (an upstream mirror).
NEEDS_INPUT = {"dsl_corpus"}
#: Scripts whose smoke run has a test module of its own (which also checks what it writes).
SMOKED_ELSEWHERE = {"propagation"}
#: Rows (or the start of their names) a script's smoke table must print, beyond the table itself:
#: one per measured path, so that a path the smoke tier stops running is noticed.
SMOKE_ROWS = {
    "pipeline": (
        "pipeline.overlay.commit.1k_rows_x50_keys",
        "pipeline.overlay.rollback.10k_rows_x50_keys",
        "pipeline.dispatch.20_tasks_1000_rows.cpu",
        "pipeline.ranking.",
    ),
}


def _results() -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in RESULTS.iterdir()}


def _run(script: str, *args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_script_is_covered() -> None:
    """The list is found, not typed: a new script is tested without editing this file."""
    assert {"core", "startup", "resilience", "propagation", "workflow", "host"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_and_runs_nothing(script: str, tmp_path: Path) -> None:
    """``--help`` describes the script and its shared options, exits 0 and writes nothing."""
    before = _results()
    done = _run(script, "--help", cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage:")
    assert "--out" in done.stdout
    if script not in NEEDS_INPUT:
        for option in ("--quick", "--smoke", "--repeats"):
            assert option in done.stdout, option
    assert "rows," not in done.stdout  # no table: nothing was measured
    assert _results() == before
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(150)
@pytest.mark.parametrize("script", sorted(set(SCRIPTS) - NEEDS_INPUT - SMOKED_ELSEWHERE))
def test_smoke_run_writes_nothing_without_out(script: str, tmp_path: Path) -> None:
    """The smoke tier runs every row's code path and prints the table; no file appears, in
    ``bench/results`` or in the working directory."""
    before = _results()
    done = _run(script, "--smoke", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " rows, " in done.stdout
    assert "load average" in done.stdout
    for row in SMOKE_ROWS.get(script, ()):
        assert row in done.stdout, row
    assert _results() == before
    assert not list(tmp_path.iterdir())


def test_out_writes_rows_with_their_spread_and_the_machine(tmp_path: Path) -> None:
    """``--out`` writes the rows with min/median/max over the repeats and the machine's load."""
    out = tmp_path / "dsl.json"
    done = _run("dsl", "--smoke", "--repeats", "2", "--out", str(out), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert doc["bench"] == "dsl" and doc["repeats"] == 2 and doc["tier"] == "smoke"
    machine = doc["machine"]
    assert machine["cpus"] >= 1
    assert len(machine["loadavg_start"]) == 3 and len(machine["loadavg_end"]) == 3
    assert doc["rows"]
    for row in doc["rows"]:
        assert row["repeats"] == 2
        assert row["min"] <= row["value"] <= row["max"]


def test_a_script_needing_input_refuses_without_it(tmp_path: Path) -> None:
    """Without its upstream mirror the corpus script stops at the command line: no file."""
    before = _results()
    done = _run("dsl_corpus", cwd=tmp_path, timeout=30)
    assert done.returncode == 2
    assert "--mirror" in done.stderr
    assert _results() == before
    assert not list(tmp_path.iterdir())
