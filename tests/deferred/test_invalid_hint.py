"""A retry hint the policy cannot use falls back to the minimum with an ``invalid-hint`` code
(D7.8): the wire schemas leave the hint to the policy, so the code is reachable."""

from __future__ import annotations

from typing import Any

import pytest

from timebound.deferred import HostPolicy, Registry, validate_operation

from .conftest import operation_doc, status_doc

OP = "deferred:report.render:op1"
POLICY = HostPolicy(jitter=False, min_retry_after=2)
_ABSENT = object()


@pytest.mark.parametrize("hint", [0, -3, 2.5, "5", True, None, {"s": 5}, _ABSENT])
async def test_an_unusable_hint_at_registration_is_the_minimum_and_recorded(
    store_url: str, clock: Any, hint: object
) -> None:
    """An absent, zero, negative, non-integer or unparsable retry_after_seconds: the operation is
    registered, its interval is min_retry_after_s, and its history says invalid-hint."""
    doc = operation_doc()
    if hint is _ABSENT:
        del doc["retry_after_seconds"]
    else:
        doc["retry_after_seconds"] = hint
    validate_operation(doc)  # the schema does not judge the hint
    async with Registry(store_url, policy=POLICY) as reg:
        op = await reg.register(doc, module="m")
        history = await reg.history(OP)
    assert op.retry_after_s == 2
    assert [h["code"] for h in history] == ["invalid-hint"]


async def test_a_large_hint_is_clamped_not_refused(store_url: str, clock: Any) -> None:
    """7200 s is a usable hint: clamped to max_retry_after_s, no code."""
    async with Registry(store_url, policy=POLICY) as reg:
        op = await reg.register(operation_doc(retry_after=7200), module="m")
        history = await reg.history(OP)
    assert op.retry_after_s == 60
    assert [h["code"] for h in history] == [None]


async def test_an_unusable_hint_in_a_status_is_recorded(store_url: str, clock: Any) -> None:
    """A running status whose hint is 0 keeps polling at the minimum and records invalid-hint;
    a usable one records nothing."""
    async with Registry(store_url, policy=POLICY) as reg:
        await reg.register(operation_doc(), module="m")
        await reg.apply_status(OP, status_doc(status="running", retry_after_seconds=0))
        await reg.apply_status(OP, status_doc(status="running", retry_after_seconds=7))
        op = await reg.get(OP)
        history = await reg.history(OP)
    assert op is not None and op.retry_after_s == 7
    assert [h["code"] for h in history] == [None, "invalid-hint", None]
