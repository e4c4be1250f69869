"""Idempotent starts and starts under a deadline (D6.18), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

import timebound as tb
from timebound import workflow as wf

from .test_engine import HANDLERS, definition


async def _stored(engine: wf.Engine) -> set[str]:
    return {r["id"] for r in await engine.list_runs(limit=1000)}


async def test_the_same_key_returns_the_same_run(virtual_clock, make_engine) -> None:
    """Three starts with one idempotency key and one input store one run and answer its id."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        ids = [await engine.start("wf", {"A": 1}, idempotency_key="order-17") for _ in range(3)]
        stored = await _stored(engine)
        await engine.wait(ids[0])
        again = await engine.start("wf", {"A": 1}, idempotency_key="order-17")
    assert len(set(ids)) == 1 and stored == {ids[0]} and again == ids[0]


async def test_concurrent_starts_with_one_key_store_one_run(virtual_clock, make_engine) -> None:
    """Twenty concurrent starts with one key (one transaction batches them) make one run."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        ids = await asyncio.gather(
            *(engine.start("wf", {"A": 1}, idempotency_key="k") for _ in range(20))
        )
        stored = await _stored(engine)
    assert len(set(ids)) == 1 and stored == set(ids)


async def test_another_request_under_the_same_key_is_a_conflict(virtual_clock, make_engine) -> None:
    """The same key with another input raises StartConflict naming the key and the run."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        first = await engine.start("wf", {"A": 1}, idempotency_key="k")
        with pytest.raises(wf.StartConflict) as err:
            await engine.start("wf", {"A": 2}, idempotency_key="k")
        stored = await _stored(engine)
    assert err.value.run_id == first and err.value.path == "idempotency_key"
    assert err.value.code == "workflow-start-conflict" and stored == {first}


async def test_a_client_chosen_run_id_is_idempotent(virtual_clock, make_engine) -> None:
    """start(run_id=…) stores the run under that id; a repeat answers it, another input is a
    conflict."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        assert await engine.start("wf", {"A": 1}, run_id="job-1") == "job-1"
        assert await engine.start("wf", {"A": 1}, run_id="job-1") == "job-1"
        with pytest.raises(wf.StartConflict) as err:
            await engine.start("wf", {"A": 3}, run_id="job-1")
        assert (await engine.get_run("job-1"))["status"] == "running"
    assert err.value.path == "run_id"


@pytest.mark.parametrize("option", ["idempotency_key", "run_id"])
@pytest.mark.parametrize("value", ["", "has space", "x" * 201, "é"])
async def test_a_bad_key_names_the_option(virtual_clock, make_engine, option, value) -> None:
    """An empty, spaced, overlong or non-ASCII key is a ConfigurationError naming its option."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        with pytest.raises(tb.ConfigurationError) as err:
            await engine.start("wf", {}, **{option: value})
    assert err.value.option == option


async def test_a_cancelled_start_stores_nothing_or_says_which_run_it_stored(
    virtual_clock, make_engine
) -> None:
    """Cancelled at every point of its way, a start either stored nothing, or raised a
    cancellation carrying the id of the run it stored (wf.started_run_id): never a run the
    caller cannot know of."""
    async with make_engine(HANDLERS, definition([{"id": "A"}])) as engine:
        known: set[str] = set()
        outcomes = set()
        for steps in range(40):
            task = asyncio.ensure_future(engine.start("wf", {"A": 1}))
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            try:
                known.add(await task)
                outcomes.add("returned")
            except asyncio.CancelledError as exc:
                run_id = wf.started_run_id(exc)
                if run_id is not None:
                    known.add(run_id)
                outcomes.add("cancelled" if run_id is None else "interrupted")
        stored = await _stored(engine)
    assert stored == known
    assert "cancelled" in outcomes  # the cut landed before the transaction at least once


@pytest.mark.asyncio_real
async def test_starts_under_a_tiny_deadline_never_store_an_unknown_run(tmp_path) -> None:
    """Twenty starts under fail_after(0.5-5 ms) each return an id, or raise DeadlineExceeded
    with nothing stored or with the stored run's id (wf.started_run_id): no duplicates from a
    caller that retries on the error."""
    engine = wf.Engine(db=f"sqlite:///{tmp_path}/runs.db", actions=HANDLERS)
    engine.register(definition([{"id": "A"}]))
    rng = random.Random(7)
    known: set[str] = set()
    async with engine:
        for _ in range(20):
            try:
                async with tb.fail_after(rng.uniform(0.0005, 0.005)):
                    known.add(await engine.start("wf", {"A": 0}))
            except tb.DeadlineExceeded as exc:
                run_id = wf.started_run_id(exc)
                if run_id is not None:
                    known.add(run_id)
        stored = await _stored(engine)
    assert stored == known


@pytest.mark.postgres
async def test_two_engines_racing_for_one_key_store_one_run(virtual_clock, pg_store_url) -> None:
    """A host engine (no worker) and a worker engine on one PostgreSQL store, starting with one
    key at once, answer the same run."""
    virtual_clock.autojump_threshold = 0.25
    d = definition([{"id": "A"}])
    worker = wf.Engine(db=pg_store_url, actions=HANDLERS)
    host = wf.Engine(db=pg_store_url, actions=HANDLERS, worker=False)
    for e in (worker, host):
        e.register(d)
    async with worker, host:
        ids: list[Any] = await asyncio.gather(
            *(e.start("wf", {"A": 0}, idempotency_key="shared") for e in (worker, host) * 3)
        )
        stored = await _stored(host)
    assert len(set(ids)) == 1 and stored == set(ids)


@pytest.mark.postgres
@pytest.mark.asyncio_real
async def test_an_engine_without_a_worker_commits_concurrent_starts_together(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """worker=False (``timebound serve --no-worker``): concurrent starts share a commit, as the
    worker loop's turn batches them, instead of one commit each; every start is answered with a
    stored run, a conflicting key fails that start alone, and nothing is left waiting."""
    from timebound._store import Tx

    commits: list[int] = []
    committed = Tx.committed

    def counting(self: Tx) -> None:
        commits.append(1)
        committed(self)

    host = wf.Engine(db=pg_store_url, actions=HANDLERS, worker=False)
    host.register(definition([{"id": "A"}]))
    async with host:
        first = await host.start("wf", {"A": 0}, idempotency_key="taken")
        monkeypatch.setattr(Tx, "committed", counting)
        results = await asyncio.gather(
            *(host.start("wf", {"A": i}) for i in range(30)),
            host.start("wf", {"A": 99}, idempotency_key="taken"),  # another input: a conflict
            return_exceptions=True,
        )
        monkeypatch.undo()
        stored = await _stored(host)
    ids, conflict = results[:30], results[30]
    assert isinstance(conflict, wf.StartConflict) and conflict.run_id == first
    assert all(isinstance(i, str) for i in ids) and len(set(ids)) == 30
    assert set(ids) | {first} == stored
    assert len(commits) < 10, commits  # one commit each was 30
