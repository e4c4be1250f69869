"""The OpenAPI 3.1 document served at ``/openapi.json``, written out so it says exactly what the
routes do (generated schemas would not know the problem documents or the SSE variant)."""

from __future__ import annotations

from typing import Any

from .._version import __version__
from ._api import _RUN_STATUSES, BOUNDS, DEPRECATED_BOUNDS, MAX_DEADLINE_MS
from ._deferred import DEFERRED_STATUSES

__all__ = ["openapi"]

# An idempotency key or client-chosen run id (D6.18, D8.15): 1 to 200 printable ASCII characters
# without spaces.
_KEY_SCHEMA: dict[str, Any] = {"type": "string", "pattern": "^[!-~]{1,200}$"}
_DESCRIBED = {"200": "OK", "201": "Created", "410": "Gone: the operation's record has expired"}
_PROBLEM = {"$ref": "#/components/responses/Problem"}
# 403: a state-changing request from another site's page (D8.4); 421: a Host name this host does
# not answer to (D8.5).
_ERRORS = {
    code: _PROBLEM for code in ("400", "401", "403", "404", "409", "413", "415", "421", "422")
}
# What a start answers, and the calls its run_id leads to (for clients and stateful testers).
_STARTED = {
    "description": "Created",
    "content": {
        "application/json": {
            "schema": {
                "type": "object",
                "required": ["run_id"],
                "properties": {"run_id": {"type": "string"}},
            }
        }
    },
    "links": {
        name: {"operationId": name, "parameters": {"run_id": "$response.body#/run_id"}}
        for name in ("getRun", "getRunEvents", "cancelRun")
    },
}


def _op(operation_id: str, summary: str, ok: str, *also: str, **more: Any) -> dict[str, Any]:
    """An operation answering ``ok`` (and the codes in ``also``) or a problem document."""
    answers: dict[str, Any] = {code: {"description": _DESCRIBED[code]} for code in (ok, *also)}
    if operation_id == "startRun":
        answers["201"] = _STARTED
    return {
        "operationId": operation_id,
        "summary": summary,
        "responses": {**answers, **_ERRORS},
        **more,
    }


def _surface(operation: dict[str, Any]) -> dict[str, Any]:
    """An operation of the deferred status surface: its own errors are ``application/json``
    documents of the problem shape (docs/deferred.md), the host's are problem documents."""
    for code, answer in operation["responses"].items():
        if answer is _PROBLEM:
            operation["responses"][code] = {"$ref": "#/components/responses/SurfaceProblem"}
    return operation


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def _status_param(statuses: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The ``status`` filter: one of ``statuses``, or empty for any (as the UI's form sends)."""
    return {
        "name": "status",
        "in": "query",
        "schema": {"type": "string", "enum": ["", *statuses]},
    }


def _action_body(*, exclusive: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    """An operator action's body: ``reason`` (recorded in the run's events) and ``fields``;
    ``exclusive``: a combination of values the body must not have (``not``)."""
    text = {"type": "string", "minLength": 1, "maxLength": 1000}
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["reason", *(k for k, v in fields.items() if v.pop("_req", 0))],
        "properties": {
            "reason": text,
            "operator": {"type": ["string", "null"], "minLength": 1, "maxLength": 100},
            **fields,
        },
    }
    if exclusive is not None:
        schema["not"] = {"required": list(exclusive), "properties": exclusive}
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _operator_paths() -> dict[str, Any]:
    """D8.19: retry, terminate and extend; a refusal is a problem document whose ``code`` says
    why (404 run-not-found, 409 for what depends on the run, 422 for the body's shape)."""
    node = {"type": ["string", "null"], "minLength": 1, "maxLength": 200}
    return {
        "/v1/runs/{run_id}/retry": {
            "post": _op(
                "retryRun",
                "Run a failed or timed-out run again from the node that failed (from_node, or "
                "from_start), with a fresh workflow timeout",
                "200",
                parameters=[_path_param("run_id")],
                requestBody=_action_body(
                    from_node=dict(node),
                    from_start={"type": ["boolean", "null"]},
                    # Two places to start from: refused (422).
                    exclusive={"from_node": {"type": "string"}, "from_start": {"const": True}},
                ),
            )
        },
        "/v1/runs/{run_id}/terminate": {
            "post": _op(
                "terminateRun",
                "End a running run failed at once (retryable, unlike a cancel)",
                "200",
                parameters=[_path_param("run_id")],
                requestBody=_action_body(),
            )
        },
        "/v1/runs/{run_id}/extend": {
            "post": _op(
                "extendRun",
                "Move the run's deadline (or a live node's) later by by_ms, within the host's "
                "max_extension for the run",
                "200",
                parameters=[_path_param("run_id")],
                requestBody=_action_body(
                    node=dict(node),
                    by_ms={"type": "integer", "minimum": 1, "maximum": 31_536_000_000, "_req": 1},
                ),
            )
        },
    }


def openapi() -> dict[str, Any]:
    ident = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[A-Za-z0-9_.:-]+$"}
    definition_body = {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    # The full definition schema is `timebound workflow schema`; the body's id
                    # must be the path's (D8.8: the document says what the API refuses).
                    "type": "object",
                    "required": ["id", "initial_node", "nodes"],
                    "properties": {
                        "id": ident,
                        "initial_node": ident,
                        "nodes": {"type": "array", "minItems": 1},
                    },
                }
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "timebound host", "version": __version__},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {
                "Problem": {
                    "description": "An RFC 9457 problem document",
                    "content": {"application/problem+json": {"schema": {"type": "object"}}},
                },
                "SurfaceProblem": {
                    "description": "A problem document (application/json from the deferred "
                    "status surface, application/problem+json from the host)",
                    "content": {
                        "application/problem+json": {"schema": {"type": "object"}},
                        "application/json": {"schema": {"type": "object"}},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/workflows/{definition_id}/runs": {
                "post": _op(
                    "startRun",
                    "Start a run: body {input, deadline_ms?, idempotency_key?, run_id?} (or an "
                    "Idempotency-Key header); answers 201 {run_id}, the same run for a repeat "
                    "of the same key (or run_id) and body, 409 for another body under it",
                    "201",
                    parameters=[
                        _path_param("definition_id"),
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": _KEY_SCHEMA,
                        },
                    ],
                    requestBody={
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "input": {},
                                        # null (or absent): no deadline of the caller's.
                                        "deadline_ms": {
                                            "type": ["integer", "null"],
                                            "minimum": 1,
                                            "maximum": MAX_DEADLINE_MS,
                                        },
                                        "idempotency_key": _KEY_SCHEMA,
                                        "run_id": _KEY_SCHEMA,
                                    },
                                }
                            }
                        },
                    },
                )
            },
            "/v1/runs": {
                "get": _op(
                    "listRuns",
                    "Runs, newest first, a page at a time (next_cursor)",
                    "200",
                    parameters=[
                        _status_param(_RUN_STATUSES),
                        *(
                            {"name": n, "in": "query", "schema": {"type": "string"}}
                            for n in ("definition", "cursor", "q")
                        ),
                        # D8.20: a bound of that layer fired (whatever the run's status).
                        {
                            "name": "bound",
                            "in": "query",
                            "description": "the layer of a bound that fired for good; "
                            "execution is the deprecated name of node (answered with a "
                            "Deprecation header)",
                            "schema": {
                                "type": "string",
                                "enum": ["", *BOUNDS, *DEPRECATED_BOUNDS],
                            },
                        },
                        *(
                            {
                                "name": n,
                                "in": "query",
                                "description": "started at or after (since) / before (until): "
                                "epoch ms or ISO 8601",
                                "schema": {
                                    "type": "string",
                                    "pattern": r"^(|[0-9]{1,15}|[0-9]{4}-[0-9]{2}-[0-9]{2}"
                                    r"([T ][0-9:.]+([+-][0-9]{2}:[0-9]{2}|Z)?)?)$",
                                },
                            }
                            for n in ("since", "until")
                        ),
                        {
                            "name": "input",
                            "in": "query",
                            "description": "field=value: the input has the field (at any "
                            "depth) with that JSON value",
                            "schema": {"type": "string", "pattern": "^(|[^=]+=.*)$"},
                        },
                    ],
                )
            },
            "/v1/runs/{run_id}": {
                "get": _op(
                    "getRun",
                    "A run, its tokens, its timeouts, the bound that fired and its timeline",
                    "200",
                    parameters=[_path_param("run_id")],
                )
            },
            "/v1/runs/{run_id}/events": {
                "get": _op(
                    "getRunEvents",
                    "A run's events as JSON, or as Server-Sent Events with "
                    "Accept: text/event-stream (resumable with Last-Event-ID); each event is "
                    "its stored row (kind, at_epoch_ms, its fields) with the telemetry record's "
                    "name, epoch_ms, correlation and bound (a problem document, or null)",
                    "200",
                    parameters=[_path_param("run_id")],
                )
            },
            "/v1/runs/{run_id}/cancel": {
                "post": _op(
                    "cancelRun",
                    "Cancel a running run (409 if it has ended)",
                    "200",
                    parameters=[_path_param("run_id")],
                )
            },
            **_operator_paths(),
            "/v1/definitions": {"get": _op("listDefinitions", "The registered definitions", "200")},
            "/v1/definitions/{definition_id}": {
                "put": _op(
                    "putDefinition",
                    "Store a definition version for every host and worker on the store "
                    "(201 new id, 200 new or same version; 422 names the invalid field's path, "
                    "409 when this version is stored with another body)",
                    "201",
                    "200",
                    parameters=[_path_param("definition_id")],
                    requestBody=definition_body,
                )
            },
            "/v1/deferred-operations": {
                "get": _op(
                    "listDeferredOperations",
                    "Deferred operations, newest first, a page at a time (next_cursor)",
                    "200",
                    parameters=[
                        _status_param(DEFERRED_STATUSES),
                        *(
                            {"name": n, "in": "query", "schema": {"type": "string"}}
                            for n in ("module", "cursor")
                        ),
                    ],
                )
            },
            "/v1/deferred-operations/{op_id}": {
                "get": _op(
                    "getDeferredOperation",
                    "A deferred operation (states, instants, digests) and its status history",
                    "200",
                    parameters=[_path_param("op_id")],
                )
            },
            "/v1/deferred-operations/{op_id}/status": {
                "get": _surface(
                    _op(
                        "getDeferredStatus",
                        "The operation's deferred-operation-status.v1 document (410 once gone)",
                        "200",
                        "410",
                        parameters=[_path_param("op_id")],
                    )
                )
            },
            "/v1/deferred-operations/{op_id}/poll": {
                "post": _op(
                    "pollDeferredOperation",
                    "Poll the operation now through the host's connector, within the poller's "
                    "rate cap (409 if it has ended or no connector serves its module)",
                    "200",
                    parameters=[_path_param("op_id")],
                )
            },
            "/v1/deferred-operations/{op_id}/cancel": {
                "post": _surface(
                    _op(
                        "cancelDeferredOperation",
                        "Cancel the operation (asks its connector; 409 if not cancelable)",
                        "200",
                        parameters=[_path_param("op_id")],
                    )
                )
            },
            "/metrics": {"get": _op("metrics", "Prometheus metrics", "200", security=[])},
            "/healthz": {"get": _op("healthz", "The process answers", "200", security=[])},
            "/readyz": {
                "get": _op("readyz", "The store is reachable (503 if not)", "200", security=[])
            },
        },
    }
