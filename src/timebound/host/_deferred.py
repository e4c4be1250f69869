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

from ..deferred import status_app
from ..deferred._contract import TERMINAL
from ._host import Host
from ._problems import Problem

__all__ = ["DEFERRED_STATUSES", "deferred_detail", "deferred_list", "deferred_routes"]

DEFERRED_STATUSES = ("pending", "running", *sorted(TERMINAL))


def _host(request: Request) -> Host:
    host: Host = request.app.state.host
    return host


async def deferred_list(host: Host, status: str | None) -> list[dict[str, Any]]:
    if status is not None and status not in DEFERRED_STATUSES:
        raise Problem(400, f"status: {status!r} is not one of {list(DEFERRED_STATUSES)}")
    registry = host.engine.deferred_registry
    ops = await registry.operations(status=status, limit=host.config.page_size)
    return [op.describe() for op in ops]


async def deferred_detail(host: Host, op_id: str) -> dict[str, Any]:
    registry = host.engine.deferred_registry
    op = await registry.get(op_id)
    if op is None:
        raise Problem(404, f"no deferred operation {op_id!r}")
    return {"operation": op.describe(), "history": await registry.history(op_id)}


async def list_operations(request: Request) -> Response:
    unknown = sorted(set(request.query_params) - {"status"})
    if unknown:
        raise Problem(400, f"unknown query parameter(s) {unknown}; allowed: ['status']")
    ops = await deferred_list(_host(request), request.query_params.get("status") or None)
    return JSONResponse({"operations": ops})


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


def deferred_routes() -> list[Route]:
    surface = _Surface()
    return [
        Route("/v1/deferred-operations", list_operations, methods=["GET"]),
        Route("/v1/deferred-operations/{op_id}", get_operation, methods=["GET"]),
        Route("/v1/deferred-operations/{op_id}/status", surface, methods=["GET"]),
        Route("/v1/deferred-operations/{op_id}/cancel", surface, methods=["POST"]),
    ]
