"""Resilience policies: timeout, retry, backoff, fallback, cache, throttle, concurrency, on_error.

One implementation, composed as DECISIONS D3 orders it, used by ``timebound.resilient`` and by
every engine (the Constellation runtime builds one :class:`Policy` per call site)::

    policy = Policy("GetUser", timeout="2s", retry=3, delay="100ms", backoff="exponential")
    user = await policy.execute(get_user, (user_id,))

See ``docs/policies.md``.
"""

from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._cache import CacheBackend, InMemoryCache, cache_key
from ._decorator import resilient
from ._hedge import Hedge
from ._limits import Slots, TokenBucket
from ._options import MISSING
from ._policy import Observer, Policy
from ._result import Err, Ok, Result
from ._zero import zero_value_for

__all__ = [
    "MISSING",
    "CacheBackend",
    "CircuitBreaker",
    "Err",
    "Hedge",
    "InMemoryCache",
    "Observer",
    "Ok",
    "Policy",
    "Result",
    "RetryBudget",
    "Slots",
    "TokenBucket",
    "cache_key",
    "resilient",
    "zero_value_for",
]

# Engine-building names moved to timebound.lowlevel; the old spelling works for one release.
_MOVED = frozenset(
    {
        "AttemptNow",
        "Decision",
        "FallBack",
        "Origin",
        "RetryAt",
        "RetryPlan",
        "RetryState",
        "Stop",
        "bound_origin",
        "classify",
        "mark_enclosing",
    }
)


# Removed names and where their job went. A module-level process-wide registry of named cache
# backends cannot be forwarded to: the new home is a method of the registry a program is
# compiled against, so the old import fails with a message saying what to write instead.
_REMOVED = {
    "register_cache_backend": (
        "timebound.policies.register_cache_backend() was removed: named cache backends are no "
        "longer shared through the process. Register one on the module registry your programs "
        "compile against, ModuleRegistry.register_cache_backend(name, backend) "
        "(from timebound.dsl import ModuleRegistry), or in Python pass the backend object "
        "itself: resilient(cache=..., cache_backend=backend)"
    ),
    "get_cache_backend": (
        "timebound.policies.get_cache_backend() was removed: named cache backends are no longer "
        "shared through the process; keep the backend object you registered with "
        "ModuleRegistry.register_cache_backend(name, backend) and pass it where it is needed"
    ),
}


def __getattr__(name: str) -> object:
    if name in _MOVED:
        import warnings

        from .._core import _classify
        from . import _retry

        warnings.warn(
            f"timebound.policies.{name} moved to timebound.lowlevel.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(_retry, name, None) or getattr(_classify, name)
    message = _REMOVED.get(name)
    if message is not None:
        # ImportError, not AttributeError: ``from timebound.policies import <name>`` replaces
        # an AttributeError by a bare "cannot import name", losing the message.
        raise ImportError(message, name=name, path=__file__)
    raise AttributeError(f"module 'timebound.policies' has no attribute {name!r}")
