"""Sync tiers for blocking code: signal, abandoned thread, killed subprocess (real time, ~50 ms)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
import warnings
from typing import Any

import pytest

import timebound as tb
from timebound._core import _preempt

# pytest-timeout's default method owns SIGALRM, and run_with_signal rightly refuses to take it
# from someone else: watch these tests from a thread instead.
pytestmark = [pytest.mark.realtime, pytest.mark.timeout(60, method="thread")]

BUDGET = 0.05


def _spin() -> None:
    """Pure-Python busy loop: only a signal (or a kill) stops it."""
    while True:
        pass


def _block(seconds: float) -> None:
    time.sleep(seconds)


def _add(a: int, b: int) -> int:
    return a + b


def _fail() -> None:
    raise KeyError("boom")


def _see_deadline() -> float:
    return tb.current_deadline().when


def _pid() -> int:
    return os.getpid()


# Signal tier --------------------------------------------------------------------------------


def test_signal_interrupts_pure_python_loop() -> None:
    """A busy loop is interrupted with DeadlineExceeded(source='scope') at the timeout."""
    with pytest.raises(tb.DeadlineExceeded) as info:
        tb.run_with_signal(_spin, timeout=BUDGET)
    assert info.value.source == "scope"
    assert info.value.timeout == BUDGET


def test_signal_reports_enclosing_bound() -> None:
    """An enclosing inherited deadline that is earlier than the timeout is the one reported."""
    with tb.inherit_deadline(tb.Deadline.after(BUDGET)), pytest.raises(tb.DeadlineExceeded) as info:
        tb.run_with_signal(_spin, timeout=10)
    assert info.value.source == "inherited"


def test_signal_returns_result_and_restores_handler_and_timer() -> None:
    """A call that finishes returns its value; the previous handler and ITIMER_REAL come back."""
    before = signal.getsignal(signal.SIGALRM)
    assert tb.run_with_signal(_add, 2, 3, timeout=1) == 5
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_signal_nested_inner_fires_then_outer_still_armed() -> None:
    """A nested call's deadline fires inside; the outer call's alarm is re-armed afterwards."""

    def outer() -> str:
        with pytest.raises(tb.DeadlineExceeded):
            tb.run_with_signal(_spin, timeout=0.01)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
        return "outer done"

    assert tb.run_with_signal(outer, timeout=5) == "outer done"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_signal_refuses_foreign_handler() -> None:
    """With someone else's SIGALRM handler installed, the tier refuses instead of replacing it."""

    def foreign(signum: int, frame: Any) -> None:
        return None

    previous = signal.signal(signal.SIGALRM, foreign)
    try:
        with pytest.raises(RuntimeError, match="already has a handler"):
            tb.run_with_signal(_add, 1, 2, timeout=1)
        assert signal.getsignal(signal.SIGALRM) is foreign
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_signal_refuses_when_sigalrm_is_blocked_in_the_main_thread() -> None:
    """With SIGALRM blocked in the calling thread the signal would go to another thread, or to
    none, and nothing might ever stop the call: the tier refuses, naming the mask."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        with pytest.raises(RuntimeError, match="SIGALRM is blocked"):
            tb.run_with_signal(_add, 1, 2, timeout=1)
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    assert tb.run_with_signal(_add, 1, 2, timeout=1) == 3


def test_signal_refuses_off_main_thread() -> None:
    """Called from a worker thread, the tier raises RuntimeError naming the alternatives."""
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            tb.run_with_signal(_add, 1, 2, timeout=1)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert isinstance(errors[0], RuntimeError)
    assert "main thread" in str(errors[0])


def test_spent_deadline_never_starts_the_call() -> None:
    """With the deadline already spent, no tier calls the function at all."""
    calls: list[int] = []
    with tb.inherit_deadline(tb.Deadline.after(0)):
        for tier in (tb.run_with_signal, tb.run_in_thread):
            with pytest.raises(tb.DeadlineExceeded):
                tier(calls.append, 1)
    assert calls == []


# Thread tier --------------------------------------------------------------------------------


def test_thread_abandoned_is_counted_and_warned() -> None:
    """A blocked thread is abandoned at the deadline: DeadlineExceeded, a warning, a count."""
    before = tb.abandoned_threads()
    with pytest.warns(tb.AbandonedThreadWarning), pytest.raises(tb.DeadlineExceeded):
        tb.run_in_thread(_block, 0.3, timeout=BUDGET)
    assert tb.abandoned_threads() == before + 1


def test_thread_abandon_increments_telemetry_counter() -> None:
    """When telemetry is loaded, each abandonment increments the ``abandoned-threads`` counter."""
    from timebound.telemetry import counters

    before = counters.get("abandoned-threads")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tb.AbandonedThreadWarning)
        with pytest.raises(tb.DeadlineExceeded):
            tb.run_in_thread(_block, 0.3, timeout=BUDGET)
    assert counters.get("abandoned-threads") == before + 1


def test_thread_returns_value_and_reraises_error() -> None:
    """A thread that finishes in time hands back its value, or its exception unchanged."""
    assert tb.run_in_thread(_add, 1, 2, timeout=1) == 3
    with pytest.raises(KeyError, match="boom"):
        tb.run_in_thread(_fail, timeout=1)


def test_thread_sees_the_deadline() -> None:
    """Inside the thread, current_deadline() is the tier's deadline (cooperative checks work)."""
    with tb.inherit_deadline(tb.Deadline.after(5)) as outer:
        assert tb.run_in_thread(_see_deadline, timeout=10) == outer.when


# Process tier -------------------------------------------------------------------------------


def test_process_killed_at_deadline() -> None:
    """A subprocess blocked far past the deadline is killed and the caller gets DeadlineExceeded."""
    before = set(multiprocessing.active_children())
    with pytest.raises(tb.DeadlineExceeded) as info:
        tb.run_in_process(_block, 30, timeout=0.3)
    assert info.value.source == "scope"
    assert set(multiprocessing.active_children()) <= before


def test_process_returns_value_and_reraises_error() -> None:
    """A subprocess that finishes hands back its value, or its picklable exception."""
    assert tb.run_in_process(_add, 2, 2, timeout=10) == 4
    with pytest.raises(KeyError, match="boom"):
        tb.run_in_process(_fail, timeout=10)
    assert tb.run_in_process(_pid, timeout=10) != os.getpid()


def test_process_rejects_unpicklable_function() -> None:
    """A local function cannot be sent to a subprocess: ConfigurationError naming ``fn``."""

    def local() -> int:
        return 1

    with pytest.raises(tb.ConfigurationError) as info:
        tb.run_in_process(local, timeout=10)
    assert info.value.option == "fn"


def test_process_rejects_fork_start_method() -> None:
    """``fork`` is refused (unsafe with threads): ConfigurationError naming ``start_method``."""
    with pytest.raises(tb.ConfigurationError) as info:
        tb.run_in_process(_add, 1, 1, start_method="fork")
    assert info.value.option == "start_method"


def test_module_exports() -> None:
    """Every tier is re-exported from ``timebound``."""
    for name in _preempt.__all__:
        assert getattr(tb, name) is getattr(_preempt, name)


@pytest.mark.parametrize("bad", [-1, float("nan"), "soon"])
def test_invalid_timeout_rejected(bad: Any) -> None:
    """A negative, NaN or unparsable ``timeout`` raises ConfigurationError naming ``timeout``."""
    for tier in (tb.run_with_signal, tb.run_in_thread, tb.run_in_process):
        with pytest.raises(tb.ConfigurationError) as info:
            tier(_add, 1, 1, timeout=bad)
        assert info.value.option == "timeout"
