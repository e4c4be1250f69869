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
import time
from collections.abc import Callable

__all__ = ["now", "real_io", "sleep", "wall"]

#: Current time in seconds on the monotonic scheduling clock. Rebound by virtual time.
now: Callable[[], float] = time.monotonic

#: Blocking sleep on the scheduling clock. Rebound by virtual time.
sleep: Callable[[float], None] = time.sleep

#: Wall-clock seconds since the Unix epoch (UTC), for durable forms only. Rebound by virtual time.
wall: Callable[[], float] = time.time

#: Entered around a wait for a real external server (a database round trip): a no-op on the real
#: clock. Virtual time (:mod:`timebound.testing`) rebinds it so that autojump never leaps while an
#: answer is on its way: a slow server must not look like an idle loop.
real_io: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
