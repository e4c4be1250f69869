"""Deferred answers of workflow actions: the node suspends, the operation resumes it (P055, D7).

An action that may defer (kind ``deferred``, or an ``http_request`` whose
``execution_mode_support`` is not ``sync-only``) can answer its bounded initial call with a
``deferred-operation.v1`` handle. :class:`Deferrals` then checks the answer against the node's
mode, records the operation in the engine's registry with a continuation, and suspends the
token; the registry resumes the token exactly once when the operation ends. An ``http_request``
handle is polled at its ``status_href`` by an :class:`~timebound.deferred.HttpConnector` for the
request's origin, made here (module ``http_request:<origin>``) unless the engine was given one.

The continuation is versioned JSON bound by the registry's digest (D7.4) and holds what resuming
needs and checks: run, token, node, output binding, deadline, idempotency key and attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from .._core._scopes import move_on_after
from .._store import Detached, Store, Tx
from ..deferred._http import origin_of, same_origin
from ._actions import ActionContext, Outcome, is_deferral, run_http, run_python
from ._bounds import call_key
from ._definition import Action, Definition, Node
from ._machine import Machine
from ._modes import DEFERRABLE_KINDS, node_mode

__all__ = ["RESUME_KIND", "Deferrals", "http_module", "plan_attempt"]

_log = logging.getLogger("timebound.workflow")

#: How the deferred registry hands a workflow's continuations back to it.
RESUME_KIND = "timebound.workflow"
#: How long asking a service to cancel an operation nobody will poll may take (seconds).
CANCEL_TIMEOUT_S = 5.0
#: The version of the workflow's part of a continuation (beside the registry's own schema).
WORKFLOW_CONTINUATION_V = 1
_FIELDS = {
    "run": str,
    "token": str,
    "node": str,
    "attempt": int,
    "output_binding": str,
    "idempotency_key": str,
}


def plan_attempt(
    definition: Definition, node: Node, action: Action, deadline_ms: int | None
) -> tuple[Mapping[str, Any], str]:
    """The implementation an attempt runs with (plus what deferral needs), and its timing.

    ``deadline_ms`` is the node's stored effective deadline: the continuation keeps it exactly
    (a ``Deadline`` read back through the clocks may differ by a millisecond).
    """
    timing = node_mode(action.execution_mode_support, node.timing_mode)
    if action.kind not in DEFERRABLE_KINDS:
        return action.implementation, "sync"
    extra = {
        "response_mode": definition.deferred_response_mode,
        "execution_mode_support": action.execution_mode_support,
        "deferred_profile": action.deferred_profile or {},
        "deadline_ms": deadline_ms,
    }
    return {**action.implementation, **extra}, timing


def http_module(url: str) -> tuple[str, str]:
    """The connector module of an ``http_request`` URL's deferrals, and its origin."""
    origin = origin_of(url)
    return f"http_request:{origin}", origin


def _stored_origin(module: str) -> str | None:
    """The origin of a stored ``http_request:<origin>`` module (as :func:`http_module` made
    it), or ``None`` for any other module."""
    prefix, _, origin = module.partition(":")
    if prefix != "http_request":
        return None
    parts = urlsplit(origin)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or origin != http_module(origin)[1]
    ):
        return None
    return origin


def _binding(node_id: str, in_branch: bool) -> str:
    # Where the result lands (Machine.complete): a branch's output, or the run's state.
    return "branch" if in_branch else f"state.{node_id}"


class Deferrals:
    """The deferred side of one engine: its registry, its poller and their connectors."""

    def __init__(
        self,
        store: Store,
        machine: Machine,
        *,
        policy: Any,
        connectors: Mapping[str, Any],
        now: Callable[[], int],
        wake: Callable[[], None],
    ) -> None:
        self._store = store
        self._machine = machine
        self._policy = policy
        self._given = dict(connectors)
        self._made: dict[str, Any] = {}  # HttpConnectors for http_request origins: ours to close
        self._now = now
        self._wake = wake
        self._registry: Any = None
        self.poller: Any = None
        self._open = False
        self._starting = Detached()  # a poller starting for a definition registered late

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from ..deferred import Registry

            self._registry = Registry(self._store, policy=self._policy)
            self._registry.on_resume(RESUME_KIND, self.resume)
            self._registry.on_refused(self.refused)
        return self._registry

    # Connectors and the poller ----------------------------------------------------------

    def add(self, definition: Definition) -> None:
        """Make a connector for each origin a definition's deferrable http_request calls."""
        if not self._open:
            return  # made when the engine opens (a client is only made to be closed)
        fresh = False
        for action in definition.actions.values():
            if action.kind != "http_request" or action.execution_mode_support == "sync-only":
                continue
            fresh |= self._connect(*http_module(action.implementation["url"]))
        if fresh and self.poller is None:
            # Registered while the engine runs: start polling on the engine's loop.
            self._starting.spawn(self._start_poller())

    def _connect(self, module: str, origin: str) -> bool:
        """Make the HttpConnector of an ``http_request`` origin; whether one was made."""
        if module in self._given or module in self._made:
            return False
        from ..deferred import HttpConnector

        self._made[module] = HttpConnector(origin)
        if self.poller is not None:
            self.poller.connectors[module] = self._made[module]
        return True

    async def open(self, definitions: Iterable[Definition]) -> None:
        self._open = True
        for definition in definitions:
            self.add(definition)
        # Operations that runs of earlier processes (or other workers on the store) suspended
        # on: their origins are polled even when no definition registered here calls them, or
        # their nodes would wait until the operations expire (D7.9).
        for module in await self.registry.live_modules():
            origin = _stored_origin(module)
            if origin is not None:
                self._connect(module, origin)
        await self._start_poller()

    async def _start_poller(self) -> None:
        connectors = {**self._made, **self._given}
        if self.poller is not None or not connectors:
            return
        from ..deferred import Poller

        poller = Poller(self.registry, connectors)
        await poller.__aenter__()
        self.poller = poller

    async def resume_stored(self) -> None:
        """Resume the operations whose end was stored but not yet resumed (a restart between
        the poller's two transactions, or a resumer that failed), before the engine re-arms
        its timers: an end stored in time is never overtaken by a node timer (D7.10)."""
        await self.registry.resume_due(limit=10_000)

    async def close(self) -> None:
        self._open = False
        await self._starting.cancel()
        if self.poller is not None:
            await self.poller.stop()
            self.poller = None
        made, self._made = self._made, {}  # a closed client cannot be reused: made anew on open
        for connector in made.values():
            await connector.aclose()

    # The initial call -------------------------------------------------------------------

    async def call(
        self,
        kind: str,
        implementation: Mapping[str, Any],
        ctx: ActionContext,
        what: str,
        handler: Any,
    ) -> Outcome:
        """Make the bounded initial call; register a deferred answer and suspend on it."""
        if kind == "http_request":
            first = await run_http(implementation, ctx, what=what)
        else:
            first = await run_python(handler, ctx, what=what, on_late=lambda: None)
            if first.kind == "ok":
                if is_deferral(first.value):
                    first = Outcome("accepted", first.value)
                elif implementation["execution_mode_support"] == "async-only":
                    # An async-only action answers with a handle: anything else breaks it.
                    return self._violation(first.value)
        if first.kind != "accepted":
            return first
        return await self._accept(kind, first.value, implementation, ctx)

    @staticmethod
    def _violation(value: Any) -> Outcome:
        from ..deferred import SchemaError, validate_operation

        try:
            validate_operation(value)
        except SchemaError as exc:
            return Outcome("error", error=f"contract-violation: {exc}")
        return Outcome("error", error="contract-violation: not a deferred-operation.v1 answer")

    async def _accept(
        self, kind: str, doc: Any, implementation: Mapping[str, Any], ctx: ActionContext
    ) -> Outcome:
        from ..deferred import CONTINUATION_SCHEMA, SchemaError, validate_operation

        if ctx.timing == "sync":
            support = implementation["execution_mode_support"]
            error = (
                "contract-violation: the connector deferred a call made in sync mode "
                f"(execution_mode_support {support!r})"
            )
            if kind == "http_request":
                error += await self._cancel_unwanted(doc, implementation)
            return Outcome("error", error=error)
        try:
            validate_operation(doc)
        except SchemaError as exc:
            return Outcome("error", error=f"contract-violation: {exc}")
        if implementation["response_mode"] == "reject-as-failure":
            return Outcome("reject", error="deferred-not-accepted")  # nothing is registered
        if kind == "http_request":
            module, origin = http_module(implementation["url"])
            for name in ("status_href", "cancel_href"):
                href = doc.get(name)
                if name == "status_href" and href is None:
                    return Outcome("error", error="contract-violation: no status_href to poll")
                if href is not None and not same_origin(origin, href):
                    return Outcome(
                        "error", error=f"contract-violation: {name} points to another origin"
                    )
        else:
            module = implementation["module"]
        # Stable across a crash re-run (D7.11): the re-sent call's answer finds this key.
        key = ctx.idempotency_key or f"{ctx.run_id}:{ctx.token_id}:{ctx.node_id}"
        deadline_ms = implementation["deadline_ms"]
        continuation = {
            "schema": CONTINUATION_SCHEMA,
            "resume_kind": RESUME_KIND,
            "workflow/v": WORKFLOW_CONTINUATION_V,
            "run": ctx.run_id,
            "token": ctx.token_id,
            "node": ctx.node_id,
            "attempt": ctx.attempt,
            "output_binding": _binding(ctx.node_id, ctx.branch is not None),
            "deadline_ms": deadline_ms,
            "idempotency_key": key,
        }
        profile = implementation["deferred_profile"]
        try:
            op = await self.registry.register(
                doc,
                module=module,
                idempotency_key=key,
                continuation=continuation,
                # The node's and the run's deadlines (D7.7), as stored: never a millisecond over.
                caller_deadline=ctx.deadline if deadline_ms is None else deadline_ms,
                action_max_ttl=profile.get("preferred_max_ttl_seconds"),
                preferred_retry_after=profile.get("preferred_retry_after_seconds"),
            )
        except SchemaError as exc:
            return Outcome("error", error=f"contract-violation: {exc}")
        if op.id != doc["operation/id"] and kind == "http_request":
            # The call ran before (a crash re-run) and its operation is registered under this
            # key, but the service did not honour the key and started another one: nobody
            # would poll that one, so it is asked to cancel (D7.9, D7.11).
            note = await self._cancel_unwanted(doc, implementation)
            _log.warning(
                "%s started a second operation for one call (its Idempotency-Key was not "
                "honoured)%s",
                http_module(implementation["url"])[1],
                note,
            )
        return Outcome("deferred", value=op.id)

    async def _cancel_unwanted(self, doc: Any, implementation: Mapping[str, Any]) -> str:
        """Ask the service to cancel an operation it started for a call made in sync mode:
        nothing will poll it, so left alone it would run on unseen (D7.9). What happened, to
        append to the node's error."""
        from ..deferred import HttpConnector, SchemaError, TransientPollError, validate_operation

        try:
            validate_operation(doc)
        except SchemaError:
            return ""  # not a handle: nothing to cancel
        module, origin = http_module(implementation["url"])
        href = doc.get("cancel_href")
        if href is None or not same_origin(origin, href):
            return "; the operation is left running (no cancel_href on the request's origin)"
        made = self._made.get(module)
        connector = made if made is not None else HttpConnector(origin)
        try:
            # Cleanup after the node's call: a budget of its own, whatever the node has left.
            async with move_on_after(CANCEL_TIMEOUT_S, shield=True) as scope:
                await connector.cancel_at(href)
            if scope.expired:
                return f"; asking it to cancel got no answer within {CANCEL_TIMEOUT_S:g} s"
        except TransientPollError as exc:
            return f"; asking it to cancel failed ({exc.code})"
        finally:
            if made is None:
                await connector.aclose()
        return "; asked it to cancel the operation"

    # Resuming ---------------------------------------------------------------------------

    async def resume(self, tx: Tx, resumption: Any) -> None:
        """The operation ended: complete or fail the token it suspended (in ``tx``, once)."""
        from ..deferred import ContinuationRefused

        cont = resumption.continuation
        if cont.get("workflow/v") != WORKFLOW_CONTINUATION_V:
            raise ContinuationRefused("continuation-version")
        if any(type(cont.get(name)) is not kind for name, kind in _FIELDS.items()):
            raise ContinuationRefused("continuation-mismatch")
        machine = self._machine
        tok = await machine.token(tx, cont["token"])
        if tok is None or tok["status"] != "executing":
            return  # the token moved on (its deadline, a cancel): nothing to resume
        expected = call_key(tok)
        if cont["idempotency_key"] != expected and cont["idempotency_key"].startswith(
            f"{tok['run_id']}:{tok['id']}:{tok['node_id']}"
        ):
            return  # an earlier call of a token retried since: nothing to resume
        op = resumption.operation
        if (
            cont["run"] != tok["run_id"]
            or cont["node"] != tok["node_id"]
            or cont["idempotency_key"] != expected
            or cont["output_binding"] != _binding(tok["node_id"], tok["branch_index"] is not None)
            or tok["child_run_id"] not in (None, op.id)
        ):
            raise ContinuationRefused("continuation-mismatch")
        now = self._now()
        run = await machine.run(tx, tok["run_id"], lock=self._store.lock_clause())
        # The operation's end was stored at op.updated_ms (D7.10): stored before the run's
        # deadline, it counts, even if a restart delays its resumption past that deadline.
        if run is None or run["status"] != "running":
            return
        in_time = run["timeout_at"] is None or min(now, op.updated_ms) < run["timeout_at"]
        if not in_time and await machine.check_run_deadline(tx, run, now):
            return
        if op.status == "completed":
            await machine.complete(tx, run, tok, resumption.result, now)
        else:
            code = (resumption.error or {}).get("code", op.status)
            error = f"deferred-operation: {op.id} ended {op.status} ({code})"
            await machine.action_error(tx, run, tok, error, now)
        self._wake()

    async def refused(self, tx: Tx, op: Any, code: str) -> None:
        """A continuation was refused: fail the token waiting on the operation (found by the
        operation's id on the token, never by the untrusted continuation)."""
        tok = await tx.fetchone(
            "SELECT * FROM tb_wf_tokens WHERE child_run_id = ? AND status = 'executing'", op.id
        )
        if tok is None:
            return
        now = self._now()
        run = await self._machine.run(tx, tok["run_id"], lock=self._store.lock_clause())
        if run is None or await self._machine.check_run_deadline(tx, run, now):
            return
        error = f"deferred-operation: {op.id} continuation refused ({code})"
        await self._machine.action_error(tx, run, tok, error, now)
        self._wake()
