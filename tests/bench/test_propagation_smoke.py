"""Smoke run of the propagation benchmark (``bench/propagation.py --smoke``): real uvicorn services.

The benchmark's numbers are judged in ``bench/results/propagation.json``; these tests only prove
the harness works end to end and never leaves a service process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "propagation.py"
ROW_KEYS = {
    *("metric", "value", "unit", "baseline", "baseline_value", "ratio", "target", "pass"),
    *("min", "max", "repeats", "ratio_range"),
}
RESULTS = ROOT / "bench" / "results"


def _run(*args: str, cwd: Path, timeout: float = 50.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(output: str) -> list[int]:
    return [int(line.split("pid=")[1].split()[0]) for line in output.splitlines() if "pid=" in line]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "propagation.json"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in RESULTS.iterdir())
    proc = _run("--smoke", "--verbose", "--out", str(out), cwd=tmp)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    return {
        "rows": {r["metric"]: r for r in rows},
        "list": rows,
        "stdout": proc.stdout,
        "written": sorted(p.name for p in tmp.iterdir()),
        "results_untouched": before
        == sorted((p.name, p.stat().st_mtime_ns) for p in RESULTS.iterdir()),
    }


def test_writes_only_the_file_asked_for(smoke: dict[str, Any]) -> None:
    """``--out`` is the only file the run writes; bench/results is left alone."""
    assert smoke["written"] == ["propagation.json"]
    assert smoke["results_untouched"]


def test_rows_have_the_shared_shape(smoke: dict[str, Any]) -> None:
    """Every row has exactly the shared result-row keys."""
    assert smoke["list"]
    for row in smoke["list"]:
        assert set(row) == ROW_KEYS


def test_reports_every_metric_for_each_mode(smoke: dict[str, Any]) -> None:
    """The smoke run reports PDW, goodput and L for M0 and M2 at rho = 1."""
    rows = smoke["rows"]
    for mode in ("M0", "M2"):
        for metric in ("pdw_c", "pdw_total", "goodput", "late_calls", "sent"):
            assert f"propagation.{mode}.rho1.{metric}" in rows


def test_capacity_and_load_are_measured(smoke: dict[str, Any]) -> None:
    """C's capacities (through the chain, alone) are measured first and every run actually sent
    requests."""
    rows = smoke["rows"]
    assert rows["propagation.c_capacity"]["value"] > 0
    assert rows["propagation.c_capacity_alone"]["value"] > 0
    assert rows["propagation.M0.rho1.sent"]["value"] > 0
    assert rows["propagation.M2.rho1.sent"]["value"] > 0


def test_pdw_is_a_fraction(smoke: dict[str, Any]) -> None:
    """Every PDW figure is a fraction of CPU time, between 0 and 1."""
    pdw = [r for name, r in smoke["rows"].items() if ".pdw_" in name]
    assert len(pdw) == 4
    for row in pdw:
        assert 0.0 <= row["value"] <= 1.0


def test_m2_rows_compare_against_m0(smoke: dict[str, Any]) -> None:
    """Rows of a propagating mode name M0 of the same load as their baseline."""
    row = smoke["rows"]["propagation.M2.rho1.pdw_c"]
    assert row["baseline"] == "M0"
    assert row["baseline_value"] == smoke["rows"]["propagation.M0.rho1.pdw_c"]["value"]


def test_services_are_stopped_after_a_run(smoke: dict[str, Any]) -> None:
    """No service process outlives a completed run."""
    pids = _pids(smoke["stdout"])
    # C alone, then A, B, C for the capacities; then A, B, C for M0 and for M2.
    assert len(pids) == 10
    assert not [pid for pid in pids if _alive(pid)]


def test_interrupt_stops_every_service(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) during a run stops every service the harness started."""
    # Not --smoke: its M0 run is over in a second, so a loaded machine that delivers the
    # signal late lets the harness start M2's chain (or finish). A single M0 run of a minute,
    # interrupted as soon as it is up, is surely still running when the signal lands.
    args = ["--modes", "M0", "--loads", "1", "--warm", "30", "--measure", "30", "--quanta", "8"]
    args += ["--overhead-repeats", "0", "--repeats", "1", "--no-lifo", "--quiet-wait", "0"]
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args, "--verbose", "--out", str(tmp_path / "x.json")],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        # Interrupt once the first chain (A, B, C, measuring the capacity through it) is up.
        for line in proc.stdout:
            seen.append(line)
            if "service A (M0)" in line:
                break
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(seen) + rest
    assert proc.returncode == 130, output
    pids = _pids(output)
    assert len(pids) == 4
    assert not [pid for pid in pids if _alive(pid)]
    assert not (tmp_path / "x.json").exists()
