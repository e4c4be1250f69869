"""Bad and hostile input: every error is an RFC 9457 problem naming what was wrong (D8.2)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from timebound.workflow._definition import MAX_DEFINITION_BYTES

from .conftest import Server

JSON = {"content-type": "application/json"}


def _problem(r: object, status: int) -> dict[str, object]:
    import httpx

    assert isinstance(r, httpx.Response)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = r.json()
    assert body["status"] == status
    assert "Traceback" not in r.text
    return body


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"input": ', "malformed JSON: Expecting value at line 1 column 11"),
        (b"\xff\xfe{}", "the body is not UTF-8"),
        (b'{"input": NaN}', "malformed JSON: NaN is not JSON"),
        (b"{}{}", "malformed JSON: Extra data at line 1 column 3"),
    ],
)
def test_malformed_json_is_a_400_problem(host: Server, body: bytes, detail: str) -> None:
    """Broken JSON is answered 400 with where it broke."""
    r = host.client.post("/v1/workflows/quick/runs", content=body, headers=JSON)
    assert str(_problem(r, 400)["detail"]).startswith(detail)


def test_unknown_field_is_named(host: Server) -> None:
    """An unknown field in a start request is a 422 naming the field and the allowed ones."""
    r = host.client.post("/v1/workflows/quick/runs", json={"input": {}, "priority": 9})
    detail = _problem(r, 422)["detail"]
    assert detail == (
        "body: unknown field(s) ['priority']; allowed: "
        "['deadline_ms', 'idempotency_key', 'input', 'run_id']"
    )


def test_body_that_is_not_an_object_is_refused(host: Server) -> None:
    """A JSON array where an object belongs is a 422."""
    r = host.client.post("/v1/workflows/quick/runs", json=[1, 2])
    assert _problem(r, 422)["detail"] == "body: expected a JSON object"


@pytest.mark.parametrize("value", [0, -1, 1.5, "100", True])
def test_bad_deadline_ms_is_refused(host: Server, value: object) -> None:
    """deadline_ms must be a positive integer."""
    r = host.client.post("/v1/workflows/quick/runs", json={"deadline_ms": value})
    assert "deadline_ms" in str(_problem(r, 422)["detail"])


def test_oversized_body_is_413_even_without_content_length(host: Server) -> None:
    """A chunked body past the limit (1 MiB by default) is refused while reading it."""

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"input": "'
        for _ in range(2048):
            yield b"x" * 1024
        yield b'"}'

    r = host.client.post("/v1/workflows/quick/runs", content=chunks(), headers=JSON)
    assert "1048576 bytes" in str(_problem(r, 413)["detail"])


def test_declared_oversized_body_is_413(host: Server) -> None:
    """A Content-Length past the limit is refused before reading."""
    r = host.client.post(
        "/v1/workflows/quick/runs", content=b"{" + b" " * 1_048_577 + b"}", headers=JSON
    )
    _problem(r, 413)


def test_wrong_media_type_is_415(host: Server) -> None:
    """A form body where JSON belongs is a 415."""
    r = host.client.post(
        "/v1/workflows/quick/runs",
        content=b"a=1",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert "application/json" in str(_problem(r, 415)["detail"])


@pytest.mark.parametrize(
    ("method", "path", "status", "detail"),
    [
        ("GET", "/v1/runs/does-not-exist", 404, "no run 'does-not-exist'"),
        ("GET", "/v1/runs/does-not-exist/events", 404, "no run 'does-not-exist'"),
        ("POST", "/v1/runs/does-not-exist/cancel", 404, "no run 'does-not-exist'"),
        ("GET", "/v1/nowhere", 404, "no such route"),
        ("DELETE", "/v1/runs", 405, "method DELETE is not allowed here"),
        ("GET", "/v1/runs?cursor=%%%", 400, "cursor: not a cursor this host gave out"),
        ("GET", "/v1/runs?cursor=WzEsMl0", 400, "cursor: not a cursor this host gave out"),
        ("GET", "/v1/runs?status=sleeping", 400, "status: 'sleeping' is not one of"),
        ("GET", "/v1/runs?limit=5", 400, "unknown query parameter(s) ['limit']"),
    ],
)
def test_unknown_ids_routes_and_parameters_are_problems(
    host: Server, method: str, path: str, status: int, detail: str
) -> None:
    """Unknown ids, routes, methods, cursors and parameters are 4xx problems naming them."""
    r = host.client.request(method, path)
    assert str(_problem(r, status)["detail"]).startswith(detail)


def test_start_of_unknown_definition_is_404(host: Server) -> None:
    """Starting a run of a definition nobody registered names it."""
    r = host.client.post("/v1/workflows/ghost/runs", json={"input": None})
    assert _problem(r, 404)["detail"] == "no definition 'ghost'"


def test_host_still_answers_after_hostile_requests(host: Server) -> None:
    """After deeply nested and binary bodies the process is alive and healthy."""
    for body in (b"[" * 200_000, b"\x00" * 1000, b'{"input": {"a": ' * 5000):
        host.client.post("/v1/workflows/quick/runs", content=body, headers=JSON)
    assert host.client.get("/healthz").status_code == 200
    assert host.proc.poll() is None


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize(("depth", "status"), [(64, 201), (65, 422), (600, 422), (5_000, 422)])
def test_run_input_nesting_is_bounded(host: Server, depth: int, status: int) -> None:
    """A run's input may nest 64 deep; past that the start is a 422 too-deep naming the path
    (at ~600 deep it was accepted and stopped every run of the engine)."""
    body = b'{"input": ' + _nested(depth) + b"}"
    r = host.client.post("/v1/workflows/quick/runs", content=body, headers=JSON)
    if status == 201:
        assert r.status_code == 201, r.text
        return
    problem = _problem(r, 422)
    assert problem["code"] == "too-deep"
    assert problem["path"] == "$.input" + "[0]" * 64


def test_a_huge_definition_is_refused_without_echoing_it(host: Server) -> None:
    """A PUT of 10,001 nodes is a 422 definition-too-large whose problem document stays small
    (it echoed the whole array, 349 KB)."""
    nodes = [{"id": f"n{i}", "action_id": "a"} for i in range(10_001)]
    body = {"id": "huge", "initial_node": "n0", "actions": [], "nodes": nodes}
    r = host.client.put("/v1/definitions/huge", json=body)
    problem = _problem(r, 422)
    assert problem["code"] == "definition-too-large" and problem["path"] == "nodes"
    assert len(r.content) < 2_000


def test_a_schema_error_on_a_huge_value_is_not_echoed(host: Server) -> None:
    """A validation message quoting a huge value is cut: the problem document stays small."""
    body = {"id": "huge", "initial_node": "n0", "actions": "x" * 500_000, "nodes": []}
    r = host.client.put("/v1/definitions/huge", json=body)
    _problem(r, 422)
    assert len(r.content) < 3_000


def _padded_definition(size: int, definition_id: str) -> bytes:
    """A valid definition (QUICK under another id), padded with JSON whitespace to ``size``."""
    from .conftest import QUICK

    text = json.dumps({**QUICK, "id": definition_id}).encode()
    return text + b" " * (size - len(text))


def test_a_definition_body_up_to_its_byte_limit_is_read(host: Server) -> None:
    """A definition body of exactly the definition byte limit is parsed and stored (D6.23)."""
    body = _padded_definition(MAX_DEFINITION_BYTES, "padded")
    r = host.client.put("/v1/definitions/padded", content=body, headers=JSON)
    assert r.status_code == 201, r.text


def test_a_definition_body_past_its_byte_limit_is_refused_unparsed(host: Server) -> None:
    """One byte past the definition byte limit (under the host's body limit) is a 413
    definition-too-large, declared or counted while reading; it was parsed (~30 ms of the loop
    per MB) and refused by its node count only after."""
    body = _padded_definition(MAX_DEFINITION_BYTES + 1, "oversize")
    declared = host.client.put("/v1/definitions/oversize", content=body, headers=JSON)
    problem = _problem(declared, 413)
    assert problem["code"] == "definition-too-large"
    assert str(MAX_DEFINITION_BYTES) in str(problem["detail"])

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted while read
        for i in range(0, len(body), 64 * 1024):
            yield body[i : i + 64 * 1024]

    streamed = host.client.put("/v1/definitions/oversize", content=chunks(), headers=JSON)
    assert _problem(streamed, 413)["code"] == "definition-too-large"
    stored = host.client.get("/v1/definitions").json()["definitions"]
    assert "oversize" not in {d["id"] for d in stored}
