"""Admission limits (DECISIONS D3.7): a token bucket and a semaphore.

Each is an object owned by whoever made it: a policy built with ``throttle="10/1s"`` or
``concurrency=4`` makes its own; sharing one between policies (two functions calling one
service, every call site of a module in a compiled program) means passing the same object.
Nothing is shared by name.

Both are thread-safe and serve sync callers (threads), asyncio tasks (on any loop) and trio tasks at
once: the bookkeeping happens under a ``threading.Lock`` that is never held across a wait, and a
waiter is *granted* its slot under that lock before it is woken, so a waiter cancelled between the
grant and its wake-up hands the slot on instead of leaking it.
"""

from __future__ import annotations

import re
import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from .._core import _clock
from .._core._durations import Duration, to_seconds
from .._core._errors import ConfigurationError
from .._core._scopes import running_loop

if TYPE_CHECKING:
    import asyncio

__all__ = ["Slots", "TokenBucket", "parse_throttle"]

_THROTTLE_RE = re.compile(r"\s*(\d+)\s*/\s*(\S+)\s*")


def parse_throttle(value: Any) -> tuple[int, float]:
    """``"N/duration"`` (``"10/1s"``, ``"100/1min"``) or ``(N, duration)`` → ``(N, seconds)``."""
    if isinstance(value, str):
        m = _THROTTLE_RE.fullmatch(value)
        if m is None:
            raise ConfigurationError(
                f"invalid throttle {value!r}: expected 'N/duration' such as '10/1s' or '100/1min'",
                option="throttle",
            )
        count, per = int(m.group(1)), to_seconds(m.group(2), option="throttle", allow_zero=False)
    elif isinstance(value, tuple) and len(value) == 2:
        count_raw, per_raw = value
        if isinstance(count_raw, bool) or not isinstance(count_raw, int):
            raise ConfigurationError(
                f"invalid throttle {value!r}: the count must be an integer", option="throttle"
            )
        count, per = count_raw, to_seconds(per_raw, option="throttle", allow_zero=False)
    else:
        raise ConfigurationError(
            f"invalid throttle {value!r}: expected 'N/duration' such as '10/1s'",
            option="throttle",
        )
    if count < 1:
        raise ConfigurationError(
            f"invalid throttle {value!r}: the count must be > 0", option="throttle"
        )
    return count, per


class TokenBucket:
    """``count`` tokens per ``per`` seconds, bursts of up to ``count`` (D3.7).

    :meth:`reserve` takes a token now or reserves the next one and says how long to wait for it
    (the balance may go negative: later callers queue behind earlier ones, first come first
    served). A caller that gives up before its wait ends :meth:`refund` s the token.
    ``TokenBucket(10, "1s")``; a bad count or duration is a ``ConfigurationError``.
    """

    def __init__(self, count: int, per: Duration) -> None:
        count, per_s = parse_throttle((count, per))
        self.count = count
        self.per = per_s
        self._rate = count / per_s
        self._tokens = float(count)
        # Read the clock on first use, not at build time: policies are often built at import,
        # before a test installs virtual time.
        self._last: float | None = None
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        last = self._last
        if last is None or now < last:
            # First use, or the clock was swapped for one with another base: no refill.
            self._last = now
            return
        if now > last:
            self._tokens = min(float(self.count), self._tokens + (now - last) * self._rate)
            self._last = now

    def reserve(self) -> float:
        """Take a token; return 0.0 when it is available now, else the seconds to wait for it."""
        with self._lock:
            self._refill(_clock.now())
            self._tokens -= 1.0
            tokens = self._tokens
        return 0.0 if tokens >= 0 else -tokens / self._rate

    def refund(self) -> None:
        """Give back a token reserved by a caller that stopped waiting for it."""
        with self._lock:
            self._refill(_clock.now())
            self._tokens = min(float(self.count), self._tokens + 1.0)


class _Waiter:
    __slots__ = ("granted",)

    def __init__(self) -> None:
        self.granted = False

    def wake(self) -> None:
        raise NotImplementedError


class _AsyncioWaiter(_Waiter):
    __slots__ = ("fut", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop
        self.fut: asyncio.Future[None] = loop.create_future()

    def wake(self) -> None:
        if running_loop() is self.loop:
            _set_future(self.fut)
            return
        # Another thread or loop: hand over thread-safely; a closed loop took the waiter with it.
        try:
            self.loop.call_soon_threadsafe(_set_future, self.fut)
        except RuntimeError:
            pass


def _set_future(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _TrioWaiter(_Waiter):
    __slots__ = ("event", "token")

    def __init__(self, trio: Any) -> None:
        super().__init__()
        self.event = trio.Event()
        self.token = trio.lowlevel.current_trio_token()

    def wake(self) -> None:
        trio = sys.modules["trio"]
        try:
            same_run = trio.lowlevel.current_trio_token() is self.token
        except RuntimeError:
            same_run = False
        if same_run:
            # Same trio run (the common case): wake directly, no trip through the entry queue.
            self.event.set()
            return
        try:
            self.token.run_sync_soon(self.event.set)
        except RuntimeError:
            pass


class _ThreadWaiter(_Waiter):
    __slots__ = ("event",)

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()

    def wake(self) -> None:
        self.event.set()


class Slots:
    """A FIFO semaphore of ``limit`` slots for threads, asyncio tasks and trio tasks (D3.7)."""

    def __init__(self, limit: int) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigurationError(
                f"concurrency must be an integer >= 1, got {limit!r}", option="concurrency"
            )
        self.limit = limit
        self._free = limit
        self._waiters: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    @property
    def in_use(self) -> int:
        """Slots held right now."""
        return self.limit - self._free

    @property
    def waiting(self) -> int:
        """Callers queued for a slot right now."""
        return len(self._waiters)

    def try_acquire(self) -> bool:
        """Take a slot if one is free and nobody is queued before us."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            return False

    def release(self) -> None:
        """Return a slot: hand it to the first waiter, or free it."""
        with self._lock:
            if not self._waiters:
                self._free += 1
                return
            waiter = self._waiters.popleft()
            waiter.granted = True
        waiter.wake()

    def _enqueue(self, waiter: _Waiter) -> bool:
        """Queue ``waiter`` unless a slot is free (then take it and return True)."""
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            self._waiters.append(waiter)
            return False

    def _abandon(self, waiter: _Waiter) -> bool:
        """The waiter stops waiting; True if it had been granted a slot in the meantime."""
        with self._lock:
            if waiter.granted:
                return True
            try:
                self._waiters.remove(waiter)
            except ValueError:
                pass
            return False

    async def acquire(self) -> None:
        """Wait for a slot (asyncio or trio). Cancellation leaves the count intact."""
        if self.try_acquire():
            return
        loop = running_loop()
        if loop is not None:
            aw = _AsyncioWaiter(loop)
            if self._enqueue(aw):
                return
            try:
                await aw.fut
            except BaseException:
                if self._abandon(aw):
                    self.release()
                raise
            return
        trio = sys.modules["trio"]
        tw = _TrioWaiter(trio)
        if self._enqueue(tw):
            return
        try:
            await tw.event.wait()
        except BaseException:
            if self._abandon(tw):
                self.release()
            raise

    def acquire_sync(self, timeout: float | None) -> bool:
        """Block until a slot is free or ``timeout`` seconds pass; True when a slot was taken."""
        if self.try_acquire():
            return True
        w = _ThreadWaiter()
        if self._enqueue(w):
            return True
        if w.event.wait(timeout):
            return True
        # Timed out: a grant may have raced with the timeout, then the slot is ours after all.
        return self._abandon(w)
