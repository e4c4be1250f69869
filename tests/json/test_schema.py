"""The one JSON-Schema helper: draft, formats, ECMA anchors, the first problem and its path."""

from __future__ import annotations

from typing import Any

import pytest

from timebound._json import SchemaValidator, json_path

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "pattern": "^[a-z]+$"},
        "at": {"type": "string", "format": "date-time"},
        "items": {"type": "array", "items": {"type": "integer"}},
        "odd key": {"type": "string"},
        "choice": {
            "oneOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]},
            ]
        },
        "cond": {
            "type": "object",
            "if": {"properties": {"kind": {"const": "x"}}},
            "then": {"properties": {"size": {"type": "integer"}}},
        },
    },
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def validator() -> SchemaValidator:
    return SchemaValidator(SCHEMA)


def test_a_valid_document_has_no_problem(validator: SchemaValidator) -> None:
    """A document that holds to the schema yields None and is_valid."""
    doc = {"id": "abc", "at": "2026-11-27T12:00:00Z", "items": [1, 2]}
    assert validator.first_problem(doc) is None and validator.is_valid(doc)


def test_dollar_ends_the_string_as_in_ecma_262(validator: SchemaValidator) -> None:
    """Python's "$" would accept a final newline; the helper does not."""
    problem = validator.first_problem({"id": "abc\n"})
    assert problem is not None and (problem.path, problem.rule) == ("$.id", "pattern")


def test_formats_are_checked(validator: SchemaValidator) -> None:
    """format: date-time is enforced, not only annotated."""
    problem = validator.first_problem({"at": "yesterday"})
    assert problem is not None and (problem.path, problem.rule) == ("$.at", "format")


def test_the_first_problem_is_the_first_by_position(validator: SchemaValidator) -> None:
    """Items sort by index (2 before 10), whatever order jsonschema found them in."""
    items: list[Any] = list(range(12))
    items[10] = "ten"
    items[2] = "two"
    problem = validator.first_problem({"items": items})
    assert problem is not None and problem.path == "$.items[2]"


def test_a_conditional_names_the_field_that_broke_it(validator: SchemaValidator) -> None:
    """An if/then failure reports the field inside, not the whole object."""
    problem = validator.first_problem({"cond": {"kind": "x", "size": "big"}})
    assert problem is not None and (problem.path, problem.rule) == ("$.cond.size", "type")


def test_a_rule_about_the_object_itself_stays_on_it(validator: SchemaValidator) -> None:
    """Two oneOf branches holding at once is the object's fault, reported as oneOf."""
    problem = validator.first_problem({"choice": {"a": "x", "b": "y"}})
    assert problem is not None and (problem.path, problem.rule) == ("$.choice", "oneOf")


def test_long_messages_are_shortened(validator: SchemaValidator) -> None:
    """A hostile value is not echoed whole in the message."""
    problem = validator.first_problem({"id": 7, "odd key": "x" * 10_000})
    assert problem is not None and len(problem.message) <= 300
    problem = validator.first_problem({"odd key": ["x" * 10_000]})
    assert problem is not None and len(problem.message) <= 300


def test_a_broken_schema_is_refused_when_built() -> None:
    """The schema itself is checked once, up front."""
    import jsonschema

    with pytest.raises(jsonschema.SchemaError):
        SchemaValidator({"type": "no-such-type"})


@pytest.mark.parametrize(
    ("parts", "root", "expected"),
    [
        ((), "$", "$"),
        (("nodes", 3, "id"), "$", "$.nodes[3].id"),
        (("nodes", 3, "id"), "", "nodes[3].id"),
        (("odd key", 0), "$", "$['odd key'][0]"),
        ((0,), "", "[0]"),
    ],
)
def test_one_path_notation(parts: tuple[str | int, ...], root: str, expected: str) -> None:
    """Members by name (quoted when not identifiers), items by index."""
    assert json_path(parts, root=root) == expected
