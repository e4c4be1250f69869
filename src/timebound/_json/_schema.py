"""The one JSON-Schema validation helper (draft, format checks, ECMA-262 anchors, first error).

``jsonschema`` does the evaluation; this module only fixes the choices an engine would otherwise
make on its own: the draft comes from the schema's ``$schema`` (2020-12 when absent), the schema
itself is checked once, formats are checked, a pattern's ``$`` means "end of string" as ECMA-262
says, and the error reported is the first by document position, narrowed to the field that broke
the rule. Its place is written in one notation (:func:`json_path`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SchemaProblem", "SchemaValidator", "json_path"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_MESSAGE_LIMIT = 300


def json_path(parts: Iterable[str | int], *, root: str = "$") -> str:
    """``$.nodes[3].id``: members by name (bracketed and quoted when not an identifier), items by
    index. With ``root=""`` the leading ``$.`` is left out (``nodes[3].id``), and an empty path is
    the root itself."""
    out = root
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _NAME.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{part!r}]"
    return out or "$"


def _short(message: str) -> str:
    # jsonschema quotes the whole offending value; a hostile document may make that huge.
    return message if len(message) <= _MESSAGE_LIMIT else message[: _MESSAGE_LIMIT - 3] + "..."


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """The first place where a document breaks its schema."""

    #: The member names and item indexes leading to the field at fault (outermost first).
    parts: tuple[str | int, ...]
    #: The schema keyword that failed (``type``, ``pattern``, ``additionalProperties``, ...).
    rule: str
    #: jsonschema's message, shortened to 300 characters.
    message: str

    @property
    def path(self) -> str:
        """The place in :func:`json_path` notation, rooted at ``$``."""
        return json_path(self.parts)


def _end_anchors(node: Any) -> Any:
    # A schema's regexes follow ECMA-262, where "$" ends the string; jsonschema runs them with
    # Python's re.search, where "$" also matches before a final newline. Without this,
    # "...T18:00:00Z\n" passed as a timestamp and an id could end in a newline. "\Z" is
    # Python's end of string.
    if isinstance(node, dict):
        return {
            k: v[:-1] + r"\Z"
            if k == "pattern" and isinstance(v, str) and v.endswith("$") and not v.endswith("\\$")
            else _end_anchors(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_end_anchors(v) for v in node]
    return node


def _position(part: str | int) -> tuple[int, int, str]:
    # Items sort by index, members by name; the two never share a parent.
    return (0, part, "") if isinstance(part, int) else (1, 0, part)


class SchemaValidator:
    """A shipped schema, checked once, ready to validate documents against."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        import jsonschema  # imported on first use: a core-only install never loads it

        self.schema: dict[str, Any] = _end_anchors(dict(schema))
        cls = jsonschema.validators.validator_for(self.schema, jsonschema.Draft202012Validator)
        cls.check_schema(self.schema)
        self._validator = cls(self.schema, format_checker=cls.FORMAT_CHECKER)

    @property
    def format_checker(self) -> Any:
        """The format checker validation uses (for checks compiled from the same schema)."""
        return self._validator.format_checker

    def is_valid(self, doc: Any) -> bool:
        """Whether ``doc`` holds to the schema (no problem is worked out)."""
        return bool(self._validator.is_valid(doc))

    def first_problem(self, doc: Any) -> SchemaProblem | None:
        """The first problem by document position (then by keyword), or ``None`` when ``doc``
        is valid. A failed ``oneOf``/``anyOf``/``if``-``then`` reports on the whole object: the
        deepest of its sub-errors names the field that broke the rule, when it is deeper. A
        document nested beyond the interpreter's recursion budget raises
        :class:`RecursionError` for the caller to name.
        """
        errors = sorted(
            self._validator.iter_errors(doc),
            key=lambda e: ([_position(p) for p in e.absolute_path], str(e.validator)),
        )
        if not errors:
            return None
        err = errors[0]
        while err.context:
            deepest = min(err.context, key=lambda e: -len(e.absolute_path))
            if len(deepest.absolute_path) <= len(err.absolute_path):
                break  # the rule is about this object itself (e.g. two "oneOf" branches hold)
            err = deepest
        return SchemaProblem(tuple(err.absolute_path), str(err.validator), _short(err.message))
