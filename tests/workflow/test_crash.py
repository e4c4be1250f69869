"""kill -9 at named points and at random instants: a new process finishes the run correctly.

Real subprocesses and real stores (durability is the point, so no virtual time). After each
kill a second process resumes the run; an invariant checker reads the engine's tokens and events
and the append-only side log the handlers write before every step.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from timebound import workflow as wf

WORKER = str(Path(__file__).with_name("_crash_worker.py"))
ROOT = Path(__file__).resolve().parents[2]

NAMED_POINTS = [
    "A:None:start", "A:None:end", "B:0:start", "B:2:end", "C:None:start", "C:None:end",
    "D:None:end",
]  # fmt: skip


def _spawn(
    url: str, side_log: Path, point: str, run_id: str | None = None
) -> subprocess.Popen[str]:
    args = [sys.executable, WORKER, url, str(side_log), point] + ([run_id] if run_id else [])
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=ROOT)


def _first_process(url: str, side_log: Path, point: str, kill_after: float | None) -> str:
    proc = _spawn(url, side_log, point)
    assert proc.stdout is not None
    run_id = proc.stdout.readline().strip()
    if kill_after is not None:
        try:
            proc.wait(timeout=kill_after)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) in (-signal.SIGKILL, 0)
    proc.stdout.close()
    return run_id


def _resume(url: str, side_log: Path, run_id: str) -> dict[str, Any]:
    proc = _spawn(url, side_log, "none", run_id)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    lines = out.strip().splitlines()
    assert lines[0] == run_id
    result: dict[str, Any] = json.loads(lines[1])
    return result


async def _inspect(url: str, run_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    engine = wf.Engine(db=url)
    async with engine:
        return await engine.tokens(run_id), await engine.events(run_id)


def _check_invariants(url: str, side_log: Path, run_id: str, result: dict[str, Any]) -> None:
    assert result["status"] == "completed", result
    assert [r["branch"] for r in result["output"]["results"]] == [0, 1, 2, 3]
    tokens, events = asyncio.run(_inspect(url, run_id))
    # Every token ends in exactly one terminal state, recorded by exactly one terminal event.
    assert all(t["status"] in ("completed",) for t in tokens), tokens
    terminal = collections.Counter(
        e["token_id"] for e in events
        if e["kind"] in ("token_completed", "token_failed", "token_timed_out", "token_cancelled")
    )  # fmt: skip
    assert terminal == collections.Counter(t["id"] for t in tokens)
    # The fan-in decided once, with each branch counted once.
    (decided,) = [e for e in events if e["kind"] == "join_decided"]
    assert decided["branches"] == [0, 1, 2, 3]
    assert collections.Counter(t["node_id"] for t in tokens) == {"A": 1, "B": 4, "C": 1, "D": 1}
    # Handlers: at most one re-run (the attempt in flight at the kill), none after the restart.
    log = [json.loads(line) for line in side_log.read_text().splitlines()]
    starts = collections.Counter((e["node"], e["branch"]) for e in log if e["event"] == "start")
    assert max(starts.values()) <= 2, starts
    pids = [e["pid"] for e in log]
    resumed = pids[-1]
    for key, n in starts.items():
        later = [e for e in log if (e["node"], e["branch"]) == key and e["pid"] == resumed]
        assert len([e for e in later if e["event"] == "start"]) <= 1, (key, n)


@pytest.mark.parametrize("point", NAMED_POINTS)
def test_kill_at_named_point_then_resume(store_url: str, tmp_path: Path, point: str) -> None:
    """A worker killed at a named point leaves a run that a new process finishes correctly."""
    side_log = tmp_path / "side.log"
    run_id = _first_process(store_url, side_log, point, None)
    _check_invariants(store_url, side_log, run_id, _resume(store_url, side_log, run_id))


# A few random instants per run of the suite; TB_CRASH_KILLS=300 runs the long matrix.
@pytest.mark.parametrize("seed", range(int(os.environ.get("TB_CRASH_KILLS", "4"))))
def test_kill_at_random_instant_then_resume(store_url: str, tmp_path: Path, seed: int) -> None:
    """A worker killed at a random instant leaves a run that a new process finishes correctly."""
    side_log = tmp_path / "side.log"
    delay = random.Random(seed).uniform(0.0, 0.25)
    run_id = _first_process(store_url, side_log, "none", delay)
    _check_invariants(store_url, side_log, run_id, _resume(store_url, side_log, run_id))
