"""Strict JSON: the one reader and the one checker of JSON that someone else chose (D6.20).

A document read from a request, a connector or a downstream, and a value a handler returns, is
held to the same rules here, once: JSON only (no ``NaN``/``Infinity``, string keys, no sets or
bytes, no cycles) and nested at most :data:`MAX_DEPTH` levels. The depth limit sits far below
Python's recursion limit, so no walker of such a value anywhere in timebound can meet a
``RecursionError``; the walk here is iterative, so checking a value never recurses either.

Errors are :class:`JSONError` (code ``not-json``) and :class:`TooDeep` (code ``too-deep``), both
a ``ValueError``; ``path`` names where the value broke the rule (``$.input[0][0]``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from .._core._errors import InvalidInput
from ._schema import json_path

__all__ = ["MAX_DEPTH", "JSONError", "TooDeep", "check", "loads"]

#: The deepest nesting of objects and arrays accepted (D6.20): a value at depth 64 is inside 64
#: containers. Python's recursion budget (1,000 frames) is far above it, so parsers, encoders
#: and the engines' own walkers stay well clear of ``RecursionError``.
MAX_DEPTH = 64


_Link = tuple[Any, Any, Any] | None


class JSONError(InvalidInput):
    """A value is not JSON timebound accepts; ``path`` names where (``$`` is the whole value)."""

    code = "not-json"

    def __init__(self, message: str, *, path: str = "$", reason: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        #: Where and how JSON text broke (``Expecting value at line 1 column 11``), if it did.
        self.reason = reason

    @property
    def field(self) -> str | None:
        return self.path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), self.path))


class TooDeep(JSONError):
    """A value nests objects and arrays deeper than the limit (``limit``, D6.20)."""

    code = "too-deep"

    def __init__(self, message: str, *, path: str = "$", limit: int = MAX_DEPTH) -> None:
        super().__init__(message, path=path)
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_deep, (str(self), self.path, self.limit))


def _rebuild(cls: type[JSONError], message: str, path: str) -> JSONError:
    return cls(message, path=path)


def _rebuild_deep(message: str, path: str, limit: int) -> TooDeep:
    return TooDeep(message, path=path, limit=limit)


def _short(text: str, limit: int = 100) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _keys(link: _Link) -> list[Any]:
    keys = []
    while link is not None:
        key, link, _ = link
        keys.append(key)
    keys.reverse()
    return keys


def _cycle(item: Any, link: _Link) -> list[Any] | None:
    """The keys to the first place where the value at the end of ``link`` contains itself."""
    values, keys = [item], []
    while link is not None:
        key, link, parent = link
        values.append(parent)
        keys.append(key)
    values.reverse()
    keys.reverse()
    seen: set[int] = set()
    for depth, value in enumerate(values):
        if id(value) in seen:
            return keys[:depth]
        seen.add(id(value))
    return None


def check(
    value: Any,
    *,
    max_depth: int = MAX_DEPTH,
    what: str = "the value",
    root: str = "$",
    arrays: tuple[type, ...] = (list,),
    objects: tuple[type, ...] = (dict,),
) -> Any:
    """``value`` itself once it is JSON nested at most ``max_depth`` deep; :class:`TooDeep` or
    :class:`JSONError` naming the first place that is not (paths under ``root``).

    ``arrays`` and ``objects`` are the Python types taken as JSON arrays and objects (a caller
    that encodes the value itself may allow tuples, or read-only mappings). Iterative: a value
    nested 100,000 deep is refused at level ``max_depth + 1`` after visiting no more than it
    took to get there. A cycle is refused as containing itself.
    """
    # (value, depth, link): link is (key, parent's link, parent), so the path costs nothing
    # until needed.
    stack: list[tuple[Any, int, _Link]] = [(value, 0, None)]
    while stack:
        item, depth, link = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise JSONError(
                    f"{what}: {item!r} is not a JSON number", path=json_path(_keys(link), root=root)
                )
            continue
        # Children pushed last first: the first bad place in document order is found first.
        container: Any = item
        is_object = isinstance(item, objects)
        if is_object:
            children: Any = reversed(list(container.items()))
        elif isinstance(item, arrays):
            children = zip(range(len(container) - 1, -1, -1), reversed(container), strict=True)
        else:
            raise JSONError(
                f"{what}: {type(item).__name__} {_short(repr(item))} is not a JSON value",
                path=json_path(_keys(link), root=root),
            )
        if depth >= max_depth:
            cycle = _cycle(item, link)
            if cycle is not None:
                raise JSONError(
                    f"{what}: the value contains itself", path=json_path(cycle, root=root)
                )
            raise TooDeep(
                f"{what} is nested deeper than the limit of {max_depth} levels",
                path=json_path(_keys(link), root=root),
                limit=max_depth,
            )
        if is_object:
            for key in container:
                if not isinstance(key, str):
                    raise JSONError(
                        f"{what}: key {_short(repr(key))} is not a string",
                        path=json_path(_keys(link), root=root),
                    )
        stack.extend((child, depth + 1, (key, link, item)) for key, child in children)
    return value


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{},:]')


def _deep_keys(text: str, max_depth: int) -> list[Any]:
    """The keys to the first container of ``text`` nested past ``max_depth`` (a scan that
    needs no recursion, for text the parser refused as too deep)."""
    # Each open container: [current key or index, whether a string now would be a key].
    stack: list[list[Any]] = []
    last = ""
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token in "[{":
            if len(stack) >= max_depth:
                return [entry[0] for entry in stack]
            stack.append([0, True] if token == "{" else [0, False])
        elif token in "]}":
            if stack:
                stack.pop()
        elif token == ",":
            if stack:
                if stack[-1][1] is None or isinstance(stack[-1][0], str):
                    stack[-1][1] = True  # in an object: a key comes next
                else:
                    stack[-1][0] += 1
        elif token == ":":
            if stack:
                stack[-1][0] = json.loads(last)
                stack[-1][1] = None
        else:
            last = token
    return []


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads(
    data: bytes | bytearray | str, *, max_depth: int = MAX_DEPTH, what: str = "the document"
) -> Any:
    """Parse JSON text strictly: UTF-8, no ``NaN``/``Infinity``, nested at most ``max_depth``.

    :class:`JSONError` says where the text broke (line and column), :class:`TooDeep` where it
    nests too deep.
    """
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError:
        raise JSONError(f"{what} is not UTF-8 text") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        reason = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise JSONError(f"{what} is not JSON: {reason}", reason=reason) from None
    except RecursionError:
        # Deeper than the parser's own budget, far past ours: find where it passed ours.
        raise TooDeep(
            f"{what} is nested deeper than the limit of {max_depth} levels",
            path=json_path(_deep_keys(text, max_depth), root="$"),
            limit=max_depth,
        ) from None
    except ValueError as exc:
        raise JSONError(f"{what} is not JSON: {exc}", reason=str(exc)) from None
    return check(value, max_depth=max_depth, what=what)
