"""Execution modes and http_request deferrals (D7) against a real uvicorn service.

The service is a :class:`Service` behind ``status_app`` on loopback; the workflow's
``http_request`` action posts straight to its start route, so a ``202`` + ``deferred-operation.v1``
answer comes back over the wire. The engine runs on both stores (SQLite and PostgreSQL).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.propagation.http.conftest import ServerThread
from timebound import workflow as wf
from timebound.deferred import HostPolicy, Registry, Service, status_app
from timebound.deferred._contract import digest, format_time
from timebound.deferred._registry import now_ms

SECRET = "canary-modes-5d1e"


class Recording:
    """The service, recording each request's path and ``Prefer`` header. ``/busy/<status>``
    answers 429 or 503 with ``Retry-After`` and a body that looks like a deferral."""

    def __init__(self, tmp_path: Path) -> None:
        self.registry = Registry(f"sqlite:///{tmp_path}/service.db")
        self.service = Service(self.registry)
        self.release = threading.Event()
        self.calls: list[tuple[str, str | None]] = []

        @self.service.operation("report.render", retry_after=1, ttl=600)
        async def render(payload: Any) -> Any:
            while not self.release.is_set():
                await asyncio.sleep(0.01)
            return {"pages": payload["input"]["pages"], "secret": SECRET}

        self.inner = status_app(self.registry, self.service)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.calls.append((scope["path"], headers.get("prefer")))
        if scope["path"].startswith("/busy/"):
            status = int(scope["path"].rsplit("/", 1)[1])
            now = now_ms()
            body = json.dumps({
                "schema": "deferred-operation.v1", "schema/v": 1, "status": "deferred",
                "operation/id": "deferred:report.render:busy", "operation/kind": "report.render",
                "retry_after_seconds": 1, "created_at": format_time(now),
                "expires_at": format_time(now + 60_000), "status_href": "/x",
                "cancel/unavailable-reason": "no",
            }).encode()  # fmt: skip
            head = [(b"content-type", b"application/json"), (b"retry-after", b"1")]
            await send({"type": "http.response.start", "status": status, "headers": head})
            await send({"type": "http.response.body", "body": body})
            return
        await self.inner(scope, receive, send)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Recording, str]]:
    s = Recording(tmp_path)
    asyncio.run(s.registry.open())  # SQLite: the store is not bound to a loop
    with ServerThread(s) as srv:
        yield s, srv.url
    s.release.set()
    asyncio.run(s.registry.close())


def _definition(
    url: str,
    *,
    support: str | None = "either",
    timing: str | None = None,
    node: dict[str, Any] | None = None,
    **action: Any,
) -> dict[str, Any]:
    act: dict[str, Any] = {
        "id": "render",
        "kind": "http_request",
        "implementation": {"method": "POST", "url": url},
        **action,
    }
    if support is not None:
        act["execution_mode_support"] = support
    n: dict[str, Any] = {"id": "A", "action_id": "render", "timeout_ms": 60_000, **(node or {})}
    if timing is not None:
        n["timing"] = {"mode": timing}
    return {"id": "report", "initial_node": "A", "actions": [act], "nodes": [n]}


def _engine(store_url: str, definition: dict[str, Any], **kw: Any) -> wf.Engine:
    engine = wf.Engine(db=store_url, deferred_policy=kw.pop("policy", HostPolicy(jitter=False)))
    engine.register(definition)
    return engine


async def _wait_for_operation(engine: wf.Engine, skip: tuple[str, ...] = ()) -> Any:
    for _ in range(2000):
        ops = [op for op in await engine.deferred_registry.operations() if op.id not in skip]
        if ops:
            return ops[0]
        await asyncio.sleep(0.01)
    raise AssertionError("no operation was registered")


async def _continuation(engine: wf.Engine, op_id: str) -> tuple[dict[str, Any], str]:
    async with engine.deferred_registry.store.transaction() as tx:
        row = await tx.fetchone(
            "SELECT continuation, continuation_digest FROM tb_deferred_ops WHERE id = ?", op_id
        )
    return json.loads(row["continuation"]), row["continuation_digest"]


# Definitions: a mode the action does not allow never reaches the connector -----------------


@pytest.mark.parametrize(
    ("definition", "path"),
    [
        (_definition("http://127.0.0.1:9/x", support=None, timing="async"), "nodes[0].timing.mode"),
        (_definition("http://127.0.0.1:9/x", support="sync-only", timing="async"),
         "nodes[0].timing.mode"),
        (_definition("http://127.0.0.1:9/x", support="async-only", timing="sync"),
         "nodes[0].timing.mode"),
        (_definition("http://127.0.0.1:9/x", timing="later"), "nodes[0].timing.mode"),
        (_definition("http://127.0.0.1:9/x", support="sometimes"),
         "actions[0].execution_mode_support"),
        (_definition("http://127.0.0.1:9/x", deferred_profile={"preferred_max_ttl_seconds": 0}),
         "actions[0].deferred_profile.preferred_max_ttl_seconds"),
        (_definition("http://127.0.0.1:9/x", deferred_profile={"poll_every": 1}),
         "actions[0].deferred_profile"),
    ],
)  # fmt: skip
def test_a_mode_the_action_does_not_allow_is_a_definition_error(
    definition: dict[str, Any], path: str
) -> None:
    """The error names the offending field's path; nothing runs, so nothing is called."""
    with pytest.raises(wf.DefinitionError) as err:
        wf.Engine(db="sqlite:///unused.db").register(definition)
    assert err.value.path == path


def test_only_kinds_that_can_defer_take_another_mode() -> None:
    """python and workflow_call are sync-only; a deferred action is never sync-only."""
    python = {
        "id": "p", "initial_node": "A",
        "actions": [{"id": "a", "kind": "python", "implementation": {"handler": "h"},
                     "execution_mode_support": "either"}],
        "nodes": [{"id": "A", "action_id": "a"}],
    }  # fmt: skip
    with pytest.raises(wf.DefinitionError, match="cannot defer") as err:
        wf.parse_definition(python)
    assert err.value.path == "actions[0].execution_mode_support"
    deferred = {
        "id": "d", "initial_node": "A",
        "actions": [{"id": "a", "kind": "deferred", "execution_mode_support": "sync-only",
                     "implementation": {"handler": "h", "module": "m"}}],
        "nodes": [{"id": "A", "action_id": "a"}],
    }  # fmt: skip
    with pytest.raises(wf.DefinitionError, match="async-only") as err:
        wf.parse_definition(deferred)
    assert err.value.path == "actions[0].execution_mode_support"
    # A deferred action is async-only by default: a sync node is refused.
    deferred["actions"][0].pop("execution_mode_support")
    deferred["nodes"][0]["timing"] = {"mode": "sync"}
    with pytest.raises(wf.DefinitionError, match="'async-only'") as err:
        wf.parse_definition(deferred)
    assert err.value.path == "nodes[0].timing.mode"


# http_request answered 202 + deferred-operation.v1 ------------------------------------------


@pytest.mark.asyncio_real
async def test_an_http_deferral_suspends_and_resumes_once(
    served: tuple[Recording, str], store_url: str
) -> None:
    """Prefer: respond-async goes out; the 202 handle is polled at its status_href through an
    HttpConnector for the origin; the node's output is the result, resumed exactly once."""
    s, url = served
    engine = _engine(store_url, _definition(f"{url}/v1/operations/report.render"))
    async with engine:
        run_id = await engine.start("report", {"pages": 3})
        op = await _wait_for_operation(engine)
        s.release.set()
        result = await engine.wait(run_id, timeout=30)
        op = await engine.deferred_registry.get(op.id)
        history = await engine.deferred_registry.history(op.id)
        events = await engine.events(run_id)
    assert result == wf.RunResult("completed", {"A": {"pages": 3, "secret": SECRET}}, None)
    assert s.calls[0] == ("/v1/operations/report.render", "respond-async")
    assert {path for path, _ in s.calls[1:]} == {f"/v1/deferred-operations/{op.id}/status"}
    assert op.module == f"http_request:{url}" and op.status == "completed"
    assert [h["code"] for h in history].count("resumed") == 1
    assert len([e for e in events if e["kind"] == "token_completed"]) == 1


@pytest.mark.parametrize(
    ("module", "origin"),
    [
        ("http_request:http://127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("http_request:https://svc.example", "https://svc.example"),
        ("http_request:http://127.0.0.1:8080/v1/operations", None),  # not an origin
        ("http_request:file:///etc/passwd", None),
        ("http_request:", None),
        ("reports", None),
        ("reports:http://127.0.0.1:8080", None),
    ],
)
def test_only_a_stored_http_origin_makes_a_connector(module: str, origin: str | None) -> None:
    """A connector is made from a stored module only when it is exactly what the engine
    writes for an http_request origin."""
    from timebound.workflow._deferral import _stored_origin

    assert _stored_origin(module) == origin


@pytest.mark.asyncio_real
async def test_after_a_restart_the_origin_is_polled_without_its_definition(
    served: tuple[Recording, str], store_url: str
) -> None:
    """A run suspended on an http_request deferral outlives its engine; a new engine on the
    store that registers no definition calling that origin still polls the operation (its
    connector is made from the stored module) and resumes the run once. Before, nothing
    polled it and the node waited until the operation expired."""
    s, url = served
    first = _engine(store_url, _definition(f"{url}/v1/operations/report.render"))
    async with first:
        run_id = await first.start("report", {"pages": 2})
        op = await _wait_for_operation(first)
    s.release.set()
    second = wf.Engine(db=store_url, deferred_policy=HostPolicy(jitter=False))
    async with second:
        result = await second.wait(run_id, timeout=30)
        history = await second.deferred_registry.history(op.id)
    assert result == wf.RunResult("completed", {"A": {"pages": 2, "secret": SECRET}}, None)
    assert [h["code"] for h in history].count("resumed") == 1


@pytest.mark.asyncio_real
@pytest.mark.parametrize(("support", "timing"), [("sync-only", None), ("either", "sync")])
async def test_a_deferral_of_a_sync_call_is_a_contract_violation(
    served: tuple[Recording, str], store_url: str, support: str, timing: str | None
) -> None:
    """A call made in sync mode sends no Prefer; a 202 handle fails the node and registers
    nothing, and the service is asked to cancel the operation nobody will poll."""
    s, url = served
    definition = _definition(f"{url}/v1/operations/report.render", support=support, timing=timing)
    engine = _engine(store_url, definition)
    async with engine:
        run_id = await engine.start("report", {"pages": 1})
        result = await engine.wait(run_id, timeout=30)
        ops = await engine.deferred_registry.operations()
    assert result.status == "failed"
    assert "contract-violation" in (result.error or "") and "sync mode" in (result.error or "")
    assert "asked it to cancel the operation" in (result.error or "")
    (started,) = await s.registry.operations()
    assert s.calls == [
        ("/v1/operations/report.render", None),
        (f"/v1/deferred-operations/{started.id}/cancel", None),
    ]
    assert started.status == "cancelled"
    assert ops == []


@pytest.mark.asyncio_real
@pytest.mark.parametrize("status", [429, 503])
async def test_overload_is_an_action_error_and_the_retry_rules_apply(
    served: tuple[Recording, str], store_url: str, status: int
) -> None:
    """429/503 with Retry-After (and a deferral-shaped body) is an error, never a deferral."""
    s, url = served
    definition = _definition(
        f"{url}/busy/{status}", node={"retry": {"max_attempts": 2, "delay_ms": 10}}
    )
    engine = _engine(store_url, definition)
    async with engine:
        run_id = await engine.start("report", {"pages": 1})
        result = await engine.wait(run_id, timeout=30)
        ops = await engine.deferred_registry.operations()
    assert result.status == "failed" and f"HTTP {status}" in (result.error or "")
    assert s.calls == [(f"/busy/{status}", "respond-async")] * 2  # the node retried once
    assert ops == []


@pytest.mark.asyncio_real
async def test_reject_as_failure_applies_to_http_deferrals(
    served: tuple[Recording, str], store_url: str
) -> None:
    """deferred_response_mode reject-as-failure: the run fails, nothing is registered."""
    _, url = served
    definition = {
        **_definition(f"{url}/v1/operations/report.render"),
        "deferred_response_mode": "reject-as-failure",
    }
    engine = _engine(store_url, definition)
    async with engine:
        run_id = await engine.start("report", {"pages": 1})
        result = await engine.wait(run_id, timeout=30)
        ops = await engine.deferred_registry.operations()
    assert result == wf.RunResult("failed", None, "deferred-not-accepted")
    assert ops == []


# Lifetimes: the node's and the run's deadlines, and the action's profile (D1.5, D7.7) --------


@pytest.mark.parametrize(
    ("run_ms", "node_ms", "profile", "policy", "expected_ms"),
    [
        (4_000, 8_000, {}, HostPolicy(jitter=False), 4_000),  # the run's deadline
        (10_000, 3_000, {}, HostPolicy(jitter=False), 3_000),  # the node's deadline
        (60_000, 60_000, {"preferred_max_ttl_seconds": 20}, HostPolicy(jitter=False), 20_000),
        # The profile never extends a lifetime: the host's max_ttl_s still clamps it.
        (600_000, 600_000, {"preferred_max_ttl_seconds": 5_000},
         HostPolicy(jitter=False, max_ttl=30), 30_000),
    ],
)  # fmt: skip
def test_the_lifetime_is_bounded_by_deadlines_and_profile(
    served: tuple[Recording, str],
    store_url: str,
    virtual_clock: Any,
    run_ms: int,
    node_ms: int,
    profile: dict[str, int],
    policy: HostPolicy,
    expected_ms: int,
) -> None:
    """On virtual time: expires_at is exactly the earliest bound present, from registration."""
    _, url = served
    virtual_clock.autojump_threshold = 0.25  # real I/O (the server, PostgreSQL) in between
    definition = {
        **_definition(
            f"{url}/v1/operations/report.render",
            node={"timeout_ms": node_ms},
            deferred_profile=profile,
        ),
        "timeout_ms": run_ms,
    }

    async def main() -> tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any]]:
        engine = _engine(store_url, definition, policy=policy)
        async with engine:
            run_id = await engine.start("report", {"pages": 1})
            op = await _wait_for_operation(engine)
            cont, _ = await _continuation(engine, op.id)
            run = await engine.get_run(run_id)
            (tok,) = await engine.tokens(run_id)
            await engine.cancel(run_id)
        return op, run, tok, cont

    op, run, tok, cont = virtual_clock.run(main())
    bounds = [b for b in (run["timeout_at"], tok["timeout_at"]) if b is not None]
    assert op.expires_ms - op.created_ms == min(expected_ms, min(bounds) - op.created_ms)
    assert cont["deadline_ms"] == min(bounds)  # the continuation holds the node's deadline
    if expected_ms in (run_ms, node_ms):
        assert op.expires_ms == min(bounds)  # exactly the deadline, not a rounded neighbour


def test_the_profiles_retry_after_only_lengthens_the_first_interval(
    served: tuple[Recording, str], store_url: str, virtual_clock: Any
) -> None:
    """The service hints 1 s; the profile prefers 7 s (clamped to the host's 5 s maximum)."""
    _, url = served
    virtual_clock.autojump_threshold = 0.25
    profile = {"preferred_retry_after_seconds": 7}
    definition = _definition(f"{url}/v1/operations/report.render", deferred_profile=profile)

    async def main(policy: HostPolicy, skip: tuple[str, ...]) -> Any:
        engine = _engine(store_url, definition, policy=policy)
        async with engine:
            run_id = await engine.start("report", {"pages": 1})
            op = await _wait_for_operation(engine, skip)
            await engine.cancel(run_id)
        return op

    first = virtual_clock.run(main(HostPolicy(jitter=False), ()))
    assert first.retry_after_s == 7 and first.next_poll_ms - first.created_ms == 7_000
    second = virtual_clock.run(main(HostPolicy(jitter=False, max_retry_after=5), (first.id,)))
    assert second.retry_after_s == 5 and second.next_poll_ms - second.created_ms == 5_000


# The continuation ---------------------------------------------------------------------------


@pytest.mark.asyncio_real
async def test_the_continuation_holds_what_resuming_checks(
    served: tuple[Recording, str], store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Run, token, node, binding, deadline, idempotency key and attempt; none of it (nor the
    result) shows in an operator read."""
    caplog.set_level(logging.DEBUG)
    s, url = served
    engine = _engine(store_url, _definition(f"{url}/v1/operations/report.render"))
    async with engine:
        run_id = await engine.start("report", {"pages": 2})
        op = await _wait_for_operation(engine)
        cont, cont_digest = await _continuation(engine, op.id)
        (tok,) = await engine.tokens(run_id)
        s.release.set()
        result = await engine.wait(run_id, timeout=30)
        reg = engine.deferred_registry
        done = await reg.get(op.id)
        reads = [
            repr(done),
            json.dumps(done.describe()),
            json.dumps(await reg.history(op.id)),
            repr(await reg.operations()),
            caplog.text,
        ]
    assert result.status == "completed"
    key = f"{run_id}:{tok['id']}:A"  # run, token and node: stable across a crash re-run
    assert cont == {
        "schema": "timebound.continuation.v1",
        "resume_kind": "timebound.workflow",
        "workflow/v": 1,
        "run": run_id,
        "token": tok["id"],
        "node": "A",
        "attempt": 1,
        "output_binding": "state.A",
        "deadline_ms": tok["timeout_at"],
        "idempotency_key": key,
    }
    assert cont_digest == digest(cont)
    # On real time too, the lifetime ends by the node's stored deadline, never a ms after it.
    assert tok["timeout_at"] - 1 <= done.expires_ms <= tok["timeout_at"]
    for text in reads:
        for private in (SECRET, key, "output_binding", "idempotency_key", "deadline_ms"):
            assert private not in text


@pytest.mark.asyncio_real
@pytest.mark.parametrize("change", ["tamper", "version", "mismatch"])
async def test_a_refused_continuation_fails_the_node_and_never_resumes(
    served: tuple[Recording, str], store_url: str, change: str
) -> None:
    """A digest mismatch, an unknown workflow version or a continuation naming another node is
    refused with its code; the token fails with it, the result never becomes the output."""
    s, url = served
    engine = _engine(store_url, _definition(f"{url}/v1/operations/report.render"))
    async with engine:
        run_id = await engine.start("report", {"pages": 2})
        op = await _wait_for_operation(engine)
        cont, _ = await _continuation(engine, op.id)
        if change == "tamper":  # edited behind the registry's back: the digest no longer fits
            cont, new_digest = {**cont, "node": "B"}, None
        elif change == "version":
            cont = {**cont, "workflow/v": 2}
            new_digest = digest(cont)
        else:
            cont = {**cont, "node": "B"}
            new_digest = digest(cont)
        async with engine.deferred_registry.store.transaction() as tx:
            await tx.execute(
                "UPDATE tb_deferred_ops SET continuation = ?, continuation_digest = "
                "COALESCE(?, continuation_digest) WHERE id = ?",
                json.dumps(cont),
                new_digest,
                op.id,
            )
        s.release.set()
        result = await engine.wait(run_id, timeout=30)
        done = await engine.deferred_registry.get(op.id)
    code = {"tamper": "continuation-tampered", "version": "continuation-version"}.get(
        change, "continuation-mismatch"
    )
    assert done.status == "completed" and done.resume_error == code and done.resumed_ms is None
    assert result.status == "failed" and f"continuation refused ({code})" in (result.error or "")
    assert result.output is None


@pytest.mark.asyncio_real
@pytest.mark.parametrize(("timing", "expected"), [(None, "async"), ("sync", "sync")])
async def test_a_deferred_action_that_may_answer_either_way(
    store_url: str, timing: str | None, expected: str
) -> None:
    """execution_mode_support 'either': the handler sees the node's timing in ctx.timing, and
    a plain answer is the node's output (an async-only action's would be a contract violation)."""

    def quick(ctx: Any) -> Any:
        return {"timing": ctx.timing}

    node: dict[str, Any] = {"id": "A", "action_id": "a"}
    if timing is not None:
        node["timing"] = {"mode": timing}
    engine = wf.Engine(db=store_url, actions={"quick": quick})
    engine.register({
        "id": "either", "initial_node": "A",
        "actions": [{"id": "a", "kind": "deferred", "execution_mode_support": "either",
                     "implementation": {"handler": "quick", "module": "m"}}],
        "nodes": [node],
    })  # fmt: skip
    async with engine:
        result = await engine.wait(await engine.start("either", {}), timeout=30)
    assert result == wf.RunResult("completed", {"A": {"timing": expected}}, None)
