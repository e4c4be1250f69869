"""The wire contract: ``deferred-operation.v1`` and ``deferred-operation-status.v1`` (D7.1).

Both schemas are JSON Schema 2020-12 files shipped in this package and checked by ``jsonschema``
with format checks on. Two rules are not expressible in the schema language and are checked here
after it: ``expires_at`` is after ``created_at``, and the kind segment of ``operation/id`` is
``operation/kind``. A compiled quick check of the same schemas (:mod:`._quickcheck`) accepts the
common documents first, so the poller does not pay for the generic validation on every poll.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from .._core._clock import datetime_of_ms, ms_of
from .._core._errors import InvalidInput
from .._json import JSONError, SchemaValidator, TooDeep
from .._json import check as check_json
from ._quickcheck import Quick, compile_quick

__all__ = [
    "OPERATION_SCHEMA",
    "STATUS_SCHEMA",
    "TERMINAL",
    "SchemaError",
    "digest",
    "format_time",
    "parse_time",
    "validate_operation",
    "validate_status",
]

OPERATION_SCHEMA = "deferred-operation.v1"
STATUS_SCHEMA = "deferred-operation-status.v1"
#: Statuses nothing leaves (D7.2).
TERMINAL = frozenset({"completed", "failed", "timed-out", "cancelled", "expired", "unknown"})


class SchemaError(InvalidInput):
    """A document breaks its schema (an :class:`~timebound.InvalidInput`, D2.6). ``path`` is
    the JSON path, ``rule`` the rule it broke."""

    code = "deferred-schema-error"

    def __init__(self, schema: str, path: str, rule: str, message: str) -> None:
        super().__init__(f"{schema}: {path}: {message} (rule: {rule})")
        self.schema = schema
        self.path = path
        self.rule = rule

    @property
    def field(self) -> str | None:
        return self.path

    def __reduce__(self) -> tuple[Any, ...]:
        message = str(self).split(": ", 2)[2].rsplit(" (rule: ", 1)[0]
        return (SchemaError, (self.schema, self.path, self.rule, message))


@cache
def _schema(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(f"schemas/{name}.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


@cache
def _validator(name: str) -> SchemaValidator:
    return SchemaValidator(_schema(name))


@cache
def _quick(name: str) -> Quick:
    # Built once per schema from the same file and format checker as the full validation.
    return compile_quick(_validator(name).schema, _validator(name).format_checker)


def _check(name: str, doc: object) -> None:
    if not isinstance(doc, dict):
        raise SchemaError(
            name, "$", "type", f"a document is a JSON object, not {type(doc).__name__}"
        )
    try:
        # jsonschema would pass a set or a NaN where the schema allows any value (a result),
        # and the digest and the stored text could not be made from it afterwards; a value
        # nested past the limit (D6.20) would make them raise RecursionError.
        check_json(doc, what="the value")
    except TooDeep as exc:
        raise SchemaError(name, exc.path, exc.code, str(exc)) from None
    except JSONError as exc:
        raise SchemaError(name, exc.path, "json", str(exc)) from None
    if _quick(name)(doc) is True:
        return  # the quick check only says True when the full validation accepts (see there)
    problem = _validator(name).first_problem(doc)
    if problem is not None:
        raise SchemaError(name, problem.path, problem.rule, problem.message)


def _short(message: str) -> str:
    # jsonschema quotes the whole offending value; a hostile document may make that huge.
    return message if len(message) <= 300 else message[:297] + "..."


def validate_operation(doc: object) -> dict[str, Any]:
    """Check a ``deferred-operation.v1`` document; return it, or raise :class:`SchemaError`."""
    _check(OPERATION_SCHEMA, doc)
    assert isinstance(doc, dict)
    _same_kind(OPERATION_SCHEMA, doc)
    if parse_time(doc["expires_at"]) <= parse_time(doc["created_at"]):
        raise SchemaError(
            OPERATION_SCHEMA,
            "$.expires_at",
            "after-created_at",
            "expires_at is not after created_at",
        )
    return doc


def validate_status(doc: object) -> dict[str, Any]:
    """Check a ``deferred-operation-status.v1`` document (or raise :class:`SchemaError`)."""
    _check(STATUS_SCHEMA, doc)
    assert isinstance(doc, dict)
    _same_kind(STATUS_SCHEMA, doc)
    return doc


def _same_kind(name: str, doc: dict[str, Any]) -> None:
    kind = doc["operation/id"].split(":")[1]
    if kind != doc["operation/kind"]:
        raise SchemaError(
            name,
            "$['operation/id']",
            "kind-segment",
            f"the kind segment {kind!r} of operation/id is not operation/kind "
            f"{doc['operation/kind']!r}",
        )


def parse_time(text: str) -> int:
    """An RFC 3339 UTC timestamp (already schema-checked) as epoch milliseconds, rounded up."""
    # Fixed positions (the schema's pattern and date-time format were checked): strptime cost
    # 30 µs a call, and registering an operation parses four timestamps.
    whole, _, frac = text[:-1].partition(".")
    if len(whole) != 19:
        raise ValueError(f"not a schema-checked timestamp: {text!r}")
    base = datetime(
        int(whole[0:4]),
        int(whole[5:7]),
        int(whole[8:10]),
        int(whole[11:13]),
        int(whole[14:16]),
        int(whole[17:19]),
        tzinfo=UTC,
    )
    ms = ms_of(base)
    if frac:
        # Rounded up: a stored instant is never earlier than the one on the wire (D1.3).
        nanos = int(frac.ljust(9, "0"))
        ms += -(-nanos // 1_000_000)
    return ms


def format_time(epoch_ms: int) -> str:
    """Epoch milliseconds as an RFC 3339 UTC timestamp with ``Z``."""
    rest = epoch_ms % 1000
    text = datetime_of_ms(epoch_ms - rest).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{rest:03d}Z" if rest else f"{text}Z"


def digest(doc: object) -> str:
    """A stable digest of a JSON value (sorted keys, no whitespace)."""
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()
