"""``cut_short``: one thread asks sync code in another to stop by making its deadline now (D3.14).

The threads meet at events the tests set, so nothing depends on how fast they run.
"""

from __future__ import annotations

import contextvars
import math
import threading

import pytest

import timebound as tb
from timebound._core._scopes import CancelScope, cut_short
from timebound.testing import VirtualClock


def _in_thread(body: object, ctx: contextvars.Context) -> threading.Thread:
    thread = threading.Thread(target=ctx.run, args=(body,))
    thread.start()
    return thread


def test_code_inside_nested_scopes_sees_the_cut(virtual_clock: VirtualClock) -> None:
    """A checkpoint under a later nested scope raises at once, reporting the cut scope, which
    reports itself expired; remaining() is 0 there."""
    scope = CancelScope(raise_on_expiry=False, what="race")
    entered = threading.Event()
    seen: dict[str, object] = {}
    ctx = contextvars.copy_context()

    def body() -> None:
        with scope, tb.fail_after(10, what="inner"):
            entered.set()
            try:
                while True:
                    tb.checkpoint()
                    threading.Event().wait(0.001)
            except tb.DeadlineExceeded as exc:
                seen["what"] = str(exc)
                seen["left"] = tb.remaining()
                raise

    thread = _in_thread(body, ctx)
    entered.wait()
    cut_short(scope, ctx)
    thread.join(10)
    assert "race" in str(seen["what"]) and seen["left"] == 0.0
    assert scope.expired and scope.deadline == tb.Deadline(0.0)


def test_a_no_deadline_block_keeps_its_deadline(virtual_clock: VirtualClock) -> None:
    """Work inside no_deadline() is not cut; the code sees the cut once it leaves the block."""
    scope = CancelScope(raise_on_expiry=False)
    inside, cut = threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    ctx = contextvars.copy_context()

    def body() -> None:
        with scope:
            with tb.no_deadline():
                inside.set()
                cut.wait()
                seen["inside"] = tb.remaining()
            seen["after"] = tb.remaining()

    thread = _in_thread(body, ctx)
    inside.wait()
    cut_short(scope, ctx)
    cut.set()
    thread.join(10)
    assert seen == {"inside": math.inf, "after": 0.0}


def test_a_scope_already_left_touches_no_enclosing_frame(virtual_clock: VirtualClock) -> None:
    """Cut after the code left the scope: only the scope changes, never the frames around it
    (the caller's own deadline stays where it was)."""
    with tb.fail_after(10):
        scope = CancelScope(raise_on_expiry=False)
        with scope:
            pass
        cut_short(scope, contextvars.copy_context())
        assert tb.remaining() == pytest.approx(10)


def test_a_passed_deadline_is_never_moved(virtual_clock: VirtualClock) -> None:
    """Cutting a scope whose deadline already passed leaves that earlier instant."""
    scope = tb.move_on_after(1)
    with scope:
        virtual_clock.advance(2)
        cut_short(scope, contextvars.copy_context())
        assert scope.deadline == tb.Deadline(1.0)
