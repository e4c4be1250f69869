"""What a worker learns from other processes on one PostgreSQL store: news that arrives during
a turn is not lost, and a stop notice is checked against the store before an attempt is
cancelled (D6.14)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from timebound import ConfigurationError
from timebound import workflow as wf

from .test_engine import definition

pytestmark = [pytest.mark.postgres, pytest.mark.asyncio_real]


async def _until(check: Any, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_news_that_arrives_during_a_turn_starts_another_turn(pg_url: str) -> None:
    """Another process's commit notified while the loop is in a turn makes the loop read the
    store again at once, not at its next sweep (here 10 minutes away)."""

    async def ok(ctx: wf.ActionContext) -> Any:
        return "done"

    d = definition([{"id": "A"}])
    engine = wf.Engine(db=pg_url, actions={"sleep": ok, "boom": ok}, sweep=600)
    host = wf.Engine(db=pg_url, actions={"sleep": ok, "boom": ok}, worker=False)
    engine.register(d)
    host.register(d)
    notified = asyncio.Event()
    wake_all = engine._wake_all

    def on_news() -> None:
        notified.set()
        wake_all()

    engine._wake_all = on_news  # type: ignore[method-assign]  # the listener calls this
    started: list[str] = []
    turn = engine._turn

    async def slow_turn(*args: Any) -> Any:
        result = await turn(*args)
        if not started:  # the first turn: a run starts elsewhere and is notified meanwhile
            notified.clear()
            started.append(await host.start("wf"))
            await asyncio.wait_for(notified.wait(), 10)
        return result

    engine._turn = slow_turn  # type: ignore[method-assign]
    async with host, engine:
        await _until(lambda: started)
        result = await host.wait(started[0], timeout=10)
    assert result.status == "completed"


async def test_a_stop_notice_for_a_token_still_this_workers_is_ignored(pg_url: str) -> None:
    """A notice names a token, not its attempt: the worker cancels its attempt only once the
    store says the token is no longer its own (the notice may be about an earlier attempt)."""
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def hang(ctx: wf.ActionContext) -> Any:
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    d = definition([{"id": "A"}])
    engine = wf.Engine(db=pg_url, actions={"sleep": hang, "boom": hang})
    host = wf.Engine(db=pg_url, actions={"sleep": hang, "boom": hang}, worker=False)
    engine.register(d)
    host.register(d)
    async with host, engine:
        run_id = await host.start("wf")
        await asyncio.wait_for(entered.wait(), 10)
        (token,) = await host.tokens(run_id)
        engine._inflight.on_stop(engine._now(), [token["id"]])
        await _until(lambda: not engine._inflight.suspects)  # checked against the store
        assert not cancelled.is_set()
        await host.cancel(run_id)  # another process stops it: now the notice is true
        await asyncio.wait_for(cancelled.wait(), 10)
        events = await host.events(run_id)
    assert [e["kind"] for e in events].count("token_cancelled") == 1


@pytest.mark.parametrize("lease", ["0s", "3x", float("inf"), -1])
def test_a_bad_lease_is_a_configuration_error(lease: Any) -> None:
    """``Engine(lease=…)`` takes a positive, finite duration; anything else names the option."""
    with pytest.raises(ConfigurationError) as caught:
        wf.Engine(db="sqlite:///unused.db", lease=lease)
    assert caught.value.option == "lease"


def test_the_lease_is_a_duration() -> None:
    """``Engine(lease="2min")`` is two minutes, in the engine's milliseconds."""
    assert wf.Engine(db="sqlite:///unused.db", lease="2min")._lease_ms == 120_000


async def test_a_worker_late_renewing_its_lease_does_not_rerun_its_own_step(pg_url: str) -> None:
    """A worker whose lease renewal is late (its loop stalled) does not take back and re-run a
    step it is still running: only another worker may, as the lease says."""
    starts: list[int] = []

    async def slow(ctx: wf.ActionContext) -> Any:
        starts.append(ctx.attempt)
        await asyncio.sleep(1.0)
        return "done"

    d = definition([{"id": "A"}])
    engine = wf.Engine(
        db=pg_url, actions={"sleep": slow, "boom": slow}, lease="200ms", sweep="50ms"
    )
    engine.register(d)

    async def stalled() -> None:  # the renewal never comes in time
        return None

    engine._renew_leases = stalled  # type: ignore[method-assign]
    async with engine:
        run_id = await engine.start("wf")
        result = await engine.wait(run_id, timeout=30)
        events = await engine.events(run_id)
    assert result.status == "completed" and starts == [1], [
        (e["kind"], e.get("reason"), e["at_epoch_ms"]) for e in events
    ]
    assert "token_redispatched" not in [e["kind"] for e in events]


async def test_a_worker_that_claims_what_it_made_wakes_nobody(pg_url: str) -> None:
    """A chain of steps one worker runs from start to end wakes the other workers once, when
    the run ends, not at every step (each wake-up cost every worker an empty turn)."""

    async def ok(ctx: wf.ActionContext) -> Any:
        return ctx.node_id

    d = definition(
        [{"id": f"S{i}"} for i in range(5)],
        [{"id": f"t{i}", "from": f"S{i}", "to": f"S{i + 1}"} for i in range(4)],
    )
    one = wf.Engine(db=pg_url, actions={"sleep": ok, "boom": ok})
    other = wf.Engine(db=pg_url, actions={"sleep": ok, "boom": ok})
    one.register(d)
    other.register(d)
    wakes: list[int] = []
    wake_all = other._wake_all

    def counted() -> None:
        wakes.append(1)
        wake_all()

    other._wake_all = counted  # type: ignore[method-assign]  # the listener calls this
    async with one, other:
        other.stop_claiming()  # so that one runs every step
        run_id = await one.start("wf")
        result = await one.wait(run_id, timeout=30)
        await other.wait(run_id, timeout=30)  # the run's end reached the other worker
    assert result.status == "completed"
    assert len(wakes) <= 2, wakes  # the run's end (and at most one reconnect)


async def test_a_waiter_hears_a_run_end_from_its_own_engine_after_the_commit(pg_url: str) -> None:
    """wait() returns once the run's end is committed, not at the next sweep (10 minutes here):
    the end wakes the waiter after the commit, when a read of committed state sees it (a wake-up
    inside the transaction was lost, since a worker ignores its own NOTIFY)."""

    async def ok(ctx: wf.ActionContext) -> Any:
        return "done"

    d = definition([{"id": "A"}, {"id": "B"}])
    engine = wf.Engine(db=pg_url, actions={"sleep": ok, "boom": ok}, sweep=600)
    engine.register(d)
    async with engine:
        for _ in range(5):
            run_id = await engine.start("wf", {"A": 0, "B": 0})
            result = await engine.wait(run_id, timeout=30)
            assert result.status == "completed"
