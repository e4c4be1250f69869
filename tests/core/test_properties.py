"""Properties of the effective deadline (CONVENTIONS: Hypothesis where it pays)."""

from __future__ import annotations

import asyncio
import contextlib
import math

from hypothesis import given, settings
from hypothesis import strategies as st

import timebound as tb
from timebound.testing import VirtualClock

# A frame is (kind, seconds): kind in scope | inherit | block | shield.
frames = st.lists(
    st.tuples(
        st.sampled_from(["scope", "inherit", "block", "shield"]),
        st.floats(min_value=0.001, max_value=1000, allow_nan=False),
    ),
    max_size=12,
)


@given(frames)
@settings(max_examples=200, deadline=None)
def test_child_never_later_than_parent(stack: list[tuple[str, float]]) -> None:
    """Entering any bound never makes the effective deadline later, except an explicit detach."""
    with VirtualClock(), contextlib.ExitStack() as es:
        expected = math.inf
        for kind, seconds in stack:
            before = tb.current_deadline().when
            if kind == "scope":
                es.enter_context(tb.move_on_after(seconds))
                expected = min(expected, seconds)
            elif kind == "inherit":
                es.enter_context(tb.inherit_deadline(tb.Deadline.after(seconds)))
                expected = min(expected, seconds)
            elif kind == "block":
                es.enter_context(tb.no_deadline())
                expected = math.inf
            else:
                es.enter_context(tb.move_on_after(seconds, shield=True))
                expected = seconds
            now = tb.current_deadline().when
            if kind in ("scope", "inherit"):
                assert now <= before
            assert now == expected
            assert tb.remaining() == expected


@given(st.lists(st.floats(min_value=0.01, max_value=100), min_size=1, max_size=6))
@settings(max_examples=100, deadline=None)
def test_earliest_nested_scope_fires_first(budgets: list[float]) -> None:
    """With nested move_on scopes, time stops exactly at the earliest budget and only the
    outermost scope holding that budget reports expiry."""
    clock = VirtualClock()
    scopes: list[tb.CancelScope] = []

    async def main() -> None:
        async with contextlib.AsyncExitStack() as es:
            for b in budgets:
                scopes.append(await es.enter_async_context(tb.move_on_after(b)))
            await asyncio.sleep(math.inf)

    clock.run(main())
    first = min(budgets)
    assert clock.now() == first
    catcher = budgets.index(first)
    assert scopes[catcher].expired
    for i, scope in enumerate(scopes):
        # Scopes with the same budget as the one that fired expired too (their deadline passed);
        # every other one did not.
        assert scope.expired == (budgets[i] == first)
