"""The operator UI under ``/ui/``: server-rendered pages, one small script of our own for the
live event list (EventSource on the API's SSE stream), no build step.

Forms are protected against cross-site requests by a double-submit token: a random value in a
``SameSite=Strict`` cookie that each form repeats in a hidden field; a POST whose field does not
match its cookie is refused (compared in constant time).
"""

from __future__ import annotations

import hmac
import math
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ._api import list_page, run_detail
from ._deferred import DEFERRED_STATUSES, cancel_now, deferred_detail, deferred_list, poll_now
from ._host import Host
from ._problems import Problem

__all__ = ["SESSION_COOKIE", "ui_routes"]

SESSION_COOKIE = "tb_session"
CSRF_COOKIE = "tb_csrf"
_HERE = Path(__file__).parent
_templates = Jinja2Templates(directory=str(_HERE / "templates"))
_SECURITY_HEADERS = {
    # Bars are placed with style attributes; no inline script or stylesheet is allowed.
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; "
    "style-src-attr 'unsafe-inline'; script-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _host(request: Request) -> Host:
    host: Host = request.app.state.host
    return host


def _render(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
    response = _templates.TemplateResponse(
        request,
        template,
        {"csrf": csrf, **context},
        status_code=status,
        headers=_SECURITY_HEADERS,
    )
    response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict", path="/ui")
    return response


async def _form(request: Request) -> dict[str, str]:
    """The posted form, once its CSRF field matches its cookie (403 otherwise)."""
    host = _host(request)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > host.config.max_body_bytes:
        raise Problem(413, "the form is larger than the body limit")
    form = await request.form()
    fields = {k: v for k, v in form.items() if isinstance(v, str)}
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not cookie or not hmac.compare_digest(fields.get("csrf", "").encode(), cookie.encode()):
        raise Problem(403, "the form's CSRF token is missing or does not match; reload the page")
    return fields


async def runs_page(request: Request) -> Response:
    params = {
        k: v for k, v in request.query_params.items() if k in ("status", "definition", "cursor")
    }
    page, cursor = await list_page(_host(request), params)
    next_url = None
    if cursor is not None:
        next_url = "/ui/?" + urlencode(
            {**{k: v for k, v in params.items() if k != "cursor"}, "cursor": cursor}
        )
    return _render(
        request,
        "runs.html",
        {
            "runs": page,
            "next_url": next_url,
            "status": params.get("status", ""),
            "definition": params.get("definition", ""),
            "definitions": sorted(_host(request).definitions),
            "statuses": ["running", "completed", "failed", "timed_out", "cancelled"],
        },
    )


def _bars(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """Token bars as percentages of the run's span, for the Gantt-like timeline."""
    tl = detail["timeline"]
    span = max(tl["end_ms"] - tl["start_ms"], 1)
    bars = []
    for tok in tl["tokens"]:
        end = tok["end_ms"] if tok["end_ms"] is not None else tl["end_ms"]
        left = (tok["start_ms"] - tl["start_ms"]) / span * 100
        bars.append(
            {
                **tok,
                "left": round(left, 2),
                "width": round(max((end - tok["start_ms"]) / span * 100, 0.5), 2),
                "offset_ms": tok["start_ms"] - tl["start_ms"],
                "duration_ms": end - tok["start_ms"],
            }
        )
    return bars


async def run_page(request: Request) -> Response:
    detail = await run_detail(_host(request), request.path_params["run_id"])
    tl = detail["timeline"]
    markers = [
        {
            **m,
            "left": round(
                (m["at_ms"] - tl["start_ms"]) / max(tl["end_ms"] - tl["start_ms"], 1) * 100, 2
            ),
        }
        for m in tl["markers"]
    ]
    return _render(
        request,
        "run.html",
        {
            **detail,
            "bars": _bars(detail),
            "markers": markers,
            "span_ms": tl["end_ms"] - tl["start_ms"],
            "now_ms": math.floor(time.time() * 1000),
        },
    )


async def cancel(request: Request) -> Response:
    await _form(request)
    host = _host(request)
    run_id = request.path_params["run_id"]
    try:
        await host.engine.get_run(run_id)
    except KeyError:
        raise Problem(404, f"no run {run_id!r}") from None
    await host.engine.cancel(run_id)
    return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)


async def login_page(request: Request) -> Response:
    host = _host(request)
    if host.config.token is None:
        return RedirectResponse("/ui/", status_code=303)
    return _render(request, "login.html", {"error": None})


async def login(request: Request) -> Response:
    host = _host(request)
    fields = await _form(request)
    if host.config.token is None:
        return RedirectResponse("/ui/", status_code=303)
    if not host.token_ok(fields.get("token")):
        return _render(request, "login.html", {"error": "That token is not valid."}, 401)
    response = RedirectResponse("/ui/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE, host.new_session(), httponly=True, samesite="strict", path="/"
    )
    return response


async def deferred_page(request: Request) -> Response:
    status = request.query_params.get("status") or None
    operations, _ = await deferred_list(_host(request), {"status": status or ""})
    return _render(
        request,
        "deferred.html",
        {"operations": operations, "status": status or "", "statuses": DEFERRED_STATUSES},
    )


async def operation_page(request: Request) -> Response:
    detail = await deferred_detail(_host(request), request.path_params["op_id"])
    return _render(request, "operation.html", detail)


async def operation_poll(request: Request) -> Response:
    await _form(request)
    op_id = request.path_params["op_id"]
    await poll_now(_host(request), op_id)
    return RedirectResponse(f"/ui/deferred/{quote(op_id, safe='')}", status_code=303)


async def operation_cancel(request: Request) -> Response:
    await _form(request)
    op_id = request.path_params["op_id"]
    await cancel_now(_host(request), op_id)
    return RedirectResponse(f"/ui/deferred/{quote(op_id, safe='')}", status_code=303)


def ui_routes() -> list[Route | Mount]:
    return [
        Route("/ui/", runs_page),
        Route("/ui/deferred", deferred_page),
        Route("/ui/deferred/{op_id}", operation_page),
        Route("/ui/deferred/{op_id}/poll", operation_poll, methods=["POST"]),
        Route("/ui/deferred/{op_id}/cancel", operation_cancel, methods=["POST"]),
        Route("/ui/runs/{run_id}", run_page),
        Route("/ui/runs/{run_id}/cancel", cancel, methods=["POST"]),
        Route("/ui/login", login_page, methods=["GET"]),
        Route("/ui/login", login, methods=["POST"]),
        Mount("/ui/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
