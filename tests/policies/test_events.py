"""Telemetry events of one execution: stable names, the policy name on every event."""

from __future__ import annotations

import asyncio

import pytest

from timebound import RetryExhausted
from timebound.policies import Policy
from timebound.telemetry import Event, add_listener
from timebound.testing import VirtualClock

from ._helpers import AsyncFlaky, Flaky, Hang, Recorder


async def test_success_after_retry_events(virtual_clock: VirtualClock) -> None:
    """A retried success reports start, two attempts with a delay between them, and ok."""
    rec = Recorder()
    await Policy("Ev", retry=2, delay=1).execute(AsyncFlaky(1), observer=rec)
    assert rec.names() == [
        "call.start",
        "attempt.start",
        "attempt.end",
        "retry.delay",
        "attempt.start",
        "attempt.end",
        "call.end",
    ]
    assert all(e.attrs["policy"] == "Ev" for e in rec.events)
    first, second = rec.of("attempt.end")
    assert first.attrs["outcome"] == "error"
    assert isinstance(first.attrs["error"], ConnectionError)
    assert second.attrs == {"policy": "Ev", "attempt": 2, "outcome": "ok", "error": None}
    assert rec.of("retry.delay")[0].attrs == {"policy": "Ev", "attempt": 1, "delay": 1.0}
    assert rec.of("call.end")[0].attrs["outcome"] == "ok"
    assert [e.at for e in rec.of("attempt.start")] == [0.0, 1.0]


async def test_timeout_outcome(virtual_clock: VirtualClock) -> None:
    """An attempt cut by its timeout ends with outcome timeout."""
    rec = Recorder()
    with pytest.raises(TimeoutError):
        await Policy("Ev", timeout=1).execute(Hang(), observer=rec)
    assert rec.of("attempt.end")[0].attrs["outcome"] == "timeout"
    assert rec.of("call.end")[0].attrs["outcome"] == "error"


async def test_fallback_events(virtual_clock: VirtualClock) -> None:
    """A fallback reports its reason and the call ends with outcome fallback."""
    rec = Recorder()
    await Policy("Ev", retry=1, fallback="x").execute(AsyncFlaky(5), observer=rec)
    assert rec.of("fallback")[0].attrs["reason"] == "retry_exhausted"
    assert isinstance(rec.of("fallback")[0].attrs["error"], RetryExhausted)
    assert rec.of("call.end")[0].attrs["outcome"] == "fallback"


async def test_cache_events(virtual_clock: VirtualClock) -> None:
    """A miss stores (cache.store), a hit reports cache.hit and outcome cached."""
    rec = Recorder()
    policy = Policy("EvCache", cache="1min")
    await policy.execute(AsyncFlaky(0), observer=rec)
    await policy.execute(AsyncFlaky(0), observer=rec)
    assert rec.names() == [
        "call.start",
        "attempt.start",
        "attempt.end",
        "cache.store",
        "call.end",
        "call.start",
        "cache.hit",
        "call.end",
    ]
    assert rec.events[-1].attrs["outcome"] == "cached"


@pytest.mark.parametrize(
    ("mode", "outcome"), [("skip", "skipped"), ("log", "skipped"), ("wrap", "wrapped")]
)
def test_on_error_events(virtual_clock: VirtualClock, mode: str, outcome: str) -> None:
    """on_error reports its mode and the call's outcome."""
    rec = Recorder()
    Policy("Ev", on_error=mode).execute_sync(Flaky(1), observer=rec)
    assert rec.of("on_error")[0].attrs["mode"] == mode
    assert rec.of("call.end")[0].attrs["outcome"] == outcome


async def test_cancelled_outcome(virtual_clock: VirtualClock) -> None:
    """A cancelled call ends its attempt and the call with outcome cancelled."""
    rec = Recorder()
    task = asyncio.ensure_future(Policy("Ev").execute(Hang(), observer=rec))
    await asyncio.sleep(1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rec.of("attempt.end")[0].attrs["outcome"] == "cancelled"
    assert rec.of("call.end")[0].attrs["outcome"] == "cancelled"


def test_global_listeners_receive_the_same_events(virtual_clock: VirtualClock) -> None:
    """Global telemetry listeners see the events too, with or without an observer."""
    seen: list[Event] = []
    remove = add_listener(seen.append)
    try:
        Policy("EvGlobal", retry=1).execute_sync(Flaky(1))
    finally:
        remove()
    names = [e.name for e in seen if e.attrs.get("policy") == "EvGlobal"]
    assert names[0] == "call.start" and names[-1] == "call.end"
    assert names.count("attempt.start") == 2


def test_a_failing_observer_does_not_break_the_call(virtual_clock: VirtualClock) -> None:
    """An observer that raises is logged and ignored."""

    def broken(event: Event) -> None:
        raise RuntimeError("observer bug")

    assert Policy("Ev").execute_sync(Flaky(0), observer=broken) == "ok"
