"""``timebound serve --no-worker`` on PostgreSQL: the host starts runs, a worker process runs
them."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from timebound import ConfigurationError
from timebound import workflow as wf

from .conftest import ROOT, launch, stop

pytestmark = pytest.mark.postgres


def test_worker_process_finishes_a_run_the_host_started(pg_url: str, tmp_path: Path) -> None:
    """With --no-worker the run waits, pending, until a `timebound worker` process runs it."""
    server = launch(tmp_path, "--db", pg_url, "--no-worker")
    worker = None
    try:
        run_id = server.start("quick")
        # No worker exists yet: nothing may have claimed the run's first token.
        tokens = server.client.get(f"/v1/runs/{run_id}").json()["tokens"]
        assert [t["status"] for t in tokens] == ["pending"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "timebound", "worker", "--db", pg_url,
             "--actions", "tests.host.host_actions"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert worker.stdout is not None
        assert worker.stdout.readline().startswith("worker ")
        detail = server.wait_run(run_id)
        assert detail["run"]["status"] == "completed"
        assert [t["node_id"] for t in detail["tokens"]] == ["a", "b"]
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=30) == 0
            worker.stdout.close()  # type: ignore[union-attr]
        stop(server)


def test_no_worker_on_sqlite_refuses_to_start(tmp_path: Path) -> None:
    """`timebound serve --no-worker` on SQLite exits 2 naming the reason, serving nothing."""
    done = subprocess.run(
        [sys.executable, "-m", "timebound", "serve", "--no-worker", "--check",
         "--db", f"sqlite:///{tmp_path}/h.db"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "worker = false needs a shared PostgreSQL store" in done.stderr


def test_engine_without_worker_on_sqlite_is_refused(tmp_path: Path) -> None:
    """``Engine(worker=False)`` on a one-process SQLite store is a configuration error."""
    with pytest.raises(ConfigurationError, match="worker=False needs a shared store"):
        wf.Engine(db=f"sqlite:///{tmp_path}/e.db", worker=False)
