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
        sweep_ms=600_000,
        lease_ms=600_000,
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
