"""Graceful stop of a real ``timebound serve``: on SIGTERM the host claims no more work, lets
running actions finish up to ``--drain-timeout``, cancels the rest and frees their tokens at
once; the next start completes everything, re-running only what was cancelled, once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from timebound._store import open_store

from .conftest import Server, launch, stop

# Two nodes, each the `logged` handler: it logs its starts and ends, and sleeps on a first start.
DRAIN = {
    "id": "drain",
    "timeout_ms": 120_000,
    "initial_node": "a",
    "actions": [{"id": "log", "kind": "python", "implementation": {"handler": "logged"}}],
    "nodes": [{"id": "a", "action_id": "log"}, {"id": "b", "action_id": "log"}],
    "transitions": [{"id": "ab", "from": "a", "to": "b"}],
}


async def _tokens(db: str, run_id: str) -> list[dict[str, Any]]:
    store = open_store(db)
    await store.open()
    try:
        async with store.transaction() as tx:
            return await tx.fetch(
                "SELECT node_id, status, lease_owner FROM tb_wf_tokens WHERE run_id = ? "
                "ORDER BY seq",
                run_id,
            )
    finally:
        await store.close()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    for _ in range(600):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/host.db"
    url: str = request.getfixturevalue("pg_url")
    return url


def test_sigterm_drains_short_actions_and_reruns_the_cancelled_one_once(
    tmp_path: Path, db: str
) -> None:
    """A 1 s action finishes during the 3 s drain and its node is not run again; a 30 s one is
    cancelled, its token left pending with no lease, and re-run exactly once after restart."""
    log = tmp_path / "actions.log"
    env = {"TB_TEST_ACTION_LOG": str(log)}

    def lines() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    server: Server = launch(tmp_path, "--db", db, "--drain-timeout", "3", env=env)
    assert server.client.put("/v1/definitions/drain", json=DRAIN).status_code == 201
    short = server.start("drain", {"sleep": {"a": 1}})
    long = server.start("drain", {"sleep": {"a": 30}})
    _wait_for(lambda: {f"{short} a start", f"{long} a start"} <= set(lines()), "both started")
    stop(server)
    assert server.proc.returncode == 0  # a drained host exits cleanly, not by the signal

    before = lines()
    assert f"{short} a end" in before  # finished within the drain bound
    assert f"{long} a end" not in before  # cancelled at the bound
    assert not any(line.startswith(f"{short} b") for line in before)  # nothing new claimed
    short_tokens = asyncio.run(_tokens(db, short))
    long_tokens = asyncio.run(_tokens(db, long))
    assert [(t["node_id"], t["status"]) for t in short_tokens] == [
        ("a", "completed"),
        ("b", "pending"),
    ]
    assert [(t["node_id"], t["status"], t["lease_owner"]) for t in long_tokens] == [
        ("a", "pending", None)
    ]

    server = launch(tmp_path, "--db", db, "--drain-timeout", "3", env=env)
    try:
        for run_id in (short, long):
            detail = server.wait_run(run_id)
            assert detail["run"]["status"] == "completed", detail["run"]
        events = {}
        for run_id in (short, long):
            listed = server.client.get(f"/v1/runs/{run_id}/events").json()["events"]
            events[run_id] = [e["kind"] for e in listed]
    finally:
        stop(server)
    after = lines()
    assert after.count(f"{short} a start") == 1
    assert after.count(f"{long} a start") == 2
    assert after.count(f"{short} b start") == 1 and after.count(f"{long} b start") == 1
    assert "token_redispatched" not in events[short]
    assert events[long].count("token_redispatched") == 1
