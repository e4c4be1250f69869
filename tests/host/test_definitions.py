"""Definitions are stored: ``PUT /v1/definitions/{id}`` writes a version to the store, which
outlives a restart, is seen by every host on a shared PostgreSQL store, and never changes body
(a run keeps the version it started with). Real ``timebound serve`` processes throughout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .conftest import QUICK, ROOT, Server, launch, stop

# Version 2 of "quick" has one node: a run of it ends with state {"a": ...} only.
QUICK_V2 = {**QUICK, "version": 2, "nodes": QUICK["nodes"][:1], "transitions": []}


def _listed(server: Server) -> dict[str, int]:
    found = server.client.get("/v1/definitions").json()["definitions"]
    return {d["id"]: d["version"] for d in found}


def test_a_put_definition_survives_a_restart(tmp_path: Path) -> None:
    """A definition PUT on one host process is listed and runnable by the next one."""
    server = launch(tmp_path)
    try:
        r = server.client.put("/v1/definitions/copy", json={**QUICK, "id": "copy"})
        assert r.status_code == 201
        assert r.json()["version"] == 1 and r.json()["latest_version"] == 1
    finally:
        stop(server)
    server = launch(tmp_path)
    try:
        assert _listed(server)["copy"] == 1
        assert server.wait_run(server.start("copy", {}))["run"]["status"] == "completed"
    finally:
        stop(server)


def test_a_run_keeps_the_version_it_started_with(tmp_path: Path) -> None:
    """A run started on version 1 ends as version 1 did, though version 2 (one node) was PUT
    while it ran; runs started afterwards take version 2."""
    server = launch(tmp_path)
    try:
        old = server.start("quick", {"sleep_s": 0.5})
        assert server.client.put("/v1/definitions/quick", json=QUICK_V2).status_code == 200
        new = server.start("quick", {})
        old_run = server.wait_run(old)["run"]
        new_run = server.wait_run(new)["run"]
        assert _listed(server)["quick"] == 2
    finally:
        stop(server)
    assert (old_run["definition_version"], old_run["state"]) == (1, {"a": "ok", "b": "ok"})
    assert (new_run["definition_version"], new_run["state"]) == (2, {"a": "ok"})


def test_a_new_body_under_a_stored_version_is_a_conflict(host: Server) -> None:
    """PUT of another body as an existing version is a 409 problem naming `version`; the same
    body again is accepted (200), and nothing changed."""
    body = {**QUICK, "id": "fixed"}
    assert host.client.put("/v1/definitions/fixed", json=body).status_code == 201
    changed = {**body, "nodes": QUICK["nodes"][:1], "transitions": []}
    r = host.client.put("/v1/definitions/fixed", json=changed)
    assert r.status_code == 409
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["path"] == "version"
    assert "already" in problem["detail"] and "higher version" in problem["detail"]
    assert host.client.put("/v1/definitions/fixed", json=body).status_code == 200
    detail = host.wait_run(host.start("fixed", {}))
    assert detail["run"]["state"] == {"a": "ok", "b": "ok"}


def test_an_unknown_handler_is_refused_naming_the_path(host: Server) -> None:
    """A definition naming a handler this host does not have is a 422 naming the field."""
    body: dict[str, Any] = json.loads(json.dumps({**QUICK, "id": "nohandler"}))
    body["actions"][0]["implementation"]["handler"] = "missing"
    r = host.client.put("/v1/definitions/nohandler", json=body)
    assert r.status_code == 422
    assert r.json()["path"] == "actions[0].implementation.handler"
    assert "nohandler" not in _listed(host)


def test_files_and_stored_versions_the_highest_wins(tmp_path: Path) -> None:
    """After a PUT of version 2, a restart with the version-1 file keeps serving version 2; a
    file whose version is stored with another body stops the start (exit 2, naming it)."""
    server = launch(tmp_path)
    try:
        assert server.client.put("/v1/definitions/quick", json=QUICK_V2).status_code == 200
    finally:
        stop(server)
    server = launch(tmp_path)  # writes the version-1 quick.json again
    try:
        assert _listed(server)["quick"] == 2
        assert server.wait_run(server.start("quick", {}))["run"]["state"] == {"a": "ok"}
    finally:
        stop(server)
    flows = tmp_path / "other-flows"
    flows.mkdir()
    (flows / "quick.json").write_text(json.dumps({**QUICK_V2, "timeout_ms": 5_000}))
    done = subprocess.run(
        [sys.executable, "-m", "timebound", "serve", "--port", "0",
         "--db", f"sqlite:///{tmp_path}/host.db", "--actions", "tests.host.host_actions",
         "--workflows", str(flows)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "workflows: 'quick': version: definition 'quick' version 2 is already stored" in (
        done.stderr
    )


@pytest.mark.postgres
def test_hosts_on_one_postgres_store_see_each_others_definitions(
    tmp_path: Path, pg_url: str
) -> None:
    """A definition PUT on host A is listed by host B, whose run of it completes; B then sees
    A's next version too."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    first = launch(tmp_path / "a", "--db", pg_url)
    second = launch(tmp_path / "b", "--db", pg_url)
    try:
        body = {**QUICK, "id": "shared"}
        assert first.client.put("/v1/definitions/shared", json=body).status_code == 201
        assert _listed(second)["shared"] == 1
        detail = second.wait_run(second.start("shared", {}))
        assert detail["run"]["state"] == {"a": "ok", "b": "ok"}
        v2 = {**QUICK_V2, "id": "shared"}
        assert first.client.put("/v1/definitions/shared", json=v2).status_code == 200
        detail = second.wait_run(second.start("shared", {}))
        assert (detail["run"]["definition_version"], detail["run"]["state"]) == (2, {"a": "ok"})
    finally:
        stop(first)
        stop(second)
