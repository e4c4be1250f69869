"""The one source classification (timebound._core._classify): own, enclosing or remote."""

from __future__ import annotations

import pickle

import pytest

from timebound import DeadlineExceeded, fail_after, move_on_after
from timebound._core._classify import bound_origin, classify, mark_enclosing
from timebound._core._errors import SOURCES
from timebound._core._scopes import current_bound_error
from timebound.policies import Policy
from timebound.testing import VirtualClock


def _inner_error(source: str, clock: VirtualClock) -> DeadlineExceeded:
    """The error of a bound with ``source`` that fired and has been left."""
    with pytest.raises(DeadlineExceeded) as info, fail_after(1, source=source):
        clock.advance(2)
    return info.value


def test_a_source_the_layer_owns_is_own(virtual_clock: VirtualClock) -> None:
    """An error from a source named in ``own=`` is the layer's own, even while it is in force."""
    with move_on_after(1, source="total"):
        virtual_clock.advance(1)
        err = current_bound_error()
        assert err is not None
        assert classify(err, own={"attempt", "total"}) == "own"
        assert classify(err) == "enclosing"


def test_remote_sources_are_remote_wherever_they_are_caught() -> None:
    """``inherited`` and ``propagated`` bounds are another process's deadline."""
    for source in ("inherited", "propagated"):
        assert classify(DeadlineExceeded(source=source)) == "remote"


def test_a_spent_enclosing_bound_is_enclosing(virtual_clock: VirtualClock) -> None:
    """A bound around the catching code that has passed is the caller's."""
    with move_on_after(1):
        virtual_clock.advance(1)  # exactly at the deadline: reached (D1.3)
        err = current_bound_error()
        assert err is not None
        assert classify(err) == "enclosing"


def test_a_bound_inside_the_code_that_ran_is_own(virtual_clock: VirtualClock) -> None:
    """A scope inside the call that fired and was left is that call failing."""
    assert classify(_inner_error("scope", virtual_clock)) == "own"


def test_an_unfired_enclosing_bound_is_never_enclosing(virtual_clock: VirtualClock) -> None:
    """Never early: a bound with time left does not make an inner error the caller's."""
    with fail_after(5):
        err = _inner_error("scope", virtual_clock)
        virtual_clock.advance(1.999)  # 4.999 s after the outer scope's entry
        assert classify(err) == "own"


def test_a_marked_error_is_enclosing_before_its_bound_passes() -> None:
    """``mark_enclosing`` records an error raised ahead of time for an enclosing bound."""
    err = mark_enclosing(DeadlineExceeded(source="scope"))
    assert classify(err) == "enclosing"


def test_the_mark_survives_pickling() -> None:
    """The mark is data: a marked error classifies the same after a round trip."""
    err = pickle.loads(pickle.dumps(mark_enclosing(DeadlineExceeded(source="node"))))
    assert classify(err) == "enclosing"


@pytest.mark.parametrize("source", sorted(SOURCES - {"inherited", "propagated", "attempt"}))
def test_every_local_source_is_classified_by_whether_it_is_in_force(
    source: str, virtual_clock: VirtualClock
) -> None:
    """A new source needs no edit: in force and spent it is enclosing, left behind it is own."""
    assert classify(_inner_error(source, virtual_clock)) == "own"
    with move_on_after(1, source=source):
        virtual_clock.advance(1)
        err = current_bound_error()
        assert err is not None and err.source == source
        assert classify(err) == "enclosing"


def test_bound_origin_classifies_the_binding_bound_by_source() -> None:
    """A bound in force: own when the layer owns it, remote for another process's, else
    enclosing; no bound at all is None."""
    assert bound_origin(None) is None
    assert bound_origin("attempt") == "own"
    assert bound_origin("inherited") == "remote"
    assert bound_origin("workflow") == "enclosing"
    assert bound_origin("total", own={"attempt", "total"}) == "own"


def test_a_policy_retries_a_region_bound_inside_the_call(virtual_clock: VirtualClock) -> None:
    """A policy asks the classification, so a new source inside the call is retried like any
    inner scope's."""
    calls = 0

    def fn() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            with fail_after(1, source="region"):
                virtual_clock.advance(1)
        return "ok"

    assert Policy("p", retry=1).execute_sync(fn) == "ok"
    assert calls == 2
