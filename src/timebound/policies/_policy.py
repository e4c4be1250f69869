"""One resilience policy for every engine: timeout, retry, backoff, fallback, cache, throttle,
concurrency and on_error, composed exactly as DECISIONS D3 orders them::

    cache lookup -> fallback( retry( admission -> timeout -> call ) ) -> on_error -> cache store

A :class:`Policy` is built once (options validated and precomputed there) and executed many times;
the Constellation runtime builds one per call site and ``timebound.resilient`` one per function.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import math
import random
import sys
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from types import CoroutineType
from typing import Any, Final, TypeVar

from .._core import _clock
from .._core._classify import classify, mark_enclosing
from .._core._deadline import Deadline
from .._core._durations import Duration, format_duration, to_seconds
from .._core._errors import ConfigurationError, DeadlineExceeded, RetryExhausted
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
from ..telemetry import Event, emit
from ..telemetry import enabled as _telemetry_enabled
from ._cache import (
    CacheBackend,
    Uncacheable,
    _default_cache,
    cache_key,
    canonical_arguments,
    get_cache_backend,
)
from ._limits import Slots, TokenBucket, parse_throttle, shared_bucket, shared_slots
from ._result import Err, Ok

__all__ = ["BACKOFFS", "MISSING", "ON_ERROR_MODES", "Observer", "Policy"]

_log = logging.getLogger("timebound.policies")

#: Marks "no fallback configured" (``None`` is a legitimate fallback value).
MISSING: Final[Any] = type("_Missing", (), {"__repr__": lambda self: "MISSING"})()

BACKOFFS: Final = frozenset({"fixed", "linear", "exponential"})
ON_ERROR_MODES: Final = frozenset({"propagate", "skip", "log", "wrap"})

#: Receives this execution's events, in addition to the global telemetry listeners.
Observer = Callable[[Event], None]

_NO_KWARGS: Final[Mapping[str, Any]] = {}
_INF: Final = math.inf
# The bounds a policy sets itself (D2.5): classify() tells them from the caller's.
_OWN_SOURCES: Final = frozenset({"attempt", "total"})
_IMMUTABLE_ZEROS: Final = (str, int, float, bool, bytes, complex, type(None), frozenset)
_rng = random.Random()
# Internal markers: "no cached value" and "evaluate the fallback" (any value may be a result).
_MISS: Final[Any] = object()
_FALLBACK: Final[Any] = object()
_NULL_CONTEXT: Final = nullcontext()
_OptFloat = TypeVar("_OptFloat", bound=float | None)


def _check_positive(value: Duration | None, option: str) -> float | None:
    if value is None:
        return None
    return to_seconds(value, option=option, allow_zero=False)


def _check_finite(value: _OptFloat, option: str) -> _OptFloat:
    # A wait must end: an infinite delay would sleep forever, or be refused by every deadline.
    if value is not None and math.isinf(value):
        raise ConfigurationError(f"{option} must be finite", option=option)
    return value


def _check_exception_types(value: Any) -> tuple[type[BaseException], ...] | None:
    if value is None:
        return None
    types_ = value if isinstance(value, tuple) else (value,)
    if not types_:
        raise ConfigurationError(
            "fallback_on must name at least one exception type", option="fallback_on"
        )
    for t in types_:
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            raise ConfigurationError(
                f"fallback_on must be exception types, got {t!r}", option="fallback_on"
            )
        if not issubclass(t, Exception):
            # D2.3: cancellation, KeyboardInterrupt and SystemExit never trigger a fallback.
            raise ConfigurationError(
                f"fallback_on cannot include {t.__name__}: cancellation, KeyboardInterrupt and "
                "SystemExit never trigger a fallback",
                option="fallback_on",
            )
    return types_


class Policy:
    """A validated, precomputed set of module-call options (DECISIONS D3).

    Every option is keyword-only and checked here; a bad one raises :class:`ConfigurationError`
    naming it. See ``docs/policies.md`` for the semantics of each option and of their
    composition.

    ``timeout``: per-attempt budget; an attempt gets ``min(timeout, remaining effective
    deadline)``. ``retry``: extra attempts (``retry=3`` → 4 attempts). ``delay``/``backoff``/
    ``max_delay``/``jitter``: the wait between attempts (``fixed`` D, ``linear`` n·D,
    ``exponential`` 2^(n-1)·D, capped at ``max_delay``; ``jitter`` adds a random amount, never
    past the cap). ``fallback``: a value, or a callable taking the call's arguments (sync or
    async), used once every attempt failed; ``fallback_on`` narrows which errors trigger it.
    ``cache``: TTL of cached successes, kept in ``cache_backend``. ``on_error``: ``propagate`` |
    ``skip`` | ``log`` | ``wrap``, returning ``zero`` for skip/log. ``throttle``: ``"N/duration"``
    token bucket; ``concurrency``: slots; both shared by every policy with the same ``name``.
    ``total_timeout``: a budget over every attempt and delay.
    """

    __slots__ = (
        "_attempt_timeout",
        "_bucket",
        "_cache",
        "_fallback_callable",
        "_fallback_on_deadline",
        "_has_fallback",
        "_plain",
        "_scoped",
        "_slots",
        "_wrap",
        "_zero_is_immutable",
        "backoff",
        "cache",
        "cache_backend",
        "concurrency",
        "delay",
        "fallback",
        "fallback_on",
        "jitter",
        "max_delay",
        "name",
        "on_error",
        "retry",
        "throttle",
        "timeout",
        "total_timeout",
        "zero",
    )

    def __init__(
        self,
        name: str,
        *,
        timeout: Duration | None = None,
        retry: int = 0,
        delay: Duration | None = None,
        backoff: str = "fixed",
        max_delay: Duration = 30.0,
        jitter: bool | Duration = False,
        fallback: Any = MISSING,
        fallback_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
        cache: Duration | None = None,
        cache_backend: CacheBackend | str | None = None,
        on_error: str = "propagate",
        zero: Any = None,
        throttle: str | tuple[int, Duration] | None = None,
        concurrency: int | None = None,
        total_timeout: Duration | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError("a policy needs a non-empty name", option="name")
        self.name = name
        self.timeout = _check_positive(timeout, "timeout")
        if isinstance(retry, bool) or not isinstance(retry, int) or retry < 0:
            raise ConfigurationError(
                f"retry must be an integer >= 0, got {retry!r}", option="retry"
            )
        self.retry = retry
        self.delay = _check_finite(_check_positive(delay, "delay"), "delay")
        if backoff not in BACKOFFS:
            raise ConfigurationError(
                f"unknown backoff {backoff!r} (expected fixed, linear or exponential)",
                option="backoff",
            )
        self.backoff = backoff
        max_delay_s = _check_finite(_check_positive(max_delay, "max_delay"), "max_delay")
        assert max_delay_s is not None
        self.max_delay = max_delay_s
        if jitter is True:
            self.jitter: float | bool = True
        elif jitter is False or jitter is None:
            self.jitter = False
        else:
            self.jitter = _check_finite(
                to_seconds(jitter, option="jitter", allow_zero=False), "jitter"
            )

        self._has_fallback = fallback is not MISSING
        self.fallback = fallback
        self._fallback_callable = self._has_fallback and callable(fallback)
        fb_on = _check_exception_types(fallback_on)
        if fb_on is not None and not self._has_fallback:
            raise ConfigurationError(
                "fallback_on without fallback has no effect", option="fallback_on"
            )
        self.fallback_on = fb_on
        # Only an explicit DeadlineExceeded lets a spent *caller* deadline reach the fallback.
        self._fallback_on_deadline = fb_on is not None and DeadlineExceeded in fb_on

        self.cache = _check_positive(cache, "cache")
        backend: CacheBackend | None = None
        if isinstance(cache_backend, str):
            backend = get_cache_backend(cache_backend)
        elif cache_backend is not None:
            if not isinstance(cache_backend, CacheBackend):
                raise ConfigurationError(
                    "cache_backend must be None, a registered name or an object with "
                    "get(key) and set(key, value, ttl)",
                    option="cache_backend",
                )
            backend = cache_backend
        self.cache_backend = backend
        self._cache: CacheBackend | None = None
        if self.cache is not None:
            self._cache = backend if backend is not None else _default_cache(name)

        if on_error not in ON_ERROR_MODES:
            raise ConfigurationError(
                f"unknown on_error {on_error!r} (expected propagate, skip, log or wrap)",
                option="on_error",
            )
        self.on_error = on_error
        self._wrap = on_error == "wrap"
        self.zero = zero
        self._zero_is_immutable = isinstance(zero, _IMMUTABLE_ZEROS)

        self.throttle: tuple[int, float] | None = None
        self._bucket: TokenBucket | None = None
        if throttle is not None:
            self.throttle = parse_throttle(throttle)
            self._bucket = shared_bucket(name, *self.throttle)
        self._slots: Slots | None = None
        if concurrency is not None:
            if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
                raise ConfigurationError(
                    f"concurrency must be an integer >= 1, got {concurrency!r}",
                    option="concurrency",
                )
            self._slots = shared_slots(name, concurrency)
        self.concurrency = concurrency
        self.total_timeout = _check_positive(total_timeout, "total_timeout")

        # An attempt needs a cancel scope when it has its own timeout, or when a total budget
        # must be able to stop it (the scope then catches the total bound and reports it).
        if self.timeout is not None:
            self._attempt_timeout: float | None = self.timeout
        elif self.total_timeout is not None:
            self._attempt_timeout = _INF
        else:
            self._attempt_timeout = None
        # The happy path of a policy with nothing but retries and a fallback: no scope, no
        # admission, no cache.
        self._plain = self._attempt_timeout is None and self._bucket is None and self._slots is None
        # An attempt with a scope but no admission: the async loop runs it inline.
        self._scoped = (
            self._attempt_timeout is not None and self._bucket is None and self._slots is None
        )

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

    # Backoff -------------------------------------------------------------------------------

    def delay_after(self, attempt: int) -> float:
        """The wait after failed attempt number ``attempt`` (1-based), before the next one.

        D3.2: ``fixed`` waits D, ``linear`` n·D, ``exponential`` 2^(n-1)·D, all capped at
        ``max_delay``. Jitter is additive: it never shortens the computed delay and never pushes
        it past ``max_delay`` (so at the cap there is no room for it).
        """
        d = self.delay
        if d is None:
            return 0.0
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
            return cap
        jitter = self.jitter
        if jitter is not False:
            spread = base if jitter is True else float(jitter)
            base = min(base + _rng.uniform(0.0, spread), cap)
        return base

    # Telemetry -------------------------------------------------------------------------------

    def _emit(self, observer: Observer | None, name: str, **attrs: Any) -> None:
        attrs = {"policy": self.name, **attrs}
        if observer is not None:
            try:
                observer(Event(name, _clock.now(), attrs))
            except Exception:
                _log.exception("policy observer failed")
        emit(name, **attrs)

    # Decisions ---------------------------------------------------------------------------------
    #
    # Everything that *decides* (cache lookup and store, whether an attempt may start, what a
    # failed attempt leads to, fallback or on_error, the events) lives in the methods below, once.
    # The async and sync drivers further down only call, await and sleep; their common
    # happy path stays inline so that it costs no extra call.

    def _begin(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        tele: bool,
        observer: Observer | None,
    ) -> tuple[str | None, Any]:
        """``call.start`` and the cache lookup (D3.6): (key to store under, result or ``_MISS``)."""
        if tele:
            self._emit(observer, "call.start")
        cache = self._cache
        if cache is None:
            return None, _MISS
        key = self._key(fn, args, kwargs)
        if key is None:
            return None, _MISS
        hit, value = self._cache_get(cache, key)
        if not hit:
            return key, _MISS
        if tele:
            self._emit(observer, "cache.hit")
            self._emit(observer, "call.end", outcome="cached")
        return key, Ok(value) if self._wrap else value

    def _succeeded(self, key: str | None, value: Any, tele: bool, observer: Observer | None) -> Any:
        """The call itself produced ``value``: store it (D3.6), report it, wrap it."""
        if key is not None:
            assert self._cache is not None
            if self._cache_set(self._cache, key, value) and tele:
                self._emit(observer, "cache.store")
        if tele:
            self._emit(observer, "call.end", outcome="ok")
        return Ok(value) if self._wrap else value

    def _stop(self, errors: list[BaseException] | None, total_at: float) -> None:
        """D3.3: the effective deadline or the total has passed; no attempt starts. Raises."""
        spent = current_bound_error(self.name)
        if spent is None:
            spent = self._total_error(total_at)
        if errors:
            raise spent from errors[-1]
        raise spent

    def _failed(
        self,
        exc: Exception,
        attempt: int,
        errors: list[BaseException] | None,
        total_at: float,
        tele: bool,
        observer: Observer | None,
    ) -> tuple[list[BaseException], float]:
        """Attempt number ``attempt`` raised ``exc``: decide what comes next.

        Raises when the loop ends: the error itself (a programming error, a spent caller
        deadline or total, D2.5; or the only attempt's error, D3.1), ``RetryExhausted``, or the
        ``DeadlineExceeded`` of a delay that cannot fit (D3.3). Otherwise returns the errors so
        far and the delay to wait before the next attempt (D3.2).
        """
        if type(exc) is _Misuse:
            raise exc  # a programming error is never retried
        is_timeout = isinstance(exc, DeadlineExceeded)
        if tele:
            self._emit(
                observer,
                "attempt.end",
                attempt=attempt,
                outcome="timeout" if is_timeout else "error",
                error=exc,
            )
        if is_timeout:
            if self._is_callers(exc):
                raise exc  # D2.5: the caller's time is spent
            if exc.source == "total" and total_at != _INF and _clock.now() >= total_at:  # type: ignore[attr-defined]
                # This policy's own total budget: no further attempt could finish (D2.5).
                if exc.timeout is None:  # type: ignore[attr-defined]
                    exc.timeout = self.total_timeout  # type: ignore[attr-defined]
                raise exc
        if errors is None:
            errors = [exc]
        else:
            errors.append(exc)
        if attempt > self.retry:
            if self.retry == 0:
                raise exc  # D3.1: retry 0 surfaces the error unwrapped
            raise self._exhausted(errors) from exc
        wait = self.delay_after(attempt)
        left = remaining()
        if total_at != _INF:
            left = min(left, total_at - _clock.now())
        if wait >= left:
            raise self._no_room(attempt + 1, wait, total_at) from exc
        return errors, wait

    def _between(self, total_at: float) -> AbstractContextManager[Any]:
        """The context of the delay between attempts: the total budget is visible there (D1.5).

        Inside an attempt the attempt scope already ends no later than the total; between
        attempts a non-cancelling bound makes ``current_deadline()`` (listeners of
        ``retry.delay``, anything that runs in this context during the wait) include it. It is
        entered only on the retry path, so the happy path pays nothing for it.
        """
        if total_at == _INF:
            return _NULL_CONTEXT
        return inherit_deadline(Deadline(total_at), source="total", timeout=self.total_timeout)

    def _is_callers(self, exc: Exception) -> bool:
        """Whether ``exc`` means the *caller's* deadline is spent (not this call's failure).

        Such an error is never retried (D2.5), never replaced by a fallback or an on_error value
        (docs/policies.md). ``attempt`` and ``total`` are this call's own budgets. A propagated
        expiry always means the caller's deadline (D4.5). Any other source counts only when it
        really is an enclosing bound: that bound has passed, or this policy raised the error for
        it (a delay the bound cannot fit). A ``DeadlineExceeded`` from a scope *inside* the call
        (its own ``fail_after``, a blocking tier's ``timeout=``) is an ordinary failure.
        """
        return isinstance(exc, DeadlineExceeded) and classify(exc, own=_OWN_SOURCES) != "own"

    def _settle(self, exc: Exception, tele: bool, observer: Observer | None) -> Any:
        """The call failed with ``exc``: ``_FALLBACK`` when the fallback must be evaluated (D3.4),
        else on_error's value (D3.5); raises for ``propagate`` and for what is never absorbed."""
        if type(exc) is _Misuse:
            raise exc  # nor replaced by a fallback or a zero value
        if self._has_fallback and self._fallback_applies(exc):
            if tele:
                self._emit(observer, "fallback", reason=_reason(exc), error=exc)
            return _FALLBACK
        return self._absorb(exc, tele, observer)

    def _fell_back(self, value: Any, tele: bool, observer: Observer | None) -> Any:
        if tele:
            self._emit(observer, "call.end", outcome="fallback")
        return Ok(value) if self._wrap else value

    def _cancelled(
        self, where: str, attempt: int, exc: BaseException, observer: Observer | None
    ) -> None:
        """Report a cancellation (or KeyboardInterrupt, SystemExit) passing through (D2.3)."""
        if where == "attempt":
            self._emit(observer, "attempt.end", attempt=attempt, outcome="cancelled", error=exc)
        else:
            self._emit(observer, "call.end", outcome="cancelled")

    def _attempt_scope(self, total_at: float) -> CancelScope:
        """The one cancel scope of an attempt: its own timeout or the total budget, the earlier.

        D3.3: inside it the effective deadline is min(timeout, total, enclosing bounds); the core
        reports whichever bound fires. The total budget is not a separate scope around the loop
        (that would cost a second scope per call): each attempt's scope ends at the earlier of
        the two, and the loop checks the total between attempts. A tie goes to the total, as a
        tie with any enclosing bound does.
        """
        t = self._attempt_timeout
        assert t is not None
        if total_at != _INF and _clock.now() + t >= total_at:
            return fail_at(Deadline(total_at), source="total", what=self.name)
        return fail_after(t, source="attempt", what=self.name)

    def _total_error(self, total_at: float) -> DeadlineExceeded:
        return DeadlineExceeded(
            source="total",
            timeout=self.total_timeout,
            deadline=Deadline(total_at),
            what=self.name,
        )

    def _no_room(self, next_attempt: int, wait: float, total_at: float) -> BaseException:
        """D3.3: the effective deadline cannot fit the next delay/attempt; stop without sleeping."""
        spent = current_bound_error(self.name)
        if spent is not None:
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
            next_attempt, wait, current_bound_source() or "scope", remaining(), enclosing, None
        )
        # The enclosing bound has not passed yet, so the classification needs to be told.
        return mark_enclosing(err)

    def _stopped(
        self,
        next_attempt: int,
        wait: float,
        source: str,
        left: float,
        deadline: Deadline,
        timeout: float | None,
    ) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"{self.name}: stopped before attempt {next_attempt}: the {source} deadline leaves "
            f"{format_duration(left)}, not enough for the {format_duration(wait)} delay and "
            "another attempt",
            source=source,
            timeout=timeout,
            deadline=deadline,
            what=self.name,
        )

    def _exhausted(self, errors: list[BaseException]) -> BaseException:
        return RetryExhausted(errors, what=self.name)

    def _fallback_applies(self, exc: Exception) -> bool:
        if self._is_callers(exc):
            return self._fallback_on_deadline
        fb_on = self.fallback_on
        if fb_on is None:
            return True
        if isinstance(exc, fb_on):
            return True
        # "How did the call end": a RetryExhausted matches when its last attempt's error does.
        return (
            isinstance(exc, RetryExhausted)
            and bool(exc.errors)
            and isinstance(exc.errors[-1], fb_on)
        )

    def _zero(self) -> Any:
        z = self.zero
        return z if self._zero_is_immutable else copy.deepcopy(z)

    def _absorb(self, exc: Exception, tele: bool, observer: Observer | None) -> Any:
        """on_error for a call that failed without a fallback; re-raises for ``propagate``."""
        mode = self.on_error
        if mode == "propagate" or self._is_callers(exc):
            # A spent caller deadline is never turned into a value (see docs/policies.md).
            if tele:
                self._emit(observer, "call.end", outcome="error", error=exc)
            raise exc
        if tele:
            self._emit(observer, "on_error", mode=mode, error=exc)
        if mode == "wrap":
            if tele:
                self._emit(observer, "call.end", outcome="wrapped", error=exc)
            return Err(exc)
        if mode == "log":
            _log.warning(
                "%s failed, returning the zero value %r: %s: %s",
                self.name,
                self.zero,
                type(exc).__name__,
                exc,
            )
        if tele:
            self._emit(observer, "call.end", outcome="skipped", error=exc)
        return self._zero()

    # Async driver ------------------------------------------------------------------------------

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
        if kwargs is None:
            kwargs = _NO_KWARGS
        tele = observer is not None or _telemetry_enabled()
        key = None
        if tele or self._cache is not None:
            key, found = self._begin(fn, args, kwargs, tele, observer)
            if found is not _MISS:
                return found
        total = self.total_timeout
        try:
            value = await self._retry_async(
                fn, args, kwargs, tele, observer, _INF if total is None else _clock.now() + total
            )
        except Exception as exc:
            result = self._settle(exc, tele, observer)
            if result is not _FALLBACK:
                return result
            fb = self.fallback
            if self._fallback_callable:
                fb = fb(*args, **kwargs)
                if inspect.isawaitable(fb):
                    fb = await fb
            return self._fell_back(fb, tele, observer)
        except BaseException as exc:
            if tele:
                self._cancelled("call", 0, exc, observer)
            raise
        if key is None and not tele and not self._wrap:
            return value
        return self._succeeded(key, value, tele, observer)

    async def _retry_async(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        tele: bool,
        observer: Observer | None,
        total_at: float,
    ) -> Any:
        name = self.name
        attempt = 0
        errors: list[BaseException] | None = None
        plain = self._plain
        scoped = self._scoped
        while True:
            attempt += 1
            # D3.3: never start an attempt once the effective deadline or the total has passed.
            if current_bound_error(name) is not None or (
                total_at != _INF and _clock.now() >= total_at
            ):
                self._stop(errors, total_at)
            if tele:
                self._emit(observer, "attempt.start", attempt=attempt)
            try:
                if plain:
                    value = fn(*args, **kwargs)
                    if type(value) is CoroutineType or inspect.isawaitable(value):
                        value = await value
                elif scoped:
                    # The common "timeout, no admission" attempt, inlined: one coroutine less.
                    with self._attempt_scope(total_at):
                        value = fn(*args, **kwargs)
                        if type(value) is CoroutineType or inspect.isawaitable(value):
                            value = await value
                        else:
                            _raise_if_late(name)
                else:
                    value = await self._attempt_async(fn, args, kwargs, total_at)
            except Exception as exc:
                errors, wait = self._failed(exc, attempt, errors, total_at, tele, observer)
                with self._between(total_at):
                    if tele:
                        self._emit(observer, "retry.delay", attempt=attempt, delay=wait)
                    if wait > 0:
                        await _asleep(wait)
                continue
            except BaseException as exc:
                if tele:
                    self._cancelled("attempt", attempt, exc, observer)
                raise
            if tele:
                self._emit(observer, "attempt.end", attempt=attempt, outcome="ok", error=None)
            return value

    async def _attempt_async(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        total_at: float,
    ) -> Any:
        """An attempt with admission (throttle and/or concurrency)."""
        slots = self._slots
        # D3.7: the scope is entered before admission, so waiting for a token or a slot counts
        # against the attempt timeout. D3.3: the scope's deadline is min(timeout, effective).
        with _NULL_CONTEXT if self._attempt_timeout is None else self._attempt_scope(total_at):
            await self._admit_async()
            try:
                value = fn(*args, **kwargs)
                if type(value) is CoroutineType or inspect.isawaitable(value):
                    return await value
            finally:
                if slots is not None:
                    slots.release()
            if self._attempt_timeout is not None:
                _raise_if_late(self.name)
            return value

    async def _admit_async(self) -> None:
        bucket = self._bucket
        slots = self._slots
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

    # Sync driver -------------------------------------------------------------------------------

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
        if kwargs is None:
            kwargs = _NO_KWARGS
        tele = observer is not None or _telemetry_enabled()
        key = None
        if tele or self._cache is not None:
            key, found = self._begin(fn, args, kwargs, tele, observer)
            if found is not _MISS:
                return found
        total = self.total_timeout
        try:
            value = self._retry_sync(
                fn, args, kwargs, tele, observer, _INF if total is None else _clock.now() + total
            )
        except Exception as exc:
            result = self._settle(exc, tele, observer)
            if result is not _FALLBACK:
                return result
            return self._fell_back(self._sync_fallback(args, kwargs, exc), tele, observer)
        except BaseException as exc:
            if tele:
                self._cancelled("call", 0, exc, observer)
            raise
        if key is None and not tele and not self._wrap:
            return value
        return self._succeeded(key, value, tele, observer)

    def _sync_fallback(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any], exc: Exception
    ) -> Any:
        fb = self.fallback
        if self._fallback_callable:
            fb = fb(*args, **kwargs)
            if inspect.isawaitable(fb):
                _discard(fb)
                raise TypeError(
                    f"{self.name}: the fallback returned an awaitable in a sync call; "
                    "use a sync fallback or run the call with execute()"
                ) from exc
        return fb

    def _retry_sync(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        tele: bool,
        observer: Observer | None,
        total_at: float,
    ) -> Any:
        name = self.name
        attempt = 0
        errors: list[BaseException] | None = None
        plain = self._plain
        while True:
            attempt += 1
            if current_bound_error(name) is not None or (
                total_at != _INF and _clock.now() >= total_at
            ):
                self._stop(errors, total_at)
            if tele:
                self._emit(observer, "attempt.start", attempt=attempt)
            try:
                value = (
                    _call_sync(name, fn, args, kwargs)
                    if plain
                    else self._attempt_sync(fn, args, kwargs, total_at)
                )
            except Exception as exc:
                errors, wait = self._failed(exc, attempt, errors, total_at, tele, observer)
                with self._between(total_at):
                    if tele:
                        self._emit(observer, "retry.delay", attempt=attempt, delay=wait)
                    if wait > 0:
                        _clock.sleep(wait)
                continue
            except BaseException as exc:
                if tele:
                    self._cancelled("attempt", attempt, exc, observer)
                raise
            if tele:
                self._emit(observer, "attempt.end", attempt=attempt, outcome="ok", error=None)
            return value

    def _attempt_sync(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        total_at: float,
    ) -> Any:
        """An attempt with a scope and/or admission, run to its end (cooperative)."""
        slots = self._slots
        with _NULL_CONTEXT if self._attempt_timeout is None else self._attempt_scope(total_at):
            if not self._scoped:  # a scope alone needs no admission (and no call for it)
                self._admit_sync()
            try:
                value = _call_sync(self.name, fn, args, kwargs)
            finally:
                if slots is not None:
                    slots.release()
            if self._attempt_timeout is not None:
                # The attempt ran to its end; if a bound passed meanwhile the result is late
                # (D1.7). The enclosing bound wins a tie, as it does in asyncio.
                _raise_if_late(self.name)
            return value

    def _admit_sync(self) -> None:
        bucket = self._bucket
        slots = self._slots
        if bucket is not None:
            wait = bucket.reserve()
            if wait > 0:
                left = remaining()
                # The wait counts against the attempt: sleep at most to the deadline, then fail
                # there, exactly when an asyncio attempt would be cancelled.
                _clock.sleep(min(wait, left))
                if wait >= left:
                    bucket.refund()
                    raise self._spent_now()
        if slots is not None:
            left = remaining()
            if not slots.acquire_sync(None if left == _INF else left):
                if bucket is not None:
                    bucket.refund()
                raise self._spent_now()

    def _spent_now(self) -> DeadlineExceeded:
        err = current_bound_error(self.name)
        if err is not None:
            return err
        # A real-time wait ended while a virtual clock stood still; report the binding bound.
        return DeadlineExceeded(
            source=current_bound_source() or "attempt",
            timeout=self.timeout,
            deadline=current_deadline(),
            what=self.name,
        )

    # Cache -----------------------------------------------------------------------------------

    def _key(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> str | None:
        try:
            # f(1), f(a=1) and f(1, b=2) (b's default) are the same call: one cache entry.
            args, kwargs = canonical_arguments(fn, args, kwargs)
            return cache_key(self.name, args, kwargs)
        except (Uncacheable, RecursionError):
            return None
        except Exception:
            # An argument whose repr() fails: the call runs, uncached, rather than failing.
            _log.debug("%s: arguments cannot be encoded for the cache", self.name, exc_info=True)
            return None

    def _cache_get(self, cache: CacheBackend, key: str) -> tuple[bool, Any]:
        try:
            return cache.get(key)
        except Exception:
            # The cache is an optimisation: a failing backend is a miss, never a failed call.
            _log.warning(
                "%s: cache backend get() failed; treating as a miss", self.name, exc_info=True
            )
            return False, None

    def _cache_set(self, cache: CacheBackend, key: str, value: Any) -> bool:
        try:
            cache.set(key, value, self.cache)  # type: ignore[arg-type]
        except Exception:
            _log.warning(
                "%s: cache backend set() failed; result not cached", self.name, exc_info=True
            )
            return False
        return True


def _call_sync(
    name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> Any:
    value = fn(*args, **kwargs)
    if type(value) is CoroutineType or inspect.isawaitable(value):
        _discard(value)
        raise _Misuse(
            f"{name}: the callable returned an awaitable in a sync call; "
            "await Policy.execute() for async callables"
        )
    return value


def _raise_if_late(name: str) -> None:
    """A sync callable cannot be interrupted: a result that came after a bound passed is late."""
    late = current_bound_error(name)
    if late is not None:
        raise late


class _Misuse(TypeError):
    """An async callable run by ``execute_sync``: a bug in the caller, not a transient failure."""


def _discard(awaitable: Awaitable[Any]) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # no "coroutine was never awaited" warning


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RetryExhausted):
        return "retry_exhausted"
    if isinstance(exc, DeadlineExceeded):
        return "timeout"
    return "error"


async def _asleep(seconds: float) -> None:
    if asyncio._get_running_loop() is not None:
        await asyncio.sleep(seconds)
        return
    trio = sys.modules.get("trio")
    if trio is None:
        raise RuntimeError("timebound policies run under asyncio or trio")
    await trio.sleep(seconds)
