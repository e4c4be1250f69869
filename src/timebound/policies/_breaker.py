"""Circuit breakers (DECISIONS D3.13): fail fast while a dependency is failing or slow.

A :class:`CircuitBreaker` watches the attempts of the policies given it over a sliding
``window``: once at least ``min_calls`` attempts were seen and the share that failed reaches
``failure_ratio``, or the share slower than ``slow_call`` reaches ``slow_ratio``, it **opens**:
attempts fail at once with :class:`~timebound.CircuitOpen`, which says when the breaker will
probe again. After ``break_for`` it is **half-open**: ``probes`` attempts go through; if they all
succeed (in time) it **closes**, and one failure opens it again. resilience4j and Polly v8 are the
anchors: ratios as resilience4j's rates, a time window and a break duration as Polly's.

Deadline-aware: an attempt cut by the *caller's* deadline (``classify``: not the policy's own
bound) says nothing about the dependency and is not counted; an attempt that ran out of its own
``timeout`` is a failure. A cancellation is not counted either.
"""

from __future__ import annotations

import math
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal

from .._core import _clock
from .._core._durations import Duration, format_duration, to_seconds
from .._core._errors import CircuitOpen, ConfigurationError
from ..telemetry import emit, enabled
from ._budget import SlidingCounts

if TYPE_CHECKING:
    from ._retry import RetryPlan

__all__ = ["CircuitBreaker", "CircuitOpen"]

State = Literal["closed", "open", "half_open"]
_CALLS: Final = 0
_FAILED: Final = 1
_SLOW: Final = 2


def _ratio(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ConfigurationError(
            f"breaker {field} must be a number in (0, 1], got {value!r}", option=f"breaker.{field}"
        )
    return float(value)


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"breaker {field} must be an integer >= 1, got {value!r}", option=f"breaker.{field}"
        )
    return value


def _duration(value: Duration, field: str) -> float:
    seconds = to_seconds(value, option=f"breaker.{field}", allow_zero=False)
    if math.isinf(seconds):
        raise ConfigurationError(f"breaker {field} must be finite", option=f"breaker.{field}")
    return seconds


class CircuitBreaker:
    """Closed, open or half-open; see the module documentation for the knobs.

    Defaults: ``failure_ratio`` 0.5 and ``slow_ratio`` 1.0 (resilience4j), ``min_calls`` 100,
    ``window`` 30 s and ``break_for`` 5 s (Polly v8), ``probes`` 1; ``slow_call`` ``None``
    counts no call as slow. A breaker is the policy's own unless one object is passed to several
    policies on purpose (D3.7). Thread-safe; on timebound's clock.
    """

    __slots__ = (
        "_counts",
        "_lock",
        "_opened_because",
        "_probe_at",
        "_probes_ok",
        "_probes_out",
        "_state",
        "break_for",
        "failure_ratio",
        "min_calls",
        "probes",
        "slow_call",
        "slow_ratio",
        "window",
    )

    def __init__(
        self,
        *,
        failure_ratio: float = 0.5,
        slow_ratio: float = 1.0,
        slow_call: Duration | None = None,
        min_calls: int = 100,
        window: Duration = 30.0,
        break_for: Duration = 5.0,
        probes: int = 1,
    ) -> None:
        self.failure_ratio = _ratio(failure_ratio, "failure_ratio")
        self.slow_ratio = _ratio(slow_ratio, "slow_ratio")
        self.slow_call = None if slow_call is None else _duration(slow_call, "slow_call")
        self.min_calls = _count(min_calls, "min_calls")
        self.window = _duration(window, "window")
        self.break_for = _duration(break_for, "break_for")
        self.probes = _count(probes, "probes")
        self._counts = SlidingCounts(self.window, 3)
        self._lock = threading.Lock()
        self._state: State = "closed"
        self._probe_at = 0.0
        self._probes_out = 0
        self._probes_ok = 0
        self._opened_because = ""

    @property
    def state(self) -> State:
        """``closed``, ``open`` or ``half_open`` (an open breaker past ``break_for`` reads
        ``half_open``: the next attempt is a probe)."""
        with self._lock:
            if self._state == "open" and _clock.now() >= self._probe_at:
                return "half_open"
            return self._state

    # The attempt's side ------------------------------------------------------------------

    def acquire(self, what: str) -> bool:
        """May an attempt of ``what`` start? True when it is a probe; raises
        :class:`~timebound.CircuitOpen` when the breaker is open (nothing is sent)."""
        with self._lock:
            state = self._state
            if state == "closed":
                return False
            now = _clock.now()
            if state == "open":
                if now < self._probe_at:
                    left = self._probe_at - now
                    raise CircuitOpen(
                        f"{what}: circuit open ({self._opened_because}); fails fast until it "
                        f"probes again in {format_duration(left)}",
                        what=what,
                        retry_after=left,
                    )
                self._enter("half_open", what)
            if self._probes_out + self._probes_ok >= self.probes:
                raise CircuitOpen(
                    f"{what}: circuit half-open: its {self.probes} probe(s) are in flight; "
                    "fails fast until they end",
                    what=what,
                    retry_after=None,
                )
            self._probes_out += 1
            return True

    def record(self, what: str, probe: bool, failed: bool, seconds: float) -> None:
        """An attempt ended: ``failed`` (an error or its own timeout) after ``seconds``."""
        slow = self.slow_call is not None and seconds >= self.slow_call
        with self._lock:
            state = self._state
            if probe and state == "half_open":
                self._probes_out -= 1
                if failed or slow:
                    self._open(
                        what,
                        "a probe failed" if failed else f"a probe took {format_duration(seconds)}",
                    )
                    return
                self._probes_ok += 1
                if self._probes_ok >= self.probes:
                    self._counts.clear()
                    self._enter("closed", what)
                return
            if state != "closed":
                return  # an attempt admitted before the breaker opened: old news
            counts = self._counts
            counts.add(_CALLS)
            if failed:
                counts.add(_FAILED)
            if slow:
                counts.add(_SLOW)
            if not (failed or slow):
                return
            calls, failures, slows = counts.totals()
            if calls < self.min_calls:
                return
            window = format_duration(self.window)
            if failures >= self.failure_ratio * calls:
                self._open(what, f"{failures:.0f} of {calls:.0f} attempts failed in {window}")
            elif self.slow_call is not None and slows >= self.slow_ratio * calls:
                self._open(
                    what,
                    f"{slows:.0f} of {calls:.0f} attempts took {format_duration(self.slow_call)}"
                    f" or more in {window}",
                )

    def release(self, probe: bool) -> None:
        """An attempt ended without saying anything about the dependency (the caller's deadline
        cut it, or it was cancelled): a probe's place is freed, nothing is counted."""
        if probe:
            with self._lock:
                if self._state == "half_open" and self._probes_out > 0:
                    self._probes_out -= 1

    def guard(self, plan: RetryPlan) -> _Guard:
        """The context of one attempt: acquire on entry, record or release on exit."""
        return _Guard(self, plan)

    # State changes (under the lock) -------------------------------------------------------

    def _open(self, what: str, because: str) -> None:
        self._opened_because = because
        self._probe_at = _clock.now() + self.break_for
        self._enter("open", what)

    def _enter(self, state: State, what: str) -> None:
        self._state = state
        self._probes_out = 0
        self._probes_ok = 0
        if enabled():
            emit("breaker.state", policy=what, state=state, reason=self._opened_because)

    def __repr__(self) -> str:
        return (
            f"CircuitBreaker(state={self.state!r}, failure_ratio={self.failure_ratio:g}, "
            f"min_calls={self.min_calls}, window={self.window:g}, break_for={self.break_for:g})"
        )


class _Guard:
    """Acquire/record around one attempt (outside its timeout scope, so the scope's own timeout
    arrives here as a ``DeadlineExceeded`` of source ``attempt``: the dependency's failure)."""

    __slots__ = ("_breaker", "_plan", "_probe", "_start")

    def __init__(self, breaker: CircuitBreaker, plan: RetryPlan) -> None:
        self._breaker = breaker
        self._plan = plan
        self._probe = False
        self._start = 0.0

    def __enter__(self) -> None:
        self._probe = self._breaker.acquire(self._plan.what)
        self._start = _clock.now()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        breaker = self._breaker
        if exc is not None and (not isinstance(exc, Exception) or self._plan.is_callers(exc)):
            breaker.release(self._probe)  # D3.13: the caller's deadline, or a cancellation
            return
        breaker.record(self._plan.what, self._probe, exc is not None, _clock.now() - self._start)
