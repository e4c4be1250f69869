"""A compiled quick check of the wire schemas, for the poller's and the registry's hot paths.

``jsonschema`` evaluates a schema generically, keyword by keyword with error objects and lazy
reference resolution: about 200 µs for a six-field status document, half of a poll's CPU at
10,000 pending operations. :func:`compile_quick` turns the *same* schema (the shipped file, already
loaded) into nested Python closures once, for the few keywords these schemas use.

The closures answer in three values: ``True`` (the full validation accepts the value), ``False``
(it rejects it) or ``None`` (not decided here, e.g. ``1.0`` where the schema says ``integer``).
Each keyword mirrors jsonschema's own definition of it, so the two never disagree on a decided
answer (``tests/deferred/test_quickcheck.py`` compares them on generated documents). The caller
trusts only ``True``: anything else goes to the full validation, which decides and names the
error, so the quick check changes how fast a document is accepted, never whether.
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable
from typing import Any

__all__ = ["Quick", "compile_quick"]

#: A compiled (sub)schema: True = valid, False = invalid, None = undecided.
Quick = Callable[[Any], bool | None]

# Keywords that only annotate or hold definitions: they never reject anything.
_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description", "$comment"})


def compile_quick(schema: dict[str, Any], format_checker: Any) -> Quick:
    """Compile ``schema`` (a loaded 2020-12 schema with local ``$ref`` only).

    ``format_checker`` is the full validation's own (so ``format`` answers exactly as it does).
    A keyword this compiler does not know raises :class:`ValueError`: a schema that grows a new
    keyword must teach the quick check first, never be half-checked.
    """
    return _Compiler(schema, format_checker).compile(schema)


def _all(checks: list[Quick]) -> Quick:
    """True when every check is True, False when one is False, else None."""
    if not checks:
        return lambda value: True

    def check(value: Any) -> bool | None:
        undecided = False
        for c in checks:
            verdict = c(value)
            if verdict is False:
                return False
            if verdict is None:
                undecided = True
        return None if undecided else True

    return check


class _Compiler:
    def __init__(self, root: dict[str, Any], format_checker: Any) -> None:
        self.root = root
        self.format_checker = format_checker

    def compile(self, schema: Any) -> Quick:
        if schema is True or schema == {}:
            return lambda value: True
        if not isinstance(schema, dict):
            raise ValueError(f"the quick check takes schema objects, not {schema!r}")
        checks: list[Quick] = []
        handled = set(_ANNOTATIONS)
        if "if" in schema:
            checks.append(self._if(schema))
            handled |= {"if", "then", "else"}
        for key, arg in schema.items():
            if key in handled:
                continue
            make = getattr(self, "_kw_" + key.lstrip("$").replace("/", "_"), None)
            if make is None:
                raise ValueError(f"the quick check does not know the keyword {key!r}")
            checks.append(make(arg, schema))
        return _all(checks)

    # Types: the same definitions as jsonschema's Draft 2020-12 type checker ------------------

    def _kw_type(self, name: str, schema: dict[str, Any]) -> Quick:
        exact: dict[str, Callable[[Any], bool]] = {
            "object": lambda v: isinstance(v, dict),
            "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str),
            "boolean": lambda v: isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if name in exact:
            test = exact[name]
            return lambda value: test(value)
        if name == "integer":
            # jsonschema also counts a float with an integral value; that case is left to it.
            def integer(value: Any) -> bool | None:
                if isinstance(value, bool):
                    return False
                if isinstance(value, int):
                    return True
                return None if isinstance(value, float) else False

            return integer
        raise ValueError(f"the quick check does not know the type {name!r}")

    # Values ---------------------------------------------------------------------------------

    def _kw_const(self, const: Any, schema: dict[str, Any]) -> Quick:
        if isinstance(const, str):
            return lambda value: value == const if isinstance(value, str) else None
        if isinstance(const, int) and not isinstance(const, bool):
            # jsonschema's equality keeps True apart from 1; anything but a plain int: undecided.
            return lambda value: value == const if type(value) is int else None
        raise ValueError(f"the quick check does not know the const {const!r}")

    def _kw_enum(self, options: list[Any], schema: dict[str, Any]) -> Quick:
        if not all(isinstance(o, str) for o in options):
            raise ValueError("the quick check knows enums of strings only")
        allowed = frozenset(options)
        return lambda value: value in allowed if isinstance(value, str) else None

    # Strings --------------------------------------------------------------------------------

    def _kw_pattern(self, pattern: str, schema: dict[str, Any]) -> Quick:
        search = re.compile(pattern).search  # jsonschema: re.search on strings only
        return lambda value: search(value) is not None if isinstance(value, str) else True

    def _kw_maxLength(self, n: int, schema: dict[str, Any]) -> Quick:
        return lambda value: len(value) <= n if isinstance(value, str) else True

    def _kw_minLength(self, n: int, schema: dict[str, Any]) -> Quick:
        return lambda value: len(value) >= n if isinstance(value, str) else True

    def _kw_format(self, name: str, schema: dict[str, Any]) -> Quick:
        conforms = self.format_checker.conforms
        return lambda value: bool(conforms(value, name))

    # Numbers: plain ints are decided here, floats are left to jsonschema ---------------------

    def _kw_minimum(self, n: int, schema: dict[str, Any]) -> Quick:
        return lambda value: _number(value, lambda v: v >= n)

    def _kw_maximum(self, n: int, schema: dict[str, Any]) -> Quick:
        return lambda value: _number(value, lambda v: v <= n)

    # Arrays ---------------------------------------------------------------------------------

    def _kw_maxItems(self, n: int, schema: dict[str, Any]) -> Quick:
        return lambda value: len(value) <= n if isinstance(value, list) else True

    def _kw_items(self, sub: Any, schema: dict[str, Any]) -> Quick:
        check = _all_items(self.compile(sub))
        return lambda value: check(value) if isinstance(value, list) else True

    # Objects --------------------------------------------------------------------------------

    def _kw_required(self, names: list[str], schema: dict[str, Any]) -> Quick:
        need = tuple(names)
        return lambda value: all(k in value for k in need) if isinstance(value, dict) else True

    def _kw_properties(self, props: dict[str, Any], schema: dict[str, Any]) -> Quick:
        compiled = {name: self.compile(sub) for name, sub in props.items()}

        def properties(value: Any) -> bool | None:
            if not isinstance(value, dict):
                return True
            undecided = False
            for key, item in value.items():
                check = compiled.get(key) if isinstance(key, str) else None
                if check is None:
                    continue  # not a listed property: additionalProperties decides
                verdict = check(item)
                if verdict is False:
                    return False
                if verdict is None:
                    undecided = True
            return None if undecided else True

        return properties

    def _kw_additionalProperties(self, allowed: Any, schema: dict[str, Any]) -> Quick:
        if allowed is not False or "patternProperties" in schema:
            raise ValueError("the quick check knows additionalProperties: false only")
        known = frozenset(schema.get("properties", {}))
        return lambda value: all(k in known for k in value) if isinstance(value, dict) else True

    # Combinators ----------------------------------------------------------------------------

    def _kw_ref(self, ref: str, schema: dict[str, Any]) -> Quick:
        if not ref.startswith("#/$defs/") or ref.count("/") != 2:
            raise ValueError(f"the quick check resolves #/$defs/NAME references only, not {ref!r}")
        return self.compile(self.root["$defs"][ref.rsplit("/", 1)[1]])

    def _kw_allOf(self, subs: list[Any], schema: dict[str, Any]) -> Quick:
        return _all([self.compile(s) for s in subs])

    def _kw_oneOf(self, subs: list[Any], schema: dict[str, Any]) -> Quick:
        compiled = [self.compile(s) for s in subs]

        def one_of(value: Any) -> bool | None:
            verdicts = [c(value) for c in compiled]
            if None in verdicts:
                return None
            return verdicts.count(True) == 1

        return one_of

    def _kw_not(self, sub: Any, schema: dict[str, Any]) -> Quick:
        check = self.compile(sub)

        def negated(value: Any) -> bool | None:
            verdict = check(value)
            return None if verdict is None else not verdict

        return negated

    def _if(self, schema: dict[str, Any]) -> Quick:
        cond = self.compile(schema["if"])
        then = self.compile(schema.get("then", True))
        other = self.compile(schema.get("else", True))

        def if_then(value: Any) -> bool | None:
            verdict = cond(value)
            if verdict is None:
                return None
            return then(value) if verdict else other(value)

        return if_then


def _number(value: Any, test: Callable[[int], bool]) -> bool | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return True  # the keyword applies to numbers only (jsonschema's "number" type)
    return test(value) if isinstance(value, int) else None


def _all_items(check: Quick) -> Quick:
    def items(values: list[Any]) -> bool | None:
        undecided = False
        for v in values:
            verdict = check(v)
            if verdict is False:
                return False
            if verdict is None:
                undecided = True
        return None if undecided else True

    return items
