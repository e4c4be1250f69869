"""The wire contract: both schemas, checked with format checks on, errors name path and rule."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from timebound.deferred import SchemaError, validate_operation, validate_status

from .conftest import operation_doc, status_doc


def _op_error(**changes: Any) -> SchemaError:
    doc = operation_doc()
    for key, value in changes.items():
        key = key.replace("__", "/")
        if value is _DROP:
            doc.pop(key)
        else:
            doc[key] = value
    with pytest.raises(SchemaError) as info:
        validate_operation(doc)
    return info.value


_DROP = object()


def test_a_valid_operation_passes() -> None:
    """A complete deferred-operation.v1 document is returned unchanged."""
    doc = operation_doc()
    assert validate_operation(doc) is doc


def test_both_cancel_surfaces_are_refused() -> None:
    """cancel_href and cancel/unavailable-reason together break the exactly-one rule."""
    err = _op_error(**{"cancel/unavailable-reason": "no"})
    assert (err.path, err.rule) == ("$", "oneOf")


def test_no_cancel_surface_is_refused() -> None:
    """Without either cancel surface the document is invalid."""
    err = _op_error(cancel_href=_DROP)
    assert (err.path, err.rule) == ("$", "oneOf")


def test_operation_id_pattern() -> None:
    """An operation/id not shaped deferred:<kind>:<token> names its path and the pattern rule."""
    err = _op_error(**{"operation/id": "job-1"})
    assert (err.path, err.rule) == ("$['operation/id']", "pattern")


def test_kind_segment_must_equal_kind() -> None:
    """The kind segment of operation/id must be operation/kind."""
    err = _op_error(**{"operation/id": "deferred:other.kind:x1"})
    assert (err.path, err.rule) == ("$['operation/id']", "kind-segment")


@pytest.mark.parametrize("value", [0, 3601, 1.5, "5", True, None])
def test_retry_after_is_left_to_the_policy(value: object) -> None:
    """retry_after_seconds is a hint the host policy judges (D7.8), not the schema: any value
    passes validation (tests/deferred/test_invalid_hint.py shows what the registry does)."""
    validate_operation(operation_doc(**{"retry_after_seconds": value}))


def test_expires_at_after_created_at() -> None:
    """An expires_at not after created_at is refused with its own rule."""
    doc = operation_doc()
    doc["expires_at"] = doc["created_at"]
    with pytest.raises(SchemaError) as info:
        validate_operation(doc)
    assert (info.value.path, info.value.rule) == ("$.expires_at", "after-created_at")


@pytest.mark.parametrize(
    "stamp", ["2026-05-05T18:00:00+00:00", "2026-05-05 18:00:00Z", "2026-13-05T18:00:00Z"]
)
def test_timestamps_are_rfc3339_utc_with_z(stamp: str) -> None:
    """An offset, a space or an impossible month is refused on the timestamp's path."""
    err = _op_error(created_at=stamp)
    assert err.path == "$.created_at"
    assert err.rule in ("pattern", "format")


def test_root_is_closed() -> None:
    """An unknown root property is refused (extensions is the place for it)."""
    err = _op_error(owner="x")
    assert (err.path, err.rule) == ("$", "additionalProperties")


def test_diagnostics_items_are_closed() -> None:
    """A diagnostics item carries no free-form payload."""
    err = _op_error(diagnostics=[{"code": "x", "severity": "info", "payload": "raw"}])
    assert (err.path, err.rule) == ("$.diagnostics[0]", "additionalProperties")


def test_a_non_object_names_the_root() -> None:
    """A list instead of an object is refused at $."""
    with pytest.raises(SchemaError) as info:
        validate_operation([1, 2])
    assert (info.value.path, info.value.rule) == ("$", "type")


def test_schema_error_is_a_value_error_and_pickles() -> None:
    """SchemaError is a ValueError and survives pickling with its path and rule."""
    err = _op_error(**{"operation/id": "job-1"})
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, ValueError)
    assert (again.path, again.rule, str(again)) == (err.path, err.rule, str(err))


def test_a_hostile_huge_value_gives_a_short_message() -> None:
    """A megabyte-long bad value does not make a megabyte-long error message."""
    err = _op_error(**{"operation/id": "x" * 1_000_000})
    assert len(str(err)) < 1000


def test_a_valid_status_passes() -> None:
    """A pending status document is accepted."""
    doc = status_doc(retry_after_seconds=10, attempt_no=2)
    assert validate_status(doc) is doc


def test_completed_requires_a_result() -> None:
    """completed without result is refused."""
    doc = status_doc(status="pending")
    doc["status"] = "completed"
    with pytest.raises(SchemaError) as info:
        validate_status(doc)
    assert (info.value.path, info.value.rule) == ("$", "required")


def test_completed_result_is_not_null() -> None:
    """completed with a null result is refused."""
    with pytest.raises(SchemaError) as info:
        validate_status(status_doc(status="completed", result=None))
    assert (info.value.path, info.value.rule) == ("$.result", "not")


@pytest.mark.parametrize("status", ["failed", "timed-out", "cancelled", "expired", "unknown"])
def test_failures_require_an_error(status: str) -> None:
    """Every failing terminal status carries an error object."""
    doc = status_doc(status=status)
    del doc["error"]
    with pytest.raises(SchemaError) as info:
        validate_status(doc)
    assert info.value.rule == "required"


def test_error_is_closed() -> None:
    """The error object is closed {code, message, retryable}."""
    bad = {"code": "x", "message": "m", "retryable": False, "trace": "..."}
    with pytest.raises(SchemaError) as info:
        validate_status(status_doc(status="failed", error=bad))
    assert (info.value.path, info.value.rule) == ("$.error", "additionalProperties")


def test_unknown_status_value() -> None:
    """A status outside the eight is refused with the enum rule."""
    with pytest.raises(SchemaError) as info:
        validate_status(status_doc(status="done"))
    assert (info.value.path, info.value.rule) == ("$.status", "enum")


@pytest.mark.parametrize(
    ("result", "path", "says"),
    [
        ({"tags": {"a", "b"}}, "$.result.tags", "set"),
        ({"rows": [1, (2, 3)]}, "$.result.rows[1]", "tuple"),
        ({"score": float("nan")}, "$.result.score", "nan is not a JSON number"),
        ({"score": float("inf")}, "$.result.score", "inf is not a JSON number"),
        ({"by id": {7: "x"}}, "$.result['by id']", "key 7 is not a string"),
        ({"blob": b"\x00"}, "$.result.blob", "bytes"),
    ],
)
def test_a_value_json_cannot_carry_is_a_schema_error(result: Any, path: str, says: str) -> None:
    """An in-process connector's document holding a set, a tuple, bytes, a NaN, a non-string
    key: jsonschema passes them where any value is allowed, and the digest could not be made
    afterwards. The check names the path."""
    with pytest.raises(SchemaError) as info:
        validate_status(status_doc(status="completed", result=result))
    assert (info.value.path, info.value.rule) == (path, "json")
    assert says in str(info.value)


def test_a_document_that_contains_itself_is_a_schema_error() -> None:
    """A cycle is no finite JSON document: refused, not a RecursionError."""
    result: dict[str, Any] = {}
    result["self"] = result
    with pytest.raises(SchemaError) as info:
        validate_operation(operation_doc(extra=result))
    assert (info.value.path, info.value.rule) == ("$.extra.self", "json")
