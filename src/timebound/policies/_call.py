"""One call under a policy, beginning and end (DECISIONS D3): the cache lookup and coalescing
before the retry loop, and after it the cache store, the fallback or ``on_error``.

The retry loop itself is ``_drive``'s; what follows a failure is the plan's (``_retry``).
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from .._core import _clock
from .._core._errors import DeadlineExceeded, RetryExhausted, set_by_of
from .._core._scopes import (
    current_bound_error,
    enter_reserve,
    exit_reserve,
    fail_after,
    record,
    running_loop,
)
from ..telemetry import enabled as _telemetry_enabled
from ._cache import CacheBackend, Uncacheable, canonical_arguments
from ._cache import cache_key as _encode_key
from ._drive import discard, in_trio, retry_async, retry_sync, spent_now
from ._result import Err, Ok
from ._retry import FallBack, Stop

if TYPE_CHECKING:
    from ._policy import Observer, Policy

__all__ = ["execute_async", "execute_sync"]

_log = logging.getLogger("timebound.policies")
_NO_KWARGS: Final[Mapping[str, Any]] = {}
# "No cached value" (any value, None included, may be a result).
_MISS: Final[Any] = object()


# Cache and coalescing (D3.6) ---------------------------------------------------------------------


def _lookup(policy: Policy[Any], key: str, tele: bool, observer: Observer | None) -> Any:
    hit, value = cache_get(policy, key)
    if not hit:
        return _MISS
    if tele:
        policy.emit(observer, "cache.hit")
        policy.emit(observer, "call.end", outcome="cached")
    return Ok(value) if policy._wrap else value


def _shared_failure(policy: Policy[Any], ending: FallBack | Stop | None) -> Exception | None:
    """What the followers of a leader that ended with ``ending`` get (see ``_flight``): the
    call's own failure; nothing when the leader's caller ran out of time or it succeeded."""
    if isinstance(ending, FallBack) or (isinstance(ending, Stop) and ending.absorbable):
        error = ending.error
        return error if isinstance(error, Exception) else None
    return None


async def execute_async(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    observer: Observer | None,
) -> Any:
    """``Policy.execute``: the cache (and coalescing), the retry loop, then the ending."""
    tele = observer is not None or _telemetry_enabled()
    if tele:
        policy.emit(observer, "call.start")
    flights = policy._flights
    key = None if flights is None else call_key(policy, fn, args, kwargs)
    if key is None:
        ok, result = await _retry_async(policy, fn, args, kwargs, tele, observer)
        if ok:
            if not tele and not policy._wrap:
                return result
            return succeeded(policy, None, result, tele, observer)
        return await _end_async(policy, result, args, kwargs, tele, observer)
    assert flights is not None
    while True:
        found = _lookup(policy, key, tele, observer)
        if found is not _MISS:
            return found
        flight = flights.join(key)
        if flight is None:
            break
        await flights.wait(flight)
        if flight.error is not None:
            shared = policy.plan.conclude(flight.error)
            return await _end_async(policy, shared, args, kwargs, tele, observer)
    ending: FallBack | Stop | None = None
    try:
        ok, result = await _retry_async(policy, fn, args, kwargs, tele, observer)
        if ok:
            return succeeded(policy, key, result, tele, observer)
        ending = result
    finally:
        flights.finish(key, _shared_failure(policy, ending))
    return await _end_async(policy, result, args, kwargs, tele, observer)


# A reserve for the fallback (D1.18) --------------------------------------------------------------


async def _retry_async(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> tuple[bool, Any]:
    """``retry_async``, under the policy's reserve when it has one."""
    reserve = policy._reserve
    if not reserve:
        return await retry_async(policy, fn, args, kwargs, tele, observer)
    try:
        frame = enter_reserve(reserve, set_by_of("attempt", policy.name) or policy.name)
    except DeadlineExceeded as refused:
        return False, _reserve_ending(policy, refused)  # D1.20: no attempt, the fallback may
    try:
        # The frame only shows the reserved instant; this scope (no deadline of its own) is the
        # first of this task under it, so it ends the attempts and delays there (D1.18).
        with fail_after(None):
            ok, result = await retry_async(policy, fn, args, kwargs, tele, observer)
    except DeadlineExceeded as err:
        if frame is None or getattr(err, "_timebound_binder", None) is not frame:
            raise
        return False, _reserve_ending(policy, err)
    finally:
        exit_reserve(frame)
    return ok, result if ok else _reserved_ending(policy, result)


def _retry_sync(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> tuple[bool, Any]:
    """``retry_sync``, under the policy's reserve when it has one."""
    reserve = policy._reserve
    if not reserve:
        return retry_sync(policy, fn, args, kwargs, tele, observer)
    try:
        frame = enter_reserve(reserve, set_by_of("attempt", policy.name) or policy.name)
    except DeadlineExceeded as refused:
        return False, _reserve_ending(policy, refused)
    try:
        with fail_after(None):  # as in _retry_async (cooperative here, D1.6)
            ok, result = retry_sync(policy, fn, args, kwargs, tele, observer)
    except DeadlineExceeded as err:
        if frame is None or getattr(err, "_timebound_binder", None) is not frame:
            raise
        return False, _reserve_ending(policy, err)
    finally:
        exit_reserve(frame)
    return ok, result if ok else _reserved_ending(policy, result)


def _reserved_ending(policy: Policy[Any], ending: FallBack | Stop) -> FallBack | Stop:
    """The ending of a call that ran under the reserve, seen from outside it.

    Inside, the reserve's instant is the caller's deadline, so a call it stopped (or a retry it
    left no room for) ended as "the caller's deadline is spent": no fallback, no ``on_error``
    (D2.5). Outside, the caller still has the reserve: that is what the fallback keeps it for.
    """
    if (
        isinstance(ending, Stop)
        and not ending.absorbable
        and isinstance(ending.error, DeadlineExceeded)
        and current_bound_error() is None
    ):
        return _reserve_ending(policy, ending.error)
    return ending


def _reserve_ending(policy: Policy[Any], error: DeadlineExceeded) -> FallBack | Stop:
    plan = policy.plan
    if plan.fallback and plan._fallback_applies(error, False):
        return FallBack(error)
    return Stop(error, True)


async def _end_async(
    policy: Policy[Any],
    ending: FallBack | Stop,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> Any:
    """A call that did not succeed: the fallback (D3.4), or on_error (D3.5)."""
    if isinstance(ending, Stop):
        return absorb(policy, ending, tele, observer)
    report_fallback(policy, ending, tele, observer)
    fb = policy.fallback
    if policy._fallback_callable:
        t0 = _clock.now()
        try:
            fb = fb(*args, **kwargs)
            if inspect.isawaitable(fb):
                fb = await fb
        except BaseException as exc:
            record("fallback", policy.name, t0, _clock.now(), None, type(exc).__name__)
            _in_context_of(exc, ending.error)
            raise
        record("fallback", policy.name, t0, _clock.now(), None, "ok")  # D13
    return fell_back(policy, fb, tele, observer)


def execute_sync(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    observer: Observer | None,
) -> Any:
    """``Policy.execute_sync``: as :func:`execute_async`, blocking."""
    tele = observer is not None or _telemetry_enabled()
    if tele:
        policy.emit(observer, "call.start")
    flights = policy._flights
    key = None if flights is None else call_key(policy, fn, args, kwargs)
    if key is None:
        ok, result = _retry_sync(policy, fn, args, kwargs, tele, observer)
        if ok:
            if not tele and not policy._wrap:
                return result
            return succeeded(policy, None, result, tele, observer)
        return _end_sync(policy, result, args, kwargs, tele, observer)
    assert flights is not None
    # A thread that runs an event loop must not block it waiting for a leader that may be a
    # task of that very loop: such a caller runs the call itself.
    may_follow = running_loop() is None and not in_trio()
    while True:
        found = _lookup(policy, key, tele, observer)
        if found is not _MISS:
            return found
        flight = flights.join(key) if may_follow else None
        if flight is None:
            break
        if not flights.wait_sync(flight):
            err = current_bound_error(policy.name)
            raise err if err is not None else spent_now(policy)
        if flight.error is not None:
            return _end_sync(
                policy, policy.plan.conclude(flight.error), args, kwargs, tele, observer
            )
    ending: FallBack | Stop | None = None
    try:
        ok, result = _retry_sync(policy, fn, args, kwargs, tele, observer)
        if ok:
            return succeeded(policy, key, result, tele, observer)
        ending = result
    finally:
        if may_follow:
            flights.finish(key, _shared_failure(policy, ending))
    return _end_sync(policy, result, args, kwargs, tele, observer)


def _end_sync(
    policy: Policy[Any],
    ending: FallBack | Stop,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> Any:
    if isinstance(ending, Stop):
        return absorb(policy, ending, tele, observer)
    report_fallback(policy, ending, tele, observer)
    fb = policy.fallback
    if policy._fallback_callable:
        t0 = _clock.now()
        try:
            fb = fb(*args, **kwargs)
        except BaseException as exc:
            record("fallback", policy.name, t0, _clock.now(), None, type(exc).__name__)
            _in_context_of(exc, ending.error)
            raise
        record("fallback", policy.name, t0, _clock.now(), None, "ok")  # D13
        if inspect.isawaitable(fb):
            discard(fb)
            raise TypeError(
                f"{policy.name}: the fallback returned an awaitable in a sync call; "
                "use a sync fallback or run the call with execute()"
            ) from ending.error
    return fell_back(policy, fb, tele, observer)


def succeeded(
    policy: Policy[Any], key: str | None, value: Any, tele: bool, observer: Observer | None
) -> Any:
    """The call itself produced ``value``: store it (D3.6), report it, wrap it."""
    if key is not None:
        assert policy._cache is not None
        if _cache_set(policy, policy._cache, key, value) and tele:
            policy.emit(observer, "cache.store")
    if tele:
        policy.emit(observer, "call.end", outcome="ok")
    return Ok(value) if policy._wrap else value


def fell_back(policy: Policy[Any], value: Any, tele: bool, observer: Observer | None) -> Any:
    if tele:
        policy.emit(observer, "call.end", outcome="fallback")
    return Ok(value) if policy._wrap else value


def report_fallback(
    policy: Policy[Any], decision: FallBack, tele: bool, observer: Observer | None
) -> None:
    if tele:
        policy.emit(observer, "fallback", reason=_reason(decision.error), error=decision.error)


def absorb(policy: Policy[Any], stop: Stop, tele: bool, observer: Observer | None) -> Any:
    """on_error for a call that ended with ``stop.error`` (D3.5); raises for ``propagate``
    and for what is never absorbed (a spent caller deadline, a misuse)."""
    exc = stop.error
    mode = policy.on_error
    if mode == "propagate" or not stop.absorbable:
        if tele:
            policy.emit(observer, "call.end", outcome="error", error=exc)
        raise exc
    if tele:
        policy.emit(observer, "on_error", mode=mode, error=exc)
    if mode == "wrap":
        if tele:
            policy.emit(observer, "call.end", outcome="wrapped", error=exc)
        return Err(exc)
    if mode == "log":
        _log.warning(
            "%s failed, returning the zero value %r: %s: %s",
            policy.name,
            policy.zero,
            type(exc).__name__,
            exc,
        )
    if tele:
        policy.emit(observer, "call.end", outcome="skipped", error=exc)
    z = policy.zero
    return z if policy._zero_is_immutable else copy.deepcopy(z)


def call_key(
    policy: Policy[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> str | None:
    """The call's cache key, or ``None`` when it has no canonical encoding (run uncached).

    The key names the policy and the function (module and qualified name) so that a
    backend shared on purpose never mixes two functions' results (D3.6).
    """
    ident = f"{policy.name}:{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    key_fn = policy._key_fn
    try:
        if key_fn is not None:
            return _encode_key(ident, (key_fn(*args, **kwargs),), _NO_KWARGS)
        # f(1), f(a=1) and f(1, b=2) (b's default) are the same call: one cache entry.
        args, kwargs = canonical_arguments(fn, args, kwargs)
        return _encode_key(ident, args, kwargs)
    except (Uncacheable, RecursionError) as exc:
        # Said once per policy: a cache that never hits should not go unnoticed, nor flood logs.
        if policy._told_uncached:
            _log.debug("%s: call not cached: %s", policy.name, exc)
        else:
            policy._told_uncached = True
            _log.warning("%s: call not cached (said once per policy): %s", policy.name, exc)
        return None
    except Exception:
        # A cache_key function or an argument that fails: the call runs, uncached.
        _log.warning("%s: no cache key for this call; not cached", policy.name, exc_info=True)
        return None


def cache_get(policy: Policy[Any], key: str) -> tuple[bool, Any]:
    cache = policy._cache
    assert cache is not None
    try:
        return cache.get(key)
    except Exception:
        # The cache is an optimisation: a failing backend is a miss, never a failed call.
        _log.warning(
            "%s: cache backend get() failed; treating as a miss", policy.name, exc_info=True
        )
        return False, None


def _cache_set(policy: Policy[Any], cache: CacheBackend, key: str, value: Any) -> bool:
    try:
        cache.set(key, value, policy.cache)  # type: ignore[arg-type]
    except Exception:
        _log.warning(
            "%s: cache backend set() failed; result not cached", policy.name, exc_info=True
        )
        return False
    return True


def _in_context_of(exc: BaseException, failure: BaseException) -> None:
    """An error of the fallback reads as raised while handling the call's failure, as it would
    inside an ``except`` block."""
    if exc is not failure and exc.__context__ is None:
        exc.__context__ = failure


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RetryExhausted):
        return "retry_exhausted"
    if isinstance(exc, DeadlineExceeded):
        return "timeout"
    return "error"
