"""The JSON API under ``/v1`` (the routes of docs/host.md; OpenAPI in ``_openapi``)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .._core import _clock
from .._core._body import TooLarge, declared_too_large, read_capped
from .._core._errors import ConfigurationError
from .._core._problem import deadline_problem
from .._core._scopes import remaining
from .._json import MAX_DEPTH, JSONError, TooDeep
from .._json import check as check_json
from .._json import loads as loads_json
from ..telemetry import stored_run_events
from ..workflow import DefinitionConflict, DefinitionError, DefinitionTooLarge, StartConflict
from ..workflow._definition import MAX_DEFINITION_BYTES
from ..workflow._rows import RUN_TERMINAL
from ._host import Host
from ._problems import Problem
from ._timeline import attempts, bound_fired, budget_rows, timeline, timeouts

__all__ = ["api_routes", "decode_cursor", "encode_cursor", "read_json", "wire_events"]

_RUN_STATUSES = ("running", *RUN_TERMINAL)
# The largest deadline a start takes: ten years, the bound of the definitions' own timeouts.
MAX_DEADLINE_MS = 315_360_000_000
# A body larger than this is parsed and checked in a worker thread (D6.23).
_PARSE_ON_LOOP_BYTES = 64 * 1024
# How often an SSE stream looks for new events: a display cadence, never part of a run's timing.
_SSE_POLL_S = 0.2


def _host(request: Request) -> Host:
    host: Host = request.app.state.host
    return host


async def read_json(
    request: Request,
    limit: int,
    *,
    max_depth: int = MAX_DEPTH,
    what: str = "the body",
    code: str | None = None,
) -> Any:
    """The request's JSON body: 415 if not JSON, 413 past ``limit`` bytes (counted while reading,
    so a lying Content-Length does not help; ``code`` instead of ``too-large`` if given), 400
    naming where the JSON broke, 422 ``too-deep`` past ``max_depth`` levels (D8.10)."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise Problem(415, f"the body must be application/json, not {media or 'missing'!r}")
    try:
        declared_too_large(request.headers.get("content-length"), limit, what)
        body = await read_capped(request.stream(), limit, what=what)
    except TooLarge as exc:
        raise Problem(413, str(exc), code=code or exc.code) from None
    try:
        if len(body) <= _PARSE_ON_LOOP_BYTES:
            return loads_json(body, max_depth=max_depth, what="the body")
        # Reading and checking a large body takes tens of milliseconds: not on the loop that
        # fires the engine's timers (D6.23).
        return await asyncio.to_thread(loads_json, body, max_depth=max_depth, what="the body")
    except TooDeep as exc:
        raise Problem(422, str(exc), code=exc.code, path=exc.path) from None
    except JSONError as exc:
        detail = str(exc) if exc.reason is None else f"malformed JSON: {exc.reason}"
        raise Problem(400, detail, code=exc.code) from None


def _only(data: Any, allowed: set[str], where: str = "body") -> dict[str, Any]:
    if not isinstance(data, dict):
        raise Problem(422, f"{where}: expected a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise Problem(422, f"{where}: unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    return data


def encode_cursor(started_at: int, run_id: str) -> str:
    raw = json.dumps([started_at, run_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        started_at, run_id = json.loads(raw)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise Problem(400, "cursor: not a cursor this host gave out") from None
    if not isinstance(started_at, int) or not isinstance(run_id, str):
        raise Problem(400, "cursor: not a cursor this host gave out")
    return started_at, run_id


def _query(request: Request, allowed: set[str]) -> dict[str, str]:
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise Problem(400, f"unknown query parameter(s) {unknown}; allowed: {sorted(allowed)}")
    return dict(request.query_params)


#: The run list's filters besides status and definition (D8.20).
LIST_FILTERS = ("bound", "since", "until", "q", "input")
BOUNDS = ("any", "workflow", "node", "synchronization")
#: Filter values accepted under an old name (D2.7): answered with a ``Deprecation`` header.
DEPRECATED_BOUNDS = {"execution": "node"}


def _instant(params: dict[str, str], name: str) -> datetime | None:
    """An instant of the list's time range: epoch ms, or ISO 8601 (UTC when no offset)."""
    text = params.get(name, "").strip()
    if not text:
        return None
    if text.isdigit():
        try:
            if len(text) > 16:
                raise OverflowError
            return _clock.datetime_of_ms(int(text))
        except OverflowError:
            raise Problem(400, f"{name}: {text[:40]!r} is past the year 9999") from None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise Problem(
            400, f"{name}: {text!r} is neither epoch milliseconds nor an ISO 8601 date-time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when


def _input_field(params: dict[str, str]) -> tuple[str, Any] | None:
    """``field=value``: the value as JSON if it parses (``n=3``, ``ok=true``), else as text."""
    text = params.get("input", "")
    if not text:
        return None
    key, eq, raw = text.partition("=")
    if not eq or not key:
        raise Problem(400, f"input: expected field=value, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key, value


async def list_page(host: Host, params: dict[str, str]) -> tuple[list[dict[str, Any]], str | None]:
    """One page of runs for the API and the UI, and the cursor of the next page."""
    status = params.get("status") or None
    if status is not None and status not in _RUN_STATUSES:
        raise Problem(400, f"status: {status!r} is not one of {list(_RUN_STATUSES)}")
    bound = params.get("bound") or None
    bound = DEPRECATED_BOUNDS.get(bound, bound) if bound is not None else None
    if bound is not None and bound not in BOUNDS:
        raise Problem(400, f"bound: {bound!r} is not one of {list(BOUNDS)}")
    after = decode_cursor(params["cursor"]) if params.get("cursor") else None
    size = host.config.page_size
    rows = await host.engine.list_runs(
        status=status,
        definition_id=params.get("definition") or None,
        after=after,
        limit=size + 1,
        bound=bound,
        since=_instant(params, "since"),
        until=_instant(params, "until"),
        id_prefix=params.get("q", "").strip() or None,
        input_field=_input_field(params),
    )
    page = rows[:size]
    more = len(rows) > size
    return page, encode_cursor(page[-1]["started_at"], page[-1]["id"]) if more else None


async def _get_run(host: Host, run_id: str) -> dict[str, Any]:
    try:
        return await host.engine.get_run(run_id)
    except KeyError:
        raise Problem(404, f"no run {run_id!r}") from None


async def start_run(request: Request) -> Response:
    host = _host(request)
    definition_id = request.path_params["definition_id"]
    # The envelope is one level: the input may nest as deep as any run's input (D6.20).
    body = _only(
        await read_json(request, host.config.max_body_bytes, max_depth=MAX_DEPTH + 1),
        {"input", "deadline_ms", "idempotency_key", "run_id"},
    )
    try:
        check_json(body.get("input"), what="input", root="$.input")
    except JSONError as exc:
        raise Problem(422, str(exc), code=exc.code, path=exc.path) from None
    deadline_ms = body.get("deadline_ms")
    # JSON has one number type: 250.0 is the integer 250 (as the OpenAPI document's JSON Schema
    # says), 250.5 is not; past ten years is a mistake, not a deadline (D8.8).
    if isinstance(deadline_ms, float) and deadline_ms.is_integer():
        deadline_ms = int(deadline_ms)
    if deadline_ms is not None and (
        not isinstance(deadline_ms, int)
        or isinstance(deadline_ms, bool)
        or not 1 <= deadline_ms <= MAX_DEADLINE_MS
    ):
        raise Problem(
            422, f"deadline_ms: expected an integer of milliseconds in [1, {MAX_DEADLINE_MS}]"
        )
    # Idempotent starts (D6.18): the Idempotency-Key header or the body's field (equal if both).
    key = request.headers.get("idempotency-key")
    if "idempotency_key" in body:
        if not isinstance(body["idempotency_key"], str):
            raise Problem(422, "idempotency_key: expected a string")
        if key is not None and key != body["idempotency_key"]:
            # The request names two keys: a conflict within it, not a malformed body (its
            # schema cannot see the header), hence 409.
            raise Problem(
                409,
                "idempotency_key: differs from the Idempotency-Key header",
                code="idempotency-key-mismatch",
            )
        key = body["idempotency_key"]
    if "run_id" in body and not isinstance(body["run_id"], str):
        raise Problem(422, "run_id: expected a string")
    # The latest version in the store: another host may have published one since our start.
    latest = await host.engine.stored_definitions(definition_id)
    if not latest:
        raise Problem(404, f"no definition {definition_id!r}")
    deadline = None if deadline_ms is None else timedelta(milliseconds=deadline_ms)
    try:
        run_id = await host.engine.start(
            definition_id,
            body.get("input"),
            version=latest[0].version,
            deadline=deadline,
            idempotency_key=key,
            # A client-chosen run id (D8.15): a repeat with the same body returns that run.
            run_id=body.get("run_id"),
        )
    except ConfigurationError as exc:
        raise Problem(422, f"{exc.option}: {exc}") from None
    except StartConflict as exc:
        raise Problem(409, str(exc), code=exc.code, run_id=exc.run_id) from None
    return JSONResponse(
        {"run_id": run_id}, status_code=201, headers={"Location": f"/v1/runs/{run_id}"}
    )


async def list_runs(request: Request) -> Response:
    params = _query(request, {"status", "definition", "cursor", *LIST_FILTERS})
    page, cursor = await list_page(_host(request), params)
    old = params.get("bound", "")
    if old in DEPRECATED_BOUNDS:
        # RFC 9745's header, and a Warning-like note a person reading the answer sees.
        return JSONResponse(
            {"runs": page, "next_cursor": cursor},
            headers={
                "Deprecation": "true",
                "X-Timebound-Deprecated": f"bound={old} is now bound={DEPRECATED_BOUNDS[old]}",
            },
        )
    return JSONResponse({"runs": page, "next_cursor": cursor})


async def run_detail(host: Host, run_id: str, *, ui: bool = False) -> dict[str, Any]:
    """A run's detail (``GET /v1/runs/{id}``); ``ui`` adds what only the UI's page shows."""
    try:
        run, tokens, rows = await host.engine.snapshot(run_id)
    except KeyError:
        raise Problem(404, f"no run {run_id!r}") from None
    # The stored rows as the one event record the engine's listeners heard (D10.9).
    events = stored_run_events(run_id, rows)
    extra = {"budget": budget_rows(events)} if ui else {}
    return extra | {
        "run": run,
        "tokens": tokens,
        "timeouts": timeouts(events),
        "bound_fired": bound_fired(events),
        "timeline": timeline(run, events, _clock.wall_ms()),
        # D8.21: each token's queued, attempt, retry-delay and fan-in-waiting stretches.
        "attempts": attempts(events),
        "events_count": len(events),
    }


async def get_run(request: Request) -> Response:
    _query(request, set())
    return JSONResponse(await run_detail(_host(request), request.path_params["run_id"]))


def wire_events(run_id: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A run's stored event rows as the wire carries them (D10.12): each row as it always was
    (``kind``, ``at_epoch_ms``, its data) and, added, the one event record's ``name``,
    ``epoch_ms``, ``correlation`` (kind -> id) and ``bound`` (the fired bound as a
    problem document, or null), read back by the function a listener's events are built with
    (D10.9)."""
    return [
        {
            **row,
            "name": event.name,
            "epoch_ms": event.epoch_ms,
            "correlation": dict(event.correlation),
            "bound": None if event.bound is None else deadline_problem(event.bound),
        }
        for row, event in zip(rows, stored_run_events(run_id, rows), strict=True)
    ]


async def _sse(host: Host, run_id: str, start: int) -> AsyncIterator[bytes]:
    """Events from number ``start + 1`` on, until the run ends or the caller's deadline passes
    (then an ``event: deadline``: the stream ends cleanly, the run goes on)."""
    seen = start
    while True:
        left = remaining()
        if left == 0.0:
            yield b"event: deadline\ndata: {}\n\n"
            return
        # The status first: a run's last events commit with its end, so events read after an
        # ended status include them all (read the other way round, another worker's commit in
        # between would end the stream without its last events).
        ended = (await host.engine.get_run(run_id))["status"] in RUN_TERMINAL
        events = await host.engine.events(run_id)
        for seq, event in enumerate(wire_events(run_id, events[seen:]), start=seen + 1):
            yield f"id: {seq}\nevent: {event['kind']}\ndata: {json.dumps(event)}\n\n".encode()
        seen = max(seen, len(events))
        if ended:
            yield b"event: end\ndata: {}\n\n"
            return
        await asyncio.sleep(min(_SSE_POLL_S, left))


async def run_events(request: Request) -> Response:
    _query(request, set())
    host = _host(request)
    run_id = request.path_params["run_id"]
    await _get_run(host, run_id)
    if "text/event-stream" in request.headers.get("accept", ""):
        last = request.headers.get("last-event-id", "0")
        start = int(last) if last.isdigit() else 0
        return StreamingResponse(
            _sse(host, run_id, start),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
    return JSONResponse({"events": wire_events(run_id, await host.engine.events(run_id))})


async def cancel_run(request: Request) -> Response:
    host = _host(request)
    run_id = request.path_params["run_id"]
    await _get_run(host, run_id)
    cancelled = await host.engine.cancel(run_id)
    if not cancelled:
        run = await _get_run(host, run_id)
        raise Problem(409, f"run {run_id!r} has already ended ({run['status']})")
    return JSONResponse({"run_id": run_id, "status": "cancelled"})


def _definition_summary(d: Any) -> dict[str, Any]:
    return {"id": d.id, "version": d.version, "timeout_ms": d.timeout_ms, "nodes": len(d.nodes)}


async def list_definitions(request: Request) -> Response:
    _query(request, set())
    stored = await _host(request).engine.stored_definitions()
    return JSONResponse({"definitions": [_definition_summary(d) for d in stored]})


async def put_definition(request: Request) -> Response:
    host = _host(request)
    definition_id = request.path_params["definition_id"]
    # Refused by its size while it is read, before parsing costs the loop (D6.23).
    body = await read_json(
        request,
        min(host.config.max_body_bytes, MAX_DEFINITION_BYTES),
        what="the definition",
        code=DefinitionTooLarge.code,
    )
    if not isinstance(body, dict):
        raise Problem(422, "body: expected a workflow definition object")
    if body.get("id") != definition_id:
        raise Problem(
            422, f"id: the body's id {body.get('id')!r} is not the path's {definition_id!r}"
        )
    try:
        definition, created = await host.engine.publish(body)
    except DefinitionConflict as exc:
        raise Problem(409, str(exc), path=exc.path) from None
    except DefinitionError as exc:
        raise Problem(422, f"invalid definition: {exc}", path=exc.path, code=exc.code) from None
    # Stored: every host and worker on the store sees it, and it outlives a restart.
    (latest,) = await host.engine.stored_definitions(definition_id)
    host.definitions[definition_id] = latest
    return JSONResponse(
        {**_definition_summary(definition), "latest_version": latest.version},
        status_code=201 if created else 200,
    )


def api_routes() -> list[Route]:
    return [
        Route("/v1/workflows/{definition_id}/runs", start_run, methods=["POST"]),
        Route("/v1/runs", list_runs, methods=["GET"]),
        Route("/v1/runs/{run_id}", get_run, methods=["GET"]),
        Route("/v1/runs/{run_id}/events", run_events, methods=["GET"]),
        Route("/v1/runs/{run_id}/cancel", cancel_run, methods=["POST"]),
        Route("/v1/definitions", list_definitions, methods=["GET"]),
        Route("/v1/definitions/{definition_id}", put_definition, methods=["PUT"]),
    ]
