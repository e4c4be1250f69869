"""Zero values for ``on_error: skip`` and ``log`` (DECISIONS D3.5).

String ``""``, Int ``0``, Float ``0.0``, Boolean ``False``, List ``[]``, Map ``{}``, Optional
``None``, a record (dataclass, ``TypedDict``, ``NamedTuple``) → its fields' zero values.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import types
import typing
from typing import Any

__all__ = ["zero_value_for"]

_SCALARS: dict[Any, Any] = {
    str: "",
    int: 0,
    float: 0.0,
    bool: False,
    bytes: b"",
    complex: 0j,
    type(None): None,
    None: None,
}
_EMPTY_FACTORIES: dict[Any, Any] = {
    list: list,
    dict: dict,
    set: set,
    frozenset: frozenset,
    tuple: tuple,
    cabc.Sequence: list,
    cabc.MutableSequence: list,
    cabc.Iterable: list,
    cabc.Collection: list,
    cabc.Mapping: dict,
    cabc.MutableMapping: dict,
    cabc.Set: frozenset,
    cabc.MutableSet: set,
}


def zero_value_for(annotation: Any) -> Any:
    """The zero value for a return annotation (D3.5); ``None`` when there is no sensible one.

    Each call builds a fresh value, so a mutable zero (``[]``, ``{}``, a dataclass) is never shared
    between calls. Unknown or missing annotations (``Any``, a plain class without fields) give
    ``None``.
    """
    return _zero(annotation, 0)


def _zero(tp: Any, depth: int) -> Any:
    if depth > 20:
        # A self-referential record (``Node`` with a ``Node`` field): stop at Optional-like None.
        return None
    if tp in _SCALARS:
        return _SCALARS[tp]
    factory = _EMPTY_FACTORIES.get(tp)
    if factory is not None:
        return factory()
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _zero(typing.get_args(tp)[0], depth + 1)
    if origin is typing.Union or origin is types.UnionType:
        args = typing.get_args(tp)
        if type(None) in args:
            return None
        # A union without None: the zero of its first member is the least surprising choice.
        return _zero(args[0], depth + 1)
    if origin is typing.Literal:
        args = typing.get_args(tp)
        return args[0] if args else None
    if origin is not None:
        factory = _EMPTY_FACTORIES.get(origin)
        if factory is not None:
            return factory()
        return None
    if isinstance(tp, type):
        return _zero_record(tp, depth)
    return None


def _zero_record(cls: type, depth: int) -> Any:
    if dataclasses.is_dataclass(cls):
        hints = _hints(cls)
        init_fields = {
            f.name: _zero(hints.get(f.name, f.type), depth + 1)
            for f in dataclasses.fields(cls)
            if f.init
        }
        return cls(**init_fields)
    if typing.is_typeddict(cls):
        return {k: _zero(v, depth + 1) for k, v in _hints(cls).items()}
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        hints = _hints(cls)
        return cls(*(_zero(hints.get(name), depth + 1) for name in cls._fields))
    for base, value in _SCALARS.items():
        # Subclasses of scalars (an ``IntEnum`` is not one we can invent a member for).
        if isinstance(base, type) and base is not type(None) and issubclass(cls, base):
            try:
                return typing.cast(Any, cls)(value)
            except Exception:
                return None
    return None


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:
        # Unresolvable forward references: fall back to the raw annotations.
        return dict(getattr(cls, "__annotations__", {}))
