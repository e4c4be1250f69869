"""What the database adapters share: fail fast, count, and report a spent deadline (D4.8).

userver's rules for database clients: stop waiting for a free connection and fail at once when
the deadline has passed; use the deadline to update the timeout; include the deadline in the
query. Every adapter reports with userver's metric names (D4.7), labelled ``client=<driver>``.
"""

from __future__ import annotations

from typing import Final

from .._core._errors import DeadlineExceeded
from .._core._scopes import current_bound_error
from ..telemetry._events import counters, emit, enabled
from ._state import ClampedTimeout, clamp_timeout, mark_spent

#: A database call whose timeout the deadline lowered (userver's name, D4.7).
TIMEOUT_UPDATED: Final = "timeout-updated-by-deadline"
#: A database call given up because the deadline was spent (userver's name, D4.7).
CANCELLED: Final = "cancelled-by-deadline"


def budget(static: float | None, *, what: str, client: str) -> ClampedTimeout:
    """``min(static, remaining)``; raises (and counts, and marks) when nothing is left."""
    try:
        return clamp_timeout(static, what=what)
    except DeadlineExceeded:
        _cancelled(client)
        raise


def spent(*, what: str, client: str) -> DeadlineExceeded | None:
    """The binding bound's error when the deadline has passed (counted; the request marked when
    that bound is its own deadline)."""
    err = current_bound_error(what)
    if err is None:
        return None
    mark_spent()
    _cancelled(client)
    return err


def _cancelled(client: str) -> None:
    counters.inc(CANCELLED, component=client)
    if enabled():
        emit("span.tags", component=client, cancelled_by_deadline=1)


def updated(client: str, timeout_ms: int | None = None) -> None:
    """Count a call whose timeout the deadline lowered (span tag ``timeout_ms``)."""
    counters.inc(TIMEOUT_UPDATED, component=client)
    if enabled():
        emit("span.tags", component=client, timeout_ms=timeout_ms)
