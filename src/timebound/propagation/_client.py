"""What the httpx, requests and aiohttp adapters share (DECISIONS D4.3, D4.5, D4.7).

One outgoing attempt goes through three decisions:

1. :func:`begin` — clamp the static timeout by the effective deadline (``_state.clamp_timeout``);
   when no time is left raise at once with the binding bound's ``source`` and send nothing.
   The header value is the attempt's timeout in whole ms, rounded up, never ``0``.
2. :meth:`Attempt.cut` — the exchange ran out of time: if our deadline set the timeout
   (``lowered``) it is *our* deadline that is spent: raise ``DeadlineExceeded`` with the binding
   bound's source and mark the request (D4.5); otherwise the attempt's own static timeout fired.
3. :meth:`Attempt.remote_expired` — a response ``>= 400`` carrying ``X-YaTaxi-Deadline-Expired``:
   if our deadline lowered the timeout, raise ``DeadlineExceeded(source="propagated")`` and mark
   the request (never retried); otherwise it is an ordinary attempt timeout (retryable). A
   timeout lowered by the attempt's own bound (a policy's per-attempt timeout, source
   ``attempt``) is the attempt's time, not our deadline: ordinary and retryable (D2.5).

The request is marked only when the spent bound is the request's own deadline
(:meth:`RequestState.cut_by`): an attempt timeout or a local scope that ends earlier leaves the
request with time, so it is not answered "Deadline expired".

The "ordinary timeout" type is each adapter's ``AttemptTimeout``: a ``DeadlineExceeded`` with
``source="attempt"`` (retryable by timebound's policies, D2.5) that is *also* the client
library's own timeout exception (``httpx.TimeoutException``, ``requests.Timeout``,
``aiohttp.ServerTimeoutError``), so existing ``except`` clauses and retry predicates keep working.

Telemetry (label ``component="http-client"``): counters ``timeout-updated-by-deadline`` and
``cancelled-by-deadline``; span tags ``propagated_timeout_ms`` and ``cancelled_by_deadline``
as ``span.tags`` events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._core import _clock
from .._core._classify import bound_origin
from .._core._deadline import Deadline
from .._core._errors import DeadlineExceeded
from .._core._scopes import (
    current_bound_error,
    current_bound_source,
    current_deadline,
    move_on_at,
)
from ..telemetry._events import counters, emit, enabled
from . import _config
from ._codec import EXPIRED_HEADER, TIMEOUT_HEADER
from ._state import ClampedTimeout, clamp_timeout, mark_spent

__all__ = ["COMPONENT", "Attempt", "AttemptTimeoutBase", "ClientOptions", "begin", "bounded"]

COMPONENT = "http-client"

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ClientOptions:
    """Per-adapter propagation options."""

    propagate_header: bool = True
    timeout_header: str = TIMEOUT_HEADER
    expired_header: str = EXPIRED_HEADER
    what: str = "http request"


class AttemptTimeoutBase(DeadlineExceeded):
    """What every adapter's ``AttemptTimeout`` is besides the client library's own timeout:
    a :class:`~timebound.DeadlineExceeded` with ``source="attempt"`` (retryable, D2.5).

    ``remote`` is true when the server answered "deadline expired" (D4.5 case 2) rather than
    the clock running out here. Pickles as its own subclass, without the live request.
    """

    def __init__(self, message: str, *, remote: bool = False, timeout: float | None = None) -> None:
        DeadlineExceeded.__init__(self, message, source="attempt", timeout=timeout)
        self.remote = remote

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_attempt_timeout, (type(self), str(self), self.remote, self.timeout))


def _rebuild_attempt_timeout(
    cls: type[AttemptTimeoutBase], message: str, remote: bool, timeout: float | None
) -> AttemptTimeoutBase:
    return cls(message, remote=remote, timeout=timeout)


def _record_cancelled(bound: float | None) -> None:
    mark_spent(None if bound is None else Deadline(bound))
    counters.inc("cancelled-by-deadline", component=COMPONENT)
    if enabled():
        emit("span.tags", component=COMPONENT, cancelled_by_deadline=1)


@dataclass(slots=True)
class Attempt:
    """One clamped attempt: its timeout, its absolute end and how to report running out."""

    clamped: ClampedTimeout
    #: Absolute end on the scheduling clock (``None``: neither deadline nor static timeout).
    end: float | None
    #: Source to report when the cut is ours: the binding bound's, or ``attempt``.
    source: str
    #: The header value to send, or ``None`` to send none.
    header_value: str | None
    options: ClientOptions

    @property
    def lowered(self) -> bool:
        return self.clamped.lowered

    def expired(self) -> bool:
        """True once the attempt's end has passed (never early, D1.3)."""
        return self.end is not None and _clock.now() >= self.end

    def note_cut(self) -> None:
        """Record a cut by our own deadline (counters, span tag, the request's mark)."""
        if self.lowered:
            _record_cancelled(self.end)

    def cut(self, attempt_timeout: Callable[[str], BaseException]) -> BaseException:
        """The error for an exchange that ran past :attr:`end`.

        ``attempt_timeout(message)`` builds the adapter's ``AttemptTimeout``.
        """
        what = self.options.what
        if self.lowered:
            _record_cancelled(self.end)
            err = current_bound_error(what)
            if err is not None:
                return err
            # Outside the caller's context (a body read later) or a socket timer a hair early:
            # report the same bound from what we recorded.
            return DeadlineExceeded(
                source=self.source,
                timeout=self.clamped.seconds,
                deadline=None if self.end is None else Deadline(self.end),
                what=what,
            )
        seconds = self.clamped.seconds
        return attempt_timeout(
            f"{what} timed out after {seconds:g}s (attempt deadline)"
            if seconds is not None
            else f"{what} timed out (attempt deadline)"
        )

    def is_remote_expired(self, status: int, header: str | None) -> bool:
        """Whether a response carries the remote "deadline expired" marker (D4.5)."""
        return status >= 400 and bool(header) and _config.is_enabled()

    def remote_expired(
        self, status: int, attempt_timeout: Callable[[str], BaseException]
    ) -> BaseException:
        """The error for a response marked "deadline expired" by the server (D4.5)."""
        what = self.options.what
        if self.lowered and bound_origin(self.source) != "own":
            _record_cancelled(self.end)
            return DeadlineExceeded(
                f"{what} answered {status} deadline expired: our deadline is spent"
                " (propagated deadline)",
                source="propagated",
                timeout=self.clamped.seconds,
                deadline=None if self.end is None else Deadline(self.end),
            )
        return attempt_timeout(
            f"{what} answered {status} deadline expired within the attempt's own timeout"
            " (attempt deadline)"
        )


def begin(static: float | None, options: ClientOptions) -> Attempt:
    """Start one attempt: clamp, fail fast when spent (sending nothing), choose the header."""
    try:
        clamped = clamp_timeout(static, what=options.what)
    except DeadlineExceeded:
        counters.inc("cancelled-by-deadline", component=COMPONENT)
        if enabled():
            emit("span.tags", component=COMPONENT, cancelled_by_deadline=1)
        raise
    seconds = clamped.seconds
    if seconds is None:
        end = None
    elif clamped.lowered:
        # Exactly the effective deadline, not "now + remaining" read a moment later.
        end = current_deadline().when
    else:
        end = _clock.now() + seconds
    header_value: str | None = None
    if seconds is not None and options.propagate_header and _config.is_enabled():
        header_value = str(clamped.ms)
    if clamped.lowered:
        source = current_bound_source() or "scope"
        counters.inc("timeout-updated-by-deadline", component=COMPONENT)
        if enabled():
            emit("span.tags", component=COMPONENT, propagated_timeout_ms=clamped.ms)
    else:
        source = "attempt"
    return Attempt(clamped, end, source, header_value, options)


async def bounded(
    attempt: Attempt,
    make: Callable[[str], BaseException],
    timeout_types: tuple[type[BaseException], ...],
    fn: Callable[..., Awaitable[_T]],
    *args: Any,
) -> _T:
    """Await ``fn(*args)`` until the attempt's end; report running out as :class:`Attempt` says.

    A timebound scope does the bounding, so it composes with every enclosing scope: when our
    timeout was lowered, the enclosing bound shares our end and reports itself (its
    ``DeadlineExceeded``, or the ``CancelledError`` its own scope catches) — we only record the
    cut and never convert a cancellation (D2.3).
    """
    assert attempt.end is not None
    scope = move_on_at(Deadline(attempt.end))
    try:
        with scope:
            return await fn(*args)
    except (DeadlineExceeded, asyncio.CancelledError):
        if attempt.expired():
            attempt.note_cut()
        raise
    except timeout_types as exc:
        if attempt.expired():
            raise attempt.cut(make) from exc
        raise
    # Reached only when our own scope moved on: the attempt's end passed.
    raise attempt.cut(make)
