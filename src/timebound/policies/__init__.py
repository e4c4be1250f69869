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
    message = _REMOVED.get(name)
    if message is not None:
        # ImportError, not AttributeError: ``from timebound.policies import <name>`` replaces
        # an AttributeError by a bare "cannot import name", losing the message.
        raise ImportError(message, name=name, path=__file__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
