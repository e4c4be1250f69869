"""Identical calls in flight under one cache (DECISIONS D3.6): one runs, the others wait.

Without this, two identical calls that start together both miss the cache and both run; with it,
the first is the *leader* and the others *follow*: they wait for the leader to finish and then
read its stored result, so "the second call is instant" holds even when both start at once.

What a follower gets when the leader did not succeed is decided by the leader's ending:

- the call itself failed (its error, its own timeouts, ``RetryExhausted``): the same error, which
  the follower's fallback and ``on_error`` then handle; the failure is never cached, and running
  it again at once would only multiply the load on whatever is failing;
- the leader was stopped by *its caller's* deadline, cancelled or interrupted: that says nothing
  about the call, so the followers start again and one of them leads.

Waiting works for threads, asyncio tasks (on any loop) and trio tasks, and is bounded by the
follower's own deadline (its scopes cancel the wait; a thread waits at most its remaining time).
"""

from __future__ import annotations

import sys
import threading
from typing import Final

from .._core._scopes import remaining, running_loop
from ._limits import _AsyncioWaiter, _ThreadWaiter, _TrioWaiter, _Waiter

__all__ = ["Flight", "Flights"]

_INF: Final = float("inf")


class Flight:
    """One call in flight: done once its leader finished; ``error`` is what followers share."""

    __slots__ = ("done", "error", "waiters")

    def __init__(self) -> None:
        self.done = False
        self.error: Exception | None = None
        self.waiters: list[_Waiter] = []


class Flights:
    """The calls in flight through one cache (or one policy with another backend), by cache
    key. Thread-safe."""

    __slots__ = ("_flights", "_lock")

    def __init__(self) -> None:
        self._flights: dict[str, Flight] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def join(self, key: str) -> Flight | None:
        """``None``: the caller leads (and must :meth:`finish`); else the flight to follow."""
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                self._flights[key] = Flight()
            return flight

    def finish(self, key: str, error: Exception | None) -> None:
        """The leader of ``key`` is done; ``error`` is the failure its followers share, if any."""
        with self._lock:
            flight = self._flights.pop(key)
            flight.done = True
            flight.error = error
            waiters, flight.waiters = flight.waiters, []
        for w in waiters:
            w.wake()

    def _enqueue(self, flight: Flight, waiter: _Waiter) -> bool:
        """Queue ``waiter`` on ``flight``; False when the flight is already done."""
        with self._lock:
            if flight.done:
                return False
            flight.waiters.append(waiter)
            return True

    def _abandon(self, flight: Flight, waiter: _Waiter) -> None:
        with self._lock:
            if waiter in flight.waiters:
                flight.waiters.remove(waiter)

    async def wait(self, flight: Flight) -> None:
        """Wait (asyncio or trio) until ``flight`` is done; cancellable."""
        loop = running_loop()
        if loop is not None:
            aw = _AsyncioWaiter(loop)
            if not self._enqueue(flight, aw):
                return
            try:
                await aw.fut
            except BaseException:
                self._abandon(flight, aw)
                raise
            return
        tw = _TrioWaiter(sys.modules["trio"])
        if not self._enqueue(flight, tw):
            return
        try:
            await tw.event.wait()
        except BaseException:
            self._abandon(flight, tw)
            raise

    def wait_sync(self, flight: Flight) -> bool:
        """Block until ``flight`` is done or the effective deadline passes; True when done."""
        w = _ThreadWaiter()
        if not self._enqueue(flight, w):
            return True
        left = remaining()
        if w.event.wait(None if left == _INF else left):
            return True
        self._abandon(flight, w)
        return flight.done
