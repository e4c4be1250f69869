"""Run the same executor scenario on asyncio and on trio, both on virtual time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from timebound.testing import VirtualClock

Runner = Callable[[Callable[[], Awaitable[Any]]], Any]


@pytest.fixture(params=["asyncio", "trio"])
def run(request: pytest.FixtureRequest) -> Runner:
    """``run(main)`` runs ``main()`` to completion on the parametrized backend, virtual time."""
    backend = request.param

    def runner(main: Callable[[], Awaitable[Any]]) -> Any:
        clock = VirtualClock()
        if backend == "asyncio":

            async def wrapped() -> Any:
                return await main()

            return clock.run(wrapped())
        with clock:
            return trio.run(main, clock=clock.trio_clock())

    return runner
