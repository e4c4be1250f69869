"""The one place that reads the clock (DECISIONS D1.1).

Scheduling uses a monotonic clock only. Every module in timebound calls ``_clock.now()`` and
``_clock.sleep()``/``_clock.asleep()`` through this module's attributes, never ``time.monotonic``
directly, so :mod:`timebound.testing` can swap in virtual time by rebinding them.

In asyncio code the event loop's ``time()`` must share this base: the default loops use
``time.monotonic``, and :class:`timebound.testing.VirtualClock` provides a loop whose ``time()`` is
the virtual clock, so deadlines computed here can be handed to ``loop.call_at`` unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["asleep", "now", "sleep"]

#: Current time in seconds on the monotonic scheduling clock. Rebound by virtual time.
now: Callable[[], float] = time.monotonic

#: Blocking sleep on the scheduling clock. Rebound by virtual time.
sleep: Callable[[float], None] = time.sleep


async def _real_asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


#: Non-blocking sleep for asyncio code. Virtual time keeps ``asyncio.sleep``: its loop jumps.
asleep: Callable[[float], object] = _real_asleep


def wall_time() -> float:
    """Wall-clock seconds since the epoch, for persisted and wire forms only (D1.1)."""
    return time.time()
