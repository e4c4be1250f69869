"""Call caches (DECISIONS D3.6): key = the call's identity + a canonical encoding of its arguments.

Only a success produced by the wrapped call itself is stored; failures, timeouts, fallback values
and on_error zero values never are. The TTL is the ``cache`` option's duration. A cache is an
object owned by whoever made it (a policy makes its own :class:`InMemoryCache`; a compiled
Constellation program one per module); sharing one means passing the same object.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import inspect
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol, runtime_checkable

from .._core import _clock
from .._core._errors import ConfigurationError
from ._flight import Flights

__all__ = ["CacheBackend", "InMemoryCache", "Uncacheable", "cache_key", "canonical_arguments"]

#: The name of the built-in backend (``cache_backend="memory"``): an in-memory cache of one's own.
MEMORY: Final = "memory"


@runtime_checkable
class CacheBackend(Protocol):
    """Where a policy keeps cached results. Both methods are synchronous and must be thread-safe.

    ``get`` returns ``(True, value)`` for a live entry and ``(False, None)`` otherwise (a cached
    ``None`` is a hit). ``set`` stores ``value`` for ``ttl`` seconds. A hit must never hand out
    an object an earlier caller could have mutated: serialise values (as a networked cache does)
    or copy them (as :class:`InMemoryCache` does).
    """

    def get(self, key: str) -> tuple[bool, Any]: ...

    def set(self, key: str, value: Any, ttl: float) -> None: ...


# Values that need no copy: nothing reachable from them can change.
_IMMUTABLE: Final = (str, int, float, bool, bytes, complex, type(None), frozenset, enum.Enum)


def _private_copy(value: Any) -> Any:
    if isinstance(value, _IMMUTABLE):
        return value
    return copy.deepcopy(value)


class InMemoryCache:
    """A bounded in-process cache with per-entry TTL on timebound's clock (``_clock.now()``).

    When ``max_entries`` is reached the least recently stored or read entry is evicted. Values
    are deep-copied when stored and on every hit, so no caller ever sees another caller's
    mutations (a value that cannot be copied is not stored: ``set`` raises ``TypeError``).
    """

    def __init__(self, *, max_entries: int = 4096) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigurationError(
                f"max_entries must be an integer >= 1, got {max_entries!r}", option="max_entries"
            )
        self.max_entries = max_entries
        #: The calls in flight of every policy using this cache (see ``_flight``).
        self.flights = Flights()
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[bool, Any]:
        """``(True, a copy of the value)`` while the entry is younger than its TTL, else
        ``(False, None)``."""
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                return False, None
            expires, value = entry
            # An entry is dead once now >= expiry, the same rule as a deadline (D1.3).
            if _clock.now() >= expires:
                del self._data[key]
                return False, None
            self._data.move_to_end(key)
        return True, _private_copy(value)

    def set(self, key: str, value: Any, ttl: float) -> None:
        """Store a copy of ``value`` under ``key`` for ``ttl`` seconds."""
        try:
            stored = _private_copy(value)
        except Exception as exc:
            raise TypeError(
                f"a {type(value).__name__} cannot be copied, so it is not cached: {exc}"
            ) from exc
        expires = _clock.now() + ttl
        with self._lock:
            self._data[key] = (expires, stored)
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)


class Uncacheable(Exception):
    """An argument has no stable canonical encoding (an object known only by its identity, a
    cycle); the call runs without the cache."""


@functools.lru_cache(maxsize=512)
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature
        return None


def canonical_arguments(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], Mapping[str, Any]]:
    """The call's arguments by parameter name, defaults applied, for a canonical cache key.

    Falls back to the arguments as given when ``fn`` has no signature, is unhashable, or the
    arguments do not bind (the call itself will then raise its own ``TypeError``).
    """
    try:
        sig = _signature(fn)
    except TypeError:  # an unhashable callable
        return args, kwargs
    if sig is None:
        return args, kwargs
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return args, kwargs
    bound.apply_defaults()
    return (), bound.arguments


def cache_key(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The cache key of a call: ``name`` plus a canonical, JSON-like encoding of the arguments.

    Equal values give equal keys whatever their identity or dict ordering; values that merely
    look alike do not collide (``1``, ``1.0``, ``True`` and ``"1"`` differ; so do a list and a
    tuple, ``float("inf")`` and ``"float:inf"``, two ``OrderedDict`` s in different orders).
    Unhashable arguments are fine. Encoded: ``None``, ``bool``, ``int``, ``float``, ``str``,
    ``bytes``, enums, lists, tuples (named too), mappings, sets, dataclasses that compare by
    value, and the standard library's value types (``complex``, ``Decimal``, ``Fraction``,
    dates and times, ``UUID``, paths). Anything else, an object whose only identity is its
    address above all, raises :class:`Uncacheable`: such calls are not cached unless the policy
    is given a ``cache_key=`` function. A cyclic argument raises :class:`Uncacheable` too.
    """
    parts: list[str] = [json.dumps(name), "("]
    active: set[int] = set()
    for a in args:
        _enc(a, parts, active)
        parts.append(",")
    parts.append(")")
    if kwargs:
        parts.append("{")
        for k in sorted(kwargs):
            parts.append(json.dumps(k))
            parts.append(":")
            _enc(kwargs[k], parts, active)
            parts.append(",")
        parts.append("}")
    return "".join(parts)


# Standard-library value types whose repr is canonical (equal values, equal reprs; no address),
# by module. An instance of one exists only once its module is imported, so the check looks the
# modules up in ``sys.modules`` instead of importing them: ``import decimal, fractions, uuid,
# pathlib`` cost a first policy call several milliseconds (bench/startup.py, first resilient).
_REPR_VALUE_TYPES: Final = (
    ("decimal", ("Decimal",)),
    ("fractions", ("Fraction",)),
    ("datetime", ("date", "time", "timedelta", "timezone")),
    ("uuid", ("UUID",)),
    ("pathlib", ("PurePath",)),
)


def _repr_value(obj: object) -> bool:
    """``obj`` is a standard-library value whose repr is canonical (see above)."""
    if isinstance(obj, complex | range):
        return True
    for module, names in _REPR_VALUE_TYPES:
        found = sys.modules.get(module)
        if found is not None and isinstance(obj, tuple(getattr(found, n) for n in names)):
            return True
    return False


def _enc(obj: Any, out: list[str], active: set[int]) -> None:
    t = type(obj)
    if obj is None:
        out.append("null")
    elif t is bool:
        out.append("true" if obj else "false")
    elif t is int:
        out.append(str(obj))
    elif t is float:
        # repr keeps a '.' or an 'e' so 1.0 never meets 1; -0.0 stays distinct. inf, -inf and
        # nan stay bare words: every string is quoted, so no string can meet them.
        out.append(repr(obj))
    elif t is str:
        out.append(json.dumps(obj, ensure_ascii=False))
    elif t is bytes:
        out.append(f'b"{obj.hex()}"')
    elif isinstance(obj, enum.Enum):
        out.append(f"enum:{_qualname(t)}.{obj.name}")
    else:
        oid = id(obj)
        if oid in active:
            raise Uncacheable("cyclic argument")
        active.add(oid)
        try:
            _enc_container(obj, t, out, active)
        finally:
            active.discard(oid)


def _enc_container(obj: Any, t: type, out: list[str], active: set[int]) -> None:
    if t is list or t is tuple:
        out.append("[" if t is list else "(")
        for x in obj:
            _enc(x, out, active)
            out.append(",")
        out.append("]" if t is list else ")")
    elif isinstance(obj, Mapping):
        items = []
        for k, v in obj.items():
            kp: list[str] = []
            _enc(k, kp, active)
            vp: list[str] = []
            _enc(v, vp, active)
            items.append(("".join(kp), "".join(vp)))
        if not isinstance(obj, OrderedDict):
            # Equal dicts are equal in any order; OrderedDicts are equal only in the same order.
            items.sort()
        prefix = "" if t is dict else _qualname(t)
        out.append(prefix + "{" + ",".join(f"{k}:{v}" for k, v in items) + "}")
    elif isinstance(obj, set | frozenset):
        encoded = []
        for x in obj:
            xp: list[str] = []
            _enc(x, xp, active)
            encoded.append("".join(xp))
        encoded.sort()
        out.append(("set" if t is set else "frozenset") + "{" + ",".join(encoded) + "}")
    elif (
        dataclasses.is_dataclass(obj) and not isinstance(obj, type) and t.__dataclass_params__.eq  # type: ignore[attr-defined]
    ):
        # Compared by value: encoded by value (a dataclass with eq=False is known by identity).
        out.append(_qualname(t) + "(")
        for f in dataclasses.fields(obj):
            out.append(f.name + "=")
            _enc(getattr(obj, f.name), out, active)
            out.append(",")
        out.append(")")
    elif isinstance(obj, tuple):  # NamedTuple and other tuple subclasses
        out.append(_qualname(t) + "(")
        for x in obj:
            _enc(x, out, active)
            out.append(",")
        out.append(")")
    elif isinstance(obj, list):
        out.append(_qualname(t) + "[")
        for x in obj:
            _enc(x, out, active)
            out.append(",")
        out.append("]")
    elif isinstance(obj, bool | int | float | str | bytes):
        # A subclass of a scalar: its type and its value as the base type sees it (a custom
        # repr may leave the value out).
        out.append(_qualname(t) + ":")
        _enc(_base_value(obj), out, active)
    elif _repr_value(obj):
        out.append(_qualname(t) + ":" + json.dumps(repr(obj), ensure_ascii=False))
    else:
        raise Uncacheable(
            f"a {_qualname(t)} argument has no canonical encoding (give the policy a "
            "cache_key= function)"
        )


def _base_value(obj: int | float | str | bytes) -> int | float | str | bytes:
    """The plain value of a scalar subclass, bypassing any override of the conversion."""
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        return float.__float__(obj)
    if isinstance(obj, str):
        return str.__str__(obj)
    return bytes(memoryview(obj))


def _qualname(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"
