"""Checking a policy's options (DECISIONS D3): each bad value is a ConfigurationError naming it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, TypedDict, TypeVar

from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._cache import MEMORY, CacheBackend, InMemoryCache
from ._hedge import Hedge
from ._limits import Slots, TokenBucket, parse_throttle

__all__ = [
    "BACKOFFS",
    "MISSING",
    "ON_ERROR_MODES",
    "PolicyOptions",
    "RetryOn",
    "check_breaker",
    "check_cache_backend",
    "check_concurrency",
    "check_exception_types",
    "check_finite",
    "check_positive",
    "check_retry_on",
    "check_retry_budget",
    "check_throttle",
]

#: Marks "no fallback configured" (``None`` is a legitimate fallback value).
MISSING: Final[Any] = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()

# Ordered as the docs list them: the Constellation option table reads them for its messages.
BACKOFFS: Final = ("fixed", "linear", "exponential")
ON_ERROR_MODES: Final = ("propagate", "skip", "log", "wrap")

_OptFloat = TypeVar("_OptFloat", bound=float | None)

#: ``retry_on``: exception types, or a predicate taking the error.
RetryOn = type[Exception] | tuple[type[Exception], ...] | Callable[[Exception], bool]


class PolicyOptions(TypedDict, total=False):
    """The options a :class:`~timebound.policies.Policy` and ``resilient`` take as keywords,
    written once (``**options: Unpack[PolicyOptions]``). ``on_error`` and ``zero`` are not here:
    ``on_error`` picks the overload (what a call returns), and the two differ in ``zero``'s
    default. The defaults and the meaning of each are :class:`~timebound.policies.Policy`'s."""

    timeout: Duration | str | None
    timeout_floor: Duration | None
    retry: int
    retry_on: RetryOn | None
    delay: Duration | None
    backoff: str
    max_delay: Duration
    jitter: bool | Duration
    fallback: Any
    fallback_on: type[Exception] | tuple[type[Exception], ...] | None
    cache: Duration | None
    cache_backend: CacheBackend | str | None
    cache_key: Callable[..., Any] | None
    throttle: str | tuple[int, Duration] | TokenBucket | None
    concurrency: int | Slots | None
    total_timeout: Duration | None
    retry_budget: RetryBudget | None
    breaker: CircuitBreaker | None
    hedge: Hedge | Duration | str | None
    reserve: Duration | None


def check_positive(value: Duration | None, option: str) -> float | None:
    if value is None:
        return None
    return to_seconds(value, option=option, allow_zero=False)


def check_finite(value: _OptFloat, option: str) -> _OptFloat:
    # A wait must end: an infinite delay would sleep forever, or be refused by every deadline.
    if value is not None and math.isinf(value):
        raise ConfigurationError(f"{option} must be finite", option=option)
    return value


def check_exception_types(value: Any, option: str) -> tuple[type[Exception], ...] | None:
    """``None``, or one or more ``Exception`` subclasses as a tuple."""
    if value is None:
        return None
    types_ = value if isinstance(value, tuple) else (value,)
    if not types_:
        raise ConfigurationError(f"{option} must name at least one exception type", option=option)
    for t in types_:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise ConfigurationError(f"{option} must be exception types, got {t!r}", option=option)
        if not issubclass(t, Exception):
            # D2.3: cancellation, KeyboardInterrupt and SystemExit are never retried and never
            # trigger a fallback.
            raise ConfigurationError(
                f"{option} cannot include {t.__name__}: cancellation, KeyboardInterrupt and "
                "SystemExit are never retried and never trigger a fallback",
                option=option,
            )
    return types_


def check_retry_on(value: Any) -> Callable[[Exception], bool] | None:
    """``retry_on``: exception type(s), or a predicate taking the error; as a predicate."""
    if value is None:
        return None
    if callable(value) and not isinstance(value, type):
        predicate: Callable[[Exception], bool] = value
        return predicate
    types_ = check_exception_types(value, "retry_on")
    assert types_ is not None

    def matches(exc: Exception) -> bool:
        return isinstance(exc, types_)

    return matches


def check_throttle(value: Any) -> TokenBucket | None:
    """``"N/duration"``, ``(N, duration)`` (a bucket of this policy's own) or a shared bucket."""
    if value is None or isinstance(value, TokenBucket):
        return value
    return TokenBucket(*parse_throttle(value))


def check_concurrency(value: Any) -> Slots | None:
    """An integer >= 1 (slots of this policy's own) or a shared :class:`Slots`."""
    if value is None or isinstance(value, Slots):
        return value
    return Slots(value)


def check_cache_backend(value: CacheBackend | str | None) -> CacheBackend | None:
    """``None``, ``"memory"`` (a cache of the policy's own) or a backend object."""
    if value is None:
        return None
    if isinstance(value, str):
        if value == MEMORY:
            return InMemoryCache()
        raise ConfigurationError(
            f"unknown cache_backend {value!r}: pass the backend object itself "
            f"(cache_backend=my_cache); the only name known everywhere is {MEMORY!r}, "
            "a cache of this policy's own",
            option="cache_backend",
        )
    if not isinstance(value, CacheBackend):
        raise ConfigurationError(
            f"cache_backend must be {MEMORY!r} or an object with get(key) and "
            f"set(key, value, ttl), got {type(value).__name__}",
            option="cache_backend",
        )
    return value


def check_retry_budget(value: Any) -> RetryBudget | None:
    """A :class:`RetryBudget` (one object shared by the policies given it, D3.12) or ``None``."""
    if value is None or isinstance(value, RetryBudget):
        return value
    raise ConfigurationError(
        f"retry_budget must be a RetryBudget object, got {type(value).__name__} "
        "(write retry_budget=RetryBudget(0.2) for retries up to 20 % of calls)",
        option="retry_budget",
    )


def check_breaker(value: Any) -> CircuitBreaker | None:
    """A :class:`CircuitBreaker` (one object shared by the policies given it, D3.13) or ``None``."""
    if value is None or isinstance(value, CircuitBreaker):
        return value
    raise ConfigurationError(
        f"breaker must be a CircuitBreaker object, got {type(value).__name__} "
        "(write breaker=CircuitBreaker(failure_ratio=0.5, min_calls=20))",
        option="breaker",
    )
