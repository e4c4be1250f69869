"""The same scopes under trio, on a virtual trio clock."""

from __future__ import annotations

import math

import pytest

import timebound as tb
from timebound.testing import VirtualClock

trio = pytest.importorskip("trio")


def run(clock: VirtualClock, fn: object) -> None:
    trio.run(fn, clock=clock.trio_clock())


def test_fail_after_under_trio(virtual_clock: VirtualClock) -> None:
    """fail_after raises DeadlineExceeded at its deadline under trio."""

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded) as info:
            async with tb.fail_after(2):
                await trio.sleep(math.inf)
        assert info.value.source == "scope"
        assert trio.current_time() == 2.0

    run(virtual_clock, main)


def test_move_on_after_under_trio(virtual_clock: VirtualClock) -> None:
    """move_on_after swallows and sets .expired under trio."""

    async def main() -> None:
        with tb.move_on_after(1.5) as scope:
            await trio.sleep(10)
        assert scope.expired and trio.current_time() == 1.5

    run(virtual_clock, main)


def test_nested_outer_binding_under_trio(virtual_clock: VirtualClock) -> None:
    """The outer, earlier scope catches; the inner is not expired."""

    async def main() -> None:
        with tb.move_on_after(1) as outer:
            with tb.fail_after(5) as inner:
                await trio.sleep(10)
        assert outer.expired and not inner.expired
        assert trio.current_time() == 1.0

    run(virtual_clock, main)


def test_inherited_under_trio(virtual_clock: VirtualClock) -> None:
    """An inherited deadline ends a later trio scope and is reported as 'inherited'."""

    async def main() -> None:
        with tb.inherit_deadline(tb.Deadline.after(1)):
            with pytest.raises(tb.DeadlineExceeded) as info:
                with tb.move_on_after(5):
                    await trio.sleep(10)
        assert info.value.source == "inherited"

    run(virtual_clock, main)


def test_nursery_children_see_deadline(virtual_clock: VirtualClock) -> None:
    """trio tasks spawned in a nursery inherit the effective deadline."""
    seen: list[float] = []

    async def child() -> None:
        seen.append(tb.remaining())

    async def main() -> None:
        async with tb.fail_after(3):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(child)

    run(virtual_clock, main)
    assert seen == [3.0]


def test_acheckpoint_under_trio(virtual_clock: VirtualClock) -> None:
    """acheckpoint() yields to trio and raises once the deadline passed."""

    async def main() -> None:
        with tb.inherit_deadline(tb.Deadline.after(1)):
            await tb.acheckpoint()
            virtual_clock.advance(1)
            with pytest.raises(tb.DeadlineExceeded):
                await tb.acheckpoint()

    run(virtual_clock, main)


def test_virtual_trio_clock_waits_for_threads(virtual_clock: VirtualClock) -> None:
    """With no timer pending, the virtual trio clock waits for a thread, never jumps to inf."""

    async def main() -> int:
        return await trio.to_thread.run_sync(lambda: 41 + 1)

    assert trio.run(main, clock=virtual_clock.trio_clock()) == 42
    assert virtual_clock.now() == 0.0


def test_sync_overrun_under_trio(virtual_clock: VirtualClock) -> None:
    """Under trio, a body that overran without yielding raises at exit (fail) or flags (move_on)."""

    async def main() -> None:
        with pytest.raises(tb.DeadlineExceeded):
            with tb.fail_after(1):
                virtual_clock.advance(2)
        with tb.move_on_after(1) as scope:
            virtual_clock.advance(2)
            tb.checkpoint()
        assert scope.expired

    run(virtual_clock, main)
