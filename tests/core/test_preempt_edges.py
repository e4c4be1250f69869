"""Edge cases of the sync tiers: nesting, restoring state, errors, pickling, spent deadlines."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator

import pytest

import timebound as tb
from timebound._core import _preempt
from timebound._core._scopes import current_bound_source
from timebound.testing import VirtualClock

# pytest-timeout's default method owns SIGALRM (run_with_signal refuses it): watch from a thread.
pytestmark = [pytest.mark.realtime, pytest.mark.timeout(60, method="thread")]

BUDGET = 0.05


def _spin() -> None:
    while True:
        pass


def _add(a: int, b: int) -> int:
    return a + b


def _fail() -> None:
    raise KeyError("boom")


def _exit_now(code: int) -> None:
    os._exit(code)


def _unpicklable_result() -> Callable[[], int]:
    return lambda: 1


class _TwoArgError(Exception):
    """Pickles, but cannot be unpickled: ``__reduce__`` replays ``args`` (one) into two params."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(a)


def _raise_two_arg() -> None:
    raise _TwoArgError(1, 2)


def _bound_source() -> str | None:
    return current_bound_source()


def _ignore_sigterm_and_block() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(30)


@pytest.fixture
def ghost_function() -> Iterator[Callable[[], int]]:
    """A function whose module exists only in this process (a subprocess cannot import it)."""
    module = types.ModuleType("timebound_ghost_module")
    exec("def ghost():\n    return 1\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        yield module.ghost
    finally:
        del sys.modules[module.__name__]


# Signal tier --------------------------------------------------------------------------------


def test_signal_without_any_bound_just_calls() -> None:
    """With neither a timeout nor an enclosing deadline, the function runs with no timer armed."""
    assert tb.run_with_signal(_add, 1, 2) == 3
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_signal_function_error_propagates_and_state_is_restored() -> None:
    """An error raised by the function propagates unchanged; handler and timer are restored."""
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(KeyError, match="boom"):
        tb.run_with_signal(_fail, timeout=1)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_signal_restores_a_previous_itimer() -> None:
    """An ITIMER_REAL armed before the call is re-armed afterwards with its interval."""
    previous = signal.signal(signal.SIGALRM, signal.SIG_IGN)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30, 7)
        assert tb.run_with_signal(_add, 1, 1, timeout=1) == 2
        delay, interval = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < delay <= 30
        assert interval == 7
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_IGN
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_signal_body_that_swallows_the_deadline_still_raises() -> None:
    """A function that catches DeadlineExceeded and returns late is reported late anyway."""

    def stubborn() -> str:
        try:
            _spin()
        except tb.DeadlineExceeded:
            pass
        return "late"

    with pytest.raises(tb.DeadlineExceeded) as info:
        tb.run_with_signal(stubborn, timeout=BUDGET)
    assert info.value.source == "scope"


def test_signal_early_alarm_rearms_instead_of_raising() -> None:
    """A SIGALRM that arrives before the deadline is not an expiry: the call completes (D1.3)."""

    def poke() -> str:
        signal.raise_signal(signal.SIGALRM)
        return "done"

    assert tb.run_with_signal(poke, timeout=5) == "done"
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_signal_stray_alarm_without_a_call_is_ignored() -> None:
    """The handler does nothing when no call of this tier is running."""
    assert _preempt._alarms == []
    _preempt._on_alarm(signal.SIGALRM, None)


def test_signal_nested_outer_deadline_fires_inside_inner_call() -> None:
    """An outer deadline earlier than the inner timeout fires inside the inner call, as 'scope'."""

    def outer() -> None:
        tb.run_with_signal(_spin, timeout=10)

    with pytest.raises(tb.DeadlineExceeded) as info:
        tb.run_with_signal(outer, timeout=BUDGET)
    assert info.value.source == "scope"
    assert info.value.timeout == BUDGET
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert tb.current_deadline().is_never  # the spent deadline did not leak


def test_signal_nested_call_accepts_its_own_handler() -> None:
    """A nested call accepts the tier's own handler (it is not a foreign SIGALRM owner)."""

    def outer() -> int:
        return tb.run_with_signal(_add, 2, 2, timeout=1)

    assert tb.run_with_signal(outer, timeout=1) == 4


# Thread tier --------------------------------------------------------------------------------


def test_thread_without_any_bound_waits_for_the_result() -> None:
    """With no bound at all the caller simply waits for the thread's result."""
    assert tb.run_in_thread(_add, 2, 5) == 7


def test_thread_reraises_system_exit_unchanged() -> None:
    """A SystemExit raised in the thread reaches the caller as itself, never converted (D2.3)."""

    def leave() -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit) as info:
        tb.run_in_thread(leave, timeout=1)
    assert info.value.code == 3


# Process tier -------------------------------------------------------------------------------


def test_process_without_any_bound_waits_for_the_result() -> None:
    """With no bound at all the subprocess runs to completion and its result comes back."""
    assert tb.run_in_process(_add, 3, 4) == 7


def test_process_spent_deadline_starts_no_process() -> None:
    """With the deadline already spent, no subprocess is started at all."""
    before = set(multiprocessing.active_children())
    with tb.inherit_deadline(tb.Deadline.after(0)), pytest.raises(tb.DeadlineExceeded) as info:
        tb.run_in_process(_add, 1, 1)
    assert info.value.source == "inherited"
    assert set(multiprocessing.active_children()) == before


def test_process_child_exiting_without_result_is_child_process_error() -> None:
    """A subprocess that exits without sending an outcome raises ChildProcessError with its code."""
    with pytest.raises(ChildProcessError, match="code 3"):
        tb.run_in_process(_exit_now, 3, timeout=10)


def test_process_unpicklable_result_is_reported() -> None:
    """A result that cannot be pickled back comes back as a RuntimeError saying so."""
    with pytest.raises(RuntimeError, match="cannot send the outcome back"):
        tb.run_in_process(_unpicklable_result, timeout=10)


def test_process_exception_that_cannot_be_unpickled_is_reported() -> None:
    """An exception that pickles but cannot be rebuilt here is a RuntimeError naming it."""
    with pytest.raises(RuntimeError, match="_TwoArgError"):
        tb.run_in_process(_raise_two_arg, timeout=10)


def test_process_function_not_importable_in_child(ghost_function: Callable[[], int]) -> None:
    """A function the subprocess cannot import raises ConfigurationError naming ``fn``."""
    with pytest.raises(tb.ConfigurationError) as info:
        tb.run_in_process(ghost_function, timeout=10)
    assert info.value.option == "fn"


def test_process_rejects_unpicklable_argument() -> None:
    """An argument that cannot be pickled raises ConfigurationError before anything runs."""
    with pytest.raises(tb.ConfigurationError) as info:
        tb.run_in_process(_add, lambda: 1, 2, timeout=10)
    assert info.value.option == "fn"


def test_process_child_sees_the_binding_source() -> None:
    """Inside the subprocess the bound keeps the source that binds outside (D2.2)."""
    with tb.inherit_deadline(tb.Deadline.after(5)):
        assert tb.run_in_process(_bound_source, timeout=10) == "inherited"
    assert tb.run_in_process(_bound_source, timeout=10) == "scope"


def test_process_ignoring_sigterm_is_killed() -> None:
    """A subprocess that ignores SIGTERM is killed after the grace period; nothing is left over."""
    before = set(multiprocessing.active_children())
    with pytest.raises(tb.DeadlineExceeded):
        tb.run_in_process(_ignore_sigterm_and_block, timeout=0.3)
    assert set(multiprocessing.active_children()) <= before


def test_invalid_start_method_rejected() -> None:
    """An unknown start method is a ConfigurationError naming ``start_method``."""
    with pytest.raises(tb.ConfigurationError) as info:
        tb.run_in_process(_add, 1, 1, start_method="teleport")
    assert info.value.option == "start_method"


def test_thread_result_finished_after_the_deadline_is_late(virtual_clock: VirtualClock) -> None:
    """A thread that finishes after the deadline, before the caller wakes, gives a late result:
    DeadlineExceeded (D1.7), and nothing is counted as abandoned."""
    before = tb.abandoned_threads()

    def overrun() -> str:
        virtual_clock.advance(2)  # the work ends past the 1 s deadline
        return "late"

    with pytest.raises(tb.DeadlineExceeded):
        tb.run_in_thread(overrun, timeout=1)
    assert tb.abandoned_threads() == before


def test_thread_result_in_time_is_returned(virtual_clock: VirtualClock) -> None:
    """A thread that finishes before the deadline returns its result."""

    def quick() -> str:
        virtual_clock.advance(0.5)
        return "ok"

    assert tb.run_in_thread(quick, timeout=1) == "ok"


def _late_checkpoint() -> None:
    time.sleep(0.02)  # past the inherited deadline below, whatever the machine's speed
    tb.checkpoint()


def test_process_child_reports_where_the_parent_bound_was_set() -> None:
    """The subprocess's inherited bound keeps the parent's source, timeout and set_by (D2.8):
    an error raised inside the child says where the bound came from, as in the parent."""
    import pickle

    receiver, sender = multiprocessing.Pipe(duplex=False)
    _preempt._child(
        sender, pickle.dumps(_late_checkpoint), (), {}, 0.001, "scope", 0.5, "job nightly"
    )
    ok, err = receiver.recv()
    receiver.close()
    assert not ok and isinstance(err, tb.DeadlineExceeded)
    assert (err.source, err.timeout, err.set_by) == ("scope", 0.5, "job nightly")
