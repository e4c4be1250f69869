"""One resilience policy for every engine: timeout, retry, backoff, fallback, cache, throttle,
concurrency and on_error, composed exactly as DECISIONS D3 orders them::

    cache lookup -> fallback( retry( admission -> timeout -> call ) ) -> on_error -> cache store

A :class:`Policy` is built once (options validated and precomputed there) and executed many times;
the Constellation runtime builds one per call site and ``timebound.resilient`` one per function.
What comes after a failed attempt is decided by the policy's :class:`~._retry.RetryPlan`; a
call's beginning and end (cache, coalescing, fallback, on_error) are ``_call``'s, and the sync and
async retry drivers (``_drive``) only call, await and sleep.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Generic, Literal, TypeVar, Unpack, overload

from .._core import _clock
from .._core._durations import Duration
from .._core._errors import ConfigurationError, DeadlineExceeded
from .._core._scopes import reserve_seconds
from ..telemetry import Event, current_correlation, emit
from . import _call
from ._breaker import CircuitBreaker
from ._budget import RetryBudget
from ._cache import CacheBackend, InMemoryCache
from ._flight import Flights
from ._hedge import Hedge, LatencyWindow, check_hedge, parse_percentile
from ._limits import Slots, TokenBucket
from ._options import (
    BACKOFFS,
    MISSING,
    ON_ERROR_MODES,
    PolicyOptions,
    RetryOn,
    check_breaker,
    check_cache_backend,
    check_concurrency,
    check_exception_types,
    check_finite,
    check_positive,
    check_retry_budget,
    check_retry_on,
    check_throttle,
)
from ._result import Err, Ok
from ._retry import RetryPlan

__all__ = ["BACKOFFS", "MISSING", "ON_ERROR_MODES", "Observer", "Policy"]

_log = logging.getLogger("timebound.policies")

#: Receives this execution's events, in addition to the global telemetry listeners.
Observer = Callable[[Event], None]

_T = TypeVar("_T")
#: ``Policy[Literal["wrap"]]`` returns ``Ok``/``Err``, ``Policy[Literal["plain"]]`` the value;
#: a mode known only at run time (``on_error=some_str``) is ``Policy[Literal["dynamic"]]``.
_Mode = TypeVar("_Mode", Literal["wrap"], Literal["plain"], Literal["dynamic"])
_NO_KWARGS: Final[Mapping[str, Any]] = {}
_IMMUTABLE_ZEROS: Final = (str, int, float, bool, bytes, complex, type(None), frozenset)
_PlainMode = Literal["propagate", "skip", "log"]


class Policy(Generic[_Mode]):
    """A validated, precomputed set of module-call options (DECISIONS D3).

    Every option is keyword-only and checked here; a bad one raises :class:`ConfigurationError`
    naming it. See ``docs/policies.md`` for the semantics of each option and of their
    composition.

    ``timeout``: per-attempt budget; an attempt gets ``min(timeout, remaining effective
    deadline)``. ``retry``: extra attempts (``retry=3`` → 4 attempts); ``retry_on``: which errors
    are retried (exception types or a predicate; every ``Exception`` by default).
    ``delay``/``backoff``/``max_delay``/``jitter``: the wait between attempts. ``fallback``: a
    value, or a callable taking the call's arguments (sync or async), used once every attempt
    failed; ``fallback_on`` narrows which errors trigger it. ``cache``: TTL of cached successes,
    kept in ``cache_backend`` (this policy's own in-memory cache by default); ``cache_key``: a
    function of the call's arguments giving its key, for arguments without a canonical
    encoding. ``on_error``: ``propagate`` | ``skip`` | ``log`` | ``wrap``, returning ``zero``
    for skip/log. ``throttle``: ``"N/duration"`` token bucket; ``concurrency``: slots; each of
    this policy's own unless a :class:`TokenBucket` / :class:`Slots` object is passed to share.
    ``reserve``: time kept from the caller's deadline for the fallback: the attempts and delays
    see that deadline less it, and when it runs out the fallback (or ``on_error``) still has it
    (D1.18). ``total_timeout``: a budget over every attempt and delay. ``retry_budget``: a
    :class:`RetryBudget` capping retries as a share of calls (D3.12). ``breaker``: a
    :class:`CircuitBreaker` failing attempts fast while the dependency fails (D3.13).
    ``hedge``: a delay (``"20ms"``, ``"p95"``) or a :class:`Hedge`: a slow attempt gets a
    backup, the first success wins (D3.14; for idempotent calls only). ``timeout="p99"`` with
    ``timeout_floor``: an attempt timeout learned from recent latencies (D3.15).
    """

    __slots__ = (
        "_attempt_timeout",
        "_breaker",
        "_bucket",
        "_cache",
        "_fallback_callable",
        "_flights",
        "_has_fallback",
        "_hedge",
        "_key_fn",
        "_latencies",
        "_plain",
        "_reserve",
        "_scoped",
        "_slots",
        "_timeout_floor",
        "_timeout_q",
        "_told_uncached",
        "_wrap",
        "_zero_is_immutable",
        "cache",
        "cache_backend",
        "concurrency",
        "fallback",
        "name",
        "on_error",
        "plan",
        "throttle",
        "timeout",
        "zero",
    )

    @overload
    def __init__(
        self: Policy[Literal["wrap"]],
        name: str,
        *,
        on_error: Literal["wrap"],
        zero: Any = None,
        **options: Unpack[PolicyOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: Policy[Literal["plain"]],
        name: str,
        *,
        on_error: _PlainMode = "propagate",
        zero: Any = None,
        **options: Unpack[PolicyOptions],
    ) -> None: ...

    @overload
    def __init__(
        self: Policy[Literal["dynamic"]],
        name: str,
        *,
        on_error: str = "propagate",
        zero: Any = None,
        **options: Unpack[PolicyOptions],
    ) -> None: ...

    def __init__(
        self,
        name: str,
        *,
        timeout: Duration | str | None = None,
        retry: int = 0,
        retry_on: RetryOn | None = None,
        delay: Duration | None = None,
        backoff: str = "fixed",
        max_delay: Duration = 30.0,
        jitter: bool | Duration = False,
        fallback: Any = MISSING,
        fallback_on: type[Exception] | tuple[type[Exception], ...] | None = None,
        cache: Duration | None = None,
        cache_backend: CacheBackend | str | None = None,
        cache_key: Callable[..., Any] | None = None,
        on_error: str = "propagate",
        zero: Any = None,
        throttle: str | tuple[int, Duration] | TokenBucket | None = None,
        concurrency: int | Slots | None = None,
        total_timeout: Duration | None = None,
        retry_budget: RetryBudget | None = None,
        breaker: CircuitBreaker | None = None,
        hedge: Hedge | Duration | str | None = None,
        timeout_floor: Duration | None = None,
        reserve: Duration | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("a policy needs a non-empty name", option="name")
        self.name = name
        # D1.18: the attempts and delays see the caller's deadline less this; the fallback and
        # on_error keep it.
        self._reserve = reserve_seconds(reserve)
        # D3.15: timeout="p99" is learned from this policy's recent latencies.
        self._timeout_q = parse_percentile(timeout, "timeout") if isinstance(timeout, str) else None
        self.timeout = None if self._timeout_q is not None else check_positive(timeout, "timeout")
        floor = check_finite(check_positive(timeout_floor, "timeout_floor"), "timeout_floor")
        if (floor is None) != (self._timeout_q is None):
            raise ConfigurationError(
                "a learned timeout needs a floor: write timeout='p99', timeout_floor='50ms'"
                if floor is None
                else "timeout_floor applies to a learned timeout ('p99') only",
                option="timeout_floor",
            )
        self._timeout_floor = floor
        if isinstance(retry, bool) or not isinstance(retry, int) or retry < 0:
            raise ConfigurationError(
                f"retry must be an integer >= 0, got {retry!r}", option="retry"
            )
        if backoff not in BACKOFFS:
            raise ConfigurationError(
                f"unknown backoff {backoff!r} (expected fixed, linear or exponential)",
                option="backoff",
            )
        max_delay_s = check_finite(check_positive(max_delay, "max_delay"), "max_delay")
        assert max_delay_s is not None
        jitter_s: bool | float
        if jitter is True:
            jitter_s = True
        elif jitter is False or jitter is None:
            jitter_s = False
        else:
            jitter_s = check_finite(check_positive(jitter, "jitter"), "jitter") or False

        self._has_fallback = fallback is not MISSING
        self.fallback = fallback
        self._fallback_callable = self._has_fallback and callable(fallback)
        fb_on = check_exception_types(fallback_on, "fallback_on")
        if fb_on is not None and not self._has_fallback:
            raise ConfigurationError(
                "fallback_on without fallback has no effect", option="fallback_on"
            )
        total = check_positive(total_timeout, "total_timeout")
        self.plan = RetryPlan(
            name,
            retry=retry,
            delay=check_finite(check_positive(delay, "delay"), "delay"),
            backoff=backoff,
            max_delay=max_delay_s,
            jitter=jitter_s,
            total_timeout=total,
            retry_on=check_retry_on(retry_on),
            fallback=self._has_fallback,
            fallback_on=fb_on,
            budget=check_retry_budget(retry_budget),
        )

        self.cache = check_positive(cache, "cache")
        self.cache_backend = check_cache_backend(cache_backend)
        if cache_key is not None and not callable(cache_key):
            raise ConfigurationError(
                f"cache_key must be a function of the call's arguments, got {cache_key!r}",
                option="cache_key",
            )
        self._key_fn = cache_key
        self._told_uncached = False
        self._cache: CacheBackend | None = None
        self._flights: Flights | None = None
        if self.cache is not None:
            # This policy's own cache unless one was passed: nothing is shared by name (D3.7).
            backend = self.cache_backend
            self._cache = InMemoryCache() if backend is None else backend
            # Calls in flight are coalesced per in-memory cache, so policies that share one
            # (the call sites of a module in a compiled program) also share their flights; keys
            # name the policy and the function, so nothing else meets.
            self._flights = (
                self._cache.flights if isinstance(self._cache, InMemoryCache) else Flights()
            )

        if on_error not in ON_ERROR_MODES:
            raise ConfigurationError(
                f"unknown on_error {on_error!r} (expected propagate, skip, log or wrap)",
                option="on_error",
            )
        self.on_error = on_error
        self._wrap = on_error == "wrap"
        self.zero = zero
        self._zero_is_immutable = isinstance(zero, _IMMUTABLE_ZEROS)

        self._bucket = check_throttle(throttle)
        self.throttle = None if self._bucket is None else (self._bucket.count, self._bucket.per)
        self._slots = check_concurrency(concurrency)
        self.concurrency = None if self._slots is None else self._slots.limit

        # An attempt needs a cancel scope when it has its own timeout, or when a total budget
        # must be able to stop it (the scope then catches the total bound and reports it).
        if self._timeout_q is not None:
            self._attempt_timeout: float | None = float("inf")  # learned per attempt
        elif self.timeout is not None:
            self._attempt_timeout = self.timeout
        elif total is not None:
            self._attempt_timeout = float("inf")
        else:
            self._attempt_timeout = None
        self._breaker = check_breaker(breaker)
        self._hedge = check_hedge(hedge)
        # This policy's recent latencies (a learned hedging delay, D3.14): its own, always.
        self._latencies: LatencyWindow | None = None
        if self._hedge is not None or self._timeout_q is not None:
            samples = 20 if self._hedge is None else self._hedge.min_samples
            self._latencies = LatencyWindow(min_samples=samples)
        # Hooks around an attempt (admission, a breaker, hedging) take it off the inline paths.
        hooked = (
            self._bucket is not None
            or self._slots is not None
            or self._breaker is not None
            or self._latencies is not None
        )
        # The happy path of a policy with nothing but retries and a fallback: no scope, no
        # admission, no cache.
        self._plain = self._attempt_timeout is None and not hooked
        # An attempt with a scope but no admission: the async loop runs it inline.
        self._scoped = self._attempt_timeout is not None and not hooked

    # Read-only views of the retry options (the plan holds them).

    @property
    def retry(self) -> int:
        return self.plan.retry

    @property
    def delay(self) -> float | None:
        return self.plan.delay

    @property
    def backoff(self) -> str:
        return self.plan.backoff

    @property
    def max_delay(self) -> float:
        return self.plan.max_delay

    @property
    def jitter(self) -> bool | float:
        return self.plan.jitter

    @property
    def total_timeout(self) -> float | None:
        return self.plan.total_timeout

    @property
    def reserve(self) -> float:
        """Seconds of the caller's deadline kept for the fallback (D1.18); ``0.0`` for none."""
        return self._reserve

    @property
    def retry_budget(self) -> RetryBudget | None:
        return self.plan.budget

    @property
    def breaker(self) -> CircuitBreaker | None:
        return self._breaker

    @property
    def hedge(self) -> Hedge | None:
        return self._hedge

    def unhedged(self) -> Policy[_Mode]:
        """This policy without hedging, for calls that must not be sent twice (D3.18).

        The copy shares everything else with this policy — breaker, retry budget, limits,
        latency window — so a client's idempotent and non-idempotent requests to one
        dependency are counted, limited and learned from together. ``self`` when not hedged.
        """
        if self._hedge is None:
            return self
        twin = copy.copy(self)
        twin._hedge = None
        return twin

    def learned_timeout(self) -> float | None:
        """The attempt timeout a ``timeout="p99"`` policy gives its next attempt: the
        percentile of recent latencies, never below ``timeout_floor``; ``None`` while fewer
        than 20 latencies are known (the attempt is bounded by the deadline only) or when the
        timeout is not learned (D3.15)."""
        q = self._timeout_q
        if q is None or self._latencies is None:
            return None
        learned = self._latencies.percentile(q)
        if learned is None:
            return None
        floor = self._timeout_floor
        return learned if floor is None or learned >= floor else floor

    @property
    def fallback_on(self) -> tuple[type[BaseException], ...] | None:
        return self.plan.fallback_on

    def delay_after(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based), before the next one."""
        return self.plan.delay_after(attempt)

    def __repr__(self) -> str:
        opts = []
        for opt in (
            "timeout",
            "retry",
            "delay",
            "backoff",
            "cache",
            "on_error",
            "throttle",
            "concurrency",
            "total_timeout",
        ):
            opts.append(f"{opt}={getattr(self, opt)!r}")
        return f"Policy({self.name!r}, {', '.join(opts)})"

    # Running -------------------------------------------------------------------------------

    @overload
    async def execute(
        self: Policy[Literal["wrap"]],
        fn: Callable[..., Awaitable[_T]],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Ok[_T] | Err: ...

    @overload
    async def execute(
        self: Policy[Literal["wrap"]],
        fn: Callable[..., _T],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Ok[_T] | Err: ...

    @overload
    async def execute(
        self: Policy[Literal["plain"]],
        fn: Callable[..., Awaitable[_T]],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> _T: ...

    @overload
    async def execute(
        self: Policy[Literal["plain"]],
        fn: Callable[..., _T],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> _T: ...

    @overload
    async def execute(
        self: Policy[Literal["dynamic"]],
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Any: ...

    async def execute(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` (sync or async) under this policy, in a coroutine.

        Works under asyncio and trio. Returns the call's value (``Ok``/``Err`` with
        ``on_error="wrap"``), the fallback, or the zero value; raises as docs/policies.md says.
        """
        return await _call.execute_async(
            self, fn, args, _NO_KWARGS if kwargs is None else kwargs, observer
        )

    @overload
    def execute_sync(
        self: Policy[Literal["wrap"]],
        fn: Callable[..., _T],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Ok[_T] | Err: ...

    @overload
    def execute_sync(
        self: Policy[Literal["plain"]],
        fn: Callable[..., _T],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> _T: ...

    @overload
    def execute_sync(
        self: Policy[Literal["dynamic"]],
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Any: ...

    def execute_sync(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        observer: Observer | None = None,
    ) -> Any:
        """Run the sync callable ``fn(*args, **kwargs)`` under this policy.

        Same semantics as :meth:`execute`, with cooperative timeouts: a sync attempt cannot be
        interrupted, so one that overran its timeout raises ``DeadlineExceeded`` (source
        ``attempt``) when it returns — its result is late (D1.7). Delays sleep on timebound's
        clock; the limiters are thread-safe.
        """
        return _call.execute_sync(
            self, fn, args, _NO_KWARGS if kwargs is None else kwargs, observer
        )

    # Telemetry -------------------------------------------------------------------------------

    def emit(self, observer: Observer | None, name: str, **attrs: Any) -> None:
        attrs = {"policy": self.name, **attrs}
        if observer is not None:
            try:
                bound = attrs.get("error")
                bound = bound if isinstance(bound, DeadlineExceeded) else None
                observer(
                    Event(name, _clock.now(), attrs, current_correlation(), _clock.wall_ms(), bound)
                )
            except Exception:
                _log.exception("policy observer failed")
        emit(name, **attrs)

    # Endings -------------------------------------------------------------------------------

    def cancelled(
        self, where: str, attempt: int, exc: BaseException, observer: Observer | None
    ) -> None:
        """Report a cancellation (or KeyboardInterrupt, SystemExit) passing through (D2.3)."""
        if where == "attempt":
            self.emit(observer, "attempt.end", attempt=attempt, outcome="cancelled", error=exc)
        else:
            self.emit(observer, "call.end", outcome="cancelled")
