"""Races between workers on a shared store (PostgreSQL; SQLite has one writer at a time): a run
read without its lock."""

from __future__ import annotations

import asyncio

import pytest

from timebound import workflow as wf

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio_real]

ONE_NODE = {
    "id": "one",
    "initial_node": "A",
    "actions": [{"id": "a", "kind": "python", "implementation": {"handler": "hang"}}],
    "nodes": [{"id": "A", "action_id": "a"}],
}


async def test_a_cancel_that_read_the_run_before_another_worker_ended_it_changes_nothing(
    pg_store_url: str,
) -> None:
    """An operator's cancel reads the run without its lock; another worker completes the run and
    commits before the cancel writes. The completion stands: the cancel ends nothing (it used
    to overwrite ``completed`` with ``cancelled``, and cancel the tokens of a finished run)."""
    release = asyncio.Event()

    async def hang(ctx: wf.ActionContext) -> int:
        await release.wait()
        return 1

    engine = wf.Engine(db=pg_store_url, actions={"hang": hang})
    engine.register(ONE_NODE)
    async with engine:
        run_id = await engine.start("one")
        store, machine = engine._store, engine._machine
        async with store.transaction() as cancel:
            stale = await machine.run(cancel, run_id)  # what Engine.cancel reads: no lock
            assert stale is not None and stale["status"] == "running"
            async with store.transaction() as worker:  # meanwhile another worker ends the run
                await worker.execute(
                    "UPDATE tb_wf_runs SET status = 'completed', finished_at = 1 WHERE id = ?",
                    run_id,
                )
            # The cancel goes on with what it read (Machine.cancel_run, past its status check).
            ended = await machine._finish_run(cancel, stale, "cancelled", 2, "cancelled")
        run = await engine.get_run(run_id)
        events = [e["kind"] for e in await engine.events(run_id)]
        release.set()
    assert run["status"] == "completed"
    assert "run_cancelled" not in events
    assert ended is False


async def test_a_lease_renewed_while_another_worker_requeues_it_stands(pg_store_url: str) -> None:
    """A worker finds a token's lease expired while its owner is renewing it (the owner's turn
    holds the row). The requeue skips the row: the owner's renewal commits and the token stays
    its own. Without the lock the requeue waited for the renewal, then put the token back to
    ``pending`` anyway, and a second worker would have run it again."""
    release = asyncio.Event()
    started = asyncio.Event()

    async def hang(ctx: wf.ActionContext) -> int:
        started.set()
        await release.wait()
        return 1

    # Long sweeps and leases: this engine's own loop stays out of the way.
    engine = wf.Engine(
        db=pg_store_url,
        actions={"hang": hang},
        sweep=600,
        lease=600,
        worker_id="owner",
    )
    engine.register(ONE_NODE)
    async with engine:
        run_id = await engine.start("one")
        await started.wait()
        # Its own loop would take the expired lease back itself (any turn runs the requeue, and
        # on PostgreSQL its own NOTIFY wakes it for one): only the "other worker" below may.
        engine.stop_claiming()
        (token,) = await engine.tokens(run_id)
        store = engine._store
        async with store.transaction() as expire:  # the lease has run out...
            await expire.execute(
                "UPDATE tb_wf_tokens SET lease_until = 1 WHERE id = ?", token["id"]
            )
        async with store.transaction() as renewal:  # ...and its owner is renewing it
            await renewal.execute(
                "UPDATE tb_wf_tokens SET lease_until = ? WHERE id = ?",
                engine._now() + 600_000,
                token["id"],
            )

            async def other_worker() -> None:
                async with store.transaction() as tx:
                    await engine._requeue(
                        tx,
                        "status IN ('dispatched', 'executing') AND lease_until < ?",
                        engine._now(),
                        lock=store.skip_locked(),
                    )

            requeue = asyncio.ensure_future(other_worker())
            await asyncio.sleep(0.2)  # the requeue reaches the row the renewal holds
        await requeue
        (after,) = await engine.tokens(run_id)
        events = [e["kind"] for e in await engine.events(run_id)]
        release.set()
    assert (after["status"], after["attempt"]) == ("executing", 1)
    assert "token_redispatched" not in events


async def test_an_extend_committed_while_the_run_timer_fires_stands(pg_store_url: str) -> None:
    """A worker reads the run's due timer; before it takes the run's lock an operator's extend
    commits. The worker finds the row's new deadline and does nothing, and its delete leaves the
    re-armed timer: the run is not ended at the old deadline (D6.27)."""
    definition = {**ONE_NODE, "timeout_ms": 1000}
    engine = wf.Engine(db=pg_store_url, actions={"hang": lambda ctx: 1}, worker=False)
    engine.register(definition)
    async with engine:
        run_id = await engine.start("one")
        old = (await engine.get_run(run_id))["timeout_at"]
        store = engine._store
        async with store.transaction() as worker:
            (timer,) = [t for t in await worker.due_timers(old) if t["stream"] == run_id]
            async with store.transaction() as operator:  # commits before the worker's lock
                await engine._operator.extend(operator, run_id, None, 5000, "more", "op", old - 1)
            await engine._fire(worker, timer, old)
            await worker.execute(
                "DELETE FROM tb_timers WHERE key = ? AND due_ms <= ?", timer["key"], old
            )
        run = await engine.get_run(run_id)
        async with store.read() as tx:
            due = await tx.fetchone("SELECT due_ms FROM tb_timers WHERE key = ?", timer["key"])
        await engine.cancel(run_id)
    assert run["status"] == "running" and run["timeout_at"] == old + 5000
    assert due is not None and due["due_ms"] == old + 5000


async def test_an_extend_that_waits_for_the_firing_timer_is_refused(pg_store_url: str) -> None:
    """The timer's worker holds the run's lock and times the run out; the operator's extend,
    waiting on that lock, then finds the run ended and is refused: never revived."""
    definition = {**ONE_NODE, "timeout_ms": 1000}
    engine = wf.Engine(db=pg_store_url, actions={"hang": lambda ctx: 1}, worker=False)
    engine.register(definition)
    async with engine:
        run_id = await engine.start("one")
        old = (await engine.get_run(run_id))["timeout_at"]
        store = engine._store
        refused: list[str] = []

        async def extend() -> None:
            async with store.transaction() as operator:
                try:
                    await engine._operator.extend(operator, run_id, None, 5000, "x", "op", old - 1)
                except wf.OperatorRefused as exc:
                    refused.append(exc.code)

        async with store.transaction() as worker:
            (timer,) = [t for t in await worker.due_timers(old) if t["stream"] == run_id]
            await engine._fire(worker, timer, old)  # holds the run's lock until commit
            waiting = asyncio.create_task(extend())
            await asyncio.sleep(0.2)
            assert not waiting.done()
        await waiting
        run = await engine.get_run(run_id)
    assert refused == ["run-ended"] and run["status"] == "timed_out"
    assert run["finished_at"] == old
