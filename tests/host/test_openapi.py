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
