"""The Python service's own task: how its work ends becomes the operation's status (D7.3)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import timebound as tb
from timebound import DeadlineExceeded, fail_after
from timebound.deferred import Registry, Service
from timebound.deferred._contract import parse_time


async def _run_to_end(store_url: str, work: Any, ttl_s: int = 300) -> tuple[Any, int]:
    """Start one operation running ``work``, wait for its task; its stored row and start time."""
    async with Registry(store_url) as reg:
        service = Service(reg)
        service.operation("report.render", ttl=ttl_s)(work)
        doc = await service.start("report.render", {})
        started = asyncio.get_running_loop().time()
        await asyncio.gather(*service._tasks)
        op = await reg.get(doc["operation/id"])
        return op, round(asyncio.get_running_loop().time() - started)


async def test_an_inner_timeout_fails_at_once(store_url: str, clock: Any) -> None:
    """The work's own 2 s bound firing ends the operation failed/timed-out at 2 s, not expired."""

    async def work(payload: Any) -> Any:
        with fail_after(2):
            await asyncio.sleep(60)

    op, took = await _run_to_end(store_url, work)
    assert (op.status, op.last_error_code, took) == ("failed", "timed-out", 2)


async def test_a_downstream_deadline_fails_the_operation(store_url: str, clock: Any) -> None:
    """A downstream's spent deadline (source propagated) fails the operation with its own code."""

    async def work(payload: Any) -> Any:
        await asyncio.sleep(1)
        raise DeadlineExceeded(source="propagated")

    op, took = await _run_to_end(store_url, work)
    assert (op.status, op.last_error_code, took) == ("failed", "downstream-deadline-exceeded", 1)


async def test_the_lifetime_running_out_expires_it(store_url: str, clock: Any) -> None:
    """Work outliving the operation's 5 s lifetime ends expired at 5 s."""

    async def work(payload: Any) -> Any:
        await asyncio.sleep(3600)

    op, took = await _run_to_end(store_url, work, ttl_s=5)
    assert (op.status, op.last_error_code, took) == ("expired", "expired", 5)


async def test_offer_spans_take_whole_second_durations_and_old_spellings(
    store_url: str, clock: Any
) -> None:
    """retry_after=/ttl= are durations of whole seconds; retry_after_s=/ttl_s= warn (D1.12)."""
    async with Registry(store_url) as reg:
        service = Service(reg)

        async def work(payload: Any) -> Any:
            return {}

        service.operation("a", retry_after="2s", ttl="2min")(work)
        with pytest.warns(
            DeprecationWarning, match=r"Service.operation\(ttl_s=…\) is deprecated; pass ttl="
        ):
            service.operation("b", ttl_s=60)(work)
        with pytest.raises(tb.ConfigurationError, match="whole seconds") as info:
            service.operation("c", ttl="1500ms")
        assert info.value.option == "ttl"
        assert (service._offers["a"].retry_after_s, service._offers["a"].ttl_s) == (2, 120)
        assert service._offers["b"].ttl_s == 60
        doc = await service.start("a", {}, wait="30s")
        await asyncio.gather(*service._tasks)
    assert parse_time(doc["expires_at"]) - parse_time(doc["created_at"]) == 30_000


async def test_an_expired_operation_says_where_its_lifetime_went(
    store_url: str, clock: Any
) -> None:
    """The deferred bound of an expiry carries the operation's states as parts (D13)."""
    from timebound.telemetry import Event, add_listener

    seen: list[Event] = []
    remove = add_listener(seen.append)
    try:

        async def work(payload: Any) -> Any:
            await asyncio.sleep(3600)

        op, _ = await _run_to_end(store_url, work, ttl_s=5)
    finally:
        remove()
    assert op.status == "expired"
    (expired,) = [e for e in seen if e.name == "deferred.expired"]
    bd = expired.bound.breakdown
    assert bd is not None and bd.name == "deferred"
    assert bd.elapsed_ms == 5000
    states = [p for p in bd.parts if p.kind == "state"]
    assert states and sum(p.elapsed_ms for p in bd.parts) == 5000
    assert "went to:" in str(expired.bound)
