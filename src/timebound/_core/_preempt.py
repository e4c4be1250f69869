"""Stopping blocking sync code at its deadline: three explicit tiers (docs/blocking.md).

Deadlines in sync code are cooperative (checkpoints, clamped clients, a check at exit). Code that
blocks and must be *stopped* needs one of these tiers, each bounded by the effective deadline
(``current_deadline()``) and an optional ``timeout``, whichever is earlier (D1.5):

* :func:`run_with_signal` — main thread only: a ``SIGALRM`` from ``setitimer`` raises
  :class:`DeadlineExceeded` inside the running Python code. Cannot interrupt a long C call before
  it returns.
* :func:`run_in_thread` — runs the function in a daemon thread and stops *waiting* at the
  deadline. The thread is **abandoned, not stopped**: it keeps running. Every abandonment is
  counted (:func:`abandoned_threads`, counter ``abandoned-threads``) and warned about.
* :func:`arun_in_thread` — the same from a coroutine (asyncio or trio), for timebound's engines
  (the pipeline's sync tasks, D5.7): the event loop keeps running while the thread does, and the
  caller stops waiting when its deadline cancels it.
* :func:`run_in_process` — runs a picklable function in a subprocess and kills it at the
  deadline (terminate, then kill). The only tier that stops anything for sure.

Each tier makes the deadline visible inside the function (``current_deadline()``/``checkpoint()``
work there, also in the subprocess), never raises before the deadline (D1.3), and reports the
bound that fired: ``source="scope"`` for ``timeout``, else the enclosing bound's own source.
These tiers use real OS timers and waits; under virtual time only their arithmetic is virtual.
"""

from __future__ import annotations

import contextvars
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from . import _clock
from ._deadline import Deadline
from ._durations import Duration, to_seconds
from ._errors import ConfigurationError, DeadlineExceeded
from ._scopes import _frame, inherit_deadline, running_loop
from ._scopes import bookkeeping_code as _scope_bookkeeping

if TYPE_CHECKING:
    import asyncio  # imported where a loop runs (D15.5)

__all__ = [
    "AbandonedThreadWarning",
    "abandoned_threads",
    "run_in_process",
    "run_in_thread",
    "run_with_signal",
]

_T = TypeVar("_T")
_INF: Final = float("inf")

# A timer can wake a hair early (clock granularity, cpython#127859): re-arm at least this far out.
_MIN_REARM: Final = 1e-5
#: A deferred delivery (the signal landed in protected bookkeeping) is retried after a delay that
#: doubles while it keeps landing there, up to this. A fixed short delay can fire again before the
#: handler itself has returned (a loaded machine, a tracer): the handler would then run nested in
#: itself, each time one level deeper, until RecursionError. Doubling bounds that nesting to a
#: handful of levels; the delivery is still only this late at most past the bookkeeping's end.
_MAX_DEFER: Final = 0.01
_defer_delay = _MIN_REARM  # main thread only, like _alarms


class AbandonedThreadWarning(RuntimeWarning):
    """:func:`run_in_thread` gave up waiting for a thread that is still running."""


@dataclass(frozen=True)
class _Bounds:
    """The instant a tier stops waiting, and the error it raises then."""

    when: float
    error: DeadlineExceeded | None  # None: no bound at all (wait forever)
    own: bool  # True when ``timeout`` binds (then the deadline must be made visible inside)


def _bounds(timeout: Duration | None, what: str | None) -> _Bounds:
    """Effective deadline = min(current deadline, now + timeout); the error of the binding one."""
    frame = _frame.get()
    eff = frame.eff
    if timeout is not None:
        seconds = to_seconds(timeout, option="timeout")
        own = _clock.now() + seconds
        if own < eff:
            err = DeadlineExceeded(
                source="scope", timeout=seconds, deadline=Deadline(own), what=what, set_by=what
            )
            return _Bounds(own, err, True)
    if eff == _INF:
        return _Bounds(_INF, None, False)
    binder = frame.binder
    assert binder is not None
    return _Bounds(eff, binder._deadline_error(context=what), False)


def _expired_now(b: _Bounds) -> None:
    """Never start work that cannot finish in time: raise at once when the bound is spent."""
    if b.error is not None and _clock.now() >= b.when:
        raise b.error


def _left(b: _Bounds) -> float:
    return b.when - _clock.now()


# Tier 1: SIGALRM in the main thread ---------------------------------------------------------


@dataclass
class _Alarm:
    """One run_with_signal() call in progress, and what to restore when it ends."""

    bounds: _Bounds
    previous: Any  # the SIGALRM handler before the outermost call
    prev_delay: float = 0.0  # the ITIMER_REAL that was running before this call (0: none)
    prev_interval: float = 0.0
    started: float = 0.0
    active: bool = False  # True from _arm() until its deadline is delivered or the call ends


_alarms: list[_Alarm] = []  # main thread only; innermost last


def _protected(frame: FrameType | None) -> bool:
    """True when the signal interrupted timebound's own bookkeeping; it must wait.

    trio protects its cancel-scope bookkeeping from KeyboardInterrupt the same way: an exception
    raised between pushing a deadline and the ``with`` taking ownership of it (or between
    restoring the frame and the timer) would leave a spent deadline in the context for good.
    The signal is deferred by re-arming the timer a moment later. As in trio, the innermost
    marked frame decides: ``run_with_signal`` itself is protected, the ``fn`` it calls (through
    :func:`_call_unprotected`) is not, and scope bookkeeping inside ``fn`` is protected again.
    """
    f = frame
    while f is not None:
        code = f.f_code
        if code is _UNPROTECTED:
            return False
        if code in _BOOKKEEPING:
            return True
        f = f.f_back
    return False


def _call_unprotected(fn: Callable[..., _T], args: Any, kwargs: Any) -> _T:
    """Call ``fn``: the one frame below which the signal may interrupt (see _protected)."""
    return fn(*args, **kwargs)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    global _defer_delay
    if not _alarms:
        return
    alarm = _alarms[-1]
    if not alarm.active:
        return
    left = _left(alarm.bounds)
    if left > 0:
        # Woke before the deadline: re-arm, never expire early (D1.3).
        signal.setitimer(signal.ITIMER_REAL, max(left, _MIN_REARM))
        return
    if _protected(frame):
        delay, _defer_delay = _defer_delay, min(_defer_delay * 2, _MAX_DEFER)
        signal.setitimer(signal.ITIMER_REAL, delay)
        return
    _defer_delay = _MIN_REARM
    # This one exception reports the earliest bound; every enclosing call whose deadline has
    # passed too is delivered by it (it unwinds through them), so none of them fires again.
    now = _clock.now()
    for a in _alarms:
        if a.bounds.when <= now:
            a.active = False
    alarm.active = False
    assert alarm.bounds.error is not None
    raise alarm.bounds.error


def _arm(alarm: _Alarm) -> None:
    """Push ``alarm`` and start its timer (protected: see :func:`_protected`)."""
    global _defer_delay
    alarm.prev_delay, alarm.prev_interval = signal.setitimer(signal.ITIMER_REAL, 0)
    _defer_delay = _MIN_REARM
    alarm.started = _clock.now()
    alarm.active = True
    _alarms.append(alarm)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(_left(alarm.bounds), _MIN_REARM))


def _disarm(alarm: _Alarm) -> None:
    """Pop ``alarm`` and restore what was there before (protected: see :func:`_protected`).

    The alarm is deactivated and popped before its timer stops, so a signal that arrives in
    between finds nothing to deliver and re-arms nothing.
    """
    if not any(a is alarm for a in _alarms):
        return  # interrupted before _arm() ran: nothing was pushed or changed
    alarm.active = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    # Innermost in practice; removed by identity so the stack stays sane whatever happened.
    del _alarms[max(i for i, a in enumerate(_alarms) if a is alarm)]
    if _alarms:
        # Nested: the enclosing call's alarm takes over (it may already be due).
        outer = _alarms[-1]
        if outer.active:
            signal.setitimer(signal.ITIMER_REAL, max(_left(outer.bounds), _MIN_REARM))
        return
    signal.signal(signal.SIGALRM, alarm.previous)
    if alarm.prev_delay > 0:
        rest = alarm.prev_delay - (_clock.now() - alarm.started)
        signal.setitimer(signal.ITIMER_REAL, max(rest, _MIN_REARM), alarm.prev_interval)


def run_with_signal(
    fn: Callable[..., _T],
    /,
    *args: Any,
    timeout: Duration | None = None,
    what: str | None = None,
    **kwargs: Any,
) -> _T:
    """Call ``fn(*args, **kwargs)`` and interrupt it with ``SIGALRM`` at the effective deadline.

    ``timeout`` (seconds, timedelta or ``"250ms"``): the effective deadline is the earlier of it
    and ``current_deadline()``; ``what`` names the call in the error. Other keyword arguments go
    to ``fn``. Raises :class:`DeadlineExceeded` inside ``fn`` at the deadline, which
    unwinds it like any exception (``finally`` blocks run). Pure Python is interrupted within
    ~0.1 ms; a long C call only when it returns. timebound's own scope bookkeeping is never
    interrupted: a signal that lands there is delivered a moment later.

    Main thread only, only when no one else owns ``SIGALRM`` and only while the main thread does
    not block it: otherwise ``RuntimeError``.
    Nested calls are safe; the previous handler and any previous ``ITIMER_REAL`` are restored.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            "run_with_signal() works only in the main thread (signals are delivered there); "
            "use run_in_thread() or run_in_process() elsewhere"
        )
    previous = signal.getsignal(signal.SIGALRM)
    if previous not in (_on_alarm, signal.SIG_DFL, signal.SIG_IGN, None):
        raise RuntimeError(
            f"run_with_signal(): SIGALRM already has a handler ({previous!r}); refusing to "
            "replace it. Use run_in_thread() or run_in_process() instead"
        )
    b = _bounds(timeout, what)
    _expired_now(b)
    if b.error is None:
        return fn(*args, **kwargs)
    if signal.SIGALRM in signal.pthread_sigmask(signal.SIG_BLOCK, ()):
        # Blocked here, the signal goes to another thread that takes it, or to none: then
        # nothing would ever stop fn.
        raise RuntimeError(
            "run_with_signal(): SIGALRM is blocked in the main thread (signal.pthread_sigmask), "
            "so the deadline could not interrupt the call. Unblock it, or use run_in_thread() "
            "or run_in_process() instead"
        )
    # This frame is protected (a signal landing in it waits): only fn itself is interrupted.
    alarm = _Alarm(b, previous)
    try:
        _arm(alarm)
        if b.own:
            with inherit_deadline(
                Deadline(b.when),
                source="scope",
                timeout=b.error.timeout,
                set_by=b.error.set_by,
            ):
                result = _call_unprotected(fn, args, kwargs)
        else:
            result = _call_unprotected(fn, args, kwargs)
    finally:
        _disarm(alarm)
    if _clock.now() >= b.when:
        # The body swallowed the DeadlineExceeded (or finished in the race window): it is late.
        raise b.error
    return result


_UNPROTECTED: Final = _call_unprotected.__code__
_BOOKKEEPING: Final = frozenset(
    (*_scope_bookkeeping, run_with_signal.__code__, _arm.__code__, _disarm.__code__)
)


# Tier 2: a daemon thread that is abandoned at the deadline -------------------------------------

_abandoned_lock = threading.Lock()
_abandoned = 0


def abandoned_threads() -> int:
    """How many :func:`run_in_thread` threads were abandoned at their deadline (process-wide)."""
    return _abandoned


#: Called with (thread name, ``what``) for every abandoned thread. _core imports nothing above
#: it: telemetry adds its counter and event here when it is loaded (dependencies point down).
abandon_hooks: list[Callable[[str, str | None], None]] = []


def _count_abandoned(name: str, what: str | None) -> None:
    global _abandoned
    with _abandoned_lock:
        _abandoned += 1
    for hook in abandon_hooks:
        hook(name, what)


def run_in_thread(
    fn: Callable[..., _T],
    /,
    *args: Any,
    timeout: Duration | None = None,
    what: str | None = None,
    **kwargs: Any,
) -> _T:
    """Call ``fn(*args, **kwargs)`` in a daemon thread; stop waiting at the effective deadline.

    Keyword options: ``timeout`` and ``what`` as for :func:`run_with_signal`. The thread sees the
    caller's context (``current_deadline()``, ``checkpoint()``). At the deadline the caller gets
    :class:`DeadlineExceeded` while **the thread keeps running** (Python cannot stop a thread):
    it is counted in :func:`abandoned_threads` and an :class:`AbandonedThreadWarning` is issued.
    Give the function cooperative checkpoints or clamped timeouts so abandoned threads finish.
    """
    b = _bounds(timeout, what)
    _expired_now(b)
    done = threading.Event()
    outcome: list[Any] = []
    finished: list[float] = []

    def body() -> None:
        try:
            if b.own:
                assert b.error is not None
                with inherit_deadline(
                    Deadline(b.when),
                    source="scope",
                    timeout=b.error.timeout,
                    set_by=b.error.set_by,
                ):
                    outcome.append((True, fn(*args, **kwargs)))
            else:
                outcome.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # handed to the caller, not lost in the thread
            outcome.append((False, exc))
        finally:
            finished.append(_clock.now())
            done.set()

    ctx = contextvars.copy_context()
    name = f"timebound:{what or getattr(fn, '__name__', 'call')}"
    thread = threading.Thread(target=ctx.run, args=(body,), name=name, daemon=True)
    thread.start()
    while not done.is_set():
        if b.error is None:
            done.wait()
            break
        left = _left(b)
        if left <= 0:
            _count_abandoned(name, what)
            warnings.warn(
                f"{name}: deadline reached, abandoning a thread that is still running "
                f"({abandoned_threads()} abandoned so far)",
                AbandonedThreadWarning,
                stacklevel=2,
            )
            raise b.error
        done.wait(left)
    ok, value = outcome[0]
    if not ok:
        raise value
    if b.error is not None and finished[0] >= b.when:
        # The thread finished, but after the deadline: its result is late (D1.7), as a
        # fail_after around a sync body would say. Nothing was abandoned.
        raise b.error
    result: _T = value
    return result


async def arun_in_thread(
    fn: Callable[..., _T],
    /,
    *args: Any,
    what: str | None = None,
    on_abandon: Callable[[], None] | None = None,
    **kwargs: Any,
) -> _T:
    """Await ``fn(*args, **kwargs)`` run in a daemon thread, on asyncio or trio.

    The event loop goes on firing timers meanwhile. The thread sees the caller's context
    (``current_deadline()``, ``checkpoint()``). Whatever bounds the caller bounds the wait: when
    its deadline (or anything else) cancels it, it stops waiting at once and the thread, if still
    running, is abandoned like :func:`run_in_thread`'s (counted in :func:`abandoned_threads`,
    warned about with :class:`AbandonedThreadWarning`, and ``on_abandon()`` is called); its
    result, when it comes, is dropped.
    """
    name = f"timebound:{what or getattr(fn, '__name__', 'call')}"
    ctx = contextvars.copy_context()
    loop = running_loop()
    if loop is None:  # trio: its own thread runner abandons the thread on cancellation
        trio = sys.modules["trio"]
        state = {"finished": False}

        def body() -> _T:
            try:
                return ctx.run(fn, *args, **kwargs)
            finally:
                state["finished"] = True

        try:
            with _clock.real_io():
                result: _T = await trio.to_thread.run_sync(body, abandon_on_cancel=True)
            return result
        except trio.Cancelled:
            if not state["finished"]:
                _abandon(name, what, on_abandon)
            raise
    import asyncio  # imported: its loop runs

    future: asyncio.Future[tuple[bool, Any]] = loop.create_future()

    def settle(outcome: tuple[bool, Any]) -> None:
        if not future.done():
            future.set_result(outcome)

    finished: list[bool] = []

    def run() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(*args, **kwargs))
        except BaseException as exc:  # handed to the caller, not lost in the thread
            outcome = (False, exc)
        finished.append(True)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    thread = threading.Thread(target=ctx.run, args=(run,), name=name, daemon=True)
    thread.start()
    try:
        # On virtual time the thread's work takes no virtual time: time does not leap to the
        # next timer while the loop merely waits for it (as for a server's answer).
        with _clock.real_io():
            ok, value = await future
    except asyncio.CancelledError:
        if not finished:
            _abandon(name, what, on_abandon)
        raise
    if not ok:
        raise value
    done: _T = value
    return done


def _abandon(name: str, what: str | None, on_abandon: Callable[[], None] | None) -> None:
    _count_abandoned(name, what)
    warnings.warn(
        f"{name}: stopped waiting, abandoning a thread that is still running "
        f"({abandoned_threads()} abandoned so far)",
        AbandonedThreadWarning,
        stacklevel=3,
    )
    if on_abandon is not None:
        on_abandon()


# Tier 3: a subprocess that is killed at the deadline --------------------------------------------

#: How long ``terminate()`` (SIGTERM) gets before ``kill()`` (SIGKILL).
_TERMINATE_GRACE: Final = 0.05


def _default_start_method() -> str:
    import multiprocessing

    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def _child(
    conn: Any,
    fn_pickled: bytes,
    args: Any,
    kwargs: Any,
    left: float,
    source: str,
    timeout: float | None,
    set_by: str | None = None,
) -> None:
    """Subprocess entry: run ``fn`` under the parent's remaining budget, send the outcome."""
    import pickle

    message: tuple[bool, Any]
    try:
        # Unpickled here, not by multiprocessing's bootstrap: a function the child cannot import
        # then becomes a ConfigurationError for the caller instead of a silent exit code 1.
        fn: Callable[..., Any] = pickle.loads(fn_pickled)
    except Exception as exc:
        message = (
            False,
            ConfigurationError(
                f"run_in_process() needs an importable (module-level) function; the subprocess "
                f"cannot load it: {exc!r}",
                option="fn",
            ),
        )
    else:
        try:
            if left == _INF:
                result = fn(*args, **kwargs)
            else:
                # The same source, timeout and origin as the bound that binds in the parent
                # (D2.2, D2.8).
                with inherit_deadline(
                    Deadline.after(left), source=source, timeout=timeout, set_by=set_by
                ):
                    result = fn(*args, **kwargs)
            message = (True, result)
        except BaseException as exc:
            message = (False, exc)
    try:
        conn.send(message)
    except Exception as exc:  # an unpicklable result or exception: send what can be sent
        conn.send((False, RuntimeError(f"run_in_process(): cannot send the outcome back: {exc!r}")))
    finally:
        conn.close()


def run_in_process(
    fn: Callable[..., _T],
    /,
    *args: Any,
    timeout: Duration | None = None,
    what: str | None = None,
    start_method: str | None = None,
    **kwargs: Any,
) -> _T:
    """Call a picklable ``fn(*args, **kwargs)`` in a subprocess; kill it at the effective deadline.

    Keyword options: ``timeout`` and ``what`` as for :func:`run_with_signal`, and
    ``start_method`` (``"forkserver"`` where available, else ``"spawn"``; never ``"fork"``,
    which is unsafe with threads). The function, its arguments, result and exception must pickle.
    The subprocess sees the remaining budget as its deadline. At the deadline it is terminated
    (SIGTERM), then killed (SIGKILL) if it has not exited within 50 ms, and the caller gets
    :class:`DeadlineExceeded`. Process start-up counts against the deadline.
    """
    # Imported here: multiprocessing and pickle are most of this module's import, and code that
    # only reads deadlines (everything that imports telemetry) would pay for them.
    import multiprocessing
    import pickle

    method = start_method or _default_start_method()
    if method not in ("forkserver", "spawn"):
        raise ConfigurationError(
            f"run_in_process() start_method must be 'forkserver' or 'spawn', not {method!r}",
            option="start_method",
        )
    b = _bounds(timeout, what)
    _expired_now(b)
    try:
        fn_pickled = pickle.dumps(fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ConfigurationError(
            f"run_in_process() needs a picklable function and arguments: {exc}", option="fn"
        ) from exc
    ctx: Any = multiprocessing.get_context(method)
    receiver, sender = ctx.Pipe(duplex=False)
    left = _left(b) if b.error is not None else _INF
    source = b.error.source if b.error is not None else "scope"
    timeout_s = b.error.timeout if b.error is not None else None
    set_by = b.error.set_by if b.error is not None else None
    proc = ctx.Process(
        target=_child,
        args=(sender, fn_pickled, args, kwargs, left, source, timeout_s, set_by),
        daemon=True,
    )
    try:
        proc.start()
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        receiver.close()
        sender.close()
        raise ConfigurationError(
            f"run_in_process() needs a picklable function and arguments: {exc}", option="fn"
        ) from exc
    sender.close()  # the child holds its end; EOF then means the child is gone
    try:
        while True:
            wait = None if b.error is None else max(_left(b), 0.0)
            if receiver.poll(wait):
                try:
                    data = receiver.recv_bytes()
                except EOFError:
                    proc.join()
                    raise ChildProcessError(
                        f"run_in_process(): the subprocess exited with code {proc.exitcode} "
                        "without a result"
                    ) from None
                try:
                    ok, value = pickle.loads(data)
                except Exception as exc:
                    # e.g. an exception whose __init__ does not accept its own ``args``: it
                    # pickles in the child but cannot be rebuilt here. Say so, not TypeError.
                    proc.join()
                    raise RuntimeError(
                        f"run_in_process(): cannot unpickle the outcome sent back: {exc!r}"
                    ) from exc
                proc.join()
                if not ok:
                    raise value
                result: _T = value
                return result
            if b.error is not None and _clock.now() >= b.when:
                raise b.error
    finally:
        receiver.close()
        if proc.is_alive():
            proc.terminate()
            proc.join(_TERMINATE_GRACE)
            if proc.is_alive():
                proc.kill()
                proc.join()
        proc.close()
