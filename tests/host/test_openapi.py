"""The OpenAPI document: valid OpenAPI 3.1, and listing every ``/v1/`` route the app serves with
its methods, read from the app itself so the two cannot drift apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate
from starlette.routing import Route

from timebound.host import Host, create_app, load_config
from timebound.host._openapi import openapi

from .conftest import Server

# Methods a route answers without saying so: Starlette adds HEAD to every GET.
_IMPLIED = {"HEAD"}


def _served(tmp_path: Path) -> dict[str, set[str]]:
    app: Any = create_app(Host.build(load_config({"db": f"sqlite:///{tmp_path}/h.db"})))
    served: dict[str, set[str]] = {}
    for route in app.routes:
        if isinstance(route, Route) and route.path.startswith("/v1/"):
            served.setdefault(route.path, set()).update(route.methods or set())
    return served


def test_the_document_is_valid_openapi() -> None:
    """The document passes the OpenAPI 3.1 validator (structure, references, parameters)."""
    validate(openapi())


def test_every_v1_route_is_documented_with_its_methods(tmp_path: Path) -> None:
    """Each /v1/ route of the app appears in the document with exactly the methods it answers,
    and the document names no /v1/ route the app does not serve."""
    served = _served(tmp_path)
    assert "/v1/deferred-operations/{op_id}/poll" in served  # the walk found the routes
    documented = {
        path: {method.upper() for method in operations}
        for path, operations in openapi()["paths"].items()
        if path.startswith("/v1/")
    }
    assert documented == {path: methods - _IMPLIED for path, methods in served.items()}


def test_path_parameters_match_the_route_templates() -> None:
    """Every {name} in a documented path is declared as a required path parameter."""
    for path, operations in openapi()["paths"].items():
        names = {part[1:-1] for part in path.split("/") if part.startswith("{")}
        for method, operation in operations.items():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == names, f"{method.upper()} {path}"


@pytest.mark.asyncio_real
async def test_the_served_document_is_the_validated_one(tmp_path: Path) -> None:
    """/openapi.json answers the same document the validator checked."""
    app: Any = create_app(Host.build(load_config({"db": f"sqlite:///{tmp_path}/h.db"})))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        served = (await client.get("/openapi.json")).json()
    assert served == openapi()


def _operation(path: str, method: str) -> dict[str, Any]:
    operation: dict[str, Any] = openapi()["paths"][path][method]
    return operation


def test_the_document_is_as_strict_as_the_api() -> None:
    """The status filters are enums of the statuses the API takes (or empty for any), a start's
    deadline_ms is an integer (or null) in the range the API takes, and a definition's body
    requires its id (D8.8)."""
    from timebound.host._api import _RUN_STATUSES, MAX_DEADLINE_MS
    from timebound.host._deferred import DEFERRED_STATUSES

    for path, statuses in (
        ("/v1/runs", _RUN_STATUSES),
        ("/v1/deferred-operations", DEFERRED_STATUSES),
    ):
        (status,) = [p for p in _operation(path, "get")["parameters"] if p["name"] == "status"]
        assert status["schema"]["enum"] == ["", *statuses]
    start = _operation("/v1/workflows/{definition_id}/runs", "post")
    body = start["requestBody"]["content"]["application/json"]["schema"]
    deadline = body["properties"]["deadline_ms"]
    assert (deadline["type"], deadline["minimum"], deadline["maximum"]) == (
        ["integer", "null"],
        1,
        MAX_DEADLINE_MS,
    )
    put = _operation("/v1/definitions/{definition_id}", "put")
    assert "id" in put["requestBody"]["content"]["application/json"]["schema"]["required"]


@pytest.mark.parametrize(
    ("deadline_ms", "status"),
    [(250.0, 201), (None, 201), (315_360_000_000, 201), (315_360_000_001, 422), (250.5, 422)],
)
def test_deadline_ms_is_what_the_document_says(
    host: Server, deadline_ms: object, status: int
) -> None:
    """An integral JSON number is an integer (as JSON Schema says), null is no deadline, and
    past ten years is refused with the range named."""
    r = host.client.post("/v1/workflows/quick/runs", json={"input": {}, "deadline_ms": deadline_ms})
    assert r.status_code == status, r.text
    if status == 422:
        assert r.json()["detail"] == (
            "deadline_ms: expected an integer of milliseconds in [1, 315360000000]"
        )
