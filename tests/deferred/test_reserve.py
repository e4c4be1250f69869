"""The host's reserve (D7.16): an operation bounded by its caller's deadline expires the
reserve earlier, so the host records its end and resumes its continuation before that deadline;
a caller with no more than the reserve left creates nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import timebound as tb
from timebound.deferred import (
    CONTINUATION_SCHEMA,
    HostPolicy,
    Operation,
    Poller,
    Registry,
    Resumption,
)
from timebound.testing import VirtualClock

from .conftest import operation_doc, status_doc

OP = "deferred:report.render:op1"


def _now(clock: VirtualClock) -> datetime:
    return datetime.fromtimestamp(clock.wall(), tz=UTC)


def test_the_caller_deadline_less_the_reserve_bounds_the_lifetime(
    virtual_clock: VirtualClock,
) -> None:
    policy = HostPolicy(reserve="5s")
    now = _now(virtual_clock)
    deadline = tb.Deadline.after(40)
    assert policy.expires_at(now, fail_after=600, caller_deadline=deadline) == now + timedelta(
        seconds=35
    )
    now_ms = int(virtual_clock.wall() * 1000)
    assert policy.lifetime_bound(now_ms, fail_after=600, caller_deadline=deadline) == (
        35.0,
        "reserve of caller",
    )
    # A shorter bound of another kind is not shortened: the reserve is kept from the caller's.
    assert policy.lifetime_bound(now_ms, fail_after=20, caller_deadline=deadline) == (
        20.0,
        "connector",
    )
    assert HostPolicy().lifetime_bound(now_ms, fail_after=600, caller_deadline=deadline) == (
        40.0,
        "caller",
    )


def test_a_caller_with_no_more_than_the_reserve_left_creates_nothing(
    virtual_clock: VirtualClock,
) -> None:
    deadline = tb.Deadline.after(2)
    with pytest.raises(tb.DeadlineExceeded) as info:
        HostPolicy(reserve="2s").expires_at(_now(virtual_clock), caller_deadline=deadline)
    err = info.value
    assert (err.source, err.set_by) == ("deferred", "reserve of caller")
    assert "reserve of 2s" in str(err)


@pytest.mark.parametrize("bad", ["-1s", "soon", float("nan"), float("inf")])
def test_an_invalid_reserve_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(tb.ConfigurationError, match="reserve"):
        HostPolicy(reserve=bad)  # type: ignore[arg-type]


def test_the_reserve_reads_back_as_seconds() -> None:
    policy = HostPolicy(reserve="1500ms")
    assert policy.reserve == 1.5
    assert policy.describe()["reserve_ms"] == 1500
    assert HostPolicy().reserve == 0.0


class _Pending:
    """A connector whose operation never ends."""

    async def status(self, op: Operation) -> object:
        return status_doc(op.id, status="pending")

    async def cancel(self, op: Operation) -> object:
        return status_doc(op.id, status="cancelled")


@pytest.mark.parametrize("reserve", [None, "2s"])
async def test_the_continuation_resumes_in_the_reserve(
    store_url: str, clock: Any, reserve: str | None
) -> None:
    """A caller with 30 s: with a 2 s reserve the operation expires and resumes its
    continuation at 28 s, 2 s before the caller's deadline; without one, only at it."""
    resumed: list[tuple[float, Resumption]] = []

    async def resume(tx: Any, r: Resumption) -> None:
        resumed.append((clock.now(), r))

    policy = HostPolicy(jitter=False, reserve=reserve)
    async with Registry(store_url, policy=policy) as reg:
        reg.on_resume("test", resume)
        start = clock.now()
        caller = tb.Deadline.after(30)
        op = await reg.register(
            operation_doc(OP, retry_after=5, ttl_s=300),
            module="m",
            continuation={"schema": CONTINUATION_SCHEMA, "resume_kind": "test", "run": "r1"},
            caller_deadline=caller,
        )
        assert op.expires_ms == op.created_ms + (28_000 if reserve else 30_000)
        assert op.expires_set_by == ("reserve of caller" if reserve else "caller")
        async with Poller(reg, {"m": _Pending()}):
            while not resumed and clock.now() - start < 60:
                await asyncio.sleep(0.5)
        after = await reg.get(OP)
    assert after is not None and after.status == "expired"
    ((at, r),) = resumed
    assert r.error is not None and r.error["code"] == "expired"
    if reserve:
        assert caller.when - at >= 1.9  # the reserve was left for the caller
    else:
        assert at >= caller.when  # never early, and nothing left for the caller


async def test_registration_refuses_a_caller_within_the_reserve(store_url: str, clock: Any) -> None:
    async with Registry(store_url, policy=HostPolicy(reserve="5s")) as reg:
        with pytest.raises(tb.DeadlineExceeded, match="reserve"):
            await reg.register(operation_doc(OP), module="m", caller_deadline=tb.Deadline.after(4))
        assert await reg.get(OP) is None


def _workflow(store_url: str, reserve: str | None) -> Any:
    from timebound import workflow as wf

    async def start(ctx: Any) -> Any:
        return operation_doc(OP, retry_after=1, ttl_s=300)

    engine = wf.Engine(
        db=store_url,
        actions={"start": start},
        deferred_policy=HostPolicy(jitter=False, reserve=reserve),
        deferred_connectors={"svc": _Pending()},
    )
    engine.register(
        {
            "id": "report",
            "initial_node": "A",
            "actions": [
                {
                    "id": "render",
                    "kind": "deferred",
                    "implementation": {"handler": "start", "module": "svc"},
                }
            ],
            "nodes": [{"id": "A", "action_id": "render", "timeout_ms": 10_000}],
        }
    )
    return engine


@pytest.mark.parametrize("reserve", [None, "2s"])
async def test_a_workflow_node_hears_its_operation_expire_before_its_deadline(
    store_url: str, clock: Any, reserve: str | None
) -> None:
    """A deferred node with 10 s: with the host's 2 s reserve the operation expires at 8 s and
    the node ends on that answer, its own timer never firing; without it the node's deadline
    and the operation's expiry are the same instant and the node times out."""
    async with _workflow(store_url, reserve) as engine:
        run_id = await engine.start("report", {})
        result = await engine.wait(run_id, timeout=60)
        events = await engine.events(run_id)
        (op,) = await engine.deferred_registry.operations()
    timed_out = [e for e in events if e["kind"] == "token_timed_out"]
    assert result.status == "failed"
    if reserve:
        assert op.status == "expired"
        assert op.expires_ms - op.created_ms == pytest.approx(8_000, abs=5)
        assert not timed_out, events
        assert result.error is not None and "expired" in result.error
        assert op.resumed_ms is not None and op.resumed_ms <= op.created_ms + 8_000 + 5
    else:
        assert timed_out  # the operation's end was not heard before the node's deadline
