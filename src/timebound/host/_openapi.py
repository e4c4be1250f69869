"""The OpenAPI 3.1 document served at ``/openapi.json``, written out so it says exactly what the
routes do (generated schemas would not know the problem documents or the SSE variant)."""

from __future__ import annotations

from typing import Any

from .._version import __version__

__all__ = ["openapi"]

_DESCRIBED = {"200": "OK", "201": "Created", "410": "Gone: the operation's record has expired"}
_PROBLEM = {"$ref": "#/components/responses/Problem"}
_ERRORS = {
    "400": _PROBLEM,
    "401": _PROBLEM,
    "404": _PROBLEM,
    "409": _PROBLEM,
    "413": _PROBLEM,
    "415": _PROBLEM,
    "422": _PROBLEM,
}


def _op(summary: str, ok: str, *also: str, **more: Any) -> dict[str, Any]:
    """An operation answering ``ok`` (and the codes in ``also``) or a problem document."""
    answers: dict[str, Any] = {code: {"description": _DESCRIBED[code]} for code in (ok, *also)}
    return {"summary": summary, "responses": {**answers, **_ERRORS}, **more}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def openapi() -> dict[str, Any]:
    json_body = {
        "required": True,
        "content": {"application/json": {"schema": {"type": "object"}}},
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
                }
            },
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/workflows/{definition_id}/runs": {
                "post": _op(
                    "Start a run: body {input, deadline_ms?, idempotency_key?, run_id?} (or an "
                    "Idempotency-Key header); answers 201 {run_id}, the same run for a repeat "
                    "of the same key and body, 409 for another body under that key",
                    "201",
                    parameters=[
                        _path_param("definition_id"),
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "minLength": 1, "maxLength": 200},
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
                                        "deadline_ms": {"type": "integer", "minimum": 1},
                                        "idempotency_key": {
                                            "type": "string",
                                            "minLength": 1,
                                            "maxLength": 200,
                                        },
                                        "run_id": {
                                            "type": "string",
                                            "minLength": 1,
                                            "maxLength": 200,
                                        },
                                    },
                                }
                            }
                        },
                    },
                )
            },
            "/v1/runs": {
                "get": _op(
                    "Runs, newest first, a page at a time (next_cursor)",
                    "200",
                    parameters=[
                        {"name": n, "in": "query", "schema": {"type": "string"}}
                        for n in ("status", "definition", "cursor")
                    ],
                )
            },
            "/v1/runs/{run_id}": {
                "get": _op(
                    "A run, its tokens, its timeouts, the bound that fired and its timeline",
                    "200",
                    parameters=[_path_param("run_id")],
                )
            },
            "/v1/runs/{run_id}/events": {
                "get": _op(
                    "A run's events as JSON, or as Server-Sent Events with "
                    "Accept: text/event-stream (resumable with Last-Event-ID)",
                    "200",
                    parameters=[_path_param("run_id")],
                )
            },
            "/v1/runs/{run_id}/cancel": {
                "post": _op(
                    "Cancel a running run (409 if it has ended)",
                    "200",
                    parameters=[_path_param("run_id")],
                )
            },
            "/v1/definitions": {"get": _op("The registered definitions", "200")},
            "/v1/definitions/{definition_id}": {
                "put": _op(
                    "Store a definition version for every host and worker on the store "
                    "(201 new id, 200 new or same version; 422 names the invalid field's path, "
                    "409 when this version is stored with another body)",
                    "201",
                    "200",
                    parameters=[_path_param("definition_id")],
                    requestBody=json_body,
                )
            },
            "/v1/deferred-operations": {
                "get": _op(
                    "Deferred operations, newest first, a page at a time (next_cursor)",
                    "200",
                    parameters=[
                        {"name": n, "in": "query", "schema": {"type": "string"}}
                        for n in ("status", "module", "cursor")
                    ],
                )
            },
            "/v1/deferred-operations/{op_id}": {
                "get": _op(
                    "A deferred operation (states, instants, digests) and its status history",
                    "200",
                    parameters=[_path_param("op_id")],
                )
            },
            "/v1/deferred-operations/{op_id}/status": {
                "get": _op(
                    "The operation's deferred-operation-status.v1 document (410 once gone)",
                    "200",
                    "410",
                    parameters=[_path_param("op_id")],
                )
            },
            "/v1/deferred-operations/{op_id}/poll": {
                "post": _op(
                    "Poll the operation now through the host's connector, within the poller's "
                    "rate cap (409 if it has ended or no connector serves its module)",
                    "200",
                    parameters=[_path_param("op_id")],
                )
            },
            "/v1/deferred-operations/{op_id}/cancel": {
                "post": _op(
                    "Cancel the operation (asks its connector; 409 if not cancelable)",
                    "200",
                    parameters=[_path_param("op_id")],
                )
            },
            "/metrics": {"get": _op("Prometheus metrics", "200", security=[])},
            "/healthz": {"get": _op("The process answers", "200", security=[])},
            "/readyz": {"get": _op("The store is reachable (503 if not)", "200", security=[])},
        },
    }
