"""The absolute deadline beside the relative one: the clock-skew rule (DECISIONS D9.3).

A caller may send its deadline as an instant (``X-Request-Deadline`` over HTTP,
``x-request-deadline`` metadata over gRPC, D4.12) beside the relative timeout. The instant counts
the time in transit, which the relative timeout cannot, but it is read on another machine's
clock. Every server adapter combines the two here, so the rule has one implementation:

* alone, the absolute deadline is taken as it is (a passed one means "already expired");
* with a relative timeout, the earlier of the two wins, unless they disagree by more than the
  allowed skew: then the clocks disagree, the absolute one is ignored and counted
  (``absolute-deadline-ignored``);
* ten years or more is no deadline, as for the relative headers (D4.1).
"""

from __future__ import annotations

import math
from typing import Final, cast

from .._core import _clock
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from ..telemetry._events import counters
from ._codec import MAX_TIMEOUT_SECONDS

__all__ = ["DEFAULT_SKEW", "check_clock_skew", "time_left"]

#: Default tolerance (seconds) between the absolute and the relative deadline (D9.3).
DEFAULT_SKEW: Final = 1.0


def check_clock_skew(clock_skew: object) -> float:
    """``clock_skew`` (a duration: seconds, a ``timedelta`` or ``"500ms"``, D1.11) as seconds,
    or :class:`~timebound.ConfigurationError` naming the option."""
    seconds = to_seconds(cast(Duration, clock_skew), option="clock_skew")
    if math.isinf(seconds):
        raise ConfigurationError(
            f"clock_skew must be a finite duration, not {clock_skew!r}", option="clock_skew"
        )
    return seconds


def time_left(
    relative: float | None, absolute: float | None, skew: float, *, component: str
) -> float | None:
    """Seconds left for a call that arrived now, from both forms of its deadline (D9.3).

    ``relative``: the seconds a relative timeout gave (``None``: none was sent). ``absolute``:
    the absolute deadline in seconds of the Unix epoch (``None``: none, or unreadable). Returns
    ``None`` for no deadline; ``0.0`` for one already passed. A disagreement beyond ``skew`` is
    counted under ``component``.
    """
    if absolute is None:
        return relative
    # Our wall clock read once. The disagreement is measured before clamping: a deadline 3 s
    # in our past is 3 s off, not 0.
    raw = absolute - _clock.wall()
    left = max(0.0, raw)
    if left >= MAX_TIMEOUT_SECONDS:
        return relative  # 10 years or more is no deadline (D4.1)
    if relative is None:
        return left
    if abs(raw - relative) > skew:
        counters.inc("absolute-deadline-ignored", component=component)
        return relative
    return min(left, relative)
