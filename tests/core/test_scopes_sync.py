"""Deadline scopes in plain synchronous code: cooperative (DECISIONS D1.6, D1.7)."""

from __future__ import annotations

import contextvars
import threading

import pytest

import timebound as tb
from timebound.testing import VirtualClock


def test_checkpoint_raises_after_deadline(virtual_clock: VirtualClock) -> None:
    """checkpoint() raises DeadlineExceeded once the effective deadline has passed."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            tb.checkpoint()  # in time: no error
            virtual_clock.advance(1)
            tb.checkpoint()
            pytest.fail("checkpoint should have raised")
    assert info.value.source == "scope"


def test_fail_after_raises_at_exit_when_body_overran(virtual_clock: VirtualClock) -> None:
    """A sync body that overran its deadline raises at exit: its result is late (D1.7)."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1) as scope:
            virtual_clock.advance(1.5)
    assert scope.expired
    assert info.value.timeout == 1


def test_move_on_after_sets_flag_when_overran(virtual_clock: VirtualClock) -> None:
    """move_on_after only sets .expired when the body overran."""
    with tb.move_on_after(1) as scope:
        virtual_clock.advance(2)
    assert scope.expired


def test_move_on_absorbs_its_own_checkpoint(virtual_clock: VirtualClock) -> None:
    """A checkpoint reporting the move_on scope's own deadline is absorbed by that scope."""
    reached = False
    with tb.move_on_after(1) as scope:
        virtual_clock.advance(1)
        tb.checkpoint()
        reached = True
    assert scope.expired and not reached


def test_move_on_does_not_absorb_outer_deadline(virtual_clock: VirtualClock) -> None:
    """An enclosing deadline's checkpoint error passes through an inner move_on untouched."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        with tb.fail_after(1):
            with tb.move_on_after(5) as inner:
                virtual_clock.advance(1)
                tb.checkpoint()
    assert info.value.timeout == 1
    assert not inner.expired


def test_in_time_no_error(virtual_clock: VirtualClock) -> None:
    """A body that finishes exactly before the deadline is not expired."""
    with tb.fail_after(1) as scope:
        virtual_clock.advance(0.999)
    assert not scope.expired


def test_body_exception_wins_over_lateness(virtual_clock: VirtualClock) -> None:
    """If the body raised its own error, that error propagates; the flag still records lateness."""
    with pytest.raises(KeyError):
        with tb.fail_after(1) as scope:
            virtual_clock.advance(2)
            raise KeyError("x")
    assert scope.expired


def test_sync_sleep_is_virtual(virtual_clock: VirtualClock) -> None:
    """timebound's clock sleep advances virtual time instantly."""
    from timebound._core import _clock

    _clock.sleep(30)
    assert virtual_clock.now() == 30.0


def test_threads_do_not_share_deadlines_unless_copied(virtual_clock: VirtualClock) -> None:
    """A plain thread starts with no deadline; one run in a copied context sees it."""
    seen: dict[str, float] = {}

    def look(key: str) -> None:
        seen[key] = tb.remaining()

    with tb.fail_after(3):
        plain = threading.Thread(target=look, args=("plain",))
        ctx = contextvars.copy_context()
        copied = threading.Thread(target=ctx.run, args=(look, "copied"))
        plain.start()
        copied.start()
        plain.join()
        copied.join()
    assert seen["plain"] == float("inf")
    assert seen["copied"] == 3.0


def test_nested_sync_scopes_min(virtual_clock: VirtualClock) -> None:
    """Nested sync scopes expose the earliest deadline and restore on exit."""
    with tb.fail_after(10):
        with tb.fail_after(2):
            assert tb.remaining() == 2.0
        assert tb.remaining() == 10.0
        with tb.no_deadline():
            assert tb.current_deadline().is_never
            with tb.inherit_deadline(tb.Deadline.after(4)) as d:
                assert d == tb.Deadline(4.0)
                assert tb.remaining() == 4.0


def test_inherit_deadline_never_lengthens(virtual_clock: VirtualClock) -> None:
    """A later inherited deadline cannot lengthen an enclosing one (D1.5)."""
    with tb.fail_after(2):
        with tb.inherit_deadline(tb.Deadline.after(60)) as d:
            assert d == tb.Deadline(2.0)
            assert tb.remaining() == 2.0


def test_bound_error_names_what_it_stopped(virtual_clock: VirtualClock) -> None:
    """A client that finds an enclosing deadline spent says what it stopped, and whose bound it
    was, without claiming it ran for the bound's whole budget."""
    from timebound._core._scopes import current_bound_error

    with tb.move_on_after(0.3, what="checkout"):
        assert current_bound_error("http request") is None
        virtual_clock.advance(0.3)
        err = current_bound_error("http request")
    assert err is not None
    assert err.source == "scope" and err.timeout == 0.3
    assert str(err) == "http request stopped: checkout timed out after 300ms (scope deadline)"
