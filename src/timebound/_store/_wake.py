"""The loop of an engine on a store, and the tasks it starts (D12.1, D12.2).

An engine on a store works in rounds: a round does what is due now and answers how long the loop
may sleep, at most. :func:`run_rounds` then sleeps until that instant or until :class:`Wake` is
set (the engine's own news, another process's commit, a task that ended), whichever comes first.
:class:`Detached` holds the tasks an engine starts beside its loop until they end, and cancels
them when the engine stops. The workflow engine and the deferred poller both run on these.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterator
from typing import Any, NoReturn, TypeVar

from .._core import _clock
from ._base import wake_delay

__all__ = ["Detached", "Wake", "run_rounds", "sleep_until_set"]

_T = TypeVar("_T")


class Wake:
    """The wake-up of one engine's loop: set when there is news, cleared by the loop alone.

    :meth:`sleep` sleeps until a stored instant or a wake-up, never :func:`asyncio.wait_for`: on
    Python 3.11 it can swallow a cancellation that arrives as the wait ends (cpython#86296), and
    a stop would then wait for the loop forever.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        # The epoch-ms instant the loop sleeps until (inf: until woken; None: not asleep).
        self._asleep_until: float | None = None

    def set(self) -> None:
        """News: the loop runs a round now (or as soon as the round in progress ends)."""
        self._event.set()

    def clear(self) -> None:
        """The loop takes the news (before its round reads the store, never after it)."""
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def news_at(self, at_ms: int | None) -> None:
        """News of work that is due at ``at_ms`` at the earliest (``None``: now): wake the loop
        unless it already sleeps until before then (its next round finds the work in the
        store)."""
        until = self._asleep_until
        if until is None or at_ms is None or at_ms < until:
            self._event.set()

    async def sleep(self, at_most: float | None = None, *, until_ms: int | None = None) -> None:
        """Sleep until woken, for ``at_most`` seconds at most, and no later than the stored
        instant ``until_ms`` (epoch ms, reached when the loop wakes: never early, D1.3)."""
        delay = at_most
        if until_ms is not None:
            to_instant = wake_delay(until_ms)
            delay = to_instant if delay is None else min(delay, to_instant)
        self._asleep_until = math.inf if delay is None else _clock.wall_ms() + delay * 1000
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._event.wait()
        finally:
            self._asleep_until = None


async def sleep_until_set(event: asyncio.Event, at_most: float | None) -> None:
    """Wait for ``event`` for ``at_most`` seconds at most (``None``: until it is set), without
    :func:`asyncio.wait_for` (see :class:`Wake`)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(at_most):
            await event.wait()


async def run_rounds(
    wake: Wake,
    round: Callable[[], Awaitable[float | None]],
    *,
    min_gap: float = 0.0,
) -> NoReturn:
    """Run ``round`` for ever: clear ``wake``, run a round, then sleep for as long as the round
    answered (seconds; ``None``: until woken; ``0``: run again at once) or until woken.

    ``wake`` is cleared before the round, never after it: news that arrives while the round runs
    (a poll that ended during its last query) sets it again and is not lost. Rounds start at
    least ``min_gap`` seconds apart (work found a little later, never earlier).
    """
    last = -math.inf
    while True:
        if min_gap > 0:
            gap = last + min_gap - _clock.now()
            if gap > 0:
                await asyncio.sleep(gap)
            last = _clock.now()
        wake.clear()
        delay = await round()
        if delay is None or delay > 0:
            await wake.sleep(delay)


class Detached:
    """The tasks an engine started beside its loop, held until they end (the event loop keeps
    only a weak reference to a task) and cancelled together when the engine stops.

    A task may be started under a ``key`` (an operation's id, say) to find it again.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._keyed: dict[Hashable, asyncio.Task[Any]] = {}

    def spawn(
        self, coro: Coroutine[Any, Any, _T], *, name: str | None = None, key: Hashable = None
    ) -> asyncio.Task[_T]:
        """Start ``coro`` in a task of the running loop and hold it until it ends."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if key is not None:
            self._keyed[key] = task
            task.add_done_callback(lambda t: self._forget(key, t))
        return task

    def _forget(self, key: Hashable, task: asyncio.Task[Any]) -> None:
        if self._keyed.get(key) is task:
            del self._keyed[key]

    def get(self, key: Hashable) -> asyncio.Task[Any] | None:
        """The running task started under ``key``, if any."""
        return self._keyed.get(key)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._tasks))

    async def cancel(self) -> None:
        """Cancel every task and wait until each has ended (whatever it raised: the engine is
        stopping); tasks started meanwhile are cancelled too."""
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)
