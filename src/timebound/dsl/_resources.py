"""The caches and limiters of one compiled program, which its call sites' policies share
(D3.6, D3.7): built by the lower pass, one set per program, none shared by name across
programs.
"""

from __future__ import annotations

from typing import Any

from .._core._errors import ConfigurationError

__all__ = ["ProgramResources", "resolve_cache_backend"]


def resolve_cache_backend(registry: Any, name: str | None) -> Any:
    """The backend ``registry`` registered as ``name`` (None for ``"memory"``, the program's
    own); :class:`~timebound.ConfigurationError` naming the known ones when there is none."""
    if name is None or name == "memory":
        return None
    cache = registry.cache_backend(name)
    if cache is None:
        known = ", ".join(repr(n) for n in registry.cache_backend_names())
        raise ConfigurationError(
            f"unknown cache_backend {name!r} (known: {known}); register it with "
            "registry.register_cache_backend(name, backend)",
            option="cache_backend",
        )
    return cache


class ProgramResources:
    """The caches and limiters one compiled program owns (D3.6, D3.7).

    Every call site of a module in the program shares that module's cache, token bucket and
    slots; nothing is shared with another program, even one compiled from the same text against
    the same registry. ``cache_backend: "memory"`` (or none) is the program's own in-memory
    cache for the module; any other name is a backend registered on the registry on purpose.
    """

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._caches: dict[tuple[str, str], Any] = {}
        self._buckets: dict[str, Any] = {}
        self._slots: dict[str, Any] = {}

    def cache(self, module: str, backend: str | None) -> Any:
        """The cache of ``module`` in ``backend`` (``"memory"`` when None)."""
        from ..policies import InMemoryCache

        name = "memory" if backend is None else backend
        key = (module, name)
        cache = self._caches.get(key)
        if cache is None:
            if name == "memory":
                cache = InMemoryCache()
            else:
                cache = resolve_cache_backend(self._registry, name)
            self._caches[key] = cache
        return cache

    def bucket(self, module: str, count: int, per: float) -> Any:
        """The token bucket of ``module``'s throttle (one per module: the compiler rejects call
        sites that declare different throttles)."""
        from ..policies import TokenBucket

        bucket = self._buckets.get(module)
        if bucket is None:
            bucket = self._buckets[module] = TokenBucket(count, per)
        return bucket

    def slots(self, module: str, limit: int) -> Any:
        """The concurrency slots of ``module``."""
        from ..policies import Slots

        slots = self._slots.get(module)
        if slots is None:
            slots = self._slots[module] = Slots(limit)
        return slots
