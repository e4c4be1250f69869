"""Call caches (DECISIONS D3.6): key = policy name + canonical encoding of the arguments.

Only a success produced by the wrapped call itself is stored; failures, timeouts, fallback values
and on_error zero values never are. The TTL is the ``cache`` option's duration.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import math
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from .._core import _clock
from .._core._errors import ConfigurationError

__all__ = [
    "CacheBackend",
    "InMemoryCache",
    "cache_key",
    "get_cache_backend",
    "register_cache_backend",
]


@runtime_checkable
class CacheBackend(Protocol):
    """Where a policy keeps cached results. Both methods are synchronous and must be thread-safe.

    ``get`` returns ``(True, value)`` for a live entry and ``(False, None)`` otherwise (a cached
    ``None`` is a hit). ``set`` stores ``value`` for ``ttl`` seconds.
    """

    def get(self, key: str) -> tuple[bool, Any]: ...

    def set(self, key: str, value: Any, ttl: float) -> None: ...


class InMemoryCache:
    """A bounded in-process cache with per-entry TTL on timebound's clock (``_clock.now()``).

    When ``max_entries`` is reached the least recently stored or read entry is evicted.
    """

    def __init__(self, *, max_entries: int = 4096) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigurationError(
                f"max_entries must be an integer >= 1, got {max_entries!r}", option="max_entries"
            )
        self.max_entries = max_entries
        self._data: OrderedDict[str, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple[bool, Any]:
        """``(True, value)`` while the entry is younger than its TTL, else ``(False, None)``."""
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
            return True, value

    def set(self, key: str, value: Any, ttl: float) -> None:
        """Store ``value`` under ``key`` for ``ttl`` seconds."""
        expires = _clock.now() + ttl
        with self._lock:
            self._data[key] = (expires, value)
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


_registry: dict[str, CacheBackend] = {}
_registry_lock = threading.Lock()

# The default cache of each policy name lives as long as some policy with that name does, so two
# call sites of one module share it (D3.6) and nothing leaks once the policies are gone.
_defaults: weakref.WeakValueDictionary[str, InMemoryCache] = weakref.WeakValueDictionary()


def register_cache_backend(name: str, backend: CacheBackend) -> None:
    """Make ``backend`` available to policies as ``cache_backend=name``.

    Registering a name again replaces the backend for policies built afterwards.
    """
    if not isinstance(name, str) or not name:
        raise ConfigurationError("a cache backend name must be a non-empty string", option="name")
    if not isinstance(backend, CacheBackend):
        raise ConfigurationError(
            f"cache backend {name!r} must have get(key) and set(key, value, ttl) methods",
            option="cache_backend",
        )
    with _registry_lock:
        _registry[name] = backend


def get_cache_backend(name: str) -> CacheBackend:
    """The backend registered as ``name``; :class:`ConfigurationError` naming
    ``cache_backend`` when there is none."""
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "none registered"
        raise ConfigurationError(
            f"unknown cache_backend {name!r} (known: {known}); "
            "register it first with register_cache_backend(name, backend)",
            option="cache_backend",
        ) from None


def _default_cache(policy_name: str) -> InMemoryCache:
    with _registry_lock:
        cache = _defaults.get(policy_name)
        if cache is None:
            cache = InMemoryCache()
            _defaults[policy_name] = cache
        return cache


class Uncacheable(Exception):
    """An argument cannot be encoded canonically (a cycle); the call runs without the cache."""


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
    tuple). Unhashable arguments are fine. Objects of other types are encoded by their type and
    ``repr`` — give them a deterministic, injective ``repr`` or do not cache calls taking them.
    Raises :class:`Uncacheable` for a cyclic argument.
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


def _enc(obj: Any, out: list[str], active: set[int]) -> None:
    t = type(obj)
    if obj is None:
        out.append("null")
    elif t is bool:
        out.append("true" if obj else "false")
    elif t is int:
        out.append(str(obj))
    elif t is float:
        # repr keeps a '.', 'e', 'inf' or 'nan' so 1.0 never meets 1; -0.0 stays distinct.
        out.append(repr(obj) if math.isfinite(obj) else f'"float:{obj!r}"')
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
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
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
    elif isinstance(obj, int | float | str | bytes):  # subclasses of scalars
        out.append(_qualname(t) + ":" + json.dumps(repr(obj)))
    else:
        out.append(_qualname(t) + ":" + json.dumps(repr(obj), ensure_ascii=False))


def _qualname(t: type) -> str:
    return f"{t.__module__}.{t.__qualname__}"
