"""The compiled quick check never disagrees with the full jsonschema validation.

The quick check may leave a document undecided (``None``), but when it decides, ``True`` must be
a document jsonschema accepts and ``False`` one it rejects; and ``validate_status`` /
``validate_operation`` (quick path first) must reject exactly what the full schema rejects.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from timebound.deferred import SchemaError, validate_operation, validate_status
from timebound.deferred._contract import (
    OPERATION_SCHEMA,
    STATUS_SCHEMA,
    _quick,
    _validator,
)
from timebound.deferred._quickcheck import compile_quick

from .conftest import operation_doc, status_doc

# Values chosen to sit on and beside every rule of the two schemas.
_ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    1.0,
    2.5,
    3600,
    3601,
    "",
    "x",
    "x" * 65,
    "x" * 1025,
    "deferred:report.render:op1",
    "deferred:report.render:op1\n",
    "deferred:Report:op1",
    "report.render",
    "report.render\n",
    "Report",
    "2026-05-05T18:00:00Z",
    "2026-05-05T18:00:00.123456789Z",
    "2026-05-05T18:00:00Z\n",
    "2026-02-30T18:00:00Z",
    "2026-13-05T18:00:00Z",
    "2026-05-05T24:00:00Z",
    "0000-01-01T00:00:00Z",
    "2026-05-05 18:00:00Z",
    "pending",
    "running",
    "completed",
    "failed",
    "expired",
    "unknown",
    "deferred",
    "deferred-operation.v1",
    "deferred-operation-status.v1",
    "info",
    "fatal",
    "bad-code",
    "Bad_Code",
    [],
    [1],
    (),
    {},
    {"code": "x", "message": "m", "retryable": False},
    {"code": "x", "message": "m", "retryable": 0},
    {"code": "X", "message": "m", "retryable": True},
    {"code": "x", "message": "m"},
    {"code": "x", "message": "m", "retryable": False, "extra": 1},
    [{"code": "x", "severity": "info"}],
    [{"code": "x", "severity": "info", "message": "m", "ref": "r"}],
    [{"code": "x", "severity": "loud"}],
    [{"code": "x"}],
    [{"code": "x", "severity": "info"}] * 65,
    [{"code": "x" * 65, "severity": "info"}],
    [{"code": "x", "severity": "info", "message": "m" * 1025}],
    [{"code": "x", "severity": "info", "ref": "r" * 513}],
    {"code": "x" * 65, "message": "m", "retryable": False},
    {"code": "x", "message": "m" * 1025, "retryable": False},
    "deferred:report.render:" + "a" * 490,
    "deferred:report.render:" + "a" * 489,
    "a" * 256,
    "a" * 257,
    "x" * 512,
    "x" * 513,
    "x" * 2048,
    "x" * 2049,
]

_STATUS_KEYS = [
    "schema",
    "schema/v",
    "operation/id",
    "operation/kind",
    "status",
    "retry_after_seconds",
    "expires_at",
    "updated_at",
    "attempt_no",
    "causal/context",
    "result",
    "error",
    "diagnostics",
    "extensions",
    "unknown-key",
]
_OPERATION_KEYS = [
    "schema",
    "schema/v",
    "status",
    "operation/id",
    "operation/kind",
    "retry_after_seconds",
    "created_at",
    "expires_at",
    "status_href",
    "cancel_href",
    "cancel/unavailable-reason",
    "correlation/id",
    "causal/context",
    "audit/outcome-ref",
    "continuation",
    "diagnostics",
    "extensions",
    1,
]


def _mutated(base: dict[str, Any], keys: list[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A valid document with a few keys replaced by odd values or dropped."""
    change = st.tuples(st.sampled_from(keys), st.sampled_from([*_ODD_VALUES, _DROP]))

    def apply(changes: list[tuple[Any, Any]]) -> dict[str, Any]:
        doc = copy.deepcopy(base)
        for key, value in changes:
            if value is _DROP:
                doc.pop(key, None)
            else:
                doc[key] = copy.deepcopy(value)
        return doc

    return st.lists(change, max_size=3).map(apply)


_DROP = object()

_STATUS_BASES = [
    status_doc(),
    status_doc(status="running", retry_after_seconds=5, attempt_no=2),
    status_doc(status="completed", result={"pages": 3}, updated_at="2026-05-05T18:00:00Z"),
    status_doc(status="failed", diagnostics=[{"code": "x", "severity": "info"}]),
    status_doc(status="unknown", extensions={}, **{"causal/context": {}}),
]
_OPERATION_BASES = [
    operation_doc(created_ms=1_777_000_000_000),
    {
        **{
            k: v
            for k, v in operation_doc(created_ms=1_777_000_000_000).items()
            if k != "cancel_href"
        },
        "cancel/unavailable-reason": "printing",
    },
]


def _full_valid(name: str, doc: object) -> bool:
    return _validator(name).is_valid(doc)


def _agrees(name: str, doc: dict[str, Any]) -> None:
    verdict = _quick(name)(doc)
    full = _full_valid(name, doc)
    if verdict is not None:
        assert verdict is full, (verdict, full, doc)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_STATUS_BASES).flatmap(lambda b: _mutated(b, _STATUS_KEYS)))
def test_quick_status_check_agrees_with_jsonschema(doc: dict[str, Any]) -> None:
    """On status documents near and far from valid, a decided quick answer is jsonschema's."""
    _agrees(STATUS_SCHEMA, doc)
    _same_rejection(validate_status, STATUS_SCHEMA, doc)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_OPERATION_BASES).flatmap(lambda b: _mutated(b, _OPERATION_KEYS)))
def test_quick_operation_check_agrees_with_jsonschema(doc: dict[str, Any]) -> None:
    """The same for deferred-operation.v1, including its exactly-one cancel surface."""
    _agrees(OPERATION_SCHEMA, doc)
    _same_rejection(validate_operation, OPERATION_SCHEMA, doc)


@pytest.mark.parametrize(
    ("name", "bases", "keys"),
    [
        (STATUS_SCHEMA, _STATUS_BASES, _STATUS_KEYS),
        (OPERATION_SCHEMA, _OPERATION_BASES, _OPERATION_KEYS),
    ],
    ids=["status", "operation"],
)
def test_every_single_change_is_judged_like_jsonschema(
    name: str, bases: list[dict[str, Any]], keys: list[Any]
) -> None:
    """Exhaustively: each base document with one key dropped or set to each odd value."""
    decided = {True: 0, False: 0}
    for base in bases:
        for key in keys:
            for value in [*_ODD_VALUES, _DROP]:
                doc = copy.deepcopy(base)
                if value is _DROP:
                    doc.pop(key, None)
                else:
                    doc[key] = copy.deepcopy(value)
                _agrees(name, doc)
                verdict = _quick(name)(doc)
                if verdict is not None:
                    decided[verdict] += 1
    # The table is not vacuous: it decides both ways, many times.
    assert decided[True] > 20 and decided[False] > 200, decided


def _same_rejection(validate: Any, name: str, doc: dict[str, Any]) -> None:
    """The public validator (quick path first) rejects for the schema exactly when jsonschema
    does (the rules checked after the schema may reject more, with their own rule names). A
    value JSON cannot carry is refused before the schema is asked (rule ``json``, D7.1): a
    tuple that jsonschema would take for an array, whatever else the document holds."""
    try:
        validate(doc)
    except SchemaError as err:
        if err.rule == "json":
            return
        schema_rule = err.rule not in ("kind-segment", "after-created_at")
        assert schema_rule is not _full_valid(name, doc), (err, doc)
    else:
        assert _full_valid(name, doc), doc


@pytest.mark.parametrize("doc", _STATUS_BASES, ids=lambda d: d["status"])
def test_common_status_documents_take_the_quick_path(doc: dict[str, Any]) -> None:
    """The documents a poll usually returns are decided by the quick check alone."""
    assert _quick(STATUS_SCHEMA)(doc) is True


def test_common_operation_documents_take_the_quick_path() -> None:
    for doc in _OPERATION_BASES:
        assert _quick(OPERATION_SCHEMA)(doc) is True


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, True), (1.0, None), (True, False), ("1", False), (None, False)],
)
def test_integers_follow_jsonschema_or_stay_undecided(value: object, expected: object) -> None:
    """A float with an integral value is jsonschema's call; a bool is never an integer."""
    doc = status_doc(attempt_no=value)
    assert _quick(STATUS_SCHEMA)(doc) is expected
    with_float = _full_valid(STATUS_SCHEMA, doc)
    assert with_float is (value in (1, 1.0) and value is not True)


def test_a_timestamp_with_a_trailing_newline_is_refused() -> None:
    """Schema regexes end at the end of the string (ECMA-262), not before a final newline."""
    doc = status_doc(updated_at="2026-05-05T18:00:00Z\n")
    assert _quick(STATUS_SCHEMA)(doc) is False
    with pytest.raises(SchemaError) as info:
        validate_status(doc)
    assert (info.value.path, info.value.rule) == ("$.updated_at", "pattern")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {"^x": {}}},
        {"type": "number"},
        {"$ref": "https://example.invalid/schema"},
        {"enum": [1, 2]},
        {"additionalProperties": {"type": "string"}},
    ],
)
def test_an_unknown_keyword_is_refused_when_compiling(schema: dict[str, Any]) -> None:
    """A schema that grows a keyword the quick check does not know fails loudly, at build time."""
    with pytest.raises(ValueError, match="quick check"):
        compile_quick(schema, format_checker=None)
