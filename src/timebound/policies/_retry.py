"""The retry decision core (DECISIONS D3.1-D3.4, D2.3, D2.5): what comes next, decided, not done.

:class:`RetryPlan` holds a policy's retry options and answers two questions, without calling,
awaiting or sleeping: *may an attempt start now?* (:meth:`RetryPlan.begin`) and *an attempt
failed with this error: what now?* (:meth:`RetryPlan.failed`). The answer is a decision:

- :class:`AttemptNow`: start attempt number ``attempt``;
- :class:`RetryAt`: wait until ``at`` (``delay`` seconds), then ask :meth:`begin` again;
- :class:`FallBack`: every attempt failed and the fallback applies to ``error``;
- :class:`Stop`: the call ends with ``error`` (``on_error`` may still turn it into a value).

Where the loop stands is a :class:`RetryState`, an immutable, picklable value (attempt number,
errors so far, when the next attempt may start, when the total budget ends), so a durable engine
can persist it between attempts and wait with a stored timer instead of a sleep. The sync and
async drivers of :class:`~timebound.policies.Policy` are two consumers of this core.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Final, NamedTuple

from .._core import _clock
from .._core._classify import classify, mark_enclosing
from .._core._deadline import Deadline
from .._core._durations import format_duration
from .._core._errors import DeadlineExceeded, RetryExhausted, set_by_of
from .._core._request import mark_spent
from .._core._scopes import (
    current_bound_error,
    current_bound_set_by,
    current_bound_source,
    current_deadline,
    remaining,
)
from ._budget import RetryBudget
from ._hints import retry_hint

__all__ = ["AttemptNow", "Decision", "FallBack", "RetryAt", "RetryPlan", "RetryState", "Stop"]

_INF: Final = math.inf
# The bounds a policy sets itself (D2.5): classify() tells them from the caller's.
_OWN_SOURCES: Final = frozenset({"attempt", "total"})
_rng = random.Random()


class RetryState(NamedTuple):
    """Where one call's retry loop stands. Immutable and picklable (errors are data, D2.4).

    ``attempt``: attempts started so far. ``errors``: each failed attempt's error, in order.
    ``next_at``: when the next attempt may start (after a delay), or ``None``. ``total_at``: the
    end of the policy's ``total_timeout``, or ``None``.
    """

    attempt: int = 0
    errors: tuple[BaseException, ...] = ()
    next_at: Deadline | None = None
    total_at: Deadline | None = None


class AttemptNow(NamedTuple):
    """Start attempt number ``attempt`` (1-based) now."""

    attempt: int


class RetryAt(NamedTuple):
    """Wait ``delay`` seconds, until ``at``, then ask :meth:`RetryPlan.begin` for ``attempt``."""

    attempt: int
    at: Deadline
    delay: float


class FallBack(NamedTuple):
    """Every attempt failed; the fallback replaces ``error`` (D3.4). ``reason``: why no retry
    followed when one was left (see :class:`Stop`)."""

    error: Exception
    reason: str | None = None


class Stop(NamedTuple):
    """The call ends with ``error``; ``absorbable`` is false for what ``on_error`` never turns
    into a value (a spent caller deadline, a misuse of the API). ``reason`` says why a retry
    that was left did not happen: ``retry_after_past_deadline``, ``retry_after_over_max_delay``,
    ``retry_refused_by_server`` (D3.11), ``retry_budget_exhausted`` (D3.12); ``None`` otherwise."""

    error: BaseException
    absorbable: bool
    reason: str | None = None


Decision = AttemptNow | RetryAt | FallBack | Stop

_FRESH: Final = RetryState()
_new_state: Final = tuple.__new__
_PREMADE: Final = 16
_ATTEMPTS: Final = tuple(AttemptNow(n) for n in range(_PREMADE))


_MISUSE: Final = "_timebound_misuse"


def misuse(message: str) -> TypeError:
    """A bug in the caller (an async callable run synchronously): a plain ``TypeError`` that a
    plan never retries and ``on_error`` never absorbs."""
    err = TypeError(message)
    setattr(err, _MISUSE, True)
    return err


def _is_misuse(exc: BaseException) -> bool:
    return getattr(exc, _MISUSE, False) is True


class RetryPlan:
    """A policy's retry options, and the decisions they lead to (see the module documentation).

    ``retry_on`` says which errors may be retried (by default every ``Exception``); ``fallback``
    whether one is configured and ``fallback_on`` what may trigger it. Cancellation,
    ``KeyboardInterrupt`` and ``SystemExit`` never reach a plan: drivers let them through (D2.3).
    """

    __slots__ = (
        "_fallback_on_deadline",
        "backoff",
        "budget",
        "delay",
        "fallback",
        "fallback_on",
        "jitter",
        "max_delay",
        "retry",
        "retry_on",
        "total_timeout",
        "what",
    )

    def __init__(
        self,
        what: str,
        *,
        retry: int = 0,
        delay: float | None = None,
        backoff: str = "fixed",
        max_delay: float = 30.0,
        jitter: bool | float = False,
        total_timeout: float | None = None,
        retry_on: Callable[[Exception], bool] | None = None,
        fallback: bool = False,
        fallback_on: tuple[type[BaseException], ...] | None = None,
        budget: RetryBudget | None = None,
    ) -> None:
        self.what = what
        self.budget = budget
        self.retry = retry
        self.delay = delay
        self.backoff = backoff
        self.max_delay = max_delay
        self.jitter = jitter
        self.total_timeout = total_timeout
        self.retry_on = retry_on
        self.fallback = fallback
        self.fallback_on = fallback_on
        # Only an explicit DeadlineExceeded lets a spent *caller* deadline reach the fallback.
        self._fallback_on_deadline = fallback_on is not None and DeadlineExceeded in fallback_on

    # The loop ----------------------------------------------------------------------------

    def start(self) -> RetryState:
        """The state of a call that starts now (its total budget, if any, starts with it)."""
        budget = self.budget
        if budget is not None:
            budget.deposit()  # D3.12: every call earns its share of retries
        total = self.total_timeout
        if total is None:
            return _FRESH  # immutable: one for every call without a total budget
        # Positional construction: RetryState(total_at=...) costs twice as much on every call.
        return _new_state(RetryState, (0, (), None, Deadline(_clock.now() + total)))

    def begin(self, state: RetryState) -> AttemptNow | FallBack | Stop:
        """D3.3: the next attempt may start unless the effective deadline or the total passed."""
        spent = current_bound_error(self.what)
        if spent is not None:
            mark_spent()  # D4.10: a spent request deadline marks the request, as clients do
        else:
            total_at = state.total_at
            if total_at is not None and _clock.now() >= total_at.when:
                spent = self._total_error(total_at.when)
        if spent is None:
            n = state.attempt + 1
            # Decisions are immutable: the first few are made once (the happy path allocates
            # nothing here).
            return _ATTEMPTS[n] if n < _PREMADE else AttemptNow(n)
        if state.errors:
            spent.__cause__ = state.errors[-1]
        return self.conclude(spent)

    def failed(
        self, state: RetryState, exc: Exception
    ) -> tuple[RetryState, RetryAt | FallBack | Stop]:
        """Attempt ``state.attempt + 1`` raised ``exc``: the new state and what comes next.

        Never retried: a misuse, an error ``retry_on`` rejects, a spent caller deadline or total
        (D2.5). After the last attempt: the error itself when ``retry`` is 0 (D3.1), else
        :class:`~timebound.RetryExhausted`. A delay the deadline cannot fit stops the loop
        without waiting (D3.3), with a ``DeadlineExceeded`` chained to ``exc``. A server's retry
        hint sets the earliest retry, and one past the deadline ends the call (D3.11); a spent
        retry budget ends it too (D3.12): both with ``exc`` and a ``reason``.
        """
        attempt = state.attempt + 1
        errors = (*state.errors, exc)
        state = state._replace(attempt=attempt, errors=errors, next_at=None)
        if _is_misuse(exc):
            return state, Stop(exc, False)
        total = state.total_at
        total_at = _INF if total is None else total.when
        if isinstance(exc, DeadlineExceeded):
            if self.is_callers(exc):
                return state, self.conclude(exc)  # D2.5: the caller's time is spent
            if exc.deadline == total and _clock.now() >= total_at:
                # The error carries its bound: this policy's own total budget fired, and no
                # further attempt could finish (D2.5).
                if exc.timeout is None:
                    exc.timeout = self.total_timeout
                return state, self.conclude(exc)
        retry_on = self.retry_on
        if retry_on is not None and not self._retryable(retry_on, exc):
            return state, self.conclude(exc)
        if attempt > self.retry:
            if self.retry == 0:
                return state, self.conclude(exc)  # D3.1: retry 0 surfaces the error unwrapped
            return state, self.conclude(_chained(RetryExhausted(errors, what=self.what), exc))
        wait = self.delay_after(attempt)
        now = _clock.now()
        left = remaining()
        if total_at != _INF:
            left = min(left, total_at - now)
        hint = retry_hint(exc)
        if hint is not None:
            # D3.11: the server's hint sets the earliest retry; one past the deadline (or past
            # max_delay, the user's cap on any wait) means no retry at all.
            refusal = self._hint_refusal(hint, left)
            if refusal is not None:
                reason, why = refusal
                exc.add_note(f"{self.what}: not retried after attempt {attempt}: {why}")
                return state, self.conclude(exc, reason)
            wait = max(wait, hint)
        if wait >= left:
            return state, self.conclude(_chained(self._no_room(attempt + 1, wait, total_at), exc))
        budget = self.budget
        if budget is not None and not budget.try_withdraw():
            # D3.12: the budget is spent; the dependency is not hit with more than its share.
            exc.add_note(
                f"{self.what}: not retried after attempt {attempt}: the retry budget is spent "
                f"({budget!r})"
            )
            return state, self.conclude(exc, "retry_budget_exhausted")
        at = Deadline(now + wait)
        return state._replace(next_at=at), RetryAt(attempt + 1, at, wait)

    def conclude(self, error: Exception, reason: str | None = None) -> FallBack | Stop:
        """How a call that failed with ``error`` ends: the fallback (D3.4) or ``error``;
        ``reason`` says why a retry that was left did not happen (see :class:`Stop`)."""
        if _is_misuse(error):
            return Stop(error, False)
        callers = self.is_callers(error)
        if self.fallback and self._fallback_applies(error, callers):
            return FallBack(error) if reason is None else FallBack(error, reason)
        return Stop(error, not callers) if reason is None else Stop(error, not callers, reason)

    def _hint_refusal(self, hint: float, left: float) -> tuple[str, str] | None:
        """(reason, explanation) when a server hint of ``hint`` seconds forbids a retry."""
        if hint == _INF:
            return "retry_refused_by_server", "the server's answer refuses a retry"
        if hint >= left:
            return (
                "retry_after_past_deadline",
                f"the server asks to wait {format_duration(hint)} before a retry, past the "
                f"deadline, which leaves {format_duration(left)}",
            )
        if hint > self.max_delay:
            return (
                "retry_after_over_max_delay",
                f"the server asks to wait {format_duration(hint)} before a retry, more than "
                f"max_delay ({format_duration(self.max_delay)})",
            )
        return None

    def is_callers(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the *caller's* deadline is spent (not this call's failure).

        Such an error is never retried (D2.5), never replaced by a fallback or an on_error value.
        :func:`~timebound.policies.classify` decides, with ``attempt`` and ``total`` as this
        policy's own budgets.
        """
        return isinstance(exc, DeadlineExceeded) and classify(exc, own=_OWN_SOURCES) != "own"

    def _retryable(self, retry_on: Callable[[Exception], bool], exc: Exception) -> bool:
        try:
            return bool(retry_on(exc))
        except Exception as broken:
            # A bug in the predicate ends the call with its own error, saying where it came from.
            broken.add_note(
                f"raised by the retry_on predicate of {self.what} while judging "
                f"{type(exc).__name__}: {exc}"
            )
            broken.__context__ = exc
            raise

    # Backoff -----------------------------------------------------------------------------

    def delay_after(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based), before the next one.

        D3.2: ``fixed`` waits D, ``linear`` n·D, ``exponential`` 2^(n-1)·D, all capped at
        ``max_delay``. Jitter is additive: it never shortens the computed delay and never pushes
        it past ``max_delay`` (so at the cap there is no room for it).
        """
        shortest, spread = self._delay_parts(attempt)
        if spread == 0.0:
            return shortest
        return min(shortest + _rng.uniform(0.0, spread), self.max_delay)

    def delay_bounds(self, attempt: int) -> tuple[float, float]:
        """The shortest and the longest wait :meth:`delay_after` can give after failed attempt
        ``attempt``: without jitter and with the most jitter can add (capped at ``max_delay``).
        The worst-case time check (``timebound.analysis``, D14.2) reads the schedule here."""
        shortest, spread = self._delay_parts(attempt)
        return shortest, min(shortest + spread, self.max_delay)

    def _delay_parts(self, attempt: int) -> tuple[float, float]:
        """(the computed delay, the most jitter may add to it): the one backoff formula."""
        d = self.delay
        if d is None:
            return 0.0, 0.0
        backoff = self.backoff
        if backoff == "fixed":
            base = d
        elif backoff == "linear":
            base = attempt * d
        else:
            # 2.0 ** 1023 is the largest finite power; beyond that the cap decides anyway.
            base = d * 2.0 ** min(attempt - 1, 1023)
        cap = self.max_delay
        if base >= cap:
            return cap, 0.0
        jitter = self.jitter
        if jitter is False:
            return base, 0.0
        return base, base if jitter is True else float(jitter)

    # Errors ------------------------------------------------------------------------------

    def _fallback_applies(self, exc: Exception, callers: bool) -> bool:
        if callers:
            return self._fallback_on_deadline
        fb_on = self.fallback_on
        if fb_on is None or isinstance(exc, fb_on):
            return True
        # "How did the call end": a RetryExhausted matches when its last attempt's error does.
        return (
            isinstance(exc, RetryExhausted)
            and bool(exc.errors)
            and isinstance(exc.errors[-1], fb_on)
        )

    def _total_error(self, total_at: float) -> DeadlineExceeded:
        return DeadlineExceeded(
            source="total",
            timeout=self.total_timeout,
            deadline=Deadline(total_at),
            what=self.what,
            set_by=set_by_of("total", self.what),
        )

    def _no_room(self, next_attempt: int, wait: float, total_at: float) -> DeadlineExceeded:
        """D3.3: the effective deadline cannot fit the next delay/attempt; stop without sleeping."""
        spent = current_bound_error(self.what)
        if spent is not None:
            mark_spent()  # D4.10
            return spent
        now = _clock.now()
        enclosing = current_deadline()
        if total_at <= enclosing.when:
            if now >= total_at:
                return self._total_error(total_at)
            return self._stopped(
                next_attempt, wait, "total", total_at - now, Deadline(total_at), self.total_timeout
            )
        err = self._stopped(
            next_attempt,
            wait,
            current_bound_source() or "scope",
            remaining(),
            enclosing,
            None,
            # Where the enclosing bound was set (D2.8): a server's reserve (D1.18) that leaves
            # no room is the server's to answer "deadline expired" for, as when it fires.
            current_bound_set_by(),
        )
        # The enclosing bound has not passed yet, so the classification needs to be told; and
        # when that bound is the request's own deadline, the server must answer "Deadline
        # expired" although it has not passed either (D4.10, as a client failing fast does).
        mark_spent(enclosing)
        return mark_enclosing(err)

    def _stopped(
        self,
        next_attempt: int,
        wait: float,
        source: str,
        left: float,
        deadline: Deadline,
        timeout: float | None,
        set_by: str | None = None,
    ) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"{self.what}: stopped before attempt {next_attempt}: the {source} deadline leaves "
            f"{format_duration(left)}, not enough for the {format_duration(wait)} delay and "
            "another attempt",
            source=source,
            timeout=timeout,
            deadline=deadline,
            what=self.what,
            set_by=set_by_of(source, self.what) if source == "total" else set_by,
        )


def _chained(err: Exception, cause: BaseException) -> Exception:
    """``err`` as ``raise err from cause`` would leave it."""
    err.__cause__ = cause
    return err
