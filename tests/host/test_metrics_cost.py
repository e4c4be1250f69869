"""/metrics costs the same whatever the stored history (D8.12): timeouts come from tallies kept
as each timeout commits, counts are read off the event loop, concurrent scrapes share a read."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from timebound import workflow as wf
from timebound._store import Tx, open_store
from timebound._store._migrations import MIGRATIONS, render
from timebound.host import Config
from timebound.host._app import create_app
from timebound.host._host import Host
from timebound.workflow._metrics import tally_timeout

from ..workflow.conftest import _pg_store


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/runs.db"
        return
    with _pg_store(request.getfixturevalue("postgres_dsn")) as url:
        yield url


async def nap(ctx: wf.ActionContext) -> Any:
    item = ctx.branch["item"] if ctx.branch else ctx.input.get("nap", 0)
    await asyncio.sleep(item)
    return item


NAPS = {"id": "nap", "kind": "python", "implementation": {"handler": "nap"}}


def _node(id_: str, **node: Any) -> dict[str, Any]:
    return {
        "id": id_,
        "initial_node": "A",
        "actions": [NAPS],
        "nodes": [{"id": "A", "action_id": "nap", **node}],
    }


def _fan(id_: str, on_timeout: str) -> dict[str, Any]:
    return {
        "id": id_,
        "initial_node": "A",
        "actions": [NAPS],
        "nodes": [{"id": n, "action_id": "nap"} for n in "ABC"],
        "transitions": [
            {"id": "fan", "from": "A", "to": "B", "foreach": "input.items"},
            {
                "id": "join",
                "from": "B",
                "to": "C",
                "synchronization": {
                    "strategy": "all",
                    "sibling_group": "fan",
                    "timeout_ms": 1000,
                    "on_timeout": on_timeout,
                    "merge": {
                        "source": "_branch.output",
                        "target": "state.r",
                        "strategy": "append",
                    },
                },
            },
        ],
    }


def _from_events(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What the old scrape computed from the stored timeout events."""
    tx = Tx()
    for e in events:
        # D6.17: a fan-in timeout is its join's event once, not again for each sibling.
        if e["kind"] == "join_timed_out" or (
            e["kind"] == "token_timed_out" and e["timeout_type"] != "synchronization"
        ):
            tally_timeout(tx, e["timeout_type"], e["policy_applied"], e["detection_lag_ms"])
    return {k: n for k, n in tx._tallies.items() if n}  # a zero sum is never stored


def _tallies(t: Any) -> dict[tuple[str, str, str], int]:
    out = {("wf_timeouts", *k): n for k, n in t.counts.items()}
    for layer, buckets in t.lag_buckets.items():
        out.update({("wf_timeout_lag", layer, b): n for b, n in buckets.items()})
    out.update({("wf_timeout_lag_ms_sum", layer, ""): n for layer, n in t.lag_sum_ms.items()})
    return out


async def test_tallies_count_every_timeout_layer_as_the_events_record_it(
    virtual_clock: Any, store_url: str
) -> None:
    """Node (fail, retry), synchronization (both policies) and workflow timeouts tally exactly
    what their events record, on both stores."""
    if store_url.startswith("postgresql"):
        virtual_clock.autojump_threshold = 0.25  # real I/O under virtual time (workflow tests)
    defs = [
        _node("node", timeout_ms=2000),
        _node("retry", timeout_ms=1000, on_timeout="retry", max_retries=2),
        {**_node("whole"), "timeout_ms": 1500},
        _fan("proceed", "proceed_with_available"),
        _fan("fail", "fail"),
    ]
    async with wf.Engine(db=store_url, actions={"nap": nap}) as engine:
        for d in defs:
            engine.register(d)
        runs = [
            await engine.start("node", {"nap": 60}),
            await engine.start("retry", {"nap": 60}),
            await engine.start("whole", {"nap": 60}),
            await engine.start("proceed", {"items": [10, 1]}),
            await engine.start("fail", {"items": [10, 1]}),
        ]
        events = []
        for run_id in runs:
            await engine.wait(run_id)
            events += await engine.events(run_id)
        tallies = _tallies(await engine.timeout_tallies())
    expected = _from_events(events)
    assert tallies == expected
    assert {k[1:] for k in expected if k[0] == "wf_timeouts"} == {
        ("node", "fail"),
        ("node", "retry"),
        ("workflow", "cancel_all"),
        ("synchronization", "proceed_with_available"),
        ("synchronization", "fail"),
    }


def _event(i: int) -> tuple[str, str, int, str]:
    kind, layer = [
        ("token_timed_out", "execution"),
        ("join_timed_out", "synchronization"),
        ("token_timed_out", "workflow"),
    ][i % 3]
    lag = [0, 3, 7, 40, 90, 300, 2000, 70_000, None][i % 9]
    policy = ["fail", "retry", "proceed_with_available"][i % 3 if layer != "workflow" else 0]
    data = {"timeout_type": layer, "policy_applied": policy, "detection_lag_ms": lag}
    return (f"run-{i % 17}", kind, 1_000 + i, json.dumps(data))


async def _plant(store_url: str, n: int) -> None:
    store = open_store(store_url)
    await store.open()
    try:
        async with store.transaction() as tx:
            await tx.execute_many(
                "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)",
                [_event(i) for i in range(n)],
            )
    finally:
        await store.close()


@pytest.mark.asyncio_real
async def test_the_migration_backfills_the_timeouts_stored_before_it(store_url: str) -> None:
    """A store whose timeouts were recorded before tallies existed gets them counted once, with
    the layers, policies and lag buckets the engine tallies."""
    await _plant(store_url, 500)
    store = open_store(store_url)
    await store.open()
    # The tallies' migration, wherever it stands in the history, run again on these events.
    (statements,) = [s for _, s in MIGRATIONS if any("CREATE TABLE tb_tallies" in x for x in s)]
    try:
        async with store.transaction() as tx:
            await tx.execute("DROP TABLE tb_tallies")
            await tx.execute("DROP INDEX tb_wf_runs_finished")
            for statement in statements:
                await tx.execute(render(statement, store.dialect))
    finally:
        await store.close()
    async with wf.Engine(db=store_url) as engine:
        tallies = _tallies(await engine.timeout_tallies())
    rows = [_event(i) for i in range(500)]
    events = [{"kind": kind, **json.loads(data)} for _, kind, _, data in rows]
    assert tallies == _from_events(events)


def _samples(text: str, name: str) -> dict[str, float]:
    return {
        labels: float(value)
        for labels, value in re.findall(rf"^{name}(\{{[^}}]*\}}) (\S+)$", text, re.MULTILINE)
    }


async def _scrape_s(client: httpx.AsyncClient, times: int = 15) -> float:
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        response = await client.get("/metrics")
        best = min(best, time.perf_counter() - started)
        assert response.status_code == 200
    return best


@pytest.mark.asyncio_real
async def test_a_scrape_costs_the_same_with_100k_stored_timeouts(tmp_path: Path) -> None:
    """Scraping a store holding 100,000 timeout events costs about what an empty one does (the
    old scrape decoded every event on the loop: ~480x), and reads no event at all."""
    db = f"sqlite:///{tmp_path}/host.db"
    engine = wf.Engine(db=db)
    app = create_app(Host(Config(db=db), engine, {}))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost")
    async with engine, client:
        empty = await _scrape_s(client)
        async with engine._store.transaction() as tx:
            await tx.execute_many(
                "INSERT INTO tb_events (stream, kind, at_ms, data) VALUES (?, ?, ?, ?)",
                [_event(i) for i in range(100_000)],
            )
            for _ in range(3):  # what the engine would have tallied with three of them
                tally_timeout(tx, "node", "fail", 4)
        full = await _scrape_s(client)
        # No scrape reads the history: with the event log out of reach it answers the same.
        async with engine._store.transaction() as tx:
            await tx.execute("ALTER TABLE tb_events RENAME TO tb_events_away")
        text = (await client.get("/metrics")).text
        async with engine._store.transaction() as tx:
            await tx.execute("ALTER TABLE tb_events_away RENAME TO tb_events")
    assert full < 10 * empty, (full, empty)  # 6c6ab5d's scrape: about 480x
    assert _samples(text, "timebound_workflow_timeouts_total") == {
        '{layer="node",policy="fail"}': 3.0
    }
    assert (
        _samples(text, "timebound_workflow_timeout_detection_lag_seconds_bucket")[
            '{layer="node",le="0.005"}'
        ]
        == 3.0
    )


class _CountingEngine:
    def __init__(self) -> None:
        self.reads = 0
        self.release = asyncio.Event()
        self.deferred_registry = self

    async def counts(self) -> dict[str, dict[str, int]]:
        self.reads += 1
        await self.release.wait()
        return {"runs": {"completed": self.reads}, "tokens": {}}

    async def timeout_tallies(self) -> Any:
        from timebound.workflow._metrics import TimeoutTallies

        return TimeoutTallies()

    async def stats(self) -> Any:
        return {}, {}

    async def stop_tallies(self) -> Any:
        return {}

    async def unrunnable(self) -> list[Any]:
        return []


async def test_concurrent_scrapes_share_one_read_and_a_late_one_reads_again(
    virtual_clock: Any,
) -> None:
    """Four scrapes in flight cost one read of the store; a cancelled scraper does not cancel
    it for the others; a scrape after them reads afresh."""
    from prometheus_client import CollectorRegistry

    from timebound.host._metrics import Metrics

    engine = _CountingEngine()
    host = type("H", (), {"engine": engine, "registry": CollectorRegistry()})()
    metrics = Metrics(host)
    scrapes = [asyncio.ensure_future(metrics.scrape()) for _ in range(4)]
    await asyncio.sleep(0)
    scrapes[0].cancel()
    engine.release.set()
    bodies = await asyncio.gather(*scrapes[1:])
    assert engine.reads == 1 and scrapes[0].cancelled()
    assert all(b'timebound_workflow_runs{state="completed"} 1.0' in b for b in bodies)
    assert b'timebound_workflow_runs{state="completed"} 2.0' in await metrics.scrape()


@pytest.mark.asyncio_real
async def test_a_rolled_back_timeout_is_never_counted(store_url: str) -> None:
    """A tally is written with its transaction: one that rolls back counts nothing, one that
    commits counts once, and two commits add up."""
    from timebound._store._tally import read_tallies

    store = open_store(store_url)
    await store.open()
    try:
        with pytest.raises(RuntimeError):
            async with store.transaction() as tx:
                tally_timeout(tx, "node", "fail", 7)
                raise RuntimeError("the turn failed")
        for _ in range(2):
            async with store.transaction() as tx:
                tally_timeout(tx, "node", "fail", 7)
        tallies = await read_tallies(store, "wf_timeouts", "wf_timeout_lag")
    finally:
        await store.close()
    assert tallies == {
        "wf_timeouts": {("node", "fail"): 2},
        "wf_timeout_lag": {("node", "10"): 2},
    }
