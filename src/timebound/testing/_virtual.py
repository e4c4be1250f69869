"""Virtual time for sync code, asyncio and trio (``timebound.testing``).

:class:`VirtualClock` replaces timebound's clock (``_clock.now``/``_clock.sleep``) while it is
installed, and provides an asyncio event loop whose ``time()`` is the virtual clock. With
*autojump*, when every task is blocked waiting for a timer, time leaps straight to the next timer,
so a test of a 30 s timeout runs in microseconds and asserts exact instants (trio's
``MockClock(autojump_threshold=0)`` is the model).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import selectors
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from .._core import _clock
from .._core._durations import Duration, to_seconds

__all__ = ["VirtualClock", "VirtualEventLoop"]

_T = TypeVar("_T")


class VirtualClock:
    """A clock that moves only when told to, or (autojump) when every task waits for a timer.

    ``start`` is the initial reading of :meth:`now`. ``autojump_threshold`` is how long, in *real*
    seconds, the event loop must be idle before time jumps (0: jump at once; raise it when tests
    wait on real threads or sockets). ``wall_start`` is the wall-clock reading (epoch seconds) at
    ``start``: the wall clock moves with the virtual one, so durable epoch forms are exact too.
    """

    def __init__(
        self,
        start: float = 0.0,
        *,
        autojump_threshold: float = 0.0,
        wall_start: float = 1_767_225_600.0,  # 2026-01-01T00:00:00Z
    ) -> None:
        if autojump_threshold < 0:
            raise ValueError("autojump_threshold must be >= 0")
        self._now = float(start)
        self._wall_offset = float(wall_start) - self._now
        self._lock = threading.Lock()
        self.autojump_threshold = autojump_threshold
        self._saved: tuple[Any, Any, Any, Any, Any] | None = None
        self._jumps = 0
        self._io = 0  # real_io() blocks open
        self._io_progress = 0.0  # real time of the last sign of life of real I/O

    # The clock ------------------------------------------------------------------------------

    def now(self) -> float:
        """The current virtual time in seconds."""
        return self._now

    def wall(self) -> float:
        """The virtual wall clock: epoch seconds, moving in step with :meth:`now`."""
        return self._wall_offset + self._now

    def advance(self, seconds: Duration) -> None:
        """Move time forward by ``seconds`` (never backwards)."""
        delta = to_seconds(seconds, option="seconds")
        with self._lock:
            self._now += delta

    def jump_to(self, instant: float) -> None:
        """Move time forward to ``instant`` exactly (no-op if it is in the past)."""
        with self._lock:
            if instant > self._now:
                self._now = instant
                self._jumps += 1

    def sleep(self, seconds: float) -> None:
        """A blocking sleep on virtual time: returns at once, ``seconds`` later."""
        if seconds > 0:
            self.advance(seconds)

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """A thread's wait for ``event`` on virtual time: ``autojump_threshold`` real seconds
        for it to be set, then time jumps ``seconds`` ahead (``None``: wait for it however
        long). True when the event was set.

        Tests that wait on threads decide by events who answers first, so that whether a wait
        jumps never depends on how fast the machine is.
        """
        if event.wait(self.autojump_threshold):
            return True
        if seconds is None:
            return event.wait()
        with self._lock:
            self._now += max(0.0, seconds)
            self._jumps += 1
        return event.is_set()

    @property
    def jumps(self) -> int:
        """How many times autojump moved time (useful to assert no real waiting happened)."""
        return self._jumps

    # Real I/O ----------------------------------------------------------------------------------

    #: How long, in real seconds without any I/O arriving, autojump waits for a ``real_io()``
    #: block before leaping anyway: code that sleeps on virtual time inside such a block must
    #: not hang a test.
    real_io_patience = 5.0

    @contextlib.contextmanager
    def real_io(self) -> Iterator[None]:
        """While open, autojump waits for real I/O instead of leaping to the next timer.

        timebound's clients of external servers (the durable store's PostgreSQL round trips)
        enter it through ``_clock.real_io()``: on virtual time a server's answer takes no time,
        however loaded the machine is, so a test never sees time leap past it to a far timer.
        """
        with self._lock:
            if self._io == 0:
                self._io_progress = time.monotonic()
            self._io += 1
        try:
            yield
        finally:
            with self._lock:
                self._io -= 1

    def _awaiting_io(self) -> bool:
        return self._io > 0 and time.monotonic() - self._io_progress < self.real_io_patience

    def _saw_io(self) -> None:
        self._io_progress = time.monotonic()

    # Installation ------------------------------------------------------------------------------

    def install(self) -> None:
        """Make timebound read this clock (``now``) and sleep on it (``sleep``)."""
        if self._saved is not None:
            raise RuntimeError("this VirtualClock is already installed")
        self._saved = (_clock.now, _clock.sleep, _clock.wall, _clock.real_io, _clock.wait)
        _clock.now = self.now
        _clock.sleep = self.sleep
        _clock.wall = self.wall
        _clock.real_io = self.real_io
        _clock.wait = self.wait

    def uninstall(self) -> None:
        """Restore the clock that was in place before :meth:`install`."""
        if self._saved is None:
            return
        _clock.now, _clock.sleep, _clock.wall, _clock.real_io, _clock.wait = self._saved
        self._saved = None

    def __enter__(self) -> VirtualClock:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # asyncio ---------------------------------------------------------------------------------

    def new_event_loop(self) -> VirtualEventLoop:
        """An asyncio event loop that runs on this clock."""
        return VirtualEventLoop(self)

    def run(self, main: Coroutine[Any, Any, _T], *, debug: bool = False) -> _T:
        """Run ``main`` like :func:`asyncio.run`, on a loop driven by this clock.

        Installs the clock for the duration of the run if it is not installed yet.
        """
        with contextlib.ExitStack() as stack:
            if self._saved is None:
                stack.enter_context(self)
            with asyncio.Runner(debug=debug, loop_factory=self.new_event_loop) as runner:
                return runner.run(main)

    @contextlib.contextmanager
    def drive(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """Run an existing asyncio selector loop on this clock inside the block, then restore it.

        For loops made by someone else (pytest-asyncio's runner, a framework's test client):
        inside the block the loop's ``time()`` is this clock and it autojumps as
        :meth:`new_event_loop`'s loops do. The loop must not be running when the block starts.
        """
        selector = getattr(loop, "_selector", None)
        if not isinstance(selector, selectors.BaseSelector) or not isinstance(
            loop, asyncio.BaseEventLoop
        ):
            raise RuntimeError(
                f"a VirtualClock can only drive an asyncio selector event loop, not "
                f"{type(loop).__name__}; run the code with VirtualClock.run() instead"
            )
        if loop.is_running():
            raise RuntimeError("a VirtualClock cannot take over an event loop that is running")
        virtual = _VirtualSelector(self, selector)
        virtual.loop = loop
        # The loop's own bookkeeping reads self.time() and self._selector: shadowing the method
        # with an instance attribute and swapping the selector is all it takes, and undoable.
        loop._selector = virtual  # type: ignore[attr-defined]
        loop.time = self.now  # type: ignore[method-assign]
        try:
            yield
        finally:
            loop._selector = selector  # type: ignore[attr-defined]
            del loop.time

    # trio --------------------------------------------------------------------------------------

    def trio_clock(self) -> Any:
        """A ``trio.abc.Clock`` on this virtual time with autojump: ``trio.run(f, clock=...)``."""
        import trio

        vclock = self

        class _TrioVirtualClock(trio.abc.Clock):
            # With a threshold, trio must stay idle that long in *real* time before time jumps.
            # trio asks deadline_to_sleep_time() only when no task is runnable; being asked
            # again before the real sleep we granted ran out means I/O or a thread woke it.
            _idle_until: float | None = None

            def start_clock(self) -> None:
                return None

            def current_time(self) -> float:
                return vclock.now()

            def deadline_to_sleep_time(self, deadline: float) -> float:
                if deadline <= vclock.now():
                    return 0.0
                if deadline == math.inf:
                    # No timer at all: only real I/O or another thread can wake the run.
                    return math.inf
                if vclock._awaiting_io():
                    # A real server is answering: poll for it without moving time.
                    return _IO_POLL
                # trio asks how long to block: say "not at all" after jumping, so the run loop
                # wakes and finds the timer due (trio's own MockClock autojump does the same).
                threshold = vclock.autojump_threshold
                if threshold == 0:
                    vclock.jump_to(deadline)
                    return 0.0
                real = time.monotonic()  # real idle time, not scheduling: the threshold is real
                if self._idle_until is not None and real >= self._idle_until:
                    self._idle_until = None
                    vclock.jump_to(deadline)
                    return 0.0
                self._idle_until = real + threshold
                return threshold

        return _TrioVirtualClock()


# Real seconds between polls while real I/O is awaited on virtual time.
_IO_POLL = 0.01


class _VirtualSelector(selectors.BaseSelector):
    """Wraps the real selector: polls real I/O, and jumps virtual time instead of blocking."""

    def __init__(self, clock: VirtualClock, real: selectors.BaseSelector | None = None) -> None:
        self._real = real if real is not None else selectors.DefaultSelector()
        self._clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.get_key(fileobj)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return self._real.select(0)
        threshold = self._clock.autojump_threshold
        events = self._real.select(threshold if timeout is None else min(timeout, threshold))
        if events:
            return events
        if timeout is None:
            # Nothing is scheduled: only real I/O or another thread can wake us.
            return self._real.select(None)
        while self._clock._awaiting_io():
            # A real server is answering: wait for it instead of leaping past its answer.
            events = self._real.select(_IO_POLL)
            if events:
                self._clock._saw_io()
                return events
        loop = self.loop
        nxt = _next_timer(loop) if loop is not None else None
        self._clock.jump_to(nxt if nxt is not None else self._clock.now() + timeout)
        return []


class VirtualEventLoop(asyncio.SelectorEventLoop):
    """An asyncio selector loop whose ``time()`` is a :class:`VirtualClock`."""

    def __init__(self, clock: VirtualClock) -> None:
        selector = _VirtualSelector(clock)
        super().__init__(selector)
        selector.loop = self
        self._virtual_clock = clock

    def time(self) -> float:
        return self._virtual_clock.now()

    def _next_timer(self) -> float | None:
        return _next_timer(self)


def _next_timer(loop: asyncio.AbstractEventLoop) -> float | None:
    """When the loop's earliest live timer is due (asyncio keeps them in ``_scheduled``)."""
    scheduled: list[asyncio.TimerHandle] = getattr(loop, "_scheduled", [])
    live = [h.when() for h in scheduled if not h.cancelled()]
    return min(live) if live else None


@contextlib.contextmanager
def virtual_time(start: float = 0.0, *, autojump_threshold: float = 0.0) -> Iterator[VirtualClock]:
    """``with virtual_time() as clock:`` installs a fresh :class:`VirtualClock` for the block."""
    clock = VirtualClock(start, autojump_threshold=autojump_threshold)
    with clock:
        yield clock
