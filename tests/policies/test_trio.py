"""Policies under trio: the same scopes, delays and limits on trio's virtual clock."""

from __future__ import annotations

import pytest
import trio

from timebound import DeadlineExceeded, RetryExhausted
from timebound.policies import Policy
from timebound.testing import VirtualClock


def test_retry_with_timeouts_under_trio(virtual_clock: VirtualClock) -> None:
    """timeout=10, retry=3, delay=1 against a hung trio call ends at exactly 43 s."""
    starts: list[float] = []

    async def hang() -> None:
        starts.append(trio.current_time())
        await trio.sleep_forever()

    async def main() -> RetryExhausted:
        with pytest.raises(RetryExhausted) as info:
            await Policy("TrioHang", timeout=10, retry=3, delay=1).execute(hang)
        return info.value

    err = trio.run(main, clock=virtual_clock.trio_clock())
    assert starts == [0.0, 11.0, 22.0, 33.0]
    assert all(isinstance(e, DeadlineExceeded) and e.source == "attempt" for e in err.errors)


def test_concurrency_and_throttle_under_trio(virtual_clock: VirtualClock) -> None:
    """concurrency=1 serialises trio tasks; throttle spaces them."""
    starts: list[float] = []

    async def work() -> None:
        starts.append(trio.current_time())
        await trio.sleep(2)

    policy = Policy("TrioLimits", concurrency=1, throttle="1/1s")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(policy.execute, work)

    trio.run(main, clock=virtual_clock.trio_clock())
    assert starts == [0.0, 2.0, 4.0]
