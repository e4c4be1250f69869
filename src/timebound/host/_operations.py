"""An operator's actions on a run over HTTP: ``POST /v1/runs/{id}/retry|terminate|extend`` and
the UI's forms for them (D8.19, D8.20). The engine decides (D6.25-D6.28); this module checks the
request and turns a refusal into a problem document with the refusal's stable ``code``."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ..workflow import OperatorRefused
from ._api import _only, read_json
from ._host import Host
from ._problems import Problem
from ._ui import _form, session_id

__all__ = ["act", "api_operation_routes", "ui_operation_routes"]

MAX_REASON = 1000
MAX_BY_MS = 31_536_000_000  # one year: past it is a mistake, whatever the cap
# Refusals that name a field of the request: still 409, since whether a node name is valid depends
# on the run (its definition, the nodes it reached), not on the request's shape (422).
_FIELD = {"unknown-node": "node"}


def _text(body: dict[str, Any], name: str, *, required: bool, limit: int) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if value is None or value == "":
        raise Problem(
            422,
            f"{name}: required, not empty (say why, for the run's events)"
            if required
            else f"{name}: expected a non-empty string or null",
            path=name,
        )
    if not isinstance(value, str) or len(value) > limit:
        raise Problem(422, f"{name}: expected a string of at most {limit} characters", path=name)
    return value


def _by_ms(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():  # a form's field
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_BY_MS:
        raise Problem(
            422, f"by_ms: expected an integer of milliseconds in [1, {MAX_BY_MS}]", path="by_ms"
        )
    return value


def operator_name(request: Request, declared: str | None, session: str | None) -> str:
    """Who acted: ``ui:<session digest>`` for the UI, ``api`` for the bearer token, followed by
    the name the caller declared (recorded as given: the token, not the name, is checked)."""
    who = "api" if session is None else "ui:" + hashlib.sha256(session.encode()).hexdigest()[:8]
    return f"{who} ({declared})" if declared else who


async def act(host: Host, run_id: str, action: str, body: dict[str, Any], who: str) -> Any:
    """Run ``action`` on the run with the request's fields; a refusal as a problem document."""
    reason = _text(body, "reason", required=True, limit=MAX_REASON)
    assert reason is not None
    engine = host.engine
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "terminate": lambda: engine.terminate(run_id, reason=reason, operator=who),
        "retry": lambda: engine.retry(
            run_id,
            from_node=_text(body, "from_node", required=False, limit=200),
            from_start=_flag(body.get("from_start")),
            reason=reason,
            operator=who,
        ),
        "extend": lambda: engine.extend(
            run_id,
            _text(body, "node", required=False, limit=200),
            by=_by_ms(body.get("by_ms")) / 1000,
            reason=reason,
            operator=who,
        ),
    }
    if action == "retry" and body.get("from_node") is not None and _flag(body.get("from_start")):
        raise Problem(422, "from_node and from_start: give one, not both", path="from_start")
    try:
        return await calls[action]()
    except OperatorRefused as exc:
        if exc.code == "run-not-found":
            raise Problem(404, str(exc), code=exc.code) from None
        if exc.code in _FIELD:
            where = "from_node" if action == "retry" else _FIELD[exc.code]
            raise Problem(409, str(exc), code=exc.code, path=where) from None
        raise Problem(409, str(exc), code=exc.code) from None


def _flag(value: Any) -> bool:
    if value in (None, False, "", "0", "false", "no"):
        return False
    if value in (True, "1", "true", "on", "yes"):
        return True
    raise Problem(422, "from_start: expected true or false", path="from_start")


_FIELDS = {
    "retry": {"reason", "operator", "from_node", "from_start"},
    "terminate": {"reason", "operator"},
    "extend": {"reason", "operator", "node", "by_ms"},
}


def _api(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        host: Host = request.app.state.host
        body = _only(await read_json(request, host.config.max_body_bytes), _FIELDS[action])
        declared = _text(body, "operator", required=False, limit=100)
        run_id = request.path_params["run_id"]
        answer = await act(host, run_id, action, body, operator_name(request, declared, None))
        return JSONResponse(answer)

    endpoint.__name__ = f"{action}_run"
    return endpoint


def api_operation_routes() -> list[Route]:
    return [
        Route(f"/v1/runs/{{run_id}}/{action}", _api(action), methods=["POST"])
        for action in ("retry", "terminate", "extend")
    ]


def _ui(action: str) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        form = await _form(request)
        host: Host = request.app.state.host
        run_id = request.path_params["run_id"]
        # A form sends its empty fields (no node chosen): for the API they would be mistakes.
        body: dict[str, Any] = {k: v for k, v in form.items() if k in _FIELDS[action] and v}
        if action == "extend" and form.get("by_s"):
            seconds = form["by_s"].strip()
            body["by_ms"] = int(float(seconds) * 1000) if _number(seconds) else seconds
        declared = _text(body, "operator", required=False, limit=100)
        sid = session_id(request) or "anonymous"
        await act(host, run_id, action, body, operator_name(request, declared, sid))
        return RedirectResponse(f"/ui/runs/{run_id}", status_code=303)

    endpoint.__name__ = f"ui_{action}"
    return endpoint


def _number(text: str) -> bool:
    try:
        return 0 < float(text) < 1e12
    except ValueError:
        return False


def ui_operation_routes() -> list[Route]:
    return [
        Route(f"/ui/runs/{{run_id}}/{action}", _ui(action), methods=["POST"])
        for action in ("retry", "terminate", "extend")
    ]
