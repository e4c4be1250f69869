"""Continuations (D7.4): versioned JSON bound by digest, resumed exactly once; privacy canary."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from timebound.deferred import CONTINUATION_SCHEMA, HostPolicy, Registry, Resumption
from timebound.deferred._registry import MAX_CONTINUATION_BYTES

from .conftest import operation_doc, raw_update, status_doc

OP = "deferred:report.render:op1"
CANARY = "canary-7f3e9a-secret"


def _cont(**extra: Any) -> dict[str, Any]:
    return {"schema": CONTINUATION_SCHEMA, "resume_kind": "test", "run": "r1", **extra}


async def _resume_log(reg: Registry) -> list[Resumption]:
    seen: list[Resumption] = []

    async def resume(tx: Any, r: Resumption) -> None:
        seen.append(r)

    reg.on_resume("test", resume)
    return seen


async def test_completed_resumes_once_with_the_result(store_url: str, clock: Any) -> None:
    """A completed operation resumes its continuation once, with the result; never again."""
    async with Registry(store_url) as reg:
        seen = await _resume_log(reg)
        await reg.register(operation_doc(), module="m", continuation=_cont())
        await reg.apply_status(OP, status_doc(status="completed", result={"n": 42}))
        assert await reg.resume_due() == 1
        assert await reg.resume_due() == 0
        assert [(r.result, r.continuation["run"]) for r in seen] == [({"n": 42}, "r1")]
        op = await reg.get(OP)
        assert op is not None and op.resumed_ms is not None


async def test_a_failure_resumes_with_the_error(store_url: str, clock: Any) -> None:
    """A terminal failure resumes the continuation with its error and no result."""
    async with Registry(store_url) as reg:
        seen = await _resume_log(reg)
        await reg.register(operation_doc(), module="m", continuation=_cont())
        await reg.apply_status(OP, status_doc(status="failed"))
        await reg.resume_due()
        assert [(r.result, r.error and r.error["code"]) for r in seen] == [(None, "failed")]


async def test_pending_does_not_resume(store_url: str, clock: Any) -> None:
    """A live operation never resumes its continuation."""
    async with Registry(store_url) as reg:
        seen = await _resume_log(reg)
        await reg.register(operation_doc(), module="m", continuation=_cont())
        await reg.apply_status(OP, status_doc(status="running"))
        assert await reg.resume_due() == 0 and seen == []


async def test_a_resumer_that_fails_resumes_later(store_url: str, clock: Any) -> None:
    """A resumer's error rolls its transaction back: the continuation is still due, and the
    error (its type only) is logged, not raised into the poller."""
    async with Registry(store_url) as reg:
        calls = []

        async def flaky(tx: Any, r: Resumption) -> None:
            calls.append(r.operation.id)
            if len(calls) == 1:
                raise RuntimeError("boom")

        reg.on_resume("test", flaky)
        await reg.register(operation_doc(), module="m", continuation=_cont())
        await reg.apply_status(OP, status_doc(status="completed"))
        assert await reg.resume_due() == 0
        assert await reg.resume_due() == 1
        assert len(calls) == 2


async def test_a_tampered_continuation_is_refused(store_url: str, clock: Any) -> None:
    """A continuation whose digest no longer matches is refused, not resumed."""
    async with Registry(store_url) as reg:
        seen = await _resume_log(reg)
        await reg.register(operation_doc(), module="m", continuation=_cont())
        await raw_update(reg, OP, continuation=json.dumps(_cont(run="evil")))
        await reg.apply_status(OP, status_doc(status="completed"))
        assert await reg.resume_due() == 0
        op = await reg.get(OP)
        assert seen == [] and op is not None and op.resume_error == "continuation-tampered"


async def test_an_unknown_continuation_version_is_refused_at_registration(
    store_url: str, clock: Any
) -> None:
    """A continuation of another schema version is refused; nothing is registered."""
    async with Registry(store_url) as reg:
        with pytest.raises(ValueError, match="continuation schema"):
            await reg.register(operation_doc(), module="m", continuation=_cont(schema="v0"))
        assert await reg.get(OP) is None


async def test_an_unknown_stored_version_is_refused_at_resume(store_url: str, clock: Any) -> None:
    """A stored continuation of an unknown version (digest intact) is refused at resume."""
    from timebound.deferred._contract import digest

    async with Registry(store_url) as reg:
        seen = await _resume_log(reg)
        await reg.register(operation_doc(), module="m", continuation=_cont())
        future = _cont(schema="timebound.continuation.v9")
        await raw_update(
            reg, OP, continuation=json.dumps(future), continuation_digest=digest(future)
        )
        await reg.apply_status(OP, status_doc(status="completed"))
        assert await reg.resume_due() == 0
        op = await reg.get(OP)
        assert seen == [] and op is not None and op.resume_error == "continuation-version"


async def test_continuations_are_bounded_json(store_url: str, clock: Any) -> None:
    """Over 64 KiB, or not JSON (a Python object), a continuation is refused."""
    async with Registry(store_url) as reg:
        with pytest.raises(ValueError, match="at most"):
            big = _cont(blob="x" * MAX_CONTINUATION_BYTES)
            await reg.register(operation_doc(), module="m", continuation=big)
        with pytest.raises(ValueError, match="plain JSON"):
            await reg.register(operation_doc(), module="m", continuation=_cont(obj=object()))


async def test_privacy_canary(store_url: str, clock: Any, caplog: pytest.LogCaptureFixture) -> None:
    """A secret in a connector's diagnostics and a continuation shows in no operator read."""
    caplog.set_level(logging.DEBUG)
    policy = HostPolicy(max_attempts=3)
    async with Registry(store_url, policy=policy) as reg:
        await _resume_log(reg)
        diag = [{"code": "raw", "severity": "info", "message": CANARY, "ref": CANARY}]
        await reg.register(
            operation_doc(diagnostics=diag), module="m", continuation=_cont(secret=CANARY)
        )
        await reg.apply_status(OP, status_doc(status="running", diagnostics=diag))
        bad = status_doc(status="failed", error={"code": "x", "message": CANARY, "retryable": 1})
        await reg.apply_status(OP, bad)  # a schema rejection must not echo the document
        await reg.apply_status(OP, status_doc(status="completed", diagnostics=diag))
        await reg.resume_due()
        op = await reg.get(OP)
        assert op is not None
        reads = [
            repr(op),
            json.dumps(op.describe()),
            json.dumps(await reg.history(OP)),
            repr(await reg.operations()),
            caplog.text,
        ]
        for text in reads:
            assert CANARY not in text
