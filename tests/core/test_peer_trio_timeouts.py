"""The ideas of trio's ``test_timeouts.py``, asked of timebound's scopes running under trio."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable

import pytest

import timebound as tb
from timebound.testing import VirtualClock

trio = pytest.importorskip("trio")


def _run(clock: VirtualClock, main: Callable[[], Awaitable[None]]) -> None:
    trio.run(main, clock=clock.trio_clock())


def test_move_on_after_stops_exactly_at_the_deadline(virtual_clock: VirtualClock) -> None:
    """move_on_after ends a long sleep exactly at its deadline and marks the scope expired."""

    async def main() -> None:
        with tb.move_on_after(1.5) as scope:
            await trio.sleep(100)
        assert scope.expired and trio.current_time() == 1.5

    _run(virtual_clock, main)


def test_fail_at_raises_at_the_absolute_deadline(virtual_clock: VirtualClock) -> None:
    """fail_at raises DeadlineExceeded (a TimeoutError, like TooSlowError's role) at its instant."""

    async def main() -> None:
        deadline = tb.Deadline.after(3)
        with pytest.raises(TimeoutError):
            with tb.fail_at(deadline):
                await trio.sleep(100)
        assert trio.current_time() == 3.0

    _run(virtual_clock, main)


def test_relative_deadline_counts_from_entry(virtual_clock: VirtualClock) -> None:
    """A scope built at t=0 and entered at t=5 ends at t=15 (the deadline is fixed on entry)."""

    async def main() -> None:
        scope = tb.move_on_after(10)
        await trio.sleep(5)
        with scope:
            await trio.sleep(100)
        assert trio.current_time() == 15.0

    _run(virtual_clock, main)


def test_nan_budget_is_a_value_error() -> None:
    """A NaN budget is rejected as a ValueError subclass (ConfigurationError), as trio does."""
    with pytest.raises(ValueError, match="NaN"):
        tb.move_on_after(math.nan)


def test_shielded_scope_ignores_the_enclosing_deadline(virtual_clock: VirtualClock) -> None:
    """A shielded scope inside an expired one runs until its own deadline."""

    async def main() -> None:
        with tb.move_on_after(1) as outer:
            with tb.move_on_after(5, shield=True) as inner:
                await trio.sleep(100)
        assert inner.expired and outer.expired
        assert trio.current_time() == 5.0

    _run(virtual_clock, main)


def test_every_checkpoint_in_a_spent_scope_is_interrupted(virtual_clock: VirtualClock) -> None:
    """After its deadline, each further checkpoint in the scope raises again (level-triggered)."""

    async def main() -> None:
        interrupted = 0
        with tb.move_on_after(1):
            for _ in range(3):
                try:
                    await trio.sleep(10)
                except trio.Cancelled:
                    interrupted += 1
        assert interrupted == 3 and trio.current_time() == 1.0

    _run(virtual_clock, main)


def test_negative_budget_is_already_expired_unlike_trio(virtual_clock: VirtualClock) -> None:
    """trio rejects a negative budget; timebound treats it as already expired (D1.9)."""

    async def main() -> None:
        with tb.move_on_after(-1) as scope:
            await trio.sleep(1)
        assert scope.expired and trio.current_time() == 0.0

    _run(virtual_clock, main)
