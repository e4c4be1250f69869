"""The poller on virtual time: never early, rate cap and module limit never exceeded, backoff."""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import random
from pathlib import Path
from typing import Any

import pytest

import timebound as tb
from timebound.deferred import HostPolicy, Operation, Poller, Registry, TransientPollError
from timebound.deferred._registry import now_ms
from timebound.testing import VirtualClock

from .conftest import operation_doc, raw_update, status_doc


class Scripted:
    """A connector answering from a script per operation; records every poll's instant."""

    def __init__(self, clock: VirtualClock, script: list[Any] | None = None, work_s: float = 0):
        self.clock = clock
        self.script = script or []
        self.work_s = work_s
        self.polls: dict[str, list[float]] = collections.defaultdict(list)
        self.starts: list[float] = []
        self.inflight = 0
        self.max_inflight = 0
        self.cancels: list[str] = []

    async def status(self, op: Operation) -> object:
        # The millisecond a poll starts in, floored as the registry reads it: a poll a hair
        # after its instant (the wake margin) is at it, one a hair before is a millisecond early.
        at = math.floor(self.clock.now() * 1000) / 1000
        self.polls[op.id].append(at)
        self.starts.append(at)
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.work_s:
                await asyncio.sleep(self.work_s)
            n = len(self.polls[op.id]) - 1
            step = self.script[n] if n < len(self.script) else "pending"
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, dict):
                return {**status_doc(op.id), **step}
            return status_doc(op.id, status=step)
        finally:
            self.inflight -= 1

    async def cancel(self, op: Operation) -> object:
        self.cancels.append(op.id)
        return status_doc(op.id, status="cancelled")


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/poller.db"


def _id(i: int) -> str:
    return f"deferred:report.render:op{i}"


async def test_polls_are_never_early(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """With a 5 s hint and no jitter, polls happen at 5 s and 10 s, never before."""
    conn = Scripted(virtual_clock, ["pending", "completed"])
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(60)
        op = await reg.get(_id(1))
    assert conn.polls[_id(1)] == [5.0, 10.0]
    assert op is not None and op.status == "completed" and op.attempts == 2


async def test_jittered_polls_are_never_before_the_clamped_interval(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """With jitter, each wait is its stretched base (10, 10, 20, 40, 60, ...) plus at most 2 s."""
    conn = Scripted(virtual_clock)
    policy = HostPolicy(rng=random.Random(3), max_ttl=900)
    async with Registry(_url(tmp_path), policy=policy) as reg:
        await reg.register(operation_doc(_id(1), retry_after=10, ttl_s=900), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(1000)
    times = [0.0, *conn.polls[_id(1)]]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    bases = [10.0] + [min(10.0 * 2 ** (n - 1), 60.0) for n in range(1, len(gaps))]
    assert len(gaps) >= 15
    assert all(base <= g <= base + 2.0 + 0.002 for g, base in zip(gaps, bases, strict=True))
    assert any(g > base + 0.5 for g, base in zip(gaps, bases, strict=True))  # jitter is used


async def test_a_one_second_hint_costs_few_polls(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """A connector answering pending with a 1 s hint for 15 minutes is polled at most 30 times."""
    conn = Scripted(virtual_clock)
    async with Registry(_url(tmp_path)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=1, ttl_s=900), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(1000)
        op = await reg.get(_id(1))
    assert op is not None and op.status == "expired"
    assert len(conn.polls[_id(1)]) <= 30


async def test_the_rate_cap_is_never_exceeded(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """100 operations due at once, a cap of 10/s: no one-second window holds more than 10 starts."""
    conn = Scripted(virtual_clock, ["completed"])
    policy = HostPolicy(jitter=False, poll_rate_cap=10, per_module_inflight=50)
    async with Registry(_url(tmp_path), policy=policy) as reg:
        for i in range(100):
            await reg.register(operation_doc(_id(i), retry_after=1), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(30)
        done = await reg.operations(status="completed", limit=1000)
    starts = sorted(conn.starts)
    assert len(done) == 100 and len(starts) == 100
    for i, t in enumerate(starts):
        assert sum(1 for s in starts[i:] if s - t < 1.0) <= 10


class Stalling(Scripted):
    """Blocks the event loop for 0.5 s of virtual time right after its first call (a host
    descheduled by a busy machine): the polls admitted with it are called half a second late."""

    async def status(self, op: Operation) -> object:
        answer = await super().status(op)
        if len(self.starts) == 1:
            self.clock.advance(0.5)  # synchronous: nothing else runs meanwhile
        return answer


async def test_a_stalled_loop_does_not_bunch_calls_over_the_cap(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """The cap counts connector calls, not admissions: polls admitted together and called late
    do not share a second with the next round's calls beyond the cap."""
    conn = Stalling(virtual_clock, ["completed"])
    policy = HostPolicy(jitter=False, poll_rate_cap=10, per_module_inflight=50)
    async with Registry(_url(tmp_path), policy=policy) as reg:
        for i in range(40):
            await reg.register(operation_doc(_id(i), retry_after=1), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(30)
        done = await reg.operations(status="completed", limit=1000)
    starts = sorted(conn.starts)
    assert len(done) == 40 and len(starts) == 40
    assert starts[1] - starts[0] >= 0.5  # the stall happened between calls of one round
    for i, t in enumerate(starts):
        assert sum(1 for s in starts[i:] if s - t < 1.0) <= 10


async def test_polls_due_a_millisecond_apart_share_rounds_and_are_never_early(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Rounds are at least 5 ms apart: polls due 1 ms apart start at most 5 ms late, in fewer
    rounds than polls, and never before their instant."""
    conn = Scripted(virtual_clock, ["completed"])
    policy = HostPolicy(jitter=False, per_module_inflight=50)
    due: dict[str, float] = {}
    async with Registry(_url(tmp_path), policy=policy) as reg:
        async with Poller(reg, {"m": conn}) as poller:
            for i in range(40):
                await reg.register(operation_doc(_id(i), retry_after=2), module="m")
                op = await reg.get(_id(i))
                assert op is not None and op.next_poll_ms is not None
                due[op.id] = op.next_poll_ms / 1000 - virtual_clock.wall() + virtual_clock.now()
                await asyncio.sleep(0.001)
            await asyncio.sleep(10)
    late = [conn.polls[op_id][0] - at for op_id, at in due.items()]
    assert poller.polls_started == 40
    assert all(-0.0005 <= x <= 0.0065 for x in late), late
    assert len(set(conn.starts)) < 40  # several polls shared a round


async def test_the_module_limit_is_never_exceeded(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Polls taking 3 s each: never more than per_module_inflight at once for a module."""
    slow = Scripted(virtual_clock, ["completed"], work_s=3)
    other = Scripted(virtual_clock, ["completed"], work_s=3)
    policy = HostPolicy(jitter=False, per_module_inflight=2)
    async with Registry(_url(tmp_path), policy=policy) as reg:
        for i in range(6):
            await reg.register(operation_doc(_id(i), retry_after=1), module="slow")
            await reg.register(operation_doc(_id(100 + i), retry_after=1), module="other")
        async with Poller(reg, {"slow": slow, "other": other}):
            await asyncio.sleep(60)
        done = await reg.operations(status="completed", limit=100)
    assert len(done) == 12
    assert slow.max_inflight == 2 and other.max_inflight == 2


async def test_transient_failures_back_off_and_keep_the_status(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """Two 503s: the status stays running, attempts are spent, the waits double (5, 10)."""
    fail = TransientPollError("poll-http-503", "503")
    conn = Scripted(virtual_clock, ["running", fail, fail, "completed"])
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(10.5)
            mid = await reg.get(_id(1))
            await asyncio.sleep(60)
        op = await reg.get(_id(1))
    assert mid is not None and (mid.status, mid.last_error_code) == ("running", "poll-http-503")
    # running at 5; 503 at 10 (+5 = 2^1 * 5 after attempt 2); 503 at 20 (+20); completed at 40
    assert conn.polls[_id(1)] == [5.0, 10.0, 20.0, 40.0]
    assert op is not None and op.status == "completed" and op.attempts == 4


async def test_a_broken_connector_backs_off(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """A connector raising an unexpected error is a poll-error: the waits stretch, no spin."""
    conn = Scripted(virtual_clock, [ValueError("bug")] * 10)
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(40)
        op = await reg.get(_id(1))
    assert conn.polls[_id(1)] == [5.0, 10.0, 20.0]
    assert op is not None and (op.status, op.last_error_code) == ("pending", "poll-error")


async def test_a_hanging_connector_is_a_poll_timeout(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """A status call that never answers is cut at poll_timeout and backs off."""
    conn = Scripted(virtual_clock, work_s=10_000)
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        async with Poller(reg, {"m": conn}, poll_timeout=2):
            await asyncio.sleep(8)
        op = await reg.get(_id(1))
    assert op is not None and op.status == "pending"
    assert (op.attempts, op.last_error_code) == (1, "poll-timeout")


async def test_expiry_is_written_on_time_without_a_poll(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """A 30 s lifetime with a 60 s cadence: expired at exactly 30 s, never polled."""
    conn = Scripted(virtual_clock)
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=60, ttl_s=30), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(29.999)
            before = await reg.get(_id(1))
            await asyncio.sleep(5)
            after = await reg.get(_id(1))
    assert before is not None and before.status == "pending"
    assert after is not None and after.status == "expired"
    assert after.updated_ms == after.created_ms + 30_000
    assert conn.polls == {}


async def test_no_poll_after_unknown(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """unknown is terminal: the poller never asks again."""
    conn = Scripted(virtual_clock, ["unknown"])
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(100)
    assert conn.polls[_id(1)] == [5.0]


async def test_a_restart_rearms_from_storage(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """Stopped at 2 s and restarted, the poller polls at the stored 5 s, not earlier."""
    conn = Scripted(virtual_clock, ["completed"])
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(2)
    async with Registry(_url(tmp_path), policy=HostPolicy(jitter=False)) as reg:
        async with Poller(reg, {"m": conn}):
            await asyncio.sleep(10)
    assert conn.polls[_id(1)] == [5.0]


async def test_poll_now_obeys_the_rate_cap(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """With a cap of 1/s, an operator's poll 0.5 s after the loop's waits until 1 s."""
    conn = Scripted(virtual_clock)
    policy = HostPolicy(jitter=False, poll_rate_cap=1, max_retry_after=600)
    async with Registry(_url(tmp_path), policy=policy) as reg:
        await reg.register(operation_doc(_id(1), retry_after=5), module="m")
        await reg.register(operation_doc(_id(2), retry_after=500), module="m")
        async with Poller(reg, {"m": conn}) as poller:
            await asyncio.sleep(5.5)
            await poller.poll_now(_id(2))
    assert conn.polls[_id(1)] == [5.0]
    assert conn.polls[_id(2)] == [6.0]


async def test_cancel_calls_the_connector_once(tmp_path: Path, virtual_clock: VirtualClock) -> None:
    """With cancel_href the host asks the connector; the operation ends cancelled."""
    conn = Scripted(virtual_clock)
    async with Registry(_url(tmp_path)) as reg:
        await reg.register(operation_doc(_id(1)), module="m")
        async with Poller(reg, {"m": conn}) as poller:
            view = await poller.cancel(_id(1))
            again = await poller.cancel(_id(1))
        op = await reg.get(_id(1))
    assert view["status"] == "cancelled" and again == view
    assert conn.cancels == [_id(1)]
    assert op is not None and op.cancel_requested_ms is not None


async def test_cancel_without_href_returns_the_reason(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """A non-cancelable operation keeps its state and shows its reason."""
    conn = Scripted(virtual_clock)
    doc = operation_doc(_id(1), **{"cancel/unavailable-reason": "sent to a printer"})
    del doc["cancel_href"]
    async with Registry(_url(tmp_path)) as reg:
        await reg.register(doc, module="m")
        async with Poller(reg, {"m": conn}) as poller:
            view = await poller.cancel(_id(1))
    assert view["status"] == "pending"
    assert view["cancel/unavailable-reason"] == "sent to a printer"
    assert conn.cancels == []


def test_bad_poll_timeout_is_refused(tmp_path: Path) -> None:
    """poll_timeout must be a positive, finite duration (a ConfigurationError naming it)."""
    for bad in (0, float("inf"), "soon"):
        with pytest.raises(tb.ConfigurationError, match="poll_timeout") as info:
            Poller(Registry(_url(tmp_path)), {}, poll_timeout=bad)  # type: ignore[arg-type]
        assert info.value.option == "poll_timeout"


def test_poll_timeout_takes_a_duration_and_its_old_spelling(tmp_path: Path) -> None:
    assert Poller(Registry(_url(tmp_path)), {}, poll_timeout="1500ms").poll_timeout == 1.5
    with pytest.warns(
        DeprecationWarning, match=r"Poller\(poll_timeout_s=…\) is deprecated; pass poll_timeout="
    ):
        assert Poller(Registry(_url(tmp_path)), {}, poll_timeout_s=3).poll_timeout == 3.0


async def test_an_idle_round_never_wakes_before_the_next_poll(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """The wait an idle round returns ends at or after the next poll's millisecond (D7.6).

    The instants are ones where ``(next - now_ms()) / 1000`` ended a millisecond early: the
    floored epoch-ms reading after the wait fell below the stored instant.
    """
    base = now_ms()
    async with Registry(_url(tmp_path)) as reg:
        await reg.register(operation_doc(_id(1), ttl_s=300), module="m")
        await raw_update(reg, _id(1), next_poll_ms=base + 16_287)
        virtual_clock.jump_to(3.017999783851022)
        delay = await Poller(reg, {"m": Scripted(virtual_clock)}).step()
    assert delay is not None
    virtual_clock.advance(delay)
    assert now_ms() >= base + 16_287


async def test_a_waiting_poll_now_leaves_the_loops_wake_up_alone(
    tmp_path: Path, virtual_clock: VirtualClock
) -> None:
    """An operator's poll waiting for a slot never clears the wake-up a change gave the loop.

    It used to wait on the loop's own event and clear it, which could swallow the wake-up of a
    poll that completed an operation meanwhile (the loop then slept with it unresumed). The loop
    is not started here, so nothing else may clear the event.
    """
    conn = Scripted(virtual_clock)
    policy = HostPolicy(jitter=False, poll_rate_cap=1, max_retry_after=600)
    async with Registry(_url(tmp_path), policy=policy) as reg:
        await reg.register(operation_doc(_id(1), retry_after=500), module="m")
        await reg.register(operation_doc(_id(2), retry_after=500), module="m")
        poller = Poller(reg, {"m": conn})
        try:
            await asyncio.sleep(5.5)
            await poller.poll_now(_id(1))  # the cap of 1/s now holds until 6.5 s
            waiting = asyncio.create_task(poller.poll_now(_id(2)))
            await asyncio.sleep(0)
            poller._wake.set()  # a change arrives while the operator's poll waits
            await asyncio.sleep(0.1)
            still_set = poller._wake.is_set()
            await waiting
        finally:
            await poller.stop()
    assert still_set
    assert conn.polls[_id(2)] == [6.5]
