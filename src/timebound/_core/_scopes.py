"""Deadline scopes and the effective deadline (DECISIONS D1, D2).

The effective deadline lives in one context variable, ``_frame``, holding the innermost *frame*.
A frame is either a :class:`CancelScope` (``fail_*``/``move_on_*``; cancels work at its deadline) or
a :class:`_Bound` (a deadline that is only *visible*: one inherited from a request, or the blocker
``no_deadline()``). Every frame stores the minimum over its enclosing frames when it is entered,
so ``current_deadline()`` and ``remaining()`` read one attribute at any depth.

Because the frame lives in a context variable, asyncio child tasks and ``asyncio.to_thread``
workers see it (they copy the context); ``spawn_background`` gives a task a clean one.

Cancellation in asyncio
-----------------------
A scope cancels only the task that entered it (child tasks *see* its deadline; a TaskGroup
cancels them when the parent's error propagates). While a task has frames, it keeps one
:class:`_TaskTimer` (found through the frame chain) with a single loop timer, armed at the
earliest deadline any of its frames needs. Entering a scope whose deadline is later than the
armed timer creates no timer at all; the timer, when it fires, re-reads the task's innermost
frame and re-arms if nothing is due yet (so it may wake early, but never declares expiry early,
D1.3). When the task's last frame exits, the timer is cancelled, as ``asyncio.timeout`` does.
Only the binding deadline arms a timer. A nested scope that
binds in no sense -- its deadline is no earlier than both the visible effective deadline and the
one its task already cancels at -- is not even pushed into the context: as a frame it would only
repeat its parent. It still checks its own deadline at exit (``.expired``, D1.7).

The frame that must *catch* a firing deadline is its ``catcher``: the outermost scope of this task
whose effective deadline is the one that fired. It cancels its task, and at exit tells its own
cancellation from anybody else's by the task's cancel count (as ``asyncio.timeout`` does), so an
explicit cancel, an outer deadline and its own deadline are never confused (D2.2).
"""

from __future__ import annotations

import contextvars
import math
import sys
from collections.abc import Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar

from . import _clock
from ._breakdown import Breakdown, add_mark, build
from ._breakdown import _frame_start as frame_start
from ._deadline import Deadline
from ._durations import Duration, to_seconds
from ._errors import (
    SOURCES,
    ConfigurationError,
    DeadlineExceeded,
    deadline_message,
    new_deadline_exceeded,
    set_by_of,
)

__all__ = [
    "CancelScope",
    "acheckpoint",
    "checkpoint",
    "current_deadline",
    "fail_after",
    "fail_at",
    "inherit_deadline",
    "move_on_after",
    "move_on_at",
    "no_deadline",
    "remaining",
    "spawn_background",
]

if TYPE_CHECKING:
    import asyncio

_T = TypeVar("_T")
_INF: Final = math.inf


# asyncio is imported by whoever runs its event loop, never by this module: sync code (the first
# call of a `resilient` function, a script's `with fail_after(...)`) should not pay for it (D15.5).
# Until asyncio is imported no loop can be running anywhere, so the answer is None; the first
# call that finds it imported binds asyncio's own functions in place of these two, and every
# later scope entry calls them directly.
def _get_running_loop() -> asyncio.AbstractEventLoop | None:
    if getattr(sys.modules.get("asyncio.events"), "_get_running_loop", None) is None:
        return None
    _bind_asyncio()
    return _get_running_loop()


def _current_task(loop: asyncio.AbstractEventLoop) -> Any:
    _bind_asyncio()
    return _current_task(loop)


_CancelledError: type[BaseException] = BaseException  # asyncio.CancelledError once bound


def _bind_asyncio() -> None:
    global _get_running_loop, _current_task, _CancelledError
    import asyncio  # waits for an import under way in another thread to complete

    _get_running_loop = asyncio._get_running_loop
    # Before 3.12 ``asyncio.current_task`` is a Python function around a dict lookup; every
    # scope entry asks it, so read the same dict directly there (~0.1 µs per scope).
    current_tasks: Any = getattr(asyncio.tasks, "_current_tasks", None)
    if sys.version_info < (3, 12) and isinstance(current_tasks, dict):
        _current_task = current_tasks.get  # type: ignore[assignment]  # dict.get is overloaded
    else:
        _current_task = asyncio.current_task
    _CancelledError = asyncio.CancelledError


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio event loop, or None; imports no asyncio for a caller that runs none."""
    return _get_running_loop()


# Marks the one cancel request a scope made, so it can be told apart from any other.
_CANCEL_MSG: Final = "timebound: deadline reached"


class _Frame:
    """Common shape of every entry in the deadline context.

    ``eff``/``binder``: the visible effective deadline and the frame that owns it.
    ``c_task``/``c_at``/``c_binder``/``catcher``: the cancellation chain for ``c_task``: when it
    must be cancelled, which bound that is, and which scope of that task catches it.
    """

    __slots__ = (
        "_marks",
        "_own",
        "_source",
        "_t0",
        "_timeout",
        "_ts",
        "_what",
        "binder",
        "c_at",
        "c_binder",
        "c_task",
        "catcher",
        "eff",
    )

    _own: float
    _source: str
    _timeout: float | None
    _what: str | None
    _marks: list[Any] | None  # where the budget went (D13): parts recorded while innermost
    _t0: float | None  # when this frame's budget started (entry; a request's arrival)
    _ts: _TaskTimer | None  # the task timer, while this frame of an asyncio task is entered
    eff: float
    binder: _Frame | None
    c_task: Any  # the asyncio.Task or trio Task the chain cancels, or None
    c_at: float
    c_binder: _Frame | None
    catcher: CancelScope | None

    def _origin(self) -> str | None:
        """Where this frame's bound was set (D2.8), as :meth:`_deadline_error` says it."""
        return set_by_of(self._source, self._what)

    def _deadline_error(self, context: str | None = None) -> DeadlineExceeded:
        """The error that reports this frame's own deadline.

        ``context`` names the operation this deadline stopped when that is not the frame's own
        ``what`` (a client that found an enclosing deadline spent): it prefixes the message, so
        "http request stopped: scope deadline of 300ms exceeded" never claims the request itself
        ran for 300 ms.
        """
        source = self._source
        timeout = self._timeout
        what = self._what
        # This runs between the deadline and the moment the caller sees the error, usually with
        # cold caches after an idle wait, where formatting the message (float formatting) cost
        # ~20 us of p50 lateness in bench/core.py. Timeouts repeat per call site: reuse the text
        # for the same (source, timeout, what); the oldest entry makes room (a full clear made
        # every firing format again once a program had more distinct timeouts than the cache).
        key = (source, timeout, what)
        texts = _messages.get(key)
        if texts is None:
            texts = (deadline_message(source, timeout, what), set_by_of(source, what))
            if len(_messages) >= _MESSAGES_MAX:
                del _messages[next(iter(_messages))]
            _messages[key] = texts
        message, set_by = texts
        if context is not None and context != what:
            message = f"{context} stopped: {message}"
        err = new_deadline_exceeded(message, source, timeout, Deadline._at(self._own), set_by)
        err._timebound_binder = self  # type: ignore[attr-defined]
        # D13: what the breakdown needs, built only when read: when it fired, which frames
        # were still entered, how many of this frame's parts existed then.
        marks = self._marks
        err._timebound_bd = (  # type: ignore[attr-defined]
            _clock.now(),
            _frame.get(),
            0 if marks is None else len(marks),
        )
        return err

    def _fold(self, exc: BaseException | None, now: float) -> None:
        """D13: this frame recorded parts; they become one part of the enclosing frame.

        A policy's attempt scope is not folded: the retry driver records the attempt itself,
        with these parts inside it.
        """
        parent: _Frame = self._parent  # type: ignore[attr-defined]
        if parent is _ROOT:
            return
        source = self._source
        if source == "attempt" or source == "total":
            return
        marks = self._marks
        if isinstance(self, _Bound):
            # A visible bound adds no part of its own (a request's, the one between attempts).
            for m in marks or ():
                add_mark(parent, m)
            return
        if now >= self._own:
            outcome = "timeout"
        elif exc is None:
            outcome = "ok"
        else:
            outcome = type(exc).__name__
        kind = "scope" if source == "scope" else source
        t0 = now if self._t0 is None else self._t0
        add_mark(parent, (kind, self._what, t0, now, self._timeout, outcome, marks))


# Formatted DeadlineExceeded messages and origins (D2.8) by (source, timeout, what); see
# _Frame._deadline_error.
_messages: dict[tuple[str, float | None, str | None], tuple[str, str | None]] = {}
_MESSAGES_MAX: Final = 4096


class _Root(_Frame):
    __slots__ = ()

    def __init__(self) -> None:
        self._own = _INF
        self._source = "scope"
        self._timeout = None
        self._what = None
        self._marks = None
        self._t0 = None
        self.eff = _INF
        self.binder = None
        self.c_task = None
        self.c_at = _INF
        self.c_binder = None
        self.catcher = None
        self._ts = None


_ROOT: Final = _Root()
_frame: contextvars.ContextVar[_Frame] = contextvars.ContextVar("timebound.frame", default=_ROOT)


class _TaskTimer:
    """One loop timer per asyncio task, shared by all its scopes.

    The timer itself is the loop callback (``__call__``): a bound method would be one more
    object per armed timer, held as long as the task waits (bench/core.py, memory per scope).
    """

    __slots__ = ("armed_at", "handle", "loop", "task", "top")

    def __init__(self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.task = task
        self.loop = loop
        self.top: _Frame = _ROOT
        self.armed_at = _INF
        self.handle: asyncio.Handle | None = None

    def arm(self, when: float, now: float) -> None:
        """Arm the timer at ``when``; ``now`` is the clock as the caller just read it."""
        if self.handle is not None:
            self.handle.cancel()
        self.armed_at = when
        if when <= now:
            # Already due: call_soon, as asyncio.timeout does (cpython#95051). A past call_at
            # would run after the task's own next step, so its first await would complete.
            self.handle = self.loop.call_soon(self)
        else:
            self.handle = self.loop.call_at(when, self)

    def __call__(self) -> None:
        """The deadline the timer was armed for may have come: cancel the task, or re-arm."""
        self.handle = None
        self.armed_at = _INF
        top = self.top
        catcher = top.catcher
        if catcher is None or top.c_task is not self.task or self.task.done():
            return
        due = top.c_at
        if due == _INF:
            return
        now = _clock.now()
        if now >= due:
            catcher._fire(top.c_binder)
        else:
            # Woke early (cpython#127859, uvloop's ms rounding): re-arm, never expire early.
            self.arm(due, now)

    def leave(self, prev: _Frame) -> None:
        """A frame of this task exited and ``prev`` is on top again: keep the timer it needs.

        Between nested scopes the timer is lazy (an enclosing bound that is no earlier than
        the armed instant needs no re-arm). Once no scope of this task is left, the timer is
        cancelled, as asyncio.timeout cancels its own: it must not outlive the task, nor hold
        it (no done-callback per task; that cost ~1 us and a loop callback per request).
        """
        self.top = prev
        if prev.catcher is None or prev.c_task is not self.task:
            handle = self.handle
            if handle is not None:
                handle.cancel()
                self.handle = None
                self.armed_at = _INF
        elif prev.c_at < self.armed_at:
            # Leaving a shield, or the timer was consumed inside: the enclosing bound still
            # needs its timer.
            self.arm(prev.c_at, _clock.now())


def _timer_for(
    parent: _Frame, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop
) -> _TaskTimer:
    """The task's timer: the enclosing frame's when it belongs to this task, else a new one.

    A timer lives exactly as long as the task has frames (see _TaskTimer.leave), so it is found
    through the frame chain: no per-task registry, no done-callback, no context variable.
    """
    if parent.c_task is task:
        ts = parent._ts
        if ts is not None:
            return ts
    return _TaskTimer(task, loop)


def _trio_module() -> Any:
    """trio, when the caller runs in a trio task; ``None`` otherwise (trio is optional).

    Sync code asks this on every scope entry, so the usual answer ("no") must be cheap even when
    trio is merely imported: trio marks the threads it runs in through sniffio (a trio
    dependency); only then is the task itself looked up.
    """
    trio = sys.modules.get("trio")
    if trio is None:
        return None
    sniffio = sys.modules.get("sniffio")
    if (
        sniffio is not None
        and sniffio.thread_local.name != "trio"
        and sniffio.current_async_library_cvar.get() != "trio"
    ):
        return None
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return None
    return trio


class CancelScope(_Frame):
    """A deadline scope: the object ``fail_after``/``move_on_after`` and friends return.

    Usable as ``with`` and ``async with`` (the same scope, D1.6). In a coroutine it cancels the
    task's awaits at the deadline; in sync code it is cooperative (:func:`checkpoint`, clamped
    clients, a check at exit). ``.deadline`` is the scope's own deadline (fixed at entry for
    relative budgets, D1.4); ``.expired`` is true when that deadline passed before the scope
    exited (D1.7).
    """

    __slots__ = (
        "_cancelling",
        "_fired",
        "_mode",
        "_parent",
        "_prev_top",
        "_raise",
        "_shield",
        "_trio_scope",
        "expired",
    )

    # The task's cancel count at entry; -1 when a cancel was requested and not yet delivered
    # then (it wins over our own expiry, see _enter_asyncio).
    _cancelling: int
    # None until the task timer fires at this scope; then the frame whose deadline it caught
    # (the scope itself for its own), and _ROOT once exit has read it.
    _fired: _Frame | None
    _mode: int
    _parent: _Frame
    _prev_top: _Frame
    _trio_scope: Any

    def __init__(
        self,
        *,
        when: float | None = None,
        relative: float | None = None,
        raise_on_expiry: bool,
        shield: bool = False,
        source: str = "scope",
        what: str | None = None,
    ) -> None:
        # Keep in step with _new_scope(), the constructors' fast path.
        _check_source(source)
        self._own = _INF if when is None else when
        self._timeout = relative  # None: an absolute scope
        self._raise = raise_on_expiry
        self._shield = shield
        self._source = source
        self._what = what
        # -1 not entered; 0 sync or non-binding asyncio; 1 asyncio timer-linked; 2 trio;
        # 3 asyncio, binding in no sense (kept out of the context)
        self._mode = -1
        self._marks = None
        self.expired = False

    # Public attributes -------------------------------------------------------------------

    @property
    def deadline(self) -> Deadline:
        """This scope's own deadline (not the effective one; see :func:`current_deadline`)."""
        if self._timeout is not None and self._mode < 0:
            # A relative budget starts at entry (D1.4); before that it is not an instant yet.
            return Deadline.after(self._timeout)
        return Deadline(self._own)

    @property
    def shield(self) -> bool:
        return self._shield

    @property
    def source(self) -> str:
        return self._source

    # Entry and exit ----------------------------------------------------------------------

    def __enter__(self) -> CancelScope:
        if self._mode >= 0:
            raise RuntimeError("a timebound scope can be entered only once")
        self._t0 = now = _clock.now()
        if self._timeout is not None:
            self._own = now + self._timeout
        own = self._own
        parent = _frame.get()
        loop = _get_running_loop()
        if loop is not None:
            task = _current_task(loop)
            if task is not None:
                if (
                    own >= parent.c_at
                    and parent.c_task is task
                    and parent.catcher is not None
                    and not self._shield
                    and parent.c_at > now
                ):
                    # Not binding in this task: an enclosing scope of the same task already
                    # cancels at or before our deadline and catches it. Nothing can fire *at*
                    # this scope, so it needs no timer, no task-timer link and no cancel count.
                    # (The common nested case; bench/core.py measures it.) An enclosing bound
                    # already spent is another matter (D1.8): see _enter_asyncio.
                    if own >= parent.eff:
                        # Not visibly binding either: as a frame it would repeat its parent in
                        # every field anyone reads (eff, binder, the cancellation chain), so
                        # it stays out of the context; only its own deadline is checked at
                        # exit (D1.7).
                        self._mode = 3
                        return self
                    self._mode = 0
                    self.eff = own
                    self.binder = self
                    self.c_task = task
                    self.c_at = parent.c_at
                    self.c_binder = parent.c_binder
                    self.catcher = parent.catcher
                    self._ts = parent._ts
                    self._parent = parent
                    _frame.set(self)
                    return self
                if self._shield or own < parent.eff:  # _set_visible, inlined on this hot path
                    self.eff = own
                    self.binder = self
                else:
                    self.eff = parent.eff
                    self.binder = parent.binder
                self._enter_asyncio(task, loop, parent, own, now)
                return self
        else:
            trio = _trio_module()
            if trio is not None:
                self._set_visible(parent, own)
                self._enter_trio(trio, parent, now)
                return self
        self._set_visible(parent, own)
        self._mode = 0
        self.c_task = None
        self.c_at = self.eff
        self.c_binder = self.binder
        self.catcher = None
        self._parent = parent
        _frame.set(self)
        return self

    def _set_visible(self, parent: _Frame, own: float) -> None:
        """The effective deadline seen inside: the earlier of ours and the enclosing one."""
        if self._shield or own < parent.eff:
            self.eff = own
            self.binder = self
        else:
            self.eff = parent.eff
            self.binder = parent.binder

    def _enter_asyncio(
        self,
        task: asyncio.Task[Any],
        loop: asyncio.AbstractEventLoop,
        parent: _Frame,
        own: float,
        now: float,
    ) -> None:
        self._mode = 1
        self._fired = None
        if self._shield:
            base_at, base_binder, base_catcher = _INF, None, None
        elif parent.c_task is task:
            base_at, base_binder, base_catcher = parent.c_at, parent.c_binder, parent.catcher
        else:
            # The enclosing bounds belong to another task or none (an inherited deadline):
            # this task's first scope under them is the one that catches them.
            base_at, base_binder, base_catcher = parent.eff, parent.binder, None
        self.c_task = task
        if own < base_at:
            self.c_at = own
            self.c_binder = self
            self.catcher = self
        else:
            self.c_at = base_at
            self.c_binder = base_binder
            # An enclosing bound that is already spent (we are in the cleanup of a scope that
            # fired, or it simply passed): this scope catches it, at its first await (D1.8). The
            # enclosing catcher may have fired and delivered already; it would not again.
            if base_catcher is None or base_at <= now:
                self.catcher = self
            else:
                self.catcher = base_catcher
        # Counts are compared relative to entry, as asyncio.timeout does: a cancel delivered and
        # handled before (a fired scope's cleanup, a caught CancelledError) leaves a count that
        # is not ours to judge. Only a cancel requested and not yet delivered (cpython#134471)
        # must win over our own expiry.
        cancelling = task.cancelling()
        pending = cancelling > 0 and getattr(task, "_must_cancel", True)
        self._cancelling = -1 if pending else cancelling
        self._parent = parent
        _frame.set(self)
        ts = parent._ts if parent.c_task is task else None  # _timer_for(), inlined: hot path
        if ts is None:
            # _TaskTimer(task, loop) without type.__call__ (one per task: ~0.1 us of ~4 us).
            ts = _new(_TaskTimer)
            ts.task = task
            ts.loop = loop
            ts.top = _ROOT
            ts.armed_at = _INF
            ts.handle = None
        self._ts = ts
        self._prev_top = ts.top
        ts.top = self
        if self.c_at < ts.armed_at:
            ts.arm(self.c_at, now)

    def _enter_trio(self, trio: Any, parent: _Frame, now: float) -> None:
        self._mode = 2
        # The trio task and this scope as its catcher: an inherit_deadline() inside it then
        # ends it at the inherited deadline, as on asyncio (see _Bound).
        self.c_task = trio.lowlevel.current_task()
        self.c_at = self.eff
        self.c_binder = self.binder
        self.catcher = self
        # trio's clock may have another base (or be a MockClock): convert through "remaining".
        trio_deadline = _INF if self.eff == _INF else trio.current_time() + max(0.0, self.eff - now)
        self._trio_scope = scope = trio.CancelScope(deadline=trio_deadline, shield=self._shield)
        scope.__enter__()
        self._parent = parent
        _frame.set(self)

    def _fire(self, binder: _Frame | None) -> None:
        """Called by the task timer: this scope catches the deadline of ``binder``."""
        if self._fired is not None:
            return
        self._fired = self if binder is None else binder
        task = self.c_task
        if task is not None:
            task.cancel(_CANCEL_MSG)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        mode = self._mode
        if mode == 1:  # asyncio, timer-linked: the common case first
            _frame.set(self._parent)
            now = _clock.now()
            self.expired = own_expired = now >= self._own
            if self._marks is not None:
                self._fold(exc, now)
            return self._exit_asyncio(exc_type, exc, own_expired)
        if mode == 3:
            # Out of the context, never a binder, never fired: only its own deadline matters.
            self.expired = own_expired = _clock.now() >= self._own
            if exc is None and own_expired and self._raise:
                raise self._deadline_error()
            return False
        _frame.set(self._parent)
        now = _clock.now()
        self.expired = own_expired = now >= self._own
        if self._marks is not None:
            self._fold(exc, now)
        if not mode:
            self.c_task = self.catcher = None  # no path from a self-cycle into the task
            # Sync code, or a non-binding asyncio scope (never fired: nothing to withdraw).
            if exc is None:
                if own_expired and self._raise:
                    # Sync code cannot be interrupted: the body overran, its result is late.
                    raise self._deadline_error()
                return False
            return self._exit_plain(exc)
        return self._exit_trio(exc_type, exc, tb, own_expired)

    async def __aenter__(self) -> CancelScope:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)

    # Exit paths ----------------------------------------------------------------------------

    def _exit_plain(self, exc: BaseException) -> bool:
        if getattr(exc, "_timebound_binder", None) is self:
            # A checkpoint inside reported this scope's own deadline.
            self.expired = True
            return not self._raise
        return False

    def _exit_asyncio(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, own_expired: bool
    ) -> bool:
        ts = self._ts
        assert ts is not None
        prev = self._prev_top
        if prev.c_task is not ts.task and ts.handle is not None:
            # The task's last frame: the common exit of one scope per task (ts.leave, inlined).
            ts.top = prev
            ts.handle.cancel()
            ts.handle = None
            ts.armed_at = _INF
        else:
            ts.leave(prev)
        # Drop the links into this task: ``binder``/``catcher`` often point at the scope itself,
        # and through that cycle the task, its context and coroutine would wait for the cyclic
        # GC (7 objects per task, the extra RSS and lateness of 100k concurrent tasks). A child
        # task that still sees this frame reads only ``eff``/``binder``.
        task = self.c_task
        self._ts = self.c_task = self.catcher = self.c_binder = None
        binder = self._fired
        if binder is None:
            if exc is None:
                if own_expired and self._raise:
                    raise self._deadline_error()
                return False
            if getattr(exc, "_timebound_binder", None) is self:
                self.expired = True
                return not self._raise
            return False

        # We asked for a cancellation: withdraw it, then decide whose it is.
        assert task is not None
        ours = task.uncancel() <= self._cancelling  # -1: a cancel was pending at entry
        self._fired = _ROOT  # fired, and no link to the binder any more
        if exc_type is not None and issubclass(exc_type, _CancelledError):
            if not ours:
                # Someone else cancelled too (or a cancel was pending before we were entered,
                # cpython#134471): their cancellation wins and propagates unchanged.
                return False
            if binder is self:
                self.expired = True
                if self._raise:
                    raise self._deadline_error() from exc
                return True
            # The bound that fired is an enclosing one this task has no scope for (an inherited
            # request deadline, another task's scope): report *that* bound, never this scope.
            raise binder._deadline_error() from exc
        if exc is None:
            # The body swallowed our CancelledError (cpython#111379) and returned late.
            if own_expired and self._raise:
                raise self._deadline_error()
            if binder is not self:
                raise binder._deadline_error()
            return False
        if getattr(exc, "_timebound_binder", None) is self:
            return not self._raise
        return False

    def _exit_trio(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        own_expired: bool,
    ) -> bool:
        scope = self._trio_scope
        # trio may raise here (a new exception group): it propagates unchanged.
        handled = bool(scope.__exit__(exc_type, exc, tb))
        if handled and scope.cancelled_caught:
            binder = self.binder
            if binder is self or binder is None:
                self.expired = True
                if self._raise:
                    raise self._deadline_error() from exc
                return True
            raise binder._deadline_error() from exc
        if exc is None:
            if own_expired and self._raise:
                raise self._deadline_error()
            return False
        if getattr(exc, "_timebound_binder", None) is self:
            self.expired = True
            return not self._raise
        return handled

    def __repr__(self) -> str:
        kind = "fail" if self._raise else "move_on"
        state = "expired" if self.expired else ("entered" if self._mode >= 0 else "new")
        return f"<CancelScope {kind} source={self._source} {state} deadline={self.deadline!r}>"


class _Bound(_Frame):
    """A visible deadline that cancels nothing by itself: an inherited one, or the blocker."""

    __slots__ = ("_blocker", "_parent", "_prev_top", "_set_by", "_trio_scope")

    _parent: _Frame
    _trio_scope: Any
    _set_by: str | None

    def __init__(
        self,
        when: float,
        *,
        source: str,
        timeout: float | None,
        blocker: bool,
        set_by: str | None = None,
    ) -> None:
        self._own = when
        self._source = source
        self._timeout = timeout
        self._what = None
        self._blocker = blocker
        self._ts = None
        self._trio_scope = None
        self._marks = None
        self._t0 = None
        self._set_by = set_by

    def _origin(self) -> str | None:
        return self._set_by if self._set_by is not None else super()._origin()

    def _deadline_error(self, context: str | None = None) -> DeadlineExceeded:
        err = super()._deadline_error(context)
        if self._set_by is not None:
            err.set_by = self._set_by  # who set an inherited bound (D2.8)
        return err

    def __enter__(self) -> Deadline:
        parent = _frame.get()
        own = self._own
        if self._blocker:
            self.eff = _INF
            self.binder = None
        elif own < parent.eff:
            self.eff = own
            self.binder = self
        else:
            self.eff = parent.eff
            self.binder = parent.binder
        loop = _get_running_loop()
        task = _current_task(loop) if loop is not None else None
        if task is None and not self._blocker and parent.catcher is not None:
            trio = _trio_module()
            if trio is not None:
                self._enter_trio(trio, parent, own)
                return Deadline(self.eff)
        if task is not None and parent.c_task is task:
            base_at, base_binder, catcher = parent.c_at, parent.c_binder, parent.catcher
        elif self._blocker:
            base_at, base_binder, catcher = _INF, None, None
        else:
            base_at, base_binder, catcher = parent.eff, parent.binder, None
        if not self._blocker and own < base_at:
            base_at, base_binder = own, self
        self.c_task = task
        self.c_at = base_at
        self.c_binder = base_binder
        self.catcher = catcher
        self._parent = parent
        _frame.set(self)
        if task is not None and loop is not None:
            self._ts = ts = _timer_for(parent, task, loop)
            self._prev_top = ts.top
            ts.top = self
            if catcher is not None and self.c_at < ts.armed_at:
                # An earlier bound inside a scope of this task: that scope ends at it (D1.5)
                # and reports this bound, as it would a bound outside it.
                ts.arm(self.c_at, _clock.now())
        return Deadline(self.eff)

    def _enter_trio(self, trio: Any, parent: _Frame, own: float) -> None:
        """Inside a scope of this trio task, an earlier bound ends that scope, as on asyncio.

        trio cancels only through its own cancel scopes, so the bound gets one with its deadline;
        what it catches is reported as this bound's DeadlineExceeded, which the enclosing scope
        lets through (it is not its own), exactly what asyncio's catcher reports.
        """
        self.c_task = ttask = trio.lowlevel.current_task()
        self.catcher = parent.catcher
        if parent.c_task is ttask and own < parent.c_at:
            self.c_at = own
            self.c_binder = self
            left = max(0.0, own - _clock.now())
            self._trio_scope = scope = trio.CancelScope(deadline=trio.current_time() + left)
            scope.__enter__()
        else:
            self.c_at = parent.c_at
            self.c_binder = parent.c_binder
        self._parent = parent
        _frame.set(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _frame.set(self._parent)
        if self._marks is not None:
            self._fold(exc, 0.0)
        self.c_task = self.catcher = self.c_binder = None  # see CancelScope._exit_asyncio
        scope = self._trio_scope
        if scope is not None:
            self._trio_scope = None
            # trio may raise here (a new exception group): it propagates unchanged.
            if scope.__exit__(exc_type, exc, tb) and scope.cancelled_caught:
                raise self._deadline_error() from exc
            return
        ts = self._ts
        if ts is not None:
            ts.leave(self._prev_top)
            self._ts = None

    async def __aenter__(self) -> Deadline:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


class _Reserve(_Frame):
    """The visible deadline under a scope with a reserve (D1.18): its effective deadline less it.

    Its cancellation chain belongs to no task (``c_task`` is ``None``), like a deadline inherited
    from another task: code directly in the scope's body is cancelled only at the scope's own
    deadline, while the first scope entered under this frame, in any task, computes its base
    from ``eff`` and catches the reserved instant itself. So the fast non-binding path of
    ``CancelScope.__enter__`` (which needs ``parent.c_task is task``) never skips such a scope.
    """

    __slots__ = ("_base_source", "_label", "_parent", "_reserve")

    _parent: _Frame
    _reserve: float
    _label: str
    _base_source: str

    def _origin(self) -> str | None:
        return f"reserve of {self._label}"

    def _deadline_error(self, context: str | None = None) -> DeadlineExceeded:
        from ._durations import format_duration

        message = (
            f"{self._label} reached its reserve: the work under it was stopped "
            f"{format_duration(self._reserve)} before its deadline, kept for the answer"
        )
        if context is not None:
            message = f"{context} stopped: {message}"
        err = new_deadline_exceeded(
            message, self._base_source, None, Deadline._at(self._own), f"reserve of {self._label}"
        )
        err._timebound_binder = self  # type: ignore[attr-defined]
        marks = self._marks
        err._timebound_bd = (  # type: ignore[attr-defined]  # D13, as _Frame._deadline_error
            _clock.now(),
            _frame.get(),
            0 if marks is None else len(marks),
        )
        return err


def _reserve_label(source: str, what: str | None, set_by: str | None = None) -> str:
    """What a reserve belongs to, as its error's ``set_by`` names it: ``reserve of <this>``."""
    if set_by is not None:
        return set_by
    origin = set_by_of(source, what)
    return "scope" if origin is None else origin


def _push_reserve(reserve: float, label: str, refuse: bool = True) -> _Reserve | None:
    """Push the visible frame of a reserve over the current one (D1.18).

    Returns ``None`` when there is no deadline to keep a reserve from. Raises the refusal (a
    :class:`DeadlineExceeded` saying the reserve did it) when no more than the reserve is left.
    """
    parent = _frame.get()
    eff = parent.eff
    if eff == _INF:
        return None
    at = eff - reserve
    binder = parent.binder
    base_source = "scope" if binder is None else binder._source
    now = _clock.now()
    if at <= now and refuse:
        from ._durations import format_duration

        left = eff - now
        err = new_deadline_exceeded(
            f"{label} refused the work: {format_duration(max(0.0, left))} left, "
            f"no more than its reserve of {format_duration(reserve)}",
            base_source,
            None,
            Deadline._at(eff),
            f"reserve of {label}",
        )
        raise err
    r: _Reserve = _new(_Reserve)
    r._own = at
    r._source = base_source
    r._timeout = None
    r._what = f"reserve of {label}"  # how the breakdown (D13) names it as a part
    r._ts = None
    r._marks = None
    r._t0 = now
    r._reserve = reserve
    r._label = label
    r._base_source = base_source
    r.eff = at
    r.binder = r
    r.c_task = None
    r.c_at = at
    r.c_binder = r
    r.catcher = None
    r._parent = parent
    _frame.set(r)
    return r


def _pop_reserve(r: _Reserve) -> None:
    _frame.set(r._parent)
    marks = r._marks
    if marks is not None:
        # D13: the parts recorded under the reserve are the enclosing frame's (it adds none of
        # its own, as a visible bound does not).
        r._marks = None
        for m in marks:
            add_mark(r._parent, m)
    r.binder = r.c_binder = None  # no self-cycle left behind (see CancelScope._exit_asyncio)


class _ReservedScope(CancelScope):
    """A scope with a reserve (D1.18): it ends at its own deadline; everything under it sees that
    deadline less the reserve. Its own class, so scopes without one pay nothing for the option."""

    __slots__ = ("_reserve", "_rframe")

    _reserve: float
    _rframe: _Reserve | None

    def __enter__(self) -> CancelScope:
        CancelScope.__enter__(self)
        try:
            self._rframe = _push_reserve(self._reserve, _reserve_label(self._source, self._what))
        except DeadlineExceeded as err:
            # Refused at once: leave the scope entered above as if its body had raised this.
            self._rframe = None
            CancelScope.__exit__(self, type(err), err, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        r = self._rframe
        if r is None:
            return CancelScope.__exit__(self, exc_type, exc, tb)
        self._rframe = None
        _pop_reserve(r)
        handled = CancelScope.__exit__(self, exc_type, exc, tb)
        if not handled and exc is not None and getattr(exc, "_timebound_binder", None) is r:
            # The reserve stopped the body: this scope's bound, so a move_on_* scope ends
            # quietly and either kind says it expired (D1.19).
            self.expired = True
            return not self._raise
        return handled

    async def __aenter__(self) -> CancelScope:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.__exit__(exc_type, exc, tb)


def reserve_seconds(reserve: Duration | None, *, option: str = "reserve") -> float:
    """A reserve as seconds, ``0.0`` for none; negative, NaN, infinite or bad input is a
    :class:`ConfigurationError` naming ``option`` (D1.20)."""
    if reserve is None:
        return 0.0
    seconds = to_seconds(reserve, option=option)
    if seconds == _INF:
        raise ConfigurationError(f"{option} must be finite, not {reserve!r}", option=option)
    return seconds


def enter_reserve(reserve: float, set_by: str, *, refuse: bool = True) -> _Reserve | None:
    """For adapters that take a ``reserve=`` (the server middleware, D1.18): make the current
    effective deadline less ``reserve`` visible from here on, in this context; exit it with
    :func:`exit_reserve`. ``None`` (nothing entered) for no reserve or no deadline. Raises the
    refusal when no more than ``reserve`` is left (D1.20); its ``set_by`` is ``reserve of
    <set_by>``. With ``refuse=False`` (an adapter that refused already, a moment before) the
    frame is entered even then, already spent: the work under it stops at once."""
    if reserve <= 0.0:
        return None
    return _push_reserve(reserve, set_by, refuse)


def exit_reserve(frame: _Reserve | None) -> None:
    """Leave what :func:`enter_reserve` entered."""
    if frame is not None:
        _pop_reserve(frame)


def _with_reserve(s: CancelScope, reserve: Duration | None) -> CancelScope:
    """``s`` as a :class:`_ReservedScope` keeping ``reserve`` (validated here, D1.18)."""
    seconds = reserve_seconds(reserve)
    if seconds == 0.0:
        return s
    r: _ReservedScope = _new(_ReservedScope)
    r._own = s._own
    r._timeout = s._timeout
    r._raise = s._raise
    r._shield = s._shield
    r._source = s._source
    r._what = s._what
    r._mode = -1
    r._marks = None
    r.expired = False
    r._reserve = seconds
    r._rframe = None
    return r


def _methods_code(*classes: type) -> frozenset[Any]:
    return frozenset(
        f.__code__ for cls in classes for f in vars(cls).values() if hasattr(f, "__code__")
    )


#: The code of every method that pushes, pops or arms a frame. An asynchronous exception (the
#: signal tier's SIGALRM) raised inside one would leave the context or a timer half-updated, so
#: the signal tier defers delivery while any of them is running (see _preempt._protected).
bookkeeping_code: Final = _methods_code(
    CancelScope, _Bound, _TaskTimer, _Frame, _Reserve, _ReservedScope
) | {_push_reserve.__code__, _pop_reserve.__code__}


# Public constructors ---------------------------------------------------------------------


_new = object.__new__


def _new_scope(
    when: float,
    seconds: Duration | None,
    raise_on_expiry: bool,
    shield: bool,
    source: str,
    what: str | None,
) -> CancelScope:
    """``CancelScope(...)`` without ``type.__call__`` and keyword parsing (~0.3 µs per scope).

    ``seconds`` (a relative budget) is validated here, plain numbers inline. Sets exactly what
    ``CancelScope.__init__`` sets; keep the two in step.
    """
    relative: float | None
    if seconds is None:
        relative = None
    elif type(seconds) is float and seconds >= 0.0:  # NaN fails this and goes to to_seconds
        relative = seconds
    elif type(seconds) is int and 0 <= seconds <= 10**15:  # huge ints go to to_seconds
        relative = float(seconds)
    else:
        # Negative means "already expired" (D1.9): the budget is zero, the deadline is entry.
        relative = to_seconds(seconds, option="seconds", negative_is_zero=True)
    if source != "scope":
        _check_source(source)
    s: CancelScope = _new(CancelScope)
    s._own = when
    s._timeout = relative
    s._raise = raise_on_expiry
    s._shield = shield
    s._source = source
    s._what = what
    s._mode = -1
    s._marks = None
    s.expired = False
    return s


def _check_source(source: str) -> None:
    """An unknown ``source=`` is a mistake to report where the scope is built (D2.1)."""
    if source not in SOURCES:
        raise ConfigurationError(
            f"unknown deadline source {source!r}; expected one of {', '.join(sorted(SOURCES))}",
            option="source",
        )


def fail_after(
    seconds: Duration | None,
    *,
    shield: bool = False,
    source: str = "scope",
    what: str | None = None,
    reserve: Duration | None = None,
) -> CancelScope:
    """A scope that raises :class:`DeadlineExceeded` when ``seconds`` (from entry) run out.

    ``with`` and ``async with`` both work. ``source`` and ``what`` shape the error report; engines
    pass ``"attempt"``, ``"region"``, ``"node"`` … and the call's name. ``None`` means no bound
    of its own (as ``asyncio.timeout(None)``); a negative budget is already over (D1.9).
    ``reserve`` keeps time for the answer: everything under the scope sees the effective deadline
    earlier by it, while the scope itself ends at its own (D1.18).
    """
    s = _new_scope(_INF, _INF if seconds is None else seconds, True, shield, source, what)
    return s if reserve is None else _with_reserve(s, reserve)


def fail_at(
    deadline: Deadline,
    *,
    shield: bool = False,
    source: str = "scope",
    what: str | None = None,
    reserve: Duration | None = None,
) -> CancelScope:
    """A scope that raises :class:`DeadlineExceeded` at the absolute ``deadline``."""
    if not isinstance(deadline, Deadline):
        raise ConfigurationError(
            f"fail_at() takes a Deadline, not {type(deadline).__name__}; "
            "use fail_after(seconds) for a relative budget",
            option="deadline",
        )
    s = _new_scope(deadline.when, None, True, shield, source, what)
    return s if reserve is None else _with_reserve(s, reserve)


def move_on_after(
    seconds: Duration | None,
    *,
    shield: bool = False,
    source: str = "scope",
    what: str | None = None,
    reserve: Duration | None = None,
) -> CancelScope:
    """A scope that stops its body quietly when ``seconds`` (from entry) run out.

    ``.expired`` tells afterwards whether the deadline passed before the scope exited (D1.7).
    ``None`` means no bound of its own; a negative budget is already over (D1.9). ``reserve``:
    as for :func:`fail_after` (D1.18); the reserve stopping the body also ends it quietly.
    """
    s = _new_scope(_INF, _INF if seconds is None else seconds, False, shield, source, what)
    return s if reserve is None else _with_reserve(s, reserve)


def move_on_at(
    deadline: Deadline,
    *,
    shield: bool = False,
    source: str = "scope",
    what: str | None = None,
    reserve: Duration | None = None,
) -> CancelScope:
    """A scope that stops its body quietly at the absolute ``deadline``; see ``.expired``."""
    if not isinstance(deadline, Deadline):
        raise ConfigurationError(
            f"move_on_at() takes a Deadline, not {type(deadline).__name__}; "
            "use move_on_after(seconds) for a relative budget",
            option="deadline",
        )
    s = _new_scope(deadline.when, None, False, shield, source, what)
    return s if reserve is None else _with_reserve(s, reserve)


def no_deadline() -> _Bound:
    """Block deadline propagation: inside, ``current_deadline()`` is never (userver's blocker).

    Enclosing ``fail_*``/``move_on_*`` scopes of the same task still cancel at their deadlines;
    what is blocked is the deadline *seen* by clients, checkpoints and new scopes.
    """
    return _Bound(_INF, source="scope", timeout=None, blocker=True)


def inherit_deadline(
    deadline: Deadline,
    *,
    source: str = "inherited",
    timeout: float | None = None,
    set_by: str | None = None,
) -> _Bound:
    """Make ``deadline`` visible as an enclosing bound without cancelling anything by itself.

    This is how a request's deadline enters (``source="inherited"``): clients clamp to it,
    checkpoints raise at it, and ``fail_*``/``move_on_*`` scopes inside end at it and report it
    with this ``source``. The effective deadline is still the minimum (D1.5). ``set_by`` names
    where the deadline was set (``ASGI middleware``, a job's name), reported as the error's
    ``set_by`` (D2.8).
    """
    if not isinstance(deadline, Deadline):
        raise ConfigurationError(
            f"inherit_deadline() takes a Deadline, not {type(deadline).__name__}",
            option="deadline",
        )
    _check_source(source)
    return _Bound(deadline.when, source=source, timeout=timeout, blocker=False, set_by=set_by)


# Queries -----------------------------------------------------------------------------------


def current_deadline() -> Deadline:
    """The effective deadline here: the earliest of every enclosing bound (never if none)."""
    eff = _frame.get().eff
    if eff == _INF:
        return Deadline.never()
    return Deadline(eff)


def bounded() -> bool:
    """Whether any bound is in force here: one context-variable read, for an adapter's fast path
    that hands a call to its library untouched when there is no deadline (D4.13)."""
    return _frame.get().eff != _INF


def remaining() -> float:
    """Seconds until the effective deadline, never negative; ``math.inf`` when there is none."""
    left = _frame.get().eff - _clock.now()
    return left if left > 0.0 else 0.0


def current_bound_error(what: str | None = None) -> DeadlineExceeded | None:
    """The :class:`DeadlineExceeded` the binding bound would raise now, or ``None`` if time is left.

    Adapters and policies use this to fail fast with the right ``source`` (D2.1).
    """
    f = _frame.get()
    if f.eff == _INF or _clock.now() < f.eff:
        return None
    binder = f.binder
    assert binder is not None
    return binder._deadline_error(context=what)


def record(
    kind: str,
    name: str | None,
    t0: float,
    t1: float,
    budget: float | None = None,
    outcome: str | None = None,
    sub: Any = None,
) -> None:
    """D13: record a part of where the budget went on the innermost frame (nothing outside
    every frame). ``t0``/``t1`` on the monotonic clock, ``budget`` in seconds, ``sub`` the marks
    of a nested frame or a callee's :class:`~timebound.Breakdown`."""
    f = _frame.get()
    if f is not _ROOT:
        add_mark(f, (kind, name, t0, t1, budget, outcome, sub))


def current_breakdown(
    parts: tuple[Any, ...], name: str, t0: float, budget: float | None
) -> Breakdown:
    """D13: the breakdown of the bound that binds here, up to now. With no bound (a call bounded
    by its own static timeout), a tree of ``parts`` (marks) from ``t0``."""
    f = _frame.get()
    binder = f.binder
    now = _clock.now()
    if binder is None:
        return build("bound", name, t0, now, budget, "timeout", list(parts), len(parts))
    return frame_breakdown(binder, now, f)


def error_breakdown(err: DeadlineExceeded) -> Breakdown | None:
    """D13: the tree of where the budget of the bound that raised ``err`` went (built now)."""
    state = err.__dict__
    binder = state.get("_timebound_binder")
    snap = state.get("_timebound_bd")
    if binder is None or snap is None:
        return None
    return frame_breakdown(binder, *snap, source=err.source)


def frame_breakdown(
    frame: _Frame,
    t_end: float,
    current: _Frame | None = None,
    n_marks: int | None = None,
    *,
    source: str | None = None,
    outcome: str = "timeout",
) -> Breakdown:
    """The breakdown of ``frame`` from its start to ``t_end``; ``current`` is the innermost frame
    entered at ``t_end`` (its enclosing frames up to ``frame`` were still open)."""
    open_frames: list[_Frame] = []
    f: Any = current
    while f is not None and f is not frame and f is not _ROOT:
        open_frames.append(f)
        f = getattr(f, "_parent", None)
    if f is not frame:
        open_frames = []  # ``current`` was not inside ``frame`` (another task's bound)
    open_frames.reverse()
    marks = frame._marks
    if n_marks is None:
        n_marks = 0 if marks is None else len(marks)
    src = frame._source if source is None else source
    name = src if frame._what is None else f"{src} {frame._what}"
    t0 = frame_start(frame, t_end)
    budget = frame._timeout
    if budget is None and frame._own != _INF:
        budget = frame._own - t0  # an absolute bound: what was left of it at entry
    return build(
        "bound",
        name,
        t0,
        t_end,
        budget,
        outcome,
        marks,
        n_marks,
        open_frames,
        frame._own if frame._own != _INF else None,
    )


def current_bound_source() -> str | None:
    """The ``source`` of the bound that sets the effective deadline, or ``None`` without one."""
    binder = _frame.get().binder
    return None if binder is None else binder._source


def current_bound_set_by() -> str | None:
    """Where the bound that sets the effective deadline was set (D2.8), as its own error would
    say: a callee that reports that deadline spent reports *this* bound spent."""
    binder = _frame.get().binder
    return None if binder is None else binder._origin()


def checkpoint() -> None:
    """Raise :class:`DeadlineExceeded` if the effective deadline has passed (sync code)."""
    f = _frame.get()
    if f.eff != _INF and _clock.now() >= f.eff:
        binder = f.binder
        assert binder is not None
        raise binder._deadline_error()


async def acheckpoint() -> None:
    """Async checkpoint: raise if the effective deadline passed, then yield to the event loop."""
    checkpoint()
    loop = _get_running_loop()
    if loop is not None:
        import asyncio  # imported: its loop runs

        await asyncio.sleep(0)
    else:
        trio = _trio_module()
        if trio is not None:
            await trio.lowlevel.checkpoint()


def cut_short(scope: CancelScope, ctx: contextvars.Context) -> None:
    """Bring ``scope``'s deadline to now for the sync code running inside it in ``ctx``.

    This is how one thread asks sync code in another to stop (a hedge that lost, D3.14): sync
    cancellation is the deadline passing (D1.6), so the scope's deadline becomes now, and so does
    the effective deadline of every frame the code entered inside it (each keeps a copy of it,
    taken at entry). From then on ``checkpoint()`` raises there, ``remaining()`` is 0, a clamped
    client sends nothing and fails fast, and the scope reports it expired. Frames inside a
    ``no_deadline()`` block or a shielded scope keep their deadline: that work said it must not
    be cut. ``ctx`` is the context the code runs in (``Context.run``); reading it from this
    thread sees its innermost frame. A frame the code is entering at this very moment may miss
    it; the code then sees the cut when that frame exits. Never early (D1.3): nothing that
    already passed is moved, and nothing moves later.
    """
    now = _clock.now()
    chain: list[_Frame] = []
    f: Any = ctx.get(_frame, _ROOT)
    while f is not None and f is not _ROOT and f is not scope:
        chain.append(f)
        f = getattr(f, "_parent", None)
    if f is not scope:
        chain = []  # the code has left the scope: only the scope itself is cut
    for i in range(len(chain) - 1, -1, -1):  # outermost first
        if getattr(chain[i], "_blocker", False) or getattr(chain[i], "_shield", False):
            del chain[: i + 1]  # it and every frame inside it stay as they are
            break
    if scope._own > now:
        scope._own = now
    for frame in (scope, *reversed(chain)):
        if frame.eff > now:
            # The binder first: a reader between the two writes sees the old deadline.
            frame.binder = scope
            frame.eff = now


# Background work ---------------------------------------------------------------------------

# The one registry of detached tasks: the loop keeps only weak references to tasks, so every task
# timebound starts without awaiting it (spawn_background, the httpx exchange, the gRPC stream
# check) is held here until it ends.
_background: set[asyncio.Task[Any]] = set()
_EAGER: Final = sys.version_info >= (3, 12)


def _clean_context() -> contextvars.Context:
    ctx = contextvars.copy_context()
    ctx.run(_frame.set, _ROOT)
    return ctx


def _spawn_detached(
    coro: Coroutine[Any, Any, _T],
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    name: str | None = None,
    eager: bool = False,
) -> asyncio.Task[_T]:
    """Start ``coro`` with no deadline (a clean context) and hold it until it ends.

    ``eager`` (Python 3.12+, else ignored) runs its first step at once, within the caller's step.
    """
    import asyncio  # imported: only code on its loop starts a task

    if loop is None:
        loop = asyncio.get_running_loop()
    task: asyncio.Task[_T]
    if eager and _EAGER:
        task = asyncio.Task(  # type: ignore[call-arg,unused-ignore]
            coro, loop=loop, name=name, context=_clean_context(), eager_start=True
        )
    else:
        task = loop.create_task(coro, name=name, context=_clean_context())
    if not task.done():
        _background.add(task)
        task.add_done_callback(_background.discard)
    return task


def spawn_background(coro: Coroutine[Any, Any, _T], *, name: str | None = None) -> asyncio.Task[_T]:
    """Start ``coro`` as an asyncio task that does **not** inherit the current deadline.

    Use it for work that must outlive the request (userver's ``AsyncBackground``). timebound keeps
    a reference until the task finishes, so it is not garbage-collected mid-flight.
    """
    return _spawn_detached(coro, name=name)
