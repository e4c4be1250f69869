"""The two drivers of a :class:`~timebound.policies.Policy`: async (asyncio, trio) and sync.

They call, await, sleep and wait for admission; everything they *decide* comes from the policy's
:class:`~._retry.RetryPlan` (what follows a failure, whether an attempt may start) and from the
policy itself (cache, events, on_error). Their common happy path stays inline, so a call that
succeeds at once costs no decision objects beyond the first.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

from .._core import _clock
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from .._core._scopes import (
    CancelScope,
    current_bound_error,
    current_bound_source,
    current_deadline,
    fail_after,
    fail_at,
    inherit_deadline,
    remaining,
)
from ..telemetry import enabled as _telemetry_enabled
from ._result import Ok
from ._retry import AttemptNow, FallBack, RetryAt, RetryState, Stop, misuse

if TYPE_CHECKING:
    from ._policy import Observer, Policy

__all__ = ["execute_async", "execute_sync"]

_INF: Final = math.inf
_NULL_CONTEXT: Final = nullcontext()
# "No cached value" (any value, None included, may be a result).
_MISS: Final[Any] = object()


# Cache and coalescing (D3.6) ---------------------------------------------------------------------


def _lookup(policy: Policy[Any], key: str, tele: bool, observer: Observer | None) -> Any:
    hit, value = policy.cache_get(key)
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
    key = None if flights is None else policy.key(fn, args, kwargs)
    if key is None:
        ok, result = await _retry_async(policy, fn, args, kwargs, tele, observer)
        if ok:
            if not tele and not policy._wrap:
                return result
            return policy.succeeded(None, result, tele, observer)
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
            return policy.succeeded(key, result, tele, observer)
        ending = result
    finally:
        flights.finish(key, _shared_failure(policy, ending))
    return await _end_async(policy, result, args, kwargs, tele, observer)


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
        return policy.absorb(ending, tele, observer)
    policy.report_fallback(ending, tele, observer)
    fb = policy.fallback
    if policy._fallback_callable:
        try:
            fb = fb(*args, **kwargs)
            if inspect.isawaitable(fb):
                fb = await fb
        except BaseException as exc:
            _in_context_of(exc, ending.error)
            raise
    return policy.fell_back(fb, tele, observer)


async def _retry_async(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> tuple[bool, Any]:
    """(True, value), or (False, the plan's FallBack/Stop)."""
    plan = policy.plan
    state = plan.start()
    plain = policy._plain
    scoped = policy._scoped
    name = policy.name
    try:
        while True:
            decision = plan.begin(state)
            if type(decision) is not AttemptNow:
                return False, decision
            attempt = decision.attempt
            if tele:
                policy.emit(observer, "attempt.start", attempt=attempt)
            try:
                if plain:
                    value = fn(*args, **kwargs)
                    if type(value) is CoroutineType or inspect.isawaitable(value):
                        value = await value
                elif scoped:
                    # The common "timeout, no admission" attempt, inlined: one coroutine less.
                    with _attempt_scope(policy, state):
                        value = fn(*args, **kwargs)
                        if type(value) is CoroutineType or inspect.isawaitable(value):
                            value = await value
                        else:
                            _raise_if_late(name)
                else:
                    value = await _attempt_async(policy, state, fn, args, kwargs)
            except Exception as exc:
                _attempt_failed(policy, attempt, exc, tele, observer)
                state, next_step = plan.failed(state, exc)
                if type(next_step) is not RetryAt:
                    return False, next_step
                with _between(policy, state):
                    if tele:
                        policy.emit(observer, "retry.delay", attempt=attempt, delay=next_step.delay)
                    if next_step.delay > 0:
                        await _asleep(next_step.delay)
                continue
            except BaseException as exc:
                if tele:
                    policy.cancelled("attempt", attempt, exc, observer)
                raise
            if tele:
                policy.emit(observer, "attempt.end", attempt=attempt, outcome="ok", error=None)
            return True, value
    except BaseException as exc:
        # Cancellation, KeyboardInterrupt, SystemExit pass through unchanged (D2.3).
        if tele:
            policy.cancelled("call", 0, exc, observer)
        raise


async def _attempt_async(
    policy: Policy[Any],
    state: RetryState,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Any:
    """An attempt with admission (throttle and/or concurrency)."""
    slots = policy._slots
    # D3.7: the scope is entered before admission, so waiting for a token or a slot counts
    # against the attempt timeout. D3.3: the scope's deadline is min(timeout, effective).
    with _NULL_CONTEXT if policy._attempt_timeout is None else _attempt_scope(policy, state):
        await _admit_async(policy)
        try:
            value = fn(*args, **kwargs)
            if type(value) is CoroutineType or inspect.isawaitable(value):
                return await value
        finally:
            if slots is not None:
                slots.release()
        if policy._attempt_timeout is not None:
            _raise_if_late(policy.name)
        return value


async def _admit_async(policy: Policy[Any]) -> None:
    bucket = policy._bucket
    slots = policy._slots
    if bucket is not None:
        wait = bucket.reserve()
        if wait > 0:
            try:
                await _asleep(wait)
            except BaseException:
                bucket.refund()
                raise
    if slots is not None:
        try:
            await slots.acquire()
        except BaseException:
            # No call was made: the attempt's token goes back to the bucket.
            if bucket is not None:
                bucket.refund()
            raise


# Sync driver ---------------------------------------------------------------------------------


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
    key = None if flights is None else policy.key(fn, args, kwargs)
    if key is None:
        ok, result = _retry_sync(policy, fn, args, kwargs, tele, observer)
        if ok:
            if not tele and not policy._wrap:
                return result
            return policy.succeeded(None, result, tele, observer)
        return _end_sync(policy, result, args, kwargs, tele, observer)
    assert flights is not None
    # A thread that runs an event loop must not block it waiting for a leader that may be a
    # task of that very loop: such a caller runs the call itself.
    may_follow = asyncio._get_running_loop() is None and not _in_trio()
    while True:
        found = _lookup(policy, key, tele, observer)
        if found is not _MISS:
            return found
        flight = flights.join(key) if may_follow else None
        if flight is None:
            break
        if not flights.wait_sync(flight):
            err = current_bound_error(policy.name)
            raise err if err is not None else _spent_now(policy)
        if flight.error is not None:
            return _end_sync(
                policy, policy.plan.conclude(flight.error), args, kwargs, tele, observer
            )
    ending: FallBack | Stop | None = None
    try:
        ok, result = _retry_sync(policy, fn, args, kwargs, tele, observer)
        if ok:
            return policy.succeeded(key, result, tele, observer)
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
        return policy.absorb(ending, tele, observer)
    policy.report_fallback(ending, tele, observer)
    fb = policy.fallback
    if policy._fallback_callable:
        try:
            fb = fb(*args, **kwargs)
        except BaseException as exc:
            _in_context_of(exc, ending.error)
            raise
        if inspect.isawaitable(fb):
            _discard(fb)
            raise TypeError(
                f"{policy.name}: the fallback returned an awaitable in a sync call; "
                "use a sync fallback or run the call with execute()"
            ) from ending.error
    return policy.fell_back(fb, tele, observer)


def _retry_sync(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> tuple[bool, Any]:
    """(True, value), or (False, the plan's FallBack/Stop)."""
    plan = policy.plan
    state = plan.start()
    plain = policy._plain
    name = policy.name
    try:
        while True:
            decision = plan.begin(state)
            if type(decision) is not AttemptNow:
                return False, decision
            attempt = decision.attempt
            if tele:
                policy.emit(observer, "attempt.start", attempt=attempt)
            try:
                value = (
                    _call_sync(name, fn, args, kwargs)
                    if plain
                    else _attempt_sync(policy, state, fn, args, kwargs)
                )
            except Exception as exc:
                _attempt_failed(policy, attempt, exc, tele, observer)
                state, next_step = plan.failed(state, exc)
                if type(next_step) is not RetryAt:
                    return False, next_step
                with _between(policy, state):
                    if tele:
                        policy.emit(observer, "retry.delay", attempt=attempt, delay=next_step.delay)
                    if next_step.delay > 0:
                        _clock.sleep(next_step.delay)
                continue
            except BaseException as exc:
                if tele:
                    policy.cancelled("attempt", attempt, exc, observer)
                raise
            if tele:
                policy.emit(observer, "attempt.end", attempt=attempt, outcome="ok", error=None)
            return True, value
    except BaseException as exc:
        # Cancellation, KeyboardInterrupt, SystemExit pass through unchanged (D2.3).
        if tele:
            policy.cancelled("call", 0, exc, observer)
        raise


def _attempt_sync(
    policy: Policy[Any],
    state: RetryState,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
) -> Any:
    """An attempt with a scope and/or admission, run to its end (cooperative)."""
    slots = policy._slots
    with _NULL_CONTEXT if policy._attempt_timeout is None else _attempt_scope(policy, state):
        if not policy._scoped:  # a scope alone needs no admission (and no call for it)
            _admit_sync(policy)
        try:
            value = _call_sync(policy.name, fn, args, kwargs)
        finally:
            if slots is not None:
                slots.release()
        if policy._attempt_timeout is not None:
            # The attempt ran to its end; if a bound passed meanwhile the result is late
            # (D1.7). The enclosing bound wins a tie, as it does in asyncio.
            _raise_if_late(policy.name)
        return value


def _admit_sync(policy: Policy[Any]) -> None:
    bucket = policy._bucket
    slots = policy._slots
    if bucket is not None:
        wait = bucket.reserve()
        if wait > 0:
            left = remaining()
            # The wait counts against the attempt: sleep at most to the deadline, then fail
            # there, exactly when an asyncio attempt would be cancelled.
            _clock.sleep(min(wait, left))
            if wait >= left:
                bucket.refund()
                raise _spent_now(policy)
    if slots is not None:
        left = remaining()
        if not slots.acquire_sync(None if left == _INF else left):
            if bucket is not None:
                bucket.refund()
            raise _spent_now(policy)


def _spent_now(policy: Policy[Any]) -> DeadlineExceeded:
    err = current_bound_error(policy.name)
    if err is not None:
        return err
    # A real-time wait ended while a virtual clock stood still; report the binding bound.
    return DeadlineExceeded(
        source=current_bound_source() or "attempt",
        timeout=policy.timeout,
        deadline=current_deadline(),
        what=policy.name,
    )


# Shared pieces ------------------------------------------------------------------------------


def _attempt_failed(
    policy: Policy[Any], attempt: int, exc: Exception, tele: bool, observer: Observer | None
) -> None:
    if tele:
        policy.emit(
            observer,
            "attempt.end",
            attempt=attempt,
            outcome="timeout" if isinstance(exc, DeadlineExceeded) else "error",
            error=exc,
        )


def _attempt_scope(policy: Policy[Any], state: RetryState) -> CancelScope:
    """The one cancel scope of an attempt: its own timeout or the total budget, the earlier.

    D3.3: inside it the effective deadline is min(timeout, total, enclosing bounds); the core
    reports whichever bound fires. The total budget is not a separate scope around the loop
    (that would cost a second scope per call): each attempt's scope ends at the earlier of
    the two, and the plan checks the total between attempts. A tie goes to the total, as a
    tie with any enclosing bound does.
    """
    t = policy._attempt_timeout
    assert t is not None
    total_at = state.total_at
    if total_at is not None and _clock.now() + t >= total_at.when:
        return fail_at(total_at, source="total", what=policy.name)
    return fail_after(t, source="attempt", what=policy.name)


def _between(policy: Policy[Any], state: RetryState) -> AbstractContextManager[Any]:
    """The context of the delay between attempts: the total budget is visible there (D1.5).

    Inside an attempt the attempt scope already ends no later than the total; between
    attempts a non-cancelling bound makes ``current_deadline()`` (listeners of
    ``retry.delay``, anything that runs in this context during the wait) include it. It is
    entered only on the retry path, so the happy path pays nothing for it.
    """
    total_at = state.total_at
    if total_at is None:
        return _NULL_CONTEXT
    return inherit_deadline(
        Deadline(total_at.when), source="total", timeout=policy.plan.total_timeout
    )


def _call_sync(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    value = fn(*args, **kwargs)
    if type(value) is CoroutineType or inspect.isawaitable(value):
        _discard(value)
        raise misuse(
            f"{name}: the callable returned an awaitable in a sync call; "
            "await Policy.execute() for async callables"
        )
    return value


def _raise_if_late(name: str) -> None:
    """A sync callable cannot be interrupted: a result that came after a bound passed is late."""
    late = current_bound_error(name)
    if late is not None:
        raise late


def _in_context_of(exc: BaseException, failure: BaseException) -> None:
    """An error of the fallback reads as raised while handling the call's failure, as it would
    inside an ``except`` block."""
    if exc is not failure and exc.__context__ is None:
        exc.__context__ = failure


def _discard(awaitable: Awaitable[Any]) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # no "coroutine was never awaited" warning


def _in_trio() -> bool:
    trio = sys.modules.get("trio")
    if trio is None:
        return False
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return False
    return True


async def _asleep(seconds: float) -> None:
    if asyncio._get_running_loop() is not None:
        await asyncio.sleep(seconds)
        return
    trio = sys.modules.get("trio")
    if trio is None:
        raise RuntimeError("timebound policies run under asyncio or trio")
    await trio.sleep(seconds)
