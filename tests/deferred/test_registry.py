"""The registry's host-enforced state machine (D7.2-D7.5) on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import timebound as tb
from timebound.deferred import (
    Gone,
    HostPolicy,
    IdempotencyConflict,
    Registry,
    SchemaError,
    StatusOutcome,
)
from timebound.deferred._contract import format_time
from timebound.deferred._registry import now_ms

from .conftest import operation_doc, status_doc

OP = "deferred:report.render:op1"
NO_JITTER = HostPolicy(jitter=False)


async def test_register_stores_the_clamped_lifetime_and_first_poll(
    store_url: str, clock: Any
) -> None:
    """A 600 s retry hint is clamped to 60 s; a 2 h lifetime hint to max_ttl (900 s)."""
    async with Registry(store_url, policy=NO_JITTER) as reg:
        start = now_ms()
        op = await reg.register(operation_doc(retry_after=600, ttl_s=7200), module="m")
        assert op.status == "pending"
        assert op.retry_after_s == 60
        assert op.next_poll_ms == start + 60_000
        assert op.expires_ms == start + 900_000


async def test_register_refuses_an_invalid_document(store_url: str, clock: Any) -> None:
    """A bad deferred-operation.v1 is a SchemaError and nothing is stored."""
    async with Registry(store_url) as reg:
        doc = operation_doc()
        del doc["cancel_href"]
        with pytest.raises(SchemaError):
            await reg.register(doc, module="m")
        assert await reg.get(OP) is None


async def test_a_spent_caller_deadline_registers_nothing(store_url: str, clock: Any) -> None:
    """The caller's deadline already passed: DeadlineExceeded(source=deferred), no row."""
    async with Registry(store_url) as reg:
        deadline = tb.Deadline.after(1)
        clock.advance(2)
        with pytest.raises(tb.DeadlineExceeded) as info:
            await reg.register(operation_doc(), module="m", caller_deadline=deadline)
        assert info.value.source == "deferred"
        assert await reg.get(OP) is None


async def test_same_key_same_request_gives_the_same_operation(store_url: str, clock: Any) -> None:
    """An idempotent repeat returns the first operation; no second row is made."""
    async with Registry(store_url) as reg:
        first = await reg.register(
            operation_doc(), module="m", idempotency_key="k", request={"a": 1}
        )
        again = await reg.register(
            operation_doc("deferred:report.render:op2"),
            module="m",
            idempotency_key="k",
            request={"a": 1},
        )
        assert again.id == first.id
        assert await reg.get("deferred:report.render:op2") is None


async def test_same_key_other_request_conflicts(store_url: str, clock: Any) -> None:
    """The same idempotency key with another request body is a conflict."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m", idempotency_key="k", request={"a": 1})
        with pytest.raises(IdempotencyConflict):
            await reg.register(
                operation_doc("deferred:report.render:op2"),
                module="m",
                idempotency_key="k",
                request={"a": 2},
            )


async def test_running_then_completed_applies(store_url: str, clock: Any) -> None:
    """pending -> running -> completed are applied in order."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        assert await reg.apply_status(OP, status_doc(status="running")) == StatusOutcome(True, None)
        assert await reg.apply_status(OP, status_doc(status="completed")) == StatusOutcome(
            True, None
        )
        op = await reg.get(OP)
        assert op is not None and op.status == "completed" and op.next_poll_ms is None


async def test_nothing_leaves_a_terminal_state(store_url: str, clock: Any) -> None:
    """A second, different terminal status is a terminal-conflict and changes nothing."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        await reg.apply_status(OP, status_doc(status="completed"))
        got = await reg.apply_status(OP, status_doc(status="failed"))
        assert got == StatusOutcome(False, "terminal-conflict")
        op = await reg.get(OP)
        assert op is not None and op.status == "completed"


async def test_a_same_digest_repeat_is_a_no_op(store_url: str, clock: Any) -> None:
    """The same terminal document again: applied False, no code, no history entry."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        doc = status_doc(status="completed")
        await reg.apply_status(OP, doc)
        before = await reg.history(OP)
        assert await reg.apply_status(OP, dict(doc)) == StatusOutcome(False, None)
        assert await reg.history(OP) == before


async def test_running_never_goes_back_to_pending(store_url: str, clock: Any) -> None:
    """running -> pending is a status-regression."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        await reg.apply_status(OP, status_doc(status="running"))
        assert await reg.apply_status(OP, status_doc()) == StatusOutcome(False, "status-regression")
        op = await reg.get(OP)
        assert op is not None and op.status == "running"


async def test_a_stale_updated_at_is_ignored(store_url: str, clock: Any) -> None:
    """A status older than the last applied one is stale-status."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        t = now_ms()
        newer = status_doc(status="running", updated_at=format_time(t + 2000))
        older = status_doc(status="completed", updated_at=format_time(t + 1000))
        assert (await reg.apply_status(OP, newer)).applied
        assert await reg.apply_status(OP, older) == StatusOutcome(False, "stale-status")


async def test_identity_mismatch(store_url: str, clock: Any) -> None:
    """A status about another operation is refused with identity-mismatch."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        other = status_doc("deferred:report.render:zzz", status="completed")
        assert await reg.apply_status(OP, other) == StatusOutcome(False, "identity-mismatch")


async def test_completed_without_result_is_a_schema_rejection(store_url: str, clock: Any) -> None:
    """A broken status is never raised at the caller: applied False, code schema."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        doc = status_doc()
        doc["status"] = "completed"
        assert await reg.apply_status(OP, doc) == StatusOutcome(False, "schema")
        assert await reg.apply_status(OP, "not even an object") == StatusOutcome(False, "schema")
        op = await reg.get(OP)
        assert op is not None and op.status == "pending"


async def test_a_result_json_cannot_carry_is_a_schema_rejection(store_url: str, clock: Any) -> None:
    """An in-process connector answering a set in its result: applied False, code schema (it
    escaped apply_status as a TypeError from the digest); the operation keeps waiting."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        doc = status_doc(status="completed", result={"ids": {1, 2}})
        assert await reg.apply_status(OP, doc) == StatusOutcome(False, "schema")
        op = await reg.get(OP)
        assert op is not None and op.status == "pending"


async def test_connector_expired_is_applied_as_failed(store_url: str, clock: Any) -> None:
    """Only the host writes expired: a connector's expired becomes failed/connector-expired."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        got = await reg.apply_status(OP, status_doc(status="expired"))
        assert got == StatusOutcome(True, "connector-expired")
        op = await reg.get(OP)
        assert op is not None and op.status == "failed"
        assert op.last_error_code == "connector-expired"


async def test_late_completion_is_recorded_never_resumed(store_url: str, clock: Any) -> None:
    """completed after expires_at on a live row: late-completion, result digest only, expired."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(ttl_s=60), module="m")
        clock.advance(61)
        got = await reg.apply_status(OP, status_doc(status="completed", result={"v": 1}))
        assert got == StatusOutcome(False, "late-completion")
        op = await reg.get(OP)
        assert op is not None and op.status == "expired" and op.result_digest is None
        assert op.late_result_digest is not None


async def test_completion_after_host_expiry_is_a_terminal_conflict(
    store_url: str, clock: Any
) -> None:
    """Once the host has written expired, a completion is terminal-conflict."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(ttl_s=60), module="m")
        clock.advance(60)
        assert await reg.expire_due() == 1
        got = await reg.apply_status(OP, status_doc(status="completed"))
        assert got == StatusOutcome(False, "terminal-conflict")


async def test_expiry_is_never_early(store_url: str, clock: Any) -> None:
    """1 ms before expires_at nothing expires; at expires_at it does."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(ttl_s=60), module="m")
        clock.advance(59.999)
        assert await reg.expire_due() == 0
        clock.advance(0.001)
        assert await reg.expire_due() == 1
        op = await reg.get(OP)
        assert op is not None and op.status == "expired" and op.last_error_code == "expired"


async def test_expiry_during_downtime_has_its_own_code(store_url: str, clock: Any) -> None:
    """A host starting after expires_at marks the operation expired-during-host-downtime."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(ttl_s=60), module="m")
    clock.advance(3600)
    async with Registry(store_url) as reg:
        assert await reg.expire_due(startup=True) == 1
        op = await reg.get(OP)
        assert op is not None and op.last_error_code == "expired-during-host-downtime"
        assert op.attempts == 0


async def test_unknown_is_terminal(store_url: str, clock: Any) -> None:
    """unknown ends the operation: no further poll is armed."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        assert (await reg.apply_status(OP, status_doc(status="unknown"))).applied
        op = await reg.get(OP)
        assert op is not None and op.terminal and op.next_poll_ms is None


async def test_retention_ends_in_gone_never_pending(store_url: str, clock: Any) -> None:
    """After retain_until an id answers Gone; an id never issued answers None."""
    policy = HostPolicy(jitter=False, retain=100)
    async with Registry(store_url, policy=policy) as reg:
        await reg.register(operation_doc(), module="m")
        await reg.apply_status(OP, status_doc(status="failed"))
        clock.advance(99.999)
        assert (await reg.get(OP)) is not None
        clock.advance(0.001)
        with pytest.raises(Gone):
            await reg.get(OP)
        with pytest.raises(Gone):
            await reg.status_document(OP)
        assert await reg.get("deferred:report.render:never") is None


async def test_poll_budget_exhausted_ends_as_expired(store_url: str, clock: Any) -> None:
    """Out of attempts, the operation expires with poll-budget-exhausted."""
    policy = HostPolicy(jitter=False, max_attempts=2)
    async with Registry(store_url, policy=policy) as reg:
        await reg.register(operation_doc(), module="m")
        assert (await reg.polled(OP, status_doc())).code is None
        assert (await reg.poll_failed(OP, 5, "poll-timeout")).code == "poll-budget-exhausted"
        op = await reg.get(OP)
        assert op is not None and op.status == "expired"
        assert op.last_error_code == "poll-budget-exhausted" and op.attempts == 2


async def test_transient_failure_keeps_the_status_and_backs_off(store_url: str, clock: Any) -> None:
    """A transient poll failure spends an attempt and moves the next poll; status unchanged."""
    async with Registry(store_url, policy=NO_JITTER) as reg:
        await reg.register(operation_doc(), module="m")
        await reg.apply_status(OP, status_doc(status="running"))
        at = now_ms()
        assert await reg.poll_failed(OP, 20, "poll-http-503") == StatusOutcome(
            True, "poll-http-503"
        )
        op = await reg.get(OP)
        assert op is not None
        assert (op.status, op.attempts, op.next_poll_ms) == ("running", 1, at + 20_000)


async def test_cancel_complete_race_ends_in_one_terminal_state(store_url: str, clock: Any) -> None:
    """A cancel and a completion applied at once: exactly one wins, the other is a conflict."""
    async with Registry(store_url) as reg:
        for i in range(20):
            op_id = f"deferred:report.render:race{i}"
            await reg.register(operation_doc(op_id), module="m")
            a, b = await asyncio.gather(
                reg.apply_status(op_id, status_doc(op_id, status="completed")),
                reg.apply_status(op_id, status_doc(op_id, status="cancelled")),
            )
            assert sorted([a.applied, b.applied]) == [False, True]
            loser = a if not a.applied else b
            assert loser.code == "terminal-conflict"


async def test_history_is_append_only_and_digest_only(store_url: str, clock: Any) -> None:
    """Every change appends one history entry with a digest, never the document."""
    async with Registry(store_url) as reg:
        await reg.register(operation_doc(), module="m")
        await reg.apply_status(OP, status_doc(status="running"))
        await reg.apply_status(OP, status_doc())
        history = await reg.history(OP)
        assert [h["status"] for h in history] == ["pending", "running", "running"]
        assert [h["code"] for h in history] == [None, None, "status-regression"]
        assert all(set(h) == {"at_ms", "status", "digest", "code"} for h in history)


async def test_invalid_hint_is_recorded(store_url: str, clock: Any) -> None:
    """A pending status without a usable hint keeps a clamped poll interval."""
    policy = HostPolicy(jitter=False, min_retry_after=2)
    async with Registry(store_url, policy=policy) as reg:
        op = await reg.register(operation_doc(retry_after=1), module="m")
        assert op.retry_after_s == 2


async def test_a_round_of_poll_answers_is_applied_as_each_alone(store_url: str, clock: Any) -> None:
    """polled_many (one transaction for a round) gives each answer the outcome polled gives it,
    in the caller's order, and counts one attempt per answer."""
    ids = [f"deferred:report.render:op{i}" for i in range(5)]
    async with Registry(store_url, policy=NO_JITTER) as reg:
        for op_id in ids:
            await reg.register(operation_doc(op_id), module="m")
        answers: list[tuple[str, object]] = [
            (ids[3], status_doc(ids[3], status="completed", result={"pages": 1})),
            (ids[0], status_doc(ids[0])),
            (ids[1], {"schema": "nonsense"}),
            ("deferred:report.render:never", status_doc("deferred:report.render:never")),
            (ids[2], status_doc(ids[4])),
        ]
        outcomes = await reg.polled_many(answers)
        assert outcomes == [
            StatusOutcome(True, None),
            StatusOutcome(True, None),
            StatusOutcome(False, "schema"),
            StatusOutcome(False, "not-found"),
            StatusOutcome(False, "identity-mismatch"),
        ]
        ops = {op_id: await reg.get(op_id) for op_id in ids}
    statuses = {k: (v.status, v.attempts) for k, v in ops.items() if v is not None}
    assert statuses == {
        ids[0]: ("pending", 1),
        ids[1]: ("pending", 1),
        ids[2]: ("pending", 1),
        ids[3]: ("completed", 1),
        ids[4]: ("pending", 0),
    }
