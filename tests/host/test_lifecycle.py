"""Stopping and starting the host: in-flight work survives a graceful stop (SIGTERM)."""

from __future__ import annotations

from pathlib import Path

from .conftest import launch, stop


def test_sigterm_mid_run_leaves_the_run_resumable_by_the_next_start(tmp_path: Path) -> None:
    """A run whose action is in flight at SIGTERM completes after the host starts again on the
    same store, and its node deadline is the one stored before the stop."""
    first = launch(tmp_path)
    run_id = first.start("quick", {"sleep_s": 1})
    before = first.client.get(f"/v1/runs/{run_id}").json()
    out = stop(first)
    assert "Finished server process" in out
    second = launch(tmp_path)
    try:
        detail = second.wait_run(run_id)
        assert detail["run"]["status"] == "completed"
        assert detail["run"]["timeout_at"] == before["run"]["timeout_at"]
        kinds = [e["kind"] for e in second.client.get(f"/v1/runs/{run_id}/events").json()["events"]]
        assert kinds.count("run_started") == 1
        assert kinds[-1] == "run_completed"
    finally:
        stop(second)


def test_sigterm_runs_the_shutdown_that_closes_the_engine(tmp_path: Path) -> None:
    """SIGTERM goes through the application's shutdown (which closes the engine), not an abrupt
    exit. (uvicorn then re-raises the signal, so the exit status is the signal's.)"""
    server = launch(tmp_path)
    out = stop(server)
    assert "Application shutdown complete." in out
