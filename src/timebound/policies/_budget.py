"""Retry budgets (DECISIONS D3.12): extra attempts as a share of calls, over a sliding window.

A :class:`RetryBudget` lets retries (and hedges) through while, over the last ``window``,

    extra attempts < ratio * calls + min_per_second * window

as Finagle's ``RetryBudget`` and gRPC's retry throttling do (Envoy's retry budget is the same idea
over requests in flight). A dependency that fails every call then sees at most ``1 + ratio`` times
the offered load, once the allowance ``min_per_second`` gives quiet periods is spent, instead of
``retry + 1`` times. The budget is a policy's own unless one object is passed to several
policies on purpose (D3.7: nothing is shared by name). Counting is on timebound's clock, so a
virtual clock drives it in tests; it is thread-safe.
"""

from __future__ import annotations

import math
import threading
from typing import Final

from .._core import _clock
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError

__all__ = ["RetryBudget", "SlidingCounts"]

_SLICES: Final = 10


class SlidingCounts:
    """``fields`` counts over the last ``window`` seconds, in ten slices.

    A slice older than the window is dropped whole, so a count may lag by one slice
    (``window / 10``): the price of O(1) bookkeeping per event. Not locked: its owner is.
    """

    __slots__ = ("_head", "_slices", "_width")

    def __init__(self, window: float, fields: int = 2) -> None:
        self._width = window / _SLICES
        self._head = 0  # index of the newest slice, on the absolute slice grid
        self._slices = [[0.0] * fields for _ in range(_SLICES)]

    def _current(self) -> list[float]:
        index = int(_clock.now() // self._width)
        head = self._head
        if index > head:
            for i in range(head + 1, min(index, head + _SLICES) + 1):
                row = self._slices[i % _SLICES]
                for k in range(len(row)):
                    row[k] = 0.0
            self._head = head = index
        return self._slices[head % _SLICES]

    def add(self, field: int, amount: float = 1.0) -> None:
        self._current()[field] += amount

    def totals(self) -> list[float]:
        self._current()
        return [sum(column) for column in zip(*self._slices, strict=True)]

    def clear(self) -> None:
        for row in self._slices:
            for k in range(len(row)):
                row[k] = 0.0


class RetryBudget:
    """At most ``ratio`` extra attempts per call over ``window``, plus ``min_per_second``.

    ``ratio`` 0.2, ``min_per_second`` 10 and ``window`` 10 s are Finagle's defaults. Pass one
    object to several policies to share it; each policy given a budget draws on that object only.
    """

    __slots__ = ("_counts", "_lock", "min_per_second", "ratio", "window")

    def __init__(
        self, ratio: float = 0.2, *, min_per_second: float = 10.0, window: Duration = 10.0
    ) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1000:
            raise ConfigurationError(
                f"retry budget ratio must be a number in [0, 1000], got {ratio!r}",
                option="retry_budget.ratio",
            )
        if (
            isinstance(min_per_second, bool)
            or not isinstance(min_per_second, (int, float))
            or not 0 <= min_per_second < math.inf
        ):
            raise ConfigurationError(
                f"retry budget min_per_second must be a finite number >= 0, got {min_per_second!r}",
                option="retry_budget.min_per_second",
            )
        seconds = to_seconds(window, option="retry_budget.window", allow_zero=False)
        if math.isinf(seconds):
            raise ConfigurationError(
                "retry budget window must be finite", option="retry_budget.window"
            )
        self.ratio = float(ratio)
        self.min_per_second = float(min_per_second)
        self.window = seconds
        self._counts = SlidingCounts(seconds)
        self._lock = threading.Lock()

    def deposit(self) -> None:
        """A call started: it earns ``ratio`` extra attempts."""
        with self._lock:
            self._counts.add(0)

    def try_withdraw(self) -> bool:
        """Take one extra attempt (a retry or a hedge) if the budget has one; never waits."""
        with self._lock:
            calls, extra = self._counts.totals()
            if extra + 1 > self.ratio * calls + self.min_per_second * self.window + 1e-9:
                return False
            self._counts.add(1)
            return True

    def balance(self) -> float:
        """Extra attempts the budget would allow now (for metrics and tests)."""
        with self._lock:
            calls, extra = self._counts.totals()
        return max(0.0, self.ratio * calls + self.min_per_second * self.window - extra)

    def __repr__(self) -> str:
        return (
            f"RetryBudget(ratio={self.ratio:g}, min_per_second={self.min_per_second:g}, "
            f"window={self.window:g})"
        )
