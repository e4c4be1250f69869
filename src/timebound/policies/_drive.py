"""The two retry drivers of a :class:`~timebound.policies.Policy`: async (asyncio, trio) and sync.

They call, await, sleep and wait for admission; everything they *decide* (whether an attempt may
start, what follows a failure) comes from the policy's :class:`~._retry.RetryPlan`. The common
happy path stays inline, and a call that succeeds at once allocates no decision.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from types import CoroutineType
from typing import TYPE_CHECKING, Any, Final

from .._core import _clock
from .._core._breakdown import MARKS_MAX, add_mark, build
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded, set_by_of
from .._core._scopes import (
    _ROOT,
    CancelScope,
    _frame,
    current_bound_error,
    current_bound_source,
    current_deadline,
    fail_after,
    fail_at,
    inherit_deadline,
    record,
    remaining,
    running_loop,
)
from ._hedge import hedged_async, hedged_sync, hedged_threads_async, races_in_threads
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
    # D13: attempts, delays and waits are parts of the enclosing frame's breakdown (none
    # outside every frame); a call with a total budget keeps its own for that budget's error.
    trail = _Trail.of(_frame.get(), state.total_at, policy)
    try:
        while True:
            decision = plan.begin(state)
            if type(decision) is not AttemptNow:
                if trail is not None:
                    trail.ending(decision)
                return False, decision
            attempt = decision.attempt
            if tele:
                policy.emit(observer, "attempt.start", attempt=attempt)
            t0 = 0.0 if trail is None else _clock.now()
            try:
                if plain:
                    value = fn(*args, **kwargs)
                    if type(value) is CoroutineType or inspect.isawaitable(value):
                        value = await value
                elif scoped:
                    # The common "timeout, no admission" attempt, inlined: one coroutine less.
                    with _attempt_scope(policy, state) as sc:
                        if trail is not None:
                            trail.scope = sc
                        value = fn(*args, **kwargs)
                        if type(value) is CoroutineType or inspect.isawaitable(value):
                            value = await value
                        else:
                            _raise_if_late(name)
                elif policy._hedge is None:
                    value = await _attempt_async(policy, state, fn, args, kwargs, trail)
                elif races_in_threads(fn):
                    # D3.16: a sync callable raced in threads, awaited off the event loop.
                    value = await hedged_threads_async(
                        policy,
                        state,
                        partial(_attempt_sync, policy, state, fn, args, kwargs),
                        attempt,
                        tele,
                        observer,
                    )
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
                if trail is not None:
                    trail.attempt(t0, exc)
                _attempt_failed(policy, attempt, exc, tele, observer)
                state, next_step = plan.failed(state, exc)
                if type(next_step) is not RetryAt:
                    if tele:
                        _refused(policy, attempt, next_step, observer)
                    if trail is not None:
                        trail.ending(next_step)
                    return False, next_step
                t0 = 0.0 if trail is None else _clock.now()
                with _between(policy, state):
                    if tele:
                        policy.emit(observer, "retry.delay", attempt=attempt, delay=next_step.delay)
                    if next_step.delay > 0:
                        await _asleep(next_step.delay)
                if trail is not None:
                    trail.add("backoff", None, t0, _clock.now(), next_step.delay, "ok", None)
                continue
            except BaseException as exc:
                if trail is not None:
                    trail.attempt(t0, exc)
                if tele:
                    policy.cancelled("attempt", attempt, exc, observer)
                raise
            if trail is not None:
                trail.attempt(t0, None)
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
    trail: _Trail | None = None,
) -> Any:
    """An attempt with admission (throttle and/or concurrency)."""
    slots = policy._slots
    breaker = policy._breaker
    # D3.7: the scope is entered before admission, so waiting for a token or a slot counts
    # against the attempt timeout. D3.3: the scope's deadline is min(timeout, effective).
    # D3.13: the breaker sees the attempt from outside its scope (its own timeout included).
    with (
        _NULL_CONTEXT if breaker is None else breaker.guard(policy.plan),
        _NULL_CONTEXT if policy._attempt_timeout is None else _attempt_scope(policy, state) as sc,
    ):
        if trail is not None:
            # D13: the driver reads the parts recorded inside the attempt from its scope.
            trail.scope = sc
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
            t0 = _clock.now()
            try:
                await _asleep(wait)
            except BaseException:
                bucket.refund()
                record("throttle", policy.name, t0, _clock.now(), wait, "cut", None)
                raise
            record("throttle", policy.name, t0, _clock.now(), wait, "ok", None)
    if slots is not None:
        t0 = _clock.now()
        try:
            await slots.acquire()
        except BaseException:
            # No call was made: the attempt's token goes back to the bucket.
            if bucket is not None:
                bucket.refund()
            record("concurrency", policy.name, t0, _clock.now(), None, "cut", None)
            raise
        t1 = _clock.now()
        if t1 > t0:
            record("concurrency", policy.name, t0, t1, None, "ok", None)


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
    plan = policy.plan
    state = plan.start()
    plain = policy._plain
    name = policy.name
    trail = _Trail.of(_frame.get(), state.total_at, policy)  # D13, as in retry_async
    try:
        while True:
            decision = plan.begin(state)
            if type(decision) is not AttemptNow:
                if trail is not None:
                    trail.ending(decision)
                return False, decision
            attempt = decision.attempt
            if tele:
                policy.emit(observer, "attempt.start", attempt=attempt)
            t0 = 0.0 if trail is None else _clock.now()
            try:
                if plain:
                    value = _call_sync(name, fn, args, kwargs)
                elif policy._hedge is None:
                    value = _attempt_sync(policy, state, fn, args, kwargs, trail)
                else:
                    # D3.14: the attempts race in threads; the caller waits for the first success.
                    value = hedged_sync(
                        policy,
                        state,
                        partial(_attempt_sync, policy, state, fn, args, kwargs),
                        attempt,
                        tele,
                        observer,
                    )
            except Exception as exc:
                if trail is not None:
                    trail.attempt(t0, exc)
                _attempt_failed(policy, attempt, exc, tele, observer)
                state, next_step = plan.failed(state, exc)
                if type(next_step) is not RetryAt:
                    if tele:
                        _refused(policy, attempt, next_step, observer)
                    if trail is not None:
                        trail.ending(next_step)
                    return False, next_step
                t0 = 0.0 if trail is None else _clock.now()
                with _between(policy, state):
                    if tele:
                        policy.emit(observer, "retry.delay", attempt=attempt, delay=next_step.delay)
                    if next_step.delay > 0:
                        _clock.sleep(next_step.delay)
                if trail is not None:
                    trail.add("backoff", None, t0, _clock.now(), next_step.delay, "ok", None)
                continue
            except BaseException as exc:
                if trail is not None:
                    trail.attempt(t0, exc)
                if tele:
                    policy.cancelled("attempt", attempt, exc, observer)
                raise
            if trail is not None:
                trail.attempt(t0, None)
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
    trail: _Trail | None = None,
) -> Any:
    """An attempt with a scope and/or admission, run to its end (cooperative)."""
    slots = policy._slots
    breaker = policy._breaker
    with (
        _NULL_CONTEXT if breaker is None else breaker.guard(policy.plan),
        _NULL_CONTEXT if policy._attempt_timeout is None else _attempt_scope(policy, state) as sc,
    ):
        if trail is not None:
            trail.scope = sc
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
            t0 = _clock.now()
            _clock.sleep(min(wait, left))
            record("throttle", policy.name, t0, _clock.now(), wait, "ok" if wait < left else "cut")
            if wait >= left:
                bucket.refund()
                raise spent_now(policy)
    if slots is not None:
        left = remaining()
        t0 = _clock.now()
        got = slots.acquire_sync(None if left == _INF else left)
        t1 = _clock.now()
        if t1 > t0:
            record("concurrency", policy.name, t0, t1, None, "ok" if got else "cut")
        if not got:
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
        set_by=set_by_of(source, policy.name) if source in ("attempt", "total") else None,
    )


# Shared pieces ------------------------------------------------------------------------------


class _Trail:
    """D13: the parts of one policy call (attempts, delays) as they happen.

    Each part goes to the frame the call runs in, so a bound around the call that fires shows
    them; a call with a total budget also keeps them, for the breakdown of that budget's error
    (the total is no frame of its own, see :func:`_attempt_scope`). A call outside every frame
    and without a total has no trail at all.
    """

    __slots__ = ("frame", "marks", "policy", "scope", "t_call")

    frame: Any
    marks: list[Any] | None
    policy: Policy[Any]
    scope: CancelScope | None
    t_call: float

    @staticmethod
    def of(frame: Any, total_at: Deadline | None, policy: Policy[Any]) -> _Trail | None:
        if frame is _ROOT and total_at is None:
            return None
        t: _Trail = _new(_Trail)
        t.frame = None if frame is _ROOT else frame
        t.policy = policy
        t.scope = None
        if total_at is None:
            t.marks = None
            t.t_call = 0.0
        else:
            t.marks = []
            t.t_call = total_at.when - (policy.plan.total_timeout or 0.0)
        return t

    def add(
        self,
        kind: str,
        name: str | None,
        t0: float,
        t1: float,
        budget: float | None,
        outcome: str | None,
        sub: Any,
    ) -> None:
        m = (kind, name, t0, t1, budget, outcome, sub)
        if self.frame is not None:
            add_mark(self.frame, m)
        marks = self.marks
        if marks is not None and len(marks) < MARKS_MAX:
            marks.append(m)

    def attempt(self, t0: float, exc: BaseException | None) -> None:
        sc = self.scope
        self.scope = None
        if exc is None:
            outcome = "ok"
        elif isinstance(exc, DeadlineExceeded):
            outcome = "timeout"
        elif isinstance(exc, Exception):
            outcome = type(exc).__name__
        else:
            outcome = "cancelled"
        if sc is None:
            self.add("attempt", self.policy.name, t0, _clock.now(), None, outcome, None)
        else:
            budget = sc._timeout
            self.add("attempt", self.policy.name, t0, _clock.now(), budget, outcome, sc._marks)

    def ending(self, decision: Any) -> None:
        """The call ends without a value: a total budget's error gets the call's breakdown."""
        err = getattr(decision, "error", None)
        marks = self.marks
        if marks is None or not isinstance(err, DeadlineExceeded) or err.source != "total":
            return
        total = self.policy.plan.total_timeout
        err.breakdown = build(
            "bound",
            f"total {self.policy.name}",
            self.t_call,
            _clock.now(),
            total,
            "timeout",
            marks,
            len(marks),
        )


_new = object.__new__


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
        set_by=set_by_of("total", policy.name),
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
    if running_loop() is not None:
        import asyncio  # imported: its loop runs (sync callers never import it, D15.5)

        await asyncio.sleep(seconds)
        return
    trio = sys.modules.get("trio")
    if trio is None:
        raise RuntimeError("timebound policies run under asyncio or trio")
    await trio.sleep(seconds)
