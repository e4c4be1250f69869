"""Constellation types: representation, assignability, zero values, value validation.

Types are small immutable objects compared structurally. Records are ``dict`` at run time; a
``Result`` (``on_error: wrap``) is the policies' ``Ok``/``Err`` value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "BOOLEAN",
    "ERROR",
    "FLOAT",
    "INT",
    "NOTHING",
    "STRING",
    "admits_none",
    "conforms",
    "elements",
    "ErrorType",
    "ListType",
    "MapType",
    "NothingType",
    "OptionalType",
    "PrimType",
    "RecordType",
    "ResultType",
    "SeqType",
    "Type",
    "UnionType",
    "is_assignable",
    "join",
    "union_of",
    "validate_value",
    "without_none",
    "zero_value",
]


class Type:
    """Base of every Constellation type. ``str(t)`` is how diagnostics spell it."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class PrimType(Type):
    """``String``, ``Int``, ``Float`` or ``Boolean``."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class NothingType(Type):
    """The type of ``[]``'s elements: assignable to every type, never a value."""

    def __str__(self) -> str:
        return "Nothing"


@dataclass(frozen=True, slots=True)
class ErrorType(Type):
    """The type of an expression that already has an error: compatible with everything, so one
    mistake gives one diagnostic, not a cascade."""

    def __str__(self) -> str:
        return "<error>"


@dataclass(frozen=True, slots=True)
class ListType(Type):
    """``List<T>``."""

    elem: Type

    def __str__(self) -> str:
        return f"List<{self.elem}>"


@dataclass(frozen=True, slots=True)
class SeqType(Type):
    """``Seq<T>`` (``Candidates<T>`` is its older name): a sequence, a ``list`` at run time.
    A ``List<T>`` is a ``Seq<T>``; ``+`` on two sequences of records merges them element-wise."""

    elem: Type

    def __str__(self) -> str:
        return f"Seq<{self.elem}>"


@dataclass(frozen=True, slots=True)
class MapType(Type):
    """``Map<K, V>`` (a ``dict`` at run time)."""

    key: Type
    value: Type

    def __str__(self) -> str:
        return f"Map<{self.key}, {self.value}>"


@dataclass(frozen=True, slots=True)
class OptionalType(Type):
    """``Optional<T>``: a value or none (``None`` at run time)."""

    inner: Type

    def __str__(self) -> str:
        return f"Optional<{self.inner}>"


@dataclass(frozen=True, slots=True)
class RecordType(Type):
    """``{ name: T, ... }``; fields keep their declared order."""

    fields: tuple[tuple[str, Type], ...]

    def field_map(self) -> dict[str, Type]:
        return dict(self.fields)

    def __str__(self) -> str:
        if not self.fields:
            return "{}"
        return "{ " + ", ".join(f"{n}: {t}" for n, t in self.fields) + " }"


@dataclass(frozen=True, slots=True)
class UnionType(Type):
    """``A | B | ...`` (flattened, no duplicates, at least two members)."""

    members: tuple[Type, ...]

    def __str__(self) -> str:
        return " | ".join(str(m) for m in self.members)


@dataclass(frozen=True, slots=True)
class ResultType(Type):
    """The type of a call with ``on_error: wrap``: fields ``ok``, ``value``, ``error``."""

    inner: Type

    def __str__(self) -> str:
        return f"Result<{self.inner}>"

    def field_types(self) -> dict[str, Type]:
        return {"ok": BOOLEAN, "value": OptionalType(self.inner), "error": OptionalType(STRING)}


STRING: Final = PrimType("String")
INT: Final = PrimType("Int")
FLOAT: Final = PrimType("Float")
BOOLEAN: Final = PrimType("Boolean")
NOTHING: Final = NothingType()
ERROR: Final = ErrorType()


def union_of(types: list[Type]) -> Type:
    """The union of ``types``, flattened and deduplicated (one member: that member)."""
    flat: list[Type] = []
    for t in types:
        for m in t.members if isinstance(t, UnionType) else (t,):
            if isinstance(m, NothingType):
                continue
            if m not in flat:
                flat.append(m)
    if not flat:
        return NOTHING
    if len(flat) == 1:
        return flat[0]
    return UnionType(tuple(flat))


def is_assignable(src: Type, dst: Type) -> bool:
    """Whether a value of type ``src`` may be used where ``dst`` is expected.

    Int widens to Float; records use width and depth subtyping (extra fields allowed, field
    types assignable); a record whose fields all fit ``V`` is a ``Map<String, V>``; lists, maps,
    optionals and results are covariant.
    """
    if src == dst or isinstance(src, NothingType | ErrorType) or isinstance(dst, ErrorType):
        return True
    if isinstance(src, UnionType):
        return all(is_assignable(m, dst) for m in src.members)
    if isinstance(src, OptionalType):
        # Optional<T> is T or none: each part must fit (none fits only an optional).
        return admits_none(dst) and is_assignable(src.inner, dst)
    if isinstance(dst, UnionType):
        return any(is_assignable(src, m) for m in dst.members)
    if isinstance(dst, OptionalType):
        return is_assignable(src, dst.inner)
    if isinstance(dst, PrimType):
        return src == INT and dst == FLOAT
    if isinstance(dst, ListType):
        return isinstance(src, ListType) and is_assignable(src.elem, dst.elem)
    if isinstance(dst, SeqType):
        return isinstance(src, ListType | SeqType) and is_assignable(src.elem, dst.elem)
    if isinstance(dst, MapType):
        if isinstance(src, RecordType):
            # A record literal is a dict at run time: `{}` or `{ a: 1 }` can be a Map<String, Int>.
            return is_assignable(STRING, dst.key) and all(
                is_assignable(t, dst.value) for _, t in src.fields
            )
        return (
            isinstance(src, MapType)
            and is_assignable(src.key, dst.key)
            and is_assignable(src.value, dst.value)
        )
    if isinstance(dst, RecordType):
        if not isinstance(src, RecordType):
            return False
        have = src.field_map()
        for name, t in dst.fields:
            if name not in have or not is_assignable(have[name], t):
                return False
        return True
    if isinstance(dst, ResultType):
        return isinstance(src, ResultType) and is_assignable(src.inner, dst.inner)
    return False


def admits_none(t: Type) -> bool:
    """Whether none is a value of ``t`` (an optional, or a union with an optional member)."""
    if isinstance(t, UnionType):
        return any(isinstance(m, OptionalType | ErrorType) for m in t.members)
    return isinstance(t, OptionalType | ErrorType)


def without_none(t: Type) -> Type:
    """``t`` with none taken out: what ``t ?? ...`` has when ``t`` is not none."""
    if isinstance(t, OptionalType):
        return without_none(t.inner)
    if isinstance(t, UnionType):
        return union_of([without_none(m) for m in t.members])
    return t


def join(a: Type, b: Type) -> Type:
    """The least type both ``a`` and ``b`` are assignable to (a union when neither fits)."""
    if is_assignable(a, b):
        return b
    if is_assignable(b, a):
        return a
    if isinstance(a, ListType) and isinstance(b, ListType):
        return ListType(join(a.elem, b.elem))
    if isinstance(a, ListType | SeqType) and isinstance(b, ListType | SeqType):
        return SeqType(join(a.elem, b.elem))
    return union_of([a, b])


def elements(t: Type) -> Type | None:
    """The element type of a ``List`` or ``Seq`` (None for other types)."""
    return t.elem if isinstance(t, ListType | SeqType) else None


def conforms(value: Any, t: Type) -> bool:
    """Whether the run value ``value`` is a value of ``t`` (``match ... { is T -> ... }``)."""
    if isinstance(t, ErrorType):
        return True
    if isinstance(t, ResultType | NothingType):
        return False
    try:
        validate_value(value, t, "value")
    except (TypeError, RecursionError):
        return False
    # validate_value accepts an Int as a Float (inputs may say 1 for 1.0); a type test does not.
    return not (t == FLOAT and not isinstance(value, float))


def zero_value(t: Type) -> Any:
    """D3.5: String "", Int 0, Float 0.0, Boolean false, List [], Map {}, Optional none,
    a record -> its fields' zero values (a union: its first member's)."""
    if isinstance(t, PrimType):
        return {"String": "", "Int": 0, "Float": 0.0, "Boolean": False}[t.name]
    if isinstance(t, ListType | SeqType):
        return []
    if isinstance(t, MapType):
        return {}
    if isinstance(t, RecordType):
        return {name: zero_value(ft) for name, ft in t.fields}
    if isinstance(t, UnionType):
        return zero_value(t.members[0])
    return None


def validate_value(value: Any, t: Type, path: str) -> Any:
    """Check ``value`` against ``t`` and return it normalised (Int accepted where Float is).

    Raises :class:`TypeError` whose message names ``path`` (e.g. ``input 'user'.id``).
    """
    if isinstance(t, PrimType):
        name = t.name
        if name == "String":
            if isinstance(value, str):
                return value
        elif name == "Boolean":
            if isinstance(value, bool):
                return value
        elif name == "Int":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        elif isinstance(value, int | float) and not isinstance(value, bool):
            f = float(value)
            if math.isfinite(f):
                return f
            raise TypeError(f"{path} must be a finite Float, got {value!r}")
        raise TypeError(f"{path} must be {name}, got {_describe(value)}")
    if isinstance(t, OptionalType):
        return None if value is None else validate_value(value, t.inner, path)
    if isinstance(t, ListType | SeqType):
        if not isinstance(value, list | tuple):
            raise TypeError(f"{path} must be {t}, got {_describe(value)}")
        return [validate_value(v, t.elem, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(t, MapType):
        if not isinstance(value, Mapping):
            raise TypeError(f"{path} must be {t}, got {_describe(value)}")
        return {
            validate_value(k, t.key, f"{path} key"): validate_value(v, t.value, f"{path}[{k!r}]")
            for k, v in value.items()
        }
    if isinstance(t, RecordType):
        if not isinstance(value, Mapping):
            raise TypeError(f"{path} must be a record {t}, got {_describe(value)}")
        out = dict(value)
        for name, ft in t.fields:
            if name not in value:
                if isinstance(ft, OptionalType):
                    out[name] = None
                    continue
                raise TypeError(f"{path} is missing field '{name}' ({ft})")
            out[name] = validate_value(value[name], ft, f"{path}.{name}")
        return out
    if isinstance(t, UnionType):
        for m in t.members:
            try:
                return validate_value(value, m, path)
            except TypeError:
                continue
        raise TypeError(f"{path} must be {t}, got {_describe(value)}")
    raise TypeError(f"{path}: values of type {t} cannot be given as inputs")


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{type(value).__name__} {text}"
