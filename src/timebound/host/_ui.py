"""The operator UI under ``/ui/``: server-rendered pages, one small script of our own for the
live event list (EventSource on the API's SSE stream), no build step.

Forms are protected against cross-site requests by a CSRF token bound to the browser's session
cookie (D8.4, ``_sessions``): each form repeats it in a hidden field, and a POST whose field is
not the token of the cookie it came with is refused (compared in constant time). The middleware
has already refused a POST from another origin (``_security``). A form's body is counted while
it is read, so a missing or lying Content-Length does not get past the body limit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import Message

from .._core import _clock
from .._core._body import TooLarge, declared_too_large, read_capped
from ._api import BOUNDS, DEPRECATED_BOUNDS, LIST_FILTERS, decode_cursor, list_page, run_detail
from ._deferred import DEFERRED_STATUSES, cancel_now, deferred_events, deferred_list, poll_now
from ._host import Host
from ._problems import Problem
from ._runview import actions_for, human_ms, iso, lanes_of, pending
from ._security import session_cookie_name
from ._sessions import MAX_AGE_S, Sessions, retry_after
from ._timeline import at_percent, lay_out
from ._traces import TraceError, read_trace, trace_view

__all__ = ["session_id", "ui_routes"]

_HERE = Path(__file__).parent
_templates = Jinja2Templates(directory=str(_HERE / "templates"))
_templates.env.filters["dur"] = human_ms
_templates.env.filters["iso"] = iso
# How many earlier pages of the runs list a "Previous page" link can walk back through: their
# cursors ride in the page's address (``back``), about 75 characters each (7.5 kB in all).
_BACK_PAGES = 100
_SECURITY_HEADERS = {
    # Bars are placed with style attributes; no inline script or stylesheet is allowed.
    "Content-Security-Policy": "default-src 'self'; style-src 'self'; "
    "style-src-attr 'unsafe-inline'; script-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    # D8.8: pages show run data and carry the session's CSRF token: no cache keeps them.
    "Cache-Control": "no-store",
}


def _host(request: Request) -> Host:
    host: Host = request.app.state.host
    return host


def session_id(request: Request) -> str | None:
    """The session id the request's cookie carries, if it is one this host could have made."""
    value = request.cookies.get(session_cookie_name(request))
    return value if Sessions.well_formed(value) else None


def _set_session(request: Request, response: Response, value: str, max_age: int | None) -> None:
    """The session cookie: HttpOnly, SameSite=Strict, for the whole host; ``__Host-`` and Secure
    over https (D8.9)."""
    secure = request.url.scheme == "https"
    response.set_cookie(
        session_cookie_name(request),
        value,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        path="/",
        secure=secure,
    )


def _render(
    request: Request, template: str, context: dict[str, Any], status: int = 200
) -> Response:
    host = _host(request)
    current = session_id(request)
    # A browser without a session id gets one here: its forms' CSRF token is bound to it.
    binding = current or host.sessions.new_id()
    signed_in = host.config.token is not None and host.sessions.valid(current)
    response = _templates.TemplateResponse(
        request,
        template,
        {"csrf": host.sessions.csrf(binding), "signed_in": signed_in, **context},
        status_code=status,
        headers=_SECURITY_HEADERS,
    )
    if current is None:
        _set_session(request, response, binding, None)
    return response


async def _checked_form(request: Request) -> FormData:
    """The posted form (urlencoded or multipart), once its CSRF field matches its cookie (403
    otherwise); 413 past the host's body limit, counted while reading."""
    limit = _host(request).config.max_body_bytes
    try:
        declared_too_large(request.headers.get("content-length"), limit, "the form")
        body = await read_capped(request.stream(), limit, what="the form")
    except TooLarge as exc:
        raise Problem(413, str(exc), code=exc.code) from None
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return {"type": "http.disconnect"}
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    # The counted body, parsed by Starlette from a request that replays it.
    form = await Request(request.scope, replay).form(max_files=2, max_fields=20)
    if not _host(request).sessions.csrf_ok(session_id(request), form.get("csrf")):
        await form.close()
        raise Problem(403, "the form's CSRF token is missing or does not match; reload the page")
    return form


async def _form(request: Request) -> dict[str, str]:
    """The posted form's text fields, once its CSRF field matches its cookie (403 otherwise)."""
    form = await _checked_form(request)
    try:
        return {k: v for k, v in form.items() if isinstance(v, str)}
    finally:
        await form.close()


def _page_url(params: dict[str, str], cursor: str | None, back: list[str]) -> str:
    query = {k: v for k, v in params.items() if k in ("status", "definition", *LIST_FILTERS) and v}
    if cursor:
        query["cursor"] = cursor
    if back:
        query["back"] = ".".join(back)
    return "/ui/?" + urlencode(query) if query else "/ui/"


async def runs_page(request: Request) -> Response:
    """A page of runs. Cursors only go forward, so the page's address carries the cursors of the
    pages before it (``back``, oldest first; the first page needs none) for a "Previous page"
    link; past ``_BACK_PAGES`` pages the oldest are dropped (``~`` marks the cut) and only "First
    page" leads further back."""
    params = {
        k: v
        for k, v in request.query_params.items()
        if k in ("status", "definition", "cursor", "back", *LIST_FILTERS)
    }
    back = [c for c in params.pop("back", "").split(".") if c]
    for c in back:
        if c != "~":
            decode_cursor(c)  # 400 for anything this host did not give out
    page, cursor = await list_page(_host(request), params)
    current = params.get("cursor")
    next_url = prev_url = first_url = None
    if cursor is not None:
        trail = [*back, current] if current else []
        if len(trail) > _BACK_PAGES:
            trail = ["~", *trail[-_BACK_PAGES + 1 :]]
        next_url = _page_url(params, cursor, trail)
    if current:
        first_url = _page_url(params, None, [])
        if back != ["~"]:
            prev_url = _page_url(params, back[-1] if back else None, back[:-1])
    return _render(
        request,
        "runs.html",
        {
            "runs": page,
            "next_url": next_url,
            "prev_url": prev_url,
            "first_url": first_url,
            "status": params.get("status", ""),
            "definition": params.get("definition", ""),
            "definitions": sorted(_host(request).definitions),
            "statuses": ["running", "completed", "failed", "timed_out", "cancelled"],
            "bounds": BOUNDS,
            # An old link's bound=execution selects its new name, node (D2.7).
            "filters": {
                k: DEPRECATED_BOUNDS.get(v, v) if k == "bound" else v
                for k in LIST_FILTERS
                for v in (params.get(k, ""),)
            },
            "now_ms": _clock.wall_ms(),
        },
    )


def _bars(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """Token bars for the run's timeline (one lane per token)."""
    tl = detail["timeline"]
    bars = lay_out(tl["tokens"], tl["start_ms"], tl["end_ms"])
    for bar in bars:
        branch = f"[{bar['branch_index']}]" if bar["branch_index"] is not None else ""
        bar["label"] = f"{bar['node_id']}{branch}"
        bar["css"] = bar["status"]
        bar["title"] = (
            f"{bar['node_id']}: {bar['status']}, +{bar['offset_ms']} ms for {bar['duration_ms']} ms"
        )
        bar["note"] = f"{bar['timeout']['timeout_type']} timeout" if bar["timeout"] else ""
    return bars


async def run_page(request: Request) -> Response:
    host = _host(request)
    detail = await run_detail(host, request.path_params["run_id"], ui=True)
    run, tl = detail["run"], detail["timeline"]
    # Ready tokens no live worker can run (D6.15): the run waits for one, or its deadline.
    unrunnable = [t for t in await host.engine.unrunnable() if t["run_id"] == run["id"]]
    markers = [
        {**m, "left": at_percent(m["at_ms"], tl["start_ms"], tl["end_ms"])} for m in tl["markers"]
    ]
    # D8.22: a node links to what it waits on, a child run or a deferred operation.
    children = {}
    for token_id, ref in (await host.engine.waits(run["id"])).items():
        try:
            await host.engine.get_run(ref)
            href = f"/ui/runs/{quote(ref, safe='')}"
        except KeyError:
            href = f"/ui/deferred/{quote(ref, safe='')}"
        children[token_id] = {"ref": ref, "href": href}
    return _render(
        request,
        "run.html",
        {
            **detail,
            "bars": _bars(detail),
            "lanes": lanes_of(detail["attempts"], tl["start_ms"], tl["end_ms"]),
            "markers": markers,
            "span_ms": tl["end_ms"] - tl["start_ms"],
            "now_ms": _clock.wall_ms(),
            "unrunnable": unrunnable,
            "pending": pending(
                run, detail["tokens"], detail["attempts"], await host.engine.next_timer(run["id"])
            ),
            "actions": actions_for(run, detail["tokens"]),
            "waits": children,
            "traces": {t["id"] for t in detail["tokens"] if _is_trace(t["output"])},
            "max_extension_s": host.config.max_extension,
            "fragment": request.query_params.get("part") == "live",
        },
    )


def _is_trace(output: Any) -> bool:
    """Whether a node's output looks like a pipeline trace (``Trace.to_json()``, or the output
    of ``timebound pipeline run --json``), which the run page links to (D8.21)."""
    if not isinstance(output, dict):
        return False
    return "spans" in output or isinstance(output.get("trace"), dict)


async def run_trace_page(request: Request) -> Response:
    """The pipeline trace a run's node produced, drawn as an uploaded one is (no export and
    upload needed); 404 when the node's output is no trace."""
    host = _host(request)
    run_id, token_id = request.path_params["run_id"], request.path_params["token_id"]
    try:
        tokens = await host.engine.tokens(run_id)
    except KeyError:
        raise Problem(404, f"no run {run_id!r}") from None
    token = next((t for t in tokens if t["id"] == token_id), None)
    if token is None or not _is_trace(token["output"]):
        raise Problem(404, f"node {token_id!r} of run {run_id!r} produced no pipeline trace")
    try:
        view = trace_view(read_trace(json.dumps(token["output"]).encode()))
    except TraceError as exc:
        raise Problem(422, f"the node's output is not a pipeline trace: {exc}") from None
    source = {"run_id": run_id, "node_id": token["node_id"], "token_id": token_id}
    return _render(
        request, "trace.html", {"trace": view, "error": None, "pasted": "", "source": source}
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
    """Sign in: rate-limited per client address (429 with Retry-After), CSRF-checked, and a new
    session id on success (D8.7)."""
    host = _host(request)
    if host.config.token is None:
        return RedirectResponse("/ui/", status_code=303)
    address = request.client.host if request.client else "unknown"
    wait = host.sessions.throttle.wait_s(address)
    if wait > 0:
        raise Problem(
            429,
            f"too many sign-in attempts from {address}; try again in {retry_after(wait)} s",
            headers={"Retry-After": retry_after(wait)},
        )
    fields = await _form(request)
    presented = fields.get("token", "")
    if not presented.strip() or not host.token_ok(presented):
        return _render(request, "login.html", {"error": "That token is not valid."}, 401)
    host.sessions.throttle.succeeded(address)
    response = RedirectResponse("/ui/", status_code=303)
    _set_session(request, response, host.sessions.open(), math.floor(MAX_AGE_S))
    return response


async def logout(request: Request) -> Response:
    """Sign out: the session ends on the host (its id is worth nothing after), the cookie goes."""
    await _form(request)
    _host(request).sessions.close(session_id(request))
    response = RedirectResponse("/ui/login", status_code=303)
    _set_session(request, response, "", 0)
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
    host = _host(request)
    operation, events = await deferred_events(host, request.path_params["op_id"])
    waiting = await host.engine.waiting_on(request.path_params["op_id"])
    return _render(
        request, "operation.html", {"operation": operation, "events": events, "waiting": waiting}
    )


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


async def traces_page(request: Request) -> Response:
    return _render(request, "trace.html", {"trace": None, "error": None, "pasted": ""})


async def trace_upload(request: Request) -> Response:
    """Show an uploaded (or pasted) pipeline trace; nothing of it is kept on the host."""
    try:
        form = await _checked_form(request)
    except Problem as exc:
        if exc.status != 413:
            raise
        return _render(
            request, "trace.html", {"trace": None, "error": exc.detail, "pasted": ""}, 413
        )
    try:
        upload = form.get("trace_file")
        pasted = form.get("trace_text")
        data = await upload.read() if isinstance(upload, UploadFile) else b""
    finally:
        await form.close()
    text = pasted if isinstance(pasted, str) else ""
    if data and text.strip():
        error = "give either a trace file or pasted JSON, not both"
    elif not data and not text.strip():
        error = "choose a trace file or paste a trace's JSON"
    else:
        try:
            view = trace_view(read_trace(data or text.encode("utf-8")))
        except TraceError as exc:
            error = str(exc)
        else:
            return _render(request, "trace.html", {"trace": view, "error": None, "pasted": ""})
    return _render(request, "trace.html", {"trace": None, "error": error, "pasted": text}, 422)


def ui_routes() -> list[Route | Mount]:
    return [
        Route("/ui/", runs_page),
        Route("/ui/deferred", deferred_page),
        Route("/ui/deferred/{op_id}", operation_page),
        Route("/ui/deferred/{op_id}/poll", operation_poll, methods=["POST"]),
        Route("/ui/deferred/{op_id}/cancel", operation_cancel, methods=["POST"]),
        Route("/ui/runs/{run_id}", run_page),
        Route("/ui/runs/{run_id}/trace/{token_id}", run_trace_page),
        Route("/ui/runs/{run_id}/cancel", cancel, methods=["POST"]),
        Route("/ui/traces", traces_page, methods=["GET"]),
        Route("/ui/traces", trace_upload, methods=["POST"]),
        Route("/ui/login", login_page, methods=["GET"]),
        Route("/ui/login", login, methods=["POST"]),
        Route("/ui/logout", logout, methods=["POST"]),
        Mount("/ui/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
