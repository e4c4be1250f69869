"""The signal tier under a SIGALRM at every instant: no spent deadline ever leaks.

A signal can land between any two bytecodes. These tests deliver the tier's handler at the k-th
opcode after the deadline passed, for every k until the call completes without it, and check the
invariant afterwards: the main thread's context holds no deadline, no alarm is left, no timer
runs and the previous SIGALRM handler is back.
"""

from __future__ import annotations

import itertools
import signal
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

import timebound as tb
from timebound._core import _preempt
from timebound._core._scopes import _ROOT, _frame
from timebound.testing import VirtualClock

pytestmark = pytest.mark.timeout(120, method="thread")

# Far more opcodes than one nested call executes after its deadline; the loop stops earlier.
_MAX_INSTANTS = 20_000


class _Injector:
    """Runs the signal handler once, at the k-th opcode executed after ``arm()``."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.count = 0
        self.armed = False
        self.fired = False

    def arm(self) -> None:
        self.armed = True

    def trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode" and self.armed and not self.fired:
            self.count += 1
            if self.count == self.k:
                self.fired = True
                # As the interpreter would run it: in this frame, between two opcodes. An
                # exception it raises propagates into the frame (and ends tracing).
                _preempt._on_alarm(signal.SIGALRM, frame)
        return self.trace


def _run_injected(k: int, call: Callable[[_Injector], None]) -> _Injector:
    injector = _Injector(k)
    sys.settrace(injector.trace)
    try:
        with pytest.raises(tb.DeadlineExceeded) as info:
            call(injector)
    finally:
        sys.settrace(None)
    assert info.value.source == "scope"
    return injector


def _assert_clean(previous: object) -> None:
    assert _frame.get() is _ROOT, f"a deadline leaked into the context: {_frame.get()!r}"
    assert _preempt._alarms == []
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is previous


def _storm(call: Callable[[_Injector], None]) -> int:
    previous = signal.getsignal(signal.SIGALRM)
    for k in range(1, _MAX_INSTANTS):
        injector = _run_injected(k, call)
        _assert_clean(previous)
        if not injector.fired:
            return k  # every instant up to the end of the call was tried
    pytest.fail(f"the call did not end within {_MAX_INSTANTS} opcodes")


def test_nested_calls_leak_nothing_whenever_the_outer_deadline_fires(
    virtual_clock: VirtualClock,
) -> None:
    """An outer deadline delivered at any instant inside a nested call leaves nothing behind."""

    def inner(injector: _Injector) -> None:
        virtual_clock.advance(6)  # past the outer deadline (5 s)
        injector.arm()

    def outer(injector: _Injector) -> None:
        tb.run_with_signal(inner, injector, timeout=10)

    instants = _storm(lambda injector: tb.run_with_signal(outer, injector, timeout=5))
    assert instants > 10


def test_scopes_inside_the_call_leak_nothing_whenever_the_deadline_fires(
    virtual_clock: VirtualClock,
) -> None:
    """A deadline delivered at any instant while scopes are entered and left leaks none of them."""

    def body(injector: _Injector) -> None:
        virtual_clock.advance(6)
        injector.arm()
        for _ in range(3):
            with tb.move_on_after(1), tb.inherit_deadline(tb.Deadline.after(2)):
                pass
            with tb.no_deadline():
                pass

    instants = _storm(lambda injector: tb.run_with_signal(body, injector, timeout=5))
    assert instants > 10


def test_a_signal_in_the_bookkeeping_is_delivered_after_it(virtual_clock: VirtualClock) -> None:
    """A signal landing inside scope bookkeeping is deferred, not dropped: it still interrupts.

    The deferral re-arms a real timer. It is not held back by blocking SIGALRM in the main
    thread: the kernel then hands the signal to another thread (an earlier test's executor or
    gRPC thread) and Python runs the handler in the main thread anyway; a test that did so
    could leave the signal blocked. The first re-arm is made long instead, so the deferral is
    recorded before the real signal lands in the loop below; a signal that never comes fails
    the test rather than hanging the run.
    """
    stopped_in: list[str] = []
    previous = signal.getsignal(signal.SIGALRM)

    def body() -> None:
        virtual_clock.advance(6)
        _preempt._defer_delay = 0.1  # the first deferral's delay (run_with_signal reset it)
        # Deliver as if inside a scope's exit called from here: the handler must defer, not raise.
        inside_exit = _FakeFrame(tb.CancelScope.__exit__.__code__, sys._getframe())
        try:
            _preempt._on_alarm(signal.SIGALRM, inside_exit)  # type: ignore[arg-type]
            stopped_in.append("deferred")
            give_up = time.monotonic() + 30
            while time.monotonic() < give_up:  # the re-armed real timer interrupts this loop
                pass
        except tb.DeadlineExceeded:
            stopped_in.append("interrupted")
            raise
        pytest.fail("the deferred signal was never delivered")

    with pytest.raises(tb.DeadlineExceeded):
        tb.run_with_signal(body, timeout=5)
    assert stopped_in == ["deferred", "interrupted"]
    assert _preempt._defer_delay == _preempt._MIN_REARM  # a delivery starts over
    _assert_clean(previous)


class _FakeFrame:
    """Just enough of a frame for the handler's walk: its code and the frame below."""

    def __init__(self, code: types.CodeType, back: types.FrameType) -> None:
        self.f_code = code
        self.f_back = back


def test_deferrals_back_off_so_the_handler_cannot_nest_in_itself(
    virtual_clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Repeated deferrals re-arm later each time (capped), then a delivery starts over.

    With a fixed 10 µs re-arm, a signal that fired again before the handler had returned ran the
    handler nested in itself, one level deeper each time, until RecursionError (seen under
    opcode tracing on a loaded machine in ``test_scopes_inside_the_call_leak_nothing…``).
    """
    delays: list[float] = []
    previous = signal.getsignal(signal.SIGALRM)
    # The delays the handler arms, as it asks for them: reading the timer back would race it
    # (a 10 µs timer has often run out, blocked or not, by the time it is read).
    armed: list[float] = []
    real_setitimer = signal.setitimer

    def recording_setitimer(which: int, seconds: float, interval: float = 0.0) -> Any:
        armed.append(seconds)
        if arming[0]:
            return real_setitimer(which, seconds, interval)
        return (0.0, 0.0)

    monkeypatch.setattr(signal, "setitimer", recording_setitimer)
    # The deferrals' timers are recorded, not armed: a real one firing during the loop would be
    # delivered (blocking SIGALRM in the main thread does not hold it back while any other
    # thread takes it) and end the loop early.
    arming = [True]

    def body() -> None:
        virtual_clock.advance(6)
        inside_exit = _FakeFrame(tb.CancelScope.__exit__.__code__, sys._getframe())
        arming[0] = False
        try:
            for _ in range(14):
                _preempt._on_alarm(signal.SIGALRM, inside_exit)  # type: ignore[arg-type]
                delays.append(armed[-1])
        finally:
            arming[0] = True
        # Not protected: delivered now, and the next deferral starts from the minimum again.
        _preempt._on_alarm(signal.SIGALRM, sys._getframe())

    with pytest.raises(tb.DeadlineExceeded):
        tb.run_with_signal(body, timeout=5)
    assert all(later > earlier for earlier, later in itertools.pairwise(delays[:10]))
    assert delays[0] == _preempt._MIN_REARM and max(delays) == _preempt._MAX_DEFER
    assert delays[-1] == _preempt._MAX_DEFER
    assert _preempt._defer_delay == _preempt._MIN_REARM
    _assert_clean(previous)
