"""The two retry drivers of a :class:`~timebound.policies.Policy`: async (asyncio, trio) and sync.

They call, await, sleep and wait for admission; everything they *decide* (whether an attempt may
start, what follows a failure) comes from the policy's :class:`~._retry.RetryPlan`. The common
happy path stays inline, and a call that succeeds at once allocates no decision.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

from .._core import _clock
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded, bound_origin
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
from ._hedge import hedged_async
from ._retry import AttemptNow, FallBack, RetryAt, RetryState, Stop, misuse

if TYPE_CHECKING:
    from ._policy import Observer, Policy

__all__ = ["discard", "in_trio", "retry_async", "retry_sync", "spent_now"]

_INF: Final = math.inf
_NULL_CONTEXT: Final = nullcontext()
# "No cached value" (any value, None included, may be a result).
_MISS: Final[Any] = object()


async def retry_async(
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
                elif policy._hedge is None:
                    value = await _attempt_async(policy, state, fn, args, kwargs)
                else:
                    # D3.14: the attempt races its hedges; each is a whole attempt of its own.
                    value = await hedged_async(
                        policy,
                        state,
                        partial(_attempt_async, policy, state, fn, args, kwargs),
                        attempt,
                        tele,
                        observer,
                    )
            except Exception as exc:
                _attempt_failed(policy, attempt, exc, tele, observer)
                state, next_step = plan.failed(state, exc)
                if type(next_step) is not RetryAt:
                    if tele:
                        _refused(policy, attempt, next_step, observer)
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
        # Cancellation, KeyboardInterrupt, SystemExit pass through unchanged (D2.3); an
        # Exception here is the user's retry_on predicate failing.
        if tele:
            if isinstance(exc, Exception):
                policy.emit(observer, "call.end", outcome="error", error=exc)
            else:
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
    breaker = policy._breaker
    # D3.7: the scope is entered before admission, so waiting for a token or a slot counts
    # against the attempt timeout. D3.3: the scope's deadline is min(timeout, effective).
    # D3.13: the breaker sees the attempt from outside its scope (its own timeout included).
    with (
        _NULL_CONTEXT if breaker is None else breaker.guard(policy.plan),
        _NULL_CONTEXT if policy._attempt_timeout is None else _attempt_scope(policy, state),
    ):
        start = 0.0 if policy._latencies is None else _clock.now()
        await _admit_async(policy)
        try:
            value = fn(*args, **kwargs)
            if type(value) is CoroutineType or inspect.isawaitable(value):
                value = await value
            elif policy._attempt_timeout is not None:
                _raise_if_late(policy.name)
        finally:
            if slots is not None:
                slots.release()
        latencies = policy._latencies
        if latencies is not None:
            latencies.record(_clock.now() - start)  # D3.14, D3.15: a success's latency
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


def retry_sync(
    policy: Policy[Any],
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    tele: bool,
    observer: Observer | None,
) -> tuple[bool, Any]:
    """(True, value), or (False, the plan's FallBack/Stop)."""
    if policy._hedge is not None:
        raise misuse(
            f"{policy.name}: a hedged policy runs async calls only (await Policy.execute()); "
            "a sync attempt cannot be cancelled when another one wins"
        )
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
                    if tele:
                        _refused(policy, attempt, next_step, observer)
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
        # Cancellation, KeyboardInterrupt, SystemExit pass through unchanged (D2.3); an
        # Exception here is the user's retry_on predicate failing.
        if tele:
            if isinstance(exc, Exception):
                policy.emit(observer, "call.end", outcome="error", error=exc)
            else:
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
    breaker = policy._breaker
    with (
        _NULL_CONTEXT if breaker is None else breaker.guard(policy.plan),
        _NULL_CONTEXT if policy._attempt_timeout is None else _attempt_scope(policy, state),
    ):
        start = 0.0 if policy._latencies is None else _clock.now()
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
        latencies = policy._latencies
        if latencies is not None:
            latencies.record(_clock.now() - start)  # D3.15: a success's latency
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
                raise spent_now(policy)
    if slots is not None:
        left = remaining()
        if not slots.acquire_sync(None if left == _INF else left):
            if bucket is not None:
                bucket.refund()
            raise spent_now(policy)


def spent_now(policy: Policy[Any]) -> DeadlineExceeded:
    err = current_bound_error(policy.name)
    if err is not None:
        return err
    # A real-time wait ended while a virtual clock stood still; report the binding bound.
    source = current_bound_source() or "attempt"
    return DeadlineExceeded(
        source=source,
        timeout=policy.timeout,
        deadline=current_deadline(),
        what=policy.name,
        set_by=bound_origin(source, policy.name) if source in ("attempt", "total") else None,
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


def _refused(
    policy: Policy[Any], attempt: int, ending: RetryAt | FallBack | Stop, observer: Observer | None
) -> None:
    """A retry was left but did not happen (D3.11, D3.12): the event names why."""
    if isinstance(ending, RetryAt) or ending.reason is None:
        return
    policy.emit(
        observer, "retry.refused", attempt=attempt, reason=ending.reason, error=ending.error
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
    if policy._timeout_q is not None:
        learned = policy.learned_timeout()  # D3.15
        if learned is not None:
            t = learned
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
        Deadline(total_at.when),
        source="total",
        timeout=policy.plan.total_timeout,
        set_by=bound_origin("total", policy.name),
    )


def _call_sync(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    value = fn(*args, **kwargs)
    if type(value) is CoroutineType or inspect.isawaitable(value):
        discard(value)
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


def discard(awaitable: Awaitable[Any]) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # no "coroutine was never awaited" warning


def in_trio() -> bool:
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
