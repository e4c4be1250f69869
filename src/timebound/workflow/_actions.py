"""Running one attempt of an action: python handlers and HTTP requests, inside the node's bound.

An attempt ends in one :class:`Outcome`: ``ok`` with a JSON value, ``error``, or ``timeout``
(the node's effective deadline was reached, whoever noticed it first: see :func:`_timed_out`).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .._core import _clock
from .._core._body import DEFAULT_MAX_BYTES, TooLarge, read_capped
from .._core._breakdown import BREAKDOWN_MAX_NODES, summarised
from .._core._classify import classify
from .._core._deadline import Deadline
from .._core._durations import ceil_ms
from .._core._errors import ConfigurationError, DeadlineExceeded
from .._core._scopes import fail_at, frame_breakdown
from .._json import JSONError, TooDeep
from .._json import check as check_json
from .._json import loads as loads_json
from ._rows import decode

__all__ = ["ActionContext", "Outcome", "handlers", "is_deferral", "run_http", "run_python"]

#: The schema a connector's deferred answer names (docs/deferred.md); its payload, not the HTTP
#: status, makes an answer a deferral.
DEFERRED_SCHEMA = "deferred-operation.v1"


@dataclass(frozen=True)
class ActionContext:
    """What a python handler receives (the data model of docs/workflows.md)."""

    input: Any
    state: Mapping[str, Any]
    branch: Mapping[str, Any] | None
    run_id: str
    token_id: str
    node_id: str
    attempt: int
    deadline: Deadline
    #: ``async`` when the call may answer with a deferred-operation handle (the node's mode).
    timing: str = "sync"
    #: The same for every run of this call, also re-run after a crash; a new one only for a
    #: deliberate retry (D7.11). ``http_request`` sends it as ``Idempotency-Key``; a
    #: ``deferred`` handler passes it to the service it calls.
    idempotency_key: str | None = None
    #: The W3C ``traceparent`` of the run's span when spans are exported, else None (D10.5).
    traceparent: str | None = None
    #: The node's reserve in seconds (D6.32): the handler runs seeing ``deadline`` less it, while
    #: the attempt is cut only at ``deadline``; ``None``: no reserve.
    reserve: float | None = None


@dataclass(frozen=True)
class Outcome:
    #: ``accepted``: the connector answered with a deferred-operation handle (``value``), not
    #: yet checked or registered; ``deferred``: registered, the token suspends on it.
    kind: Literal["ok", "error", "timeout", "accepted", "deferred", "reject"]
    value: Any = None
    error: str | None = None
    #: A ``timeout`` that a called service reported: our whole remaining budget, sent with the
    #: request, is spent (D4.5); its length in ms. The node times out with that bound (D6.17).
    propagated_ms: int | None = None
    #: A ``timeout``'s breakdown (D13): where the attempt's budget went, stored with its event.
    breakdown: dict[str, Any] | None = None


#: Where a cancelled attempt's breakdown travels on its CancelledError (see run_python).
CUT_BREAKDOWN = "_timebound_breakdown"


def _breakdown_of(exc: BaseException) -> dict[str, Any] | None:
    bd = getattr(exc, "breakdown", None) if isinstance(exc, DeadlineExceeded) else None
    return None if bd is None else summarised(bd, BREAKDOWN_MAX_NODES).to_dict()


def is_deferral(value: Any) -> bool:
    """Whether an answer claims to be a deferred-operation handle (then it is checked as one)."""
    return isinstance(value, dict) and value.get("schema") == DEFERRED_SCHEMA


def freeze(value: Any) -> Any:
    """A read-only view of a JSON value (the handler's ``state`` snapshot).

    Bounded (D6.20): the engine calls it on stored values in its shared turn, where a
    ``RecursionError`` would have failed every run's work, not one run's. Values within the
    nesting limit (all that the engine accepts) are frozen recursively, which is fastest; past
    :data:`_RECURSE` levels the rest is frozen without recursion.
    """
    return _freeze(value, 0)


#: How deep freeze recurses before it goes on iteratively (two frames a level, far below the
#: interpreter's 1,000).
_RECURSE = 100


def _freeze(value: Any, depth: int) -> Any:
    if isinstance(value, dict):
        if depth >= _RECURSE:
            return _freeze_iteratively(value)
        return MappingProxyType({k: _freeze(v, depth + 1) for k, v in value.items()})
    if isinstance(value, list):
        if depth >= _RECURSE:
            return _freeze_iteratively(value)
        return tuple([_freeze(v, depth + 1) for v in value])
    return value


def _freeze_iteratively(value: Any) -> Any:
    out: list[Any] = [None]
    # Entries: (value, container, slot), or (_SEAL, items, (container, slot)) to make the tuple of
    # an array once its children are in (pushed first, so it runs after every descendant).
    stack: list[tuple[Any, Any, Any]] = [(value, out, 0)]
    while stack:
        item, into, slot = stack.pop()
        if item is _SEAL:
            parent, at = slot
            parent[at] = tuple(into)
        elif isinstance(item, dict):
            mapping = dict(item)  # the keys in order; a container is replaced below
            into[slot] = MappingProxyType(mapping)  # a live view
            for key, child in mapping.items():
                if isinstance(child, (dict, list)):
                    stack.append((child, mapping, key))
        elif isinstance(item, list):
            items = list(item)
            stack.append((_SEAL, items, (into, slot)))
            for index, child in enumerate(items):
                if isinstance(child, (dict, list)):
                    stack.append((child, items, index))
        else:
            into[slot] = item
    return out[0]


def thaw(value: Any) -> Any:
    """Plain JSON data again from a :func:`freeze` view (iterative, like :func:`freeze`)."""
    if not isinstance(value, (Mapping, list, tuple)):
        return value
    out: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(value, out, 0)]
    while stack:
        item, into, slot = stack.pop()
        if isinstance(item, Mapping):
            mapping: dict[Any, Any] = {}
            into[slot] = mapping
            for key, child in item.items():
                mapping[key] = child
                if isinstance(child, (Mapping, list, tuple)):
                    stack.append((child, mapping, key))
        else:
            items = list(item)
            into[slot] = items
            for index, child in enumerate(items):
                if isinstance(child, (Mapping, list, tuple)):
                    stack.append((child, items, index))
    return out[0]


_SEAL = object()


def _json_value(value: Any, what: str) -> Outcome:
    """The attempt's output if it is JSON within the limits (D6.20), else an error naming why."""
    try:
        check_json(
            value, what=f"the output of {what}", arrays=(list, tuple), objects=(dict, Mapping)
        )
        return Outcome("ok", decode(_OUTPUT.encode(value)))
    except TooDeep as exc:
        return Outcome("error", error=f"{exc.code}: {exc} (at {exc.path})")
    except (TypeError, ValueError) as exc:  # JSONError included
        return Outcome("error", error=f"{what} returned a value that is not JSON: {exc}")


def _thawed(obj: Any) -> Any:
    """A part of ``ctx.state`` returned as it is (a :func:`freeze` view) is JSON: thawed."""
    if isinstance(obj, MappingProxyType):
        return dict(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


#: What ``json.dumps(value, allow_nan=False, default=_thawed)`` makes for each call, made once.
_OUTPUT = json.JSONEncoder(allow_nan=False, default=_thawed)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _timed_out(exc: BaseException, deadline: Deadline) -> bool:
    """Whether the node's own bound ended the attempt (then its timeout policy applies).

    The one classification decides whose bound the error reports (D2.5, D4.5). A bound inside
    the action (a handler's own scope, an HTTP attempt's static timeout) is the action failing.
    The node's bound, a bound around it, or a downstream reporting the budget we gave it spent
    (D4.5) is the node's timeout only once the node's effective deadline (D6.11) has passed:
    a downstream whose clock ran ahead answers "expired" while the node still has time, and
    that is an error of the action, never an early node timeout (D1.3).
    """
    if not isinstance(exc, DeadlineExceeded):
        return False
    if classify(exc, own={"node"}) == "own" and exc.source != "node":
        return False
    return deadline.expired


async def run_python(
    handler: Callable[[ActionContext], Any],
    ctx: ActionContext,
    *,
    what: str,
    on_late: Callable[[], None],
) -> Outcome:
    """Call ``handler(ctx)`` inside ``fail_at(ctx.deadline, source="node")``, keeping the node's
    reserve (D6.32): the handler sees the deadline less it and may still answer after it fires.

    Async handlers are cancelled at the deadline. A sync handler runs in a worker thread, so the
    loop is never blocked; it cannot be interrupted, so when the engine gives up on it, its result
    is reported to ``on_late`` (discarded and counted, D6.10).
    """
    try:
        if inspect.iscoroutinefunction(handler):
            scope = fail_at(ctx.deadline, source="node", what=what, reserve=ctx.reserve)
            try:
                async with scope:
                    value = await handler(ctx)
            except asyncio.CancelledError as exc:
                if scope.expired:
                    # D13: the engine stopped the attempt at the node's deadline (its timer
                    # came first): the cancellation carries where the attempt's budget went.
                    exc.__dict__[CUT_BREAKDOWN] = frame_breakdown(scope, _clock.now())
                raise
        else:
            value = await _in_thread(handler, ctx, what=what, on_late=on_late)
    except Exception as exc:
        if _timed_out(exc, ctx.deadline):
            return Outcome("timeout", error=str(exc), breakdown=_breakdown_of(exc))
        return Outcome("error", error=_describe(exc))
    return _json_value(value, what)


async def _in_thread(
    handler: Callable[[ActionContext], Any],
    ctx: ActionContext,
    *,
    what: str,
    on_late: Callable[[], None],
) -> Any:
    def call() -> Any:
        with fail_at(ctx.deadline, source="node", what=what, reserve=ctx.reserve):
            return handler(ctx)

    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, contextvars.copy_context().run, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        # The engine gave up on this attempt; the thread runs on. Count what it returns.
        future.add_done_callback(lambda f: _report_late(f, on_late))
        raise


def _report_late(future: asyncio.Future[Any], on_late: Callable[[], None]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so asyncio does not log it: the result is discarded
        on_late()


async def run_http(implementation: Mapping[str, Any], ctx: ActionContext, *, what: str) -> Outcome:
    """Send the request through timebound's httpx transport, carrying the node's budget.

    The JSON body is ``{"input", "state", "branch"}``; a JSON response body is the output (text
    otherwise). An answer carrying the remote expiry marker reaches us as the transport's
    ``DeadlineExceeded`` and is judged like any other (:func:`_timed_out`); every other 4xx/5xx
    answer, a bare 498 included, is an action error: a 429 or 503 is overload, never a
    deferral. In ``async`` timing the request sends ``Prefer: respond-async``; a 2xx answer whose
    JSON body is a ``deferred-operation.v1`` handle is ``accepted`` (the caller registers it).
    """
    import httpx

    from ..propagation.httpx import AsyncDeadlineTransport

    body = thaw({"input": ctx.input, "state": ctx.state, "branch": ctx.branch})
    headers = dict(implementation.get("headers", {}))
    if ctx.idempotency_key is not None and not any(k.lower() == "idempotency-key" for k in headers):
        headers["Idempotency-Key"] = ctx.idempotency_key  # a crash re-run is recognised (D7.11)
    if ctx.timing == "async":
        prefer = next((k for k in headers if k.lower() == "prefer"), None)
        if prefer is None:
            headers["Prefer"] = "respond-async"
        elif "respond-async" not in headers[prefer]:
            headers[prefer] += ", respond-async"
    try:
        async with (
            fail_at(ctx.deadline, source="node", what=what),
            # No httpx timeout of its own: the node's deadline is the bound (and the header).
            httpx.AsyncClient(transport=AsyncDeadlineTransport(what=what), timeout=None) as client,
        ):
            # Streamed with a cap (D6.21): a downstream answering gigabytes costs the cap.
            limit = int(implementation.get("max_response_bytes", DEFAULT_MAX_BYTES))
            async with client.stream(
                implementation["method"],
                implementation["url"],
                json=body,
                headers=headers,
            ) as response:
                data = await read_capped(
                    response.aiter_bytes(), limit, what=f"the answer to {what}"
                )
    except TooLarge as exc:
        return Outcome("error", error=f"{exc.code}: {exc}")
    except (DeadlineExceeded, httpx.HTTPError) as exc:
        # An attempt timeout is both: the classification, not the except clause, decides.
        if _timed_out(exc, ctx.deadline):
            return Outcome("timeout", error=str(exc), breakdown=_breakdown_of(exc))
        if isinstance(exc, DeadlineExceeded) and exc.source == "propagated":
            # The request carried the node's whole remaining budget and the service says it
            # is spent (an expired answer, D4.5): the chain is out of time, so the node times
            # out with that bound, never retried (D6.17), even if our clock still shows time.
            sent = None if exc.timeout is None else ceil_ms(exc.timeout)
            return Outcome(
                "timeout", error=str(exc), propagated_ms=sent, breakdown=_breakdown_of(exc)
            )
        return Outcome("error", error=_describe(exc))
    if response.status_code >= 400:
        return Outcome("error", error=f"{what}: HTTP {response.status_code}")
    try:
        value = loads_json(data, what=f"the answer to {what}")
    except TooDeep as exc:
        return Outcome("error", error=f"{exc.code}: {exc} (at {exc.path})")
    except JSONError:
        return Outcome("ok", data.decode("utf-8", "replace"))
    return Outcome("accepted" if is_deferral(value) else "ok", value)


def handlers(
    actions: Mapping[str, Callable[..., Any]] | types.ModuleType | None,
) -> dict[str, Any]:
    """The python handlers an engine is given, by name: a mapping, or a module's public
    callables (not its classes); ``ConfigurationError`` for anything else."""
    if actions is None:
        return {}
    if isinstance(actions, types.ModuleType):
        return {
            name: obj
            for name, obj in vars(actions).items()
            if callable(obj) and not name.startswith("_") and not isinstance(obj, type)
        }
    if isinstance(actions, Mapping):
        bad = [name for name, fn in actions.items() if not callable(fn)]
        if bad:
            raise ConfigurationError(f"actions[{bad[0]!r}] is not callable", option="actions")
        return dict(actions)
    raise ConfigurationError(
        f"actions is a mapping of handler names to callables or a module, not "
        f"{type(actions).__name__}",
        option="actions",
    )
