"""Tasks a region can stop waiting for (D5.7, D5.8).

A region's deadline cancels the tasks of its branch; a task that cannot be cancelled must not
hold the region, nor the request, past that deadline. A sync task that a deadline bounds runs in
a worker thread (the blocking tier's :func:`~timebound._core._preempt.arun_in_thread`), so the
event loop keeps firing timers and the region stops waiting at its deadline. An async task runs
as a task of its own that its caller awaits through a shield: at the deadline it is cancelled
and given a few loop turns to finish (a cooperative task needs one); one that swallows the
cancellation is abandoned, not awaited. Either way a result that comes later is dropped: a task
writes only through the engine, after it returned in time, so a late write is never committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .._core._preempt import arun_in_thread

__all__ = ["await_abandonable", "run_in_worker"]

_log = logging.getLogger("timebound.pipeline")

# Loop turns a cancelled task gets to end before it counts as abandoned. A task cancelled at an
# ``await`` ends in the first; the others leave room for a cleanup that awaits something ready.
_GRACE_TURNS = 3


async def run_in_worker(
    fn: Callable[..., Any], args: tuple[Any, ...], name: str, on_abandon: Callable[[str], None]
) -> Any:
    """``fn(*args)`` in a worker thread; abandoned (counted, warned) when the caller stops
    waiting while it still runs."""
    return await arun_in_thread(fn, *args, what=f"task {name}", on_abandon=lambda: on_abandon(name))


async def await_abandonable(
    coro: Coroutine[Any, Any, Any], name: str, on_abandon: Callable[[str], None]
) -> Any:
    """Await ``coro`` so that a cancellation of the caller (a deadline) stops the wait even if
    ``coro`` swallows it. On trio the coroutine is awaited directly (structured concurrency
    waits for what it started: a task that swallows ``Cancelled`` holds the region there)."""
    loop = asyncio._get_running_loop()
    if loop is None:
        return await coro
    inner = loop.create_task(coro)  # a copy of this context: it sees the same deadline
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        inner.cancel()
        for _ in range(_GRACE_TURNS):
            if inner.done():
                break
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                pass  # the caller is already being cancelled; the raise below says so
        if not inner.done():
            inner.add_done_callback(_finished_late)
            _log.warning(
                "pipeline task %r did not stop when cancelled; abandoned (its result is dropped)",
                name,
            )
            on_abandon(name)
        elif not inner.cancelled():
            inner.exception()  # retrieved: a late result or error is dropped with the run
        raise


def _finished_late(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, never reported as "never retrieved"
