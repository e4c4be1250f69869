"""The durable form of a deadline: absolute UTC epoch milliseconds (DECISIONS D1.10)."""

from __future__ import annotations

import copy
import math
import pickle

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.testing import VirtualClock

# VirtualClock's wall clock reads this at virtual time 0.
_WALL0_MS = 1_767_225_600_000


def test_to_epoch_ms_is_wall_clock_plus_remaining(virtual_clock: VirtualClock) -> None:
    """to_epoch_ms() is the wall-clock reading now plus what is left, in whole milliseconds."""
    virtual_clock.advance(10)
    assert tb.Deadline.after(5).to_epoch_ms() == _WALL0_MS + 15_000


def test_to_epoch_ms_rounds_up(virtual_clock: VirtualClock) -> None:
    """A fraction of a millisecond rounds up, so the stored deadline is never earlier (D1.3)."""
    assert tb.Deadline.after(0.2501).to_epoch_ms() == _WALL0_MS + 251


def test_to_epoch_ms_does_not_bump_exact_values(virtual_clock: VirtualClock) -> None:
    """An instant on a whole millisecond is written as that millisecond, not the next."""
    assert tb.Deadline.after(0.007).to_epoch_ms() == _WALL0_MS + 7


def test_never_is_written_as_none_and_read_back() -> None:
    """Deadline.never() has no epoch form (None), and None loads as never."""
    assert tb.Deadline.never().to_epoch_ms() is None
    assert tb.Deadline.from_epoch_ms(None) is tb.Deadline.never()


def test_from_epoch_ms_converts_to_the_local_monotonic_clock(virtual_clock: VirtualClock) -> None:
    """A stored instant becomes now + (instant - wall clock now) on the monotonic clock."""
    virtual_clock.advance(100)
    d = tb.Deadline.from_epoch_ms(_WALL0_MS + 130_000)
    assert d.when == 130.0
    assert d.remaining() == 30.0


def test_epoch_form_round_trips(virtual_clock: VirtualClock) -> None:
    """A deadline on a whole millisecond survives to_epoch_ms() -> from_epoch_ms() unchanged."""
    d = tb.Deadline.after(2.5)
    assert tb.Deadline.from_epoch_ms(d.to_epoch_ms()) == d


def test_a_past_instant_loads_as_an_expired_deadline(virtual_clock: VirtualClock) -> None:
    """An instant already passed on this machine's wall clock is an expired deadline."""
    virtual_clock.advance(60)
    d = tb.Deadline.from_epoch_ms(_WALL0_MS + 1_000)
    assert d.expired and d.remaining() == 0.0


def test_skew_between_machines_shifts_the_loaded_deadline() -> None:
    """Loaded on a machine whose wall clock is 2 s ahead, a deadline has 2 s less left."""
    writer = VirtualClock(start=50.0)
    with writer:
        stored = tb.Deadline.after(10).to_epoch_ms()
    reader = VirtualClock(start=7.0, wall_start=writer.wall() + 2.0)
    with reader:
        loaded = tb.Deadline.from_epoch_ms(stored)
        assert loaded.when == 15.0
        assert loaded.remaining() == 8.0


def test_a_wall_clock_step_after_loading_does_not_move_the_deadline(
    virtual_clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once loaded, the deadline lives on the monotonic clock: a wall-clock jump changes nothing."""
    d = tb.Deadline.from_epoch_ms(_WALL0_MS + 5_000)
    monkeypatch.setattr(_clock, "wall", lambda: virtual_clock.wall() + 3600.0)
    assert d.remaining() == 5.0


@pytest.mark.parametrize("bad", [1.5e12, "1767225600000", True, b"1"])
def test_from_epoch_ms_rejects_what_is_not_whole_milliseconds(bad: object) -> None:
    """A non-integer epoch value is a ConfigurationError naming epoch_ms."""
    with pytest.raises(tb.ConfigurationError, match="epoch milliseconds") as info:
        tb.Deadline.from_epoch_ms(bad)  # type: ignore[arg-type]
    assert info.value.option == "epoch_ms"


def test_from_epoch_ms_rejects_an_instant_too_large_to_represent() -> None:
    """An epoch value beyond any float is a ConfigurationError, not an OverflowError."""
    with pytest.raises(tb.ConfigurationError, match="too large") as info:
        tb.Deadline.from_epoch_ms(10**400)
    assert info.value.option == "epoch_ms"


def test_pickle_carries_the_epoch_form_not_the_monotonic_instant(
    virtual_clock: VirtualClock,
) -> None:
    """A pickled deadline holds epoch milliseconds; the monotonic instant never leaves."""
    d = tb.Deadline.after(4)
    assert d.__reduce__() == (tb.Deadline.from_epoch_ms, (_WALL0_MS + 4_000,))
    data = pickle.dumps(d)
    other = VirtualClock(start=1000.0, wall_start=virtual_clock.wall())
    with other:
        assert pickle.loads(data).when == 1004.0


def test_pickled_never_stays_never() -> None:
    """Deadline.never() pickles and loads as never."""
    back = pickle.loads(pickle.dumps(tb.Deadline.never()))
    assert back.is_never and back.when == math.inf


def test_copy_keeps_the_exact_instant(virtual_clock: VirtualClock) -> None:
    """copy/deepcopy return the same immutable value, not a rounded epoch round-trip."""
    d = tb.Deadline.after(0.0001234)
    assert copy.copy(d) is d
    assert copy.deepcopy({"d": d})["d"] is d


def test_pickled_deadline_exceeded_keeps_its_deadline(virtual_clock: VirtualClock) -> None:
    """A DeadlineExceeded that crosses a process boundary keeps its deadline (epoch form)."""
    err = tb.DeadlineExceeded(source="node", timeout=3.0, deadline=tb.Deadline.after(3))
    back = pickle.loads(pickle.dumps(err))
    assert back.deadline == tb.Deadline(3.0)


def test_wall_ms_rounds_down_so_an_expiry_never_holds_early(virtual_clock: VirtualClock) -> None:
    """Now in epoch ms is floored: a deadline stored rounded up is reached, never passed early."""
    virtual_clock.advance(0.2509)
    assert _clock.wall_ms() == _WALL0_MS + 250
    stored = tb.Deadline.after(0.0001).to_epoch_ms()
    assert stored is not None and stored > _clock.wall_ms()


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [((), None), ((None, None), None), ((5, None, 3), 3), ((None, 7), 7), ((0, 9), 0)],
)
def test_earliest_takes_the_smallest_present_bound(
    bounds: tuple[int | None, ...], expected: int | None
) -> None:
    """None means no bound; zero is a bound like any other."""
    assert _clock.earliest(*bounds) == expected
