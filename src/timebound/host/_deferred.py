"""Deferred operations on the host (docs/deferred.md): the operator list and detail, and the
deferred status surface (``…/status``, ``…/cancel``) of the engine's registry, mounted as is.

The operator views show states, instants and digests only (``Operation.describe``), never a
continuation, a result or a connector's diagnostics (D7).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._core._errors import DeadlineExceeded
from ..deferred import Gone, TransientPollError, status_app
from ..deferred._contract import TERMINAL
from ..telemetry import Event, stored_operation_events
from ._api import decode_cursor, encode_cursor
from ._host import Host
from ._problems import Problem

__all__ = [
    "DEFERRED_STATUSES",
    "cancel_now",
    "deferred_detail",
    "deferred_events",
    "deferred_list",
    "deferred_routes",
    "poll_now",
]

DEFERRED_STATUSES = ("pending", "running", *sorted(TERMINAL))


def _host(request: Request) -> Host:
    host: Host = request.app.state.host
    return host


async def deferred_list(
    host: Host, params: dict[str, str]
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of operations (``status``, ``module`` and ``cursor`` filters) and the cursor of
    the next page."""
    status = params.get("status") or None
    if status is not None and status not in DEFERRED_STATUSES:
        raise Problem(400, f"status: {status!r} is not one of {list(DEFERRED_STATUSES)}")
    after = decode_cursor(params["cursor"]) if params.get("cursor") else None
    size = host.config.page_size
    ops = await host.engine.deferred_registry.operations(
        status=status, module=params.get("module") or None, after=after, limit=size + 1
    )
    page = ops[:size]
    more = len(ops) > size
    return [op.describe() for op in page], (
        encode_cursor(page[-1].created_ms, page[-1].id) if more else None
    )


def _poller(host: Host, op: Any) -> Any:
    """The poller that may act on ``op`` for an operator, or a 409 problem saying why none."""
    if op.terminal:
        raise Problem(409, f"deferred operation {op.id!r} has already ended ({op.status})")
    poller = host.engine.deferred_poller
    if poller is None or op.module not in poller.connectors:
        raise Problem(409, f"this host has no connector for module {op.module!r}")
    return poller


async def _operation(host: Host, op_id: str) -> Any:
    try:
        op = await host.engine.deferred_registry.get(op_id)
    except Gone as exc:
        raise Problem(
            410, f"deferred operation {op_id!r} is no longer retained", code=exc.code
        ) from None
    if op is None:
        raise Problem(404, f"no deferred operation {op_id!r}", code="unknown-operation")
    return op


async def poll_now(host: Host, op_id: str) -> dict[str, Any]:
    """Poll an operation now, within the poller's rate cap and per-module limit (it waits for
    room; the caller's deadline bounds the wait)."""
    poller = _poller(host, await _operation(host, op_id))
    outcome = await poller.poll_now(op_id)
    fresh = await _operation(host, op_id)
    return {"applied": outcome.applied, "code": outcome.code, "operation": fresh.describe()}


async def cancel_now(host: Host, op_id: str) -> dict[str, Any]:
    """Ask the operation's connector to cancel it (D7); 409 when it offers no cancel."""
    op = await _operation(host, op_id)
    poller = _poller(host, op)
    if op.cancel_href is None:
        raise Problem(409, f"not cancelable: {op.cancel_reason or 'no cancel offered'}")
    try:
        described: dict[str, Any] = await poller.cancel(op_id)
    except TransientPollError as exc:
        raise Problem(502, f"the connector of {op.module!r} did not cancel: {exc.code}") from None
    except DeadlineExceeded:
        raise Problem(504, f"the connector of {op.module!r} did not answer in time") from None
    return described


async def deferred_detail(host: Host, op_id: str) -> dict[str, Any]:
    """An operation and its stored history (``GET /v1/deferred/{id}``)."""
    op = await _operation(host, op_id)
    history = await host.engine.deferred_registry.history(op_id)
    return {"operation": op.describe(), "history": history}


async def deferred_events(host: Host, op_id: str) -> tuple[dict[str, Any], list[Event]]:
    """An operation (described) and its stored history as the one event record its listeners
    heard (D10.9), for the operation's page."""
    op = await _operation(host, op_id)
    history = await host.engine.deferred_registry.history(op_id)
    lifetime = {
        "created_ms": op.created_ms,
        "expires_ms": op.expires_ms,
        "expires_set_by": op.expires_set_by,
    }
    return op.describe(), stored_operation_events(op_id, history, lifetime)


async def list_operations(request: Request) -> Response:
    allowed = ["cursor", "module", "status"]
    unknown = sorted(set(request.query_params) - set(allowed))
    if unknown:
        raise Problem(400, f"unknown query parameter(s) {unknown}; allowed: {allowed}")
    ops, cursor = await deferred_list(_host(request), dict(request.query_params))
    return JSONResponse({"operations": ops, "next_cursor": cursor})


async def poll_operation(request: Request) -> Response:
    return JSONResponse(await poll_now(_host(request), request.path_params["op_id"]))


async def get_operation(request: Request) -> Response:
    return JSONResponse(await deferred_detail(_host(request), request.path_params["op_id"]))


class _Surface:
    """The registry's own status app, built on first use (the engine owns the registry)."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            self._app = status_app(scope["app"].state.host.engine.deferred_registry)
        await self._app(scope, receive, send)


class _Cancel:
    """``POST …/cancel``: a live operation whose module has a connector on this host is
    cancelled through it (D7) and answered with its status document; anything else gets the
    status surface's own answer (the status of an ended one, 409 when not cancelable)."""

    def __init__(self, surface: _Surface) -> None:
        self._surface = surface

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        host: Host = scope["app"].state.host
        op_id = scope["path_params"]["op_id"]
        op = await _operation(host, op_id)
        poller = host.engine.deferred_poller
        if op.terminal or poller is None or op.module not in poller.connectors:
            await self._surface(scope, receive, send)
            return
        await cancel_now(host, op_id)
        document = await host.engine.deferred_registry.status_document(op_id)
        await JSONResponse(document)(scope, receive, send)


def deferred_routes() -> list[Route]:
    surface = _Surface()
    return [
        Route("/v1/deferred-operations", list_operations, methods=["GET"]),
        Route("/v1/deferred-operations/{op_id}", get_operation, methods=["GET"]),
        Route("/v1/deferred-operations/{op_id}/poll", poll_operation, methods=["POST"]),
        Route("/v1/deferred-operations/{op_id}/status", surface, methods=["GET"]),
        Route("/v1/deferred-operations/{op_id}/cancel", _Cancel(surface), methods=["POST"]),
    ]
