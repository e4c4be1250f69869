"""The one place that reads the clock (DECISIONS D1.1).

Scheduling uses a monotonic clock only. Every module in timebound calls ``_clock.now()`` and
``_clock.sleep()`` through this module's attributes, never ``time.monotonic`` directly, so
:mod:`timebound.testing` can swap in virtual time by rebinding them. ``_clock.wall()`` is read
only to convert a deadline to and from its durable epoch form (D1.10), never to schedule.

In asyncio code the event loop's ``time()`` must share this base: the default loops use
``time.monotonic``, and :class:`timebound.testing.VirtualClock` provides a loop whose ``time()`` is
the virtual clock, so deadlines computed here can be handed to ``loop.call_at`` unchanged.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

__all__ = [
    "datetime_of_ms",
    "earliest",
    "ms_of",
    "now",
    "real_io",
    "sleep",
    "wait",
    "wall",
    "wall_ms",
]

#: Current time in seconds on the monotonic scheduling clock. Rebound by virtual time.
now: Callable[[], float] = time.monotonic

#: Blocking sleep on the scheduling clock. Rebound by virtual time.
sleep: Callable[[float], None] = time.sleep


def _wait(event: threading.Event, seconds: float | None) -> bool:
    return event.wait(seconds)


#: Block until ``event`` is set or ``seconds`` pass on the scheduling clock (``None``: no limit);
#: True when the event was set. Rebound by virtual time, where the wait moves the clock instead
#: of letting real time pass (a thread waiting for other threads, D3.14).
wait: Callable[[threading.Event, float | None], bool] = _wait

#: Wall-clock seconds since the Unix epoch (UTC), for durable forms only. Rebound by virtual time.
wall: Callable[[], float] = time.time

#: Entered around a wait for a real external server (a database round trip): a no-op on the real
#: clock. Virtual time (:mod:`timebound.testing`) rebinds it so that autojump never leaps while an
#: answer is on its way: a slow server must not look like an idle loop.
real_io: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext


def wall_ms() -> int:
    """Now as whole epoch milliseconds, the form durable rows store (D6.12), rounded **down**:
    an expiry compared against it (``deadline_ms <= wall_ms()``) never holds early (D1.3)."""
    return math.floor(wall() * 1000)


def earliest(*bounds: int | None) -> int | None:
    """The earliest of the bounds that are present (``None`` is "no bound"), or ``None``."""
    present = [b for b in bounds if b is not None]
    return min(present) if present else None


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def ms_of(when: datetime) -> int:
    """An aware instant as whole epoch milliseconds, exactly (integer arithmetic on the
    ``timedelta``, never float seconds), rounded down within the millisecond; a naive one is
    read as UTC."""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // _MS


def datetime_of_ms(ms: int) -> datetime:
    """Whole epoch milliseconds as an aware UTC ``datetime``, exactly: ``ms_of`` reads it back
    unchanged."""
    return _EPOCH + ms * _MS
