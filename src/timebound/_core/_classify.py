"""Whose deadline fired: the one classification every layer asks (DECISIONS D2.5, D4.5).

A :class:`~timebound.DeadlineExceeded` carries its bound's ``source``. What a layer does with it
depends on whose bound that is, seen from the layer that caught it:

``own``
    The catching layer's own budget (a source it names in ``own=``, by default a per-attempt
    ``attempt`` bound), or a bound *inside* the code it ran that is no longer in force: that code
    failing, like any other error. Retryable; a fallback or ``on_error`` may replace it.
``enclosing``
    A bound around the catching layer: it has passed here, or the error was raised on its behalf
    ahead of time (:func:`mark_enclosing`). The caller's time is spent; nothing may retry it or
    turn it into a value.
``remote``
    Another process's deadline: the one a request brought with it (``inherited``) or one a
    downstream reported spent (``propagated``). Spent for the caller as well.

Only this module decides it. Every source that is neither remote nor named in ``own=`` is
classified by whether it is in force, so a new source (``region``, ``node``, ``workflow``,
``synchronization``, ``deferred`` or a later one) needs no edit anywhere.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final, Literal

from ._errors import DeadlineExceeded
from ._scopes import current_bound_error

__all__ = [
    "REMOTE_SOURCES",
    "Origin",
    "bound_origin",
    "classify",
    "mark_enclosing",
]

#: ``own``, ``enclosing`` or ``remote`` (see the module documentation).
Origin = Literal["own", "enclosing", "remote"]

#: Sources whose bound is another process's deadline (D4).
REMOTE_SOURCES: Final = frozenset({"inherited", "propagated"})

_ATTEMPT: Final = frozenset({"attempt"})
# Not "_timebound_…": those attributes are process-local and dropped when pickling; the mark is
# data and travels with the error.
_MARK: Final = "_enclosing"


def bound_origin(source: str | None, *, own: Collection[str] = _ATTEMPT) -> Origin | None:
    """The origin of a bound that is in force here, from its ``source``; ``None`` for no bound.

    For a layer that is about to act under the binding bound (a client choosing whether a
    lowered timeout is its attempt's or its caller's): ``own`` when ``source`` is in ``own``,
    ``remote`` for :data:`REMOTE_SOURCES`, else ``enclosing``.
    """
    if source is None:
        return None
    if source in own:
        return "own"
    if source in REMOTE_SOURCES:
        return "remote"
    return "enclosing"


def classify(err: DeadlineExceeded, *, own: Collection[str] = _ATTEMPT) -> Origin:
    """Whose deadline ``err`` reports, seen from the code that caught it, here and now.

    ``own`` names the sources of the bounds the catching layer set itself (a retry policy:
    ``{"attempt", "total"}``). A remote source is ``remote``. Any other bound is ``enclosing``
    when the effective deadline here has passed or the error was marked with
    :func:`mark_enclosing`; otherwise it was a bound inside the code that ran, and is ``own``.
    """
    source = err.source
    if source in own:
        return "own"
    if source in REMOTE_SOURCES:
        return "remote"
    if getattr(err, _MARK, False) or current_bound_error() is not None:
        return "enclosing"
    return "own"


def mark_enclosing(err: DeadlineExceeded) -> DeadlineExceeded:
    """Record that ``err`` was raised for an enclosing bound that has not passed yet.

    A layer that stops early because the bound cannot fit what comes next (a retry delay) raises
    before the bound passes; marked, the error still classifies as ``enclosing`` everywhere.
    Returns ``err``.
    """
    setattr(err, _MARK, True)
    return err
