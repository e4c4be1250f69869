"""Smoke run of ``bench/pipeline.py --smoke``: the harness works end to end (its numbers are
judged in ``bench/results/pipeline.json``, never here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_pipeline_benchmark_runs() -> None:
    """The smoke run prints every row of the table and writes nothing."""
    before = (ROOT / "bench" / "results" / "pipeline.json").exists()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pipeline.py"), "--smoke"],
        cwd=ROOT / "bench",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    for metric in (
        "pipeline.overlay.commit.1k_rows_x50_keys",
        "pipeline.overlay.rollback.10k_rows_x50_keys",
        "pipeline.dispatch.20_tasks_1000_rows.cpu",
        "pipeline.ranking.",
    ):
        assert metric in done.stdout
    assert (ROOT / "bench" / "results" / "pipeline.json").exists() == before
