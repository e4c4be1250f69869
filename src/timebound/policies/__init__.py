"""Resilience policies: timeout, retry, backoff, fallback, cache, throttle, concurrency, on_error.

One implementation, composed as DECISIONS D3 orders it, used by ``timebound.resilient`` and by
every engine (the Constellation runtime builds one :class:`Policy` per call site)::

    policy = Policy("GetUser", timeout="2s", retry=3, delay="100ms", backoff="exponential")
    user = await policy.execute(get_user, (user_id,))

See ``docs/policies.md``.
"""

from .._core._classify import Origin, bound_origin, classify, mark_enclosing
from ._cache import CacheBackend, InMemoryCache, cache_key
from ._decorator import resilient
from ._limits import Slots, TokenBucket
from ._options import MISSING
from ._policy import Observer, Policy
from ._result import Err, Ok, Result
from ._retry import AttemptNow, Decision, FallBack, RetryAt, RetryPlan, RetryState, Stop
from ._zero import zero_value_for

__all__ = [
    "MISSING",
    "AttemptNow",
    "CacheBackend",
    "Decision",
    "Err",
    "FallBack",
    "InMemoryCache",
    "Observer",
    "Ok",
    "Origin",
    "Policy",
    "Result",
    "RetryAt",
    "RetryPlan",
    "RetryState",
    "Slots",
    "Stop",
    "TokenBucket",
    "bound_origin",
    "cache_key",
    "classify",
    "mark_enclosing",
    "resilient",
    "zero_value_for",
]
