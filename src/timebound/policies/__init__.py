"""Resilience policies: timeout, retry, backoff, fallback, cache, throttle, concurrency, on_error.

One implementation, composed as DECISIONS D3 orders it, used by ``timebound.resilient`` and by
every engine (the Constellation runtime builds one :class:`Policy` per call site)::

    policy = Policy("GetUser", timeout="2s", retry=3, delay="100ms", backoff="exponential")
    user = await policy.execute(get_user, (user_id,))

See ``docs/policies.md``.
"""

from ._cache import CacheBackend, InMemoryCache, cache_key
from ._decorator import resilient
from ._limits import Slots, TokenBucket
from ._options import MISSING
from ._policy import Observer, Policy
from ._result import Err, Ok, Result
from ._zero import zero_value_for

__all__ = [
    "MISSING",
    "CacheBackend",
    "Err",
    "InMemoryCache",
    "Observer",
    "Ok",
    "Policy",
    "Result",
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
    raise AttributeError(f"module 'timebound.policies' has no attribute {name!r}")
