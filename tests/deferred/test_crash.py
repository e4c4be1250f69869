"""kill -9 of the host at random instants: no operation lost, each resumed once, no early poll.

Real subprocesses on real stores, SQLite and PostgreSQL (durability is the point: no virtual time).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from timebound._store import open_store

HOST = str(Path(__file__).with_name("_crash_host.py"))
ROOT = Path(__file__).resolve().parents[2]
#: CI kills 25 times per store; a run by hand may ask for hundreds (TIMEBOUND_DEFERRED_KILLS=200).
KILLS = int(os.environ.get("TIMEBOUND_DEFERRED_KILLS", "25"))


async def _read(url: str) -> tuple[dict[str, str], list[str]]:
    store = open_store(url)
    await store.open()
    try:
        async with store.transaction() as tx:
            ops = await tx.fetch("SELECT id, status FROM tb_deferred_ops")
            resumes = await tx.fetch("SELECT op_id FROM crash_resumes")
    finally:
        await store.close()
    return {r["id"]: r["status"] for r in ops}, [r["op_id"] for r in resumes]


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, HOST, *args], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )


@pytest.mark.realtime
@pytest.mark.timeout(max(600, KILLS * 6))  # a run with many kills gets the time it needs
def test_kill_9_loses_nothing_resumes_once_polls_none_early(tmp_path: Path, store_url: str) -> None:
    """Pending, completed-not-resumed and expiring operations survive repeated kill -9."""
    url = store_url
    log = tmp_path / "polls.log"
    setup = _spawn("setup", url)
    assert setup.wait(timeout=60) == 0
    rng = random.Random(int(os.environ.get("TIMEBOUND_DEFERRED_SEED", "20261126")))
    for _ in range(KILLS):
        proc = _spawn("run", url, str(log))
        assert proc.stdout is not None
        proc.stdout.readline()  # started: the poller is running
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) in (-signal.SIGKILL, 0)
        proc.stdout.close()
    final = _spawn("run", url, str(log))
    try:
        out, _ = final.communicate(timeout=120)
    finally:
        final.kill()  # never left running after a failure
        final.wait()
    assert final.returncode == 0 and out.strip().endswith("done")

    rows, resumes = asyncio.run(_read(url))
    assert len(rows) == 40  # none lost
    assert sorted(resumes) == sorted(rows)  # each resumed exactly once
    assert {rows[k] for k in rows if ":stuck.job:" in k} == {"expired"}
    assert {rows[k] for k in rows if ":slow.job:" in k} == {"completed"}
    polls = [line.split() for line in log.read_text().splitlines() if line]
    assert all(int(at) >= int(due) for _, at, due in polls)  # never early
    assert not any(":stuck.job:" in op for op, _, _ in polls)  # expired without a poll
    slack = min((int(at) - int(due) for _, at, due in polls), default=None)
    # The numbers of a run by hand (pytest -s), e.g. with TIMEBOUND_DEFERRED_KILLS=200.
    print(f"\nkills={KILLS} operations={len(rows)} resumed={len(resumes)} polls={len(polls)} "
          f"earliest_poll_slack_ms={slack}")  # fmt: skip
