"""A run that breaks the engine's turn, on PostgreSQL with two `timebound worker` processes: it
fails alone, and the workers go on serving other runs (D6.22)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from timebound import workflow as wf

from .test_worker_cli import ROOT, _status

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio_real]

ACTIONS = """
async def work(ctx):
    return "done"
"""

DEFINITION: dict[str, Any] = {
    "id": "plain",
    "initial_node": "A",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [{"id": "A", "action_id": "work"}],
}


async def test_workers_fail_a_poisoned_run_alone_and_serve_the_rest(
    pg_url: str, tmp_path: Path
) -> None:
    """A stored token nested 5,000 deep (written before the limit existed) fails its run with
    engine-error; a run started beside it completes; both worker processes stay up (before,
    every turn of every worker failed, forever)."""
    front = wf.Engine(db=pg_url, actions={"work": lambda ctx: None}, worker=False)
    front.register(DEFINITION)
    async with front:
        poisoned = await front.start("plain")
        async with front._store.transaction() as tx:
            await tx.execute(
                "UPDATE tb_wf_tokens SET branch_index = 0, branch_total = 1, branch_item = ? "
                "WHERE run_id = ?",
                "[" * 5_000 + "]" * 5_000,
                poisoned,
            )
        healthy = await front.start("plain")
    (tmp_path / "acts.py").write_text(ACTIONS)
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "timebound",
                "worker",
                "--db",
                pg_url,
                "--actions",
                str(tmp_path / "acts.py"),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            assert worker.stdout.readline().startswith("worker ")
        give_up = time.monotonic() + 30
        while (await _status(pg_url, healthy))[0] == "running" or (await _status(pg_url, poisoned))[
            0
        ] == "running":
            assert time.monotonic() < give_up, "the workers did not end both runs"
            await asyncio.sleep(0.05)
        assert [w.poll() for w in workers] == [None, None]
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=30)
            worker.stdout.close()  # type: ignore[union-attr]
    async with front:
        poisoned_row = await front.get_run(poisoned)
        healthy_row = await front.get_run(healthy)
    assert healthy_row["status"] == "completed"
    assert poisoned_row["status"] == "failed"
    assert poisoned_row["error"].startswith("engine-error: RecursionError")
