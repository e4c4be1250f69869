"""The operator's actions cross processes: a host without a worker (``--no-worker``) extends a
run whose attempt runs in a ``timebound worker`` process, on PostgreSQL. (A terminate stops a
handler in another process the way a cancel does: by the cross-process stop of the engine.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import ROOT, Server, launch, stop

pytestmark = pytest.mark.postgres

WATCHED = {
    "id": "watched",
    "timeout_ms": 120_000,
    "initial_node": "a",
    "actions": [{"id": "w", "kind": "python", "implementation": {"handler": "watched"}}],
    "nodes": [{"id": "a", "action_id": "w", "timeout_ms": 2_000}],
}


@pytest.fixture
def split(pg_url: str, tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    """A --no-worker host and one worker process on the same store, and the action log."""
    log = tmp_path / "actions.log"
    server = launch(tmp_path, "--db", pg_url, "--no-worker")
    assert server.client.put("/v1/definitions/watched", json=WATCHED).status_code in (200, 201)
    worker = subprocess.Popen(
        [sys.executable, "-m", "timebound", "worker", "--db", pg_url,
         "--actions", "tests.host.host_actions"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "TB_TEST_ACTION_LOG": str(log)},
    )  # fmt: skip
    assert worker.stdout is not None
    assert worker.stdout.readline().startswith("worker ")
    try:
        yield server, log
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        worker.stdout.close()
        stop(server)


def _until(check: Callable[[], bool], seconds: float = 30) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError("the condition never held")


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_extending_a_node_running_on_the_worker_lets_it_finish(
    split: tuple[Server, Path],
) -> None:
    """A 3 s step under a 2 s node bound, extended by 30 s from the host while it runs on the
    worker, completes: cut at the 2 s it began with, it runs again under the new deadline."""
    server, log = split
    run_id = server.start("watched", {"sleep_s": 3})
    _until(lambda: f"{run_id} start 1" in _lines(log))
    r = server.client.post(
        f"/v1/runs/{run_id}/extend", json={"reason": "slow", "by_ms": 30_000, "node": "a"}
    )
    assert r.status_code == 200, r.text
    detail = server.wait_run(run_id)
    assert detail["run"]["status"] == "completed", detail["run"]
    events = server.client.get(f"/v1/runs/{run_id}/events").json()["events"]
    assert not [e for e in events if e["kind"] == "token_timed_out"]
    assert len([e for e in events if e["kind"] == "token_redispatched"]) == 1
