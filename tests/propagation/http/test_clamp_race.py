"""A deadline that passes between the spent-check and the remaining-time reading of a clamp."""

from __future__ import annotations

import itertools

import pytest

import timebound as tb
from timebound._core import _clock
from timebound.propagation._state import clamp_timeout
from timebound.testing import VirtualClock


def test_deadline_passing_between_two_clock_reads_fails_fast() -> None:
    """The first reading is before the deadline, the next at it: the call fails with the
    deadline's own error instead of being given a timeout of 0 (which urllib3 rejects)."""
    with VirtualClock() as clock, tb.inherit_deadline(tb.Deadline.after(1.0)):
        readings = itertools.chain([0.5], itertools.repeat(1.0))
        # Swapped by hand and restored to the virtual clock, which restores the real one on
        # exit (monkeypatch would restore the virtual clock after the test, freezing time).
        _clock.now = lambda: next(readings)
        try:
            with pytest.raises(tb.DeadlineExceeded) as info:
                clamp_timeout(5.0)
        finally:
            _clock.now = clock.now
    assert info.value.source == "inherited"
    assert _clock.now is not clock.now
