"""``timebound worker``: a separate process picks up a dead worker's run on PostgreSQL."""

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

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio_real]

ROOT = Path(__file__).resolve().parents[2]

ACTIONS = """
async def work(ctx):
    return "done by the worker process"
"""

DEFINITION: dict[str, Any] = {
    "id": "handover",
    "initial_node": "A",
    "actions": [{"id": "work", "kind": "python", "implementation": {"handler": "work"}}],
    "nodes": [{"id": "A", "action_id": "work"}],
}


async def _status(url: str, run_id: str) -> tuple[str, Any]:
    import asyncpg

    dsn, schema = url.split("?schema=")
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            f'SELECT status, state FROM "{schema}".tb_wf_runs WHERE id = $1', run_id
        )
    finally:
        await conn.close()
    return row["status"], row["state"]


async def test_worker_process_finishes_a_dead_workers_run(pg_url: str, tmp_path: Path) -> None:
    """A run whose worker died is finished by a `timebound worker` process after the lease."""
    entered = asyncio.Event()

    async def hang(ctx: wf.ActionContext) -> Any:
        entered.set()
        await asyncio.sleep(3600)

    dying = wf.Engine(db=pg_url, actions={"work": hang}, lease="300ms")
    dying.register(DEFINITION)
    await dying.open()
    run_id = await dying.start("handover")
    await asyncio.wait_for(entered.wait(), 10)
    await dying.close()

    (tmp_path / "acts.py").write_text(ACTIONS)
    worker = subprocess.Popen(
        [sys.executable, "-m", "timebound", "worker", "--db", pg_url,
         "--actions", str(tmp_path / "acts.py")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().startswith("worker ")
        give_up = time.monotonic() + 30
        while (state := await _status(pg_url, run_id))[0] == "running":
            assert time.monotonic() < give_up, "the worker did not finish the run"
            await asyncio.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
        worker.stdout.close()  # type: ignore[union-attr]
    assert state[0] == "completed" and "done by the worker process" in state[1]
    assert code == 0
