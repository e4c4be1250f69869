"""The standard library: the functions upstream Constellation programs call without a Python
module of their own, under upstream's names, namespaces and signatures.

Every program can call them (``timebound run prog.cst`` needs no ``--modules`` when a program
uses only these). They are ordinary modules (plain sync functions), so options work on them as on
any call. ``filter``, ``map``, ``all`` and ``any`` take a lambda and are compiled in place (see
:data:`HIGHER_ORDER`); they have no Python function.

Integer arithmetic follows upstream's 64-bit semantics where Python's differs: ``divide`` and
``modulo`` truncate toward zero (Python's ``//`` and ``%`` floor), and ``round`` rounds halves up.
"""

from __future__ import annotations

import functools
import math
import types
from collections.abc import Callable, Mapping
from typing import Any, Final

from ._registry import ModuleRegistry, ModuleSpec

__all__ = ["HIGHER_ORDER", "standard_library"]

#: Higher-order functions, by qualified name: each takes a list (or Seq) and a lambda.
HIGHER_ORDER: Final = {
    "stdlib.collection.filter": "filter",
    "stdlib.collection.map": "map",
    "stdlib.collection.all": "all",
    "stdlib.collection.any": "any",
}


def _divide(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero in stdlib.math.divide")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _modulo(a: int, b: int) -> int:
    if b == 0:
        raise ZeroDivisionError("division by zero in stdlib.math.modulo")
    return a - b * _divide(a, b)


def _round(value: float) -> int:
    if not math.isfinite(value):
        raise ValueError(f"cannot round {value!r} to an integer")
    return math.floor(value + 0.5)


def _first(items: list[int]) -> int:
    if not items:
        raise IndexError("stdlib.list.list-first: the list is empty")
    return items[0]


def _last(items: list[int]) -> int:
    if not items:
        raise IndexError("stdlib.list.list-last: the list is empty")
    return items[-1]


def _to_int(value: float) -> int:
    if not math.isfinite(value):
        raise ValueError(f"cannot convert {value!r} to an integer")
    return int(value)  # truncates toward zero, as upstream's conversion does


def _split(value: str, separator: str) -> list[str]:
    if not separator:
        raise ValueError("stdlib.string.split: the separator is empty")
    return value.split(separator)


def _log(message: str) -> str:
    import logging

    logging.getLogger("timebound.dsl").info("%s", message)
    return message


def _functions() -> dict[str, Callable[..., Any]]:
    # Annotations give the Constellation signatures (upstream's: Int, String, List<Int>...).
    def add(a: int, b: int) -> int:
        return a + b

    def subtract(a: int, b: int) -> int:
        return a - b

    def multiply(a: int, b: int) -> int:
        return a * b

    def divide(a: int, b: int) -> int:
        return _divide(a, b)

    def max_(a: int, b: int) -> int:
        return max(a, b)

    def min_(a: int, b: int) -> int:
        return min(a, b)

    def abs_(value: int) -> int:
        return abs(value)

    def modulo(a: int, b: int) -> int:
        return _modulo(a, b)

    def round_(value: float) -> int:
        return _round(value)

    def negate(value: int) -> int:
        return -value

    def concat(a: str, b: str) -> str:
        return a + b

    def string_length(value: str) -> int:
        return len(value)

    def join(list: list[str], separator: str) -> str:
        return separator.join(list)

    def split(value: str, substring: str) -> list[str]:
        return _split(value, substring)

    def contains(value: str, substring: str) -> bool:
        return substring in value

    def trim(value: str) -> str:
        return value.strip()

    def replace(value: str, target: str, replacement: str) -> str:
        return value.replace(target, replacement)

    def list_length(list: list[int]) -> int:
        return len(list)

    def list_first(list: list[int]) -> int:
        return _first(list)

    def list_last(list: list[int]) -> int:
        return _last(list)

    def list_is_empty(list: list[int]) -> bool:
        return not list

    def list_sum(list: list[int]) -> int:
        return sum(list)

    def list_concat(a: list[int], b: list[int]) -> list[int]:
        return a + b

    def list_contains(list: list[int], value: int) -> bool:
        return value in list

    def list_reverse(list: list[int]) -> list[int]:
        return list[::-1]

    def eq_int(a: int, b: int) -> bool:
        return a == b

    def eq_string(a: str, b: str) -> bool:
        return a == b

    def gt(a: int, b: int) -> bool:
        return a > b

    def lt(a: int, b: int) -> bool:
        return a < b

    def gte(a: int, b: int) -> bool:
        return a >= b

    def lte(a: int, b: int) -> bool:
        return a <= b

    def identity(value: str) -> str:
        return value

    def log(message: str) -> str:
        return _log(message)

    def to_string(value: int) -> str:
        return str(value)

    def to_int(value: float) -> int:
        return _to_int(value)

    def to_float(value: int) -> float:
        return float(value)

    return {
        "stdlib.math.add": add,
        "stdlib.math.subtract": subtract,
        "stdlib.math.multiply": multiply,
        "stdlib.math.divide": divide,
        "stdlib.math.max": max_,
        "stdlib.math.min": min_,
        "stdlib.math.abs": abs_,
        "stdlib.math.modulo": modulo,
        "stdlib.math.round": round_,
        "stdlib.math.negate": negate,
        "stdlib.string.concat": concat,
        "stdlib.string.string-length": string_length,
        "stdlib.string.join": join,
        "stdlib.string.split": split,
        "stdlib.string.contains": contains,
        "stdlib.string.trim": trim,
        "stdlib.string.replace": replace,
        "stdlib.list.list-length": list_length,
        "stdlib.list.list-first": list_first,
        "stdlib.list.list-last": list_last,
        "stdlib.list.list-is-empty": list_is_empty,
        "stdlib.list.list-sum": list_sum,
        "stdlib.list.list-concat": list_concat,
        "stdlib.list.list-contains": list_contains,
        "stdlib.list.list-reverse": list_reverse,
        "stdlib.compare.eq-int": eq_int,
        "stdlib.compare.eq-string": eq_string,
        "stdlib.compare.gt": gt,
        "stdlib.compare.lt": lt,
        "stdlib.compare.gte": gte,
        "stdlib.compare.lte": lte,
        "stdlib.identity": identity,
        "stdlib.debug.log": log,
        "stdlib.convert.to-string": to_string,
        "stdlib.convert.to-int": to_int,
        "stdlib.convert.to-float": to_float,
    }


@functools.cache
def standard_library() -> Mapping[str, ModuleSpec]:
    """The standard library's module signatures by qualified name: a read-only mapping built
    once (signatures only; caches and limiters belong to each program). A program's own
    registry shadows it name by name."""
    registry = ModuleRegistry()
    for name, fn in _functions().items():
        registry.register(name, fn)
    specs = {name: spec for name in registry.names() if (spec := registry.get(name))}
    return types.MappingProxyType(specs)
