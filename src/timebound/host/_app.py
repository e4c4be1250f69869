"""The host's ASGI application: API, UI, metrics and health, behind the deadline middleware."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Match, Mount, Route

from .._core import _clock
from ..propagation.asgi import DeadlineMiddleware
from ._api import api_routes
from ._deferred import deferred_routes
from ._host import Host
from ._openapi import openapi
from ._operations import api_operation_routes, ui_operation_routes
from ._problems import Problem, problem_response
from ._security import SAFE_METHODS, cross_site, host_allowed
from ._ui import session_id, ui_routes

__all__ = ["create_app"]

_log = logging.getLogger("timebound.host")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Pages that must answer without a session: the login form and its stylesheet.
_UI_OPEN = ("/ui/login", "/ui/static/")
# The one API route a signed-in UI session may read without a Bearer header: EventSource cannot
# send one (D8.7).
_EVENTS = re.compile(r"/v1/runs/[^/]+/events")


class _Guard:
    """The host's checks before any route (Host allow-list, same-origin for what changes state,
    auth: D8.1, D8.4, D8.5, D8.7), ``Cache-Control: no-store`` on what carries run data (D8.8),
    and request metrics; pure ASGI so streaming answers stay streaming."""

    def __init__(self, app: ASGIApp, host: Host) -> None:
        self.app, self.host = app, host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        path = scope["path"]
        refused = self._refuse(request, path)
        private = path.startswith("/v1/") or (
            path.startswith("/ui") and not path.startswith("/ui/static/")
        )
        started = _clock.now()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.setdefault("headers", [])
                if private and not any(k.lower() == b"cache-control" for k, _ in headers):
                    headers.append((b"cache-control", b"no-store"))
            await send(message)

        try:
            if refused is not None:
                await refused(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        finally:
            route = _route_label(scope)
            self.host.requests.labels(route, str(status)).inc()
            self.host.latency.labels(route).observe(_clock.now() - started)

    def _refuse(self, request: Request, path: str) -> Response | None:
        host = self.host
        if not host_allowed(request.headers.get("host"), host.config.allowed_hosts):
            return problem_response(
                421,
                f"this host does not answer to the name {request.headers.get('host', '')!r}: "
                "allowed are loopback names, IP addresses and the names given with "
                "--allowed-host (D8.5)",
            )
        if request.method not in SAFE_METHODS:
            why = cross_site(request)
            if why is not None:
                return problem_response(403, why)
            media = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if path.startswith("/v1/") and media not in ("", "application/json"):
                # A form (or text/plain) post from a page of another site is a "simple"
                # request a browser sends without asking first: the API takes JSON only.
                return problem_response(
                    415, f"the body must be application/json, not {media!r}", path
                )
        if host.config.token is None:
            return None
        if path.startswith("/v1/"):
            scheme, _, presented = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() == "bearer" and host.token_ok(presented.strip() or None):
                return None
            if (
                request.method in ("GET", "HEAD")
                and _EVENTS.fullmatch(path)
                and cross_site(request) is None
                and host.sessions.valid(session_id(request))
            ):
                return None
            return problem_response(401, "this route needs 'Authorization: Bearer <token>'")
        if (
            path.startswith("/ui")
            and not path.startswith(_UI_OPEN)
            and not host.sessions.valid(session_id(request))
        ):
            return RedirectResponse("/ui/login", status_code=303)
        return None


def _allowed_methods(routes: list[BaseRoute], scope: Scope) -> str:
    """Every method some route serves at this path (several routes may share one)."""
    # The app's own root: inside a Mount, root_path has grown by the mount's prefix.
    root = scope.get("app_root_path", scope.get("root_path", ""))
    probe = {"type": "http", "path": scope["path"], "root_path": root}
    methods: set[str] = set()
    for route in routes:
        match, _ = route.matches({**probe, "method": "\x00"})
        if match == Match.NONE:
            continue
        if isinstance(route, Mount):
            methods |= {"GET", "HEAD"}  # the static files
        elif isinstance(route, Route) and route.methods:
            methods |= route.methods
    return ", ".join(sorted(methods))


def _route_label(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


def create_app(host: Host) -> ASGIApp:
    """The ASGI app serving ``host``; its lifespan opens and closes the engine."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await host.engine.open()
        try:
            await host.publish_definitions()
            yield
        finally:
            try:
                await host.engine.close(drain=host.config.drain)
            finally:
                await host.aclose_connectors()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            await host.engine.list_runs(limit=1)
        except Exception as exc:
            _log.warning("readiness: the store is not reachable: %s", type(exc).__name__)
            return problem_response(503, "the store is not reachable")
        return JSONResponse({"status": "ready"})

    async def metrics(request: Request) -> Response:
        return Response(await host.metrics.scrape(), media_type=CONTENT_TYPE_LATEST)

    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi())

    async def on_problem(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, Problem)
        return problem_response(
            exc.status, exc.detail, request.url.path, headers=exc.headers, **exc.extra
        )

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # D8.8: every 405 says what is allowed (RFC 9110 §15.5.6), for all routes that share
            # the path, not only the one Starlette tried.
            headers["Allow"] = _allowed_methods(app.routes, request.scope)
        detail = {404: "no such route", 405: f"method {request.method} is not allowed here"}
        return problem_response(
            exc.status_code,
            detail.get(exc.status_code, str(exc.detail)),
            request.url.path,
            headers=headers,
        )

    async def on_error(request: Request, exc: Exception) -> Response:
        # The traceback goes to the host's log only, never into a response (D8.2).
        _log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return problem_response(500, "internal error; the host's log has the details")

    app = Starlette(
        routes=[
            *api_routes(),
            *api_operation_routes(),
            *deferred_routes(),
            *ui_routes(),
            *ui_operation_routes(),
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics),
            Route("/openapi.json", openapi_json),
        ],
        exception_handlers={Problem: on_problem, HTTPException: on_http, Exception: on_error},
        lifespan=lifespan,
    )
    app.state.host = host
    guarded = _Guard(app, host)
    # D8.3: a caller's deadline header bounds every call. A handler is cancelled at the deadline
    # (answered 498); an event stream instead ends itself cleanly at the deadline (see _api._sse),
    # because cancelling it would cut the chunked response mid-message.
    bounded = DeadlineMiddleware(guarded, cancel_on_expiry=True)
    streaming = DeadlineMiddleware(guarded, cancel_on_expiry=False)

    return _Dispatch(app, bounded, streaming)


class _Dispatch:
    """The host's ASGI app: event streams to the non-cancelling deadline middleware, the rest to
    the cancelling one. ``routes`` are the routes it serves (the OpenAPI document's test reads
    them, so the document cannot drift from the app)."""

    def __init__(self, app: Starlette, bounded: ASGIApp, streaming: ASGIApp) -> None:
        self._app, self._bounded, self._streaming = app, bounded, streaming

    @property
    def routes(self) -> list[Any]:
        return list(self._app.routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _wants_stream(scope):
            await self._streaming(scope, receive, send)
        else:
            await self._bounded(scope, receive, send)


def _wants_stream(scope: Scope) -> bool:
    if not scope["path"].endswith("/events"):
        return False
    return any(k == b"accept" and b"text/event-stream" in v for k, v in scope["headers"])
