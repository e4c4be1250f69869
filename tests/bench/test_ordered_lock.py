"""The benchmark's worker lock (``bench/_services.py``): cancellation while being handed over.

Seen in a full benchmark run (M3, rho 3): a waiter's task was cancelled at its deadline, and
before it ran its ``except`` clause the holder released, popped the cancelled future and skipped
it. The waiter then tried to remove a future no longer queued (``ValueError``). asyncio delivers
the cancel correctly; the lock must expect its future to be gone.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest

# Loaded from its file, without touching sys.path or sys.modules (no process state left).
_spec = importlib.util.spec_from_file_location(
    "bench_services", Path(__file__).resolve().parents[2] / "bench" / "_services.py"
)
assert _spec is not None and _spec.loader is not None
_services = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_services)
OrderedLock = _services.OrderedLock


@pytest.mark.parametrize("lifo", [False, True])
def test_waiter_cancelled_then_skipped_by_a_release_leaves_cleanly(lifo: bool) -> None:
    async def main() -> None:
        lock = OrderedLock(lifo)
        await lock.__aenter__()
        entered: list[str] = []

        async def waiter(name: str) -> None:
            async with lock:
                entered.append(name)

        first = asyncio.create_task(waiter("first"))
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)  # both queued
        first.cancel()  # cancels its future at once; its handler runs later
        await lock.__aexit__(None, None, None)  # pops and skips the cancelled future
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        assert entered == ["second"]
        # The lock is free again: a new holder gets it without waiting.
        await asyncio.wait_for(lock.__aenter__(), 1.0)
        await lock.__aexit__(None, None, None)

    asyncio.run(main())


def test_waiter_cancelled_after_the_handover_passes_the_lock_on() -> None:
    async def main() -> None:
        lock = OrderedLock()
        await lock.__aenter__()
        entered: list[str] = []

        async def waiter(name: str) -> None:
            async with lock:
                entered.append(name)

        first = asyncio.create_task(waiter("first"))
        second = asyncio.create_task(waiter("second"))
        await asyncio.sleep(0)
        await lock.__aexit__(None, None, None)  # hands the lock to "first"
        first.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        assert entered == ["second"]

    asyncio.run(main())
